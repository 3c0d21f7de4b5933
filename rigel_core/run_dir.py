"""The run folder: the one home of its policy, shared by ``rigel-train``, ``rigel-render`` and ``rigel-viewer``.

A run folder (``--out`` of ``rigel-train``; the viewer's ``--data`` run) holds:

- :data:`CHECKPOINT_NAME` (``checkpoint.safetensors``) and :data:`PLY_NAME` (``model.ply``, INRIA layout: an
  MLP appearance baked into SH first, :meth:`rigel_core.train.Trainer.export_ply`), both written atomically;
- :data:`METRICS_NAME` (``metrics.json``: configuration, loss curve, evaluations, densification, timings; strict
  JSON, non-finite numbers as ``null``, written atomically by :func:`write_json_atomic`);
- :data:`LOG_NAME` (``log.txt``: one line per event, appended; :func:`open_run_log`);
- :data:`LOCK_NAME` (``.lock``: an ``fcntl.flock`` held by the one process using the folder, :class:`RunLock`;
  removed when that process ends, so a finished run holds none).

Rules (README "Runs are never lost"): a folder that holds a run (:func:`holds_run`) is refused without
``--resume`` (:class:`RunFolderTaken`), or, when the folder was not named by the user, a fresh one is picked
(:func:`fresh_run_dir`: ``runs/<name>-2``, ``-3``, …); two processes never share a run folder (:class:`RunLock`);
an ``--out`` that cannot be written is said in one line before any data loads (:func:`out_problem`); exports never
replace a file (:func:`unused_path`).
"""
from __future__ import annotations

import json
import logging
import math
import os
import warnings
from pathlib import Path

from .atomic import atomic_path
from .strict_json import finite_or_none  # noqa: F401  (re-exported: the run files' strict JSON)

__all__ = ["CHECKPOINT_NAME", "PLY_NAME", "METRICS_NAME", "LOG_NAME", "LOCK_NAME", "EXPOSURE_NAME", "POSES_NAME", "RUN_FILES",
           "ATOMIC_NAMES", "RunFolderTaken", "RunBusy", "RunLock", "out_problem", "holds_run", "fresh_run_dir",
           "choose_run_dir", "foreign_outputs", "CAPTURE_MARKERS", "unused_path", "finite_or_none", "write_json_atomic", "open_run_log", "new_metrics",
           "read_metrics", "train_entry", "RunRecord", "close_run_log"]

CHECKPOINT_NAME = "checkpoint.safetensors"
PLY_NAME = "model.ply"
METRICS_NAME = "metrics.json"
LOG_NAME = "log.txt"
LOCK_NAME = ".lock"
EXPOSURE_NAME = "exposure.json"
#: the refined training poses of a run with pose refinement (nerfstudio layout: train/pose.py transforms_json)
POSES_NAME = "transforms.json"
#: files whose presence means a folder holds a run (of rigel-train or of the viewer; viewer.log: older viewers)
RUN_FILES = (CHECKPOINT_NAME, PLY_NAME, METRICS_NAME, LOG_NAME, "viewer.log")
#: the files of a run written through rigel_core.atomic (their stale temporaries are removed at start)
ATOMIC_NAMES = (CHECKPOINT_NAME, PLY_NAME, METRICS_NAME, EXPOSURE_NAME, POSES_NAME)


class RunFolderTaken(ValueError):
    """The folder already holds a run and ``--resume`` was not given (or it is a file, not a folder)."""


class RunBusy(RuntimeError):
    """Another process holds the run folder's lock."""


def out_problem(path: Path, flag: str = "--out") -> str | None:
    """Why ``path`` cannot be used as an output folder (one line starting with ``flag``), or None: it (or, when it
    does not exist yet, its nearest existing ancestor) must be a directory this process may write into."""
    path = Path(path)
    if path.exists() or path.is_symlink():
        if not path.is_dir():
            return f"{flag} {path}: exists and is not a directory"
        if not os.access(path, os.W_OK | os.X_OK):
            return f"{flag} {path}: directory is not writable"
        return None
    parent = path.absolute().parent
    while not parent.exists():
        parent = parent.parent
    if not parent.is_dir():
        return f"{flag} {path}: cannot be created, {parent} is not a directory"
    if not os.access(parent, os.W_OK | os.X_OK):
        return f"{flag} {path}: cannot be created, {parent} is not writable"
    return None


