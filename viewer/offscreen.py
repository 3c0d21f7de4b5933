"""``rigel-viewer --offscreen``: the viewer's own frames (panels included) written to PNG, plus a JSON summary.

Two runs:

* :func:`run_offscreen` — a scene: N frames on an orbit, then the image, alpha and overdraw views of the last
  one;
* :func:`run_offscreen_training` — live training: the UI loop runs exactly as in a window (it drains the
  training thread's events, renders the newest snapshot, builds the panels) while the trainer steps in its
  thread; N frames are captured at evenly spaced training progress, then the last views and the per-pixel
  error of a training view. The training never waits for a frame, and a session that waits (started paused)
  is resumed when the loop starts, so that every iteration runs while frames are presented.

Both write ``summary.json`` with ``ok`` false (and an ``error``) when something failed; the CLI turns that
into a non-zero exit status.
"""
from __future__ import annotations

import math
import re
import time
from pathlib import Path

import numpy as np

from rigel_core.run_dir import write_json_atomic

from . import messages as M
from .gpu.shaderio import C

__all__ = ["run_offscreen", "run_offscreen_training", "OUTPUT_PATTERNS", "earlier_output", "next_frame_index",
           "FRAME_NAME", "PATH_FRAME_NAME", "LAST_VIEWS", "TRAINING_VIEW_NAME", "SUMMARY_NAME"]

# The names an offscreen run writes into ``--out``; the writers below (and viewer.panels.camera_path) take them from here,
# and :data:`OUTPUT_PATTERNS` is made of them, so that the refusal of an earlier run's folder covers every one.
#: the frames of :func:`run_offscreen` / :func:`run_offscreen_training` (``str.format`` with the frame index)
FRAME_NAME = "frame_{:04d}.png"
#: the camera path's frames (:func:`viewer.panels.camera_path.run_offscreen_path`)
PATH_FRAME_NAME = "path_{:04d}.png"
#: the last views of both runs: (file stem, render mode), written as ``<stem>.png`` (:func:`_last_views`)
LAST_VIEWS = (("image", C.MODE_IMAGE), ("alpha", C.MODE_ALPHA), ("overdraw", C.MODE_OVERDRAW))
#: training view 0 with its per-pixel error (:func:`run_offscreen_training`)
TRAINING_VIEW_NAME = "training_view.png"
#: the summary every offscreen run writes
SUMMARY_NAME = "summary.json"


def _glob(name_format: str) -> str:
    """``frame_{:04d}.png`` → ``frame_*.png``."""
    return re.sub(r"\{[^}]*\}", "*", name_format)


#: glob patterns of everything an offscreen run writes into ``--out`` (:func:`earlier_output`)
OUTPUT_PATTERNS = (_glob(FRAME_NAME), _glob(PATH_FRAME_NAME), *(f"{stem}.png" for stem, _ in LAST_VIEWS),
                   TRAINING_VIEW_NAME, SUMMARY_NAME)


def earlier_output(out_dir) -> str | None:
    """Why ``out_dir`` cannot take a new offscreen run, or None: it already holds a file an offscreen run writes
    (:data:`OUTPUT_PATTERNS`), which the new run would replace or leave mixed with its own (a run of 1 frame beside
    the frame_0001.png, frame_0002.png … of an earlier run of 8; a user's own image.png). One line naming the
    folder and what it holds."""
    out = Path(out_dir)
    if not out.is_dir():
        return None
    found = sorted({p.name for pattern in OUTPUT_PATTERNS for p in out.glob(pattern)})
    if not found:
        return None
    names = ", ".join(found[:3]) + (f" and {len(found) - 3} more" if len(found) > 3 else "")
    return f"--out {out} already holds the output of an earlier viewer run or files it would replace ({names}); " \
           "choose a new folder"


def next_frame_index(out_dir) -> int:
    """One past the highest index of the :data:`FRAME_NAME` files in ``out_dir`` (0 when none): where a resumed
    training run (``rigel-viewer --data … --resume --offscreen``) numbers its frames, so that it neither replaces
    nor mixes with an earlier session's."""
    rx = re.compile(re.escape(_glob(FRAME_NAME)).replace(r"\*", r"(\d+)") + "$")
    found = [int(m.group(1)) for p in Path(out_dir).glob(_glob(FRAME_NAME)) if (m := rx.match(p.name))]
    return max(found) + 1 if found else 0


def _save_rgb(px, path):
    from PIL import Image

    Image.fromarray(px[..., :3]).save(path)


