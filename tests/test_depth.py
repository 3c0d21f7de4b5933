"""Depth output of the reference rasterizer (docs/PIPELINE.md "Depth"), against independent float64 computations.

* forward: a naive per-pixel compositor (every live Gaussian in (depth, index) order, Python loops) gives
  Σ wᵢzᵢ, the expected depth and the median depth of each pixel;
* backward: the expected depth written densely (every pixel × every Gaussian, no tiles, no blocks, sorted by
  (depth, index)) and differentiated by float64 autograd, ≤ 1e-5 relative per input group; and gradcheck
  (finite differences) through the whole reference render, down to means3D;
* edge cases forced: pixels no Gaussian reaches, a single opaque Gaussian, T never crossing ½, T landing on ½
  exactly, equal depths (exact duplicates and distinct Gaussians at one depth), pixels stopped at T_MIN;
* the colour outputs and their gradients are unchanged when depth is asked for.
"""
from __future__ import annotations

import math

import pytest
import torch

import rigel_core as rc
from rigel_core import config
from rigel_core.reference import (RasterDepth, bin_gaussians, expected_depth, project_gaussians, rasterize_tiles,
                                  render_reference)

from helpers import cam_tensors, random_camera, random_gaussians

TOL = 1e-5


def naive_depth(means2D, conics, opac, depths, live, w, h):
    """Per pixel, in (depth, index) order with the guards of PIPELINE.md [3]: (Σ w z, final_T, median) float64."""
    zl, m2l, cl, ol = (t.detach().double().tolist() for t in (depths, means2D, conics, opac))
    order = sorted(live, key=lambda i: (zl[i], i))
    gs = [(m2l[i][0], m2l[i][1], *cl[i], ol[i], zl[i]) for i in order]
    dsum = torch.zeros(h, w, dtype=torch.float64)
    fT = torch.ones(h, w, dtype=torch.float64)
    med = torch.zeros(h, w, dtype=torch.float64)
    for y in range(h):
        for x in range(w):
            T, acc, m = 1.0, 0.0, 0.0
            for u, v, A, B, C, o, z in gs:
                dx, dy = x + 0.5 - u, y + 0.5 - v
                q = A * dx * dx + 2 * B * dx * dy + C * dy * dy
                if q > config.RADIUS_SIGMA ** 2:
                    continue
                a = min(config.ALPHA_MAX, o * math.exp(-0.5 * q))
                if a < config.ALPHA_MIN:
                    continue
                T_new = T * (1 - a)
                if T_new < config.T_MIN:
                    break
                acc += z * a * T
                if T > 0.5 >= T_new:
                    m = z
                T = T_new
            dsum[y, x], fT[y, x], med[y, x] = acc, T, m
    return dsum, fT, med


def dense_expected_depth(means2D, conics, opac, depths, live, w, h):
    """(H,W) expected depth, every pixel against every live Gaussian at once (no tiles): float64 autograd oracle.

    The skip/stop decisions are taken on detached values (they are piecewise constant), the weights are formed
    from the attached ones: w_i = α_i Π_{j<i}(1 − α_j) over the blended entries, ED = Σ w z / Σ w (0 if Σ w = 0).
    """
    idx = torch.tensor(sorted(live, key=lambda i: (float(depths[i].detach()), i)), dtype=torch.long)
    ys, xs = torch.meshgrid(torch.arange(h, dtype=torch.float64), torch.arange(w, dtype=torch.float64),
                            indexing="ij")
    P = torch.stack([xs.reshape(-1) + 0.5, ys.reshape(-1) + 0.5], -1)  # (HW, 2)
    d = P[:, None, :] - means2D[idx][None]  # (HW, n, 2)
    A, B, C = conics[idx].unbind(-1)
    q = A * d[..., 0] ** 2 + 2 * B * d[..., 0] * d[..., 1] + C * d[..., 1] ** 2
    alpha = torch.clamp_max(opac[idx] * torch.exp(-0.5 * q), config.ALPHA_MAX)
    with torch.no_grad():
        use = (q <= config.RADIUS_SIGMA ** 2) & (alpha >= config.ALPHA_MIN)
        a0 = torch.where(use, alpha, torch.zeros_like(alpha))
        T_after = torch.cumprod(1 - a0, 1)
        blended = use & ~(torch.cumsum((T_after < config.T_MIN).long(), 1) > 0)
    a = torch.where(blended, alpha, torch.zeros_like(alpha))
    T_before = torch.cat([torch.ones_like(a[:, :1]), torch.cumprod(1 - a, 1)[:, :-1]], 1)
    wts = a * T_before
    sw = wts.sum(1)
    num = (wts * depths[idx][None]).sum(1)
    ed = torch.where(sw > 0, num / torch.where(sw > 0, sw, torch.ones_like(sw)), torch.zeros_like(sw))
    return ed.reshape(h, w)


