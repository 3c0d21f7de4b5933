"""The viewer's live refresh cap while training (issue 15): the frame loop re-presents its last frame and panels
between two live refreshes (and holds it, submitting nothing, when it is already the picture presented last), the
presenter submits a recording again when nothing it depends on changed, and the trainer copies its model only when
the viewer asks for one.

Offscreen on lavapipe (CPU); tiny scenes. Rates are bounded from above only (a busy CI box presents fewer frames).
"""
import importlib.util
import time

import numpy as np
import pytest
import torch

from test_vulkan import VK_OK, VK_REASON  # noqa: F401

from viewer import requests as R  # noqa: E402
from viewer.model_slot import ModelSlot  # noqa: E402
from viewer.training import TrainingSession  # noqa: E402

needs_vulkan = pytest.mark.skipif(not VK_OK, reason=f"no usable Vulkan device: {VK_REASON}")
needs_ui = pytest.mark.skipif(importlib.util.find_spec("imgui_bundle") is None,
                              reason="the viewer's UI package imgui-bundle is not installed")


def _trainer(rng, iterations=10_000):
    from rigel_core.train import TrainConfig, Trainer
    from test_viewer_app import tiny_dataset

    # no densification in reach: the model's shape never changes, so every publish is a periodic one
    config = TrainConfig(iterations=iterations, init_points=200, sh_degree=1, eval_every=0,
                         densify_from=100_000, densify_until=100_001)
    return Trainer(tiny_dataset(rng), config, device="cpu")


def test_model_slot_publishes_on_demand_once_a_reader_asks():
    slot = ModelSlot()
    assert slot.wanted                      # no reader has asked: the producer's own schedule
    slot.publish("a")
    assert slot.wanted
    slot.request()
    assert slot.wanted
    v = slot.publish("b")
    assert not slot.wanted and slot.latest().version == v
    slot.request()
    assert slot.wanted


def test_training_session_copies_the_model_only_when_asked(rng, tmp_path, one_thread):
    trainer = _trainer(rng)
    slot = ModelSlot()
    s = TrainingSession(trainer, slot, tmp_path / "run", eval_at_start=False, publish_every_s=0.0).start()
    try:
        while slot.latest() is None:
            time.sleep(0.01)
        slot.request()
        t0 = time.perf_counter()
        while slot.wanted and time.perf_counter() - t0 < 30:   # the next step publishes
            time.sleep(0.005)
        v, it = slot.latest().version, trainer.iteration
        while trainer.iteration < it + 10 and time.perf_counter() - t0 < 60:
            time.sleep(0.01)
        assert trainer.iteration >= it + 10 and slot.latest().version == v   # steps, but no copy nobody asked for
        slot.request()
        while slot.latest().version == v and time.perf_counter() - t0 < 60:
            time.sleep(0.005)
        assert slot.latest().version == v + 1
    finally:
        assert s.stop(save=False, timeout=60)


@pytest.fixture
def live_viewer(rng, tmp_path, one_thread):
    from viewer.app import Viewer
    from viewer.ui import ViewSettings

    trainer = _trainer(rng)
    slot = ModelSlot()
    session = TrainingSession(trainer, slot, tmp_path / "run", eval_at_start=False).start()
    while slot.latest() is None:
        time.sleep(0.01)
    v = Viewer(slot, offscreen=True, size=(240, 160), device="cpu", settings=ViewSettings(render_scale=0.3),
               training=session)
    try:
        yield v
    finally:
        v.close(save=False)


def _run(v, seconds, fps=60.0, shown=None):
    """Step at most ``fps`` times a second for ``seconds``; returns (steps, presents, renders, ui builds, dt).
    ``shown``: a list that gets, per frame, (held?, (slot index, render number) of the newest finished render,
    ImGui frame number) as the frame began."""
    s0 = (v.stats.presents, v.stats.renders, v.stats.ui_builds)
    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        t = time.perf_counter()
        held = v.stats.held
        v.step()
        if shown is not None:
            slot = v.ring.newest_ready() or v.ring.latest
            shown.append((v.stats.held > held, (slot.index, slot.frame), v.stats.ui_builds))
        n += 1
        time.sleep(max(0.0, 1.0 / fps - (time.perf_counter() - t)))
    dt = time.perf_counter() - t0
    return (n, v.stats.presents - s0[0], v.stats.renders - s0[1], v.stats.ui_builds - s0[2], dt)


def _presented(v):
    """Wrap the presenter: the list it returns gets (slot index, render number, ImGui frame) of every present that
    submitted (a held one returns the last present number and submits nothing)."""
    calls, pr = [], v.presenter
    present = pr.present

    def spy(slot, **kw):
        count = pr.count
        p = present(slot, **kw)
        if pr.count != count:
            calls.append((slot.index, slot.frame, kw.get("ui_version")))
        return p

    v.presenter.present = spy
    return calls


