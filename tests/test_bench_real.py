"""bench/real.py (rigel vs a plain gsplat loop on real captures) on tiny CPU scenes.

The rigel half runs for real on the PyTorch reference backend. gsplat needs CUDA, so its half is exercised
through a stand-in ``gsplat`` module: ``rasterization`` built on rigel's reference renderer (the same math) and a
``DefaultStrategy`` that checks the call protocol and duplicates Gaussians the way gsplat's ops do. With
densification off on both sides, the two loops must then follow the same trajectory (same start, view order,
learning rates, loss and SH ramp) — a check that the benchmark gives both methods the same protocol.
"""
import dataclasses
import itertools
import json
import math
import re
import subprocess
import sys
import types
from pathlib import Path

import numpy as np
import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench import real  # noqa: E402
from rigel_core import Camera, GaussianModel, render  # noqa: E402
from rigel_core.data import Dataset, Frame  # noqa: E402
from rigel_core.reference import sh_colors  # noqa: E402
from rigel_core.renderer import rasterize_gaussians  # noqa: E402
from rigel_core.train import TrainConfig  # noqa: E402
from rigel_core.train.losses import ssim  # noqa: E402

FAR = 10 ** 9


pytestmark = pytest.mark.usefixtures("one_thread")  # conftest.py: one PyTorch thread


# ---- a stand-in gsplat ----------------------------------------------------------------------------------------
class FakeStrategy:
    """Checks gsplat's DefaultStrategy protocol; ``dup_every`` > 0 duplicates the first Gaussian every that many
    steps (parameters and Adam moments, as gsplat's ops do)."""

    instances = []

    def __init__(self, dup_every=0):
        self.dup_every, self.steps, self.pre = dup_every, [], []
        FakeStrategy.instances.append(self)

    def check_sanity(self, params, optimizers):
        assert set(params) == set(optimizers) == {"means", "scales", "quats", "opacities", "sh0", "shN"}
        for k, opt in optimizers.items():
            assert len(opt.param_groups) == 1 and opt.param_groups[0]["params"][0] is params[k]

    def initialize_state(self, scene_scale=1.0):
        return {"scene_scale": scene_scale}

    def step_pre_backward(self, params, optimizers, state, step, info):
        info["means2d"].retain_grad()
        self.pre.append(step)

    def step_post_backward(self, params, optimizers, state, step, info, packed=False):
        assert packed is False and self.pre[-1] == step
        assert info["means2d"].grad is not None  # backward ran ...
        assert all(p.grad is None for p in params.values())  # ... and Adam stepped and zeroed
        self.steps.append(step)
        if self.dup_every and step > 0 and step % self.dup_every == 0:
            for k, opt in optimizers.items():
                old = params[k]
                new = torch.nn.Parameter(torch.cat([old.detach(), old.detach()[:1]]))
                st = opt.state.pop(old)
                for key in ("exp_avg", "exp_avg_sq"):
                    st[key] = torch.cat([st[key], torch.zeros_like(st[key][:1])])
                opt.param_groups[0]["params"] = [new]
                opt.state[new] = st
                params[k] = new


class FakeMCMCStrategy:
    """Checks gsplat's MCMCStrategy protocol as its example trainer drives it: no ``step_pre_backward``, one
    ``step_post_backward(..., lr=means' lr)`` per step after Adam; ``cap_max`` and ``noise_lr`` recorded."""

    instances = []

    def __init__(self, cap_max=1_000_000, noise_lr=5e5):
        self.cap_max, self.noise_lr, self.steps, self.lrs = cap_max, noise_lr, [], []
        FakeMCMCStrategy.instances.append(self)

    def check_sanity(self, params, optimizers):
        assert {"means", "scales", "quats", "opacities"} <= set(params)

    def initialize_state(self):  # (no scene_scale: MCMC's takes none)
        return {}

    def step_pre_backward(self, *a, **k):  # pragma: no cover - must not be called
        raise AssertionError("MCMCStrategy has no step_pre_backward in gsplat's example trainer")

    def step_post_backward(self, params, optimizers, state, step, info, lr):
        assert all(p.grad is None for p in params.values())  # after Adam's step and zero_grad
        self.steps.append(step)
        self.lrs.append(lr)


def fake_rasterization(calls):
    def rasterization(means, quats, scales, opacities, colors, viewmats, Ks, width, height, sh_degree=None,
                      packed=True, near_plane=0.01, far_plane=1e10, **kw):
        assert packed is False and not kw, kw
        assert viewmats.shape == (1, 4, 4) and Ks.shape == (1, 3, 3)
        assert colors.dim() == 3 and colors.shape[0] == means.shape[0] and colors.shape[1] >= (sh_degree + 1) ** 2
        calls.append(sh_degree)
        v = viewmats[0].double()
        campos = (-v[:3, :3].T @ v[:3, 3]).to(means)
        src = means[None] * 1.0  # stands for gsplat's means2d: a non-leaf in the graph
        rgb = sh_colors(sh_degree, colors, src[0], campos)
        out = rasterize_gaussians(src[0], quats, scales, opacities, rgb, viewmats[0], Ks[0], width, height,
                                  near_plane=near_plane, far_plane=far_plane)
        info = {"means2d": src, "radii": out.radii[None], "width": width, "height": height, "n_cameras": 1}
        return out.image[None], (1.0 - out.final_T)[None, ..., None], info

    return rasterization


@pytest.fixture
def fake_gsplat(monkeypatch):
    calls = []
    mod = types.ModuleType("gsplat")
    mod.__version__ = "fake"
    mod.rasterization = fake_rasterization(calls)
    mod.DefaultStrategy = FakeStrategy
    mod.MCMCStrategy = FakeMCMCStrategy
    FakeStrategy.instances = []
    FakeMCMCStrategy.instances = []
    monkeypatch.setitem(sys.modules, "gsplat", mod)
    return calls


# ---- tiny datasets --------------------------------------------------------------------------------------------
def orbit(n, size, offset=0.0, prefix="v"):
    cams = []
    for i in range(n):
        az = 2 * math.pi * (i + offset) / n
        el = 0.3 + 0.3 * math.sin(3 * az)
        eye = 3.0 * np.array([math.cos(az) * math.cos(el), math.sin(az) * math.cos(el), math.sin(el)])
        cams.append(Camera.look_at(eye, (0, 0, 0), width=size, height=size, fov_x_deg=50, name=f"{prefix}{i}"))
    return cams


def sfm_dataset(rng, n=120, size=24, n_train=5, n_test=2):
    """Frames rendered from a random scene; its means (jittered) and colours stand for the SfM points."""
    pts = (torch.rand(n, 3, generator=rng) * 2 - 1) * 0.7
    cols = torch.rand(n, 3, generator=rng)
    truth = GaussianModel.from_points(pts, cols, sh_degree=1, scale=0.12, opacity=0.7)

    def frames(cams):
        out = []
        for c in cams:
            r = render(truth, c)
            out.append(Frame(c, r.image.detach().clamp(0, 1), None, c.name))
        return out

    sfm = (pts + 0.03 * torch.randn(n, 3, generator=rng)).double().numpy()
    return Dataset(frames(orbit(n_train, size)), frames(orbit(n_test, size, 0.5, "t")), np.zeros(3), 3.3,
                   points=sfm, point_colors=cols.double().numpy())


