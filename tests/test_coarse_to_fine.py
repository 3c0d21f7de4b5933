"""Coarse-to-fine training resolution (TrainConfig.coarse_to_fine; rigel_core/train/trainer.py
``training_downscale`` and ``Trainer._use_downscale``), on tiny CPU datasets."""
import math

import pytest
import torch

from rigel_core.train import TrainConfig, Trainer
from rigel_core.train.trainer import training_downscale
from test_trainer import make_dataset, small_config

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


def test_the_factor_never_makes_an_image_smaller_than_the_minimum(rng):
    from rigel_core.train.trainer import MIN_COARSE_SIDE

    ds = make_dataset(rng, n_gauss=40, size=16, n_train=2, n_test=1)
    t = Trainer(ds, small_config(coarse_to_fine=64, coarse_to_fine_iters=10), device="cpu")
    t.step()
    assert t.train_downscale == 16 // MIN_COARSE_SIDE  # 64 asked; 16 px images stop at 8 px
    assert min(t.train_frames[0].camera.width, t.train_frames[0].camera.height) == MIN_COARSE_SIDE


def test_schedule_off():
    assert {training_downscale(TrainConfig(), it) for it in range(1, 5000, 7)} == {1}
    assert training_downscale(TrainConfig(coarse_to_fine=4, coarse_to_fine_iters=0), 1) == 1


@pytest.mark.parametrize("bad", [0, 3, 6, 128, -2])
def test_bad_factor_is_refused(bad):
    with pytest.raises(ValueError, match="coarse_to_fine"):
        TrainConfig(coarse_to_fine=bad).validate()
    with pytest.raises(ValueError, match="coarse_to_fine_iters"):
        TrainConfig(coarse_to_fine=2, coarse_to_fine_iters=-1).validate()


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
        assert len(err) == 1 and err[0].startswith("rigel-train: TrainConfig."), err
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
    assert len(err) == 1 and "TrainConfig.coarse_to_fine" in err[0], err
