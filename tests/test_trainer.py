"""The trainer (rigel_core/train/, rigel_core/checkpoint.py, rigel_core/cli/train.py) on tiny CPU datasets.

Ground truth comes from rendering a random GaussianModel with the reference renderer, so every pixel of
error is the optimisation's. Images are 16–64 px and models a few hundred Gaussians: the reference renderer
costs ~15–30 ms per forward+backward there (single-threaded: at this size PyTorch's intra-op threads cost
more than they save, so the tests pin one thread).
"""
import dataclasses
import json
import math
import os
import re
import types

import numpy as np
import pytest
import torch

from rigel_core import Camera, GaussianModel, render
from rigel_core.checkpoint import CheckpointError, load_checkpoint_model
from rigel_core.data import Dataset, Frame
from rigel_core.model import PARAM_NAMES
from rigel_core.train import TrainConfig, Trainer, random_init_points
from rigel_core.train.densify import DensifyStats, densify_and_prune, means2D_grad, ndc_grad_norm, \
    prepare_means2D_grad, reset_opacity
from rigel_core.train.optim import group_lrs, make_optimizer, per_gaussian_tensors


pytestmark = pytest.mark.usefixtures("one_thread")  # conftest.py: one PyTorch thread


# ---- tiny datasets ---------------------------------------------------------------------------------------
def random_scene(rng, n, sh_degree=1):
    pts = (torch.rand(n, 3, generator=rng) * 2 - 1) * 0.8
    m = GaussianModel.from_points(pts, torch.rand(n, 3, generator=rng), sh_degree=sh_degree, scale=0.1, opacity=0.8)
    m.log_scales = m.log_scales + 0.3 * torch.randn(n, 3, generator=rng)
    m.quats = torch.randn(n, 4, generator=rng)
    m.sh_rest = 0.1 * torch.randn(m.sh_rest.shape, generator=rng)
    return m


def orbit(n, size, offset=0.0, radius=3.0, prefix="v"):
    cams = []
    for i in range(n):
        az = 2 * math.pi * (i + offset) / n
        el = 0.3 + 0.4 * math.sin(3 * az)
        eye = radius * np.array([math.cos(az) * math.cos(el), math.sin(az) * math.cos(el), math.sin(el)])
        cams.append(Camera.look_at(eye, (0, 0, 0), width=size, height=size, fov_x_deg=50, name=f"{prefix}{i}"))
    return cams


def make_dataset(rng, n_gauss=150, size=64, n_train=24, n_test=6, white_bg=False, scene=None):
    scene = random_scene(rng, n_gauss) if scene is None else scene
    bg = (1.0, 1.0, 1.0) if white_bg else None

    def frames(cams):
        out = []
        for c in cams:
            r = render(scene, c, background=bg)
            out.append(Frame(c, r.image.detach().clamp(0, 1), (1 - r.final_T).detach(), c.name))
        return out

    return Dataset(frames(orbit(n_train, size)), frames(orbit(n_test, size, 0.5, prefix="t")), np.zeros(3), 3.3,
                   white_bg=white_bg)


def small_config(**kw):
    # init_background_points explicit (no "auto": its 20000 points would swamp these models); the tests of "auto"
    # ask for it. coarse_to_fine explicit too (1: these tests are about full-resolution training; "auto" would
    # train these datasets without SfM points coarse first): tests/test_coarse_to_fine.py asks for it; densify_grad
    # explicit too ("grad", what "auto" becomes on the CPU: a config without "auto" is used as given), and init_mode
    # ("box": where these tests' random points have always been drawn; "auto" draws a photo capture's along rays),
    # and coarse_to_fine_min_side 8 (these tests' images are 12-64 px: the default floor would leave them no level)
    base = dict(iterations=300, init_points=200, densify_from=50, densify_interval=50, densify_until=250,
                eval_every=0, sh_degree=1, sh_degree_interval=100, seed=0, init_background_points=0,
                coarse_to_fine=1, densify_grad="grad", init_mode="box", coarse_to_fine_min_side=8)
    base.update(kw)
    return TrainConfig(**base)


# ---- the loop ---------------------------------------------------------------------------------------------
def test_training_improves_heldout_psnr(rng):
    ds = make_dataset(rng)
    tr = Trainer(ds, small_config(seed=int(torch.randint(0, 2 ** 31, (1,), generator=rng))), device="cpu")
    before = tr.evaluate()
    results = [tr.step() for _ in range(300)]
    after = tr.evaluate()
    first = np.mean([r.loss for r in results[:30]])
    last = np.mean([r.loss for r in results[-30:]])
    print(f"held-out PSNR {before.psnr:.2f} -> {after.psnr:.2f} dB, SSIM {before.ssim:.3f} -> {after.ssim:.3f}, "
          f"loss {first:.4f} -> {last:.4f}, N {results[0].num_gaussians} -> {after.num_gaussians}")
    assert last < 0.7 * first
    assert after.psnr >= before.psnr + 3.0
    assert after.ssim > before.ssim
    # 3DGS schedule: after densify_from (50), every densify_interval, strictly before densify_until (250)
    assert [r.iteration for r in results if r.densify is not None] == [100, 150, 200]
    assert all(not r.skipped for r in results) and tr.nan_skips == 0
    assert [e.iteration for e in tr.eval_history] == [0, 300]
    assert results[-1].sh_degree == 1 and results[98].sh_degree == 0 and results[99].sh_degree == 1


def test_the_last_iteration_neither_densifies_nor_resets(rng):
    """A run whose last iteration falls on both the densification and the opacity-reset schedule ends with the
    model as trained (a --iters 3000 run used to end with every opacity at opacity_reset_value); one iteration
    further on, the same iteration does both, so each branch is forced."""
    ds = make_dataset(rng, n_gauss=40, size=24, n_train=4, n_test=1)
    for iterations, last_acts in ((20, False), (21, True)):
        cfg = small_config(iterations=iterations, init_points=60, densify_from=5, densify_interval=10,
                           densify_until=100, opacity_reset_interval=20, grad_threshold=0.0)
        tr = Trainer(ds, cfg, device="cpu")
        results = [tr.step() for _ in range(20)]
        assert results[9].densify is not None  # iteration 10: densified (a zero threshold takes every candidate)
        r20 = results[19]
        assert r20.iteration == 20
        assert (r20.densify is not None) is last_acts and r20.opacity_reset is last_acts
        top = float(tr.model.opacities.max())
        assert (top <= cfg.opacity_reset_value + 1e-6) is last_acts, top


def test_mcmc_never_relocates_at_the_last_iteration(rng):
    """The MCMC schedule is the schedule (mcmc.scheduled, whatever the run's length); the trainer holds the last
    iteration's relocation and growth (Trainer._holds): a 20-iteration run does not relocate at 20, a 21-iteration
    run does."""
    from rigel_core.train.mcmc import scheduled

    cfg = TrainConfig(iterations=7000, densify_from=500, densify_until=15000, densify_interval=100)
    assert scheduled(cfg, 6900) and scheduled(cfg, 7000) and not scheduled(cfg, 7050)
    ds = make_dataset(rng, n_gauss=40, size=24, n_train=4, n_test=1)
    for iterations, last_acts in ((20, False), (21, True)):
        tr = Trainer(ds, small_config(iterations=iterations, init_points=60, densify_from=5, densify_interval=10,
                                      densify_until=100, strategy="mcmc", max_gaussians=200), device="cpu")
        results = [tr.step() for _ in range(20)]
        assert results[9].densify is not None  # iteration 10 relocated and grew
        assert (results[19].densify is not None) is last_acts
        assert (tr.deferred_schedule == 20) is not last_acts


@pytest.mark.parametrize("strategy", ["default", "mcmc"])
def test_an_extended_run_equals_one_planned_longer(rng, tmp_path, strategy):
    """The last iteration's skipped schedule (Trainer.deferred_schedule) runs first when the run goes on — live (a
    larger ``iterations``) or through a checkpoint — so 20 + 10 iterations equal 30 planned, bit for bit on the
    CPU, across the skipped densification and opacity reset (default) or relocation and growth (MCMC)."""
    ds = make_dataset(rng, n_gauss=40, size=24, n_train=4, n_test=1)
    kw = dict(init_points=60, densify_from=5, densify_interval=10, densify_until=100, opacity_reset_interval=20,
              grad_threshold=1e-5, strategy=strategy, seed=int(torch.randint(0, 2 ** 31, (1,), generator=rng)),
              position_lr_max_steps=30)  # the position lr schedule otherwise follows `iterations`
    if strategy == "mcmc":
        kw["max_gaussians"] = 200
    planned = Trainer(ds, small_config(iterations=30, **kw), device="cpu")
    short = Trainer(ds, small_config(iterations=20, **kw), device="cpu")
    for _ in range(20):
        planned.step()
        short.step()
    assert short.deferred_schedule == 20 and planned.deferred_schedule is None
    assert short.model.num_gaussians != planned.model.num_gaussians or strategy == "default"
    path = tmp_path / "c.safetensors"
    short.save_checkpoint(path)
    resumed = Trainer.from_checkpoint(path, ds, device="cpu")
    assert resumed.deferred_schedule == 20
    for t in (short, resumed):
        t.config.iterations = 30
    for _ in range(10):
        results = [t.step() for t in (planned, short, resumed)]
        assert len({r.num_gaussians for r in results}) == 1 and len({r.loss for r in results}) == 1
    assert planned.deferred_schedule == short.deferred_schedule == resumed.deferred_schedule == 30  # 30 is last now
    _assert_same_state(_state(planned), _state(short))
    _assert_same_state(_state(planned), _state(resumed))


def _schedule_case(rng, strategy, *, opacity_reset_interval, max_gaussians):
    """A 40-iteration run on a tiny scene whose schedule acts every 10 iterations from 10 (a zero gradient
    threshold densifies every candidate); max_gaussians for MCMC only. Returns (dataset, small_config kwargs)."""
    ds = make_dataset(rng, n_gauss=40, size=24, n_train=4, n_test=1)
    kw = dict(iterations=40, init_points=60, densify_from=5, densify_interval=10, densify_until=100,
              opacity_reset_interval=opacity_reset_interval, grad_threshold=0.0, strategy=strategy,
              seed=int(torch.randint(0, 2 ** 31, (1,), generator=rng)))
    if strategy == "mcmc":
        kw["max_gaussians"] = max_gaussians
    return ds, kw


@pytest.mark.parametrize("strategy", ["default", "mcmc"])
def test_an_evaluated_iteration_scores_the_model_as_trained(rng, strategy):
    """An iteration the step evaluates (eval_every) or that is in schedule_holds holds its densification / reset /
    relocation until the next step (3DGS evaluates before densifying the same iteration): its evaluation sees the
    model as trained, not with untrained clones and splits; the held schedule runs first in the next step and is
    reported there, and the run is bit for bit the one that never held."""
    ds, kw = _schedule_case(rng, strategy, opacity_reset_interval=20, max_gaussians=200)
    plain = Trainer(ds, small_config(**kw), device="cpu")
    evals = Trainer(ds, small_config(eval_every=10, **kw), device="cpu")
    holds = Trainer(ds, small_config(**kw), device="cpu")
    holds.schedule_holds = {10, 20, 30}
    runs = {t: [t.step() for _ in range(40)] for t in (plain, evals, holds)}
    by_it = lambda t: {r.iteration: r for r in runs[t]}
    p, e, h = by_it(plain), by_it(evals), by_it(holds)
    for it in (10, 20, 30):
        assert p[it].densify is not None, "the schedule must act at these iterations for the test to test"
        assert e[it].densify is None and h[it].densify is None
        done = lambda r: (r.densify.iteration, r.densify.n_after)
        assert done(e[it + 1]) == done(p[it]) == done(h[it + 1]) == (it, p[it].num_gaussians)  # one step later
        assert e[it].num_gaussians == p[it - 1].num_gaussians != p[it].num_gaussians or strategy == "mcmc"
        if strategy == "default" and it == 20:
            assert p[it].opacity_reset and not e[it].opacity_reset and e[it + 1].opacity_reset
            assert p[it].opacity_reset_iteration == e[it + 1].opacity_reset_iteration == it  # what the CLI logs
    ev = {x.iteration: x for x in evals.eval_history}
    assert [i for i in ev if i in (10, 20, 30)] == [10, 20, 30]
    assert all(ev[i].num_gaussians == e[i].num_gaussians for i in (10, 20, 30))
    assert plain.deferred_schedule == evals.deferred_schedule == holds.deferred_schedule == 40
    for t in (evals, holds):
        _assert_same_state(_state(plain), _state(t))


@pytest.mark.parametrize("strategy", ["default", "mcmc", "mcmc/cameras"])
def test_a_held_schedule_keeps_the_settings_it_was_held_under(rng, tmp_path, strategy):
    """Settings changed between a held iteration and the next step (the viewer's sliders land there, during the
    evaluation; or --resume --set from a checkpoint of that iteration) act from the next scheduled iteration on, as
    without the hold: the held densification / relocation is the one decided then (Trainer._deferred_config, also
    in the checkpoint). Here the interval goes 10 -> 15 right after iteration 10, which the unheld run densified."""
    import dataclasses

    strategy, _, units = strategy.partition("/")  # "mcmc/cameras": the held relocation's noise in that unit too
    ds, kw = _schedule_case(rng, strategy, opacity_reset_interval=1000, max_gaussians=400)
    if units:
        kw["mcmc_units"] = units
    plain = Trainer(ds, small_config(**kw), device="cpu")
    held = Trainer(ds, small_config(eval_every=10, **kw), device="cpu")
    for t in (plain, held):
        for _ in range(10):
            t.step()
        t.config.densify_interval = 15
    assert held.deferred_schedule == 10 and plain.deferred_schedule is None
    path = tmp_path / "held.safetensors"
    held.save_checkpoint(path)
    resumed = Trainer.from_checkpoint(path, ds, device="cpu", config=dataclasses.replace(held.config))
    assert resumed.deferred_schedule == 10 and resumed._deferred_config.densify_interval == 10
    for _ in range(21):  # to 31: iteration 30 (held by the evaluation) has run its schedule in step 31
        results = [t.step() for t in (plain, held, resumed)]
        assert len({r.num_gaussians for r in results[1:]}) == 1
    assert plain.model.num_gaussians == held.model.num_gaussians == resumed.model.num_gaussians
    _assert_same_state(_state(plain), _state(held))
    _assert_same_state(_state(plain), _state(resumed))


