"""Reference binning vs a brute-force per-(Gaussian, tile) check over every pixel centre."""
import math

import pytest
import torch

from rigel_core import config
from rigel_core.renderer.output import BinningOverflow
from rigel_core.reference import bin_gaussians, footprint_threshold, min_q_over_box, project_gaussians
from helpers import cam_tensors, random_camera, random_gaussians


def _scene(rng, n=150, w=80, h=56):
    cam = random_camera(rng, w, h)
    g = random_gaussians(rng, n, scale_range=(-3.5, -0.5))
    p = project_gaussians(*g[:4], *cam_tensors(cam), w, h)
    return cam, g, p


def brute_force_tiles(p, opac, w, h):
    """{(gaussian, tile_id)} whose footprint (q ≤ Q at some pixel centre) lies in the tile."""
    T = config.TILE_SIZE
    tiles_x = -(-w // T)
    ys, xs = torch.meshgrid(torch.arange(h, dtype=torch.float64) + 0.5, torch.arange(w, dtype=torch.float64) + 0.5,
                            indexing="ij")
    tile_of = (torch.div(ys, T, rounding_mode="floor") * tiles_x + torch.div(xs, T, rounding_mode="floor")).long()
    Q = footprint_threshold(opac)
    pairs = set()
    for i in torch.nonzero(p.radii > 0).flatten().tolist():
        A, B, C = p.conics[i].tolist()
        dx, dy = xs - p.means2D[i, 0], ys - p.means2D[i, 1]
        q = A * dx * dx + 2 * B * dx * dy + C * dy * dy
        for t in torch.unique(tile_of[q <= Q[i]]).tolist():
            pairs.add((i, t))
    return pairs


def test_binning_covers_the_footprint_and_is_sorted(rng):
    w, h = 80, 56
    cam, g, p = _scene(rng, w=w, h=h)
    opac = g[3]
    b = bin_gaussians(p.means2D, p.conics, opac, p.depths, p.radii, w, h)
    assert b.keys.numel() > 0
    tile_ids = (b.keys >> 32).tolist()
    got = set(zip(b.gaussian_ids.tolist(), tile_ids))
    assert len(got) == b.keys.numel(), "a (Gaussian, tile) pair was emitted twice"
    want = brute_force_tiles(p, opac, w, h)
    missing = want - got
    assert not missing, f"ellipse test dropped touched tiles: {sorted(missing)[:5]}"
    # extras are tiles whose pixel-centre box meets the ellipse between pixel centres: allowed, but rare
    assert len(got - want) <= 0.2 * len(got) + 3
    # never beyond the 3σ tile rectangle, never a culled Gaussian
    assert all(p.radii[gid] > 0 for gid in b.gaussian_ids.tolist())
    # tile_ranges partition the sorted list; depth non-decreasing inside each tile, ties by Gaussian index
    r = b.tile_ranges.long()
    assert r[0, 0] == 0 and r[-1, 1] == b.keys.numel()
    assert torch.all(r[1:, 0] == r[:-1, 1]) and torch.all(r[:, 1] >= r[:, 0])
    for t in range(r.shape[0]):
        s, e = r[t].tolist()
        assert all(x == t for x in tile_ids[s:e])
        d = p.depths[b.gaussian_ids[s:e].long()]
        assert torch.all(d[1:] >= d[:-1])
    # tiles_touched agrees with the entries
    assert torch.equal(torch.bincount(b.gaussian_ids.long(), minlength=len(p.radii)).int(), b.tiles_touched)


def test_ellipse_saves_entries_vs_square(rng):
    """Thin, rotated Gaussians: the ellipse test emits fewer entries than the 3σ square."""
    w, h = 128, 128
    cam, g, p = _scene(rng, n=100, w=w, h=h)
    b = bin_gaussians(p.means2D, p.conics, torch.ones_like(g[3]) * 0.99, p.depths, p.radii, w, h)
    from rigel_core.reference import tile_rects

    rect = tile_rects(p.means2D, p.radii, w, h)
    square = int(((rect[:, 2] - rect[:, 0]) * (rect[:, 3] - rect[:, 1]))[p.radii > 0].sum())
    assert b.keys.numel() <= square


def test_ties_keep_gaussian_order():
    """Equal depths in one tile sort by Gaussian index (stable sort)."""
    n = 5
    means2D = torch.full((n, 2), 8.0, dtype=torch.float64)
    conics = torch.tensor([[1.0, 0.0, 1.0]] * n, dtype=torch.float64)
    depths = torch.full((n,), 2.0, dtype=torch.float64)
    radii = torch.full((n,), 3, dtype=torch.int32)
    b = bin_gaussians(means2D, conics, torch.full((n,), 0.9, dtype=torch.float64), depths, radii, 16, 16)
    assert b.gaussian_ids.tolist() == list(range(n))


def test_min_q_over_box_matches_dense_sampling(rng):
    n = 400
    L = torch.randn(n, 2, 2, generator=rng, dtype=torch.float64)
    S = L @ L.transpose(1, 2) + 0.1 * torch.eye(2, dtype=torch.float64)
    A, B, C = S[:, 0, 0], S[:, 0, 1], S[:, 1, 1]
    lo = torch.randn(n, 2, generator=rng, dtype=torch.float64) * 3
    hi = lo + torch.rand(n, 2, generator=rng, dtype=torch.float64) * 3
    got = min_q_over_box(A, B, C, lo[:, 0], hi[:, 0], lo[:, 1], hi[:, 1])
    t = torch.linspace(0, 1, 201, dtype=torch.float64)
    dx = lo[:, 0, None, None] + (hi - lo)[:, 0, None, None] * t[None, :, None]
    dy = lo[:, 1, None, None] + (hi - lo)[:, 1, None, None] * t[None, None, :]
    dense = (A[:, None, None] * dx * dx + 2 * B[:, None, None] * dx * dy + C[:, None, None] * dy * dy).flatten(1).amin(1)
    assert torch.all(got <= dense + 1e-12)
    assert torch.all(dense - got <= 0.01 * (1 + dense))


def test_too_many_entries_is_a_clear_error(monkeypatch):
    monkeypatch.setattr(config, "MAX_ENTRIES", 10)
    n = 4
    means2D = torch.full((n, 2), 32.0)
    b_args = (means2D, torch.tensor([[0.001, 0.0, 0.001]] * n), torch.full((n,), 0.9), torch.full((n,), 1.0),
              torch.full((n,), 200, dtype=torch.int32), 64, 64)
    with pytest.raises(BinningOverflow, match="exceed the limit of 10 ") as err:
        bin_gaussians(*b_args)
    # each of the 4 covers all 4×4 tiles of the 64×64 view: what the trainer needs to pick the widest
    assert isinstance(err.value, RuntimeError) and err.value.n_entries == 64 and err.value.max_entries == 10
    assert err.value.tiles_touched.tolist() == [16] * n
