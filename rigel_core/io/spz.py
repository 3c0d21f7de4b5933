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
stream's sizes) and :data:`~rigel_core.limits.MAX_SPZ_POINTS`. A gzip stream is inflated twice in bounded chunks
(``zlib.decompressobj`` with ``max_length``, :data:`INFLATE_CHUNK`): first keeping nothing, to check it holds
exactly the bytes the header implies (and at most :data:`~rigel_core.limits.MAX_SPZ_EXTENSION_BYTES` more, of
extension records or trailing data: a stream that inflates past that is refused, naming the limit, and is inflated
no further), then decoding attribute by attribute, :data:`DECODE_CHUNK` points at a
time, straight into the output arrays — so memory is the model itself plus bounded chunks, whatever the header
claims (docs/RELIABILITY.md).
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
from ..limits import MAX_SPZ_EXTENSION_BYTES, MAX_SPZ_POINTS
from .errors import SpzFormatError
from .ply import SceneWarning

__all__ = ["load_spz", "SPZ_MAGIC", "MAX_POINTS", "RUB_TO_RDF_SH_SIGNS", "COLOR_SCALE"]

SPZ_MAGIC = 0x5053474E  # b"NGSP" little-endian
COLOR_SCALE = 0.15
_ALPHA_EPS = 0.5 / 255.0
_DEFLATE_MAX_RATIO = 1032  # the largest expansion deflate can produce
_ZSTD_MAX_RATIO = 32768  # an RLE block: 4 bytes for up to 128 KiB
#: Largest point count accepted (rigel_core.limits.MAX_SPZ_POINTS: the reference library's ``maxPointsToRead``).
MAX_POINTS = MAX_SPZ_POINTS
#: Bytes inflated per zlib call: the gzip stream is never held whole (bounded chunks, zlib ``max_length``).
INFLATE_CHUNK = 1 << 22
#: Points decoded per step: temporaries stay ~100 bytes × this, whatever the file's size.
DECODE_CHUNK = 1 << 16
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


class _Source:
    """Exact-size sequential reads from a gzip stream, inflated in bounded chunks, or from a plain buffer.

    ``read(n)`` returns exactly ``n`` bytes or raises SpzFormatError (truncated); ``count(limit)`` inflates up to
    ``limit`` bytes without keeping them and returns how many the stream holds (capped at ``limit``).
    """

    def __init__(self, path, raw: bytes, gz: bool):
        self.path, self.gz = path, gz
        self.produced = 0
        if gz:
            self._d = zlib.decompressobj(16 + zlib.MAX_WBITS)
            self._tail = raw
        else:
            self._view = memoryview(raw)

    def _inflate(self, n: int) -> bytes:
        """Up to ``n`` more bytes (fewer only at the end of the stream)."""
        if not self.gz:
            out = bytes(self._view[self.produced:self.produced + n])
            self.produced += len(out)
            return out
        parts, got = [], 0
        while got < n and not self._d.eof:
            try:
                chunk = self._d.decompress(self._tail, min(n - got, INFLATE_CHUNK))
            except zlib.error as e:
                raise SpzFormatError(self.path, f"corrupt gzip data ({e})") from None
            self._tail = self._d.unconsumed_tail
            if chunk:
                parts.append(chunk)
                got += len(chunk)
            elif not self._tail:
                break  # input exhausted before the end of the stream
        self.produced += got
        return b"".join(parts)

    def read(self, n: int, what: str) -> bytes:
        out = self._inflate(n)
        if len(out) < n:
            end = "the gzip stream ends early" if self.gz else "the file ends"
            raise SpzFormatError(self.path, f"{end} in the {what} ({self.produced} bytes of data): truncated file")
        return out

    def count(self, limit: int) -> int:
        """Bytes left in the stream, inflating (and discarding) at most ``limit``."""
        start = self.produced
        while self.produced - start < limit:
            if not self._inflate(min(INFLATE_CHUNK, limit - (self.produced - start))):
                break
        return self.produced - start


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
    return version, n, sh_degree, fbits, [_Source(path, st, False) for st in streams]


