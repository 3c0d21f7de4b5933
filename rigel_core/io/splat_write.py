"""antimatter15 ``.splat`` export: the raw 32-byte-per-splat format of antimatter15's WebGL viewer (read by
SuperSplat, splat-transform, Spark, gsplat.js and others). No header; little-endian; per splat:

| bytes | field | encoding |
|---|---|---|
| 0–11 | position | 3 × float32 (x, y, z as stored: no axis change) |
| 12–23 | scale | 3 × float32, **linear** standard deviations ``exp(log_scale)`` |
| 24–27 | colour | R, G, B = ``round(255 · clamp(0.5 + C0·f_dc, 0, 1))``, A = ``round(255 · sigmoid(opacity_logit))`` |
| 28–31 | rotation | normalised (w, x, y, z), each ``round(128 · c + 128)`` clamped to 0..255 |

The format holds **SH degree 0 only**: the higher coefficients are dropped (a warning says so), so
view-dependent colour is lost. Splats are sorted by decreasing ``exp(Σ log_scale) · sigmoid(opacity)`` (volume
× opacity), as antimatter15's converter does, so a streaming viewer draws the big opaque ones first
(``sort=False`` keeps the input order). Bytes are rounded to nearest (antimatter15's converter truncates;
the readers decode the same way either way).

**Quantisation error** (what :func:`rigel_core.io.splat.load_splat` gives back vs the input):

* positions, and log-scales: float32 rounding only (≤ 2^−24 relative; log-scales below log(2^−149) ≈ −103
  underflow to scale 0, which reads back as log-scale −∞, and above log(float32 max) ≈ 88.7 to ∞);
* base colour 0.5 + C0·f_dc ≤ 0.5/255 within [0, 1] (clamped outside), i.e. f_dc ≤ 0.5/(255·C0) ≈ 0.0070;
* activated opacity ≤ 0.5/255;
* rotation: each unit-quaternion component is stored to ≤ 0.5/128 (1 at +1, where 256 clamps to 255:
  ≤ 1/128); after renormalisation the components differ by ≤ 2·√4·(1/128) ≈ 0.031 at worst — the coarsest
  of the four formats.
"""
from __future__ import annotations

import os
import warnings

import numpy as np

from ..atomic import atomic_path
from ..config import SH_C0
from ..model import GaussianModel
from .write_common import model_arrays, round_clamp_u8, sigmoid
from .ply import SceneWarning

__all__ = ["save_splat", "encode_splat", "SPLAT_DTYPE", "importance_order"]

#: one splat of the file, as a numpy structured dtype (32 bytes)
SPLAT_DTYPE = np.dtype([("position", "<f4", (3,)), ("scale", "<f4", (3,)), ("rgba", "u1", (4,)),
                        ("rot", "u1", (4,))])
assert SPLAT_DTYPE.itemsize == 32


def importance_order(log_scales: np.ndarray, opacity_logits: np.ndarray) -> np.ndarray:
    """(N,) int64: decreasing exp(Σ log_scales) · sigmoid(opacity) (stable for ties)."""
    # compared in log space: Σ log_scale + log sigmoid(o) = Σ log_scale − log(1 + exp(−o))
    key = log_scales.sum(1) - np.logaddexp(0.0, -opacity_logits)
    return np.argsort(-key, kind="stable").astype(np.int64)


def encode_splat(model: GaussianModel, *, sort: bool = True, path=None) -> tuple[bytes, np.ndarray]:
    """(file bytes, order) of ``model`` as a ``.splat`` (module docstring); ``path`` only names it in errors."""
    arr = model_arrays(model, path, "a .splat file")
    n = arr.n
    order = importance_order(arr.log_scales, arr.opacity_logits) if sort else np.arange(n, dtype=np.int64)
    out = np.zeros(n, dtype=SPLAT_DTYPE)
    out["position"] = arr.means[order]
    with np.errstate(over="ignore"):
        out["scale"] = np.exp(arr.log_scales[order])
    rgb = np.clip(0.5 + SH_C0 * arr.sh_dc[order], 0.0, 1.0)
    out["rgba"][:, :3] = round_clamp_u8(rgb * 255.0)
    out["rgba"][:, 3] = round_clamp_u8(sigmoid(arr.opacity_logits[order]) * 255.0)
    out["rot"] = round_clamp_u8(arr.quats[order] * 128.0 + 128.0)
    return out.tobytes(), order


def save_splat(model: GaussianModel, path, *, sort: bool = True) -> np.ndarray:
    """Write ``model`` as an antimatter15 ``.splat`` file (module docstring), atomically.

    Args:
        model: the scene (any device/dtype). SH above degree 0 is dropped (SceneWarning).
        path: output file (``.splat``).
        sort: order by decreasing volume × opacity (default), else keep the input's order.
    Returns: (N,) int64 ``order``: file row i holds input Gaussian ``order[i]``.
    Raises: ExportError (non-finite parameters), OSError (directory not writable).
    """
    path = os.fspath(path)
    if model.sh_degree > 0:
        warnings.warn(f"{path}: the .splat format holds SH degree 0 only; the model's degree-{model.sh_degree} "
                      f"coefficients (view-dependent colour) are dropped", SceneWarning, stacklevel=2)
    blob, order = encode_splat(model.with_sh_degree(0), sort=sort, path=path)
    with atomic_path(path) as tmp:
        with open(tmp, "wb") as f:
            f.write(blob)
    return order
