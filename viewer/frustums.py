"""Training cameras drawn in the 3D view: frustum geometry, projection into the shown frame, picking.

A training camera (a :class:`rigel_core.Camera`: OpenCV axes, ``viewmat`` world → camera, pinhole ``K``) is
drawn as a pyramid: its centre (the apex) and the four corners of its image at depth ``depth`` in front of it,
back-projected through ``K`` (pixel corners (0, 0), (W, 0), (W, H), (0, H); a corner pixel ``(u, v)`` at depth
``d`` is the camera-space point ``((u − cx)·d/fx, (v − cy)·d/fy, d)``), plus a small triangle above the image's
top edge (−y in OpenCV axes) that tells up from down. The segments are clipped against the viewing camera's
near plane, projected with its pinhole model into the rendered frame's pixels, then mapped to the target the
present pass fills (the frame fitted into the content rectangle keeping its aspect and centred, the rule of
viewer/gpu/shaders/present_modes.comp). The viewer draws them as 2D lines on ImGui's background draw list, so they
show in a window and in ``--offscreen`` frames alike, without another render of the scene.

Picking: a click selects the camera whose projected frustum centre (the mean of its five pyramid vertices) is
nearest the click, within ``radius`` pixels. Pure numpy, no window: tested in tests/test_viewer_studio.py.
"""
from __future__ import annotations

import numpy as np

__all__ = ["frustum_points", "frustum_segments", "project_segments", "frame_to_target", "target_to_frame",
           "frustum_depth", "box_segments", "sphere_segments",
           "pick_camera", "EDGES"]

#: vertex pairs of the drawn pyramid: apex–corners, the image rectangle, the up triangle
EDGES = ((0, 1), (0, 2), (0, 3), (0, 4), (1, 2), (2, 3), (3, 4), (4, 1), (1, 5), (5, 2))


def frustum_points(cam, depth: float) -> np.ndarray:
    """(6, 3) float64 world points of ``cam``'s pyramid: apex (camera centre), image corners at ``depth``
    (top-left, top-right, bottom-right, bottom-left in image terms), and the tip of the up triangle (half the
    image height above the top edge's middle). ``depth`` in world units, > 0."""
    d = float(depth)
    w, h = float(cam.width), float(cam.height)
    uv = np.array([[0.0, 0.0], [w, 0.0], [w, h], [0.0, h], [0.5 * w, -0.25 * h]])
    pc = np.stack([(uv[:, 0] - cam.cx) * d / cam.fx, (uv[:, 1] - cam.cy) * d / cam.fy, np.full(len(uv), d)], -1)
    R, t = cam.viewmat[:3, :3], cam.viewmat[:3, 3]
    world = (pc - t) @ R        # X_world = Rᵀ (X_cam − t), row-vector form
    return np.concatenate([cam.campos[None], world], 0)


def frustum_depth(cameras, scene_size: float | None = None) -> float:
    """A pyramid depth that keeps neighbouring frustums apart: half the median distance of each camera centre
    to its nearest neighbour; one camera: 5 % of ``scene_size`` (or 0.1). Always > 0."""
    c = np.array([cam.campos for cam in cameras], dtype=np.float64).reshape(-1, 3)
    if len(c) >= 2:
        d = np.linalg.norm(c[:, None] - c[None], axis=-1)
        np.fill_diagonal(d, np.inf)
        nn = np.median(d.min(1))
        if nn > 0 and np.isfinite(nn):
            return 0.5 * float(nn)
    return 0.05 * float(scene_size) if scene_size and scene_size > 0 else 0.1


def frustum_segments(cameras, depth: float) -> np.ndarray:
    """(N, len(EDGES), 2, 3) world segments of the N cameras' pyramids."""
    if not len(cameras):
        return np.zeros((0, len(EDGES), 2, 3))
    pts = np.stack([frustum_points(c, depth) for c in cameras])            # (N, 6, 3)
    e = np.asarray(EDGES)
    return np.stack([pts[:, e[:, 0]], pts[:, e[:, 1]]], 2)                  # (N, E, 2, 3)


def project_segments(segments: np.ndarray, view, near: float = 1e-3):
    """Clip world segments (..., 2, 3) against the plane z = ``near`` of camera ``view`` (a rigel_core.Camera)
    and project them to its pixels. Returns (segments (..., 2, 2) float64 pixel coordinates, visible (...,) bool);
    a segment wholly behind the near plane is invisible (its coordinates are then meaningless)."""
    s = np.asarray(segments, dtype=np.float64)
    R, t = view.viewmat[:3, :3], view.viewmat[:3, 3]
    pc = s @ R.T + t                                       # camera space (..., 2, 3)
    a, b = pc[..., 0, :], pc[..., 1, :]
    za, zb = a[..., 2], b[..., 2]
    visible = (za > near) | (zb > near)
    # move the endpoint behind the plane onto it along the segment
    denom = np.where(np.abs(zb - za) > 1e-300, zb - za, 1.0)
    f = np.clip((near - za) / denom, 0.0, 1.0)[..., None]
    cut = a + f * (b - a)
    a = np.where((za < near)[..., None], cut, a)
    b = np.where((zb < near)[..., None], cut, b)
    ends = np.stack([a, b], -2)
    z = np.maximum(ends[..., 2], near)
    px = np.stack([view.fx * ends[..., 0] / z + view.cx, view.fy * ends[..., 1] / z + view.cy], -1)
    return px, visible