def _capture(viewer, path, *, panels=None, mode=None):
    """Step once with capture and write the frame to ``path``; returns the pixels (H, W, 4)."""
    keep = viewer.settings.mode
    if mode is not None:
        viewer.settings.mode = mode
    try:
        p = viewer.step(capture=True, panels=panels)
        if p is None:
            raise RuntimeError("the offscreen target did not take a frame")
        px = viewer.read_pixels(p)
    finally:
        viewer.settings.mode = keep
    _save_rgb(px, path)
    return px


def _last_views(viewer, out: Path, files: list) -> dict:
    """image / alpha / overdraw PNGs of the current view (no panels) and statistics of the last frame."""
    for name, mode in LAST_VIEWS:
        _capture(viewer, out / f"{name}.png", panels=False, mode=mode)
        files.append(f"{name}.png")
    viewer.wait_rendered()   # the slot was written on the viewer's CUDA stream
    slot = viewer.ring.latest
    alpha = (1.0 - slot.final_T.float()).cpu().numpy()
    n = slot.n_contrib.cpu().numpy()
    img = slot.image.float().cpu().numpy()
    return {"image_mean_rgb": [round(float(x), 5) for x in img.reshape(-1, 3).mean(0)],
            "alpha_coverage": round(float((alpha > 0.5).mean()), 5),
            "alpha_mean": round(float(alpha.mean()), 5),
            "n_contrib_max": int(n.max()), "n_contrib_mean": round(float(n.mean()), 3)}


def _common(viewer) -> dict:
    return {
        "scene": viewer.stats.scene,
        "gaussians": viewer.stats.gaussians,
        "sh_degree": viewer.model.sh_degree,
        "appearance": viewer.appearance,
        "render_device": viewer.render_device,
        # "cuda-interop": the renderer wrote CUDA tensors imported from the Vulkan ring's exported memory;
        # "host-mapped": the CPU reference wrote host-visible Vulkan memory
        "frame_ring": "cuda-interop" if viewer.ring.device == "cuda" else "host-mapped",
        "vulkan_device": viewer.ctx.device_name,
        "target_size": [viewer.target.width, viewer.target.height],
        "frame_size": list(viewer.stats.frame_size),
        "mode": viewer.settings.mode_name,
    }


def _finish(viewer, out: Path, summary: dict) -> dict:
    from .gpu.vk_context import validation_log

    if viewer.ctx.validation:
        summary["validation_errors"] = validation_log.errors
    if summary["ok"] and summary["last_frame"]["alpha_mean"] <= 0:
        finite = _finite_gaussians(viewer.model)
        if summary.get("gaussians") == 0:   # a valid empty scene: its frame is the background, not an error
            summary["note"] = "empty scene (0 Gaussians): the frames show the background"
        elif finite == 0:                   # every Gaussian culled (a non-finite parameter in each): empty too
            summary["note"] = (f"no drawable Gaussian: all {summary.get('gaussians')} have a non-finite parameter "
                               "and are culled (docs/PIPELINE.md); the frames show the background")
        else:
            summary["ok"] = False
            summary["error"] = "the last frame is empty: the camera sees no Gaussian"
    write_json_atomic(out / SUMMARY_NAME, summary, indent=2)
    return summary


def _finite_gaussians(model) -> int | None:
    """How many Gaussians of ``model`` have every parameter finite (the others are culled); None without one."""
    if model is None:
        return None
    import torch

    from rigel_core.model import PARAM_NAMES

    ok = None
    for name in PARAM_NAMES:
        t = getattr(model, name).detach()
        if t[0:1].numel():  # rows with values (not N = 0, not an empty (N, 0, 3) sh_rest)
            row = torch.isfinite(t.reshape(t.shape[0], -1)).all(1)
        else:
            row = torch.ones(t.shape[0], dtype=torch.bool, device=t.device)
        ok = row if ok is None else ok & row
    return int(ok.sum())


