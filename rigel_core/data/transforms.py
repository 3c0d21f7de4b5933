"""NeRF-style ``transforms*.json`` files: Blender / NeRF-synthetic and instant-ngp (also nerfstudio's layout).

One parser serves both (and the ``rigel-render`` CLI, which needs only the cameras):

- ``transform_matrix``: camera-to-world, OpenGL camera axes (x right, y up, z back), 4×4 or 3×4; converted by
  :meth:`rigel_core.Camera.from_c2w_opengl`. Used exactly as stored: instant-ngp's ``aabb_scale``, ``scale``
  and ``offset`` keys only tell instant-ngp how to fit the scene into its own unit cube, so they are ignored
  (so are ``sharpness``, ``rotation`` and any other key not listed here).
- Intrinsics, each looked up on the frame first, then at the top level: ``w``, ``h`` (else the image's
  own size), ``fl_x``/``fl_y`` in pixels or ``camera_angle_x``/``camera_angle_y`` in radians
  (``fx = 0.5·w / tan(0.5·camera_angle_x)``; ``fy`` defaults to ``fx``), ``cx``/``cy`` (default ``w/2``,
  ``h/2``; pixel centres at +0.5, DESIGN §3).
- Lens distortion, removed from the image once, at load (:mod:`rigel_core.data.undistort`); the camera returned
  is the ideal pinhole with the same ``fx fy cx cy`` and ``Frame.mask`` flags the pixels left without a source.
  OpenCV ``k1 k2 p1 p2`` (+ ``k3``) (``camera_model`` absent, ``OPENCV`` or ``PERSPECTIVE``); fisheye
  ``k1 k2 k3 k4`` (equidistant) when ``camera_model`` is ``OPENCV_FISHEYE`` (or ``FISHEYE``) or ``is_fisheye``
  is true. Other ``camera_model`` values (``EQUIRECTANGULAR``, ``FISHEYE624``, …) are rejected with an error.
- Masks: a frame's ``mask_path`` (relative to the JSON file), else ``masks/<image file name>`` next to the JSON
  file (any image extension; nerfstudio / Brush convention: non-zero keeps, black ignores).
- ``file_path`` is relative to the JSON file and may lack an extension (any of
  :data:`~rigel_core.data.images.IMAGE_EXTENSIONS` is accepted).
- nerfstudio's ``ply_file_path`` (relative to the JSON file): a PLY ``vertex`` element with ``x y z`` and
  optional ``red green blue`` — the SfM points that initialise training (:func:`read_ply_points`).
  nerfstudio's ``applied_transform`` (3×4) records the transform its converter applied to COLMAP's world; it
  has already been applied to both the ``transform_matrix`` poses and the PLY points, which therefore share
  one world frame and are used as stored (the key is informational, like ``aabb_scale``).
"""
from __future__ import annotations

import json
import math
import os
import warnings
from pathlib import Path

import numpy as np

from ..camera import Camera, check_fov
from ..limits import (MAX_DATASET_FRAMES, MAX_IMAGE_SIDE, MAX_JSON_BYTES, MAX_JSON_DEPTH, MAX_NAME_BYTES,
                      MAX_PATH_LENGTH, check_image_size, focal_length_problem)
from .frames import DatasetError, FrameSpec
from .images import IMAGE_EXTENSIONS, find_mask, image_size, names_folder, resolve_image_path
from .undistort import FISHEYE_KEYS, OPENCV_KEYS, fisheye_lens, opencv_lens

#: the largest float32: SfM coordinates beyond it become Inf in the model
FLOAT32_MAX = float(np.finfo(np.float32).max)


def unusable_points(points: np.ndarray) -> int:
    """How many rows of SfM ``points`` (M, 3) the float32 model cannot hold: NaN, Inf, or beyond float32's range
    (the COLMAP and the ply_file_path readers refuse a file with any)."""
    return int((~(np.abs(points) <= FLOAT32_MAX).all(axis=1)).sum())

__all__ = ["read_json", "read_transforms", "frame_name", "read_ply_points", "check_file_path", "number"]


