"""Per-image exposure correction (rigel_core/train/exposure.py) and its hooks in the trainer, the checkpoint and
the CLI, on tiny CPU datasets (tests/test_trainer.py's procedural scenes)."""
import json
import math

import numpy as np
import pytest
import torch

from rigel_core.checkpoint import CheckpointError
from rigel_core.train import TrainConfig, Trainer
from rigel_core.train.exposure import Exposure, apply_affine, exposure_lr, fit_affine, left_right_metrics
from rigel_core.train.losses import psnr_from_mse, ssim
from test_trainer import _assert_same_state, _state, make_dataset, random_scene, small_config


pytestmark = pytest.mark.usefixtures("one_thread")  # conftest.py: one PyTorch thread


def _random_affine(rng, dtype=torch.float64):
    A = torch.eye(3, dtype=dtype) + 0.2 * torch.randn(3, 3, generator=rng, dtype=dtype)
    b = 0.1 * torch.randn(3, generator=rng, dtype=dtype)
    return A, b


# ---- the correction and its gradient -------------------------------------------------------------------------
def test_apply_affine_gradient_matches_closed_form_and_finite_differences(rng):
    img = torch.rand(7, 5, 3, generator=rng, dtype=torch.float64)
    A, b = _random_affine(rng)
    A.requires_grad_(True)
    b.requires_grad_(True)
    w = torch.randn(7, 5, 3, generator=rng, dtype=torch.float64)
    out = apply_affine(img, A, b)
    # independent reference of the forward: a per-pixel loop over the matrix-vector product
    ref = torch.stack([torch.stack([A.detach() @ img[i, j] + b.detach() for j in range(5)]) for i in range(7)])
    assert torch.allclose(out.detach(), ref, atol=1e-14)
    (out * w).sum().backward()
    # d/dA_rc Σ w·(A p + b) = Σ_p w_r(p)·p_c ; d/db_r = Σ_p w_r(p)
    assert torch.allclose(A.grad, torch.einsum("hwr,hwc->rc", w, img), atol=1e-12)
    assert torch.allclose(b.grad, w.sum((0, 1)), atol=1e-12)
    # and through the trainer's loss (L1 + D-SSIM), against central finite differences
    gt = torch.rand(7, 5, 3, generator=rng, dtype=torch.float64)
    loss = lambda A_, b_, x_: 0.8 * (apply_affine(x_, A_, b_) - gt).abs().mean() + 0.2 * (1 - ssim(
        apply_affine(x_, A_, b_), gt))
    assert torch.autograd.gradcheck(loss, (A.detach().requires_grad_(True), b.detach().requires_grad_(True),
                                           img.requires_grad_(True)))


def test_exposure_module_rows_and_learning_rate(rng):
    ex = Exposure(4)
    assert ex.affine.shape == (4, 3, 4) and ex.affine.requires_grad
    assert torch.equal(ex.A, torch.eye(3).expand(4, 3, 3)) and torch.equal(ex.b, torch.zeros(4, 3))
    img = torch.rand(6, 6, 3, generator=rng)
    assert torch.equal(ex.apply(img, 2), img)  # identity at start: exactly the render
    with torch.no_grad():
        ex.affine[1] = torch.randn(3, 4, generator=rng)
    y = ex.apply(img, 1)
    assert torch.allclose(y, img @ ex.A[1].T + ex.b[1])
    y.sum().backward()
    g = ex.affine.grad
    assert torch.count_nonzero(g[[0, 2, 3]]) == 0 and torch.count_nonzero(g[1]) == 12  # only the used row
    ex.set_lr(0.1)
    before = ex.affine.detach().clone()
    ex.step(torch.ones(()))  # found_inf set: no update
    assert torch.equal(ex.affine.detach(), before)
    ex.step(torch.zeros(()))
    moved = (ex.affine.detach() - before).abs().flatten(1).amax(1)
    assert moved[1] > 0.05 and torch.count_nonzero(moved[[0, 2, 3]]) == 0
    with pytest.raises(ValueError, match="at least one"):
        Exposure(0)

    cfg = TrainConfig(iterations=1000, exposure_lr_init=1e-2, exposure_lr_final=1e-4)
    assert exposure_lr(cfg, 0) == pytest.approx(1e-2) and exposure_lr(cfg, 1000) == pytest.approx(1e-4)
    assert exposure_lr(cfg, 500) == pytest.approx(1e-3)  # log-linear: the geometric mean half-way
    cfg.exposure_lr_delay_steps, cfg.exposure_lr_delay_mult = 200, 0.01
    assert exposure_lr(cfg, 0) == pytest.approx(1e-4)  # 1e-2 · 0.01
    assert exposure_lr(cfg, 100) == pytest.approx(1e-2 ** 0.9 * 1e-4 ** 0.1 * (0.01 + 0.99 * math.sin(math.pi / 4)))
    assert exposure_lr(cfg, 300) == pytest.approx(1e-2 ** 0.7 * 1e-4 ** 0.3)
    with pytest.raises(ValueError, match="exposure_lr"):
        TrainConfig(exposure_lr_delay_mult=2.0).validate()