class RunLock:
    """An exclusive ``fcntl.flock`` on ``RUN/.lock`` held until :meth:`release` (or process exit): two processes
    (``rigel-train``, ``rigel-viewer --data``) on one run folder never interleave.

    A process that claimed the folder (:meth:`acquire`, :meth:`claim`) removes the file when it releases it, so that
    a finished (or interrupted) run leaves no ``.lock`` behind; only while it still holds the lock, and only the file
    it locked. Removing it is safe because taking the lock checks, once the flock is held, that the path still names
    the file locked (same device and inode): a process that opened the file before its holder removed it, and got
    the flock after, finds the path gone (or another file) and takes the lock anew, instead of holding a removed
    file while a third process locks the new one. A ``.lock`` left by a killed process (kill -9) holds no flock: the
    next run takes it and removes it at its end."""

    def __init__(self, run_dir: Path):
        self.path = Path(run_dir) / LOCK_NAME
        self.fd = None
        self.claimed = False   # acquire() ran: this process writes the run, and removes the file on release

    def try_existing(self) -> bool:
        """Lock the lock file if it exists already (writes nothing); False when another process holds it."""
        if self.fd is not None or not self.path.is_file():
            return True
        try:
            fd = os.open(self.path, os.O_RDONLY)
        except OSError:
            return True  # vanished or unreadable: acquire() decides
        return self._lock(fd) is not False   # None (removed meanwhile by its holder): not busy

    def acquire(self) -> bool:
        """Create (if needed) and lock the file; False when another process holds it."""
        while self.fd is None:
            got = self._lock(os.open(self.path, os.O_RDONLY | os.O_CREAT, 0o644))
            if got is False:
                return False
            # None: the file was removed (its holder finished) between open and flock: open the new one
        self.claimed = True
        return True

    def _lock(self, fd) -> bool | None:
        """Take the flock of ``fd`` (closed otherwise): True when held on the file the path names, False when
        another process holds it, None when the path no longer names that file (its holder removed it)."""
        import fcntl

        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            return False
        if not self._names(fd):
            os.close(fd)
            return None
        self.fd = fd
        return True

    def _names(self, fd) -> bool:
        """The path still names the file open as ``fd`` (same device and inode)."""
        try:
            st, mine = os.stat(self.path), os.fstat(fd)
        except OSError:
            return False
        return (st.st_dev, st.st_ino) == (mine.st_dev, mine.st_ino)

    def release(self) -> None:
        """Give the lock up; a process that claimed the folder first removes the file (while it still holds it,
        and only when the path still names the file it locked)."""
        if self.fd is not None:
            if self.claimed and self._names(self.fd):
                try:
                    os.unlink(self.path)
                except OSError:
                    pass   # a folder made read-only meanwhile: the file stays, its flock goes below
            os.close(self.fd)  # closing the descriptor releases the flock
            self.fd = None
        self.claimed = False

    def claim(self, *, resume: bool) -> list | None:
        """Start writing the run: create the folder, take the lock, check the folder again under it (another
        process may have finished a run there while this one loaded its data: :func:`choose_run_dir` raises
        :class:`RunFolderTaken`), then remove the temporaries of killed atomic writes. Returns the paths removed,
        or None when another process holds the lock. OSError when the folder cannot be made."""
        from .atomic import remove_stale_temp_files

        run = self.path.parent
        run.mkdir(parents=True, exist_ok=True)
        if not self.acquire():
            return None
        choose_run_dir(run, run, resume=resume)
        return remove_stale_temp_files(run, ATOMIC_NAMES)

    def busy_message(self, prog: str) -> str:
        return f"--out {self.path.parent}: another {prog} is using this run directory ({LOCK_NAME} is locked)"


def holds_run(d: Path) -> bool:
    """``d`` is a folder holding any of :data:`RUN_FILES`."""
    d = Path(d)
    return d.is_dir() and any((d / f).exists() for f in RUN_FILES)


#: what a capture's folder holds and a run folder never does (Blender's split files, a COLMAP model)
CAPTURE_MARKERS = ("transforms_train.json", "sparse")


