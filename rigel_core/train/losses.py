"""Image losses and metrics of the trainer: L1, SSIM / D-SSIM, PSNR.

All functions take images as (H, W, C) or (B, H, W, C) float tensors with values in [0, 1] (the layout
``rigel_core.render`` returns and ``rigel_core.data`` loads) and are differentiable by autograd.

SSIM follows Wang, Bovik, Sheikh & Simoncelli, "Image Quality Assessment: From Error Visibility to Structural
Similarity" (IEEE TIP 2004), eq. 13, with the constants of that paper (K1 = 0.01, K2 = 0.03, dynamic range
L = 1) and an 11×11 Gaussian window of σ = 1.5. The window is separable, so the local statistics are two 1-D
convolutions (rows, then columns) instead of one 2-D one. Border handling: ``padding="same"`` (default) zero-pads
by 5 pixels and averages the SSIM map over every pixel — what the 3DGS reference trainer (Kerbl et al. 2023)
uses for its D-SSIM loss and its reported SSIM, so our figures compare with theirs; ``padding="valid"`` keeps
only windows fully inside the image (Wang et al.'s MATLAB code, scikit-image with ``gaussian_weights=True``).

Masks: every function takes an optional ``mask`` — (H, W) or (B, H, W), bool or float in {0, 1} (True / 1 = the
pixel counts; ``rigel_core.data.Frame.mask``). Masked-out pixels of *both* images are replaced by 0 (``torch.where``,
so a NaN or any other value there changes nothing) before anything is computed, and the mean is taken over the
valid pixels only: L1 / MSE = sum over valid pixels / (their count × C); SSIM = the SSIM map of the two masked
images averaged over the valid pixels. A masked pixel's value therefore has exactly zero effect on the result and
on every gradient. (The SSIM of a valid pixel next to masked ones sees zeros in its window, as a pixel at the
image border sees the zero padding.) ``mask=None`` runs the unmasked code unchanged.

:func:`ssim_map` (hence :func:`ssim`, :func:`dssim`) dispatches by device, as ``rigel_core.render`` does: CUDA images
with the default window and padding run the fused kernels of ``csrc/ssim.cu``
(:func:`rigel_core.renderer.cuda_backend.ssim_map_cuda`: same contract, float32, gradient to ``pred`` only; its
docstring derives the gradient); everything else runs :func:`ssim_map_reference`, the kernels' PyTorch twin.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from .._ext import use_kernels

__all__ = ["loss_terms", "l1_loss", "mse", "psnr", "apply_mask", "psnr_from_mse", "gaussian_window_1d", "ssim_map",
           "ssim_map_reference", "ssim", "dssim", "SSIM_C1", "SSIM_C2", "SSIM_WINDOW", "SSIM_SIGMA"]

SSIM_C1 = 0.01 ** 2  # (K1·L)², L = 1
SSIM_C2 = 0.03 ** 2  # (K2·L)²
SSIM_WINDOW = 11  # the default window: taps per side and σ (px); the fused kernels' only one (csrc/ssim.h)
SSIM_SIGMA = 1.5


def _as_batch(img: torch.Tensor, name: str) -> torch.Tensor:
    """(H,W,C) or (B,H,W,C) → (B,C,H,W)."""
    if img.dim() == 3:
        img = img[None]
    if img.dim() != 4:
        raise ValueError(f"{name}: expected an image (H,W,C) or a batch (B,H,W,C), got shape {tuple(img.shape)}")
    return img.permute(0, 3, 1, 2)


def _check_pair(pred: torch.Tensor, target: torch.Tensor) -> None:
    for name, t in (("prediction", pred), ("target", target)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name}: expected a torch.Tensor image, got {type(t).__name__}")
    if pred.shape != target.shape:
        raise ValueError(f"prediction {tuple(pred.shape)} and target {tuple(target.shape)} differ in shape")
    if pred.dtype != target.dtype:
        raise TypeError(f"prediction ({pred.dtype}) and target ({target.dtype}) differ in dtype; convert one")


def _as_mask(mask: torch.Tensor, img: torch.Tensor) -> torch.Tensor:
    """``mask`` (H,W) or (B,H,W), bool or {0,1} float → bool (…, H, W, 1) broadcastable against ``img``."""
    m = mask if mask.dtype == torch.bool else mask > 0.5
    if m.shape != img.shape[-3:-1] and m.shape != img.shape[:-1]:
        raise ValueError(f"mask {tuple(mask.shape)} does not fit image {tuple(img.shape)} (expected (H, W) or "
                         "(B, H, W))")
    return m.to(img.device)[..., None]


def apply_mask(pred: torch.Tensor, target: torch.Tensor, mask: torch.Tensor):
    """``(pred_m, target_m, m, count)``: both images with masked-out pixels replaced by exactly 0 (``where``:
    neither the value nor its gradient leaks), the bool (…, H, W, 1) mask, and the number of valid values
    (pixels × channels, ≥ 1 so that an all-masked image gives 0, not NaN)."""
    _check_pair(pred, target)
    m = _as_mask(mask, pred)
    zero = pred.new_zeros(())
    count = (m.expand(*pred.shape[:-1], 1).sum() * pred.shape[-1]).clamp_min(1)
    return torch.where(m, pred, zero), torch.where(m, target, zero.to(target.dtype)), m, count


def l1_loss(pred: torch.Tensor, target: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
    """Mean absolute error over all pixels and channels (a 0-d tensor); over the valid pixels with ``mask``."""
    if mask is None:
        _check_pair(pred, target)
        return (pred - target).abs().mean()
    p, t, _, count = apply_mask(pred, target, mask)
    return (p - t).abs().sum() / count


def mse(pred: torch.Tensor, target: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
    """Mean squared error over all pixels and channels (a 0-d tensor); over the valid pixels with ``mask``."""
    if mask is None:
        _check_pair(pred, target)
        return ((pred - target) ** 2).mean()
    p, t, _, count = apply_mask(pred, target, mask)
    return ((p - t) ** 2).sum() / count


def psnr(pred: torch.Tensor, target: torch.Tensor, max_val: float = 1.0,
         mask: torch.Tensor | None = None) -> torch.Tensor:
    """Peak signal-to-noise ratio in dB, ``10·log10(max_val² / MSE)`` over the whole image (0-d tensor), or over
    the valid pixels of ``mask``.

    Identical images give +inf. For a set of views, average the per-view values (as 3DGS reports).
    """
    m = mse(pred, target, mask)
    return 10.0 * torch.log10(max_val ** 2 / m)


def gaussian_window_1d(size: int = SSIM_WINDOW, sigma: float = SSIM_SIGMA, dtype=torch.float32,
                       device=None) -> torch.Tensor:
    """(size,) normalised 1-D Gaussian, centred on the middle tap: ``w_i ∝ exp(−(i − size//2)² / (2σ²))``."""
    if size < 1 or size % 2 == 0:
        raise ValueError(f"SSIM window size must be odd and positive, got {size}")
    x = torch.arange(size, dtype=torch.float64) - size // 2
    w = torch.exp(-(x * x) / (2.0 * sigma * sigma))
    return (w / w.sum()).to(dtype=dtype, device=device)


def _filter(x: torch.Tensor, w: torch.Tensor, pad: int) -> torch.Tensor:
    """Separable depthwise filtering of (B,C,H,W) by the 1-D window ``w`` along W, then along H."""
    c = x.shape[1]
    size = w.numel()
    wx = w.reshape(1, 1, 1, size).expand(c, 1, 1, size)
    wy = w.reshape(1, 1, size, 1).expand(c, 1, size, 1)
    x = F.conv2d(x, wx, padding=(0, pad), groups=c)
    return F.conv2d(x, wy, padding=(pad, 0), groups=c)


def ssim_map(pred: torch.Tensor, target: torch.Tensor, *, window_size: int = SSIM_WINDOW, sigma: float = SSIM_SIGMA,
             padding: str = "same") -> torch.Tensor:
    """Per-pixel SSIM (B, C, H', W') of two images (H,W,C) or batches (B,H,W,C) in [0, 1].

    ``H' = H`` for ``padding="same"`` (zero padding), ``H − window_size + 1`` for ``"valid"``.
    Dispatch: non-empty CUDA images with the default window and padding, whose ``target`` needs no gradient, go
    to the fused kernels (:func:`rigel_core.renderer.cuda_backend.ssim_map_cuda`, float32 only; the map is then a
    permuted view of a channels-last (B, H, W, C) tensor); all other arguments to :func:`ssim_map_reference`.
    Raises ValueError for mismatched shapes, an unknown padding or an image smaller than the window ("valid");
    TypeError for CUDA images that are not float32 (the kernels'); RuntimeError for CUDA images when the
    kernels are not built.
    """
    if (isinstance(pred, torch.Tensor) and use_kernels(pred) and pred.numel() > 0 and not target.requires_grad
            and (window_size, sigma, padding) == (SSIM_WINDOW, SSIM_SIGMA, "same")):
        from ..renderer.cuda_backend import ssim_map_cuda

        _check_pair(pred, target)
        m = ssim_map_cuda(pred, target)
        return (m if m.dim() == 4 else m[None]).permute(0, 3, 1, 2)
    return ssim_map_reference(pred, target, window_size=window_size, sigma=sigma, padding=padding)


def ssim_map_reference(pred: torch.Tensor, target: torch.Tensor, *, window_size: int = SSIM_WINDOW,
                       sigma: float = SSIM_SIGMA, padding: str = "same") -> torch.Tensor:
    """:func:`ssim_map` in PyTorch ops on any device and floating dtype, differentiable by autograd w.r.t. both
    images: the CPU backend, and the twin the fused kernels are tested against. Arguments, result and errors as
    :func:`ssim_map`."""
    _check_pair(pred, target)
    x, y = _as_batch(pred, "pred"), _as_batch(target, "target")
    if padding == "same":
        pad = window_size // 2
    elif padding == "valid":
        pad = 0
        if min(x.shape[-2:]) < window_size:
            raise ValueError(f"SSIM with padding='valid' needs images of at least {window_size} px, "
                             f"got {tuple(x.shape[-2:])}")
    else:
        raise ValueError(f"SSIM padding must be 'same' or 'valid', got {padding!r}")
    w = gaussian_window_1d(window_size, sigma, x.dtype, x.device)
    # One filtering pass over the five stacked statistics' inputs: x, y, x², y², xy.
    c = x.shape[1]
    stats = _filter(torch.cat([x, y, x * x, y * y, x * y], 1), w, pad)
    mu_x, mu_y, e_xx, e_yy, e_xy = stats.split(c, 1)
    mu_xx, mu_yy, mu_xy = mu_x * mu_x, mu_y * mu_y, mu_x * mu_y
    var_x, var_y, cov = e_xx - mu_xx, e_yy - mu_yy, e_xy - mu_xy
    num = (2 * mu_xy + SSIM_C1) * (2 * cov + SSIM_C2)
    den = (mu_xx + mu_yy + SSIM_C1) * (var_x + var_y + SSIM_C2)
    return num / den


def ssim(pred: torch.Tensor, target: torch.Tensor, *, window_size: int = SSIM_WINDOW, sigma: float = SSIM_SIGMA,
         padding: str = "same", mask: torch.Tensor | None = None) -> torch.Tensor:
    """Mean SSIM (0-d tensor; 1 for identical images) — see :func:`ssim_map` and the module docstring.

    With ``mask`` (``padding="same"`` only): the SSIM map of the masked images averaged over the valid pixels.
    """
    if mask is None:
        return ssim_map(pred, target, window_size=window_size, sigma=sigma, padding=padding).mean()
    if padding != "same":
        raise ValueError("a masked SSIM needs padding='same' (one SSIM value per pixel)")
    p, t, m, count = apply_mask(pred, target, mask)
    smap = ssim_map(p, t, window_size=window_size, sigma=sigma, padding=padding)  # (B, C, H, W)
    mb = m if m.dim() == 4 else m[None]  # (B|1, H, W, 1)
    return torch.where(mb.permute(0, 3, 1, 2), smap, smap.new_zeros(())).sum() / count


def dssim(pred: torch.Tensor, target: torch.Tensor, **kw) -> torch.Tensor:
    """Structural dissimilarity as the 3DGS loss uses it: ``1 − SSIM`` (0-d tensor, 0 for identical images);
    ``mask=`` as :func:`ssim`."""
    return 1.0 - ssim(pred, target, **kw)


def loss_terms(pred: torch.Tensor, target: torch.Tensor, mask: torch.Tensor | None = None, *,
               lambda_dssim: float = 0.2, fp32: bool = False):
    """The trainer's loss ``(loss, l1, ssim, mse)`` (0-d tensors): loss = (1 − λ)·L1 + λ·(1 − SSIM), λ =
    ``lambda_dssim``, and the MSE of the same pixels (detached: a metric). ``mask`` as :func:`l1_loss`.

    Non-empty CUDA images whose ``target`` needs no gradient take the fused kernels
    (:func:`rigel_core.renderer.cuda_backend.photometric_sums_cuda`: two launches, float64 sums; float32 only,
    TypeError for another dtype, as every kernel: :func:`rigel_core._ext.use_kernels`); everything else the functions of this
    module. Both give the same values and gradients (tests/test_losses.py). ``fp32``: the fused
    kernels' float32 form (``TrainConfig.loss_float32``; no effect off CUDA)."""
    _check_pair(pred, target)
    if use_kernels(pred) and pred.numel() > 0 and not target.requires_grad:
        from ..renderer.cuda_backend import photometric_sums_cuda

        m = None
        if mask is not None:
            m = _as_mask(mask, pred)[..., 0]
            if m.shape != pred.shape[:-1]:  # one (H, W) mask for a batch
                m = m.expand(pred.shape[:-1])
        totals = photometric_sums_cuda(pred, target, m, fp32=fp32)
        count = totals[3].detach().clamp_min(1.0)
        l1, s, sq = (totals[:3] / count).float().unbind()
        l1_value, s_value, m_value = l1, s, sq.detach()
    else:
        l1_value = l1_loss(pred, target, mask)
        s_value = ssim(pred, target, mask=mask)
        with torch.no_grad():
            m_value = mse(pred, target, mask)
    loss = (1.0 - lambda_dssim) * l1_value + lambda_dssim * (1.0 - s_value)
    return loss, l1_value, s_value, m_value


def psnr_from_mse(m: float, max_val: float = 1.0) -> float:
    """PSNR in dB of a mean squared error (float; +inf for 0)."""
    return math.inf if m <= 0 else 10.0 * math.log10(max_val ** 2 / m)