@needs_vulkan
@needs_ui
def test_a_still_camera_renders_at_the_refresh_cap_and_holds_the_picture_between(live_viewer):
    v = live_viewer
    v.settings.refresh_hz = 4.0
    t0 = time.perf_counter()
    while v.train_state.status != "running" and time.perf_counter() - t0 < 30:
        v.step()
    assert v.train_state.status == "running"
    calls, frames = _presented(v), []
    v.step(force_render=True)                                    # a present: the picture the run starts from
    it0, held0, base = v.training.trainer.iteration, v.stats.held, len(calls)
    n, presents, renders, builds, dt = _run(v, 1.5, shown=frames)
    held = v.stats.held - held0
    assert presents + held == n and presents == len(calls) - base   # every frame presented, or held
    assert 1 <= builds <= 4.0 * dt + 1 and renders <= builds     # full frames at the cap, not at the frame rate
    assert renders >= 1                                          # the live model is shown as it trains
    assert v.stats.repeats >= n - builds - held   # the rest re-present (a recording submitted again: the test below)
    assert held >= n - 3 * builds - 2    # a repeat presents only when a newer render finished since the last present
    # a held frame never hides a newer render or other panels: the picture presented last is the newest there is
    i = base
    for was_held, newest, ui in frames:
        if was_held:
            assert calls[i - 1] == (*newest, ui)
        else:
            i += 1
    assert base == 1 and i == len(calls)
    assert v.training.trainer.iteration > it0
    # a camera move renders at once, with the panels
    r, b = v.stats.renders, v.stats.ui_builds
    v.camera.orbit(15.0, 0.0)
    t_move = time.perf_counter()
    v.step()
    assert (v.stats.renders, v.stats.ui_builds) == (r + 1, b + 1)
    v.step()                                                     # and the camera still again: a repeat
    if time.perf_counter() - t_move < 0.2:                       # (unless the box took a refresh period for it)
        assert (v.stats.renders, v.stats.ui_builds) == (r + 1, b + 1)
    # a request (a button, a key) makes a full frame too
    v.request(R.SetMode(1))
    v.step()
    assert v.stats.ui_builds == b + 2 and v.settings.mode == 1
    # 0: no cap, every frame builds its panels
    v.settings.refresh_hz = 0.0
    held0 = v.stats.held
    n, presents, renders, builds, dt = _run(v, 0.4)
    assert builds == presents == n and v.stats.held == held0


@needs_vulkan
@needs_ui
def test_a_render_finished_after_the_present_is_presented_not_held(live_viewer):
    """Between two refreshes a repeat holds the picture only while no newer render finished: one that finishes
    after the last present (a CUDA render is enqueued, so the full frame showed the one before) is presented by the
    next repeat, then held."""
    v = live_viewer
    v.settings.refresh_hz = 0.2                                  # no live refresh falls due within this test
    t0 = time.perf_counter()
    while v.train_state.status != "running" and time.perf_counter() - t0 < 30:
        v.step()
    v.step(force_render=True)
    calls = _presented(v)
    held, repeats = v.stats.held, v.stats.repeats
    v.step()
    assert (v.stats.held, len(calls)) == (held + 1, 0)          # the same picture: nothing submitted
    fw, fh = v.frame_size()
    shown = v.ring.latest
    slot = v.ring.acquire(fw, fh)                                # a render finishing now
    slot.image.fill_(float(torch.rand(())) * 0.5 + 0.25)
    slot.n_contrib.copy_(shown.n_contrib)                        # the same overdraw scale: only the render differs
    v.ring.release(slot)
    v.step()
    assert calls == [(slot.index, slot.frame, v.stats.ui_builds)] and v.stats.repeats == repeats + 1
    v.step()
    assert (v.stats.held, len(calls)) == (held + 2, 1)


@needs_vulkan
@needs_ui
def test_no_cap_when_the_training_is_paused(live_viewer):
    from viewer import messages as M

    v = live_viewer
    v.settings.refresh_hz = 2.0
    v.request(M.Pause())
    t0 = time.perf_counter()
    while v.train_state.status != "paused" and time.perf_counter() - t0 < 30:
        v.step()
    assert v.train_state.status == "paused"
    n, presents, _, builds, _ = _run(v, 0.3)
    assert builds == presents == n


@needs_vulkan
@needs_ui
def test_a_resubmitted_recording_shows_what_a_fresh_one_does(live_viewer):
    """The presenter's reuse: same key → the recording is submitted again, and its pixels are those of a fresh
    recording of the same frame, including a new render written into the same slot since."""
    v = live_viewer
    pr = v.presenter
    v.step(capture=True)
    slot = v.ring.latest
    draw = v.build_ui()
    ver = v.stats.ui_builds
    kw = dict(mode=0, overdraw_max=1, draw_data=draw, content=v.content_rect(), capture=True)
    p1 = pr.present(slot, ui_version=ver, **kw)
    px1 = v.read_pixels(p1)
    p2 = pr.present(slot, ui_version=ver, **kw)   # the other frame in flight: recorded
    v.read_pixels(p2)
    value = float(torch.rand(()).item()) * 0.5 + 0.25
    slot.image.fill_(value)                         # "a new render" into the same slot (host-mapped on the CPU)
    reuses = pr.reuses
    p3 = pr.present(slot, ui_version=ver, **kw)    # frame p1's: nothing it depends on changed
    assert pr.reuses == reuses + 1
    px3 = v.read_pixels(p3)
    p4 = pr.present(slot, ui_version=None, **kw)   # never reused: recorded afresh
    p5 = pr.present(slot, ui_version=None, **kw)
    assert pr.reuses == reuses + 1
    px5 = v.read_pixels(p5)
    v.read_pixels(p4)
    assert np.array_equal(px3, px5) and not np.array_equal(px1, px3)
    # a different mode is recorded, not reused
    p6 = pr.present(slot, ui_version=ver, **{**kw, "mode": 1})
    assert pr.reuses == reuses + 1 and p6 == p5 + 1
