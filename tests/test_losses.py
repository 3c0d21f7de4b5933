"""Losses and metrics of the trainer (rigel_core/train/losses.py) against independent float64 references."""
import math

import numpy as np
import pytest
import torch
from numpy.lib.stride_tricks import sliding_window_view

from rigel_core.train.losses import dssim, gaussian_window_1d, l1_loss, mse, psnr, psnr_from_mse, ssim, ssim_map


def ssim_reference(x: np.ndarray, y: np.ndarray, padding: str, size: int = 11, sigma: float = 1.5) -> np.ndarray:
    """Per-pixel SSIM (C, H', W') in float64, written from Wang et al. 2004 eq. 13: an explicit 2-D Gaussian
    window (not separable), every window's weighted moments by direct summation over the window's pixels."""
    r = size // 2
    ii, jj = np.mgrid[-r:r + 1, -r:r + 1]
    w = np.exp(-(ii ** 2 + jj ** 2) / (2 * sigma ** 2))
    w /= w.sum()
    c1, c2 = (0.01 * 1.0) ** 2, (0.03 * 1.0) ** 2
    out = []
    for c in range(x.shape[-1]):
        a, b = x[..., c].astype(np.float64), y[..., c].astype(np.float64)
        if padding == "same":
            a, b = np.pad(a, r), np.pad(b, r)
        wa, wb = sliding_window_view(a, (size, size)), sliding_window_view(b, (size, size))
        mu_a = (wa * w).sum((-1, -2))
        mu_b = (wb * w).sum((-1, -2))
        var_a = (w * (wa - mu_a[..., None, None]) ** 2).sum((-1, -2))
        var_b = (w * (wb - mu_b[..., None, None]) ** 2).sum((-1, -2))
        cov = (w * (wa - mu_a[..., None, None]) * (wb - mu_b[..., None, None])).sum((-1, -2))
        out.append((2 * mu_a * mu_b + c1) * (2 * cov + c2) / ((mu_a ** 2 + mu_b ** 2 + c1) * (var_a + var_b + c2)))
    return np.stack(out)


def _pair(rng, h, w, noise, dtype=torch.float64):
    x = torch.rand(h, w, 3, generator=rng, dtype=torch.float64)
    # a smooth-ish image (structure at the window's scale) plus noise: SSIM far from 0 and from 1
    x = 0.5 * x + 0.5 * torch.nn.functional.avg_pool2d(x.permute(2, 0, 1)[None], 5, 1, 2)[0].permute(1, 2, 0)
    y = (x + noise * torch.randn(h, w, 3, generator=rng, dtype=torch.float64)).clamp(0, 1)
    return x.to(dtype), y.to(dtype)


@pytest.mark.parametrize("padding", ["same", "valid"])
@pytest.mark.parametrize("shape", [(23, 37), (16, 16), (11, 30)])
def test_ssim_matches_float64_reference(rng, padding, shape):
    x, y = _pair(rng, *shape, noise=0.1)
    ref = ssim_reference(x.numpy(), y.numpy(), padding)
    got = ssim_map(x, y, padding=padding)[0].numpy()
    assert got.shape == ref.shape
    np.testing.assert_allclose(got, ref, rtol=0, atol=1e-12)  # float64 vs float64: only summation order differs
    assert abs(float(ssim(x, y, padding=padding)) - ref.mean()) < 1e-12
    # float32: inputs and arithmetic rounded to 2^-24; the moments are differences of O(1) terms → ~1e-6
    got32 = float(ssim(x.float(), y.float(), padding=padding))
    assert abs(got32 - ref.mean()) < 2e-5
    assert 0.05 < ref.mean() < 0.95  # the test pair is neither trivial nor hopeless


def test_ssim_batch_and_identity(rng):
    a, b = _pair(rng, 20, 24, 0.2)
    c, d = _pair(rng, 20, 24, 0.05)
    batch = ssim(torch.stack([a, c]), torch.stack([b, d]))
    assert abs(float(batch) - 0.5 * float(ssim(a, b) + ssim(c, d))) < 1e-12
    assert float(ssim(a, a)) == pytest.approx(1.0, abs=1e-12)
    assert float(dssim(a, a)) == pytest.approx(0.0, abs=1e-12)
    assert float(ssim(a, b)) == pytest.approx(float(ssim(b, a)), abs=1e-14)  # symmetric
    assert float(ssim(a, b)) < float(ssim(c, d))  # more noise, lower SSIM


