"""Reference tile rasterizer vs a naive compositor that visits every pixel and every depth-sorted Gaussian; its
chunked walk vs the walk in one piece (bit for bit) and its bounded memory."""
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from rigel_core import config, rasterize_gaussians
from rigel_core.reference import bin_gaussians, project_gaussians, rasterize_tiles
from rigel_core.reference.rasterize import _spans

from helpers import box_mask_bare_np, box_mask_np, box_of_pixel, cam_tensors, random_camera, random_gaussians


def naive_composite(p, opac, colors, w, h, bg):
    """Per pixel, all live Gaussians in (depth, index) order with the guards of PIPELINE.md [3].

    Returns image (h,w,3), final_T (h,w), and the index of the last blended Gaussian per pixel (−1: none).
    """
    live = torch.nonzero(p.radii > 0).flatten().tolist()
    live.sort(key=lambda i: (float(p.depths[i]), i))
    img = torch.zeros(h, w, 3, dtype=torch.float64)
    fT = torch.ones(h, w, dtype=torch.float64)
    last = torch.full((h, w), -1, dtype=torch.long)
    for y in range(h):
        for x in range(w):
            T, acc, lg = 1.0, torch.zeros(3, dtype=torch.float64), -1
            for i in live:
                A, B, C = p.conics[i].tolist()
                dx, dy = x + 0.5 - float(p.means2D[i, 0]), y + 0.5 - float(p.means2D[i, 1])
                q = A * dx * dx + 2 * B * dx * dy + C * dy * dy
                if q > config.RADIUS_SIGMA ** 2:
                    continue
                a = min(config.ALPHA_MAX, float(opac[i]) * math.exp(-0.5 * q))
                if a < config.ALPHA_MIN:
                    continue
                if T * (1 - a) < config.T_MIN:
                    break
                acc += colors[i] * a * T
                T *= 1 - a
                lg = i
            img[y, x] = acc + T * bg
            fT[y, x] = T
            last[y, x] = lg
    return img, fT, last


