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

The run loop's bookkeeping is rigel-train's own (:class:`rigel_core.train.run.TrainingRun`, the one run loop):
the run folder gets what ``rigel-train`` writes (:class:`rigel_core.run_dir.RunRecord`): ``log.txt`` (a line per
densification, opacity reset, evaluation, skipped step and save), ``metrics.json`` (the loss curve per window of
``progress_every`` steps, the evaluations, the densifications; written at each evaluation and save; its ``timings``
as rigel-train's, summed over the run's sessions), the checkpoint and ``model.ply``. A step's loss and PSNR stay on
the device until a window is full (one read per window, never a host sync per step); the UI gets one
:class:`~viewer.messages.TrainingProgress` per window, and at a pause or the end. This module adds what is the
viewer's: the commands, pausing, the snapshots and the events (:class:`_ViewerHooks`).

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

from rigel_core.run_dir import CHECKPOINT_NAME, METRICS_NAME, PLY_NAME, RunRecord, read_metrics
from rigel_core.train.run import RunHooks, TrainingRun, run_finished

from . import messages as M
from .model_slot import ModelSlot

__all__ = ["TrainingSession", "CHECKPOINT_NAME", "PLY_NAME", "snapshot_model", "PoseSnapshot", "snapshot_poses"]

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


class PoseSnapshot:
    """The trainer's pose corrections (:mod:`rigel_core.train.pose`) at a snapshot, for drawing the refined training
    cameras beside the given ones: ``delta`` (n, 6) and ``pivot`` (n,) copied to the host without a host sync (on
    CUDA into pinned memory, ``ready`` the CUDA event recorded after the copy; None on the CPU), ``extent``."""

    def __init__(self, delta, pivot, extent: float, ready=None):
        self.delta, self.pivot, self.extent, self.ready = delta, pivot, float(extent), ready

    def cameras(self, cameras: list):
        """The refined Camera of each of ``cameras`` (the training views' given cameras), or None while the copy is
        still on its way (never waits for it) or when the counts differ."""
        from rigel_core.train.pose import refined_cameras

        if self.ready is not None and not self.ready.query():
            return None
        if len(cameras) != self.delta.shape[0]:
            return None
        return refined_cameras(cameras, self.delta, self.extent, self.pivot)


