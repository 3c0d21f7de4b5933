"""COLMAP → nerfstudio ``transforms.json`` (as ``ns-process-data`` writes it): a capture that loads without pycolmap.

:func:`colmap_to_transforms` reads a COLMAP dataset (``images/`` + ``sparse/0`` or ``sparse``, binary or text,
through pycolmap) and writes ``DST/transforms.json`` plus ``DST/sparse_pc.ply`` (the SfM points and colours).

- ``transform_matrix``: camera-to-world in OpenGL camera axes (x right, y up, z back) — the inverse of what
  :meth:`rigel_core.Camera.from_c2w_opengl` reads — of COLMAP's ``cam_from_world``. The world frame is COLMAP's
  own: nerfstudio's extra re-orientation (swap y/z, flip the new z) is **not** applied, so ``applied_transform``
  is written as the 3×4 identity and the PLY points are in the same frame as the poses.
- Per frame: ``fl_x fl_y cx cy w h`` (COLMAP's pixel convention, which is ours: pixel centres at +0.5) and
  ``camera_model`` with its coefficients:

  ============================  ==================  ========================================
  COLMAP model                  ``camera_model``    keys
  ============================  ==================  ========================================
  SIMPLE_PINHOLE, PINHOLE       ``PINHOLE``         none
  SIMPLE_RADIAL, RADIAL         ``OPENCV``          ``k1 k2 p1 p2`` (absent ones 0)
  OPENCV                        ``OPENCV``          ``k1 k2 p1 p2``
  FULL_OPENCV (k4 = k5 = k6 = 0) ``OPENCV``         ``k1 k2 p1 p2 k3``
  OPENCV_FISHEYE                ``OPENCV_FISHEYE``  ``k1 k2 k3 k4``
  ============================  ==================  ========================================

  FULL_OPENCV with a non-zero k4..k6 (OpenCV's rational model, a denominator ``1 + k4 r² + k5 r⁴ + k6 r⁶``)
  has no transforms.json key and is refused, as is every other model (fisheye variants other than
  OPENCV_FISHEYE, FOV, THIN_PRISM, EQUIRECTANGULAR, …). ``camera_model`` is also written at the top level when
  all frames share it (nerfstudio reads it there).
- Frames: registered images whose file exists, sorted by name (the COLMAP loader's order, so both loaders hold
  out the same test frames). ``file_path`` is relative to DST: by default the original image
  (``os.path.relpath``, nothing copied); ``images="copy"`` copies each image to ``DST/images/<name>``,
  ``images="link"`` makes a symbolic link there instead.
- Every file is written atomically (:mod:`rigel_core.atomic`); ``transforms.json`` is written last, so its
  presence means a complete conversion. An existing ``DST/transforms.json`` is refused unless ``force``, and so is
  any file the conversion would replace (an image under ``DST/images``, ``DST/sparse_pc.ply``).
"""
from __future__ import annotations

import json
import os
import shutil
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..atomic import atomic_path
from ..camera import Camera, check_camera_position
from .colmap import _cam_from_world, _import_pycolmap, find_sparse_dir
from .colmap_check import read_reconstruction
from .frames import DatasetError

__all__ = ["colmap_to_transforms", "ConvertResult", "COLMAP_PARAMS", "PLY_NAME", "IMAGE_MODES"]

#: COLMAP's parameter order for each model the converter supports (colmap/src/colmap/sensor/models.h).
COLMAP_PARAMS = {
    "SIMPLE_PINHOLE": ("f", "cx", "cy"),
    "PINHOLE": ("fx", "fy", "cx", "cy"),
    "SIMPLE_RADIAL": ("f", "cx", "cy", "k1"),
    "RADIAL": ("f", "cx", "cy", "k1", "k2"),
    "OPENCV": ("fx", "fy", "cx", "cy", "k1", "k2", "p1", "p2"),
    "FULL_OPENCV": ("fx", "fy", "cx", "cy", "k1", "k2", "p1", "p2", "k3", "k4", "k5", "k6"),
    "OPENCV_FISHEYE": ("fx", "fy", "cx", "cy", "k1", "k2", "k3", "k4"),
}
#: name of the point-cloud file written next to transforms.json (nerfstudio's name).
PLY_NAME = "sparse_pc.ply"
#: how images are referenced: in place (relative path), copied, or symlinked into DST/images.
IMAGE_MODES = ("reference", "copy", "link")


@dataclass
class ConvertResult:
    """What :func:`colmap_to_transforms` wrote: the JSON path, frame / skipped / point counts, models seen."""

    path: Path
    n_frames: int
    n_missing: int
    n_points: int
    camera_models: tuple[str, ...]


