"""Real spherical harmonics up to degree 3 — the PyTorch reference of ``csrc/sh_fwd.cu``.

Sign convention of Kerbl et al. 2023 (the 3DGS reference implementation), which every trained PLY uses.
The polynomials are the standard real SH basis (e.g. Sloan, "Stupid Spherical Harmonics Tricks", 2008,
appendix A2) with the Condon–Shortley phase folded into the constants.
"""
from __future__ import annotations

import torch

from ..config import SH_C0, SH_C1

__all__ = ["sh_basis", "eval_sh", "sh_colors", "SH_C2", "SH_C3"]

SH_C2 = (1.0925484305920792, -1.0925484305920792, 0.31539156525252005, -1.0925484305920792, 0.5462742152960396)
SH_C3 = (-0.5900435899266435, 2.890611442640554, -0.4570457994644658, 0.3731763325901154,
         -0.4570457994644658, 1.445305721320277, -0.5900435899266435)


def sh_basis(degree: int, dirs: torch.Tensor) -> torch.Tensor:
    """(N, (degree+1)²) values of the real SH basis at unit directions ``dirs`` (N, 3)."""
    if not 0 <= degree <= 3:
        raise ValueError(f"SH degree must be in 0..3, got {degree}")
    x, y, z = dirs.unbind(-1)
    out = [torch.full_like(x, SH_C0)]
    if degree >= 1:
        out += [-SH_C1 * y, SH_C1 * z, -SH_C1 * x]
    if degree >= 2:
        xx, yy, zz, xy, yz, xz = x * x, y * y, z * z, x * y, y * z, x * z
        out += [SH_C2[0] * xy, SH_C2[1] * yz, SH_C2[2] * (2 * zz - xx - yy), SH_C2[3] * xz, SH_C2[4] * (xx - yy)]
    if degree >= 3:
        out += [SH_C3[0] * y * (3 * xx - yy), SH_C3[1] * xy * z, SH_C3[2] * y * (4 * zz - xx - yy),
                SH_C3[3] * z * (2 * zz - 3 * xx - 3 * yy), SH_C3[4] * x * (4 * zz - xx - yy),
                SH_C3[5] * z * (xx - yy), SH_C3[6] * x * (xx - 3 * yy)]
    return torch.stack(out, -1)


def eval_sh(degree: int, sh_coeffs: torch.Tensor, dirs: torch.Tensor) -> torch.Tensor:
    """Σ_k Y_k(dir)·c_k for the first (degree+1)² coefficients.

    Args:
        degree: 0..3, must satisfy (degree+1)² ≤ K.
        sh_coeffs: (N, K, 3).
        dirs: (N, 3) unit directions.
    Returns: (N, 3), without the +0.5 offset or clamp.
    """
    k = (degree + 1) ** 2
    if sh_coeffs.shape[1] < k:
        raise ValueError(f"eval_sh: degree {degree} needs {k} coefficients, got {sh_coeffs.shape[1]}")
    basis = sh_basis(degree, dirs)
    return (basis[:, :, None] * sh_coeffs[:, :k, :]).sum(1)


def sh_colors(degree: int, sh_coeffs: torch.Tensor, means3D: torch.Tensor, campos: torch.Tensor) -> torch.Tensor:
    """View-dependent RGB (N,3): ``max(eval_sh(dir) + 0.5, 0)``, ``dir = normalize(mean − campos)``.

    The clamp passes zero gradient where it is active (``torch.clamp_min`` semantics). A mean equal to the
    camera centre gives direction 0 (only the DC term survives), never NaN.

    Cull rule (docs/PIPELINE.md "Non-finite parameters"): a Gaussian with any non-finite coefficient (all K,
    not only the evaluated degree's) or mean gets the colour NaN — the marker the projection culls it by
    (radius 0) — and exactly zero gradients: its inputs are replaced by harmless values before any arithmetic.
    """
    ok = torch.isfinite(sh_coeffs).all(-1).all(-1) & torch.isfinite(means3D).all(-1)
    d = means3D - campos.to(means3D)
    d = torch.where(ok[:, None], d, torch.zeros_like(d))
    c = torch.where(ok[:, None, None], sh_coeffs, torch.zeros_like(sh_coeffs))
    n = torch.linalg.norm(d, dim=-1, keepdim=True)
    dirs = d / torch.where(n > 0, n, torch.ones_like(n))
    colors = torch.clamp_min(eval_sh(degree, c, dirs) + 0.5, 0.0)
    return torch.where(ok[:, None], colors, torch.full_like(colors, float("nan")))