def _a_runs_file(path: Path) -> bool:
    """Whether ``path`` (:data:`POSES_NAME` or :data:`EXPOSURE_NAME`) reads as a run wrote it — refined poses with
    each frame's ``original_transform_matrix`` (:func:`rigel_core.train.pose.transforms_json`), exposures as
    ``{"model", "images"}`` (``Exposure.to_dict``) — or cannot be read at all (a damaged copy of a run's own)."""
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError, UnicodeDecodeError):
        return True
    if not isinstance(doc, dict):
        return False
    if path.name == POSES_NAME:
        frames = doc.get("frames")
        return isinstance(frames, list) and all(isinstance(f, dict) and "original_transform_matrix" in f
                                                for f in frames)
    return set(doc) == {"model", "images"}


def foreign_outputs(d: Path) -> list[str]:
    """What in ``d`` a run there would write over or beside that is not a run's: a ``transforms.json`` or
    ``exposure.json`` without a run's checkpoint, or with one but not in a run's format (a capture's own
    ``transforms.json``, trained into before this rule); a capture's markers (:data:`CAPTURE_MARKERS`: a refined
    ``transforms.json`` beside a COLMAP model would make the folder read as another capture)."""
    d = Path(d)
    if not d.is_dir():
        return []
    run = (d / CHECKPOINT_NAME).exists()
    found = [n for n in (POSES_NAME, EXPOSURE_NAME) if (d / n).is_file() and not (run and _a_runs_file(d / n))]
    return found + [n for n in CAPTURE_MARKERS if (d / n).exists()]


def fresh_run_dir(base: Path) -> Path:
    """``base``, or ``base-2``, ``base-3``, … : the first that neither holds a run (nor a file a run writes:
    :func:`foreign_outputs`) nor is a file."""
    base = Path(base)
    out, k = base, 2
    while holds_run(out) or foreign_outputs(out) or (out.exists() and not out.is_dir()):
        out = base.with_name(f"{base.name}-{k}")
        k += 1
    return out


def _resume_refused(run: Path) -> list[str]:
    """The files that make ``--resume`` refuse ``run``: its ``model.ply`` and/or ``metrics.json`` when it holds no
    checkpoint (a run stopped before its first checkpoint, or whose checkpoint was deleted); [] otherwise."""
    if (run / CHECKPOINT_NAME).exists():
        return []
    return [f for f in (PLY_NAME, METRICS_NAME) if (run / f).exists()]


def choose_run_dir(out: Path | None, default: Path, *, resume: bool, data: Path | None = None) -> Path:
    """The run folder to train into; never one that holds another run.

    ``resume``: ``out`` (or ``default``) as it is, unless it holds ``model.ply`` or ``metrics.json`` but no
    checkpoint (a finished run whose checkpoint was deleted: nothing to continue, and the new run would replace its
    model or its record), which raises :class:`RunFolderTaken`. (A ``log.txt`` alone — a run killed before its
    first save — is appended to.) An explicit ``out`` that holds a run without ``resume`` raises
    :class:`RunFolderTaken` naming its run files (or that it is a file). A capture's folder (:func:`foreign_outputs`:
    a ``transforms.json`` or ``exposure.json`` that is not a run's, which its refined poses or exposures would
    replace, or a capture's markers) raises :class:`RunFolderTaken`, resumed or not, and so does the dataset's folder
    itself (``data``: the ``--data`` folder, or the folder of a ``--data`` file). Without ``out``,
    ``default`` becomes ``default-2``, ``-3``, … when it holds a run (:func:`fresh_run_dir`)."""
    run = Path(out) if out is not None else Path(default)
    if data is not None:
        d = Path(data) if Path(data).is_dir() else Path(data).parent
        if run.exists() and d.exists() and os.path.samefile(run, d):
            raise RunFolderTaken(f"--out {run} is the dataset's folder (--data {data}): a run writes its model, "
                                 "checkpoint and poses there; choose another --out")
    if resume:
        kept = _resume_refused(run)
        if kept:
            names = " and ".join(kept)
            raise RunFolderTaken(f"{run} holds {names} but no {CHECKPOINT_NAME}: --resume has nothing to "
                                 f"continue, and a new run would replace {names}; choose another --out")
    elif out is not None:
        if run.exists() and not run.is_dir():
            raise RunFolderTaken(f"--out {run} is a file, not a folder")
        if holds_run(run):
            names = ", ".join(f for f in RUN_FILES if (run / f).exists())
            if _resume_refused(run):
                raise RunFolderTaken(f"{run} already holds a run ({names}) with no {CHECKPOINT_NAME} to continue "
                                     "(stopped before its first, or deleted): choose another --out")
            raise RunFolderTaken(f"{run} already holds a run ({names}); pass --resume to continue it, or choose "
                                 "another --out")
    else:
        return fresh_run_dir(default)
    foreign = foreign_outputs(run)
    if foreign:
        raise RunFolderTaken(f"--out {run} holds {' and '.join(foreign)}, not a run's (a capture's own?): a run there "
                             "would write its files over or beside them; choose another --out")
    return run


