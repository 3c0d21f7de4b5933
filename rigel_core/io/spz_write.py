"""Niantic SPZ export, versions 2 and 3 (one gzip stream), as Niantic's reference library, SuperSplat /
splat-transform and Spark read them.

The layout is the one :mod:`rigel_core.io.spz` decodes (its docstring has the table); the encoding side,
re-derived here from the public reference (nianticlabs/spz ``load-spz.cc``, ``packGaussians``):

| attribute | bytes | encoding (x = rigel's value, after RDF → RUB) |
|---|---|---|
| header | 16 | ``"NGSP"``, version, N, SH degree, fractional bits, flags (0x1 antialiased), reserved 0 |
| positions | 3×3 | ``round(x · 2^fractional_bits)``, 24-bit two's complement, little-endian |
| alphas | 1 | ``round(sigmoid(opacity_logit) · 255)`` |
| colours | 3 | ``round(f_dc · 0.15 · 255 + 127.5)`` (0.15, not C0: room for DC colours outside [0, 1]) |
| scales | 3 | ``round((log_scale + 10) · 16)`` |
| rotations v2 | 3 | unit quaternion with w ≥ 0: ``round(x·127.5 + 127.5)`` for x, y, z |
| rotations v3 | 4 | "smallest three", u32 LE (below) |
| SH | 3·(K−1) | coefficient-major (``[coef][r, g, b]``), ``128 + 128·c`` rounded to a multiple of 8 or 16 (below) |

SH: degree-1 coefficients keep 5 bits (multiples of 8), degrees 2–3 keep 4 bits (multiples of 16) — the reference
library's default depths — clamped to 0..255. v3 rotations: bits 30–31 hold the index (in x, y, z, w order) of the
largest-magnitude component, which is made positive and dropped; the other three follow, the lowest index in the
highest bits, 10 bits each: a sign bit (bit 9) and the magnitude ``round(511 · |c| · √2)``. Every byte is rounded
to nearest and clamped to 0..255. Axes: SPZ stores RUB; rigel is RDF: positions ``(x, y, z) → (x, −y, −z)``,
quaternions (w, x, y, z) → (w, x, −y, −z), SH coefficients times :data:`rigel_core.io.spz.RUB_TO_RDF_SH_SIGNS`
(the conversion is its own inverse).

**Quantisation error** (what :func:`rigel_core.io.spz.load_spz` gives back vs the input, float64):

* positions ≤ 2^−(fractional_bits+1) per coordinate (2^−13 ≈ 1.2e−4 for 12 bits), for
  \\|x\\| < 2^(23−fractional_bits) (2048 for 12 bits; the writer refuses positions outside);
* log-scales ≤ 1/32 within [−10, 5.94] (clamped outside); activated opacity ≤ 0.5/255;
* f_dc ≤ 0.5 / (0.15·255) ≈ 0.0131 within \\|f_dc\\| ≤ 3.33 (clamped outside), i.e. base colour ≤ 0.0037;
* quaternion components (unit, sign-aligned): v3 ≤ δ = 1/(1022·√2) ≈ 6.9e−4 for the three stored and
  ≤ 3δ for the derived largest; v2 ≤ 0.5/127.5 ≈ 3.9e−3 for x, y, z but w = √(1 − x² − y² − z²) is
  ill-conditioned near w = 0 (≤ 0.117 in the worst case): prefer v3;
* SH rest ≤ 4/128 (degree 1) and ≤ 8/128 (degrees 2–3) within [−1, 127/128] (clamped outside).
"""
from __future__ import annotations

import gzip
import math
import os
import struct

import numpy as np

from ..atomic import atomic_path
from ..model import GaussianModel
from .write_common import ExportError, model_arrays, position_bits_fit, round_clamp_u8, sigmoid
from .spz import COLOR_SCALE, RUB_TO_RDF_SH_SIGNS, SPZ_MAGIC

__all__ = ["save_spz", "encode_spz", "SH1_BITS", "SH_REST_BITS"]