def camera_keys(cam, where: str) -> dict:
    """transforms.json intrinsics and lens keys of one pycolmap camera (see the module table).

    The model name is checked before any parameter is read (pycolmap's ``focal_length_x`` of a model without a
    focal length aborts the process). Raises DatasetError (``where``: the model file) for an unsupported model,
    a rational FULL_OPENCV, or a parameter count that does not match the model.
    """
    model = str(cam.model_name)
    if model not in COLMAP_PARAMS:
        raise DatasetError(f"{where}: camera {cam.camera_id} uses COLMAP model {model}, which transforms.json "
                           f"cannot express (supported: {', '.join(COLMAP_PARAMS)})")
    names = COLMAP_PARAMS[model]
    params = [float(v) for v in np.asarray(cam.params, dtype=np.float64).ravel()]
    if len(params) != len(names):
        raise DatasetError(f"{where}: camera {cam.camera_id} ({model}) has {len(params)} parameters, "
                           f"expected {len(names)}")
    p = dict(zip(names, params))
    out = {"fl_x": p.get("fx", p.get("f")), "fl_y": p.get("fy", p.get("f")), "cx": p["cx"], "cy": p["cy"],
           "w": int(cam.width), "h": int(cam.height)}
    if model in ("SIMPLE_PINHOLE", "PINHOLE"):
        out["camera_model"] = "PINHOLE"
    elif model == "OPENCV_FISHEYE":
        out.update(camera_model="OPENCV_FISHEYE", **{k: p[k] for k in ("k1", "k2", "k3", "k4")})
    else:
        if model == "FULL_OPENCV" and any(p[k] != 0.0 for k in ("k4", "k5", "k6")):
            raise DatasetError(
                f"{where}: camera {cam.camera_id} is FULL_OPENCV with k4..k6 = "
                f"{p['k4']:g}, {p['k5']:g}, {p['k6']:g}: OpenCV's rational model has no transforms.json keys "
                "(only k1 k2 p1 p2 k3 are read)")
        out["camera_model"] = "OPENCV"
        out.update({k: p.get(k, 0.0) for k in ("k1", "k2", "p1", "p2")})
        if model == "FULL_OPENCV":
            out["k3"] = p["k3"]
    return out


def c2w_opengl(camera: Camera) -> np.ndarray:
    """(4, 4) camera-to-world in OpenGL camera axes: ``Camera.c2w`` with its y and z columns negated (the exact
    inverse of :meth:`Camera.from_c2w_opengl`)."""
    m = camera.c2w.copy()
    m[:3, 1:3] *= -1.0
    return m