def unused_path(path: Path, *, reserve: bool = False) -> Path:
    """``path``, or ``stem_2.ext``, ``stem_3.ext``, … when it exists (the whole suffix kept for ``.compressed.ply``).
    With ``reserve`` the name is taken at once (an empty file created exclusively, ``O_EXCL``), so that a second
    writer racing for it picks the next one; the caller then replaces it (atomically) or removes it."""
    path = Path(path)
    name = path.name
    cut = name.find(".", 1)
    stem, suffix = (name[:cut], name[cut:]) if cut > 0 else (name, "")
    k, out = 2, path
    while True:
        if not out.exists() and not out.is_symlink():
            if not reserve:
                return out
            try:
                os.close(os.open(out, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644))
                return out
            except FileExistsError:
                pass
        out = path.with_name(f"{stem}_{k}{suffix}")
        k += 1


def write_json_atomic(path: Path, obj, *, indent: int = 1) -> None:
    """Strict JSON (:func:`finite_or_none`) written through :func:`rigel_core.atomic.atomic_path`."""
    with atomic_path(path) as tmp:
        with open(tmp, "w") as f:
            json.dump(finite_or_none(obj), f, indent=indent, allow_nan=False)


def open_run_log(run_dir: Path, name: str, console=None) -> logging.Logger:
    """The logger ``name`` writing ``RUN/log.txt`` (appended; ``time message`` lines) and, when given, calling
    ``console(line)`` for each message. Its handlers are replaced on every call (a later run in one process)."""
    log = logging.getLogger(name)
    for h in list(log.handlers):
        log.removeHandler(h)
        h.close()
    log.setLevel(logging.INFO)
    log.propagate = False
    fh = logging.FileHandler(Path(run_dir) / LOG_NAME)
    fh.setFormatter(logging.Formatter("%(asctime)s %(message)s", "%Y-%m-%d %H:%M:%S"))
    log.addHandler(fh)
    if console is not None:
        class _Console(logging.Handler):
            def emit(self, record):
                console(self.format(record))

        log.addHandler(_Console())
    return log


def log_to_file(log: logging.Logger, lines) -> None:
    """Write each of ``lines`` to ``log``'s ``log.txt`` only, not to its console handler: what the console has
    shown already (the dataset's warnings, printed before the run folder existed)."""
    for line in lines:
        record = log.makeRecord(log.name, logging.WARNING, "", 0, line, None, None)
        for h in log.handlers:
            if isinstance(h, logging.FileHandler):
                h.handle(record)


def close_run_log(log: logging.Logger) -> None:
    for h in list(log.handlers):
        log.removeHandler(h)
        h.close()


def _mask_counts(frames, trainer) -> tuple[int, int]:
    """(views with a mask, pixels that do not count: ``Frame.mask`` False, a float mask's <= 0.5) of ``frames``,
    from ``trainer.view_mask_facts`` (what its start read of each view's mask found)."""
    facts = trainer.view_mask_facts(list(frames))
    return sum(m.shape is not None for m in facts), sum(m.ignored for m in facts)


def read_metrics(path: Path) -> dict | None:
    """A resumed run's ``metrics.json`` when it is whole (None when missing or damaged: the checkpoint holds the
    training state, so the curve starts afresh)."""
    try:
        metrics = json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None
    ok = (isinstance(metrics, dict) and isinstance(metrics.get("timings"), dict)
          and all(isinstance(metrics.get(k), list) for k in ("train", "eval", "densify"))
          and isinstance(metrics.get("resumed_at", []), list))
    return metrics if ok else None


