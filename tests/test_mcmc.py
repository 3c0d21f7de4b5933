"""The MCMC Gaussian budget (rigel_core/train/mcmc.py; ``TrainConfig.strategy = "mcmc"``) on the CPU.

The mass-splitting formulas are checked against a float64 quadrature of the composited opacity of the stacked
copies, ``1 − Π(1 − o_i·g_i(x))``, not against the formulas themselves; relocation, growth and the cap on small
random models with live Adam moments; the position noise statistically (empirical covariance against Σ² with a
margin of several standard errors); the regularisers' gradients against their closed forms; and a short training
run and a resume on the procedural scenes of test_trainer.py.
"""
import dataclasses
import json
import math

import numpy as np
import pytest
import torch

from rigel_core import render
from rigel_core.data import Dataset, Frame
from rigel_core.model import PARAM_NAMES
from rigel_core.reference.project import quat_to_rotmat
from rigel_core.train import TrainConfig, Trainer
from rigel_core.train.config import AUTO_BUDGET_MIN, AUTO_BUDGET_PIXELS_PER_GAUSSIAN, AUTO_BUDGET_RANDOM, \
    TRANSPARENT_BACKGROUND, Capture, \
    auto_mcmc_budget, resolve_init_points, resolve_strategy
from rigel_core.train.mcmc import MCMCReport, add_gaussians, length_unit, noise_max_scale, position_noise, regularizer, \
    relocate_dead, sample_indices, split_mass, trim_to_cap
from rigel_core.train.optim import make_optimizer, per_gaussian_tensors
from test_trainer import _assert_same_state, _state, blender_dataset, make_dataset, orbit, random_scene, \
    small_config  # noqa: F401  (blender_dataset: a fixture)

pytestmark = pytest.mark.usefixtures("one_thread")  # conftest.py: one PyTorch thread


def mcmc_config(**kw):
    base = dict(strategy="mcmc", max_gaussians=1000)
    base.update(kw)
    return small_config(**base)


# ---- splitting one Gaussian's mass into n copies -----------------------------------------------------------------
def _stack_opacity(o_new: float, cov_inv: torch.Tensor, n: int, pts: torch.Tensor) -> torch.Tensor:
    """float64 ``1 − Π_{i=1}^{n}(1 − o'·g'(x))`` of n identical copies at the origin, at points (P,3)."""
    g = torch.exp(-0.5 * torch.einsum("pi,ij,pj->p", pts, cov_inv, pts))
    alpha = o_new * g
    return 1.0 - torch.prod(torch.stack([1.0 - alpha] * n), 0)


def test_split_mass_keeps_the_centre_opacity_and_every_line_integral(rng):
    m = 24
    o = 0.02 + 0.97 * torch.rand(m, generator=rng, dtype=torch.float64)
    scales = torch.exp(-2 + torch.rand(m, 3, generator=rng, dtype=torch.float64))
    n = torch.randint(2, 40, (m,), generator=rng)
    quats = torch.randn(m, 4, generator=rng, dtype=torch.float64)
    new_o, new_s = split_mass(o, scales, n, min_opacity=1e-9)
    assert new_o.dtype == torch.float64 and new_s.shape == (m, 3)
    rot = quat_to_rotmat(quats)
    t = torch.linspace(-1, 1, 40001, dtype=torch.float64)
    for i in range(m):
        cov_old = rot[i] @ torch.diag(scales[i] ** 2) @ rot[i].T
        cov_new = rot[i] @ torch.diag(new_s[i] ** 2) @ rot[i].T
        k = int(n[i])
        centre = _stack_opacity(float(new_o[i]), torch.linalg.inv(cov_new), k, torch.zeros(1, 3, dtype=torch.float64))
        assert float(centre) == pytest.approx(float(o[i]), rel=1e-12)
        # along a random line through the centre: ∫ stack = ∫ o·g (trapezoid, ±12 σ of the original)
        d = torch.randn(3, generator=rng, dtype=torch.float64)
        d = d / d.norm()
        sigma_d = float(1.0 / torch.sqrt(d @ torch.linalg.inv(cov_old) @ d))
        x = t * 12 * sigma_d
        pts = x[:, None] * d[None]
        stack = torch.trapezoid(_stack_opacity(float(new_o[i]), torch.linalg.inv(cov_new), k, pts), x)
        orig = torch.trapezoid(o[i] * torch.exp(-0.5 * (x / sigma_d) ** 2), x)
        assert float(stack) == pytest.approx(float(orig), rel=1e-6), (k, float(o[i]))
        # an off-axis point is not preserved exactly (the stack is flatter-topped), but it is close
        assert float(new_s[i].max() / scales[i].max()) < 1.0


def test_split_mass_clamps_and_the_paper_double_sum(rng):
    o = torch.tensor([0.3, 0.3, 0.3, 0.006, 0.999999], dtype=torch.float64)
    s = torch.rand(5, 3, generator=rng, dtype=torch.float64) + 0.1
    n = torch.tensor([1, 51, 200, 5, 3])
    new_o, new_s = split_mass(o, s, n, max_copies=51, min_opacity=0.005)
    assert new_o[0] == o[0] and torch.equal(new_s[0], s[0])  # n = 1: unchanged
    assert new_o[2] == new_o[1]  # n clamped to 51
    torch.testing.assert_close(new_s[2] / s[2], new_s[1] / s[1], rtol=1e-14, atol=0)
    assert new_o[3] == 0.005  # 1 − 0.994^(1/5) ≈ 0.0012: floored
    assert 0.0 < float(new_o[4]) < 1.0
    # the paper's nested sum, term by term in Python floats, gives the same factor
    for i in (1, 4):
        k = 51 if i == 1 else 3
        a = 1.0 - (1.0 - float(o[i])) ** (1.0 / k)
        dsum = sum(math.comb(j - 1, q) * (-1) ** q * a ** (q + 1) / math.sqrt(q + 1)
                   for j in range(1, k + 1) for q in range(j))
        assert float(new_s[i, 0] / s[i, 0]) == pytest.approx(float(o[i]) / dsum, rel=1e-9)


def test_sample_indices_is_proportional_deterministic_and_skips_zero_weights(rng):
    w = torch.rand(20, generator=rng, dtype=torch.float64)
    w[torch.randperm(20, generator=rng)[:6]] = 0.0
    seed = int(torch.randint(0, 2 ** 31, (1,), generator=rng))
    m = 200_000
    idx = sample_indices(w.float(), m, torch.Generator().manual_seed(seed))
    again = sample_indices(w.float(), m, torch.Generator().manual_seed(seed))
    assert torch.equal(idx, again) and idx.dtype == torch.long
    counts = torch.bincount(idx, minlength=20).double()
    assert (counts[w == 0] == 0).all()
    p = w / w.sum()
    sd = torch.sqrt(m * p * (1 - p))
    assert ((counts - m * p).abs() <= 6 * sd + 1).all()  # 6 standard deviations: every seed meets it
    assert sample_indices(w, 0, None).numel() == 0
    with pytest.raises(ValueError, match="sum to 0"):
        sample_indices(torch.zeros(5), 3, None)


# ---- relocation, growth, cap ---------------------------------------------------------------------------------------
def _model_with_moments(rng, n, dead_frac=0.3, sh_degree=1):
    """A random model, its optimizer after two Adam steps on random gradients (non-zero moments), and the dead
    mask: a ``dead_frac`` of the opacities below 0.005."""
    model = random_scene(rng, n, sh_degree=sh_degree)
    o = 0.02 + 0.95 * torch.rand(n, generator=rng)
    dead = torch.rand(n, generator=rng) < dead_frac
    dead[0], dead[1] = True, False
    o = torch.where(dead, 0.004 * torch.rand(n, generator=rng) + 1e-4, o)
    model.opacity_logits = torch.logit(o)
    opt = make_optimizer(model, TrainConfig(), 1.0)
    for _ in range(2):
        for p in per_gaussian_tensors(opt, model).values():
            p.grad = torch.randn(p.shape, generator=rng)
        opt.step()
        opt.zero_grad(set_to_none=True)
    return model, opt, dead


def _moments(opt, model):
    return {k: {s: v.clone() for s, v in opt.state[p].items() if s != "step"}
            for k, p in per_gaussian_tensors(opt, model).items()}


@pytest.mark.parametrize("reset", ["moved", "sources"])
def test_relocation_moves_dead_onto_live_and_keeps_the_rest(rng, reset):
    """Dead rows take a live row's parameters, the drawn rows share their mass; the moments zeroed are those of the
    drawn rows and, under ``mcmc_reset_moments = "moved"``, of the moved rows, which under "sources" keep theirs."""
    n = 80
    model, opt, dead = _model_with_moments(rng, n)
    cfg = TrainConfig(strategy="mcmc", max_gaussians=n, mcmc_reset_moments=reset)
    before = {k: v.detach().clone() for k, v in model.parameters().items()}
    o_before, s_before = model.opacities.detach().clone(), model.scales.detach().clone()
    mom_before = _moments(opt, model)
    moved = relocate_dead(model, opt, cfg, torch.Generator().manual_seed(int(torch.randint(0, 999, (1,),
                                                                                           generator=rng))))
    assert moved == int(dead.sum()) and model.num_gaussians == n
    means = model.means3D.detach()
    # each dead row now holds a live row's parameters: find its source by position (the means are distinct)
    alive_idx = torch.nonzero(~dead).flatten()
    src = []
    for i in torch.nonzero(dead).flatten().tolist():
        match = torch.nonzero((before["means3D"][alive_idx] == means[i]).all(1)).flatten()
        assert match.numel() == 1, "a dead Gaussian must land exactly on one live one"
        j = int(alive_idx[match[0]])
        src.append(j)
        for k in PARAM_NAMES:
            assert torch.equal(getattr(model, k).detach()[i], getattr(model, k).detach()[j]), k
    counts = torch.bincount(torch.tensor(src), minlength=n)
    sampled = counts > 0
    exp_o, exp_s = split_mass(o_before[sampled], s_before[sampled], counts[sampled] + 1)
    torch.testing.assert_close(model.opacities.detach()[sampled], exp_o, rtol=1e-5, atol=1e-7)
    torch.testing.assert_close(model.scales.detach()[sampled], exp_s, rtol=1e-5, atol=0)
    untouched = ~dead & ~sampled
    assert untouched.any()
    for k in PARAM_NAMES:
        assert torch.equal(getattr(model, k).detach()[untouched], before[k][untouched]), k
    zeroed = (dead | sampled) if reset == "moved" else sampled
    kept = ~zeroed
    assert (kept & dead).any() == (reset == "sources") and (dead & ~sampled).any()
    mom = _moments(opt, model)
    for k in mom:
        for s in mom[k]:
            assert (mom[k][s][zeroed] == 0).all(), (k, s)
            assert torch.equal(mom[k][s][kept], mom_before[k][s][kept]), (k, s)
            assert (mom_before[k][s][zeroed] != 0).all(), (k, s)  # so the zeros above were written
    # all dead or none dead: nothing to do
    model.opacity_logits.data.fill_(-10.0)
    assert relocate_dead(model, opt, cfg, None) == 0
    model.opacity_logits.data.fill_(0.0)
    assert relocate_dead(model, opt, cfg, None) == 0


