"""Per-image exposure: an affine colour correction of each training image, learnt with the scene.

Real captures change exposure, white balance and vignetting from image to image (auto-exposure, a phone's ISP).
A single radiance field cannot explain that, so the optimiser bakes it into view-dependent colour and floaters
that show up as error on held-out views. With ``TrainConfig.exposure`` on, the trainer compares the training
image ``i`` with

    pred'(p) = A_i · pred(p) + b_i        (every pixel p; pred(p) and b_i are RGB columns, A_i is 3×3)

where ``A_i`` starts at the identity and ``b_i`` at zero; both are optimised by their own Adam (the 3DGS
``--train_test_exp`` model: Kerbl et al.'s released code keeps one 3×4 matrix ``[A_i | b_i]`` per training image,
Adam, learning rate decaying exponentially from ``exposure_lr_init`` to ``exposure_lr_final`` over the run with
an optional delay; we re-derive the same schedule in :func:`exposure_lr`). The scene itself stays free of the
correction: renders for the viewer, the PLY and held-out views use no ``A, b``.

**Held-out views** have no learnt correction. The evaluation protocol (3DGS's ``train_test_exp``; ours fits the
correction in closed form instead of by gradient descent): for each held-out image fit ``A, b`` by least squares
of the render against the ground truth on the **left half** of the image (:func:`fit_affine`), apply it to the
**right half** and score PSNR / SSIM there only (:func:`left_right_metrics`). The correction is fitted on pixels
that are never scored, so it cannot hide geometry errors on the scored ones; it only removes a global colour
transform. The trainer reports this next to the plain, uncorrected metric.

The correction has a gauge freedom (any global colour transform can move between the scene's colours and all
``A_i, b_i``); nothing pins it, as in 3DGS: the protocol above is invariant to it, the plain metric is not.

Tensors: images are (H, W, 3) float tensors; ``affine`` is (N, 3, 4) float32, ``affine[i, :, :3] = A_i``,
``affine[i, :, 3] = b_i``.
"""
from __future__ import annotations

import math

import torch

from .losses import psnr_from_mse, ssim
from .per_image import PerImageParam

__all__ = ["Exposure", "exposure_lr", "log_linear_lr", "apply_affine", "fit_affine", "left_right_metrics"]


def log_linear_lr(lr0: float, lr1: float, iteration: int, iterations: int) -> float:
    """``lr0`` at iteration 0 to ``lr1`` at ``iterations``, log-linear (linear when either is 0), constant after."""
    t = min(max(iteration / max(iterations, 1), 0.0), 1.0)
    if lr0 <= 0 or lr1 <= 0:
        return lr0 * (1 - t) + lr1 * t
    return math.exp(math.log(lr0) * (1 - t) + math.log(lr1) * t)


def exposure_lr(cfg, iteration: int) -> float:
    """The exposure learning rate at ``iteration``: log-linear from ``cfg.exposure_lr_init`` to
    ``cfg.exposure_lr_final`` over ``cfg.iterations``, times the delay factor
    ``m + (1 − m)·sin(π/2 · clip(iteration / d, 0, 1))`` (``d = exposure_lr_delay_steps``,
    ``m = exposure_lr_delay_mult``; 1 when ``d`` is 0) — 3DGS's ``get_expon_lr_func``."""
    lr = log_linear_lr(cfg.exposure_lr_init, cfg.exposure_lr_final, iteration, cfg.iterations)
    d = cfg.exposure_lr_delay_steps
    if d and d > 0:
        m = cfg.exposure_lr_delay_mult
        lr *= m + (1.0 - m) * math.sin(0.5 * math.pi * min(max(iteration / d, 0.0), 1.0))
    return lr


