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
