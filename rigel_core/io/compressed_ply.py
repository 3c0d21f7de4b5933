"""PlayCanvas / SuperSplat "compressed PLY" import (``*.compressed.ply``).

The format, as PlayCanvas's engine and ``splat-transform`` read and write it (the bit layout here was learned
from their public readers/writers; this decoder is written independently):

* ``element chunk C`` — per chunk of 256 consecutive splats, float properties
  ``min_x min_y min_z max_x max_y max_z min_scale_x min_scale_y min_scale_z max_scale_x max_scale_y
  max_scale_z`` and optionally ``min_r min_g min_b max_r max_g max_b`` (18 properties; 12 in older files).
* ``element vertex N`` — four ``uint`` per splat:

  - ``packed_position``: 11/10/11 bits (x in bits 21–31, y in 11–20, z in 0–10), each an unsigned
    normalised value t = v / (2^bits − 1), lerped between the chunk's min and max;
  - ``packed_rotation``: "smallest three" 2+10+10+10: bits 30–31 give the index (in PLY order
    ``rot_0..3`` = w, x, y, z) of the largest-magnitude component, which is made non-negative and dropped;
    the other three, in order, occupy bits 20–29, 10–19, 0–9 as (v/1023 − 0.5)·√2 (i.e. in ±1/√2);
    the dropped one is √(1 − a² − b² − c²);
  - ``packed_scale``: 11/10/11 bits lerped between the chunk's ``min_scale_*``/``max_scale_*``; those are
    **log** scales already, so the result maps to ``log_scales`` directly;
  - ``packed_color``: 8/8/8/8 bits (R in 24–31, G 16–23, B 8–15, alpha 0–7), unsigned normalised; R, G, B
    are lerped between ``min_r..max_b`` when the chunk has them (else used directly) and give the base colour
    c with c = 0.5 + C0·f_dc, so ``f_dc = (c − 0.5) / C0``; alpha is the activated opacity, so
    ``opacity_logit = log(a / (1 − a))`` with a clamped to [0.5/255, 1 − 0.5/255] (a byte cannot say more;
    without the clamp 0 and 255 would give ±∞).

* optional ``element sh N`` — ``uchar f_rest_0 … f_rest_{M−1}``, M = 9, 24 or 45, channel-major as in the
  INRIA PLY; byte q encodes a coefficient in [−4, 4]: ``(n − 0.5)·8`` with n = (q + 0.5)/256, and the clamped
  ends q = 0 → −4, q = 255 → +4 (the writer computes q = trunc((v/8 + 0.5)·256) clamped to 0..255).

Coordinates are stored as in the INRIA PLY the file was made from (x right, y down, z forward for COLMAP
scenes); no axis conversion is applied.
"""
from __future__ import annotations

import math
import os
import warnings

import numpy as np
import torch

from ..config import SH_C0
from ..model import GaussianModel
from .errors import PlyFormatError
from .ply import SceneWarning, _warn_nonfinite, read_ply_elements, read_ply_header, rest_property_names

__all__ = ["load_compressed_ply", "is_compressed_ply_header", "CHUNK_SIZE"]

CHUNK_SIZE = 256
_CHUNK_BASE = ["min_x", "min_y", "min_z", "max_x", "max_y", "max_z",
               "min_scale_x", "min_scale_y", "min_scale_z", "max_scale_x", "max_scale_y", "max_scale_z"]
_CHUNK_COLOR = ["min_r", "min_g", "min_b", "max_r", "max_g", "max_b"]
_PACKED = ["packed_position", "packed_rotation", "packed_scale", "packed_color"]
_ALPHA_EPS = 0.5 / 255.0


def is_compressed_ply_header(header) -> bool:
    """True when a parsed :class:`~rigel_core.io.ply.PlyHeader` has the compressed layout's elements
    (``chunk`` and a ``vertex`` element with ``packed_*`` properties)."""
    vertex, chunk = header.element("vertex"), header.element("chunk")
    return (chunk is not None and vertex is not None
            and any(vertex.property(n) is not None for n in _PACKED))


def _unorm(v: np.ndarray, shift: int, bits: int) -> np.ndarray:
    """Unsigned normalised field of ``bits`` bits at ``shift`` of uint32 ``v`` → float64 in [0, 1]."""
    return ((v >> np.uint32(shift)) & np.uint32((1 << bits) - 1)).astype(np.float64) / float((1 << bits) - 1)


def _unpack_11_10_11(v: np.ndarray) -> np.ndarray:
    return np.stack([_unorm(v, 21, 11), _unorm(v, 11, 10), _unorm(v, 0, 11)], axis=1)


def _lerp(lo, hi, t):
    return lo * (1.0 - t) + hi * t


def decode_rotation(packed: np.ndarray) -> np.ndarray:
    """(N,) uint32 "smallest three" quaternions → (N,4) float64 (w, x, y, z), unit norm."""
    scale = math.sqrt(2.0)  # (t − 0.5)·√2 maps [0, 1] onto [−1/√2, 1/√2]
    abc = np.stack([(_unorm(packed, s, 10) - 0.5) * scale for s in (20, 10, 0)], axis=1)
    largest = (packed >> np.uint32(30)).astype(np.int64)
    m = np.sqrt(np.clip(1.0 - (abc * abc).sum(1), 0.0, None))
    q = np.empty((packed.shape[0], 4), dtype=np.float64)
    for idx in range(4):
        rows = largest == idx
        others = [j for j in range(4) if j != idx]
        q[rows, idx] = m[rows]
        q[np.ix_(rows, others)] = abc[rows]
    return q


