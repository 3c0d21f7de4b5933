"""COLMAP sparse reconstructions (``sparse/0`` or ``sparse``, binary or text) read through pycolmap.

- Poses: ``image.cam_from_world`` is world-to-camera in OpenCV axes — our ``viewmat`` as it stands.
- Cameras: PINHOLE and SIMPLE_PINHOLE are used directly. SIMPLE_RADIAL, RADIAL, OPENCV, FULL_OPENCV,
  OPENCV_FISHEYE, SIMPLE_RADIAL_FISHEYE and RADIAL_FISHEYE are undistorted at load with our own forward models
  (COLMAP's documented formulas, :mod:`rigel_core.data.undistort`): each pixel centre of the output pinhole
  image (same size, same focal lengths and principal point) is sent through the forward model and the photo
  is sampled there bilinearly; ``Frame.mask`` flags the pixels left without a source. Any other model (FOV,
  THIN_PRISM_FISHEYE, …) uses pycolmap's own forward projection (``Camera.img_from_cam``). pycolmap's
  ``undistort_image`` is not used because it changes the image size and intrinsics; keeping them lets one
  map per camera serve all its images.
- Images are read from ``images/`` next to ``sparse/`` (by ``image.name``, which may contain sub-folders).
  Registered images whose file is missing are skipped with one warning.
- Masks: ``masks/`` next to ``images/``, a file per image with the same relative name and any image extension
  (``a.jpg`` → ``masks/a.png``, ``masks/a.jpg.png`` or ``masks/a.jpg``); non-zero keeps, black ignores.
- ``points3D`` give ``Dataset.points`` (M,3) float64 and ``point_colors`` (M,3) in [0, 1]. A model of cameras and
  images without a ``points3D`` file (known poses, no SfM) loads as one with none (``points`` None: a random start).
- Before pycolmap reads anything, :func:`rigel_core.data.colmap_check.check_colmap_model` walks the model's files
  (declared counts against file lengths, camera models by id, every camera number): pycolmap trusts counts and
  crashes on models without a focal length.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from ..camera import Camera, check_camera_position
from ..deps import require
from ..io.errors import NoImageFiles
from .assemble import assemble_dataset, warn_small_split
from .colmap_check import read_reconstruction
from .frames import Dataset, DatasetError, FrameSpec, cap_frames, split_every, with_unique_names
from .images import find_mask
from .transforms import frame_name, unusable_points, warn_missing, warn_unmasked
from .undistort import Distortion, fisheye_lens, opencv_lens

__all__ = ["load_colmap", "read_colmap_frames", "find_sparse_dir"]

PINHOLE_MODELS = ("PINHOLE", "SIMPLE_PINHOLE")


def find_sparse_dir(root: Path) -> Path:
    """``root/sparse/0`` or ``root/sparse`` (whichever holds ``cameras.bin`` or ``cameras.txt``). DatasetError
    naming ``root`` otherwise: missing ("no such directory"), a file, or a folder without a model."""
    root = Path(root)
    if not root.exists():
        raise DatasetError(f"{root}: no such directory")
    if not root.is_dir():
        raise DatasetError(f"{root}: not a directory (a COLMAP dataset is a folder holding sparse/0 or sparse)")
    for sub in ("sparse/0", "sparse"):
        d = Path(root) / sub
        if any((d / f"cameras.{ext}").is_file() for ext in ("bin", "txt")):
            return d
    raise DatasetError(f"{root}: no COLMAP model (sparse/0/cameras.bin|txt or sparse/cameras.bin|txt)")


def _import_pycolmap():
    """pycolmap; MissingPackage (an ImportError) saying what to install when it is missing."""
    return require("pycolmap", package="pycolmap", extra="colmap", purpose="reading a COLMAP model")


def _cam_from_world(image) -> np.ndarray:
    """(4,4) world-to-camera of a pycolmap Image (a method in pycolmap ≥ 3.12, a property before)."""
    cfw = image.cam_from_world
    cfw = cfw() if callable(cfw) else cfw
    vm = np.eye(4)
    vm[:3, :4] = np.asarray(cfw.matrix(), dtype=np.float64)
    return vm


#: parameter names of the models whose forward projection is ours (COLMAP ``src/colmap/sensor/models.h``).
COLMAP_MODELS = {
    "SIMPLE_RADIAL": ("f", "cx", "cy", "k1"),
    "RADIAL": ("f", "cx", "cy", "k1", "k2"),
    "OPENCV": ("fx", "fy", "cx", "cy", "k1", "k2", "p1", "p2"),
    "FULL_OPENCV": ("fx", "fy", "cx", "cy", "k1", "k2", "p1", "p2", "k3", "k4", "k5", "k6"),
    "OPENCV_FISHEYE": ("fx", "fy", "cx", "cy", "k1", "k2", "k3", "k4"),
    "SIMPLE_RADIAL_FISHEYE": ("f", "cx", "cy", "k1"),
    "RADIAL_FISHEYE": ("f", "cx", "cy", "k1", "k2"),
}


def _colmap_distortion(model_name: str, params, width: int, height: int) -> Distortion | None:
    """The lens of a COLMAP camera as a :class:`~rigel_core.data.undistort.Distortion` (None for the pinhole
    models). A pure function of the camera's model name, parameters and size.

    The models of :data:`COLMAP_MODELS` use our forward models (``*_FISHEYE``: equidistant; the others: OpenCV
    radial-tangential); any other model goes through a pycolmap camera built from the same four values.
    Raises ValueError when the parameter count does not fit the model.
    """
    params = tuple(float(p) for p in params)
    if model_name in PINHOLE_MODELS:
        return None
    names = COLMAP_MODELS.get(model_name)
    if names is not None:
        if len(params) != len(names):
            raise ValueError(f"camera model {model_name} takes {len(names)} parameters, got {len(params)}")
        p = dict(zip(names, params))
        if "f" in p:
            p["fx"] = p["fy"] = p["f"]
        lens = fisheye_lens if model_name.endswith("FISHEYE") else opencv_lens
        return lens(p, p["fx"], p["fy"], p["cx"], p["cy"], width, height)
    pycolmap = _import_pycolmap()
    cam = pycolmap.Camera.create_from_model_name(1, model_name, 1.0, int(width), int(height))
    if len(cam.params) != len(params):
        raise ValueError(f"camera model {model_name} takes {len(cam.params)} parameters, got {len(params)}")
    cam.params = list(params)
    fx, fy, cx, cy = cam.focal_length_x, cam.focal_length_y, cam.principal_point_x, cam.principal_point_y

    def to_pixels(x, y):
        pts = np.stack([x.ravel(), y.ravel(), np.ones(x.size)], axis=-1)  # all in front: z = 1
        uv = np.asarray(cam.img_from_cam(pts), dtype=np.float64)
        return uv[:, 0].reshape(x.shape), uv[:, 1].reshape(x.shape)

    def profile(r):  # along the +x axis, in pixels from the principal point
        u, v = to_pixels(r, np.zeros_like(r))
        return np.hypot((u - cx) / fx, (v - cy) / fy)

    return Distortion(("colmap", model_name, params, int(width), int(height)), to_pixels, int(width),
                      int(height), profile)


def read_colmap_frames(root, *, require_images: bool = True):
    """The registered images of the COLMAP dataset ``root`` as frame specs, sorted by image name, before any image
    is read (``load_colmap`` and ``rigel-render --cameras``).

    Args:
        root: the dataset directory (``sparse/0`` or ``sparse``, images in ``root/images``).
        require_images: skip the images whose file is not in ``root/images`` (listed in ``missing``); with False
            they are kept with ``image_path=None`` (their camera alone).
    Returns:
        (sparse, rec, specs, missing, total): the model folder, the pycolmap Reconstruction, the
        :class:`FrameSpec` list (pinhole camera of the declared size, lens, mask file), the names of the images not
        found, and how many images are registered.
    Raises:
        DatasetError naming the path (no such folder, no or an unreadable model, a camera it refuses);
        ImportError without pycolmap.
    """
    root = Path(root)
    sparse = find_sparse_dir(root)
    pycolmap = _import_pycolmap()
    rec = read_reconstruction(sparse, pycolmap)  # its files walked first: pycolmap trusts counts and sizes
    images_dir = root / "images"
    masks_dir = root / "masks"
    specs, missing, total = [], [], 0
    for image in sorted(rec.images.values(), key=lambda im: im.name):
        if hasattr(image, "has_pose") and not image.has_pose:
            continue  # not registered
        total += 1
        path = images_dir / image.name
        if not path.is_file():
            missing.append(image.name)
            if require_images:
                continue
            path = None
        cam = rec.cameras[image.camera_id]
        model = cam.model_name
        try:
            pin = Camera(cam.width, cam.height, cam.focal_length_x, cam.focal_length_y,
                         cam.principal_point_x, cam.principal_point_y, _cam_from_world(image),
                         frame_name({"file_path": image.name}, image.image_id))
            check_camera_position(pin.c2w[:3, 3])
            dist = _colmap_distortion(model, cam.params, cam.width, cam.height)
        except ValueError as e:
            raise DatasetError(f"{sparse}: image {image.name} (camera {image.camera_id}, {model}): {e}") from e
        specs.append(FrameSpec(pin, path, pin.name, dist, mask_path=find_mask(masks_dir, image.name)))
    return sparse, rec, specs, missing, total


def load_colmap(root, *, white_bg=False, downscale=1, device="cpu", max_frames=None, test_every=8,
                alpha_as_mask=False, stream=False, cache_mb=None) -> Dataset:
    """A COLMAP dataset directory (``images/`` + ``sparse/0``); see the module docstring.

    Images sorted by name; every ``test_every``-th (indices 0, N, 2N, …) is held out (3DGS llffhold).
    Raises DatasetError naming the path for an unreadable model or no usable image; ImportError without pycolmap.
    """
    root = Path(root)
    sparse, rec, specs, missing, total = read_colmap_frames(root)
    images_dir = root / "images"
    if not specs:   # said once, by the error (a model of cameras alone: NoImageFiles)
        raise NoImageFiles(f"{sparse}: none of its {total} registered images was found in {images_dir}")
    warn_missing(images_dir, missing, total)
    warn_unmasked(root / "masks", specs)
    points = colors = None
    if rec.points3D:
        pts = list(rec.points3D.values())
        points = np.array([p.xyz for p in pts], dtype=np.float64).reshape(-1, 3)
        colors = np.array([p.color for p in pts], dtype=np.float64).reshape(-1, 3) / 255.0
        bad = unusable_points(points)
        if bad:
            raise DatasetError(sparse, f"points3D: {bad} points have NaN or Inf coordinates (or beyond float32's "
                                       f"range)")
    train, test = split_every(with_unique_names(specs), test_every)
    if max_frames is None:   # (a cap of the views is the caller's choice)
        warn_small_split(root, train, test)
    return assemble_dataset(cap_frames(train, max_frames), cap_frames(test, max_frames), root, "colmap", white_bg,
                            downscale, device, points, colors, alpha_as_mask=alpha_as_mask, stream=stream,
                            cache_mb=cache_mb)