# ---- the held-out protocol -------------------------------------------------------------------------------------
def test_fit_affine_recovers_a_known_correction_and_matches_lstsq(rng):
    pred = torch.rand(20, 30, 3, generator=rng)
    A, b = _random_affine(rng, torch.float32)
    gt = apply_affine(pred, A, b)
    A_fit, b_fit = fit_affine(pred, gt)
    assert torch.allclose(A_fit, A, atol=1e-4) and torch.allclose(b_fit, b, atol=1e-4)
    # with noise: numpy's least squares on the same system is the reference
    noisy = gt + 0.05 * torch.randn(gt.shape, generator=rng)
    mask = torch.rand(20, 30, generator=rng) > 0.3
    A_fit, b_fit = fit_affine(pred, noisy, mask)
    X = np.concatenate([pred[mask].double().numpy(), np.ones((int(mask.sum()), 1))], 1)
    W = np.linalg.lstsq(X, noisy[mask].double().numpy(), rcond=None)[0]
    assert np.allclose(A_fit.numpy(), W[:3].T, atol=1e-5) and np.allclose(b_fit.numpy(), W[3], atol=1e-5)
    # a flat render is rank-deficient: the minimum-norm solution, finite, mapping the render onto the mean
    flat = torch.full((8, 8, 3), 0.25)
    A_fit, b_fit = fit_affine(flat, noisy[:8, :8])
    assert torch.isfinite(A_fit).all() and torch.isfinite(b_fit).all()
    assert torch.allclose(apply_affine(flat[0, 0], A_fit, b_fit), noisy[:8, :8].reshape(-1, 3).mean(0), atol=1e-5)
    with pytest.raises(ValueError, match="no pixel"):
        fit_affine(pred, gt, torch.zeros(20, 30, dtype=torch.bool))
    with pytest.raises(ValueError, match="must be equal"):
        fit_affine(pred, gt[:, :4])


def test_left_right_metrics_fit_left_and_score_right(rng):
    h, w = 24, 33  # odd width: left = 16 columns, right = 17
    pred = 0.2 + 0.6 * torch.rand(h, w, 3, generator=rng)
    A, b = _random_affine(rng, torch.float32)
    gt = apply_affine(pred, A, b)  # not clamped: the left half stays exactly affine in the render
    gt[:, 16:] += 0.03 * torch.randn(h, w - 16, 3, generator=rng)  # error on the scored half only
    r = left_right_metrics(pred, gt)
    # by hand: the exact correction (the left half is noise-free) applied to the right half
    right = apply_affine(pred[:, 16:], A, b).clamp(0, 1)
    m = float(((right - gt[:, 16:]) ** 2).mean())
    assert r["psnr"] == pytest.approx(psnr_from_mse(m), abs=0.02)
    assert r["ssim"] == pytest.approx(float(ssim(right, gt[:, 16:])), abs=1e-3)
    assert np.allclose(r["A"], A.numpy(), atol=2e-3)
    # the uncorrected render scores far worse than the protocol
    assert r["psnr"] > psnr_from_mse(float(((pred - gt) ** 2).mean())) + 5
    # errors on the fitted half do not reach the score ...
    gt2 = gt.clone()
    gt2[:, :16] += 0.3 * (torch.rand(h, 16, 3, generator=rng) > 0.95)
    assert left_right_metrics(pred, gt2)["psnr"] < r["psnr"] + 1e-6  # ... except through a worse fit
    with pytest.raises(ValueError, match="width"):
        left_right_metrics(pred[:, :1], gt[:, :1])


# ---- the trainer -----------------------------------------------------------------------------------------------
def _exposed_dataset(rng, **kw):
    """A procedural dataset whose training images went through random per-image channel gains and offsets;
    the held-out images did not."""
    ds = make_dataset(rng, **kw)
    n = len(ds.train)
    gains = 0.6 + 0.8 * torch.rand(n, 3, generator=rng)
    offsets = 0.1 * torch.rand(n, 3, generator=rng) - 0.05
    for i, f in enumerate(ds.train):
        f.image = (f.image * gains[i] + offsets[i]).clamp(0, 1)
    return ds, gains


