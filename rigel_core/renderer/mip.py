"""The anti-aliased ("mip") render mode's 3D smoothing filter (docs/PIPELINE.md "Anti-aliased mode").

Math: Yu et al., "Mip-Splatting: Alias-free 3D Gaussian Splatting" (CVPR 2024), §5.1 (eq. 7–8). A scene seen
by the training cameras at most at sampling rate ν (samples per world unit: ``focal / depth``) holds no
frequency above ν/2, so each Gaussian is convolved with an isotropic low-pass Gaussian of variance
``s3d / ν_max²`` (``s3d = config.MIP_FILTER_3D`` = 0.2, the published implementation's value; ν_max the highest
rate over the training cameras that see the Gaussian's mean). Convolving N(μ, Σ) with N(0, f·I) gives
N(μ, Σ + f·I); with Σ = R diag(s²) Rᵀ and an isotropic f this is R diag(s² + f) Rᵀ, so exactly

    scales' = sqrt(scales² + f),   opacity' = opacity · sqrt(Π scales² / Π scales'²)

(the opacity factor keeps the Gaussian's integral — the amount of density it holds — unchanged). That is a
differentiable *activation* of (log_scales, opacity_logits), like ``exp`` and ``sigmoid``: gradients flow
through it to the trained parameters, ``filter_3D`` itself is not trained. The 2D Mip filter is the projection
stage's (``rigel_core.reference.project``, ``csrc/project_*.cu``).

``filter_3D`` (N,) lives on the model (:attr:`rigel_core.model.GaussianModel.filter_3D`), is recomputed by the
trainer at initialisation, after each densification and every :data:`FILTER_3D_INTERVAL` iterations (the means
move), saved in checkpoints, and baked into scales/opacities when a PLY is written (:func:`bake_3d_filter`), so
viewers that apply only the 2D filter of ``comment SplatRenderMode: mip`` render the file right.
"""
from __future__ import annotations

import torch

from .. import config

__all__ = ["FILTER_3D_INTERVAL", "apply_3d_filter", "compute_filter_3d", "bake_3d_filter", "effective_scales_opacities"]

#: iterations between recomputations of ``filter_3D`` besides those after densification (Mip-Splatting: 100)
FILTER_3D_INTERVAL = 100
#: fraction of the image size a projected mean may lie outside the image and still count as seen (Mip-Splatting
#: uses 15 %: a Gaussian just outside the frame still contributes to its edge pixels)
SEEN_MARGIN = 0.15


def apply_3d_filter(scales: torch.Tensor, opacities: torch.Tensor, filter_3D: torch.Tensor):
    """(scales', opacities') of Gaussians convolved with the isotropic 3D filter (module docstring).

    Args: scales (N,3) > 0 world units, opacities (N,) in [0,1], filter_3D (N,) ≥ 0 variances (world units²);
        one floating dtype and device. Differentiable w.r.t. scales and opacities (float32 or float64).
    Returns: scales' (N,3) = sqrt(scales² + filter_3D), opacities' (N,) = opacities · sqrt(Π scales² / Π scales'²)
        (computed as Π (scales / scales') so tiny scales do not underflow).
    Raises: ValueError when filter_3D does not have shape (N,).
    """
    if tuple(filter_3D.shape) != (scales.shape[0],):
        raise ValueError(f"filter_3D: expected shape ({scales.shape[0]},), got {tuple(filter_3D.shape)} "
                         "(recompute it after the Gaussians change: rigel_core.renderer.mip.compute_filter_3d)")
    f = filter_3D.to(scales.dtype)[:, None]
    s2 = scales * scales
    filtered = torch.sqrt(s2 + f)
    return filtered, opacities * torch.prod(scales / filtered, dim=-1)


def effective_scales_opacities(model, render_mode: str):
    """(scales (N,3), opacities (N,)) that ``render`` passes to the projection: the model's activations, through
    :func:`apply_3d_filter` when ``render_mode`` is "mip" and the model carries a ``filter_3D``."""
    scales, opacities = model.scales, model.opacities
    f3d = getattr(model, "filter_3D", None)
    if render_mode == "mip" and f3d is not None:
        scales, opacities = apply_3d_filter(scales, opacities, f3d.to(model.device))
    return scales, opacities