def apply_affine(image: torch.Tensor, A: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``A · image(p) + b`` at every pixel: ``image`` (..., 3), ``A`` (3, 3), ``b`` (3,) → (..., 3).
    Differentiable in all three."""
    return image @ A.transpose(0, 1) + b


@torch.no_grad()
def fit_affine(pred: torch.Tensor, gt: torch.Tensor,
               mask: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Least-squares ``(A (3,3), b (3,))`` minimising ``Σ_p ‖A·pred(p) + b − gt(p)‖²`` over the pixels of
    ``mask`` (all when None). ``pred``, ``gt``: (..., 3); ``mask``: bool of shape ``pred.shape[:-1]``.

    Closed form: the normal equations of ``[pred, 1] · W = gt`` (W is 4×3) accumulated in float64 on the
    images' device, solved on the CPU by the pseudo-inverse (a flat render, e.g. one constant colour, makes the
    system rank-deficient; the pseudo-inverse then returns the minimum-norm solution). Returned on ``pred``'s
    device as float32. Raises ValueError for mismatched shapes or no pixel selected."""
    if pred.shape != gt.shape or pred.shape[-1] != 3:
        raise ValueError(f"fit_affine: pred {tuple(pred.shape)} and gt {tuple(gt.shape)} must be equal (..., 3)")
    x = pred.reshape(-1, 3).double()
    y = gt.reshape(-1, 3).double()
    if mask is not None:
        m = mask.reshape(-1)
        x, y = x[m], y[m]
    if x.shape[0] == 0:
        raise ValueError("fit_affine: no pixel to fit")
    X = torch.cat([x, torch.ones_like(x[:, :1])], 1)  # (M,4)
    xtx, xty = (X.T @ X).cpu(), (X.T @ y).cpu()
    W = torch.linalg.pinv(xtx, hermitian=True) @ xty  # (4,3)
    return W[:3].T.contiguous().to(pred.device, torch.float32), W[3].contiguous().to(pred.device, torch.float32)


@torch.no_grad()
def left_right_metrics(pred: torch.Tensor, gt: torch.Tensor, mask: torch.Tensor | None = None) -> dict:
    """The exposure evaluation protocol (module docstring) of one (H, W, 3) render against its ground truth:
    fit ``A, b`` on columns ``[0, W//2)``, apply them to columns ``[W//2, W)``, clamp to [0, 1] and score there.
    ``mask`` (H, W) bool (None = every pixel valid) restricts both the fit and the score to valid pixels (as
    :func:`.losses.mse` and :func:`.losses.ssim` do with a mask).
    Returns ``{"psnr": dB, "ssim": ..., "A": 3×3 list, "b": 3 list}`` (SSIM as :func:`.losses.ssim` on the
    right half as an image of its own). Raises ValueError for an image narrower than 2 px or a left half with no
    valid pixel."""
    from .losses import mse

    w = pred.shape[1]
    if w < 2:
        raise ValueError(f"left_right_metrics: image width {w} px, need at least 2")
    half = w // 2
    A, b = fit_affine(pred[:, :half], gt[:, :half], None if mask is None else mask[:, :half])
    right = apply_affine(pred[:, half:].float(), A, b).clamp(0.0, 1.0)
    g = gt[:, half:].float()
    mr = None if mask is None else mask[:, half:]
    m = float(mse(right, g, mr))
    return {"psnr": psnr_from_mse(m), "ssim": float(ssim(right, g, mask=mr)), "A": A.cpu().tolist(),
            "b": b.cpu().tolist()}


class Exposure(PerImageParam):
    """The learnt corrections of ``n`` training images and their optimiser (:class:`.per_image.PerImageParam`).

    Attributes:
        affine: (n, 3, 4) float32 leaf tensor requiring grad (the base's ``param``); row ``i`` is ``[A_i | b_i]``,
            initially ``[I | 0]``.
        optimizer: fused Adam over ``affine`` alone (betas 0.9, 0.999, eps 1e-8 as 3DGS's exposure optimizer;
            learning rate set each step by :meth:`set_lr`).
    Checkpoint tensors: ``exposure.affine``, ``exposure.adam.<key>``.
    """

    prefix, key, item_shape = "exposure.", "affine", (3, 4)
    trainer_attr = "exposure"
    config_field = "exposure"
    title = "per-image exposure"

    def __init__(self, n: int, device=None):
        a = torch.zeros(max(int(n), 0), 3, 4, dtype=torch.float32, device=device)
        a[:, :, :3] = torch.eye(3, dtype=torch.float32, device=device)
        super().__init__(a)

    @property
    def affine(self) -> torch.Tensor:
        return self.param

    def apply(self, image: torch.Tensor, i: int) -> torch.Tensor:
        """(H, W, 3) ``A_i · image + b_i`` (differentiable in the image and in ``affine``)."""
        row = self.affine[i]
        return apply_affine(image, row[:, :3], row[:, 3])

    @property
    def A(self) -> torch.Tensor:
        """(n, 3, 3) detached colour matrices."""
        return self.affine.detach()[:, :, :3]

    @property
    def b(self) -> torch.Tensor:
        """(n, 3) detached offsets."""
        return self.affine.detach()[:, :, 3]

    def to_dict(self, names: list[str]) -> dict:
        """JSON-able ``{"model": ..., "images": {name: {"A": 3×3, "b": 3}}}`` for the run directory."""
        if len(names) != len(self):
            raise ValueError(f"Exposure.to_dict: {len(names)} names for {len(self)} corrections")
        A, b = self.A.cpu().tolist(), self.b.cpu().tolist()
        return {"model": "pred' = A·pred + b per training image (RGB column vectors, linear in the render)",
                "images": {n: {"A": A[i], "b": b[i]} for i, n in enumerate(names)}}