def test_ssim_gradient(rng):
    # full Jacobian on a small image with a small window; random projections (fast mode) at the real window
    x, y = _pair(rng, 6, 7, 0.1)
    x.requires_grad_(True)
    assert torch.autograd.gradcheck(lambda t: ssim(t, y, window_size=5, sigma=1.0), (x,), eps=1e-6, atol=1e-8)
    x, y = _pair(rng, 14, 15, 0.1)
    x.requires_grad_(True)
    for padding in ("same", "valid"):
        assert torch.autograd.gradcheck(lambda t: ssim(t, y, padding=padding), (x,), eps=1e-6, atol=1e-8,
                                        fast_mode=True)


def test_gaussian_window():
    w = gaussian_window_1d(11, 1.5, torch.float64)
    assert w.shape == (11,) and abs(float(w.sum()) - 1) < 1e-15
    ref = np.exp(-((np.arange(11) - 5) ** 2) / 4.5)
    np.testing.assert_allclose(w.numpy(), ref / ref.sum(), rtol=1e-14)
    with pytest.raises(ValueError, match="odd"):
        gaussian_window_1d(10)


def test_l1_mse_psnr(rng):
    x = torch.rand(9, 7, 3, generator=rng, dtype=torch.float64)
    y = torch.rand(9, 7, 3, generator=rng, dtype=torch.float64)
    assert float(l1_loss(x, y)) == pytest.approx(float(np.abs(x.numpy() - y.numpy()).mean()), rel=1e-14)
    m = float(((x.numpy() - y.numpy()) ** 2).mean())
    assert float(mse(x, y)) == pytest.approx(m, rel=1e-14)
    assert float(psnr(x, y)) == pytest.approx(-10 * math.log10(m), rel=1e-12)
    assert psnr_from_mse(m) == pytest.approx(-10 * math.log10(m), rel=1e-12)
    assert psnr_from_mse(0.0) == math.inf and math.isinf(float(psnr(x, x)))
    assert psnr_from_mse(1e-2) == pytest.approx(20.0)


def test_errors():
    a = torch.zeros(8, 8, 3)
    with pytest.raises(ValueError, match="differ in shape"):
        ssim(a, torch.zeros(8, 9, 3))
    with pytest.raises(ValueError, match="at least 11"):
        ssim(a, a, padding="valid")
    with pytest.raises(ValueError, match="padding"):
        ssim(a, a, padding="reflect")
    with pytest.raises(ValueError, match="expected an image"):
        ssim(torch.zeros(8, 3), torch.zeros(8, 3))
    with pytest.raises(ValueError, match="differ in shape"):
        l1_loss(a, torch.zeros(8, 8, 4))


# ---- fused CUDA SSIM (csrc/ssim.cu, rigel_core.cuda_backend.ssim_map_cuda) ----------------------------------------
from rigel_core import cuda_backend  # noqa: E402
from rigel_core.train.losses import ssim_map_reference  # noqa: E402

FUSED_SHAPES = [(1, 1), (5, 7), (16, 16), (37, 53), (64, 48), (401, 399)]


def _torch_map_bhwc(p, t):
    """The PyTorch path's map, moved to the fused path's channels-last layout (B, H, W, C)."""
    return ssim_map(p, t).permute(0, 2, 3, 1).contiguous()


def test_dispatch_by_device_cpu(rng, monkeypatch):
    # CPU images never reach the kernels; the reference is the same function ssim_map returns for them
    calls = []
    monkeypatch.setattr(cuda_backend, "ssim_map_cuda", lambda p, t: calls.append(p.shape))
    x, y = _pair(rng, 12, 13, 0.1)
    torch.testing.assert_close(ssim_map(x, y), ssim_map_reference(x, y), rtol=0, atol=0)
    assert calls == []


