"""EWA projection of 3D Gaussians — the PyTorch reference of ``csrc/project_fwd.cu`` (docs/PIPELINE.md [1]).

Math: Zwicker et al., "EWA Splatting" (2002), eq. 29 (local affine approximation of the projection);
Kerbl et al., "3D Gaussian Splatting" (2023), eq. 5–6 (Σ' = J W Σ Wᵀ Jᵀ, Σ = R S Sᵀ Rᵀ).
Anti-aliased ("mip") mode: the 2D Mip filter of Yu et al., "Mip-Splatting: Alias-free 3D Gaussian Splatting"
(CVPR 2024), eq. 9 — the screen covariance is widened by ``config.MIP_FILTER_2D`` px² instead of the
``config.LOWPASS`` dilation, and the Gaussian's peak is scaled by ``sqrt(det Σ2D / det(Σ2D + s·I))`` so that
its integral (the energy it deposits) is unchanged (docs/PIPELINE.md "Anti-aliased mode").
Differentiable by autograd in float32 and float64. Culled Gaussians get radius 0 and zeroed outputs; their
inputs are replaced by harmless values *before* any arithmetic so that no NaN reaches a gradient.
"""
from __future__ import annotations

from typing import NamedTuple

import torch

from .. import config
from ..renderer.modes import RENDER_MODES

__all__ = ["Projection", "project_gaussians", "quat_to_rotmat", "tile_rects", "RENDER_MODES", "check_render_mode"]



def check_render_mode(render_mode: str) -> str:
    """``render_mode`` if it is one of :data:`RENDER_MODES`, else ValueError naming the choices."""
    if render_mode not in RENDER_MODES:
        raise ValueError(f"render_mode: expected one of {', '.join(RENDER_MODES)}, got {render_mode!r}")
    return render_mode


class Projection(NamedTuple):
    means2D: torch.Tensor  # (N, 2) pixels
    conics: torch.Tensor  # (N, 3) (A, B, C) of the inverse 2D covariance
    depths: torch.Tensor  # (N,) camera-space z
    radii: torch.Tensor  # (N,) int32, 0 = culled
    cov2D: torch.Tensor  # (N, 3) (a, b, c) of the 2D covariance, low-pass (or mip filter) included
    # (N,) opacity compensation sqrt(det(Σ2D) / det(Σ2D + s·I)) of the mip mode (0 for culled Gaussians);
    # None in the default mode
    compensations: torch.Tensor | None = None


def quat_to_rotmat(quats: torch.Tensor) -> torch.Tensor:
    """(N,3,3) rotation matrices of quaternions (N,4) (w, x, y, z), normalised here (differentiably)."""
    q = quats / torch.linalg.norm(quats, dim=-1, keepdim=True)
    w, x, y, z = q.unbind(-1)
    return torch.stack([
        1 - 2 * (y * y + z * z), 2 * (x * y - w * z), 2 * (x * z + w * y),
        2 * (x * y + w * z), 1 - 2 * (x * x + z * z), 2 * (y * z - w * x),
        2 * (x * z - w * y), 2 * (y * z + w * x), 1 - 2 * (x * x + y * y),
    ], -1).reshape(*q.shape[:-1], 3, 3)


def tile_rects(means2D: torch.Tensor, radii: torch.Tensor, width: int, height: int):
    """Tile rectangles (x0, y0, x1, y1) int64 (N,4), inclusive-exclusive, clamped to the tile grid.

    Computed in floating point and clamped before the integer conversion, so a huge or non-finite value can
    never become an out-of-range tile index (cf. the reference implementation's issue 781).
    """
    T = config.TILE_SIZE
    tx, ty = (width + T - 1) // T, (height + T - 1) // T
    u, v = means2D.detach().unbind(-1)
    r = radii.to(means2D.dtype)

    def rng(c, n):
        lo = torch.floor((c - r) / T).nan_to_num(0.0).clamp(0, n)
        hi = (torch.floor((c + r) / T) + 1).nan_to_num(0.0).clamp(0, n)
        return lo.long(), hi.long()

    x0, x1 = rng(u, tx)
    y0, y1 = rng(v, ty)
    return torch.stack([x0, y0, x1, y1], -1)


