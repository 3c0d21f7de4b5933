"""Niantic SPZ import, versions 2, 3 and 4.

Layout (learned from the public description and reference library, nianticlabs/spz; decoder written here):

* **v2 / v3**: the whole file is one gzip stream (a plain, un-gzipped stream is accepted too). It holds a
  16-byte header — ``magic u32 = 0x5053474e ("NGSP")``, ``version u32``, ``numPoints u32``, ``shDegree u8``,
  ``fractionalBits u8``, ``flags u8`` (0x1 antialiased, 0x2 extensions follow), ``reserved u8`` — then, when
  flag 0x2 is set, extension records, then the attributes, each for all points in turn.
* **v4**: an uncompressed 32-byte header — the 16 bytes above with byte 15 = ``numStreams``, then
  ``tocByteOffset u32`` and 12 reserved bytes — optional extension records up to ``tocByteOffset``, a table of
  contents of ``numStreams`` × (compressed size u64, uncompressed size u64), then one zstd frame per
  non-empty attribute, in the same attribute order. Needs the ``zstandard`` package.

Attributes, per point, little-endian:

| attribute | bytes | decoding |
|---|---|---|
| positions | 3×3 | 24-bit two's-complement fixed point, ``value / 2^fractionalBits`` |
| alphas | 1 | activated opacity ``a/255`` → ``opacity_logit = log(a/(1−a))``, a clamped to [0.5/255, 1−0.5/255] |
| colours | 3 | SH DC scaled by 0.15, not C0: ``f_dc = (c/255 − 0.5) / 0.15`` |
| scales | 3 | log scale ``s/16 − 10`` |
| rotations | 3 (v2) | x, y, z as ``r/127.5 − 1``; ``w = √(1 − x² − y² − z²)`` |
| rotations | 4 (v3+) | "smallest three": u32, bits 30–31 = index of the largest of (x, y, z, w); the other three, from the highest index down, take 10 bits each starting at bit 0: 9-bit magnitude ``m/511 · 1/√2`` and a sign bit; the largest is ``√(1 − Σ others²)`` |
| SH | 3·(K−1) | coefficient-major, colour inner: ``[coef][r,g,b]``; ``(q − 128)/128`` |

**Coordinates.** SPZ stores RUB (x right, y up, z back — OpenGL / three.js). rigel and the INRIA PLY use
RDF (x right, y down, z forward — COLMAP / OpenCV). The two differ by a rotation of 180° about x,
S = diag(1, −1, −1), applied on load:

* positions: ``(x, y, z) → (x, −y, −z)``;
* rotations: R' = S·R·S, i.e. the quaternion (w, x, y, z) → (w, x, −y, −z) (S is a proper rotation, so
  scales are unchanged);
* SH: a coefficient's basis function Y_k(x, y, z) becomes Y_k(x, −y, −z) = ±Y_k; the signs, for the 15
  higher coefficients in the reference order, are ``− − + | − + + − + | − + − − + − +`` (each basis polynomial
  is odd or even in y·z jointly; e.g. −C1·y → flips, C1·x → keeps).

SH degree 4 (SPZ allows it) is truncated to degree 3 with a warning. Version 1 (half-float positions, never
released) is rejected. Every size is checked against the file before anything is allocated or decompressed:
the header's point count must fit the compressed data (deflate expands at most ~1032×, and v4 declares every
stream's sizes), and decompression is bounded by the expected size.
"""
from __future__ import annotations

import io
import math
import os
import struct
import warnings
import zlib

import numpy as np
import torch

from ..model import GaussianModel
from .errors import SpzFormatError
from .ply import SceneWarning, _warn_nonfinite

__all__ = ["load_spz", "SPZ_MAGIC", "MAX_POINTS", "RUB_TO_RDF_SH_SIGNS", "COLOR_SCALE"]

SPZ_MAGIC = 0x5053474E  # b"NGSP" little-endian
COLOR_SCALE = 0.15
_ALPHA_EPS = 0.5 / 255.0
_DEFLATE_MAX_RATIO = 1032  # the largest expansion deflate can produce
_ZSTD_MAX_RATIO = 32768  # an RLE block: 4 bytes for up to 128 KiB
#: Largest point count accepted (the reference library's own limit, ``maxPointsToRead``).
MAX_POINTS = 10_000_000
_LEGACY_HEADER = struct.Struct("<IIIBBBB")
_V4_HEADER = struct.Struct("<IIIBBBBI12x")
_FLAG_EXTENSIONS = 0x2
_SH_DIM = {0: 0, 1: 3, 2: 8, 3: 15, 4: 24}  # higher-order coefficients per channel
# Sign of Y_k(x, −y, −z) / Y_k(x, y, z) for the 15 higher SH basis functions (reference order, DESIGN §3).
RUB_TO_RDF_SH_SIGNS = (-1, -1, 1, -1, 1, 1, -1, 1, -1, 1, -1, -1, 1, -1, 1)


