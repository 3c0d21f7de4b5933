"""The training run loop's body, shared by ``rigel-train`` (:mod:`rigel_core.cli.train`) and the viewer's training
thread (:mod:`viewer.training`): one session of a :class:`~rigel_core.train.Trainer` training in a run folder.

:class:`TrainingRun` steps the trainer and does, after each step, what both front ends do: the loss-curve window
(the step values read from the device once per window, :meth:`~rigel_core.run_dir.RunRecord.steps`), the log lines
of densifications and opacity resets, the evaluations (recorded, ``metrics.json`` written), periodic checkpoints,
the timings, and at the end the final evaluation and save — or, after an interrupt or a failure, the save of a
consistent state. What differs between the front ends (a progress bar and PNG renders; the viewer's events and
snapshots) comes in through :class:`RunHooks`; when to step, pause or stop (signals, the viewer's commands) stays
with the caller.

Counts: :attr:`TrainingRun.steps` is this session's iterations, ``trainer.iteration`` the run's (a resumed run
started at :attr:`TrainingRun.start_iteration`): ``steps == trainer.iteration - start_iteration`` at every moment,
whatever stopped the session.

Timings (``metrics.json`` ``timings``, summed over the run's sessions): ``train_s`` the steps' own seconds,
evaluations excluded; ``loop_s`` the wall-clock seconds of the loop while it steps (from the end of a step to the
end of the next, evaluations and saves excluded; a pause, :meth:`TrainingRun.pause`, stops it); ``eval_s`` the
evaluations' seconds; ``ms_per_iter`` ``train_s`` per iteration of the run.
"""
from __future__ import annotations

import time
import warnings

__all__ = ["TrainingRun", "RunHooks", "run_finished"]


def run_finished(trainer) -> bool:
    """Whether a (resumed) ``trainer`` has nothing left to do: all its iterations done and, with held-out views, the
    last one evaluated (a run stopped during its last step was saved before its final evaluation: that one still
    runs). ``rigel-train --resume`` and ``rigel-viewer --data … --resume`` then write nothing."""
    it = trainer.iteration
    return it >= trainer.config.iterations and (
        not trainer.test_frames or bool(trainer.eval_history and trainer.eval_history[-1].iteration == it))


class RunHooks:
    """What a front end adds to :class:`TrainingRun`'s bookkeeping (every method optional: the base does nothing)."""

    def window(self, entry: dict, results: list) -> None:
        """A loss-curve window was read: ``entry`` (:func:`rigel_core.run_dir.train_entry`) of ``results``."""

    def densified(self, report) -> None:
        """A step densified / relocated (``report``: a DensifyReport; already logged and recorded)."""

    def evaluating(self, ev) -> None:
        """An evaluation is about to be recorded (before its log line and ``metrics.json``)."""

    def evaluated(self, ev) -> None:
        """An evaluation was recorded and ``metrics.json`` written."""

    def saved(self, paths: tuple, reason: str) -> None:
        """Files were written (:meth:`TrainingRun.save`)."""

    def metrics(self, metrics: dict) -> None:
        """``metrics.json`` is about to be written: a last chance to add fields (e.g. ``timings.total_s``)."""