def project_gaussians(means3D, quats, scales, opacities, viewmat, K, width: int, height: int,
                      near_plane: float = config.NEAR_PLANE, far_plane: float = config.FAR_PLANE,
                      colors=None, render_mode: str = "default") -> Projection:
    """Project N Gaussians into a pinhole camera.

    Args:
        means3D (N,3), quats (N,4) (w,x,y,z; any norm), scales (N,3) (> 0, world units),
        opacities (N,) (only checked for finiteness here), all one floating dtype;
        viewmat (4,4) row-major world-to-camera (OpenCV axes); K (3,3) pixels; width, height in pixels;
        colors (N,C) or None: only checked for finiteness here.
        render_mode: "default" (screen covariance + LOWPASS·I, Kerbl et al.) or "mip" (+ MIP_FILTER_2D·I and
        the opacity compensation, returned as ``compensations``; Mip-Splatting eq. 9).
    A Gaussian with any non-finite mean, quaternion, scale, opacity or colour entry is culled (docs/PIPELINE.md
    "Non-finite parameters"), as are degenerate, behind-the-camera and off-screen ones.
    Returns:
        :class:`Projection` — means2D (N,2) px, conics (N,3), depths (N,), radii (N,) int32 (0 = culled),
        cov2D (N,3), compensations (N,) in mip mode (None otherwise). Outputs of culled Gaussians are 0.
    Raises: ValueError for an unknown ``render_mode``.
    """
    mip = check_render_mode(render_mode) == "mip"
    filt = config.MIP_FILTER_2D if mip else config.LOWPASS
    dtype = means3D.dtype
    viewmat = viewmat.to(dtype)
    K = K.to(dtype)
    fx, fy, cx, cy = K[0, 0], K[1, 1], K[0, 2], K[1, 2]
    Rw, tw = viewmat[:3, :3], viewmat[:3, 3]

    finite = (torch.isfinite(means3D).all(-1) & torch.isfinite(quats).all(-1) & torch.isfinite(scales).all(-1)
              & torch.isfinite(opacities))
    if colors is not None:
        finite = finite & torch.isfinite(colors.detach()).all(-1)
    qn2 = (quats * quats).sum(-1)
    ok_q = finite & (qn2 >= 1e-24)
    ok = ok_q
    zero = torch.zeros((), dtype=dtype, device=means3D.device)
    m = torch.where(ok[:, None], means3D, zero)
    q = torch.where(ok[:, None], quats, torch.tensor([1.0, 0.0, 0.0, 0.0], dtype=dtype, device=means3D.device))
    s = torch.where(ok[:, None], scales, torch.ones((), dtype=dtype, device=means3D.device))

    p = m @ Rw.T + tw
    x, y, z = p.unbind(-1)
    ok = ok & (z > near_plane) & (z < far_plane)
    z = torch.where(ok, z, torch.ones_like(z))

    Rq = quat_to_rotmat(q)
    M = Rq * s[:, None, :]
    Sigma = M @ M.transpose(1, 2)
    Sc = Rw @ Sigma @ Rw.T

    lim_x = config.TAN_CLAMP * 0.5 * width / fx
    lim_y = config.TAN_CLAMP * 0.5 * height / fy
    tx = torch.clamp(x / z, -lim_x, lim_x)
    ty = torch.clamp(y / z, -lim_y, lim_y)
    J = torch.zeros(means3D.shape[0], 2, 3, dtype=dtype, device=means3D.device)
    J = torch.stack([
        torch.stack([fx / z, torch.zeros_like(z), -fx * tx / z], -1),
        torch.stack([torch.zeros_like(z), fy / z, -fy * ty / z], -1),
    ], 1)
    S2 = J @ Sc @ J.transpose(1, 2)
    a0, b, c0 = S2[:, 0, 0], S2[:, 0, 1], S2[:, 1, 1]
    a = a0 + filt
    c = c0 + filt
    det = a * c - b * b
    ok = ok & torch.isfinite(det) & (det > 0)
    det_s = torch.where(ok, det, torch.ones_like(det))
    conics = torch.stack([c / det_s, -b / det_s, a / det_s], -1)

    u = fx * x / z + cx
    v = fy * y / z + cy
    means2D = torch.stack([u, v], -1)
    mid = 0.5 * (a + c)
    half = 0.5 * (a - c)
    lam = mid + torch.sqrt(torch.clamp_min(half * half + b * b, 0.0))
    lam = torch.where(ok, lam, torch.ones_like(lam))
    radius_f = torch.ceil(config.RADIUS_SIGMA * torch.sqrt(lam.detach().clamp_min(0)))
    ok = ok & torch.isfinite(radius_f) & torch.isfinite(means2D.detach()).all(-1)
    radius_f = torch.where(ok, radius_f, torch.zeros_like(radius_f)).clamp_max(2.0 ** 30)
    rect = tile_rects(torch.where(ok[:, None], means2D.detach(), torch.zeros_like(means2D)), radius_f, width, height)
    ok = ok & (rect[:, 2] > rect[:, 0]) & (rect[:, 3] > rect[:, 1])

    radii = torch.where(ok, radius_f, torch.zeros_like(radius_f)).to(torch.int32)
    okf = ok[:, None]
    compensations = None
    if mip:
        # det of the unfiltered screen covariance; <= 0 (a degenerate or rounding-negative one) gives 0: the
        # Gaussian vanishes, with zero gradient (no sqrt at 0 is differentiated).
        det0 = a0 * c0 - b * b
        pos = ok & (det0 > 0)
        ratio = torch.where(pos, det0, torch.ones_like(det0)) / det_s
        compensations = torch.where(pos, torch.sqrt(ratio), zero)
    return Projection(
        means2D=torch.where(okf, means2D, zero),
        conics=torch.where(okf, conics, zero),
        depths=torch.where(ok, z, zero),
        radii=radii,
        cov2D=torch.where(okf, torch.stack([a, b, c], -1), zero),
        compensations=compensations,
    )
