"""PlayCanvas / SuperSplat "compressed PLY" export (``*.compressed.ply``), the layout
:mod:`rigel_core.io.compressed_ply` decodes (its docstring has the bit layout). Encoding, re-derived from the
public description and PlayCanvas's writer (splat-transform ``compressed-chunk.ts`` / ``write-compressed-ply.ts``):

* The splats are sorted along a 3D Morton (Z-order) curve of their positions (21 bits per axis over the
  scene's bounding box) so that each chunk of 256 consecutive splats is spatially compact: the chunk's
  min/max boxes are tight, which is what bounds the quantisation error below.
* ``element chunk`` — per 256 splats, float32 ``min/max`` of x y z, of the log-scales (``min_scale_x`` …,
  log-scales clamped to [−20, 20] first, as PlayCanvas does) and of the base colour r g b = 0.5 + C0·f_dc.
  The float32 bounds are rounded outwards so that every member lies inside them.
* ``element vertex`` — ``packed_position`` and ``packed_scale`` 11-10-11 bits (x in the high bits), each
  ``round(t · (2^bits − 1))`` of t = (v − min)/(max − min) (0 when max = min); ``packed_rotation`` the
  normalised (w, x, y, z) with its largest-magnitude component made positive and dropped: 2 bits of its index,
  then the other three in ascending index order, 10 bits each, ``round((c/√2 + 0.5)·1023)``;
  ``packed_color`` R G B (chunk-normalised) and the opacity sigmoid(logit), 8 bits each.
* ``element sh`` (SH degree ≥ 1) — ``uchar f_rest_0 …`` channel-major, ``q = trunc((c/8 + 0.5)·256)`` clamped
  to 0..255, which the readers decode to the centre of q's cell.

Axes are written as they are (the INRIA PLY's RDF; PlayCanvas applies its own flip on load, as for a PLY).

**Quantisation error** (decoded vs input, per splat, with ext = the chunk's max − min of that quantity):

* positions ≤ ext/(2·2047) in x and z, ≤ ext/(2·1023) in y; log-scales likewise (within [−20, 20]);
* base colour 0.5 + C0·f_dc ≤ ext/(2·255) per channel (so f_dc ≤ ext/(2·255·C0));
* activated opacity ≤ 0.5/255;
* quaternion components (unit, sign-aligned) ≤ δ = √2/2046 ≈ 6.9e−4 for the three stored, ≤ 3δ for the
  derived largest;
* SH rest ≤ 1/64 within (−4 + 1/32, 4 − 1/32), ≤ 1/32 at the ends of [−4, 4] (clamped outside).
"""
from __future__ import annotations

import math
import os

import numpy as np

from ..atomic import atomic_path
from ..config import SH_C0
from ..model import GaussianModel
from .compressed_ply import CHUNK_SIZE
from .write_common import model_arrays, sigmoid

__all__ = ["save_compressed_ply", "morton_order"]

_CHUNK_PROPS = ["min_x", "min_y", "min_z", "max_x", "max_y", "max_z",
                "min_scale_x", "min_scale_y", "min_scale_z", "max_scale_x", "max_scale_y", "max_scale_z",
                "min_r", "min_g", "min_b", "max_r", "max_g", "max_b"]
_VERTEX_PROPS = ["packed_position", "packed_rotation", "packed_scale", "packed_color"]
_LOG_SCALE_CLAMP = 20.0
_MORTON_BITS = 21  # 3 × 21 = 63 bits fit a uint64


def _spread_bits_3(v: np.ndarray) -> np.ndarray:
    """Insert two zero bits between each of the low 21 bits of ``v`` (uint64) — bit i moves to bit 3i."""
    v = v & np.uint64(0x1FFFFF)
    for shift, mask in ((32, 0x1F00000000FFFF), (16, 0x1F0000FF0000FF), (8, 0x100F00F00F00F00F),
                        (4, 0x10C30C30C30C30C3), (2, 0x1249249249249249)):
        v = (v | (v << np.uint64(shift))) & np.uint64(mask)
    return v


def morton_order(means: np.ndarray) -> np.ndarray:
    """(N,) int64 permutation sorting (N,3) finite positions along a Morton curve over their bounding box
    (x in the lowest bit of each triple; ties keep the input order)."""
    n = means.shape[0]
    if n == 0:
        return np.zeros(0, dtype=np.int64)
    lo, hi = means.min(0), means.max(0)
    ext = hi - lo
    scale = np.where(ext > 0, ((1 << _MORTON_BITS) - 1) / np.where(ext > 0, ext, 1.0), 0.0)
    cells = np.clip(np.floor((means - lo) * scale), 0, (1 << _MORTON_BITS) - 1).astype(np.uint64)
    code = _spread_bits_3(cells[:, 0]) | (_spread_bits_3(cells[:, 1]) << np.uint64(1)) \
        | (_spread_bits_3(cells[:, 2]) << np.uint64(2))
    return np.argsort(code, kind="stable").astype(np.int64)


def _outward_f32(lo: np.ndarray, hi: np.ndarray):
    """float32 bounds enclosing [lo, hi] (float64), as float64 values."""
    lo32, hi32 = lo.astype(np.float32), hi.astype(np.float32)
    lo32 = np.where(lo32.astype(np.float64) > lo, np.nextafter(lo32, np.float32(-np.inf)), lo32)
    hi32 = np.where(hi32.astype(np.float64) < hi, np.nextafter(hi32, np.float32(np.inf)), hi32)
    return lo32.astype(np.float64), hi32.astype(np.float64)


