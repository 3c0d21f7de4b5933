"""Random scene builders shared by the tests (fresh inputs each run from the test's generator)."""
import math

import numpy as np
import torch

from rigel_core import Camera, config


def random_camera(gen, width=64, height=48, dist=4.0):
    """A look-at camera at a random direction around the origin, random focal length."""
    d = torch.randn(3, generator=gen, dtype=torch.float64).numpy()
    d /= np.linalg.norm(d)
    up = (0.0, 0.0, 1.0) if abs(d[2]) < 0.9 else (0.0, 1.0, 0.0)
    fov = 40 + 30 * float(torch.rand(1, generator=gen))
    cam = Camera.look_at(d * dist, (0, 0, 0), up, width=width, height=height, fov_x_deg=fov)
    # an off-centre principal point and fx != fy exercise every intrinsic
    cam.cx += float(torch.rand(1, generator=gen) - 0.5) * 4
    cam.cy += float(torch.rand(1, generator=gen) - 0.5) * 4
    cam.fy *= 1.0 + 0.1 * float(torch.rand(1, generator=gen))
    return cam


def random_gaussians(gen, n, dtype=torch.float64, spread=1.0, scale_range=(-3.0, -1.0)):
    """Activated Gaussians: means3D, quats (non-unit), scales, opacities, colors."""
    means = (torch.rand(n, 3, generator=gen, dtype=dtype) * 2 - 1) * spread
    quats = torch.randn(n, 4, generator=gen, dtype=dtype) * (0.5 + torch.rand(n, 1, generator=gen, dtype=dtype))
    lo, hi = scale_range
    scales = torch.exp(lo + (hi - lo) * torch.rand(n, 3, generator=gen, dtype=dtype))
    opac = 0.05 + 0.9 * torch.rand(n, generator=gen, dtype=dtype)
    colors = torch.rand(n, 3, generator=gen, dtype=dtype)
    return means, quats, scales, opac, colors


def cam_tensors(cam, dtype=torch.float64):
    return cam.viewmat_tensor(dtype=dtype), cam.K_tensor(dtype=dtype)


def real_scene_pair(shared_data, name, device):
    """``(model, model64)``: the real scene file ``shared_data/name`` loaded on ``device`` (float32) and its float64
    copy — the inputs of the CUDA-vs-reference checks on trained scenes; skips the test when the file is absent."""
    import pytest

    from rigel_core.io import load_scene

    path = shared_data / name
    if not path.exists():
        pytest.skip(f"{path} not present")
    if path.suffix == ".spz":  # the SPZ sample is version 4, zstd-compressed: its reader needs zstandard
        pytest.importorskip("zstandard", reason=f"{path.name} is zstd-compressed; zstandard is not installed")
    model = load_scene(path, device=device)
    return model, model.to(dtype=torch.float64)


# ---- warp boxes (csrc/rasterize_common.cuh box_mask), emulated in numpy float32 --------------------------------

def _fma32(a, b, c):
    """fmaf(a, b, c) for float32 arrays: the product is exact in float64; one more rounding than a true fma
    on the sum (a 1-ulp difference at most, far inside box_mask's margins)."""
    return (a.astype(np.float64) * b.astype(np.float64) + c.astype(np.float64)).astype(np.float32)


