"""INRIA / graphdeco 3DGS PLY: read and write through ``plyfile`` (DESIGN §3).

Layout of the ``vertex`` element, one row per Gaussian, every value **pre-activation**::

    x y z [nx ny nz] f_dc_0 f_dc_1 f_dc_2 f_rest_0 … f_rest_{3(K−1)−1} opacity scale_0..2 rot_0..3

with K = (degree+1)². Mapping to :class:`~rigel_core.model.GaussianModel` (1:1, no activation applied):

| PLY | model |
|---|---|
| ``x y z`` | ``means3D[:, 0:3]`` |
| ``f_dc_0..2`` | ``sh_dc[:, 0, 0:3]`` (R, G, B) |
| ``f_rest_{c·(K−1)+j}`` | ``sh_rest[:, j, c]`` — **channel-major**: all of red's K−1 coefficients, then green's, then blue's |
| ``opacity`` | ``opacity_logits`` (opacity = sigmoid) |
| ``scale_0..2`` | ``log_scales`` (scale = exp) |
| ``rot_0..3`` | ``quats`` as (w, x, y, z), not normalised |

Reading policy (each case is either read correctly or raises one :class:`PlyFormatError` naming the file):

* formats: binary little-endian (the standard), binary big-endian and ASCII are all read;
* the SH degree is inferred from the number of ``f_rest_*`` properties (0, 9, 24 or 45 → degree 0..3);
  any other count, or a gap in the numbering, is an error; zero-padded names (``f_rest_00``, as some tools
  write them) are the same index, and two names for one index (``f_rest_1`` and ``f_rest_01``) an error;
* ``nx ny nz`` and any property not named above (e.g. a ``transform`` float) are ignored, whatever their type;
* the Gaussian parameters must be ``float`` or ``double``; ``double`` is converted to the requested dtype.
  Integer types (``uchar``, ``int`` …) are rejected: an integer there means a quantised or foreign layout
  that a 1:1 reading would turn into garbage. PLY has no half-float type, so float16 cannot occur;
* NaN / Inf values are loaded as they are and counted in a :class:`SceneWarning` (the renderer culls
  Gaussians with a non-finite parameter, docs/PIPELINE.md [1]);
* zero vertices: an empty model (N = 0, SH degree from the header) and a :class:`SceneWarning`; this keeps
  ``save_ply`` → ``load_ply`` exact for an empty model;
* the header is parsed by this module first, and the data size it declares is checked against the file size
  **before** ``plyfile`` allocates anything, so a header claiming 10¹² vertices fails at once; so does a count
  above :data:`~rigel_core.limits.MAX_SCENE_SPLATS`. A binary body (without list properties) must be exactly the
  declared size: trailing bytes mean a mis-declared or corrupt file (a header declaring 0 vertices before
  megabytes of data) and are an error, as is data after an ASCII header that declares no rows;
* a plain point cloud (``x y z`` with or without colours, no splat properties) is an error that says so;
  a PlayCanvas compressed PLY is recognised and the error points to :func:`rigel_core.io.load_scene`.

Writing (:func:`save_ply`) emits the reference trainer's layout exactly — float32, binary little-endian, with
``nx ny nz`` written as zeros — into a temporary file in the destination directory, then ``os.replace``\\ s it,
so a reader never sees a half-written file.
"""
from __future__ import annotations

import os
import re
import warnings
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from ..limits import MAX_PLY_HEADER_BYTES, MAX_SCENE_SPLATS
from .errors import PlyFormatError
from ..atomic import atomic_path

if TYPE_CHECKING:   # the module imports no torch at load: the viewer's loading preview reads PLYs before it
    from ..model import GaussianModel

__all__ = ["load_ply", "read_ply_arrays", "save_ply", "read_ply_header", "render_mode_of", "RENDER_MODE_COMMENT",
           "PlyHeader", "PlyElementInfo", "PlyPropertyInfo", "PlyFormatError", "SceneWarning", "ply_property_names",
           "MAX_HEADER_BYTES"]

