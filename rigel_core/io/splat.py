"""antimatter15 ``.splat`` import (layout in :mod:`rigel_core.io.splat_write`): 32 bytes per splat, no header,
so the file is recognised by its ``.splat`` suffix and its size (a multiple of 32).

Decoding: positions as stored; ``log_scales = log(scale)``; ``f_dc = (c/255 − 0.5)/C0``; opacity logit of
a = A/255 clamped to [0.5/255, 1 − 0.5/255] (a byte says no more; 0 and 255 would give ±∞); quaternion
(w, x, y, z) = (byte − 128)/128, left unnormalised (rigel normalises in the forward pass). SH degree 0.
"""
from __future__ import annotations

import os
import warnings

import numpy as np
import torch

from ..config import SH_C0
from ..model import GaussianModel
from .errors import SceneFormatError
from .ply import SceneWarning, _warn_nonfinite

__all__ = ["load_splat", "SplatFormatError"]

_ALPHA_EPS = 0.5 / 255.0
_SPLAT_DTYPE = np.dtype([("position", "<f4", (3,)), ("scale", "<f4", (3,)), ("rgba", "u1", (4,)),
                         ("rot", "u1", (4,))])


class SplatFormatError(SceneFormatError):
    """An antimatter15 ``.splat`` file that cannot be one (size not a multiple of 32 bytes)."""


def load_splat(path, device=None, dtype=torch.float32) -> GaussianModel:
    """Load an antimatter15 ``.splat`` file into a :class:`GaussianModel` (SH degree 0).

    Args: path; device, dtype of the returned tensors.
    Raises: SplatFormatError when the size is not a multiple of 32 bytes (not a .splat, or truncated);
        OSError when the file cannot be read.
    Warns: SceneWarning for zero splats, and for splats with non-finite or non-positive scales (their
        log-scale is −∞/NaN; they are loaded as they are and the renderer culls them).
    """
    path = os.fspath(path)
    size = os.path.getsize(path)
    if size % _SPLAT_DTYPE.itemsize:
        raise SplatFormatError(path, f"a .splat file holds 32 bytes per splat, but this one has {size} bytes "
                                     f"({size % 32} left over): not a .splat file, or truncated")
    data = np.fromfile(path, dtype=_SPLAT_DTYPE)
    n = data.shape[0]
    means = data["position"].astype(np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        log_scales = np.log(data["scale"].astype(np.float64))
    rgba = data["rgba"].astype(np.float64) / 255.0
    sh_dc = ((rgba[:, :3] - 0.5) / SH_C0).reshape(n, 1, 3)
    a = np.clip(rgba[:, 3], _ALPHA_EPS, 1.0 - _ALPHA_EPS)
    opacity = np.log(a / (1.0 - a))
    quats = (data["rot"].astype(np.float64) - 128.0) / 128.0
    arrays = (means, log_scales, quats, opacity, sh_dc, np.zeros((n, 0, 3)))
    _warn_nonfinite(path, arrays, n)
    if n == 0:
        warnings.warn(f"{path}: the .splat file has 0 splats; returning an empty model", SceneWarning, stacklevel=2)
    return GaussianModel(*(torch.from_numpy(np.ascontiguousarray(x)).to(device=device, dtype=dtype)
                           for x in arrays))
