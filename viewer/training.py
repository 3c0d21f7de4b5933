"""The viewer's training thread (DESIGN §6): a :class:`~rigel_core.train.Trainer` stepped in the background.

The thread owns the trainer. Between two iterations it applies the commands the UI sent
(:mod:`viewer.messages`), steps, emits events, and every ``publish_every_s`` seconds (and after anything that
changed the model's shape: densification, an appearance switch, the end) publishes a consistent copy of the
model to the :class:`~viewer.model_slot.ModelSlot` the UI renders from. Neither side waits for the other:
the UI drains :attr:`TrainingSession.events` once per frame without blocking, and the thread never looks at
frames. The copy is taken under ``trainer.lock`` (held by the trainer only while it modifies parameters); on
CUDA a CUDA event recorded after the copy travels with it (``info["_ready_event"]``) so the UI's render
stream waits for the copy on the GPU, not on the host.

Failures are never lost: an exception in the thread is logged (with its traceback) to the ``rigel.viewer``
logger and emitted as :class:`~viewer.messages.TrainingFailed`; the checkpoint and the PLY are then written
when the state is still consistent. :meth:`TrainingSession.stop` (window closed, Ctrl-C) saves both too.
"""
from __future__ import annotations

import dataclasses
import logging
import math
import queue
import threading
import time
import traceback
from pathlib import Path

from . import messages as M
from .model_slot import ModelSlot

__all__ = ["TrainingSession", "CHECKPOINT_NAME", "PLY_NAME", "snapshot_model"]

CHECKPOINT_NAME = "checkpoint.safetensors"   # same names as rigel-train, so a viewer run can be resumed by it
PLY_NAME = "model.ply"

log = logging.getLogger("rigel.viewer")


def snapshot_model(trainer):
    """A detached copy of ``trainer.model`` (appearance module included) taken under ``trainer.lock``; on CUDA
    also the CUDA event recorded after the copy (else None)."""
    import torch

    with trainer.lock:
        model = trainer.model.to()      # copies the appearance module too (never aliased)
        event = None
        if model.device.type == "cuda":
            event = torch.cuda.Event()
            event.record()
    return model, event