#: A PLY header longer than this is treated as corrupt (rigel_core.limits.MAX_PLY_HEADER_BYTES).
MAX_HEADER_BYTES = MAX_PLY_HEADER_BYTES

# PLY scalar type name → (numpy kind+size, bytes). Both the PLY 1.0 names and the sized aliases.
_PLY_TYPES = {
    "char": ("i1", 1), "int8": ("i1", 1), "uchar": ("u1", 1), "uint8": ("u1", 1),
    "short": ("i2", 2), "int16": ("i2", 2), "ushort": ("u2", 2), "uint16": ("u2", 2),
    "int": ("i4", 4), "int32": ("i4", 4), "uint": ("u4", 4), "uint32": ("u4", 4),
    "float": ("f4", 4), "float32": ("f4", 4), "double": ("f8", 8), "float64": ("f8", 8),
}
_FORMATS = ("ascii", "binary_little_endian", "binary_big_endian")
_F_REST = re.compile(r"^f_rest_(\d+)$")


def _sh_bases(degree: int) -> int:
    """SH coefficients per channel of ``degree`` (:func:`rigel_core.model.num_sh_bases`, which imports torch)."""
    return (degree + 1) ** 2


_VALID_REST_COUNTS = {3 * (_sh_bases(d) - 1): d for d in range(4)}  # {0: 0, 9: 1, 24: 2, 45: 3}
_COMPRESSED_MARKERS = ("packed_position", "packed_rotation", "packed_scale", "packed_color")


class SceneWarning(UserWarning):
    """A scene file was read, but something in it deserves the user's attention (NaN values, no splats…)."""


# ---------------------------------------------------------------------------------------------------------
# Header
# ---------------------------------------------------------------------------------------------------------
@dataclass
class PlyPropertyInfo:
    """One ``property`` line: ``type`` is the PLY name (``float``…); ``count_type`` is set for list properties."""

    name: str
    type: str
    count_type: str | None = None

    @property
    def is_list(self) -> bool:
        return self.count_type is not None

    @property
    def is_float(self) -> bool:
        return not self.is_list and _PLY_TYPES[self.type][0][0] == "f"


@dataclass
class PlyElementInfo:
    name: str
    count: int
    properties: list[PlyPropertyInfo] = field(default_factory=list)

    def property(self, name: str) -> PlyPropertyInfo | None:
        for p in self.properties:
            if p.name == name:
                return p
        return None

    def min_row_bytes(self, fmt: str) -> int:
        """Smallest number of bytes one row can take (list properties counted as empty lists)."""
        if fmt == "ascii":  # every value is at least one character plus a separator
            return 2 * len(self.properties)
        return sum(_PLY_TYPES[p.count_type if p.is_list else p.type][1] for p in self.properties)


@dataclass
class PlyHeader:
    """What :func:`read_ply_header` found: ``format`` is one of ascii / binary_little_endian /
    binary_big_endian; ``data_offset`` is the byte where the body starts; ``file_size`` in bytes."""

    format: str
    elements: list[PlyElementInfo]
    data_offset: int
    file_size: int
    comments: list[str] = field(default_factory=list)

    def element(self, name: str) -> PlyElementInfo | None:
        for e in self.elements:
            if e.name == name:
                return e
        return None


