"""Orbit / pan / zoom / fly camera for the viewer, producing ``rigel_core.Camera`` objects (OpenCV axes,
DESIGN §3). Pure numpy: everything here is tested without a window.

The camera orbits ``target`` at ``distance``; ``yaw`` turns about the world ``up`` axis, ``pitch`` raises the eye
above the plane perpendicular to it (clamped short of the poles so ``Camera.look_at`` never sees up ∥ forward).
:meth:`OrbitCamera.frame` places a bounding sphere (centre, radius) inside the narrower field of view;
:meth:`OrbitCamera.frame_box` fits an axis-aligned box tightly from the current direction.

Fly mode uses the same state: :meth:`OrbitCamera.look` turns the view about the *eye* (the target moves),
:meth:`OrbitCamera.fly` translates eye and target together by ``speed × dt`` (world units per second × seconds,
so the motion does not depend on the frame rate; Shift ×10, Ctrl ×0.1).

:meth:`OrbitCamera.snap_to` adopts a dataset camera (its pose *and* intrinsics: the viewer then renders exactly
that view until the camera moves); :func:`nearest_camera` picks the training camera closest to the current eye;
:func:`up_from_cameras` guesses a dataset's up axis from its cameras, :func:`mean_up` gives their mean up
direction (any vector: captures are often neither z-up nor y-up), and :meth:`OrbitCamera.frame_with_cameras`
(``rigel-viewer SCENE --cameras DATASET``) frames the cameras and the scene together about that up direction.
:func:`region_offset` is the principal-point shift that centres the orbit target in the free part of the image.
``version`` increases on every change, so the UI re-renders only when the view moved.
"""
from __future__ import annotations

import math

import numpy as np

__all__ = ["OrbitCamera", "framing_box", "UP_AXES", "nearest_camera", "focus_of_cameras", "up_from_cameras", "mean_up",
           "region_offset", "FLY_FAST", "FLY_SLOW", "MAX_FLY_DT"]

UP_AXES = {"+z": (0.0, 0.0, 1.0), "-z": (0.0, 0.0, -1.0), "+y": (0.0, 1.0, 0.0), "-y": (0.0, -1.0, 0.0),
           "+x": (1.0, 0.0, 0.0), "-x": (-1.0, 0.0, 0.0)}