@pytest.mark.parametrize("batch", [False, True])
def test_fused_glue_layout_cpu(rng, monkeypatch, batch):
    # The glue of losses.ssim_map around the kernels (channels-last map → (B, C, H, W) view), with the kernel
    # replaced by the PyTorch path in the kernel's layout and the images made to look like CUDA tensors: the result
    # must equal the PyTorch path's.
    x, y = _pair(rng, 9, 14, 0.1)
    if batch:
        x, y = torch.stack([x, y]), torch.stack([y, x])
    want = ssim_map(x, y)
    kernel_out = _torch_map_bhwc(x, y)
    kernel_out = kernel_out if batch else kernel_out[0]  # the kernel returns the inputs' shape
    calls = []

    def fake_fused(p, t):
        calls.append(p.shape)
        return kernel_out

    class CudaLooking(torch.Tensor):
        is_cuda = True

    monkeypatch.setattr(cuda_backend, "ssim_map_cuda", fake_fused)
    got = ssim_map(x.as_subclass(CudaLooking), y.as_subclass(CudaLooking))
    assert calls == [x.shape]
    assert got.shape == want.shape
    torch.testing.assert_close(got.as_subclass(torch.Tensor), want, rtol=0, atol=0)
    # not the kernels' window, or a target that needs a gradient: the reference even for "CUDA" images
    ssim_map(x.as_subclass(CudaLooking), y.as_subclass(CudaLooking), window_size=7)
    ssim_map(x.as_subclass(CudaLooking), y.as_subclass(CudaLooking), sigma=2.0)
    ssim_map(x.as_subclass(CudaLooking), y.clone().requires_grad_(True).as_subclass(CudaLooking))
    assert len(calls) == 1


def _fused_called(monkeypatch):
    calls = []
    real = cuda_backend.ssim_map_cuda

    def spy(p, t):
        calls.append(p.shape)
        return real(p, t)

    monkeypatch.setattr(cuda_backend, "ssim_map_cuda", spy)
    return calls


def _check_fused(pred, target, monkeypatch, rng):
    """Fused map, mean and gradients (of the mean and of a random weighting of the map) vs float64 PyTorch."""
    calls = _fused_called(monkeypatch)
    x = pred.clone().requires_grad_(True)
    m = ssim_map(x, target)
    assert calls, "the fused path did not run"
    x64 = pred.detach().double().cpu().requires_grad_(True)
    t64 = target.double().cpu()
    m64 = ssim_map(x64, t64)
    assert m.shape == m64.shape and m.dtype == torch.float32
    assert torch.isfinite(m).all()
    assert (m.double().cpu() - m64).abs().max().item() <= 1e-5
    assert abs(m.double().mean().item() - m64.mean().item()) <= 1e-5
    weights = torch.rand(m64.shape, generator=rng, dtype=torch.float64)
    for reduce in (lambda t: t.mean(), lambda t: (t * weights.to(t)).sum()):
        (g,) = torch.autograd.grad(reduce(m), x, retain_graph=True)
        (g64,) = torch.autograd.grad(reduce(m64), x64, retain_graph=True)
        assert g.shape == pred.shape and torch.isfinite(g).all()
        err = (g.double().cpu() - g64).norm().item()
        scale = g64.norm().item()
        assert err <= 1e-5 * scale + 1e-10, (err, scale)  # + 1e-10: identical images, whose gradient is 0
    return m64


@pytest.mark.gpu
@pytest.mark.parametrize("shape", FUSED_SHAPES)
def test_fused_ssim_matches_float64(rng, monkeypatch, shape):
    x, y = _pair(rng, *shape, noise=0.1, dtype=torch.float32)
    _check_fused(x.cuda(), y.cuda(), monkeypatch, rng)


@pytest.mark.gpu
@pytest.mark.parametrize("channels", [1, 4])
def test_fused_ssim_batch_and_channels(rng, monkeypatch, channels):
    x = torch.rand(3, 29, 41, channels, generator=rng)
    y = (x + 0.1 * torch.randn(3, 29, 41, channels, generator=rng)).clamp(0, 1)
    _check_fused(x.cuda(), y.cuda(), monkeypatch, rng)
    # a batch = its images one by one
    xs, ys = x.cuda(), y.cuda()
    whole = ssim_map(xs, ys)
    for b in range(3):
        torch.testing.assert_close(whole[b:b + 1], ssim_map(xs[b], ys[b]), rtol=0, atol=0)


@pytest.mark.gpu
def test_fused_ssim_non_contiguous_input(rng, monkeypatch):
    x = torch.rand(3, 40, 33, generator=rng).cuda().permute(1, 2, 0)  # (H, W, C) view of a CHW tensor
    y = torch.rand(40, 33, 3, generator=rng).cuda()
    assert not x.is_contiguous()
    _check_fused(x, y, monkeypatch, rng)