def test_automatic_background_points_are_in_the_shared_start_and_the_rigel_run(rng):
    """On a partial SfM "auto" adds background points: they are in the start both methods share, and the rigel
    run (a Trainer given that start) records the same count and the strategy they bring (3DGS's densification)."""
    from rigel_core.train import sfm_view_coverage

    ds = sfm_dataset(rng, n=60, size=16, n_train=3, n_test=1)
    assert sfm_view_coverage(ds.train, ds.points) < 0.5  # the object only: a partial SfM
    cfg = TrainConfig(iterations=2, eval_every=0, sh_degree=0, auto_background_points=25,
                      auto_default_min_views=1)  # (3 views stand for a large partial-SfM capture)
    dev = torch.device("cpu")
    base = real.initial_model(ds, cfg, dev)
    assert base.num_gaussians == 60 + 25
    rig = real.run_rigel(ds, base, cfg, [2], None, dev, "rigel")
    assert (rig["config"]["init_background_points"], rig["config"]["strategy"]) == (25, "default")
    no_bg = real.initial_model(ds, dataclasses.replace(cfg, init_background_points=0), dev)
    assert no_bg.num_gaussians == 60
    assert torch.equal(base.means3D[:60], no_bg.means3D)


# ---- the two halves follow one protocol ---------------------------------------------------------------------
def test_gsplat_loop_follows_rigels_trajectory(rng, fake_gsplat):
    ds = sfm_dataset(rng)
    cfg = TrainConfig(iterations=12, eval_every=0, seed=3, sh_degree=1, sh_degree_interval=5, densify_from=FAR,
                      opacity_reset_interval=FAR, strategy="default",  # (auto: MCMC's noise on an SfM capture)
                      init_background_points=0)  # the SfM points alone (auto: background points on this capture)
    gcfg = TrainConfig(iterations=12, eval_every=0, seed=3, sh_degree_interval=5)
    dev = torch.device("cpu")
    base = real.initial_model(ds, cfg, dev)
    assert base.num_gaussians == len(ds.points) and base.sh_degree == 1
    ref = GaussianModel.from_points(ds.points, ds.point_colors, sh_degree=1, opacity=0.1)
    for p in ("means3D", "log_scales", "quats", "opacity_logits", "sh_dc", "sh_rest"):
        assert torch.equal(getattr(base, p), getattr(ref, p)), p
    snapshot = real.clone_model(base)
    rig = real.run_rigel(ds, base, cfg, [6, 12], None, dev, "rigel")
    assert rig["graph_step"] is None  # eager on the CPU (on CUDA: captures, capture_s, replays, overflows)
    gsp = real.run_gsplat(ds, base, gcfg, [6, 12], None, dev, 3, "gsplat")
    for p in ("means3D", "log_scales", "opacity_logits", "sh_dc"):  # neither run touched the shared start
        assert torch.equal(getattr(base, p), getattr(snapshot, p))
    strat = FakeStrategy.instances[-1]
    assert strat.steps == list(range(12)) and strat.pre == list(range(12))  # 0-based steps, one call each
    # the active SH degree follows the ramp min(1, it // 5) for it = 1..12, then the evaluations at 6 and 12
    train_calls = fake_gsplat[:12]
    assert train_calls == [min(1, it // 5) for it in range(1, 13)]
    assert [c["iteration"] for c in rig["checkpoints"]] == [c["iteration"] for c in gsp["checkpoints"]] == [6, 12]
    first = real.evaluate_views(lambda f: render(base, f.camera).image, ds.test, dev)["psnr"]
    for a, b in zip(rig["checkpoints"], gsp["checkpoints"]):
        assert a["psnr"] > first + 0.1  # training moved
        assert abs(a["psnr"] - b["psnr"]) < 1e-3 and abs(a["ssim"] - b["ssim"]) < 1e-4, (a["psnr"], b["psnr"])
        assert a["num_gaussians"] == b["num_gaussians"] == base.num_gaussians
        assert abs(a["psnr_trainer"] - a["psnr"]) < 1e-6  # Trainer.evaluate agrees with the shared metric
        assert a["train_s"] > 0 and a["peak_gib"] is None and a["reserved_gib"] is None
        assert len(a["per_view"]) == len(ds.test)
    assert rig["checkpoints"][1]["train_s"] >= rig["checkpoints"][0]["train_s"]


def test_gsplat_loop_follows_densification_and_time_limit(rng, fake_gsplat, monkeypatch):
    ds = sfm_dataset(rng, n=40, size=16, n_train=3, n_test=1)
    dev = torch.device("cpu")
    base = real.initial_model(ds, TrainConfig(iterations=9, sh_degree=0, init_background_points=0), dev)
    monkeypatch.setattr(sys.modules["gsplat"], "DefaultStrategy", lambda: FakeStrategy(dup_every=2))
    cfg = TrainConfig(iterations=9, eval_every=0)
    res = real.run_gsplat(ds, base, cfg, [9], None, dev, 0, "gsplat")
    assert res["checkpoints"][-1]["num_gaussians"] == 40 + 4  # steps 2, 4, 6, 8 each added one
    # a time limit stops the run after the first iteration that passes it, and records where
    res = real.run_gsplat(ds, base, cfg, [5, 9], 1e-9, dev, 0, "gsplat")
    assert res["stopped_at"] == 1 and "time limit" in res["stop_reason"]
    assert [c["iteration"] for c in res["checkpoints"]] == [1]


def test_gsplat_mcmc_loop_protocol_and_regularisers(rng, fake_gsplat):
    """gsplat's MCMCStrategy is driven as its example trainer drives it (lr = the means' rate of each step, the
    budget passed as cap_max), and its loss adds the opacity and scale regularisers: with the regularisers' weights
    at 0 the loop follows the DefaultStrategy loop's trajectory exactly, with them it does not."""
    from rigel_core.train.optim import position_lr

    ds = sfm_dataset(rng, n=40, size=16, n_train=3, n_test=1)
    dev = torch.device("cpu")
    base = real.initial_model(ds, TrainConfig(iterations=6, sh_degree=0, init_background_points=0), dev)
    cfg = TrainConfig(iterations=6, eval_every=0)
    res = real.run_gsplat(ds, base, cfg, [6], None, dev, 0, "gsplat-mcmc", mcmc_cap=1234)
    strat = FakeMCMCStrategy.instances[-1]
    assert strat.cap_max == 1234 and strat.steps == list(range(6)) and res["strategy_name"] == "FakeMCMCStrategy"
    assert strat.lrs == [position_lr(cfg, it, ds.scene_extent) for it in range(1, 7)]
    assert strat.noise_lr == cfg.mcmc_noise_lr  # "world" units: gsplat's own number
    # "cameras" units: the noise and the scale term in the cameras' radius, as rigel measures them
    cams = dataclasses.replace(cfg, mcmc_units="cameras", mcmc_opacity_reg=0.0)
    in_cams = real.run_gsplat(ds, base, cams, [6], None, dev, 0, "gsplat-mcmc", mcmc_cap=1234)
    unit = ds.scene_extent / 1.1
    assert FakeMCMCStrategy.instances[-1].noise_lr == pytest.approx(cfg.mcmc_noise_lr / unit ** 2, rel=1e-12)
    scaled = dataclasses.replace(cfg, mcmc_opacity_reg=0.0, mcmc_scale_reg=cfg.mcmc_scale_reg / unit)
    same_term = real.run_gsplat(ds, base, scaled, [6], None, dev, 0, "gsplat-mcmc", mcmc_cap=1234)
    assert in_cams["checkpoints"][-1]["psnr"] == pytest.approx(same_term["checkpoints"][-1]["psnr"], abs=1e-9)
    plain = real.run_gsplat(ds, base, cfg, [6], None, dev, 0, "gsplat")
    no_reg = dataclasses.replace(cfg, mcmc_opacity_reg=0.0, mcmc_scale_reg=0.0)
    same = real.run_gsplat(ds, base, no_reg, [6], None, dev, 0, "gsplat-mcmc", mcmc_cap=1234)
    assert same["checkpoints"][-1]["psnr"] == pytest.approx(plain["checkpoints"][-1]["psnr"], abs=1e-9)
    assert res["checkpoints"][-1]["psnr"] != pytest.approx(plain["checkpoints"][-1]["psnr"], abs=1e-6)
    # the budget: the rigel run's MCMC budget, else its final count; --mcmc-cap wins
    sc = {"scene": "s", "runs": {"rigel": {"config": {"strategy": "mcmc", "max_gaussians": 777},
                                           "checkpoints": [{"num_gaussians": 500}]}}}
    assert real.gsplat_mcmc_cap(sc, None) == 777 and real.gsplat_mcmc_cap(sc, 9) == 9
    sc["runs"]["rigel"]["config"]["strategy"] = "default"
    assert real.gsplat_mcmc_cap(sc, None) == 500
    with pytest.raises(real.BenchError, match="--mcmc-cap"):
        real.gsplat_mcmc_cap({"scene": "s", "runs": {}}, None)


# ---- masks ----------------------------------------------------------------------------------------------------
def test_masked_loss_and_metrics(rng):
    h, w = 20, 24
    pred = torch.rand(h, w, 3, generator=rng)
    gt = torch.rand(h, w, 3, generator=rng)
    mask = torch.ones(h, w)
    mask[:, : w // 3] = 0  # the left third is invalid
    ones = torch.ones(h, w)
    valid = mask.bool().numpy()
    d = (pred - gt).numpy()[valid]
    assert torch.allclose(real.masked_l1(pred, gt, mask), torch.tensor(np.abs(d).mean(), dtype=torch.float32))
    p, _ = real.view_metrics(pred, gt, mask)
    assert p == pytest.approx(10 * math.log10(1.0 / (d ** 2).mean()), abs=1e-4)
    # a mask of ones is no mask
    assert torch.allclose(real.masked_ssim(pred, gt, ones), ssim(pred, gt), atol=1e-6)
    assert real.view_metrics(pred, gt, ones) == pytest.approx(real.view_metrics(pred, gt, None), abs=1e-5)
    # nothing under the invalid pixels counts: not in the loss, not in the metrics, no gradient
    pred2, gt2 = pred.clone(), gt.clone()
    pred2[~mask.bool()] = torch.rand(int((~mask.bool()).sum()), 3, generator=rng)
    gt2[~mask.bool()] = torch.rand(int((~mask.bool()).sum()), 3, generator=rng)
    assert real.view_metrics(pred2, gt2, mask) == pytest.approx(real.view_metrics(pred, gt, mask), abs=1e-6)
    x = pred.clone().requires_grad_(True)
    loss = real.train_loss(x, gt, mask, 0.2)
    assert torch.allclose(real.train_loss(pred2, gt2, mask, 0.2), loss.detach(), atol=1e-6)
    loss.backward()
    assert x.grad[~mask.bool()].abs().max() == 0 and x.grad[mask.bool()].abs().max() > 0
    # the unmasked loss is Trainer.compute_loss's formula
    assert torch.allclose(real.train_loss(pred, gt, None, 0.2),
                          0.8 * (pred - gt).abs().mean() + 0.2 * (1 - ssim(pred, gt)))


def test_evaluation_uses_frame_masks(rng):
    ds = sfm_dataset(rng, n=30, size=16, n_train=1, n_test=2)
    model = GaussianModel.from_points(torch.as_tensor(ds.points), torch.as_tensor(ds.point_colors), sh_degree=0)
    plain = real.evaluate_views(lambda f: render(model, f.camera).image, ds.test, "cpu")
    f = ds.test[0]
    f.mask = torch.zeros(16, 16)
    f.mask[4:12, 4:12] = 1
    masked = real.evaluate_views(lambda f: render(model, f.camera).image, ds.test, "cpu")
    pred = render(model, f.camera).image.detach().clamp(0, 1)
    assert masked["per_view"][0]["psnr"] == pytest.approx(real.view_metrics(pred, f.image, f.mask)[0], abs=1e-9)
    assert masked["per_view"][0]["psnr"] != pytest.approx(plain["per_view"][0]["psnr"], abs=1e-3)
    assert masked["per_view"][1] == plain["per_view"][1]  # the unmasked view is unchanged
    for other in (f.mask.bool(), (f.mask * 255).to(torch.uint8)):  # boolean and 0/255 masks mean the same
        f.mask = other
        again = real.evaluate_views(lambda f: render(model, f.camera).image, ds.test, "cpu")
        assert again["per_view"][0] == masked["per_view"][0]


# ---- options --------------------------------------------------------------------------------------------------
def test_options():
    assert real.parse_iters("30000,7000,7000") == [7000, 30000]
    for bad in ("", "0,5", "a"):
        with pytest.raises(real.BenchError, match="--iters"):
            real.parse_iters(bad)
    o = real.parse_overrides(["max_gaussians=None", "lambda_dssim=0", "random_background=true",
                              "init_box=(-1,-1,-1,1,1,1)", "appearance=mlp"])
    assert o == {"max_gaussians": None, "lambda_dssim": 0.0, "random_background": True,
                 "init_box": (-1, -1, -1, 1, 1, 1), "appearance": "mlp"}
    assert isinstance(o["lambda_dssim"], float)
    for bad, msg in (("nosuch=1", "no field 'nosuch'"), ("sh_degree", "key=value"), ("iterations=5", "--iters"),
                     ("random_background=maybe", "true or false")):
        with pytest.raises(real.BenchError, match=msg):
            real.parse_overrides([bad])
    with pytest.raises(real.BenchError, match="sh_degree"):
        real.rigel_config(10, 0, {"sh_degree": 7})
    cfg = real.rigel_config(10, 4, {"densify_from": 3})
    assert (cfg.iterations, cfg.eval_every, cfg.seed, cfg.densify_from) == (10, 0, 4, 3)


def test_scene_discovery(tmp_path, monkeypatch):
    monkeypatch.setenv("RIGEL_SHARED_DATA", str(tmp_path))
    with pytest.raises(real.BenchError, match="no such directory"):
        real.find_scenes(None)
    (tmp_path / "real" / "b").mkdir(parents=True)
    (tmp_path / "real" / "b" / "transforms.json").write_text("{}")
    (tmp_path / "real" / "a" / "sparse" / "0").mkdir(parents=True)
    (tmp_path / "real" / "a" / "sparse" / "0" / "cameras.txt").write_text("")
    (tmp_path / "real" / "notes").mkdir()
    assert real.find_scenes(None) == [("a", tmp_path / "real" / "a", ()), ("b", tmp_path / "real" / "b", ())]
    assert real.find_scenes(f"b,{tmp_path / 'real' / 'a'}") == [("b", tmp_path / "real" / "b", ()),
                                                                ("a", tmp_path / "real" / "a", ())]
    with pytest.raises(real.BenchError, match="nosuch"):
        real.find_scenes("nosuch")
    # variants: kept in the name (output files, tables), checked against VARIANTS, repeated ones once
    assert real.find_scenes("a~nosfm~halfres~nosfm,b") == [("a~nosfm~halfres", tmp_path / "real" / "a",
                                                            ("nosfm", "halfres")), ("b", tmp_path / "real" / "b", ())]
    with pytest.raises(real.BenchError, match="unknown variant 'blur'"):
        real.find_scenes("a~blur")
    # the suite: its entries whose capture exists here (none of bonsai, fern, beer, fox: refused), else those
    with pytest.raises(real.BenchError, match="suite"):
        real.find_scenes("suite")
    for name in ("fern", "fox"):
        (tmp_path / "real" / name).mkdir()
        (tmp_path / "real" / name / "transforms.json").write_text("{}")
    got = real.find_scenes("suite")
    assert [n for n, _, _ in got] == [i for i in real.SUITE if i.split("~")[0] in ("fern", "fox")]
    assert "fern~nosfm" in [n for n, _, _ in got] and all(set(v) <= set(real.VARIANTS) for _, _, v in got)


def test_variants_change_what_they_name_only(rng):
    ds = sfm_dataset(rng, n=30, size=16, n_train=17, n_test=2)
    train, test, center, extent = list(ds.train), list(ds.test), ds.scene_center.copy(), ds.scene_extent
    real.apply_variants(ds, ())
    assert ds.train == train and ds.points is not None
    real.apply_variants(ds, ("halfviews",))
    assert ds.train == train[::2] and ds.test == test and ds.points is not None
    ds.train = list(train)
    real.apply_variants(ds, ("fewviews", "nosfm"))
    assert ds.train == train[::8] and ds.test == test and ds.points is None and ds.point_colors is None
    assert np.array_equal(ds.scene_center, center) and ds.scene_extent == extent  # the same scene


# ---- the command line -----------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def procedural(tmp_path_factory):
    from rigel_core.data import make_dataset

    d = tmp_path_factory.mktemp("data") / "real" / "proc"
    make_dataset(d, 300, 24, 24, n_train=5, n_test=2, seed=int(torch.randint(0, 1000, (1,))), device="cpu",
                 progress=False)
    return d


@pytest.mark.parametrize("stream", [False, True], ids=["preloaded", "streamed"])
def test_opaque_variant_drops_alpha_and_keeps_the_composited_image(procedural, stream):
    """``~opaque``: an object on a plain backdrop photographed without alpha. Every frame keeps its camera, name and
    composited image to the bit, and has no alpha — so the strategy rules read a photo capture (the trainer's
    transparency share is 0) — streamed frames as well as preloaded ones; a frame without alpha is left as it is."""
    from rigel_core.data import load_dataset
    from rigel_core.train.trainer import capture_facts

    ds = load_dataset(procedural, stream=stream)
    before = {id(f): (f.camera, f.name, f.image.clone()) for f in ds.train + ds.test}
    assert all(f.alpha is not None for f in ds.train + ds.test)  # the procedural capture is RGBA
    assert capture_facts(ds.train).transparent > 0.05
    order = [id(f) for f in ds.train], [id(f) for f in ds.test]
    bare = Frame(ds.train[0].camera, ds.train[0].image.clone(), None, "bare")
    ds.train.append(bare)
    real.apply_variants(ds, ("opaque",))
    assert ds.train[-1] is bare
    for frames, ids in zip((ds.train[:-1], ds.test), order):
        assert len(frames) == len(ids)
        for f, i in zip(frames, ids):
            cam, name, image = before[i]
            assert f.alpha is None and f.camera == cam and f.name == name and torch.equal(f.image, image)
    assert capture_facts(ds.train).transparent == 0


CLI = ["--device", "cpu", "--iters", "4,8", "--rigel-config", "init_points=200", "sh_degree=1"]
COLUMNS = ["scene", "method", "iters", "PSNR", "SSIM", "N", "train s", "peak GiB", "time ratio rigel/gsplat",
           "ΔPSNR rigel − gsplat", "time ratio rigel/gsplat-mcmc", "ΔPSNR rigel − gsplat-mcmc"]


def table_rows(md: str) -> tuple[list[str], list[list[str]]]:
    """(header, rows) of the first markdown table in ``md``."""
    def is_row(line):
        return line.startswith("|")

    lines = list(itertools.takewhile(is_row, itertools.dropwhile(lambda line: not is_row(line), md.splitlines())))
    cells = [[c.strip() for c in line.strip("|").split("|")] for line in lines]
    return cells[0], cells[2:]


def check_time_to_peer(out: Path, method: str = "rigel", peer: str = "gsplat") -> None:
    """real.json's time_to_peer_psnr and real.md's "Time to the gsplat loop's PSNR" row against the runs' own
    checkpoints (issue 39): the peer's last PSNR, the first checkpoint of ``method`` at or above it."""
    sc = json.loads((out / "real.json").read_text())["scenes"][0]
    rig, gsp = sc["runs"][method]["checkpoints"], sc["runs"][peer]["checkpoints"]
    target = gsp[-1]
    hit = [c for c in rig if c["psnr"] >= target["psnr"]][:1]
    t = next(t for t in sc["time_to_peer_psnr"] if (t["method"], t["peer"]) == (method, peer))
    assert (t["peer_iteration"], t["peer_psnr"], t["peer_train_s"]) == (target["iteration"], target["psnr"],
                                                                        target["train_s"])
    assert t["reached"] == bool(hit) and t["last_iteration"] == rig[-1]["iteration"]
    md = (out / "real.md").read_text()
    head, rows = table_rows(md.split("## Time to the gsplat loop's PSNR")[1])
    assert head[:4] == ["scene", "method", "peer", "peer's last it"]
    row = next(r for r in rows if (r[1], r[2]) == (method, peer))
    assert float(row[4]) == pytest.approx(target["psnr"], abs=0.006)
    if hit:
        assert (t["iteration"], t["train_s"]) == (hit[0]["iteration"], hit[0]["train_s"])
        assert t["time_ratio"] == pytest.approx(hit[0]["train_s"] / target["train_s"])
        assert row[6] == f"it {hit[0]['iteration']:,}" and float(row[9]) == pytest.approx(t["time_ratio"], abs=0.006)
    else:
        assert t["iteration"] is None and row[6].startswith(f"not reached by it {rig[-1]['iteration']:,}")
    line = (out / "summary.txt").read_text()
    assert f"{peer}'s {target['psnr']:.2f} dB (it {target['iteration']}," in line
    assert (f"reached by rigel at it {hit[0]['iteration']}," if hit else "not reached by it") in line


def test_time_to_peer_psnr_on_hand_made_curves():
    """rigel's first checkpoint at or above the peer's PSNR at the peer's last checkpoint (issue 39)."""
    gsp = [(1000, 22.0, 10.0), (2000, 24.0, 20.0), (3000, 23.5, 40.0)]  # the target: 23.5 dB (its last, not best)
    first = real.time_to_psnr([(1000, 23.6, 4.0), (2000, 25.0, 8.0), (3000, 26.0, 12.0)], gsp)
    assert first == {"peer_iteration": 3000, "peer_psnr": 23.5, "peer_train_s": 40.0, "reached": True,
                     "iteration": 1000, "psnr": 23.6, "train_s": 4.0, "time_ratio": 0.1, "last_iteration": 3000,
                     "best_psnr": 26.0}
    # in the middle, and the first that reaches it even when a later one dips below again; unsorted input
    mid = real.time_to_psnr([(3000, 23.0, 30.0), (1000, 20.0, 5.0), (2000, 23.7, 15.0)], gsp[::-1])
    assert (mid["reached"], mid["iteration"], mid["psnr"], mid["train_s"]) == (True, 2000, 23.7, 15.0)
    assert mid["time_ratio"] == pytest.approx(15.0 / 40.0) and mid["last_iteration"] == 3000
    # equal PSNR counts as reached
    eq = real.time_to_psnr([(1000, 23.4999, 5.0), (2000, 23.5, 50.0)], gsp)
    assert (eq["iteration"], eq["time_ratio"]) == (2000, 1.25)
    # never: the last iteration and the best PSNR reached instead; rigel's unevaluated checkpoint skipped
    never = real.time_to_psnr([(1000, 21.0, 5.0), (2000, None, 9.0), (3000, 23.4, 14.0)], gsp)
    assert never["reached"] is False and never["iteration"] is None and never["time_ratio"] is None
    assert (never["last_iteration"], never["best_psnr"]) == (3000, 23.4)
    assert real.reached_text(never) == "not reached by it 3,000 (best 23.40 dB)"
    assert real.reached_text(first) == "it 1,000"
    # a gsplat run stopped early (time limit / Ctrl-C): the target is its last evaluated checkpoint
    stopped = real.time_to_psnr([(1000, 21.0, 5.0), (2000, 22.5, 9.0)], [(1000, 22.0, 10.0), (1437, 22.4, 12.5)])
    assert (stopped["peer_iteration"], stopped["peer_psnr"], stopped["iteration"]) == (1437, 22.4, 2000)
    assert stopped["time_ratio"] == pytest.approx(9.0 / 12.5)
    # a rigel run stopped before any checkpoint; a peer without PSNR (no held-out views) or without a run
    none = real.time_to_psnr([], gsp)
    assert none["reached"] is False and none["last_iteration"] is None and none["best_psnr"] is None
    assert real.reached_text(none) == "not reached (no checkpoint)"
    assert real.time_to_psnr([(1000, 30.0, 1.0)], [(1000, 20.0, 1.0), (2000, None, 2.0)]) is None
    assert real.time_to_psnr([(1000, 30.0, 1.0)], []) is None
    assert real.time_to_psnr([(1000, 30.0, 1.0)], [(1000, 20.0, 0.0)])["time_ratio"] is None
    # a diverged run's NaN: no target from a NaN peer; a NaN rigel checkpoint neither reaches nor is the best
    nan = float("nan")
    assert real.time_to_psnr([(1000, 30.0, 1.0)], [(1000, 20.0, 1.0), (2000, nan, 2.0)]) is None
    for curve_ in ([(1000, nan, 1.0), (2000, 22.0, 2.0)], [(2000, 22.0, 2.0), (1000, nan, 1.0)]):
        t = real.time_to_psnr(curve_, gsp)
        assert t["reached"] is False and t["best_psnr"] == 22.0 and "nan" not in real.reached_text(t)
    # two peer checkpoints at one iteration: the one recorded last, whatever the PSNRs
    a = real.time_to_psnr([(1000, 25.0, 1.0)], [(2000, 24.0, 2.0), (2000, 26.0, 3.0)])
    b = real.time_to_psnr([(1000, 25.0, 1.0)], [(2000, 26.0, 3.0), (2000, 24.0, 2.0)])
    assert (a["peer_psnr"], a["reached"], b["peer_psnr"], b["reached"]) == (26.0, False, 24.0, True)


def test_time_to_peer_psnr_per_scene_record():
    """Every rigel method against every gsplat loop that measured, in real.md's table and summary.txt's line;
    skipped and failed runs give no row."""
    def run(*pts, **kw):
        return {"checkpoints": [{"iteration": i, "psnr": p, "train_s": t, "ssim": 0.5, "num_gaussians": 10,
                                 "peak_gib": None} for i, p, t in pts], **kw}

    sc = {"scene": "s", "runs": {"rigel": run((100, 20.0, 1.0), (200, 25.0, 2.0)), "rigel-mcmc": run((100, 26.0, 3.0)),
                                 "gsplat": run((100, 21.0, 4.0), (150, 24.0, 8.0), stopped_at=150,
                                               stop_reason="interrupted"),
                                 "gsplat-mcmc": {"skipped": "no CUDA"}}}
    got = real.times_to_peer_psnr(sc)
    assert [(t["method"], t["peer"], t["iteration"], t["time_ratio"]) for t in got] == [
        ("rigel", "gsplat", 200, 0.25), ("rigel-mcmc", "gsplat", 100, 0.375)]
    meta = {"methods": list(real.METHODS), "device_name": "CPU", "date": "d", "commit": "c", "torch": "t",
            "gsplat": None, "downscale": 1, "rigel_config": {}}
    _, rows = table_rows(real.markdown({"meta": meta, "scenes": [sc]}).split("## Time to the gsplat loop's PSNR")[1])
    assert rows == [["s", "rigel", "gsplat", "150 (stopped: interrupted)", "24.00", "8.0", "it 200", "25.00", "2.0",
                     "0.25"],
                    ["s", "rigel-mcmc", "gsplat", "150 (stopped: interrupted)", "24.00", "8.0", "it 100", "26.00",
                     "3.0", "0.38"]]
    assert (" | gsplat's 24.00 dB (it 150, 8.0 s) reached by rigel at it 200, 2.0 s, time ratio 0.25 | "
            in real.summary_line(sc))
    sc["runs"]["rigel"] = run((100, 20.0, 1.0), stopped_at=100, stop_reason="time limit 1 s")
    _, rows = table_rows(real.markdown({"meta": meta, "scenes": [sc]}).split("## Time to the gsplat loop's PSNR")[1])
    assert rows[0][6:] == ["not reached by it 100 (best 20.00 dB) (stopped: time limit 1 s)", "-", "-", "-"]
    assert " | gsplat's 24.00 dB (it 150, 8.0 s): not reached by it 100 (best 20.00 dB) | " in real.summary_line(sc)
    sc["runs"]["gsplat"] = {"error": "boom"}
    assert real.times_to_peer_psnr(sc) == []
    assert real.peer_psnr_table({"scenes": [sc]}) == []


def test_cli_rigel_only_when_gsplat_is_missing(procedural, tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "gsplat", None)  # import gsplat → ImportError, whatever is installed
    monkeypatch.setenv("RIGEL_SHARED_DATA", str(procedural.parents[1]))
    before = sorted(p.name for p in procedural.rglob("*"))
    out = tmp_path / "out"
    assert real.main(CLI + ["--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "gsplat half skipped: gsplat not importable" in printed
    assert sum("[proc] rigel" in line and " it " in line for line in printed.splitlines()) == 2  # one per evaluation
    head, rows = table_rows((out / "real.md").read_text())
    assert head == COLUMNS
    assert [(r[0], r[1], r[2]) for r in rows] == [("proc", "rigel", "4"), ("proc", "rigel", "8")]
    assert all(float(r[3]) > 0 and 0 < float(r[4]) <= 1 and int(r[5].replace(",", "")) > 0 for r in rows)
    res = json.loads((out / "real.json").read_text())
    sc = res["scenes"][0]
    assert sc["runs"]["gsplat"]["skipped"].startswith("gsplat not importable")
    assert "skipped — gsplat not importable" in (out / "real.md").read_text()
    assert sc["n_train"] == 5 and sc["n_test"] == 2 and sc["initial_gaussians"] == 200
    assert res["meta"]["rigel_config"] == {"init_points": 200, "sh_degree": 1}
    assert sc["runs"]["rigel"]["config"]["init_points"] == 200
    # the run's config as trained ("auto" resolved: random points here, so 3DGS's densification), named in real.md
    assert sc["runs"]["rigel"]["config"]["strategy"] == "default"
    assert "- proc rigel: densification default (3DGS's clone / split / prune, threshold 0.0002)" in \
        (out / "real.md").read_text()
    # the wide Gaussians at each checkpoint, as shape_stats counts them on the run's model
    ck = sc["runs"]["rigel"]["checkpoints"]
    assert all(0.0 <= c["wide_share"] <= 1.0 and c["median_scale"] > 0 for c in ck)
    assert (f"- proc rigel: Gaussians wider than 0.1 × the scene extent at it 4: {100 * ck[0]['wide_share']:.1f} %"
            in (out / "real.md").read_text())
    assert all(0.0 <= c["faint_share"] <= 1.0 and 0 < c["median_opacity"] < 1 for c in ck)
    assert (f"- proc rigel: Gaussians fainter than 0.027 at it 4: {100 * ck[0]['faint_share']:.1f} % (median "
            f"opacity {ck[0]['median_opacity']:.3f})" in (out / "real.md").read_text())
    from PIL import Image

    im = Image.open(out / sc["png"])
    assert sc["png_panels"] == ["gt", "rigel"] and im.size == (24 * 2 + 2, 24)
    assert (out / "summary.txt").read_text().startswith("proc: rigel it 8 ")
    assert "Time to the gsplat loop's PSNR" not in (out / "real.md").read_text() and sc["time_to_peer_psnr"] == []
    assert sorted(p.name for p in procedural.rglob("*")) == before  # nothing written into the dataset
    # no run is overwritten
    assert real.main(CLI + ["--out", str(out)]) == 2
    assert "exists" in capsys.readouterr().err


def test_cli_rigel_streams_its_images_as_rigel_train_does(procedural, tmp_path, monkeypatch, capsys):
    """--frames stream (the default, rigel-train's) trains rigel from a streamed dataset, --frames preload from
    the preloaded one; on the CPU the two runs are the same run (streamed frames are the preloaded ones bit for
    bit), so every checkpoint's PSNR is equal, and real.json says which way each run read its images."""
    monkeypatch.setitem(sys.modules, "gsplat", None)
    psnr, frames = {}, {}
    for mode in ("stream", "preload"):
        out = tmp_path / mode
        argv = CLI + ["--scenes", str(procedural), "--out", str(out), "--methods", "rigel"]
        assert real.main(argv + (["--frames", mode] if mode == "preload" else [])) == 0
        res = json.loads((out / "real.json").read_text())
        run = res["scenes"][0]["runs"]["rigel"]
        psnr[mode] = [c["psnr"] for c in run["checkpoints"]]
        frames[mode] = run["frames"]
        assert res["meta"]["frames"] == mode
    capsys.readouterr()
    assert frames["stream"]["streamed"] is True and frames["stream"]["loads"] > 0
    assert frames["preload"] == {"streamed": False}
    assert psnr["stream"] == psnr["preload"] and len(psnr["stream"]) == 2


def test_cli_both_methods_with_a_stand_in_gsplat(procedural, tmp_path, fake_gsplat, monkeypatch, capsys):
    monkeypatch.setattr(real, "gsplat_status", lambda device: (True, None))  # the stand-in runs on the CPU
    out = tmp_path / "out"
    assert real.main(CLI + ["--scenes", str(procedural), "--out", str(out), "--methods", "gsplat,rigel"]) == 0
    head, rows = table_rows((out / "real.md").read_text())
    assert [(r[1], r[2]) for r in rows] == [("rigel", "4"), ("rigel", "8"), ("gsplat", "4"), ("gsplat", "8")]
    res = json.loads((out / "real.json").read_text())
    runs = res["scenes"][0]["runs"]
    for i, r in enumerate(rows[:2]):
        g, c = runs["gsplat"]["checkpoints"][i], runs["rigel"]["checkpoints"][i]
        assert float(r[8]) == pytest.approx(c["train_s"] / g["train_s"], abs=0.006)
        assert float(r[9]) == pytest.approx(c["psnr"] - g["psnr"], abs=0.006)
    assert rows[2][8] == rows[2][9] == "-"
    assert res["scenes"][0]["png_panels"] == ["gt", "gsplat", "rigel"]
    assert "time ratio" in (out / "summary.txt").read_text()
    check_time_to_peer(out)
    # --time-limit stops each run early and says where
    out2 = tmp_path / "out2"
    assert real.main(CLI + ["--scenes", str(procedural), "--out", str(out2), "--time-limit", "1e-9"]) == 0
    res = json.loads((out2 / "real.json").read_text())
    for r in res["scenes"][0]["runs"].values():
        assert r["stopped_at"] == 1 and [c["iteration"] for c in r["checkpoints"]] == [1]
    assert "1 (stopped: time limit" in (out2 / "real.md").read_text()
    check_time_to_peer(out2)  # both stopped at iteration 1: the target is the gsplat loop's there
    _, rows = table_rows((out2 / "real.md").read_text().split("## Time to the gsplat loop's PSNR")[1])
    assert rows[0][3].startswith("1 (stopped: time limit")


def test_cli_gsplat_mcmc_column(procedural, tmp_path, fake_gsplat, monkeypatch, capsys):
    """--methods gsplat-mcmc runs after rigel (whatever the order given) at the rigel run's budget, and rigel's rows
    carry the time ratio and ΔPSNR against it; a variant scene keeps its name in the table."""
    monkeypatch.setattr(real, "gsplat_status", lambda device: (True, None))
    out = tmp_path / "out"
    assert real.main(CLI + ["--scenes", f"{procedural}~halfviews", "--out", str(out),
                            "--methods", "gsplat-mcmc,gsplat,rigel"]) == 0
    head, rows = table_rows((out / "real.md").read_text())
    assert head == COLUMNS
    assert [(r[0], r[1]) for r in rows[::2]] == [("proc~halfviews", m) for m in ("rigel", "gsplat", "gsplat-mcmc")]
    res = json.loads((out / "real.json").read_text())
    sc = res["scenes"][0]
    assert sc["n_train"] == 3 and sc["variants"] == ["halfviews"]  # 5 training views, every other one
    runs = sc["runs"]
    assert FakeMCMCStrategy.instances[-1].cap_max == runs["rigel"]["checkpoints"][-1]["num_gaussians"]
    for i, r in enumerate(rows[:2]):
        g, c = runs["gsplat-mcmc"]["checkpoints"][i], runs["rigel"]["checkpoints"][i]
        assert float(r[10]) == pytest.approx(c["train_s"] / g["train_s"], abs=0.006)
        assert float(r[11]) == pytest.approx(c["psnr"] - g["psnr"], abs=0.006)
    assert "vs gsplat-mcmc at 8" in (out / "summary.txt").read_text()
    check_time_to_peer(out, peer="gsplat")
    check_time_to_peer(out, peer="gsplat-mcmc")
    assert FakeMCMCStrategy.instances[-1].noise_lr == 5e5  # rigel in world units: gsplat's own number
    # rigel's length unit reaches the peer: --rigel-config mcmc_units=cameras gives it noise_lr / L²
    out2 = tmp_path / "cams"
    assert real.main(CLI + ["--scenes", str(procedural), "--out", str(out2), "--methods", "rigel,gsplat-mcmc",
                            "--rigel-config", "mcmc_units=cameras"]) == 0
    extent = json.loads((out2 / "real.json").read_text())["scenes"][0]["extent"]
    assert FakeMCMCStrategy.instances[-1].noise_lr == pytest.approx(5e5 / (extent / 1.1) ** 2, rel=1e-3)


def test_cli_mcmc_vs_default_at_equal_counts(procedural, tmp_path, capsys):
    out = tmp_path / "out"
    grow = ["densify_from=1", "densify_interval=2", "grad_threshold=1e-7"]
    assert real.main(CLI + grow + ["--scenes", str(procedural), "--out", str(out), "--methods", "rigel-mcmc,rigel",
                                   "--mcmc-config", "mcmc_growth=1.0"]) == 0
    res = json.loads((out / "real.json").read_text())
    runs = res["scenes"][0]["runs"]
    assert res["meta"]["methods"] == ["rigel", "rigel-mcmc"]  # the default run first: its count is the budget
    cap = runs["rigel"]["checkpoints"][-1]["num_gaussians"]
    assert cap > 200  # the default densification grew
    cfg = runs["rigel-mcmc"]["config"]
    assert (cfg["strategy"], cfg["max_gaussians"], cfg["mcmc_growth"]) == ("mcmc", cap, 1.0)
    assert runs["rigel"]["config"]["strategy"] == "default" and runs["rigel"]["config"]["mcmc_growth"] == 0.05
    assert runs["rigel-mcmc"]["checkpoints"][-1]["num_gaussians"] == cap
    md = (out / "real.md").read_text()
    table = md.split("## MCMC budget vs default")[1]
    head, rows = table_rows(table)
    assert head[:5] == ["scene", "iters", "PSNR default", "PSNR MCMC", "ΔPSNR MCMC − default"]
    assert [r[1] for r in rows] == ["4", "8"]
    for r, a, b in zip(rows, runs["rigel"]["checkpoints"], runs["rigel-mcmc"]["checkpoints"]):
        assert float(r[4]) == pytest.approx(b["psnr"] - a["psnr"], abs=0.006)
        assert (int(r[7].replace(",", "")), int(r[8].replace(",", ""))) == (a["num_gaussians"], b["num_gaussians"])
    assert "mcmc vs default at 8" in (out / "summary.txt").read_text()
    # the MCMC run records its dead share and the relocations' churn at each checkpoint, the notes say them
    mc = runs["rigel-mcmc"]["checkpoints"]
    assert all(0 <= c["dead_share"] <= 1 for c in mc)
    assert any("relocated_share" in c for c in mc) and all(0 <= c.get("relocated_share", 0) <= 1 for c in mc)
    assert re.search(r"\n- \S+ rigel-mcmc: Gaussians at or under MCMC's dead bound 0.005 at it 4: [0-9.]+ % \(each "
                     r"relocation step since the last checkpoint moved [0-9.]+ %\), 8: ", md)
    assert not re.search(r"\n- \S+ rigel: Gaussians at or under", md)  # 3DGS's densification relocates nothing
    assert "rigel-mcmc: budget" in capsys.readouterr().out
    # rigel-mcmc alone needs a budget; a bad MCMC override fails before any training
    assert real.main(CLI + ["--scenes", str(procedural), "--out", str(tmp_path / "o2"), "--methods",
                            "rigel-mcmc"]) == 2
    assert "--mcmc-cap" in capsys.readouterr().err
    assert real.main(CLI + ["--scenes", str(procedural), "--out", str(tmp_path / "o3"), "--methods", "rigel,rigel-mcmc",
                            "--mcmc-config", "mcmc_growth=-1"]) == 2
    assert "mcmc_growth" in capsys.readouterr().err and not (tmp_path / "o3").exists()


def test_merge_separate_runs(procedural, tmp_path, fake_gsplat, monkeypatch, capsys):
    monkeypatch.setattr(real, "gsplat_status", lambda device: (True, None))
    a, b, m = tmp_path / "a", tmp_path / "b", tmp_path / "m"
    common = CLI + ["--scenes", str(procedural)]
    assert real.main(common + ["--out", str(a), "--methods", "rigel"]) == 0
    assert real.main(common + ["--out", str(b), "--methods", "gsplat"]) == 0
    assert real.main(["--merge", str(a), str(b), "--out", str(m)]) == 0
    head, rows = table_rows((m / "real.md").read_text())
    assert [(r[1], r[2]) for r in rows] == [("rigel", "4"), ("rigel", "8"), ("gsplat", "4"), ("gsplat", "8")]
    ra, rb = (json.loads((d / "real.json").read_text())["scenes"][0]["runs"] for d in (a, b))
    c, g = ra["rigel"]["checkpoints"][1], rb["gsplat"]["checkpoints"][1]
    assert float(rows[1][8]) == pytest.approx(c["train_s"] / g["train_s"], abs=0.006)
    assert float(rows[1][9]) == pytest.approx(c["psnr"] - g["psnr"], abs=0.006)
    res = json.loads((m / "real.json").read_text())
    assert res["meta"]["methods"] == ["rigel", "gsplat"] and res["meta"]["merged_from"] == [str(a), str(b)]
    for d in (a, b):  # each run alone has no pair; the merge has the joined runs' row
        assert json.loads((d / "real.json").read_text())["scenes"][0]["time_to_peer_psnr"] == []
    check_time_to_peer(m)
    from PIL import Image

    sc = res["scenes"][0]
    assert sc["png_panels"] == ["gt", "rigel", "gsplat"]
    merged = np.asarray(Image.open(m / sc["png"]))
    assert merged.shape == (24, 3 * 24 + 4, 3)
    for d, col in ((a, 1), (b, 2)):  # each method's panel is the one its own run saved
        own = np.asarray(Image.open(d / sc["png"]))
        assert np.array_equal(merged[:, col * 26: col * 26 + 24], own[:, 26:50])
        assert np.array_equal(merged[:, :24], own[:, :24])
    # the same method twice, a different protocol, an existing output: one line each, nothing written
    c2 = tmp_path / "c"
    assert real.main(["--merge", str(a), str(a), "--out", str(c2)]) == 2
    assert "rigel measured in two" in capsys.readouterr().err
    assert real.main(CLI[:3] + ["4"] + CLI[4:] + ["--scenes", str(procedural), "--out", str(c2 / "x"),
                                                  "--methods", "gsplat"]) == 0
    assert real.main(["--merge", str(a), str(c2 / "x"), "--out", str(c2 / "y")]) == 2
    assert "iters = [4] differs" in capsys.readouterr().err
    assert real.main(["--merge", str(a), str(b), "--out", str(m)]) == 2
    assert "exists" in capsys.readouterr().err


def test_cli_a_failing_run_costs_only_itself(procedural, tmp_path, fake_gsplat, monkeypatch, capsys):
    monkeypatch.setattr(real, "gsplat_status", lambda device: (True, None))
    warm = sys.modules["gsplat"].rasterization

    def broken(*a, **kw):  # the warm-up (64×64) passes, the training call fails
        if a[7] != 64:
            raise RuntimeError("boom")
        return warm(*a, **kw)

    monkeypatch.setattr(sys.modules["gsplat"], "rasterization", broken)
    out = tmp_path / "out"
    assert real.main(CLI + ["--scenes", str(procedural), "--out", str(out), "--methods", "gsplat,rigel"]) == 0
    md = (out / "real.md").read_text()
    _, rows = table_rows(md)
    assert [(r[1], r[2]) for r in rows] == [("rigel", "4"), ("rigel", "8")]
    assert "- proc gsplat: failed — RuntimeError: boom" in md
    assert "gsplat failed (RuntimeError: boom)" in (out / "summary.txt").read_text()
    assert "RuntimeError: boom" in capsys.readouterr().err  # the traceback, for the log


def test_driver_times_training_only_and_stops_cleanly():
    import time as _time

    frames = [Frame(orbit(1, 8)[0], torch.full((8, 8, 3), 0.5), None, "t0")]
    done, spent = [], []

    def step(it):
        t = _time.perf_counter()
        _time.sleep(0.01)
        done.append(it)
        spent.append(_time.perf_counter() - t)

    def render(f):
        _time.sleep(0.05)  # evaluation is slow: it must not count as training
        return torch.full((8, 8, 3), 0.25)

    res = real.train_and_evaluate("toy", step, render, lambda: 7, frames, [3, 6], None, torch.device("cpu"))
    assert done == list(range(1, 7)) and [c["iteration"] for c in res["checkpoints"]] == [3, 6]
    c3, c6 = res["checkpoints"]
    # the steps' own time, not the evaluations' (≥ 0.05 s each); the loop adds microseconds
    assert c3["train_s"] == pytest.approx(sum(spent[:3]), abs=5e-3)
    assert c6["train_s"] == pytest.approx(sum(spent), abs=5e-3), (c6["train_s"], sum(spent))
    assert c3["eval_s"] >= 0.05 and c3["psnr"] == pytest.approx(10 * math.log10(1 / 0.0625))
    assert c3["num_gaussians"] == 7 and res["stopped_at"] is None and not res["interrupted"]
    assert res["first_view"].shape == (8, 8, 3) and res["first_view"][0, 0, 0] == 64
    assert "train_psnr" not in c3  # no training views given: none scored

    # training views, given, are scored at each checkpoint (their own error, not the held-out one), outside the time
    seen = [Frame(orbit(1, 8)[0], torch.full((8, 8, 3), 0.75), None, "s0")]
    spent.clear()
    res = real.train_and_evaluate("toy", step, render, lambda: 7, frames, [2], None, torch.device("cpu"),
                                  train_frames=seen)
    c2 = res["checkpoints"][0]
    assert c2["psnr"] == pytest.approx(10 * math.log10(1 / 0.0625))
    assert c2["train_psnr"] == pytest.approx(10 * math.log10(1 / 0.25)) and c2["eval_s"] >= 0.1
    assert c2["train_s"] == pytest.approx(sum(spent), abs=5e-3)

    def interrupted_step(it):
        if it == 5:
            raise KeyboardInterrupt
    res = real.train_and_evaluate("toy", interrupted_step, render, lambda: 7, frames, [2, 9], None,
                                  torch.device("cpu"))
    assert res["interrupted"] and res["stopped_at"] == 5 and res["stop_reason"] == "interrupted"
    assert [c["iteration"] for c in res["checkpoints"]] == [2, 5]


def test_spaced_takes_evenly_spaced_frames_and_loads_streamed_ones():
    class Lazy:
        def __init__(self, i):
            self.i = i

        def load(self):
            return ("loaded", self.i)

    assert real.spaced(range(20), 5) == [0, 5, 10, 14, 19]
    assert real.spaced(range(3), 8) == [0, 1, 2] and real.spaced(range(9), 1) == [0] and real.spaced(range(9), 0) == []
    assert real.spaced([Lazy(i) for i in range(4)], 2) == [("loaded", 0), ("loaded", 3)]


def test_sweep_table_has_the_training_view_column_where_runs_scored_them(tmp_path, monkeypatch):
    """bench/real_sweep.py's table: PSNR per seed and, where the runs recorded it (bench/real.py's ``train_psnr``),
    the training views' PSNR per seed; a run without it shows a dash. The runs are faked: each writes the real.json
    bench/real.py would."""
    from bench import real_sweep

    def fake_run(cmd, stdout=None, stderr=None):
        out = Path(cmd[cmd.index("--out") + 1])
        seed = int(cmd[cmd.index("--seed") + 1])
        ck = {"psnr": 20.0 + seed + (0.5 if "b" in out.name.split("-")[0] else 0.0), "ssim": 0.5,
              "num_gaussians": 100, "train_s": 1.0}
        if seed == 0:
            ck["train_psnr"] = 30.0 + seed
        else:
            ck["wide_share"], ck["faint_share"] = 0.25, 0.125
        cps = [ck]
        if seed == 1:  # an earlier checkpoint too: the faint share's and the dead share's paths show
            ck["dead_share"] = 0.25
            cps = [{**ck, "faint_share": 0.5, "iteration": 3000, "dead_share": 0.375, "relocated_share": 0.125}, ck]
        out.mkdir(parents=True)
        (out / "real.json").write_text(json.dumps({"scenes": [{"runs": {"rigel": {"checkpoints": cps}}}]}))
        return subprocess.CompletedProcess(cmd, 0)

    monkeypatch.setattr(real_sweep.subprocess, "run", fake_run)
    assert real_sweep.main(["--scenes", "fern", "--seeds", "0,1", "--variant", "a", "--variant", "b=x=1",
                            "--parallel", "1", "--out", str(tmp_path / "s")]) == 0
    md = (tmp_path / "s" / "sweep.md").read_text()
    assert ("training-view PSNR per seed | % wider than 0.1 extent per seed | % fainter than 0.027 per seed | "
            "% fainter than 0.027 at each checkpoint per seed | % dead (% a relocation step moved) at each checkpoint "
            "per seed |" in md)
    assert ("| fern | a | 20.00 / 21.00 | 20.50 |  | 100 | 1.0 | 30.00 / — | — / 25.00 | — / 12.50 | — / 50 → 12 | "
            "— / 38 (12) → 25 |" in md)
    assert ("| fern | b | 20.50 / 21.50 | 21.00 | +0.50 [+0.50, +0.50] | 100 | 1.0 | 30.00 / — | — / 25.00 | "
            "— / 12.50 | — / 50 → 12 | — / 38 (12) → 25 |" in md)


def test_shape_stats_count_the_wide_gaussians_and_their_opacity(rng):
    """bench/real.py's ``shape_stats`` against counts made by hand: Gaussians drawn on either side of the wide
    bound (largest of three scales), with known opacities; non-finite rows left out; an empty model gives Nones."""
    extent = 2.0 + 5 * float(torch.rand(1, generator=rng))
    n_wide, n_thin = 7 + int(torch.randint(0, 20, (1,), generator=rng)), 30
    bound = real.WIDE_SHARE_OF_EXTENT * extent
    thin = bound * (0.05 + 0.9 * torch.rand(n_thin, 3, generator=rng))
    wide = bound * (0.05 + 0.9 * torch.rand(n_wide, 3, generator=rng))
    wide[torch.arange(n_wide), torch.randint(0, 3, (n_wide,), generator=rng)] = bound * (1.01 + torch.rand(n_wide,
                                                                                                     generator=rng))
    opac = torch.rand(n_thin + n_wide, generator=rng) * 0.98 + 0.01
    opac[::3] = 0.001 + 0.04 * torch.rand(opac[::3].shape, generator=rng)  # about half of them faint
    log_scales = torch.log(torch.cat([thin, wide]))
    logits = torch.logit(opac)
    bad = torch.tensor([[math.nan, 0.0, 0.0]])  # a culled Gaussian: left out
    st = real.shape_stats(torch.cat([log_scales, bad]), torch.cat([logits, torch.tensor([0.0])]), extent)
    assert st["wide_share"] == pytest.approx(n_wide / (n_thin + n_wide), rel=1e-6)
    assert st["wide_opacity"] == pytest.approx(float(opac[n_thin:].mean()), rel=1e-5)
    largest = torch.cat([thin, wide]).amax(1)
    assert st["median_scale"] == pytest.approx(float(largest.median()) / extent, rel=1e-5)
    assert 0 < st["faint_share"] < 1
    assert st["faint_share"] == pytest.approx(float((opac < real.FAINT_OPACITY).float().mean()), rel=1e-6)
    assert st["median_opacity"] == pytest.approx(float(opac.median()), rel=1e-5)
    # the faint bound is where the default noise gate passes a tenth of the noise
    cfg = TrainConfig()
    assert 1 / (1 + math.exp(cfg.mcmc_noise_k * (real.FAINT_OPACITY - cfg.mcmc_noise_t))) == pytest.approx(0.1)
    none = real.shape_stats(log_scales[:n_thin], logits[:n_thin], extent)
    assert none["wide_share"] == 0.0 and none["wide_opacity"] is None
    assert real.shape_stats(torch.empty(0, 3), torch.empty(0), extent)["wide_share"] is None


def test_sweep_run_names_are_plain():
    """bench/real_sweep.py names each run's folder and log so that the GPU machine's tool returns them: a derived
    capture's '~' becomes '.', distinct captures stay distinct."""
    from bench import real_sweep

    names = {real_sweep.run_tag("b500", sc, 1) for sc in (".data/real/fox~halfviews", "fox", "bonsai~nosfm~halfres",
                                                            "/abs/path/bonsai~nosfm")}
    assert names == {"b500-fox.halfviews-s1", "b500-fox-s1", "b500-bonsai.nosfm.halfres-s1", "b500-bonsai.nosfm-s1"}
    assert all(c.isalnum() or c in "-_." for n in names for c in n)
    assert real_sweep.parse_variant("sqrt=auto_mcmc_budget=531000;auto_budget_pixels_per_gaussian=0") == \
        ("sqrt", ["auto_mcmc_budget=531000", "auto_budget_pixels_per_gaussian=0"])
    with pytest.raises(SystemExit, match="the name must be"):
        real_sweep.parse_variant("a~b=x=1")
