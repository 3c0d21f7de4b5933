"""What the viewer's frame loop costs a host-bound trainer in the same process (issue 15), measurable on a CPU box.

On the H200 the training step is host-bound (~90 kernel launches, each a Python call) and the viewer's frame loop
runs in the same interpreter, so every millisecond the loop holds the interpreter lock is taken from the trainer
(docs/BENCHMARKS.md, issue 15). This bench measures that on any machine, without a GPU:

* the viewer (offscreen, lavapipe or any Vulkan device, the panels of a live training: a real
  :class:`~viewer.training.TrainingSession` on a tiny procedural dataset with ``--train-views`` cameras, whose
  frustums the view draws, kept paused) runs its frame loop at
  ``--fps`` presents per second for ``--seconds``;
* a **proxy trainer** thread stands in for the H200's step: ``--ops`` tiny PyTorch operations per "step" (each
  releases and retakes the interpreter lock, as a CUDA launch does) and, like the session, publishes a snapshot of
  the model every 0.1 s (only when the viewer asked for one, where the slot supports that);
* the render is the proxy too (``--proxy-render``, default): ``--render-ops`` tiny operations into the ring slot,
  what the CUDA render costs the host (the CPU reference rasterizer would take the cores instead);

and reports: proxy steps/s alone and with the viewer (ratio = the throughput the trainer keeps), the UI thread's
CPU milliseconds per frame and per second (``time.thread_time``: what it took from the interpreter and the cores),
presents/s, panel builds and renders per second. The figures are this machine's; the ratio is a proxy of the
H200 bench (bench/viewer_throughput.py), not a substitute.

    python bench/viewer_frame_cost.py [--seconds 8] [--fps 60] [--size 640x360] [--refresh-hz 10]
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=8.0)
    ap.add_argument("--fps", type=float, default=60.0)
    ap.add_argument("--size", default="640x360")
    ap.add_argument("--ops", type=int, default=90, help="tiny operations per proxy training step")
    ap.add_argument("--render-ops", type=int, default=60, help="tiny operations per proxy render")
    ap.add_argument("--refresh-hz", type=float, default=None, help="the viewer's live refresh rate (where it has one)")
    ap.add_argument("--train-views", type=int, default=100, help="training cameras (drawn as frustums; "
                                                                  "NeRF-synthetic scenes have 100)")
    ap.add_argument("--switch-interval", type=float, default=None, help="sys.setswitchinterval for the run (s)")
    ap.add_argument("--real-render", action="store_true", help="the CPU reference render instead of the proxy")
    ap.add_argument("--json", type=Path, default=None, help="also write the figures here")
    return ap.parse_args(argv)


def _proxy_step(x, ops: int):
    for _ in range(ops):
        x.add_(1.0)


def _proxy_loop(stop, counts, ops, session, publish_every_s=0.1):
    import torch

    from viewer.training import snapshot_model

    x = torch.zeros(64)
    last = time.perf_counter()
    while not stop.is_set():
        _proxy_step(x, ops)
        counts[0] += 1
        now = time.perf_counter()
        if session is not None and now - last >= publish_every_s:
            slot = session.slot
            if getattr(slot, "wanted", True):
                model, _ = snapshot_model(session.trainer)
                slot.publish(model, iteration=counts[0])
                counts[1] += 1
            last = now


def _alone(seconds: float, ops: int) -> float:
    stop, counts = threading.Event(), [0, 0]
    t = threading.Thread(target=_proxy_loop, args=(stop, counts, ops, None))
    t.start()
    time.sleep(seconds)
    stop.set()
    t.join()
    return counts[0] / seconds


def _wrap_parts(v, app) -> dict:
    """Wrap the frame loop's parts to sum the UI thread's CPU seconds in each: {name: [seconds, calls]}."""
    parts = {}

    def wrap(obj, name, label):
        fn = getattr(obj, name)
        parts[label] = [0.0, 0]

        def timed(*a, **k):
            c0 = time.thread_time()
            try:
                return fn(*a, **k)
            finally:
                parts[label][0] += time.thread_time() - c0
                parts[label][1] += 1
        setattr(obj, name, timed)

    wrap(v, "build_ui", "ui")
    wrap(v.presenter, "present", "present")
    wrap(app, "render_view", "render")
    wrap(v, "take_model", "take_model")
    wrap(v, "drain_events", "drain_events")
    return parts


def main(argv=None) -> int:
    args = parse_args(argv)
    import torch

    torch.set_num_threads(1)
    if args.switch_interval:
        sys.setswitchinterval(args.switch_interval)
    from rigel_core.data import load_dataset, make_dataset
    from rigel_core.train import TrainConfig, Trainer

    import viewer.app as app
    from viewer.model_slot import ModelSlot
    from viewer.training import TrainingSession
    from viewer.ui import ViewSettings

    w, h = (int(v) for v in args.size.split("x"))
    tmp = Path(tempfile.mkdtemp(prefix="rigel_vfc_"))
    make_dataset(tmp / "data", 300, 32, 32, n_train=args.train_views, n_test=2, seed=3, progress=False, device="cpu")
    ds = load_dataset(tmp / "data", white_bg=True)
    trainer = Trainer(ds, TrainConfig(iterations=1000, init_points=300, sh_degree=1, eval_every=0, coarse_to_fine=1),
                      device="cpu")
    session = TrainingSession(trainer, ModelSlot(), tmp / "run", running=False, eval_at_start=False).start()
    while session.slot.latest() is None:
        time.sleep(0.01)
    if not args.real_render:
        def proxy_render(v, fw, fh):
            slot = v.ring.acquire(fw, fh, None)
            _proxy_step(torch.zeros(64), args.render_ops)
            slot.image.fill_(0.5)
            slot.final_T.fill_(0.5)
            slot.n_contrib.fill_(1)
            v.ring.release(slot, None)
            v.stats.frame_size = (fw, fh)
            v.stats.renders += 1
        app.render_view = proxy_render
    settings = ViewSettings(render_scale=0.5, white_background=True)
    if args.refresh_hz is not None and hasattr(settings, "refresh_hz"):
        settings.refresh_hz = args.refresh_hz
    alone = _alone(min(args.seconds, 4.0), args.ops)
    v = app.Viewer(session.slot, offscreen=True, size=(w, h), device="cpu", settings=settings, training=session,
                   frames=list(ds.train))
    parts = _wrap_parts(v, app)
    stop, counts = threading.Event(), [0, 0]
    v.train_state.status = "running"   # the proxy trains: the panels and the live refresh cap as while training
    for _ in range(10):
        v.step()
    for k in parts:
        parts[k] = [0.0, 0]
    # getattr with a default here and above: the bench also runs on earlier commits (before/after figures), whose
    # viewer lacks ui_builds, held, refresh_hz or ModelSlot.wanted
    r0, ui0 = v.stats.renders, getattr(v.stats, "ui_builds", None)
    v.train_state.status = "running"   # again: the warm-up frames drained the paused session's start event
    p0, h0 = v.stats.presents, getattr(v.stats, "held", 0)
    th = threading.Thread(target=_proxy_loop, args=(stop, counts, args.ops, session))
    frame_cpu = []
    t_start = time.perf_counter()
    th.start()
    period = 1.0 / args.fps
    while time.perf_counter() - t_start < args.seconds:
        t0, c0 = time.perf_counter(), time.thread_time()
        v.step()
        frame_cpu.append(time.thread_time() - c0)
        rest = period - (time.perf_counter() - t0)
        if rest > 0:
            time.sleep(rest)
    elapsed = time.perf_counter() - t_start
    stop.set()
    th.join()
    with_viewer = counts[0] / elapsed
    ui_builds = (v.stats.ui_builds - ui0) if ui0 is not None else v.stats.presents - p0
    res = {"proxy_steps_per_s_alone": round(alone, 1), "proxy_steps_per_s_with_viewer": round(with_viewer, 1),
           "ratio": round(with_viewer / alone, 4), "presents_per_s": round((v.stats.presents - p0) / elapsed, 2),
           "held_per_s": round((getattr(v.stats, "held", 0) - h0) / elapsed, 2),
           "ui_builds_per_s": round(ui_builds / elapsed, 2),
           "renders_per_s": round((v.stats.renders - r0) / elapsed, 2),
           "snapshots_per_s": round(counts[1] / elapsed, 2),
           "ui_thread_cpu_ms_per_frame": round(1e3 * sum(frame_cpu) / max(len(frame_cpu), 1), 3),
           "ui_thread_cpu_ms_per_s": round(1e3 * sum(frame_cpu) / elapsed, 1),
           "ui_thread_cpu_ms_per_s_by_part": {k: round(1e3 * c / elapsed, 1) for k, (c, n) in parts.items()},
           "calls_per_s_by_part": {k: round(n / elapsed, 1) for k, (c, n) in parts.items()},
           "size": [w, h], "fps_cap": args.fps, "refresh_hz": getattr(settings, "refresh_hz", None),
           "switch_interval_s": sys.getswitchinterval(), "proxy_render": not args.real_render}
    v.close(save=False)
    shutil.rmtree(tmp, ignore_errors=True)
    print(json.dumps(res))
    if args.json:
        args.json.write_text(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    os.environ.pop("DISPLAY", None)
    sys.exit(main())
