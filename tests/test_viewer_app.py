"""rigel-viewer as an application: the training thread and its messages, the panels' state, orbit videos,
``--offscreen`` training, a scripted session in a real window (Xvfb + lavapipe), closing and Ctrl-C during
training.

Datasets are tiny (a procedural scene rendered at 24×24 in memory, or the 64×64 procedural dataset on disk), the
windows small, and heavy runs use one PyTorch thread (much faster than two on a busy 2-core machine). The real
PLY comes from ``../shared/data`` through the ``shared_data`` fixture.
"""
import importlib.util
import json
import math
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from test_vulkan import VK_OK, VK_REASON, display, no_validation_errors  # noqa: F401  (fixtures)

ROOT = Path(__file__).resolve().parents[1]

from viewer import messages as M  # noqa: E402
from viewer import requests as R  # noqa: E402
from viewer.model_slot import ModelSlot  # noqa: E402
from viewer.training import CHECKPOINT_NAME, PLY_NAME, TrainingSession  # noqa: E402
from viewer.ui_state import Job, TrainingState, downsample_mean, error_map  # noqa: E402

needs_vulkan = pytest.mark.skipif(not VK_OK, reason=f"no usable Vulkan device: {VK_REASON}")
needs_ui = pytest.mark.skipif(importlib.util.find_spec("imgui_bundle") is None,
                              reason="the viewer's UI package imgui-bundle is not installed")


def tiny_dataset(rng, *, size=24, n_train=6, n_test=2):
    """A procedural scene (a few hundred Gaussians) rendered from cameras around it, in memory."""
    from rigel_core import Camera, render
    from rigel_core.data import make_scene
    from rigel_core.data.frames import Dataset, Frame

    seed = int(torch.randint(0, 2**31 - 1, (1,), generator=rng))
    scene = make_scene(n=300, sh_degree=1, seed=seed)
    lo, hi = scene.bounds(0.01)
    center = (0.5 * (lo + hi)).double().numpy()
    radius = float(torch.linalg.norm(hi - lo)) * 0.5

    def cams(n, phase):
        out = []
        for i in range(n):
            a = 2 * math.pi * (i + phase) / n
            eye = center + 2.5 * radius * np.array([math.cos(a), math.sin(a), 0.5])
            out.append(Camera.look_at(eye, center, (0, 0, 1), width=size, height=size, fov_x_deg=50, name=f"v{i}"))
        return out

    def frames(cs):
        with torch.no_grad():
            return [Frame(c, render(scene, c).image.clamp(0, 1).contiguous(), None, c.name) for c in cs]

    train, test = frames(cams(n_train, 0.0)), frames(cams(n_test, 0.5))
    centres = np.stack([f.camera.campos for f in train])
    return Dataset(train, test, centres.mean(0), float(np.linalg.norm(centres - centres.mean(0), axis=1).max()))


def tiny_trainer(rng, iterations=30, **cfg):
    from rigel_core.train import TrainConfig, Trainer

    ds = tiny_dataset(rng)
    cfg = {"strategy": "default", **cfg}  # 3DGS's densification and its sliders ("auto": MCMC on these photos)
    config = TrainConfig(iterations=iterations, init_points=200, sh_degree=1, eval_every=10,
                         densify_from=5, densify_interval=5, densify_until=20, **cfg)
    return Trainer(ds, config, device="cpu")


_seen: dict = {}  # id(events) -> (events, index after the last event a wait_for returned from it); the list is
#                   kept so that its id cannot be reused by another list


def wait_for(events: list, session, predicate, timeout=60.0):
    """Drain ``session`` into ``events`` until one event satisfies ``predicate``; return it. Events already
    drained by an earlier call but after the event it returned are looked at first (two events can arrive in
    one drain)."""
    t0 = time.perf_counter()
    seen = _seen.get(id(events))
    i = seen[1] if seen is not None and seen[0] is events else 0
    while True:
        while i < len(events):
            e = events[i]
            i += 1
            if predicate(e):
                _seen[id(events)] = (events, i)
                return e
        if time.perf_counter() - t0 >= timeout:
            break
        events.extend(session.drain_events())
        if i == len(events):
            time.sleep(0.005)
    raise AssertionError(f"no matching event within {timeout} s; got {[type(e).__name__ for e in events][-10:]}")


# ---- the UI's state (no window) -----------------------------------------------------------------------------------
def test_training_state_folds_events():
    st = TrainingState()
    st.apply(M.TrainingStarted(0, 100, 50, "cpu", 6, 2, "/run", False, {"grad_threshold": 2e-4}, "sh"))
    assert (st.status, st.iterations, st.densify) == ("paused", 100, {"grad_threshold": 2e-4})
    st.apply(M.EvalFinished(0, 9.5, 0.1, 50, 2))
    st.apply(M.TrainingResumed(0))
    for it, p in ((1, 10.0), (2, float("nan")), (3, 12.0)):
        st.apply(M.TrainingProgress(it, 0.5, p, 50 + it, 0.1 * it, 100.0, f"v{it}"))
    assert st.status == "running" and st.iteration == 3 and st.num_gaussians == 53
    assert st.train_iters == [1, 3] and st.train_psnr == [10.0, 12.0]        # a non-finite PSNR is not plotted
    st.apply(M.Densified(3, 2, 1, 4, 52))
    assert st.log[-1].endswith("densify +2 clone +1 split -4 prune -> 52")
    st.apply(M.Densified(3, 0, 0, 0, 52, n_relocated=7, n_added=0))           # an MCMC step says what it did
    assert st.log[-1].endswith("mcmc relocate 7 add 0 -> 52") and "clone" not in st.log[-1]
    st.apply(M.Densified(4, 0, 0, 0, 52, n_relocated=30, n_added=0, dead_share=0.577))  # growth held by the rule
    assert st.log[-1].endswith("mcmc relocate 30 add 0 -> 52 (growth held: 58% dead)")
    st.apply(M.DensifyParamsChanged(3, {"grad_threshold": 5e-4}))
    assert st.num_gaussians == 52 and st.densify["grad_threshold"] == 5e-4
    st.apply(M.CommandRejected("SetAppearance", "unknown appearance 'x'"))
    assert st.appearance_switchable                                        # a bad value is not "unsupported"
    st.apply(M.CommandRejected("SetAppearance", "no Trainer.set_appearance", unsupported=True))
    assert not st.appearance_switchable                                    # typed, not recognised by its text
    st.densify["grad_threshold"] = -1.0                                    # the slider's rejected value
    st.apply(M.CommandRejected("SetDensifyParams", "grad_threshold must be > 0", current={"grad_threshold": 5e-4}))
    assert st.densify["grad_threshold"] == 5e-4                            # ... reverts to the trainer's
    st.apply(M.TrainingFailed(4, "RuntimeError: boom", "Traceback ... boom"))
    st.apply(M.TrainingFailed(4, "saving after the failure failed: disk", "..."))
    assert st.status == "failed" and st.error == "RuntimeError: boom"          # the cause, not the consequence
    st.apply(M.TrainingStopped(4))
    assert st.status == "failed" and any("FAILED" in line for line in st.log)
    st2 = TrainingState()
    st2.apply(M.TrainingFinished(9, 20.0))
    st2.apply(M.TrainingStopped(9))
    assert st2.status == "finished"


def test_error_map_and_downsampling(rng):
    r = torch.rand(13, 17, 3, generator=rng).numpy() * 1.2 - 0.1            # a render may leave [0, 1]
    g = torch.rand(13, 17, 3, generator=rng).numpy()
    err, psnr = error_map(r, g)
    rc = np.clip(r, 0, 1)
    for y, x in ((0, 0), (5, 11), (12, 16)):
        assert err[y, x] == pytest.approx(sum(abs(rc[y, x, c] - g[y, x, c]) for c in range(3)) / 3, rel=1e-5)
    mse = sum(((rc[..., c] - g[..., c]) ** 2).sum() for c in range(3)) / rc.size
    assert psnr == pytest.approx(-10 * math.log10(mse), rel=1e-6)
    assert error_map(g, g)[1] == math.inf
    with pytest.raises(ValueError, match="shape"):
        error_map(r[:5], g)
    small = downsample_mean(err, 6)                                          # factor 3: 13x17 -> 4x5
    assert small.shape == (4, 5)
    assert small[1, 2] == pytest.approx(err[3:6, 6:9].mean(), rel=1e-6)
    assert downsample_mean(err, 100) is err


def test_job_keeps_result_or_error():
    ok = Job("ok", lambda job, x: x * 2, 21)
    bad = Job("bad", lambda job: 1 / 0)
    assert ok.join(10) and bad.join(10)
    assert ok.result == 42 and ok.progress == 1.0 and not ok.error
    assert bad.result is None and "ZeroDivisionError" in bad.error and "1 / 0" in bad.traceback


