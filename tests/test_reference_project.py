"""Reference projection vs a float64 closed form written independently here, one Gaussian at a time."""
import math

import numpy as np
import pytest
import torch

from rigel_core import Camera, config
from rigel_core.reference import project_gaussians
from helpers import cam_tensors, random_camera, random_gaussians


def closed_form(mean, quat, scale, opac, cam, near=config.NEAR_PLANE, far=config.FAR_PLANE):
    """Projection of one Gaussian with plain numpy scalars: (means2D, conic, depth, radius) or None if culled."""
    if not (np.all(np.isfinite(mean)) and np.all(np.isfinite(quat)) and np.all(np.isfinite(scale)) and np.isfinite(opac)):
        return None
    if np.dot(quat, quat) < 1e-24:
        return None
    W, t = cam.viewmat[:3, :3], cam.viewmat[:3, 3]
    x, y, z = W @ mean + t
    if not (near < z < far):
        return None
    w, a, b, c = quat / np.linalg.norm(quat)
    # rotation of a unit quaternion, from the half-angle formula R = (w² − |v|²) I + 2 v vᵀ + 2 w [v]×
    v = np.array([a, b, c])
    cross = np.array([[0, -c, b], [c, 0, -a], [-b, a, 0]])
    R = (w * w - v @ v) * np.eye(3) + 2 * np.outer(v, v) + 2 * w * cross
    Sigma = R @ np.diag(np.asarray(scale) ** 2) @ R.T
    lx = config.TAN_CLAMP * cam.width / (2 * cam.fx)
    ly = config.TAN_CLAMP * cam.height / (2 * cam.fy)
    txz, tyz = min(max(x / z, -lx), lx), min(max(y / z, -ly), ly)
    J = np.array([[cam.fx / z, 0, -cam.fx * txz / z], [0, cam.fy / z, -cam.fy * tyz / z]])
    S2 = J @ W @ Sigma @ W.T @ J.T + config.LOWPASS * np.eye(2)
    det = np.linalg.det(S2)
    if not det > 0:
        return None
    conic = np.linalg.inv(S2)
    lam = np.linalg.eigvalsh(S2).max()
    r = math.ceil(config.RADIUS_SIGMA * math.sqrt(lam))
    u, vv = cam.fx * x / z + cam.cx, cam.fy * y / z + cam.cy
    T = config.TILE_SIZE
    tx, ty = -(-cam.width // T), -(-cam.height // T)
    x0, x1 = min(max(math.floor((u - r) / T), 0), tx), min(max(math.floor((u + r) / T) + 1, 0), tx)
    y0, y1 = min(max(math.floor((vv - r) / T), 0), ty), min(max(math.floor((vv + r) / T) + 1, 0), ty)
    if x1 <= x0 or y1 <= y0:
        return None
    return np.array([u, vv]), np.array([conic[0, 0], conic[0, 1], conic[1, 1]]), z, r


def check_against_closed_form(means, quats, scales, opac, cam, **kw):
    vm, K = cam_tensors(cam)
    p = project_gaussians(means, quats, scales, opac, vm, K, cam.width, cam.height, **kw)
    n_live = 0
    for i in range(means.shape[0]):
        ref = closed_form(means[i].numpy(), quats[i].numpy(), scales[i].numpy(), float(opac[i]), cam, **kw)
        if ref is None:
            assert p.radii[i] == 0, f"Gaussian {i} should be culled"
            assert torch.all(p.means2D[i] == 0) and torch.all(p.conics[i] == 0)
            continue
        n_live += 1
        m2, con, z, r = ref
        assert p.radii[i] == r, f"radius of {i}: {int(p.radii[i])} vs {r}"
        np.testing.assert_allclose(p.means2D[i].numpy(), m2, rtol=1e-12, atol=1e-9)
        np.testing.assert_allclose(p.conics[i].numpy(), con, rtol=1e-9, atol=1e-12)
        assert abs(float(p.depths[i]) - z) < 1e-12
    return p, n_live


def test_random_scene_matches_closed_form(rng):
    cam = random_camera(rng)
    g = random_gaussians(rng, 300, scale_range=(-4, 0))
    p, n_live = check_against_closed_form(*g[:4], cam)
    assert n_live > 50  # the test exercised the visible path


def test_each_cull_branch_fires(rng):
    cam = Camera.look_at((0, -4, 0), (0, 0, 0), (0, 0, 1), width=64, height=48, fov_x_deg=60)
    means, quats, scales, opac, _ = random_gaussians(rng, 9, scale_range=(-3, -2))
    means[:] = torch.tensor([0.0, 0.0, 0.0])  # all visible in the middle ...
    means[0, 0] = float("nan")                 # non-finite mean
    scales[1, 2] = float("inf")                # non-finite scale
    quats[2] = 0.0                             # degenerate quaternion
    means[3] = torch.tensor([0.0, -4.0, 0.0])  # at the camera centre: z = 0 (near plane)
    means[4] = torch.tensor([0.0, -8.0, 0.0])  # behind the camera
    means[5] = torch.tensor([100.0, 0.0, 0.0])  # far off-screen to the right
    opac[6] = float("nan")                     # non-finite opacity
    p, n_live = check_against_closed_form(means, quats, scales, opac, cam)
    assert (p.radii[:7] == 0).all() and (p.radii[7:] > 0).all()
    # far plane
    p2 = project_gaussians(means, quats, scales, opac, *cam_tensors(cam), 64, 48, far_plane=3.0)
    assert (p2.radii == 0).all()
    # a zero-determinant 2D covariance cannot happen with the low-pass; NaN radius via huge scale is culled
    scales[8] = 1e200
    p3 = project_gaussians(means, quats, scales, opac, *cam_tensors(cam), 64, 48)
    assert p3.radii[8] == 0


def test_tangent_clamp_branch(rng):
    """Off-axis Gaussians, large enough to reach the image, take the clamped Jacobian."""
    cam = Camera.look_at((0, -4, 0), (0, 0, 0), (0, 0, 1), width=64, height=48, fov_x_deg=60)
    n = 40
    means, quats, scales, opac, _ = random_gaussians(rng, n, scale_range=(-0.5, 0.5))
    # place them beyond 1.3x the half-width in x/z, both sides
    side = torch.where(torch.rand(n, generator=rng) < 0.5, -1.0, 1.0).double()
    means[:, 0] = side * (4.0 * 0.58 * 1.3 * (1.1 + torch.rand(n, generator=rng, dtype=torch.float64)))
    means[:, 1] = 0.0
    p, n_live = check_against_closed_form(means, quats, scales, opac, cam)
    assert n_live >= 5, "the clamp set must reach the image"
    xz = (means[:, 0] / 4.0).abs()
    assert bool((xz > config.TAN_CLAMP * 32 / cam.fx).all())


def test_straddling_near_plane(rng):
    cam = Camera.look_at((0, -4, 0), (0, 0, 0), (0, 0, 1), width=64, height=48)
    means, quats, scales, opac, _ = random_gaussians(rng, 50, scale_range=(-2, 0))
    means[:, 1] = -4.0 + (torch.rand(50, generator=rng, dtype=torch.float64) - 0.5) * 0.05  # z ∈ (−0.025, 0.025)
    check_against_closed_form(means, quats, scales, opac, cam)


def test_float32_close_to_float64(rng):
    cam = random_camera(rng)
    g = random_gaussians(rng, 200)
    p64 = project_gaussians(*g[:4], *cam_tensors(cam), cam.width, cam.height)
    p32 = project_gaussians(*(x.float() for x in g[:4]), *cam_tensors(cam, torch.float32), cam.width, cam.height)
    live = (p64.radii > 0) & (p32.radii > 0)
    assert (p64.radii > 0).eq(p32.radii > 0).float().mean() > 0.98
    torch.testing.assert_close(p32.means2D[live].double(), p64.means2D[live], rtol=1e-5, atol=1e-3)