def read_ply_header(path, *, error_cls=PlyFormatError) -> PlyHeader:
    """Parse and sanity-check a PLY header without reading the body.

    Checks: the ``ply`` magic, one known ``format`` line, known property types, non-negative integer counts,
    an ``end_header`` within :data:`MAX_HEADER_BYTES`, and that the body is at least as large as the smallest
    body the declared element counts allow (so a truncated file, or a header claiming 10¹² vertices, fails here
    before anything is allocated).

    Raises:
        PlyFormatError (or ``error_cls``): naming ``path`` and the problem. OSError when the file cannot be read.
    """
    path = os.fspath(path)
    file_size = os.path.getsize(path)
    with open(path, "rb") as f:
        head = f.read(min(file_size, MAX_HEADER_BYTES))
    if not head.startswith(b"ply"):
        what = "an empty file" if file_size == 0 else "the file does not start with 'ply'"
        raise error_cls(path, f"not a PLY file ({what})")
    if not re.match(rb"ply[ \t]*\r?\n", head):
        raise error_cls(path, "not a PLY file (first line is not 'ply')")
    m = re.search(rb"(?:^|\n)end_header[ \t]*\r?\n", head)
    if m is None:
        if file_size > MAX_HEADER_BYTES:
            raise error_cls(path, f"no 'end_header' line in the first {MAX_HEADER_BYTES} bytes: corrupt PLY header")
        raise error_cls(path, "no 'end_header' line: truncated or corrupt PLY header")
    data_offset = m.end()
    try:
        text = head[:m.start()].decode("ascii")
    except UnicodeDecodeError:
        raise error_cls(path, "the PLY header contains non-ASCII bytes: corrupt header") from None
    lines = [ln.strip() for ln in text.replace("\r", "").split("\n")]

    fmt, elements, comments = None, [], []
    for lineno, line in enumerate(lines[1:], start=2):
        if not line:
            continue
        words = line.split()
        key = words[0]
        if key in ("comment", "obj_info"):
            comments.append(line[len(key):].strip())
        elif key == "format":
            if fmt is not None:
                raise error_cls(path, f"header line {lineno}: a second 'format' line")
            if len(words) != 3 or words[1] not in _FORMATS:
                raise error_cls(path, f"header line {lineno}: unknown format {line!r} "
                                      f"(expected one of {', '.join(_FORMATS)})")
            fmt = words[1]
        elif key == "element":
            if len(words) != 3 or not re.fullmatch(r"\d+", words[2]):
                raise error_cls(path, f"header line {lineno}: expected 'element <name> <count>', got {line!r}")
            elements.append(PlyElementInfo(words[1], int(words[2])))
        elif key == "property":
            if not elements:
                raise error_cls(path, f"header line {lineno}: 'property' before any 'element'")
            if len(words) >= 2 and words[1] == "list":
                if len(words) != 5:
                    raise error_cls(path, f"header line {lineno}: expected 'property list <count type> "
                                          f"<item type> <name>', got {line!r}")
                ctype, itype, name = words[2:5]
                for t in (ctype, itype):
                    if t not in _PLY_TYPES:
                        raise error_cls(path, f"header line {lineno}: unknown property type {t!r}")
                if _PLY_TYPES[ctype][0][0] == "f":
                    raise error_cls(path, f"header line {lineno}: list count type {ctype!r} is not an integer")
                elements[-1].properties.append(PlyPropertyInfo(name, itype, ctype))
            else:
                if len(words) != 3:
                    raise error_cls(path, f"header line {lineno}: expected 'property <type> <name>', got {line!r}")
                if words[1] not in _PLY_TYPES:
                    raise error_cls(path, f"header line {lineno}: unknown property type {words[1]!r} for "
                                          f"{words[2]!r} (PLY types: char uchar short ushort int uint float "
                                          f"double)")
                elements[-1].properties.append(PlyPropertyInfo(words[2], words[1]))
        else:
            raise error_cls(path, f"header line {lineno}: unknown keyword {key!r}")
    if fmt is None:
        raise error_cls(path, "the PLY header has no 'format' line")
    for e in elements:
        names = [p.name for p in e.properties]
        dup = {n for n in names if names.count(n) > 1}
        if dup:
            raise error_cls(path, f"element '{e.name}' declares property {sorted(dup)[0]!r} twice")

    # Size check, in Python integers (no overflow, no allocation).
    body = file_size - data_offset
    need = 0
    for e in elements:
        need += e.count * e.min_row_bytes(fmt)
    if fmt == "ascii":
        need = max(0, need - 1)  # the last value may end the file without a separator
    counts = ", ".join(f"{e.count} {e.name}" for e in elements) or "no elements"
    if need > body:
        raise error_cls(path, f"the header declares {counts} (at least {need} bytes of data) but only {body} "
                              f"bytes follow the header: truncated file or corrupt header")
    for e in elements:
        if e.count > MAX_SCENE_SPLATS:
            raise error_cls(path, f"element '{e.name}' declares {e.count} rows; more than {MAX_SCENE_SPLATS} is "
                                  f"refused (rigel_core.limits.MAX_SCENE_SPLATS; a larger scene than rigel loads)")
    exact = fmt != "ascii" and not any(p.is_list for e in elements for p in e.properties)
    if exact and body > need:  # a binary body without lists has exactly the declared size
        raise error_cls(path, f"the header declares {counts} ({need} bytes of data) but {body} bytes follow the "
                              f"header: corrupt or mis-declared file ({body - need} trailing bytes)")
    if fmt == "ascii" and need == 0 and body > 0:
        with open(path, "rb") as f:
            f.seek(data_offset)
            if f.read(1 << 16).strip():
                raise error_cls(path, f"the header declares {counts} but data follows the header: corrupt or "
                                      f"mis-declared file")
    return PlyHeader(fmt, elements, data_offset, file_size, comments)


