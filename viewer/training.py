"""The viewer's training thread (DESIGN §6): a :class:`~rigel_core.train.Trainer` stepped in the background.

The thread owns the trainer. Between two iterations it applies the commands the UI sent
(:mod:`viewer.messages`), steps, emits events, and publishes a consistent copy of the model to the
:class:`~viewer.model_slot.ModelSlot` the UI renders from: every ``publish_every_s`` seconds while the UI asks for
a newer one (:meth:`ModelSlot.request <viewer.model_slot.ModelSlot.request>`: the viewer asks at its live refresh
rate, so no copy is made that it would not show), and after anything that changed the model's shape
(densification, an appearance switch, the end). Neither side waits for the other:
the UI drains :attr:`TrainingSession.events` once per frame without blocking, and the thread never looks at
frames. The copy is taken under ``trainer.lock`` (held by the trainer only while it modifies parameters); on
CUDA a CUDA event recorded after the copy travels with it (``info["_ready_event"]``) so the UI's render
stream waits for the copy on the GPU, not on the host.

The run folder gets what ``rigel-train`` writes (:class:`rigel_core.run_dir.RunRecord`): ``log.txt`` (a line per
densification, evaluation, skipped step and save), ``metrics.json`` (the loss curve per window of
``progress_every`` steps, the evaluations, the densifications; written at each evaluation and save), the checkpoint
and ``model.ply``. ``metrics.json``'s ``timings`` are rigel-train's: ``train_s`` (the steps' own seconds, evaluations
excluded) and ``loop_s`` (the wall-clock seconds of the training loop while it runs: from the start of a step to
the end of the last step that follows it without a pause, snapshots, loss-curve reads and commands included,
evaluations and saves excluded), summed over the run's sessions; ``ms_per_iter`` is ``train_s`` per iteration. A
step's loss and PSNR stay on the device until a window is full (one read per window, never a
host sync per step); the UI gets one :class:`~viewer.messages.TrainingProgress` per window, and at a pause or
the end.

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

from rigel_core.run_dir import CHECKPOINT_NAME, PLY_NAME, RunRecord

from . import messages as M
from .model_slot import ModelSlot

__all__ = ["TrainingSession", "CHECKPOINT_NAME", "PLY_NAME", "snapshot_model"]

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
        eval_at_start: evaluate the held-out views before the first step (a starting point for the PSNR plot; a
            resumed run shows its last evaluation when it was at the resume iteration).
        progress_every: steps per :class:`~viewer.messages.TrainingProgress` (and loss-curve point): their values
            are read from the device once per window.
        data: the dataset's name for ``metrics.json``.
    """

    def __init__(self, trainer, slot: ModelSlot, run_dir, *, running: bool = True, publish_every_s: float = 0.1,
                 eval_at_start: bool = True, progress_every: int = 10, data=""):
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
        self.progress_every = max(int(progress_every), 1)
        self.data = data
        self.record: RunRecord | None = None   # opened on the thread (the run folder is written from there only)
        self._window: list = []
        self._train_s = 0.0
        self._loop_s = 0.0            # wall-clock seconds of the training loop (module docstring)
        self._loop_mark = None        # the end of the previous step while stepping without a pause, else None
        self._aside_s = 0.0           # evaluation and save seconds inside the current step (not loop time)
        self._timings_before: dict = {}   # a resumed run's timings (earlier sessions)
        self._steps = 0               # steps of this session
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
        """Write the checkpoint and/or PLY now, then ``metrics.json`` (called on the training thread). Returns the
        paths written."""
        tr = self.trainer
        paths = tuple(str(p.resolve()) for p in self._record().save(tr, reason, what))
        self._write_metrics()
        if what == "both":
            self._dirty = False
        self._emit(M.Saved(tr.iteration, paths, reason))
        return paths

    def _record(self) -> RunRecord:
        if self.record is None:
            self.record = RunRecord.open(self.run_dir, self.trainer, data=self.data, name=f"rigel.viewer.run.{id(self)}")
            self._timings_before = dict(self.record.metrics.get("timings") or {})
        return self.record

    def _write_metrics(self) -> None:
        """``metrics.json`` now; ``timings`` as rigel-train writes them (summed over the run's sessions, ms per
        iteration over all its iterations)."""
        before = self._timings_before
        train_s = float(before.get("train_s", 0.0)) + self._train_s
        loop_s = float(before.get("loop_s", 0.0)) + self._loop_s
        self._record().write(self.trainer, timings={**before, "train_s": train_s, "loop_s": loop_s,
                                                    "ms_per_iter": 1e3 * train_s / max(1, self.trainer.iteration)})

    def _flush_progress(self) -> None:
        """Read the window's step values (one device read for the window) into a TrainingProgress and a
        loss-curve point."""
        if not self._window:
            return
        window, self._window = self._window, []
        entry = self._record().steps(window)
        r = window[-1]
        self._emit(M.TrainingProgress(r.iteration, entry["loss"], entry["psnr"], r.num_gaussians, self._elapsed,
                                      entry["ms_per_iter"], r.view, any(w.skipped for w in window)))

    def _apply(self, cmd: M.Command):
        """Apply one command; returns the Stop command when the thread must end."""
        tr = self.trainer
        if isinstance(cmd, M.Stop):
            return cmd
        if isinstance(cmd, M.Pause):
            if self._running or self._steps_left:
                self._running, self._steps_left = False, 0
                self._flush_progress()
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
            self._emit(M.CommandRejected("SetDensifyParams", str(e), current={k: getattr(before, k) for k in params}))
            return
        for k, v in params.items():          # in place: the trainer keeps reading the same config object
            setattr(before, k, v)
        self._emit(M.DensifyParamsChanged(tr.iteration, dict(params)))

    def _set_appearance(self, kind: str) -> None:
        tr = self.trainer
        if kind not in ("sh", "mlp"):
            self._emit(M.CommandRejected("SetAppearance", f"unknown appearance {kind!r} (sh or mlp)"))
            return
        rmse = float(tr.set_appearance(kind))
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
        t0 = time.perf_counter()
        start = self._loop_mark if self._loop_mark is not None else t0
        self._aside_s = 0.0
        r = tr.step()
        self._train_s += r.seconds - (r.eval.seconds if r.eval else 0.0)
        self._aside_s += r.eval.seconds if r.eval else 0.0
        self._elapsed += r.seconds
        self._dirty = True
        self._steps += 1
        self._window.append(r)        # its values stay on the device until the window is read
        changed = False
        if r.densify is not None:
            d = r.densify
            self._record().densified(d)
            self._emit(M.Densified(d.iteration, d.n_clone, d.n_split, d.n_prune, d.n_after,
                                   getattr(d, "n_relocated", None), getattr(d, "n_added", 0)))
            changed = True
        if len(self._window) >= self.progress_every:
            self._flush_progress()
        if r.eval is not None:
            self._evaluated(r.eval)
        paused = False
        if self._steps_left > 0:
            self._steps_left -= 1
            if self._steps_left == 0 and not self._running:
                changed = paused = True
                self._flush_progress()
        if tr.iteration >= tr.config.iterations:
            if paused:
                self._emit(M.TrainingPaused(tr.iteration))
            self._finish()
        else:
            if changed or (self.slot.wanted and time.perf_counter() - self._last_publish >= self.publish_every_s):
                self._publish()   # periodic copies only when the viewer will take one (ModelSlot.request)
            if paused:            # after the publish: whoever sees the pause finds the paused model in the slot
                self._emit(M.TrainingPaused(tr.iteration))
        end = time.perf_counter()
        self._loop_s += end - start - self._aside_s
        self._loop_mark = None if self._finished else end

    def _evaluated(self, e) -> None:
        self._flush_progress()
        t0 = time.perf_counter()
        self._record().evaluated(e)
        self._write_metrics()
        self._emit(M.EvalFinished(e.iteration, e.psnr, e.ssim, e.num_gaussians, e.n_views))
        self._aside_s += time.perf_counter() - t0

    def _evaluate_at_start(self) -> None:
        """The held-out PSNR where this session starts: evaluated at iteration 0; a resumed run's own evaluation at
        its iteration (``metrics.json``) when it has one (a finished session evaluated there), else evaluated now."""
        tr = self.trainer
        if tr.iteration > 0:
            evals = self._record().metrics.get("eval") or []
            last = evals[-1] if evals else None
            if isinstance(last, dict) and last.get("iteration") == tr.iteration:
                self._emit(M.EvalFinished(tr.iteration, float(last["psnr"]), float(last["ssim"]),
                                          int(last.get("num_gaussians", tr.model.num_gaussians)),
                                          int(last.get("n_views", len(tr.test_frames)))))
                return
        e = tr.evaluate()
        if e is not None:
            self._evaluated(e)

    def _finish(self) -> None:
        tr = self.trainer
        self._finished = True
        self._running, self._steps_left = False, 0
        self._flush_progress()            # the last read of the step values: the device's work is done
        t0, aside = time.perf_counter(), self._aside_s
        last = tr.eval_history[-1] if tr.eval_history else None
        if last is None or last.iteration != tr.iteration:
            e = tr.evaluate()
            if e is not None:
                self._evaluated(e)
                last = e
        self._publish()
        self.save("both", "finished")
        self._aside_s = aside + time.perf_counter() - t0   # the final evaluation and save are not loop time
        self._emit(M.TrainingFinished(tr.iteration, last.psnr if last is not None else math.nan))

    def _run(self) -> None:
        tr = self.trainer
        stop = None
        try:
            rec = self._record()
            rec.log_warnings(echo=True)  # a warning while training also goes to the run's log.txt (as rigel-train)
            rec.log.info(f"{'resumed at iteration ' + str(tr.iteration) if tr.iteration else 'start'}: "
                         f"{tr.model.num_gaussians} Gaussians, device {tr.device}, {tr.config.iterations} iterations "
                         f"(rigel-viewer)")
            for note in getattr(tr, "notes", ()):
                rec.log.info(note)
            if self.eval_at_start and tr.config.eval_every:
                self._evaluate_at_start()
            self._publish()
            self._emit(M.TrainingStarted(tr.iteration, tr.config.iterations, tr.model.num_gaussians,
                                         str(tr.device), len(tr.train_frames), len(tr.test_frames),
                                         str(self.run_dir), self._running and not self._finished,
                                         {k: getattr(tr.config, k)
                                          for k in M.densify_fields(tr.config.strategy, tr.config.densify_grad)},
                                         "mlp" if getattr(tr.model, "appearance", None) is not None else "sh",
                                         tr.config.strategy))
            while True:
                stop = self._drain_commands(block=not self._should_step())
                if stop is not None:
                    break
                if self._should_step():
                    self._step()
                else:                       # paused: the loop time stops until the next step
                    self._loop_mark = None
            self._flush_progress()
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
            if self.record is not None:
                try:
                    self._write_metrics()
                except OSError as e:
                    log.error("metrics.json not written: %s", e)
                self.record.close()
            self._emit(M.TrainingStopped(tr.iteration))
