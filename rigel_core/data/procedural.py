"""A procedural Gaussian scene with exact ground truth: a sphere shell coloured by its normals, a three-turn
helix around it and a checkered ground plane; and a renderer of it into a Blender-layout dataset.

World units, z up. Sphere: radius 1 at the origin. Helix: radius 1.6 around the z axis, z from −1 to 1.2,
a tube of radius 0.06. Plane: z = −1.25, 5 × 5, checkers of 0.5. Every Gaussian is a flat (surface) or
elongated (helix) ellipsoid aligned with its surface: its thin axis along the surface normal.
"""
from __future__ import annotations

import json
import math
import os
from pathlib import Path

import numpy as np
import torch

from ..camera import Camera
from ..model import GaussianModel, num_sh_bases, rgb_to_sh
from ..render import render

__all__ = ["make_scene", "make_dataset", "rotmat_to_quat", "SH_BAND_SHIFT", "SPHERE_RADIUS", "HELIX_RADIUS", "PLANE_Z",
           "PLANE_HALF", "SCENE_RADIUS"]

SPHERE_RADIUS = 1.0
HELIX_RADIUS, HELIX_Z, HELIX_TURNS, HELIX_TUBE = 1.6, (-1.0, 1.2), 3, 0.06
PLANE_Z, PLANE_HALF, CHECKER = -1.25, 2.5, 0.5
#: radius of a sphere around the origin that holds the whole scene (plane corners).
SCENE_RADIUS = math.hypot(PLANE_HALF * math.sqrt(2.0), PLANE_Z)
#: share of the Gaussians given to the sphere, the helix and the plane.
SHARES = (0.45, 0.20, 0.35)
#: largest colour change each SH degree ≥ 1 can cause; with base colours in [0.1, 0.9] and degree ≤ 3 every
#: colour stays inside [0.01, 0.99] from every direction, so 8-bit PNGs of the scene need no clipping.
SH_BAND_SHIFT = 0.03


def rotmat_to_quat(R: np.ndarray) -> np.ndarray:
    """(N,4) unit quaternions (w, x, y, z) of rotation matrices R (N,3,3) (Shepperd's method: pivot on the
    largest of w², x², y², z² for accuracy; Shepperd, J. Guidance and Control 1(3), 1978). w ≥ 0."""
    R = np.asarray(R, dtype=np.float64)
    m00, m11, m22 = R[:, 0, 0], R[:, 1, 1], R[:, 2, 2]
    tr = m00 + m11 + m22
    cand = np.stack([tr, m00, m11, m22], axis=1)
    pick = np.argmax(cand, axis=1)
    q = np.empty((R.shape[0], 4))
    for k in range(4):
        s = pick == k
        if not s.any():
            continue
        r = R[s]
        if k == 0:
            t = np.sqrt(1.0 + tr[s]) * 2.0  # t = 4w
            q[s] = np.stack([0.25 * t, (r[:, 2, 1] - r[:, 1, 2]) / t, (r[:, 0, 2] - r[:, 2, 0]) / t,
                             (r[:, 1, 0] - r[:, 0, 1]) / t], 1)
        elif k == 1:
            t = np.sqrt(1.0 + m00[s] - m11[s] - m22[s]) * 2.0  # t = 4x
            q[s] = np.stack([(r[:, 2, 1] - r[:, 1, 2]) / t, 0.25 * t, (r[:, 0, 1] + r[:, 1, 0]) / t,
                             (r[:, 0, 2] + r[:, 2, 0]) / t], 1)
        elif k == 2:
            t = np.sqrt(1.0 + m11[s] - m00[s] - m22[s]) * 2.0  # t = 4y
            q[s] = np.stack([(r[:, 0, 2] - r[:, 2, 0]) / t, (r[:, 0, 1] + r[:, 1, 0]) / t, 0.25 * t,
                             (r[:, 1, 2] + r[:, 2, 1]) / t], 1)
        else:
            t = np.sqrt(1.0 + m22[s] - m00[s] - m11[s]) * 2.0  # t = 4z
            q[s] = np.stack([(r[:, 1, 0] - r[:, 0, 1]) / t, (r[:, 0, 2] + r[:, 2, 0]) / t,
                             (r[:, 1, 2] + r[:, 2, 1]) / t, 0.25 * t], 1)
    q *= np.where(q[:, :1] < 0, -1.0, 1.0)
    return q / np.linalg.norm(q, axis=1, keepdims=True)


