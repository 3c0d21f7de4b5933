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
    # mixed dtypes and non-tensors: one clear line, whichever argument it is (float32 pred with a float64 target
    # used to raise torch's "expected scalar type Double but found Float", the other order silently promoted)
    from rigel_core.train.losses import loss_terms

    for f in (l1_loss, ssim, mse, loss_terms):
        with pytest.raises(TypeError, match=r"prediction \(torch.float32\) and target \(torch.float64\) differ"):
            f(a, a.double())
        with pytest.raises(TypeError, match=r"prediction \(torch.float64\) and target \(torch.float32\) differ"):
            f(a.double(), a)
        with pytest.raises(TypeError, match="target: expected a torch.Tensor image, got ndarray"):
            f(a, a.numpy())
        with pytest.raises(TypeError, match="prediction: expected a torch.Tensor image, got ndarray"):
            f(a.numpy(), a)


# ---- fused CUDA SSIM (csrc/ssim.cu, rigel_core.renderer.cuda_backend.ssim_map_cuda) ---------------------------------
from helpers import CudaLooking, pretend_kernels_built  # noqa: E402
from rigel_core.renderer import cuda_backend  # noqa: E402
from rigel_core.train.losses import SSIM_SIGMA, SSIM_WINDOW, ssim_map_reference  # noqa: E402

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

    pretend_kernels_built(monkeypatch)
    monkeypatch.setattr(cuda_backend, "ssim_map_cuda", fake_fused)
    got = ssim_map(x.as_subclass(CudaLooking), y.as_subclass(CudaLooking))
    assert calls == [x.shape]
    assert got.shape == want.shape
    torch.testing.assert_close(got.as_subclass(torch.Tensor), want, rtol=0, atol=0)
    # not the kernels' window, or a target that needs a gradient: the reference even for "CUDA" images (a
    # stand-in here: the real one would allocate on the device the images claim)
    import rigel_core.train.losses as losses_module

    refs = []
    monkeypatch.setattr(losses_module, "ssim_map_reference", lambda p, t, **kw: refs.append(kw))
    ssim_map(x.as_subclass(CudaLooking), y.as_subclass(CudaLooking), window_size=7)
    ssim_map(x.as_subclass(CudaLooking), y.as_subclass(CudaLooking), sigma=2.0)
    ssim_map(x.as_subclass(CudaLooking), y.clone().requires_grad_(True).as_subclass(CudaLooking))
    assert len(calls) == 1 and [r["window_size"] for r in refs] == [7, SSIM_WINDOW, SSIM_WINDOW]
    assert [r["sigma"] for r in refs] == [SSIM_SIGMA, 2.0, SSIM_SIGMA]


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


# ---- the trainer's loss terms (losses.loss_terms; fused: csrc/ssim.cu photometric_sums) ---------------------------
from rigel_core.train.losses import apply_mask, loss_terms  # noqa: E402

MASK_KINDS = ["none", "random", "all", "empty"]


def _images(rng, shape, noise=0.1):
    """float32 (pred, target) of ``shape`` ((H, W, C) or (B, H, W, C)) in [0, 1], built as :func:`_pair`: structure
    at the window's scale plus noise, so SSIM is far from 0 and from 1."""
    x = torch.rand(shape, generator=rng, dtype=torch.float64)
    xb = x.reshape(-1, *shape[-3:]).permute(0, 3, 1, 2)
    xb = 0.5 * xb + 0.5 * torch.nn.functional.avg_pool2d(xb, 5, 1, 2)
    x = xb.permute(0, 2, 3, 1).reshape(shape)
    y = (x + noise * torch.randn(shape, generator=rng, dtype=torch.float64)).clamp(0, 1)
    return x.float(), y.float()