def colmap_to_transforms(src, dst, *, images: str = "reference", images_dir: str = "images",
                         force: bool = False) -> ConvertResult:
    """Convert the COLMAP dataset ``src`` to ``dst/transforms.json`` + ``dst/sparse_pc.ply`` (module docstring).

    Args:
        src: COLMAP dataset directory (``sparse/0`` or ``sparse`` with cameras/images/points3D ``.bin|.txt``).
        dst: output directory (created; may equal ``src``).
        images: ``"reference"`` (file_path → the original image, relative to ``dst``), ``"copy"`` (into
            ``dst/images``) or ``"link"`` (symbolic links in ``dst/images``).
        images_dir: the folder of ``src`` holding the images named by the model (e.g. ``images_4`` for
            downsampled LLFF images; the loader rescales the intrinsics to the image size).
        force: replace an existing ``dst/transforms.json`` and any image or points file the conversion writes.
    Returns: :class:`ConvertResult`.
    Raises:
        DatasetError naming the file: unreadable model, unsupported camera model, no image file found.
        FileExistsError: ``dst/transforms.json``, or a file the conversion would write, exists and ``force`` is
        False.
        ImportError without pycolmap; OSError when writing fails.
    """
    if images not in IMAGE_MODES:
        raise ValueError(f"images must be one of {IMAGE_MODES}, got {images!r}")
    src, dst = Path(src), Path(dst)
    out_json = dst / "transforms.json"
    if out_json.exists() and not force:
        raise FileExistsError(f"{out_json}: already exists (use --force to replace it)")
    sparse = find_sparse_dir(src)   # a missing SRC is said as such, pycolmap installed or not
    pycolmap = _import_pycolmap()
    rec = read_reconstruction(sparse, pycolmap)  # its files walked first: pycolmap trusts counts and sizes
    src_images = src / images_dir

    intrinsics, frames, missing, total = {}, [], 0, 0
    for image in sorted(rec.images.values(), key=lambda im: im.name):
        if hasattr(image, "has_pose") and not image.has_pose:
            continue  # not registered
        total += 1
        if image.camera_id not in intrinsics:
            intrinsics[image.camera_id] = camera_keys(rec.cameras[image.camera_id], str(sparse))
        keys = intrinsics[image.camera_id]
        path = src_images / image.name
        if not path.is_file():
            missing += 1
            continue
        try:
            cam = Camera(keys["w"], keys["h"], keys["fl_x"], keys["fl_y"], keys["cx"], keys["cy"],
                         _cam_from_world(image))
            check_camera_position(cam.c2w[:3, 3])
        except ValueError as e:
            raise DatasetError(f"{sparse}: image {image.name} (camera {image.camera_id}): {e}") from e
        frames.append({"file_path": path, "name": image.name, "image_id": int(image.image_id),
                       "transform_matrix": c2w_opengl(cam).tolist(), **keys})
    if missing:
        warnings.warn(f"{src_images}: {missing} of {total} registered images have no file and were skipped",
                      stacklevel=2)
    if not frames:
        raise DatasetError(f"{sparse}: none of its {total} registered images was found in {src_images}")

    if not force:  # nothing in dst is replaced without --force: the images it would write, its points file
        taken = [dst / "images" / f["name"] for f in frames
                 if images != "reference" and _occupied(dst / "images" / f["name"], f["file_path"])]
        if len(rec.points3D) and (dst / PLY_NAME).exists():
            taken.insert(0, dst / PLY_NAME)
        if taken:
            more = f" and {len(taken) - 1} more file(s)" if len(taken) > 1 else ""
            raise FileExistsError(f"{taken[0]}: already exists{more} in {dst} (use --force to replace them)")
    dst.mkdir(parents=True, exist_ok=True)
    for f in frames:
        f["file_path"] = _place_image(f.pop("file_path"), dst, f.pop("name"), images)

    meta = {}
    models = sorted({f["camera_model"] for f in frames})
    if len(models) == 1:
        meta["camera_model"] = models[0]
    meta["applied_transform"] = np.eye(4)[:3].tolist()  # poses and points stay in COLMAP's world frame
    n_points = len(rec.points3D)
    if n_points:
        write_points_ply(dst / PLY_NAME, *_colmap_points(rec))
        meta["ply_file_path"] = PLY_NAME
    meta["frames"] = [{"file_path": f.pop("file_path"), "transform_matrix": f.pop("transform_matrix"),
                       "colmap_im_id": f.pop("image_id"), **f} for f in frames]
    with atomic_path(out_json) as tmp:
        Path(tmp).write_text(json.dumps(meta, indent=2) + "\n")
    return ConvertResult(out_json, len(frames), missing, n_points, tuple(models))


def _occupied(target: Path, source: Path) -> bool:
    """True when writing ``target`` would replace a file other than ``source`` itself (e.g. a link to it)."""
    if not (target.exists() or target.is_symlink()):
        return False
    try:
        return not os.path.samefile(target, source)
    except OSError:  # a dangling link
        return True


def _place_image(path: Path, dst: Path, name: str, mode: str) -> str:
    """The ``file_path`` (relative to ``dst``, '/'-separated) of one image, after copying or linking it."""
    if mode == "reference":
        return Path(os.path.relpath(path.absolute(), dst.absolute())).as_posix()
    target = dst / "images" / name
    if not (target.exists() and os.path.samefile(target, path)):
        target.parent.mkdir(parents=True, exist_ok=True)
        if mode == "copy":
            with atomic_path(target) as tmp:
                shutil.copyfile(path, tmp)
        else:  # not atomic_path: its fsync/chmod would follow the link to the source image
            tmp = target.with_name(f".{target.name}.{os.getpid()}.link")
            os.symlink(path.resolve(), tmp)
            os.replace(tmp, target)
    return (Path("images") / name).as_posix()


def _colmap_points(rec) -> tuple[np.ndarray, np.ndarray]:
    pts = list(rec.points3D.values())
    xyz = np.array([p.xyz for p in pts], dtype=np.float64).reshape(-1, 3)
    rgb = np.array([p.color for p in pts], dtype=np.uint8).reshape(-1, 3)
    return xyz, rgb


def write_points_ply(path, xyz: np.ndarray, rgb: np.ndarray) -> None:
    """Write a binary little-endian PLY ``vertex`` element: ``x y z`` float64 and ``red green blue`` uint8
    (atomically). ``xyz`` (M,3), ``rgb`` (M,3) uint8."""
    from plyfile import PlyData, PlyElement

    v = np.empty(len(xyz), dtype=[("x", "<f8"), ("y", "<f8"), ("z", "<f8"),
                                  ("red", "u1"), ("green", "u1"), ("blue", "u1")])
    for i, k in enumerate("xyz"):
        v[k] = xyz[:, i]
    for i, k in enumerate(("red", "green", "blue")):
        v[k] = rgb[:, i]
    with atomic_path(path) as tmp:
        PlyData([PlyElement.describe(v, "vertex")], text=False, byte_order="<").write(tmp)