def ply_property_names(sh_degree: int) -> list[str]:
    """The vertex property names :func:`save_ply` writes, in order, for SH ``sh_degree``."""
    n_rest = 3 * (_sh_bases(sh_degree) - 1)
    return (["x", "y", "z", "nx", "ny", "nz", "f_dc_0", "f_dc_1", "f_dc_2"]
            + [f"f_rest_{i}" for i in range(n_rest)]
            + ["opacity", "scale_0", "scale_1", "scale_2", "rot_0", "rot_1", "rot_2", "rot_3"])


# ---------------------------------------------------------------------------------------------------------
# Reading
# ---------------------------------------------------------------------------------------------------------
def read_ply_elements(path, header: PlyHeader, *, error_cls=PlyFormatError) -> dict:
    """Read the body with ``plyfile`` (memory-mapped where the layout allows): {element name: structured array}.

    Call only after :func:`read_ply_header` accepted the file. plyfile's own errors are re-raised as one
    ``error_cls`` naming the file.
    """
    from plyfile import PlyData, PlyParseError

    path = os.fspath(path)
    try:
        # an ASCII body from a text stream: given a binary one, plyfile wraps it in a TextIOWrapper it never closes
        # (a ResourceWarning on every load); ascii as plyfile's own wrapper decodes it
        text = header.format == "ascii"
        with (open(path, "r", encoding="ascii") if text else open(path, "rb")) as f:
            ply = PlyData.read(f, mmap="c")
            return {el.name: el.data for el in ply.elements}
    except PlyParseError as e:
        raise error_cls(path, f"malformed PLY data: {e}") from None
    except (ValueError, TypeError, IndexError, EOFError) as e:
        raise error_cls(path, f"malformed PLY data ({type(e).__name__}: {e})") from None


