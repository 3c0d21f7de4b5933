"""Frame-ring overhead (issue 6): render + ring hand-over + present passes against the render alone, offscreen.

Two ways to make the same frame of the procedural scene (``make_scene(n, sh_degree=3)``, the view of
``bench/forward.py``'s ``load()``):

(a) **render alone**: ``rigel_core.render`` (SH + projection + binning + rasterization) into ordinary torch
    output tensors (``out=``), on a CUDA stream of its own;
(b) **full frame**: the viewer's frame loop without a window (DESIGN §6): ``FrameRing.acquire`` (the stream
    waits ``free[s]``), the same render into the slot's imported tensors, ``FrameRing.release`` (overdraw scale,
    ``ready[s]`` signalled), ``Presenter.present`` (one Vulkan submit: waits ``ready[s]``, runs the present pass
    of the mode into an :class:`~viewer.gpu.targets.OffscreenTarget`, signals ``free[s]``).

Two present policies for (b) (``--policies``):

* ``ready`` (the viewer's): the ring enqueues a ``free[s]`` wait only when the host sees it unmet, and each
  frame presents :meth:`FrameRing.newest_ready` — the newest render already finished, usually the previous one —
  so that no GPU-side wait is queued before the other API's signal; after the last frame its render is presented
  too, so every frame of the run is rendered and the last one shown;
* ``eager`` (the protocol as first written, commit 862c999): every render enqueues its ``free[s]`` wait and is
  presented right after its release, the Vulkan submit waiting on a ``ready[s]`` not signalled yet;
* ``event``: as ``ready``, but the render's end reaches Vulkan as a CUDA event the host polls instead of the
  ``ready[s]`` semaphore signal (``ring_variants.BenchRing(handover="event")``): the present submit waits for nothing;
* ``ring-only`` (a diagnostic, not a frame): acquire, render into the slot and release as ``ready``, no present;
  it separates the ring's own cost from the present pass's;
* ``present-only`` (a diagnostic): the render alone into ordinary tensors, then a present of a slot rendered
  before (finished): what the Vulkan pass running beside the CUDA stream costs it; ``present-compute`` and
  ``present-empty`` break it down: the present pass's compute dispatch alone (no copy into the image), and a
  submit with no commands (``ring_variants.DiagnosticPresenter.diagnostic``; the target shows nothing usable then).

No readback of the colour image is timed: copying a frame to host memory is not part of a frame (the viewer
reads back only for screenshots and ``--offscreen`` PNGs); one readback *after* the timing checks that the ring
frame equals the render alone and that the presented pixels are its 8-bit conversion. No ImGui pass.

Figures, per mode (image, alpha, overdraw, side-by-side; side-by-side renders one panel, width // 3, as the
viewer does):

* **throughput** (the overhead figure): the pipeline drained, ``--frames`` frames issued back to back, waited
  for only after the last one (stream synchronised for (a), the last present's timeline value for (b)), the
  time divided by the frame count; median of ``--repeats`` runs, (a) and (b) interleaved. overhead =
  (b − a) / a; the issue's target is ≤ 5 %.
* **per frame** (``--sync-frames`` frames of each kind, each waited for before the next is issued, so that no
  time stamp sits in the throughput loops): medians of the render's time (CUDA events on the render stream;
  host timers on the CPU path, where the render is synchronous), in (b) of the ring's own GPU work
  (``release``: overdraw scale + ``ready[s]`` signal), of the host time of ``Presenter.present`` (command
  buffer recorded and submitted through the Python binding), and of the wall time of the frame ("wall, synced":
  issue → stream synchronised, or issue → present finished).

Paths: ``cuda-interop`` (CUDA kernels, the ring's device-local exported memory imported into CUDA, semaphores
shared) or ``host-mapped`` (the CPU reference renders into host-visible Vulkan memory; the host signals).

Run (GPU machine): ``python bench/ring_overhead.py [--n 1000000] [--res 1920x1080] [--frames 200]``; a smoke run
of the CPU path on lavapipe: ``python bench/ring_overhead.py --small``. Writes ``$OUT/ring_overhead.md`` and
``$OUT/ring_overhead.json`` when OUT is set. Exit status 1 when the ring frame does not match the render alone
or the validation layer (``--validation``) reported an error.
"""
from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import math
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run from a checkout without installing