#: bits kept per SH coefficient of degree 1 and of degrees 2-3 (the reference library's defaults)
SH1_BITS = 5
SH_REST_BITS = 4
_FLAG_ANTIALIASED = 0x1
_MAX_FRACTIONAL_BITS = 23  # 24-bit two's complement: 23 bits below the sign


def _auto_fractional_bits(means: np.ndarray) -> int:
    """The reference's 12 bits, or more for a small scene: enough that a step is ≤ 2^−16 of the bounding box's
    largest side (12 bits are ~2^−15 of a 10-unit scene), at most 23."""
    side = float((means.max(0) - means.min(0)).max()) if means.size else 0.0
    if not side > 0:
        return 12
    return int(min(_MAX_FRACTIONAL_BITS, max(12, math.ceil(16 - math.log2(side)))))


def _encode_positions(means_rub: np.ndarray, fractional_bits: int) -> np.ndarray:
    scaled = means_rub * float(1 << fractional_bits)
    fixed = (np.sign(scaled) * np.floor(np.abs(scaled) + 0.5)).astype(np.int64) & 0xFFFFFF
    out = np.empty((means_rub.shape[0], 3, 3), dtype=np.uint8)
    for b in range(3):
        out[..., b] = (fixed >> (8 * b)) & 0xFF
    return out.reshape(-1)


def _encode_rotations(q_xyzw: np.ndarray, version: int) -> np.ndarray:
    n = q_xyzw.shape[0]
    if version == 2:
        q = q_xyzw * np.where(q_xyzw[:, 3] < 0, -1.0, 1.0)[:, None]
        return round_clamp_u8(q[:, :3] * 127.5 + 127.5).reshape(-1)
    largest = np.abs(q_xyzw).argmax(axis=1)  # first of equal magnitudes, as the reference's strict '>'
    q = q_xyzw * np.where(q_xyzw[np.arange(n), largest] < 0, -1.0, 1.0)[:, None]
    comp = largest.astype(np.uint32)
    for i in range(4):  # ascending index: the lowest stored index ends up in the highest bits
        keep = largest != i
        c = q[:, i]
        mag = np.minimum(np.floor(511.0 * np.abs(c) * math.sqrt(2.0) + 0.5), 511).astype(np.uint32)
        field = (np.where(c < 0, 1, 0).astype(np.uint32) << np.uint32(9)) | mag
        comp = np.where(keep, (comp << np.uint32(10)) | field, comp)
    return comp.astype("<u4").view(np.uint8).reshape(-1)


def _quantise_sh(c: np.ndarray, bits: int) -> np.ndarray:
    step = float(1 << (8 - bits))
    q = np.floor((128.0 * c + 128.0) / step + 0.5) * step
    return np.clip(q, 0, 255).astype(np.uint8)


