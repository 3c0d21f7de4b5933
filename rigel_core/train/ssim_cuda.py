"""Fused CUDA SSIM (forward + backward in two kernels, ``csrc/ssim.cu``) behind :func:`.losses.ssim_map`.

The PyTorch path of :mod:`.losses` costs ~30 depthwise-convolution launches and ~60 elementwise kernels per training
step; this replaces them by one forward and one backward kernel with the very same contract: Wang et al. 2004,
eq. 13, an 11×11 Gaussian window of σ = 1.5 (separable, normalised in float64 as
:func:`.losses.gaussian_window_1d`), zero "same" padding by 5 px, C1 = 0.01², C2 = 0.03².

Layout: ``pred`` and ``target`` are channels-last float32 CUDA tensors (H, W, C) or (B, H, W, C), the layout of
the renderer and the loaders (no permute copy); each channel of each image is filtered on its own. The kernels
compute in float64 and store the map in float32 (the same shape as the inputs).

Gradient (to ``pred`` = x only; ``target`` = y is a constant). With μ1 = w⋆x, σ1² = w⋆x² − μ1²,
σ12 = w⋆(xy) − μ1μ2 (w the window, ⋆ correlation over in-image pixels) and S = (2μ1μ2+C1)(2σ12+C2) /
((μ1²+μ2²+C1)(σ1²+σ2²+C2)) = n1·n2 / (d1·d2), per pixel p:

    ∂S/∂μ1 = 2(μ2·n2 − μ1·S·d2) / (d1·d2),   ∂S/∂σ1² = −S / d2,   ∂S/∂σ12 = 2·n1 / (d1·d2).

Since ∂μ1(p)/∂x(q) = w(p−q), ∂σ1²(p)/∂x(q) = 2w(p−q)(x(q) − μ1(p)), ∂σ12(p)/∂x(q) = w(p−q)(y(q) − μ2(p)),
an upstream gradient g(p) gives

    ∂L/∂x(q) = [w⋆(g·A)](q) + 2·x(q)·[w⋆(g·B)](q) + y(q)·[w⋆(g·Cc)](q),
    A = ∂S/∂μ1 − 2μ1·∂S/∂σ1² − μ2·∂S/∂σ12,   B = ∂S/∂σ1²,   Cc = ∂S/∂σ12,

summing only over in-image p (the window is symmetric, so correlation = convolution). The forward stores A, B, Cc
per pixel (float64: A and 2x·B cancel on flat regions, where they are ~1/C2 ≈ 1100 times the result).

Dispatch (:func:`use_fused`): the fused path runs when ``RIGEL_SSIM`` is not ``torch``, both images are float32
CUDA tensors on one device with the same 3-d or 4-d non-empty shape, ``target`` does not require a gradient, the
arguments are the defaults (window 11, σ 1.5, padding "same") and ``rigel_core._C`` was built with ``ssim_fwd``;
otherwise :mod:`.losses` takes its PyTorch path, unchanged. ``RIGEL_SSIM`` = ``torch`` forces the PyTorch path,
unset / empty / ``auto`` chooses as above; any other value raises ValueError.
"""
from __future__ import annotations

import os

import torch

from .. import _ext

__all__ = ["use_fused", "fused_ssim_map", "ssim_mode"]

# the kernels' fixed window and padding (csrc/ssim.h)
_WINDOW_SIZE = 11
_SIGMA = 1.5
_MAX_PLANES = 65535  # B·C: blockIdx.z


def ssim_mode() -> str:
    """``"torch"`` or ``"auto"`` from the environment variable ``RIGEL_SSIM`` (read on every call, for A/B runs).

    Raises ValueError for any other value.
    """
    mode = os.environ.get("RIGEL_SSIM", "").strip().lower()
    if mode in ("", "auto"):
        return "auto"
    if mode == "torch":
        return "torch"
    raise ValueError(f"RIGEL_SSIM must be 'torch' or 'auto' (or unset), got {os.environ['RIGEL_SSIM']!r}")


def _kernels_built() -> bool:
    return _ext.available() and hasattr(_ext._C, "ssim_fwd")


def use_fused(pred: torch.Tensor, target: torch.Tensor, window_size: int, sigma: float, padding: str) -> bool:
    """True when :func:`.losses.ssim_map` may run the fused kernels on these arguments (the rules of the module
    docstring); False sends it down the PyTorch path, which also raises the errors for bad arguments."""
    if ssim_mode() == "torch":
        return False
    if not (window_size == _WINDOW_SIZE and sigma == _SIGMA and padding == "same"):
        return False
    if not (isinstance(pred, torch.Tensor) and isinstance(target, torch.Tensor)):
        return False
    if not (pred.is_cuda and target.is_cuda and pred.device == target.device):
        return False
    if not (pred.dtype == torch.float32 and target.dtype == torch.float32):
        return False
    if pred.shape != target.shape or pred.dim() not in (3, 4) or pred.numel() == 0:
        return False
    if target.requires_grad:
        return False
    planes = pred.shape[-1] * (pred.shape[0] if pred.dim() == 4 else 1)
    if planes > _MAX_PLANES or pred.shape[-3] > 65535 * 16:
        return False
    return _kernels_built()


class _FusedSSIMMap(torch.autograd.Function):
    """(pred, target) channels-last float32 CUDA, contiguous → SSIM map of the same shape; gradient to pred only."""

    @staticmethod
    def forward(ctx, pred, target):
        smap, coef = _ext.get().ssim_fwd(pred, target)
        ctx.save_for_backward(pred, target, coef)
        return smap

    @staticmethod
    def backward(ctx, grad_map):
        if not ctx.needs_input_grad[0]:
            return None, None
        pred, target, coef = ctx.saved_tensors
        grad = _ext.get().ssim_bwd(grad_map.to(torch.float32).contiguous(), pred, target, coef)
        return grad, None


def fused_ssim_map(pred: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Per-pixel SSIM of two (H, W, C) or (B, H, W, C) float32 CUDA images, in their layout (same shape as
    ``pred``), by the fused kernels; differentiable w.r.t. ``pred`` only. Call it when :func:`use_fused` allows
    (the kernels' host checks raise TypeError / ValueError otherwise). Non-contiguous inputs are copied."""
    return _FusedSSIMMap.apply(pred.contiguous(), target.detach().contiguous())