import rigel_core as rc  # noqa: E402
from rigel_core.data.procedural import SCENE_RADIUS, make_scene  # noqa: E402

MODES = ("image", "alpha", "overdraw", "side-by-side")
POLICIES = ("ready", "eager", "event", "ring-only", "present-only", "present-compute", "present-empty")
TARGET_OVERHEAD = 0.05  # issue 6: ring + passes cost at most 5 % of the render time
SMALL = dict(n=2000, res="160x120", frames=5, warmup=1, repeats=1, sync_frames=2)
FULL = dict(n=1_000_000, res="1920x1080", frames=200, warmup=20, repeats=5, sync_frames=None)  # None: --frames


def scene(n: int, device: str):
    """(model, camera factory (width, height) -> Camera): the procedural scene seen as bench/forward.py's
    ``load()`` sees it (elevation 25°, azimuth 30°, distance 2.3 scene radii, 55° horizontal field of view,
    +z up)."""
    model = make_scene(n, sh_degree=3, seed=0, device=device)
    center, dist = np.zeros(3), 2.3 * SCENE_RADIUS
    el, az = math.radians(25.0), math.radians(30.0)
    eye = center + dist * np.array([math.cos(el) * math.cos(az), math.cos(el) * math.sin(az), math.sin(el)])

    def camera(width, height):
        return rc.Camera.look_at(eye, center, (0.0, 0.0, 1.0), width=width, height=height, fov_x_deg=55.0)

    return model, camera


class Marks:
    """``k`` time stamps per frame for ``frames`` frames: CUDA events on ``stream`` (GPU time, created before the
    timed loop), or ``time.perf_counter`` when ``stream`` is None (the CPU path renders synchronously)."""

    def __init__(self, stream, frames: int, k: int):
        self.stream = stream
        if stream is None:
            self.t = [[0.0] * k for _ in range(frames)]
        else:
            self.t = [[torch.cuda.Event(enable_timing=True) for _ in range(k)] for _ in range(frames)]
        self.i = 0
        self.host_ms: list[float] = []   # host time of each frame's Presenter.present call

    def mark(self, j: int):
        if self.stream is None:
            self.t[self.i][j] = time.perf_counter()
        else:
            self.t[self.i][j].record(self.stream)

    def next(self):
        self.i += 1

    def intervals(self):
        """[per frame: ms from mark j to j+1] (CUDA: call after the events completed)."""
        if self.stream is None:
            return [[(b - a) * 1e3 for a, b in zip(row[:-1], row[1:])] for row in self.t[: self.i]]
        return [[a.elapsed_time(b) for a, b in zip(row[:-1], row[1:])] for row in self.t[: self.i]]