def rest_property_names(path, element: PlyElementInfo, error_cls=PlyFormatError) -> list[str]:
    """The element's ``f_rest_<i>`` property names ordered by i = 0..M−1, M in (0, 9, 24, 45).

    Zero-padded indices (``f_rest_00`` … ``f_rest_08``, as some tools write them) are the same index as the
    plain ones; two names for one index, a gap in the numbering, or another count is an error naming the file
    and the property.
    """
    by_index: dict[int, str] = {}
    for p in element.properties:
        m = _F_REST.match(p.name)
        if m:
            i = int(m.group(1))
            if i in by_index:
                raise error_cls(path, f"properties '{by_index[i]}' and '{p.name}' of element '{element.name}' both "
                                      f"name f_rest index {i}")
            by_index[i] = p.name
    n = len(by_index)
    if sorted(by_index) != list(range(n)):
        missing = min(set(range(n)) - set(by_index))
        raise error_cls(path, f"f_rest_* properties of element '{element.name}' are not numbered 0..{n - 1}: "
                              f"f_rest_{missing} is missing")
    if n not in _VALID_REST_COUNTS:
        raise error_cls(path, f"{n} f_rest_* properties in element '{element.name}'; an SH degree d in 0..3 has "
                              f"3((d+1)²−1) = 0, 9, 24 or 45")
    return [by_index[i] for i in range(n)]


def check_gaussian_vertex(path, header: PlyHeader) -> tuple[PlyElementInfo, list[str]]:
    """Validate the ``vertex`` element as a 3DGS layout; returns (vertex element, its f_rest property names in
    index order: :func:`rest_property_names`)."""
    vertex = header.element("vertex")
    if vertex is None:
        names = ", ".join(e.name for e in header.elements) or "none"
        raise PlyFormatError(path, f"no 'vertex' element (elements: {names}): not a Gaussian splat PLY")
    props = {p.name: p for p in vertex.properties}
    if header.element("chunk") is not None and any(n in props for n in _COMPRESSED_MARKERS):
        raise PlyFormatError(path, "this is a PlayCanvas compressed PLY (element chunk + packed_* properties), "
                                   "not the INRIA layout: load it with rigel_core.io.load_scene")
    splat_props = [n for n in props if n.startswith(("f_dc_", "f_rest_", "scale_", "rot_")) or n == "opacity"]
    if not splat_props:
        listed = " ".join(props) or "none"
        raise PlyFormatError(path, f"this is a point cloud (vertex properties: {listed}), not a Gaussian splat: it "
                                   f"has none of f_dc_*, opacity, scale_*, rot_*")
    required = ["x", "y", "z", "f_dc_0", "f_dc_1", "f_dc_2", "opacity", "scale_0", "scale_1", "scale_2",
                "rot_0", "rot_1", "rot_2", "rot_3"]
    missing = [n for n in required if n not in props]
    if missing:
        raise PlyFormatError(path, f"missing Gaussian propert{'y' if len(missing) == 1 else 'ies'} "
                                   f"{', '.join(missing)} in element 'vertex'")
    rest = rest_property_names(path, vertex)
    for name in required + rest:
        p = props[name]
        if p.is_list:
            raise PlyFormatError(path, f"property '{name}' is a list; Gaussian parameters are scalars")
        if not p.is_float:
            raise PlyFormatError(path, f"property '{name}' has integer type '{p.type}'; Gaussian parameters must be "
                                       f"float or double (quantised layouts are not the INRIA PLY)")
    return vertex, rest


def _columns(data, names, np_dtype) -> np.ndarray:
    """(N, len(names)) array of the named fields of a structured array, converted to ``np_dtype``.

    When every field is a native float32 (the usual file), the rows are viewed as an (N, P) matrix and the
    columns gathered in one pass instead of one strided copy per field.
    """
    dt = data.dtype
    fields = dt.names
    if (data.ndim == 1 and all(dt[f] == np.dtype("=f4") for f in fields) and dt.itemsize == 4 * len(fields)
            and all(dt.fields[f][1] == 4 * i for i, f in enumerate(fields))):
        mat = np.asarray(data).view(np.float32).reshape(data.shape[0], len(fields))
        idx = [fields.index(nm) for nm in names]
        return mat[:, idx].astype(np_dtype, copy=False)
    out = np.empty((data.shape[0], len(names)), dtype=np_dtype)
    for i, n in enumerate(names):
        out[:, i] = data[n]
    return out


