"""Coarse-to-fine training resolution (TrainConfig.coarse_to_fine; rigel_core/train/trainer.py
``training_downscale`` and ``Trainer._use_downscale``), its default "auto" (rigel_core/train/config.py
``resolve_coarse_to_fine``, ``Trainer._resolve_auto``) and the downscale rule it shares with the data loaders
(rigel_core/data/frames.py ``downscale_frame``), on tiny CPU datasets."""
import json
import math
import weakref

import numpy as np
import pytest
import torch
from PIL import Image

from rigel_core import Camera
from rigel_core.data import load_dataset
from rigel_core.data.frames import downscale_frame
from rigel_core.data.images import resize_area
from rigel_core.train import TrainConfig, Trainer
from rigel_core.train import trainer as trainer_module
from rigel_core.train.config import coarse_to_fine_span
from rigel_core.train.trainer import training_downscale
from test_trainer import blender_dataset, make_dataset, small_config  # noqa: F401  (a fixture)

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.mark.parametrize("d0,total", [(4, 3000), (8, 300), (2, 7), (16, 1000), (64, 50)])
def test_schedule_halves_in_equal_phases_then_stays_full(d0, total):
    cfg = TrainConfig(coarse_to_fine=d0, coarse_to_fine_iters=total)
    seq = [training_downscale(cfg, it) for it in range(1, total + 50)]
    k = int(math.log2(d0))
    assert seq[0] == d0 and all(a >= b for a, b in zip(seq, seq[1:]))
    assert seq[total:] == [1] * 49  # iteration total + 1 on: full resolution
    for j in range(k):  # phase j trains at d0 / 2^j for total/k iterations (±1)
        assert abs(seq[:total].count(d0 >> j) - total / k) <= 1, (j, seq[:total].count(d0 >> j))
    assert set(seq) <= {d0 >> j for j in range(k + 1)}


def test_a_short_run_reaches_full_resolution_for_its_second_half():
    cfg = TrainConfig(iterations=20, coarse_to_fine=4, coarse_to_fine_iters=3000)
    seq = [training_downscale(cfg, it) for it in range(1, 21)]
    assert seq == [4] * 5 + [2] * 5 + [1] * 10


@pytest.mark.parametrize("share,iters,cap,span", [(0.8, 20, 3000, 16), (1.0, 12, 3000, 12), (0.3, 40, 3000, 12),
                                                  (0.9, 100, 30, 30), (0.05, 10, 3000, 0), (0.29, 100, 3000, 29),
                                                  (0.7, 90, 3000, 63), (0.58, 50, 3000, 29)])
def test_the_share_bounds_the_coarse_levels(share, iters, cap, span):
    """``coarse_to_fine_share``: the coarse levels end at min(coarse_to_fine_iters, ⌊iterations × share⌋), the
    share as written: 100 × 0.29 is 28.999999999999996 in binary floating point, and the levels ended at 28 (the
    log said so) instead of 29; 90 × 0.7 at 62 instead of 63."""
    cfg = TrainConfig(iterations=iters, coarse_to_fine=4, coarse_to_fine_iters=cap, coarse_to_fine_share=share)
    seq = [training_downscale(cfg, it) for it in range(1, iters + 1)]
    assert coarse_to_fine_span(cfg) == span
    assert seq.count(1) == iters - span and seq[span:] == [1] * (iters - span)
    quarter, half = seq[:span].count(4), seq[:span].count(2)
    assert quarter + half == span and quarter - half in (0, 1)  # two equal phases (an odd span: ¼ one longer)


@pytest.mark.parametrize("bad", [0, -0.5, 1.01, float("nan"), float("inf")])
def test_a_share_outside_its_range_is_refused(bad):
    with pytest.raises(ValueError, match="TrainConfig.coarse_to_fine_share must be (in|a finite)") as e:
        TrainConfig(coarse_to_fine=2, coarse_to_fine_share=bad).validate()
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("bad", [-0.5, float("nan"), float("inf")])
def test_a_gaussians_per_pixel_outside_its_range_is_refused(bad):
    with pytest.raises(ValueError, match="coarse_to_fine_gaussians_per_pixel must be a finite number") as e:
        TrainConfig(coarse_to_fine=2, coarse_to_fine_gaussians_per_pixel=bad).validate()
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("per, first", [(0.0, 8), (4.0, 8), (1.0, 16), (0.5, 32)])
def test_a_level_the_gaussians_crowd_is_left_for_a_finer_one(rng, per, first):
    """200 Gaussians on 32×32 views: ¼ (64 px) is kept only while 200 ≤ per × 64, ½ (256 px) while
    200 ≤ per × 256; 0 leaves the schedule alone; a level left is not come back to (the schedule's later levels
    are finer still)."""
    ds = make_dataset(rng, n_gauss=60, size=32, n_train=4, n_test=1)
    t = Trainer(ds, small_config(iterations=40, coarse_to_fine=4, coarse_to_fine_iters=20, densify_from=1000,
                                 coarse_to_fine_gaussians_per_pixel=per), device="cpu")
    assert t.model.num_gaussians == 200
    widths = []
    for _ in range(40):
        t.step()
        widths.append(t.train_frames[0].camera.width)
    expected = [max(w, first) for w in [8] * 10 + [16] * 10 + [32] * 20]
    assert widths == expected