def _attribute_sizes(n: int, version: int, sh_degree: int) -> list[int]:
    """Bytes of positions, alphas, colours, scales, rotations, SH for ``n`` points."""
    return [9 * n, n, 3 * n, 3 * n, (4 if version >= 3 else 3) * n, 3 * _SH_DIM[sh_degree] * n]


def _check_header_fields(path, version, n, sh_degree, fractional_bits):
    if version == 1:
        raise SpzFormatError(path, "SPZ version 1 (half-float positions) is not supported; versions 2-4 are")
    if version not in (2, 3, 4):
        raise SpzFormatError(path, f"unsupported SPZ version {version} (versions 2-4 are supported)")
    if sh_degree not in _SH_DIM:
        raise SpzFormatError(path, f"SH degree {sh_degree} in the header; SPZ allows 0-4")
    if n > MAX_POINTS:
        raise SpzFormatError(path, f"header claims {n} points; more than {MAX_POINTS} is refused (corrupt header?)")
    if fractional_bits > 23:
        raise SpzFormatError(path, f"{fractional_bits} fractional bits in the header; at most 23 fit 24-bit positions")


def _decompress_bounded(path, blob: bytes, limit: int) -> bytes:
    """Inflate a gzip (or zlib / raw-header) stream, producing at most ``limit`` bytes."""
    d = zlib.decompressobj(16 + zlib.MAX_WBITS)
    try:
        out = d.decompress(blob, limit)
    except zlib.error as e:
        raise SpzFormatError(path, f"corrupt gzip data ({e})") from None
    if not d.eof and len(out) < limit:
        raise SpzFormatError(path, "the gzip stream ends early: truncated file")
    return out


def _zstd_bounded(path, frame: bytes, expected: int, what: str) -> bytes:
    try:
        import zstandard
    except ImportError:
        raise SpzFormatError(path, "SPZ version 4 is zstd-compressed and needs the 'zstandard' package "
                                   "(pip install zstandard)") from None
    try:
        declared = zstandard.frame_content_size(frame)
    except zstandard.ZstdError as e:
        raise SpzFormatError(path, f"the {what} stream is not a zstd frame ({e})") from None
    if declared >= 0 and declared != expected:
        raise SpzFormatError(path, f"the {what} stream's zstd frame declares {declared} bytes, expected {expected}")
    try:
        reader = zstandard.ZstdDecompressor().stream_reader(io.BytesIO(frame))
        out = reader.read(expected + 1)
        while 0 < len(out) <= expected:  # read() may return early at frame-internal boundaries
            more = reader.read(expected + 1 - len(out))
            if not more:
                break
            out += more
    except zstandard.ZstdError as e:
        raise SpzFormatError(path, f"corrupt zstd data in the {what} stream ({e})") from None
    if len(out) > expected:
        raise SpzFormatError(path, f"the {what} stream decompresses to more than the {expected} bytes declared")
    if len(out) < expected:
        raise SpzFormatError(path, f"the {what} stream decompresses to {len(out)} bytes, {expected} declared: "
                                   f"truncated or corrupt")
    return out


_ATTR_NAMES = ("positions", "alphas", "colors", "scales", "rotations", "spherical harmonics")