def _unit(v: np.ndarray) -> np.ndarray:
    return v / np.linalg.norm(v, axis=-1, keepdims=True)


def _tangent_frame(normal: np.ndarray, angle: np.ndarray) -> np.ndarray:
    """(N,3,3) rotations whose third column is ``normal`` and whose first is turned by ``angle`` about it."""
    ref = np.where(np.abs(normal[:, 2:3]) < 0.9, np.array([[0.0, 0.0, 1.0]]), np.array([[1.0, 0.0, 0.0]]))
    t1 = _unit(np.cross(ref, normal))
    t2 = np.cross(normal, t1)
    c, s = np.cos(angle)[:, None], np.sin(angle)[:, None]
    return np.stack([c * t1 + s * t2, -s * t1 + c * t2, normal], axis=2)


def _hsv_to_rgb(h, s, v) -> np.ndarray:
    """(N,3) RGB of hue h in [0,1), saturation s, value v (the standard hexcone formula)."""
    k = (np.stack([np.full_like(h, 5.0), np.full_like(h, 3.0), np.full_like(h, 1.0)], 1) + h[:, None] * 6.0) % 6.0
    return v[:, None] - (v * s)[:, None] * np.clip(np.minimum(k, 4.0 - k), 0.0, 1.0)


def _sphere(n, rng):
    normal = _unit(rng.normal(size=(n, 3)))
    means = normal * SPHERE_RADIUS
    spacing = math.sqrt(4.0 * math.pi * SPHERE_RADIUS ** 2 / n)
    rot = _tangent_frame(normal, rng.uniform(0.0, 2.0 * math.pi, n))
    colors = 0.5 + 0.4 * normal
    return means, rot, spacing, colors


def _helix(n, rng):
    s = np.sort(rng.uniform(0.0, 1.0, n))
    omega, (z0, z1) = 2.0 * math.pi * HELIX_TURNS, HELIX_Z
    phase = omega * s
    centre = np.stack([HELIX_RADIUS * np.cos(phase), HELIX_RADIUS * np.sin(phase), z0 + (z1 - z0) * s], 1)
    tangent = _unit(np.stack([-HELIX_RADIUS * omega * np.sin(phase), HELIX_RADIUS * omega * np.cos(phase),
                              np.full(n, z1 - z0)], 1))
    inward = np.stack([-np.cos(phase), -np.sin(phase), np.zeros(n)], 1)  # ⟂ tangent
    binormal = np.cross(tangent, inward)
    phi = rng.uniform(0.0, 2.0 * math.pi, n)
    radial = np.cos(phi)[:, None] * inward + np.sin(phi)[:, None] * binormal  # tube surface normal
    means = centre + HELIX_TUBE * radial
    rot = np.stack([tangent, np.cross(radial, tangent), radial], axis=2)  # thin axis along the tube normal
    length = HELIX_TURNS * math.hypot(2.0 * math.pi * HELIX_RADIUS, (z1 - z0) / HELIX_TURNS)
    spacing = math.sqrt(2.0 * math.pi * HELIX_TUBE * length / n)
    colors = _hsv_to_rgb(s, np.full(n, 0.75), np.full(n, 0.9))
    return means, rot, spacing, colors


def _plane(n, rng):
    xy = rng.uniform(-PLANE_HALF, PLANE_HALF, size=(n, 2))
    means = np.concatenate([xy, np.full((n, 1), PLANE_Z)], 1)
    normal = np.tile([[0.0, 0.0, 1.0]], (n, 1))
    rot = _tangent_frame(normal, rng.uniform(0.0, 2.0 * math.pi, n))
    spacing = math.sqrt((2.0 * PLANE_HALF) ** 2 / n)
    cell = (np.floor(xy[:, 0] / CHECKER) + np.floor(xy[:, 1] / CHECKER)).astype(np.int64) % 2
    colors = np.where(cell[:, None] == 0, np.array([[0.88, 0.86, 0.80]]), np.array([[0.18, 0.20, 0.26]]))
    return means, rot, spacing, colors