def test_a_checkpoint_deferred_schedule_must_be_its_own_iteration(rng, tmp_path):
    import json
    from safetensors import safe_open
    from safetensors.torch import save_file

    ds = make_dataset(rng, n_gauss=20, size=16, n_train=3, n_test=1)
    tr = Trainer(ds, small_config(iterations=10, init_points=30, densify_from=2, densify_interval=5), device="cpu")
    for _ in range(10):
        tr.step()
    assert tr.deferred_schedule == 10
    path = tmp_path / "c.safetensors"
    tr.save_checkpoint(path)
    with safe_open(str(path), "pt") as f:
        tensors = {k: f.get_tensor(k) for k in f.keys()}
        meta = json.loads(f.metadata()["rigel"])
    meta["deferred_schedule"] = 7
    bad = tmp_path / "bad.safetensors"
    save_file(tensors, str(bad), metadata={"rigel": json.dumps(meta)})
    with pytest.raises(CheckpointError, match="deferred_schedule"):
        Trainer.from_checkpoint(bad, ds, device="cpu")


def test_learning_rates_sh_ramp_and_live_config(rng):
    ds = make_dataset(rng, n_gauss=20, size=16, n_train=4, n_test=1)
    cfg = small_config(iterations=100, init_points=30, sh_degree=3, sh_degree_interval=2, densify_from=1000)
    tr = Trainer(ds, cfg, device="cpu")
    degrees = []
    for _ in range(8):
        r = tr.step()
        degrees.append(r.sh_degree)
        lrs = {g["name"]: g["lr"] for g in tr.optimizer.param_groups}
        t = r.iteration / 100
        expect = 1.6e-4 * (1.6e-6 / 1.6e-4) ** t * 3.3  # log-linear decay, times the scene extent
        assert lrs["means3D"] == pytest.approx(expect, rel=1e-12) and r.lr_position == lrs["means3D"]
    assert degrees == [0, 1, 1, 2, 2, 3, 3, 3]
    assert lrs["log_scales"] == 5e-3 and lrs["quats"] == 1e-3 and lrs["opacity_logits"] == 0.05
    assert lrs["sh_dc"] == 2.5e-3 and lrs["sh_rest"] == pytest.approx(2.5e-3 / 20, rel=1e-15)
    assert group_lrs(cfg, 100, 3.3)["means3D"] == pytest.approx(1.6e-6 * 3.3, rel=1e-12)
    assert group_lrs(cfg, 0, 1.0)["means3D"] == pytest.approx(1.6e-4, rel=1e-12)
    tr.config.feature_lr = 1e-2  # edited "live": the next step uses it
    tr.step()
    lrs = {g["name"]: g["lr"] for g in tr.optimizer.param_groups}
    assert lrs["sh_dc"] == 1e-2 and lrs["sh_rest"] == pytest.approx(1e-2 / 20)


def test_step_updates_every_parameter_group(rng):
    ds = make_dataset(rng, n_gauss=30, size=32, n_train=4, n_test=1)
    # an anisotropic start (isotropic Gaussians, as from_points makes them, give rotations zero gradient)
    start = random_scene(rng, 40, sh_degree=2)
    tr = Trainer(ds, small_config(sh_degree=1, sh_degree_interval=1), model=start, device="cpu")
    assert tr.model.sh_rest.shape == (40, 3, 3)  # truncated to the configured degree
    before = {k: v.detach().clone() for k, v in tr.model.parameters().items()}
    tr.step()
    for k, v in tr.model.parameters().items():
        assert not torch.equal(before[k], v.detach()), f"{k} did not move"
        assert v.is_leaf and v.requires_grad and v.grad is None


def test_random_background_recomposites_the_target(rng, monkeypatch):
    truth = random_scene(rng, 40)
    truth.sh_rest.zero_()  # colours in [0, 1]: renders need no clamping, so the target is exact
    ds = make_dataset(rng, size=32, n_train=4, n_test=0, scene=truth)
    import rigel_core.train.step as step_mod  # the step body's render

    seen = []

    def spy(model, camera, background=None, **kw):
        seen.append(background)
        return render(model, camera, background=background, **kw)

    monkeypatch.setattr(step_mod, "render", spy)
    tr = Trainer(ds, small_config(random_background=True), model=truth, device="cpu")
    for k in ("position_lr_init", "position_lr_final", "scaling_lr", "rotation_lr", "opacity_lr", "feature_lr"):
        setattr(tr.config, k, 0.0)  # the model stays the ground truth
    l1 = [tr.step().l1 for _ in range(4)]
    assert all(float(b.min()) > 0 for b in seen) and len({tuple(b.tolist()) for b in seen}) == 4
    assert max(l1) < 1e-5, l1  # the target was re-composited onto each drawn colour
    tr.config.random_background = False
    assert tr.step().l1 < 1e-5 and float(seen[-1].abs().sum()) == 0


# ---- densification -----------------------------------------------------------------------------------------
def _model_with_state(rng, log_scales, opacities, means=None):
    n = log_scales.shape[0]
    means = torch.randn(n, 3, generator=rng) if means is None else means
    quats = torch.randn(n, 4, generator=rng)
    logits = torch.logit(torch.as_tensor(opacities, dtype=torch.float32))
    m = GaussianModel.from_tensors(means, log_scales, quats, logits, torch.randn(n, 1, 3, generator=rng),
                                   torch.randn(n, 3, 3, generator=rng))
    opt = make_optimizer(m, TrainConfig(), 1.0)
    for p in per_gaussian_tensors(opt, m).values():  # give Adam non-zero moments, keep the values exact
        p.grad = torch.randn(p.shape, generator=rng)
    saved = {k: v.detach().clone() for k, v in per_gaussian_tensors(opt, m).items()}
    opt.step()
    opt.zero_grad(set_to_none=True)
    with torch.no_grad():
        for k, v in per_gaussian_tensors(opt, m).items():
            v.copy_(saved[k])
    return m, opt


def _moments(opt, m):
    return {k: {s: v.clone() for s, v in opt.state[p].items()} for k, p in per_gaussian_tensors(opt, m).items()}


def _check_aligned(opt, m):
    n = m.num_gaussians
    m.validate()
    for name, p in per_gaussian_tensors(opt, m).items():
        assert p is getattr(m, name) and p.shape[0] == n and p.is_leaf and p.requires_grad
        st = opt.state[p]
        assert st["exp_avg"].shape == p.shape and st["exp_avg_sq"].shape == p.shape, name
    assert {id(g["params"][0]) for g in opt.param_groups} == {id(getattr(m, k)) for k in PARAM_NAMES}


def test_densify_clone_split_prune_keep_params_and_moments_aligned(rng):
    extent, cfg = 2.0, TrainConfig()
    small, large = math.log(0.5 * cfg.percent_dense * extent), math.log(5 * cfg.percent_dense * extent)
    log_scales = torch.tensor([[small] * 3, [small] * 3, [large] * 3, [large] * 3, [small] * 3, [small] * 3])
    opac = [0.5, 0.5, 0.5, 0.5, 0.001, 0.5]
    m, opt = _model_with_state(rng, log_scales, opac)
    old = {k: v.detach().clone() for k, v in m.parameters().items()}
    old_mom = _moments(opt, m)
    stats = DensifyStats(6)
    stats.grad_accum = torch.tensor([3e-4, 1e-4, 9e-4, 1e-4, 0.0, 0.0]) * 3
    stats.denom = torch.tensor([3.0, 3, 3, 3, 0, 3])
    rep = densify_and_prune(m, opt, stats, cfg, extent, iteration=600, generator=torch.Generator().manual_seed(1))
    assert (rep.n_clone, rep.n_split, rep.n_prune, rep.n_before, rep.n_after) == (1, 1, 1, 6, 7)
    assert not rep.capped
    _check_aligned(opt, m)
    assert len(stats) == 7 and float(stats.denom.sum()) == 0  # statistics restart
    # row order: survivors [0, 1, 3, 5], the clone of 0, the two children of 2
    src = [0, 1, 3, 5, 0]
    for k in PARAM_NAMES:
        assert torch.equal(getattr(m, k).detach()[:5], old[k][src]), k
        for s in ("exp_avg", "exp_avg_sq"):
            mom = opt.state[getattr(m, k)][s]
            assert torch.equal(mom[:4], old_mom[k][s][src[:4]]), (k, s)
            assert torch.count_nonzero(mom[4:]) == 0, (k, s)  # new rows start with zero moments
        assert opt.state[getattr(m, k)]["step"] == old_mom[k]["step"]
    children = {k: getattr(m, k).detach()[5:] for k in PARAM_NAMES}
    assert torch.allclose(children["log_scales"], old["log_scales"][[2, 2]] - math.log(1.6))
    for k in ("quats", "opacity_logits", "sh_dc", "sh_rest"):
        assert torch.equal(children[k], old[k][[2, 2]])
    d = (children["means3D"] - old["means3D"][2]).norm(dim=-1)
    assert (d > 0).all() and (d < 6 * 5 * cfg.percent_dense * extent).all()
    # the optimizer still steps with the new tensors
    for p in per_gaussian_tensors(opt, m).values():
        p.grad = torch.ones_like(p)
    opt.step()
    _check_aligned(opt, m)


def test_split_samples_children_from_the_parent_gaussian(rng):
    n = 3000
    s = torch.tensor([0.3, 0.1, 0.02])
    log_scales = torch.log(s).expand(n, 3).clone()
    q = torch.nn.functional.normalize(torch.randn(4, generator=rng), dim=0)
    m, opt = _model_with_state(rng, log_scales, [0.5] * n, means=torch.zeros(n, 3))
    m.quats.data[:] = q
    stats = DensifyStats(n)
    stats.grad_accum.fill_(1.0)
    stats.denom.fill_(1.0)
    rep = densify_and_prune(m, opt, stats, TrainConfig(), 1.0, 600, torch.Generator().manual_seed(2))
    assert rep.n_split == n and rep.n_after == 2 * n
    from rigel_core.reference.project import quat_to_rotmat

    R = quat_to_rotmat(q[None])[0]
    local = (m.means3D.detach() @ R) / s  # back to the parent's frame, in standard deviations: ~ N(0, I)
    assert local.mean(0).abs().max() < 0.06
    assert (local.std(0) - 1).abs().max() < 0.05
    assert torch.allclose(m.scales.detach(), (s / 1.6).expand(2 * n, 3))


def test_size_prune_only_after_first_reset_and_cap(rng):
    assert TrainConfig().max_screen_size == 0  # off by default (3DGS effectively, gsplat by default)
    cfg, extent = TrainConfig(max_screen_size=20.0), 1.0
    log_scales = torch.log(torch.tensor([[0.2] * 3, [0.005] * 3, [0.005] * 3]))  # 0: world-space too big
    for iteration, expect in ((cfg.opacity_reset_interval, 3), (cfg.opacity_reset_interval + 100, 1)):
        m, opt = _model_with_state(rng, log_scales, [0.5, 0.5, 0.5])
        stats = DensifyStats(3)
        stats.max_radii = torch.tensor([1.0, 25.0, 3.0])  # 1: screen-space too big
        stats.denom.fill_(1)
        rep = densify_and_prune(m, opt, stats, cfg, extent, iteration)
        assert rep.n_after == expect and rep.n_prune == 3 - expect
        _check_aligned(opt, m)
    m, opt = _model_with_state(rng, log_scales, [0.5, 0.5, 0.5])
    stats = DensifyStats(3)
    stats.max_radii = torch.tensor([1.0, 25.0, 3.0])
    densify_and_prune(m, opt, stats, TrainConfig(max_screen_size=0), extent, cfg.opacity_reset_interval + 1)
    assert m.num_gaussians == 2  # only the world-space test

    # cap: three clone candidates, room for one → the largest gradient wins
    m, opt = _model_with_state(rng, torch.log(torch.full((4, 3), 0.001)), [0.5] * 4)
    stats = DensifyStats(4)
    stats.grad_accum = torch.tensor([3e-4, 9e-4, 5e-4, 0.0])
    stats.denom.fill_(1)
    rep = densify_and_prune(m, opt, stats, TrainConfig(max_gaussians=5), extent, 600)
    assert rep.capped and rep.n_clone == 1 and m.num_gaussians == 5
    assert torch.equal(m.means3D.detach()[4], m.means3D.detach()[1])
    rep = densify_and_prune(m, opt, stats, TrainConfig(max_gaussians=5), extent, 700)
    assert rep.n_clone == 0 and m.num_gaussians == 5  # stats were reset: nothing to do


def test_never_prunes_to_nothing(rng):
    m, opt = _model_with_state(rng, torch.zeros(3, 3) - 5, [1e-4] * 3)
    rep = densify_and_prune(m, opt, DensifyStats(3), TrainConfig(), 1.0, 600)
    assert rep.n_after == 3 and rep.n_prune == 0


def test_opacity_reset(rng):
    m, opt = _model_with_state(rng, torch.zeros(4, 3) - 3, [0.9, 0.005, 0.5, 0.02])
    before = _moments(opt, m)
    reset_opacity(m, opt, 0.01)
    o = m.opacities.detach()
    assert torch.allclose(o, torch.tensor([0.01, 0.005, 0.01, 0.01]), rtol=1e-6)
    st = opt.state[m.opacity_logits]
    assert torch.count_nonzero(st["exp_avg"]) == 0 and torch.count_nonzero(st["exp_avg_sq"]) == 0
    assert torch.equal(opt.state[m.means3D]["exp_avg"], before["means3D"]["exp_avg"])
    _check_aligned(opt, m)


def test_gradient_statistics(rng):
    n, w, h = 50, 40, 24
    g = torch.randn(n, 2, generator=rng)
    radii = torch.randint(0, 4, (n,), generator=rng, dtype=torch.int32)
    stats = DensifyStats(n)
    stats.update(g, radii, w, h)
    stats.update(2 * g, radii, w, h)
    stats.update(None, torch.zeros(n, dtype=torch.int32), w, h)  # a view where nothing is visible
    vis = (radii > 0).numpy()
    norm = np.hypot(g[:, 0].numpy() * w / 2, g[:, 1].numpy() * h / 2)
    np.testing.assert_allclose(stats.grad_accum.numpy(), np.where(vis, 3 * norm, 0), rtol=1e-6)
    np.testing.assert_array_equal(stats.denom.numpy(), np.where(vis, 2, 0))
    np.testing.assert_allclose(stats.mean_grad().numpy(), np.where(vis, 1.5 * norm, 0), rtol=1e-6)
    np.testing.assert_array_equal(stats.max_radii.numpy(), radii.numpy())
    assert torch.allclose(ndc_grad_norm(torch.tensor([[1.0, 0.0], [0.0, 1.0]]), 100, 50), torch.tensor([50.0, 25.0]))