@pytest.mark.parametrize("size, min_side, want", [(16, 8, 2), (32, 8, 4), (32, 16, 2), (48, 16, 2), (20, 16, 1)])
def test_the_factor_never_makes_an_image_smaller_than_the_minimum(rng, size, min_side, want):
    """coarse_to_fine_min_side: 64 asked, the factor halves until the shorter side keeps that many pixels."""
    ds = make_dataset(rng, n_gauss=40, size=size, n_train=2, n_test=1)
    t = Trainer(ds, small_config(coarse_to_fine=64, coarse_to_fine_iters=10, coarse_to_fine_min_side=min_side),
                device="cpu")
    t.step()
    assert t.train_downscale == want
    assert min(t.train_frames[0].camera.width, t.train_frames[0].camera.height) == size // want >= min_side


def test_the_default_floor_keeps_small_captures_at_full_resolution(rng):
    """The default coarse_to_fine_min_side (64): "auto" gives a capture without SfM points 4, and a 100 px capture
    trains at full resolution (its ¼ would be 25 px: lego~opaque at 1/8 lost every Gaussian there on one seed of
    two), a 256 px one from ¼ (64 px), a 128 px one from ½; the start line says why."""
    from rigel_core.train.config import COARSE_MIN_SIDE
    assert TrainConfig().coarse_to_fine_min_side == COARSE_MIN_SIDE == 64
    for bad in (7, 4097, 0, -8):
        with pytest.raises(ValueError, match="coarse_to_fine_min_side must be in 8..4096"):
            TrainConfig(coarse_to_fine_min_side=bad).validate()
    for size, want in ((100, 1), (128, 2), (256, 4)):
        ds = make_dataset(rng, n_gauss=20, size=size, n_train=2, n_test=1)
        cfg = small_config(coarse_to_fine="auto", iterations=8, coarse_to_fine_iters=4,
                           coarse_to_fine_min_side=COARSE_MIN_SIDE, init_points=50)
        t = Trainer(ds, cfg, device="cpu")
        assert t.config.coarse_to_fine == 4
        t.step()
        assert t.train_downscale == want, size
        if want < 4:
            assert f"a level keeps at least {COARSE_MIN_SIDE} px" in t.coarse_note, t.coarse_note
            assert ("this run trains at full resolution" if want == 1 else f"this run starts at 1/{want}") in \
                t.coarse_note, t.coarse_note


def test_schedule_off():
    assert {training_downscale(TrainConfig(coarse_to_fine=1), it) for it in range(1, 5000, 7)} == {1}
    assert training_downscale(TrainConfig(coarse_to_fine=4, coarse_to_fine_iters=0), 1) == 1
    with pytest.raises(ValueError, match="coarse_to_fine is 'auto'"):  # only a Trainer's resolved config has a factor
        training_downscale(TrainConfig(), 1)


@pytest.mark.parametrize("bad", [0, 3, 6, 128, -2, "fast", "", True, 2.5, None, [4]])
def test_bad_factor_is_refused(bad):
    with pytest.raises(ValueError, match="TrainConfig.coarse_to_fine must be") as e:
        TrainConfig(coarse_to_fine=bad).validate()
    assert "\n" not in str(e.value) and "'auto'" in str(e.value)
    with pytest.raises(ValueError, match="coarse_to_fine_iters"):
        TrainConfig(coarse_to_fine=2, coarse_to_fine_iters=-1).validate()


def test_auto_and_every_power_of_two_are_accepted():
    assert TrainConfig().coarse_to_fine == "auto"
    for good, want in [("auto", "auto"), (" AUTO ", "auto"), (4.0, 4)] + [(2 ** k, 2 ** k) for k in range(7)]:
        cfg = TrainConfig(coarse_to_fine=good)
        cfg.validate()
        assert cfg.coarse_to_fine == want and type(cfg.coarse_to_fine) is type(want)


# ---- the default: "auto" ---------------------------------------------------------------------------------------
def with_sfm_points(ds, rng, n=150):
    """``ds`` with ``n`` SfM points (and colours) in the scene's box: what a real capture's loader gives."""
    ds.points = ((torch.rand(n, 3, generator=rng, dtype=torch.float64) * 2 - 1) * 0.8).numpy()
    ds.point_colors = torch.rand(n, 3, generator=rng, dtype=torch.float64).numpy()
    return ds


