"""Lens-distortion removal at load time, so every camera the rest of rigel sees is an ideal pinhole, and the
validity mask of the result.

Method: for each pixel centre of the *undistorted* output image (same size and same ``fx fy cx cy`` as the
distorted camera), back-project through the pinhole model to normalised coordinates ``(x, y)``, push them
through the *forward* lens model to a position in the distorted input, and sample the input there
(``cv2.remap``, bilinear). Only the forward model is needed, so no iterative inversion is involved and the
mapping is exact up to the interpolation.

Validity: an output pixel is valid when (a) its source position lies inside the photo by at least half a pixel
(so bilinear interpolation reads only real pixels, never a border extension) and (b) its ray lies inside the
lens model's *fold-free* field: the radial profile ``r ↦ r_d`` of a polynomial model stops increasing at some
radius (e.g. k1 < 0), beyond which the forward model maps rays back onto the photo a second time; those
pixels would receive wrong content and are invalid. Invalid pixels are set to 0 and flagged in the mask; the
trainer ignores them (:class:`rigel_core.data.Frame` ``mask``).

Pixel conventions: ours (DESIGN §3, COLMAP) puts pixel (col, row)'s centre at continuous position
(col + 0.5, row + 0.5); OpenCV's ``remap`` puts it at (col, row). A position (u, v) in ours is therefore
(u − 0.5, v − 0.5) in OpenCV's, which is what the maps hold.

Lens models (formulas re-derived from the OpenCV and COLMAP documentation):

- ``opencv`` (Brown–Conrady with OpenCV's rational radial term; COLMAP SIMPLE_RADIAL, RADIAL, OPENCV,
  FULL_OPENCV; instant-ngp / nerfstudio ``k1 k2 p1 p2 k3``): see :func:`opencv_distort`.
- ``fisheye`` (equidistant with polynomial θ; OpenCV's ``cv::fisheye``, COLMAP OPENCV_FISHEYE,
  SIMPLE_RADIAL_FISHEYE, RADIAL_FISHEYE; nerfstudio ``camera_model: OPENCV_FISHEYE``): see
  :func:`fisheye_distort`. The output is still a pinhole of the same ``fx fy cx cy``, so it shows the central
  part of the fisheye's field (a pinhole cannot hold 180°); the rest of the photo is not used.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import numpy as np

from ..deps import require

__all__ = ["opencv_distort", "fisheye_distort", "pinhole_pixel_grid", "opencv_source_coords", "remap_bilinear",
           "undistort_opencv", "OPENCV_KEYS", "FISHEYE_KEYS", "Distortion", "opencv_lens", "fisheye_lens",
           "fold_radius", "undistort_map", "remap", "mask_all", "remap_mask"]

#: instant-ngp / nerfstudio / OpenCV distortion coefficient names (radial k1..k3, tangential p1, p2).
OPENCV_KEYS = ("k1", "k2", "p1", "p2", "k3")
#: nerfstudio / OpenCV fisheye coefficient names.
FISHEYE_KEYS = ("k1", "k2", "k3", "k4")


def opencv_distort(x: np.ndarray, y: np.ndarray, k1=0.0, k2=0.0, p1=0.0, p2=0.0, k3=0.0, k4=0.0, k5=0.0, k6=0.0):
    """OpenCV's (Brown–Conrady) forward distortion of normalised image coordinates.

    ``r² = x² + y²``, ``radial = (1 + k1 r² + k2 r⁴ + k3 r⁶) / (1 + k4 r² + k5 r⁴ + k6 r⁶)``,
    ``x_d = x·radial + 2 p1 x y + p2 (r² + 2x²)``, ``y_d = y·radial + p1 (r² + 2y²) + 2 p2 x y``
    (OpenCV "Camera Calibration and 3D Reconstruction", ``cv::projectPoints``; COLMAP's FULL_OPENCV; OPENCV is
    k3..k6 = 0, RADIAL p1 = p2 = 0 too, SIMPLE_RADIAL k2 = 0 too). Arrays of any matching shape, float64
    recommended.
    """
    r2 = x * x + y * y
    radial = 1.0 + r2 * (k1 + r2 * (k2 + r2 * k3))
    if k4 or k5 or k6:
        radial = radial / (1.0 + r2 * (k4 + r2 * (k5 + r2 * k6)))
    xd = x * radial + 2.0 * p1 * x * y + p2 * (r2 + 2.0 * x * x)
    yd = y * radial + p1 * (r2 + 2.0 * y * y) + 2.0 * p2 * x * y
    return xd, yd


def _fisheye_theta_d(theta, k1, k2, k3, k4):
    t2 = theta * theta
    return theta * (1.0 + t2 * (k1 + t2 * (k2 + t2 * (k3 + t2 * k4))))


def fisheye_distort(x: np.ndarray, y: np.ndarray, k1=0.0, k2=0.0, k3=0.0, k4=0.0):
    """OpenCV / COLMAP OPENCV_FISHEYE forward model of normalised pinhole coordinates (x, y) = (X/Z, Y/Z).

    ``r = √(x² + y²)``, ``θ = atan(r)``, ``θ_d = θ (1 + k1 θ² + k2 θ⁴ + k3 θ⁶ + k4 θ⁸)``,
    ``(x_d, y_d) = (θ_d / r)·(x, y)`` (→ (x, y) as r → 0) (OpenCV ``cv::fisheye`` module documentation,
    COLMAP ``OpenCVFisheyeCameraModel``). Pixel = ``(fx x_d + cx, fy y_d + cy)``.
    """
    r = np.sqrt(x * x + y * y)
    theta = np.arctan(r)
    with np.errstate(invalid="ignore", divide="ignore"):
        s = np.where(r > 1e-12, _fisheye_theta_d(theta, k1, k2, k3, k4) / np.where(r > 1e-12, r, 1.0), 1.0)
    return x * s, y * s


@dataclass
class Distortion:
    """A lens model to remove at load.

    Attributes:
        key: hashable, equal for equal models (caches the per-pixel map).
        to_pixels: ``(x, y) -> (u, v)``: normalised pinhole coordinates (float64 arrays) to pixel positions in
            the distorted image of size ``width × height`` (the size its intrinsics refer to; pixel centres at
            +0.5).
        width, height: that size.
        profile: ``r -> r_d`` (float64 array → array): the lens's radial map along a ray at pinhole radius
            ``r = √(x² + y²)``, in any unit; used only to find where it stops increasing
            (:func:`fold_radius`). None: never folds.
    """

    key: tuple
    to_pixels: Callable
    width: int
    height: int
    profile: Callable | None = None


def opencv_lens(coeffs: dict, fx, fy, cx, cy, width, height) -> Distortion:
    """:class:`Distortion` of an OpenCV-model camera; ``coeffs`` maps ``k1 k2 p1 p2 k3 [k4 k5 k6]`` (missing = 0)."""
    c = {k: float(coeffs.get(k, 0.0) or 0.0) for k in ("k1", "k2", "p1", "p2", "k3", "k4", "k5", "k6")}
    fx, fy, cx, cy = float(fx), float(fy), float(cx), float(cy)

    def to_pixels(x, y):
        xd, yd = opencv_distort(x, y, **c)
        return fx * xd + cx, fy * yd + cy

    def profile(r):
        r2 = r * r
        num = 1.0 + r2 * (c["k1"] + r2 * (c["k2"] + r2 * c["k3"]))
        den = 1.0 + r2 * (c["k4"] + r2 * (c["k5"] + r2 * c["k6"]))
        with np.errstate(divide="ignore", invalid="ignore"):
            return np.where(den > 0, r * num / np.where(den > 0, den, 1.0), np.nan)

    return Distortion(("opencv", tuple(c.values()), fx, fy, cx, cy, int(width), int(height)), to_pixels,
                      int(width), int(height), profile)


def fisheye_lens(coeffs: dict, fx, fy, cx, cy, width, height) -> Distortion:
    """:class:`Distortion` of an OpenCV-fisheye camera; ``coeffs`` maps ``k1 k2 k3 k4`` (missing = 0)."""
    c = {k: float(coeffs.get(k, 0.0) or 0.0) for k in FISHEYE_KEYS}
    fx, fy, cx, cy = float(fx), float(fy), float(cx), float(cy)

    def to_pixels(x, y):
        xd, yd = fisheye_distort(x, y, **c)
        return fx * xd + cx, fy * yd + cy

    return Distortion(("fisheye", tuple(c.values()), fx, fy, cx, cy, int(width), int(height)), to_pixels,
                      int(width), int(height), lambda r: _fisheye_theta_d(np.arctan(r), **c))


def fold_radius(profile: Callable | None, r_max: float, samples: int = 20001) -> float:
    """Pinhole radius (normalised) up to which ``profile`` is strictly increasing, searched on [0, r_max].

    Returns ``inf`` when it increases over the whole range (or ``profile`` is None). The radius returned is
    the last sample before the first non-increasing step (a step of ``r_max / (samples − 1)``), so rays
    beyond it are treated as folded.
    """
    if profile is None or not r_max > 0:
        return math.inf
    r = np.linspace(0.0, float(r_max), int(samples))
    g = np.asarray(profile(r), dtype=np.float64)
    bad = ~(np.diff(g) > 0) | ~np.isfinite(g[1:])
    if not bad.any():
        return math.inf
    return float(r[int(np.argmax(bad))])


def pinhole_pixel_grid(width: int, height: int, fx: float, fy: float, cx: float, cy: float):
    """Normalised coordinates (x, y), each (H, W) float64, of every pixel centre of a pinhole camera."""
    u = np.arange(width, dtype=np.float64) + 0.5
    v = np.arange(height, dtype=np.float64) + 0.5
    uu, vv = np.meshgrid(u, v)
    return (uu - cx) / fx, (vv - cy) / fy


def undistort_map(width: int, height: int, fx: float, fy: float, cx: float, cy: float, dist: Distortion,
                  src_size: tuple[int, int] | None = None):
    """The resampling map of a pinhole output ``width × height`` (intrinsics ``fx fy cx cy``) from a photo.

    Args:
        dist: the photo's lens; its pixel positions refer to ``dist.width × dist.height``.
        src_size: (width, height) of the photo as stored (default: the lens's size); positions are scaled to it.
    Returns:
        ``(map_x, map_y, valid)``: (H, W) float32 source positions in OpenCV's pixel convention (pixel centres at
        integers; what ``cv2.remap`` takes) and (H, W) bool: the source lies at least half a pixel inside the
        photo (every bilinear tap is a real pixel) and the ray is inside the lens's fold-free field.
    """
    sw, sh = src_size if src_size is not None else (dist.width, dist.height)
    x, y = pinhole_pixel_grid(width, height, fx, fy, cx, cy)
    with np.errstate(all="ignore"):
        u, v = dist.to_pixels(x, y)
        u = np.asarray(u, dtype=np.float64) * (sw / dist.width)
        v = np.asarray(v, dtype=np.float64) * (sh / dist.height)
        r = np.sqrt(x * x + y * y)
        valid = (np.isfinite(u) & np.isfinite(v) & (u >= 0.5) & (u <= sw - 0.5) & (v >= 0.5) & (v <= sh - 0.5)
                 & (r <= fold_radius(dist.profile, float(r.max()) * 1.001)))
    map_x = np.where(valid, u - 0.5, 0.0).astype(np.float32)
    map_y = np.where(valid, v - 0.5, 0.0).astype(np.float32)
    return map_x, map_y, valid


def require_opencv():
    """The ``cv2`` module; MissingPackage (an ImportError naming ``opencv-python-headless``) without it. Asked by
    :func:`remap` and, for a capture with a lens, when the dataset is assembled: a streamed dataset decodes its
    images later, and the refusal must come before a run starts (tests/test_packaging.py)."""
    return require("cv2", package="opencv-python-headless",
                   purpose="undistorting the images of a capture with lens distortion")


def remap(img: np.ndarray, map_x: np.ndarray, map_y: np.ndarray, valid: np.ndarray | None = None) -> np.ndarray:
    """Sample ``img`` (H_in, W_in[, C]) float32 bilinearly at the OpenCV-convention positions of the maps.

    ``cv2.remap`` with INTER_LINEAR and a replicated border (only reached by invalid pixels); pixels where
    ``valid`` is False are set to 0. Measured against scipy's ``map_coordinates`` (order 1) on a 1080×1920
    float32 image: equal to 6e-8, 6.5× faster (0.07 s vs 0.45 s for three channels).
    Returns (H, W[, C]) float32. Raises MissingPackage (an ImportError) when OpenCV is not installed.
    """
    cv2 = require_opencv()

    src = np.ascontiguousarray(img, dtype=np.float32)
    chans = src.shape[-1] if src.ndim == 3 else 1
    if chans > 4:  # cv2.remap handles up to 4 channels
        return np.concatenate([remap(src[..., i:i + 4], map_x, map_y, valid) for i in range(0, chans, 4)], -1)
    out = cv2.remap(src, map_x, map_y, interpolation=cv2.INTER_LINEAR, borderMode=cv2.BORDER_REPLICATE)
    if src.ndim == 3 and out.ndim == 2:  # a 1-channel (H, W, 1) input comes back (H, W)
        out = out[..., None]
    if valid is not None:
        out[~valid] = 0.0
    return out


def remap_mask(keep: np.ndarray, map_x: np.ndarray, map_y: np.ndarray, valid: np.ndarray) -> np.ndarray:
    """Resample a bool mask (H_in, W_in) of the photo like the image: an output pixel is kept only when every photo
    pixel that its bilinear interpolation reads with a non-zero weight is kept (the *ignored* mask, resampled
    with the same maps, is exactly 0 there) and it is ``valid``. Returns (H, W) bool."""
    return (remap((~keep).astype(np.float32), map_x, map_y, valid) == 0.0) & valid


def mask_all(mask: np.ndarray | None) -> np.ndarray | None:
    """None for a mask that keeps every pixel (the cheap representation), else the bool mask."""
    return None if mask is None or bool(mask.all()) else mask


def opencv_source_coords(width: int, height: int, fx: float, fy: float, cx: float, cy: float,
                         dist: dict) -> np.ndarray:
    """(H, W, 2) float64 position (u, v) (pixel centres at +0.5) in the distorted image of each undistorted
    pixel centre. ``dist`` maps names of :data:`OPENCV_KEYS` to coefficients (missing ones are 0)."""
    x, y = pinhole_pixel_grid(width, height, fx, fy, cx, cy)
    xd, yd = opencv_distort(x, y, **{k: float(dist.get(k, 0.0)) for k in OPENCV_KEYS})
    return np.stack([fx * xd + cx, fy * yd + cy], axis=-1)


def remap_bilinear(img: np.ndarray, coords: np.ndarray) -> np.ndarray:
    """Sample ``img`` (H_in, W_in[, C]) at continuous pixel positions ``coords`` (H, W, 2) as (u, v) (pixel
    centres at +0.5), bilinearly (:func:`remap`). Positions within half a pixel outside the border take the
    border value; farther ones give 0. Returns (H, W[, C]) float32."""
    h_in, w_in = img.shape[:2]
    u, v = coords[..., 0], coords[..., 1]
    inside = (u >= 0.0) & (u <= w_in) & (v >= 0.0) & (v <= h_in)
    return remap(img, (u - 0.5).astype(np.float32), (v - 0.5).astype(np.float32), inside)


def undistort_opencv(img: np.ndarray, fx: float, fy: float, cx: float, cy: float, dist: dict,
                     return_mask: bool = False):
    """Remove OpenCV distortion from ``img`` (H, W[, C]) taken by a camera with intrinsics ``fx fy cx cy``.

    The result has the same size and is what a pinhole camera with the same ``fx fy cx cy`` would see; invalid
    pixels (see the module docstring) are 0. With ``return_mask``, returns ``(image, valid (H, W) bool)``.
    """
    h, w = img.shape[:2]
    mx, my, valid = undistort_map(w, h, fx, fy, cx, cy, opencv_lens(dist, fx, fy, cx, cy, w, h))
    out = remap(img, mx, my, valid)
    return (out, valid) if return_mask else out