def test_max_scale_counts_a_huge_gaussian_as_dead(rng):
    """``mcmc_max_scale`` > 0: a Gaussian whose largest scale exceeds it × the extent is relocated like a dead one,
    opaque or not; exactly at the bound it stays; 0 (the default) relocates none of them."""
    n, extent = 60, float(2.0 + 5.0 * torch.rand(1, generator=rng))
    model, opt, _ = _model_with_moments(rng, n, dead_frac=0.0)
    bound = 0.1 * extent
    s = (0.2 * bound * (0.1 + torch.rand(n, 3, generator=rng)))  # all well inside the bound
    huge = torch.rand(n, generator=rng) < 0.25
    huge[0], huge[1], huge[2] = True, False, False
    axis = torch.randint(0, 3, (n,), generator=rng)
    s[huge, axis[huge]] = bound * (1.5 + 10 * torch.rand(int(huge.sum()), generator=rng))  # one axis too large
    model.log_scales = torch.log(s)
    model.log_scales.data[2, 1] = math.log(bound)  # exactly at the bound: kept
    model.opacity_logits = torch.logit(0.02 + 0.95 * torch.rand(n, generator=rng))  # none dead by its opacity
    opt = make_optimizer(model, TrainConfig(), 1.0)
    before = model.means3D.detach().clone()
    off = TrainConfig(strategy="mcmc", max_gaussians=n)
    assert relocate_dead(model, opt, off, None, extent) == 0
    on = TrainConfig(strategy="mcmc", max_gaussians=n, mcmc_max_scale=0.1)
    assert relocate_dead(model, opt, on, torch.Generator().manual_seed(3), extent) == int(huge.sum())
    moved = ~(model.means3D.detach() == before).all(1)
    assert torch.equal(moved, huge)  # the huge ones took a kept one's place, the rest stayed
    assert bool((model.scales.detach()[huge].amax(1) <= bound * (1 + 1e-6)).all())
    with pytest.raises(ValueError, match="scene extent must be given"):
        relocate_dead(model, opt, on, None)
    with pytest.raises(ValueError, match="mcmc_max_scale"):
        TrainConfig(mcmc_max_scale=-0.1).validate()


def test_growth_reaches_the_cap_and_never_passes_it(rng):
    n, cap = 100, 112
    model, opt, _ = _model_with_moments(rng, n, dead_frac=0.0)
    cfg = TrainConfig(strategy="mcmc", max_gaussians=cap, mcmc_growth=0.05)
    before = {k: v.detach().clone() for k, v in model.parameters().items()}
    mom_before = _moments(opt, model)
    g = torch.Generator().manual_seed(int(torch.randint(0, 999, (1,), generator=rng)))
    assert add_gaussians(model, opt, cfg, g) == 5 and model.num_gaussians == 105
    new_means = model.means3D.detach()[n:]
    src = [int(torch.nonzero((before["means3D"] == m).all(1)).flatten()[0]) for m in new_means]
    sampled = torch.bincount(torch.tensor(src), minlength=n) > 0
    mom = _moments(opt, model)
    for k in mom:
        for s in mom[k]:
            assert mom[k][s].shape[0] == 105 and (mom[k][s][n:] == 0).all() and (mom[k][s][:n][sampled] == 0).all()
            assert torch.equal(mom[k][s][:n][~sampled], mom_before[k][s][~sampled])
    for k in PARAM_NAMES:
        assert torch.equal(getattr(model, k).detach()[:n][~sampled], before[k][~sampled])
        assert torch.equal(getattr(model, k).detach()[n:], getattr(model, k).detach()[torch.tensor(src)])
    assert add_gaussians(model, opt, cfg, g) == 5 and add_gaussians(model, opt, cfg, g) == 2
    assert model.num_gaussians == cap and add_gaussians(model, opt, cfg, g) == 0
    assert all(len(t) == cap for t in per_gaussian_tensors(opt, model).values())


@pytest.mark.parametrize("bound", ["under", "over", "off"])
def test_growth_stops_where_too_many_gaussians_are_dead(rng, bound):
    """mcmc_growth_max_dead: a relocation step whose model has more dead Gaussians (opacity ≤ mcmc_min_opacity, a
    NaN among them) than that share relocates them as always and adds none; at or under it, or with the rule off,
    it grows by mcmc_growth. dead_share against a count made by hand."""
    from rigel_core.train.densify import DensifyStats
    from rigel_core.train.mcmc import dead_share, mcmc_relocate_and_grow
    n = 200
    model, opt, dead = _model_with_moments(rng, n, dead_frac=0.2 + 0.5 * float(torch.rand(1, generator=rng)))
    with torch.no_grad():
        model.opacity_logits[5] = math.nan  # dead too
    dead[5] = True
    share = int(dead.sum()) / n
    cfg = TrainConfig(strategy="mcmc", max_gaussians=10 * n, mcmc_growth=0.1)
    assert dead_share(model, cfg) == pytest.approx(share, rel=1e-12)
    limit = {"under": share * 0.99, "over": min(1.0, share * 1.01), "off": 0.0}[bound]
    cfg = dataclasses.replace(cfg, mcmc_growth_max_dead=limit)
    g = torch.Generator().manual_seed(int(torch.randint(0, 999, (1,), generator=rng)))
    rep = mcmc_relocate_and_grow(model, opt, DensifyStats(n), cfg, 100, g)
    assert rep.n_relocated == int(dead.sum())
    grows = bound != "under"
    assert rep.n_added == (int(n * 0.1) if grows else 0) and model.num_gaussians == n + rep.n_added
    assert rep.growth_held == (not grows)  # what the log and metrics.json say (tests below)
    assert rep.dead_share == (None if bound == "off" else pytest.approx(share, rel=1e-12))
    assert rep.to_dict()["growth_held"] == rep.growth_held
    assert dead_share(random_scene(rng, 0), cfg) == 0.0


def test_live_copies_is_the_most_copies_above_the_dead_bound(rng):
    """live_copies(o) = n: n copies of 1 − (1 − o)^(1/n) each stay alive through float32 (the logit the model stores,
    read back by sigmoid), n + 1 would not stay above the bound with its margin; a source at or under the bound,
    or not finite, gives 1 (itself)."""
    from rigel_core.train.mcmc import live_copies
    b = 0.005
    o = torch.cat([torch.rand(300, generator=rng, dtype=torch.float64) ** 3,
                   torch.tensor([0.0, b, b * 1.00005, 2 * b, 1 - 2 ** -23], dtype=torch.float64)])
    n = live_copies(o, b)
    assert n.dtype == torch.int64 and (n >= 1).all()
    for oi, ni in zip(o.tolist(), n.tolist()):
        copy = 1 - (1 - oi) ** (1 / ni)
        if oi > b * 1.0001:
            stored = torch.sigmoid(torch.logit(torch.tensor(copy, dtype=torch.float64).float()))
            assert stored > b, (oi, ni)          # every copy alive as the model stores it
            assert 1 - (1 - oi) ** (1 / (ni + 1)) <= b * 1.0001, (oi, ni)   # one more would not be
        else:
            assert ni == 1, oi
    assert live_copies(torch.tensor([math.nan, math.inf, -1.0]), b).tolist() == [1, 1, 1]


def _faint_model(rng, n, dead_frac):
    """_model_with_moments with the live Gaussians faint (opacity 0.0051-0.03: a source shares with few copies)."""
    model, opt, dead = _model_with_moments(rng, n, dead_frac=dead_frac)
    with torch.no_grad():
        o = 0.0051 + 0.025 * torch.rand(n, generator=rng)
        model.opacity_logits[~dead] = torch.logit(o[~dead])
    return model, opt, dead


@pytest.mark.parametrize("step", ["relocate", "grow"])
def test_live_copies_leaves_no_copy_born_dead(rng, step):
    """mcmc_live_copies: with faint sources the old rule floors the copies at the bound (born dead: the next
    relocation counts them); with it on no copy is born dead, each source is drawn at most live_copies − 1 times,
    a dead row not moved keeps its parameters, and growth adds fewer."""
    from rigel_core.train.mcmc import _dead, live_copies
    n = 300
    seed = int(torch.randint(0, 999, (1,), generator=rng))
    results = {}
    for on in (False, True):
        model, opt, dead = _faint_model(torch.Generator().manual_seed(seed), n, 0.7)
        cfg = TrainConfig(strategy="mcmc", max_gaussians=10 * n, mcmc_growth=0.5, mcmc_live_copies=on)
        o_before = model.opacities.detach().clone()
        before = {k: v.detach().clone() for k, v in model.parameters().items()}
        g = torch.Generator().manual_seed(seed)
        if step == "relocate":
            done = relocate_dead(model, opt, cfg, g)
        else:
            done = add_gaussians(model, opt, cfg, g)
        now_dead = _dead(model.opacities.detach(), cfg)
        results[on] = done
        if step == "relocate":
            moved = dead & ~torch.stack([(before["means3D"][i] == model.means3D.detach()[i]).all() for i in range(n)])
            assert int(moved.sum()) == done
            if on:
                assert not (now_dead & moved).any()  # every moved row alive
                stay = dead & ~moved
                assert stay.any()  # the sources could not take every dead row
                for k in PARAM_NAMES:
                    assert torch.equal(getattr(model, k).detach()[stay], before[k][stay]), k
                # no source drawn over its share: its copies (itself and the rows moved onto it) number ≤ live_copies
                src = [int(torch.nonzero((before["means3D"] == model.means3D.detach()[i]).all(1) & ~dead)[0])
                       for i in torch.nonzero(moved).flatten().tolist()]
                counts = torch.bincount(torch.tensor(src), minlength=n)
                assert (counts + 1 <= live_copies(o_before, cfg.mcmc_min_opacity)).all()
            else:
                assert (now_dead & moved).any()  # the old rule: copies floored at the bound, born dead
        else:
            assert bool(now_dead[n:].any()) != on  # appended copies born dead only under the old rule
            assert bool((now_dead[:n] & ~dead).any()) != on  # and their sources with them
    assert results[True] < results[False]


def test_live_copies_changes_nothing_where_every_source_has_its_share(rng):
    """Opaque sources (here ≥ 0.3: each can give 70 copies and more) are never drawn over their share, so a
    relocation and a growth step with mcmc_live_copies are bit for bit those without it."""
    n = 120
    seed = int(torch.randint(0, 999, (1,), generator=rng))
    out = {}
    for on in (False, True):
        model, opt, dead = _model_with_moments(torch.Generator().manual_seed(seed), n, dead_frac=0.3)
        with torch.no_grad():
            model.opacity_logits[~dead] = model.opacity_logits[~dead].clamp_min(math.log(0.3 / 0.7))
        cfg = TrainConfig(strategy="mcmc", max_gaussians=2 * n, mcmc_growth=0.2, mcmc_live_copies=on)
        g = torch.Generator().manual_seed(seed)
        counts = (relocate_dead(model, opt, cfg, g), add_gaussians(model, opt, cfg, g))
        out[on] = (counts, {k: v.detach().clone() for k, v in model.parameters().items()}, _moments(opt, model))
    assert out[True][0] == out[False][0] and out[True][0][0] > 0 and out[True][0][1] > 0
    for k in out[False][1]:
        assert torch.equal(out[True][1][k], out[False][1][k]), k
    assert out[True][2].keys() == out[False][2].keys()
    for k in out[False][2]:
        for s in out[False][2][k]:
            assert torch.equal(out[True][2][k][s], out[False][2][k][s]), (k, s)