def read_json(path: Path) -> dict:
    """Parse a transforms file; DatasetError naming it when it is unreadable, larger than
    :data:`~rigel_core.limits.MAX_JSON_BYTES`, nested deeper than :data:`~rigel_core.limits.MAX_JSON_DEPTH`,
    not a JSON object with a 'frames' list, or lists more than :data:`~rigel_core.limits.MAX_DATASET_FRAMES`."""
    path = Path(path)
    try:
        size = os.path.getsize(path)
        if size > MAX_JSON_BYTES:
            raise DatasetError(path, f"{size} bytes; a transforms file larger than {MAX_JSON_BYTES} bytes is refused")
        with open(path, encoding="utf-8") as f:
            meta = json.load(f)
    except FileNotFoundError:
        raise DatasetError(path, "file not found") from None
    except RecursionError:
        raise DatasetError(path, f"JSON nested too deeply (a transforms file needs 4 levels; at most "
                                 f"{MAX_JSON_DEPTH} are accepted)") from None
    except (OSError, ValueError) as e:  # JSONDecodeError, UnicodeDecodeError, an over-long integer literal
        raise DatasetError(path, f"not a readable JSON file ({_short(e)})") from None
    depth = _json_depth(meta)
    if depth > MAX_JSON_DEPTH:
        raise DatasetError(path, f"JSON nested more than {MAX_JSON_DEPTH} levels deep (a transforms file needs 4)")
    if not isinstance(meta, dict) or not isinstance(meta.get("frames"), list):
        raise DatasetError(path, "expected a JSON object with a 'frames' list")
    if len(meta["frames"]) > MAX_DATASET_FRAMES:
        raise DatasetError(path, f"{len(meta['frames'])} frames; at most {MAX_DATASET_FRAMES} are accepted")
    return meta


def _short(e: Exception, n: int = 200) -> str:
    text = str(e)
    return text if len(text) <= n else text[:n] + "…"