def _read_v4(path, raw: bytes):
    if len(raw) < _V4_HEADER.size:
        raise SpzFormatError(path, f"file is {len(raw)} bytes, shorter than the 32-byte SPZ v4 header")
    magic, version, n, sh_degree, fbits, flags, n_streams, toc_offset = _V4_HEADER.unpack_from(raw)
    _check_header_fields(path, version, n, sh_degree, fbits)
    sizes = _attribute_sizes(n, version, sh_degree)
    present = [i for i, s in enumerate(sizes) if s > 0]
    if n_streams != len(present):
        raise SpzFormatError(path, f"header declares {n_streams} streams; {n} points with SH degree {sh_degree} "
                                   f"need {len(present)}")
    toc_end = toc_offset + 16 * n_streams
    if toc_offset < _V4_HEADER.size or toc_end > len(raw):
        raise SpzFormatError(path, f"table of contents at byte {toc_offset} lies outside the {len(raw)}-byte file")
    if flags & _FLAG_EXTENSIONS:
        warnings.warn(f"{path}: SPZ extension records ({toc_offset - 32} bytes) are ignored", SceneWarning,
                      stacklevel=3)
    streams = [b""] * len(sizes)
    offset = toc_end
    for j, attr in enumerate(present):
        csize, usize = struct.unpack_from("<QQ", raw, toc_offset + 16 * j)
        if usize != sizes[attr]:
            raise SpzFormatError(path, f"the {_ATTR_NAMES[attr]} stream declares {usize} bytes; {n} points need "
                                       f"{sizes[attr]}")
        if usize > _ZSTD_MAX_RATIO * csize + 1024:
            raise SpzFormatError(path, f"the {_ATTR_NAMES[attr]} stream claims {usize} bytes from {csize} compressed "
                                       f"bytes, more than zstd can expand: corrupt file")
        if offset + csize > len(raw):
            raise SpzFormatError(path, f"the {_ATTR_NAMES[attr]} stream ({csize} bytes at byte {offset}) runs past "
                                       f"the end of the {len(raw)}-byte file: truncated")
        streams[attr] = _zstd_bounded(path, raw[offset:offset + csize], usize, _ATTR_NAMES[attr])
        offset += csize
    if offset < len(raw):
        warnings.warn(f"{path}: {len(raw) - offset} bytes after the last stream are ignored", SceneWarning,
                      stacklevel=3)
    return version, n, sh_degree, fbits, streams


def _read_legacy(path, raw: bytes):
    gz = raw[:2] == b"\x1f\x8b"
    if gz:
        head = _decompress_bounded(path, raw, _LEGACY_HEADER.size)
    else:
        head = raw[:_LEGACY_HEADER.size]
    if len(head) < _LEGACY_HEADER.size:
        raise SpzFormatError(path, "shorter than the 16-byte SPZ header: truncated file")
    magic, version, n, sh_degree, fbits, flags, _ = _LEGACY_HEADER.unpack_from(head)
    if magic != SPZ_MAGIC:
        raise SpzFormatError(path, "not an SPZ file (no 'NGSP' magic after decompression)")
    _check_header_fields(path, version, n, sh_degree, fbits)
    if version == 4:
        raise SpzFormatError(path, "SPZ version 4 must not be gzip-wrapped (its header is stored uncompressed)")
    sizes = _attribute_sizes(n, version, sh_degree)
    payload = sum(sizes)
    total = _LEGACY_HEADER.size + payload
    if gz and total > _DEFLATE_MAX_RATIO * len(raw) + 1024:
        raise SpzFormatError(path, f"header claims {n} points ({total} bytes), more than {len(raw)} bytes of gzip "
                                   f"data can hold: corrupt header")
    has_ext = bool(flags & _FLAG_EXTENSIONS)
    # Extension records (flag 0x2) precede the attributes; their total size is whatever is left over.
    slack = (1 << 20) if has_ext else 0
    if gz:
        data = _decompress_bounded(path, raw, total + slack + 1)
    else:
        data = raw
    if len(data) < total:
        raise SpzFormatError(path, f"the data holds {len(data) - _LEGACY_HEADER.size} bytes after the header; "
                                   f"{n} points need {payload}: truncated file")
    extra = len(data) - total
    if has_ext:
        if extra > slack:
            raise SpzFormatError(path, "more than 1 MiB of extension records: corrupt file")
        if extra:
            warnings.warn(f"{path}: SPZ extension records ({extra} bytes) are ignored", SceneWarning, stacklevel=3)
        start = _LEGACY_HEADER.size + extra
    else:
        if extra:
            more = "or more " if gz else ""  # a gzip stream is only inflated one byte past the expected size
            warnings.warn(f"{path}: {extra} {more}unexpected bytes after the splat data are ignored", SceneWarning,
                          stacklevel=3)
        start = _LEGACY_HEADER.size
    streams, off = [], start
    for s in sizes:
        streams.append(data[off:off + s])
        off += s
    return version, n, sh_degree, fbits, streams


