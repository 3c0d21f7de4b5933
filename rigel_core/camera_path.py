"""Keyframed camera paths: smooth interpolation of pose and field of view, rigel's JSON format, nerfstudio's
``camera_path.json``.

Conventions (DESIGN §3): a :class:`Keyframe` holds the camera centre ``position`` (3,) in world units and the
camera-to-world rotation as a unit quaternion ``orientation`` (w, x, y, z) in rigel's OpenCV camera axes
(x right, y down, z forward), and ``fov_y_deg``, the vertical field of view in degrees. Cameras made from a path
have square pixels (``fx = fy = 0.5·height / tan(fov_y / 2)``) and a centred principal point.

The maths (re-derived here; sources named):

* **Positions** — a centripetal Catmull–Rom spline (Catmull & Rom 1974; knot spacing |P_{i+1} − P_i|^α with
  α = ½, Yuksel, Schaefer & Keyser, "Parameterization and applications of Catmull–Rom curves", CAD 2011, which
  shows that α = ½ has no cusps or self-intersections within a segment). Written in Hermite form over the
  global knot parameter τ (τ_{i+1} = τ_i + |P_{i+1} − P_i|^α): on [τ_i, τ_{i+1}] with h = τ_{i+1} − τ_i and
  u = (τ − τ_i)/h, P = h00(u) P_i + h10(u) h m_i + h01(u) P_{i+1} + h11(u) h m_{i+1} (cubic Hermite basis), and
  the tangent m_i = dP/dτ at τ_i is the derivative of the parabola through P_{i−1}, P_i, P_{i+1} at their
  knots — the same vector the Barry–Goldman pyramid (SIGGRAPH 1988) gives:
  m_i = (P_i − P_{i−1})/(τ_i − τ_{i−1}) − (P_{i+1} − P_{i−1})/(τ_{i+1} − τ_{i−1}) + (P_{i+1} − P_i)/(τ_{i+1} − τ_i).
  Each tangent depends only on its keyframe's neighbours, so the curve passes through every keyframe and is C1
  in τ. ``smoothness`` s ∈ [0, 1] scales every tangent (Kochanek–Bartels tension = 1 − s): 1 is Catmull–Rom,
  0 stops at each keyframe (straight segments with ease-in/ease-out). Ends of an open path: a phantom point
  P_{−1} = 2P_0 − P_1 one knot interval before (likewise after the last), which makes m_0 the chord
  (P_1 − P_0)/h_0; two keyframes give the straight segment between them. A ``loop`` closes the path with a
  segment from the last keyframe back to the first, tangents wrapping around.
* **Field of view** — the same Hermite spline in τ (scalar values), clamped to [1°, 179°].
* **Orientation** — spherical linear interpolation (Shoemake, "Animating rotation with quaternion curves",
  SIGGRAPH 1985) per segment in u, along the shorter arc (q and −q are one rotation: the second keyframe's sign
  is flipped when q_i·q_{i+1} < 0). Slerp is C0 at keyframes (the angular velocity may jump there; squad would
  be C1 but overshoots with uneven keyframe spacing); chosen for predictability.
* **Timing** — keyframes sit at times t_i (given, or spread evenly over ``duration``); τ(t) is the monotone
  cubic (Fritsch & Carlson, SIAM J. Numer. Anal. 1980, with Fritsch–Butland's weighted harmonic-mean slopes)
  through (t_i, τ_i), C1 and strictly increasing, so the camera reaches keyframe i exactly at t_i and its
  position is C1 in t. With ``constant_speed`` the frames are spaced evenly in arc length instead (the curve is
  sampled densely, its cumulative chord length inverted by linear interpolation): uniform speed along the
  path, keyframes passed at whatever time that gives; a rotation-only segment (two keyframes at one
  position) then takes no time.

Files: :func:`save_path` / :func:`load_path` read and write rigel's format (documented at :data:`FORMAT`);
:func:`load_path` also reads nerfstudio's ``camera_path.json`` (its rendered ``camera_path`` samples; the
``keyframes`` list of nerfstudio's editor is not used), :func:`save_nerfstudio` writes one. Bad files raise
:class:`CameraPathError`, one line naming the file and the field.
"""
from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from .atomic import atomic_path

if TYPE_CHECKING:
    from .renderer.camera import Camera