def encode_spz(model: GaussianModel, *, version: int = 3, fractional_bits: int | None = 12,
               sh_degree: int | None = None, antialiased: bool = False, path=None) -> bytes:
    """The uncompressed SPZ v2/v3 stream (header + attributes) of ``model``; :func:`save_spz` gzips it.
    Arguments as for :func:`save_spz`; ``path`` only names the file in errors."""
    if version not in (2, 3):
        raise ExportError(path, f"SPZ version {version} asked; this writer writes versions 2 and 3 (gzip)")
    arr = model_arrays(model, path, "SPZ", sh_degree)
    n = arr.n
    means = arr.means * np.array([1.0, -1.0, -1.0])  # RDF → RUB
    if fractional_bits is None:
        fractional_bits = next((b for b in range(_auto_fractional_bits(means), -1, -1)
                                if position_bits_fit(means, b)), None)
        if fractional_bits is None:
            raise ExportError(path, f"positions reach |x| = {np.abs(means).max():.6g}; SPZ's 24-bit fixed point holds "
                                    f"|x| < 2^23 even with 0 fractional bits")
    elif not 0 <= int(fractional_bits) <= 23:
        raise ExportError(path, f"{fractional_bits} fractional bits asked; SPZ allows 0-23")
    elif not position_bits_fit(means, int(fractional_bits)):
        fits = next((b for b in range(int(fractional_bits), -1, -1) if position_bits_fit(means, b)), None)
        hint = f"use fractional_bits <= {fits}" if fits is not None else "the scene is too large for SPZ"
        raise ExportError(path, f"positions reach |x| = {np.abs(means).max():.6g}, outside the 24-bit fixed point "
                                f"with {fractional_bits} fractional bits (|x| < {2.0 ** (23 - fractional_bits):g}); "
                                f"{hint}")
    fractional_bits = int(fractional_bits)
    degree = {0: 0, 3: 1, 8: 2, 15: 3}[arr.sh_rest.shape[1]]
    w, x, y, z = arr.quats.T
    q_xyzw = np.stack([x, -y, -z, w], axis=1)  # RDF → RUB, in SPZ's (x, y, z, w) order
    dim = arr.sh_rest.shape[1]
    sh = arr.sh_rest * np.asarray(RUB_TO_RDF_SH_SIGNS[:dim], dtype=np.float64)[None, :, None]
    sh_q = np.empty((n, dim, 3), dtype=np.uint8)
    if dim:
        sh_q[:, :3] = _quantise_sh(sh[:, :3], SH1_BITS)
        sh_q[:, 3:] = _quantise_sh(sh[:, 3:], SH_REST_BITS)
    header = struct.pack("<IIIBBBB", SPZ_MAGIC, version, n, degree, fractional_bits,
                         _FLAG_ANTIALIASED if antialiased else 0, 0)
    parts = [
        _encode_positions(means, fractional_bits),
        round_clamp_u8(sigmoid(arr.opacity_logits) * 255.0),
        round_clamp_u8(arr.sh_dc * (COLOR_SCALE * 255.0) + 127.5).reshape(-1),
        round_clamp_u8((arr.log_scales + 10.0) * 16.0).reshape(-1),
        _encode_rotations(q_xyzw, version),
        sh_q.reshape(-1),  # (N, coef, rgb): coefficient-major, colour inner
    ]
    return header + b"".join(p.tobytes() for p in parts)


def save_spz(model: GaussianModel, path, *, version: int = 3, fractional_bits: int | None = 12,
             sh_degree: int | None = None, antialiased: bool = False) -> np.ndarray:
    """Write ``model`` as a gzip-compressed Niantic SPZ file (module docstring), atomically.

    Args:
        model: the scene (rigel's RDF axes; any device/dtype).
        path: output file (``.spz``).
        version: 2 (rotations as x, y, z bytes) or 3 (smallest-three, 4 bytes; more precise). Default 3.
        fractional_bits: of the 24-bit fixed-point positions; 12 as the reference writes (|x| < 2048).
            None: 12, or more for a small scene so that a step is ≤ 2^−16 of its bounding box (the 0.2-unit
            donut gets 19 bits: steps of 1.9e−6 instead of 2.4e−4), or fewer when the positions do not fit.
        sh_degree: truncate (or zero-pad) the SH to this degree (0-3); default the model's.
        antialiased: set the header's antialiased flag (the scene was trained with the Mip-Splatting 2D filter).
    Returns: (N,) int64 ``order`` (the identity: SPZ keeps the input's order).
    Raises: ExportError (non-finite parameters, positions outside the fixed-point range, bad arguments),
        OSError (directory not writable).
    """
    path = os.fspath(path)
    raw = encode_spz(model, version=version, fractional_bits=fractional_bits, sh_degree=sh_degree,
                     antialiased=antialiased, path=path)
    blob = gzip.compress(raw, compresslevel=6, mtime=0)
    with atomic_path(path) as tmp:
        with open(tmp, "wb") as f:
            f.write(blob)
    return np.arange(model.num_gaussians, dtype=np.int64)