def test_trim_to_cap_keeps_the_most_opaque(rng):
    model, opt, _ = _model_with_moments(rng, 50, dead_frac=0.0)
    logits = model.opacity_logits.detach().clone()
    g = torch.Generator().manual_seed(3)
    assert trim_to_cap(model, opt, 30, g) == 20 and model.num_gaussians == 30
    keep = torch.sort(torch.argsort(logits, descending=True)[:30]).values
    assert torch.equal(model.opacity_logits.detach(), logits[keep])
    assert trim_to_cap(model, opt, 30, g) == 0 and trim_to_cap(model, opt, None, g) == 0
    model.opacity_logits.data.fill_(0.0)  # all tied: a random subset, the same for the same generator state
    a = model.means3D.detach().clone()
    m2 = type(model)(*(getattr(model, k).detach().clone() for k in PARAM_NAMES))
    opt2 = make_optimizer(m2, TrainConfig(), 1.0)
    trim_to_cap(model, opt, 10, torch.Generator().manual_seed(7))
    trim_to_cap(m2, opt2, 10, torch.Generator().manual_seed(7))
    assert torch.equal(model.means3D, m2.means3D) and not torch.equal(model.means3D.detach(), a[:10])


# ---- noise and regularisers ----------------------------------------------------------------------------------------
def test_position_noise_is_zero_for_opaque_and_follows_sigma_for_transparent(rng):
    n = 20_000
    cfg = TrainConfig(strategy="mcmc", max_gaussians=n, mcmc_noise_max_scale=0.0)  # the paper's Σ
    model = random_scene(rng, n)
    q = torch.randn(4, generator=rng)
    s = torch.exp(-1.5 + torch.rand(3, generator=rng))
    model.quats = q.expand(n, 4).clone()
    model.log_scales = torch.log(s).expand(n, 3).clone()
    opaque = torch.rand(n, generator=rng) < 0.3
    model.opacity_logits = torch.where(opaque, torch.logit(torch.tensor(0.2)), torch.logit(torch.tensor(1e-3)))
    start = model.means3D.clone()
    lr = 1e-4 * (1 + float(torch.rand(1, generator=rng)))
    seed = int(torch.randint(0, 2 ** 31, (1,), generator=rng))
    noise = position_noise(model, lr, cfg, torch.Generator().manual_seed(seed))
    assert torch.equal(model.means3D, start + noise)
    gate_opaque = 1 / (1 + math.exp(100 * (0.2 - 0.005)))  # σ(−k(o − t)) at o = 0.2: 3.4e-9
    scale = cfg.mcmc_noise_lr * lr
    rot = quat_to_rotmat(q[None].double())[0]
    cov = rot @ torch.diag(s.double() ** 2) @ rot.T  # Σ; the noise is Σ·η, covariance Σ²
    bound = 8 * scale * gate_opaque * float(torch.linalg.matrix_norm(cov, 2))
    assert float(noise[opaque].abs().max()) <= bound
    gate = 1 / (1 + math.exp(100 * (1e-3 - 0.005)))
    x = noise[~opaque].double() / (scale * gate)
    emp = x.T @ x / x.shape[0]
    want = cov @ cov
    # a covariance entry from m samples has standard error ≤ sqrt(2/m)·‖Σ²‖: 8 of them is a margin every seed meets
    tol = 8 * math.sqrt(2 / x.shape[0]) * float(torch.linalg.matrix_norm(want, 2))
    assert float((emp - want).abs().max()) <= tol
    assert float(x.mean(0).abs().max()) <= 6 * math.sqrt(float(want.diagonal().max()) / x.shape[0])
    # the same generator state gives the same noise; a skipped step (ok False) adds none
    model.means3D = start.clone()
    again = position_noise(model, lr, cfg, torch.Generator().manual_seed(seed))
    assert torch.equal(again, noise)
    model.means3D = start.clone()
    none = position_noise(model, lr, cfg, torch.Generator().manual_seed(seed), ok=torch.tensor(False))
    assert (none == 0).all() and torch.equal(model.means3D, start)


def test_length_unit():
    world, cams = TrainConfig(strategy="mcmc"), TrainConfig(strategy="mcmc", mcmc_units="cameras")
    e = 0.5 + 10 * float(torch.rand(1))
    assert length_unit(world, e) == 1.0
    assert length_unit(cams, e) == pytest.approx(e / 1.1, rel=1e-15)
    for bad in (None, 0.0, -1.0, math.nan, math.inf):
        assert length_unit(world, bad) == 1.0
        with pytest.raises(ValueError, match="scene extent"):
            length_unit(cams, bad)


@pytest.mark.parametrize("units", ["world", "cameras"])
def test_noise_and_scale_regularizer_in_cameras_units_ignore_the_scenes_scale(rng, units):
    """The same Gaussians in a world c times larger (means and scales × c, the position lr × c as the trainer's is ×
    extent): under "cameras" units the noise is c times the original's (the same fraction of the scene) and the
    scale regulariser's value and gradient are the original's; under "world" units the noise grows c³ (the lr's c,
    Σ's c²) and the regulariser c, which is the dependence "cameras" removes."""
    n, c, e = 500, 2.0 + 6 * float(torch.rand(1, generator=rng)), 3.3
    cfg = TrainConfig(strategy="mcmc", max_gaussians=n, mcmc_units=units)
    base = random_scene(rng, n)
    base.opacity_logits = torch.logit(0.001 + 0.01 * torch.rand(n, generator=rng))  # faint: the gate is open
    big = random_scene(rng, n)
    for name in ("quats", "opacity_logits", "sh_dc", "sh_rest"):
        setattr(big, name, getattr(base, name).clone())
    big.means3D, big.log_scales = base.means3D * c, base.log_scales + math.log(c)
    lr = 1.6e-4 * (1 + float(torch.rand(1, generator=rng)))
    seed = int(torch.randint(0, 2 ** 31, (1,), generator=rng))
    small_noise = position_noise(base, lr * e, cfg, torch.Generator().manual_seed(seed), extent=e)
    big_noise = position_noise(big, lr * e * c, cfg, torch.Generator().manual_seed(seed), extent=e * c)
    assert float(small_noise.abs().max()) > 0
    want = c if units == "cameras" else c ** 3
    torch.testing.assert_close(big_noise, small_noise * want, rtol=1e-4, atol=1e-6 * float(big_noise.abs().max()))
    cfg_s = dataclasses.replace(cfg, mcmc_opacity_reg=0.0, mcmc_scale_reg=0.01 + float(torch.rand(1, generator=rng)))
    grads = []
    for m, ext in ((base, e), (big, e * c)):
        m.log_scales.requires_grad_(True)
        r = regularizer(m, cfg_s, ext)
        r.backward()
        grads.append((float(r.detach()), m.log_scales.grad.clone()))
    want = 1.0 if units == "cameras" else c
    assert grads[1][0] == pytest.approx(grads[0][0] * want, rel=1e-5)
    torch.testing.assert_close(grads[1][1], grads[0][1] * want, rtol=1e-4, atol=0.0)


@pytest.mark.parametrize("units", ["world", "cameras"])
def test_an_mcmc_run_in_cameras_units_is_the_same_in_a_larger_world(rng, units):
    """One capture and the same capture c times larger (cameras, scene and initial Gaussians × c, so the scene
    extent is × c): 30 MCMC steps (two relocations, noise on faint Gaussians) give, under "cameras" units, the
    same Gaussians up to that factor (to float rounding, which Adam and the draws may amplify a little); under
    "world" units the larger world's noise reaches c² further relative to its scene and the runs part."""
    c = 4.0
    scene = random_scene(rng, 60)
    init = random_scene(rng, 150)
    init.opacity_logits = torch.where(torch.rand(150, generator=rng) < 0.5, torch.logit(torch.tensor(0.004)),
                                      init.opacity_logits)

    def scaled(m, f):
        out = random_scene(rng, m.num_gaussians)
        for name in ("quats", "opacity_logits", "sh_dc", "sh_rest"):
            setattr(out, name, getattr(m, name).clone())
        out.means3D, out.log_scales = m.means3D * f, m.log_scales + math.log(f)
        return out

    def dataset(f):  # tests/test_trainer.make_dataset's, with the cameras' orbit and the extent × f
        big = scaled(scene, f)

        def frames(cams):
            return [Frame(cam, (r := render(big, cam)).image.detach().clamp(0, 1), (1 - r.final_T).detach(),
                          cam.name) for cam in cams]
        return Dataset(frames(orbit(6, 24, radius=3.0 * f)), frames(orbit(1, 24, 0.5, radius=3.0 * f, prefix="t")),
                       np.zeros(3), 3.3 * f)

    seed = int(torch.randint(0, 2 ** 31, (1,), generator=rng))
    runs = []
    for f in (1.0, c):
        cfg = mcmc_config(iterations=30, max_gaussians=200, densify_from=5, densify_interval=10, densify_until=30,
                          mcmc_units=units, seed=seed)
        tr = Trainer(dataset(f), cfg, model=scaled(init, f), device="cpu")
        seen = []
        for it in range(1, 31):
            tr.step()
            if it in (9, 30):  # before the first relocation (which moves the faint ones onto opaque ones), the end
                seen.append((tr.model.means3D.detach().double() / f, tr.model.log_scales.detach().double() - math.log(f)))
        runs.append(seen)
    assert runs[0][1][0].shape == runs[1][1][0].shape and runs[0][1][0].shape[0] > 150  # grown at both relocations
    gaps = [float((b[0] - a[0]).norm(dim=1).max()) / 3.3 for a, b in zip(*runs)]  # positions, in scene extents
    # the scales (in the log, − log c): the scale regulariser's unit shows there (a world-unit term pulls the larger
    # world's scales c times harder)
    scale_gaps = [float((b[1] - a[1]).abs().max()) for a, b in zip(*runs)]
    print(f"{units}: largest gaps {gaps[0]:.2e} (iteration 9), {gaps[1]:.2e} (30) scene extents; log-scales "
          f"{scale_gaps[0]:.2e}, {scale_gaps[1]:.2e}")
    off = max(float(((b[1] - a[1]).abs() > 1e-5).double().mean()) for a, b in zip(*runs))
    if units == "cameras":
        # Adam divides each gradient by its own running size, so a log-scale whose gradient is near 0 steps by up to
        # its learning rate on a rounding difference: at RIGEL_SEED=1392107205, 3 of 492 entries ended 3.4e-4 apart
        # (a fifteenth of scaling_lr); "world" parts them by ~1
        assert max(gaps) < 1e-4 and max(scale_gaps) < 0.2 * cfg.scaling_lr and off < 0.02, (gaps, scale_gaps, off)
    else:
        assert gaps[0] > 1e-1


def _noise_float64(means, quats, log_scales, logits, eta, c, cfg, max_scale=math.inf):
    """The position noise in float64 from its definition: Σ = R·diag(s²)·Rᵀ as a matrix, s and o activated (s at
    most ``max_scale``), the gate σ(−k(o − t)), a non-finite component 0 (tensors on the CPU)."""
    q, ls, lo, e = (t.double().cpu() for t in (quats, log_scales, logits, eta))
    s = torch.where(torch.isfinite(ls), torch.minimum(torch.exp(ls), torch.tensor(max_scale, dtype=torch.float64)),
                    torch.nan)
    o = torch.where(torch.isfinite(lo), torch.sigmoid(lo), torch.nan)
    rot = quat_to_rotmat(q)
    sigma = rot @ torch.diag_embed(s ** 2) @ rot.transpose(1, 2)
    gate = torch.sigmoid(-cfg.mcmc_noise_k * (o - cfg.mcmc_noise_t))
    noise = (sigma @ e[:, :, None])[:, :, 0] * (c * gate)[:, None]
    return torch.where(torch.isfinite(noise), noise, 0.0)