__all__ = ["Keyframe", "CameraPath", "CameraPathError", "FORMAT", "FORMAT_VERSION", "rotmat_to_quat", "slerp",
           "load_path", "save_path", "save_nerfstudio", "path_from_dict", "path_to_dict", "render_size"]

FORMAT = "rigel-camera-path"
#: rigel's camera-path JSON, version 1::
#:
#:   {"format": "rigel-camera-path", "version": 1,
#:    "keyframes": [{"position": [x, y, z], "orientation": [w, x, y, z], "fov_y_deg": 50.0,
#:                   "time": 0.0 (optional, seconds)}, ...],
#:    "duration": 4.0 (seconds), "fps": 30, "frames": null (or an int: overrides duration·fps),
#:    "loop": false, "smoothness": 1.0, "constant_speed": false,
#:    "width": 640, "height": 480 (optional: the render size it was made for)}
#:
#: orientation: camera-to-world, OpenCV camera axes (x right, y down, z forward), normalised on load.
FORMAT_VERSION = 1
_ALPHA = 0.5          # centripetal
_MIN_FOV, _MAX_FOV = 1.0, 179.0


class CameraPathError(ValueError):
    """A camera-path file that cannot be used: ``str(err)`` is ``"<path>: <problem>"`` (``err.path``,
    ``err.problem``), the problem naming the field."""

    def __init__(self, path, problem: str):
        self.path = os.fspath(path) if path is not None else "<dict>"
        self.problem = problem
        super().__init__(f"{self.path}: {problem}")


# ---- quaternions (w, x, y, z) ---------------------------------------------------------------------------------
def rotmat_to_quat(R) -> np.ndarray:
    """Unit quaternion (4,) float64 (w, x, y, z), w ≥ 0, of a rotation matrix (3, 3).

    Shepperd's method (J. Guidance & Control 1978): the largest of 4w², 4x², 4y², 4z² (from the trace and the
    diagonal) is taken as the pivot so that the division is well conditioned. Inverse of
    :func:`rigel_core.renderer.camera.quat_to_rotmat_np`.
    """
    R = np.asarray(R, dtype=np.float64)
    tr = R[0, 0] + R[1, 1] + R[2, 2]
    d = (tr, R[0, 0], R[1, 1], R[2, 2])
    k = int(np.argmax(d))
    if k == 0:
        s = 2.0 * math.sqrt(max(1.0 + tr, 0.0))
        q = [0.25 * s, (R[2, 1] - R[1, 2]) / s, (R[0, 2] - R[2, 0]) / s, (R[1, 0] - R[0, 1]) / s]
    elif k == 1:
        s = 2.0 * math.sqrt(max(1.0 + R[0, 0] - R[1, 1] - R[2, 2], 0.0))
        q = [(R[2, 1] - R[1, 2]) / s, 0.25 * s, (R[0, 1] + R[1, 0]) / s, (R[0, 2] + R[2, 0]) / s]
    elif k == 2:
        s = 2.0 * math.sqrt(max(1.0 + R[1, 1] - R[0, 0] - R[2, 2], 0.0))
        q = [(R[0, 2] - R[2, 0]) / s, (R[0, 1] + R[1, 0]) / s, 0.25 * s, (R[1, 2] + R[2, 1]) / s]
    else:
        s = 2.0 * math.sqrt(max(1.0 + R[2, 2] - R[0, 0] - R[1, 1], 0.0))
        q = [(R[1, 0] - R[0, 1]) / s, (R[0, 2] + R[2, 0]) / s, (R[1, 2] + R[2, 1]) / s, 0.25 * s]
    q = np.asarray(q)
    q /= np.linalg.norm(q)
    return -q if q[0] < 0 else q


def slerp(q0, q1, u: float) -> np.ndarray:
    """Spherical linear interpolation of unit quaternions (w, x, y, z) at ``u`` ∈ [0, 1], along the shorter arc
    (``q1`` negated when q0·q1 < 0). Returns a unit quaternion (4,) float64; falls back to normalised linear
    interpolation when the two are within 1e-6 rad (sin θ → 0)."""
    q0 = np.asarray(q0, dtype=np.float64)
    q1 = np.asarray(q1, dtype=np.float64)
    q0, q1 = q0 / np.linalg.norm(q0), q1 / np.linalg.norm(q1)
    c = float(q0 @ q1)
    if c < 0.0:
        q1, c = -q1, -c
    c = min(c, 1.0)
    theta = math.acos(c)
    if theta < 1e-6:
        q = (1.0 - u) * q0 + u * q1
    else:
        s = math.sin(theta)
        q = (math.sin((1.0 - u) * theta) / s) * q0 + (math.sin(u * theta) / s) * q1
    return q / np.linalg.norm(q)