def test_the_coarse_summary_says_what_this_session_does(rng):
    """Trainer.coarse_summary (the viewer's Training panel): off, too short a run, images too small for a coarser
    level, the resolution a session starting there begins at and from when it is full, done."""
    ds = make_dataset(rng, n_gauss=40, size=32, n_train=2, n_test=1)
    summary = lambda **cfg: Trainer(ds, small_config(**cfg), device="cpu").coarse_summary()  # noqa: E731
    assert summary(coarse_to_fine=1, iterations=10) == "coarse-to-fine: off"
    assert summary(coarse_to_fine=4, iterations=1) == "coarse-to-fine: off (the run is too short for it)"
    tiny = make_dataset(rng, n_gauss=40, size=12, n_train=2, n_test=1)   # 12 px // 2 < 8 (small_config's floor)
    assert Trainer(tiny, small_config(coarse_to_fine=4, iterations=10), device="cpu").coarse_summary() == \
        "coarse-to-fine: off (the images are too small for it)"
    t = Trainer(ds, small_config(coarse_to_fine=4, coarse_to_fine_iters=4, iterations=10), device="cpu")
    said = []
    for _ in range(6):
        said.append(t.coarse_summary())
        t.step()
    # 32 px images: 1/4 keeps 8 px; iterations 1-2 at 1/4, 3-4 at 1/2, 5 on full
    assert said == ["coarse-to-fine: from 1/4 resolution, full from iteration 5"] * 2 + \
        ["coarse-to-fine: from 1/2 resolution, full from iteration 5"] * 2 + ["coarse-to-fine: done, full resolution"] * 2


def test_auto_is_4_without_sfm_points_and_the_run_trains_coarse_first(rng):
    ds = make_dataset(rng, n_gauss=40, size=32, n_train=3, n_test=1)
    assert ds.points is None
    cfg = small_config(coarse_to_fine="auto", iterations=10, coarse_to_fine_iters=4)
    t = Trainer(ds, cfg, device="cpu")
    assert t.config.coarse_to_fine == 4 and cfg.coarse_to_fine == "auto"  # the caller's config is left as given
    assert t.config is not cfg and t.config == TrainConfig(**{**cfg.to_dict(), "coarse_to_fine": 4,
                                                             "strategy": "default"})
    note = t.coarse_note
    assert note.startswith("coarse_to_fine auto: 4 (no SfM points") and "--set coarse_to_fine=1" in note
    assert "\n" not in note and "1/4" in note and "4 iterations" in note  # min(coarse_to_fine_iters, iterations/2)
    seen = []
    for _ in range(6):
        assert math.isfinite(t.step().loss)
        seen.append(t.train_frames[0].camera.width)
    assert seen == [8, 8, 16, 16, 32, 32]
    # a run started from a given model (bench/real.py) resolves the same
    again = Trainer(ds, cfg, model=t.model, device="cpu")
    assert again.config == t.config and again.coarse_note == note


def test_auto_is_1_with_sfm_points(rng):
    ds = with_sfm_points(make_dataset(rng, n_gauss=40, size=32, n_train=3, n_test=1), rng)
    cfg = small_config(coarse_to_fine="auto", iterations=10, coarse_to_fine_iters=4, auto_mcmc_budget=1000)
    t = Trainer(ds, cfg, device="cpu")
    assert t.config.coarse_to_fine == 1 and cfg.coarse_to_fine == "auto"
    assert t.model.num_gaussians == 150  # the SfM start (not init_points' 200 random ones)
    note = t.coarse_note
    assert note.startswith("coarse_to_fine auto: 1, off (SfM points") and "--set coarse_to_fine=4" in note
    assert "\n" not in note
    for _ in range(2):
        assert math.isfinite(t.step().loss)
        assert t.train_downscale == 1 and t.train_frames[0].camera.width == 32


@pytest.mark.parametrize("sfm", [False, True])
def test_an_explicit_factor_is_never_changed(rng, sfm):
    ds = make_dataset(rng, n_gauss=30, size=16, n_train=2, n_test=0)
    if sfm:
        with_sfm_points(ds, rng)
    for factor in (1, 2, 4):
        cfg = small_config(coarse_to_fine=factor, strategy="default")
        t = Trainer(ds, cfg, device="cpu")
        assert t.config.coarse_to_fine == factor
        if factor == 1:
            assert t.coarse_note is None
        else:   # a factor set for a new run is said with its schedule (it was not: only "auto" got a line)
            span = coarse_to_fine_span(t.config)
            assert t.coarse_note.startswith(f"coarse_to_fine {factor} (set): training starts at 1/{factor} ")
            assert f"= {span:,} iteration" in t.coarse_note and "\n" not in t.coarse_note
        if not sfm:  # nothing "auto" left to resolve: the caller's config itself is the one in use
            assert t.config is cfg