def test_means2D_gradient_from_render(rng):
    scene = random_scene(rng, 40)
    scene.means3D[0] = torch.tensor([0.0, 0.0, 50.0])  # behind the camera below: culled
    for p in scene.parameters().values():
        p.requires_grad_(True)
    cam = Camera.look_at((0, 0, 3), (0, 0, 0), up=(0, 1, 0), width=32, height=32, fov_x_deg=60)
    out = render(scene, cam)
    prepare_means2D_grad(out)
    out.image.square().sum().backward()
    g = means2D_grad(out)
    assert g is not None and g.shape == (40, 2)
    assert out.radii[0] == 0 and torch.count_nonzero(g[0]) == 0
    ref = torch.autograd.grad(render(scene, cam).image.square().sum(), [scene.means3D])[0]
    assert torch.isfinite(g).all() and torch.count_nonzero(g[out.radii > 0]) > 0 and ref.abs().sum() > 0

    class Out:  # a backend that hands the gradient over out of band
        means2D = torch.zeros(3, 2)

    o = Out()
    assert means2D_grad(o) is None
    o.means2D_grad = lambda: torch.ones(3, 2)
    assert torch.equal(means2D_grad(o), torch.ones(3, 2))


# ---- robustness -----------------------------------------------------------------------------------------------
def _state(tr):
    params = {k: v.detach().clone() for k, v in tr.model.parameters().items()}
    mom = _moments(tr.optimizer, tr.model)
    return params, mom


def _assert_same_state(a, b):
    for k in a[0]:
        assert torch.equal(a[0][k], b[0][k]), k
        for s in a[1][k]:
            assert torch.equal(a[1][k][s], b[1][k][s]), (k, s)


def test_nan_loss_and_nan_gradient_are_skipped(rng):
    ds = make_dataset(rng, n_gauss=30, size=32, n_train=4, n_test=1)
    tr = Trainer(ds, small_config(init_points=40), device="cpu")
    tr.step()
    orig = tr.loss_terms
    tr.loss_terms = lambda *a: tuple(v * float("nan") if i == 0 else v for i, v in enumerate(orig(*a)))
    before = _state(tr)
    stats_before = tr.stats.grad_accum.clone()
    r = tr.step()
    assert r.skipped and math.isnan(r.loss) and r.nan_skips == 1 and tr.nan_skips == 1 and r.iteration == 2
    _assert_same_state(before, _state(tr))
    assert torch.equal(tr.stats.grad_accum, stats_before)
    tr.loss_terms = orig

    fired = []

    def poison(grad):  # a finite loss whose gradient is not
        if not fired:
            fired.append(1)
            return grad * float("nan")
        return grad

    tr.model.means3D.register_hook(poison)
    r = tr.step()
    assert r.skipped and math.isfinite(r.loss) and tr.nan_skips == 2
    _assert_same_state(before, _state(tr))
    r = tr.step()  # and training goes on
    assert not r.skipped and tr.nan_skips == 2
    assert all(torch.isfinite(v).all() for v in tr.model.parameters().values())
    assert all(v.grad is None for v in tr.model.parameters().values())


def test_bad_inputs(rng):
    ds = make_dataset(rng, n_gauss=10, size=16, n_train=2, n_test=0)
    ds.train[0].image = ds.train[0].image[:8]
    with pytest.raises(ValueError, match="v0.*shape"):
        Trainer(ds, small_config(), device="cpu")
    with pytest.raises(ValueError, match="no training frames"):
        Trainer(Dataset([], [], np.zeros(3), 1.0), small_config(), device="cpu")
    with pytest.raises(ValueError, match="lambda_dssim"):
        small_config(lambda_dssim=2.0).validate()
    with pytest.raises(ValueError, match="unknown field"):
        TrainConfig.from_dict({"iterations": 3, "densify_grad_thresh": 1})
    assert TrainConfig.from_dict(TrainConfig(init_box=(0, 0, 0, 1, 1, 1)).to_dict()) == TrainConfig(init_box=(0, 0, 0, 1, 1, 1))


def test_random_init_points_are_seen_by_the_cameras(rng):
    cams = orbit(12, 32)
    pts = random_init_points(cams, 2000, np.zeros(3), 3.3, min_visible=0.75, generator=rng)
    assert pts.shape == (2000, 3) and pts.dtype == torch.float32
    assert (pts.abs() <= 3.3).all()
    seen = np.zeros(2000)
    for c in cams:
        p = pts.double().numpy()
        z = (p @ c.R.T + c.t)[:, 2]
        uv = c.project(p)
        seen += (z > 0) & (uv[:, 0] >= 0) & (uv[:, 0] < 32) & (uv[:, 1] >= 0) & (uv[:, 1] < 32)
    assert (seen >= 9).all()
    assert pts.std(0).min() > 0.2  # spread over the common view, not collapsed
    box = random_init_points(cams, 500, None, 0, box=(1, 2, 3, 1.5, 2.5, 3.5), min_visible=0.0, generator=rng)
    assert (box >= torch.tensor([1, 2, 3])).all() and (box <= torch.tensor([1.5, 2.5, 3.5])).all()


def test_random_init_points_along_rays_reach_a_scene_in_front_of_forward_facing_cameras(rng):
    """A forward-facing rig (cameras on a small grid, all looking down +z): the box of their centres holds nothing
    they look at. "rays" draws along the cameras' pixels, log-uniform in 0.2..50 extents, keeps what most cameras see:
    every point is in front of them, inside their images, and most lie well beyond the box."""
    from rigel_core import Camera

    cams = [Camera.look_at(eye=(x, y, 0.0), target=(x, y, 10.0), up=(0, -1, 0), width=40, height=30, fov_x_deg=60)
            for x in (-0.5, 0.0, 0.5) for y in (-0.3, 0.3)]
    center, extent = np.zeros(3), 0.66
    pts = random_init_points(cams, 3000, center, extent, min_visible=0.5, generator=rng, mode="rays")
    assert pts.shape == (3000, 3) and pts.dtype == torch.float32 and torch.isfinite(pts).all()
    p = pts.double().numpy()
    seen = np.zeros(len(p))
    for c in cams:
        z = (p @ c.R.T + c.t)[:, 2]
        uv = c.project(p)
        seen += (z > 0) & (uv[:, 0] >= 0) & (uv[:, 0] < 40) & (uv[:, 1] >= 0) & (uv[:, 1] < 30)
    assert (seen >= 3).all()
    depth = p[:, 2]
    assert depth.min() >= 0.2 * extent * 0.99 and depth.max() <= 50 * extent * 1.01
    assert np.median(depth) > 3 * extent  # the box (|z| <= extent) would hold none of these
    box = random_init_points(cams, 3000, center, extent, min_visible=0.5, generator=rng)
    assert np.abs(box.numpy()).max() <= extent + 1e-6
    # the same generator state draws the same points (the run's RNG stream stays reproducible)
    g1, g2 = torch.Generator().manual_seed(5), torch.Generator().manual_seed(5)
    assert torch.equal(random_init_points(cams, 100, center, extent, generator=g1, mode="rays"),
                       random_init_points(cams, 100, center, extent, generator=g2, mode="rays"))
    with pytest.raises(ValueError, match="mode"):
        random_init_points(cams, 10, center, extent, mode="sphere")
    with pytest.raises(ValueError, match="ray_depths"):
        random_init_points(cams, 10, center, extent, mode="rays", ray_depths=(2.0, 1.0))
    with pytest.raises(ValueError, match="init_mode"):
        small_config(init_mode="sphere").validate()


# ---- checkpoints ------------------------------------------------------------------------------------------------
def test_checkpoint_resume_gives_the_same_next_steps(rng, tmp_path):
    ds = make_dataset(rng, n_gauss=60, size=32, n_train=5, n_test=2)
    cfg = small_config(init_points=80, densify_from=3, densify_interval=4, opacity_reset_interval=10,
                       eval_every=5, sh_degree_interval=4, grad_threshold=1e-5)
    tr = Trainer(ds, cfg, device="cpu")
    for _ in range(11):  # densification at 4 and 8, an opacity reset at 10, mid-epoch (5 views)
        tr.step()
    path = tmp_path / "ckpt.safetensors"
    tr.save_checkpoint(path)
    saved_params = {k: v.detach().clone() for k, v in tr.model.parameters().items()}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt.safetensors"]  # no temporary left behind
    resumed = Trainer.from_checkpoint(path, ds, device="cpu")
    assert resumed.iteration == 11 and resumed.config == tr.config and len(resumed.eval_history) == 2
    reports = []
    for _ in range(6):  # crosses a densification (12, with random split offsets) and an evaluation (15)
        a, b = tr.step(), resumed.step()
        assert (a.loss, a.view, a.num_gaussians, a.sh_degree) == (b.loss, b.view, b.num_gaussians, b.sh_degree)
        assert (a.densify is None) == (b.densify is None)
        reports += [a.densify] if a.densify else []
        _assert_same_state(_state(tr), _state(resumed))
        assert torch.equal(tr.stats.grad_accum, resumed.stats.grad_accum)
    assert [r.iteration for r in reports] == [12, 16] and reports[0].n_split > 0
    assert tr.eval_history[-1].psnr == resumed.eval_history[-1].psnr

    model = load_checkpoint_model(path)  # safetensors + JSON: nothing is unpickled
    for k in PARAM_NAMES:
        assert torch.equal(getattr(model, k), saved_params[k])
    with pytest.raises(CheckpointError, match="no such"):
        load_checkpoint_model(tmp_path / "missing.safetensors")
    bad = tmp_path / "bad.safetensors"
    bad.write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not json at all}")
    with pytest.raises(CheckpointError, match="bad.safetensors"):
        load_checkpoint_model(bad)


def test_load_checkpoint_model_round_trip(rng, tmp_path):
    ds = make_dataset(rng, n_gauss=20, size=16, n_train=2, n_test=0)
    tr = Trainer(ds, small_config(init_points=30, sh_degree=2, sh_degree_interval=1), device="cpu")
    tr.step()
    tr.save_checkpoint(tmp_path / "c.safetensors")
    m = load_checkpoint_model(tmp_path / "c.safetensors")
    for k in PARAM_NAMES:
        assert torch.equal(getattr(m, k), getattr(tr.model, k).detach())
    assert m.sh_degree == 2 and m.active_sh_degree == 1 and not m.means3D.requires_grad


# ---- command line -------------------------------------------------------------------------------------------------
@pytest.fixture
def blender_dataset(tmp_path_factory, rng):
    from rigel_core.data import make_dataset as make_procedural

    d = tmp_path_factory.mktemp("blender")
    make_procedural(d, 400, 32, 32, n_train=6, n_test=2, seed=int(torch.randint(0, 1000, (1,), generator=rng)),
                    device="cpu", progress=False)
    return d


def test_cli_end_to_end_resume_and_interrupt(blender_dataset, tmp_path, monkeypatch, capsys):
    from rigel_core.cli.train import main
    from rigel_core.io.ply import load_ply

    run = tmp_path / "run"
    common = ["--data", str(blender_dataset), "--out", str(run), "--device", "cpu", "--quiet", "--init-points", "150",
              "--eval-every", "10", "--n-renders", "1"]
    assert main(common + ["--iters", "20"]) == 0
    metrics = json.loads((run / "metrics.json").read_text())
    assert [e["iteration"] for e in metrics["eval"]] == [10, 20]
    assert all(math.isfinite(e["psnr"]) and 0 < e["ssim"] <= 1 for e in metrics["eval"])
    assert [t["iteration"] for t in metrics["train"]] == [10, 20] and metrics["iterations_done"] == 20
    assert metrics["dataset"]["train_views"] == 6 and metrics["timings"]["train_s"] > 0
    assert metrics["config"]["iterations"] == 20 and metrics["nan_skips"] == 0
    log = (run / "log.txt").read_text()
    assert "test psnr" in log and "final: 20 iterations" in log
    for it in ("it000010", "it000020"):
        names = sorted(p.name for p in (run / "renders" / it).iterdir())
        assert names == ["r_0_gt.png", "r_0_pred.png"]
    ply = load_ply(run / "model.ply")
    ck = load_checkpoint_model(run / "checkpoint.safetensors")
    assert torch.equal(ply.means3D, ck.means3D) and ply.sh_degree == 3
    assert "ply_bake_rmse" not in metrics and "baked" not in log   # SH: nothing to bake

    # an MLP run: the PLY holds SH fitted to the MLP, and the fit's error is reported
    run_mlp = tmp_path / "run_mlp"
    assert main(common[:2] + ["--out", str(run_mlp)] + common[4:] + ["--iters", "10", "--appearance", "mlp",
                                                                      "--sh-degree", "2"]) == 0
    metrics_mlp = json.loads((run_mlp / "metrics.json").read_text())
    assert 0.0 < metrics_mlp["ply_bake_rmse"] < 0.2
    assert "baked into SH degree 2, RMSE" in (run_mlp / "log.txt").read_text()
    assert load_ply(run_mlp / "model.ply").sh_degree == 2
    assert load_checkpoint_model(run_mlp / "checkpoint.safetensors").appearance is not None

    # an existing run is never overwritten by accident
    mtime = (run / "checkpoint.safetensors").stat().st_mtime_ns
    assert main(common + ["--iters", "25"]) == 2
    assert "--resume" in capsys.readouterr().err
    assert (run / "checkpoint.safetensors").stat().st_mtime_ns == mtime

    assert main(common + ["--iters", "25", "--resume"]) == 0
    metrics = json.loads((run / "metrics.json").read_text())
    assert metrics["resumed_at"] == [20] and metrics["iterations_done"] == 25
    assert [e["iteration"] for e in metrics["eval"]] == [10, 20, 25]

    # Ctrl-C during a step: checkpoint + PLY of the last completed iteration, exit status 130
    calls = {"n": 0}
    real_step = Trainer.step

    def step(self):
        calls["n"] += 1
        if calls["n"] == 4:
            raise KeyboardInterrupt
        return real_step(self)

    monkeypatch.setattr(Trainer, "step", step)
    run2 = tmp_path / "run2"
    assert main(["--data", str(blender_dataset), "--out", str(run2), "--device", "cpu", "--quiet",
                 "--init-points", "100", "--iters", "50", "--log-every", "2"]) == 130
    from rigel_core.checkpoint import read_checkpoint

    assert read_checkpoint(run2 / "checkpoint.safetensors")[1]["iteration"] == 3
    assert (run2 / "model.ply").is_file() and "interrupted" in (run2 / "log.txt").read_text()
    m2 = json.loads((run2 / "metrics.json").read_text())
    # the loss curve keeps the steps after its last full window (iteration 3 of a 2-step window)
    assert m2["iterations_done"] == 3 and [t["iteration"] for t in m2["train"]] == [2, 3]

    assert main(["--data", str(tmp_path / "nothing"), "--out", str(tmp_path / "r3"), "--device", "cpu"]) == 2
    assert not (tmp_path / "r3").exists()  # a run that cannot start leaves no directory behind
    capsys.readouterr()
    assert main(["--data", str(tmp_path / "nothing"), "--out", str(tmp_path / "r4"), "--device", "cpu",
                 "--resume"]) == 2
    assert "no checkpoint.safetensors" in capsys.readouterr().err