_MAX_PITCH = math.radians(89.0)
#: speed factors of the fly mode's modifiers (Shift, Ctrl)
FLY_FAST, FLY_SLOW = 10.0, 0.1
#: longest time step one :meth:`OrbitCamera.fly` call moves by (s): a frame that stalled (a window drag, a long
#: CPU render) does not throw the camera across the scene
MAX_FLY_DT = 1.0


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
        #: fly speed in world units per second (set from the scene size by :meth:`frame` / :meth:`frame_box`)
        self.fly_speed = 1.0
        #: a dataset camera being shown exactly (pose and intrinsics), or None; any move clears it
        self.snapped = None
        #: principal point shift as a fraction of the image width: the orbit target is drawn at
        #: (0.5 + view_offset)·width, e.g. centred in the part of a window that a side panel leaves free, while
        #: orbiting still turns about the target (set by :meth:`frame_box`)
        self.view_offset = 0.0
        self.version = 0
        self._home = None

    # ---- geometry ----------------------------------------------------------------------------------------
    @property
    def eye(self) -> np.ndarray:
        a, b, u = _basis(self.up)
        d = math.cos(self.pitch) * (math.cos(self.yaw) * a + math.sin(self.yaw) * b) + math.sin(self.pitch) * u
        return self.target + self.distance * d

    @property
    def forward(self) -> np.ndarray:
        """(3,) unit viewing direction (eye → target)."""
        d = self.target - self.eye
        return d / max(np.linalg.norm(d), 1e-300)

    def rotation(self) -> np.ndarray:
        """(3, 3) world → camera rotation of the orbit view, rows right, down, forward (OpenCV axes): the
        rotation of :meth:`camera` (``Camera.look_at``'s), in numpy, so that framing needs no torch (the
        viewer's loading frame, viewer/loading.py)."""
        z = self.forward
        x = np.cross(z, self.up)
        x /= max(np.linalg.norm(x), 1e-300)
        return np.stack([x, np.cross(z, x), z])

    def camera(self, width: int, height: int, name: str = "", *, offset: float | None = None):
        """A ``rigel_core.Camera`` of ``width × height`` pixels for the current view (the snapped dataset
        camera resized to that size when :attr:`snapped` is set). ``offset`` overrides :attr:`view_offset`."""
        from dataclasses import replace

        from rigel_core import Camera

        width, height = max(int(width), 1), max(int(height), 1)
        if self.snapped is not None:
            return self.snapped.with_size(width, height)
        cam = Camera.look_at(self.eye, self.target, self.up, width=width, height=height, fov_x_deg=self.fov_deg,
                             name=name)
        off = self.view_offset if offset is None else offset
        return replace(cam, cx=cam.cx + off * width) if off else cam

    def _touch(self):
        self.snapped = None
        self.version += 1

    def set_yaw(self, yaw: float) -> None:
        """Turn about the up axis to ``yaw`` radians (an orbit's frames)."""
        self.yaw = float(yaw)
        self._touch()

    def _set_direction(self, d):
        """yaw and pitch from the unit vector ``d`` pointing from the target to the eye."""
        a, b, u = _basis(self.up)
        d = np.asarray(d, dtype=np.float64)
        d = d / max(np.linalg.norm(d), 1e-300)
        self.pitch = min(max(math.asin(min(max(float(d @ u), -1.0), 1.0)), -_MAX_PITCH), _MAX_PITCH)
        self.yaw = math.atan2(float(d @ b), float(d @ a))

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
        self.fly_speed = radius
        self.view_offset = 0.0
        self._home = (self.target.copy(), self.distance, self.yaw, self.pitch, self.fov_deg, self.view_offset)
        self._touch()

    def frame_box(self, lo, hi, aspect: float = 16 / 9, margin: float = 0.9, region=(0.0, 1.0)):
        """Look at the centre of the box [lo, hi] from the current direction, from the distance at which its
        eight corners fill ``margin`` of the narrower half-extent of the image columns ``region`` = (u0, u1)
        (fractions of the width; default the whole image; ``aspect`` = width / height of the whole image),
        the box centred in them (:attr:`view_offset`); the home view for :meth:`reset`. See :meth:`frame_points`.
        """
        lo, hi = (np.asarray(v, dtype=np.float64).reshape(3) for v in (lo, hi))
        corners = np.array([[(lo, hi)[i >> k & 1][k] for k in range(3)] for i in range(8)])
        self.frame_points(corners, aspect, margin, region)

    def frame_points(self, points, aspect: float = 16 / 9, margin: float = 0.9, region=(0.0, 1.0)):
        """Look at the centre of the bounding box of ``points`` (M, 3) from the current direction, from the
        distance at which every point lies within ``margin`` of the narrower half-extent of the image columns
        ``region`` (see :meth:`frame_box`); the home view for :meth:`reset`.

        Closed form: a point at (x, y) across and z0 along the viewing direction from the target is at depth
        z0 + d, and stays inside when |x| ≤ t_x (z0 + d) and |y| ≤ t_y (z0 + d) with t_y = margin·tan(half-FOV_y)
        and t_x = t_y·aspect·(u1 − u0) (pinhole with square pixels, principal point at the region's centre), so
        d = max over points of max(|x| / t_x, |y| / t_y) − z0. The target (the box centre) projects to the
        region's centre column and the image's centre row.
        """
        pts = np.asarray(points, dtype=np.float64).reshape(-1, 3)
        lo, hi = pts.min(0), pts.max(0)
        u0, u1 = (min(max(float(u), 0.0), 1.0) for u in region)
        if u1 - u0 < 1e-3:
            u0, u1 = 0.0, 1.0
        self.snapped = None
        self.view_offset = region_offset((u0, u1))
        self.target = 0.5 * (lo + hi)
        self.distance = 1.0
        R = self.rotation()  # rows: right, down, forward (world → camera)
        rel = (pts - self.target) @ R.T
        t = margin * math.tan(math.radians(self.fov_deg) / 2)
        tx, ty = t * (u1 - u0), t / max(aspect, 1e-6)
        d = np.max(np.maximum(np.abs(rel[:, 0]) / tx, np.abs(rel[:, 1]) / ty) - rel[:, 2])
        self.distance = max(float(d), 1e-6, float(np.linalg.norm(hi - lo)) * 1e-3)
        self.fly_speed = max(0.5 * float(np.linalg.norm(hi - lo)), 1e-6)
        self._home = (self.target.copy(), self.distance, self.yaw, self.pitch, self.fov_deg, self.view_offset)
        self._touch()

    def set_region(self, region) -> bool:
        """Centre the target in the image columns ``region`` = (u0, u1) (:func:`region_offset`) without moving
        the camera: e.g. after the side panel was hidden or shown. Returns whether the view changed (a snapped
        dataset view, which has its own principal point, is left alone)."""
        off = region_offset(region)
        if self.snapped is not None or abs(off - self.view_offset) < 1e-12:
            return False
        self.view_offset = off
        if self._home is not None:
            self._home = self._home[:5] + (off,)
        self.version += 1
        return True

    def frame_with_cameras(self, cameras, points=(), aspect: float = 16 / 9, margin: float = 0.9,
                           region=(0.0, 1.0), pitch_deg: float = 35.0):
        """Home view showing a dataset's cameras and the scene together (``rigel-viewer SCENE --cameras``):
        world up becomes :func:`mean_up` of the cameras (the orbit turns about it); the view looks from the side
        of ``cameras[0]`` (its direction from the centre, projected on the plane perpendicular to up), raised
        ``pitch_deg`` above that plane so that a ring of cameras is seen as a ring; the distance fits the camera
        centres and ``points`` (M, 3) (e.g. the scene's box corners and the frustums' vertices) by
        :meth:`frame_points`. Raises ValueError for an empty camera list."""
        if not cameras:
            raise ValueError("frame_with_cameras: no cameras")
        up = mean_up(cameras)
        self.up = up
        self.up_name = next((k for k, v in UP_AXES.items() if np.allclose(v, up, atol=1e-12)), "custom")
        centres = np.stack([np.asarray(c.campos, dtype=np.float64) for c in cameras])
        pts = np.concatenate([centres, np.asarray(points, dtype=np.float64).reshape(-1, 3)])
        centre = 0.5 * (pts.min(0) + pts.max(0))
        a, b, u = _basis(up)
        d = centres[0] - centre
        if math.hypot(float(d @ a), float(d @ b)) > 1e-12:
            self.yaw = math.atan2(float(d @ b), float(d @ a))
        self.pitch = min(max(math.radians(pitch_deg), -_MAX_PITCH), _MAX_PITCH)
        self.frame_points(pts, aspect, margin, region)

    def reset(self):
        """Back to the view of the last :meth:`frame` / :meth:`frame_box` (the home view)."""
        if self._home is not None:
            t, self.distance, self.yaw, self.pitch, self.fov_deg, self.view_offset = self._home
            self.target = t.copy()
            self._touch()

    def face(self, point):
        """Turn the orbit (keeping the pitch) so that the eye lies on the side of ``point``, seen from the
        target: e.g. a crop of a larger capture is looked at from where the capture's cameras were (near the
        world origin). Nothing changes when ``point`` is on the up axis through the target."""
        a, b, u = _basis(self.up)
        d = np.asarray(point, dtype=np.float64) - self.target
        x, y = float(d @ a), float(d @ b)
        if math.hypot(x, y) > 1e-12:
            self.yaw = math.atan2(y, x)
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

    # ---- fly mode ------------------------------------------------------------------------------------------
    def look(self, dx: float, dy: float, speed: float = 0.003):
        """Mouse look: turn the view about the eye by a drag of ``dx, dy`` pixels (``speed`` radians per pixel;
        dragging right turns right, dragging down looks down). The eye stays where it is."""
        eye = self.eye
        self.yaw -= dx * speed
        self.pitch = min(max(self.pitch + dy * speed, -_MAX_PITCH), _MAX_PITCH)
        # the eye is target + distance·d(yaw, pitch): keep the eye, move the target
        self.target = self.target + (eye - self.eye)
        self._touch()

    def fly(self, dt: float, right: float = 0.0, up: float = 0.0, forward: float = 0.0, *, fast: bool = False,
            slow: bool = False) -> bool:
        """Translate eye and target by ``fly_speed × factor × dt`` along the view's right / world-up / forward
        axes (``right``, ``up``, ``forward`` in [-1, 1], e.g. D − A, E − Q, W − S); factor ×10 with ``fast``
        (Shift), ×0.1 with ``slow`` (Ctrl). ``dt`` (seconds) is clamped to [0, :data:`MAX_FLY_DT`].
        Returns True when the camera moved."""
        dt = min(max(float(dt), 0.0), MAX_FLY_DT)
        if dt == 0.0 or (right == 0 and up == 0 and forward == 0):
            return False
        f = self.forward
        r = np.cross(f, self.up)
        r = r / max(np.linalg.norm(r), 1e-300)
        u = self.up / np.linalg.norm(self.up)
        factor = (FLY_FAST if fast else 1.0) * (FLY_SLOW if slow else 1.0)
        self.target = self.target + self.fly_speed * factor * dt * (right * r + up * u + forward * f)
        self._touch()
        return True

    # ---- dataset cameras -----------------------------------------------------------------------------------
    def frame_cameras(self, cameras, index: int = 0):
        """Home view for a dataset: orbit about :func:`focus_of_cameras` at the cameras' median distance from
        it, with their horizontal field of view, from the direction of ``cameras[index]`` (its roll dropped):
        the first view looks like a training view. Raises ValueError for an empty list."""
        if not cameras:
            raise ValueError("frame_cameras: no cameras")
        focus = focus_of_cameras(cameras)
        centres = np.stack([np.asarray(c.campos, dtype=np.float64) for c in cameras])
        dist = np.linalg.norm(centres - focus, axis=1)
        self.snapped = None
        self.target = focus
        self.distance = max(float(np.median(dist)), 1e-6)
        self.fov_deg = math.degrees(cameras[index].fov_x)
        self._set_direction(centres[index] - focus)
        self.fly_speed = max(0.5 * self.distance, 1e-6)
        self.view_offset = 0.0
        self._home = (self.target.copy(), self.distance, self.yaw, self.pitch, self.fov_deg, self.view_offset)
        self._touch()

    def snap_to(self, cam, pivot=None):
        """Show dataset camera ``cam`` exactly: eye at its centre, looking along its optical axis, with its
        intrinsics (:meth:`camera` returns ``cam`` resized) until the next move. The orbit target is put on
        the optical axis at the depth of ``pivot`` (default: the current target), so that orbiting from there
        turns about the scene. Roll about the optical axis is dropped once the camera moves (the orbit keeps
        world up up)."""
        eye = np.asarray(cam.campos, dtype=np.float64)
        fwd = np.asarray(cam.R[2], dtype=np.float64)          # camera +z in world coordinates
        fwd = fwd / np.linalg.norm(fwd)
        pivot = self.target if pivot is None else np.asarray(pivot, dtype=np.float64)
        depth = float((pivot - eye) @ fwd)
        self.distance = depth if depth > 1e-6 else max(float(np.linalg.norm(pivot - eye)), 1e-3)
        self.target = eye + self.distance * fwd
        self._set_direction(-fwd)
        self.fov_deg = math.degrees(cam.fov_x)
        self.view_offset = 0.0
        self._touch()
        self.snapped = cam