def box_mask_np(u, v, A, B2, C, opacity, tile_x0, tile_y0):
    """box_mask of csrc/rasterize_common.cuh, one uint8 per entry (bit w: warp w's 8x4 box), float32 numpy.

    The kernel's log, reciprocal and square root are the hardware's (a few ulp); these are correctly rounded. The
    margins (1e-3 on Q', 1e-5 relative and 1e-3 px on the extents) exceed that difference by orders of magnitude.

    Every argument broadcasts; u, v, A, B2 = 2B, C, opacity float32 (the staged conic and activated opacity).
    """
    f = np.float32
    shape = np.broadcast_shapes(*(np.shape(x) for x in (u, v, A, B2, C, opacity, tile_x0, tile_y0)))
    u, v, A, B2, C, o = (np.broadcast_to(np.asarray(x, dtype=f), shape) for x in (u, v, A, B2, C, opacity))
    tile_x0, tile_y0 = (np.broadcast_to(np.asarray(t), shape) for t in (tile_x0, tile_y0))
    with np.errstate(all="ignore"):
        B = f(0.5) * B2
        bb = B * B
        det = _fma32(A, C, -bb) + _fma32(-B, B, bb)
        Q = np.minimum(f(9.0), f(2.0) * np.log(np.maximum(o, f(1e-30)) * f(255.0)).astype(f))
        trace = A + C
        inv_det = f(1) / det
        kappa = trace * trace * inv_det
        Qm = (np.maximum(Q, f(0)) * (f(1) + f(1e-6) * kappa) + f(1e-3)) * inv_det
        ex = np.sqrt(Qm * C) * f(1 + 1e-5) + f(1e-3)
        ey = np.sqrt(Qm * A) * f(1 + 1e-5) + f(1e-3)
        cols = np.zeros(shape, np.uint32)
        rows = np.zeros(shape, np.uint32)
        for bx in range(2):
            lo = (tile_x0 + 8 * bx).astype(f) + f(0.5)
            cols |= ((u + ex >= lo) & (u - ex <= lo + f(7))).astype(np.uint32) << bx
        for by in range(4):
            lo = (tile_y0 + 4 * by).astype(f) + f(0.5)
            rows |= ((v + ey >= lo) & (v - ey <= lo + f(3))).astype(np.uint32) << by
        mask = np.zeros(shape, np.uint32)
        for by in range(4):
            mask |= np.where((rows >> by) & 1, cols << (2 * by), 0).astype(np.uint32)
        # the kernel's order of returns: not positive definite / NaN opacity, kappa, Q < 0, then the extents
        unusable = ~(ex < f(1e30)) | ~(ey < f(1e30)) | ~(np.abs(u) < f(1e30)) | ~(np.abs(v) < f(1e30))
        mask = np.where(unusable, 0xFF, mask)
        mask = np.where(Q < f(-1e-3), 0, mask)
        mask = np.where(~(kappa < f(1e5)), 0xFF, mask)
        mask = np.where(~((A > 0) & (C > 0) & (det > 0) & (o == o)), 0xFF, mask)
    return mask.astype(np.uint8)