def make_scene(n: int = 160_000, sh_degree: int = 3, seed: int = 0, *, device=None,
               dtype=torch.float32) -> GaussianModel:
    """The procedural scene as a :class:`~rigel_core.model.GaussianModel` of exactly ``n`` Gaussians.

    45 % sphere shell (colour ``0.5 + 0.4·normal``), 20 % helix tube (rainbow along its length), 35 % checkered
    plane; base colours lie in [0.1, 0.9]. Each Gaussian is an ellipsoid in its surface's tangent frame: in-plane standard deviations
    ≈ 0.8·spacing × (1.3, 0.75) (spacing = √(area / count)), 0.08·spacing along the normal, ±10 % log-normal
    jitter; opacities 0.8–0.97. SH coefficients above degree 0 (for ``sh_degree`` ≥ 1) are small uniform noise,
    bounded so that each degree moves a colour by at most ``SH_BAND_SHIFT`` (0.03): colours change a little
    with the viewing direction and never leave [0, 1]. Deterministic for a
    ``seed`` (numpy's PCG64), independent of ``device``.

    Raises ValueError for n < 3 or an SH degree outside 0..3.
    """
    if n < 3:
        raise ValueError(f"make_scene needs n >= 3 Gaussians (one per part), got {n}")
    if not 0 <= sh_degree <= 3:
        raise ValueError(f"sh_degree must be in 0..3, got {sh_degree}")
    rng = np.random.default_rng(seed)
    counts = [max(1, round(n * SHARES[0])), max(1, round(n * SHARES[1]))]
    counts.append(n - sum(counts))
    means, rots, scales, colors = [], [], [], []
    for part, count in zip((_sphere, _helix, _plane), counts):
        m, r, spacing, c = part(count, rng)
        base = 0.8 * spacing * np.array([1.3, 0.75, 0.1])
        if part is _helix:  # elongated along the curve, narrower around the tube
            base = spacing * np.array([1.6, 0.6, 0.08])
        means.append(m)
        rots.append(r)
        scales.append(base * np.exp(0.1 * rng.normal(size=(count, 3))))
        colors.append(c)
    means, rots, scales, colors = (np.concatenate(x) for x in (means, rots, scales, colors))
    opac = rng.uniform(0.8, 0.97, n)
    k = num_sh_bases(sh_degree) - 1
    rest = np.zeros((n, k, 3))
    for l in range(1, sh_degree + 1):
        # Σ_m |Y_lm(d)| ≤ (2l+1)/√(4π) for any direction d (Cauchy–Schwarz on the addition theorem
        # Σ_m Y_lm² = (2l+1)/4π), so coefficients in ±a_l change a colour by at most SH_BAND_SHIFT per degree
        a_l = SH_BAND_SHIFT * math.sqrt(4.0 * math.pi) / (2 * l + 1)
        rest[:, l * l - 1:(l + 1) ** 2 - 1] = rng.uniform(-a_l, a_l, size=(n, 2 * l + 1, 3))
    conv = lambda a: torch.as_tensor(np.asarray(a, dtype=np.float64), dtype=dtype, device=device)
    return GaussianModel(conv(means), conv(np.log(scales)), conv(rotmat_to_quat(rots)),
                         conv(np.log(opac / (1.0 - opac))), conv(rgb_to_sh(colors)[:, None, :]), conv(rest))


# ---- rendering the scene into a dataset --------------------------------------------------------------------

def _c2w_opengl(cam: Camera) -> np.ndarray:
    """(4,4) camera-to-world in the OpenGL convention (Blender's ``transform_matrix``)."""
    c2w = cam.c2w.copy()
    c2w[:3, 1:3] *= -1.0
    return c2w


def _train_cameras(n, width, height, fov_x_deg, distance, rng) -> list[Camera]:
    cams = []
    while len(cams) < n:
        d = rng.normal(size=3)
        d /= np.linalg.norm(d)
        if abs(d[2]) > 0.95:  # looking straight up/down: the world-up is undefined there
            continue
        eye = d * distance * rng.uniform(0.9, 1.1)
        cams.append(Camera.look_at(eye, (0.0, 0.0, 0.0), (0.0, 0.0, 1.0), width=width, height=height,
                                   fov_x_deg=fov_x_deg, name=f"r_{len(cams)}"))
    return cams


def _orbit_cameras(n, width, height, fov_x_deg, distance, elevation_deg=25.0) -> list[Camera]:
    el = math.radians(elevation_deg)
    cams = []
    for i in range(n):
        az = 2.0 * math.pi * (i + 0.5) / n
        eye = distance * np.array([math.cos(el) * math.cos(az), math.cos(el) * math.sin(az), math.sin(el)])
        cams.append(Camera.look_at(eye, (0.0, 0.0, 0.0), (0.0, 0.0, 1.0), width=width, height=height,
                                   fov_x_deg=fov_x_deg, name=f"r_{i}"))
    return cams