def _decode_rotations(rot: np.ndarray, version: int, n: int) -> np.ndarray:
    """(N,4) float64 quaternions (x, y, z, w) in the file's RUB frame."""
    if version < 3:
        xyz = rot.reshape(n, 3).astype(np.float64) / 127.5 - 1.0
        w = np.sqrt(np.clip(1.0 - (xyz * xyz).sum(1), 0.0, None))
        return np.concatenate([xyz, w[:, None]], axis=1)
    comp = rot.reshape(n, 4).astype(np.uint32)
    comp = comp[:, 0] | (comp[:, 1] << 8) | (comp[:, 2] << 16) | (comp[:, 3] << 24)
    largest = (comp >> 30).astype(np.int64)
    q = np.zeros((n, 4), dtype=np.float64)
    for idx in range(4):
        rows = np.nonzero(largest == idx)[0]
        c = comp[rows]
        acc = np.zeros(rows.shape[0])
        for slot, comp_i in enumerate(j for j in (3, 2, 1, 0) if j != idx):  # highest index in the lowest bits
            field = (c >> np.uint32(10 * slot)) & np.uint32(0x3FF)
            mag = (field & np.uint32(0x1FF)).astype(np.float64) * (math.sqrt(0.5) / 511.0)
            val = np.where((field >> np.uint32(9)) & np.uint32(1), -mag, mag)
            q[rows, comp_i] = val
            acc += val * val
        q[rows, idx] = np.sqrt(np.clip(1.0 - acc, 0.0, None))
    return q


def load_spz(path, device=None, dtype=torch.float32) -> GaussianModel:
    """Load a Niantic ``.spz`` file (versions 2-4; module docstring) into a :class:`GaussianModel` in rigel's
    RDF convention (x right, y down, z forward), converting from SPZ's RUB.

    Args: path; device, dtype of the returned tensors.
    Returns: GaussianModel (SH degree ≤ 3).
    Raises:
        SpzFormatError: not SPZ, unsupported version, corrupt or truncated data, sizes that do not match the
            header, or v4 without the ``zstandard`` package.
    Warns: SceneWarning for ignored extension records, truncated SH degree 4, trailing bytes, zero points.
    """
    path = os.fspath(path)
    with open(path, "rb") as f:
        raw = f.read()
    if not raw:
        raise SpzFormatError(path, "not an SPZ file (an empty file)")
    if len(raw) >= 8 and struct.unpack_from("<I", raw)[0] == SPZ_MAGIC and struct.unpack_from("<I", raw, 4)[0] >= 4:
        version, n, sh_degree, fbits, streams = _read_v4(path, raw)
    elif raw[:2] == b"\x1f\x8b" or raw[:4] == b"NGSP":
        version, n, sh_degree, fbits, streams = _read_legacy(path, raw)
    else:
        raise SpzFormatError(path, "not an SPZ file (neither gzip data nor the 'NGSP' magic)")
    pos_b, alpha_b, color_b, scale_b, rot_b, sh_b = (np.frombuffer(s, dtype=np.uint8) for s in streams)

    # positions: 24-bit little-endian two's complement
    p = pos_b.reshape(n, 3, 3).astype(np.int32)
    fixed = p[..., 0] | (p[..., 1] << 8) | (p[..., 2] << 16)
    fixed = np.where(fixed & 0x800000, fixed - (1 << 24), fixed)
    means = fixed.astype(np.float64) / float(1 << fbits)
    a = np.clip(alpha_b.astype(np.float64) / 255.0, _ALPHA_EPS, 1.0 - _ALPHA_EPS)
    opacity = np.log(a / (1.0 - a))
    sh_dc = ((color_b.reshape(n, 3).astype(np.float64) / 255.0 - 0.5) / COLOR_SCALE).reshape(n, 1, 3)
    log_scales = scale_b.reshape(n, 3).astype(np.float64) / 16.0 - 10.0
    q_xyzw = _decode_rotations(rot_b, version, n)
    dim = _SH_DIM[sh_degree]
    sh_rest = (sh_b.reshape(n, dim, 3).astype(np.float64) - 128.0) / 128.0
    if dim > 15:
        warnings.warn(f"{path}: SH degree {sh_degree} truncated to 3 (rigel supports degrees 0-3)", SceneWarning,
                      stacklevel=2)
        sh_rest = sh_rest[:, :15]
        dim = 15

    # RUB → RDF: rotate 180° about x (module docstring).
    means[:, 1:] *= -1.0
    quats = np.stack([q_xyzw[:, 3], q_xyzw[:, 0], -q_xyzw[:, 1], -q_xyzw[:, 2]], axis=1)
    sh_rest *= np.asarray(RUB_TO_RDF_SH_SIGNS[:dim], dtype=np.float64)[None, :, None]

    arrays = (means, log_scales, quats, opacity, sh_dc, np.ascontiguousarray(sh_rest))
    _warn_nonfinite(path, arrays, n)
    if n == 0:
        warnings.warn(f"{path}: the SPZ file has 0 points; returning an empty model", SceneWarning, stacklevel=2)
    return GaussianModel(*(torch.from_numpy(np.ascontiguousarray(x)).to(device=device, dtype=dtype)
                           for x in arrays))