class TrainingSession:
    """Runs ``trainer`` in a thread, publishing snapshots into ``slot``.

    Args:
        trainer: a :class:`rigel_core.train.Trainer` (its ``config.iterations`` is the goal).
        slot: the ModelSlot the viewer renders from.
        run_dir: where :data:`CHECKPOINT_NAME` and :data:`PLY_NAME` are written.
        running: step at once (else wait for :class:`~viewer.messages.Resume` or ``Step``).
        publish_every_s: minimum wall time between two snapshots while stepping.
        eval_at_start: evaluate the held-out views before the first step (a starting point for the PSNR plot).
    """

    def __init__(self, trainer, slot: ModelSlot, run_dir, *, running: bool = True, publish_every_s: float = 0.1,
                 eval_at_start: bool = True):
        self.trainer = trainer
        self.slot = slot
        self.run_dir = Path(run_dir)
        self.commands: queue.Queue = queue.Queue()
        self.events: queue.Queue = queue.Queue()
        self.publish_every_s = float(publish_every_s)
        self.eval_at_start = eval_at_start
        self._running = bool(running)
        self._steps_left = 0
        self._finished = trainer.iteration >= trainer.config.iterations
        self._dirty = False           # the model changed since the last save
        self._elapsed = 0.0
        self._last_publish = 0.0
        self._thread = threading.Thread(target=self._run, name="rigel-training", daemon=True)

    # ---- the UI side ----------------------------------------------------------------------------------------
    def start(self) -> "TrainingSession":
        self._thread.start()
        return self

    def send(self, command: M.Command) -> None:
        """Queue a command; it is applied before the next iteration."""
        if not isinstance(command, M.Command):
            raise TypeError(f"not a viewer command: {command!r}")
        self.commands.put(command)

    def drain_events(self) -> list:
        """Every event emitted since the last call (never blocks)."""
        out = []
        while True:
            try:
                out.append(self.events.get_nowait())
            except queue.Empty:
                return out

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    def stop(self, *, save: bool = True, timeout: float | None = None) -> bool:
        """Ask the thread to end after the current iteration (saving first when ``save``) and wait for it.
        Returns True when it has ended."""
        if self._thread.is_alive():
            self.send(M.Stop(save=save))
            self._thread.join(timeout)
        return not self._thread.is_alive()

    # ---- the thread -------------------------------------------------------------------------------------------
    def _emit(self, event: M.Event) -> None:
        self.events.put(event)

    def _should_step(self) -> bool:
        return not self._finished and (self._running or self._steps_left > 0)

    def _publish(self, **extra) -> None:
        tr = self.trainer
        model, event = snapshot_model(tr)
        info = {"iteration": tr.iteration}
        info.update(extra)
        if event is not None:
            info["_ready_event"] = event
        self.slot.publish(model, **info)
        self._last_publish = time.perf_counter()

    def save(self, what: str = "both", reason: str = "request") -> tuple:
        """Write the checkpoint and/or PLY now (called on the training thread). Returns the paths written."""
        tr = self.trainer
        self.run_dir.mkdir(parents=True, exist_ok=True)
        paths = []
        if what in ("both", "checkpoint"):
            p = self.run_dir / CHECKPOINT_NAME
            tr.save_checkpoint(p)
            paths.append(str(p.resolve()))
        if what in ("both", "ply"):
            p = self.run_dir / PLY_NAME
            rmse = tr.export_ply(p)      # an MLP appearance is baked into SH first (other tools cannot run it)
            if tr.model.appearance is not None:
                log.info("[%d] %s: the MLP appearance baked into SH degree %d, RMSE %.4f", tr.iteration, p.name,
                         tr.config.sh_degree, rmse)
            paths.append(str(p.resolve()))
        if what == "both":
            self._dirty = False
        self._emit(M.Saved(tr.iteration, tuple(paths), reason))
        log.info("[%d] %s: wrote %s", tr.iteration, reason, ", ".join(paths))
        return tuple(paths)

    def _apply(self, cmd: M.Command):
        """Apply one command; returns the Stop command when the thread must end."""
        tr = self.trainer
        if isinstance(cmd, M.Stop):
            return cmd
        if isinstance(cmd, M.Pause):
            if self._running or self._steps_left:
                self._running, self._steps_left = False, 0
                self._publish()
                self._emit(M.TrainingPaused(tr.iteration))
        elif isinstance(cmd, M.Resume):
            if not self._running and not self._finished:
                self._running = True
                self._emit(M.TrainingResumed(tr.iteration))
        elif isinstance(cmd, M.Step):
            if self._finished:
                self._emit(M.CommandRejected("Step", f"training finished at iteration {tr.iteration}"))
            else:
                self._running = False
                self._steps_left += max(int(cmd.n), 0)
        elif isinstance(cmd, M.SetDensifyParams):
            self._set_densify(cmd.params)
        elif isinstance(cmd, M.SetAppearance):
            self._set_appearance(cmd.kind)
        elif isinstance(cmd, M.Save):
            if cmd.what not in ("both", "checkpoint", "ply"):
                self._emit(M.CommandRejected("Save", f"unknown target {cmd.what!r}"))
            else:
                self.save(cmd.what, "request")
        else:
            self._emit(M.CommandRejected(type(cmd).__name__, "unknown command"))
        return None

    def _set_densify(self, params: dict) -> None:
        tr = self.trainer
        unknown = sorted(set(params) - set(M.DENSIFY_FIELDS))
        if unknown:
            self._emit(M.CommandRejected("SetDensifyParams", f"not densification fields: {unknown}"))
            return
        before = tr.config
        candidate = dataclasses.replace(before, **params)
        try:
            candidate.validate()
        except ValueError as e:
            self._emit(M.CommandRejected("SetDensifyParams", str(e)))
            return
        for k, v in params.items():          # in place: the trainer keeps reading the same config object
            setattr(before, k, v)
        self._emit(M.DensifyParamsChanged(tr.iteration, dict(params)))

    def _set_appearance(self, kind: str) -> None:
        tr = self.trainer
        if kind not in ("sh", "mlp"):
            self._emit(M.CommandRejected("SetAppearance", f"unknown appearance {kind!r} (sh or mlp)"))
            return
        switch = getattr(tr, "set_appearance", None)
        if switch is None:
            self._emit(M.CommandRejected("SetAppearance", "this rigel_core trainer cannot switch the appearance "
                                                          "while training (no Trainer.set_appearance)"))
            return
        result = switch(kind)
        rmse = float(getattr(result, "rmse", result if isinstance(result, (int, float)) else math.nan))
        self._dirty = True
        self._publish()
        self._emit(M.AppearanceChanged(tr.iteration, kind, rmse))

    def _drain_commands(self, block: bool):
        """Apply the queued commands (waiting up to 50 ms for one when ``block``); the Stop command if one came."""
        try:
            cmd = self.commands.get(timeout=0.05) if block else self.commands.get_nowait()
        except queue.Empty:
            return None
        while True:
            stop = self._apply(cmd)
            if stop is not None:
                return stop
            try:
                cmd = self.commands.get_nowait()
            except queue.Empty:
                return None

    def _step(self) -> None:
        tr = self.trainer
        r = tr.step()
        step_s = r.seconds - (r.eval.seconds if r.eval else 0.0)
        self._elapsed += r.seconds
        self._dirty = True
        self._emit(M.TrainingProgress(r.iteration, r.loss, r.psnr, r.num_gaussians, self._elapsed, 1e3 * step_s,
                                      r.view, r.skipped))
        changed = False
        if r.densify is not None:
            d = r.densify
            self._emit(M.Densified(d.iteration, d.n_clone, d.n_split, d.n_prune, d.n_after))
            changed = True
        if r.eval is not None:
            e = r.eval
            self._emit(M.EvalFinished(e.iteration, e.psnr, e.ssim, e.num_gaussians, e.n_views))
        if self._steps_left > 0:
            self._steps_left -= 1
            if self._steps_left == 0 and not self._running:
                changed = True
                self._emit(M.TrainingPaused(tr.iteration))
        if tr.iteration >= tr.config.iterations:
            self._finish()
        elif changed or time.perf_counter() - self._last_publish >= self.publish_every_s:
            self._publish()

    def _finish(self) -> None:
        tr = self.trainer
        self._finished = True
        self._running, self._steps_left = False, 0
        last = tr.eval_history[-1] if tr.eval_history else None
        if last is None or last.iteration != tr.iteration:
            e = tr.evaluate()
            if e is not None:
                self._emit(M.EvalFinished(e.iteration, e.psnr, e.ssim, e.num_gaussians, e.n_views))
                last = e
        self._publish()
        self.save("both", "finished")
        self._emit(M.TrainingFinished(tr.iteration, last.psnr if last is not None else math.nan))

    def _run(self) -> None:
        tr = self.trainer
        stop = None
        try:
            if self.eval_at_start and tr.iteration == 0 and tr.config.eval_every:
                e = tr.evaluate()
                if e is not None:
                    self._emit(M.EvalFinished(e.iteration, e.psnr, e.ssim, e.num_gaussians, e.n_views))
            self._publish()
            self._emit(M.TrainingStarted(tr.iteration, tr.config.iterations, tr.model.num_gaussians,
                                         str(tr.device), len(tr.train_frames), len(tr.test_frames),
                                         str(self.run_dir), self._running and not self._finished,
                                         {k: getattr(tr.config, k) for k in M.DENSIFY_FIELDS},
                                         "mlp" if getattr(tr.model, "appearance", None) is not None else "sh"))
            while True:
                stop = self._drain_commands(block=not self._should_step())
                if stop is not None:
                    break
                if self._should_step():
                    self._step()
            if stop.save and self._dirty:
                self.save("both", "stopped")
        except BaseException as e:  # noqa: BLE001 - reported, logged, and the state saved when possible
            tb = traceback.format_exc()
            log.error("training failed at iteration %d:\n%s", tr.iteration, tb)
            self._emit(M.TrainingFailed(tr.iteration, f"{type(e).__name__}: {e}", tb))
            try:
                tr.optimizer.zero_grad(set_to_none=True)
                if tr.is_consistent():
                    self._publish()
                    self.save("both", "failed")
                else:
                    log.error("training state inconsistent after the failure: checkpoint not written")
            except BaseException as e2:  # noqa: BLE001
                log.error("saving after the failure failed too: %s", e2)
                self._emit(M.TrainingFailed(tr.iteration, f"saving after the failure failed: {e2}",
                                            traceback.format_exc()))
            if stop is None:   # keep serving until the UI says stop, so that the failure stays visible
                self._finished, self._running = True, False
                while stop is None:
                    try:
                        cmd = self.commands.get(timeout=0.05)
                    except queue.Empty:
                        continue
                    if isinstance(cmd, M.Stop):
                        stop = cmd
        finally:
            self._emit(M.TrainingStopped(tr.iteration))