def test_orbit_video_is_written_and_can_be_cancelled(tmp_path):
    import imageio.v3 as iio

    from viewer.camera_control import OrbitCamera
    from viewer.video import orbit_cameras, video_format, write_orbit_video

    from rigel_core.data import make_scene

    model = make_scene(n=200, sh_degree=1, seed=1)
    oc = OrbitCamera()
    oc.frame_box(*(t.numpy() for t in model.bounds(0.01)), aspect=1.0)
    yaw = oc.yaw
    cams = orbit_cameras(oc, 4, 33, 25)
    assert oc.yaw == yaw and [(c.width, c.height) for c in cams] == [(32, 24)] * 4   # even sizes for H.264
    d0, d2 = cams[0].campos - oc.target, cams[2].campos - oc.target             # half a turn about +z
    np.testing.assert_allclose(d2, [-d0[0], -d0[1], d0[2]], atol=1e-9)
    job = Job("video", write_orbit_video, model, cams, tmp_path / "orbit.mp4", fps=10)
    assert job.join(60) and not job.error, job.traceback
    path = job.result
    assert path.suffix == "." + video_format() and path.is_file()
    frames = iio.imread(path, index=None)
    assert frames.shape[0] == 4 and frames.shape[1:3] == (24, 32)
    assert np.abs(frames[0].astype(int) - frames[2].astype(int)).mean() > 1   # the view turned
    assert not list(tmp_path.glob("c.*"))


def test_cancelling_an_orbit_video_is_not_a_failure(tmp_path, caplog):
    """Cancel asked for by the user: no error in the panel, no traceback in the log, no partial file (issue 15;
    before, the cancelled job logged a RuntimeError with its traceback as a failure)."""
    import logging

    from viewer.camera_control import OrbitCamera
    from viewer.video import orbit_cameras, write_orbit_video

    from rigel_core.data import make_scene

    model = make_scene(n=100, sh_degree=0, seed=int(torch.randint(0, 2**31 - 1, (1,))))
    oc = OrbitCamera()
    oc.frame_box(*(t.numpy() for t in model.bounds(0.01)), aspect=1.0)
    cams = orbit_cameras(oc, 3, 16, 16)
    logging.getLogger("rigel.viewer").addHandler(caplog.handler)
    try:
        with caplog.at_level(logging.INFO, logger="rigel.viewer"):
            cancelled = Job("video", lambda job: (job.cancel(),
                                                  write_orbit_video(job, model, cams, tmp_path / "c.mp4"))[1])
            assert cancelled.join(60)
    finally:
        logging.getLogger("rigel.viewer").removeHandler(caplog.handler)
    assert cancelled.error == "" and cancelled.traceback == "" and cancelled.message == "cancelled"
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR or "Traceback" in r.getMessage()]
    assert not list(tmp_path.glob("c.*"))


# ---- the training thread (no window) ----------------------------------------------------------------------------
def test_training_thread_writes_warnings_and_graph_stats_to_the_run(rng, tmp_path, one_thread, monkeypatch):
    """A warning raised while the viewer trains (coarse-to-fine's smaller factor, a failed graph capture) is in the
    run's log.txt as in rigel-train's; the hook is removed when the session ends; metrics.json has graph_step."""
    import warnings

    trainer = tiny_trainer(rng, iterations=30)
    step = type(trainer).step

    def warning_step(self):
        if self.iteration == 1:
            warnings.warn("a viewer warning at iteration 1 (test)", stacklevel=2)
        return step(self)

    monkeypatch.setattr(type(trainer), "step", warning_step)
    shown = warnings.showwarning
    session = TrainingSession(trainer, ModelSlot(), tmp_path / "run", running=False, eval_at_start=False).start()
    ev = []
    wait_for(ev, session, lambda e: isinstance(e, M.TrainingStarted))
    session.send(M.Step(3))
    wait_for(ev, session, lambda e: isinstance(e, M.TrainingPaused))
    assert session.stop() and not session.alive
    assert warnings.showwarning is shown
    assert (tmp_path / "run" / "log.txt").read_text().count("warning: a viewer warning at iteration 1 (test)") == 1
    assert json.loads((tmp_path / "run" / "metrics.json").read_text())["graph_step"] is None  # CPU: eager


def test_training_thread_publishes_the_refined_poses(rng, tmp_path, one_thread):
    """A run with pose refinement publishes its corrections with each snapshot (``_poses``, kept out of the panel's
    model info): the refined cameras they give are the trainer's own at that iteration; a run without publishes
    none."""
    for pose_opt in (True, False):
        trainer = tiny_trainer(rng, iterations=30, pose_opt=pose_opt, pose_opt_lr=0.01, pose_opt_lr_final=0.01)
        slot = ModelSlot()
        session = TrainingSession(trainer, slot, tmp_path / f"run{pose_opt}", running=False,
                                  eval_at_start=False).start()
        try:
            ev = []
            wait_for(ev, session, lambda e: isinstance(e, M.TrainingStarted))
            session.send(M.Step(3))
            wait_for(ev, session, lambda e: isinstance(e, M.TrainingPaused))
            snap = slot.latest()
            assert snap.info["iteration"] == 3
            if not pose_opt:
                assert "_poses" not in snap.info
                continue
            cams = [f.camera for f in trainer.train_frames]
            got = snap.info["_poses"].cameras(cams)
            want = trainer.refined_cameras()
            np.testing.assert_allclose([c.viewmat for c in got], [c.viewmat for c in want], atol=1e-12)
            assert max(np.linalg.norm(c.campos - f.campos) for c, f in zip(got, cams)) > 1e-6   # they moved
        finally:
            session.stop(save=False, timeout=30)


def test_a_pause_is_reported_only_after_the_paused_model_is_published(rng, tmp_path, one_thread, monkeypatch):
    """Whoever sees TrainingPaused finds the paused iteration in the slot, however slow the copy (the copy is
    slowed here so that an event sent before the publish is caught every time, not one CI run in a hundred)."""
    import viewer.training as T

    real = T.snapshot_model

    def slow(trainer):
        time.sleep(0.3)
        return real(trainer)

    monkeypatch.setattr(T, "snapshot_model", slow)
    trainer = tiny_trainer(rng, iterations=30)
    slot = ModelSlot()
    session = TrainingSession(trainer, slot, tmp_path / "run", running=False).start()
    try:
        ev = []
        wait_for(ev, session, lambda e: isinstance(e, M.TrainingStarted))
        for k in (2, 1):                              # the window-cut pause and a one-step pause
            session.send(M.Step(k))
            paused = wait_for(ev, session, lambda e: isinstance(e, M.TrainingPaused))
            assert slot.latest().info["iteration"] == paused.iteration == trainer.iteration
    finally:
        session.stop(save=False, timeout=30)


def test_training_thread_obeys_commands_and_reports_events(rng, tmp_path, one_thread):
    from rigel_core.io import load_scene

    trainer = tiny_trainer(rng, iterations=30)
    slot = ModelSlot()
    session = TrainingSession(trainer, slot, tmp_path / "run", running=False).start()
    ev = []
    started = wait_for(ev, session, lambda e: isinstance(e, M.TrainingStarted))
    assert not started.running and started.densify["grad_threshold"] == trainer.config.grad_threshold
    assert isinstance(ev[0], M.EvalFinished) and ev[0].iteration == 0      # the PSNR plot's starting point
    assert slot.latest() is not None and slot.latest().info["iteration"] == 0

    session.send(M.Step(3))
    wait_for(ev, session, lambda e: isinstance(e, M.TrainingPaused))
    # one TrainingProgress per window of steps (their values read from the device once), here cut by the pause
    assert [e.iteration for e in ev if isinstance(e, M.TrainingProgress)] == [3]
    assert trainer.iteration == 3 and slot.latest().info["iteration"] == 3   # a pause publishes the model
    snap = slot.latest().model
    assert snap.means3D is not trainer.model.means3D and not snap.means3D.requires_grad

    session.send(M.SetDensifyParams({"grad_threshold": 7e-4, "densify_interval": 3}))
    changed = wait_for(ev, session, lambda e: isinstance(e, (M.DensifyParamsChanged, M.CommandRejected)))
    assert isinstance(changed, M.DensifyParamsChanged)
    assert (trainer.config.grad_threshold, trainer.config.densify_interval) == (7e-4, 3)
    for bad in ({"densify_interval": 0}, {"lambda_dssim": 0.5}):
        session.send(M.SetDensifyParams(bad))
        rej = wait_for(ev, session, lambda e: isinstance(e, (M.DensifyParamsChanged, M.CommandRejected)))
        assert isinstance(rej, M.CommandRejected)
        assert rej.current == ({"densify_interval": 3} if "densify_interval" in bad else {})   # the UI reverts to it
    assert trainer.config.densify_interval == 3 and trainer.config.lambda_dssim == 0.2   # left as they were
    session.send(M.SetAppearance("neural"))
    assert isinstance(wait_for(ev, session, lambda e: isinstance(e, (M.CommandRejected, M.AppearanceChanged))),
                      M.CommandRejected)
    # SH -> MLP while training (Trainer.set_appearance): the published snapshot carries its own MLP copy
    session.send(M.SetAppearance("mlp"))
    switched = wait_for(ev, session, lambda e: isinstance(e, (M.CommandRejected, M.AppearanceChanged)))
    assert isinstance(switched, M.AppearanceChanged) and switched.kind == "mlp" and math.isfinite(switched.rmse)
    app = slot.latest().model.appearance
    assert app is not None and app.latents is not trainer.model.appearance.latents
    session.send(M.Step(2))
    wait_for(ev, session, lambda e: isinstance(e, M.TrainingPaused))
    session.send(M.SetAppearance("sh"))
    back = wait_for(ev, session, lambda e: isinstance(e, (M.CommandRejected, M.AppearanceChanged)))
    assert isinstance(back, M.AppearanceChanged) and back.kind == "sh"
    assert slot.latest().model.appearance is None and trainer.iteration == 5

    session.send(M.Save("checkpoint"))
    saved = wait_for(ev, session, lambda e: isinstance(e, M.Saved))
    assert saved.iteration == 5 and Path(saved.paths[0]).name == CHECKPOINT_NAME
    assert load_scene(saved.paths[0]).num_gaussians == trainer.model.num_gaussians

    session.send(M.Resume())
    fin = wait_for(ev, session, lambda e: isinstance(e, M.TrainingFinished))
    assert fin.iteration == 30 and math.isfinite(fin.psnr)
    progress = [e.iteration for e in ev if isinstance(e, M.TrainingProgress)]
    # in order, a window of at most progress_every steps each (cut at pauses and evaluations), up to the end
    assert progress == sorted(set(progress)) and progress[-1] == 30
    assert max(b - a for a, b in zip([0] + progress, progress)) <= session.progress_every
    assert any(isinstance(e, M.Densified) for e in ev)                       # the live interval 3 was used
    evals = [e for e in ev if isinstance(e, M.EvalFinished)]
    assert [e.iteration for e in evals] == [0, 10, 20, 30] and evals[-1].psnr > evals[0].psnr
    final = [e for e in ev if isinstance(e, M.Saved) and e.reason == "finished"]
    assert final and {Path(p).name for p in final[0].paths} == {CHECKPOINT_NAME, PLY_NAME}
    assert slot.latest().info["iteration"] == 30
    session.send(M.Step(1))
    assert isinstance(wait_for(ev, session, lambda e: isinstance(e, M.CommandRejected)), M.CommandRejected)
    assert session.stop() and not session.alive
    ev.extend(session.drain_events())
    assert isinstance(ev[-1], M.TrainingStopped)
    assert not [e for e in ev if isinstance(e, M.Saved) and e.reason == "stopped"]   # nothing new to save
    # the run folder has rigel-train's log.txt and metrics.json (issue 15: the viewer wrote neither)
    run = tmp_path / "run"
    metrics = json.loads((run / "metrics.json").read_text())
    assert [e["iteration"] for e in metrics["train"]] == progress
    assert [e["iteration"] for e in metrics["eval"]] == [0, 10, 20, 30]
    assert metrics["densify"] and metrics["iterations_done"] == 30
    assert metrics["config"]["densify_interval"] == 3 and metrics["dataset"]["train_views"] == 6
    log = (run / "log.txt").read_text()
    assert "test psnr" in log and "densify clone" in log and "finished: checkpoint.safetensors, model.ply written" in log


