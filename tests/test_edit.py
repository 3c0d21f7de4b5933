"""rigel_core.edit: crop / selection masks against brute force, undo/redo against recomputed states, saving."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from rigel_core import Camera, GaussianModel
from rigel_core.edit import (EditStack, box_mask, brush_mask, combine, ellipse_meets_disc, ellipse_meets_rect,
                             footprint, footprint_brush_mask, footprint_rect_mask, save_model, screen_rect_mask,
                             sphere_mask, tint_colors)


def _model(n, seed):
    g = torch.Generator().manual_seed(seed)
    means = torch.randn(n, 3, generator=g, dtype=torch.float64)
    return GaussianModel.from_tensors(means, torch.randn(n, 3, generator=g, dtype=torch.float64) - 3,
                                      torch.randn(n, 4, generator=g, dtype=torch.float64),
                                      torch.randn(n, generator=g, dtype=torch.float64),
                                      torch.randn(n, 1, 3, generator=g, dtype=torch.float64))


def _rot(rng):
    q, _ = np.linalg.qr(rng.normal(size=(3, 3)))
    return q * np.sign(np.linalg.det(q))


def test_box_and_sphere_masks_match_brute_force():
    rng = np.random.default_rng()
    p = rng.normal(size=(500, 3))
    c, h, R = rng.normal(size=3) * 0.3, rng.uniform(0.2, 1.5, size=3), _rot(rng)
    want = [all(abs(float(np.dot(p[i] - c, R[:, k]))) <= h[k] for k in range(3)) for i in range(len(p))]
    assert box_mask(p, c, h, R).tolist() == want
    want_aa = [all(abs(p[i, k] - c[k]) <= h[k] for k in range(3)) for i in range(len(p))]
    assert box_mask(torch.from_numpy(p), c, h).tolist() == want_aa
    r = rng.uniform(0.5, 1.5)
    assert sphere_mask(p, c, r).tolist() == [math.dist(p[i], c) <= r for i in range(len(p))]
    assert 0 < sum(want_aa) < len(p)


def test_screen_rect_and_brush_match_camera_project():
    rng = np.random.default_rng()
    cam = Camera.look_at(rng.normal(size=3) * 0.2 + [0, -4, 1], [0, 0, 0], (0, 0, 1), width=200, height=150,
                         fov_x_deg=60)
    p = rng.normal(size=(400, 3)) * 2.0
    p[:20] = cam.campos + rng.normal(size=(20, 3)) * 0.1 - 2 * (np.array([0, 0, 0]) - cam.campos)  # behind it
    px = cam.project(p)
    z = (p @ cam.R.T + cam.t)[:, 2]
    rect = (150.0, 20.0, 40.0, 120.0)   # corners in any order
    want = (z > 0) & (px[:, 0] >= 40) & (px[:, 0] <= 150) & (px[:, 1] >= 20) & (px[:, 1] <= 120)
    got = screen_rect_mask(p, cam, rect)
    assert got.tolist() == want.tolist() and 0 < want.sum() < len(p)
    assert not got[:20][z[:20] <= 0].any()
    c, r = (100.0, 75.0), 30.0
    want_b = (z > 0) & (np.hypot(px[:, 0] - c[0], px[:, 1] - c[1]) <= r)
    assert brush_mask(p, cam, c, r).tolist() == want_b.tolist() and want_b.any()


def test_combine_modes_and_errors():
    rng = np.random.default_rng()
    a, b = rng.random(64) < 0.5, rng.random(64) < 0.5
    assert (combine(a, b, "replace") == b).all()
    assert (combine(a, b, "add") == (a | b)).all()
    assert (combine(a, b, "subtract") == (a & ~b)).all()
    assert (combine(a, b, "intersect") == (a & b)).all()
    with pytest.raises(ValueError, match="mode"):
        combine(a, b, "xor")
    with pytest.raises(ValueError, match="shape"):
        combine(a, b[:3])


def test_undo_redo_sequence_matches_recomputed_states():
    """A random sequence of edits, then undo all and redo all: each state equals the state recomputed from
    scratch by replaying the prefix of operations on a fresh stack, and the model equals base.subset(alive)."""
    rng = np.random.default_rng()
    model = _model(300, int(rng.integers(1 << 30)))
    means = model.means3D.numpy()
    ops = []
    for _ in range(12):
        k = int(rng.integers(6))
        if k == 0:
            ops.append(("box", rng.normal(size=3) * 0.3, rng.uniform(0.5, 2.0, 3), bool(rng.integers(2))))
        elif k == 1:
            ops.append(("sphere", rng.normal(size=3) * 0.3, float(rng.uniform(0.5, 2.0)), bool(rng.integers(2))))
        elif k == 2:
            ops.append(("select", rng.random(300) < 0.3, ["replace", "add", "subtract", "intersect"][rng.integers(4)]))
        elif k == 3:
            ops.append(("invert",))
        elif k == 4:
            ops.append(("delete",))
        else:
            ops.append(("clear",))

    def apply(st, op):
        if op[0] == "box":
            return st.crop_box(op[1], op[2], keep_inside=op[3])
        if op[0] == "sphere":
            return st.crop_sphere(op[1], op[2], keep_inside=op[3])
        if op[0] == "select":
            return st.select_base(op[1], op[2])
        return {"invert": st.invert_selection, "delete": st.delete_selected, "clear": st.clear_selection}[op[0]]()

    # expected states by direct set arithmetic (independent of EditStack)
    alive, sel = np.ones(300, bool), np.zeros(300, bool)
    states = [(alive.copy(), sel.copy())]
    for op in ops:
        if op[0] in ("box", "sphere"):
            inside = (np.all(np.abs(means - op[1]) <= op[2], 1) if op[0] == "box"
                      else np.linalg.norm(means - op[1], axis=1) <= op[2])
            keep = inside if op[3] else ~inside
            alive, sel = alive & keep, sel & keep
        elif op[0] == "select":
            m = op[1] & alive
            sel = {"replace": m, "add": sel | m, "subtract": sel & ~m, "intersect": sel & m}[op[2]]
        elif op[0] == "invert":
            sel = alive & ~sel
        elif op[0] == "delete":
            alive, sel = alive & ~sel, np.zeros(300, bool)
        else:
            sel = np.zeros(300, bool)
        if not (np.array_equal(alive, states[-1][0]) and np.array_equal(sel, states[-1][1])):
            states.append((alive.copy(), sel.copy()))   # a no-op adds no undo step
    st = EditStack(model)
    for op in ops:
        apply(st, op)

    def check(i):
        a, s = states[i]
        assert np.array_equal(st.alive, a) and np.array_equal(st.selected, s), i
        assert st.model.num_gaussians == a.sum()
        assert torch.equal(st.model.means3D, model.means3D[torch.from_numpy(a)])
        assert np.array_equal(st.selection, s[a])

    check(len(states) - 1)
    assert len(st.history) == len(states) - 1
    for i in range(len(states) - 2, -1, -1):
        assert st.undo() is not None
        check(i)
    assert st.undo() is None and not st.can_undo
    for i in range(1, len(states)):
        assert st.redo() is not None
        check(i)
    assert st.redo() is None
    # a new edit after an undo drops the redo branch
    if len(states) > 1:
        st.undo()
        assert st.can_redo
        if st.select_all() or st.clear_selection():
            assert not st.can_redo


def test_selection_in_current_indices_and_tint():
    model = _model(50, 3)
    st = EditStack(model)
    keep = np.arange(50) % 2 == 0
    st.crop(keep)
    cur = np.zeros(25, bool)
    cur[[0, 3]] = True
    assert st.select(cur)
    assert np.flatnonzero(st.selected).tolist() == [0, 6]
    assert not st.select(cur)           # same selection again: no step
    assert st.undo() == "select" and st.can_redo
    assert st.invert_selection() and not st.can_redo   # a new step drops the redo branch
    assert st.num_selected == 25 and st.delete_selected() and st.num_alive == 0
    assert st.undo() == "delete" and st.undo() == "invert selection" and st.select(cur)
    with pytest.raises(ValueError, match="25"):
        st.select(np.zeros(50, bool))
    colors = torch.rand(25, 3)
    out = tint_colors(colors, st.selection, tint=(1.0, 0.0, 0.0), amount=0.5)
    assert torch.allclose(out[0], 0.5 * colors[0] + 0.5 * torch.tensor([1.0, 0.0, 0.0]))
    assert torch.equal(out[1], colors[1]) and torch.equal(colors, colors.clone())
    assert tint_colors(colors, np.zeros(25, bool)) is colors


def test_save_model_round_trip(tmp_path):
    from rigel_core.io import load_scene

    model = _model(40, 5)
    st = EditStack(model)
    st.crop_sphere([0, 0, 0], 1.0)
    path = save_model(st.model, tmp_path / "edited.ply")
    back = load_scene(path)
    assert back.num_gaussians == st.num_alive
    assert torch.allclose(back.means3D.double(), st.model.means3D, atol=1e-6)
    import rigel_core.io as rio

    if getattr(rio, "save_scene", None) is None:
        with pytest.raises(ValueError, match="edited.xyz"):
            save_model(st.model, tmp_path / "edited.xyz")


def test_brush_dabs_of_one_stroke_undo_together():
    rng = np.random.default_rng()
    model = _model(400, int(rng.integers(1 << 30)))
    cam = Camera.look_at([0, -6, 0.5], [0, 0, 0], (0, 0, 1), width=160, height=120, fov_x_deg=60)
    px = cam.project(model.means3D.numpy())
    st = EditStack(model)
    sel = np.zeros(400, bool)
    for i in rng.choice(400, 3, replace=False):          # stroke 1: three dabs, each on a Gaussian's centre
        st.select_brush(cam, px[i], 10, "add", stroke=1)
        sel |= footprint_brush_mask(model, cam, px[i], 10)
    after_first = sel.copy()
    j = int(rng.choice(np.flatnonzero(~sel)))            # stroke 2: add an unselected one, subtract a selected one
    st.select_brush(cam, px[j], 4, "add", stroke=2)
    sel |= footprint_brush_mask(model, cam, px[j], 4)
    k = int(rng.choice(np.flatnonzero(after_first)))
    st.select_brush(cam, px[k], 4, "subtract", stroke=2)
    sel &= ~footprint_brush_mask(model, cam, px[k], 4)
    assert np.array_equal(st.selected, sel)
    assert st.history == ["brush", "brush"]
    assert st.undo() == "brush" and np.array_equal(st.selected, after_first)
    assert st.undo() == "brush" and not st.selected.any() and not st.can_undo
    st.redo()
    st.redo()
    assert np.array_equal(st.selected, sel)
    st.select_brush(cam, px[j], 4, "add")                # no stroke key: its own step
    assert len(st.history) == 3 or np.array_equal(st.selected, sel)


# ---- selection by footprint -----------------------------------------------------------------------------------------
def _random_ellipses(rng, n):
    m = rng.uniform(-40, 240, size=(n, 2))
    A = rng.normal(size=(n, 2, 2)) * rng.uniform(2, 25, size=(n, 1, 1))
    cov = A @ A.transpose(0, 2, 1) + 0.3 * np.eye(2)
    return m, np.linalg.inv(cov), rng.uniform(0.5, 9.0, size=n)


def test_ellipse_meets_rect_and_disc_match_dense_sampling():
    """The closed-form edge minimum (rect) and the trust-region bisection (disc) against the least quadratic
    form over dense samples of the rectangle's boundary / the circle (the minimum lies there when the centre is
    outside); cases within 1 % of tangency are left out (sampling cannot decide them)."""
    rng = np.random.default_rng()
    m, Q, k2 = _random_ellipses(rng, 600)
    x0, y0 = rng.uniform(0, 80, size=2)
    rect = (x0 + rng.uniform(10, 120), y0 + rng.uniform(10, 90), x0, y0)       # corners in any order
    t = np.linspace(0, 1, 4001)
    xs = np.concatenate([x0 + t * (rect[0] - x0), np.full_like(t, rect[0]), x0 + t * (rect[0] - x0),
                         np.full_like(t, x0)])
    ys = np.concatenate([np.full_like(t, y0), y0 + t * (rect[1] - y0), np.full_like(t, rect[1]),
                         y0 + t * (rect[1] - y0)])
    bnd = np.stack([xs, ys], -1)
    inside = (m[:, 0] >= x0) & (m[:, 0] <= rect[0]) & (m[:, 1] >= y0) & (m[:, 1] <= rect[1])
    d = bnd[None] - m[:, None]
    fmin = np.where(inside, 0.0, np.einsum("nki,nij,nkj->nk", d, Q, d).min(1))
    clear = np.abs(fmin - k2) > 0.01 * k2
    got = ellipse_meets_rect(m, Q, k2, rect)
    assert np.array_equal(got[clear], (fmin <= k2)[clear])
    assert 20 < got[clear & ~inside].sum() < (clear & ~inside).sum() - 20   # both outcomes among outside centres
    c, r = rng.uniform(60, 140, size=2), rng.uniform(5, 50)
    a = np.linspace(0, 2 * np.pi, 20001)
    circ = c + r * np.stack([np.cos(a), np.sin(a)], -1)
    near = np.linalg.norm(m - c, axis=1) <= r
    d = circ[None] - m[:, None]
    fmin = np.where(near, 0.0, np.einsum("nki,nij,nkj->nk", d, Q, d).min(1))
    clear = np.abs(fmin - k2) > 0.01 * k2
    got = ellipse_meets_disc(m, Q, k2, c, r)
    assert np.array_equal(got[clear], (fmin <= k2)[clear])
    assert 20 < got[clear & ~near].sum() < (clear & ~near).sum() - 20
    assert np.array_equal(ellipse_meets_disc(m, Q, k2, c, 0.0),
                          np.einsum("ni,nij,nj->n", m - c, Q, m - c) <= k2)          # a point brush
    assert not ellipse_meets_rect(m, Q, np.full(len(m), -1.0), rect).any()     # empty footprints never meet


def _one_splat_model(cam_xyz, log_scale, quat, opacity):
    """A model of Gaussians at camera-space points (the camera at the origin looking along +z)."""
    n = len(cam_xyz)
    logit = np.log(np.asarray(opacity, dtype=np.float64) / (1 - np.asarray(opacity, dtype=np.float64)))
    return GaussianModel.from_tensors(torch.tensor(np.asarray(cam_xyz, dtype=np.float64)),
                                      torch.tensor(np.asarray(log_scale, dtype=np.float64)),
                                      torch.tensor(np.asarray(quat, dtype=np.float64)),
                                      torch.tensor(logit, dtype=torch.float64), torch.full((n, 1, 3), 0.5,
                                                                                             dtype=torch.float64))


def test_footprint_selection_differs_from_centres_where_it_should():
    """Constructed splats (camera at the origin, fx = fy = 100, depth 5: 1 world unit = 20 px): a wide splat whose
    centre is left of the rectangle but whose footprint reaches into it is selected (centre rule: not); a
    needle-thin splat whose bounding circle (the renderer's radius) reaches the rectangle but whose ellipse does
    not is left out; a faint one (opacity 2/255: footprint 1.18σ) likewise; one behind the camera never; the
    brush the same way."""
    rng = np.random.default_rng()
    cam = Camera(200, 160, 100.0, 100.0, 100.0, 80.0, np.eye(4))
    gap = rng.uniform(0.2, 0.6)             # world units left of the rectangle's left edge (x = 120 px = +1 unit)
    s = lambda px: math.log(px / 20.0)       # log scale giving ``px`` pixels of sigma at depth 5
    turn = [math.cos(math.pi / 8), 0.0, 0.0, -math.sin(math.pi / 8)]   # -45° about the optical axis: up-right
    pts = [[1.0 - gap, 0.0, 5.0], [1.0 - gap, -2.4, 5.0], [1.0 - gap, 0.0, 5.0], [0.6, 0.0, 5.0],
           [0.6, 0.0, -5.0]]
    logs = [[s(20 * gap / 2), s(20 * gap / 2), s(1.0)],      # sigma = gap/2: the 3σ ellipse reaches 1.5·gap in
            [s(30.0), s(0.05), s(1.0)],                      # needle at -45°: radius 3·30 px, thin ellipse
            [s(20 * gap / 2), s(20 * gap / 2), s(1.0)],      # as the first, but faint
            [s(1.0)] * 3, [s(1.0)] * 3]
    quats = [[1, 0, 0, 0], turn, [1, 0, 0, 0], [1, 0, 0, 0], [1, 0, 0, 0]]
    opac = [0.9, 0.9, 2.0 / 255.0, 0.9, 0.9]
    model = _one_splat_model(pts, logs, quats, opac)
    rect = (120.0, 70.0, 180.0, 90.0)    # x from +1 world unit, a band around the optical axis' row
    centre = screen_rect_mask(model.means3D, cam, rect)
    got = footprint_rect_mask(model, cam, rect)
    assert centre.tolist() == [False] * 5
    assert got.tolist() == [True, False, False, False, False]
    m, Q, k2, vis = footprint(model, cam)
    assert vis.tolist() == [True, True, True, True, False]
    assert math.isclose(k2[2], 2 * math.log(2.0), rel_tol=1e-9) and k2[0] == 9.0
    # the needle's renderer radius does reach the rectangle: a bounding-circle rule would select it
    from rigel_core.reference.project import project_gaussians
    pr = project_gaussians(model.means3D, model.quats, model.scales, model.opacities,
                           cam.viewmat_tensor(dtype=torch.float64), cam.K_tensor(dtype=torch.float64), 200, 160)
    assert float(pr.means2D[1, 0]) + float(pr.radii[1]) > 120 + 10
    # brush: a disc just right of the wide splat's centre, beyond it
    c = (float(m[0, 0]) + 20 * gap * 1.2, float(m[0, 1]))
    got_b = footprint_brush_mask(model, cam, c, 20 * gap * 0.2)
    assert got_b.tolist()[:3] == [True, False, False] and not brush_mask(model.means3D, cam, c, 20 * gap * 0.2)[0]
    # a splat hidden right behind an opaque one (same pixel, deeper) is selected with it: selection goes through
    hidden = _one_splat_model([[1.5, 0.0, 5.0], [3.0, 0.0, 10.0]], [[s(8.0)] * 3, [s(8.0)] * 3],
                              [[1, 0, 0, 0]] * 2, [0.99, 0.9])
    mh, _, _, _ = footprint(hidden, cam)
    assert np.allclose(mh[0], mh[1])                                            # one pixel, two depths
    assert footprint_rect_mask(hidden, cam, (125.0, 75.0, 135.0, 85.0)).tolist() == [True, True]
    # the stack selects by footprint (default) or by centre
    st = EditStack(model)
    assert st.select_rect(cam, rect) and st.selected.tolist() == got.tolist()
    assert st.select_rect(cam, rect, by="centre") and not st.selected.any()


def test_footprint_is_where_the_renderer_draws():
    """Every pixel the reference renderer covers (alpha > 0) of a random splat lies in its footprint, and none
    of the pixels it leaves empty does (pixel centres at +0.5; a thin band at the boundary is left out)."""
    from rigel_core.renderer import render

    rng = np.random.default_rng()
    cam = Camera(64, 48, 60.0, 60.0, 32.0, 24.0, np.eye(4))
    for _ in range(3):
        q = rng.normal(size=4)
        model = _one_splat_model([[rng.uniform(-0.5, 0.5), rng.uniform(-0.3, 0.3), 4.0]],
                                 [np.log(rng.uniform(0.05, 0.4, size=3))], [q], [rng.uniform(0.01, 0.95)])
        alpha = render(model, cam, background=torch.zeros(3, dtype=torch.float64)).alpha.reshape(48, 64).numpy()
        m, Q, k2, vis = footprint(model, cam)
        ys, xs = np.mgrid[0:48, 0:64]
        d = np.stack([xs + 0.5, ys + 0.5], -1).reshape(-1, 2) - m[0]
        q2 = np.einsum("ki,ij,kj->k", d, Q[0], d).reshape(48, 64)
        clear = np.abs(q2 - k2[0]) > 1e-6 * max(k2[0], 1)
        assert vis[0] and (alpha > 0).sum() > 4
        assert np.array_equal((alpha > 0)[clear], (q2 <= k2[0])[clear])
        one = [ellipse_meets_rect(m, Q, k2, (x + 0.5, y + 0.5, x + 0.5, y + 0.5))[0]
               for y, x in zip(*np.nonzero(clear))]
        assert np.array_equal(np.array(one), (alpha > 0)[clear])