def _pack_unorm(t: np.ndarray, bits: int) -> np.ndarray:
    top = (1 << bits) - 1
    return np.clip(np.floor(t * top + 0.5), 0, top).astype(np.uint32)


def _chunk_quantise(values: np.ndarray, n_chunks: int, bits) -> tuple:
    """values (C·256, 3) padded → (lo (C,3), hi (C,3) float32-representable, packed 11-10-11 or 8-8-8 fields
    (C·256, 3) uint32)."""
    v = values.reshape(n_chunks, CHUNK_SIZE, 3)
    lo, hi = _outward_f32(v.min(1), v.max(1))
    rng = hi - lo
    t = np.where(rng[:, None] > 0, (v - lo[:, None]) / np.where(rng > 0, rng, 1.0)[:, None], 0.0)
    fields = np.stack([_pack_unorm(t[..., a], bits[a]) for a in range(3)], axis=-1)
    return lo, hi, fields.reshape(-1, 3)


def _pack_rotation(q: np.ndarray) -> np.ndarray:
    """(N,4) unit (w, x, y, z) → (N,) uint32 smallest-three words."""
    n = q.shape[0]
    largest = np.abs(q).argmax(1)
    q = q * np.where(q[np.arange(n), largest] < 0, -1.0, 1.0)[:, None]
    word = largest.astype(np.uint32)
    for i in range(4):
        field = _pack_unorm(q[:, i] / math.sqrt(2.0) + 0.5, 10)
        word = np.where(largest != i, (word << np.uint32(10)) | field, word)
    return word


def save_compressed_ply(model: GaussianModel, path, *, sh_degree: int | None = None, sort: bool = True) -> np.ndarray:
    """Write ``model`` as a PlayCanvas / SuperSplat compressed PLY (module docstring), atomically.

    Args:
        model: the scene (any device/dtype).
        path: output file (name it ``*.compressed.ply``: PlayCanvas's loaders go by that suffix).
        sh_degree: truncate (or zero-pad) the SH to this degree (0-3); default the model's.
        sort: Morton-sort the splats before chunking (default; tighter chunks, smaller errors).
    Returns: (N,) int64 ``order``: file row i holds input Gaussian ``order[i]``.
    Raises: ExportError (non-finite parameters, bad sh_degree), OSError (directory not writable).
    """
    path = os.fspath(path)
    arr = model_arrays(model, path, "a compressed PLY", sh_degree)
    n = arr.n
    order = morton_order(arr.means) if sort else np.arange(n, dtype=np.int64)
    n_chunks = -(-n // CHUNK_SIZE)
    pad = np.concatenate([order, np.full(n_chunks * CHUNK_SIZE - n, order[-1] if n else 0, dtype=np.int64)])

    chunk = np.zeros((n_chunks, 18), dtype=np.float64)
    packed = np.zeros((n_chunks * CHUNK_SIZE, 4), dtype=np.uint32)
    if n:
        log_scales = np.clip(arr.log_scales, -_LOG_SCALE_CLAMP, _LOG_SCALE_CLAMP)
        rgb = 0.5 + SH_C0 * arr.sh_dc
        for col, (values, bits) in enumerate(((arr.means, (11, 10, 11)), (log_scales, (11, 10, 11)),
                                              (rgb, (8, 8, 8)))):
            lo, hi, f = _chunk_quantise(values[pad], n_chunks, bits)
            chunk[:, 6 * col:6 * col + 3], chunk[:, 6 * col + 3:6 * col + 6] = lo, hi
            if col < 2:
                packed[:, 0 if col == 0 else 2] = (f[:, 0] << np.uint32(21)) | (f[:, 1] << np.uint32(11)) | f[:, 2]
            else:
                alpha = _pack_unorm(sigmoid(arr.opacity_logits[pad]), 8)
                packed[:, 3] = (f[:, 0] << np.uint32(24)) | (f[:, 1] << np.uint32(16)) | (f[:, 2] << np.uint32(8)) \
                    | alpha
        packed[:, 1] = _pack_rotation(arr.quats[pad])
    packed = packed[:n]

    k1 = arr.sh_rest.shape[1]
    header = ["ply", "format binary_little_endian 1.0", "comment Generated by rigel (compressed_ply_write)",
              f"element chunk {n_chunks}", *[f"property float {p}" for p in _CHUNK_PROPS],
              f"element vertex {n}", *[f"property uint {p}" for p in _VERTEX_PROPS]]
    sh_bytes = b""
    if k1:
        header += [f"element sh {n}", *[f"property uchar f_rest_{i}" for i in range(3 * k1)]]
        rest = arr.sh_rest[order].transpose(0, 2, 1).reshape(n, 3 * k1)  # channel-major, as the INRIA PLY
        sh_bytes = np.clip(np.floor((rest / 8.0 + 0.5) * 256.0), 0, 255).astype(np.uint8).tobytes()
    header.append("end_header\n")
    with atomic_path(path) as tmp:
        with open(tmp, "wb") as f:
            f.write("\n".join(header).encode("ascii"))
            f.write(chunk.astype("<f4").tobytes())
            f.write(packed.astype("<u4").tobytes())
            f.write(sh_bytes)
    return order
