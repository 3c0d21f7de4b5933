"""What the panels show that is not a render setting: the UI's mirror of the training (built from events only),
the per-pixel error of a training view, and background jobs (orbit video, appearance conversion).

Nothing here touches ImGui or Vulkan, so all of it is tested without a window.
"""
from __future__ import annotations

import math
import threading
import traceback
from collections import deque
from dataclasses import dataclass, field

import numpy as np

from . import messages as M

__all__ = ["TrainingState", "ErrorView", "Job", "error_map", "downsample_mean"]


@dataclass
class TrainingState:
    """The training as the UI knows it: updated only by :meth:`apply` (events from the training thread), never
    by reading the trainer.

    ``status``: "starting", "running", "paused", "finished", "failed" or "stopped".
    ``train_iters`` / ``train_psnr``: PSNR (dB) of each iteration's training view; ``eval_iters`` /
    ``eval_psnr``: held-out PSNR at each evaluation. ``densify``: the densification fields as last sent or
    confirmed (the sliders edit this dict). ``log``: the last messages worth showing (saves, rejections).
    """

    status: str = "starting"
    iteration: int = 0
    iterations: int = 0
    loss: float = math.nan
    psnr: float = math.nan
    num_gaussians: int = 0
    elapsed_s: float = 0.0
    ms_per_iter: float = math.nan
    view: str = ""
    device: str = ""
    run_dir: str = ""
    appearance: str = "sh"
    appearance_switchable: bool = True
    strategy: str = "default"
    notes: tuple = ()   # the run's start line and the "auto" notes (TrainingStarted.notes)
    coarse: str = ""    # coarse-to-fine in a few words (TrainingStarted.coarse)
    start: str = ""     # where the session starts (TrainingStarted.start)
    budget: str = ""    # the strategy's bound on the Gaussians, "" without one (TrainingStarted.budget)
    train_iters: list = field(default_factory=list)
    train_psnr: list = field(default_factory=list)
    eval_iters: list = field(default_factory=list)
    eval_psnr: list = field(default_factory=list)
    eval_ssim: list = field(default_factory=list)
    densify: dict = field(default_factory=dict)
    error: str = ""
    error_traceback: str = ""
    saved: tuple = ()
    log: deque = field(default_factory=lambda: deque(maxlen=6))

    @property
    def last_eval_psnr(self) -> float:
        return self.eval_psnr[-1] if self.eval_psnr else math.nan

    def apply(self, ev: M.Event) -> None:
        """Fold one event into the state."""
        if isinstance(ev, M.TrainingProgress):
            self.iteration, self.loss, self.psnr = ev.iteration, ev.loss, ev.psnr
            self.num_gaussians, self.elapsed_s, self.ms_per_iter, self.view = (ev.num_gaussians, ev.elapsed_s,
                                                                               ev.ms_per_iter, ev.view)
            if math.isfinite(ev.psnr):
                self.train_iters.append(ev.iteration)
                self.train_psnr.append(ev.psnr)
        elif isinstance(ev, M.EvalFinished):
            self.eval_iters.append(ev.iteration)
            self.eval_psnr.append(ev.psnr)
            self.eval_ssim.append(ev.ssim)
            self.log.append(f"[{ev.iteration}] held-out PSNR {ev.psnr:.2f} dB, SSIM {ev.ssim:.3f}")
        elif isinstance(ev, M.TrainingStarted):
            self.iteration, self.iterations, self.num_gaussians = ev.iteration, ev.iterations, ev.num_gaussians
            self.device, self.run_dir = ev.device, ev.run_dir
            self.densify = dict(ev.densify)
            self.appearance = ev.appearance
            self.strategy = ev.strategy
            self.notes = tuple(ev.notes)
            self.coarse = ev.coarse
            self.start, self.budget = ev.start, ev.budget
            self.status = "running" if ev.running else ("finished" if ev.iteration >= ev.iterations else "paused")
        elif isinstance(ev, M.TrainingPaused):
            if self.status in ("running", "starting"):
                self.status = "paused"
        elif isinstance(ev, M.TrainingResumed):
            self.status = "running"
        elif isinstance(ev, M.Densified):
            self.num_gaussians = ev.n_after
            if ev.n_relocated is not None:   # the MCMC budget
                self.log.append(f"[{ev.iteration}] mcmc relocate {ev.n_relocated} add {ev.n_added} "
                                f"-> {ev.n_after:,}" + ("" if ev.dead_share is None else
                                                        f" (growth held: {ev.dead_share:.0%} dead)"))
            else:
                self.log.append(f"[{ev.iteration}] densify +{ev.n_clone} clone +{ev.n_split} split "
                                f"-{ev.n_prune} prune -> {ev.n_after:,}")
        elif isinstance(ev, M.DensifyParamsChanged):
            self.densify.update(ev.params)
        elif isinstance(ev, M.AppearanceChanged):
            self.appearance = ev.kind
            self.log.append(f"[{ev.iteration}] appearance -> {ev.kind} (rmse {ev.rmse:.4f})")
        elif isinstance(ev, M.Saved):
            self.saved = ev.paths
            self.log.append(f"[{ev.iteration}] saved ({ev.reason}): " + ", ".join(p.rsplit("/", 1)[-1]
                                                                                    for p in ev.paths))
        elif isinstance(ev, M.CommandRejected):
            if ev.unsupported and ev.command == "SetAppearance":
                self.appearance_switchable = False
            self.densify.update({k: v for k, v in ev.current.items() if k in self.densify})   # the slider reverts
            self.log.append(f"{ev.command} rejected: {ev.reason}")
        elif isinstance(ev, M.TrainingFinished):
            self.status = "finished"
            self.iteration = ev.iteration
        elif isinstance(ev, M.TrainingFailed):
            self.status = "failed"
            if not self.error:   # the first failure is the cause; later ones are consequences
                self.error, self.error_traceback = ev.message, ev.traceback
            self.log.append(f"[{ev.iteration}] FAILED: {ev.message}")
        elif isinstance(ev, M.TrainingStopped):
            if self.status != "failed":
                self.status = "stopped" if self.status != "finished" else "finished"


