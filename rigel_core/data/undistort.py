"""Lens-distortion removal at load time, so every camera the rest of rigel sees is an ideal pinhole.

Method: for each pixel centre of the *undistorted* output image (same size and same ``fx fy cx cy`` as the
distorted camera), back-project through the pinhole model to normalised coordinates ``(x, y)``, push them
through the *forward* distortion model to a position in the distorted input, and sample the input there
with bilinear interpolation. Only the forward model is needed, so no iterative inversion is involved and the
mapping is exact up to the interpolation. Output pixels whose source falls outside the input are black.

Pixel convention (DESIGN §3, COLMAP, OpenCV-with-half-pixel): pixel (col, row) covers the unit square whose
centre is (col + 0.5, row + 0.5), so a continuous position (u, v) is array index (v − 0.5, u − 0.5).
"""
from __future__ import annotations

import numpy as np

__all__ = ["opencv_distort", "pinhole_pixel_grid", "opencv_source_coords", "remap_bilinear",
           "undistort_opencv", "OPENCV_KEYS"]

#: instant-ngp / nerfstudio / OpenCV distortion coefficient names (radial k1..k3, tangential p1, p2).
OPENCV_KEYS = ("k1", "k2", "p1", "p2", "k3")


def opencv_distort(x: np.ndarray, y: np.ndarray, k1=0.0, k2=0.0, p1=0.0, p2=0.0, k3=0.0):
    """OpenCV's (Brown–Conrady) forward distortion of normalised image coordinates.

    ``r² = x² + y²``, ``radial = 1 + k1 r² + k2 r⁴ + k3 r⁶``,
    ``x_d = x·radial + 2 p1 x y + p2 (r² + 2x²)``, ``y_d = y·radial + p1 (r² + 2y²) + 2 p2 x y``
    (OpenCV "Camera Calibration and 3D Reconstruction", ``cv::projectPoints``; COLMAP's OPENCV model when
    k3 = 0, its FULL_OPENCV with k4..k6 = 0). Arrays of any matching shape, float64 recommended.
    """
    r2 = x * x + y * y
    radial = 1.0 + r2 * (k1 + r2 * (k2 + r2 * k3))
    xd = x * radial + 2.0 * p1 * x * y + p2 * (r2 + 2.0 * x * x)
    yd = y * radial + p1 * (r2 + 2.0 * y * y) + 2.0 * p2 * x * y
    return xd, yd


def pinhole_pixel_grid(width: int, height: int, fx: float, fy: float, cx: float, cy: float):
    """Normalised coordinates (x, y), each (H, W) float64, of every pixel centre of a pinhole camera."""
    u = np.arange(width, dtype=np.float64) + 0.5
    v = np.arange(height, dtype=np.float64) + 0.5
    uu, vv = np.meshgrid(u, v)
    return (uu - cx) / fx, (vv - cy) / fy


def opencv_source_coords(width: int, height: int, fx: float, fy: float, cx: float, cy: float,
                         dist: dict) -> np.ndarray:
    """(H, W, 2) float64 position (u, v) in the distorted image of each undistorted pixel centre.

    ``dist`` maps names of :data:`OPENCV_KEYS` to coefficients (missing ones are 0).
    """
    x, y = pinhole_pixel_grid(width, height, fx, fy, cx, cy)
    xd, yd = opencv_distort(x, y, **{k: float(dist.get(k, 0.0)) for k in OPENCV_KEYS})
    return np.stack([fx * xd + cx, fy * yd + cy], axis=-1)


def remap_bilinear(img: np.ndarray, coords: np.ndarray) -> np.ndarray:
    """Sample ``img`` (H_in, W_in[, C]) at continuous pixel positions ``coords`` (H, W, 2) as (u, v).

    Bilinear interpolation between pixel centres (scipy.ndimage.map_coordinates, order 1); positions within
    half a pixel outside the border take the border value; farther ones give 0. Returns (H, W[, C]) float32.
    """
    from scipy.ndimage import map_coordinates

    h_in, w_in = img.shape[:2]
    u, v = coords[..., 0], coords[..., 1]
    inside = (u >= 0.0) & (u <= w_in) & (v >= 0.0) & (v <= h_in)
    rc = np.stack([v - 0.5, u - 0.5])
    chans = img[..., None] if img.ndim == 2 else img
    out = np.stack([map_coordinates(chans[..., c].astype(np.float64, copy=False), rc, order=1, mode="nearest")
                    for c in range(chans.shape[-1])], axis=-1)
    out[~inside] = 0.0
    out = out.astype(np.float32)
    return out[..., 0] if img.ndim == 2 else out


def undistort_opencv(img: np.ndarray, fx: float, fy: float, cx: float, cy: float, dist: dict) -> np.ndarray:
    """Remove OpenCV distortion from ``img`` (H, W[, C]) taken by a camera with intrinsics ``fx fy cx cy``.

    The result has the same size and is what a pinhole camera with the same ``fx fy cx cy`` would see.
    """
    h, w = img.shape[:2]
    return remap_bilinear(img, opencv_source_coords(w, h, fx, fy, cx, cy, dist))