def _check(rng, n, w, h, opac_lo=0.05):
    cam = random_camera(rng, w, h, dist=3.0)
    means, quats, scales, opac, colors = random_gaussians(rng, n, scale_range=(-2.5, -0.8))
    opac = opac_lo + (1 - opac_lo) * torch.rand(n, generator=rng, dtype=torch.float64)
    bg = torch.rand(3, generator=rng, dtype=torch.float64)
    vm, K = cam_tensors(cam)
    p = project_gaussians(means, quats, scales, opac, vm, K, w, h)
    b = bin_gaussians(p.means2D, p.conics, opac, p.depths, p.radii, w, h)
    r = rasterize_tiles(p.means2D, p.conics, colors, opac, b.gaussian_ids, b.tile_ranges, b.tiles_x, b.tiles_y, w, h, bg)
    img, fT, last = naive_composite(p, opac, colors, w, h, bg)
    # float64 on both sides, same operation order per pixel: only the summation order of colour differs
    torch.testing.assert_close(r.image, img, rtol=0, atol=1e-12)
    torch.testing.assert_close(r.final_T, fT, rtol=0, atol=1e-12)
    # n_contrib is a position in the tile's list: the entry it points at must be the last blended Gaussian
    T = config.TILE_SIZE
    for y in range(h):
        for x in range(w):
            k = int(r.n_contrib[y, x])
            if last[y, x] < 0:
                assert k == 0
                continue
            t = (y // T) * b.tiles_x + x // T
            start = int(b.tile_ranges[t, 0])
            assert k > 0 and int(b.gaussian_ids[start + k - 1]) == int(last[y, x]), (x, y)
    return r, fT


def test_matches_naive_compositor(rng):
    r, fT = _check(rng, 40, 37, 29)
    assert (fT < 0.999).float().mean() > 0.2  # the scene covers the image


def test_early_termination_and_saturation(rng):
    """Dense opaque Gaussians: pixels stop (T < T_MIN) and alpha clamps at ALPHA_MAX."""
    r, fT = _check(rng, 120, 20, 18, opac_lo=0.995)
    assert (fT < 1e-3).any(), "no pixel reached early termination"


def test_out_tensors_and_background():
    """``out=`` is written in place; an empty scene returns the background with final_T = 1."""
    w, h = 20, 12
    out = (torch.full((h, w, 3), float("nan")), torch.full((h, w), float("nan")), torch.full((h, w), -7, dtype=torch.int32))
    z = torch.zeros(0, 3)
    res = rasterize_gaussians(z, torch.zeros(0, 4), z, torch.zeros(0), z, torch.eye(4), torch.tensor(
        [[20.0, 0, 10], [0, 20, 6], [0, 0, 1]]), w, h, background=(0.1, 0.2, 0.3), out=out)
    assert res.image is out[0]
    torch.testing.assert_close(out[0], torch.tensor([0.1, 0.2, 0.3]).expand(h, w, 3))
    assert torch.all(out[1] == 1) and torch.all(out[2] == 0)


def test_float32_matches_float64(rng):
    w, h = 48, 40
    cam = random_camera(rng, w, h)
    g = random_gaussians(rng, 300, scale_range=(-3, -1))
    r64 = rasterize_gaussians(*g, *cam_tensors(cam), w, h)
    r32 = rasterize_gaussians(*(x.float() for x in g), *cam_tensors(cam, torch.float32), w, h)
    d = (r64.image - r32.image.double()).abs().amax(-1)
    # Rounding alone keeps every pixel within 1e-3. The pipeline also has hard cutoffs (q ≤ RADIUS_SIGMA²,
    # alpha ≥ ALPHA_MIN, T·(1 − alpha) ≥ T_MIN): where a Gaussian sits within float32 rounding of one, it counts in
    # one precision only, and the pixel moves by at most the alpha switched (C changes by Δalpha·T·(c − C_behind),
    # colours in [0, 1]). Seed 178: one pixel, q = 9.000009 (float64) vs 8.999998 (float32), alpha 0.0062, off by
    # 0.0017. Such pixels are rare (one in 200 runs of 1920 pixels), so at most two may exceed 1e-3, by no more than
    # the largest alpha a cutoff can switch.
    jump = max(float(g[3].max()) * math.exp(-0.5 * config.RADIUS_SIGMA ** 2), config.ALPHA_MIN,
               config.ALPHA_MAX * config.T_MIN / (1 - config.ALPHA_MAX))
    assert int((d > 1e-3).sum()) <= 2, f"{int((d > 1e-3).sum())} pixels differ by more than 1e-3"
    assert float(d.max()) <= jump + 1e-3


# ---- the chunked walk -------------------------------------------------------------------------------------------

def _raster_and_grads(inputs, b, w, h, bg, G, **kw):
    m2, con, col, op, dep = (x.detach().clone().requires_grad_(True) for x in inputs)
    r = rasterize_tiles(m2, con, col, op, b.gaussian_ids, b.tile_ranges, b.tiles_x, b.tiles_y, w, h, bg, depths=dep,
                        **kw)
    loss = (r.image * G).sum() + (r.depth_sum * G[..., 0]).sum() + (r.final_T * G[..., 1]).sum()
    loss.backward()
    return [r.image, r.final_T, r.n_contrib, r.depth_sum, r.depth_median, m2.grad, con.grad, col.grad, op.grad,
            dep.grad]


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_chunked_walk_is_bit_identical_to_one_piece(rng, dtype):
    """Tiles walked a chunk at a time (gradients recomputed chunk by chunk in the backward pass) give exactly the
    values and gradients of every tile in one chunk: random chunk sizes, 1 included (a one-tile chunk would take
    the batched product's matrix-vector path, which rounds the depth sum differently in float32), with depth.
    Deterministic algorithms: CPU index_put_ accumulates large float32 gathers' gradients with atomic adds, whose
    order varies from run to run whatever the chunking."""
    w, h = 150, 110  # 70 tiles
    cam = random_camera(rng, w, h, dist=3.0)
    g = [x.to(dtype) for x in random_gaussians(rng, 900, scale_range=(-3.5, -1.8))]
    vm, K = cam_tensors(cam, dtype)
    p = project_gaussians(*g[:4], vm, K, w, h)
    b = bin_gaussians(p.means2D, p.conics, g[3], p.depths, p.radii, w, h)
    assert int((b.tile_ranges[:, 1] > b.tile_ranges[:, 0]).sum()) > 40 and b.keys.numel() > 3000
    bg = torch.rand(3, generator=rng, dtype=dtype)
    G = torch.randn(h, w, 3, generator=rng, dtype=dtype)
    inputs = (p.means2D.detach(), p.conics.detach(), g[4], g[3], p.depths.detach())
    was = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        whole = _raster_and_grads(inputs, b, w, h, bg, G, chunk=10 ** 6)
        for chunk in [1, 2] + torch.randint(3, 30, (2,), generator=rng).tolist():
            got = _raster_and_grads(inputs, b, w, h, bg, G, chunk=chunk)
            for name, x, y in zip("image final_T n_contrib depth_sum depth_median g_means2D g_conics g_colors "
                                  "g_opacities g_depths".split(), whole, got):
                assert torch.equal(x, y), (chunk, name, int((x != y).sum()))
        with torch.no_grad():  # the walk without gradients (one cumulative product a block): the same values
            nog = rasterize_tiles(*inputs[:4], b.gaussian_ids, b.tile_ranges, b.tiles_x, b.tiles_y, w, h, bg,
                                  depths=inputs[4], chunk=5)
        for x, y in zip(whole[:5], nog):
            assert torch.equal(x, y)
    finally:
        torch.use_deterministic_algorithms(was)
    assert (whole[1] < 0.5).float().mean() > 0.3 and whole[5].abs().sum() > 0  # a covered image, live gradients


def test_batched_backward_through_the_chunked_walk(rng):
    """autograd.grad(..., is_grads_batched=True) (vmap over the backward: what the GPU absgrad test uses to take
    each pixel's gradient in one call) through the chunked walk gives, row for row, what one backward per pixel
    gives — with chunks of 2 tiles, so that pieces of the gradient come from several spans and some spans see none
    of a pixel's weight. Before the backward assembled its pieces out of place, vmap refused the in-place copy."""
    w, h = 40, 24  # 3 x 2 tiles
    cam = random_camera(rng, w, h, dist=3.0)
    g = [x.double() for x in random_gaussians(rng, 60, scale_range=(-3.0, -1.6))]
    p = project_gaussians(*g[:4], *cam_tensors(cam, torch.float64), w, h)
    b = bin_gaussians(p.means2D, p.conics, g[3], p.depths, p.radii, w, h)
    m2 = p.means2D.detach().clone().requires_grad_(True)
    r = rasterize_tiles(m2, p.conics.detach(), g[4], g[3], b.gaussian_ids, b.tile_ranges, b.tiles_x, b.tiles_y, w, h,
                        chunk=2)
    pix = torch.randperm(h * w, generator=rng)[:12]            # a dozen random pixels, rows of the identity
    terms = (r.image.sum(-1) + r.final_T).flatten()[pix]
    (batched,) = torch.autograd.grad(terms, m2, torch.eye(pix.numel(), dtype=terms.dtype), retain_graph=True,
                                     is_grads_batched=True)
    for i in range(pix.numel()):
        (one,) = torch.autograd.grad(terms[i], m2, retain_graph=True)
        torch.testing.assert_close(batched[i], one, rtol=1e-12, atol=1e-14)
    assert int((batched.abs().sum(-1) > 0).sum()) > 5      # pixels reached by live Gaussians


def test_outputs_need_gradients_only_through_the_inputs_they_depend_on(rng):
    """With only some inputs requiring gradients, the outputs that do not depend on them do not require one (as
    through the walk in one piece): the colours reach the image alone, the depths the depth sum alone; the means
    reach all three. And each input's gradient from the chunked walk is the one-piece walk's."""
    w, h = 48, 40
    cam = random_camera(rng, w, h, dist=3.0)
    g = random_gaussians(rng, 120, scale_range=(-3.0, -1.5))
    p = project_gaussians(*g[:4], *cam_tensors(cam), w, h)
    b = bin_gaussians(p.means2D, p.conics, g[3], p.depths, p.radii, w, h)
    base = [p.means2D.detach(), p.conics.detach(), g[4], g[3], p.depths.detach()]
    for k, expect in ((2, (True, False, False)), (4, (False, False, True)), (0, (True, True, True))):
        for chunk in (2, 10 ** 6):
            ins = [x.clone().requires_grad_(i == k) for i, x in enumerate(base)]
            r = rasterize_tiles(*ins[:4], b.gaussian_ids, b.tile_ranges, b.tiles_x, b.tiles_y, w, h, depths=ins[4],
                                chunk=chunk)
            assert (r.image.requires_grad, r.final_T.requires_grad, r.depth_sum.requires_grad) == expect, (k, chunk)
            (r.image.sum() + r.depth_sum.sum()).backward()
            if chunk == 2:
                first = ins[k].grad
            else:
                assert torch.equal(first, ins[k].grad) and first.abs().sum() > 0


def test_chunk_spans_cover_the_rows_without_one_row_pieces():
    for n in range(1, 40):
        for chunk in range(1, 12):
            spans = _spans(n, chunk)
            assert [a for a, _ in spans] == [0] + [e for _, e in spans[:-1]] and spans[-1][1] == n
            assert all(e - a <= max(chunk, 2) + 1 for a, e in spans)
            assert n == 1 or all(e - a >= 2 for a, e in spans), (n, chunk, spans)
    with pytest.raises(ValueError, match="chunk must be"):
        z = torch.zeros(1, 2)
        rasterize_tiles(z, torch.ones(1, 3), torch.zeros(1, 3), torch.ones(1), torch.zeros(1, dtype=torch.int32),
                        torch.tensor([[0, 1]], dtype=torch.int32), 1, 1, 16, 16, chunk=0)


_PEAK_SCRIPT = r"""
import json, sys, torch
sys.path.insert(0, "tests")
from helpers import cam_tensors, random_camera, random_gaussians
from rigel_core.reference import bin_gaussians, project_gaussians, rasterize_tiles
grad, chunk = sys.argv[1] == "grad", int(sys.argv[2])
gen = torch.Generator().manual_seed(int(sys.argv[3]))
cam = random_camera(gen, 320, 320, dist=2.5)
g = [x.float() for x in random_gaussians(gen, 4000, scale_range=(-2.6, -1.6))]
def status(key):
    return next(int(l.split()[1]) for l in open("/proc/self/status") if l.startswith(key))
def render(w, h):
    c = cam.scaled(w / cam.width)
    vm, K = cam_tensors(c, torch.float32)
    p = project_gaussians(*g[:4], vm, K, w, h)
    b = bin_gaussians(p.means2D, p.conics, g[3], p.depths, p.radii, w, h)
    ins = [x.detach().clone().requires_grad_(grad) for x in (p.means2D, p.conics, g[4], g[3], p.depths)]
    G = torch.randn(h, w, 3, generator=gen)
    open("/proc/self/clear_refs", "w").write("5")  # the peak (VmHWM) restarts from the resident set now
    before = status("VmRSS")
    with torch.set_grad_enabled(grad):
        r = rasterize_tiles(*ins[:4], b.gaussian_ids, b.tile_ranges, b.tiles_x, b.tiles_y, w, h, depths=ins[4],
                            chunk=chunk)
        if grad:
            ((r.image * G).sum() + r.depth_sum.sum()).backward()
    return {"entries": int(b.keys.numel()), "growth": (status("VmHWM") - before) * 1024,
            "covered": float((r.final_T < 0.5).float().mean())}
render(32, 32)  # first a small one: the libraries' own first-use memory (autograd's threads, BLAS) is not the walk's
print(json.dumps(render(320, 320)))
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the peak resident set, reset: Linux /proc")
@pytest.mark.parametrize("grad", ["grad", "nograd"])
def test_walk_memory_is_bounded_by_the_chunk(rng, grad):
    """A 320×320 float32 render of 100k–200k (tile, Gaussian) entries, with and without its backward pass, with
    8-tile chunks: the process's peak resident set grows by less than the image's own tensors (128 bytes a pixel)
    and a quarter of one (entries × 256 pixels) float32 tensor (the bound 37–61 MB). Measured: 10–13 MB when this
    test was written; 18–23 MB with the backward pass on torch 2.14 (2026-12-07, this machine's CPU), where the
    earlier bound of a sixteenth (20–24 MB) failed one run in six at the same seed. The walk in one piece, before the
    chunks, grew it by 230–250 MB with the backward pass and 86–91 MB without; by 3.1 GB for an 800×800 training
    render. Measured in a fresh process after a 32×32 render (the first backward pass's
    own memory), the peak (VmHWM) reset before the render, glibc's heap keeping no freed block (a fixed mmap
    threshold)."""
    root = Path(__file__).resolve().parents[1]
    env = dict(os.environ, PYTHONPATH=str(root), MALLOC_MMAP_THRESHOLD_="131072")
    seed = int(torch.randint(0, 2 ** 31 - 1, (1,), generator=rng))
    out = subprocess.run([sys.executable, "-c", _PEAK_SCRIPT, grad, "8", str(seed)], cwd=root, env=env,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    r = json.loads(out.stdout.strip().splitlines()[-1])
    one_tensor = r["entries"] * 256 * 4
    assert r["entries"] > 60_000 and r["covered"] > 0.5, r  # a scene that fills the image
    bound = 320 * 320 * 128 + one_tensor / 4
    assert r["growth"] < bound, f"peak grew {r['growth'] / 2**20:.1f} MiB for {r['entries']} entries (bound " \
                                f"{bound / 2**20:.1f} MiB; one per-pixel tensor: {one_tensor / 2**20:.0f} MiB)"


# ---- warp boxes: the CUDA rasterizer's per-warp skip (csrc/rasterize_common.cuh box_mask) ----------------------

def _fragments_pass_np(u, v, A, B2, C, o, x0, y0):
    """(n, 16, 16) bool: fragment_alpha's verdict for each entry and tile pixel, in float32 as the kernel computes
    q (every product rounded, left to right: rasterize_common.cuh quadratic_form) — box_mask must cover these."""
    f = np.float32
    x0 = np.broadcast_to(np.asarray(x0), u.shape)[:, None]
    y0 = np.broadcast_to(np.asarray(y0), v.shape)[:, None]
    xs = (np.arange(16)[None] + x0).astype(f) + f(0.5)  # (n, 16) pixel centres, exact in float32
    ys = (np.arange(16)[None] + y0).astype(f) + f(0.5)
    dx = (xs[:, None, :] - u[:, None, None]).astype(f)
    dy = (ys[:, :, None] - v[:, None, None]).astype(f)
    A, B2, C, o = (a[:, None, None] for a in (A, B2, C, o))
    with np.errstate(all="ignore"):
        q = ((A * dx) * dx + (B2 * dx) * dy) + (C * dy) * dy
        alpha = np.minimum(f(config.ALPHA_MAX), o * np.exp(f(-0.5) * q))
    return (q <= f(config.RADIUS_SIGMA ** 2)) & (alpha >= f(config.ALPHA_MIN))


def _grazing_conics(gen, n, kappa_hi, kappa_lo=1.0):
    """n random ellipses: sigma_minor^2 in [0.3, 4] px^2 (the 0.3 low-pass is the floor), anisotropy kappa
    log-uniform in [kappa_lo, kappa_hi], any angle. Returns float64 (A, B, C) of the conic (inverse covariance)."""
    s_min = 0.3 + 3.7 * torch.rand(n, generator=gen, dtype=torch.float64)
    kappa = kappa_lo * torch.exp(math.log(kappa_hi / kappa_lo) * torch.rand(n, generator=gen, dtype=torch.float64))
    th = math.pi * torch.rand(n, generator=gen, dtype=torch.float64)
    c, s = torch.cos(th), torch.sin(th)
    l1, l2 = 1 / (s_min * kappa), 1 / s_min  # conic eigenvalues
    return l1 * c * c + l2 * s * s, (l1 - l2) * c * s, l1 * s * s + l2 * c * c


def test_warp_boxes_hold_every_fragment_that_passes(rng):
    """Every fragment the kernel would blend lies in a box whose bit box_mask sets: random and grazing ellipses
    (centred so that the extreme point of {q <= Q} sits on a box's first or last pixel centre, within ±2e-6 px),
    needles up to kappa 3e5 (beyond 1e5 every box is kept), opacities from below ALPHA_MIN to 1, tiles far from
    the origin (coordinates near 4000 px round at 2.4e-4 px). The emulation is tests/helpers.box_mask_np."""
    f = np.float32
    n = 6000
    A, B, C = (t.numpy() for t in _grazing_conics(rng, n, 3e5))
    o = np.exp(np.log(1e-3) * torch.rand(n, generator=rng, dtype=torch.float64).numpy())
    x0 = 16 * torch.randint(0, 256, (n,), generator=rng).numpy()
    y0 = 16 * torch.randint(0, 256, (n,), generator=rng).numpy()
    # exact extent of {q <= Q}; half the centres graze a box edge from outside or inside, half are anywhere near
    Q = np.minimum(config.RADIUS_SIGMA ** 2, 2 * np.log(np.maximum(o, 1e-30) / config.ALPHA_MIN))
    det = A * C - B * B
    ex, ey = np.sqrt(np.maximum(Q, 0) * C / det), np.sqrt(np.maximum(Q, 0) * A / det)
    edge_x = x0 + 8 * torch.randint(0, 3, (n,), generator=rng).numpy() + np.where(
        torch.rand(n, generator=rng).numpy() < 0.5, 0.5, -0.5)
    edge_y = y0 + 4 * torch.randint(0, 5, (n,), generator=rng).numpy() + np.where(
        torch.rand(n, generator=rng).numpy() < 0.5, 0.5, -0.5)
    jit = lambda: 2e-6 * (2 * torch.rand(n, generator=rng, dtype=torch.float64).numpy() - 1)
    sgn = lambda: np.where(torch.rand(n, generator=rng).numpy() < 0.5, -1.0, 1.0)
    graze = torch.rand(n, generator=rng).numpy() < 0.5
    u = np.where(graze, edge_x + sgn() * ex + jit(), x0 - 12 + 40 * torch.rand(n, generator=rng).numpy())
    v = np.where(graze, edge_y + sgn() * ey + jit(), y0 - 12 + 40 * torch.rand(n, generator=rng).numpy())
    u, v, A32, C32, o32 = (np.asarray(a, dtype=f) for a in (u, v, A, C, o))
    B2 = f(2) * B.astype(f)  # staged as 2.f * conics[1]
    mask = box_mask_np(u, v, A32, B2, C32, o32, x0, y0)
    passes = _fragments_pass_np(u, v, A32, B2, C32, o32, x0, y0)
    yy, xx = np.meshgrid(np.arange(16), np.arange(16), indexing="ij")
    covered = (mask[:, None, None] >> box_of_pixel(xx, yy)[None]) & 1
    missed = passes & (covered == 0)
    assert not missed.any(), f"{int(missed.sum())} passing fragments outside their box (entries " \
                             f"{np.unique(np.nonzero(missed)[0])[:5].tolist()})"
    # the cull must also cull: every branch present, and small round splats keep few boxes
    pop = np.unpackbits(mask[:, None], axis=1).sum(1)
    kappa = (A + C) ** 2 / det
    assert (mask == 0).sum() > 0 and (o < config.ALPHA_MIN).any()  # opacity below ALPHA_MIN: no box
    assert ((kappa >= 1e5) & (mask == 0xFF) & (o >= config.ALPHA_MIN)).any()  # needles beyond the bound: all
    assert ((pop > 0) & (pop < 8)).mean() > 0.2
    passing_hits = passes.any((1, 2))
    assert passing_hits.sum() > n // 4
    edge_pass = (passes & (covered == 1)).sum((1, 2))
    assert (graze & (edge_pass > 0)).sum() > n // 10  # grazing ellipses do reach pixels
    small = (ex < 3) & (ey < 3) & ~graze & (o >= config.ALPHA_MIN)  # 3-sigma boxes up to 6 px wide, anywhere
    assert small.sum() > 50 and pop[small].mean() < 4.0, (small.sum(), pop[small].mean())


def test_warp_boxes_would_miss_fragments_without_their_margins(rng):
    """The margins of box_mask are needed: with Q' = Q and no 1e-3 px pad, ellipses whose extreme point sits on a
    pixel centre of the next box lose fragments that pass (so the test above can fail)."""
    f = np.float32
    n = 6000
    A, B, C = (t.numpy() for t in _grazing_conics(rng, n, 1e4))
    o = np.full(n, 0.9)
    Q = config.RADIUS_SIGMA ** 2
    det = A * C - B * B
    ex = np.sqrt(Q * C / det)
    # the extreme point (u + ex, v - B ex / C) of {q <= Q} on the pixel centre (8.5, 6.5), within ±1e-7 px
    u = 8.5 - ex + 1e-7 * (2 * torch.rand(n, generator=rng, dtype=torch.float64).numpy() - 1)
    v = 6.5 + B * ex / C
    u, v, A32, C32, o32 = (np.asarray(a, dtype=f) for a in (u, v, A, C, o))
    B2 = f(2) * B.astype(f)
    passes = _fragments_pass_np(u, v, A32, B2, C32, o32, 0, 0)
    yy, xx = np.meshgrid(np.arange(16), np.arange(16), indexing="ij")
    box = box_of_pixel(xx, yy)[None]

    def missed(mask):
        return int((passes & (((mask[:, None, None] >> box) & 1) == 0)).sum())

    assert missed(box_mask_np(u, v, A32, B2, C32, o32, 0, 0)) == 0
    assert missed(box_mask_bare_np(u, v, A32, B2, C32, 0, 0)) > 0  # Q' = Q, extents unpadded


def test_warp_boxes_keep_needles_whose_q_rounds_negative(rng):
    """A needle (kappa 1e7..1e8) can round q along its long axis below 0, so G > 1 and an opacity just under
    ALPHA_MIN blends: box_mask must keep every box there (its kappa test comes before the opacity one). Centres
    far out along the long axis, which crosses the tile."""
    f = np.float32
    n = 20000  # ~25 of them blend somewhere in the tile
    A, B, C = (t.numpy() for t in _grazing_conics(rng, n, 1e8, kappa_lo=1e7))
    o = config.ALPHA_MIN * (0.9 + 0.099 * torch.rand(n, generator=rng, dtype=torch.float64).numpy())
    x0, y0 = 432, 576
    # centres 200..1000 px from a tile pixel along the long axis (the conic's smallest eigenvector), either side
    _, vec = np.linalg.eigh(np.stack([np.stack([A, B], -1), np.stack([B, C], -1)], -2))
    axis = vec[:, :, 0]
    r = lambda k: torch.rand(k, generator=rng, dtype=torch.float64).numpy()
    t = (200 + 800 * r(n)) * np.where(r(n) < 0.5, -1.0, 1.0)
    px = x0 + 0.5 + np.floor(16 * r(n))  # the axis through a pixel centre
    py = y0 + 0.5 + np.floor(16 * r(n))
    u, v = px - t * axis[:, 0], py - t * axis[:, 1]
    u, v, A32, C32, o32 = (np.asarray(a, dtype=f) for a in (u, v, A, C, o))
    B2 = f(2) * B.astype(f)
    mask = box_mask_np(u, v, A32, B2, C32, o32, x0, y0)
    passes = _fragments_pass_np(u, v, A32, B2, C32, o32, x0, y0)
    assert passes.any(), "no needle rounded q below 0 here: the test would not test the order"
    yy, xx = np.meshgrid(np.arange(16), np.arange(16), indexing="ij")
    covered = (mask[:, None, None] >> box_of_pixel(xx, yy)[None]) & 1
    assert not (passes & (covered == 0)).any()


def _cut_sensitivity(cam, inputs, rel):
    """Largest relative change of the float64 reference's gradients (means3D, quats, scales, opacities) when the
    3-sigma cut moves from RADIUS_SIGMA² to RADIUS_SIGMA²·(1 ± rel), on entries binned for the widest cut (an entry
    beyond a pixel's cut blends nothing there)."""
    h, w = cam.height, cam.width
    g = torch.Generator().manual_seed(0)
    w_img = torch.randn(h, w, 3, generator=g, dtype=torch.float64)
    vm, K = cam_tensors(cam, torch.float64)
    x64 = [a.to(torch.float64) for a in inputs]
    sigma = config.RADIUS_SIGMA
    config.RADIUS_SIGMA = sigma * math.sqrt(1 + 2 * rel)  # entries for every tile the widest cut reaches
    try:
        with torch.no_grad():
            p = project_gaussians(*x64[:4], vm, K, w, h)
            b = bin_gaussians(p.means2D, p.conics, x64[3], p.depths, p.radii, w, h)
    finally:
        config.RADIUS_SIGMA = sigma

    def grads(s):
        y = [a.clone().requires_grad_(i < 4) for i, a in enumerate(x64)]
        config.RADIUS_SIGMA = s
        try:
            q = project_gaussians(*y[:4], vm, K, w, h)
            ras = rasterize_tiles(q.means2D, q.conics, y[4], y[3], b.gaussian_ids, b.tile_ranges, -(-w // 16),
                                  -(-h // 16), w, h)
            (ras.image * w_img).sum().backward()  # the reference's backward reads the cut again
        finally:
            config.RADIUS_SIGMA = sigma
        return [a.grad for a in y[:4]]

    base = grads(sigma)
    worst = 0.0
    for s in (sigma * math.sqrt(1 + rel), sigma * math.sqrt(1 - rel)):
        for a, b0 in zip(grads(s), base):
            fin = torch.isfinite(b0)  # the edge rows' non-finite inputs give non-finite gradients, the same each time
            assert torch.equal(torch.isfinite(a), fin) and float(b0[fin].norm()) > 0
            worst = max(worst, float((a[fin] - b0[fin]).norm() / b0[fin].norm()))
    return worst


def test_clear_decision_ties_leaves_no_step_at_the_cut(rng):
    """tests/test_cuda_forward.py's clear_decision_ties, which the CUDA end-to-end gradient tests apply to their
    scene: afterwards no pixel of a random scene (the tests' own kind) lies where a float32 rounding decides whether
    it blends, so moving the float64 reference's 3-sigma cut by ±1e-6 leaves every gradient exactly as it was. Most
    scenes had such pixels before (2-5 Gaussians of 800); where one of them is blended, the same move changes the
    gradients (at RIGEL_SEED=3221425706 by 1.5e-5 in quats, the CUDA test's failure there)."""
    from test_cuda_forward import clear_decision_ties, decision_ties, make_scene
    cam, inputs = make_scene(rng, 800, 96, 72, anisotropic=False, with_near=False)
    ties = decision_ties(cam, *inputs[:4])
    cleared = clear_decision_ties(cam, inputs)
    assert decision_ties(cam, *cleared[:4]).numel() == 0
    same = lambda a, b: bool(((a == b) | (a.isnan() & b.isnan())).all())  # the edge rows hold NaNs
    moved = [i for i, (a, b) in enumerate(zip(inputs, cleared)) if not same(a, b)]
    assert moved == ([2] if ties.numel() else [])  # only the scales, only where a tie was
    assert _cut_sensitivity(cam, cleared, 1e-6) == 0.0