class RingBench:
    """The render and the viewer's frame loop on one scene, one offscreen target, one ring."""

    def __init__(self, model, camera, ctx, ring, presenter, stream):
        self.model, self.camera = model, camera
        self.ctx, self.ring, self.presenter = ctx, ring, presenter
        self.stream = stream   # torch.cuda.Stream, or None on the CPU path
        self.dev = model.device
        self.presented: set[int] = set()   # render numbers shown by the ``ready`` policy's presents

    def _on_stream(self):
        return torch.cuda.stream(self.stream) if self.stream is not None else contextlib.nullcontext()

    def drain(self):
        """Wait for everything issued so far (outside the timed loops only)."""
        if self.stream is not None:
            self.stream.synchronize()
        if self.presenter.count and not self.presenter.wait(self.presenter.count, 60_000_000_000):
            raise TimeoutError(f"present {self.presenter.count} did not finish within 60 s")

    # ---- one frame each way -----------------------------------------------------------------------------
    def frame_alone(self, cam, out, marks=None):
        """(a): the render into ordinary tensors ``out``."""
        with self._on_stream():
            if marks is not None:
                marks.mark(0)
            rc.render(self.model, cam, out=out)
            if marks is not None:
                marks.mark(1)
                marks.next()

    def frame_full(self, cam, mode: int, marks=None, policy: str = "eager") -> int:
        """(b): acquire a slot, render into it, release it, present it (``eager``) or the newest finished render
        (``ready``). Returns the present number."""
        w, h = cam.width, cam.height
        with self._on_stream():
            slot = self.ring.acquire(w, h, self.stream)
            if marks is not None:
                marks.mark(0)
            rc.render(self.model, cam, out=(slot.image, slot.final_T, slot.n_contrib))
            if marks is not None:
                marks.mark(1)
            self.ring.release(slot, self.stream)
            if marks is not None:
                marks.mark(2)
                marks.next()
        if policy == "ring-only":
            return 0
        if policy in ("ready", "event"):
            slot = self.ring.newest_ready() or slot
            self.presented.add(slot.frame)
        t0 = time.perf_counter()
        p = self.presenter.present(slot, mode=mode)
        if marks is not None:
            marks.host_ms.append((time.perf_counter() - t0) * 1e3)
        if p is None:
            raise RuntimeError("the offscreen target did not take a frame")
        return p

    def wait_present(self, p: int):
        if not self.presenter.wait(p, 60_000_000_000):
            raise TimeoutError(f"present {p} did not finish within 60 s")

    # ---- measurements -----------------------------------------------------------------------------------
    def outputs(self, w: int, h: int):
        """Ordinary output tensors of the render alone, shaped like a ring slot's views (allocated on the
        render stream)."""
        with self._on_stream():
            return (torch.empty(h, w, 3, dtype=torch.float32, device=self.dev),
                    torch.empty(h, w, dtype=torch.float32, device=self.dev),
                    torch.empty(h, w, dtype=torch.int32, device=self.dev))

    def throughput_alone(self, cam, out, frames: int) -> float:
        self.drain()
        t0 = time.perf_counter()
        for _ in range(frames):
            self.frame_alone(cam, out)
        if self.stream is not None:
            self.stream.synchronize()
        return (time.perf_counter() - t0) * 1e3 / frames

    def throughput_full(self, cam, mode: int, frames: int, policy: str, out=None) -> float:
        self.drain()
        shown = self.ring.latest   # present-only shows this finished render every frame
        t0 = time.perf_counter()
        for _ in range(frames):
            if policy.startswith("present-"):
                self.frame_alone(cam, out)
                p = self.presenter.present(shown, mode=mode)
            else:
                p = self.frame_full(cam, mode, policy=policy)
        if policy == "ring-only":
            if self.stream is not None:
                self.stream.synchronize()
            return (time.perf_counter() - t0) * 1e3 / frames
        if policy in ("ready", "event"):   # show the last render too: every frame rendered and the last shown
            p = self.presenter.present(self.ring.latest, mode=mode)
            self.presented.add(self.ring.latest.frame)
        self.wait_present(p)   # the present waited for the render's ready[s]: the whole frame is done
        return (time.perf_counter() - t0) * 1e3 / frames

    def latency_alone(self, cam, out, frames: int, marks: Marks) -> list[float]:
        self.drain()
        ms = []
        for _ in range(frames):
            t0 = time.perf_counter()
            self.frame_alone(cam, out, marks)
            if self.stream is not None:
                self.stream.synchronize()
            ms.append((time.perf_counter() - t0) * 1e3)
        return ms

    def latency_full(self, cam, mode: int, frames: int, marks: Marks) -> list[float]:
        """Issue → present done of one frame (its own render presented: the ``eager`` order)."""
        self.drain()
        ms = []
        for _ in range(frames):
            t0 = time.perf_counter()
            self.wait_present(self.frame_full(cam, mode, marks))
            ms.append((time.perf_counter() - t0) * 1e3)
        return ms

    def check(self, mode_image: int) -> dict:
        """Outside the timing: one full frame in image mode, read back. The ring slot must equal the render alone
        bit for bit (same kernels, same inputs), and each presented 8-bit value must be one of the two nearest
        to 255·clamp(image, 0, 1) (Vulkan's float → UNORM conversion; NVIDIA was seen rounding down)."""
        t = self.presenter.target
        cam = self.camera(t.width, t.height)
        out = self.outputs(t.width, t.height)
        self.frame_alone(cam, out)
        with self._on_stream():
            slot = self.ring.acquire(t.width, t.height, self.stream)
            rc.render(self.model, cam, out=(slot.image, slot.final_T, slot.n_contrib))
            self.ring.release(slot, self.stream)
        p = self.presenter.present(slot, mode=mode_image, capture=True)
        px = self.presenter.read_pixels(p)[..., :3].astype(np.float32)
        self.drain()
        same = all(torch.equal(a, b) for a, b in zip(out, (slot.image, slot.final_T, slot.n_contrib)))
        want = np.clip(out[0].cpu().numpy(), 0.0, 1.0) * np.float32(255)
        max_dev = float(np.abs(px - want).max())
        alpha = 1.0 - out[1]
        return {"ring_equals_render": same, "readback_max_dev_8bit": round(max_dev, 4),
                "readback_ok": max_dev < 1.0 + 1e-3, "alpha_mean": round(float(alpha.mean()), 4),
                "n_contrib_max": int(out[2].max())}

    def measure(self, mode_name: str, mode: int, *, frames: int, warmup: int, repeats: int,
                sync_frames: int, policy: str) -> dict:
        """Both figures of one mode (see the module docstring)."""
        from viewer.gpu.shaderio import C

        t = self.presenter.target
        w = max(t.width // 3, 1) if mode == C.MODE_SIDE_BY_SIDE else t.width   # as Viewer.frame_size
        h = t.height
        cam = self.camera(w, h)
        out = self.outputs(w, h)
        for _ in range(warmup):
            self.frame_alone(cam, out)
        self.ring.elide_waits = policy != "eager"
        self.ring.handover = "event" if policy == "event" else "semaphore"
        for _ in range(warmup):
            self.frame_full(cam, mode, policy="ready" if policy.startswith("present-") else policy)
        self.presenter.diagnostic = {"present-compute": "compute", "present-empty": "empty"}.get(policy)
        alone, full = [], []
        waits0 = self.ring.waits_enqueued
        self.presented = set()
        for _ in range(repeats):   # interleaved, so that a clock or thermal drift affects both alike
            alone.append(self.throughput_alone(cam, out, frames))
            full.append(self.throughput_full(cam, mode, frames, policy, out))
        self.presenter.diagnostic = None
        waits = self.ring.waits_enqueued - waits0
        shown = len(self.presented)
        # per frame, each waited for on its own; the time stamps stay out of the throughput loops above
        ma, mb = Marks(self.stream, sync_frames, 2), Marks(self.stream, sync_frames, 3)
        lat_a = self.latency_alone(cam, out, sync_frames, ma)
        lat_b = self.latency_full(cam, mode, sync_frames, mb)
        self.drain()
        ia, ib = ma.intervals(), mb.intervals()
        a, b = statistics.median(alone), statistics.median(full)
        return {
            "policy": policy, "mode": mode_name, "frame": f"{w}x{h}",
            "free_waits_enqueued": waits,
            "distinct_frames_shown": {"ready": shown, "event": shown, "eager": repeats * frames}.get(policy, 0),
            "frames_rendered": repeats * frames,
            "alone_ms": a, "full_ms": b, "overhead": (b - a) / a, "met": (b - a) / a <= TARGET_OVERHEAD,
            "alone_runs_ms": alone, "full_runs_ms": full,
            "alone_render_ms": statistics.median(r[0] for r in ia),
            "full_render_ms": statistics.median(r[0] for r in ib),
            "ring_release_ms": statistics.median(r[1] for r in ib),
            "present_call_ms": statistics.median(mb.host_ms),
            "alone_latency_ms": statistics.median(lat_a), "full_latency_ms": statistics.median(lat_b),
        }


# ---- report ---------------------------------------------------------------------------------------------------
def markdown(rows, info) -> str:
    gpu = info["path"] == "cuda-interop"
    timer = "CUDA events on the render stream" if gpu else "host timers: the CPU render is synchronous"
    lines = [
        f"# Frame-ring overhead ({info['meta']})", "",
        f"Procedural scene, {info['n']:,} Gaussians, SH degree 3; offscreen target {info['res']} "
        f"(B8G8R8A8_UNORM), {info['slots']} ring slots, {info['frames_in_flight']} frames in flight. "
        f"Path: **{info['path']}**; renderer: {info['renderer']}; Vulkan device: **{info['vulkan_device']}**.", "",
        f"ms/frame = {info['frames']} frames issued back to back after a drained pipeline, waited for only after "
        f"the last one, divided by {info['frames']}; median of {info['repeats']} runs, (a) and (b) interleaved, "
        f"after {info['warmup']} warm-up frames. Render alone = SH + project + bin + raster into ordinary torch "
        "tensors. Full = the same render into the ring slot's tensors + ring hand-over (free/ready timeline "
        "semaphores, overdraw scale) + the mode's present pass into the offscreen image. No readback of the "
        "colour image (not part of a frame: the viewer reads back only for screenshots); no ImGui pass. "
        "Side-by-side renders one panel (width / 3), as the viewer does.", "",
        "| policy | mode | frame | render alone (ms/frame) | full frame (ms/frame) | overhead | target ≤ 5 % | "
        "free[s] waits enqueued | frames shown / rendered |",
        "|---|---|---|---:|---:|---:|---|---:|---:|",
    ]
    for r in rows:
        lines.append(f"| {r['policy']} | {r['mode']} | {r['frame']} | {r['alone_ms']:.3f} | {r['full_ms']:.3f} | "
                     f"{100 * r['overhead']:+.1f} % | {'met' if r['met'] else '**not met**'} | "
                     f"{r['free_waits_enqueued']} | {r['distinct_frames_shown']} / {r['frames_rendered']} |")
    lines += [
        "", f"Per frame: {info['sync_frames']} frames of each kind, each waited for on its own; medians of the "
        f"render's time ({timer}), of the ring's release (overdraw scale + ready[s] signal), of the host "
        "time of `Presenter.present` (record + submit) and of the wall time from issuing the frame to its "
        "completion (ms):", "",
        "| policy | mode | render alone | render into the ring slot | ring release | present call (host) | "
        "render alone, wall synced | full frame, wall synced (issue → present done) |",
        "|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(f"| {r['policy']} | {r['mode']} | {r['alone_render_ms']:.3f} | {r['full_render_ms']:.3f} | "
                     f"{r['ring_release_ms']:.3f} | {r['present_call_ms']:.3f} | {r['alone_latency_ms']:.3f} | "
                     f"{r['full_latency_ms']:.3f} |")
    c = info["check"]
    lines += ["", f"Check (after the timing, one image-mode frame read back): ring slot == render alone bit for bit: "
              f"{'yes' if c['ring_equals_render'] else '**NO**'}; presented pixels vs 255·clamp(image): max "
              f"|Δ| = {c['readback_max_dev_8bit']} ({'ok' if c['readback_ok'] else '**FAIL**'}, < 1 required); "
              f"mean alpha {c['alpha_mean']}, max n_contrib {c['n_contrib_max']}."]
    if info.get("validation_errors") is not None:
        lines.append(f"Vulkan validation layer on: {info['validation_errors']} errors.")
    if not gpu:
        lines.append("CPU smoke run: the figures say nothing about the GPU overhead.")
    return "\n".join(lines) + "\n"


def _size(s: str):
    """(width, height) of "WIDTHxHEIGHT", or None when ``s`` is not that with positive sizes."""
    try:
        w, h = (int(v) for v in s.lower().split("x"))
    except ValueError:
        return None
    return (w, h) if w > 0 and h > 0 else None


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, help=f"Gaussians (default {FULL['n']:,}; --small: {SMALL['n']:,})")
    ap.add_argument("--res", help=f"target WIDTHxHEIGHT (default {FULL['res']}; --small: {SMALL['res']})")
    ap.add_argument("--frames", type=int, help=f"frames per timed run (default {FULL['frames']}; --small: "
                                               f"{SMALL['frames']})")
    ap.add_argument("--warmup", type=int, help=f"warm-up frames per mode and side (default {FULL['warmup']})")
    ap.add_argument("--repeats", type=int, help=f"timed runs per mode and side (default {FULL['repeats']})")
    ap.add_argument("--sync-frames", type=int, help="frames timed one at a time, each waited for (default: "
                    f"--frames; --small: {SMALL['sync_frames']})")
    ap.add_argument("--modes", default=",".join(MODES), help="comma-separated subset of " + ", ".join(MODES))
    ap.add_argument("--policies", default="ready,eager",
                    help="comma-separated present policies: ready (the viewer's), eager (the first protocol), "
                         "event (CUDA event instead of the ready[s] signal); diagnostics: ring-only, "
                         "present-only, present-compute, present-empty")
    ap.add_argument("--slots", type=int, default=3, help="frame-ring slots K (the viewer's default: 3)")
    ap.add_argument("--frames-in-flight", type=int, default=2, help="presenter frames in flight (viewer: 2)")
    ap.add_argument("--device", choices=("auto", "cuda", "cpu"), default=None,
                    help="render device (default: cuda when the kernels are built; --small: cpu)")
    ap.add_argument("--small", action="store_true", help="CPU reference + host-mapped ring smoke run: "
                    f"{SMALL['n']:,} Gaussians, {SMALL['res']}, {SMALL['frames']} frames")
    ap.add_argument("--validation", action="store_true", help="Vulkan validation layer on (slow; errors fail)")
    args = ap.parse_args(argv)
    base = SMALL if args.small else FULL
    for k, v in base.items():
        if getattr(args, k) is None:
            setattr(args, k, v)
    if args.sync_frames is None:
        args.sync_frames = args.frames
    args.size = _size(args.res)
    if args.size is None:
        ap.error(f"--res: expected WIDTHxHEIGHT with positive sizes, got {args.res!r}")
    args.modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    bad = [m for m in args.modes if m not in MODES]
    if bad or not args.modes:
        ap.error(f"--modes: unknown {bad or 'empty list'}; choose from {', '.join(MODES)}")
    args.policies = [m.strip() for m in args.policies.split(",") if m.strip()]
    if not args.policies or any(m not in POLICIES for m in args.policies):
        ap.error(f"--policies: choose from {', '.join(POLICIES)}; got {args.policies}")
    if args.n < 3 or args.frames < 1 or args.sync_frames < 1 or args.repeats < 1 or args.warmup < 0:
        ap.error("--n >= 3, --frames >= 1, --sync-frames >= 1, --repeats >= 1 and --warmup >= 0 are required")
    if args.device is None:
        args.device = "cpu" if args.small else "auto"
    if args.device == "auto":
        args.device = "cuda" if rc.cuda_available() else "cpu"
        if args.device == "cpu" and not args.small:
            ap.error("no CUDA device or rigel_core._C is not built: this benchmark is for the GPU "
                     "(`--small` runs the CPU/lavapipe smoke run, `--device cpu` forces the CPU path)")
    if args.device == "cuda" and not rc.cuda_available():
        from rigel_core import _ext

        why = "PyTorch sees no CUDA device" if not torch.cuda.is_available() else \
            f"rigel_core._C is not built ({_ext._error})"
        ap.error(f"--device cuda: {why}")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    from ring_variants import BenchRing as FrameRing                # the production ring + the switches measured
    from ring_variants import DiagnosticPresenter as Presenter
    from viewer.gpu.shaderio import MODE_NAMES, C
    from viewer.gpu.targets import OffscreenTarget
    from viewer.gpu.vk_context import VulkanContext, cuda_device_uuid, validation_log

    gpu = args.device == "cuda"
    w, h = args.size
    t0 = time.perf_counter()
    model, camera = scene(args.n, args.device)
    print(f"scene: {model.num_gaussians:,} Gaussians on {args.device} in {time.perf_counter() - t0:.1f} s", flush=True)
    errors_before = validation_log.errors
    ctx = VulkanContext(validation=args.validation, app_name="rigel-bench-ring")
    try:
        if gpu:   # the Vulkan device is the CUDA device (UUID), with the external memory/semaphore extensions
            ctx.init_device(interop=True, device_uuid=cuda_device_uuid())
        else:
            ctx.init_device()
        ring = FrameRing(ctx, args.slots, device=args.device, capacity=(w, h))
        target = OffscreenTarget(ctx, w, h, frames=args.frames_in_flight)
        presenter = Presenter(ctx, target, ring, imgui=False, frames=args.frames_in_flight)
        stream = torch.cuda.Stream() if gpu else None   # like the viewer: the render's own stream
        path = "cuda-interop" if ring.device == "cuda" else "host-mapped"
        vk_name = ctx.device_name
        print(f"path: {path}; Vulkan device: {vk_name}; target {w}x{h}", flush=True)
        bench = RingBench(model, camera, ctx, ring, presenter, stream)
        rows = []
        with torch.no_grad():
            for policy, name in ((pol, m) for pol in args.policies for m in args.modes):
                t1 = time.perf_counter()
                r = bench.measure(name, MODE_NAMES[name], frames=args.frames, warmup=args.warmup,
                                  repeats=args.repeats, sync_frames=args.sync_frames, policy=policy)
                rows.append(r)
                print(f"  {policy:>5} {name:>12} {r['frame']:>10}: alone {r['alone_ms']:.3f} ms/frame, full {r['full_ms']:.3f} "
                      f"ms/frame, overhead {100 * r['overhead']:+.1f} % ({time.perf_counter() - t1:.1f} s)", flush=True)
            check = bench.check(C.MODE_IMAGE)
        bench.drain()
    finally:
        ctx.close()

    commit = os.environ.get("RIGEL_COMMIT") or subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    device_name = torch.cuda.get_device_name() if gpu else f"CPU ({torch.get_num_threads()} torch threads)"
    info = {
        "meta": f"{device_name}, {datetime.date.today()}, commit {commit or 'unknown'}, torch {torch.__version__}",
        "n": model.num_gaussians, "res": f"{w}x{h}", "frames": args.frames, "warmup": args.warmup,
        "repeats": args.repeats, "sync_frames": args.sync_frames, "slots": args.slots, "frames_in_flight": args.frames_in_flight, "path": path,
        "renderer": "CUDA kernels (rigel_core._C)" if gpu else "CPU reference (rigel_core.reference)",
        "vulkan_device": vk_name, "check": check,
        "validation_errors": validation_log.errors - errors_before if args.validation else None,
    }
    table = markdown(rows, info)
    print("\n" + table)
    if os.environ.get("OUT"):
        out = Path(os.environ["OUT"])
        out.mkdir(parents=True, exist_ok=True)
        (out / "ring_overhead.md").write_text(table)
        (out / "ring_overhead.json").write_text(json.dumps({**info, "rows": rows}, indent=2))
    ok = check["ring_equals_render"] and check["readback_ok"] and not info["validation_errors"]
    if not ok:
        print("ring_overhead: the check failed (see above)", file=sys.stderr)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