def new_metrics(metrics: dict | None, *, data, device: str, trainer, resumed: bool) -> dict:
    """``metrics.json``'s content at the start of a session: ``metrics`` (a resumed run's, :func:`read_metrics`)
    or a fresh one, with the data, device, configuration and the facts of the trainer's views (among them
    ``downscale``, the factor its dataset was loaded at, which ``--resume`` reads again)."""
    if metrics is None:
        metrics = {"train": [], "eval": [], "densify": [], "timings": {}, "resumed_at": []}
    if resumed:
        metrics.setdefault("resumed_at", []).append(trainer.iteration)
        # points past the checkpoint came from a session that ended without saving (a second Ctrl-C, kill -9): its
        # steps are redone now, so their old points go (the curve stays monotonic, each iteration once)
        for key in ("train", "eval", "densify"):
            metrics[key] = [e for e in metrics.get(key, [])
                            if not (isinstance(e, dict) and isinstance(e.get("iteration"), (int, float))
                                    and e["iteration"] > trainer.iteration)]
    # the views as loaded (the trainer may pad some to a common size, with masked margins that are not data)
    train, test = list(getattr(trainer.dataset, "train", trainer.train_frames)), trainer.test_frames
    (train_views, train_pixels), (test_views, test_pixels) = (_mask_counts(x, trainer) for x in (train, test))
    metrics.update({"data": str(data), "device": device, "config": trainer.config.to_dict(),
                    "dataset": {"train_views": len(train), "test_views": len(test),
                                "scene_extent": trainer.extent, "white_bg": trainer.white_bg,
                                "resolution": [train[0].camera.width, train[0].camera.height],
                                "masked_pixels": {"train": train_pixels, "test": test_pixels},
                                "masked_views": {"train": train_views, "test": test_views},
                                "downscale": float(getattr(getattr(trainer, "dataset", None), "downscale", 1.0))}})
    return metrics


def train_entry(window: list) -> dict:
    """One point of the loss curve from a window of :class:`~rigel_core.train.StepResult` (reading their values:
    one device→host copy each, so call it once per window, not per step): mean loss and PSNR over the steps not
    skipped, the last step's Gaussian count, the mean ms per iteration without evaluation."""
    fin = [w for w in window if not w.skipped]

    def mean(xs):
        return float(sum(xs) / len(xs)) if xs else math.nan

    last = window[-1]
    return {"iteration": last.iteration, "loss": mean([w.loss for w in fin]), "psnr": mean([w.psnr for w in fin]),
            "num_gaussians": last.num_gaussians,
            "ms_per_iter": 1e3 * mean([w.seconds - (w.eval.seconds if w.eval else 0) for w in window])}


