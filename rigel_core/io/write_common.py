"""What the lossy scene writers share (``compressed_ply_write``, ``spz_write``, ``splat_write``): the error type,
the float64 copy of a model's parameters they quantise, and the rounding helpers. A module of its own so that
:mod:`.export`, which dispatches to the writers, and the writers do not import each other."""
from __future__ import annotations

import math
import os
from dataclasses import dataclass

import numpy as np
import torch

from ..model import GaussianModel

__all__ = ["ExportError", "finite_mask", "ModelArrays", "model_arrays", "sigmoid", "round_clamp_u8",
           "position_bits_fit"]


class ExportError(ValueError):
    """A model that a format cannot store as asked (non-finite values, positions out of the fixed-point range,
    an unknown suffix). ``str(err)`` is ``"<path>: <problem>"``."""

    def __init__(self, path, problem: str):
        self.path = os.fspath(path) if path is not None else "<stream>"
        self.problem = problem
        super().__init__(f"{self.path}: {problem}")


def finite_mask(model: GaussianModel) -> torch.Tensor:
    """(N,) bool: the Gaussians whose parameters are all finite."""
    n = model.num_gaussians
    ok = torch.ones(n, dtype=torch.bool, device=model.device)
    for t in model.parameters().values():
        ok &= torch.isfinite(t.detach().reshape(n, t[0].numel() if n else 0)).all(dim=1)
    return ok


@dataclass
class ModelArrays:
    """float64 numpy copies of a model's parameters (quaternions normalised, w ≥ 0 not enforced)."""
    means: np.ndarray       # (N, 3)
    log_scales: np.ndarray  # (N, 3)
    quats: np.ndarray       # (N, 4) (w, x, y, z), unit norm; a zero quaternion becomes the identity
    opacity_logits: np.ndarray  # (N,)
    sh_dc: np.ndarray       # (N, 3)
    sh_rest: np.ndarray     # (N, K-1, 3)

    @property
    def n(self) -> int:
        return self.means.shape[0]


def model_arrays(model: GaussianModel, path, what: str, sh_degree: int | None = None) -> ModelArrays:
    """The parameters a writer quantises, as float64 numpy arrays, SH truncated (or zero-padded) to
    ``sh_degree``. Raises ExportError naming ``path`` when any Gaussian has a NaN/Inf parameter (no lossy
    format can store one) or ``sh_degree`` is outside 0..3."""
    if sh_degree is not None:
        if sh_degree not in (0, 1, 2, 3):
            raise ExportError(path, f"SH degree {sh_degree} asked; 0-3 are supported")
        model = model.with_sh_degree(sh_degree)
    n = model.num_gaussians
    bad = int((~finite_mask(model)).sum())
    if bad:
        raise ExportError(path, f"{bad} of {n} Gaussians have NaN or Inf parameters, which {what} cannot store; "
                                f"drop them first (rigel-convert drops them and says so)")
    get = lambda t: t.detach().to(device="cpu", dtype=torch.float64).numpy()
    q = get(model.quats).reshape(n, 4).copy()
    norm = np.linalg.norm(q, axis=1)
    zero = ~(norm > 0)
    q[zero] = (1.0, 0.0, 0.0, 0.0)
    norm[zero] = 1.0
    q /= norm[:, None]
    return ModelArrays(get(model.means3D).reshape(n, 3), get(model.log_scales).reshape(n, 3), q,
                       get(model.opacity_logits).reshape(n), get(model.sh_dc).reshape(n, 3),
                       get(model.sh_rest).reshape(n, model.sh_rest.shape[1], 3))


def sigmoid(x: np.ndarray) -> np.ndarray:
    """Overflow-free logistic function."""
    return 0.5 * (1.0 + np.tanh(0.5 * x))


def round_clamp_u8(x: np.ndarray) -> np.ndarray:
    """Round half away from zero (C's ``round``, as the SPZ reference does) and clamp to 0..255 → uint8."""
    r = np.sign(x) * np.floor(np.abs(x) + 0.5)
    return np.clip(r, 0, 255).astype(np.uint8)


def position_bits_fit(means: np.ndarray, fractional_bits: int) -> bool:
    """True when every coordinate rounds into a 24-bit two's-complement fixed-point number."""
    if means.size == 0:
        return True
    m = float(np.abs(means).max()) * (1 << fractional_bits)
    return math.floor(m + 0.5) <= (1 << 23) - 1