def _read_legacy(path, raw: bytes):
    """Header fields and a source positioned at the first attribute of a v2/v3 file.

    Pass 1 inflates the whole stream in bounded chunks, keeping nothing, to check that it holds exactly the
    bytes the header's point count implies (extension records aside) before anything is allocated for the
    points; pass 2 (the caller) decodes from a fresh source, attribute by attribute, in bounded chunks.
    """
    gz = raw[:2] == b"\x1f\x8b"
    src = _Source(path, raw, gz)
    head = src._inflate(_LEGACY_HEADER.size)
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
    # Extension records (flag 0x2) precede the attributes; their total size is whatever is left over. With them or
    # without (bytes after the splats), at most MAX_SPZ_EXTENSION_BYTES beyond the attributes are accepted: the
    # stream is inflated no further, and one that goes on is refused naming that limit (a small header before
    # 300 MB of zeros loaded as one invisible splat, "the camera sees no Gaussian" in the viewer).
    slack = MAX_SPZ_EXTENSION_BYTES
    held = src.count(payload + slack + 1)  # pass 1: one byte past the most that is accepted
    if held < payload:
        raise SpzFormatError(path, f"the data holds {held} bytes after the header; {n} points need {payload}: "
                                   f"truncated file")
    extra = held - payload
    if extra > slack:
        limit = _LEGACY_HEADER.size + payload + slack
        what = "the gzip stream inflates past" if gz else "the file holds more than"
        raise SpzFormatError(path, f"{what} {limit:,} bytes, the limit for its header's {n:,} point"
                                   f"{'' if n == 1 else 's'} and {slack >> 20} MiB of "
                                   f"{'extension records' if has_ext else 'trailing data'} (MAX_SPZ_EXTENSION_BYTES): "
                                   "a decompression bomb or a corrupt header")
    if has_ext:
        if extra:
            warnings.warn(f"{path}: SPZ extension records ({extra} bytes) are ignored", SceneWarning, stacklevel=3)
    elif extra:
        warnings.warn(f"{path}: {extra} unexpected bytes after the splat data are ignored", SceneWarning,
                      stacklevel=3)
    src = _Source(path, raw, gz)  # pass 2
    src.read(_LEGACY_HEADER.size + (extra if has_ext else 0), "header")
    return version, n, sh_degree, fbits, [src] * len(sizes)


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
    np_dtype = np.float64 if dtype == torch.float64 else np.float32
    dim = _SH_DIM[sh_degree]
    keep = min(dim, 15)
    if dim > 15:
        warnings.warn(f"{path}: SH degree {sh_degree} truncated to 3 (rigel supports degrees 0-3)", SceneWarning,
                      stacklevel=2)
    # Outputs allocated once the data is known to hold all n points; filled attribute by attribute, in chunks of
    # DECODE_CHUNK points (the attributes are stored one after the other, each for all points).
    means = np.empty((n, 3), np_dtype)
    opacity = np.empty(n, np_dtype)
    sh_dc = np.empty((n, 1, 3), np_dtype)
    log_scales = np.empty((n, 3), np_dtype)
    quats = np.empty((n, 4), np_dtype)
    sh_rest = np.empty((n, keep, 3), np_dtype)
    signs = np.asarray(RUB_TO_RDF_SH_SIGNS[:keep], dtype=np.float64)[None, :, None]
    per_point = [9, 1, 3, 3, 4 if version >= 3 else 3, 3 * dim]
    for attr, what in enumerate(_ATTR_NAMES):
        if per_point[attr] == 0:
            continue
        for lo in range(0, n, DECODE_CHUNK):
            k = min(DECODE_CHUNK, n - lo)
            b = np.frombuffer(streams[attr].read(k * per_point[attr], what), dtype=np.uint8)
            sl = slice(lo, lo + k)
            if attr == 0:
                means[sl] = _decode_positions(b, k, fbits)
            elif attr == 1:
                a = np.clip(b.astype(np.float64) / 255.0, _ALPHA_EPS, 1.0 - _ALPHA_EPS)
                opacity[sl] = np.log(a / (1.0 - a))
            elif attr == 2:
                sh_dc[sl] = (b.reshape(k, 1, 3).astype(np.float64) / 255.0 - 0.5) / COLOR_SCALE
            elif attr == 3:
                log_scales[sl] = b.reshape(k, 3).astype(np.float64) / 16.0 - 10.0
            elif attr == 4:
                q = _decode_rotations(b, version, k)  # (x, y, z, w) in RUB
                quats[sl] = np.stack([q[:, 3], q[:, 0], -q[:, 1], -q[:, 2]], axis=1)  # RUB → RDF: S·R·S
            else:  # in place in the output (the largest attribute): (q − 128)/128 is exact in float32
                out = sh_rest[sl]
                out[...] = b.reshape(k, dim, 3)[:, :keep]
                out -= 128.0
                out *= signs / 128.0
    # SPZ values are finite by construction (bytes mapped to bounded floats): no NaN scan needed.
    if n == 0:
        warnings.warn(f"{path}: the SPZ file has 0 points; returning an empty model", SceneWarning, stacklevel=2)
    return GaussianModel(*(torch.from_numpy(x).to(device=device, dtype=dtype)
                           for x in (means, log_scales, quats, opacity, sh_dc, sh_rest)))


def _decode_positions(b: np.ndarray, k: int, fbits: int) -> np.ndarray:
    """(k,3) float64 RDF positions from 24-bit little-endian two's complement fixed point (RUB: y, z negated)."""
    p = b.reshape(k, 3, 3).astype(np.int32)
    fixed = p[..., 0] | (p[..., 1] << 8) | (p[..., 2] << 16)
    fixed = np.where(fixed & 0x800000, fixed - (1 << 24), fixed)
    out = fixed.astype(np.float64) / float(1 << fbits)
    out[:, 1:] *= -1.0  # RUB → RDF: rotate 180° about x (module docstring)
    return out