def test_noise_max_scale():
    off = TrainConfig(strategy="mcmc", mcmc_noise_max_scale=0.0)
    share = 0.01 + float(torch.rand(1))
    on = TrainConfig(strategy="mcmc", mcmc_noise_max_scale=share)
    e = 0.5 + 10 * float(torch.rand(1))
    assert noise_max_scale(off, e) == math.inf and noise_max_scale(off, None) == math.inf
    default = TrainConfig(strategy="mcmc")  # the default bounds the noise (docs/TRAINING.md)
    assert 0 < default.mcmc_noise_max_scale and noise_max_scale(default, e) < math.inf
    assert noise_max_scale(on, e) == pytest.approx(share * e, rel=1e-15)
    for bad in (None, 0.0, -1.0, math.nan, math.inf):
        with pytest.raises(ValueError, match="scene extent"):
            noise_max_scale(on, bad)
    for bad in (-0.1, math.inf, math.nan):
        with pytest.raises(ValueError, match="mcmc_noise_max_scale"):
            TrainConfig(strategy="mcmc", mcmc_noise_max_scale=bad).validate()


def test_noise_max_scale_bounds_only_the_wide_gaussians(rng):
    """The PyTorch form (the CPU's) with mcmc_noise_max_scale: against the float64 definition with s bounded; a
    Gaussian whose three scales lie under the bound moves exactly as without it, a wider one as if its wide axes
    were at the bound (so less), a non-finite one not at all."""
    import rigel_core.train.mcmc as mcmc
    n, e = 4000, 1 + 5 * float(torch.rand(1, generator=rng))
    share = 0.02 + 0.05 * float(torch.rand(1, generator=rng))
    off = TrainConfig(strategy="mcmc", max_gaussians=n, mcmc_noise_max_scale=0.0)
    on = dataclasses.replace(off, mcmc_noise_max_scale=share)
    model = random_scene(rng, n)
    model.quats = torch.randn(n, 4, generator=rng)
    bound = share * e
    model.log_scales = math.log(bound) + 2.5 * torch.randn(n, 3, generator=rng)  # about half of them above it
    model.opacity_logits = torch.logit(0.001 + 0.01 * torch.rand(n, generator=rng))  # the gate open
    model.log_scales[:5, 1] = torch.tensor([math.inf, -math.inf, math.nan, 50.0, -40.0])
    start = model.means3D.clone()
    lr = 1e-4 * (1 + float(torch.rand(1, generator=rng)))
    seed = int(torch.randint(0, 2 ** 62, (1,), generator=rng))

    def draw(cfg):
        model.means3D = start.clone()
        return mcmc.add_position_noise(model, lr, cfg, torch.Generator().manual_seed(seed), extent=e)

    free, bounded = draw(off), draw(on)
    # a bound past float32's range (accepted: finite) never binds and trains, as 0 does (it raised in clamp)
    huge = draw(dataclasses.replace(off, mcmc_noise_max_scale=1e300))
    assert torch.equal(huge, free)
    eta = torch.randn((n, 3), generator=torch.Generator().manual_seed(seed))
    want = _noise_float64(start, model.quats, model.log_scales, model.opacity_logits, eta, on.mcmc_noise_lr * lr,
                          on, max_scale=bound)
    scale = float(want.abs().max())
    torch.testing.assert_close(bounded.double(), want, rtol=2e-5, atol=1e-6 * scale)
    under = (model.log_scales < math.log(bound)).all(1)
    over = (model.log_scales > math.log(bound)).any(1)
    over[:5] = False
    assert int(under.sum()) > n // 20 and int(over.sum()) > n // 2
    assert torch.equal(bounded[under], free[under])
    # Σ's eigenvalues lowered on the same axes: |Σ'η| ≤ |Ση| for every η, strictly where η has a clamped component
    b, f = bounded[over].double().norm(dim=1), free[over].double().norm(dim=1)
    assert bool((b <= f * (1 + 1e-5)).all()) and bool((b < f).float().mean() > 0.9)
    assert bool((bounded[:3] == 0).all()) and bool((free[:3] == 0).all())  # a non-finite log-scale: not moved
    # s = e^50: s² overflows float32 unbounded (not moved); bounded, it moves as a Gaussian at the bound
    assert float(free[3].abs().max()) == 0 and 0 < float(bounded[3].abs().max()) < float("inf")