def project_and_bin(rng, n, w, h, opac=None, dtype=torch.float64, **kw):
    cam = random_camera(rng, w, h, dist=3.0)
    means, quats, scales, op, _ = random_gaussians(rng, n, dtype=dtype, **kw)
    if opac is not None:
        op = opac(n).to(dtype)
    vm, K = cam_tensors(cam, dtype)
    p = project_gaussians(means, quats, scales, op, vm, K, w, h)
    b = bin_gaussians(p.means2D, p.conics, op, p.depths, p.radii, w, h)
    return p, b, op


def raster_depth(p2, con, op, z, b, w, h, colors=None, bg=None):
    colors = torch.zeros(p2.shape[0], 3, dtype=p2.dtype) if colors is None else colors
    return rasterize_tiles(p2, con, colors, op, b.gaussian_ids, b.tile_ranges, b.tiles_x, b.tiles_y, w, h, bg,
                           depths=z)


def check_forward(p, b, op, w, h):
    r = raster_depth(p.means2D, p.conics, op, p.depths, b, w, h)
    assert isinstance(r, RasterDepth)
    live = torch.nonzero(p.radii > 0).flatten().tolist()
    dsum, fT, med = naive_depth(p.means2D, p.conics, op, p.depths, live, w, h)
    torch.testing.assert_close(r.final_T, fT, rtol=0, atol=1e-12)
    torch.testing.assert_close(r.depth_sum, dsum, rtol=0, atol=1e-12)
    assert torch.equal(r.depth_median, med), "median depth differs from the brute-force per-pixel crossing"
    ed = expected_depth(r.depth_sum, r.final_T)
    ref_ed = torch.where(fT < 1, dsum / (1 - fT).clamp_min(1e-300), torch.zeros_like(fT))
    torch.testing.assert_close(ed, ref_ed, rtol=1e-12, atol=1e-12)
    return r


def test_forward_matches_naive_compositor(rng):
    p, b, op = project_and_bin(rng, 40, 37, 29, scale_range=(-2.5, -0.8))
    r = check_forward(p, b, op, 37, 29)
    assert (r.final_T < 0.5).any() and (r.final_T > 0.5).any(), "scene does not cross ½ in some pixels only"
    assert (r.depth_median > 0).any() and (r.depth_median == 0).any()


def test_forward_stopped_pixels_and_saturated_alpha(rng):
    """Dense opaque layers: pixels stop at T_MIN (the stopping entry is not blended), alpha clamps at ALPHA_MAX."""
    p, b, op = project_and_bin(rng, 120, 20, 18, opac=lambda n: 0.995 + 0.005 * torch.rand(n, generator=rng,
                                                                                           dtype=torch.float64),
                               scale_range=(-2.5, -0.8))
    r = check_forward(p, b, op, 20, 18)
    assert (r.final_T < 1e-3).any(), "no pixel reached early termination"


def test_median_never_crosses_half(rng):
    """Faint Gaussians: T stays above ½ everywhere — median 0 everywhere, expected depth still positive."""
    p, b, op = project_and_bin(rng, 6, 24, 20, opac=lambda n: torch.full((n,), 0.06, dtype=torch.float64),
                               scale_range=(-1.5, -0.8))
    r = check_forward(p, b, op, 24, 20)
    assert (r.final_T > 0.5).all()
    assert torch.equal(r.depth_median, torch.zeros_like(r.depth_median))
    assert (expected_depth(r.depth_sum, r.final_T) > 0).any()


def _single(w, h, mean, conic, opacity, z, dtype=torch.float64):
    """One or more hand-made projected Gaussians (means2D (k,2), conics (k,3), opacities (k,), depths (k,))."""
    m2 = torch.tensor(mean, dtype=dtype).reshape(-1, 2)
    con = torch.tensor(conic, dtype=dtype).reshape(-1, 3)
    op = torch.tensor(opacity, dtype=dtype).reshape(-1)
    z = torch.tensor(z, dtype=dtype).reshape(-1)
    radii = torch.full((m2.shape[0],), 64, dtype=torch.int32)  # every tile of the small images: binning decides
    b = bin_gaussians(m2, con, op, z, radii, w, h)
    return m2, con, op, z, b