def nearest_camera(cameras, eye, forward=None) -> int:
    """Index of the camera in ``cameras`` (``rigel_core.Camera`` list) whose centre is closest to ``eye``;
    with ``forward`` given, distance ties (within 1e-9 relative) go to the one looking most nearly along it.
    Raises ValueError for an empty list."""
    if not cameras:
        raise ValueError("nearest_camera: no cameras")
    eye = np.asarray(eye, dtype=np.float64)
    centres = np.stack([np.asarray(c.campos, dtype=np.float64) for c in cameras])
    dist = np.linalg.norm(centres - eye, axis=1)
    if forward is None:
        return int(np.argmin(dist))
    axes = np.stack([np.asarray(c.R[2], dtype=np.float64) for c in cameras])
    near = dist <= dist.min() * (1 + 1e-9) + 1e-12
    score = np.where(near, axes @ np.asarray(forward, dtype=np.float64), -np.inf)
    return int(np.argmax(score))


def focus_of_cameras(cameras) -> np.ndarray:
    """(3,) the point the cameras look at: least-squares nearest point to all optical axes,
    argmin_p Σ_i |(I − f_i f_iᵀ)(p − c_i)|² (c_i centre, f_i unit axis). When the axes are nearly parallel
    (a forward-facing capture: the system is ill-conditioned) the mean centre moved along the mean axis by the
    cameras' spread. Raises ValueError for an empty list."""
    if not cameras:
        raise ValueError("focus_of_cameras: no cameras")
    c = np.stack([np.asarray(cam.campos, dtype=np.float64) for cam in cameras])
    f = np.stack([np.asarray(cam.R[2], dtype=np.float64) for cam in cameras])
    f /= np.linalg.norm(f, axis=1, keepdims=True)
    P = np.eye(3)[None] - f[:, :, None] * f[:, None, :]          # (n, 3, 3) projectors off each axis
    A = P.sum(0)
    b = np.einsum("nij,nj->i", P, c)
    w = np.linalg.eigvalsh(A)
    if w[0] > 1e-3 * max(w[-1], 1e-300):
        return np.linalg.solve(A, b)
    spread = float(np.linalg.norm(c - c.mean(0), axis=1).max()) or 1.0
    axis = f.mean(0)
    return c.mean(0) + axis / max(np.linalg.norm(axis), 1e-300) * 2.0 * spread


