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
"""
from __future__ import annotations

import json
import math
import os
import warnings
from pathlib import Path

import numpy as np

from ..camera import Camera
from .frames import DatasetError, FrameSpec
from .images import IMAGE_EXTENSIONS, find_mask, image_size, resolve_image_path
from .undistort import FISHEYE_KEYS, OPENCV_KEYS, fisheye_lens, opencv_lens

__all__ = ["read_json", "read_transforms", "frame_name"]


def read_json(path: Path) -> dict:
    """Parse a transforms file; DatasetError naming it when it is unreadable or not a JSON object with frames."""
    path = Path(path)
    try:
        with open(path) as f:
            meta = json.load(f)
    except FileNotFoundError:
        raise DatasetError(f"{path}: file not found") from None
    except (OSError, json.JSONDecodeError, UnicodeDecodeError) as e:
        raise DatasetError(f"{path}: not a readable JSON file ({e})") from e
    if not isinstance(meta, dict) or not isinstance(meta.get("frames"), list):
        raise DatasetError(f"{path}: expected a JSON object with a 'frames' list")
    return meta


def frame_name(frame: dict, index: int) -> str:
    """The name of a frame: the stem of its ``file_path`` (``./train/r_0`` → ``r_0``), else ``frame_<index>``."""
    fp = frame.get("file_path")
    if isinstance(fp, str) and fp.strip():
        name = Path(fp).name
        stem, ext = os.path.splitext(name)
        return stem if ext in IMAGE_EXTENSIONS else name
    return f"frame_{index:05d}"


def read_transforms(path, *, require_images: bool = True, size: tuple[int, int] | None = None):
    """Cameras (and image paths) of every frame of a ``transforms*.json`` file.

    Args:
        path: the JSON file.
        require_images: skip frames whose image file does not exist (the caller warns with the count);
            with False, frames keep ``image_path=None`` and the image is used only for its size, if present.
        size: (width, height) used when neither the file nor an image gives the size (the render CLI's
            ``--width/--height``).
    Returns:
        (specs, n_missing, n_total): a list of :class:`FrameSpec` in file order, how many frames had no image
        file, and how many frames the file lists.
    Raises:
        DatasetError naming the file (and frame index) for malformed JSON, a missing or invalid
        ``transform_matrix``, no focal length, an unknown image size, an unsupported ``camera_model``, or a
        ``mask_path`` that names no file.
    """
    path = Path(path)
    meta = read_json(path)
    specs, missing = [], 0
    for i, frame in enumerate(meta["frames"]):
        where = f"{path}: frame {i}"
        if not isinstance(frame, dict):
            raise DatasetError(f"{where}: expected an object, got {type(frame).__name__}")
        fp = frame.get("file_path")
        img = resolve_image_path(path.parent, fp) if isinstance(fp, str) and fp.strip() else None
        if img is None and require_images:
            missing += 1
            continue
        try:
            spec = _frame_spec(meta, frame, img, frame_name(frame, i), size)
            if require_images:  # masks matter only to a loader of the images
                spec.mask_path = _mask_path(path.parent, frame, img)
        except (ValueError, TypeError, KeyError) as e:
            raise DatasetError(f"{where} ({fp}): {e}") from e
        specs.append(spec)
    return specs, missing, len(meta["frames"])


def _lookup(frame: dict, meta: dict, key: str):
    return frame[key] if key in frame else meta.get(key)


def _mask_path(base: Path, frame: dict, img: Path | None) -> Path | None:
    """The frame's ``mask_path`` (must exist), else ``base/masks/<image name>`` when that exists, else None."""
    mp = frame.get("mask_path")
    if isinstance(mp, str) and mp.strip():
        found = resolve_image_path(base, mp)
        if found is None:
            raise ValueError(f"mask_path {mp!r}: file not found")
        return found
    return None if img is None else find_mask(base / "masks", img.name)


#: ``camera_model`` values of nerfstudio's transforms.json that this loader understands.
_PINHOLE_MODELS, _FISHEYE_MODELS = ("OPENCV", "PERSPECTIVE", "PINHOLE", ""), ("OPENCV_FISHEYE", "FISHEYE")


def _frame_spec(meta: dict, frame: dict, img: Path | None, name: str, size) -> FrameSpec:
    model = str(_lookup(frame, meta, "camera_model") or "").upper()
    if model not in _PINHOLE_MODELS + _FISHEYE_MODELS:
        raise ValueError(f"camera_model {model!r} is not supported (supported: OPENCV, PERSPECTIVE, "
                         "OPENCV_FISHEYE)")
    fisheye = model in _FISHEYE_MODELS or bool(_lookup(frame, meta, "is_fisheye"))
    if "transform_matrix" not in frame:
        raise ValueError("no 'transform_matrix'")
    w, h = _lookup(frame, meta, "w"), _lookup(frame, meta, "h")
    if w is None or h is None:
        if img is not None:
            iw, ih = image_size(img)
        elif size is not None:
            iw, ih = size
        else:
            raise ValueError("image size unknown: no 'w'/'h' keys and no image file (give the size explicitly, e.g. rigel-render --width W --height H)")
        w, h = (iw if w is None else w), (ih if h is None else h)
    w, h = int(round(float(w))), int(round(float(h)))

    fx = fy = None
    for d in (frame, meta):  # the first level that defines a focal length decides both axes
        if "fl_x" in d or "camera_angle_x" in d:
            fx = float(d["fl_x"]) if "fl_x" in d else 0.5 * w / math.tan(0.5 * float(d["camera_angle_x"]))
            if "fl_y" in d:
                fy = float(d["fl_y"])
            elif "camera_angle_y" in d:
                fy = 0.5 * h / math.tan(0.5 * float(d["camera_angle_y"]))
            break
    if fx is None:
        raise ValueError("no focal length: needs 'fl_x' or 'camera_angle_x'")
    fy = fx if fy is None else fy
    cx, cy = _lookup(frame, meta, "cx"), _lookup(frame, meta, "cy")
    cx = w / 2.0 if cx is None else float(cx)
    cy = h / 2.0 if cy is None else float(cy)
    c2w = np.asarray(frame["transform_matrix"], dtype=np.float64)
    cam = Camera.from_c2w_opengl(c2w, width=w, height=h, fx=fx, fy=fy, cx=cx, cy=cy, name=name)

    coeffs = {k: float(_lookup(frame, meta, k) or 0.0) for k in (FISHEYE_KEYS if fisheye else OPENCV_KEYS)}
    dist = None
    if fisheye:  # even with k = 0 the equidistant projection is not a pinhole
        dist = fisheye_lens(coeffs, fx, fy, cx, cy, w, h)
    elif any(v != 0.0 for v in coeffs.values()):
        dist = opencv_lens(coeffs, fx, fy, cx, cy, w, h)
    return FrameSpec(cam, img, name, dist)


def warn_unmasked(masks_dir: Path, specs: list) -> None:
    """The one warning when a ``masks/`` folder exists but some images have no mask file in it (every pixel of
    those images counts)."""
    n = sum(s.mask_path is None for s in specs)
    if n and Path(masks_dir).is_dir():
        warnings.warn(f"{masks_dir}: {n} of {len(specs)} images have no mask file here; all their pixels count",
                      stacklevel=3)


def warn_missing(path: Path, missing: int, total: int) -> None:
    """The one warning for frames skipped because their image file does not exist."""
    if missing:
        warnings.warn(f"{path}: {missing} of {total} frames have no image file and were skipped", stacklevel=3)