class TrainingRun:
    """One training session of ``trainer`` recorded by ``record`` (:class:`~rigel_core.run_dir.RunRecord`).

    Args:
        trainer: the Trainer (its ``config.iterations`` is the goal).
        record: the run folder's log and metrics; ``record.metrics["timings"]`` holds the earlier sessions' timings.
        window: steps per loss-curve point (and :meth:`RunHooks.window` call).
        checkpoint_every: write the checkpoint and the PLY every this many iterations (0: only at the end).
        hooks: a :class:`RunHooks`.
        comm: the process group of a data-parallel run (the statistics are synchronised before a save; only the
            main rank writes), or None.
    """

    def __init__(self, trainer, record, *, window: int = 10, checkpoint_every: int = 0, hooks: RunHooks | None = None,
                 comm=None):
        self.trainer = trainer
        self.record = record
        self.window_size = max(int(window), 1)
        self.checkpoint_every = int(checkpoint_every or 0)
        self.hooks = hooks if hooks is not None else RunHooks()
        self.comm = comm
        self.is_main = comm is None or comm.is_main
        self.timings = record.metrics.setdefault("timings", {})
        self._before = {k: float(self.timings.get(k, 0.0)) for k in ("train_s", "loop_s", "eval_s")}
        self.train_s = self.loop_s = self.eval_s = 0.0  # this session's
        self.start_iteration = trainer.iteration
        self.steps = 0  # iterations of this session
        self.dirty = False  # the model changed since the last save of both files
        self.results: list = []  # the current window's StepResults (values still on the device)
        self._mark = None  # the end of the previous step while stepping without a pause, else None

    # ---- stepping ---------------------------------------------------------------------------------------------
    def step(self):
        """One training iteration and its bookkeeping (module docstring); returns its StepResult."""
        tr, log = self.trainer, self.record.log
        t0 = time.perf_counter()
        start = self._mark if self._mark is not None else t0
        r = tr.step()
        self.steps += 1
        self.dirty = True
        eval_s = r.eval.seconds if r.eval else 0.0
        self.train_s += r.seconds - eval_s
        aside = eval_s
        self.results.append(r)
        if r.densify is not None:
            self.record.densified(r.densify)
            self.hooks.densified(r.densify)
        if r.opacity_reset:
            log.info(f"[{r.opacity_reset_iteration or r.iteration}] opacity reset")
        if len(self.results) >= self.window_size or tr.iteration == tr.config.iterations:
            self.flush()
        if r.eval is not None:
            aside += self.evaluated(r.eval)
        if self.checkpoint_every and tr.iteration % self.checkpoint_every == 0 and tr.iteration < tr.config.iterations:
            t_save = time.perf_counter()
            self.save("periodic")
            aside += time.perf_counter() - t_save
        end = time.perf_counter()
        self.loop_s += end - start - aside
        self._mark = end
        return r

    def pause(self) -> None:
        """The loop stops stepping for a while: the loop time stops until the next step."""
        self._mark = None

    def flush(self) -> dict | None:
        """Read the window's step values (one device read for the window) into a loss-curve point; returns it (None
        for an empty window)."""
        if not self.results:
            return None
        results, self.results = self.results, []
        entry = self.record.steps(results)
        self.hooks.window(entry, results)
        return entry

    def evaluated(self, ev) -> float:
        """Record the evaluation ``ev`` (log line, ``metrics.json``); returns the seconds that took."""
        t0 = time.perf_counter()
        self.hooks.evaluating(ev)
        self.eval_s += ev.seconds
        self.record.evaluated(ev)
        self.write_metrics()
        self.hooks.evaluated(ev)
        return time.perf_counter() - t0

    # ---- the end ----------------------------------------------------------------------------------------------
    def finish(self, reason: str = "done"):
        """The run reached its goal: the last window read, the held-out views evaluated at the last iteration
        unless already, the checkpoint and PLY written, the ``final:`` line logged. Returns the last evaluation (None without held-out views)."""
        tr = self.trainer
        self.flush()
        last = tr.eval_history[-1] if tr.eval_history else None
        if self.is_main and (last is None or last.iteration != tr.iteration):
            ev = tr.evaluate()
            if ev is not None:
                self.evaluated(ev)
                last = ev
        self.save(reason)
        if self.is_main:   # log.txt's last line (rigel-train and rigel-viewer alike)
            self.record.log_final(tr, last, self.total_train_s)
        return last

    def save(self, reason: str, what: str = "both", *, collective: bool = True) -> tuple:
        """Write the checkpoint and/or the PLY (``what``: "both", "checkpoint", "ply"), then ``metrics.json``;
        returns the paths written (none on a rank other than the main one). ``collective``: in a data-parallel run,
        synchronise the statistics over the ranks first (every rank must call it then)."""
        if self.comm is not None and collective:  # every rank: the global running maximum of the screen radii
            self.comm.sync_stats(self.trainer.stats)
        if not self.is_main:
            return ()
        paths = tuple(self.record.save(self.trainer, reason, what))
        self.write_metrics()
        if what == "both":
            self.dirty = False
        self.hooks.saved(paths, reason)
        return paths

    def save_if_consistent(self, reason: str, *, collective: bool = True) -> bool:
        """After an interrupt or a failure: drop the gradients and save when the state is consistent
        (``Trainer.is_consistent``), with the loss-curve window of the steps since the last point read first (a run
        stopped at iteration 17 of a 10-step log keeps its point at 17). Returns whether it was saved."""
        tr = self.trainer
        tr.optimizer.zero_grad(set_to_none=True)
        if not tr.is_consistent():
            return False
        try:
            self.flush()
        except RuntimeError as e:  # a failed device (the run's failure itself) cannot give its last values back
            self.results = []
            warnings.warn(f"the loss values since the last loss-curve point could not be read ({e}); the run is "
                          "saved without them", RuntimeWarning, stacklevel=2)
        self.save(reason, collective=collective)
        return True

    @property
    def total_train_s(self) -> float:
        """``train_s`` of the run: its earlier sessions' and this one's."""
        return self._before["train_s"] + self.train_s

    def write_metrics(self) -> None:
        """``metrics.json`` now, with the timings summed over the run's sessions (main rank only)."""
        if not self.is_main:
            return
        train_s = self.total_train_s
        self.timings.update(train_s=train_s, loop_s=self._before["loop_s"] + self.loop_s,
                            eval_s=self._before["eval_s"] + self.eval_s,
                            ms_per_iter=1e3 * train_s / max(1, self.trainer.iteration))
        self.hooks.metrics(self.record.metrics)
        self.record.write(self.trainer)