def test_the_resolved_factor_is_recorded_and_reused_on_resume(rng, tmp_path):
    from safetensors.torch import load_file, save_file

    from rigel_core.checkpoint import read_checkpoint
    from rigel_core.cli.common import resume_config

    ds = make_dataset(rng, n_gauss=30, size=32, n_train=3, n_test=0)
    t = Trainer(ds, small_config(coarse_to_fine="auto", iterations=20, coarse_to_fine_iters=8), device="cpu")
    for _ in range(3):  # stop inside the 1/4 → 1/2 schedule
        t.step()
    path = tmp_path / "c.safetensors"
    t.save_checkpoint(path)
    _, meta = read_checkpoint(path)
    assert meta["config"]["coarse_to_fine"] == 4
    assert "auto" not in {v for v in meta["config"].values() if isinstance(v, str)}
    resumed = Trainer.from_checkpoint(path, ds, device="cpu")
    assert resumed.config.coarse_to_fine == 4 and resumed.coarse_note is None and resumed.config == t.config
    for _ in range(5):  # iterations 4..8 continue the schedule: 1/4 once more, then 1/2
        resumed.step()
        t.step()
        assert resumed.train_downscale == t.train_downscale
        assert torch.equal(resumed.model.means3D, t.model.means3D)
    assert resumed.iteration == 8 and resumed.train_downscale == 2
    changes = []
    assert resume_config(path, {"iterations": 20}, changes).coarse_to_fine == 4
    assert changes == []  # the saved value: nothing changed, nothing said
    assert resume_config(path, {"coarse_to_fine": "auto"}, changes).coarse_to_fine == "auto"  # resolved again
    assert resume_config(path, {"coarse_to_fine": 2, "iterations": 30}, changes).coarse_to_fine == 2
    assert changes == ["coarse_to_fine 4 -> 'auto'", "coarse_to_fine 4 -> 2", "iterations 20 -> 30"]
    # a checkpoint from before the field existed trained at full resolution: it resumes with 1, not "auto" (4 here)
    del meta["config"]["coarse_to_fine"], meta["config"]["coarse_to_fine_iters"]
    save_file(load_file(path), path, metadata={"rigel": json.dumps(meta)})
    old = Trainer.from_checkpoint(path, ds, device="cpu")
    assert old.config.coarse_to_fine == 1 and old.coarse_note is None


def test_an_extended_run_never_goes_back_to_a_coarser_resolution(rng, tmp_path):
    """The schedule's length min(coarse_to_fine_iters, iterations / 2) grows with ``iterations``: extending a run
    (the viewer, live; ``--resume --iters``, through a checkpoint) must not send it back to a coarse level it has
    left (found by a new-user run: 20 iterations, then 100, trained 21–50 at 1/4 and 1/2 again)."""
    from rigel_core.checkpoint import read_checkpoint

    ds = make_dataset(rng, n_gauss=30, size=32, n_train=3, n_test=0)
    cfg = small_config(coarse_to_fine=4, iterations=20, coarse_to_fine_iters=3000)  # T = 10: 4 ×5, 2 ×5, then 1
    t = Trainer(ds, cfg, device="cpu")
    factors = []
    for _ in range(20):
        t.step()
        factors.append(t.train_downscale)
    assert factors == [4] * 5 + [2] * 5 + [1] * 10
    path = tmp_path / "at20.safetensors"
    t.save_checkpoint(path)
    assert read_checkpoint(path)[1]["coarse_floor"] == 1
    t.config.iterations = 100  # live, as the viewer extends a run: the schedule alone would say 4 at 21–25
    assert training_downscale(t.config, 21) == 4
    for _ in range(10):
        t.step()
        assert t.train_downscale == 1
    resumed = Trainer.from_checkpoint(path, ds, device="cpu", config=TrainConfig(**{**cfg.to_dict(), "iterations": 100}))
    for _ in range(5):
        resumed.step()
        assert resumed.train_downscale == 1
    # extended before it was saved: the floor, not the saved config's (longer) schedule, decides on resume
    path2 = tmp_path / "at30.safetensors"
    t.save_checkpoint(path2)
    assert training_downscale(t.config, 31) == 2 and read_checkpoint(path2)[1]["coarse_floor"] == 1
    again = Trainer.from_checkpoint(path2, ds, device="cpu")
    again.step()
    assert again.train_downscale == 1
    # a checkpoint without the field (older): the saved run's own schedule at its iteration
    from safetensors.torch import load_file, save_file

    tensors, meta = load_file(path), read_checkpoint(path)[1]
    del meta["coarse_floor"]
    save_file(tensors, path, metadata={"rigel": json.dumps(meta)})
    old = Trainer.from_checkpoint(path, ds, device="cpu", config=TrainConfig(**{**cfg.to_dict(), "iterations": 100}))
    old.step()
    assert old.train_downscale == 1
    # a bad value is refused with one line naming the file and the field
    from rigel_core.checkpoint import CheckpointError

    for bad in (3, 0, 128, "4", True):
        meta["coarse_floor"] = bad
        save_file(tensors, path, metadata={"rigel": json.dumps(meta)})
        with pytest.raises(CheckpointError, match="coarse_floor") as e:
            Trainer.from_checkpoint(path, ds, device="cpu")
        assert str(path) in str(e.value) and "\n" not in str(e.value)