def load_ply(path, device=None, dtype=None) -> GaussianModel:
    """Load an INRIA / graphdeco 3DGS PLY (see the module docstring for the layout and the policy).

    Args:
        path: file path.
        device: torch device of the returned tensors (default CPU).
        dtype: floating dtype of the returned tensors (float32, the default, or float64).
    Returns: :class:`GaussianModel` with N Gaussians, ``sh_degree`` inferred from the ``f_rest_*`` count.
    Raises:
        PlyFormatError: malformed, truncated or non-splat file (message: ``"<path>: <problem>"``).
        OSError: the file cannot be opened.
    Warns:
        SceneWarning: NaN/Inf parameters (counted), or zero vertices.
    """
    import torch

    from ..model import GaussianModel

    dtype = torch.float32 if dtype is None else dtype
    arrays = read_ply_arrays(path, np.float64 if dtype == torch.float64 else np.float32)
    mode = arrays.pop("render_mode")
    model = GaussianModel(*(torch.from_numpy(a).to(device=device, dtype=dtype) for a in arrays.values()))
    model.render_mode = mode
    return model


def read_ply_arrays(path, np_dtype=np.float32) -> dict:
    """The parameters of an INRIA / graphdeco 3DGS PLY as numpy arrays of ``np_dtype``, without PyTorch (the
    reader of :func:`load_ply`; the viewer's loading preview reads it before ``import torch``): ``means3D``
    (N, 3), ``log_scales`` (N, 3), ``quats`` (N, 4) wxyz, ``opacity_logits`` (N,), ``sh_dc`` (N, 1, 3),
    ``sh_rest`` (N, K−1, 3), all pre-activation, in :class:`~rigel_core.model.GaussianModel`'s argument order, and
    ``render_mode`` ("default" or "mip"). Raises and warns as :func:`load_ply`."""
    path = os.fspath(path)
    header = read_ply_header(path)
    vertex, rest = check_gaussian_vertex(path, header)
    n_rest = len(rest)
    elements = read_ply_elements(path, header)
    data = elements["vertex"]
    n = int(data.shape[0])
    if n != vertex.count:
        raise PlyFormatError(path, f"read {n} vertices, the header declares {vertex.count}")
    k1 = n_rest // 3

    means = _columns(data, ["x", "y", "z"], np_dtype)
    sh_dc = _columns(data, ["f_dc_0", "f_dc_1", "f_dc_2"], np_dtype).reshape(n, 1, 3)
    # channel-major: f_rest_{c*k1 + j} is coefficient j+1 of channel c → sh_rest[:, j, c]
    sh_rest = _columns(data, rest, np_dtype).reshape(n, 3, k1).transpose(0, 2, 1)
    opacity = _columns(data, ["opacity"], np_dtype).reshape(n)
    log_scales = _columns(data, ["scale_0", "scale_1", "scale_2"], np_dtype)
    quats = _columns(data, ["rot_0", "rot_1", "rot_2", "rot_3"], np_dtype)
    del data, elements

    arrays = (means, log_scales, quats, opacity, sh_dc, np.ascontiguousarray(sh_rest))
    _warn_nonfinite(path, arrays, n, stacklevel=4)
    if n == 0:
        warnings.warn(f"{path}: the PLY has 0 vertices; returning an empty model", SceneWarning, stacklevel=3)
    names = ("means3D", "log_scales", "quats", "opacity_logits", "sh_dc", "sh_rest")
    return {**dict(zip(names, arrays)), "render_mode": render_mode_of(path, header.comments, stacklevel=4)}


#: the header comment that says how a splat file is to be rendered (Brush, splat-transform and gsplat's
#: exporter write it): ``comment SplatRenderMode: mip`` (anti-aliased) or ``default``
RENDER_MODE_COMMENT = "SplatRenderMode:"


