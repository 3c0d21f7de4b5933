"""COLMAP sparse reconstructions (``sparse/0`` or ``sparse``, binary or text) read through pycolmap.

- Poses: ``image.cam_from_world`` is world-to-camera in OpenCV axes — our ``viewmat`` as it stands.
- Cameras: PINHOLE and SIMPLE_PINHOLE are used directly. Every other model (SIMPLE_RADIAL, RADIAL, OPENCV,
  FULL_OPENCV, …) is undistorted at load: each pixel centre of the output pinhole image (same size, same
  focal lengths and principal point) is sent through the model's own forward projection
  (``pycolmap.Camera.img_from_cam``) and the input image is sampled there bilinearly
  (:mod:`rigel_core.data.undistort`). pycolmap's ``undistort_image`` is not used because it changes the
  image size and intrinsics; keeping them lets one map per camera serve all its images.
- Images are read from ``images/`` next to ``sparse/`` (by ``image.name``, which may contain sub-folders).
  Registered images whose file is missing are skipped with one warning.
- ``points3D`` give ``Dataset.points`` (M,3) float64 and ``point_colors`` (M,3) in [0, 1].
- Before pycolmap reads anything, :func:`rigel_core.data.colmap_check.check_colmap_model` walks the model's files
  (declared counts against file lengths, camera models by id, every camera number): pycolmap trusts counts and
  crashes on models without a focal length.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from ..camera import Camera
from .colmap_check import check_colmap_model
from .frames import Dataset, DatasetError, Distortion, FrameSpec
from .transforms import frame_name, warn_missing

__all__ = ["load_colmap", "find_sparse_dir"]

PINHOLE_MODELS = ("PINHOLE", "SIMPLE_PINHOLE")


def find_sparse_dir(root: Path) -> Path:
    """``root/sparse/0`` or ``root/sparse`` (whichever holds ``cameras.bin`` or ``cameras.txt``)."""
    for sub in ("sparse/0", "sparse"):
        d = Path(root) / sub
        if any((d / f"cameras.{ext}").is_file() for ext in ("bin", "txt")):
            return d
    raise DatasetError(f"{root}: no COLMAP model (sparse/0/cameras.bin|txt or sparse/cameras.bin|txt)")


def _import_pycolmap():
    try:
        import pycolmap
    except ImportError as e:
        raise ImportError("reading COLMAP datasets needs pycolmap: pip install pycolmap "
                          "(or pip install 'rigel[colmap]')") from e
    return pycolmap


def _cam_from_world(image) -> np.ndarray:
    """(4,4) world-to-camera of a pycolmap Image (a method in pycolmap ≥ 3.12, a property before)."""
    cfw = image.cam_from_world
    cfw = cfw() if callable(cfw) else cfw
    vm = np.eye(4)
    vm[:3, :4] = np.asarray(cfw.matrix(), dtype=np.float64)
    return vm


def _colmap_distortion(cam) -> Distortion:
    """The lens of a pycolmap camera as a :class:`Distortion` (its own forward projection)."""
    params = tuple(float(p) for p in cam.params)

    def to_pixels(x, y):
        pts = np.stack([x.ravel(), y.ravel(), np.ones(x.size)], axis=-1)  # all in front: z = 1
        try:
            uv = np.asarray(cam.img_from_cam(pts))
        except TypeError:  # pycolmap < 3.10 takes normalised 2D points
            uv = np.asarray(cam.img_from_cam(pts[:, :2]))
        return uv[:, 0].reshape(x.shape), uv[:, 1].reshape(x.shape)

    return Distortion(("colmap", cam.model_name, params, cam.width, cam.height), to_pixels, cam.width, cam.height)


def load_colmap(root, *, white_bg=False, downscale=1, device="cpu", max_frames=None, test_every=8) -> Dataset:
    """A COLMAP dataset directory (``images/`` + ``sparse/0``); see the module docstring.

    Images sorted by name; every ``test_every``-th (indices 0, N, 2N, …) is held out (3DGS llffhold).
    Raises DatasetError naming the path for an unreadable model or no usable image; ImportError without pycolmap.
    """
    from .dataset import _assemble, _cap, split_every

    pycolmap = _import_pycolmap()
    root = Path(root)
    sparse = find_sparse_dir(root)
    check_colmap_model(sparse)  # counts, sizes, camera models and numbers, before pycolmap trusts them
    try:
        rec = pycolmap.Reconstruction(str(sparse))
    except Exception as e:  # pycolmap raises a bare RuntimeError/ValueError for a corrupt model
        raise DatasetError(f"{sparse}: cannot read the COLMAP model ({e})") from e
    images_dir = root / "images"
    specs, missing, total = [], 0, 0
    for image in sorted(rec.images.values(), key=lambda im: im.name):
        if hasattr(image, "has_pose") and not image.has_pose:
            continue  # not registered
        total += 1
        path = images_dir / image.name
        if not path.is_file():
            missing += 1
            continue
        cam = rec.cameras[image.camera_id]
        model = cam.model_name
        try:
            pin = Camera(cam.width, cam.height, cam.focal_length_x, cam.focal_length_y,
                         cam.principal_point_x, cam.principal_point_y, _cam_from_world(image),
                         frame_name({"file_path": image.name}, image.image_id))
        except ValueError as e:
            raise DatasetError(f"{sparse}: image {image.name} (camera {image.camera_id}, {model}): {e}") from e
        specs.append(FrameSpec(pin, path, pin.name, None if model in PINHOLE_MODELS else _colmap_distortion(cam)))
    warn_missing(images_dir, missing, total)
    if not specs:
        raise DatasetError(f"{sparse}: none of its {total} registered images was found in {images_dir}")
    points = colors = None
    if rec.points3D:
        pts = list(rec.points3D.values())
        points = np.array([p.xyz for p in pts], dtype=np.float64).reshape(-1, 3)
        colors = np.array([p.color for p in pts], dtype=np.float64).reshape(-1, 3) / 255.0
        if not np.isfinite(points).all():
            raise DatasetError(sparse, f"points3D: {int((~np.isfinite(points).all(1)).sum())} points have NaN or "
                                       f"Inf coordinates")
    train, test = split_every(specs, test_every)
    return _assemble(_cap(train, max_frames), _cap(test, max_frames), root, "colmap", white_bg, downscale, device,
                     points, colors)