@pytest.mark.gpu
def test_fused_ssim_identical_and_constant(rng, monkeypatch):
    x, _ = _pair(rng, 45, 38, 0.1, dtype=torch.float32)
    x = x.cuda()
    # identical images: SSIM = 1 everywhere, the gradient is zero (the maximum)
    m64 = _check_fused(x, x.clone(), monkeypatch, rng)
    assert float(m64.min()) > 1 - 1e-12
    xg = x.clone().requires_grad_(True)
    (g,) = torch.autograd.grad(ssim(xg, x), xg)
    assert g.abs().max().item() <= 1e-6 / x.numel()
    # constant images: flat interior (variance 0, the ill-conditioned case of E[x²] − μ²), zero-padded borders
    for a, b in ((0.7, 0.3), (0.5, 0.5), (0.0, 0.0), (0.0, 1.0)):
        _check_fused(torch.full((33, 50, 3), a, device="cuda"), torch.full((33, 50, 3), b, device="cuda"),
                     monkeypatch, rng)


@pytest.mark.gpu
def test_fused_ssim_outputs_fully_written(rng):
    # The kernels' outputs come from torch's caching allocator: fill blocks of the same sizes with NaN and free
    # them first, so that any element a kernel fails to write shows up as NaN.
    from rigel_core import _ext

    C = _ext.get()
    for h, w in ((37, 53), (16, 16), (5, 7)):
        x = torch.rand(2, h, w, 3, generator=rng).cuda()
        y = torch.rand(2, h, w, 3, generator=rng).cuda()
        poison = [torch.full_like(x, math.nan), torch.full((3, 2, h, w, 3), math.nan, dtype=torch.float64,
                                                           device="cuda")]
        del poison
        smap, coef = C.ssim_map(x, y)
        assert torch.isfinite(smap).all() and torch.isfinite(coef).all()
        g = torch.rand(2, h, w, 3, generator=rng).cuda()
        poison = torch.full_like(x, math.nan)
        del poison
        dx = C.ssim_map_backward(x, y, coef, g)
        assert torch.isfinite(dx).all()


@pytest.mark.gpu
def test_fused_ssim_dispatch_on_gpu(rng, monkeypatch):
    x, y = _pair(rng, 20, 22, 0.1, dtype=torch.float32)
    x, y = x.cuda(), y.cuda()
    calls = _fused_called(monkeypatch)
    fused = ssim(x, y)
    assert len(calls) == 1
    assert abs(float(ssim_map_reference(x, y).mean()) - float(fused)) < 1e-5
    # non-default arguments, a target that needs a gradient: the reference (the kernels have one window)
    ssim(x, y, window_size=7)
    ssim(x, y, sigma=2.0)
    ssim(x, x, padding="valid")
    xt, yt = x.clone().requires_grad_(True), y.clone().requires_grad_(True)
    ssim(xt, yt).backward()
    assert len(calls) == 1
    assert xt.grad is not None and yt.grad is not None
    # CUDA images must be float32, as for every kernel (no silent cast)
    with pytest.raises(TypeError, match="float32"):
        ssim(x.double(), y.double())


@pytest.mark.gpu
def test_fused_ssim_host_checks():
    from rigel_core import _ext

    C = _ext.get()
    a = torch.rand(8, 9, 3, device="cuda")
    with pytest.raises(TypeError, match="CUDA"):
        C.ssim_map(a.cpu(), a.cpu())
    with pytest.raises(TypeError, match="float32"):
        C.ssim_map(a.double(), a.double())
    with pytest.raises(ValueError, match="contiguous"):
        C.ssim_map(a.transpose(0, 1), a.transpose(0, 1))
    with pytest.raises(ValueError, match="shape"):
        C.ssim_map(a, torch.rand(8, 9, 4, device="cuda"))
    with pytest.raises(ValueError, match="channels-last"):
        C.ssim_map(a[..., 0], a[..., 0])
    smap, coef = C.ssim_map(a, a)
    with pytest.raises(TypeError, match="float64"):
        C.ssim_map_backward(a, a, coef.float(), a)
    with pytest.raises(ValueError, match="shape"):
        C.ssim_map_backward(a, a, coef[:2], a)