# ---- keyframes and paths ---------------------------------------------------------------------------------------
@dataclass
class Keyframe:
    """One camera pose of a path.

    Attributes:
        position: (3,) float64 camera centre, world units.
        orientation: (4,) float64 unit quaternion (w, x, y, z), camera-to-world rotation, OpenCV camera axes.
        fov_y_deg: vertical field of view, degrees, in (0, 180).
        time: seconds from the start of the path, or None (keyframes spread evenly).

    Raises: ValueError for non-finite values, a zero quaternion or a field of view outside (0, 180).
    """

    position: np.ndarray
    orientation: np.ndarray
    fov_y_deg: float = 50.0
    time: float | None = None

    def __post_init__(self):
        self.position = np.asarray(self.position, dtype=np.float64).reshape(3).copy()
        q = np.asarray(self.orientation, dtype=np.float64).reshape(4)
        n = np.linalg.norm(q)
        if not (np.all(np.isfinite(self.position)) and np.all(np.isfinite(q)) and n > 1e-12):
            raise ValueError("keyframe position and orientation must be finite, orientation non-zero")
        self.orientation = q / n
        self.fov_y_deg = float(self.fov_y_deg)
        if not 0.0 < self.fov_y_deg < 180.0:
            raise ValueError(f"keyframe fov_y_deg must be in (0, 180), got {self.fov_y_deg}")
        if self.time is not None:
            self.time = float(self.time)
            if not math.isfinite(self.time):
                raise ValueError("keyframe time must be finite")

    @classmethod
    def from_camera(cls, cam: Camera, time: float | None = None) -> "Keyframe":
        """The pose and vertical field of view (from ``fy`` and ``height``) of a :class:`~rigel_core.Camera`."""
        c2w = cam.c2w
        return cls(c2w[:3, 3], rotmat_to_quat(c2w[:3, :3]), math.degrees(2.0 * math.atan(0.5 * cam.height / cam.fy)),
                   time)

    def camera(self, width: int, height: int, name: str = "") -> Camera:
        """A :class:`~rigel_core.Camera` of ``width × height`` pixels at this pose (square pixels, centred)."""
        return _camera(self.position, self.orientation, self.fov_y_deg, width, height, name)

    def to_dict(self) -> dict:
        d = {"position": self.position.tolist(), "orientation": self.orientation.tolist(),
             "fov_y_deg": self.fov_y_deg}
        if self.time is not None:
            d["time"] = self.time
        return d


def _camera(position, q, fov_y_deg, width, height, name="") -> Camera:
    # here: rigel_core.renderer.camera imports torch (the viewer's first frame comes before that;
    # tests/test_first_frame.py)
    from .renderer.camera import Camera, quat_to_rotmat_np
    R = quat_to_rotmat_np(q)
    vm = np.eye(4)
    vm[:3, :3] = R.T
    vm[:3, 3] = -R.T @ np.asarray(position, dtype=np.float64)
    f = 0.5 * height / math.tan(0.5 * math.radians(fov_y_deg))
    return Camera(width, height, f, f, width / 2.0, height / 2.0, vm, name)


def _hermite(p0, p1, m0, m1, h, u):
    """Cubic Hermite on one segment: values ``p0, p1``, derivatives ``m0, m1`` per unit of the parameter whose
    segment length is ``h``, at the fraction ``u`` ∈ [0, 1]."""
    u2, u3 = u * u, u * u * u
    return ((2 * u3 - 3 * u2 + 1) * p0 + (u3 - 2 * u2 + u) * h * m0 + (-2 * u3 + 3 * u2) * p1
            + (u3 - u2) * h * m1)