def load_compressed_ply(path, device=None, dtype=torch.float32) -> GaussianModel:
    """Decode a PlayCanvas / SuperSplat compressed PLY (module docstring) into a :class:`GaussianModel`.

    Args: path; device, dtype of the returned tensors.
    Returns: GaussianModel with N splats, SH degree 0 or from the ``sh`` element (1..3).
    Raises:
        PlyFormatError: missing or mistyped elements/properties, too few chunks for the vertices, an ``sh``
            element whose row count or property count does not fit, truncated or corrupt file.
    Warns: SceneWarning for decoded non-finite values (only possible with non-finite chunk bounds).
    """
    path = os.fspath(path)
    header = read_ply_header(path)
    chunk_el, vertex_el, sh_el = header.element("chunk"), header.element("vertex"), header.element("sh")
    if chunk_el is None or vertex_el is None:
        raise PlyFormatError(path, "a compressed PLY needs elements 'chunk' and 'vertex'")
    for name in _CHUNK_BASE:
        p = chunk_el.property(name)
        if p is None:
            raise PlyFormatError(path, f"compressed PLY: element 'chunk' lacks property '{name}'")
        if not p.is_float:
            raise PlyFormatError(path, f"compressed PLY: chunk property '{name}' is '{p.type}', expected float")
    has_color = [chunk_el.property(n) is not None for n in _CHUNK_COLOR]
    if any(has_color) and not all(has_color):
        missing = [n for n, h in zip(_CHUNK_COLOR, has_color) if not h]
        raise PlyFormatError(path, f"compressed PLY: chunk colour bounds incomplete, missing {', '.join(missing)}")
    has_color = all(has_color)
    if has_color and not all(chunk_el.property(n).is_float for n in _CHUNK_COLOR):
        raise PlyFormatError(path, "compressed PLY: chunk colour bounds must be float")
    for name in _PACKED:
        p = vertex_el.property(name)
        if p is None:
            raise PlyFormatError(path, f"compressed PLY: element 'vertex' lacks property '{name}'")
        if p.is_list or p.type not in ("uint", "uint32"):
            raise PlyFormatError(path, f"compressed PLY: vertex property '{name}' is '{p.type}', expected uint")
    n = vertex_el.count
    n_chunks_needed = -(-n // CHUNK_SIZE)
    if chunk_el.count < n_chunks_needed:
        raise PlyFormatError(path, f"compressed PLY: {n} vertices need {n_chunks_needed} chunks of {CHUNK_SIZE}, "
                                   f"the file has {chunk_el.count}")
    n_sh = 0
    if sh_el is not None:
        n_sh = len(sh_el.properties)
        if n_sh not in (9, 24, 45) or any(not p.name.startswith("f_rest_") for p in sh_el.properties):
            raise PlyFormatError(path, f"compressed PLY: element 'sh' must hold f_rest_0..f_rest_M-1 with M = 9, 24 "
                                       f"or 45, got {n_sh} properties")
        sh_names = rest_property_names(path, sh_el)  # index order; zero-padded names accepted as in the INRIA PLY
        bad = [p.name for p in sh_el.properties if p.is_list or p.type not in ("uchar", "uint8")]
        if bad:
            raise PlyFormatError(path, f"compressed PLY: sh property '{bad[0]}' is not uchar")
        if sh_el.count != n:
            raise PlyFormatError(path, f"compressed PLY: element 'sh' has {sh_el.count} rows for {n} vertices")

    elements = read_ply_elements(path, header)
    chunks, verts = elements["chunk"], elements["vertex"]
    ci = np.arange(n) // CHUNK_SIZE

    def chunk_cols(names):
        return np.stack([np.asarray(chunks[nm], dtype=np.float64) for nm in names], axis=1)[ci]

    pos_lo, pos_hi = chunk_cols(_CHUNK_BASE[0:3]), chunk_cols(_CHUNK_BASE[3:6])
    sc_lo, sc_hi = chunk_cols(_CHUNK_BASE[6:9]), chunk_cols(_CHUNK_BASE[9:12])
    pp, pr, ps, pc = (np.asarray(verts[nm], dtype=np.uint32) for nm in _PACKED)

    means = _lerp(pos_lo, pos_hi, _unpack_11_10_11(pp))
    log_scales = _lerp(sc_lo, sc_hi, _unpack_11_10_11(ps))
    quats = decode_rotation(pr)
    rgb = np.stack([_unorm(pc, 24, 8), _unorm(pc, 16, 8), _unorm(pc, 8, 8)], axis=1)
    if has_color:
        rgb = _lerp(chunk_cols(_CHUNK_COLOR[0:3]), chunk_cols(_CHUNK_COLOR[3:6]), rgb)
    sh_dc = ((rgb - 0.5) / SH_C0).reshape(n, 1, 3)
    alpha = np.clip(_unorm(pc, 0, 8), _ALPHA_EPS, 1.0 - _ALPHA_EPS)
    opacity = np.log(alpha / (1.0 - alpha))

    k1 = n_sh // 3
    if n_sh:
        sh = elements["sh"]
        q = np.stack([np.asarray(sh[name], dtype=np.float64) for name in sh_names], axis=1)
        nrm = np.where(q == 0, 0.0, np.where(q == 255, 1.0, (q + 0.5) / 256.0))
        sh_rest = ((nrm - 0.5) * 8.0).reshape(n, 3, k1).transpose(0, 2, 1)  # channel-major → (N, K−1, 3)
    else:
        sh_rest = np.zeros((n, 0, 3))
    arrays = (means, log_scales, quats, opacity, sh_dc, np.ascontiguousarray(sh_rest))
    _warn_nonfinite(path, arrays, n)
    if n == 0:
        warnings.warn(f"{path}: the compressed PLY has 0 splats; returning an empty model", SceneWarning,
                      stacklevel=2)
    return GaussianModel(*(torch.from_numpy(a).to(device=device, dtype=dtype) for a in arrays))