def frame_to_target(px, frame_size, panel):
    """Map frame pixel coordinates (..., 2) of a ``frame_size`` = (w, h) frame to target pixels of the panel
    ``(x, y, w, h)`` it is shown in (fitted keeping its aspect, centred: viewer/gpu/shaders/present_modes.comp)."""
    fw, fh = (float(v) for v in frame_size)
    x0, y0, pw, ph = (float(v) for v in panel)
    s = min(pw / fw, ph / fh)
    sw, sh = max(np.floor(fw * s + 0.5), 1.0), max(np.floor(fh * s + 0.5), 1.0)
    off = np.array([x0 + (pw - sw) // 2, y0 + (ph - sh) // 2])
    return off + np.asarray(px, dtype=np.float64) * np.array([sw / fw, sh / fh])


def target_to_frame(pts, frame_size, panel):
    """The inverse of :func:`frame_to_target`: target pixels (..., 2) to frame pixel coordinates."""
    fw, fh = (float(v) for v in frame_size)
    x0, y0, pw, ph = (float(v) for v in panel)
    s = min(pw / fw, ph / fh)
    sw, sh = max(np.floor(fw * s + 0.5), 1.0), max(np.floor(fh * s + 0.5), 1.0)
    off = np.array([x0 + (pw - sw) // 2, y0 + (ph - sh) // 2])
    return (np.asarray(pts, dtype=np.float64) - off) * np.array([fw / sw, fh / sh])


def box_segments(center, half_size, rotation=None) -> np.ndarray:
    """(12, 2, 3) world edges of the box of ``rigel_core.edit.box_mask`` (for drawing the crop box)."""
    c = np.asarray(center, dtype=np.float64).reshape(3)
    h = np.broadcast_to(np.asarray(half_size, dtype=np.float64), (3,))
    R = np.eye(3) if rotation is None else np.asarray(rotation, dtype=np.float64).reshape(3, 3)
    corners = np.array([[(i >> k) & 1 for k in range(3)] for i in range(8)], dtype=np.float64) * 2 - 1
    pts = c + (corners * h) @ R.T
    edges = [(i, i | (1 << k)) for i in range(8) for k in range(3) if not i & (1 << k)]
    return np.stack([np.stack([pts[a], pts[b]]) for a, b in edges])


def sphere_segments(center, radius: float, n: int = 48) -> np.ndarray:
    """(3n, 2, 3) world segments of the sphere's three great circles in the world axis planes."""
    c = np.asarray(center, dtype=np.float64).reshape(3)
    a = np.linspace(0.0, 2 * np.pi, n + 1)
    ring = np.stack([np.cos(a), np.sin(a)], -1) * float(radius)
    out = []
    for i, j in ((0, 1), (1, 2), (0, 2)):
        p = np.tile(c, (n + 1, 1))
        p[:, i] += ring[:, 0]
        p[:, j] += ring[:, 1]
        out.append(np.stack([p[:-1], p[1:]], 1))
    return np.concatenate(out)


def pick_camera(cameras, depth: float, view, click, *, frame_size=None, panel=None, radius: float = 8.0):
    """Index of the camera whose projected frustum centre (mean of the five pyramid vertices) is nearest the
    point ``click`` (target pixels) and within ``radius`` pixels of it, or None. Centres behind the viewing
    camera never match. ``frame_size``/``panel``: the frame → target mapping of :func:`frame_to_target`
    (default: identity, ``click`` in frame pixels)."""
    if not len(cameras):
        return None
    centres = np.stack([frustum_points(c, depth)[:5].mean(0) for c in cameras])
    R, t = view.viewmat[:3, :3], view.viewmat[:3, 3]
    pc = centres @ R.T + t
    front = pc[:, 2] > 1e-6
    z = np.where(front, pc[:, 2], 1.0)
    px = np.stack([view.fx * pc[:, 0] / z + view.cx, view.fy * pc[:, 1] / z + view.cy], -1)
    if frame_size is not None and panel is not None:
        px = frame_to_target(px, frame_size, panel)
    d = np.linalg.norm(px - np.asarray(click, dtype=np.float64), axis=1)
    d[~front] = np.inf
    i = int(np.argmin(d))
    return i if d[i] <= radius else None