@pytest.mark.parametrize("strategy", ["default", "mcmc"])
def test_the_training_panel_offers_only_the_fields_the_strategy_reads(rng, tmp_path, one_thread, strategy):
    # the MCMC budget has no gradient threshold, opacity reset or pruning (train/mcmc.py): sliders for them in an
    # MCMC run (the default on SfM captures) moved nothing
    trainer = tiny_trainer(rng, iterations=5, strategy=strategy, max_gaussians=400)
    session = TrainingSession(trainer, ModelSlot(), tmp_path / "run", running=False, eval_at_start=False).start()
    try:
        started = wait_for([], session, lambda e: isinstance(e, M.TrainingStarted))
    finally:
        session.stop()
    unused = {"grad_threshold", "absgrad_threshold", "opacity_reset_interval", "prune_opacity"}
    # 3DGS's densification reads one of the two thresholds: the plain statistic's here (CPU)
    want = set(M.DENSIFY_FIELDS) - (unused if strategy == "mcmc" else {"absgrad_threshold"})
    assert trainer.config.densify_grad == "grad"
    assert started.strategy == strategy and set(started.densify) == want
    assert started.densify["max_gaussians"] == 400
    st = TrainingState()
    st.apply(started)
    assert st.strategy == strategy and set(st.densify) == want
    # the panel's budget line and its "why": the trainer's start line and notes, as the run's log has them
    assert st.notes == (trainer.start_line(), *trainer.notes) and f"strategy {strategy}" in st.notes[0]
    log = (tmp_path / "run" / "log.txt").read_text()
    assert all(n in log for n in st.notes[1:])


def test_a_session_under_absgrad_offers_its_threshold(rng, tmp_path, one_thread):
    # the session's TrainingStarted reads the statistic from the trainer's resolved config (absgrad is CUDA only,
    # so the CPU trainer's config is switched after construction: the session does not step here)
    trainer = tiny_trainer(rng, iterations=5, strategy="default")
    trainer.config.densify_grad = "absgrad"
    session = TrainingSession(trainer, ModelSlot(), tmp_path / "run", running=False, eval_at_start=False).start()
    try:
        started = wait_for([], session, lambda e: isinstance(e, M.TrainingStarted))
    finally:
        session.stop()
    assert "absgrad_threshold" in started.densify and "grad_threshold" not in started.densify
    assert started.densify["absgrad_threshold"] == trainer.config.absgrad_threshold


def test_the_panel_offers_the_threshold_of_the_statistic_the_run_reads():
    # under densify_grad="absgrad" the densification compares with absgrad_threshold: a grad_threshold slider there
    # would move nothing (and the other way round)
    grad, absgrad = set(M.densify_fields("default", "grad")), set(M.densify_fields("default", "absgrad"))
    assert "grad_threshold" in grad and "absgrad_threshold" not in grad
    assert "absgrad_threshold" in absgrad and "grad_threshold" not in absgrad
    assert grad - {"grad_threshold"} == absgrad - {"absgrad_threshold"}
    assert not {"grad_threshold", "absgrad_threshold"} & set(M.densify_fields("mcmc", "absgrad"))
    from viewer.panels.training import DENSIFY_SLIDERS
    assert set(M.DENSIFY_FIELDS) == set(DENSIFY_SLIDERS)   # a slider for every field the panel may be offered


def test_the_strategy_objects_and_the_viewer_read_one_table():
    """Each strategy object's live fields and title are its entry of the torch-free table the viewer reads (one
    entry per strategy, none left over); an unknown strategy is an error, not the default's sliders."""
    from rigel_core.train import strategy as S
    from rigel_core.train.strategy_table import LIVE, live_for

    assert set(S._STRATEGIES) == set(LIVE)
    for name, s in S._STRATEGIES.items():
        assert s.live is LIVE[name] is live_for(name) and s.live.title
        for grad in ("grad", "absgrad"):
            assert M.densify_fields(name, grad) == s.live.fields(grad)
    assert len({s.live.title for s in S._STRATEGIES.values()}) == len(LIVE)
    with pytest.raises(ValueError, match="no training strategy 'auto'"):
        M.densify_fields("auto")


def test_a_finished_run_opened_again_writes_nothing_until_it_changes(rng, tmp_path, one_thread):
    """A finished run opened again (``rigel-viewer --data … --resume``): the session shows its last evaluation and
    writes nothing — no empty session appended to metrics.json, no start line in log.txt — until the model is
    saved, as ``rigel-train --resume`` of a finished run writes nothing (before: both files grew a session)."""
    from rigel_core.run_dir import LOG_NAME, METRICS_NAME
    from rigel_core.train import Trainer

    trainer = tiny_trainer(rng, iterations=10)
    run = tmp_path / "run"
    session = TrainingSession(trainer, ModelSlot(), run, eval_at_start=False).start()
    ev = []
    wait_for(ev, session, lambda e: isinstance(e, M.TrainingFinished))
    assert session.stop(timeout=30)
    files = {n: (run / n).read_bytes() for n in (METRICS_NAME, LOG_NAME, CHECKPOINT_NAME, PLY_NAME)}
    last = json.loads(files[METRICS_NAME])["eval"][-1]
    assert last["iteration"] == 10

    again = Trainer.from_checkpoint(run / CHECKPOINT_NAME, trainer.dataset, device="cpu")
    assert again.iteration == 10
    session = TrainingSession(again, ModelSlot(), run, running=True).start()
    ev = []
    shown = wait_for(ev, session, lambda e: isinstance(e, M.EvalFinished))   # evaluated before it starts
    started = wait_for(ev, session, lambda e: isinstance(e, M.TrainingStarted))
    assert started.iteration == 10 and not started.running
    assert (shown.iteration, shown.psnr) == (10, last["psnr"])      # the run's own evaluation, not a new one
    session.send(M.Step(3))
    wait_for(ev, session, lambda e: isinstance(e, M.CommandRejected))
    assert session.stop(timeout=30)
    assert {n: (run / n).read_bytes() for n in files} == files

    # a save asked for is written, and recorded as a session of the run
    session = TrainingSession(Trainer.from_checkpoint(run / CHECKPOINT_NAME, trainer.dataset, device="cpu"),
                              ModelSlot(), run, eval_at_start=False).start()
    ev = []
    session.send(M.Save("ply"))
    wait_for(ev, session, lambda e: isinstance(e, M.Saved))
    assert session.stop(timeout=30)
    metrics = json.loads((run / METRICS_NAME).read_text())
    assert metrics["eval"][-1] == last and (run / METRICS_NAME).read_bytes() != files[METRICS_NAME]
    log_text = (run / LOG_NAME).read_text()
    assert log_text.startswith(files[LOG_NAME].decode()) and f"request: {PLY_NAME} written" in log_text[
        len(files[LOG_NAME]):]