def _per_segment(segments: int) -> int:
    """Dense samples per segment for arc lengths: 256, fewer for long paths (a nerfstudio file of hundreds of
    samples) so that the viewer's UI thread stays responsive."""
    return max(16, min(256, 20000 // max(segments, 1)))


def _pchip_slopes(x, y, periodic: bool) -> np.ndarray:
    """Fritsch–Carlson monotone slopes at the nodes of a strictly increasing (x, y) (weighted harmonic means of
    the neighbouring secants, Fritsch & Butland 1984); ends: the secant (open) or wrap around (periodic, where
    the last node is the first one a period later)."""
    hx, dy = np.diff(x), np.diff(y)
    d = dy / hx
    m = np.empty_like(x)

    def mean(da, db, ha, hb):
        if da * db <= 0:
            return 0.0
        w1, w2 = 2 * hb + ha, hb + 2 * ha
        return (w1 + w2) / (w1 / da + w2 / db)

    for i in range(1, len(x) - 1):
        m[i] = mean(d[i - 1], d[i], hx[i - 1], hx[i])
    if periodic and len(d) >= 1:
        m[0] = m[-1] = mean(d[-1], d[0], hx[-1], hx[0])
    else:
        m[0], m[-1] = d[0], d[-1]
    return m


@dataclass
class CameraPath:
    """Keyframes and how to play them.

    Attributes:
        keyframes: list of :class:`Keyframe` (at least 1 to evaluate; times, when given, on all of them,
            strictly increasing).
        duration: seconds of the whole path (keyframes without times are spread evenly over it; with times,
            the path runs from the first to the last time, a loop on to ``duration``).
        fps: frames per second of a video. frames: number of frames, or None for round(duration·fps).
        loop: a closed path (the last keyframe leads back to the first).
        smoothness: tangent scale s ∈ [0, 1] (1 Catmull–Rom, 0 stop at each keyframe).
        constant_speed: frames evenly spaced in arc length instead of in time.
        width, height: the render size the path was made for, or None.
    """

    keyframes: list = field(default_factory=list)
    duration: float = 4.0
    fps: float = 30.0
    frames: int | None = None
    loop: bool = False
    smoothness: float = 1.0
    constant_speed: bool = False
    width: int | None = None
    height: int | None = None

    # ---- timing ------------------------------------------------------------------------------------------
    def num_frames(self) -> int:
        """Frames of a video of this path (≥ 1)."""
        return max(1, int(self.frames) if self.frames else int(round(self.duration * self.fps)))

    def _times(self) -> np.ndarray:
        """(n,) keyframe times plus, for a loop, the end time (n + 1 values)."""
        kf = self.keyframes
        n = len(kf)
        given = [k.time is not None for k in kf]
        if any(given) and not all(given):
            raise ValueError("camera path: either every keyframe has a time or none")
        if all(given) and n:
            t = np.array([k.time for k in kf])
            if n > 1 and np.any(np.diff(t) <= 0):
                raise ValueError("camera path: keyframe times must be strictly increasing")
            if self.loop:
                end = float(self.duration)
                if n > 1 and end <= t[-1]:
                    end = t[-1] + (t[-1] - t[0]) / (n - 1)   # one more average gap closes the loop
                t = np.append(t, end)
            return t
        if self.duration <= 0 or not math.isfinite(self.duration):
            raise ValueError(f"camera path: duration must be positive, got {self.duration}")
        segs = n if self.loop else n - 1
        return np.linspace(0.0, self.duration, max(segs, 1) + 1)[: (n + 1 if self.loop else n)]

    def _knots(self):
        """Positions (m, 3) and fields of view (m,) of the spline's nodes (a loop repeats the first at the end),
        their centripetal knots τ (m,), and tangents dP/dτ, dfov/dτ (Catmull–Rom, scaled by smoothness)."""
        kf = self.keyframes
        P = np.stack([k.position for k in kf])
        F = np.array([k.fov_y_deg for k in kf])
        if self.loop:
            P, F = np.vstack([P, P[:1]]), np.append(F, F[0])
        m = len(P)
        seg = np.linalg.norm(np.diff(P, axis=0), axis=1) ** _ALPHA if m > 1 else np.zeros(0)
        # zero-length segments (keyframes at one position) get a tiny interval so that divisions stay finite
        floor = 1e-6 * max(float(seg.max()) if seg.size else 0.0, 1e-9)
        seg = np.maximum(seg, floor)
        tau = np.concatenate([[0.0], np.cumsum(seg)])
        V = np.hstack([P, F[:, None]])            # positions and fov share the spline
        T = np.zeros_like(V)
        if m == 1:
            return P, F, tau, T[:, :3], T[:, 3]
        for i in range(m):
            if 0 < i < m - 1:
                a, b, c = V[i - 1], V[i], V[i + 1]
                ha, hb = seg[i - 1], seg[i]
            elif self.loop:   # the first and last node are one point: neighbours across the seam
                a, b, c = V[-2], V[0], V[1]
                ha, hb = seg[-1], seg[0]
            elif i == 0:       # phantom point 2P_0 − P_1 one interval before
                a, b, c = 2 * V[0] - V[1], V[0], V[1]
                ha = hb = seg[0]
            else:
                a, b, c = V[-2], V[-1], 2 * V[-1] - V[-2]
                ha = hb = seg[-1]
            T[i] = (b - a) / ha - (c - a) / (ha + hb) + (c - b) / hb
        T *= float(min(max(self.smoothness, 0.0), 1.0))
        return P, F, tau, T[:, :3], T[:, 3]

    def _state(self):
        if not self.keyframes:
            raise ValueError("camera path: no keyframes")
        P, F, tau, TP, TF = self._knots()
        Q = [k.orientation for k in self.keyframes]
        if self.loop:
            Q = Q + [Q[0]]
        t = self._times()
        return P, F, tau, TP, TF, Q, t

    @property
    def start_time(self) -> float:
        return float(self._times()[0]) if self.keyframes else 0.0

    @property
    def end_time(self) -> float:
        return float(self._times()[-1]) if self.keyframes else 0.0

    # ---- evaluation --------------------------------------------------------------------------------------------
    def _at_tau(self, state, tau_v: float):
        P, F, tau, TP, TF, Q, _ = state
        if len(P) == 1:
            return P[0].copy(), np.asarray(Q[0]).copy(), float(F[0])
        tau_v = min(max(float(tau_v), tau[0]), tau[-1])
        i = int(min(np.searchsorted(tau, tau_v, side="right") - 1, len(tau) - 2))
        h = tau[i + 1] - tau[i]
        u = (tau_v - tau[i]) / h
        pos = _hermite(P[i], P[i + 1], TP[i], TP[i + 1], h, u)
        fov = float(_hermite(F[i], F[i + 1], TF[i], TF[i + 1], h, u))
        return pos, slerp(Q[i], Q[i + 1], u), min(max(fov, _MIN_FOV), _MAX_FOV)

    def _tau_of_time(self, state, tv):
        _, _, tau, _, _, _, t = state
        if len(tau) == 1:
            return np.zeros_like(np.asarray(tv, dtype=np.float64))
        slopes = _pchip_slopes(t, tau, self.loop)
        tv = np.clip(np.asarray(tv, dtype=np.float64), t[0], t[-1])
        i = np.clip(np.searchsorted(t, tv, side="right") - 1, 0, len(t) - 2)
        h = t[i + 1] - t[i]
        return _hermite(tau[i], tau[i + 1], slopes[i], slopes[i + 1], h, (tv - t[i]) / h)

    def evaluate(self, time: float):
        """Pose at ``time`` seconds (clamped to the path's span), timed by keyframe times (not constant speed).

        Returns: (position (3,), orientation (4,) unit (w, x, y, z), fov_y_deg float).
        Raises ValueError for an empty path or inconsistent keyframe times.
        """
        state = self._state()
        return self._at_tau(state, float(self._tau_of_time(state, time)))

    def sample(self, n: int | None = None, *, constant_speed: bool | None = None):
        """``n`` poses (default :meth:`num_frames`) from start to end (an open path includes both ends; a loop
        stops one step short of its start). ``constant_speed`` (default: the attribute) spaces them evenly in
        arc length. Returns (positions (n, 3), orientations (n, 4), fov_y_deg (n,), times (n,) seconds along
        the path's own clock for the time-spaced case, or the fraction of arc length × span otherwise)."""
        n = self.num_frames() if n is None else int(n)
        if n < 1:
            raise ValueError(f"camera path: need at least one frame, got {n}")
        state = self._state()
        t = state[-1]
        t0, t1 = float(t[0]), float(t[-1])
        fr = np.arange(n) / (n if self.loop else max(n - 1, 1))
        cs = self.constant_speed if constant_speed is None else constant_speed
        if cs and len(state[0]) > 1:
            taus = self._arc_length_taus(state, fr)
        else:
            taus = self._tau_of_time(state, t0 + fr * (t1 - t0))
        out = [self._at_tau(state, float(tv)) for tv in np.atleast_1d(taus)]
        pos = np.stack([o[0] for o in out])
        quat = np.stack([o[1] for o in out])
        fov = np.array([o[2] for o in out])
        return pos, quat, fov, t0 + fr * (t1 - t0)

    def _arc_length_taus(self, state, fractions):
        """τ at the given fractions of the total arc length: dense samples (256 per segment, fewer for paths of
        over 80 segments: 20 000 in all, at least 16 per segment), cumulative chord length, inverted by linear
        interpolation (relative error O(1/samples²) per segment)."""
        P, F, tau, TP, TF, Q, _ = state
        per_segment = _per_segment(len(tau) - 1)
        dense = np.concatenate([np.linspace(tau[i], tau[i + 1], per_segment, endpoint=False)
                                for i in range(len(tau) - 1)] + [[tau[-1]]])
        pts = np.stack([self._at_tau(state, tv)[0] for tv in dense])
        s = np.concatenate([[0.0], np.cumsum(np.linalg.norm(np.diff(pts, axis=0), axis=1))])
        if s[-1] <= 0:
            return tau[0] + np.asarray(fractions) * (tau[-1] - tau[0])
        return np.interp(np.asarray(fractions) * s[-1], s, dense)

    def arc_length(self) -> float:
        """Length of the path's position curve (world units; dense chord sum)."""
        state = self._state()
        if len(state[0]) == 1:
            return 0.0
        tau = state[2]
        dense = np.linspace(tau[0], tau[-1], _per_segment(len(tau) - 1) * (len(tau) - 1) + 1)
        pts = np.stack([self._at_tau(state, tv)[0] for tv in dense])
        return float(np.linalg.norm(np.diff(pts, axis=0), axis=1).sum())

    def cameras(self, width: int | None = None, height: int | None = None, *, frames: int | None = None,
                constant_speed: bool | None = None, prefix: str = "path") -> list:
        """The video's cameras: ``frames`` (default :meth:`num_frames`) :class:`~rigel_core.Camera` of
        ``width × height`` (default: the path's own size, else 640 × 480; one of them alone keeps that size's aspect
        ratio), named ``<prefix>_0000`` …"""
        w, h = render_size(width, height, self.width, self.height)
        pos, quat, fov, _ = self.sample(frames, constant_speed=constant_speed)
        return [_camera(p, q, f, w, h, f"{prefix}_{i:04d}") for i, (p, q, f) in enumerate(zip(pos, quat, fov))]


def render_size(width: int | None, height: int | None, path_width: int | None = None,
                path_height: int | None = None) -> tuple[int, int]:
    """(width, height) of a path's render: those given; one of them alone keeps the aspect ratio of the path's own
    size (``path_width`` × ``path_height``, one of which alone is completed at 4:3), else of 640 × 480; neither:
    that size. None or 0 counts as not given."""
    pw, ph = path_width or None, path_height or None
    if pw and not ph:
        ph = max(1, round(pw * 3 / 4))
    elif ph and not pw:
        pw = max(1, round(ph * 4 / 3))
    base_w, base_h = (pw, ph) if pw else (640, 480)
    if width and height:
        return int(width), int(height)
    if width:
        return int(width), max(1, round(int(width) * base_h / base_w))
    if height:
        return max(1, round(int(height) * base_w / base_h)), int(height)
    return int(base_w), int(base_h)


# ---- files ---------------------------------------------------------------------------------------------------------
def path_to_dict(path: CameraPath) -> dict:
    """rigel's JSON object for ``path`` (see :data:`FORMAT`)."""
    d = {"format": FORMAT, "version": FORMAT_VERSION, "keyframes": [k.to_dict() for k in path.keyframes],
         "duration": float(path.duration), "fps": float(path.fps), "frames": path.frames, "loop": bool(path.loop),
         "smoothness": float(path.smoothness), "constant_speed": bool(path.constant_speed)}
    if path.width and path.height:
        d["width"], d["height"] = int(path.width), int(path.height)
    return d


_REQUIRED = object()


def _num(d: dict, key: str, src, *, default=_REQUIRED, positive=False, integer=False, lo=None, hi=None,
         where: str = ""):
    """``d[key]`` checked as a finite number (``default`` when absent or null; required when no default);
    ``where`` prefixes the field's name in errors (e.g. "keyframes[2].")."""
    key_name = where + key
    if d.get(key) is None:
        if default is _REQUIRED:
            raise CameraPathError(src, f"missing field '{key_name}'")
        return default
    v = d[key]
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        raise CameraPathError(src, f"field '{key_name}' must be a finite number, got {v!r}")
    if integer and int(v) != v:
        raise CameraPathError(src, f"field '{key_name}' must be an integer, got {v!r}")
    if positive and v <= 0:
        raise CameraPathError(src, f"field '{key_name}' must be positive, got {v!r}")
    if (lo is not None and v < lo) or (hi is not None and v > hi):
        raise CameraPathError(src, f"field '{key_name}' must be in [{lo}, {hi}], got {v!r}")
    return int(v) if integer else float(v)


def _bool(d: dict, key: str, src) -> bool:
    v = d.get(key, False)
    if not isinstance(v, bool):
        raise CameraPathError(src, f"field '{key}' must be true or false, got {v!r}")
    return v


def _vector(v, n: int, src, where: str) -> np.ndarray:
    try:
        a = np.asarray(v, dtype=np.float64)
    except (TypeError, ValueError):
        a = None
    if a is None or a.shape != (n,) or not np.all(np.isfinite(a)):
        raise CameraPathError(src, f"{where} must be a list of {n} finite numbers")
    return a


def path_from_dict(d, src=None) -> CameraPath:
    """A :class:`CameraPath` from rigel's JSON object or nerfstudio's (told apart by the ``camera_path`` key).
    ``src`` names the file in errors. Raises :class:`CameraPathError` naming the field."""
    if not isinstance(d, dict):
        raise CameraPathError(src, "top level must be a JSON object")
    if "camera_path" in d and "format" not in d:
        return _from_nerfstudio(d, src)
    if d.get("format") != FORMAT:
        raise CameraPathError(src, f"field 'format' must be '{FORMAT}' (or a nerfstudio file with 'camera_path'), "
                                   f"got {d.get('format')!r}")
    version = d.get("version")
    if version != FORMAT_VERSION:
        raise CameraPathError(src, f"field 'version' {version!r} is not supported (this rigel reads "
                                   f"{FORMAT_VERSION})")
    kfs = d.get("keyframes")
    if not isinstance(kfs, list):
        raise CameraPathError(src, "field 'keyframes' must be a list")
    keyframes = []
    for i, k in enumerate(kfs):
        where = f"keyframes[{i}]"
        if not isinstance(k, dict):
            raise CameraPathError(src, f"{where} must be an object")
        for key in ("position", "orientation", "fov_y_deg"):
            if key not in k:
                raise CameraPathError(src, f"{where}: missing field '{key}'")
        pos = _vector(k["position"], 3, src, f"{where}.position")
        q = _vector(k["orientation"], 4, src, f"{where}.orientation")
        if np.linalg.norm(q) < 1e-12:
            raise CameraPathError(src, f"{where}.orientation is a zero quaternion")
        fov = _num(k, "fov_y_deg", src, lo=1e-6, hi=179.999, where=where + ".")
        t = _num(k, "time", src, default=None, where=where + ".")
        keyframes.append(Keyframe(pos, q, fov, t))
    path = CameraPath(keyframes, duration=_num(d, "duration", src, default=4.0, positive=True),
                      fps=_num(d, "fps", src, default=30.0, positive=True),
                      frames=_num(d, "frames", src, default=None, integer=True, positive=True),
                      loop=_bool(d, "loop", src), smoothness=_num(d, "smoothness", src, default=1.0, lo=0, hi=1),
                      constant_speed=_bool(d, "constant_speed", src),
                      width=_num(d, "width", src, default=None, integer=True, positive=True),
                      height=_num(d, "height", src, default=None, integer=True, positive=True))
    try:
        path._times()
    except ValueError as e:
        raise CameraPathError(src, f"field 'keyframes': {str(e).split(': ', 1)[-1]}") from None
    return path


def _from_nerfstudio(d: dict, src) -> CameraPath:
    """nerfstudio's rendered samples → a path that reproduces them frame for frame: one keyframe per sample at
    time k / fps, ``frames`` = the number of samples. OpenGL camera-to-world → OpenCV by negating the y and z
    columns (as :meth:`rigel_core.Camera.from_c2w_opengl`); ``fov`` is vertical, in degrees. The poses are used
    as given: nerfstudio's dataparser transform (its normalised world) is not undone."""
    samples = d["camera_path"]
    if not isinstance(samples, list) or not samples:
        raise CameraPathError(src, "field 'camera_path' must be a non-empty list")
    fps = _num(d, "fps", src, default=30.0, positive=True)
    w = _num(d, "render_width", src, default=None, integer=True, positive=True)
    h = _num(d, "render_height", src, default=None, integer=True, positive=True)
    keyframes = []
    for i, s in enumerate(samples):
        where = f"camera_path[{i}]"
        if not isinstance(s, dict) or "camera_to_world" not in s:
            raise CameraPathError(src, f"{where}: missing field 'camera_to_world'")
        try:   # 16 floats row-major (nerfstudio), or nested 4 × 4
            flat = np.asarray(s["camera_to_world"], dtype=np.float64).reshape(-1)
        except (TypeError, ValueError):
            flat = None
        m = _vector(flat, 16, src, f"{where}.camera_to_world").reshape(4, 4).copy()
        m[:3, 1:3] *= -1.0                      # OpenGL (y up, z back) → OpenCV (y down, z forward)
        R = m[:3, :3]
        if not np.allclose(R.T @ R, np.eye(3), atol=1e-4) or np.linalg.det(R) <= 0:
            raise CameraPathError(src, f"{where}.camera_to_world: rotation part is not a rotation "
                                       "(scaled or reflected camera-to-world)")
        if "fov" not in s:
            raise CameraPathError(src, f"{where}: missing field 'fov'")
        fov = _num(s, "fov", src, lo=1e-6, hi=179.999, where=where + ".")
        keyframes.append(Keyframe(m[:3, 3], rotmat_to_quat(R), fov, i / fps))
    n = len(keyframes)
    seconds = _num(d, "seconds", src, default=n / fps, positive=True)
    return CameraPath(keyframes, duration=seconds, fps=fps, frames=n, loop=False, width=w, height=h)


def load_path(path) -> CameraPath:
    """Read a camera path: rigel's JSON (:data:`FORMAT`) or nerfstudio's ``camera_path.json``.

    Raises :class:`CameraPathError` ("<file>: <problem>") for a missing or unreadable file, bad JSON or a bad
    field."""
    p = Path(path)
    try:
        text = p.read_text()
    except OSError as e:
        raise CameraPathError(p, f"cannot read: {e.strerror or e}") from None
    try:
        d = json.loads(text)
    except json.JSONDecodeError as e:
        raise CameraPathError(p, f"not valid JSON (line {e.lineno}, column {e.colno}: {e.msg})") from None
    return path_from_dict(d, p)


def _write_json(obj: dict, out, force: bool):
    out = Path(out)
    if out.exists() and not force:
        raise FileExistsError(f"{out}: exists (pass force=True / --force to replace it)")
    with atomic_path(out) as tmp:
        Path(tmp).write_text(json.dumps(obj, indent=1) + "\n")
    return out


def save_path(path: CameraPath, out, *, force: bool = False) -> Path:
    """Write ``path`` as rigel's JSON (atomically). Raises FileExistsError when ``out`` exists and not ``force``."""
    return _write_json(path_to_dict(path), out, force)


def save_nerfstudio(path: CameraPath, out, *, width: int | None = None, height: int | None = None,
                    force: bool = False) -> Path:
    """Write the path's rendered samples as nerfstudio's ``camera_path.json`` (``camera_to_world`` row-major in
    OpenGL axes, vertical ``fov`` in degrees, ``aspect``; ``keyframes`` empty: the samples are the path), at
    :func:`render_size`."""
    from .renderer.camera import quat_to_rotmat_np

    w, h = render_size(width, height, path.width, path.height)
    pos, quat, fov, _ = path.sample()
    samples = []
    for p, q, f in zip(pos, quat, fov):
        m = np.eye(4)
        m[:3, :3] = quat_to_rotmat_np(q)
        m[:3, 3] = p
        m[:3, 1:3] *= -1.0                      # OpenCV → OpenGL
        samples.append({"camera_to_world": m.reshape(-1).tolist(), "fov": float(f), "aspect": w / h})
    n = len(samples)
    obj = {"keyframes": [], "camera_type": "perspective", "render_height": h, "render_width": w,
           "camera_path": samples, "fps": float(path.fps), "seconds": n / float(path.fps),
           "smoothness_value": float(path.smoothness), "is_cycle": bool(path.loop)}
    return _write_json(obj, out, force)