def box_of_pixel(x, y):
    """The warp (box) of tile-local pixel (x, y): 8x4 boxes, two per row of boxes (rasterize_common.cuh box_pixel)."""
    return (np.asarray(y) // 4) * 2 + np.asarray(x) // 8


def splats_2d(gen, n, width, height, kappa_hi=50.0):
    """n screen-space splats for rasterizer tests that bypass projection and binning (float32, CPU).

    Centres over the image and up to 8 px beyond; half of them snapped to within 0.3 px of an 8x4 warp-box edge
    (box_mask's boundaries); sigma_min^2 in [0.3, 6] px^2, anisotropy log-uniform up to kappa_hi, any angle;
    opacities in [0.02, 0.9], colours in [0, 1]. Returns means2D (n, 2), conics (n, 3) = (A, B, C), colors (n, 3),
    opacities (n,).
    """
    f64 = dict(generator=gen, dtype=torch.float64)
    u = -8 + (width + 16) * torch.rand(n, **f64)
    v = -8 + (height + 16) * torch.rand(n, **f64)
    snap = torch.rand(n, generator=gen) < 0.5
    u = torch.where(snap, torch.round(u / 8) * 8 + 0.6 * torch.rand(n, **f64) - 0.3, u)
    v = torch.where(snap, torch.round(v / 4) * 4 + 0.6 * torch.rand(n, **f64) - 0.3, v)
    s_min = 0.3 + 5.7 * torch.rand(n, **f64)
    kappa = torch.exp(math.log(kappa_hi) * torch.rand(n, **f64))
    th = math.pi * torch.rand(n, **f64)
    c, s = torch.cos(th), torch.sin(th)
    l1, l2 = 1 / (s_min * kappa), 1 / s_min  # conic eigenvalues
    conics = torch.stack([l1 * c * c + l2 * s * s, (l1 - l2) * c * s, l1 * s * s + l2 * c * c], -1)
    colors = torch.rand(n, 3, **f64)
    opacities = 0.02 + 0.88 * torch.rand(n, **f64)
    return (torch.stack([u, v], -1).float(), conics.float(), colors.float(), opacities.float())


def every_tile_lists(n, width, height, tile=16):
    """gaussian_ids / tile_ranges (int32, CPU) listing all n entries, in index order, in every tile: what the
    rasterizer draws then depends on its own tests alone (3-sigma cut, ALPHA_MIN, warp boxes), not on binning."""
    n_tiles = -(-width // tile) * -(-height // tile)
    ids = torch.arange(n, dtype=torch.int32).repeat(n_tiles)
    starts = torch.arange(n_tiles, dtype=torch.int32) * n
    return ids, torch.stack([starts, starts + n], -1)


def grazing_splats(gen, tiles_x, tiles_y, per_tile, kappa_hi=1e4):
    """Splats whose 3-sigma ellipse {q <= 9} has its extreme point (x or y) on a pixel centre of a warp-box or
    tile edge of its own tile, within float32 rounding of the centre: the fragments box_mask's margins exist for.
    Opacity in [0.4, 0.5], so the 3-sigma cut, not ALPHA_MIN, decides (alpha >= 0.4 e^-4.5 > ALPHA_MIN) and the
    CUDA q and the float32 reference's q are the same float. Returns means2D (n, 2), conics (n, 3), colors (n, 3),
    opacities (n,) float32 and tile lists (gaussian_ids, tile_ranges: each tile lists its own per_tile splats).
    """
    n_tiles = tiles_x * tiles_y
    n = n_tiles * per_tile
    f64 = dict(generator=gen, dtype=torch.float64)
    s_min = 0.3 + 3.7 * torch.rand(n, **f64)
    kappa = torch.exp(math.log(kappa_hi) * torch.rand(n, **f64))
    th = math.pi * torch.rand(n, **f64)
    c, s = torch.cos(th), torch.sin(th)
    l1, l2 = 1 / (s_min * kappa), 1 / s_min
    A, B, C = (x.float().double() for x in (l1 * c * c + l2 * s * s, (l1 - l2) * c * s, l1 * s * s + l2 * c * c))
    det = A * C - B * B
    ex, ey = torch.sqrt(9 * C / det), torch.sqrt(9 * A / det)
    tile = torch.arange(n) // per_tile
    tx, ty = (tile % tiles_x) * 16, (tile // tiles_x) * 16
    edges = torch.tensor([0.5, 7.5, 8.5, 15.5], dtype=torch.float64)  # box / tile edge columns, pixel centres
    row_edges = torch.tensor([0.5, 3.5, 4.5, 7.5, 8.5, 11.5, 12.5, 15.5], dtype=torch.float64)
    any_px = lambda: torch.floor(16 * torch.rand(n, **f64)) + 0.5
    sgn = torch.where(torch.rand(n, generator=gen) < 0.5, -1.0, 1.0).double()
    along_x = torch.rand(n, generator=gen) < 0.5
    xc = tx + torch.where(along_x, edges[torch.randint(0, 4, (n,), generator=gen)], any_px())
    yc = ty + torch.where(along_x, any_px(), row_edges[torch.randint(0, 8, (n,), generator=gen)])
    # x-extreme of {q <= 9} at (u + sgn ex, v - sgn B ex / C); y-extreme at (u - sgn B ey / A, v + sgn ey)
    u = torch.where(along_x, xc - sgn * ex, xc + sgn * B * ey / A)
    v = torch.where(along_x, yc + sgn * B * ex / C, yc - sgn * ey)
    means2D = torch.stack([u, v], -1).float()
    conics = torch.stack([A, B, C], -1).float()
    colors = torch.rand(n, 3, generator=gen)
    opacities = (0.4 + 0.1 * torch.rand(n, **f64)).float()
    ids = torch.arange(n, dtype=torch.int32)
    starts = torch.arange(n_tiles, dtype=torch.int32) * per_tile
    return means2D, conics, colors, opacities, ids, torch.stack([starts, starts + per_tile], -1)


def box_mask_bare_np(u, v, A, B2, C, tile_x0, tile_y0):
    """box_mask without its float32 margins (Q' = Q = RADIUS_SIGMA^2, extents unpadded; opacity ignored): what a
    careless copy would compute. Tests show that it drops fragments that pass, so that they can fail."""
    f = np.float32
    shape = np.broadcast_shapes(*(np.shape(x) for x in (u, v, A, B2, C, tile_x0, tile_y0)))
    u, v, A, B2, C = (np.broadcast_to(np.asarray(x, dtype=f), shape) for x in (u, v, A, B2, C))
    tile_x0, tile_y0 = (np.broadcast_to(np.asarray(t), shape) for t in (tile_x0, tile_y0))
    det = A * C - (f(0.5) * B2) ** 2
    ex, ey = np.sqrt(f(9) * C / det), np.sqrt(f(9) * A / det)
    mask = np.zeros(shape, np.uint32)
    for by in range(4):
        for bx in range(2):
            lox = (tile_x0 + 8 * bx).astype(f) + f(0.5)
            loy = (tile_y0 + 4 * by).astype(f) + f(0.5)
            hit = (u + ex >= lox) & (u - ex <= lox + f(7)) & (v + ey >= loy) & (v - ey <= loy + f(3))
            mask |= hit.astype(np.uint32) << (2 * by + bx)
    return mask.astype(np.uint8)


def stop_rule_ties(n_contrib32, final_T32, n_contrib64, final_T64):
    """(H, W) bool, CPU: pixels whose float32 walk (the CUDA kernel or the float32 reference: ``n_contrib32``,
    ``final_T32``) stopped before the float64 reference's (``n_contrib64``, ``final_T64``) on the exact tie of the
    stop rule: one clamped fragment in front (T = 1 − ALPHA_MAX exactly as float32 computes it) and a clamped one
    next, whose T (1 − ALPHA_MAX)² equals T_MIN in exact arithmetic (3DGS's 0.99 and 1e-4), falls below it in
    float32 (0.99f rounds up, so 1 − 0.99f rounds down) and stays above it in float64, whose walk goes on past it
    (its final T at most that product). Not an error of either side. A scene with a large saturated splat in front
    of another has it on a large share of its pixels (RIGEL_SEED=4087383481 on the H200,
    test_raster_depth_backward: 1222 of 6912 pixels, every one of them this tie)."""
    f32 = torch.float32
    one_clamped = torch.tensor(1.0, dtype=f32) - torch.tensor(config.ALPHA_MAX, dtype=f32)
    two_clamped = (1.0 - config.ALPHA_MAX) ** 2
    return ((final_T32.detach().cpu() == one_clamped) & (n_contrib32.cpu() < n_contrib64.cpu())
            & (final_T64.detach().cpu().double() <= two_clamped * (1 + 1e-9)))


class CudaLooking(torch.Tensor):
    """A CPU tensor that claims to be on CUDA (``is_cuda``, ``device``): the CUDA-or-CPU dispatch
    (:func:`rigel_core._ext.use_kernels`) tested without a GPU; ``t.as_subclass(CudaLooking)``."""

    is_cuda = True

    @property
    def device(self):
        return torch.device("cuda", 0)


def pretend_kernels_built(monkeypatch):
    """Make :func:`rigel_core._ext.use_kernels` find kernels on a machine without them (a stand-in module: a test
    that reaches a real kernel call fails)."""
    from types import SimpleNamespace

    from rigel_core import _ext

    if not _ext.available():
        monkeypatch.setattr(_ext, "_C", SimpleNamespace())