def test_a_run_saved_before_its_final_evaluation_is_finished_when_opened_again(rng, tmp_path, one_thread):
    """A run whose iterations are all done but whose final evaluation is not (stopped during its last step) is not
    "finished" (``rigel_core.train.run.run_finished``, rigel-train's rule too): opened again, the viewer evaluates
    and saves it, as ``rigel-train --resume`` does; once done, opening it writes nothing."""
    from rigel_core.run_dir import METRICS_NAME
    from rigel_core.train import Trainer
    from rigel_core.train.run import run_finished

    trainer = tiny_trainer(rng, iterations=6)   # evaluates every 10: none by 6
    for _ in range(6):
        trainer.step()
    run = tmp_path / "run"
    run.mkdir()
    trainer.save_checkpoint(run / CHECKPOINT_NAME)
    again = Trainer.from_checkpoint(run / CHECKPOINT_NAME, trainer.dataset, device="cpu")
    assert again.iteration == 6 and not run_finished(again)
    session = TrainingSession(again, ModelSlot(), run, eval_at_start=False).start()
    done = wait_for([], session, lambda e: isinstance(e, M.TrainingFinished))
    assert session.stop(timeout=30)
    assert done.iteration == 6 and math.isfinite(done.psnr)
    metrics = json.loads((run / METRICS_NAME).read_text())
    assert metrics["eval"][-1]["iteration"] == 6 and (run / PLY_NAME).is_file()
    assert run_finished(Trainer.from_checkpoint(run / CHECKPOINT_NAME, trainer.dataset, device="cpu"))


def test_the_viewers_sessions_add_to_the_runs_total_time(rng, tmp_path, one_thread):
    """``timings.total_s`` in metrics.json: a viewer session adds its loop and evaluation seconds to the run's total,
    as rigel-train's sessions add theirs (before: the viewer never wrote it, so a rigel-train run resumed in the
    viewer kept its first session's total, below the run's train_s)."""
    from rigel_core.run_dir import METRICS_NAME
    from rigel_core.train import Trainer

    trainer = tiny_trainer(rng, iterations=6)
    run = tmp_path / "run"
    session = TrainingSession(trainer, ModelSlot(), run, eval_at_start=False).start()
    wait_for([], session, lambda e: isinstance(e, M.TrainingFinished))
    assert session.stop(timeout=30)
    t1 = json.loads((run / METRICS_NAME).read_text())["timings"]
    assert t1["total_s"] >= t1["train_s"] > 0 and t1["total_s"] >= t1["loop_s"] + t1["eval_s"] - 1e-9
    # a run of an earlier session (rigel-train's, say) resumed for more iterations: its total grows by this session's
    doc = json.loads((run / METRICS_NAME).read_text())
    doc["timings"]["total_s"] = 1000.0
    (run / METRICS_NAME).write_text(json.dumps(doc))
    from rigel_core.cli.common import resume_config

    again = Trainer.from_checkpoint(run / CHECKPOINT_NAME, trainer.dataset, device="cpu",
                                    config=resume_config(run / CHECKPOINT_NAME, {"iterations": 10}))
    session = TrainingSession(again, ModelSlot(), run, eval_at_start=False).start()
    wait_for([], session, lambda e: isinstance(e, M.TrainingFinished))
    assert session.stop(timeout=30)
    t2 = json.loads((run / METRICS_NAME).read_text())["timings"]
    assert t2["train_s"] > t1["train_s"] and t2["total_s"] >= 1000.0 + (t2["train_s"] - t1["train_s"])


def test_a_failure_in_the_thread_is_shown_logged_and_saved(rng, tmp_path, caplog, one_thread):
    from rigel_core.checkpoint import read_checkpoint

    trainer = tiny_trainer(rng, iterations=50)
    real_step = trainer.step

    def failing_step():
        if trainer.iteration == 4:
            raise RuntimeError("CUDA error: an illegal memory access (simulated)")
        return real_step()

    trainer.step = failing_step
    session = TrainingSession(trainer, ModelSlot(), tmp_path / "run", eval_at_start=False)
    with caplog.at_level("ERROR", logger="rigel.viewer"):
        session.start()
        ev = []
        failed = wait_for(ev, session, lambda e: isinstance(e, M.TrainingFailed))
        saved = wait_for(ev, session, lambda e: isinstance(e, M.Saved))
    assert failed.iteration == 4 and "illegal memory access" in failed.message
    assert "failing_step" in failed.traceback and "illegal memory access" in caplog.text
    assert saved.reason == "failed" and read_checkpoint(tmp_path / "run" / CHECKPOINT_NAME)[1]["iteration"] == 4
    assert (tmp_path / "run" / PLY_NAME).is_file()
    time.sleep(0.1)
    assert session.alive                      # it waits for the UI to say stop, so the failure stays visible
    st = TrainingState()
    for e in ev:
        st.apply(e)
    assert st.status == "failed" and "illegal memory access" in st.error
    assert session.stop(timeout=10)


def test_the_ui_never_waits_for_a_training_step(rng, tmp_path, one_thread):
    trainer = tiny_trainer(rng, iterations=20)
    real_step = trainer.step
    gate, inside = threading.Event(), threading.Event()

    def slow_step():
        inside.set()
        gate.wait(30)                         # a very long iteration
        return real_step()

    trainer.step = slow_step
    slot = ModelSlot()
    session = TrainingSession(trainer, slot, tmp_path / "run", eval_at_start=False).start()
    assert inside.wait(30)
    t0 = time.perf_counter()
    for _ in range(100):                      # what the UI does every frame while the step runs
        session.drain_events()
        slot.latest()
        session.send(M.SetDensifyParams({"grad_threshold": 3e-4}))
    assert time.perf_counter() - t0 < 0.5
    trainer.step = real_step
    gate.set()
    # and the training never waits for the UI: nobody drains the events, it still finishes
    t0 = time.perf_counter()
    while trainer.iteration < 20 and time.perf_counter() - t0 < 60:
        time.sleep(0.01)
    assert trainer.iteration == 20 and session.events.qsize() > 20
    assert session.stop(timeout=30)


# ---- offscreen: the CLI ----------------------------------------------------------------------------------------------
def _viewer_cmd(*args):
    return [sys.executable, "-m", "viewer", *map(str, args)]


def _env(**extra):
    env = dict(os.environ, OMP_NUM_THREADS="1", **extra)
    env.pop("WAYLAND_DISPLAY", None)
    return env


@pytest.fixture(scope="module")
def procedural_64(tmp_path_factory):
    """The 64×64 procedural dataset (``rigel_core.data.make_dataset``) on disk."""
    from rigel_core.data import make_dataset

    out = tmp_path_factory.mktemp("procedural64")
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        make_dataset(out, 1000, 64, 64, n_train=12, n_test=3, progress=False, device="cpu")
    finally:
        torch.set_num_threads(n)
    return out