def up_from_cameras(cameras) -> str:
    """The key of :data:`UP_AXES` closest to the cameras' mean "up" (camera −y in world coordinates, OpenCV
    axes), e.g. "+z" for NeRF-synthetic, often "-y" for COLMAP reconstructions. "+z" for an empty list."""
    if not cameras:
        return "+z"
    ups = np.stack([-np.asarray(c.R[1], dtype=np.float64) for c in cameras])
    m = ups.mean(0)
    if np.linalg.norm(m) < 1e-9:
        return "+z"
    return max(UP_AXES, key=lambda k: float(np.dot(UP_AXES[k], m)))


def mean_up(cameras) -> np.ndarray:
    """(3,) unit vector: the cameras' mean "up" (camera −y in world coordinates, OpenCV axes), normalised. When the
    ups cancel out (|mean| < 1e-6: e.g. cameras rolled every way) the :data:`UP_AXES` axis of
    :func:`up_from_cameras` instead. Raises ValueError for an empty list."""
    if not cameras:
        raise ValueError("mean_up: no cameras")
    ups = np.stack([-np.asarray(c.R[1], dtype=np.float64) for c in cameras])
    m = ups.mean(0)
    n = float(np.linalg.norm(m))
    if n < 1e-6:
        return np.asarray(UP_AXES[up_from_cameras(cameras)], dtype=np.float64)
    return m / n