def test_exposure_recovers_the_gains_on_a_known_scene(rng):
    """The scene fixed at the one that made the images (every Gaussian lr 0, no densification): the only
    freedom left is the correction, and it must converge to each image's true gain and offset."""
    scene = random_scene(rng, 120)
    ds = make_dataset(rng, size=24, n_train=6, n_test=0, scene=scene)
    gains = 0.7 + 0.4 * torch.rand(6, 3, generator=rng)
    offsets = 0.05 * torch.rand(6, 3, generator=rng)
    for i, f in enumerate(ds.train):
        f.image = (f.image * gains[i] + offsets[i]).clamp(0, 1)
    frozen = dict(position_lr_init=0.0, position_lr_final=0.0, scaling_lr=0.0, rotation_lr=0.0, opacity_lr=0.0,
                  feature_lr=1e-12, densify_from=10 ** 6, sh_degree_interval=1)  # feature_lr must be > 0
    tr = Trainer(ds, small_config(iterations=240, exposure=True, exposure_lr_init=2e-2, exposure_lr_final=2e-3,
                                  **frozen), model=scene, device="cpu")
    for _ in range(240):
        tr.step()
    A, b = tr.exposure.A, tr.exposure.b
    # what matters is the correction applied to the scene's colours (a matrix is under-determined along
    # colour directions the images do not span): compare it with the true one on every unclamped pixel
    err = []
    for i, f in enumerate(ds.train):
        x = tr.render_frame(f)
        want = x * gains[i] + offsets[i]
        ok = (want <= 1).all(-1)
        err.append(float(((apply_affine(x, A[i], b[i]) - want)[ok] ** 2).mean().sqrt()))
    diag = A.diagonal(dim1=1, dim2=2)
    print(f"corrected colours: RMS error max {max(err):.4f}; gain error max {float((diag - gains).abs().max()):.4f}, "
          f"offset error max {float((b - offsets).abs().max()):.4f}")
    assert max(err) < 0.01 and (diag - gains).abs().max() < 0.15 and (b - offsets).abs().max() < 0.05


def test_exposure_beats_exposure_off_on_held_out_views(rng):
    """Full training on images with random per-image gains: the exposure run fits its training views far better,
    is not worse under the held-out protocol, and its learnt gains follow the true ones up to the global colour
    gauge."""
    ds, gains = _exposed_dataset(rng, n_train=8, n_test=4, size=32)
    cfg = dict(iterations=250, densify_until=200, seed=int(torch.randint(0, 2 ** 31, (1,), generator=rng)))
    off = Trainer(ds, small_config(**cfg), device="cpu")
    on = Trainer(ds, small_config(exposure=True, **cfg), device="cpu")
    assert off.exposure is None
    for _ in range(250):
        off.step()
        on.step()
    ev_on = on.evaluate()
    off.config.eval_exposure = True  # score the exposure-off model by the same protocol
    ev_off = off.evaluate()
    assert off.exposure is None  # evaluating makes no corrections
    learnt = on.exposure.A.diagonal(dim1=1, dim2=2)
    rel_l, rel_t = learnt / learnt.mean(0), gains / gains.mean(0)
    corr = float(np.corrcoef(rel_l.flatten().numpy(), rel_t.flatten().numpy())[0, 1])
    print(f"held-out, left-fit/right-scored: exposure off {ev_off.psnr_exposure:.2f} dB / {ev_off.ssim_exposure:.3f}, "
          f"on {ev_on.psnr_exposure:.2f} dB / {ev_on.ssim_exposure:.3f}; plain {ev_off.psnr:.2f} / {ev_on.psnr:.2f}; "
          f"gain correlation {corr:.3f}")
    # The training views, each with its own correction (identity for the exposure-off run): the exposure run
    # explains their per-image gains and fits them far better. On held-out views the protocol's margin is
    # seed-dependent on a toy this small, so only "not worse" is asserted there. Bounds from 40 fresh seeds
    # (RIGEL_SEED=200-239): held-out on − off +0.54 ± 0.54 dB (min −0.54 dB at seed 225, which failed the former
    # −0.5 dB bound; so did one run of the suite), training L1 on/off 0.805 ± 0.033 (max 0.876). The bounds sit
    # about four standard deviations out: −1.5 dB, 0.95. They still fail when exposure harms the held-out scene by
    # more than the seed noise, or when it does not explain the gains (on/off ≈ 1).
    with torch.no_grad():
        def train_l1(tr):
            errs = []
            for i, f in enumerate(tr.train_frames):
                pred = tr.render_frame(f)
                if tr.exposure is not None:
                    pred = tr.exposure.apply(pred, i)
                errs.append(float((pred - f.image).abs().mean()))
            return float(np.mean(errs))

        l1_off, l1_on = train_l1(off), train_l1(on)
    print(f"training views L1: exposure off {l1_off:.4f}, on {l1_on:.4f}")
    assert l1_on < 0.95 * l1_off
    assert ev_on.psnr_exposure > ev_off.psnr_exposure - 1.5
    assert all({"psnr_exposure", "ssim_exposure", "exposure_fit"} <= set(v) for v in ev_on.per_view)
    assert corr > 0.8