def _mask(rng, shape, kind):
    """None ("none") or a bool mask of the images' (B,) H, W: "all" / "empty" (every pixel / none counts), or
    "random": 4-px blocks kept with probability 0.75, then single pixels dropped with probability 0.1."""
    hw = tuple(shape[:-1])
    if kind == "none":
        return None
    if kind == "all":
        return torch.ones(hw, dtype=torch.bool)
    if kind == "empty":
        return torch.zeros(hw, dtype=torch.bool)
    blocks = torch.rand(*hw[:-2], -(-hw[-2] // 4), -(-hw[-1] // 4), generator=rng) < 0.75
    m = blocks.repeat_interleave(4, -2).repeat_interleave(4, -1)[..., :hw[-2], :hw[-1]]
    return m & (torch.rand(hw, generator=rng) < 0.9)


def _masked_sums_reference(pred, target, mask):
    """float64 ``(Σ m|p − t|, Σ m·S, Σ m(p − t)², Σ m)`` over every element, from the reference ops on the masked
    images (apply_mask: 0 where the mask is false), differentiable w.r.t. ``pred`` by autograd. mask None: all."""
    if mask is None:
        mask = torch.ones(pred.shape[:-1], dtype=torch.bool)
    p, t, m, _ = apply_mask(pred, target, mask)
    d = p - t
    smap = ssim_map_reference(p, t)  # (B, C, H, W)
    mb = (m if m.dim() == 4 else m[None]).permute(0, 3, 1, 2)  # (B|1, 1, H, W)
    s = torch.where(mb, smap, smap.new_zeros(())).sum()
    count = (m.expand(*pred.shape[:-1], 1).sum() * pred.shape[-1]).to(d.dtype)
    return torch.stack([d.abs().sum(), s, (d * d).sum(), count])


def _photometric_called(monkeypatch):
    calls = []
    real = cuda_backend.photometric_sums_cuda

    def spy(p, t, m=None, **kw):
        calls.append(p.shape)
        return real(p, t, m, **kw)

    monkeypatch.setattr(cuda_backend, "photometric_sums_cuda", spy)
    return calls


PHOTO_SHAPES = [(23, 37, 3), (40, 17, 3), (3, 21, 35, 3), (2, 16, 16, 1), (5, 7, 4)]


@pytest.mark.gpu
@pytest.mark.parametrize("mask_kind", MASK_KINDS)
@pytest.mark.parametrize("shape", PHOTO_SHAPES)
def test_photometric_sums_match_float64_losses(rng, shape, mask_kind):
    x, y = _images(rng, shape)
    mask = _mask(rng, shape, mask_kind)
    totals = cuda_backend.photometric_sums_cuda(x.cuda(), y.cuda(), None if mask is None else mask.cuda())
    assert totals.shape == (4,) and totals.dtype == torch.float64 and totals.is_cuda
    t = totals.cpu()
    assert torch.isfinite(t).all()
    count = x.numel() if mask is None else int(mask.sum()) * shape[-1]
    assert t[3].item() == count  # a float64 sum of ones: exact
    n = max(count, 1)
    x64, y64 = x.double(), y.double()
    want_l1, want_s, want_mse = l1_loss(x64, y64, mask), ssim(x64, y64, mask=mask), mse(x64, y64, mask)
    # float64 sums of exact float32 differences: summation order only; SSIM in float64 from the exact inputs
    # (its moments are differences of O(1) terms, divided by ≥ C2: ~1e-13 per pixel)
    assert t[0].item() / n == pytest.approx(want_l1.item(), rel=1e-12, abs=1e-15)
    assert t[2].item() / n == pytest.approx(want_mse.item(), rel=1e-12, abs=1e-15)
    assert abs(t[1].item() / n - want_s.item()) <= 1e-9
    if count:
        assert 0.05 < want_s.item() < 0.99  # neither trivial nor hopeless (small images: mostly zero padding)
    else:  # nothing counts: exact zeros, and loss_terms clamps the count to 1 (finite, not NaN)
        assert torch.equal(t, torch.zeros(4, dtype=torch.float64))
        lam = float(torch.rand((), generator=rng))
        xg = x.cuda().requires_grad_(True)
        loss, l1, s, m = loss_terms(xg, y.cuda(), mask.cuda(), lambda_dssim=lam)
        assert all(math.isfinite(v.item()) for v in (loss, l1, s, m))
        assert l1.item() == 0.0 and s.item() == 0.0 and m.item() == 0.0
        assert loss.item() == pytest.approx(lam, rel=1e-6)
        (g,) = torch.autograd.grad(loss, xg)
        assert torch.equal(g, torch.zeros_like(g))


def _upstreams(rng):
    """Upstream gradients of the four totals: each of the three terms alone, then all together; v[3] (the count's)
    arbitrary, as it must be ignored."""
    vs = []
    for k in range(4):
        v = torch.randn(4, generator=rng, dtype=torch.float64)
        if k < 3:
            v[:3] = 0.0
            v[k] = 0.5 + torch.rand((), generator=rng, dtype=torch.float64)
        v[3] = 1e3 * torch.randn((), generator=rng, dtype=torch.float64)
        vs.append(v)
    return vs


@pytest.mark.gpu
@pytest.mark.parametrize("mask_kind", ["none", "random", "empty"])
@pytest.mark.parametrize("shape", [(23, 37, 3), (2, 40, 17, 3), (5, 7, 4)])
def test_photometric_sums_gradient_matches_float64(rng, shape, mask_kind):
    from rigel_core import _ext

    C = _ext.get()
    x, y = _images(rng, shape)
    mask = _mask(rng, shape, mask_kind)
    mc = None if mask is None else mask.cuda()
    xc, yc = x.cuda(), y.cuda()
    xg = xc.clone().requires_grad_(True)
    totals = cuda_backend.photometric_sums_cuda(xg, yc, mc)
    x64 = x.double().requires_grad_(True)
    ref = _masked_sums_reference(x64, y.double(), mask)
    _, coef = C.photometric_sums(xc, yc, mc)
    for v in _upstreams(rng):
        (g,) = torch.autograd.grad((totals * v.cuda()).sum(), xg, retain_graph=True)
        (g64,) = torch.autograd.grad((ref[:3] * v[:3]).sum(), x64, retain_graph=True)
        assert g.shape == shape and g.dtype == torch.float32 and torch.isfinite(g).all()
        err = (g.double().cpu() - g64).norm().item()
        scale = g64.norm().item()
        assert err <= 1e-5 * scale + 1e-10, (v, err, scale)
        if mask is not None:  # exactly no gradient where the mask is false
            assert torch.all(g.cpu()[~mask[..., None].expand(shape)] == 0)
        if mask_kind != "empty":
            assert scale > 0
        # the op itself: the same numbers as through autograd, and the count's gradient is never read
        direct = C.photometric_sums_backward(xc, yc, mc, coef, v.cuda())
        assert torch.equal(direct, g)
        v_nan = v.clone()
        v_nan[3] = math.nan
        assert torch.equal(C.photometric_sums_backward(xc, yc, mc, coef, v_nan.cuda()), g)


@pytest.mark.gpu
@pytest.mark.parametrize("fp32", [False, True])
@pytest.mark.parametrize("shape", [(23, 37, 3), (2, 40, 17, 3), (13, 9, 1)])
def test_photometric_sums_ignore_masked_values(rng, shape, fp32):
    from rigel_core import _ext

    C = _ext.get()
    x, y = _images(rng, shape)
    mask = _mask(rng, shape, "random")
    inv = ~mask[..., None].expand(shape)
    assert inv.any() and (~inv).any()
    v = torch.randn(4, generator=rng, dtype=torch.float64).cuda()
    mc = mask.cuda()

    def run(a, b):
        a, b = a.cuda(), b.cuda()
        totals, coef = C.photometric_sums(a, b, mc, fp32=fp32)
        return totals.cpu(), coef.cpu(), C.photometric_sums_backward(a, b, mc, coef, v).cpu()

    t0, c0, g0 = run(torch.where(inv, 0.0, x), torch.where(inv, 0.0, y))
    assert torch.all(g0[inv] == 0) and g0[~inv].abs().sum() > 0
    one_block = len(shape) == 3 and shape[0] <= 16 and shape[1] <= 16 and shape[2] == 1
    for fx, fy in ((math.nan, math.nan), (math.inf, -math.inf), (1e30, -1e30), (-7.0, 3.0), (None, None)):
        a, b = x.clone(), y.clone()  # None: the images' own values stay there
        if fx is not None:
            a[inv], b[inv] = fx, fy
        t1, c1, g1 = run(a, b)
        assert torch.equal(c1, c0) and torch.equal(g1, g0), (fx, fy)
        if one_block:  # one block, one atomic per total: bit for bit
            assert torch.equal(t1, t0), (fx, fy)
        else:  # the blocks' atomics may add in another order: the last bits only
            torch.testing.assert_close(t1, t0, rtol=1e-13, atol=0)


@pytest.mark.gpu
@pytest.mark.parametrize("fp32", [False, True])
def test_photometric_sums_outputs_fully_written(rng, fp32):
    # As test_fused_ssim_outputs_fully_written: blocks of the outputs' sizes filled with NaN and freed first, so
    # an element the kernels fail to write (or a total not zeroed) shows up.
    from rigel_core import _ext

    C = _ext.get()
    for shape in ((2, 37, 53, 3), (16, 16, 3), (5, 7, 1)):
        x, y = _images(rng, shape)
        for mask in (None, _mask(rng, shape, "random")):
            xc, yc, mc = x.cuda(), y.cuda(), None if mask is None else mask.cuda()
            poison = [torch.full((4,), math.nan, dtype=torch.float64, device="cuda"),
                      torch.full((5 if fp32 else 3, *shape), math.nan, dtype=torch.float32 if fp32 else torch.float64,
                                 device="cuda")]
            del poison
            totals, coef = C.photometric_sums(xc, yc, mc, fp32=fp32)
            assert torch.isfinite(totals).all() and torch.isfinite(coef).all()
            assert coef.shape == (5 if fp32 else 3, *shape)
            ref = _masked_sums_reference(x.double(), y.double(), mask)
            tol = 1e-5 if fp32 else 1e-9  # float32 SSIM per pixel (the sums of differences are exact either way)
            torch.testing.assert_close(totals.cpu(), ref, rtol=tol, atol=tol)
            v = torch.randn(4, generator=rng, dtype=torch.float64).cuda()
            poison = torch.full_like(xc, math.nan)
            del poison
            g = C.photometric_sums_backward(xc, yc, mc, coef, v)
            assert torch.isfinite(g).all()
            if mask is not None:
                assert torch.all(g.cpu()[~mask[..., None].expand(shape)] == 0)


def _flat_images(rng, shape):
    """A near-flat pair (values 0.5 ± 0.002, the prediction 0.001 away): local variances ~1e-6, far below C2, where
    SSIM's moments and its backward's sum A + 2x·B + y·Cc cancel (B, Cc ~ 1/C2): the float32 kernels' hard case."""
    x = 0.5 + 0.002 * torch.rand(shape, generator=rng, dtype=torch.float64)
    y = x + 0.001 * torch.randn(shape, generator=rng, dtype=torch.float64)
    return x.float(), y.float()


@pytest.mark.gpu
@pytest.mark.parametrize("images", ["structured", "flat"])
@pytest.mark.parametrize("mask_kind", ["none", "random", "corners"])
@pytest.mark.parametrize("shape", [(23, 37, 3), (2, 40, 17, 3), (70, 45, 1)])
def test_photometric_sums_fp32_against_float64(rng, shape, mask_kind, images):
    """The float32 locally centred kernels (fp32=True) against the float64 reference: the L1 / squared-error sums
    and the count exactly as the float64 kernels (float64 sums of exact float32 differences), SSIM's mean and the
    gradient of every term to float32 accuracy — also on near-flat images, where the same float32 arithmetic
    without the centring errs by ~6e-5 (tolerances from test_fp32_centring_emulated's float32 run of the same
    algorithm on the CPU: SSIM per pixel ≤ 1.1e-6, gradient 4e-7 structured / 4e-6 flat relative; not yet from a
    GPU run)."""
    x, y = _images(rng, shape) if images == "structured" else _flat_images(rng, shape)
    if mask_kind == "corners":  # every tile's first pixel masked out: the centring must take another one
        mask = torch.ones(shape[:-1], dtype=torch.bool)
        mask[..., ::16, ::16] = False
    else:
        mask = _mask(rng, shape, mask_kind)
    mc = None if mask is None else mask.cuda()
    xg = x.cuda().requires_grad_(True)
    totals = cuda_backend.photometric_sums_cuda(xg, y.cuda(), mc, fp32=True)
    x64 = x.double().requires_grad_(True)
    ref = _masked_sums_reference(x64, y.double(), mask)
    t = totals.detach().cpu()
    assert t[3].item() == ref[3].item()
    n = max(ref[3].item(), 1.0)
    assert t[0].item() == pytest.approx(ref[0].item(), rel=1e-12, abs=1e-15)
    assert t[2].item() == pytest.approx(ref[2].item(), rel=1e-12, abs=1e-15)
    assert abs(t[1].item() - ref[1].item()) / n <= 2e-6
    for v in _upstreams(rng):
        (g,) = torch.autograd.grad((totals * v.cuda()).sum(), xg, retain_graph=True)
        (g64,) = torch.autograd.grad((ref[:3] * v[:3]).sum(), x64, retain_graph=True)
        assert torch.isfinite(g).all()
        err, scale = (g.double().cpu() - g64).norm().item(), g64.norm().item()
        tol = 3e-5 if images == "flat" else 1e-5
        assert scale > 0 and err <= tol * scale, (images, v, err, scale)
        if mask is not None:
            assert torch.all(g.cpu()[~mask[..., None].expand(shape)] == 0)


@pytest.mark.gpu
def test_loss_terms_fp32_and_the_config_switch(rng, monkeypatch):
    """loss_terms(fp32=True) takes the float32 kernels and agrees with the float64 ones to float32 accuracy; the
    Trainer passes TrainConfig.loss_float32."""
    from rigel_core import Camera, GaussianModel
    from rigel_core.data import Dataset, Frame
    from rigel_core.train import TrainConfig, Trainer

    x, y = _images(rng, (31, 45, 3))
    mask = _mask(rng, (31, 45, 3), "random").cuda()
    a = loss_terms(x.cuda(), y.cuda(), mask, fp32=False)
    b = loss_terms(x.cuda(), y.cuda(), mask, fp32=True)
    for u, w in zip(a, b):
        assert u.item() == pytest.approx(w.item(), rel=1e-5, abs=1e-7)
    seen = []
    real = cuda_backend.photometric_sums_cuda
    monkeypatch.setattr(cuda_backend, "photometric_sums_cuda",
                        lambda p, t, m=None, fp32=False: seen.append(fp32) or real(p, t, m, fp32=fp32))
    cam = Camera.look_at((0.5, -3.0, 1.2), (0, 0, 0), (0, 0, 1), width=45, height=31, fov_x_deg=60, name="v")
    ds = Dataset([Frame(cam, y, None, "v", None)], [], np.zeros(3), 3.0)
    for flag in (False, True):
        pts = (torch.rand(40, 3, generator=rng) * 2 - 1) * 0.8
        model = GaussianModel.from_points(pts, torch.rand(40, 3, generator=rng), sh_degree=1, scale=0.15, opacity=0.7)
        tr = Trainer(ds, TrainConfig(sh_degree=1, strategy="default", densify_from=1000, seed=1, loss_float32=flag),
                     device="cuda", model=model)
        seen.clear()
        tr.loss_terms(x.cuda(), y.cuda())
        assert seen == [flag]


LOSS_TERM_CASES = [("none", (31, 45, 3)), ("random", (31, 45, 3)), ("float", (31, 45, 3)), ("view", (31, 45, 3)),
                   ("batch", (2, 27, 35, 3)), ("shared", (2, 27, 35, 3)), ("empty", (31, 45, 3))]


def _loss_term_mask(rng, shape, kind):
    """The mask of a LOSS_TERM_CASES case as the trainer may pass it: bool (H, W) or (B, H, W), a float {0, 1}
    one ("float"), one (H, W) mask for a batch ("shared"), or None ("none", "view")."""
    if kind in ("none", "view"):
        return None
    if kind == "empty":
        return _mask(rng, shape, "empty")
    m = _mask(rng, shape[1:] if kind == "shared" else shape, "random")
    return m.double() if kind == "float" else m


@pytest.mark.gpu
@pytest.mark.parametrize("kind,shape", LOSS_TERM_CASES)
def test_loss_terms_cuda_matches_cpu(rng, monkeypatch, kind, shape):
    x, y = _images(rng, shape)
    mask = _loss_term_mask(rng, shape, kind)
    lam = float(torch.rand((), generator=rng))
    if mask is not None:  # poison the masked pixels of both images, on both devices
        inv = ~(mask > 0.5)[..., None].expand(shape)
        x[inv], y[inv] = math.nan, math.inf
    calls = _photometric_called(monkeypatch)
    xc = x.cuda()
    if kind == "view":  # a non-contiguous prediction (a (H, W, C) view of a CHW tensor)
        xc = x.permute(2, 0, 1).contiguous().cuda().permute(1, 2, 0)
        assert not xc.is_contiguous()
    xc.requires_grad_(True)
    mc = None if mask is None else (mask if kind == "float" else mask.cuda())  # the float mask stays on the CPU
    got = loss_terms(xc, y.cuda(), mc, lambda_dssim=lam)
    assert calls == [shape], "the fused path did not run"
    x64 = x.double().requires_grad_(True)
    want = loss_terms(x64, y.double(), mask, lambda_dssim=lam)
    for a, b in zip(got, want):
        assert a.shape == () and a.is_cuda and a.dtype == torch.float32
        assert math.isfinite(a.item()) and abs(a.item() - b.item()) <= 1e-6, (kind, got, want)
    assert [t.requires_grad for t in got] == [True, True, True, False]
    assert [t.requires_grad for t in want] == [True, True, True, False]
    (g,) = torch.autograd.grad(got[0], xc)
    (g64,) = torch.autograd.grad(want[0], x64)
    assert g.shape == shape and torch.isfinite(g).all()
    err, scale = (g.double().cpu() - g64).norm().item(), g64.norm().item()
    assert err <= 1e-5 * scale + 1e-10, (err, scale)
    if mask is not None:
        assert torch.all(g.cpu()[inv] == 0)
    if kind == "empty":
        assert scale == 0 and got[0].item() == pytest.approx(lam, rel=1e-6)
    else:
        assert scale > 0


@pytest.mark.gpu
def test_loss_terms_cuda_target_with_gradient_is_not_fused(rng, monkeypatch):
    x, y = _images(rng, (26, 33, 3))
    mask = _mask(rng, (26, 33, 3), "random").cuda()
    calls = _photometric_called(monkeypatch)
    fused = loss_terms(x.cuda(), y.cuda(), mask)
    assert len(calls) == 1
    yt = y.cuda().requires_grad_(True)
    plain = loss_terms(x.cuda(), yt, mask)
    assert len(calls) == 1  # the kernels give no gradient to the target: the module's functions
    for a, b in zip(fused, plain):
        assert abs(a.item() - b.item()) <= 2e-5  # float32 reference SSIM: ~1e-6
    plain[0].backward()
    assert yt.grad is not None and torch.isfinite(yt.grad).all()


@pytest.mark.gpu
def test_photometric_sums_host_checks():
    from rigel_core import _ext

    C = _ext.get()
    a = torch.rand(8, 9, 3, device="cuda")
    ab = torch.rand(2, 8, 9, 3, device="cuda")
    m = torch.rand(8, 9, device="cuda") < 0.5
    mb = torch.rand(2, 8, 9, device="cuda") < 0.5
    for f in (cuda_backend.photometric_sums_cuda, C.photometric_sums):
        with pytest.raises(TypeError, match="mask"):
            f(a, a, m.float())
        with pytest.raises(ValueError, match="mask"):
            f(a, a, m[:, :8])
        with pytest.raises(ValueError, match="mask"):
            f(a, a, mb)  # a (B, H, W) mask for one image
        with pytest.raises(ValueError, match="mask"):
            f(ab, ab, m)  # the kernels take a batch's (B, H, W) mask (loss_terms expands an (H, W) one)
        with pytest.raises(TypeError, match="float32"):
            f(a.double(), a.double(), None)
        with pytest.raises(ValueError, match="target"):
            f(a, torch.rand(8, 9, 4, device="cuda"), None)
    with pytest.raises(ValueError, match="mask"):
        C.photometric_sums(a, a, (torch.rand(9, 8, device="cuda") < 0.5).t())  # not contiguous
    with pytest.raises(TypeError, match="mask"):
        C.photometric_sums(a, a, m.cpu())
    with pytest.raises(ValueError, match="mask"):
        loss_terms(a, a, m[:, :8])
    totals, coef = C.photometric_sums(a, a, m)
    totals_b, coef_b = C.photometric_sums(ab, ab, mb)
    assert torch.isfinite(totals).all() and torch.isfinite(totals_b).all()
    v = torch.zeros(4, dtype=torch.float64, device="cuda")
    for bad in (v[:3], torch.zeros(5, dtype=torch.float64, device="cuda"), v[None], v.repeat(2)[::2]):
        with pytest.raises(ValueError, match="v_totals"):
            C.photometric_sums_backward(a, a, m, coef, bad)
    for bad in (v.float(), v.cpu()):
        with pytest.raises(TypeError, match="v_totals"):
            C.photometric_sums_backward(a, a, m, coef, bad)
    with pytest.raises(ValueError, match="coef"):
        C.photometric_sums_backward(a, a, m, coef[:2], v)
    with pytest.raises(ValueError, match="coef"):  # float32 is the fp32 kernels' coef, which is (5, ...)
        C.photometric_sums_backward(a, a, m, coef.float(), v)
    with pytest.raises(TypeError, match="coef"):
        C.photometric_sums_backward(a, a, m, coef.half(), v)
    totals32, coef32 = C.photometric_sums(a, a, m, fp32=True)
    assert coef32.shape == (5, 8, 9, 3) and coef32.dtype == torch.float32
    with pytest.raises(ValueError, match="coef"):
        C.photometric_sums_backward(a, a, m, coef32[:3].contiguous(), v)
    with pytest.raises(ValueError, match="mask"):
        C.photometric_sums_backward(a, a, m[:, :8].contiguous(), coef, v)
    with pytest.raises(TypeError, match="mask"):
        C.photometric_sums_backward(a, a, m.float(), coef, v)
    with pytest.raises(ValueError, match="mask"):
        C.photometric_sums_backward(ab, ab, m, coef_b, v)
    assert torch.isfinite(C.photometric_sums_backward(ab, ab, mb, coef_b, v)).all()


# ---- loss_terms on the CPU ----------------------------------------------------------------------------------------
def _loss_terms_numpy(p, t, mask, lam):
    """(loss, l1, ssim, mse) in float64 from the definitions: masked-out pixels of both images set to 0, means over
    the valid values (pixels × channels, at least 1), SSIM from the explicit-window :func:`ssim_reference`."""
    p, t = p.reshape(-1, *p.shape[-3:]), t.reshape(-1, *t.shape[-3:])  # (B, H, W, C)
    m = np.ones(p.shape[:-1], bool) if mask is None else np.broadcast_to(mask.numpy() > 0.5, p.shape[:-1])
    pz, tz = np.where(m[..., None], p, 0.0), np.where(m[..., None], t, 0.0)
    n = max(int(m.sum()) * p.shape[-1], 1)
    d = (pz - tz)[m]  # (valid pixels, C)
    l1, se = np.abs(d).sum() / n, (d ** 2).sum() / n
    s = sum(ssim_reference(pz[b], tz[b], "same").transpose(1, 2, 0)[m[b]].sum() for b in range(len(p))) / n
    return (1 - lam) * l1 + lam * (1 - s), l1, s, se


@pytest.mark.parametrize("kind,shape", [("none", (19, 23, 3)), ("random", (19, 23, 3)), ("float", (19, 23, 3)),
                                        ("batch", (2, 17, 21, 3)), ("shared", (2, 17, 21, 3)),
                                        ("empty", (19, 23, 3))])
def test_loss_terms_cpu_match_their_definition(rng, one_thread, kind, shape):
    x, y = _images(rng, shape)
    x, y = x.double(), y.double()
    mask = _loss_term_mask(rng, shape, kind)
    lam = float(torch.rand((), generator=rng, dtype=torch.float64))
    xg = x.clone().requires_grad_(True)
    got = loss_terms(xg, y, mask, lambda_dssim=lam)
    want = _loss_terms_numpy(x.numpy(), y.numpy(), mask, lam)
    for a, b in zip(got, want):
        assert a.shape == () and a.dtype == torch.float64
        assert abs(a.item() - b) <= 1e-12, (kind, got, want)
    assert [t.requires_grad for t in got] == [True, True, True, False]  # mse: a metric, detached
    if kind == "empty":
        assert got[0].item() == pytest.approx(lam, abs=1e-15) and got[1].item() == got[2].item() == 0.0
    # the default λ is the trainer's 0.2
    loss, l1, s, _ = loss_terms(x, y, mask)
    assert loss.item() == pytest.approx(0.8 * l1.item() + 0.2 * (1 - s.item()), rel=1e-14, abs=1e-15)
    (g0,) = torch.autograd.grad(got[0], xg)
    if mask is None:
        return
    # masked pixels: NaN / inf / huge in either image change nothing, bit for bit, and get exactly no gradient
    inv = ~(mask > 0.5)[..., None].expand(shape)
    for fx, fy in ((math.nan, math.nan), (math.inf, 1e30), (-1e30, math.nan)):
        a, b = x.clone(), y.clone()
        a[inv], b[inv] = fx, fy
        a.requires_grad_(True)
        again = loss_terms(a, b, mask, lambda_dssim=lam)
        assert all(torch.equal(u, w) for u, w in zip(again, got)), (fx, fy)
        (g1,) = torch.autograd.grad(again[0], a)
        assert torch.equal(g1, g0)
    assert torch.all(g0[inv] == 0)
    if kind != "empty":
        assert g0[~inv].abs().sum() > 0


def test_loss_terms_cpu_gradient(rng, one_thread):
    shape = (2, 9, 12, 2)
    x, y = _images(rng, shape)
    x, y = x.double().requires_grad_(True), y.double()
    mask = _mask(rng, shape, "random")
    lam = float(torch.rand((), generator=rng, dtype=torch.float64))
    for m in (None, mask):
        assert torch.autograd.gradcheck(lambda t: loss_terms(t, y, m, lambda_dssim=lam)[0], (x,), eps=1e-6,
                                        atol=1e-8, fast_mode=True)


def test_trainer_compute_loss_is_loss_terms(rng, one_thread):
    from rigel_core import Camera, GaussianModel
    from rigel_core.data import Dataset, Frame
    from rigel_core.train import TrainConfig, Trainer

    w, h = 30, 24
    cam = Camera.look_at((0.5, -3.0, 1.2), (0, 0, 0), (0, 0, 1), width=w, height=h, fov_x_deg=60, name="v")
    gt_img = torch.rand(h, w, 3, generator=rng)
    mask = _mask(rng, (h, w, 3), "random")
    lam = 0.05 + 0.9 * float(torch.rand((), generator=rng))
    pts = (torch.rand(40, 3, generator=rng) * 2 - 1) * 0.8
    model = GaussianModel.from_points(pts, torch.rand(40, 3, generator=rng), sh_degree=1, scale=0.15, opacity=0.7)
    ds = Dataset([Frame(cam, gt_img, None, "v", mask)], [], np.zeros(3), 3.0)
    tr = Trainer(ds, TrainConfig(sh_degree=1, lambda_dssim=lam, strategy="default", densify_from=1000, seed=1),
                 device="cpu", model=model)
    pred = torch.rand(h, w, 3, generator=rng, requires_grad=True)
    for args in ((pred, gt_img), (pred, gt_img, None), (pred, gt_img, mask)):
        terms = tr.loss_terms(*args)
        three = tr.compute_loss(*args)
        assert len(terms) == 4 and len(three) == 3
        assert all(torch.equal(a, b) for a, b in zip(three, terms[:3]))
        # λ is the config's
        assert all(torch.equal(a, b) for a, b in zip(terms, loss_terms(*args, lambda_dssim=lam)))
        loss, l1, s, m = terms
        assert loss.item() == pytest.approx((1 - lam) * l1.item() + lam * (1 - s.item()), rel=1e-6)
        assert not m.requires_grad and m.item() == pytest.approx(mse(*args).item(), rel=1e-6)
        (g3,) = torch.autograd.grad(three[0], pred)
        (g4,) = torch.autograd.grad(terms[0], pred)
        assert torch.equal(g3, g4)
    # the step reports the terms loss_terms gave it (its PSNR from their MSE)
    seen = []
    orig = tr.loss_terms

    def spy(*a, **k):
        seen.append(orig(*a, **k))
        return seen[-1]

    tr.loss_terms = spy
    r = tr.step()
    assert len(seen) == 1 and not r.skipped
    loss, l1, s, m = (v.item() for v in seen[0])
    assert (r.loss, r.l1, r.ssim) == (loss, l1, s)
    assert r.psnr == psnr_from_mse(m) and math.isfinite(r.psnr)


def test_fp32_centring_emulated(rng, one_thread):
    """The float32 fused loss's algorithm (csrc/ssim.cu, loss32_*: one centring constant per 16×16 tile, the
    moments of x − c with the zero padding read as −c, the backward's A' = D − 2(μ1 − c_x)B − (μ2 − c_y)Cc and
    f0 + 2(x − c_x)f1 + (y − c_y)f2), written out in PyTorch: in float64 it is SSIM and its gradient (to 1e-12 of
    the autograd reference: the derivation), and in float32 on a near-flat pair it errs ≥ 5× less than the same
    float32 sums uncentred (why the kernels centre)."""
    import torch.nn.functional as F

    from rigel_core.train.losses import SSIM_C1, SSIM_C2

    h, w = 40, 37

    def run(x, y, dt, centred):
        win = gaussian_window_1d(11, 1.5, dt)

        def filt(img):
            k = F.conv2d(F.pad(img[None, None], (5, 5, 0, 0)), win.view(1, 1, 1, 11))
            return F.conv2d(F.pad(k, (0, 0, 5, 5)), win.view(1, 1, 11, 1))[0, 0]

        xs, ys = x.to(dt), y.to(dt)
        outside = 1 - filt(torch.ones_like(xs))  # the window's weight on the zero padding
        smap, grad = torch.zeros_like(xs), torch.zeros_like(xs)
        coef = [torch.zeros_like(xs) for _ in range(5)]
        tiles = [(slice(i, i + 16), slice(j, j + 16)) for i in range(0, h, 16) for j in range(0, w, 16)]
        consts = [(xs[t[0].start, t[1].start], ys[t[0].start, t[1].start]) if centred else (xs.new_zeros(()),) * 2
                  for t in tiles]
        for t, (cx, cy) in zip(tiles, consts):  # forward, each tile with its constants
            xp, yp = xs - cx, ys - cy
            m0, m1 = filt(xp) - cx * outside, filt(yp) - cy * outside
            m2, m3 = filt(xp * xp) + cx * cx * outside, filt(yp * yp) + cy * cy * outside
            m4 = filt(xp * yp) + cx * cy * outside
            mu1, mu2 = cx + m0, cy + m1
            n1, n2 = 2 * mu1 * mu2 + SSIM_C1, 2 * (m4 - m0 * m1) + SSIM_C2
            d1, d2 = mu1 * mu1 + mu2 * mu2 + SSIM_C1, (m2 - m0 * m0) + (m3 - m1 * m1) + SSIM_C2
            s = n1 * n2 / (d1 * d2)
            for c, val in zip(coef + [smap], (2 * (mu2 * n2 - mu1 * s * d2) / (d1 * d2), -s / d2,
                                              2 * n1 / (d1 * d2), mu1, mu2, s)):
                c[t] = val[t]
        D, B, Cc, M1, M2 = coef
        for t, (cx, cy) in zip(tiles, consts):  # backward of sum(S), each tile with its own constants
            g = filt(D - 2 * (M1 - cx) * B - (M2 - cy) * Cc) + 2 * (xs - cx) * filt(B) + (ys - cy) * filt(Cc)
            grad[t] = g[t]
        return smap.double(), grad.double()

    def reference(x, y):
        xg = x.clone().requires_grad_(True)
        smap = ssim_map_reference(xg[..., None], y[..., None])[0, 0]
        (g,) = torch.autograd.grad(smap.sum(), xg)
        return smap.detach(), g

    x = torch.rand(h, w, generator=rng, dtype=torch.float64).float().double()
    y = (x + 0.1 * torch.randn(h, w, generator=rng, dtype=torch.float64)).clamp(0, 1).float().double()
    s_ref, g_ref = reference(x, y)
    s64, g64 = run(x, y, torch.float64, centred=True)
    assert (s64 - s_ref).abs().max() <= 1e-12 and (g64 - g_ref).norm() <= 1e-12 * g_ref.norm()

    x = (0.5 + 0.002 * torch.rand(h, w, generator=rng, dtype=torch.float64)).float().double()
    y = (x + 0.001 * torch.randn(h, w, generator=rng, dtype=torch.float64)).float().double()
    s_ref, g_ref = reference(x, y)
    errs = {}
    for centred in (True, False):
        s32, g32 = run(x, y, torch.float32, centred)
        errs[centred] = ((s32 - s_ref).abs().max().item(), ((g32 - g_ref).norm() / g_ref.norm()).item())
    # centred: SSIM to ~3e-7, gradient ~4e-6; uncentred: SSIM off by ~2e-4 (the moments), gradient ~6e-5
    assert errs[True][0] <= 2e-6 and errs[True][1] <= 3e-5, errs
    assert errs[True][0] * 20 <= errs[False][0] and errs[True][1] * 5 <= errs[False][1], errs