def region_offset(region) -> float:
    """The :attr:`OrbitCamera.view_offset` (principal-point shift, a fraction of the width) that draws the orbit
    target at the centre of the image columns ``region`` = (u0, u1) (fractions of the width, clamped to [0, 1];
    a region narrower than 0.1 % counts as the whole image): 0.5·(u0 + u1) − 0.5."""
    u0, u1 = (min(max(float(u), 0.0), 1.0) for u in region)
    if u1 - u0 < 1e-3:
        u0, u1 = 0.0, 1.0
    return 0.5 * (u0 + u1) - 0.5


def framing_box(model):
    """(lo (3,), hi (3,)) float64 numpy: the box the first view fits — the model's robust bounds
    (``model.bounds(0.01)``), widened by 3σ of its largest finite scale where the means alone span (almost)
    nothing: one splat, or several at one point. An empty scene (or one without a finite mean) gets the unit
    box around the origin, so there is always a camera to show the background from."""
    import numpy as np
    import torch

    lo, hi = (t.detach().cpu().double().numpy() for t in model.bounds(0.01))
    size = float(np.linalg.norm(hi - lo))
    if size > 1e-9 * max(1.0, float(np.abs(lo).max()), float(np.abs(hi).max())):
        return lo, hi
    pad = 0.0
    if model.num_gaussians > 0:
        s = model.scales.detach().double()
        s = s[torch.isfinite(s).all(-1)]
        if s.numel():
            pad = 3.0 * float(s.max())
    if not pad > 0 or not np.isfinite(pad):
        pad = 1.0
    return lo - pad, hi + pad