def test_exposure_off_is_the_plain_step_and_identity_exposure_changes_nothing(rng):
    """Exposure off: no corrections exist and nothing is drawn for them. Exposure on with zero learning rate:
    the identity correction is exact in float arithmetic, so the run is bit-identical to exposure off (the
    same render, loss, gradients, densification)."""
    ds = make_dataset(rng, n_gauss=40, size=24, n_train=5, n_test=1)
    base = dict(init_points=60, densify_from=3, densify_interval=4, grad_threshold=1e-5, opacity_reset_interval=9)
    a = Trainer(ds, small_config(**base), device="cpu")
    b = Trainer(ds, small_config(exposure=True, exposure_lr_init=0.0, exposure_lr_final=0.0, **base), device="cpu")
    for _ in range(12):
        ra, rb = a.step(), b.step()
        assert ra.loss == rb.loss and ra.num_gaussians == rb.num_gaussians
        _assert_same_state(_state(a), _state(b))
    assert a.exposure is None and torch.equal(b.exposure.A, torch.eye(3).expand(5, 3, 3))
    # switched on mid-run (a viewer may): the corrections start then, at identity, and learn
    a.config.exposure = True
    a.step()
    assert a.exposure is not None and len(a.exposure) == 5
    a.step()
    a.step()
    assert not torch.equal(a.exposure.A, torch.eye(3).expand(5, 3, 3))


def test_nan_guard_skips_the_exposure_update(rng):
    ds = make_dataset(rng, n_gauss=30, size=24, n_train=3, n_test=0)
    tr = Trainer(ds, small_config(init_points=40, exposure=True), device="cpu")
    tr.step()
    before = tr.exposure.affine.detach().clone()
    orig = tr.loss_terms
    tr.loss_terms = lambda *a, **k: tuple(v * float("nan") if i == 0 else v for i, v in enumerate(orig(*a, **k)))
    r = tr.step()
    assert r.skipped and torch.equal(tr.exposure.affine.detach(), before)
    tr.loss_terms = orig
    fired = []

    def poison(grad):  # finite loss, non-finite exposure gradient only
        if not fired:
            fired.append(1)
            return grad * float("nan")
        return grad

    tr.exposure.affine.register_hook(poison)
    r = tr.step()
    assert r.skipped and torch.equal(tr.exposure.affine.detach(), before)
    assert not tr.step().skipped and not torch.equal(tr.exposure.affine.detach(), before)


def test_checkpoint_round_trip_with_exposure_and_without(rng, tmp_path):
    ds = make_dataset(rng, n_gauss=40, size=24, n_train=5, n_test=1)
    cfg = small_config(init_points=50, exposure=True, densify_from=3, densify_interval=4, grad_threshold=1e-5)
    tr = Trainer(ds, cfg, device="cpu")
    for _ in range(7):
        tr.step()
    path = tmp_path / "c.safetensors"
    tr.save_checkpoint(path)
    res = Trainer.from_checkpoint(path, ds, device="cpu")
    assert torch.equal(res.exposure.affine.detach(), tr.exposure.affine.detach())
    for _ in range(5):  # Adam moments and step count restored: the next steps are bit-identical
        a, b = tr.step(), res.step()
        assert a.loss == b.loss
        assert torch.equal(tr.exposure.affine.detach(), res.exposure.affine.detach())
        _assert_same_state(_state(tr), _state(res))
    assert not torch.equal(tr.exposure.A, torch.eye(3).expand(5, 3, 3))

    # a checkpoint without exposure (older, or exposure off) loads; exposure switched on starts at identity
    plain = Trainer(ds, small_config(init_points=50), device="cpu")
    plain.step()
    p2 = tmp_path / "plain.safetensors"
    plain.save_checkpoint(p2)
    from safetensors import safe_open

    with safe_open(str(p2), framework="pt") as f:
        assert not any(k.startswith("exposure.") for k in f.keys())
    on = Trainer.from_checkpoint(p2, ds, device="cpu", config=small_config(init_points=50, exposure=True))
    assert torch.equal(on.exposure.A, torch.eye(3).expand(5, 3, 3))
    on.step()
    # the corrections must fit the dataset's training set
    other = make_dataset(rng, n_gauss=10, size=24, n_train=4, n_test=0)
    with pytest.raises(CheckpointError, match="4 training images|5 training images|for 4 training views"):
        Trainer.from_checkpoint(path, other, device="cpu")