def test_the_auto_note_says_what_this_run_does(rng):
    tiny = make_dataset(rng, n_gauss=20, size=16, n_train=2, n_test=0)  # 16 px: 1/4 would be 4 px < 8
    t = Trainer(tiny, small_config(coarse_to_fine="auto", iterations=20), device="cpu")
    assert t.config.coarse_to_fine == 4 and "starts at 1/2" in t.coarse_note and "16 px" in t.coarse_note
    t.step()
    assert t.train_downscale == 2
    short = Trainer(tiny, small_config(coarse_to_fine="auto", iterations=1), device="cpu")
    assert "too short" in short.coarse_note
    short.step()
    assert short.train_downscale == 1
    wide = Trainer(make_dataset(rng, n_gauss=20, size=32, n_train=2, n_test=0),
                   small_config(coarse_to_fine="auto", iterations=20), device="cpu")
    assert "(this run" not in wide.coarse_note  # it does what the note says: 1/4, 1/2, full


def test_downscaled_views_are_block_means_with_strict_masks(rng):
    ds = make_dataset(rng, n_gauss=60, size=32, n_train=3, n_test=1)
    m = torch.rand(32, 32, generator=rng) > 0.05  # a few invalid pixels
    m[:4, :4] = True
    m[0, 0] = False  # one invalid pixel spoils its whole 2x2 (and 4x4) block
    ds.train[0].mask = m
    t = Trainer(ds, small_config(coarse_to_fine=4, coarse_to_fine_iters=10), device="cpu")
    full = (t.train_frames, t._train_images, t._train_masks)
    for d in (2, 4):
        t._use_downscale(d)
        assert t.train_downscale == d
        for i, (f0, img0, f) in enumerate(zip(full[0], full[1], t.train_frames)):
            blocks = lambda x: x.reshape(32 // d, d, 32 // d, d, *x.shape[2:]).double().mean((1, 3))
            assert f.camera.to_dict() == f0.camera.scaled(1.0 / d).to_dict()
            torch.testing.assert_close(f.image.double(), blocks(img0), rtol=0, atol=1e-6)
            assert f.image is t._train_images[i]  # one tensor: the frame and the training list
            if f0.alpha is not None:
                torch.testing.assert_close(f.alpha.double(), blocks(f0.alpha), rtol=0, atol=1e-6)
        coarse = t._train_masks[0]
        want = blocks(m.float()) == 1.0
        assert coarse is not None and torch.equal(coarse, want) and not bool(coarse[0, 0])
    t._use_downscale(1)
    assert t.train_frames is full[0] and t._train_images is full[1] and t._train_masks is full[2]


def test_training_follows_the_schedule_and_learns(rng):
    ds = make_dataset(rng, n_gauss=120, size=32, n_train=8, n_test=2)
    t = Trainer(ds, small_config(iterations=90, coarse_to_fine=4, coarse_to_fine_iters=40, densify_from=20,
                                 densify_interval=20, densify_until=70), device="cpu")
    before = t.evaluate(record=False).psnr
    sizes = []
    for _ in range(90):
        r = t.step()
        sizes.append(t.train_frames[0].camera.width)
        assert math.isfinite(r.loss)
    assert sizes[:20] == [8] * 20 and sizes[20:40] == [16] * 20 and sizes[40:] == [32] * 50
    after = t.evaluate(record=False)
    assert after.psnr > before + 1.0 and t.test_frames[0].camera.width == 32  # evaluated at full resolution


def test_rigel_train_refuses_a_bad_value_before_loading_the_dataset(tmp_path, capsys, monkeypatch):
    from rigel_core.cli import common, train as train_cli

    def no_load(args):  # the dataset must not be read for a configuration that will be refused
        raise AssertionError("dataset loaded")

    monkeypatch.setattr(train_cli, "load_training_data", no_load)
    data = tmp_path / "data"
    data.mkdir()
    for bad in ("coarse_to_fine=3", "coarse_to_fine_iters=-1", "cuda_graph=maybe"):
        assert train_cli.main(["--data", str(data), "--out", str(tmp_path / "run"), "--device", "cpu",
                               "--set", bad]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith(f"rigel-train: --set {bad.partition('=')[0]} "), err
    assert not (tmp_path / "run").exists()
    assert common.new_run_problem is train_cli.new_run_problem  # the rule rigel-viewer --data uses too


def test_rigel_viewer_refuses_a_bad_value_before_loading_the_dataset(tmp_path, capsys, monkeypatch):
    cli = pytest.importorskip("viewer.cli", reason="the viewer needs the `vulkan` package")
    from rigel_core.cli import common

    def no_load(args):
        raise AssertionError("dataset loaded")

    monkeypatch.setattr(common, "load_training_data", no_load)
    data = tmp_path / "data"
    data.mkdir()
    assert cli.main(["--data", str(data), "--offscreen", "--out", str(tmp_path / "run"), "--device", "cpu",
                     "--set", "coarse_to_fine=3"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--set coarse_to_fine must be" in err[0], err


def test_rigel_train_logs_and_records_the_resolved_factor_and_resumes_with_it(blender_dataset, tmp_path, capsys):
    from rigel_core.checkpoint import read_checkpoint
    from rigel_core.cli.train import main

    run = tmp_path / "run"
    common = ["--data", str(blender_dataset), "--out", str(run), "--device", "cpu", "--quiet", "--init-points", "80",
              "--eval-every", "0", "--n-renders", "0", "--set", "coarse_to_fine_iters=4"]
    assert main(common + ["--iters", "6"]) == 0
    assert json.loads((run / "metrics.json").read_text())["config"]["coarse_to_fine"] == 4  # no SfM points
    assert read_checkpoint(run / "checkpoint.safetensors")[1]["config"]["coarse_to_fine"] == 4
    log = (run / "log.txt").read_text()
    assert log.count("coarse_to_fine auto: 4 (no SfM points") == 1
    capsys.readouterr()
    assert main(common + ["--iters", "8", "--resume"]) == 0
    metrics = json.loads((run / "metrics.json").read_text())
    assert metrics["config"]["coarse_to_fine"] == 4 and metrics["iterations_done"] == 8
    assert (run / "log.txt").read_text().count("coarse_to_fine auto") == 1  # resumed: recorded, not re-decided
    # what the command line changes in the saved settings is said (the same coarse_to_fine_iters is not)
    changed = [l for l in capsys.readouterr().err.splitlines() if "with changed settings" in l]
    assert len(changed) == 1 and changed[0].endswith("with changed settings: iterations 6 -> 8"), changed
    assert (run / "log.txt").read_text().count("with changed settings: iterations 6 -> 8") == 1  # the log too
    assert main(common + ["--iters", "9", "--resume", "--set", "coarse_to_fine=2"]) == 0
    changed = [l for l in capsys.readouterr().err.splitlines() if "with changed settings" in l]
    assert len(changed) == 1 and "coarse_to_fine 4 -> 2" in changed[0] and "iterations 8 -> 9" in changed[0]
    assert json.loads((run / "metrics.json").read_text())["config"]["coarse_to_fine"] == 2
    off = tmp_path / "off"
    assert main(common[:2] + ["--out", str(off)] + common[4:] + ["--iters", "4", "--set", "coarse_to_fine=1"]) == 0
    assert json.loads((off / "metrics.json").read_text())["config"]["coarse_to_fine"] == 1
    assert "coarse_to_fine auto" not in (off / "log.txt").read_text()


def test_cli_set_takes_auto_or_a_factor():
    from rigel_core.cli.common import config_overrides, new_config
    from rigel_core.cli.train import build_parser

    def parse(*argv):
        return build_parser().parse_args(["--data", "d", "--out", "o", *argv])

    assert "coarse_to_fine" not in config_overrides(parse())  # the default: TrainConfig's "auto"
    assert new_config(parse(), {}).coarse_to_fine == "auto"
    for text, want in (("auto", "auto"), ("4", 4), ("1", 1), ("64", 64)):
        args = parse("--set", f"coarse_to_fine={text}")
        assert new_config(args, config_overrides(args)).coarse_to_fine == want


def test_bench_real_passes_the_factor_through():
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from bench import real

    for text, want in (("4", 4), ("1", 1), ("auto", "auto")):
        over = real.parse_overrides([f"coarse_to_fine={text}"])
        assert over == {"coarse_to_fine": want} and real.rigel_config(100, 0, over).coarse_to_fine == want
    assert real.rigel_config(100, 0, {}).coarse_to_fine == "auto"  # rigel's default: resolved by its Trainer
    with pytest.raises(real.BenchError, match="TrainConfig.coarse_to_fine"):
        real.rigel_config(100, 0, real.parse_overrides(["coarse_to_fine=3"]))


# ---- one downscale rule: the loaders' --downscale and the trainer's coarse levels ----------------------------
FLIP = np.diag([1.0, -1.0, -1.0, 1.0])


def write_ngp(path, rng, w, h, n, lens=True):
    """An instant-ngp dataset of ``n`` random RGBA images (``w`` × ``h``, some alpha exactly 0), a pincushion lens
    (k1 > 0: pixels near the corners have no source after undistortion; none without ``lens``) and a masks/ file
    (random pixels ignored) for every other frame. Returns the names of the frames with a mask file."""
    g = np.random.default_rng(int(torch.randint(0, 2 ** 31 - 1, (1,), generator=rng)))
    path.joinpath("images").mkdir(parents=True)
    path.joinpath("masks").mkdir()
    frames, masked = [], []
    for i in range(n):
        cam = Camera.look_at((3 * math.cos(i), 3 * math.sin(i), 1.0), (0, 0, 0), width=w, height=h, name=f"f{i}")
        rgba = g.uniform(size=(h, w, 4))
        rgba[..., 3][g.uniform(size=(h, w)) < 0.1] = 0.0
        Image.fromarray(np.rint(rgba * 255).astype(np.uint8), "RGBA").save(path / "images" / f"f{i}.png")
        if i % 2 == 0:
            keep = g.uniform(size=(h, w)) > 0.02
            Image.fromarray(keep.astype(np.uint8) * 255, "L").save(path / "masks" / f"f{i}.png")
            masked.append(f"f{i}")
        c2w = np.linalg.inv(cam.viewmat) @ FLIP  # OpenCV world-to-camera → the file's OpenGL camera-to-world
        frames.append({"file_path": f"images/f{i}.png", "transform_matrix": c2w.tolist()})
    meta = {"fl_x": 0.9 * w, "w": w, "h": h, "frames": frames, **({"k1": 0.15} if lens else {})}
    path.joinpath("transforms.json").write_text(json.dumps(meta))
    return masked


def load(path, downscale):
    with pytest.warns(UserWarning, match="no mask file"):  # the frames without a masks/ file
        return load_dataset(path, downscale=downscale, test_every=0)


def assert_same_frame(got, want):
    """Bit for bit: camera, image, alpha and mask (None or equal)."""
    assert got.name == want.name and got.camera.to_dict() == want.camera.to_dict()
    assert got.image.dtype == want.image.dtype == torch.float32 and torch.equal(got.image, want.image)
    assert (got.alpha is None) == (want.alpha is None)
    assert got.alpha is None or torch.equal(got.alpha, want.alpha)
    assert (got.mask is None) == (want.mask is None), got.name
    assert got.mask is None or (got.mask.dtype == torch.bool and torch.equal(got.mask, want.mask))


def box_support_valid(keep, w, h):
    """Reference of the mask rule: (h, w) bool, a downscaled pixel valid iff every full-resolution pixel whose
    impulse reaches it through the box filter (a non-zero weight) is kept (``keep`` (H, W) bool)."""
    valid = np.ones((h, w), bool)
    for y, x in zip(*np.nonzero(~keep)):
        impulse = np.zeros(keep.shape, np.float32)
        impulse[y, x] = 1.0
        valid &= resize_area(impulse, w, h) == 0.0
    return valid


def test_downscale_frame_is_what_the_loader_gives(tmp_path, rng):
    w, h = 45, 35  # divisible by none of the factors
    masked = write_ngp(tmp_path, rng, w, h, 4)
    full = load(tmp_path, 1)
    lens_only = full.train[1].mask  # a frame without a mask file
    assert all(f.alpha is not None and f.mask is not None for f in full.train)  # alpha; lens (+ file) masks
    assert masked == ["f0", "f2"] and full.train[1].name == "f1" and bool(lens_only[h // 2, w // 2])
    assert int((~full.train[0].mask).sum()) > int((~lens_only).sum())  # the mask file adds ignored pixels
    for factor in (2, 3, 4, 1.5):
        coarse = load(tmp_path, factor)
        for f1, fd in zip(full.train, coarse.train, strict=True):
            assert (fd.camera.width, fd.camera.height) == (round(w / factor), round(h / factor))
            assert_same_frame(downscale_frame(f1, factor), fd)
            # the mask's representation does not matter (float {0, 1} keeps where > 0.5)
            assert_same_frame(downscale_frame(f1.__class__(f1.camera, f1.image, f1.alpha, f1.name,
                                                           f1.mask.float()), factor), fd)
            # the rule itself, from the box filter's impulse responses
            want = box_support_valid(f1.mask.numpy(), fd.camera.width, fd.camera.height)
            got = np.ones_like(want) if fd.mask is None else fd.mask.numpy()
            assert np.array_equal(got, want), (factor, fd.name)
            assert 0 < (~want).sum() < want.size  # some pixels of each kind
    assert downscale_frame(full.train[0], 1) is full.train[0]
    with pytest.raises(ValueError, match="factor"):
        downscale_frame(full.train[0], 0)


def check_views(t, ref):
    """The trainer's current training views are ``ref`` (a loaded dataset's frames), bit for bit."""
    for i, (f, fd) in enumerate(zip(t.train_frames, ref, strict=True)):
        assert_same_frame(f, fd)
        assert t._train_images[i] is f.image
        # the same valid pixels (a view without a mask may hold an all-True one: Trainer._uniform_masks)
        valid = lambda m: torch.ones(f.camera.height, f.camera.width, dtype=torch.bool) if m is None else m.bool()
        assert torch.equal(valid(t._train_masks[i]), valid(f.mask))


def test_coarse_levels_are_the_loaders_and_at_most_two_image_sets_live(tmp_path, rng, monkeypatch):
    write_ngp(tmp_path, rng, 45, 35, 4)
    full = load(tmp_path, 1)
    want = {d: load(tmp_path, d).train for d in (2, 4)}
    made = []  # (factor, weak references to the tensors of one coarse frame), in the order made
    real = trainer_module.downscale_frame

    def live_levels():
        return {d for d, refs in made if any(r() is not None for r in refs)}

    def spy(frame, factor, device=None):
        assert live_levels() <= {factor}, f"making level {factor} while {live_levels()} is still held"
        out = real(frame, factor, device=device)
        made.append((factor, [weakref.ref(x) for x in (out.image, out.alpha, out.mask) if x is not None]))
        return out

    monkeypatch.setattr(trainer_module, "downscale_frame", spy)
    t = Trainer(full, small_config(iterations=10, coarse_to_fine=4, coarse_to_fine_iters=4, init_points=100),
                device="cpu")
    full_images = list(t._train_images)
    seen = []
    for it in range(1, 9):
        assert math.isfinite(t.step().loss)
        d = t.train_downscale
        seen.append(d)
        assert live_levels() <= ({d} if d > 1 else set())  # with the full set: at most two image sets
        assert all(a is b for a, b in zip(t._full_views[1], full_images, strict=True))  # the full set stays
        check_views(t, full.train if d == 1 else want[d])  # (a function: the test keeps no reference)
    assert seen == [4, 4, 2, 2, 1, 1, 1, 1]
    assert [d for d, _ in made] == [4] * 4 + [2] * 4  # each level made once, from the full-resolution views
    assert not live_levels() and t._train_images is t._full_views[1]


def block_has_valid(keep, factor):
    """Reference for a size ``factor`` divides: (H/f, W/f) bool, True where the f × f block of ``keep`` is all kept
    (the strict rule: a coarse pixel is valid only when every pixel it averages is)."""
    h, w = keep.shape
    return keep.reshape(h // factor, factor, w // factor, factor).all(axis=(1, 3))


def test_a_mask_that_would_leave_a_view_no_coarse_pixel_gets_a_smaller_factor(rng):
    """Ignored pixels on a stride-4 lattice (random phase per view): every 4 × 4 block holds one, so at 1/4 those
    views would train on no pixel at all; at 1/2 three blocks in four stay valid. The trainer then uses 1/2 for the
    1/4 phase (one warning), while a view whose mask ignores everything already at full resolution (it has nothing
    to lose) and views without a mask do not count."""
    ds = make_dataset(rng, size=32, n_train=5, n_test=1)
    g = np.random.default_rng(int(torch.randint(0, 2 ** 31 - 1, (1,), generator=rng)))
    for i, f in enumerate(ds.train[:3]):
        keep = np.ones((32, 32), bool)
        oy, ox = g.integers(0, 4, size=2)
        keep[oy::4, ox::4] = False
        f.mask = torch.from_numpy(keep)
        assert not block_has_valid(keep, 4).any() and block_has_valid(keep, 2).any()
    ds.train[3].mask = torch.zeros(32, 32, dtype=torch.bool)  # blind at full resolution: not a reason (left out)
    with pytest.warns(UserWarning, match=r"1 training view\(s\) have every pixel masked .*: " + ds.train[3].name):
        t = Trainer(ds, small_config(iterations=12, coarse_to_fine=4, coarse_to_fine_iters=8, strategy="default"),
                    device="cpu")
    seen = []
    with pytest.warns(UserWarning, match=r"1/4 resolution 3 training view\(s\) would keep no valid pixel") as rec:
        for _ in range(12):
            assert math.isfinite(t.step().loss)
            seen.append(t.train_downscale)
            if t.train_downscale == 2:  # the 1/2 level's masks: the strict rule, from the full-resolution ones
                for f, m in zip(ds.train[:3], t._train_masks[:3], strict=True):
                    assert np.array_equal(m.numpy(), block_has_valid(f.mask.numpy(), 2))
    assert len([w for w in rec if "coarse-to-fine" in str(w.message)]) == 1  # the smaller factor is remembered
    assert seen == [2] * 6 + [1] * 6


def test_a_checkpoint_from_before_the_floor_field_resumes_with_8_px(rng, tmp_path):
    """A checkpoint written before ``coarse_to_fine_min_side`` existed kept coarse levels down to 8 px: it resumes
    with 8, as it trained, not the default floor (which would change a small capture's schedule mid-run); a new
    checkpoint keeps its own value."""
    import dataclasses
    import json

    from safetensors.torch import load_file, save_file

    from rigel_core.checkpoint import read_checkpoint
    ds = make_dataset(rng, n_gauss=30, size=16, n_train=2, n_test=0)
    cfg = small_config(iterations=6, coarse_to_fine=2, coarse_to_fine_iters=4, coarse_to_fine_min_side=16)
    tr = Trainer(ds, cfg, device="cpu")
    tr.step()
    assert tr.train_downscale == 1   # 16 px images keep no ½ level at a 16 px floor
    path, old = tmp_path / "now.safetensors", tmp_path / "old.safetensors"
    tr.save_checkpoint(path)
    tensors, meta = load_file(path), read_checkpoint(path)[1]
    meta["config"] = {k: v for k, v in meta["config"].items() if k != "coarse_to_fine_min_side"}
    save_file(tensors, old, metadata={"rigel": json.dumps(meta)})
    resumed = Trainer.from_checkpoint(old, ds, device="cpu")
    assert resumed.config == dataclasses.replace(tr.config, coarse_to_fine_min_side=8)  # "auto" resolved in both
    assert Trainer.from_checkpoint(path, ds, device="cpu").config == tr.config