@pytest.mark.parametrize("signame", ["SIGTERM", "SIGHUP"])
def test_cli_sigterm_saves_like_ctrl_c(blender_dataset, tmp_path, monkeypatch, signame):
    """SIGTERM (what `timeout`, `docker stop`, systemd and batch schedulers send) finishes the step and saves the
    checkpoint, the PLY and the metrics as Ctrl-C does, exit status 143 = 128 + SIGTERM; a run killed this way
    resumes instead of losing every iteration since the last periodic checkpoint. SIGHUP (a closed terminal, a
    dropped ssh session) likewise, 129: it killed the run with nothing saved.
    """
    import signal

    sig = getattr(signal, signame)

    from rigel_core.checkpoint import read_checkpoint
    from rigel_core.cli.train import main

    calls = {"n": 0}
    real_step = Trainer.step

    def step(self):
        calls["n"] += 1
        if calls["n"] == 3:
            os.kill(os.getpid(), sig)   # arrives during this step, which then completes
        return real_step(self)

    monkeypatch.setattr(Trainer, "step", step)
    def not_caught(signum, frame):   # stands in for the default action (which would end pytest) if main misses it
        calls["missed"] = True

    before = signal.signal(sig, not_caught)
    try:
        run = tmp_path / "run"
        status = main(["--data", str(blender_dataset), "--out", str(run), "--device", "cpu", "--quiet",
                       "--init-points", "100", "--iters", "50"])
        assert signal.getsignal(sig) is not_caught   # the handler is put back
    finally:
        signal.signal(sig, before)
    assert status == 128 + int(sig) and "missed" not in calls
    assert read_checkpoint(run / "checkpoint.safetensors")[1]["iteration"] == 3
    assert (run / "model.ply").is_file() and "interrupted" in (run / "log.txt").read_text()


def test_cli_under_nohup_a_hangup_does_not_stop_the_run(blender_dataset, tmp_path, monkeypatch):
    """`nohup rigel-train …`: SIGHUP ignored when the run starts stays ignored (a logout must not stop the run; it
    stopped and saved with status 129), and the run ends normally."""
    import signal

    from rigel_core.checkpoint import read_checkpoint
    from rigel_core.cli.train import main

    calls = {"n": 0}
    real_step = Trainer.step

    def step(self):
        calls["n"] += 1
        if calls["n"] == 3:
            os.kill(os.getpid(), signal.SIGHUP)  # ignored: the run goes on
            calls["hup_handler"] = signal.getsignal(signal.SIGHUP)
        return real_step(self)

    monkeypatch.setattr(Trainer, "step", step)
    before = signal.signal(signal.SIGHUP, signal.SIG_IGN)
    try:
        run = tmp_path / "run"
        status = main(["--data", str(blender_dataset), "--out", str(run), "--device", "cpu", "--quiet",
                       "--init-points", "100", "--iters", "6"])
        assert signal.getsignal(signal.SIGHUP) == signal.SIG_IGN
    finally:
        signal.signal(signal.SIGHUP, before)
    assert calls["hup_handler"] == signal.SIG_IGN
    assert status == 0 and read_checkpoint(run / "checkpoint.safetensors")[1]["iteration"] == 6


@pytest.mark.parametrize("when", ["last step", "final evaluation"])
def test_cli_ctrl_c_at_the_end_still_exits_interrupted(blender_dataset, tmp_path, monkeypatch, capsys, when):
    """Ctrl-C during the last step: saved as interrupted, no final evaluation, 130. During the final evaluation (on
    a CPU, seconds of a real capture): it finishes and everything is saved, but the status is 130, not 0 (a script
    must not read success)."""
    import signal

    from rigel_core.cli.train import main

    calls = {"n": 0, "evals": 0}
    real_step, real_eval = Trainer.step, Trainer.evaluate

    def step(self):
        calls["n"] += 1
        if when == "last step" and calls["n"] == 6:
            os.kill(os.getpid(), signal.SIGINT)   # arrives during the last step, which then completes
        return real_step(self)

    def evaluate(self, *a, **kw):
        calls["evals"] += 1
        if when == "final evaluation":
            os.kill(os.getpid(), signal.SIGINT)
        return real_eval(self, *a, **kw)

    monkeypatch.setattr(Trainer, "step", step)
    monkeypatch.setattr(Trainer, "evaluate", evaluate)
    run = tmp_path / "run"
    status = main(["--data", str(blender_dataset), "--out", str(run), "--device", "cpu", "--quiet",
                   "--init-points", "100", "--iters", "6", "--eval-every", "0"])
    assert status == 130 and calls["n"] == 6
    # the signal is answered at once, before the step or evaluation in progress ends
    assert "SIGINT: stopping after the current step or evaluation" in capsys.readouterr().err
    log = (run / "log.txt").read_text()
    if when == "last step":
        assert calls["evals"] == 0 and "interrupted" in log and "final:" not in log
    else:
        assert calls["evals"] == 1 and "final: 6 iterations" in log
        assert "SIGINT during the final evaluation: the run finished and is saved; exit status 130" in log
    assert (run / "model.ply").is_file() and (run / "checkpoint.safetensors").is_file()
    if when == "last step":   # all its iterations, but not its final evaluation: --resume still has that to do
        assert main(["--data", str(blender_dataset), "--out", str(run), "--device", "cpu", "--quiet",
                     "--resume"]) == 0
        assert calls["n"] == 6 and calls["evals"] == 1 and "final: 6 iterations" in (run / "log.txt").read_text()


def test_cli_resume_of_a_finished_run_says_so_and_writes_nothing(blender_dataset, tmp_path, capsys):
    """``--resume`` of a run that finished its iterations (and its final evaluation; or has no held-out view) is
    one line — it finished its N iterations, ``--iters M`` beyond N extends it — exit 0, and every file of the run
    as it was: before, it rewrote the checkpoint, model.ply, metrics.json and log.txt as "done" again. With --iters M
    it trains on (TRAINING.md: an extended run)."""
    import shutil

    from rigel_core.cli.train import main

    def files(run):
        return {p.relative_to(run): p.read_bytes() for p in sorted(run.rglob("*")) if p.is_file()}

    no_test = shutil.copytree(blender_dataset, tmp_path / "no_test")
    (no_test / "transforms_test.json").unlink()   # no held-out view: no final evaluation to wait for
    for data in (blender_dataset, no_test):
        run = tmp_path / f"run_{data.name}"
        common = ["--data", str(data), "--out", str(run), "--device", "cpu", "--quiet", "--init-points", "100",
                  "--eval-every", "0"]
        assert main(common + ["--iters", "4"]) == 0
        before = files(run)
        assert (json.loads((run / "metrics.json").read_text())["eval"] == []) == (data == no_test)
        capsys.readouterr()
        for again in ([], ["--iters", "4"]):
            assert main(common + ["--resume"] + again) == 0
            err = capsys.readouterr().err
            assert err.count("\n") == 1 and f"{run} already finished its 4 iterations" in err \
                and "--iters M, M > 4, extends it" in err, err
            assert files(run) == before
        # settings changed for a run with nothing left to do are said not to apply, in the same line
        assert main(common + ["--resume", "--set", "exposure=true"]) == 0
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "not applied: exposure False -> True" in err, err
        assert files(run) == before
        assert main(common + ["--resume", "--iters", "6"]) == 0
        assert json.loads((run / "metrics.json").read_text())["iterations_done"] == 6


def test_cli_resume_on_another_dataset_or_resolution_is_refused(blender_dataset, tmp_path, capsys):
    """--resume checks that --data gives the views the run was trained on (count, resolution, extent, from its
    metrics.json): another dataset, or the same at another --downscale, was trained on silently and its model.ply
    overwritten (new-user review). A moved copy of the same dataset still resumes."""
    import shutil

    from rigel_core.cli.train import main

    run = tmp_path / "run"
    base = ["--out", str(run), "--device", "cpu", "--quiet", "--init-points", "100"]
    assert main(["--data", str(blender_dataset), *base, "--iters", "2"]) == 0
    before = (run / "model.ply").read_bytes()
    capsys.readouterr()
    assert main(["--data", str(blender_dataset), *base, "--iters", "3", "--resume", "--downscale", "2"]) == 2
    err = capsys.readouterr().err
    # refused before the images load since metrics.json records the factor (the next test)
    assert err.count("\n") == 1 and "--resume" in err and "was trained at --downscale 1, not 2" in err, err
    other = tmp_path / "other"
    shutil.copytree(blender_dataset, other)
    meta = json.loads((other / "transforms_train.json").read_text())
    meta["frames"] = meta["frames"][:-1]   # one training view fewer: another dataset
    (other / "transforms_train.json").write_text(json.dumps(meta))
    assert main(["--data", str(other), *base, "--iters", "3", "--resume"]) == 2
    assert "training views" in capsys.readouterr().err
    assert (run / "model.ply").read_bytes() == before   # nothing was trained over
    moved = tmp_path / "moved"
    shutil.copytree(blender_dataset, moved)
    assert main(["--data", str(moved), *base, "--iters", "3", "--resume"]) == 0
    # a damaged record has nothing to compare (was a traceback formatting its null extent): the resume goes on
    metrics = json.loads((run / "metrics.json").read_text())
    metrics["dataset"]["scene_extent"] = None
    (run / "metrics.json").write_text(json.dumps(metrics))
    assert main(["--data", str(blender_dataset), *base, "--iters", "4", "--resume"]) == 0


def test_cli_resume_keeps_the_downscale_it_was_trained_at(blender_dataset, tmp_path, monkeypatch, capsys):
    """--resume without --downscale continues at the factor the run was trained at (metrics.json records it; it
    was refused after loading the images at full size, new-user check); another factor is refused before the
    dataset loads; a run without the record resumes as before (1 unless given)."""
    import rigel_core.cli.train as train_cli

    run = tmp_path / "run"
    base = ["--data", str(blender_dataset), "--out", str(run), "--device", "cpu", "--quiet", "--init-points", "100",
            "--eval-every", "0"]
    assert train_cli.main(base + ["--iters", "2", "--downscale", "2"]) == 0
    metrics = json.loads((run / "metrics.json").read_text())
    assert metrics["dataset"]["downscale"] == 2.0
    res = metrics["dataset"]["resolution"]
    capsys.readouterr()
    assert train_cli.main(base + ["--iters", "3", "--resume"]) == 0
    err = capsys.readouterr().err
    assert f"--resume: at --downscale 2, the factor {run} was trained at" in err
    metrics = json.loads((run / "metrics.json").read_text())
    assert metrics["iterations_done"] == 3 and metrics["dataset"]["resolution"] == res
    assert train_cli.main(base + ["--iters", "4", "--resume", "--downscale", "2"]) == 0   # the same, given: no line
    assert "the factor" not in capsys.readouterr().err
    metrics = json.loads((run / "metrics.json").read_text())   # a factor printed rounded is refused in full
    metrics["dataset"]["downscale"] = 2.0000001
    (run / "metrics.json").write_text(json.dumps(metrics))
    assert train_cli.main(base + ["--iters", "4", "--resume", "--downscale", "2.000001"]) == 2
    assert "trained at --downscale 2.0000001, not 2.000001" in capsys.readouterr().err
    metrics["dataset"]["downscale"] = 2.0
    (run / "metrics.json").write_text(json.dumps(metrics))

    def no_load(args):
        raise AssertionError("the dataset was loaded before the refusal")

    monkeypatch.setattr(train_cli, "load_training_data", no_load)
    before = (run / "model.ply").read_bytes()
    assert train_cli.main(base + ["--iters", "5", "--resume", "--downscale", "1"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "was trained at --downscale 2, not 1 (leave --downscale out" in err, err
    assert (run / "model.ply").read_bytes() == before
    monkeypatch.undo()
    # metrics.json deleted: the checkpoint's record (factor 1 would train over the run at another size, unseen)
    (run / "metrics.json").unlink()
    assert train_cli.main(base + ["--iters", "5", "--resume"]) == 0
    assert f"--resume: at --downscale 2, the factor {run} was trained at" in capsys.readouterr().err
    assert json.loads((run / "metrics.json").read_text())["dataset"]["resolution"] == res
    # a run from before the records: 1 unless given, and the check after loading refuses another resolution
    from safetensors.torch import load_file, save_file

    from rigel_core.checkpoint import read_checkpoint

    metrics = json.loads((run / "metrics.json").read_text())
    del metrics["dataset"]["downscale"]
    (run / "metrics.json").write_text(json.dumps(metrics))
    _, meta = read_checkpoint(run / "checkpoint.safetensors")
    assert meta.pop("downscale") == 2.0
    save_file(load_file(run / "checkpoint.safetensors"), run / "checkpoint.safetensors",
              metadata={"rigel": json.dumps(meta)})
    assert train_cli.main(base + ["--iters", "6", "--resume"]) == 2
    err = capsys.readouterr().err   # the size names the factor that gives it
    assert "another dataset, --downscale or --test-every" in err and "its size is that of about --downscale 2" in err
    assert train_cli.main(base + ["--iters", "6", "--resume", "--downscale", "2"]) == 0


def test_cli_ctrl_c_while_loading_is_one_line(blender_dataset, tmp_path, monkeypatch, capsys):
    """Ctrl-C before training starts (a capture takes seconds to load): one line and 130, no traceback, no run."""
    import rigel_core.cli.train as train_cli

    def interrupted(args):
        raise KeyboardInterrupt

    monkeypatch.setattr(train_cli, "load_training_data", interrupted)
    run = tmp_path / "run"
    assert train_cli.main(["--data", str(blender_dataset), "--out", str(run), "--device", "cpu", "--quiet"]) == 130
    err = capsys.readouterr().err
    assert err.strip() == "rigel-train: interrupted" and not run.exists()


def test_cli_a_ctrl_c_while_an_interrupted_process_exits_adds_nothing(tmp_path):
    """After the one line of an interrupted rigel-train, a further Ctrl-C (pressed twice) reaches the interpreter's
    exit handlers: it must be ignored there — no traceback after the line, status 130 — in the process that ran
    the command line (here a SIGINT sent from an exit handler, deterministically after main returned)."""
    import subprocess
    import sys
    from pathlib import Path

    code = ("import atexit, os, signal, sys\n"
            "import rigel_core.cli.train as t\n"
            "def interrupted(argv):\n    raise KeyboardInterrupt\n"
            "t._run = interrupted\n"
            "atexit.register(lambda: os.kill(os.getpid(), signal.SIGINT))\n"
            "sys.exit(t.main())\n")
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[1]))
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env,
                          cwd=tmp_path)
    assert proc.returncode == 130, (proc.returncode, proc.stderr[-2000:])
    assert proc.stderr.strip() == "rigel-train: interrupted", proc.stderr[-2000:]