def test_single_opaque_gaussian_and_empty_pixels():
    """Expected depth is z wherever it is seen, 0 (and finite gradient) where nothing is; the median is z exactly
    where α ≥ ½ (T = 1 − α ≤ ½) and 0 elsewhere; the centre pixel lands on T = ½ exactly when opacity = ½."""
    w, h = 40, 24
    for opacity in (1.0, 0.5):
        m2, con, op, z, b = _single(w, h, [10.5, 8.5], [0.08, 0.01, 0.06], [opacity], [2.75])
        z.requires_grad_()
        r = raster_depth(m2, con, op, z, b, w, h)
        ed = expected_depth(r.depth_sum, r.final_T)
        seen = r.final_T < 1
        assert seen.any() and (~seen).any()
        torch.testing.assert_close(ed[seen], torch.full_like(ed[seen], 2.75), rtol=1e-14, atol=0)
        assert torch.all(ed[~seen] == 0) and torch.all(r.depth_median[~seen] == 0)
        alpha = 1 - r.final_T
        assert torch.equal(r.depth_median, torch.where(alpha >= 0.5, 2.75, 0.0).to(torch.float64))
        if opacity == 0.5:
            assert float(r.final_T[8, 10]) == 0.5 and float(r.depth_median[8, 10]) == 2.75  # T_new ≤ ½ inclusive
            assert int((r.depth_median > 0).sum()) == 1
        ed.sum().backward()
        assert torch.isfinite(z.grad).all()
        torch.testing.assert_close(z.grad, seen.sum().to(torch.float64).reshape(1))  # ∂ED/∂z = 1 where seen


def test_equal_depths():
    """Exact duplicates (same depth bits: index order) and distinct Gaussians at one depth: expected depth is
    that depth; the median is that depth where T crosses ½; the naive compositor agrees."""
    w, h = 32, 32
    m2, con, op, z, b = _single(w, h, [[12.0, 13.0], [12.0, 13.0], [18.0, 17.0], [5.0, 25.0]],
                                [[0.05, 0.0, 0.05], [0.05, 0.0, 0.05], [0.03, -0.01, 0.07], [0.1, 0.02, 0.04]],
                                [0.4, 0.4, 0.7, 0.3], [1.5, 1.5, 1.5, 1.5])
    r = raster_depth(m2, con, op, z, b, w, h)
    dsum, fT, med = naive_depth(m2, con, op, z, [0, 1, 2, 3], w, h)
    torch.testing.assert_close(r.depth_sum, dsum, rtol=0, atol=1e-12)
    assert torch.equal(r.depth_median, med)
    seen = r.final_T < 1
    torch.testing.assert_close(expected_depth(r.depth_sum, r.final_T)[seen], torch.full_like(r.final_T[seen], 1.5),
                               rtol=1e-12, atol=0)
    assert ((r.depth_median == 1.5) & (r.final_T < 0.5)).any()


@pytest.mark.parametrize("opac_lo", [0.05, 0.95])
def test_backward_matches_dense_autograd(rng, opac_lo):
    """∂(Σ_p u_p ED_p)/∂(means2D, conics, opacities, depths): tile rasterizer vs the dense formula, float64."""
    w, h = 33, 27
    n = 30
    p, b, op = project_and_bin(rng, n, w, h, opac=lambda k: opac_lo + (1 - opac_lo) * torch.rand(
        k, generator=rng, dtype=torch.float64), scale_range=(-2.5, -1.0))
    live = torch.nonzero(p.radii > 0).flatten().tolist()
    u = torch.randn(h, w, generator=rng, dtype=torch.float64)
    base = [t.detach().clone() for t in (p.means2D, p.conics, op, p.depths)]
    grads = []
    for fn in ("tiles", "dense"):
        x = [t.clone().requires_grad_() for t in base]
        if fn == "tiles":
            r = raster_depth(*x, b, w, h)
            ed = expected_depth(r.depth_sum, r.final_T)
        else:
            ed = dense_expected_depth(*x, live, w, h)
        (ed * u).sum().backward()
        grads.append([t.grad for t in x])
        if fn == "tiles":
            ed_tiles = ed.detach()
    torch.testing.assert_close(ed_tiles, dense_expected_depth(*base, live, w, h), rtol=0, atol=1e-10)
    for name, a, c in zip(("means2D", "conics", "opacities", "depths"), *grads):
        err = float((a - c).norm() / c.norm().clamp_min(1e-300))
        assert err <= TOL, f"{name}: relative error {err:.2e}"
        assert torch.count_nonzero(c) > 0, name