def test_cli_exposure_writes_exposure_json_and_protocol_metrics(tmp_path):
    from rigel_core.cli.train import main
    from rigel_core.data import make_dataset as make_procedural

    data = tmp_path / "data"
    make_procedural(data, 300, 32, 32, n_train=5, n_test=2, seed=3, device="cpu", progress=False)
    run = tmp_path / "run"
    common = ["--data", str(data), "--device", "cpu", "--quiet", "--init-points", "120", "--eval-every", "5",
              "--n-renders", "0"]
    assert main(common + ["--out", str(run), "--exposure", "--iters", "10"]) == 0
    ex = json.loads((run / "exposure.json").read_text())
    assert len(ex["images"]) == 5 and all(np.shape(v["A"]) == (3, 3) and len(v["b"]) == 3
                                          for v in ex["images"].values())
    metrics = json.loads((run / "metrics.json").read_text())
    assert metrics["config"]["exposure"] is True
    assert all(math.isfinite(e["psnr_exposure"]) and 0 < e["ssim_exposure"] <= 1 for e in metrics["eval"])
    assert "exposure protocol" in (run / "log.txt").read_text()
    # resumed without the flag: the saved run keeps its exposure
    assert main(common + ["--out", str(run), "--iters", "15", "--resume"]) == 0
    metrics = json.loads((run / "metrics.json").read_text())
    assert metrics["config"]["exposure"] is True and metrics["iterations_done"] == 15
    assert metrics["eval"][-1]["iteration"] == 15 and math.isfinite(metrics["eval"][-1]["psnr_exposure"])
    run2 = tmp_path / "run2"
    assert main(common + ["--out", str(run2), "--iters", "5"]) == 0
    assert not (run2 / "exposure.json").exists()
    metrics = json.loads((run2 / "metrics.json").read_text())
    assert metrics["config"]["exposure"] is False and metrics["eval"][-1]["psnr_exposure"] is None
    run3 = tmp_path / "run3"  # an exposure-off run scored by the protocol too
    assert main(common + ["--out", str(run3), "--iters", "5", "--set", "eval_exposure=true"]) == 0
    assert not (run3 / "exposure.json").exists()
    assert math.isfinite(json.loads((run3 / "metrics.json").read_text())["eval"][-1]["psnr_exposure"])


def test_cli_set_and_real_capture_flags(tmp_path, capsys):
    from rigel_core.cli.train import main
    from rigel_core.data import make_dataset as make_procedural

    data = tmp_path / "data"
    make_procedural(data, 200, 24, 24, n_train=3, n_test=1, seed=4, device="cpu", progress=False)
    common = ["--data", str(data), "--device", "cpu", "--quiet", "--init-points", "80", "--iters", "3"]
    run = tmp_path / "run"
    assert main(common + ["--out", str(run), "--position-lr-max-steps", "30000", "--init-background", "7",
                          "--set", "densify_until=2", "--set", "grad_threshold=1e-3", "--set", "init_scale_rms=true",
                          "--set", "init_box=[-1,-1,-1,1,1,1]", "--set", "sh_degree=1"]) == 0
    cfg = json.loads((run / "metrics.json").read_text())["config"]
    assert (cfg["position_lr_max_steps"], cfg["init_background_points"], cfg["densify_until"],
            cfg["grad_threshold"], cfg["init_scale_rms"], cfg["init_box"], cfg["sh_degree"]) == \
        (30000, 0, 2, 1e-3, True, [-1, -1, -1, 1, 1, 1], 1)  # no SfM points here: the 7 is noted, not used
    assert "init_background_points=7 not used" in (run / "log.txt").read_text()
    for bad, msg in ((["--set", "densify_untill=3"], "no field 'densify_untill'"),
                     (["--set", "densify_until"], "expected FIELD=VALUE"),
                     (["--set", "iterations=abc"], "rigel-train:")):
        out = tmp_path / f"bad{len(msg)}"
        assert main(common + ["--out", str(out)] + bad) == 2
        assert msg in capsys.readouterr().err and not out.exists()