def run_offscreen(viewer, frames: int, out_dir, *, orbit_degrees: float = 360.0) -> dict:
    """Render ``frames`` views on an orbit (``orbit_degrees`` in all), each with the panels, to
    ``out_dir/frame_XXXX.png``; then ``image.png``, ``alpha.png``, ``overdraw.png`` of the last view; returns the
    summary (also written to ``summary.json``)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    files, per_frame = [], []
    yaw0 = viewer.camera.yaw
    step = math.radians(orbit_degrees) / max(frames, 1)
    viewer.build_ui()   # ImGui sizes auto-resizing panels from one frame's contents: frame 0 is then complete
    t_start = time.perf_counter()
    for i in range(frames):
        if i and step:   # frame 0 is the opening view as it is (a training view of --view N stays exact: no
            viewer.camera.set_yaw(yaw0 + i * step)   # re-posing; with no orbit, every frame stays so)
        t0 = time.perf_counter()
        path = out / FRAME_NAME.format(i)
        _capture(viewer, path)
        files.append(path.name)
        per_frame.append({"frame": i, "render_ms": round(viewer.stats.render_ms, 3),
                          "frame_ms": round((time.perf_counter() - t0) * 1e3, 3)})
    elapsed = time.perf_counter() - t_start
    common = _common(viewer)   # before the last views re-render in single modes (another frame size)
    last = _last_views(viewer, out, files)
    summary = {"ok": True, **common, "frames": frames, "iterations": 0, "psnr": None,
               "seconds": round(elapsed, 3), "fps": round(frames / elapsed, 3) if elapsed > 0 else None,
               "median_render_ms": float(np.median([f["render_ms"] for f in per_frame])) if per_frame else None,
               "per_frame": per_frame, "last_frame": last, "files": files}
    return _finish(viewer, out, summary)


def run_offscreen_training(viewer, frames: int, out_dir, *, max_fps: float = 30.0, timeout_s: float | None = None,
                           orbit_degrees: float = 90.0) -> dict:
    """Run the UI loop offscreen while ``viewer.training`` trains to its ``config.iterations``.

    ``frames`` PNGs (with the panels; numbered after the highest ``frame_XXXX.png`` already in ``out_dir``, so that
    a resumed run replaces none of an earlier session's, :func:`next_frame_index`) are captured when the training
    passes ``k/frames`` of its remaining iterations (k = 1 … frames; the last one once the training has ended, so
    that it shows the final status and evaluation), the camera turning ``orbit_degrees`` in all;
    then ``image/alpha/overdraw.png`` of the final model and ``training_view.png`` (the panels with the per-pixel
    error of training view 0).
    The loop presents at most ``max_fps`` frames per second (it sleeps otherwise, leaving the cores to the
    trainer); a paused session is resumed as the loop starts. Returns the summary (also in ``summary.json``):
    frames, presents, fps (presents per second achieved over the loop), ``max_fps``, ``iterations`` (the run's iteration
    when the session stopped) and ``session_iterations`` (this session's: fewer on a resumed run), held-out PSNR (first
    and last evaluation), train-view PSNR (mean of the first and of the last window of ≤ 10 iterations),
    Gaussians, the run folder and the files written there; ``renders``, ``ui_builds``, ``repeats`` and ``held`` over
    the loop (the live refresh cap, :mod:`viewer.app`: a repeat presents the last frame and panels again, a held
    frame was already the one presented and submits nothing), ``loop_fps`` (frames of the loop per second, held ones
    included). ``ok`` is false when the training failed, ``timeout_s`` passed or a Ctrl-C / SIGTERM came (checked
    before every frame: the loop ends at once, the run saved).
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    session, state = viewer.training, viewer.train_state
    trainer = session.trainer
    start_it, goal = trainer.iteration, trainer.config.iterations
    if not max_fps > 0:
        raise ValueError(f"max_fps must be > 0, got {max_fps}")
    span = max(goal - start_it, 1)
    marks = [start_it + math.ceil(span * (k + 1) / frames) for k in range(frames)]
    files, shots = [], []
    first = next_frame_index(out)   # a resumed run's frames follow the earlier sessions' (none replaced)
    yaw0 = viewer.camera.yaw
    t_start = time.perf_counter()
    presents0 = viewer.stats.presents
    counts0 = (viewer.stats.renders, viewer.stats.ui_builds, viewer.stats.repeats, viewer.stats.held)
    session.send(M.Resume())   # a session started paused (rigel-viewer --offscreen) trains from here on
    error = None
    interrupted = False
    k = 0

    def stopped() -> str | None:
        """Why the loop must end now (Ctrl-C / SIGTERM, the timeout), or None: asked before every frame, the
        catch-up frames included (a training ahead of its marks kept the loop capturing, and training, after a
        Ctrl-C)."""
        if getattr(viewer, "interrupted", False):
            return f"interrupted (Ctrl-C) at iteration {state.iteration} of {goal}; the run was saved"
        if timeout_s is not None and time.perf_counter() - t_start > timeout_s:
            return f"timed out after {timeout_s} s at iteration {state.iteration} of {goal}"
        return None

    while True:
        t0 = time.perf_counter()
        viewer.step()
        done = state.status in ("finished", "failed", "stopped")
        # the last frame waits for the end (status, final evaluation in the panels), not only its iteration
        while k < frames and (done or (k < frames - 1 and state.iteration >= marks[k])) and stopped() is None:
            if orbit_degrees:   # (none: the opening view stays exact, e.g. --view N)
                viewer.camera.set_yaw(yaw0 + math.radians(orbit_degrees) * (k + 1) / frames)
            path = out / FRAME_NAME.format(first + k)
            _capture(viewer, path)
            files.append(path.name)
            shots.append({"frame": first + k, "iteration": state.iteration, "model_iteration":
                          viewer.stats.model_info.get("iteration"), "gaussians": viewer.stats.gaussians,
                          "status": state.status, "eval_iteration": state.eval_iters[-1] if state.eval_iters else None})
            k += 1
        if done and k >= frames:
            break
        error = stopped()
        if error is not None:
            interrupted = getattr(viewer, "interrupted", False)  # said once the session has stopped: its iteration
            break
        rest = 1.0 / max_fps - (time.perf_counter() - t0)
        if rest > 0:
            time.sleep(rest)
    elapsed = time.perf_counter() - t_start
    presents = viewer.stats.presents - presents0
    renders, ui_builds, repeats, held = (a - b for a, b in zip((viewer.stats.renders, viewer.stats.ui_builds,
                                                               viewer.stats.repeats, viewer.stats.held), counts0))
    if state.status == "failed":
        error = f"training failed: {state.error}"
    session.stop(save=True)
    viewer.drain_events()
    # the counts of the stopped session, from its run loop (rigel_core/train/run.py): this session's iterations and
    # the run's iteration (the UI's state may lag a window behind, and a resumed run started past 0)
    iteration = trainer.iteration
    steps = session.run.steps if session.run is not None else 0
    if interrupted:
        error = f"interrupted (Ctrl-C) at iteration {iteration} of {goal}; the run was saved"
    # the final model, then training view 0 with its per-pixel error in the PSNR window
    viewer.take_model()
    common = _common(viewer)   # before the last views re-render in single modes (another frame size)
    last = _last_views(viewer, out, files)
    if viewer.frames:
        viewer.snap_to_camera(0)
        viewer.step()
        for _ in range(3):   # the error is picked up without waiting (CUDA): give it a few frames
            viewer.poll_error()
            if viewer.error_view is not None:
                break
            time.sleep(0.05)
            viewer.step()
        _capture(viewer, out / TRAINING_VIEW_NAME)
        files.append(TRAINING_VIEW_NAME)
    train = state.train_psnr
    first = float(train[0]) if train else None    # each point: the mean of a window of (at most) 10 steps
    final = float(train[-1]) if train else None
    summary = {
        "ok": error is None, **common,
        "frames": len(shots), "presents": presents, "seconds": round(elapsed, 3),
        "fps": round(presents / elapsed, 3) if elapsed > 0 else None, "max_fps": max_fps,
        "loop_fps": round((presents + held) / elapsed, 3) if elapsed > 0 else None,
        # the live refresh cap (viewer/app.py): full frames (renders, panel builds) vs presents of the last frame
        "refresh_hz": viewer.settings.refresh_hz, "renders": renders, "ui_builds": ui_builds, "repeats": repeats,
        "held": held,
        "iterations": iteration, "session_iterations": steps, "iterations_goal": goal, "status": state.status,
        "psnr": state.last_eval_psnr if state.eval_psnr else None,
        "psnr_initial": state.eval_psnr[0] if state.eval_psnr else None,
        "eval": [{"iteration": i, "psnr": p, "ssim": s} for i, p, s in zip(state.eval_iters, state.eval_psnr,
                                                                          state.eval_ssim)],
        "train_psnr_first10": first, "train_psnr_last10": final,
        "ms_per_iter": round(1e3 * state.elapsed_s / max(steps, 1), 3),
        "training_device": state.device, "run_dir": state.run_dir, "saved": list(state.saved),
        "strategy": trainer.config.strategy, "max_gaussians": trainer.config.max_gaussians,
        "densify_grad": trainer.config.densify_grad,
        "error_view_psnr": viewer.error_view.psnr if viewer.error_view is not None else None,
        "shots": shots, "last_frame": last, "files": files,
    }
    if error is not None:
        summary["error"] = error
    return _finish(viewer, out, summary)
