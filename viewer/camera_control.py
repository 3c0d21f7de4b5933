"""Orbit / pan / zoom camera for the viewer, producing ``rigel_core.Camera`` objects (OpenCV axes, DESIGN §3).

The camera orbits ``target`` at ``distance``; ``yaw`` turns about the world ``up`` axis, ``pitch`` raises the eye
above the plane perpendicular to it (clamped short of the poles so ``Camera.look_at`` never sees up ∥ forward).
:meth:`OrbitCamera.frame` places a bounding sphere (centre, radius) inside the narrower field of view;
:meth:`OrbitCamera.frame_box` fits an axis-aligned box tightly from the current direction.
``version`` increases on every change, so the UI re-renders only when the view moved.
"""
from __future__ import annotations

import math

import numpy as np

__all__ = ["OrbitCamera", "UP_AXES"]

UP_AXES = {"+z": (0.0, 0.0, 1.0), "-z": (0.0, 0.0, -1.0), "+y": (0.0, 1.0, 0.0), "-y": (0.0, -1.0, 0.0),
           "+x": (1.0, 0.0, 0.0), "-x": (-1.0, 0.0, 0.0)}

_MAX_PITCH = math.radians(89.0)


def _basis(up):
    """Two unit vectors (a, b) spanning the plane perpendicular to ``up`` (right-handed with it)."""
    u = np.asarray(up, dtype=np.float64)
    u = u / np.linalg.norm(u)
    helper = np.array([1.0, 0.0, 0.0]) if abs(u[0]) < 0.9 else np.array([0.0, 1.0, 0.0])
    a = np.cross(helper, u)
    a /= np.linalg.norm(a)
    b = np.cross(u, a)
    return a, b, u


class OrbitCamera:
    """Orbit camera state. Angles in radians, lengths in world units, ``fov_deg`` the horizontal field of view.

    Args:
        up: world up axis, a 3-vector or a key of :data:`UP_AXES` ("+z", "-y", …).
    """

    def __init__(self, target=(0.0, 0.0, 0.0), distance: float = 3.0, *, yaw: float = math.radians(-60.0),
                 pitch: float = math.radians(20.0), up="+z", fov_deg: float = 50.0):
        self.target = np.asarray(target, dtype=np.float64).reshape(3).copy()
        self.distance = float(distance)
        self.yaw = float(yaw)
        self.pitch = float(pitch)
        self.fov_deg = float(fov_deg)
        self.up_name = up if isinstance(up, str) else "custom"
        self.up = np.asarray(UP_AXES[up] if isinstance(up, str) else up, dtype=np.float64)
        self.version = 0
        self._home = None

    # ---- geometry ----------------------------------------------------------------------------------------
    @property
    def eye(self) -> np.ndarray:
        a, b, u = _basis(self.up)
        d = math.cos(self.pitch) * (math.cos(self.yaw) * a + math.sin(self.yaw) * b) + math.sin(self.pitch) * u
        return self.target + self.distance * d

    def camera(self, width: int, height: int, name: str = ""):
        """A ``rigel_core.Camera`` of ``width × height`` pixels for the current view."""
        from rigel_core import Camera

        return Camera.look_at(self.eye, self.target, self.up, width=max(int(width), 1), height=max(int(height), 1),
                              fov_x_deg=self.fov_deg, name=name)

    def _touch(self):
        self.version += 1

    # ---- framing -----------------------------------------------------------------------------------------
    def frame(self, center, radius: float, aspect: float = 16 / 9):
        """Look at ``center`` from far enough that a sphere of ``radius`` fits the narrower field of view
        (``aspect`` = width / height); remembered as the home view for :meth:`reset`."""
        radius = max(float(radius), 1e-6)
        half_x = math.radians(self.fov_deg) / 2
        half_y = math.atan(math.tan(half_x) / max(aspect, 1e-6))
        half = min(half_x, half_y)
        self.target = np.asarray(center, dtype=np.float64).reshape(3).copy()
        self.distance = 1.05 * radius / math.sin(half)
        self._home = (self.target.copy(), self.distance, self.yaw, self.pitch)
        self._touch()

    def frame_box(self, lo, hi, aspect: float = 16 / 9, margin: float = 0.9):
        """Look at the centre of the box [lo, hi] from the current direction, from the distance at which its
        eight corners fill ``margin`` of the narrower image half-extent (``aspect`` = width / height); the home
        view for :meth:`reset`.

        Closed form: a corner at (x, y) across and z0 along the viewing direction from the target is at depth
        z0 + d, and stays inside when |x| ≤ t_x (z0 + d) and |y| ≤ t_y (z0 + d) with t = margin·tan(half-FOV)
        (pinhole with square pixels: tan(half_y) = tan(half_x) / aspect), so d = max over corners of
        max(|x| / t_x, |y| / t_y) − z0.
        """
        lo, hi = (np.asarray(v, dtype=np.float64).reshape(3) for v in (lo, hi))
        self.target = 0.5 * (lo + hi)
        corners = np.array([[(lo, hi)[i >> k & 1][k] for k in range(3)] for i in range(8)])
        self.distance = 1.0
        R = self.camera(64, 64).viewmat[:3, :3]  # rows: right, down, forward (world → camera)
        rel = (corners - self.target) @ R.T
        tx = margin * math.tan(math.radians(self.fov_deg) / 2)
        ty = tx / max(aspect, 1e-6)
        d = np.max(np.maximum(np.abs(rel[:, 0]) / tx, np.abs(rel[:, 1]) / ty) - rel[:, 2])
        self.distance = max(float(d), 1e-6, float(np.linalg.norm(hi - lo)) * 1e-3)
        self._home = (self.target.copy(), self.distance, self.yaw, self.pitch)
        self._touch()

    def reset(self):
        if self._home is not None:
            t, self.distance, self.yaw, self.pitch = self._home
            self.target = t.copy()
            self._touch()

    def set_up(self, name: str):
        if name != self.up_name and name in UP_AXES:
            self.up_name = name
            self.up = np.asarray(UP_AXES[name], dtype=np.float64)
            self._touch()

    # ---- interaction (pixel deltas of the window) ---------------------------------------------------------
    def orbit(self, dx: float, dy: float, speed: float = 0.005):
        self.yaw -= dx * speed
        self.pitch = min(max(self.pitch + dy * speed, -_MAX_PITCH), _MAX_PITCH)
        self._touch()

    def pan(self, dx: float, dy: float, viewport_w: int):
        """Move the target with the image: a drag of ``dx, dy`` pixels moves the scene by as much on screen."""
        cam = self.camera(max(viewport_w, 1), max(viewport_w, 1))
        R_c2w = cam.viewmat[:3, :3].T
        right, down = R_c2w[:, 0], R_c2w[:, 1]
        world_per_px = 2.0 * self.distance * math.tan(math.radians(self.fov_deg) / 2) / max(viewport_w, 1)
        self.target = self.target - (dx * right + dy * down) * world_per_px
        self._touch()

    def zoom(self, steps: float):
        """Scroll ``steps`` (positive = closer); each step is 10 %."""
        self.distance = max(self.distance * (0.9 ** steps), 1e-6)
        self._touch()
