"""Camera paths written as ``transforms.json`` (instant-ngp layout), e.g. for ``rigel-render``."""
from __future__ import annotations

import json
import math
import os
from pathlib import Path

import numpy as np

from ..camera import Camera

__all__ = ["orbit_cameras", "orbit_transforms", "cameras_to_transforms"]


def orbit_cameras(center, radius: float, n: int, width: int, height: int, fov_deg: float, up=(0.0, 0.0, 1.0), *,
                  elevation_deg: float = 20.0, start_deg: float = 0.0) -> list[Camera]:
    """``n`` cameras on a circle around ``center``, looking at it.

    The circle lies at ``elevation_deg`` above the plane perpendicular to ``up`` through ``center``, at distance
    ``radius`` from it; azimuths ``start_deg + 360°·i/n``. ``fov_deg`` is the horizontal field of view; pixels
    are square; ``up`` points up in every image. Camera names are ``orbit_000``, ``orbit_001``, …
    Raises ValueError for n < 1, radius ≤ 0, or a zero ``up``.
    """
    if n < 1 or not radius > 0:
        raise ValueError(f"orbit needs n >= 1 and radius > 0, got n={n}, radius={radius}")
    c = np.asarray(center, dtype=np.float64).reshape(3)
    u = np.asarray(up, dtype=np.float64).reshape(3)
    if np.linalg.norm(u) == 0:
        raise ValueError("up must be a non-zero vector")
    u = u / np.linalg.norm(u)
    a = np.array([1.0, 0.0, 0.0]) if abs(u[0]) < 0.9 else np.array([0.0, 1.0, 0.0])
    e1 = np.cross(u, a)
    e1 /= np.linalg.norm(e1)
    e2 = np.cross(u, e1)
    el = math.radians(elevation_deg)
    cams = []
    for i in range(n):
        az = math.radians(start_deg) + 2.0 * math.pi * i / n
        d = math.cos(el) * (math.cos(az) * e1 + math.sin(az) * e2) + math.sin(el) * u
        cams.append(Camera.look_at(c + radius * d, c, u, width=width, height=height, fov_x_deg=fov_deg,
                                   name=f"orbit_{i:03d}"))
    return cams


def cameras_to_transforms(cameras: list[Camera]) -> dict:
    """An instant-ngp ``transforms.json`` dict for ``cameras``: shared intrinsics from the first camera
    (``w h fl_x fl_y cx cy camera_angle_x``), per-frame overrides where a camera differs, and
    ``transform_matrix`` = camera-to-world in OpenGL axes. ``file_path`` is the camera name (no image needed)."""
    if not cameras:
        raise ValueError("no cameras")
    c0 = cameras[0]
    intr = lambda c: {"w": c.width, "h": c.height, "fl_x": c.fx, "fl_y": c.fy, "cx": c.cx, "cy": c.cy}
    shared = intr(c0)
    meta = {"camera_angle_x": c0.fov_x, **shared, "frames": []}
    for i, cam in enumerate(cameras):
        c2w = cam.c2w.copy()
        c2w[:3, 1:3] *= -1.0  # OpenCV → OpenGL camera axes
        frame = {"file_path": cam.name or f"frame_{i:05d}", "transform_matrix": c2w.tolist()}
        frame.update({k: v for k, v in intr(cam).items() if v != shared[k]})
        meta["frames"].append(frame)
    return meta


def orbit_transforms(center, radius: float, n: int, width: int, height: int, fov_deg: float, up=(0.0, 0.0, 1.0),
                     *, out=None, elevation_deg: float = 20.0, start_deg: float = 0.0) -> dict:
    """A ``transforms.json`` (instant-ngp layout, readable by ``rigel-render`` and :func:`load_dataset`'s
    parser) circling ``center``: see :func:`orbit_cameras` for the geometry. Writes it to ``out`` when given
    (atomically), and returns the dict."""
    meta = cameras_to_transforms(orbit_cameras(center, radius, n, width, height, fov_deg, up,
                                               elevation_deg=elevation_deg, start_deg=start_deg))
    if out is not None:
        out = Path(out)
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = out.with_name(f".{out.name}.tmp{os.getpid()}")
        tmp.write_text(json.dumps(meta, indent=2))
        os.replace(tmp, out)
    return meta