def _json_depth(value) -> int:
    """Deepest nesting of lists/dicts in a parsed JSON value (iterative: no recursion)."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        v, d = stack.pop()
        if isinstance(v, (list, dict)):
            deepest = max(deepest, d)
            if d <= MAX_JSON_DEPTH:  # deeper is refused anyway: stop counting
                stack.extend((x, d + 1) for x in (v.values() if isinstance(v, dict) else v))
    return deepest


def check_file_path(fp) -> str | None:
    """The problem with a frame's ``file_path`` value as a phrase, or None when it can name a file: a string
    without NUL bytes, at most :data:`~rigel_core.limits.MAX_PATH_LENGTH` characters, no component longer than
    :data:`~rigel_core.limits.MAX_NAME_BYTES` UTF-8 bytes."""
    if not isinstance(fp, str):
        return f"'file_path' must be a string, got {type(fp).__name__}"
    if "\0" in fp:
        return "'file_path' contains a NUL byte"
    if len(fp) > MAX_PATH_LENGTH:
        return f"'file_path' is {len(fp)} characters long; at most {MAX_PATH_LENGTH} are accepted"
    try:
        longest = max((len(part.encode("utf-8")) for part in fp.replace("\\", "/").split("/")), default=0)
    except UnicodeEncodeError:
        return "'file_path' is not valid Unicode text"
    if longest > MAX_NAME_BYTES:
        return f"'file_path' has a {longest}-byte component; at most {MAX_NAME_BYTES} bytes are accepted"
    return None


def number(d: dict, key: str) -> float:
    """``d[key]`` as a float; ValueError naming the key for a bool, a string or any non-number (JSON ``true``,
    ``"500"``), or an integer too large for a float."""
    v = d[key]
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise ValueError(f"'{key}' must be a number, got {type(v).__name__} {json.dumps(v)[:40]}")
    try:
        return float(v)
    except OverflowError:
        raise ValueError(f"'{key}' = {str(v)[:20]}… is too large") from None


def _finite(d: dict, key: str) -> float:
    v = number(d, key)
    if not math.isfinite(v):
        raise ValueError(f"'{key}' must be finite, got {v}")
    return v


def _size(d: dict, key: str) -> int:
    v = _finite(d, key)
    if v != int(v):
        raise ValueError(f"'{key}' must be a whole number of pixels, got {v}")
    return int(v)


def _matrix(value) -> np.ndarray:
    """A ``transform_matrix`` as a (4,4) or (3,4) float64 array; ValueError unless it is rows of numbers."""
    if (not isinstance(value, list) or len(value) not in (3, 4)
            or not all(isinstance(r, list) and len(r) == 4 for r in value)):
        raise ValueError("'transform_matrix' must be a 4x4 or 3x4 list of rows of numbers")
    for r in value:
        for v in r:
            if isinstance(v, bool) or not isinstance(v, (int, float)):
                raise ValueError(f"'transform_matrix' entries must be numbers, got {type(v).__name__} "
                                 f"{json.dumps(v)[:40]}")
    try:
        return np.array(value, dtype=np.float64)
    except OverflowError:
        raise ValueError("'transform_matrix' has an integer too large for a float") from None


def frame_name(frame: dict, index: int) -> str:
    """The name of a frame: the stem of its ``file_path`` (``./train/r_0`` → ``r_0``), else (none, or a path that
    names a folder: :func:`~rigel_core.data.images.names_folder`) ``frame_<index>``."""
    fp = frame.get("file_path")
    if isinstance(fp, str) and fp.strip() and not names_folder(fp):
        name = Path(fp).name
        stem, ext = os.path.splitext(name)
        return stem if ext in IMAGE_EXTENSIONS else name
    return f"frame_{index:05d}"


def read_transforms(path, *, require_images: bool = True, size: tuple[int, int] | None = None,
                    max_image_size: int = MAX_IMAGE_SIDE):
    """Cameras (and image paths) of every frame of a ``transforms*.json`` file.

    Args:
        path: the JSON file.
        require_images: skip frames whose image file does not exist (the caller warns with the count);
            with False, frames keep ``image_path=None`` and the image is used only for its size, if present.
        size: (width, height) used when neither the file nor an image gives the size (the render CLI's
            ``--width/--height``).
        max_image_size: largest width or height accepted (pixels; the pixel cap is its square).
    Returns:
        (specs, missing, n_total): a list of :class:`FrameSpec` in file order, the ``file_path`` of each frame
        whose image file does not exist (skipped; empty with ``require_images=False``), and how many frames the
        file lists.
    Raises:
        DatasetError naming the file, the frame index and the field for malformed JSON, a missing or invalid
        ``transform_matrix``, no focal length, an unknown image size, an unsupported ``camera_model``, or a
        ``mask_path`` that names no file; for a bool or string
        where a number belongs, a non-finite number, ``camera_angle_x/y`` outside (0, π), a size that is not a
        whole number in 1..``max_image_size``, a non-positive focal length, and a ``file_path`` that is not a
        usable path (:func:`check_file_path`).
    """
    path = Path(path)
    meta = read_json(path)
    specs, missing = [], []
    for i, frame in enumerate(meta["frames"]):
        where = f"{path}: frame {i}"
        if not isinstance(frame, dict):
            raise DatasetError(f"{where}: expected an object, got {type(frame).__name__}")
        fp = frame.get("file_path")
        problem = None if fp is None else check_file_path(fp)
        if problem:
            raise DatasetError(f"{where}: {problem}")
        try:
            img = resolve_image_path(path.parent, fp) if fp is not None and fp.strip() else None
        except OSError as e:
            raise DatasetError(f"{where} ({fp!r:.80}): cannot look up the image ({e.strerror or e})") from None
        if img is None and require_images:
            missing.append(str(fp))
            continue
        try:
            spec = _frame_spec(meta, frame, img, frame_name(frame, i), size, max_image_size)
            if require_images:  # masks matter only to a loader of the images
                spec.mask_path = _mask_path(path.parent, frame, img)
        except (ValueError, TypeError, KeyError) as e:
            raise DatasetError(f"{where} ({fp!r:.80}): {e}") from e
        specs.append(spec)
    return specs, missing, len(meta["frames"])


def _lookup(frame: dict, meta: dict, key: str):
    return frame[key] if key in frame else meta.get(key)


def _level(frame: dict, meta: dict, key: str) -> dict | None:
    """The dict (frame first, then top level) that holds a non-null ``key``, or None."""
    for d in (frame, meta):
        if d.get(key) is not None:
            return d
    return None


def _mask_path(base: Path, frame: dict, img: Path | None) -> Path | None:
    """The frame's ``mask_path`` (must exist), else the image's path below ``base`` mirrored under ``base/masks``
    (``train/r_0.png`` → ``masks/train/r_0.png``: a Blender set's splits share file names), else
    ``base/masks/<image name>`` (the nerfstudio / Brush convention), whichever exists first, else None."""
    mp = frame.get("mask_path")
    if isinstance(mp, str) and mp.strip():
        found = resolve_image_path(base, mp)
        if found is None:
            raise ValueError(f"mask_path {mp!r}: file not found")
        return found
    if img is None:
        return None
    try:
        rel = Path(os.path.abspath(img)).relative_to(os.path.abspath(base)).as_posix()  # symlinks kept
    except ValueError:  # an image outside the dataset folder: its name only
        rel = None
    found = find_mask(base / "masks", rel) if rel is not None and "/" in rel else None
    return found if found is not None else find_mask(base / "masks", img.name)


#: ``camera_model`` values of nerfstudio's transforms.json that this loader understands.
_PINHOLE_MODELS, _FISHEYE_MODELS = ("OPENCV", "PERSPECTIVE", "PINHOLE", ""), ("OPENCV_FISHEYE", "FISHEYE")


def _frame_spec(meta: dict, frame: dict, img: Path | None, name: str, size, max_image_size=MAX_IMAGE_SIDE
                ) -> FrameSpec:
    model = str(_lookup(frame, meta, "camera_model") or "").upper()
    if model not in _PINHOLE_MODELS + _FISHEYE_MODELS:
        raise ValueError(f"camera_model {model!r} is not supported (supported: OPENCV, PERSPECTIVE, "
                         "OPENCV_FISHEYE)")
    fisheye = model in _FISHEYE_MODELS or bool(_lookup(frame, meta, "is_fisheye"))
    if "transform_matrix" not in frame:
        raise ValueError("no 'transform_matrix'")
    w, h = (_size(_level(frame, meta, k), k) if _level(frame, meta, k) is not None else None for k in ("w", "h"))
    if w is None or h is None:
        if img is not None:
            iw, ih = image_size(img, max_side=max_image_size, max_pixels=max_image_size * max_image_size)
        elif size is not None:
            iw, ih = size
        else:
            raise ValueError("image size unknown: no 'w'/'h' keys and no image file (give the size explicitly, e.g. rigel-render --width W --height H)")
        w, h = (iw if w is None else w), (ih if h is None else h)
    problem = check_image_size(w, h, max_side=max_image_size, max_pixels=max_image_size * max_image_size)
    if problem:
        raise ValueError(f"'w'/'h': {problem}" + (" (the limits: docs/RELIABILITY.md; rigel-render has "
                                                   "--max-image-size)" if "exceeds" in problem else ""))

    fx = fy = None
    for d in (frame, meta):  # the first level that defines a focal length decides both axes
        if "fl_x" in d or "camera_angle_x" in d:
            fx = _finite(d, "fl_x") if "fl_x" in d else 0.5 * w / math.tan(0.5 * check_fov("camera_angle_x",
                                                                                            number(d, "camera_angle_x")))
            key_x = key_y = "fl_x" if "fl_x" in d else "camera_angle_x"   # the field a refusal names
            if "fl_y" in d:
                fy, key_y = _finite(d, "fl_y"), "fl_y"
            elif "camera_angle_y" in d:
                fy = 0.5 * h / math.tan(0.5 * check_fov("camera_angle_y", number(d, "camera_angle_y")))
                key_y = "camera_angle_y"
            break
    if fx is None:
        raise ValueError("no focal length: needs 'fl_x' or 'camera_angle_x'")
    fy = fx if fy is None else fy
    for key, v in (("fl_x", fx), ("fl_y", fy)):
        if not v > 0:
            raise ValueError(f"'{key}' (focal length) must be > 0, got {v}")
    for key, v, side in ((key_x, fx, w), (key_y, fy, h)):   # absurd intrinsics (docs/RELIABILITY.md)
        problem = focal_length_problem(v, side)
        if problem:
            raise ValueError(f"'{key}': {problem}")
    cx = w / 2.0 if _level(frame, meta, "cx") is None else _finite(_level(frame, meta, "cx"), "cx")
    cy = h / 2.0 if _level(frame, meta, "cy") is None else _finite(_level(frame, meta, "cy"), "cy")
    c2w = _matrix(frame["transform_matrix"])
    cam = Camera.from_c2w_opengl(c2w, width=w, height=h, fx=fx, fy=fy, cx=cx, cy=cy, name=name)

    coeffs = {k: 0.0 if _level(frame, meta, k) is None else _finite(_level(frame, meta, k), k)
              for k in (FISHEYE_KEYS if fisheye else OPENCV_KEYS)}
    dist = None
    if fisheye:  # even with k = 0 the equidistant projection is not a pinhole
        dist = fisheye_lens(coeffs, fx, fy, cx, cy, w, h)
    elif any(v != 0.0 for v in coeffs.values()):
        dist = opencv_lens(coeffs, fx, fy, cx, cy, w, h)
    return FrameSpec(cam, img, name, dist)


def warn_unmasked(masks_dir: Path, specs: list) -> None:
    """The one warning when a ``masks/`` folder exists but some images have no mask file in it (every pixel of
    those images counts), and one when a mask file serves several images (found by file name for images of the
    same name in different folders, e.g. a Blender set's ``train/r_0.png`` and ``test/r_0.png``: each then gets
    it; ``masks/train/``, ``masks/test/`` keep them apart)."""
    n = sum(s.mask_path is None for s in specs)
    if n and Path(masks_dir).is_dir():
        warnings.warn(f"{masks_dir}: {n} of {len(specs)} images have no mask file here; all their pixels count",
                      stacklevel=3)
    users: dict = {}
    for s in specs:
        if s.mask_path is not None and s.image_path is not None:
            users.setdefault(Path(s.mask_path), []).append(Path(s.image_path))
    shared = {m: imgs for m, imgs in users.items() if len(set(imgs)) > 1}
    if shared:
        m, imgs = next(iter(shared.items()))
        names = ", ".join(f"{i.parent.name}/{i.name}" for i in imgs[:3])
        warnings.warn(f"{masks_dir}: {len(shared)} mask file(s) serve more than one image ({m.name}: {names}); "
                      "each such image uses it — mirror the image folders under masks/ (masks/train/, "
                      "masks/test/) to give each its own", stacklevel=3)


def warn_missing(path: Path, missing: list, total: int) -> None:
    """The one warning for frames skipped because their image file does not exist (``missing``: their paths as
    the file gives them; the first is named)."""
    if missing:
        warnings.warn(f"{path}: {len(missing)} of {total} frames have no image file and were skipped (first: "
                      f"{missing[0]!r:.120})", stacklevel=3)


def read_ply_points(json_path, meta: dict | None = None):
    """(points (M,3) float64, colours (M,3) float64 in [0, 1] or None) of the PLY named by nerfstudio's
    ``ply_file_path`` key of ``json_path`` (path relative to the JSON file), or (None, None) without the key.

    ASCII or binary PLY (plyfile), element ``vertex`` with ``x y z``; colours from ``red green blue`` when all
    three are present (integer types divided by their maximum, e.g. uint8 / 255; float types must lie in
    [0, 1]). No vertex gives (None, None), like a COLMAP model without points.
    Raises DatasetError naming the PLY file (and the JSON): missing or unreadable file, no ``vertex`` element or
    coordinate, non-finite coordinates, colours out of range.
    """
    json_path = Path(json_path)
    meta = read_json(json_path) if meta is None else meta
    rel = meta.get("ply_file_path")
    if rel is None:
        return None, None
    if not isinstance(rel, str) or not rel.strip():
        raise DatasetError(f"{json_path}: 'ply_file_path' must be a file name, got {rel!r}")
    ply = json_path.parent / rel
    where = f"{ply} (ply_file_path of {json_path})"
    if not ply.is_file():
        raise DatasetError(f"{where}: file not found")
    from plyfile import PlyData

    try:
        data = PlyData.read(str(ply))
    except Exception as e:  # plyfile raises PlyParseError, ValueError, struct/numpy errors for corrupt files
        raise DatasetError(f"{where}: not a readable PLY file ({type(e).__name__}: {e})") from e
    if "vertex" not in data:
        raise DatasetError(f"{where}: no 'vertex' element")
    v = data["vertex"].data
    names = v.dtype.names or ()
    for k in ("x", "y", "z"):
        if k not in names:
            raise DatasetError(f"{where}: vertex has no '{k}' property")
    if len(v) == 0:
        return None, None
    points = np.stack([np.asarray(v[k], dtype=np.float64) for k in ("x", "y", "z")], axis=-1)
    bad = unusable_points(points)
    if bad:
        raise DatasetError(f"{where}: {bad} vertices have non-finite x y z (NaN, Inf or beyond float32's range)")
    if not all(k in names for k in ("red", "green", "blue")):
        return points, None
    cols = np.stack([np.asarray(v[k]) for k in ("red", "green", "blue")], axis=-1)
    if np.issubdtype(cols.dtype, np.integer):
        colors = cols.astype(np.float64) / float(np.iinfo(cols.dtype).max)
    else:
        colors = cols.astype(np.float64)
    if not (np.all(np.isfinite(colors)) and colors.min() >= 0.0 and colors.max() <= 1.0):
        raise DatasetError(f"{where}: red green blue must be integers or floats in [0, 1]")
    return points, colors
