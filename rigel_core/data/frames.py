"""``Frame`` and ``Dataset`` (what every loader returns), and the shared load step of one frame:
decode → composite alpha → undistort → downscale → torch.
"""
from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np
import torch

from ..camera import Camera
from ..io.errors import DatasetError  # defined with the other input-error families
from .images import composite, read_image, resize_area
from .undistort import pinhole_pixel_grid, remap_bilinear

__all__ = ["Frame", "Dataset", "DatasetError", "FrameSpec", "Distortion", "load_frames", "camera_extent"]


@dataclass
class Frame:
    """One image with its camera.

    Attributes:
        camera: ideal pinhole :class:`~rigel_core.camera.Camera` of this image (distortion already removed).
        image: (H, W, 3) float32 in [0, 1]; alpha already composited onto the dataset's background.
        alpha: (H, W) float32 in [0, 1], or None when the image file has no alpha channel.
        name: frame name (the image file's stem), used for output file names.
    """

    camera: Camera
    image: torch.Tensor
    alpha: torch.Tensor | None
    name: str


@dataclass
class Dataset:
    """A loaded dataset.

    Attributes:
        train, test: frames of each split.
        scene_center: (3,) float64 mean of the training camera centres.
        scene_extent: radius of the training camera centres around that mean × 1.1 (the 3DGS "nerf++
            normalisation" radius; world units). Learning rates and densification thresholds scale with it.
        points, point_colors: (M, 3) float64 SfM points and their colours in [0, 1] (COLMAP), else None.
        white_bg: whether alpha was composited onto white (else black).
        source: format name: ``"blender"``, ``"ngp"`` or ``"colmap"``.
        path: the directory (or file) it was loaded from.
    """

    train: list[Frame]
    test: list[Frame]
    scene_center: np.ndarray
    scene_extent: float
    points: np.ndarray | None = None
    point_colors: np.ndarray | None = None
    white_bg: bool = False
    source: str = ""
    path: str = ""

    @property
    def background(self) -> tuple[float, float, float]:
        """The RGB background the images were composited onto."""
        return (1.0, 1.0, 1.0) if self.white_bg else (0.0, 0.0, 0.0)

    def __repr__(self) -> str:
        return (f"Dataset(source={self.source!r}, train={len(self.train)}, test={len(self.test)}, "
                f"extent={self.scene_extent:.3g}, points={None if self.points is None else len(self.points)})")


@dataclass
class Distortion:
    """A lens model to remove at load.

    ``to_pixels(x, y)`` maps normalised pinhole coordinates (arrays, float64) to pixel positions ``(u, v)`` in
    the distorted image of size ``width × height`` (the size its intrinsics refer to). ``key`` is hashable and
    equal for equal models (used to cache the per-pixel map).
    """

    key: tuple
    to_pixels: Callable
    width: int
    height: int


@dataclass
class FrameSpec:
    """A frame before its image is read: pinhole camera at the declared size, image path, lens model."""

    camera: Camera
    image_path: Path | None
    name: str
    distortion: Distortion | None = None
    extra: dict = field(default_factory=dict)


def camera_extent(cameras: list[Camera]) -> tuple[np.ndarray, float]:
    """(centre (3,), radius) of camera centres: their mean, and 1.1 × the largest distance to it.

    The 3DGS convention (``getNerfppNorm`` in the reference implementation). One camera gives radius 1.1·0 →
    replaced by 1.0 so that nothing downstream divides by zero.
    """
    # the translation of camera-to-world (not −Rᵀt, which assumes an exactly orthonormal R; stored poses
    # such as NeRF-synthetic's float32 matrices are orthonormal only to ~1e-7)
    centres = np.stack([c.c2w[:3, 3] for c in cameras]) if cameras else np.zeros((1, 3))
    center = centres.mean(0)
    radius = float(np.linalg.norm(centres - center, axis=1).max()) * 1.1
    return center, (radius if radius > 0 else 1.0)


def load_frames(specs: list[FrameSpec], *, white_bg: bool, downscale: float, device, source: Path) -> list[Frame]:
    """Read, composite, undistort and downscale the images of ``specs``.

    When an image's size differs from the size its camera declares, the intrinsics are rescaled to the image
    (a dataset shipped with downsampled images); a warning says so once per call.
    Raises DatasetError naming the image when it cannot be decoded.
    """
    frames, maps, resized = [], {}, 0
    for spec in specs:
        try:
            rgba = read_image(spec.image_path)
        except ValueError as e:
            raise DatasetError(str(e)) from e
        cam = spec.camera
        h, w = rgba.shape[:2]
        if (w, h) != (cam.width, cam.height):
            cam = cam.with_size(w, h)
            resized += 1
        rgb, alpha = composite(rgba, white_bg)
        if spec.distortion is not None:
            key = (spec.distortion.key, w, h, cam.fx, cam.fy, cam.cx, cam.cy)
            if key not in maps:
                maps[key] = _source_coords(cam, spec.distortion)
            rgb = remap_bilinear(rgb, maps[key])
            alpha = None if alpha is None else remap_bilinear(alpha, maps[key])
        if downscale != 1:
            cam = cam.scaled(1.0 / downscale)
            rgb = resize_area(rgb, cam.width, cam.height)
            alpha = None if alpha is None else resize_area(alpha, cam.width, cam.height)
        frames.append(Frame(cam, torch.from_numpy(np.ascontiguousarray(rgb, dtype=np.float32)).to(device),
                            None if alpha is None else torch.from_numpy(np.ascontiguousarray(alpha)).to(device),
                            spec.name))
    if resized:
        warnings.warn(f"{source}: {resized} image(s) differ in size from their camera's declared size; "
                      "intrinsics were rescaled to the image size", stacklevel=3)
    return frames


def _source_coords(cam: Camera, dist: Distortion) -> np.ndarray:
    """(H, W, 2) position in the distorted image (actual size) of each pixel centre of the pinhole ``cam``."""
    x, y = pinhole_pixel_grid(cam.width, cam.height, cam.fx, cam.fy, cam.cx, cam.cy)
    u, v = dist.to_pixels(x, y)
    # the lens model's pixels refer to its declared size; the image may have been stored at another size
    return np.stack([np.asarray(u) * (cam.width / dist.width), np.asarray(v) * (cam.height / dist.height)], -1)