def downsample_mean(a: np.ndarray, max_side: int) -> np.ndarray:
    """Block-mean ``a`` (H, W) by an integer factor so that both sides are ≤ ``max_side`` (rows/columns that do
    not fill a block are dropped)."""
    h, w = a.shape
    f = max(1, math.ceil(max(h, w) / max(int(max_side), 1)))
    if f == 1:
        return a
    hh, ww = h // f, w // f
    return a[: hh * f, : ww * f].reshape(hh, f, ww, f).mean(axis=(1, 3))


def error_map(render, gt) -> tuple[np.ndarray, float]:
    """Per-pixel error of ``render`` against ``gt`` (both (H, W, 3) float in [0, 1], numpy or torch): the mean
    over channels of |render − gt| as an (H, W) float32 array, and the PSNR (dB) of the clamped render
    (``10·log10(1 / MSE)``, inf for identical images)."""
    r = np.clip(np.asarray(render, dtype=np.float32), 0.0, 1.0)
    g = np.asarray(gt, dtype=np.float32)
    if r.shape != g.shape:
        raise ValueError(f"error_map: render {r.shape} and ground truth {g.shape} differ in shape")
    d = r - g
    mse = float(np.mean(d.astype(np.float64) ** 2))
    psnr = math.inf if mse == 0 else 10.0 * math.log10(1.0 / mse)
    return np.abs(d).mean(-1), psnr


@dataclass
class ErrorView:
    """The per-pixel error of the training view the viewer is snapped to: ``values`` (h, w) float32 (a
    downsampled |render − GT|), its max, the view's name and PSNR (dB) of the full-resolution frame."""

    name: str
    values: np.ndarray
    psnr: float
    vmax: float
    frame_size: tuple


class Job:
    """A function run on a background thread, reporting ``progress`` in [0, 1] and a ``message``; its result or
    its exception (with traceback) is kept, never lost. ``cancel()`` asks the function to stop (it receives the
    job and checks ``job.cancelled``)."""

    def __init__(self, name: str, fn, *args, **kwargs):
        self.name = name
        self.progress = 0.0
        self.message = ""
        self.result = None
        self.error: str = ""
        self.traceback: str = ""
        self.cancelled = False
        self._thread = threading.Thread(target=self._run, args=(fn, args, kwargs), name=f"rigel-{name}",
                                        daemon=True)
        self._thread.start()

    def _run(self, fn, args, kwargs):
        try:
            self.result = fn(self, *args, **kwargs)
            self.progress = 1.0
        except BaseException as e:  # noqa: BLE001 - kept for the UI and the log
            from rigel_core.render_video import VideoCancelled

            if isinstance(e, VideoCancelled):   # asked for (cancel()): not a failure, no traceback
                self.message = "cancelled"
                return
            self.error = f"{type(e).__name__}: {e}"
            self.traceback = traceback.format_exc()
            import logging

            logging.getLogger("rigel.viewer").error("%s failed:\n%s", self.name, self.traceback)

    @property
    def done(self) -> bool:
        return not self._thread.is_alive()

    def cancel(self):
        self.cancelled = True

    def join(self, timeout: float | None = None) -> bool:
        self._thread.join(timeout)
        return self.done