def test_cli_threads_sets_the_trainers_cpu_threads_with_the_viewers_bound(blender_dataset, tmp_path, monkeypatch,
                                                                          capsys):
    """``rigel-train --threads N`` (it had none: two CPU runs at once, each with a thread per core, slowed each other
    20-30x) trains with N PyTorch threads; outside [1, 4 x the CPUs] (rigel-viewer's bound, one rule) it is one
    line naming the flag, exit 2, nothing written."""
    import rigel_core.cli.train as train_cli
    from rigel_core.cli.common import max_threads
    from rigel_core.train import Trainer

    seen = []
    real_step = Trainer.step

    def step(self, *a, **k):
        seen.append(torch.get_num_threads())
        return real_step(self, *a, **k)

    monkeypatch.setattr(Trainer, "step", step)
    before = torch.get_num_threads()
    want = 1 if before != 1 else 2
    run = tmp_path / "run"
    common = ["--data", str(blender_dataset), "--device", "cpu", "--quiet", "--init-points", "100", "--iters", "3"]
    try:
        assert train_cli.main(common + ["--out", str(run), "--threads", str(want)]) == 0
    finally:
        torch.set_num_threads(before)
    assert seen == [want] * 3
    capsys.readouterr()
    for bad in ("0", "-2", str(max_threads() + 1)):
        out = tmp_path / f"bad{bad}"
        assert train_cli.main(common + ["--out", str(out), "--threads", bad]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and f"--threads must be in [1, {max_threads()}]" in err and bad in err, err
        assert not out.exists()


@pytest.mark.parametrize("flags,says", [
    (["--iters", "-5"], "--iters must be > 0, got -5"),
    (["--max-gaussians", "0"], "--max-gaussians must be ≥ 1, got 0"),
    (["--sh-degree", "7"], "--sh-degree must be in 0..3, got 7"),
    (["--batch-size", "0"], "--batch-size must be in 1..4096, got 0"),
    (["--init-points", "0"], "--init-points must be ≥ 1, got 0"),
    (["--position-lr-max-steps", "0"], "--position-lr-max-steps must be ≥ 1, got 0"),
    (["--seed", str(2**70)], f"--seed must be in -2^63..2^64-1, got {2**70}"),
    (["--set", "iterations=-5"], "--set iterations must be > 0, got -5"),
    (["--iters", "9", "--set", "iterations=-5"], "--set iterations must be > 0, got -5"),   # --set wins
    (["--set", "densify_interval=0"], "--set densify_interval must be > 0, got 0"),
    # fields once refused in a group ("TrainConfig.pose_opt_*, eval_pose_steps, eval_pose_lr must be ≥ 0, got -1,
    # 1e-06, 0.0, 0, 100, 0.001"): named alone, as the flag's
    (["--pose-opt", "--set", "pose_opt_lr=-1"], "--set pose_opt_lr must be ≥ 0, got -1"),
    (["--set", "appearance_grid_size=0"], "--set appearance_grid_size must be ≥ 2, got 0"),
    (["--set", "exposure_lr_delay_mult=2"], "--set exposure_lr_delay_mult must be in [0, 1], got 2"),
    # refused by the Trainer itself (build_trainer), after the configuration was checked
    (["--set", "densify_grad=absgrad"], "--set densify_grad='absgrad' needs the CUDA kernels"),
])
@pytest.mark.parametrize("cli", ["rigel-train", "rigel-viewer"])
def test_cli_refusals_name_the_flag_not_the_config_field(blender_dataset, tmp_path, capsys, cli, flags, says):
    """A refused training value is named as the user gave it: ``--iters -5`` says "--iters must be > 0", not
    "TrainConfig.iterations must be > 0" (an internal name); one line, exit 2, nothing written; by rigel-train and
    rigel-viewer --data (before the viewer opens)."""
    if cli == "rigel-train":
        from rigel_core.cli.train import main
    else:
        from viewer.cli import main
    out = tmp_path / "run"
    argv = ["--data", str(blender_dataset), "--out", str(out), "--device", "cpu"] + flags
    assert main(argv + (["--quiet"] if cli == "rigel-train" else ["--offscreen"])) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and says in err and "TrainConfig" not in err, err
    assert not out.exists()


def test_cli_resume_refusals_name_the_flag(blender_dataset, tmp_path, capsys):
    """The same on --resume (the checkpoint's configuration with the command line's overrides): the flag is named,
    and a field the command line did not set keeps its TrainConfig name."""
    from rigel_core.cli.common import FLAG_FIELDS, flag_words
    from rigel_core.cli.train import build_parser, main
    from rigel_core.train import TrainConfig
    from viewer.cli import main as viewer_main

    run = tmp_path / "run"
    common = ["--data", str(blender_dataset), "--out", str(run), "--device", "cpu", "--init-points", "100"]
    assert main(common + ["--iters", "2", "--quiet"]) == 0
    capsys.readouterr()
    for m in (main, viewer_main):
        assert m(common + ["--resume", "--max-gaussians", "0"] + (["--quiet"] if m is main else ["--offscreen"])) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "--max-gaussians must be ≥ 1, got 0" in err and "TrainConfig" not in err, err
    # the table is not stale: each field is TrainConfig's, each flag rigel-train's, and a flag left out keeps the
    # field's own name
    fields = set(TrainConfig.__dataclass_fields__)
    parser_flags = {o for a in build_parser()._actions for o in a.option_strings}
    assert set(FLAG_FIELDS) <= fields and set(FLAG_FIELDS.values()) <= parser_flags
    args = build_parser().parse_args(["--data", "d", "--out", "o"])
    assert flag_words("TrainConfig.iterations must be > 0, got 0", args) == "TrainConfig.iterations must be > 0, got 0"


# ---- background points for a partial SfM (init_background_points) -------------------------------------------------
def test_background_init_points_lie_behind_the_sfm_points_between_the_two_spheres(rng):
    from rigel_core.train import background_init_points

    size = 40
    cam = orbit(1, size, radius=3.0)[0]
    blocks = torch.rand(size // 4, size // 4, 3, generator=rng)  # a blocky image: colours constant over 4×4 px
    img = blocks.repeat_interleave(4, 0).repeat_interleave(4, 1)
    sfm = 0.3 * torch.randn(500, 3, generator=rng, dtype=torch.float64)  # an "object" at the centre
    center, extent, radius, n = np.zeros(3), 3.3, 2.5, 4000
    pts, cols = background_init_points([Frame(cam, img, None, "a")], sfm.numpy(), n, center, extent, radius=radius,
                                       generator=rng)
    assert pts.shape == (n, 3) and cols.shape == (n, 3) and pts.dtype == cols.dtype == torch.float32
    p = pts.double().numpy()
    pc = p @ cam.R.T + cam.t
    z = pc[:, 2]
    uv = cam.project(p)
    assert ((uv >= 0) & (uv < size)).all() and (z > 0).all()  # on rays of the image's pixels
    z_sfm = (sfm.numpy() @ cam.R.T + cam.t)[:, 2]
    assert (z >= np.percentile(z_sfm, 95) * (1 - 1e-5)).all()  # behind (almost) all the object in this view
    dist = np.linalg.norm(p - center, axis=1)
    assert (dist >= extent * (1 - 1e-5)).all()  # outside the camera sphere
    # the bounds along each ray (independent: numpy on the recomputed ray): leaving the camera sphere or the
    # percentile, and leaving the outer sphere
    o = cam.c2w[:3, 3]
    d = (p - o) / z[:, None]
    a, b = (d * d).sum(1), d @ (o - center)
    exit_at = lambda r: (-b + np.sqrt(b * b - a * ((o - center) @ (o - center) - r * r))) / a
    t_near = np.maximum(exit_at(extent), np.percentile(z_sfm, 95))
    t_far = np.where(exit_at(radius * extent) > t_near, exit_at(radius * extent), 2 * t_near)
    assert (z <= t_far * (1 + 1e-5)).all()
    s = (1 / t_near - 1 / z) / (1 / t_near - 1 / t_far)  # uniform in inverse depth
    assert abs(s.mean() - 0.5) < 0.03 and abs((s < 0.25).mean() - 0.25) < 0.03
    # the colour of the pixel the point projects to (a float32 round trip may move a point across a block
    # edge: allow a few)
    iu, iv = np.clip(np.floor(uv).astype(int), 0, size - 1).T
    assert (np.abs(cols.numpy() - img.numpy()[iv, iu]).max(1) < 1e-6).mean() > 0.99

    # frames are drawn uniformly; a camera that sees no SfM point starts at the camera sphere
    cams = orbit(2, 16)
    fr = [Frame(c, torch.rand(16, 16, 3, generator=rng), None, c.name) for c in cams]
    pts2, _ = background_init_points(fr, np.zeros((0, 3)), 2000, center, extent, generator=rng)
    depth = np.stack([(pts2.double().numpy() @ c.R.T + c.t)[:, 2] for c in cams])
    in_view = np.stack([((c.project(pts2.double().numpy()) >= 0) & (c.project(pts2.double().numpy()) < 16)).all(1)
                        & (depth[i] > 0) for i, c in enumerate(cams)])
    assert in_view.any(0).all() and 800 < in_view[0].sum() and 800 < in_view[1].sum()
    assert depth.max() > 5 and (np.linalg.norm(pts2.double().numpy(), axis=1) >= extent * (1 - 1e-5)).all()
    with pytest.raises(ValueError, match="radius"):
        background_init_points(fr, None, 5, center, extent, radius=1.0)
    with pytest.raises(ValueError, match="no training frames"):
        background_init_points([], None, 5, center, extent)


def test_trainer_adds_background_points_only_to_sfm_points(rng):
    ds = make_dataset(rng, n_gauss=30, size=16, n_train=3, n_test=0)
    ds.points = (0.3 * torch.randn(50, 3, generator=rng, dtype=torch.float64)).numpy()
    ds.point_colors = np.full((50, 3), 200.0)  # 8-bit colours
    plain = Trainer(ds, small_config(), device="cpu")
    tr = Trainer(ds, small_config(init_background_points=70, init_background_radius=2.0), device="cpu")
    assert plain.model.num_gaussians == 50 and tr.model.num_gaussians == 120
    assert torch.equal(tr.model.means3D.detach()[:50], plain.model.means3D.detach())
    from rigel_core.model import rgb_to_sh

    assert torch.allclose(tr.model.sh_dc.detach()[:50, 0], rgb_to_sh(torch.full((50, 3), 200 / 255)), atol=1e-6)
    far = tr.model.means3D.detach()[50:].double().norm(dim=1)
    assert (far <= 2.0 * ds.scene_extent * (1 + 1e-5)).all() and (far >= ds.scene_extent * (1 - 1e-5)).all()
    tr.step()  # and it trains
    ds.points = None  # no SfM points: random init, the option is ignored
    assert Trainer(ds, small_config(init_background_points=70), device="cpu").model.num_gaussians == 200
    with pytest.raises(ValueError, match="init_background"):
        small_config(init_background_points=-1).validate()


def _object_in_a_room(rng, n_obj=80, n_room=600, room_radius=6.0):
    """An object (random Gaussians within ±0.8) inside a "room": a shell of large opaque Gaussians of smooth
    colours at ``room_radius``, around the orbit cameras (radius 3). Returns (scene, object model)."""
    obj = random_scene(rng, n_obj)
    d = torch.randn(n_room, 3, generator=rng)
    d = d / d.norm(dim=1, keepdim=True)
    col = (0.5 + 0.4 * torch.sin(2.0 * d + 6 * torch.rand(1, 3, generator=rng))).clamp(0, 1)
    room = GaussianModel.from_points(room_radius * d, col, sh_degree=1, scale=0.6, opacity=0.95)
    return GaussianModel(*(torch.cat([getattr(obj, k), getattr(room, k)]) for k in PARAM_NAMES)), obj


def test_background_points_help_when_sfm_covers_only_the_object(rng):
    """The bonsai case in small: SfM points on the object only; the room behind it is in every image."""
    scene, obj = _object_in_a_room(rng, n_room=300)
    ds = make_dataset(rng, size=20, n_train=8, n_test=3, scene=scene)
    ds.points = obj.means3D.double().numpy()
    ds.point_colors = np.full((len(obj), 3), 0.5)
    seed = int(torch.randint(0, 2 ** 31, (1,), generator=rng))
    psnr = {}
    for nb in (0, 300):
        tr = Trainer(ds, small_config(iterations=120, densify_from=30, densify_interval=30, densify_until=100,
                                      seed=seed, init_background_points=nb), device="cpu")
        for _ in range(120):
            tr.step()
        psnr[nb] = tr.evaluate().psnr
    print(f"held-out PSNR: SfM points only {psnr[0]:.2f} dB, with 300 background points {psnr[300]:.2f} dB")
    assert psnr[300] > psnr[0] + 1.0  # measured +2.6 to +4.8 dB over fresh seeds


def test_sfm_view_coverage_counts_the_grid_cells_the_points_reach(rng):
    from rigel_core.train import sfm_view_coverage

    w, h, cells = 64, 48, 8
    cams = orbit(3, w)
    cams = [Camera(w, h, c.fx, c.fx, w / 2, h / 2, c.viewmat, c.name) for c in cams]
    pts, want = [], []
    for cam in cams:  # points in a random set of cells of each view, placed through that camera
        chosen = torch.randperm(cells * cells, generator=rng)[: int(torch.randint(1, cells * cells, (1,),
                                                                                     generator=rng))]
        want.append(len(chosen) / cells ** 2)
        for c in chosen.tolist():
            k = int(torch.randint(1, 4, (1,), generator=rng))
            col, row = c % cells, c // cells
            u = (col + 0.05 + 0.9 * torch.rand(k, generator=rng, dtype=torch.float64)) * (w / cells)
            v = (row + 0.05 + 0.9 * torch.rand(k, generator=rng, dtype=torch.float64)) * (h / cells)
            z = 0.5 + 4 * torch.rand(k, generator=rng, dtype=torch.float64)
            pc = torch.stack([(u - cam.cx) / cam.fx * z, (v - cam.cy) / cam.fy * z, z], 1).numpy()
            pts.append((pc - cam.viewmat[:3, 3]) @ cam.viewmat[:3, :3])  # camera → world
    pts = np.concatenate(pts)
    frames = [Frame(c, torch.zeros(h, w, 3), None, c.name) for c in cams]
    # an independent count of the cells each view's projections reach (other views' points may add cells)
    per_view = []
    for cam in cams:
        pc = pts @ cam.viewmat[:3, :3].T + cam.viewmat[:3, 3]
        z = pc[:, 2]
        ok = z > 0
        u = cam.fx * pc[ok, 0] / z[ok] + cam.cx
        v = cam.fy * pc[ok, 1] / z[ok] + cam.cy
        inside = (u >= 0) & (u < w) & (v >= 0) & (v < h)
        per_view.append(len({(int(a // (w / cells)), int(b // (h / cells))) for a, b in zip(u[inside], v[inside])})
                        / cells ** 2)
    assert all(p >= q for p, q in zip(per_view, want))  # the independent count sees at least the placed cells
    assert sfm_view_coverage(frames, pts, cells) == pytest.approx(float(np.median(per_view)), abs=1e-12)
    assert sfm_view_coverage(frames[:1], pts[:0], cells) == 0.0
    # a large model is sampled: evenly spaced frames, every k-th point
    step = -(-len(pts) // 7)
    assert sfm_view_coverage(frames, pts, cells, max_frames=2, max_points=7) == \
        sfm_view_coverage([frames[0], frames[2]], pts[::step], cells)
    # points behind the camera or outside the image reach nothing
    cam = cams[0]
    behind = (np.array([[0.0, 0.0, -2.0]]) - cam.viewmat[:3, 3]) @ cam.viewmat[:3, :3]
    aside = (np.array([[50.0, 0.0, 2.0]]) - cam.viewmat[:3, 3]) @ cam.viewmat[:3, :3]
    assert sfm_view_coverage(frames[:1], np.concatenate([behind, aside]), cells) == 0.0
    with pytest.raises(ValueError, match="no frames"):
        sfm_view_coverage([], pts)
    with pytest.raises(ValueError, match="cells"):
        sfm_view_coverage(frames, pts, 0)


def test_trainer_suggests_background_points_when_the_sfm_leaves_the_views_empty(rng):
    scene, obj = _object_in_a_room(rng, n_room=300)
    ds = make_dataset(rng, size=20, n_train=6, n_test=1, scene=scene)
    core = 0.5 * obj.means3D.double().numpy()  # SfM points on the object's core: 16–21 % of a view's cells
    ds.points, ds.point_colors = core, np.full((len(core), 3), 0.5)
    tr = Trainer(ds, small_config(), device="cpu")
    assert "--init-background" in tr.init_note
    assert Trainer(ds, small_config(init_background_points=50), device="cpu").init_note is None  # already asked
    d = torch.randn(3000, 3, generator=rng, dtype=torch.float64)
    ds.points = np.concatenate([core, 6.0 * (d / d.norm(dim=1, keepdim=True)).numpy()])  # and the room's walls
    ds.point_colors = np.full((len(ds.points), 3), 0.5)
    assert Trainer(ds, small_config(), device="cpu").init_note is None
    ds.points = None  # random initialisation: nothing to say
    assert Trainer(ds, small_config(), device="cpu").init_note is None


# ---- init_background_points = "auto" (with strategy "auto") ----------------------------------------------------------
def _partial_sfm_dataset(rng, covered=False):
    """The bonsai case in small: SfM points on an object's core (16–21 % of a view's 8x8 cells), or with
    ``covered`` also on the room's walls around the cameras (every cell)."""
    scene, obj = _object_in_a_room(rng, n_room=300)
    ds = make_dataset(rng, size=20, n_train=6, n_test=1, scene=scene)
    pts = 0.5 * obj.means3D.double().numpy()
    if covered:
        d = torch.randn(3000, 3, generator=rng, dtype=torch.float64)
        pts = np.concatenate([pts, 6.0 * (d / d.norm(dim=1, keepdim=True)).numpy()])
    ds.points, ds.point_colors = pts, np.full((len(pts), 3), 0.5)
    return ds


def _auto_config(**kw):
    """"auto" background points (40) and strategy; a partial SfM of a few views keeps 3DGS's densification here
    (``auto_default_min_views`` 1: the tiny test captures stand for bonsai's 255 views)."""
    return small_config(**{"init_background_points": "auto", "auto_background_points": 40,
                           "auto_default_min_views": 1, **kw})


def test_auto_background_on_a_partial_sfm_adds_points_and_picks_3dgs_densification(rng):
    from rigel_core.train import sfm_view_coverage
    from rigel_core.train.trainer import SPARSE_SFM_COVERAGE

    ds = _partial_sfm_dataset(rng)
    m = len(ds.points)
    cover = sfm_view_coverage(ds.train, ds.points)
    assert cover < SPARSE_SFM_COVERAGE
    cfg = _auto_config()
    assert TrainConfig().init_background_points == "auto" and TrainConfig().auto_background_points == 20_000
    tr = Trainer(ds, cfg, device="cpu")
    assert tr.sfm_coverage == cover
    assert (tr.config.init_background_points, tr.config.strategy, tr.config.max_gaussians) == (40, "default",
                                                                                               3_000_000)
    assert tr.model.num_gaussians == m + 40
    explicit = Trainer(ds, small_config(init_background_points=40, strategy="default"), device="cpu")
    assert torch.equal(tr.model.means3D, explicit.model.means3D)  # exactly what the explicit count gives
    assert f"{cover:.0%}" in tr.init_note and "40 background points" in tr.init_note \
        and "--init-background 0" in tr.init_note
    assert tr.strategy_note.startswith("strategy auto: default") and f"{cover:.0%}" in tr.strategy_note \
        and "--init-background 0" in tr.strategy_note
    assert (cfg.init_background_points, cfg.strategy) == ("auto", "auto")  # the caller's config is left as given
    tr.step()
    assert tr.is_consistent()
    # a run started from a given model (bench/real.py trains from another Trainer's initial model) resolves the
    # same, and says nothing about an initialisation it did not make
    again = Trainer(ds, cfg, model=tr.model, device="cpu")
    assert again.config == tr.config and again.init_note is None and again.strategy_note == tr.strategy_note
    # with fewer training views than auto_default_min_views: the same points, under the MCMC budget
    few = Trainer(ds, _auto_config(auto_default_min_views=len(ds.train) + 1), device="cpu")
    assert (few.config.init_background_points, few.config.strategy) == (40, "mcmc")
    assert torch.equal(few.model.means3D, explicit.model.means3D) and f"{len(ds.train)} training views" in few.strategy_note
    # an explicit strategy is never overridden: the points are added, the MCMC budget stays
    mc = Trainer(ds, _auto_config(strategy="mcmc", max_gaussians=500), device="cpu")
    assert (mc.config.init_background_points, mc.config.strategy, mc.config.max_gaussians) == (40, "mcmc", 500)
    assert mc.model.num_gaussians == m + 40 and mc.strategy_note is None and "40 background points" in mc.init_note


def test_auto_background_on_a_covering_sfm_adds_none_and_keeps_the_mcmc_budget(rng):
    ds = _partial_sfm_dataset(rng, covered=True)
    tr = Trainer(ds, _auto_config(auto_mcmc_budget=5000), device="cpu")
    assert tr.sfm_coverage >= 0.5
    assert (tr.config.init_background_points, tr.config.strategy, tr.config.max_gaussians) == (0, "mcmc", 5000)
    assert tr.model.num_gaussians == len(ds.points) and tr.init_note is None
    assert f"{tr.sfm_coverage:.0%}" in tr.strategy_note and "mcmc" in tr.strategy_note


def test_explicit_zero_background_on_a_partial_sfm_adds_none_and_suggests(rng):
    ds = _partial_sfm_dataset(rng)
    tr = Trainer(ds, small_config(init_background_points=0, auto_mcmc_budget=5000), device="cpu")
    assert (tr.config.init_background_points, tr.config.strategy, tr.config.max_gaussians) == (0, "mcmc", 5000)
    assert tr.model.num_gaussians == len(ds.points)
    assert "--init-background" in tr.init_note and f"{tr.sfm_coverage:.0%}" in tr.init_note
    # a given model with an explicit count: nothing to initialise, so nothing measured or suggested
    given = Trainer(ds, small_config(init_background_points=0, strategy="default"), model=tr.model, device="cpu")
    assert given.sfm_coverage is None and given.init_note is None and given.config.init_background_points == 0


def test_auto_background_without_sfm_points_is_random_init_and_default(rng):
    ds = make_dataset(rng, n_gauss=30, size=16, n_train=3, n_test=0)
    tr = Trainer(ds, _auto_config(), device="cpu")
    assert (tr.config.init_background_points, tr.config.strategy) == (0, "default")
    assert tr.model.num_gaussians == 200 and tr.sfm_coverage is None and tr.init_note is None
    assert "no SfM points" in tr.strategy_note


def test_the_resolved_config_never_holds_auto_and_an_old_checkpoint_resumes_unchanged(rng, tmp_path):
    from safetensors.torch import load_file, save_file

    from rigel_core.checkpoint import read_checkpoint
    from rigel_core.cli.common import resume_config

    ds = _partial_sfm_dataset(rng)
    tr = Trainer(ds, _auto_config(), device="cpu")
    tr.step()
    path = tmp_path / "c.safetensors"
    tr.save_checkpoint(path)
    _, meta = read_checkpoint(path)
    saved = meta["config"]
    assert (saved["init_background_points"], saved["strategy"]) == (40, "default")
    assert "auto" not in {v for v in saved.values() if isinstance(v, str)}
    assert TrainConfig.from_dict(saved) == tr.config  # a re-run from the saved config does the same thing
    assert Trainer(ds, TrainConfig.from_dict(saved), device="cpu").model.num_gaussians == len(ds.points) + 40
    # a run of today's old defaults on this capture (explicit 0, MCMC) resumes as it was, nothing re-decided
    old = Trainer(ds, small_config(init_background_points=0, strategy="mcmc", max_gaussians=900), device="cpu")
    old.step()
    old.save_checkpoint(path := tmp_path / "old.safetensors")
    resumed = Trainer.from_checkpoint(path, ds, device="cpu")
    assert (resumed.config.init_background_points, resumed.config.strategy, resumed.config.max_gaussians) == (
        0, "mcmc", 900)
    assert resumed.strategy_note is None and resumed.init_note is None and resumed.sfm_coverage is None
    assert resume_config(path, {"iterations": 50}).init_background_points == 0
    # a checkpoint from before the field existed started without background points: 0, not "auto"
    _, meta = read_checkpoint(path)
    del meta["config"]["init_background_points"], meta["config"]["auto_background_points"]
    del meta["config"]["init_mode"]   # before it existed, random points were drawn in the cameras' box
    save_file(load_file(path), path, metadata={"rigel": json.dumps(meta)})
    resumed = Trainer.from_checkpoint(path, ds, device="cpu")
    assert (resumed.config.init_background_points, resumed.config.strategy) == (0, "mcmc")
    assert resumed.config.init_mode == "box"


@pytest.mark.parametrize("bad", ["x", -1, True, None, 1.5, [3], 10_000_001, 1e30])
def test_init_background_points_validation(bad):
    with pytest.raises(ValueError, match="init_background_points must be") as e:
        TrainConfig(init_background_points=bad).validate()
    assert "\n" not in str(e.value)
    for good, want in (("auto", "auto"), ("AUTO", "auto"), (0, 0), (7, 7), (7.0, 7), (10_000_000, 10_000_000)):
        cfg = TrainConfig(init_background_points=good)
        cfg.validate()
        assert cfg.init_background_points == want
    for n in (0, 10_000_001):
        with pytest.raises(ValueError, match="auto_background_points"):
            TrainConfig(auto_background_points=n).validate()


def test_an_explicit_background_count_without_sfm_points_is_noted_and_recorded_as_unused(rng):
    ds = make_dataset(rng, n_gauss=30, size=16, n_train=3, n_test=0)
    cfg = small_config(init_background_points=500)
    tr = Trainer(ds, cfg, device="cpu")
    assert tr.model.num_gaussians == 200 and tr.config.init_background_points == 0
    assert "not used: the dataset has no SfM points" in tr.init_note
    assert cfg.init_background_points == 500  # the caller's config is left as given


def test_cli_init_background_takes_auto_or_a_count(capsys):
    from rigel_core.cli.common import config_overrides, new_config
    from rigel_core.cli.train import build_parser

    def parse(*argv):
        return build_parser().parse_args(["--data", "d", "--out", "o", *argv])

    assert "init_background_points" not in config_overrides(parse())  # the default: TrainConfig's "auto"
    for text, want in (("auto", "auto"), ("AUTO", "auto"), ("0", 0), ("20000", 20000)):
        args = parse("--init-background", text)
        assert config_overrides(args)["init_background_points"] == want
        assert new_config(args, config_overrides(args)).init_background_points == want
    assert config_overrides(parse("--set", "init_background_points=auto"))["init_background_points"] == "auto"
    for bad in ("lots", "-3", "1.5", "", "99999999999999999999", "10000001"):
        with pytest.raises(SystemExit):
            parse("--init-background", bad)
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and (f"argument --init-background: expected a count in [0, 10,000,000] or 'auto', got "
                                  f"{bad!r}") in err[0]   # one line (rigel_core.cli.common.Parser)


@pytest.mark.parametrize("name,partial", [("bonsai", True), ("fern", False), ("beer", False)])
def test_sfm_view_coverage_tells_bonsai_from_fern_and_beer(shared_data, name, partial):
    """bonsai's SfM points cover only the bonsai and its table; fern's and beer's the whole view. Cameras and
    points read with pycolmap (independent of rigel's loaders)."""
    from rigel_core.train import sfm_view_coverage
    from rigel_core.train.trainer import SPARSE_SFM_COVERAGE

    src = shared_data / "real" / name
    if not (src / "sparse" / "0").is_dir():
        pytest.skip(f"{src}: real capture not present")
    pycolmap = pytest.importorskip("pycolmap")
    rec = pycolmap.Reconstruction(str(src / "sparse" / "0"))
    frames = []
    for im in rec.images.values():
        cam = rec.cameras[im.camera_id]
        K = cam.calibration_matrix()
        cfw = im.cam_from_world() if callable(im.cam_from_world) else im.cam_from_world
        vm = np.eye(4)
        vm[:3] = cfw.matrix()
        frames.append(types.SimpleNamespace(camera=Camera(cam.width, cam.height, K[0, 0], K[1, 1], K[0, 2], K[1, 2],
                                                          vm, im.name)))
    pts = np.stack([p.xyz for p in rec.points3D.values()])
    cover = sfm_view_coverage(frames, pts)
    print(f"{name}: SfM coverage {cover:.2f}")
    assert (cover < SPARSE_SFM_COVERAGE) == partial


def test_init_scale_rms_option(rng):
    from rigel_core.train.trainer import knn_rms_distance

    ds = make_dataset(rng, n_gauss=10, size=16, n_train=2, n_test=0)
    pts = torch.randn(40, 3, generator=rng, dtype=torch.float64)
    pts[1] = pts[0]  # a duplicate
    ds.points = pts.numpy()
    ds.point_colors = None
    mean = Trainer(ds, small_config(), device="cpu").model.scales.detach()[:, 0].double()
    rms = Trainer(ds, small_config(init_scale_rms=True), device="cpu").model.scales.detach()[:, 0].double()
    # brute force: squared distances to every other point, the 3 smallest
    d2 = ((pts[:, None] - pts[None]) ** 2).sum(-1) + torch.diag(torch.full((40,), float("inf"), dtype=torch.float64))
    near = d2.sort(1).values[:, :3]
    assert torch.allclose(rms, near.mean(1).clamp_min(1e-7).sqrt(), rtol=1e-6)
    assert torch.allclose(mean, near.sqrt().mean(1), rtol=1e-6)
    assert (rms >= mean * (1 - 1e-6)).all() and (rms > mean * 1.001).any()  # RMS ≥ mean, strictly somewhere
    one = knn_rms_distance(torch.zeros(1, 3))
    assert one.shape == (1,) and float(one) == 1.0
    assert float(knn_rms_distance(torch.zeros(4, 3))[0]) == pytest.approx(1e-7 ** 0.5)  # the d² clamp


def test_densify_visibility_rules_against_brute_force(rng):
    """Which views count in a Gaussian's average gradient: 'radius' (radii > 0), 'opacity' (gsplat's
    opacity-aware extent reaches the image, opacity ≥ 1/255), 'contrib' (a non-zero gradient), each checked
    per Gaussian against a plain-Python rule on fresh random inputs with every branch present."""
    n, w, h = 400, 64, 48
    radii = torch.randint(0, 12, (n,), generator=rng, dtype=torch.int32)
    means2D = torch.rand(n, 2, generator=rng) * torch.tensor([w + 40.0, h + 40.0]) - 20.0
    opac = torch.rand(n, generator=rng) ** 3          # many faint ones, some below 1/255
    opac[:5] = 1.0 / 255.0 - 1e-6
    opac[5:10] = float("nan")                           # culled rows: never visible under 'opacity'
    grad = torch.randn(n, 2, generator=rng) * 1e-3
    grad[torch.rand(n, generator=rng) < 0.3] = 0.0      # views a Gaussian did not draw in
    for vis in ("radius", "opacity", "contrib"):
        stats = DensifyStats(n)
        stats.update(grad, radii, w, h, visibility=vis, means2D=means2D, opacities=opac)
        for i in range(n):
            r, (u, v), o = int(radii[i]), means2D[i].tolist(), float(opac[i])
            want = r > 0
            if vis == "opacity":
                ok_o = o == o and o >= 1 / 255
                e = min(3.33, math.sqrt(2 * math.log(max(255 * o, 1.0)))) if ok_o else 0.0
                rr = r * e / 3
                want = want and ok_o and u + rr > 0 and u - rr < w and v + rr > 0 and v - rr < h
            elif vis == "contrib":
                want = want and bool((grad[i] != 0).any())
            assert float(stats.denom[i]) == float(want), (vis, i)
            norm = math.hypot(float(grad[i, 0]) * w / 2, float(grad[i, 1]) * h / 2)
            assert float(stats.grad_accum[i]) == pytest.approx(norm if want else 0.0, rel=1e-5, abs=1e-12)
    with pytest.raises(ValueError, match="visibility"):
        DensifyStats(n).update(grad, radii, w, h, visibility="bogus")
    with pytest.raises(ValueError, match="densify_visibility"):
        TrainConfig(densify_visibility="bogus").validate()


def test_densify_grad_picks_the_statistic_and_absgrad_needs_the_kernels(rng):
    """densify_grad: "grad" averages ∂L/∂means2D, "absgrad" the raster backward's Σ_p |∂L_p/∂means2D| (left on the
    render's means2D by the CUDA backend); a bad value and "absgrad" on the CPU are refused, naming the field."""
    from types import SimpleNamespace

    from rigel_core.train.densify import densify_grad, means2D_absgrad

    g = torch.randn(7, 2, generator=rng)
    a = g.abs() + torch.rand(7, 2, generator=rng)   # what a backward leaves: ≥ |g| per axis
    m = torch.zeros(7, 2, requires_grad=True)
    m.grad = g
    out = SimpleNamespace(means2D=m)
    assert means2D_absgrad(out) is None   # no backward has left one (the CPU reference never does)
    m.absgrad = a
    assert densify_grad(out, TrainConfig(densify_grad="grad")) is g
    assert densify_grad(out, TrainConfig(densify_grad="absgrad")) is a
    with pytest.raises(ValueError, match="densify_grad"):
        TrainConfig(densify_grad="abs").validate()
    ds = make_dataset(rng, n_train=2, n_test=1, size=32)
    with pytest.raises(ValueError, match="densify_grad='absgrad' needs the CUDA kernels"):
        Trainer(ds, small_config(densify_grad="absgrad"), device="cpu")


@pytest.mark.parametrize("strategy, sfm, cuda, want, noted", [
    ("default", True, True, "absgrad", True),    # a real capture under 3DGS's densification, on the kernels
    ("default", True, False, "grad", True),      # ... on the CPU: no absolute gradients there, said in the log
    ("default", False, True, "grad", False),     # no SfM points (lego): 3DGS's statistic
    ("mcmc", True, True, "grad", False),         # the MCMC budget reads no gradient statistic
])
def test_densify_grad_auto_resolves_from_the_capture_the_strategy_and_the_device(strategy, sfm, cuda, want, noted):
    from rigel_core.train.config import resolve_densify_grad

    cfg = TrainConfig(strategy=strategy)
    assert cfg.densify_grad == "auto"   # the default
    note = resolve_densify_grad(cfg, has_sfm_points=sfm, cuda=cuda)
    assert cfg.densify_grad == want and (note is not None) == noted
    if noted:
        assert note.startswith(f"densify_grad auto: {want}")
    for explicit in ("grad", "absgrad"):   # an explicit statistic is kept, whatever the capture
        cfg = TrainConfig(strategy=strategy, densify_grad=explicit)
        assert resolve_densify_grad(cfg, has_sfm_points=sfm, cuda=cuda) is None and cfg.densify_grad == explicit
        # ... and a grad_threshold that "absgrad" does not read is said (the old recipe set it for absgrad)
        cfg = TrainConfig(strategy=strategy, densify_grad=explicit, grad_threshold=6e-4)
        note = resolve_densify_grad(cfg, has_sfm_points=sfm, cuda=cuda)
        assert cfg.densify_grad == explicit
        assert (note is not None and "grad_threshold 0.0006 is not read" in note) == \
            (explicit == "absgrad" and strategy != "mcmc")
    # a grad_threshold set away from its default is a threshold for 3DGS's statistic: "auto" keeps that statistic
    # (and says so where it would have picked absgrad), else the setting would be silently ignored
    cfg = TrainConfig(strategy=strategy, grad_threshold=1.5e-4)
    note = resolve_densify_grad(cfg, has_sfm_points=sfm, cuda=cuda)
    assert cfg.densify_grad == "grad"
    assert (note is not None and "grad_threshold is set" in note) == (want == "absgrad")


def test_densify_grad_auto_on_a_cpu_capture_trains_with_the_plain_statistic(rng):
    """A dataset with SfM points under 3DGS's densification on the CPU backend: "auto" resolves to "grad" (the
    resolved config never holds "auto"), the caller's config is left as it was, and the log line says why."""
    from test_mcmc import _with_sfm_points

    ds = _with_sfm_points(make_dataset(rng, n_train=2, n_test=1, size=32), rng)
    cfg = small_config(strategy="default", densify_grad="auto")
    tr = Trainer(ds, cfg, device="cpu")
    assert tr.config.densify_grad == "grad" and cfg.densify_grad == "auto"
    assert any(n.startswith("densify_grad auto: grad (the CPU backend") for n in tr.notes)
    tr.step()   # and it trains


def test_a_checkpoint_config_without_densify_grad_keeps_the_plain_statistic():
    """A config saved before ``densify_grad`` existed densified with 3DGS's statistic: it is read back as "grad",
    not as today's default "auto" (which on a real capture on the CUDA kernels would switch statistic and threshold
    mid-run); a saved value is kept, and an "absgrad" saved before ``absgrad_threshold`` keeps its threshold."""
    from rigel_core.checkpoint import _config_of

    saved = dataclasses.asdict(TrainConfig(strategy="default", densify_grad="absgrad"))
    assert _config_of("x.safetensors", {"config": saved}).densify_grad == "absgrad"
    del saved["densify_grad"], saved["absgrad_threshold"]
    assert _config_of("x.safetensors", {"config": saved}).densify_grad == "grad"
    # "absgrad" saved before absgrad_threshold existed was compared with grad_threshold: that value carries over
    saved.update(densify_grad="absgrad", grad_threshold=6e-4)
    old = _config_of("x.safetensors", {"config": saved})
    assert (old.densify_grad, old.absgrad_threshold, old.grad_threshold) == ("absgrad", 6e-4, 6e-4)


def test_absgrad_threshold_replaces_grad_threshold_under_absgrad(rng):
    """densify_and_prune compares the statistic with ``grad_threshold`` under "grad" and with ``absgrad_threshold``
    under "absgrad"; each threshold is ignored under the other statistic."""
    extent = 2.0
    small = math.log(0.5 * TrainConfig().percent_dense * extent)
    mean_grads = torch.tensor([1e-4, 5e-4, 1e-3])   # below both / between them / above both (defaults 2e-4, 8e-4)
    cases = [(dict(densify_grad="grad"), 2), (dict(densify_grad="absgrad"), 1),
             (dict(densify_grad="grad", absgrad_threshold=1e-5), 2),
             (dict(densify_grad="absgrad", grad_threshold=1.0), 1),
             (dict(densify_grad="absgrad", absgrad_threshold=5e-5), 3),
             (dict(densify_grad="grad", grad_threshold=2e-3), 0)]
    for kw, clones in cases:
        m, opt = _model_with_state(rng, torch.full((3, 3), small), [0.5] * 3)
        stats = DensifyStats(3)
        stats.grad_accum = mean_grads * 4
        stats.denom = torch.full((3,), 4.0)
        rep = densify_and_prune(m, opt, stats, TrainConfig(**kw), extent, iteration=600)
        assert (rep.n_clone, rep.n_split) == (clones, 0), kw
    with pytest.raises(ValueError, match="absgrad_threshold"):
        TrainConfig(absgrad_threshold=-1e-4).validate()
    with pytest.raises(ValueError, match="TrainConfig.grad_threshold must be ≥ 0"):
        TrainConfig(grad_threshold=-1.0).validate()


def test_snapshot_is_a_copy_that_training_does_not_change(rng):
    """Trainer.snapshot() and GaussianModel.to() on the same device and dtype return copies: before, ``.to``
    aliased the storage, so a published snapshot moved with Adam's in-place steps."""
    ds = make_dataset(rng, n_gauss=30, size=16, n_train=3, n_test=0)
    tr = Trainer(ds, small_config(init_points=40, densify_from=10 ** 6), device="cpu")
    tr.step()
    snap = tr.snapshot()
    before = {p: getattr(snap, p).clone() for p in ("means3D", "log_scales", "quats", "opacity_logits", "sh_dc")}
    for p in before:
        assert getattr(snap, p).data_ptr() != getattr(tr.model, p).data_ptr(), p
    for _ in range(3):
        tr.step()
    assert not torch.equal(tr.model.means3D, before["means3D"])   # the model did move
    for p, t in before.items():
        assert torch.equal(getattr(snap, p), t), p                  # the snapshot did not


def test_cli_warnings_while_training_reach_log_txt(blender_dataset, tmp_path, monkeypatch, capsys):
    """A warning raised during training (e.g. coarse-to-fine falling back to a smaller factor, a failed CUDA-graph
    capture) is in the run's log.txt, not only on the console where it scrolls away."""
    import warnings

    from rigel_core.cli.train import main

    step = Trainer.step

    def warning_step(self):
        if self.iteration == 3:
            warnings.warn("a warning at iteration 3 (test)", stacklevel=2)
        return step(self)

    monkeypatch.setattr(Trainer, "step", warning_step)
    shown = warnings.showwarning
    run = tmp_path / "run"
    assert main(["--data", str(blender_dataset), "--out", str(run), "--device", "cpu", "--init-points", "100",
                 "--iters", "6"]) == 0
    assert warnings.showwarning is shown  # restored once rigel-train returns
    log = (run / "log.txt").read_text()
    assert log.count("warning: a warning at iteration 3 (test)") == 1
    assert json.loads((run / "metrics.json").read_text())["graph_step"] is None  # the CPU steps are eager
    shown_now = capsys.readouterr()
    assert "warning: a warning at iteration 3 (test)" in shown_now.out + shown_now.err  # and on the console


def test_schedule_scale_multiplies_each_step_count_once():
    """resolve_schedule_scale: each positive count of SCHEDULE_STEP_FIELDS × S, rounded, at least 1; 0 (off) and
    None (the run's length) stay; then the scale is 1.0, so applying it again changes nothing."""
    from rigel_core.train.config import SCHEDULE_STEP_FIELDS, resolve_schedule_scale

    gen = np.random.default_rng()
    scale = float(gen.uniform(0.05, 3.0))
    counts = {name: int(gen.integers(1, 40_000)) for name in SCHEDULE_STEP_FIELDS}
    counts["densify_from"] = 0                       # off: stays 0
    counts["position_lr_max_steps"] = None           # the run's length: stays None
    counts["densify_interval"] = 1                   # × a small scale would round to 0: at least 1
    cfg = TrainConfig(schedule_scale=scale, **counts)
    note = resolve_schedule_scale(cfg)
    for name, old in counts.items():
        want = old if old is None or old <= 0 else max(1, round(old * scale))
        assert getattr(cfg, name) == want, name
    assert cfg.schedule_scale == 1.0 and "\n" not in note and note.startswith(f"schedule_scale {scale:g}: ")
    assert "densify_from" not in note and "position_lr_max_steps" not in note and "densify_until" in note
    before = cfg.to_dict()
    assert resolve_schedule_scale(cfg) is None and cfg.to_dict() == before
    for bad in (0.0, -0.5, 101.0, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="TrainConfig.schedule_scale must be (in|a finite)"):
            TrainConfig(schedule_scale=bad).validate()


def test_a_trainer_applies_schedule_scale_to_a_copy_and_says_so(rng, tmp_path):
    """The Trainer's config holds the scaled counts and 1.0 (metrics.json, the checkpoint: a resumed run is not
    scaled again); the caller's config is left as it was; the note comes first in the log's lines."""
    ds = make_dataset(rng, n_gauss=30, size=16, n_train=3, n_test=1)
    cfg = small_config(iterations=40, schedule_scale=0.5, densify_from=10, densify_interval=6, densify_until=30,
                       sh_degree_interval=20, opacity_reset_interval=30)
    t = Trainer(ds, cfg, device="cpu")
    got = t.config
    assert (got.densify_from, got.densify_interval, got.densify_until, got.sh_degree_interval,
            got.opacity_reset_interval, got.schedule_scale) == (5, 3, 15, 10, 15, 1.0)
    assert cfg.schedule_scale == 0.5 and cfg.densify_from == 10
    assert t.notes[0] == t.schedule_note and "densify_from 10 → 5" in t.schedule_note
    t.step()
    path = tmp_path / "c.safetensors"
    t.save_checkpoint(path)
    assert Trainer.from_checkpoint(path, ds, device="cpu").config == got
    assert Trainer(ds, small_config(), device="cpu").schedule_note is None


def test_cli_schedule_scale_sets_the_default_length_and_is_refused_on_resume(tmp_path, capsys):
    """--schedule-scale S: --iters 30000 × S unless --iters is given; refused with --resume in one line (the saved
    counts are already scaled), nothing written."""
    from rigel_core.cli.common import config_overrides
    from rigel_core.cli.train import build_parser
    from rigel_core.cli.train import main as train_main
    from rigel_core.data import make_dataset as make_data

    def overrides(*argv):
        return config_overrides(build_parser().parse_args(["--data", "d", "--out", "o", *argv]))

    assert overrides("--schedule-scale", "0.7") == {"schedule_scale": 0.7, "iterations": 21_000}
    assert overrides("--schedule-scale", "0.5", "--iters", "100") == {"schedule_scale": 0.5, "iterations": 100}
    assert "iterations" not in overrides()
    data, run = tmp_path / "data", tmp_path / "run"
    make_data(data, 50, 8, 8, n_train=2, n_test=1, device="cpu", progress=False)
    common = ["--data", str(data), "--out", str(run), "--device", "cpu", "--quiet", "--eval-every", "0",
              "--n-renders", "0", "--init-points", "20"]
    assert train_main(common + ["--iters", "2", "--schedule-scale", "0.5"]) == 0
    saved = json.loads((run / "metrics.json").read_text())["config"]
    assert saved["schedule_scale"] == 1.0 and saved["densify_from"] == 250 and saved["iterations"] == 2
    assert "schedule_scale 0.5: densify_from 500 → 250" in (run / "log.txt").read_text()
    capsys.readouterr()
    before = {p.name: p.read_bytes() for p in run.iterdir() if p.is_file()}
    assert train_main(common + ["--iters", "3", "--resume", "--schedule-scale", "0.5"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "--schedule-scale applies to a new run" in err and "checkpoint.safetensors" in err
    assert {p.name: p.read_bytes() for p in run.iterdir() if p.is_file()} == before
    for bad in ("nan", "0", "-1"):
        assert train_main(common[:2] + ["--out", str(tmp_path / "new")] + common[4:] + ["--schedule-scale", bad]) == 2
        assert "--schedule-scale must be" in capsys.readouterr().err


def test_resume_refuses_any_schedule_scale_one_included(tmp_path, capsys):
    """--resume refuses --schedule-scale whatever S, 1 too: --schedule-scale 1 (or --set schedule_scale=1) also
    implies --iters 30000 × 1, so a resumed 2-iteration run was extended to 30,000 iterations ("iterations 2 ->
    30000") by a flag the docs say --resume refuses. The refusal names the flag as given; nothing is written."""
    from rigel_core.cli.common import config_overrides, resume_config
    from rigel_core.cli.train import build_parser
    from rigel_core.cli.train import main as train_main
    from rigel_core.data import make_dataset as make_data

    data, run = tmp_path / "data", tmp_path / "run"
    make_data(data, 50, 8, 8, n_train=2, n_test=1, device="cpu", progress=False)
    common = ["--data", str(data), "--out", str(run), "--device", "cpu", "--quiet", "--eval-every", "0",
              "--n-renders", "0", "--init-points", "20"]
    assert train_main(common + ["--iters", "2"]) == 0
    capsys.readouterr()
    ckpt = run / "checkpoint.safetensors"
    for extra, named in ((["--schedule-scale", "1"], "--schedule-scale"),
                         (["--set", "schedule_scale=1.0"], "--set schedule_scale")):
        args = build_parser().parse_args(common + ["--resume"] + extra)
        with pytest.raises(ValueError, match=f"{re.escape(named)} applies to a new run"):
            resume_config(ckpt, config_overrides(args), [], args=args)
    before = {p.name: p.read_bytes() for p in run.iterdir() if p.is_file()}
    assert train_main(common + ["--resume", "--schedule-scale", "1"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "--schedule-scale applies to a new run" in err and str(ckpt) in err
    assert {p.name: p.read_bytes() for p in run.iterdir() if p.is_file()} == before
    assert train_main(common + ["--resume", "--iters", "3"]) == 0   # without it: continued
    assert json.loads((run / "metrics.json").read_text())["iterations_done"] == 3


def test_the_start_line_counts_one_iteration_in_the_singular(rng):
    ds = make_dataset(rng, n_gauss=20, size=16, n_train=2, n_test=0)
    n = int(np.random.default_rng().integers(2, 10**6))
    assert ", 1 iteration, strategy " in Trainer(ds, small_config(iterations=1), device="cpu").start_line()
    assert f", {n:,} iterations, strategy " in Trainer(ds, small_config(iterations=n), device="cpu").start_line()


# ---- a binning overflow in a training step ---------------------------------------------------------------------
@pytest.mark.parametrize("strategy", ["default", "mcmc"])
def test_a_binning_overflow_retires_the_widest_gaussians_and_retakes_the_step(rng, monkeypatch, strategy):
    """A training view that needs more (Gaussian, tile) entries than the limit (the CUDA binning raises
    BinningOverflow; injected here at the step body, which the CPU reference never reaches) no longer ends the run:
    the fewest Gaussians, widest first, that bring the view to half the limit are made transparent, their Adam
    moments zeroed, the step taken again, one warning said. Every other row is left as it was."""
    from rigel_core.renderer.cuda_backend import BinningOverflow
    from rigel_core.train import trainer as trainer_mod

    ds = make_dataset(rng, n_train=6, n_test=2)
    kw = dict(strategy=strategy, max_gaussians=400) if strategy == "mcmc" else {}
    tr = Trainer(ds, small_config(iterations=20, **kw), device="cpu")
    for _ in range(3):
        tr.step()
    n = tr.model.num_gaussians
    touched = torch.randint(0, 40, (n,), generator=rng, dtype=torch.int32)
    wide = torch.randperm(n, generator=rng)[:int(torch.randint(3, 12, (1,), generator=rng))]
    touched[wide] = torch.randint(5000, 9000, (wide.numel(),), generator=rng, dtype=torch.int32)
    total, limit = int(touched.sum()), int(touched.sum()) - int(touched[wide].min()) // 2  # over by less than one
    # the expected rows: sort descending, the shortest prefix whose sum reaches total - limit // 2
    order = torch.argsort(touched.long(), descending=True)
    k = int((torch.cumsum(touched.long()[order], 0) < total - limit // 2).sum()) + 1
    expect = torch.zeros(n, dtype=torch.bool)
    expect[order[:k]] = True
    real, calls, seen = trainer_mod.train_step, [], {}
    logits_before = tr.model.opacity_logits.detach().clone()
    moments_before = _moments(tr.optimizer, tr.model)

    def overflowing(t, views, ctx, **kw):
        calls.append(ctx)
        if len(calls) == 1:
            for p in t.model.parameters().values():  # a forward-backward before the failing view left gradients
                p.grad = torch.full_like(p, float("nan"))
            raise BinningOverflow(total, limit, touched)
        assert all(p.grad is None for p in t.model.parameters().values()), "gradients of the failed try were kept"
        seen["logits"] = t.model.opacity_logits.detach().clone()  # as the retry starts
        seen["moments"] = _moments(t.optimizer, t.model)
        return real(t, views, ctx, **kw)

    monkeypatch.setattr(trainer_mod, "train_step", overflowing)
    with pytest.warns(UserWarning, match=rf"needed {total:,} \(Gaussian, tile\) entries, over the limit of "
                                         rf"{limit:,}: the {k:,} Gaussians covering the most tiles"):
        res = tr.step()
    assert len(calls) == 2 and calls[0] is not calls[1] and res.iteration == 4 == tr.iteration
    assert tr.retired_wide == k and tr.model.num_gaussians == n
    retired = torch.sigmoid(seen["logits"])
    torch.testing.assert_close(retired[expect], torch.full((k,), trainer_mod.RETIRED_OPACITY), rtol=1e-4, atol=0)
    assert torch.equal(seen["logits"][~expect], logits_before[~expect])
    for name, states in seen["moments"].items():
        for st, v in states.items():
            if v.dim() == 0:  # the step count: one per parameter, not per row
                continue
            assert bool((v[expect] == 0).all()), (name, st)
            assert torch.equal(v[~expect], moments_before[name][st][~expect]), (name, st)
    assert bool((tr.model.opacities.detach()[expect] < 1.0 / 255).all())  # still under the alpha floor after it

    # an overflow that retiring cannot cure: the error stands after OVERFLOW_RETRIES more tries
    calls.clear()

    def always(t, views, ctx, **kw):
        calls.append(ctx)
        raise BinningOverflow(total, limit, touched[:tr.model.num_gaussians])

    monkeypatch.setattr(trainer_mod, "train_step", always)
    with pytest.warns(UserWarning), pytest.raises(BinningOverflow):
        tr.step()
    assert len(calls) == trainer_mod.OVERFLOW_RETRIES + 1
    # a batch of B views: each may need its own repair, so B − 1 more tries
    calls.clear()
    batch = int(torch.randint(2, 5, (1,), generator=rng))
    tr.config.batch_size = batch
    with pytest.warns(UserWarning), pytest.raises(BinningOverflow):
        tr.step()
    assert len(calls) == trainer_mod.OVERFLOW_RETRIES + batch


def _entries(model, camera) -> int:
    """The (Gaussian, tile) entries a render of ``model`` from ``camera`` needs, past the limit too."""
    from rigel_core.renderer.output import BinningOverflow

    try:
        return int(render(model, camera).n_entries)
    except BinningOverflow as e:
        return e.n_entries


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
@pytest.mark.parametrize("strategy", ["default", "mcmc"])
def test_a_real_binning_overflow_is_survived(rng, monkeypatch, strategy, device):
    """End to end, no injection: after a warm-up the entry limit is lowered to what the views need plus a quarter
    of what the opaque Gaussians wider than the view, added next, take; every view is then over the limit and its
    binning raises (the CPU reference's and the CUDA kernels'; on CUDA through the CUDA-graph step, whose captures
    are re-made at the lowered limit: a replay overflows past it and the next step goes eager). The trainer
    retires the huge ones (half the limit is under what the rest need), warns, and the run goes on with every view
    under the limit."""
    from rigel_core import config as rconfig

    ds = make_dataset(rng, size=128 if device == "cpu" else 256, n_train=6, n_test=2)
    kw = dict(strategy=strategy, max_gaussians=400) if strategy == "mcmc" else {}
    tr = Trainer(ds, small_config(iterations=60, **kw), device=device)
    for _ in range(10):  # under the real limit: eager first, then (CUDA) graph replays
        tr.step()
    cam = ds.train[0].camera
    tiles = math.ceil(cam.width / 16) * math.ceil(cam.height / 16)
    n = tr.model.num_gaussians
    n_huge = int(torch.randint(30, 50, (1,), generator=rng))
    need = max(_entries(tr.model, f.camera) for f in ds.train)
    limit = need + n_huge * tiles // 4
    monkeypatch.setattr(rconfig, "MAX_ENTRIES", limit)
    if tr.graph_step is not None and tr.graph_step.capture:
        tr.graph_step._drop()  # captured again, sized by the lowered limit as the real one sizes them
    huge = torch.randperm(n, generator=rng)[:n_huge].to(device)
    with torch.no_grad():  # at the scene's centre, σ twice its extent, opaque: each covers every tile of a view
        tr.model.means3D[huge] = torch.as_tensor(ds.scene_center, dtype=tr.model.means3D.dtype, device=device)
        tr.model.log_scales[huge] = math.log(2.0 * tr.extent)
        tr.model.opacity_logits[huge] = 3.0
    assert min(_entries(tr.model, f.camera) for f in ds.train) > limit
    with pytest.warns(UserWarning, match=rf"over the limit of {limit:,}: the [\d,]+ Gaussians covering the most"):
        for _ in range(15):
            tr.step()
    assert tr.iteration == 25 and tr.retired_wide >= n_huge
    assert bool((tr.model.opacities.detach()[huge] < 1.0 / 255).all())
    for f in ds.train:  # every view renders under the limit now
        assert render(tr.model, f.camera).n_entries <= limit

    # the same fog at an evaluation (the final one of a run, say): retired as well, every held-out view scored
    before = tr.retired_wide
    again = torch.randperm(n, generator=rng)[:limit // tiles + 1].to(device)  # alone over the limit in any view
    with torch.no_grad():
        tr.model.means3D[again] = torch.as_tensor(ds.scene_center, dtype=tr.model.means3D.dtype, device=device)
        tr.model.log_scales[again] = math.log(2.0 * tr.extent)
        tr.model.opacity_logits[again] = 3.0
    assert min(_entries(tr.model, f.camera) for f in ds.test) > limit
    with pytest.warns(UserWarning, match=r"a held-out view needed .* made transparent and it was rendered again"):
        ev = tr.evaluate()
    assert ev.n_views == len(ds.test) and math.isfinite(ev.psnr) and tr.retired_wide > before
    for f in ds.test:
        assert render(tr.model, f.camera).n_entries <= limit