def snapshot_poses(trainer) -> PoseSnapshot | None:
    """A :class:`PoseSnapshot` of ``trainer.pose`` (None when the run refines no poses); called on the training thread
    between two steps, as :func:`snapshot_model`."""
    import torch

    pose = trainer.pose
    if pose is None:
        return None
    src = (pose.param.detach(), pose.pivot)
    if pose.param.device.type != "cuda":
        return PoseSnapshot(src[0].clone(), src[1].clone(), pose.extent)
    host = [torch.empty(t.shape, dtype=t.dtype, pin_memory=True) for t in src]
    for h, t in zip(host, src):
        h.copy_(t, non_blocking=True)
    ready = torch.cuda.Event()
    ready.record()
    return PoseSnapshot(host[0], host[1], pose.extent, ready)


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
        self._last_publish = 0.0
        self.progress_every = max(int(progress_every), 1)
        self.data = data
        self.record: RunRecord | None = None   # opened on the thread (the run folder is written from there only)
        self.run: TrainingRun | None = None    # the run loop's bookkeeping, made with the record
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
        poses = snapshot_poses(tr)
        if poses is not None:   # the refined training cameras (viewer/studio.py draws them)
            info["_poses"] = poses
        self.slot.publish(model, **info)
        self._last_publish = time.perf_counter()

    def save(self, what: str = "both", reason: str = "request") -> tuple:
        """Write the checkpoint and/or PLY now, then ``metrics.json`` (called on the training thread). Returns the
        paths written."""
        return tuple(str(p.resolve()) for p in self._loop().save(reason, what))

    def _loop(self) -> TrainingRun:
        """The run loop's bookkeeping (and the run folder's record), made at first use on the thread."""
        if self.run is None:
            self.record = RunRecord.open(self.run_dir, self.trainer, data=self.data, name=f"rigel.viewer.run.{id(self)}")
            self.run = TrainingRun(self.trainer, self.record, window=self.progress_every, hooks=_ViewerHooks(self))
        return self.run

    @property
    def unsaved(self) -> bool:
        """The model changed since the last save of both files (what closing the viewer then saves)."""
        return self.run is not None and self.run.dirty

    def _flush_progress(self) -> None:
        """Read the window's step values (one device read for the window) into a TrainingProgress and a
        loss-curve point (nothing to read before the record is opened: no step was taken)."""
        if self.run is not None:
            self.run.flush()

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
        self._loop().dirty = True
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
        r = self._loop().step()   # the window, the densification and evaluation events: _ViewerHooks
        changed = r.densify is not None
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

    def _evaluate_at_start(self) -> None:
        """The held-out PSNR where this session starts: evaluated at iteration 0; a resumed run's own evaluation at
        its iteration (``metrics.json``) when it has one (a finished session evaluated there), else evaluated now."""
        tr = self.trainer
        if tr.iteration > 0:
            metrics = (self.run.record.metrics if self.run is not None
                       else read_metrics(self.run_dir / METRICS_NAME) or {})   # a finished run's, not opened
            evals = metrics.get("eval") or []
            last = evals[-1] if evals else None
            if isinstance(last, dict) and last.get("iteration") == tr.iteration:
                self._emit(M.EvalFinished(tr.iteration, float(last["psnr"]), float(last["ssim"]),
                                          int(last.get("num_gaussians", tr.model.num_gaussians)),
                                          int(last.get("n_views", len(tr.test_frames)))))
                return
        e = tr.evaluate()
        if e is None:
            return
        if self.run is not None:
            self.run.evaluated(e)
        else:   # a finished run looked at: shown, not written into its record
            self._emit(M.EvalFinished(e.iteration, e.psnr, e.ssim, e.num_gaussians, e.n_views))

    def _finish(self) -> None:
        tr = self.trainer
        self._finished = True
        self._running, self._steps_left = False, 0
        last = self._loop().finish("finished")   # the last window, the final evaluation, the save
        self._publish()
        self._emit(M.TrainingFinished(tr.iteration, last.psnr if last is not None else math.nan))

    def _run(self) -> None:
        tr = self.trainer
        stop = None
        try:
            # the log's first lines, and the panel's (TrainingStarted.notes)
            start, notes = tr.start_line(), tuple(getattr(tr, "notes", ()))
            if not run_finished(tr):   # (a finished run opened to look at writes nothing: below)
                rec = self._loop().record
                rec.log_warnings(echo=True)  # a warning while training also goes to log.txt (as rigel-train)
                rec.log_data(tr)             # the data line and the frames' cache, as rigel-train's
                rec.log.info(f"{start} (rigel-viewer)")
                for note in notes:
                    rec.log.info(note)
            # else: a finished run opened to look at (--resume): its files change only when the model does (a Save,
            # the appearance switched), as rigel-train --resume of a finished run writes nothing — not even a line in
            # log.txt (rigel-viewer's command line says so on the console)
            if self.eval_at_start and tr.config.eval_every:
                self._evaluate_at_start()
            self._publish()
            self._emit(M.TrainingStarted(tr.iteration, tr.config.iterations, tr.model.num_gaussians,
                                         str(tr.device), len(tr.train_frames), len(tr.test_frames),
                                         str(self.run_dir), self._running and not self._finished,
                                         {k: getattr(tr.config, k)
                                          for k in M.densify_fields(tr.config.strategy, tr.config.densify_grad)},
                                         "mlp" if getattr(tr.model, "appearance", None) is not None else "sh",
                                         tr.config.strategy, (start, *notes), tr.coarse_summary(),
                                         tr.start_words(), tr.budget_words()))
            if self._finished and self.run is not None:   # its iterations done, not its final evaluation and save
                self._finish()                             # (stopped during its last step): as rigel-train --resume
            while True:
                stop = self._drain_commands(block=not self._should_step())
                if stop is not None:
                    break
                if self._should_step():
                    self._step()
                elif self.run is not None:  # paused: the loop time stops until the next step
                    self.run.pause()
            self._flush_progress()
            if stop.save and self.unsaved:
                self.save("both", "stopped")
        except BaseException as e:  # noqa: BLE001 - reported, logged, and the state saved when possible
            tb = traceback.format_exc()
            log.error("training failed at iteration %d:\n%s", tr.iteration, tb)
            self._emit(M.TrainingFailed(tr.iteration, f"{type(e).__name__}: {e}", tb))
            try:
                if self._loop().save_if_consistent("failed"):
                    self._publish()
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
            if self.run is not None:
                try:
                    self.run.write_metrics()
                except OSError as e:
                    log.error("metrics.json not written: %s", e)
                self.record.close()
            self._emit(M.TrainingStopped(tr.iteration))


class _ViewerHooks(RunHooks):
    """The viewer's part of the run loop (:class:`rigel_core.train.run.TrainingRun`): its events."""

    def __init__(self, session: TrainingSession):
        self.session = session
        self.elapsed = 0.0  # the steps' seconds of this session (TrainingProgress.elapsed_s)
        self._total_before: float | None = None  # the run's timings.total_s before this session

    def metrics(self, metrics: dict) -> None:
        """``timings.total_s`` as rigel-train keeps it, summed over the run's sessions: this session adds its loop
        and evaluation seconds (the time a window spends paused is not the run's)."""
        timings = metrics.setdefault("timings", {})
        if self._total_before is None:
            self._total_before = float(timings.get("total_s", 0.0))
        run = self.session.run
        timings["total_s"] = self._total_before + run.loop_s + run.eval_s

    def window(self, entry: dict, results: list) -> None:
        self.elapsed += sum(r.seconds for r in results)
        r = results[-1]
        self.session._emit(M.TrainingProgress(r.iteration, entry["loss"], entry["psnr"], r.num_gaussians,
                                              self.elapsed, entry["ms_per_iter"], r.view,
                                              any(w.skipped for w in results)))

    def densified(self, d) -> None:
        self.session._emit(M.Densified(d.iteration, d.n_clone, d.n_split, d.n_prune, d.n_after,
                                       getattr(d, "n_relocated", None), getattr(d, "n_added", 0),
                                       d.dead_share if getattr(d, "growth_held", False) else None))

    def evaluating(self, ev) -> None:
        self.session._flush_progress()   # the window before it first: the plot's points stay in order

    def evaluated(self, e) -> None:
        self.session._emit(M.EvalFinished(e.iteration, e.psnr, e.ssim, e.num_gaussians, e.n_views))

    def saved(self, paths: tuple, reason: str) -> None:
        self.session._emit(M.Saved(self.session.trainer.iteration, tuple(str(p.resolve()) for p in paths), reason))
