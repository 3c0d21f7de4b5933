"""rigel_core.edit: crop / selection masks against brute force, undo/redo against recomputed states, saving."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from rigel_core import Camera, GaussianModel
from rigel_core.edit import (EditStack, box_mask, brush_mask, combine, save_model, screen_rect_mask, sphere_mask,
                             tint_colors)


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
        sel |= brush_mask(model.means3D, cam, px[i], 10)
    after_first = sel.copy()
    j = int(rng.choice(np.flatnonzero(~sel)))            # stroke 2: add an unselected one, subtract a selected one
    st.select_brush(cam, px[j], 4, "add", stroke=2)
    sel |= brush_mask(model.means3D, cam, px[j], 4)
    k = int(rng.choice(np.flatnonzero(after_first)))
    st.select_brush(cam, px[k], 4, "subtract", stroke=2)
    sel &= ~brush_mask(model.means3D, cam, px[k], 4)
    assert np.array_equal(st.selected, sel)
    assert st.history == ["brush", "brush"]
    assert st.undo() == "brush" and np.array_equal(st.selected, after_first)
    assert st.undo() == "brush" and not st.selected.any() and not st.can_undo
    st.redo()
    st.redo()
    assert np.array_equal(st.selected, sel)
    st.select_brush(cam, px[j], 4, "add")                # no stroke key: its own step
    assert len(st.history) == 3 or np.array_equal(st.selected, sel)