class RunRecord:
    """``log.txt`` and ``metrics.json`` of one training session in a run folder (``rigel-train`` and
    ``rigel-viewer --data`` write the same files, the same lines and the same fields).

    Args:
        run_dir: the run folder (exists, locked by the caller).
        log: the logger writing ``log.txt`` (:func:`open_run_log`).
        metrics: the metrics dict (:func:`new_metrics`).
    """

    def __init__(self, run_dir: Path, log: logging.Logger, metrics: dict):
        self.run_dir = Path(run_dir)
        self.log = log
        self.metrics = metrics
        self._warning_hook = None  # (installed hook, the one it replaced) while :meth:`log_warnings` is on
        self._nan_skips: int | None = None  # the NaN guard's count at the last step logged (None: none yet)

    def log_warnings(self, *, echo: bool) -> None:
        """From now until :meth:`close`: every Python warning (coarse-to-fine's smaller factor, a failed CUDA-graph
        capture, …) is also a ``warning: …`` line of ``log.txt``; ``echo``: also shown as before (for a log with
        no console handler of its own, as the viewer's)."""
        shown = warnings.showwarning

        def hook(message, category, filename, lineno, file=None, line=None):
            self.log.warning(f"warning: {message}")
            if echo:
                shown(message, category, filename, lineno, file, line)

        self._warning_hook = (hook, shown)
        warnings.showwarning = hook

    def log_data(self, trainer) -> None:
        """A session's first lines of ``log.txt`` (``rigel-train`` and ``rigel-viewer --data`` alike): the data —
        views, their size, the scene's extent, the background, the pixels masks leave out — and how the frames are
        held (streamed: the host cache)."""
        from .data.frames import view_sizes
        from .data.stream import cache_note

        facts = self.metrics["dataset"]
        ds = trainer.dataset   # the views as loaded (the trainer may leave some out: rigel_core.train.trainer)
        train, test = list(getattr(ds, "train", trainer.train_frames)), list(getattr(ds, "test", trainer.test_frames))
        masked = facts["masked_views"]["train"]
        self.log.info(f"data {self.metrics['data']}: {len(train)} train / {len(test)} test views, "
                      f"{view_sizes(train)}, extent {trainer.extent:.3f}, "
                      f"{'white' if trainer.white_bg else 'black'} background"
                      + (f", {masked} train views with masked pixels ({facts['masked_pixels']['train']} pixels "
                         "ignored)" if masked else ""))
        if (note := cache_note(train + test)) is not None:
            self.log.info(note)

    def log_final(self, trainer, final, train_s: float) -> None:
        """The line a finished session ends ``log.txt`` with: iterations, Gaussians, the last held-out evaluation
        ``final`` (None: no held-out views), the run's seconds of training (all its sessions), skipped steps, and
        how many MCMC relocation steps held growth (``mcmc_growth_max_dead``; why N may end under the budget)."""
        held = sum(1 for d in self.metrics.get("densify", []) if d.get("growth_held"))
        self.log.info(f"final: {trainer.iteration} iterations, {trainer.model.num_gaussians} Gaussians"
                      + (f", test psnr {final.psnr:.2f} ssim {final.ssim:.4f}" if final else "")
                      + f", {train_s:.1f} s training, {trainer.nan_skips} skipped steps"
                      + (f"; MCMC growth held at {held} relocation step{'s' if held != 1 else ''} where more than "
                         f"mcmc_growth_max_dead of the Gaussians were dead" if held else ""))

    @classmethod
    def open(cls, run_dir: Path, trainer, *, data="", device: str | None = None, name: str | None = None,
             console=None) -> "RunRecord":
        """Create the run folder if needed and start a session's record there: a resumed run (trainer at an
        iteration > 0) continues its whole ``metrics.json``, a new one starts afresh."""
        run_dir = Path(run_dir)
        run_dir.mkdir(parents=True, exist_ok=True)
        resumed = trainer.iteration > 0
        metrics = read_metrics(run_dir / METRICS_NAME) if resumed else None
        metrics = new_metrics(metrics, data=data, device=device or str(trainer.device), trainer=trainer,
                              resumed=resumed)
        return cls(run_dir, open_run_log(run_dir, name or f"rigel.run.{id(metrics)}", console), metrics)

    def steps(self, window: list) -> dict:
        """Log the skipped steps of ``window`` and append its loss-curve point (:func:`train_entry`)."""
        if window and self._nan_skips is None:  # the first window (a resumed run's count starts above 0)
            self._nan_skips = window[0].nan_skips - int(window[0].skipped)
        for w in window:
            if w.skipped and w.nan_skips > self._nan_skips:
                self.log.info(f"[{w.iteration}] non-finite loss or gradient: update skipped ({w.nan_skips} so far)")
            elif w.skipped:  # finite, but the view's tile entries outgrew the captured graph's binning capacity
                self.log.info(f"[{w.iteration}] the view outgrew the CUDA graph's tile capacity: its update was "
                              "skipped and it is trained again with a larger one")
            self._nan_skips = max(self._nan_skips, w.nan_skips)
        entry = train_entry(window)
        self.metrics["train"].append(entry)
        return entry

    def densified(self, d) -> None:
        self.metrics["densify"].append(d.to_dict())
        if hasattr(d, "n_relocated"):  # the MCMC budget (train/mcmc.py)
            self.log.info(f"[{d.iteration}] mcmc relocate {d.n_relocated} add {d.n_added}"
                          + (f" trim {d.n_prune}" if d.n_prune else "") + f" -> {d.n_after}"
                          + (" (at the budget)" if d.capped else "")
                          + (f" (growth held: {d.dead_share:.0%} of the Gaussians dead, over mcmc_growth_max_dead)"
                             if getattr(d, "growth_held", False) else ""))
        else:
            self.log.info(f"[{d.iteration}] densify clone {d.n_clone} split {d.n_split} prune {d.n_prune} "
                          f"-> {d.n_after}{' (capped)' if d.capped else ''}")

    def evaluated(self, ev) -> None:
        self.metrics["eval"].append(dict(ev.to_dict()))
        self.log.info(f"[{ev.iteration}] test psnr {ev.psnr:.2f}  ssim {ev.ssim:.4f}  gaussians {ev.num_gaussians}  "
                      f"({ev.n_views} views, {ev.seconds:.1f} s)"
                      + (f"; exposure protocol (right halves) psnr {ev.psnr_exposure:.2f} ssim "
                         f"{ev.ssim_exposure:.4f}" if getattr(ev, "psnr_exposure", None) is not None else "")
                      + (f"; fitted poses psnr {ev.psnr_pose:.2f} ssim {ev.ssim_pose:.4f}"
                         if getattr(ev, "psnr_pose", None) is not None else ""))

    def save(self, trainer, reason: str, what: str = "both") -> tuple:
        """Write :data:`CHECKPOINT_NAME` and/or :data:`PLY_NAME` (``what``: "both", "checkpoint", "ply"; an MLP
        appearance baked into SH of ``config.sh_degree``, its RMSE logged and kept as ``ply_bake_rmse``) and,
        with a learnt exposure, :data:`EXPOSURE_NAME`, with learnt poses, :data:`POSES_NAME` (either removed when its
        correction has been turned off since it was written); one log line. Returns the paths written."""
        import time

        t0 = time.perf_counter()
        paths = []
        if what in ("both", "checkpoint"):
            trainer.save_checkpoint(self.run_dir / CHECKPOINT_NAME)
            paths.append(self.run_dir / CHECKPOINT_NAME)
        if what in ("both", "ply"):
            try:
                rmse = trainer.export_ply(self.run_dir / PLY_NAME)
                paths.append(self.run_dir / PLY_NAME)
                if trainer.model.appearance is not None:   # other tools cannot run the MLP: the PLY holds SH
                    self.metrics["ply_bake_rmse"] = rmse
                    self.log.info(f"[{trainer.iteration}] {PLY_NAME}: the MLP appearance baked into SH degree "
                                  f"{trainer.config.sh_degree}, RMSE {rmse:.4f} (colour units, 128 view directions)")
            except ImportError as e:  # rigel_core.io missing: keep the checkpoint
                self.log.info(f"{PLY_NAME} not written ({e})")
        removed = []
        if what == "both":
            learnt = {EXPOSURE_NAME: (trainer.exposure,
                                      lambda: trainer.exposure.to_dict([f.name for f in trainer.train_frames])),
                      POSES_NAME: (getattr(trainer, "pose", None), trainer.refined_poses_json)}
            for name, (correction, doc) in learnt.items():
                path = self.run_dir / name
                if correction is None:   # never learnt by this run: its files, if any, are not the run's
                    continue
                if getattr(trainer.config, correction.config_field):
                    write_json_atomic(path, doc())
                    paths.append(path)
                elif path.exists():  # written while the correction was on (turned off since, on a resume or in the
                    path.unlink()    # viewer): the model is trained without it now
                    removed.append(f"; {name} removed ({correction.title} is off: it no longer matches the model)")
        self.log.info(f"[{trainer.iteration}] {reason}: {', '.join(p.name for p in paths)} written "
                      f"({trainer.model.num_gaussians} Gaussians, {time.perf_counter() - t0:.1f} s)" + "".join(removed))
        return tuple(paths)

    def write(self, trainer, **fields) -> None:
        """``metrics.json`` now, with the trainer's iteration, Gaussian count, skipped steps, configuration (the
        viewer changes densification fields live), this session's CUDA-graph statistics (``graph_step``:
        :meth:`~rigel_core.train.graph_step.GraphStep.stats`, null when every step was eager), this session's count
        of Gaussians made transparent for a view over the binning's entry limit (``retired_wide``:
        ``Trainer._retire_widest``) and ``fields``."""
        gs = getattr(trainer, "graph_step", None)
        self.metrics.update(iterations_done=trainer.iteration, num_gaussians=trainer.model.num_gaussians,
                            nan_skips=trainer.nan_skips, config=trainer.config.to_dict(),
                            graph_step=None if gs is None else gs.stats(),
                            retired_wide=trainer.retired_wide, **fields)
        write_json_atomic(self.run_dir / METRICS_NAME, self.metrics)

    def close(self) -> None:
        if self._warning_hook is not None and warnings.showwarning is self._warning_hook[0]:
            warnings.showwarning = self._warning_hook[1]
        self._warning_hook = None
        close_run_log(self.log)