def render_mode_of(path, comments, stacklevel: int = 3) -> str:
    """The render mode a PLY header's comments declare: "mip" or "default" (also when no comment says it); an
    unknown value is a :class:`SceneWarning` naming the file and the value, and reads as "default"."""
    for c in comments:
        if c.lower().startswith(RENDER_MODE_COMMENT.lower()):
            value = c[len(RENDER_MODE_COMMENT):].strip().lower()
            if value in ("mip", "default"):
                return value
            warnings.warn(f"{path}: unknown '{RENDER_MODE_COMMENT} {value}' in the PLY header; rendering it in the "
                          "default mode", SceneWarning, stacklevel=stacklevel)
            return "default"
    return "default"


def _warn_nonfinite(path, arrays, n: int, stacklevel: int = 3) -> None:
    """Warn (SceneWarning) with the number of Gaussians that have any NaN/Inf parameter."""
    if n == 0:
        return
    bad = np.zeros(n, dtype=bool)
    for a in arrays:
        bad |= ~np.isfinite(a.reshape(n, -1)).all(axis=1)
    nb = int(bad.sum())
    if nb:
        warnings.warn(f"{path}: {nb} of {n} Gaussians have NaN or Inf parameters; they are loaded as they are "
                      f"(the renderer culls them)", SceneWarning, stacklevel=stacklevel)


# ---------------------------------------------------------------------------------------------------------
# Writing
# ---------------------------------------------------------------------------------------------------------
def model_to_ply_array(model: GaussianModel) -> np.ndarray:
    """(N,) structured float32 array in the reference trainer's vertex layout (normals zero)."""
    import torch

    n = model.num_gaussians
    deg = model.sh_degree
    k1 = _sh_bases(deg) - 1
    names = ply_property_names(deg)
    cols = [
        model.means3D.detach().reshape(n, 3),
        torch.zeros(n, 3, dtype=model.dtype, device=model.device),
        model.sh_dc.detach().reshape(n, 3),
        model.sh_rest.detach().reshape(n, k1, 3).transpose(1, 2).reshape(n, 3 * k1),  # channel-major
        model.opacity_logits.detach().reshape(n, 1),
        model.log_scales.detach().reshape(n, 3),
        model.quats.detach().reshape(n, 4),
    ]
    mat = torch.cat([c.to(device="cpu", dtype=torch.float32) for c in cols], dim=1).contiguous().numpy()
    assert mat.shape[1] == len(names)
    struct = np.dtype([(nm, "<f4") for nm in names])
    return np.ascontiguousarray(mat.astype("<f4", copy=False)).view(struct).reshape(n)


def save_ply(model: GaussianModel, path) -> None:
    """Write ``model`` as an INRIA / graphdeco 3DGS PLY, atomically.

    Layout: ``x y z nx ny nz f_dc_0..2 f_rest_0..(3(K−1)−1) opacity scale_0..2 rot_0..3`` (normals zero, as the
    reference trainer writes them), float32, binary little-endian; ``f_rest`` channel-major; values
    pre-activation. float64 models are rounded to float32. The file is written to a temporary file in the
    destination directory and moved into place with ``os.replace`` (readers never see a partial file).
    The header says ``comment SplatRenderMode: mip|default`` (``model.render_mode``); a mip model's 3D smoothing
    filter is baked into its scales and opacities first (:func:`rigel_core.renderer.mip.bake_3d_filter`, exact), so a
    viewer that applies only the 2D filter of a ``mip`` file renders it as rigel does.

    Raises: OSError when the directory is not writable.
    """
    from plyfile import PlyData, PlyElement

    from ..renderer.mip import bake_3d_filter

    path = os.fspath(path)
    mode = getattr(model, "render_mode", "default")
    arr = model_to_ply_array(bake_3d_filter(model) if mode == "mip" else model)
    with atomic_path(path) as tmp:
        with open(tmp, "wb") as f:
            PlyData([PlyElement.describe(arr, "vertex")], text=False, byte_order="<",
                    comments=[f"{RENDER_MODE_COMMENT} {mode}"]).write(f)