@needs_vulkan
def test_offscreen_training_writes_frames_and_psnr_rises(procedural_64, tmp_path):
    from PIL import Image

    from rigel_core.io import load_scene

    out = tmp_path / "out"
    env = _env()
    env.pop("DISPLAY", None)                  # offscreen needs no display
    r = subprocess.run(_viewer_cmd("--data", procedural_64, "--offscreen", "--iters", 200, "--init-points", 500,
                                   "--eval-every", 100, "--frames", 3, "--out", out, "--size", "320x200",
                                   "--device", "cpu", "--threads", 1),
                       cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    s = json.loads((out / "summary.json").read_text())
    assert s["ok"] and s["iterations"] == 200 and s["status"] == "finished" and s["frames"] == 3
    assert s["strategy"] == "default"  # "auto" resolved: the procedural data has no SfM points
    assert s["densify_grad"] == "grad"  # likewise (no SfM points: 3DGS's statistic)
    assert s["frame_ring"] == "host-mapped" and s["render_device"] == "cpu" and s["training_device"] == "cpu"
    assert [e["iteration"] for e in s["eval"]] == [0, 100, 200]
    assert s["psnr"] > s["psnr_initial"] + 5                                  # held-out PSNR rises
    assert s["train_psnr_last10"] > s["train_psnr_first10"] + 5
    assert s["fps"] > 0 and s["presents"] >= s["frames"]
    its = [shot["iteration"] for shot in s["shots"]]
    assert its == sorted(its) and its[-1] == 200
    # the last frame shows the ended run: its status and the final evaluation in the panels
    assert s["shots"][-1]["status"] == "finished" and s["shots"][-1]["eval_iteration"] == 200
    for name in ("frame_0000.png", "frame_0002.png", "image.png", "alpha.png", "overdraw.png", "training_view.png"):
        assert Image.open(out / name).size == (320, 200)
    # the run folder: checkpoint and PLY of the final model, loadable
    assert {Path(p).name for p in s["saved"]} == {CHECKPOINT_NAME, PLY_NAME}
    m = load_scene(out / CHECKPOINT_NAME)
    assert m.num_gaussians == s["gaussians"] and load_scene(out / PLY_NAME).num_gaussians == m.num_gaussians
    # the per-pixel error of training view 0 is in the PSNR window: the last frame differs from the first
    # where that window is, and its PSNR is a number
    assert s["error_view_psnr"] is not None and s["error_view_psnr"] > 10
    img = np.asarray(Image.open(out / "image.png"))
    assert img.std() > 3                                                       # not an empty frame


def test_the_signal_line_says_saving_only_when_the_training_has_something_unsaved(rng, tmp_path, one_thread):
    """Ctrl-C / SIGTERM's line: "saving the training and closing" only while the session has unsaved work (it said
    so for a session that trained nothing and saved nothing); "closing" without a session."""
    from types import SimpleNamespace

    from viewer.window import closing_words

    assert closing_words(SimpleNamespace(training=None)) == "closing"
    session = TrainingSession(tiny_trainer(rng, iterations=4), ModelSlot(), tmp_path / "run", running=False,
                              eval_at_start=False).start()
    viewer = SimpleNamespace(training=session)
    wait_for([], session, lambda e: isinstance(e, M.TrainingStarted))
    assert closing_words(viewer) == "closing"                  # paused before its first step: nothing to save
    ev = []
    session.send(M.Step(2))
    wait_for(ev, session, lambda e: isinstance(e, M.TrainingPaused))
    assert closing_words(viewer) == "saving the training and closing"
    session.send(M.Save("both"))
    wait_for(ev, session, lambda e: isinstance(e, M.Saved))
    assert closing_words(viewer) == "closing"                  # saved since
    assert session.stop(timeout=30)


def test_counts_in_the_cli_lines_agree_with_their_number():
    """The offscreen summary lines say "1 frame" and "1 iteration" (they said "1 frames"), "2 frames", "0 frames"."""
    from viewer.cli import _count

    assert [_count(n, "frame") for n in (0, 1, 2)] == ["0 frames", "1 frame", "2 frames"]
    assert _count(1, "iteration") == "1 iteration"


@needs_vulkan
def test_offscreen_cli_fails_loudly(procedural_64, tmp_path, capsys):
    from viewer.cli import main

    # a dataset that cannot be loaded is an input error: one line, status 2 (as rigel-render / rigel-train)
    assert main(["--data", str(tmp_path / "missing"), "--offscreen", "--out", str(tmp_path / "o")]) == 2
    assert "missing" in capsys.readouterr().err
    assert main(["--data", str(procedural_64), "scene.ply", "--offscreen", "--out", str(tmp_path)]) == 2
    assert "either" in capsys.readouterr().err
    assert main(["--data", str(procedural_64), "--offscreen", "--out", str(tmp_path), "--frames", "0"]) == 2


@needs_vulkan
def test_offscreen_training_out_is_refused_or_resumed_never_overwritten(procedural_64, tmp_path, capsys, rng,
                                                                       one_thread):
    """--data --offscreen into a plain offscreen run's folder is refused (one line naming it, status 2, nothing
    replaced), with --resume too (no run there); a --resume of an offscreen training run numbers its frames after
    the earlier session's (none replaced, none left unlisted beside the new summary) and its psnr_initial is the
    held-out PSNR where it started (before: frame_0000… were rewritten, an earlier frame_0002.png stayed, and
    psnr_initial was this session's last evaluation)."""
    from rigel_core import GaussianModel
    from rigel_core.io import save_ply
    from viewer.cli import main

    scene = tmp_path / "s.ply"
    pts = torch.randn(40, 3, generator=rng)
    save_ply(GaussianModel.from_points(pts, torch.rand(40, 3, generator=rng), sh_degree=0, scale=0.2,
                                       opacity=0.8), scene)
    small = ["--size", "64x48", "--device", "cpu", "--threads", "1"]
    train = ["--data", str(procedural_64), "--offscreen", "--init-points", "300", "--eval-every", "10"] + small
    plain, run = tmp_path / "plain", tmp_path / "run"
    assert main([str(scene), "--offscreen", "--out", str(plain), "--frames", "2"] + small) == 0
    capsys.readouterr()
    before = {p.name: p.read_bytes() for p in plain.iterdir()}
    for extra in ([], ["--resume"]):
        assert main(train + ["--out", str(plain), "--frames", "3", "--iters", "20"] + extra) == 2, extra
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and str(plain) in err and "frame_0000.png" in err, err
        assert {p.name: p.read_bytes() for p in plain.iterdir()} == before

    assert main(train + ["--out", str(run), "--frames", "3", "--iters", "20"]) == 0, capsys.readouterr().err
    s1 = json.loads((run / "summary.json").read_text())
    # log.txt opens and ends as rigel-train's: the data line (views, size, extent, background; the viewer wrote its
    # own "INFO training …" line without them) and the final line (the viewer wrote none)
    data_line = re.compile(rf"^\S+ \S+ data {re.escape(str(procedural_64))}: 12 train / 3 test views, 64x64, "
                           r"extent \d+\.\d{3}, (white|black) background$", re.M)
    log1 = (run / "log.txt").read_text()
    assert len(data_line.findall(log1)) == 1 and " INFO " not in log1, log1
    assert re.search(r"^\S+ \S+ final: 20 iterations, \d+ Gaussians, test psnr \d+\.\d\d ssim 0\.\d{4}, "
                     r"\d+\.\d s training, 0 skipped steps$", log1, re.M), log1
    first = {p.name: p.read_bytes() for p in run.glob("frame_*.png")}
    assert sorted(first) == [f"frame_{i:04d}.png" for i in range(3)] and s1["iterations"] == 20
    assert main(train + ["--out", str(run), "--frames", "2", "--iters", "40", "--resume"]) == 0, \
        capsys.readouterr().err
    s2 = json.loads((run / "summary.json").read_text())
    assert s2["ok"] and s2["iterations"] == 40
    new = [f for f in s2["files"] if f.startswith("frame_")]
    assert new == ["frame_0003.png", "frame_0004.png"] and [sh["frame"] for sh in s2["shots"]] == [3, 4]
    assert sorted(p.name for p in run.glob("frame_*.png")) == [f"frame_{i:04d}.png" for i in range(5)]
    assert {k: (run / k).read_bytes() for k in first} == first             # the earlier session's frames as they were
    # the held-out PSNR at the resume point: the earlier session's last evaluation (at iteration 20)
    assert s1["eval"][-1]["iteration"] == 20 and s2["eval"][0]["iteration"] == 20
    assert s2["psnr_initial"] == s1["psnr"] and s2["eval"][-1]["iteration"] == 40
    assert s2["psnr"] == s2["eval"][-1]["psnr"] != s2["psnr_initial"]
    # the resumed session's log.txt says what it changed, as rigel-train's (it was said on stderr only)
    log2 = (run / "log.txt").read_text()
    assert log2.count("with changed settings: iterations 20 -> 40") == 1
    assert len(data_line.findall(log2)) == 2 and "final: 40 iterations" in log2.split("final: 20 iterations")[1]
    assert re.search(r"^\S+ \S+ resuming \S+ with changed settings", log2, re.M), log2   # no "WARNING" between

    # the factor the run was trained at is recorded, and another one is refused before the images load, as
    # rigel-train does (tests/test_trainer.py); nothing is written
    assert json.loads((run / "metrics.json").read_text())["dataset"]["downscale"] == 1.0
    capsys.readouterr()
    assert main(train + ["--out", str(run), "--frames", "1", "--iters", "50", "--resume", "--downscale", "2"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "was trained at --downscale 1, not 2 (leave --downscale out" in err, err

    # the finished run opened once more: its log.txt and metrics.json stay as they were (before: the command line
    # appended its "training …" line and the session a start line that said the files are written only when changed)
    kept = {n: (run / n).read_bytes() for n in ("log.txt", "metrics.json", "checkpoint.safetensors", "model.ply")}
    assert main(train + ["--out", str(run), "--frames", "1", "--resume"]) == 0
    err = capsys.readouterr().err
    assert f"{run} already finished its 40 iterations; its files are written only when you change or save it" in err
    assert {n: (run / n).read_bytes() for n in kept} == kept


@needs_vulkan
@pytest.mark.filterwarnings("ignore:.*0 vertices")
def test_offscreen_tiny_scenes(tmp_path, capsys):
    """A valid 0-splat scene shows the background (exit 0, not "the camera sees no Gaussian"); a single splat,
    or several at one point, far from the origin, is framed and seen (issue 13: framing used a zero-size box)."""
    from rigel_core.io import save_ply
    from rigel_core.model import GaussianModel
    from viewer.cli import main

    def model(n, at):
        return GaussianModel.from_tensors(torch.tensor([at] * n, dtype=torch.float32).reshape(n, 3),
                                          torch.full((n, 3), -2.0), torch.tensor([[1.0, 0, 0, 0]] * n).reshape(n, 4),
                                          torch.full((n,), 3.0), torch.full((n, 1, 3), 1.0), torch.zeros(n, 3, 3))

    for name, n, at in (("zero", 0, (0, 0, 0)), ("one", 1, (40.0, -7.0, 3.0)), ("stack", 5, (0.2, 0.1, -0.3))):
        save_ply(model(n, at), tmp_path / f"{name}.ply")
        out = tmp_path / f"view_{name}"
        assert main([str(tmp_path / f"{name}.ply"), "--offscreen", "--frames", "1", "--out", str(out),
                     "--size", "96x64", "--device", "cpu"]) == 0, capsys.readouterr().err
        s = json.loads((out / "summary.json").read_text())
        assert s["ok"] and s["gaussians"] == n
        if n == 0:
            assert s["last_frame"]["alpha_mean"] == 0 and "empty scene" in s["note"]
        else:
            assert s["last_frame"]["alpha_mean"] > 0.005


@needs_vulkan
def test_offscreen_scene_with_no_finite_gaussian_is_an_empty_scene(tmp_path, capsys):
    """Every Gaussian with a NaN colour: all culled, so the offscreen viewer shows the background and exits 0 with
    a note, as for a 0-splat scene (before: exit 1, "the camera sees no Gaussian")."""
    from rigel_core.io import save_ply
    from rigel_core.model import GaussianModel
    from viewer.cli import main

    n = 6
    dc = torch.full((n, 1, 3), 1.0)
    dc[:, 0, torch.arange(n) % 3] = float("nan")
    m = GaussianModel.from_tensors(torch.randn(n, 3) * 0.2, torch.full((n, 3), -2.0),
                                   torch.tensor([[1.0, 0, 0, 0]] * n), torch.full((n,), 3.0), dc, torch.zeros(n, 3, 3))
    save_ply(m, tmp_path / "nan.ply")
    out = tmp_path / "view"
    assert main([str(tmp_path / "nan.ply"), "--offscreen", "--frames", "1", "--out", str(out), "--size", "64x48",
                 "--device", "cpu"]) == 0, capsys.readouterr().err
    s = json.loads((out / "summary.json").read_text())
    assert s["ok"] and s["gaussians"] == n and s["last_frame"]["alpha_mean"] == 0
    assert "no drawable Gaussian" in s["note"]


# ---- the window (Xvfb + lavapipe) ----------------------------------------------------------------------------------
def _px(viewer):
    p = viewer.step(capture=True)
    assert p is not None
    return viewer.read_pixels(p)[..., :3].astype(int)


@needs_vulkan
def test_scripted_session_on_a_real_ply(display, shared_data, tmp_path, one_thread):  # noqa: F811
    import glfw
    from PIL import Image

    from test_vulkan import VALIDATION
    from viewer.app import Viewer
    from viewer.scene import load_scene_file
    from viewer.gpu.shaderio import C
    from viewer.ui import PANEL_WIDTH, ViewSettings

    model = load_scene_file(shared_data / "ply" / "donut_mipsplatting_sh0.ply")
    W, H = 560, 480
    with Viewer(ModelSlot(model), size=(W, H), device="cpu", debug=VALIDATION,
                settings=ViewSettings(render_scale=0.25)) as v:
        v.screenshot_dir = tmp_path
        glfw.poll_events()
        first = _px(v)
        scene = (slice(40, H - 40), slice(PANEL_WIDTH + 20, W - 10))          # right of the panel
        bg = np.array([0, 0, 0])
        covered = (np.abs(first[scene] - bg).sum(-1) > 30).mean()
        assert 0.05 < covered < 0.95                                             # the donut, framed
        panel = first[15:60, 15:PANEL_WIDTH - 20]
        # orbit: a left drag in the scene area changes the scene's pixels, not the panel's
        x0, y0 = W - 60.0, H / 2
        v.input._on_cursor(v.window, x0, y0)
        v.step()
        v.input._on_button(v.window, glfw.MOUSE_BUTTON_LEFT, glfw.PRESS, 0)
        v.input._on_cursor(v.window, x0 + 40, y0 + 25)
        v.input._on_button(v.window, glfw.MOUSE_BUTTON_LEFT, glfw.RELEASE, 0)
        renders = v.stats.renders
        orbited = _px(v)
        assert v.stats.renders == renders + 1
        assert (np.abs(orbited[scene] - first[scene]).sum(-1) > 30).mean() > 0.02
        np.testing.assert_array_equal(orbited[15:60, 15:PANEL_WIDTH - 20], panel)
        # render mode 2 (alpha): grey levels, the same frame re-presented (no new render)
        v.input._on_key(v.window, glfw.KEY_2, 0, glfw.PRESS, 0)
        alpha = _px(v)
        assert v.settings.mode == C.MODE_ALPHA and v.stats.renders == renders + 1
        a = alpha[scene]
        assert (a[..., 0] == a[..., 1]).all() and (a[..., 1] == a[..., 2]).all() and a.max() > 200
        # overdraw (3): a colormap, so colours that are not grey
        v.input._on_key(v.window, glfw.KEY_3, 0, glfw.PRESS, 0)
        over = _px(v)
        assert (np.abs(over[scene][..., 0] - over[scene][..., 2]) > 40).mean() > 0.02
        v.input._on_key(v.window, glfw.KEY_1, 0, glfw.PRESS, 0)
        image = _px(v)
        np.testing.assert_array_equal(image[scene], orbited[scene])
        # toggle a panel: the Stats section of the main window closes, the pixels below its header change
        v.settings.panels["stats"] = False
        v.step()
        no_stats = _px(v)
        assert (np.abs(no_stats[200:H - 10, 15:PANEL_WIDTH - 10] - image[200:H - 10, 15:PANEL_WIDTH - 10]).sum(-1)
                > 30).mean() > 0.2
        # H hides every panel: the scene shows where the panel was
        v.input._on_key(v.window, glfw.KEY_H, 0, glfw.PRESS, 0)
        bare = _px(v)
        assert not v.settings.show_panels
        assert (np.abs(bare[15:60, 15:PANEL_WIDTH - 20] - panel).sum(-1) > 30).mean() > 0.5
        # fly: W (and Shift) held moves the camera forward by speed x 10 x the frame's time
        eye, fwd = v.camera.eye.copy(), v.camera.forward.copy()
        held = {glfw.KEY_W, glfw.KEY_LEFT_SHIFT}
        real_get_key = glfw.get_key
        glfw.get_key = lambda window, key: glfw.PRESS if key in held else glfw.RELEASE
        try:
            assert v.input.fly_keys(0.25)
        finally:
            glfw.get_key = real_get_key
        np.testing.assert_allclose(v.camera.eye - eye, 2.5 * v.camera.fly_speed * fwd, atol=1e-9)
        # fly mode (F): a left drag turns the view about the eye instead of orbiting
        v.input._on_key(v.window, glfw.KEY_F, 0, glfw.PRESS, 0)
        v.step()
        assert v.settings.fly and v.input.fly_mode
        eye = v.camera.eye.copy()
        v.input._on_button(v.window, glfw.MOUSE_BUTTON_LEFT, glfw.PRESS, 0)
        v.input._on_cursor(v.window, x0 + 60, y0)
        v.input._on_button(v.window, glfw.MOUSE_BUTTON_LEFT, glfw.RELEASE, 0)
        np.testing.assert_allclose(v.camera.eye, eye, atol=1e-9)
        assert not np.allclose(v.camera.forward, fwd)
        # screenshot (F12): the file holds exactly the presented pixels
        v.input._on_key(v.window, glfw.KEY_F12, 0, glfw.PRESS, 0)
        p = v.step()
        shots = list(tmp_path.glob("rigel_screenshot_*.png"))
        assert len(shots) == 1
        np.testing.assert_array_equal(np.asarray(Image.open(shots[0])), v.read_pixels(p)[..., :3])


@needs_vulkan
def test_an_interrupted_offscreen_session_reports_one_count(rng, tmp_path, one_thread):
    """Ctrl-C during offscreen training (issue 40): the summary's counts and its error line come from the stopped
    session, not from the UI's state of a window before (it said 'trained 50 iterations' and 'interrupted at
    iteration 40'); on a resumed run it tells this session's iterations from the run's (it counted both runs)."""
    from viewer.app import Viewer
    from viewer.offscreen import run_offscreen_training

    trainer = tiny_trainer(rng, iterations=100_000)
    before = 7
    for _ in range(before):  # a run that had trained before this session (as after --resume)
        trainer.step()
    slot = ModelSlot()
    session = TrainingSession(trainer, slot, tmp_path / "run", running=False, eval_at_start=False,
                              progress_every=50).start()
    while slot.latest() is None:
        time.sleep(0.01)
    v = Viewer(slot, offscreen=True, size=(160, 120), device="cpu", training=session)
    try:
        def ctrl_c_after_a_few_steps():
            while trainer.iteration < before + 12:
                time.sleep(0.005)
            v.interrupted = True

        timer = threading.Thread(target=ctrl_c_after_a_few_steps)
        timer.start()
        s = run_offscreen_training(v, 2, tmp_path / "out", max_fps=200.0)
        timer.join()
    finally:
        v.close()
    assert not session.alive
    done = trainer.iteration
    assert s["error"] == f"interrupted (Ctrl-C) at iteration {done} of 100000; the run was saved"
    assert s["iterations"] == done and s.get("session_iterations") == done - before > 0, s
    metrics = json.loads((tmp_path / "run" / "metrics.json").read_text())
    assert metrics["iterations_done"] == done


@needs_vulkan
def test_training_window_presents_at_most_once_per_display_refresh(display, rng, tmp_path, one_thread,  # noqa: F811
                                                                    monkeypatch):
    """While training, with vsync off, the loop presents at most once per refresh of the display (here said to
    be 8 Hz) and not at all while the window cannot be seen; the training goes on meanwhile (issue 15)."""
    from viewer.app import Viewer
    from viewer.ui import ViewSettings
    from viewer.window import Window

    hz, seconds = 8.0, 1.5
    monkeypatch.setattr(Window, "refresh_hz", lambda self: hz)
    trainer = tiny_trainer(rng, iterations=10_000)
    slot = ModelSlot()
    session = TrainingSession(trainer, slot, tmp_path / "run", eval_at_start=False).start()
    while slot.latest() is None:
        time.sleep(0.01)
    v = Viewer(slot, size=(320, 200), device="cpu", settings=ViewSettings(render_scale=0.2, vsync=False),
               training=session)
    try:
        def run_for(s):
            v.interrupted = False
            timer = threading.Timer(s, lambda: setattr(v, "interrupted", True))
            timer.start()
            p0, t0 = v.stats.presents, time.perf_counter()
            v.run()
            timer.join()
            return v.stats.presents - p0, time.perf_counter() - t0

        n, dt = run_for(seconds)
        assert 2 <= n <= hz * dt + 2, (n, dt)
        it = trainer.iteration
        monkeypatch.setattr(Window, "visible", lambda self: False)        # minimised / hidden
        n, _ = run_for(1.0)
        assert n == 0 and trainer.iteration > it                            # no frame; the training went on
    finally:
        v.close()


@needs_vulkan
def test_closing_the_window_during_training_leaves_a_loadable_checkpoint(display, rng, tmp_path,  # noqa: F811
                                                                         one_thread):
    import glfw

    from rigel_core.checkpoint import read_checkpoint
    from rigel_core.io import load_scene
    from viewer.app import Viewer
    from viewer.ui import ViewSettings

    trainer = tiny_trainer(rng, iterations=10_000)
    slot = ModelSlot()
    session = TrainingSession(trainer, slot, tmp_path / "run", eval_at_start=False).start()
    while slot.latest() is None:
        time.sleep(0.01)
    v = Viewer(slot, size=(480, 300), device="cpu", settings=ViewSettings(render_scale=0.2), training=session,
               frames=trainer.train_frames)
    try:
        t0 = time.perf_counter()
        while v.train_state.iteration < 3 and time.perf_counter() - t0 < 60:
            glfw.poll_events()
            v.step()
        assert v.train_state.status == "running" and v.train_state.iteration >= 3
        # snap to a training view: the PSNR window shows its per-pixel error
        v.request(R.CycleCamera(1))
        v.step()
        assert v.camera_index is not None and v.error_view is not None and math.isfinite(v.error_view.psnr)
        glfw.set_window_should_close(v.window, True)
        v.run()                                          # returns at once: the window is closing
    finally:
        v.close()                                        # stops the thread, which saves first
    assert not session.alive and v.train_state.status == "stopped"
    ck = tmp_path / "run" / CHECKPOINT_NAME
    meta = read_checkpoint(ck)[1]
    assert meta["iteration"] == trainer.iteration >= 3
    assert load_scene(ck).num_gaussians == trainer.model.num_gaussians
    assert load_scene(tmp_path / "run" / PLY_NAME).num_gaussians == trainer.model.num_gaussians


@needs_vulkan
@pytest.mark.parametrize("sig, status", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_ctrl_c_or_sigterm_saves_the_run(display, procedural_64, tmp_path, sig, status):  # noqa: F811
    # SIGTERM (kill, timeout, docker stop, a scheduler) saves as rigel-train does: the viewer writes the checkpoint
    # only when it stops, so an unhandled SIGTERM lost every iteration of the run
    run = tmp_path / "run"
    proc = subprocess.Popen(_viewer_cmd("--data", procedural_64, "--out", run, "--iters", 100000,
                                        "--init-points", 300, "--size", "320x200", "--device", "cpu",
                                        "--threads", 1),
                            cwd=ROOT, env=_env(XDG_CONFIG_HOME=str(tmp_path / "config")),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        log = run / "log.txt"
        t0 = time.perf_counter()
        while time.perf_counter() - t0 < 120 and proc.poll() is None:
            if log.is_file() and "window open" in log.read_text():
                break
            time.sleep(0.1)
        time.sleep(1.5)                                  # some iterations and frames
        assert proc.poll() is None, proc.stderr.read()
        proc.send_signal(sig)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == status, err
    assert ("interrupted" if sig == signal.SIGINT else "terminated") in err
    from rigel_core.io import load_scene

    assert load_scene(run / CHECKPOINT_NAME).num_gaussians > 0
    assert load_scene(run / PLY_NAME).num_gaussians > 0
    assert (tmp_path / "config" / "rigel" / "imgui.ini").is_file()             # the panels' places are kept


@needs_vulkan
def test_offscreen_ctrl_c_stops_at_once_even_with_frames_to_catch_up(procedural_64, tmp_path):
    """Offscreen training with a frame at every iteration (the training runs ahead of the frames, so the loop is
    always catching up): a real SIGINT stops it within 2 s, exit 130, the run saved and summary.json written. Before,
    the catch-up loop never looked at the interrupt: it went on training and writing frames for minutes."""
    from rigel_core.io import load_scene

    out = tmp_path / "out"
    env = _env()
    env.pop("DISPLAY", None)
    proc = subprocess.Popen(_viewer_cmd("--data", procedural_64, "--offscreen", "--iters", 100000, "--frames", 100000,
                                        "--init-points", 300, "--out", out, "--size", "160x100", "--device", "cpu",
                                        "--threads", 1),
                            cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        t0 = time.perf_counter()
        while time.perf_counter() - t0 < 120 and proc.poll() is None and not (out / "frame_0002.png").is_file():
            time.sleep(0.05)
        assert proc.poll() is None, proc.stderr.read()
        proc.send_signal(signal.SIGINT)
        t_sig = time.perf_counter()
        n_at_signal = len(list(out.glob("frame_*.png")))
        while not (out / "summary.json").is_file() and time.perf_counter() - t_sig < 30:   # the run's end
            time.sleep(0.01)
        took = time.perf_counter() - t_sig
        try:
            _, err = proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            pytest.fail(f"still running 30 s after Ctrl-C, {len(list(out.glob('frame_*.png')))} frames written")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 130, err
    # stopped, saved and summarised within 2 s (the process then exits: interpreter and Vulkan teardown)
    assert took < 2.0, f"{took:.2f} s from Ctrl-C to summary.json"
    s = json.loads((out / "summary.json").read_text())
    assert not s["ok"] and "interrupted" in s["error"]
    assert s["frames"] <= n_at_signal + 1          # at most the frame being written when the signal came
    assert len(list(out.glob("frame_*.png"))) == s["frames"]
    assert not (out / ".lock").exists()            # the run's lock went with it
    assert load_scene(out / CHECKPOINT_NAME).num_gaussians > 0
    assert load_scene(out / PLY_NAME).num_gaussians > 0


# ---- GPU -----------------------------------------------------------------------------------------------------------
@pytest.mark.gpu
@needs_ui
def test_gpu_offscreen_training_takes_the_cuda_ring(tmp_path):
    from rigel_core.data import make_dataset

    data = tmp_path / "data"
    make_dataset(data, 20_000, 200, 200, n_train=40, n_test=8, progress=False, device="cuda")
    out = tmp_path / "out"
    from viewer.cli import main

    assert main(["--data", str(data), "--offscreen", "--iters", "2000", "--eval-every", "500", "--frames", "4",
                 "--out", str(out), "--size", "640x480", "--device", "cuda"]) == 0
    s = json.loads((out / "summary.json").read_text())
    assert s["frame_ring"] == "cuda-interop" and s["render_device"] == "cuda"
    assert s["training_device"].startswith("cuda") and s["ok"]
    assert s["psnr"] > s["psnr_initial"] + 5


@needs_vulkan
def test_panel_layout_is_kept_between_runs(rng, tmp_path):
    from imgui_bundle import imgui

    from rigel_core.data import make_scene
    from viewer.app import Viewer
    from viewer.ui import ViewSettings

    ini = tmp_path / "cfg" / "rigel" / "imgui.ini"
    slot = ModelSlot(make_scene(n=200, sh_degree=1, seed=2))

    def title_bar_at(v, x, y):
        px = _px(v)
        return px[y + 5, x + 40]

    x, y = 150 + int(torch.randint(0, 100, (1,), generator=rng)), 60
    with Viewer(slot, offscreen=True, size=(480, 360), device="cpu", ini_path=ini,
                settings=ViewSettings(render_scale=0.1)) as v:
        default = title_bar_at(v, 10, 10)
        imgui.set_window_pos("rigel-viewer", imgui.ImVec2(x, y))        # what a drag of the title bar does
        moved = title_bar_at(v, x, y)
        np.testing.assert_array_equal(moved, default)
        assert not np.array_equal(title_bar_at(v, 10, 10), default) or x < 60
    assert f"Pos={x},{y}" in ini.read_text()
    with Viewer(slot, offscreen=True, size=(480, 360), device="cpu", ini_path=ini,
                settings=ViewSettings(render_scale=0.1)) as v:
        np.testing.assert_array_equal(title_bar_at(v, x, y), default)  # the next run opens it where it was


@needs_vulkan
def test_viewing_a_scene_the_colour_toggle_converts_it_without_going_black(tmp_path, one_thread):
    from rigel_core.data import make_scene
    from viewer.app import Viewer
    from viewer.ui import ViewSettings

    slot = ModelSlot(make_scene(n=300, sh_degree=2, seed=3))
    with Viewer(slot, offscreen=True, size=(160, 120), device="cpu", settings=ViewSettings(render_scale=1.0,
                                                                                          show_panels=False)) as v:
        before = _px(v).astype(float)
        v.request(R.SwitchAppearance("mlp"))
        v.step()
        job = v.jobs["appearance"]
        assert job.join(120) and not job.error, job.traceback
        after = _px(v).astype(float)
        assert v.appearance == "mlp" and v.stats.model_info["appearance"].startswith("mlp")
        mse = ((after - before) ** 2).mean() / 255.0 ** 2
        assert 10 * math.log10(1 / max(mse, 1e-12)) > 20          # the same scene, in about the same colours
        v.request(R.SwitchAppearance("sh"))
        v.step()
        assert v.jobs["appearance"].join(120) and not v.jobs["appearance"].error
        v.step()
        assert v.appearance == "sh"
        # and the orbit video of what is shown, from the Export section's request
        v.settings.video_frames, v.settings.video_size = 3, (32, 24)
        v.screenshot_dir = tmp_path
        v.request(R.OrbitVideo())
        v.step()
        assert v.jobs["video"].join(120) and not v.jobs["video"].error, v.jobs["video"].traceback
        assert v.jobs["video"].result.is_file()


@pytest.mark.gpu
@needs_ui
def test_gpu_viewer_training_matches_rigel_train(tmp_path):
    """The viewer's thread drives the same Trainer as rigel-train: same data, settings and seed give the same
    held-out PSNR (within 0.3 dB: CUDA atomics make both runs slightly nondeterministic)."""
    from rigel_core.cli.train import main as train_main
    from rigel_core.data import make_dataset
    from viewer.cli import main

    data = tmp_path / "data"
    make_dataset(data, 20_000, 200, 200, n_train=40, n_test=8, progress=False, device="cuda")
    common = ["--data", str(data), "--iters", "3000", "--eval-every", "1000", "--seed", "3"]
    assert train_main(common + ["--out", str(tmp_path / "train"), "--quiet", "--device", "cuda"]) == 0
    assert main(common + ["--offscreen", "--frames", "2", "--out", str(tmp_path / "view"), "--size", "480x320",
                          "--device", "cuda"]) == 0
    ref = json.loads((tmp_path / "train" / "metrics.json").read_text())["eval"][-1]
    s = json.loads((tmp_path / "view" / "summary.json").read_text())
    assert s["iterations"] == ref["iteration"] == 3000
    assert abs(s["psnr"] - ref["psnr"]) <= 0.3, (s["psnr"], ref["psnr"])


# ---- run folders: the viewer never replaces another run (issue 15's data loss) -----------------------------------
def test_viewer_run_folder_never_replaces_a_run(tmp_path, monkeypatch):
    """A finished rigel-train run in runs/<name> is left alone: the viewer trains into runs/<name>-2 (then -3);
    an explicit --out holding a run is refused without --resume; --resume keeps the folder; a file is refused."""
    from rigel_core.run_dir import RUN_FILES, RunFolderTaken, choose_run_dir

    monkeypatch.chdir(tmp_path)
    data = tmp_path / "datasets" / "orbit"
    data.mkdir(parents=True)

    def choose(*extra):
        out = Path(extra[extra.index("--out") + 1]) if "--out" in extra else None
        return choose_run_dir(out, Path("runs") / data.name, resume="--resume" in extra)

    assert choose() == Path("runs/orbit")                      # nothing there yet
    Path("runs/orbit").mkdir(parents=True)
    assert choose() == Path("runs/orbit")                      # an empty folder is not a run
    for name in RUN_FILES:                                     # any one run file makes it a run
        f = Path("runs/orbit") / name
        f.write_bytes(b"x")
        assert choose() == Path("runs/orbit-2"), name
        f.unlink()
    (Path("runs/orbit") / "checkpoint.safetensors").write_bytes(b"finished run")
    (Path("runs/orbit-2")).mkdir()
    (Path("runs/orbit-2") / "model.ply").write_bytes(b"another")
    assert choose() == Path("runs/orbit-3")
    assert choose("--resume") == Path("runs/orbit")
    with pytest.raises(RunFolderTaken, match="already holds a run.*--resume"):
        choose("--out", "runs/orbit")
    assert choose("--out", "runs/orbit", "--resume") == Path("runs/orbit")
    assert choose("--out", "fresh") == Path("fresh")
    Path("afile").write_text("x")
    with pytest.raises(RunFolderTaken, match="is a file"):
        choose("--out", "afile")
    assert (Path("runs/orbit") / "checkpoint.safetensors").read_bytes() == b"finished run"


def test_unused_never_returns_an_existing_path(tmp_path):
    from rigel_core.run_dir import unused_path as _unused

    p = tmp_path / "model.ply"
    assert _unused(p) == p
    p.write_bytes(b"1")
    (tmp_path / "model_2.ply").write_bytes(b"2")
    assert _unused(p) == tmp_path / "model_3.ply"


@needs_vulkan
def test_viewer_warnings_are_one_line(tmp_path):
    """A scene file's warning (here: a PLY declaring 0 vertices) prints as one 'rigel-viewer: warning:' line, not
    as Python's file:line report with the source line (fresh-user finding)."""
    (tmp_path / "zero.ply").write_bytes(b"ply\nformat binary_little_endian 1.0\nelement vertex 0\n"
                                        + b"".join(f"property float {p}\n".encode() for p in
                                                   ["x", "y", "z", "f_dc_0", "f_dc_1", "f_dc_2", "opacity",
                                                    "scale_0", "scale_1", "scale_2", "rot_0", "rot_1", "rot_2",
                                                    "rot_3"]) + b"end_header\n")
    r = subprocess.run([sys.executable, "-m", "viewer", str(tmp_path / "zero.ply"), "--offscreen", "--frames",
                        "1", "--out", str(tmp_path / "o"), "--size", "32x24", "--device", "cpu"], cwd=ROOT,
                       capture_output=True, text=True, timeout=120, env={**os.environ, "PYTHONWARNINGS": "default"})
    assert r.returncode == 0, r.stderr
    warn = [ln for ln in r.stderr.splitlines() if "warning" in ln.lower()]
    assert warn and all(ln.startswith("rigel-viewer: warning: ") for ln in warn), r.stderr
    assert "return load_ply" not in r.stderr and ".py:" not in r.stderr


def test_ctrl_c_while_the_training_starts_stops_its_thread(tmp_path, monkeypatch, capsys, one_thread):
    """Ctrl-C while ``rigel-viewer --data`` waits for the training thread's first snapshot (its initial evaluation,
    seconds on the CPU): the session is stopped (and saved) before the interrupt leaves ``_start_training`` — the
    caller does not hold it yet, and the interpreter used to exit with the thread inside torch ("terminate called
    without an active exception", SIGABRT). Exit status 130, one line."""
    from rigel_core.data import make_dataset
    from viewer import cli, training

    data = tmp_path / "data"
    make_dataset(data, 200, 24, 24, n_train=3, n_test=1, seed=1, progress=False, device="cpu")
    stops = []
    monkeypatch.setattr(training.TrainingSession, "start", lambda self: self)   # no snapshot ever comes ...
    monkeypatch.setattr(training.TrainingSession, "alive", property(lambda self: True))  # ... while it "runs"
    monkeypatch.setattr(training.TrainingSession, "stop", lambda self, **kw: stops.append(kw.get("save", True)))

    def ctrl_c(_):
        raise KeyboardInterrupt

    monkeypatch.setattr(cli.time, "sleep", ctrl_c)
    rc = cli.main(["--data", str(data), "--iters", "5", "--device", "cpu", "--offscreen", "--frames", "1",
                   "--out", str(tmp_path / "run")])
    monkeypatch.undo()
    assert rc == 130 and stops == [True]
    err = capsys.readouterr().err
    assert err.strip().endswith("rigel-viewer: interrupted"), err


def test_the_offscreen_summary_says_one_psnr_for_one_evaluation():
    """rigel-viewer --offscreen's last line: "first -> last dB" over the session's evaluations, one value when it
    evaluated once (a resumed run with eval_every 0 said "PSNR a -> a"), "n/a" when never or not finite."""
    from viewer.cli import _psnr_words

    rng = np.random.default_rng()
    a, b = (float(x) for x in rng.uniform(10, 40, 2))
    it = int(rng.integers(1, 10**6))
    assert _psnr_words([]) == "n/a dB"
    assert _psnr_words([{"iteration": it, "psnr": a}]) == f"{a:.2f} dB (iteration {it:,})"
    assert _psnr_words([{"iteration": 0, "psnr": a}, {"iteration": it, "psnr": b}]) == f"{a:.2f} -> {b:.2f} dB"
    assert _psnr_words([{"iteration": it, "psnr": a}, {"iteration": it, "psnr": b}]) == f"{b:.2f} dB (iteration {it:,})"
    assert _psnr_words([{"iteration": None, "psnr": float("nan")}]) == "n/a dB"


@pytest.mark.parametrize("flag", [["--iters", "50"], ["--set", "densify_until=5"], ["--resume"], ["--paused"],
                                  ["--schedule-scale", "0.5"], ["--max-gaussians", "7"], ["--test-every", "3"]])
def test_a_training_flag_without_data_is_refused_in_one_line(tmp_path, capsys, flag):
    """rigel-viewer SCENE (or --cameras) only views: a training flag given there was ignored without a word (exit
    0). It is one line naming the flag, exit 2, nothing written; --downscale (it scales --cameras' images) and the
    flags' own defaults stay accepted."""
    from rigel_core.data import make_dataset
    from viewer.cli import build_parser, main

    data = tmp_path / "data"
    make_dataset(data, 50, 16, 12, n_train=2, n_test=1, progress=False, device="cpu")
    out = tmp_path / "out"
    assert main([str(data / "scene.ply"), *flag, "--offscreen", "--out", str(out), "--device", "cpu"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"{flag[0]} is a training flag: it needs --data DIR" in err, err
    assert not out.exists()
    checked = {a.option_strings[0] for a in build_parser().training_actions}
    assert flag[0] in checked and "--downscale" not in checked and "--data" not in checked