@torch.no_grad()
def compute_filter_3d(means3D: torch.Tensor, cameras, *, near_plane: float = config.NEAR_PLANE,
                      chunk: int = 1 << 20) -> torch.Tensor:
    """(N,) 3D filter variances ``MIP_FILTER_3D / ν_max²`` of Gaussians at ``means3D`` (module docstring).

    ν(camera) = max(fx, fy) / z (the finest sample spacing of that view at depth z) for every camera whose
    frustum (near plane, image grown by :data:`SEEN_MARGIN` on each side) holds the mean; ν_max the maximum over
    them. A Gaussian no camera sees gets the smallest ν_max of the seen ones (the largest filter, as
    Mip-Splatting); non-finite means, and every mean when none is seen, get 0 (no filter).

    Args: means3D (N,3) world units (any device, float); cameras: iterable of
    :class:`rigel_core.renderer.camera.Camera`.
    Returns: (N,) variances in world units², on means3D's device and dtype.
    """
    m = means3D.detach()
    n = m.shape[0]
    nu = torch.zeros(n, dtype=torch.float64, device=m.device)
    for cam in cameras:
        vm = cam.viewmat_tensor(m.device, torch.float64)
        K = cam.K_tensor(m.device, torch.float64)
        fx, fy, cx, cy = K[0, 0], K[1, 1], K[0, 2], K[1, 2]
        focal = torch.maximum(fx, fy)
        w, h = float(cam.width), float(cam.height)
        for lo in range(0, n, chunk):
            p = m[lo:lo + chunk].double() @ vm[:3, :3].T + vm[:3, 3]
            z = p[:, 2]
            zs = torch.where(z > near_plane, z, torch.ones_like(z))
            u, v = fx * p[:, 0] / zs + cx, fy * p[:, 1] / zs + cy
            seen = ((z > near_plane) & (u >= -SEEN_MARGIN * w) & (u <= (1 + SEEN_MARGIN) * w)
                    & (v >= -SEEN_MARGIN * h) & (v <= (1 + SEEN_MARGIN) * h))
            rate = torch.where(seen, focal / zs, torch.zeros_like(zs))
            nu[lo:lo + chunk] = torch.maximum(nu[lo:lo + chunk], rate)
    seen = torch.isfinite(nu) & (nu > 0)
    if bool(seen.any()):
        nu = torch.where(seen, nu, nu[seen].min())
        out = config.MIP_FILTER_3D / (nu * nu)
    else:
        out = torch.zeros_like(nu)
    out = torch.where(torch.isfinite(m).all(-1), out, torch.zeros_like(out))
    return out.to(m.dtype if m.is_floating_point() else torch.float32)


def bake_3d_filter(model):
    """A copy of ``model`` with its 3D filter folded into ``log_scales`` and ``opacity_logits`` (exact:
    :func:`apply_3d_filter`) and ``filter_3D`` cleared; ``render_mode`` kept. The model itself when it has no
    filter. Rendering the copy in mip mode equals rendering the original in mip mode (the 2D filter is applied
    by the renderer either way) — what PLY export needs for viewers that know only the 2D filter.

    The new logit is written as logit(o·k) = log o + log k − log1p(−o·k) with log o = −softplus(−logit), so
    neither a tiny opacity nor a factor k = Π scales/scales' near 0 loses precision; where k = 1 the logit is kept.
    """
    f3d = getattr(model, "filter_3D", None)
    if f3d is None:
        return model
    out = model.to()
    with torch.no_grad():
        scales, _ = apply_3d_filter(model.scales.detach(), model.opacities.detach(), f3d.to(model.device))
        x = model.opacity_logits.detach()
        k = torch.prod(model.scales.detach() / scales, dim=-1)
        o = model.opacities.detach()
        baked = -torch.nn.functional.softplus(-x) + torch.log(k) - torch.log1p(-o * k)
        out.log_scales = torch.where(torch.isfinite(scales), torch.log(scales), model.log_scales.detach())
        out.opacity_logits = torch.where(k < 1, baked, x)
    out.filter_3D = None
    return out