@pytest.mark.gpu
@pytest.mark.parametrize("lr_on_device", [False, True])
@pytest.mark.parametrize("bounded", [False, True])
def test_position_noise_kernel_matches_float64_and_the_pytorch_form(rng, lr_on_device, bounded, monkeypatch):
    """csrc/mcmc_noise.cu against the float64 definition, and against the PyTorch form it replaces on CUDA (same η),
    with non-finite log-scales and logits, zero quaternions, opacities on both sides of the gate's knee, and (bounded)
    mcmc_noise_max_scale at a share of the extent that about a third of the scales exceed; ok False moves nothing."""
    import rigel_core.train.mcmc as mcmc
    n = 6000
    extent = 1 + 5 * float(torch.rand(1, generator=rng))
    cfg = TrainConfig(strategy="mcmc", max_gaussians=n,
                      mcmc_noise_max_scale=(math.exp(-1.5) / extent if bounded else 0.0))
    model = random_scene(rng, n)
    model.quats = torch.randn(n, 4, generator=rng)
    model.quats[:7] = 0.0
    model.log_scales = -4 + 3.5 * torch.rand(n, 3, generator=rng)
    model.opacity_logits = torch.logit(torch.rand(n, generator=rng) * 0.02 + 1e-4)  # around t = 0.005
    model.opacity_logits[::5] = 4 * torch.randn(n, generator=rng)[::5]
    bad = torch.randint(0, n, (40,), generator=rng)
    model.log_scales[bad[:20], torch.randint(0, 3, (20,), generator=rng)] = torch.tensor([math.inf, -math.inf, math.nan,
                                                                                          1.0] * 5)
    model.opacity_logits[bad[20:]] = torch.tensor([math.inf, -math.inf, math.nan, 0.5] * 5)
    gpu = type(model)(*(getattr(model, k).detach().cuda() for k in PARAM_NAMES))
    lr = 1e-4 * (1 + float(torch.rand(1, generator=rng)))
    lr_arg = torch.tensor(lr, device="cuda") if lr_on_device else lr
    seed = int(torch.randint(0, 2 ** 62, (1,), generator=rng))
    assert mcmc._noise_kernel(gpu, lr_arg, cfg) is not None, "the kernel path must be taken on CUDA"
    # what the op refuses goes to the PyTorch form: a non-finite float lr, an ok on the CPU
    assert mcmc._noise_kernel(gpu, math.inf, cfg) is None
    assert mcmc._noise_kernel(gpu, lr, cfg, torch.tensor(True)) is None

    start = gpu.means3D.clone()

    def draw(ok=None):  # the noise and the moved means, from the same start and seed each time
        gpu.means3D = start.clone()
        g = mcmc.noise_generator(torch.device("cuda")).manual_seed(seed)
        noise = mcmc.add_position_noise(gpu, lr_arg, cfg, g, ok, extent=extent)
        return noise, gpu.means3D.clone()

    noise, moved = draw()
    eta = torch.randn((n, 3), generator=torch.Generator(device="cuda").manual_seed(seed), device="cuda")
    want = _noise_float64(start, gpu.quats, gpu.log_scales, gpu.opacity_logits, eta,
                          cfg.mcmc_noise_lr * float(torch.tensor(lr, dtype=torch.float32)), cfg,
                          max_scale=mcmc.noise_max_scale(cfg, extent))
    got = noise.double().cpu()
    assert bool((want != 0).sum() > n // 2) and bool((got[:7] == 0).all())  # zero quaternions: NaN → not moved
    scale = float(want.abs().max())
    torch.testing.assert_close(got, want, rtol=2e-5, atol=1e-6 * scale)
    assert torch.equal(moved, start + noise)  # the kernel's in-place add is the float32 sum
    # the PyTorch form (CUDA, same η) agrees with it
    monkeypatch.setattr(mcmc, "_noise_kernel", lambda *args: None)
    torch_noise, torch_moved = draw()
    torch.testing.assert_close(noise, torch_noise, rtol=2e-5, atol=1e-6 * scale)
    assert torch.equal(torch_moved, start + torch_noise)
    monkeypatch.undo()
    for ok, moves in ((torch.tensor(True, device="cuda"), True), (torch.tensor(False, device="cuda"), False)):
        out, after = draw(ok)
        if moves:
            assert torch.equal(out, noise) and torch.equal(after, moved)
        else:
            assert (out == 0).all() and torch.equal(after, start)


@pytest.mark.gpu
def test_position_noise_kernel_refuses_bad_arguments_naming_them():
    """rigel_core._C.mcmc_position_noise: a wrong dtype, device or shape is a TypeError / ValueError naming the
    argument; a non-finite setting a ValueError."""
    from rigel_core import _ext
    C = _ext.get()
    n = 5
    args = dict(means3D=torch.zeros(n, 3, device="cuda"), quats=torch.ones(n, 4, device="cuda"),
                log_scales=torch.zeros(n, 3, device="cuda"), opacity_logits=torch.zeros(n, device="cuda"),
                eta=torch.zeros(n, 3, device="cuda"), lr_tensor=None, lr=1e-4, noise_lr=5e5, k=100.0, t=0.005)
    assert C.mcmc_position_noise(**args).shape == (n, 3)
    for key, value, err in (("means3D", torch.zeros(n, 3, device="cuda", dtype=torch.float64), TypeError),
                            ("quats", torch.ones(n, 3, device="cuda"), ValueError),
                            ("eta", torch.zeros(n, 3), TypeError),
                            ("lr_tensor", torch.zeros(2, device="cuda"), ValueError),
                            ("ok", torch.ones(n, dtype=torch.bool, device="cuda"), ValueError),
                            ("k", math.nan, ValueError), ("max_scale", 0.0, ValueError),
                            ("max_scale", math.nan, ValueError), ("max_scale", -1.0, ValueError)):
        with pytest.raises(err, match=key if key != "k" else "finite"):
            C.mcmc_position_noise(**{**args, key: value})


def test_regularizer_gradients(rng):
    model = random_scene(rng, 37)
    cfg = TrainConfig(strategy="mcmc", max_gaussians=100, mcmc_opacity_reg=float(torch.rand(1, generator=rng)),
                      mcmc_scale_reg=float(torch.rand(1, generator=rng)))
    model.opacity_logits.requires_grad_(True)
    model.log_scales.requires_grad_(True)
    r = regularizer(model, cfg)
    r.backward()
    o = torch.sigmoid(model.opacity_logits.detach().double())
    s = torch.exp(model.log_scales.detach().double())
    want = cfg.mcmc_opacity_reg * float(o.mean()) + cfg.mcmc_scale_reg * float(s.mean())
    assert float(r.detach()) == pytest.approx(want, rel=1e-5)
    torch.testing.assert_close(model.opacity_logits.grad.double(), cfg.mcmc_opacity_reg * o * (1 - o) / 37,
                               rtol=1e-5, atol=1e-12)
    torch.testing.assert_close(model.log_scales.grad.double(), cfg.mcmc_scale_reg * s / (37 * 3), rtol=1e-5,
                               atol=1e-12)


def test_regularizer_in_float64_and_with_non_finite_entries(rng):
    """The written-out gradient against torch.autograd.gradcheck in float64 (finite entries), and non-finite logits or
    log-scales (NaN, ±Inf: Gaussians the projection culls) counting as 0 with a zero gradient: a finite loss (it
    was NaN, and the NaN guard then skipped every step) whose other entries' gradients are unchanged."""
    from rigel_core.train.mcmc import _Regularizer

    n = 23
    x = (torch.randn(n, generator=rng, dtype=torch.float64) * 3).requires_grad_(True)
    s = (torch.randn(n, 3, generator=rng, dtype=torch.float64) - 2).requires_grad_(True)
    w_o, w_s = float(torch.rand(1, generator=rng)), float(torch.rand(1, generator=rng))
    assert torch.autograd.gradcheck(lambda a, b: _Regularizer.apply(a, b, w_o, w_s), (x, s))
    model = random_scene(rng, n)
    cfg = TrainConfig(strategy="mcmc", max_gaussians=100, mcmc_opacity_reg=w_o, mcmc_scale_reg=w_s)
    bad_o, bad_s = [1, 5, 9], [(2, 0), (5, 1), (7, 2)]
    logits, log_scales = model.opacity_logits.detach().clone(), model.log_scales.detach().clone()
    logits[bad_o] = torch.tensor([math.nan, math.inf, -math.inf])
    log_scales[tuple(zip(*bad_s))] = torch.tensor([math.nan, math.inf, -math.inf])
    model.opacity_logits, model.log_scales = logits.requires_grad_(True), log_scales.requires_grad_(True)
    r = regularizer(model, cfg)
    r.backward()
    ok_o = torch.ones(n, dtype=torch.bool)
    ok_o[bad_o] = False
    ok_s = torch.ones(n, 3, dtype=torch.bool)
    ok_s[tuple(zip(*bad_s))] = False
    o = torch.sigmoid(logits.detach().double()).where(ok_o, 0)
    e = torch.exp(log_scales.detach().double()).where(ok_s, 0)
    want = w_o * float(o.sum()) / n + w_s * float(e.sum()) / (3 * n)   # +Inf's sigmoid (1) does not count either
    assert math.isfinite(float(r.detach())) and float(r.detach()) == pytest.approx(want, rel=1e-5)
    g_o, g_s = model.opacity_logits.grad, model.log_scales.grad
    assert torch.isfinite(g_o).all() and torch.isfinite(g_s).all()
    assert not g_o[bad_o].any() and not g_s[~ok_s].any()
    torch.testing.assert_close(g_o.double()[ok_o], (w_o * o * (1 - o) / n)[ok_o], rtol=1e-5, atol=1e-12)
    torch.testing.assert_close(g_s.double()[ok_s], (w_s * e / (3 * n))[ok_s], rtol=1e-5, atol=1e-12)


def test_an_mcmc_run_with_a_culled_gaussian_keeps_training(rng):
    """One Gaussian with a NaN opacity logit (culled by the render): the MCMC steps still update the others. Through
    the NaN-safe activations its regulariser made every loss NaN, and the NaN guard skipped every step (5 of 5)."""
    ds = make_dataset(rng, n_gauss=30, size=16, n_train=3, n_test=1)
    model = random_scene(rng, 200)
    model.opacity_logits[7] = math.nan
    tr = Trainer(ds, small_config(strategy="mcmc", max_gaussians=400), model=model, device="cpu")
    before = tr.model.means3D.detach().clone()
    for _ in range(3):
        tr.step()
    assert tr.nan_skips == 0 and not torch.equal(tr.model.means3D.detach(), before)


def test_config_validation():
    with pytest.raises(ValueError, match="strategy"):
        TrainConfig(strategy="relocate").validate()
    TrainConfig(strategy="mcmc", max_gaussians=None).validate()   # the pixel rule's budget, set when a run starts
    with pytest.raises(ValueError, match="mcmc_min_opacity"):
        TrainConfig(strategy="mcmc", mcmc_min_opacity=0.0).validate()
    with pytest.raises(ValueError, match="mcmc_noise_lr"):
        TrainConfig(strategy="mcmc", mcmc_noise_lr=-1.0).validate()
    with pytest.raises(ValueError, match="mcmc_max_copies"):
        TrainConfig(mcmc_max_copies=0).validate()
    with pytest.raises(ValueError, match="mcmc_reset_moments"):
        TrainConfig(mcmc_reset_moments="dead").validate()
    with pytest.raises(ValueError, match="mcmc_units"):
        TrainConfig(mcmc_units="metres").validate()
    TrainConfig(strategy="mcmc", max_gaussians=10).validate()
    TrainConfig(max_gaussians=None).validate()  # the default strategy needs no cap


# ---- "auto": MCMC on SfM captures ---------------------------------------------------------------------------------
def _with_sfm_points(ds, rng, m=50):
    return dataclasses.replace(ds, points=(torch.rand(m, 3, generator=rng, dtype=torch.float64) - 0.5).numpy(),
                               point_colors=torch.rand(m, 3, generator=rng, dtype=torch.float64).numpy())


@pytest.mark.parametrize("cap, budget, n_start, want", [
    (3_000_000, 1_000_000, 0, 1_000_000), (400, 1_000_000, 0, 400), (None, 700, 0, 700), (5_000, 5_000, 0, 5_000),
    (3_000_000, 1_000_000, 1_500_000, 1_500_000), (1_200_000, 1_000_000, 1_500_000, 1_200_000)])
def test_auto_is_mcmc_with_the_budget_on_an_sfm_capture(cap, budget, n_start, want):
    cfg = TrainConfig(max_gaussians=cap, auto_mcmc_budget=budget)
    assert cfg.strategy == "auto"
    note = resolve_strategy(cfg, has_sfm_points=True, n_start=n_start)
    assert (cfg.strategy, cfg.max_gaussians) == ("mcmc", want) and f"{want:,}" in note
    cfg.validate()
    assert resolve_strategy(cfg, has_sfm_points=True) is None and cfg.max_gaussians == want  # explicit now


@pytest.mark.parametrize("explicit", ["default", "mcmc"])
def test_auto_without_sfm_points_follows_the_images_and_an_explicit_strategy_stays(explicit):
    # an object on a transparent background (a synthetic render): 3DGS's densification, the cap as it was
    cfg = TrainConfig(max_gaussians=123)
    obj = Capture(n_views=100, pixels=100 * 800 * 800, transparent=TRANSPARENT_BACKGROUND)
    assert "transparent background" in resolve_strategy(cfg, has_sfm_points=False, capture=obj)
    assert (cfg.strategy, cfg.max_gaussians) == ("default", 123)
    # a photo capture (no alpha, or alpha almost everywhere opaque): the MCMC budget from its pixels
    for transparent in (0.0, TRANSPARENT_BACKGROUND * 0.99):
        cfg = TrainConfig()
        photo = Capture(n_views=44, pixels=44 * 1080 * 1920, transparent=transparent)
        note = resolve_strategy(cfg, has_sfm_points=False, capture=photo)
        assert (cfg.strategy, cfg.max_gaussians) == ("mcmc", 1_000_000) and "no SfM points" in note
        assert ("ceiling" in note) == (AUTO_BUDGET_RANDOM not in (0, 1_000_000))
    # a random start's own ceiling (auto_mcmc_budget_random) bounds the pixel rule, and the note says so; the same
    # pixels with SfM points do not feel it
    for sfm, want in ((False, 300_000), (True, 1_000_000)):
        cfg = TrainConfig(auto_mcmc_budget_random=300_000)
        note = resolve_strategy(cfg, has_sfm_points=sfm, capture=photo)
        assert (cfg.strategy, cfg.max_gaussians) == ("mcmc", want)
        assert ("to 300,000 (a random start's ceiling)" in note) == (not sfm)
    # not measured: a photo capture with the fixed budget
    cfg = TrainConfig(max_gaussians=None, auto_mcmc_budget=777)
    assert "mcmc" in resolve_strategy(cfg, has_sfm_points=False) and cfg.max_gaussians == 777
    for sfm in (False, True):
        cfg = TrainConfig(strategy=explicit, max_gaussians=321, auto_mcmc_budget=5)
        assert resolve_strategy(cfg, has_sfm_points=sfm) is None
        assert (cfg.strategy, cfg.max_gaussians) == (explicit, 321)


def test_mcmc_asked_for_without_a_budget_gets_the_pixel_rules(rng):
    """``strategy="mcmc"`` with ``max_gaussians`` None (``rigel-train --strategy mcmc``): the budget "auto" would give
    the capture (one Gaussian per 32 training pixels in [10k, 1M], never below the start), with a note saying so;
    the default strategy's None stays "no cap"."""
    photo = Capture(n_views=17, pixels=17 * 504 * 378)
    cfg = TrainConfig(strategy="mcmc", max_gaussians=None)
    note = resolve_strategy(cfg, has_sfm_points=True, n_start=5_000, capture=photo)
    want = photo.pixels // AUTO_BUDGET_PIXELS_PER_GAUSSIAN
    assert (cfg.strategy, cfg.max_gaussians) == ("mcmc", want) and f"a budget of {want:,}" in note
    assert "one per 32 of the" in note and "--max-gaussians N" in note and "auto" not in note
    cfg = TrainConfig(strategy="mcmc", max_gaussians=None)
    resolve_strategy(cfg, has_sfm_points=True, n_start=2 * want, capture=photo)
    assert cfg.max_gaussians == 2 * want                     # never below the Gaussians it starts from
    cfg = TrainConfig(strategy="default", max_gaussians=None)
    assert resolve_strategy(cfg, has_sfm_points=True, capture=photo) is None and cfg.max_gaussians is None
    # through the Trainer: resolved on its copy of the config, the caller's left as it was
    ds = _with_sfm_points(make_dataset(rng, n_gauss=30, size=16, n_train=3, n_test=0), rng)
    given = small_config(strategy="mcmc", max_gaussians=None)
    tr = Trainer(ds, given, device="cpu")
    assert given.max_gaussians is None and tr.config.max_gaussians == max(AUTO_BUDGET_MIN, 50)
    assert tr.strategy_note in tr.notes and "strategy mcmc, a budget of" in tr.strategy_note
    tr.step()


@pytest.mark.parametrize("pixels, want", [(17 * 504 * 378, 17 * 504 * 378 // 32), (44 * 1080 * 1920, 1_000_000),
                                          (20 * 48 * 48, 10_000), (0, 10_000)])
def test_the_automatic_budget_and_initial_count_follow_the_pixels(pixels, want, rng):
    cap = Capture(n_views=20, pixels=pixels)
    cfg = TrainConfig()
    assert auto_mcmc_budget(cfg, cap) == want
    assert auto_mcmc_budget(TrainConfig(auto_mcmc_budget=5000), cap) == min(5000, want)
    assert auto_mcmc_budget(cfg, None) == cfg.auto_mcmc_budget
    # a random start (no SfM points): the pixel rule under its own ceiling, which a given budget does not feel
    ceiling = int(torch.randint(AUTO_BUDGET_MIN, 600_000, (1,), generator=rng))
    assert auto_mcmc_budget(cfg, cap, random_start=True) == min(want, AUTO_BUDGET_RANDOM or want)
    low = TrainConfig(auto_mcmc_budget_random=ceiling)
    assert auto_mcmc_budget(low, cap, random_start=True) == min(want, ceiling, low.auto_mcmc_budget)
    assert auto_mcmc_budget(low, cap) == want and auto_mcmc_budget(low, None, random_start=True) == ceiling
    given = TrainConfig(auto_mcmc_budget=2_000_000, auto_budget_pixels_per_gaussian=0, auto_mcmc_budget_random=ceiling)
    assert auto_mcmc_budget(given, cap, random_start=True) == 2_000_000
    assert cfg.init_points == "auto"
    resolve_init_points(cfg, cap)
    assert cfg.init_points == min(100_000, min(want, AUTO_BUDGET_RANDOM or want) // 2)
    resolve_init_points(tiny := TrainConfig(auto_mcmc_budget_random=ceiling // 4), cap)  # the start under the ceiling
    assert tiny.init_points == min(100_000, min(want, ceiling // 4) // 2)
    with pytest.raises(ValueError, match="auto_mcmc_budget_random"):
        TrainConfig(auto_mcmc_budget_random=-1).validate()
    cfg.validate()
    resolve_init_points(cfg, Capture(n_views=1, pixels=10 ** 12))  # an integer stays
    assert cfg.init_points == min(100_000, want // 2)
    # the strategy's budget is the same number, and its note says where it came from
    cfg = TrainConfig()
    note = resolve_strategy(cfg, has_sfm_points=True, capture=cap)
    assert cfg.max_gaussians == want and f"{want:,}" in note and f"{pixels:,} training pixels" in note


@pytest.mark.parametrize("n_views, want", [(99, "mcmc"), (100, "default"), (255, "default")])
def test_a_partial_sfm_keeps_3dgs_densification_only_with_many_views(n_views, want):
    cfg = TrainConfig()
    cap = Capture(n_views=n_views, pixels=n_views * 800 * 533)
    note = resolve_strategy(cfg, has_sfm_points=True, auto_background=True, coverage=0.28, capture=cap)
    assert cfg.strategy == want and f"{n_views} training views" in note and "28%" in note
    assert cfg.max_gaussians == (3_000_000 if want == "default" else min(1_000_000, n_views * 800 * 533 // 32))
    # without background points (a covering SfM) the view count does not matter: MCMC
    cfg = TrainConfig()
    resolve_strategy(cfg, has_sfm_points=True, auto_background=False, capture=cap)
    assert cfg.strategy == "mcmc"


def test_the_automatic_budget_never_trims_the_sfm_start(rng):
    """A budget below the SfM points' count (a tiny capture: fern at --downscale 16 got 10,000 for its 10,091 points
    and trimmed 91 at the first step) is raised to the count; the note names the start once."""
    ds = _with_sfm_points(make_dataset(rng, n_gauss=30, size=16, n_train=3, n_test=1), rng, m=50)
    tr = Trainer(ds, small_config(auto_mcmc_budget=30, init_background_points=0), device="cpu")
    assert (tr.config.strategy, tr.config.max_gaussians, tr.model.num_gaussians) == ("mcmc", 50, 50)
    assert "SfM points: 50 start it" in tr.strategy_note and tr.strategy_note.count("SfM points") == 1
    r = tr.step()
    assert r.num_gaussians == 50 and tr.is_consistent()


def test_trainer_picks_mcmc_for_a_photo_capture_without_sfm_points(rng):
    """The same views without alpha (photos): no SfM points → the MCMC budget from their pixels, and a random start
    of half that budget; with alpha leaving the background transparent → 3DGS's densification, as before."""
    ds = make_dataset(rng, n_gauss=30, size=16, n_train=3, n_test=1)
    assert all(f.alpha is not None for f in ds.train)
    photo = dataclasses.replace(ds, train=[dataclasses.replace(f, alpha=None) for f in ds.train])
    tr = Trainer(photo, small_config(init_points="auto", max_gaussians=None, init_mode="auto"), device="cpu")
    budget = 10_000  # 3 views of 16x16 pixels: the floor
    assert tr.capture == Capture(n_views=3, pixels=3 * 16 * 16, transparent=0.0)
    assert (tr.config.strategy, tr.config.max_gaussians, tr.config.init_points) == ("mcmc", budget, budget // 2)
    assert tr.model.num_gaussians == budget // 2 and "no SfM points" in tr.strategy_note
    # the note says where the start's count comes from when "auto" chose it, and not when it was given
    assert "5,000 of them (init_points auto: half the pixel rule's budget, at most 100,000)" in tr.strategy_note
    given = Trainer(photo, small_config(init_points=40, max_gaussians=None, init_mode="auto"), device="cpu")
    assert "40 of them" in given.strategy_note and "init_points auto" not in given.strategy_note
    obj = Trainer(ds, small_config(init_points="auto", max_gaussians=None, init_mode="auto"), device="cpu")
    assert obj.capture.object_on_background and obj.config.strategy == "default"
    # a few images with a transparent background among opaque photos (a mixed export): still a photo capture
    # (the median image is opaque; the mean of 1 in 3 transparent images made it an object on a background)
    mixed = dataclasses.replace(ds, train=[f if i == 0 else dataclasses.replace(f, alpha=None)
                                           for i, f in enumerate(ds.train)])
    assert float((ds.train[0].alpha < 0.5).float().mean()) / 3 >= TRANSPARENT_BACKGROUND   # the mean would say object
    mix = Trainer(mixed, small_config(init_points="auto", max_gaussians=None, init_mode="auto"), device="cpu")
    assert mix.capture.transparent == 0.0 and mix.config.strategy == "mcmc"
    assert obj.config.init_points == budget // 2 and obj.config.max_gaussians is None
    # where the random points are drawn: along the pixels' rays for the photos, in the cameras' box for the object
    assert tr.config.init_mode == "rays" and "along the training pixels' rays" in tr.strategy_note
    assert obj.config.init_mode == "box"
    assert Trainer(photo, small_config(init_points=40, init_mode="box"), device="cpu").config.init_mode == "box"
    assert Trainer(ds, small_config(init_points=40, init_mode="rays"), device="cpu").config.init_mode == "rays"


def test_trainer_resolves_auto_from_its_dataset_on_a_copy(rng):
    ds = make_dataset(rng, n_gauss=30, size=16, n_train=3, n_test=1)
    cfg = small_config(auto_mcmc_budget=90)
    sfm = Trainer(_with_sfm_points(ds, rng), cfg, device="cpu")
    assert (sfm.config.strategy, sfm.config.max_gaussians) == ("mcmc", 90) and "mcmc" in sfm.strategy_note
    assert sfm.model.num_gaussians == 50  # started from the SfM points
    assert (cfg.strategy, cfg.max_gaussians) == ("auto", 3_000_000)  # the caller's config is left as given
    blender = Trainer(ds, cfg, device="cpu")  # the same config on random-init data
    assert (blender.config.strategy, blender.config.max_gaussians) == ("default", 3_000_000)
    r = [sfm.step() for _ in range(2)][-1]
    assert r.densify is None and sfm.is_consistent()
    # a run that starts from a given model larger than the budget keeps all of it (the budget never cuts it)
    big = Trainer(_with_sfm_points(ds, rng), cfg, model=random_scene(rng, 130), device="cpu")
    assert (big.config.strategy, big.config.max_gaussians) == ("mcmc", 130)
    big.step()
    assert big.model.num_gaussians == 130
    explicit = small_config(strategy="default")
    tr = Trainer(_with_sfm_points(ds, rng), explicit, device="cpu")
    assert tr.config is explicit and tr.config.strategy == "default" and tr.strategy_note is None


def test_cli_max_gaussians_is_also_the_auto_budget():
    from rigel_core.cli.common import config_overrides
    from rigel_core.cli.train import build_parser

    def over(*argv):
        return config_overrides(build_parser().parse_args(["--data", "d", "--out", "o", *argv]))

    given = {"auto_budget_pixels_per_gaussian": 0}  # N is the budget itself, not a bound on the pixel rule's
    assert over("--max-gaussians", "2000000") == {"max_gaussians": 2_000_000, "auto_mcmc_budget": 2_000_000, **given}
    assert over("--max-gaussians", "9", "--strategy", "default") == {"max_gaussians": 9, "strategy": "default"}
    assert over("--max-gaussians", "9", "--strategy", "mcmc") == {"max_gaussians": 9, "strategy": "mcmc"}
    assert "auto_mcmc_budget" not in over()
    # naming the default strategy changes nothing: the same budget as --max-gaussians alone (not min(N, 1M))
    assert over("--max-gaussians", "2000000", "--strategy", "auto") == {
        "max_gaussians": 2_000_000, "auto_mcmc_budget": 2_000_000, "strategy": "auto", **given}
    # --set max_gaussians=N says the same as --max-gaussians N; an explicit --set auto_mcmc_budget wins
    assert over("--set", "max_gaussians=2000000") == {"max_gaussians": 2_000_000, "auto_mcmc_budget": 2_000_000,
                                                      **given}
    assert over("--max-gaussians", "7", "--set", "auto_budget_pixels_per_gaussian=64") == {
        "max_gaussians": 7, "auto_mcmc_budget": 7, "auto_budget_pixels_per_gaussian": 64}
    assert over("--set", "max_gaussians=5", "--set", "auto_mcmc_budget=3") == {"max_gaussians": 5,
                                                                               "auto_mcmc_budget": 3}
    assert over("--set", "max_gaussians=5", "--set", "strategy=default") == {"max_gaussians": 5,
                                                                              "strategy": "default"}


@pytest.mark.parametrize("sfm", [True, False])
def test_cli_max_gaussians_sets_the_budget_the_pixel_rule_would_not_give(sfm):
    """--max-gaussians N without --strategy: the budget "auto" gives MCMC is N — above the pixel rule's (a small
    capture: 3 views of 16x16 give the 10k floor) as well as below it; the config alone (a cap) keeps the rule."""
    from rigel_core.cli.common import config_overrides
    from rigel_core.cli.train import build_parser

    small = Capture(n_views=3, pixels=3 * 16 * 16)
    big = Capture(n_views=44, pixels=44 * 1080 * 1920)
    for cap, n in ((small, 20_000), (big, 300_000), (big, 2_000_000)):
        over = config_overrides(build_parser().parse_args(["--data", "d", "--out", "o", "--max-gaussians", str(n)]))
        cfg = TrainConfig(**over)
        note = resolve_strategy(cfg, has_sfm_points=sfm, capture=cap)
        assert (cfg.strategy, cfg.max_gaussians) == ("mcmc", n) and "as given, the pixel rule off" in note
        assert "auto_mcmc_budget" not in note   # the field --max-gaussians sets, which the user never named
        resolve_init_points(cfg, cap)  # the start: half the pixel rule's budget, bounded by N (not N's half)
        assert cfg.init_points == min(100_000, min(n, max(10_000, cap.pixels // 32)) // 2)
    rule = TrainConfig(max_gaussians=20_000)  # a cap only: the pixel rule's 10k
    resolve_strategy(rule, has_sfm_points=sfm, capture=small)
    assert rule.max_gaussians == 10_000
    with pytest.raises(ValueError, match="auto_budget_pixels_per_gaussian"):
        TrainConfig(auto_budget_pixels_per_gaussian=-1).validate()


def test_the_start_line_names_the_strategy_and_budget_however_it_was_chosen(rng):
    """The log's first line names the strategy in use and its budget: given (no note says it), resolved by "auto"
    and restored by a resume alike."""
    ds = _with_sfm_points(make_dataset(rng, n_gauss=30, size=16, n_train=3, n_test=1), rng, m=50)
    given = Trainer(ds, small_config(strategy="mcmc", max_gaussians=77, init_background_points=0), device="cpu")
    assert given.strategy_note is None
    assert given.start_line().startswith("start: 50 Gaussians") and "strategy mcmc, a budget of 77 Gaussians" in \
        given.start_line()
    auto = Trainer(ds, small_config(init_background_points=0, max_gaussians=None), device="cpu")
    assert "strategy mcmc, a budget of 10,000 Gaussians" in auto.start_line()
    dflt = Trainer(ds, small_config(strategy="default", max_gaussians=900, init_background_points=0), device="cpu")
    assert dflt.start_line().endswith("strategy default, at most 900 Gaussians")
    over = Trainer(ds, small_config(strategy="default", max_gaussians=40, init_background_points=0), device="cpu")
    assert over.model.num_gaussians == 50  # 3DGS's densification keeps a start above its bound, and says so
    assert over.start_line().endswith("strategy default, at most 40 Gaussians (the start is above it: densification "
                                      "adds none until pruning brings it below)")
    # the pieces the viewer's Training panel shows (Trainer.start_words / budget_words), not parsed from the line
    assert given.start_words() == "start: 50 Gaussians (the SfM points)" and given.start_line().startswith(
        given.start_words() + ", device ")
    assert given.budget_words() == "a budget of 77 Gaussians" and over.budget_words().startswith("at most 40 ")
    nocap = Trainer(ds, small_config(strategy="default", max_gaussians=None, init_background_points=0), device="cpu")
    assert nocap.budget_words() == "" and nocap.start_line().endswith(", strategy default")
    dflt.step()
    assert dflt.start_line().startswith("resumed at iteration 1: ")
    assert dflt.start_words() == f"resumed at iteration 1: {dflt.model.num_gaussians:,} Gaussians"
    dflt.config.exposure = dflt.config.pose_opt = True  # the per-image corrections a run learns are named too
    assert dflt.start_line().endswith("; learning per-image exposure, pose refinement")


@pytest.mark.parametrize("kind", ["sfm", "sfm+background", "rays", "box", "given"])
def test_the_start_line_says_what_the_run_starts_from(rng, kind):
    """The start line names the initialisation beside the Gaussian count — the SfM points (and how many background
    points were added to them), random points along the rays or in the box, or a given model — and the strategy
    note counts background points apart from the SfM points: it said "SfM points: 3,050 start it" for 50 SfM and
    3,000 background points."""
    ds = make_dataset(rng, n_gauss=30, size=16, n_train=3, n_test=1)
    if kind.startswith("sfm"):
        ds = _with_sfm_points(ds, rng, m=50)
    bg = 3_000 if kind == "sfm+background" else 0
    cfg = small_config(init_background_points=bg, max_gaussians=None, init_points=40,
                       init_mode="box" if kind == "box" else "rays")
    model = random_scene(rng, 25) if kind == "given" else None
    tr = Trainer(ds, cfg, device="cpu", model=model)
    want = {"sfm": "start: 50 Gaussians (the SfM points), ",
            "sfm+background": "start: 3,050 Gaussians (50 SfM points + 3,000 background points), ",
            "rays": "start: 40 Gaussians (random along the training pixels' rays), ",
            "box": "start: 40 Gaussians (random in the cameras' box), ",
            "given": "start: 25 Gaussians (a given model), "}[kind]
    assert tr.start_line().startswith(want), tr.start_line()
    if kind.startswith("sfm"):
        assert ("SfM points: 50, with 3,000 background points, start it" if bg else "SfM points: 50 start it") \
            in tr.strategy_note
    tr.step()
    assert tr.start_line().startswith(f"resumed at iteration 1: {tr.model.num_gaussians:,} Gaussians, device")


@pytest.mark.parametrize("given", [True, False])
def test_init_points_left_unused_by_sfm_points_is_said(rng, given):
    """--init-points N on a capture with SfM points starts nothing (the SfM points do): a note says so, instead of
    the flag vanishing without a word; "auto" (not given) and a dataset without SfM points say nothing."""
    ds = _with_sfm_points(make_dataset(rng, n_gauss=30, size=16, n_train=3, n_test=1), rng, m=50)
    tr = Trainer(ds, small_config(init_points=500 if given else "auto", max_gaussians=None), device="cpu")
    assert tr.model.num_gaussians == 50
    if given:
        assert tr.init_points_note.startswith("init_points=500 not used: the dataset's 50 SfM points start the run")
        assert tr.init_points_note in tr.notes
    else:
        assert tr.init_points_note is None
    bare = Trainer(dataclasses.replace(ds, points=None, point_colors=None), small_config(init_points=500), device="cpu")
    assert bare.init_points_note is None and bare.model.num_gaussians == 500


def test_the_budget_note_says_when_the_start_raised_it(rng):
    ds = _with_sfm_points(make_dataset(rng, n_gauss=30, size=16, n_train=3, n_test=1), rng, m=10_050)
    tr = Trainer(ds, small_config(init_background_points=0, max_gaussians=None), device="cpu")
    assert tr.config.max_gaussians == 10_050 and "raised to the 10,050 Gaussians the run starts from" in \
        tr.strategy_note


def test_a_checkpoint_from_before_the_strategy_field_resumes_with_3dgs_densification(rng, tmp_path):
    # a run saved before TrainConfig had ``strategy`` trained with clone / split / prune; "auto" (the field's
    # default now) must not turn its resumption into the MCMC budget on an SfM capture
    from safetensors.torch import load_file, save_file

    from rigel_core.checkpoint import read_checkpoint
    from rigel_core.cli.common import resume_config

    ds = _with_sfm_points(make_dataset(rng, n_gauss=30, size=16, n_train=3, n_test=0), rng)
    tr = Trainer(ds, small_config(strategy="default", max_gaussians=777), device="cpu")
    tr.step()
    path = tmp_path / "old.safetensors"
    tr.save_checkpoint(path)
    _, meta = read_checkpoint(path)
    for field in ("strategy", "auto_mcmc_budget"):  # the fields the old format lacks
        del meta["config"][field]
    save_file(load_file(path), path, metadata={"rigel": json.dumps(meta)})
    resumed = Trainer.from_checkpoint(path, ds, device="cpu")
    assert (resumed.config.strategy, resumed.config.max_gaussians) == ("default", 777)
    assert resumed.strategy_note is None
    cfg = resume_config(path, {"iterations": 50})  # rigel-train / rigel-viewer --resume
    assert (cfg.strategy, cfg.max_gaussians, cfg.iterations) == ("default", 777, 50)
    assert resume_config(path, {"strategy": "auto"}).strategy == "auto"  # asked for explicitly: resolved anew
    # switching a resumed 3DGS run to MCMC: the saved cap was not chosen as a budget, so the pixel rule's (None: set
    # when the Trainer starts) unless one is given
    changes = []
    assert resume_config(path, {"strategy": "mcmc"}, changes).max_gaussians is None
    assert "max_gaussians 777 -> the pixel rule's budget" in changes   # not "-> None"
    switched = Trainer.from_checkpoint(path, ds, device="cpu", config=resume_config(path, {"strategy": "mcmc"}))
    assert switched.config.strategy == "mcmc" and switched.config.max_gaussians == max(AUTO_BUDGET_MIN,
                                                                                        switched.model.num_gaussians)
    assert resume_config(path, {"strategy": "mcmc", "max_gaussians": 90}).max_gaussians == 90
    # --strategy mcmc repeated on an MCMC run (the CLI's None): the budget it chose stays, and is no change
    switched.save_checkpoint(tmp_path / "mcmc.safetensors")
    changes = []
    assert resume_config(tmp_path / "mcmc.safetensors", {"strategy": "mcmc", "max_gaussians": None},
                         changes).max_gaussians == switched.config.max_gaussians and changes == []
    # an MCMC run switched to 3DGS's densification: its budget (reached) is not kept as the cap, which would stop
    # all growth; 3DGS's default cap, said as a change; --max-gaussians N still sets it
    changes = []
    back = resume_config(tmp_path / "mcmc.safetensors", {"strategy": "default"}, changes)
    assert back.max_gaussians == TrainConfig().max_gaussians > switched.config.max_gaussians
    assert f"max_gaussians {switched.config.max_gaussians} -> {TrainConfig().max_gaussians}" in changes
    assert resume_config(tmp_path / "mcmc.safetensors", {"strategy": "default", "max_gaussians": 55}).max_gaussians == 55
    # --max-gaussians N on a resumed run: the cap / budget changes; the "auto" inputs it implies for a new run
    # (read only where "auto" is resolved) are neither applied nor listed as changed settings
    changes = []
    cfg = resume_config(path, {"max_gaussians": 900, "auto_mcmc_budget": 900, "auto_budget_pixels_per_gaussian": 0},
                        changes)
    assert cfg.max_gaussians == 900 and cfg.auto_budget_pixels_per_gaussian == 32 and changes == ["max_gaussians 777 -> 900"]
    changes = []  # asked to resolve "auto" anew: its inputs count again
    cfg = resume_config(path, {"strategy": "auto", "auto_budget_pixels_per_gaussian": 0}, changes)
    assert cfg.auto_budget_pixels_per_gaussian == 0 and any("auto_budget_pixels_per_gaussian" in c for c in changes)


# ---- training ----------------------------------------------------------------------------------------------------
def test_mcmc_training_reaches_the_budget_and_learns(rng):
    ds = make_dataset(rng, n_gauss=120, size=24, n_train=8, n_test=3)
    cap = 150
    cfg = mcmc_config(iterations=160, init_points=120, max_gaussians=cap, densify_from=10, densify_interval=10,
                      densify_until=150, mcmc_growth=0.1, seed=int(torch.randint(0, 2 ** 31, (1,), generator=rng)))
    tr = Trainer(ds, cfg, device="cpu")
    before = tr.evaluate()
    results = [tr.step() for _ in range(160)]
    after = tr.evaluate()
    reps = [r.densify for r in results if r.densify is not None]
    print(f"held-out PSNR {before.psnr:.2f} -> {after.psnr:.2f} dB, N {[r.n_after for r in reps]}, "
          f"relocated {[r.n_relocated for r in reps]}")
    assert all(isinstance(r, MCMCReport) for r in reps)
    assert [r.iteration for r in reps] == list(range(20, 150, 10))  # strictly between densify_from and _until
    assert max(r.num_gaussians for r in results) == cap == tr.model.num_gaussians
    assert reps[-1].capped and not reps[0].capped and sum(r.n_relocated for r in reps) > 0
    assert not any(r.opacity_reset for r in results) and tr.is_consistent()
    assert after.psnr >= before.psnr + 3.0 and after.psnr > 15.5  # 17.1–18.5 dB over 4 seeds


def test_mcmc_init_above_the_budget_is_trimmed(rng):
    ds = make_dataset(rng, n_gauss=30, size=16, n_train=3, n_test=0)
    tr = Trainer(ds, mcmc_config(init_points=90, max_gaussians=60), device="cpu")
    assert tr.model.num_gaussians == 90
    r = tr.step()
    assert r.num_gaussians == 60 and r.densify.n_prune == 30 and tr.is_consistent()


def test_mcmc_resume_continues_bit_for_bit(rng, tmp_path):
    ds = make_dataset(rng, n_gauss=60, size=24, n_train=5, n_test=2)
    start = random_scene(rng, 70)
    dead = torch.rand(70, generator=rng) < 0.4
    start.opacity_logits = torch.where(dead, torch.logit(torch.tensor(0.002)), start.opacity_logits)
    cfg = mcmc_config(max_gaussians=90, densify_from=3, densify_interval=4, eval_every=5, sh_degree_interval=4)
    tr = Trainer(ds, cfg, model=start, device="cpu")
    for _ in range(11):  # relocation + growth at 4 and 8, mid-epoch (5 views)
        tr.step()
    path = tmp_path / "ckpt.safetensors"
    tr.save_checkpoint(path)
    resumed = Trainer.from_checkpoint(path, ds, device="cpu")
    assert resumed.config == cfg and resumed.iteration == 11
    reports = []
    for _ in range(6):  # crosses the step at 12 and 16 (sampling and noise from the restored generator)
        a, b = tr.step(), resumed.step()
        assert (a.loss, a.view, a.num_gaussians) == (b.loss, b.view, b.num_gaussians)
        assert a.densify == b.densify
        reports += [a.densify] if a.densify else []
        _assert_same_state(_state(tr), _state(resumed))
    assert [r.iteration for r in reports] == [12, 16] and all(r.n_added > 0 for r in reports)


def test_cli_strategy_mcmc(blender_dataset, tmp_path, capsys):  # noqa: F811
    from rigel_core.cli.train import main

    common = ["--data", str(blender_dataset), "--white-bg", "--quiet", "--init-points", "100", "--sh-degree", "1",
              "--eval-every", "0", "--checkpoint-every", "0", "--n-renders", "0"]
    # without --max-gaussians: the budget "auto" would give (the pixel rule), said in the log (before: refused)
    assert main(common + ["--out", str(tmp_path / "a"), "--iters", "5", "--strategy", "mcmc"]) == 0
    metrics = json.loads((tmp_path / "a" / "metrics.json").read_text())
    assert metrics["config"]["strategy"] == "mcmc" and metrics["config"]["max_gaussians"] == AUTO_BUDGET_MIN
    assert f"strategy mcmc, a budget of {AUTO_BUDGET_MIN:,} Gaussians" in (tmp_path / "a" / "log.txt").read_text()
    # resumed with the same command line: the budget stays, nothing listed as changed
    capsys.readouterr()
    assert main(common + ["--out", str(tmp_path / "a"), "--iters", "8", "--strategy", "mcmc", "--resume"]) == 0
    assert "max_gaussians" not in capsys.readouterr().err
    assert json.loads((tmp_path / "a" / "metrics.json").read_text())["config"]["max_gaussians"] == AUTO_BUDGET_MIN
    assert main(common + ["--out", str(tmp_path / "b"), "--iters", "24", "--strategy", "mcmc", "--max-gaussians",
                          "130", "--set", "densify_from=5", "--set", "densify_interval=5",
                          "--set", "mcmc_growth=0.15"]) == 0
    metrics = json.loads((tmp_path / "b" / "metrics.json").read_text())
    assert metrics["config"]["strategy"] == "mcmc" and metrics["num_gaussians"] == 130
    assert [d["iteration"] for d in metrics["densify"]] == [10, 15, 20]
    assert "mcmc relocate" in (tmp_path / "b" / "log.txt").read_text()
    # --set works for the strategy and its hyper-parameters
    assert main(common + ["--out", str(tmp_path / "c"), "--iters", "3", "--set", "strategy=mcmc", "--set",
                          "max_gaussians=100", "--set", "mcmc_noise_lr=1e4"]) == 0
    cfg = json.loads((tmp_path / "c" / "metrics.json").read_text())["config"]
    assert cfg["strategy"] == "mcmc" and cfg["mcmc_noise_lr"] == 1e4
    assert "not read by this run" not in (tmp_path / "c" / "log.txt").read_text()
    # an MCMC setting on a run that "auto" sends to 3DGS's densification (an object on a transparent background)
    # is said to do nothing, on the console and in log.txt; the run still trains and records it
    capsys.readouterr()
    assert main(common + ["--out", str(tmp_path / "d"), "--iters", "2", "--set", "mcmc_units=cameras",
                          "--set", "mcmc_noise_lr=7"]) == 0
    line = ("--set mcmc_noise_lr, mcmc_units: not read by this run, which densifies with 3DGS's clone / split / prune "
            "(strategy default)")
    assert line in capsys.readouterr().err and line in (tmp_path / "d" / "log.txt").read_text()
    assert json.loads((tmp_path / "d" / "metrics.json").read_text())["config"]["mcmc_units"] == "cameras"


@pytest.mark.gpu
def test_mcmc_on_cuda(rng):
    """The CUDA path: relocation and growth draw on the CPU generator, so a model on the GPU lands its copies on the
    same rows as on the CPU; the noise is drawn on the device; a short run reaches the budget and stays consistent."""
    model, opt, dead = _model_with_moments(rng, 200)
    cfg = TrainConfig(strategy="mcmc", max_gaussians=230)
    gpu = type(model)(*(getattr(model, k).detach().cuda() for k in PARAM_NAMES))
    gopt = make_optimizer(gpu, TrainConfig(), 1.0)
    seed = int(torch.randint(0, 2 ** 31, (1,), generator=rng))
    for m, o, dev in ((model, opt, "cpu"), (gpu, gopt, "cuda")):
        g = torch.Generator().manual_seed(seed)
        assert relocate_dead(m, o, cfg, g) == int(dead.sum()) and add_gaussians(m, o, cfg, g) == 10
        assert m.means3D.device.type == dev
    assert torch.equal(model.means3D.detach(), gpu.means3D.detach().cpu())
    torch.testing.assert_close(model.opacities.detach(), gpu.opacities.detach().cpu(), rtol=1e-5, atol=1e-7)
    noise = position_noise(gpu, 1e-4, cfg, torch.Generator().manual_seed(seed), extent=2.0)
    assert noise.is_cuda and bool(torch.isfinite(noise).all()) and float(noise.abs().max()) > 0

    ds = make_dataset(rng, n_gauss=120, size=32, n_train=6, n_test=2)
    tr = Trainer(ds, mcmc_config(iterations=60, init_points=150, max_gaussians=200, densify_from=5,
                                 densify_interval=5, mcmc_growth=0.2), device="cuda")
    before = tr.evaluate()
    for _ in range(60):
        r = tr.step()
    assert r.num_gaussians == 200 and tr.is_consistent() and tr.nan_skips == 0
    assert tr.evaluate().psnr > before.psnr


# ---- the fog rule, removed (measured: docs/TRAINING.md) -------------------------------------------------------------
@pytest.mark.parametrize("entry", ["fog_at (1,)", "fog_at ()", "noise_scale"])
def test_a_checkpoint_of_the_removed_fog_rule_resumes_without_it(rng, tmp_path, entry):
    """A checkpoint the previous rigel wrote on an MCMC run the fog rule had acted on holds the int64 tensor
    ``mcmc.fog_at`` (shape (1,), the iteration it acted at; a 0-d one is taken too; the rule's first form held
    ``mcmc.noise_scale``, its multiplier, instead) and the rule's three fields in its
    config and its held iteration's ``deferred_config``: ``--resume`` (Trainer.from_checkpoint, the CLI's
    resume_config) reads it as the run without them and goes on bit for bit, and the model alone loads. The removed
    fields are unknown fields for ``--set`` and TrainConfig.from_dict, refused in the usual line."""
    from safetensors.torch import load_file, save_file

    from rigel_core.checkpoint import load_checkpoint_model, read_checkpoint
    from rigel_core.cli.common import config_overrides, resume_config
    from rigel_core.cli.train import build_parser
    ds = make_dataset(rng, n_gauss=40, size=16, n_train=4, n_test=0)
    cfg = mcmc_config(iterations=40, max_gaussians=80, densify_from=3, densify_interval=4)
    tr = Trainer(ds, cfg, model=random_scene(rng, 60), device="cpu")
    tr.schedule_holds.add(12)  # the checkpoint's iteration holds its relocation: a deferred_config is saved too
    for _ in range(12):
        tr.step()
    path, old = tmp_path / "now.safetensors", tmp_path / "old.safetensors"
    tr.save_checkpoint(path)
    tensors, meta = load_file(path), read_checkpoint(path)[1]
    assert meta["deferred_schedule"] == 12 and "deferred_config" in meta
    fog = {"mcmc_fog_share": 0.8, "mcmc_fog_from": 0.25, "mcmc_fog_noise": 0.1}  # the rule on, acted at 12
    meta = {**meta, "config": {**meta["config"], **fog}, "deferred_config": {**meta["deferred_config"], **fog}}
    retired = {"fog_at (1,)": {"mcmc.fog_at": torch.tensor([12], dtype=torch.int64)},
               "fog_at ()": {"mcmc.fog_at": torch.tensor(12, dtype=torch.int64)},
               # the rule's first form (until 875d3bd) kept its multiplier instead, float64 (1,)
               "noise_scale": {"mcmc.noise_scale": torch.tensor([0.1], dtype=torch.float64)}}[entry]
    save_file({**tensors, **retired}, old,
              metadata={"rigel": json.dumps(meta)})
    resumed = Trainer.from_checkpoint(old, ds, device="cpu")
    assert resumed.config == cfg and resumed._deferred_config == cfg and resumed.deferred_schedule == 12
    assert resume_config(old, {}) == cfg
    for _ in range(6):  # the held relocation at 12, then 16
        tr.step()
        resumed.step()
        _assert_same_state(_state(tr), _state(resumed))
    assert torch.equal(load_checkpoint_model(old).means3D, tensors["model.means3D"])
    for field, value in fog.items():
        with pytest.raises(ValueError, match=f"--set '{field}={value}': TrainConfig has no field '{field}'"):
            config_overrides(build_parser().parse_args(["--data", "d", "--out", "o", "--set", f"{field}={value}"]))
        with pytest.raises(ValueError, match=f"unknown field.*{field}"):
            TrainConfig.from_dict({**cfg.to_dict(), field: value})


def test_a_held_growth_step_is_logged_and_a_checkpoint_from_before_the_rule_keeps_growing(rng, tmp_path):
    """A relocation step the growth rule holds says so in log.txt (its dead share) and in metrics.json
    (``growth_held``), and the run's final line counts such steps: why N ends under the budget. A checkpoint written
    before ``mcmc_growth_max_dead`` and ``mcmc_noise_max_scale`` existed (no such keys in its config) resumes with both
    off, as it trained: growth at every relocation step, the paper's unbounded noise."""
    from safetensors.torch import load_file, save_file

    from rigel_core.checkpoint import read_checkpoint
    from rigel_core.run_dir import RunRecord
    ds = make_dataset(rng, n_gauss=40, size=16, n_train=4, n_test=0)
    # every Gaussian far under the dead bound but a few: the first relocation step finds most of them dead
    cfg = mcmc_config(iterations=12, max_gaussians=400, densify_from=3, densify_interval=4, mcmc_min_opacity=0.2)
    model = random_scene(rng, 60)
    with torch.no_grad():
        model.opacity_logits[:50] = -6.0
    tr = Trainer(ds, cfg, model=model, device="cpu")
    rec = RunRecord.open(tmp_path / "run", tr, data="synthetic")
    for _ in range(12):
        r = tr.step()
        if r.densify is not None:
            rec.densified(r.densify)
    held = [d for d in rec.metrics["densify"] if d["growth_held"]]
    assert held and all(d["n_added"] == 0 and d["dead_share"] > cfg.mcmc_growth_max_dead for d in held)
    rec.log_final(tr, None, 1.0)
    log = (tmp_path / "run" / "log.txt").read_text()
    first = held[0]
    assert (f"[{first['iteration']}] mcmc relocate {first['n_relocated']} add 0 -> {first['n_after']} (growth held: "
            f"{first['dead_share']:.0%} of the Gaussians dead, over mcmc_growth_max_dead)") in log
    n = len(held)
    assert f"MCMC growth held at {n} relocation step{'s' if n != 1 else ''} where more than" in log
    # a checkpoint from before the two rules: neither key in its config
    path, old = tmp_path / "now.safetensors", tmp_path / "old.safetensors"
    tr.save_checkpoint(path)
    tensors, meta = load_file(path), read_checkpoint(path)[1]
    meta["config"] = {k: v for k, v in meta["config"].items()
                      if k not in ("mcmc_growth_max_dead", "mcmc_noise_max_scale")}
    save_file(tensors, old, metadata={"rigel": json.dumps(meta)})
    resumed = Trainer.from_checkpoint(old, ds, device="cpu")
    assert resumed.config.mcmc_growth_max_dead == 0.0 and resumed.config.mcmc_noise_max_scale == 0.0
    assert resumed.config == dataclasses.replace(cfg, mcmc_growth_max_dead=0.0, mcmc_noise_max_scale=0.0)
    assert Trainer.from_checkpoint(path, ds, device="cpu").config == cfg  # a new checkpoint keeps its values