def test_backward_through_projection_gradcheck(rng):
    """Finite differences of the whole reference render's expected depth w.r.t. means3D, scales, opacities."""
    w, h = 20, 16
    cam = random_camera(rng, w, h, dist=3.0)
    means, quats, scales, op, colors = random_gaussians(rng, 6, scale_range=(-1.6, -1.0))
    vm, K = cam_tensors(cam)
    u = torch.randn(h, w, generator=rng, dtype=torch.float64)

    def f(m, s, o):
        out = rc.rasterize_gaussians(m, quats, s, o, colors, vm, K, w, h, depth=True)
        return (out.depth * u).sum()

    x = [t.clone().requires_grad_() for t in (means, scales, op)]
    assert float(f(*x).detach()) != 0, "camera sees nothing"
    torch.autograd.gradcheck(f, x, eps=1e-7, atol=1e-5, rtol=1e-4)


def test_colour_outputs_unchanged_with_depth(rng):
    """depth=True changes nothing of the colour pass: image, final_T, n_contrib bit for bit, and their
    gradients; the new fields are None when depth is not asked for."""
    w, h = 41, 30
    cam = random_camera(rng, w, h)
    g = random_gaussians(rng, 200, scale_range=(-3, -1))
    vm, K = cam_tensors(cam)
    wi = torch.randn(h, w, 3, generator=rng, dtype=torch.float64)
    outs, grads = [], []
    for depth in (False, True):
        x = [t.clone().requires_grad_() for t in g]
        out = rc.rasterize_gaussians(*x, vm, K, w, h, background=(0.2, 0.3, 0.4), depth=depth)
        (out.image * wi).sum().backward()
        outs.append(out)
        grads.append([t.grad for t in x])
    a, d = outs
    assert a.depth is None and a.depth_median is None
    assert d.depth.shape == (h, w) and d.depth_median.shape == (h, w) and not d.depth_median.requires_grad
    assert torch.equal(a.image, d.image) and torch.equal(a.final_T, d.final_T) and torch.equal(a.n_contrib,
                                                                                                d.n_contrib)
    for ga, gd in zip(*grads):
        assert torch.equal(ga, gd)
    assert (d.depth > 0).any()


def test_render_model_depth_float32_matches_float64(rng):
    """``render(model, cam, depth=True)`` on the CPU: float32 within 1e-4 of float64 (relative to the depth)."""
    means, quats, scales, opac, _ = random_gaussians(rng, 300, spread=1.0, scale_range=(-3, -1.5))
    model = rc.GaussianModel.from_tensors(means.float(), torch.log(scales).float(), quats.float(),
                                          torch.logit(opac).float(), torch.zeros(300, 1, 3), torch.zeros(300, 0, 3))
    cam = random_camera(rng, 48, 40)
    r32 = rc.render(model, cam, depth=True)
    r64 = rc.render(model.to(dtype=torch.float64), cam, depth=True)
    seen = r64.final_T < 0.99
    assert seen.any()
    rel = ((r32.depth.double() - r64.depth).abs() / r64.depth.clamp_min(1e-9))[seen]
    assert float(rel.max()) < 1e-4
    same = r32.depth_median.double() == r64.depth_median
    close = (r32.depth_median.double() - r64.depth_median).abs() <= 1e-5 * r64.depth_median.abs()
    assert float((same | close).double().mean()) > 0.99


def test_real_ply_depth_float32_vs_float64(shared_data):
    """A real trained scene (donut PLY, every 16th Gaussian: CPU time) on the CPU: float32 expected and median
    depth vs the float64 reference, PSNR (peak = the largest reference depth) ≥ 50 dB; the GPU twin, on whole
    scenes at 512×512, is tests/test_cuda_depth.py."""
    from rigel_core.io import load_scene

    path = shared_data / "ply" / "donut_mipsplatting_sh0.ply"
    if not path.exists():
        pytest.skip(f"{path} not present")
    model = load_scene(path)
    model = model.subset(torch.arange(0, model.num_gaussians, 16))
    c, e = model.center().detach().double().numpy(), model.extent()
    cam = rc.Camera.look_at(c + e * torch.tensor([1.3, -0.9, 0.8], dtype=torch.float64).numpy(), c, (0, 0, 1),
                            width=64, height=64, fov_x_deg=50)
    got = rc.render(model, cam, depth=True)
    ref = rc.render(model.to(dtype=torch.float64), cam, depth=True)
    assert float(ref.final_T.min()) < 0.5 and (ref.depth_median > 0).any(), "camera does not see the scene"
    for a, b in ((got.depth, ref.depth), (got.depth_median, ref.depth_median)):
        mse = float(((a.double() - b) ** 2).mean())
        assert mse == 0 or 10 * math.log10(float(b.max()) ** 2 / mse) >= 50