def make_dataset(out_dir, n_gaussians: int, width: int, height: int, n_train: int = 100, n_test: int = 24,
                 seed: int = 0, renderer=render, *, sh_degree: int = 3, device=None, fov_x_deg: float = 55.0,
                 progress: bool = True, writers: int | None = None) -> GaussianModel:
    """Render :func:`make_scene` into a Blender / NeRF-synthetic dataset with exact ground truth.

    Writes ``out_dir/transforms_{train,test}.json`` (``camera_angle_x`` plus ``w``/``h``; ``file_path`` without
    extension, like NeRF-synthetic) and ``out_dir/{train,test}/r_<i>.png``: 8-bit RGBA, straight alpha with
    alpha = 1 − final_T, so that compositing onto a background reproduces the render on that background up to
    8-bit rounding (≤ 1/255). Train cameras look at the origin from random directions on a sphere of radius
    ≈ 2.3 × the scene radius (±10 %); test cameras are a held-out orbit at 25° elevation. Also writes the
    ground-truth scene as ``out_dir/scene.ply`` when :mod:`rigel_core.io` can save PLY.

    Args:
        renderer: ``f(model, camera, background=None) -> RenderOutput``; default :func:`rigel_core.render`
            (CUDA kernels for a CUDA device, the PyTorch reference on the CPU).
        device: where to build and render the scene; default CUDA when :func:`rigel_core.cuda_available`, else CPU.
        writers: threads encoding the PNGs while the next views render (default min(8, CPUs); 1: in turn). PNG
            encoding releases the GIL, and at 1080p it takes longer than a render (a 2,000-view capture written
            in turn took minutes); the files are the same whatever the count.
    Returns: the ground-truth :class:`~rigel_core.model.GaussianModel`.
    """
    from concurrent.futures import ThreadPoolExecutor

    from tqdm import tqdm

    from .. import cuda_available
    from .images import write_render_rgba

    if device is None:
        device = "cuda" if cuda_available() else "cpu"
    out = Path(out_dir)
    model = make_scene(n_gaussians, sh_degree=sh_degree, seed=seed, device=device)
    rng = np.random.default_rng(seed + 1)
    distance = 2.3 * SCENE_RADIUS
    splits = {"train": _train_cameras(n_train, width, height, fov_x_deg, distance, rng),
              "test": _orbit_cameras(n_test, width, height, fov_x_deg, distance)}
    writers = max(1, int(writers if writers is not None else min(8, os.cpu_count() or 1)))
    bar = tqdm(total=n_train + n_test, desc="rendering dataset", unit="view", disable=not progress)
    with ThreadPoolExecutor(writers, thread_name_prefix="rigel-png") as pool:
        pending: list = []  # at most 2 × writers renders wait in host memory
        for split, cams in splits.items():
            (out / split).mkdir(parents=True, exist_ok=True)
            frames = []
            for cam in cams:
                with torch.no_grad():
                    r = renderer(model, cam, background=None)
                image, final_T = r.image.cpu(), r.final_T.cpu()  # the device read stays on this thread
                pending.append(pool.submit(write_render_rgba, out / split / f"{cam.name}.png", image, final_T))
                frames.append({"file_path": f"./{split}/{cam.name}", "transform_matrix": _c2w_opengl(cam).tolist()})
                while len(pending) > 2 * writers or (pending and pending[0].done()):
                    pending.pop(0).result()  # a write's error surfaces here
                    bar.update(1)
            while pending:  # the split's images all written before its transforms file names them
                pending.pop(0).result()
                bar.update(1)
            meta = {"camera_angle_x": cams[0].fov_x if cams else math.radians(fov_x_deg), "w": width, "h": height,
                    "frames": frames}
            (out / f"transforms_{split}.json").write_text(json.dumps(meta, indent=2))
    bar.close()
    save_ply = _ply_writer()
    if save_ply is not None:
        save_ply(model.to("cpu"), out / "scene.ply")
    return model


def _ply_writer():
    """``rigel_core.io.save_ply(model, path)``, or None when the io package is not available."""
    try:
        from ..io import save_ply
    except ImportError:
        return None
    return save_ply
