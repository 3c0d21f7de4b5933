"""``rigel-viewer``: look at a Gaussian scene or watch one train, in a window or offscreen.

    rigel-viewer [SCENE] [--cameras DATASET [--view N]] [--offscreen --frames N --out DIR] [--size 1280x720]
                 [--mode image|alpha|overdraw|side-by-side|depth] [--device auto|cpu|cuda] [--render-scale S]
                 [--up +z] [--white-bg] [--no-vsync] [--debug]
    rigel-viewer --data DIR [--appearance sh|mlp] [--iters N] [--white-bg] [--downscale F] [--max-gaussians N]
                 [--eval-every N] [--device …] [--out RUN] [--paused] [--resume] [--offscreen --frames N --fps F]
                 [--refresh-hz HZ]

SCENE is any file ``rigel_core.io.load_scene`` reads (INRIA PLY of any SH degree, compressed PLY, SPZ, rigel
checkpoint); without it the bundled default scene. ``--data`` trains on a dataset
(``rigel_core.data.load_dataset``) in a background thread while the window shows the live model; the run folder
(``--out``, default ``runs/<dataset name>``, or ``runs/<dataset name>-2``, ``-3``, … when that one holds a run)
receives what ``rigel-train`` writes (``log.txt``, ``metrics.json``, ``checkpoint.safetensors`` and ``model.ply``,
:mod:`rigel_core.run_dir`): the model when the training finishes, when the window is closed, on Ctrl-C or SIGTERM and after a
failure of the training thread. No run is ever replaced: an ``--out`` that holds one is refused without
``--resume`` (the default folder moves on to ``-2``, ``-3``, … and says so), a run folder another process uses
(its ``.lock``) is refused, an ``--out`` that cannot be written is said in one line before any data loads;
saved scenes, screenshots and videos go to the run folder (or ``--out``) and take a new name when theirs
exists. The training flags are ``rigel-train``'s (:func:`rigel_core.cli.common.add_training_args`).

``--cameras DATASET`` draws a dataset's training cameras as frustums in the view of a SCENE (click one to snap to
it; a file of cameras alone, such as a ``--pose-opt`` run's ``RUN/transforms.json``, gives all its cameras, as
``rigel-render --cameras`` reads them, and no error map), and, when SCENE lies in the run folder of a ``--pose-opt``
run (its ``transforms.json``), each camera's refined pose beside its given one (Studio → View → "refined poses"; a
live ``--data … --pose-opt`` run shows its own); ``--view N`` opens at training view N of ``--cameras`` (or of
``--data``) — its pose and intrinsics, numbered from 1 as the Camera section shows them ("train view N/M") — rather
than at the framing of the whole capture, where a forward-facing capture is a speck; an N beyond the views is
refused (one line, status 2) before anything opens or is written; with ``--offscreen`` the first frame is that view.
Progressive rendering, opening files (drop / File → open) and editing live in the Studio window
(:mod:`viewer.studio`).

``--offscreen`` needs no display: it writes ``frame_XXXX.png`` (with the panels), ``image.png`` /
``alpha.png`` / ``overdraw.png`` and ``summary.json`` into ``--out`` (see :mod:`viewer.offscreen`); an ``--out``
that holds any file of those names (``viewer.offscreen.OUTPUT_PATTERNS``) is refused (one line, status 2), so that
a folder describes one run and no file is replaced; ``--data … --resume`` into a run folder numbers its frames
after the earlier session's and replaces ``summary.json`` and the last views. With ``--data``
the training starts with the offscreen frame loop (``--paused`` does not apply), which presents at most ``--fps``
frames per second (default 30; ``summary.json`` gives the rate achieved, ``fps``).
While a training runs and the camera is still, the live model is re-rendered and the panels rebuilt at most
``--refresh-hz`` times a second (default 10; the Training window's "view refresh" slider); the frames in between
repeat the last frame, or hold it — nothing submitted — when it is already the picture shown (:mod:`viewer.app`), so
that the frame loop leaves the Python interpreter and the GPU to the trainer (``summary.json``: ``fps`` presents
per second, ``loop_fps`` frames per second, held ones included).
``--path FILE`` opens a camera path in the Camera path section; with ``--offscreen`` it writes the path's frames
instead, ``path_XXXX.png`` (see :mod:`viewer.panels.camera_path`).
Exit status: 0 on success, 1 when something failed, 2 for an input rigel cannot use (a bad scene, dataset or
``--cameras`` file, a flag value it refuses such as ``--fps 0``: one line naming it, as ``rigel-train``) or when
Vulkan or a display is unavailable (the message says what to install), 130 after Ctrl-C, 143 after SIGTERM (the
training was saved).
"""
from __future__ import annotations

import argparse
import logging
import math
import os
import signal
import sys
import time
from pathlib import Path

from rigel_core.cli.common import (Parser, add_threads_arg, add_training_args, limit_heap_retention, path_arg,
                                   set_threads, threads_problem)
from rigel_core.run_dir import LOG_NAME, out_problem

from .camera_control import UP_AXES
from .gpu.vk_context import VulkanUnavailable
from .model_slot import ModelSlot
from .panels.training import REFRESH_HZ_MAX
from .ui import MODE_LABELS, ViewSettings

__all__ = ["main", "build_parser", "parse_args", "config_dir", "EXIT_INTERRUPTED"]

EXIT_INTERRUPTED = 130
#: the largest --size side accepted before Vulkan is up (the device's ``maxImageDimension2D`` is checked after)
MAX_SIZE = 16384
#: the frame ring's slots (--slots)
MIN_SLOTS, MAX_SLOTS = 2, 16
#: --fps: presents per second of the offscreen training loop (below 1 a run of N frames would wait minutes a frame)
FPS_RANGE = (1.0, 1000.0)


def config_dir() -> Path:
    """Where the viewer keeps its settings (the ImGui window layout, ``imgui.ini``):
    ``$XDG_CONFIG_HOME/rigel`` (default ``~/.config/rigel``)."""
    base = os.environ.get("XDG_CONFIG_HOME") or os.path.join(os.path.expanduser("~"), ".config")
    return Path(base) / "rigel"


def _parse_size(s: str):
    try:
        w, h = (int(v) for v in s.lower().split("x"))
        if w <= 0 or h <= 0:
            raise ValueError
        return w, h
    except ValueError:
        raise argparse.ArgumentTypeError(f"--size must look like 1280x720, got {s!r}") from None


def build_parser() -> argparse.ArgumentParser:
    ap = Parser(prog="rigel-viewer", description="View or train a 3D Gaussian Splatting scene "
                                                                  "(Vulkan).")
    ap.add_argument("scene", nargs="?", help="scene file (.ply, compressed .ply, .spz, .splat, checkpoint); default: "
                                             "the bundled scene")
    ap.add_argument("--offscreen", action="store_true", help="no window: render frames to PNG files (needs --out)")
    ap.add_argument("--frames", type=int, default=None, help="offscreen: frames to write (default 8); windowed: "
                                                             "quit after this many")
    ap.add_argument("--out", type=path_arg, default=None, help="output folder (offscreen frames, screenshots, videos; "
                                                           "with --data the run folder)")
    ap.add_argument("--fps", type=float, default=30.0, help="offscreen training: present at most this many frames "
                                                            "per second (1 to 1000, default 30)")
    ap.add_argument("--refresh-hz", type=float, default=None,
                    help="while training with a still camera: re-render the live model and rebuild the panels at most "
                         "this often per second; the frames in between repeat the last frame (or hold it, submitting "
                         "nothing, when it is already shown), leaving the interpreter and the GPU to the trainer "
                         "(0 to 60, default 10; 0: every frame)")
    ap.add_argument("--path", type=Path, default=None, help="camera path .json to open in the Camera path section; "
                                                            "with --offscreen: write its frames")
    ap.add_argument("--size", type=_parse_size, default=(1280, 720),
                    help="window / image size, e.g. 1280x720 (at most 16384 a side and the Vulkan device's limit)")
    ap.add_argument("--mode", choices=[name for name, _ in MODE_LABELS], default="image",
                    help="initial render mode (depth: the expected depth through the overdraw colormap)")
    ap.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto",
                    help="render (and training) device")
    ap.add_argument("--render-scale", type=float, default=None,
                    help="frame size / window size (default 1 on CUDA, ~320x240 pixels on the CPU)")
    ap.add_argument("--up", choices=list(UP_AXES), default=None,
                    help="world up axis (default: -y for .spz and compressed PLY, +z for other scenes; with "
                         "--data guessed from the cameras)")
    ap.add_argument("--white-bg", action="store_true", help="white background (with --data: composite the "
                                                            "images' alpha onto white, as NeRF-synthetic)")
    ap.add_argument("--no-vsync", action="store_true", help="present without waiting for vertical sync")
    ap.add_argument("--no-panels", action="store_true", help="hide the ImGui panels")
    ap.add_argument("--slots", type=int, default=3, help="frame ring slots K (2 to 16)")
    ap.add_argument("--debug", action="store_true", help="Vulkan validation layer on")
    ap.add_argument("--cameras", type=Path, default=None,
                    help="dataset folder or transforms .json whose training cameras are drawn in the scene (click "
                         "one to snap to it; [ ] cycle); images downscaled by --downscale. A file of cameras "
                         "alone (a --pose-opt run's transforms.json) is read as rigel-render --cameras reads it")
    ap.add_argument("--view", type=int, default=None, metavar="N",
                    help="open at training view N of --cameras (or of --data): its exact pose and intrinsics; 1 to "
                         "the number of views, numbered as the Camera section shows them ('train view N/M')")
    add_threads_arg(ap)   # rigel-train's flag, with its bound
    t = ap.add_argument_group("live training (--data; the flags of rigel-train)")
    actions = add_training_args(t, data_required=False, skip=("--white-bg",))
    actions.append(t.add_argument("--paused", action="store_true", help="open with the training paused (press start)"))
    #: the argparse actions of the flags that act only on a training run (--data; --downscale also scales the images
    #: of --cameras): _flag_problem refuses one given without --data
    ap.training_actions = [a for a in actions if a.option_strings[0] not in ("--data", "--downscale")]
    return ap


def _setup_logging(run_dir: Path | None) -> logging.Logger:
    """The ``rigel.viewer`` logger: warnings as one ``rigel-viewer:`` line on stderr; with a run folder, everything
    (failures with their traceback) appended to its ``log.txt`` too."""
    log = logging.getLogger("rigel.viewer")
    log.setLevel(logging.INFO)
    log.propagate = False
    for h in list(log.handlers):
        log.removeHandler(h)
        h.close()
    console = logging.StreamHandler(sys.stderr)
    console.setFormatter(logging.Formatter("rigel-viewer: %(message)s"))
    console.setLevel(logging.WARNING)
    log.addHandler(console)
    if run_dir is not None:
        fh = logging.FileHandler(run_dir / LOG_NAME)
        # rigel-train's lines (rigel_core.run_dir.open_run_log): "time message", no level name
        fh.setFormatter(logging.Formatter("%(asctime)s %(message)s", "%Y-%m-%d %H:%M:%S"))
        log.addHandler(fh)
    return log


class _Refused(Exception):
    """An argument rigel-viewer cannot use: one line, exit status 2."""


def _camera_frames(cameras: Path, downscale: float):
    """``--cameras``: (frames, None) — a dataset's training frames, cameras and images (downscaled by
    ``downscale``; the error map compares against them) — or, for a file of cameras alone (a ``--pose-opt`` run's
    ``RUN/transforms.json``: no image beside it, :class:`rigel_core.io.errors.NoImageFiles`), (frames, file): all
    of its cameras, read and named as ``rigel-render --cameras`` reads them
    (:func:`rigel_core.cli.render.resolve_cameras`), each a ``Frame`` with ``image`` None (no error map). Raises
    DatasetError (one line naming the file) when neither can be read."""
    from rigel_core.cli.render import resolve_cameras
    from rigel_core.data import Frame, load_dataset
    from rigel_core.io.errors import NoImageFiles

    try:
        return list(load_dataset(cameras, downscale=downscale).train), None
    except NoImageFiles:
        cams, names, file = resolve_cameras(str(cameras), None, None)
        return [Frame(camera=c, image=None, alpha=None, name=n) for c, n in zip(cams, names)], Path(file)


def _refined_beside(scene, frames, shown: Path | None = None):
    """The refined poses (:func:`rigel_core.train.pose.read_refined_poses`: a Camera or None per frame) of the run
    whose folder holds ``scene`` — its ``transforms.json``, written by a ``--pose-opt`` run — for ``--cameras``'s
    ``frames``; None when there is no such file or it is ``shown``, the file ``--cameras`` read (its poses are the
    cameras drawn), and, with one line on stderr saying why, when it is not a pose-refining run's, names another
    dataset or none of these frames."""
    from rigel_core.run_dir import POSES_NAME
    from rigel_core.train.pose import read_refined_poses

    path = Path(scene).parent / POSES_NAME
    if not path.is_file() or (shown is not None and path.resolve() == shown.resolve()):
        return None
    try:
        refined = read_refined_poses(path, [f.camera for f in frames])
    except ValueError as e:
        print(f"rigel-viewer: {e}; the refined cameras are not drawn", file=sys.stderr)
        return None
    if not any(r is not None for r in refined):
        print(f"rigel-viewer: {path}: no frame of --cameras in it; the refined cameras are not drawn", file=sys.stderr)
        return None
    return refined


def _start_training(args, settings: ViewSettings, locks: list):
    """The run folder (:func:`rigel_core.run_dir.choose_run_dir`; locked), the trainer and its session for
    ``--data``. Everything about the run folder is checked before the dataset loads. Returns
    (run_dir, session, frames, device)."""
    from rigel_core.checkpoint import CheckpointError
    from rigel_core.cli.common import build_trainer, changed_settings_line, config_overrides, kept_settings, \
        load_training_data, memory_problem_of, new_config, new_run_problem, no_checkpoint_line, preload_problem, \
        remembered_warnings, resolve_downscale, resume_config, resumed_data_problem
    from rigel_core.run_dir import CHECKPOINT_NAME, RunFolderTaken, RunLock, choose_run_dir, holds_run, \
        log_to_file, out_problem
    from rigel_core.train.run import run_finished

    from .app import _pick_render_device
    from .camera_control import up_from_cameras
    from .training import TrainingSession

    default = Path("runs") / Path(args.data).resolve().name
    try:
        run_dir = choose_run_dir(args.out, default, resume=args.resume, data=args.data)
    except RunFolderTaken as e:
        raise _Refused(str(e)) from None
    if args.out is None and run_dir != default:
        print(f"rigel-viewer: {default} holds a run; training into {run_dir}", file=sys.stderr)
    if args.offscreen and not (args.resume and holds_run(run_dir)):
        from .offscreen import earlier_output   # an earlier offscreen run's files: refused as without --data

        problem = earlier_output(run_dir)
        if problem:
            raise _Refused(problem)
    problem = out_problem(run_dir)
    if problem:
        raise _Refused(problem)
    lock = RunLock(run_dir)
    locks.append(lock)                  # released by the caller, whatever happens
    if not lock.try_existing():
        raise _Refused(RunLock(run_dir).busy_message("rigel process"))
    ckpt = run_dir / CHECKPOINT_NAME
    try:
        overrides = config_overrides(args)
        changes: list = []
        resume_cfg = (resume_config(ckpt, overrides, changes, kept_settings(args), args=args)
                      if args.resume and ckpt.is_file() else None)
    except (CheckpointError, ValueError) as e:
        raise _Refused(str(e)) from None
    problem = None if resume_cfg is not None else new_run_problem(overrides, args)  # before the dataset loads
    if problem:
        raise _Refused(problem)
    early = []  # what stderr shows before log.txt exists (the dataset's warnings, …): written there once it does
    if args.resume and resume_cfg is None:
        early.append(no_checkpoint_line(run_dir))
        print(f"rigel-viewer: {early[-1]}", file=sys.stderr)
    problem, note = resolve_downscale(args, run_dir, resume_cfg is not None)  # as rigel-train
    if problem:
        raise _Refused(problem)
    if note:
        early.append(note)
        print(f"rigel-viewer: {note}", file=sys.stderr)
    device = _pick_render_device(args.device)
    problem = preload_problem(args) if args.preload_frames else None   # before a single image is decoded
    if problem:
        raise _Refused(problem)
    with remembered_warnings(early, prefix="warning: "):
        ds = load_training_data(args)
    problem = resumed_data_problem(run_dir, ds, args.data, args.downscale) if resume_cfg is not None else None
    if problem:
        raise _Refused(f"--resume: {run_dir} {problem}")
    problem = _view_problem(args.view, len(ds.train), f"--data {args.data}")
    if problem:   # before the run folder is claimed: nothing written
        raise _Refused(problem)
    streamed = not args.preload_frames
    try:   # a configuration the trainer refuses: one line, status 2, as rigel-train (it was status 1)
        # what cannot fit the device, as rigel-train refuses it: preloaded images go there as the trainer is made
        problem = None if streamed else memory_problem_of(ds, resume_cfg or new_config(args, overrides), device,
                                                          streamed=False, n_gaussians=0)
        if problem:
            raise _Refused(problem)
        with remembered_warnings(early, prefix="warning: "):
            trainer = build_trainer(args, ds, device, resume_cfg=resume_cfg, ckpt=ckpt, overrides=overrides)
    except (ValueError, TypeError) as e:   # TypeError: a --set value of the wrong type
        if isinstance(e, TypeError) and not args.set_fields:
            raise
        raise _Refused(str(e)) from None
    problem = memory_problem_of(ds, trainer.config, device, streamed=streamed)  # the resolved budget ("auto")
    if problem:
        raise _Refused(problem)
    try:  # the folder is checked again under the lock: a rigel-train may have finished a run here meanwhile
        if lock.claim(resume=args.resume) is None:
            raise _Refused(RunLock(run_dir).busy_message("rigel process"))
    except RunFolderTaken as e:
        raise _Refused(str(e)) from None
    if changes:  # said once the resume goes ahead (a refused one stays one line)
        print(f"rigel-viewer: {changed_settings_line(ckpt, changes)}", file=sys.stderr)
    # a finished run opened again writes nothing until it is changed or saved (TrainingSession), as rigel-train
    # --resume of a finished run: neither this session's lines nor the dataset's warnings go to its log.txt
    reopened = run_finished(trainer)
    if reopened and args.resume:
        print(f"rigel-viewer: --resume: {run_dir} already finished its {trainer.iteration} iterations; its files are "
              "written only when you change or save it", file=sys.stderr)
    log = _setup_logging(run_dir)
    if not reopened:   # what the console said before the run folder's log opened: in its log.txt too (rigel-train's)
        log_to_file(log, early + ([changed_settings_line(ckpt, changes)] if changes else []))
    frames = list(ds.train)
    if args.up is None:
        settings.up = up_from_cameras([f.camera for f in frames])
    settings.white_background = bool(getattr(ds, "white_bg", args.white_bg))
    if device == "cpu":
        settings.model_refresh_s = 0.5
    # offscreen: the frame loop resumes it (viewer.offscreen), so no iteration runs before frames are presented
    session = TrainingSession(trainer, ModelSlot(), run_dir, running=not (args.paused or args.offscreen),
                              data=args.data)
    session.start()
    try:
        while session.slot.latest() is None and session.alive:   # the first snapshot (after the initial evaluation)
            time.sleep(0.01)
    except KeyboardInterrupt:   # Ctrl-C before the caller holds the session: stop its thread here (it was left
        session.stop(save=True)  # inside torch while the interpreter exited: "terminate called", SIGABRT)
        raise
    if session.slot.latest() is None:
        failed = [e for e in session.drain_events() if type(e).__name__ == "TrainingFailed"]
        raise RuntimeError(failed[0].message if failed else "the training thread ended before starting")
    return run_dir, session, frames, device


def _view_problem(view: int | None, n: int, what: str) -> str | None:
    """Why ``--view`` cannot open at one of the ``n`` training views of ``what`` (one line), or None."""
    if view is not None and view > n:
        return f"--view {view}: {what} has {n} training view{'s' if n != 1 else ''} (--view 1 to {n})"
    return None


def _input_error():
    """``rigel_core.io.errors.InputError``, imported when an exception is matched against it: the ``rigel_core.io``
    package imports torch, which the loading frame comes before."""
    from rigel_core.io.errors import InputError

    return InputError


def _db(x) -> str:
    """A PSNR for a message: two decimals, or "n/a"."""
    return f"{x:.2f}" if isinstance(x, (int, float)) and math.isfinite(x) else "n/a"


def _psnr_words(evals: list) -> str:
    """The held-out PSNR of an offscreen training session's evaluations (``[{"iteration", "psnr", ...}]``, in order)
    for its last line: "first -> last dB", or one value when the session evaluated once (a resumed run with
    ``eval_every`` 0 evaluates only at its end: "a -> a" said nothing), "n/a dB" when never."""
    if not evals:
        return "n/a dB"
    first, last = evals[0], evals[-1]
    if len(evals) == 1 or first.get("iteration") == last.get("iteration"):
        it = last.get("iteration")
        return f"{_db(last.get('psnr'))} dB" + (f" (iteration {it:,})" if isinstance(it, int) else "")
    return f"{_db(first.get('psnr'))} -> {_db(last.get('psnr'))} dB"


def _count(n, word: str) -> str:
    """``"1 frame"``, ``"2 frames"``: a count and its noun for a message."""
    return f"{n} {word}" + ("" if n == 1 else "s")


def _flag_problem(args) -> str | None:
    """The first flag value rigel-viewer refuses (one line naming the flag and the value), or None; the ``--out``
    folder of a viewer run is checked here too, before the scene loads (:func:`rigel_core.run_dir.out_problem`)."""
    if args.offscreen and args.out is None:
        return "--offscreen needs --out DIR"
    if args.render_scale is not None and not 0 < args.render_scale <= 4:
        return f"--render-scale must be in (0, 4], got {args.render_scale}"
    if not MIN_SLOTS <= args.slots <= MAX_SLOTS:
        return f"--slots must be in [{MIN_SLOTS}, {MAX_SLOTS}], got {args.slots}"
    if max(args.size) > MAX_SIZE:   # the device's own limit is checked when Vulkan is up (viewer.app)
        return f"--size must be at most {MAX_SIZE}x{MAX_SIZE}, got {args.size[0]}x{args.size[1]}"
    if args.data is not None and args.cameras is not None:
        return "--cameras is for viewing a SCENE; with --data the dataset's cameras are shown"
    if args.data is not None and args.scene:
        return "give either a SCENE to view or --data DIR to train, not both"
    if args.data is None:   # a training flag where nothing trains was ignored without a word
        for action in build_parser().training_actions:
            if getattr(args, action.dest, None) != action.default:
                return (f"{action.option_strings[0]} is a training flag: it needs --data DIR (a SCENE or --cameras "
                        "is only viewed)")
    if args.view is not None and args.cameras is None and args.data is None:
        return "--view N opens at a training view: it needs --cameras DATASET (or --data DIR)"
    if args.view is not None and args.view < 1:
        return f"--view must be ≥ 1 (training views are numbered from 1, as the Camera section shows), got " \
               f"{args.view}"
    if args.data is None and args.out is not None:   # frames, screenshots, videos
        problem = out_problem(args.out)
        if problem:
            return problem
        if args.offscreen:      # one run's output per folder (with --data the run-folder rules apply)
            from .offscreen import earlier_output

            problem = earlier_output(args.out)
            if problem:
                return problem
    if not FPS_RANGE[0] <= args.fps <= FPS_RANGE[1]:      # NaN fails both
        return f"--fps must be in [{FPS_RANGE[0]:g}, {FPS_RANGE[1]:g}] frames per second, got {args.fps}"
    if args.refresh_hz is not None and not 0 <= args.refresh_hz <= REFRESH_HZ_MAX:
        return f"--refresh-hz must be in [0, {REFRESH_HZ_MAX:g}] (the Training panel's slider), got {args.refresh_hz}"
    if args.frames is not None and args.frames < 1:
        return f"--frames must be >= 1, got {args.frames}"
    return threads_problem(args.threads)


def main(argv=None) -> int:
    """Entry point of ``rigel-viewer``; returns the exit status. Warnings (a scene file's, a dataset's) print as one
    ``rigel-viewer: warning: …`` line, not as Python's two-line source report (``one_line_warnings``, as
    rigel-train and rigel-render)."""
    from rigel_core.cli.common import one_line_warnings

    with one_line_warnings("rigel-viewer"):
        return _main(argv)


def parse_args(argv=None) -> argparse.Namespace:
    """``build_parser().parse_args`` of ``argv`` (default ``sys.argv[1:]``), where ``--up -y`` (any axis of
    :data:`~viewer.camera_control.UP_AXES` after ``--up``) is read as ``--up=-y``: argparse takes a value that starts
    with ``-`` for an option and refused it ("expected one argument")."""
    argv = list(sys.argv[1:] if argv is None else argv)
    joined, i = [], 0
    while i < len(argv):
        if argv[i] == "--":                   # what follows is positional
            joined += argv[i:]
            break
        if argv[i] == "--up" and i + 1 < len(argv) and argv[i + 1] in UP_AXES:
            joined.append(f"--up={argv[i + 1]}")
            i += 2
        else:
            joined.append(argv[i])
            i += 1
    return build_parser().parse_args(joined)


def _main(argv=None) -> int:
    args = parse_args(argv)
    from .app import SizeUnsupported, Viewer
    from .gpu.targets import DisplayUnavailable
    from .offscreen import run_offscreen, run_offscreen_training
    from .window import sigint_flag

    problem = _flag_problem(args)
    if problem:         # one line, status 2: as argparse's own errors and rigel-train's refusals
        print(f"rigel-viewer: {problem}", file=sys.stderr)
        return 2
    # A window on the CPU shows a loading frame before torch is imported (viewer/loading.py); the scene file must
    # exist (a missing one is refused before any window opens, below).
    early = None
    if not args.offscreen and args.data is None and args.cameras is None and \
            (not args.scene or os.path.isfile(args.scene)):
        from .loading import early_device

        early = early_device(args.device)
    if early is None:
        set_threads(args.threads)   # imports torch: after the loading frame, if any
    settings = ViewSettings(mode=dict(MODE_LABELS)[args.mode], render_scale=args.render_scale,
                            white_background=args.white_bg, vsync=not args.no_vsync, up=args.up or "+z",
                            show_panels=not args.no_panels)
    if args.refresh_hz is not None:
        settings.refresh_hz = args.refresh_hz
    viewer = session = None
    run_dir = None
    interrupted = False
    locks: list = []
    try:
        if args.data is not None:
            limit_heap_retention()
            run_dir, session, frames, device = _start_training(args, settings, locks)
            viewer = Viewer(session.slot, offscreen=args.offscreen, size=args.size, device=device, debug=args.debug,
                            settings=settings, scene_name=str(args.data), slots=args.slots, training=session,
                            frames=frames, ini_path=None if args.offscreen else config_dir() / "imgui.ini")
            viewer.screenshot_dir = run_dir
        else:
            from .scene import default_scene, default_up, load_scene_file

            _setup_logging(None)
            if early is not None:   # the window and a loading frame first, then torch (viewer/loading.py)
                from .loading import adopt_scene, bundled_scene_path, present_loading, scene_preview

                shown = str(args.scene or bundled_scene_path())
                viewer = Viewer(ModelSlot(), size=args.size, device=early, debug=args.debug, settings=settings,
                                scene_name=shown, slots=args.slots, ini_path=config_dir() / "imgui.ini")
                present_loading(viewer, shown, scene_preview(viewer, shown, args.up))
                set_threads(args.threads)   # imports torch: after the loading frame, if any
            if args.scene:
                model, name = load_scene_file(args.scene), str(args.scene)
                settings.up = args.up or default_up(args.scene, model)
            else:
                model, name = default_scene()
            if early is not None:
                adopt_scene(viewer, model, name, settings.up)
            else:
                frames = None
                alone = None
                if args.cameras is not None:   # a dataset's training cameras, drawn as frustums (viewer/studio.py)
                    frames, alone = _camera_frames(args.cameras, args.downscale or 1)
                    problem = _view_problem(args.view, len(frames), f"--cameras {args.cameras}")
                    if problem:
                        raise _Refused(problem)
                viewer = Viewer(ModelSlot(model), offscreen=args.offscreen, size=args.size, device=args.device,
                                debug=args.debug, settings=settings, scene_name=name, slots=args.slots,
                                frames=frames, ini_path=None if args.offscreen else config_dir() / "imgui.ini")
                if frames and args.scene:   # a pose-refining run's scene: its refined cameras beside the given ones
                    viewer.studio.refined = _refined_beside(args.scene, frames, shown=alone)
            if args.out is not None:
                viewer.screenshot_dir = args.out
        if args.view is not None:   # the opening view: training view N (--cameras or --data), exactly
            viewer.snap_to_camera(args.view - 1)
        status = 0
        if args.path is not None:   # the Camera path section (viewer/panels/camera_path.py)
            from .panels.camera_path import open_path, run_offscreen_path

            open_path(viewer, args.path)
        if args.offscreen:
            n = 8 if args.frames is None else args.frames
            if args.path is not None and session is None:
                summary = run_offscreen_path(viewer, args.out, args.frames)
                print(f"rigel-viewer: {_count(summary.get('frames', 0), 'frame')} of {args.path} -> {args.out}")
                if not summary["ok"]:
                    print(f"rigel-viewer: {summary['error']}", file=sys.stderr)
                return 0 if summary["ok"] else 1
            if session is not None:
                with sigint_flag(viewer):
                    summary = run_offscreen_training(viewer, n, args.out, max_fps=args.fps,
                                                     orbit_degrees=0.0 if args.view is not None else 90.0)
                interrupted = viewer.interrupted
                resumed = summary["session_iterations"] != summary["iterations"]
                last = (summary.get("eval") or [{}])[-1].get("iteration")
                stale = (f" (last evaluated at iteration {last})"   # a Ctrl-C between evaluations: not the end's
                         if last is not None and last != summary["iterations"] else "")
                print(f"rigel-viewer: trained {_count(summary['session_iterations'], 'iteration')}"
                      + (f" (to iteration {summary['iterations']})" if resumed else "")
                      + f" on {summary['training_device']}, "
                      f"held-out PSNR {_psnr_words(summary.get('eval') or [])}{stale}, "
                      f"{_count(summary['frames'], 'frame')} "
                      f"({summary['frame_ring']}) in {summary['seconds']} s -> {args.out}")
            else:
                # --view N: every frame at training view N (the orbit would leave it after the first)
                summary = run_offscreen(viewer, n, args.out, orbit_degrees=0.0 if args.view is not None else 360.0)
                print(f"rigel-viewer: {_count(summary['frames'], 'frame')} of {summary['scene']} "
                      f"({summary['gaussians']:,} Gaussians, {viewer.render_device}, {viewer.ctx.device_name}) in "
                      f"{summary['seconds']} s "
                      f"-> {args.out}")
            if not summary["ok"]:
                print(f"rigel-viewer: {summary['error']}", file=sys.stderr)
                status = 1
        else:
            viewer.run(frames=args.frames)
            interrupted = viewer.interrupted
        if viewer.train_state is not None:
            viewer.close()   # stops the training thread, which saves
            if viewer.train_state.status == "failed":
                print(f"rigel-viewer: training failed: {viewer.train_state.error} (see {run_dir / LOG_NAME})",
                      file=sys.stderr)
                status = 1
        if args.debug:
            from .gpu.vk_context import validation_log

            if validation_log.errors:
                print(f"rigel-viewer: the validation layer reported {validation_log.errors} error(s)",
                      file=sys.stderr)
                status = 1
        if interrupted:   # 130 after Ctrl-C, 143 after SIGTERM (as rigel-train)
            return 128 + int(getattr(viewer, "stop_signal", None) or signal.SIGINT)
        return status
    except _Refused as e:
        print(f"rigel-viewer: {e}", file=sys.stderr)
        return 2
    except (VulkanUnavailable, DisplayUnavailable, SizeUnsupported) as e:
        print(f"rigel-viewer: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("rigel-viewer: interrupted" + (", saving the run" if session is not None else ""), file=sys.stderr)
        return EXIT_INTERRUPTED
    except (_input_error(), FileNotFoundError, IsADirectoryError) as e:  # a bad or missing scene / dataset file: one
        print(f"rigel-viewer: {e}", file=sys.stderr)                 # line naming it, status 2 as rigel-render/-train
        return 2
    except (FileNotFoundError, ValueError, RuntimeError, OSError, ImportError) as e:
        print(f"rigel-viewer: {e}", file=sys.stderr)
        return 1
    finally:
        if viewer is not None:
            viewer.close()       # with a training thread: stops it and saves the checkpoint and the PLY first
        elif session is not None:
            session.stop(save=True)
        for lock in locks:
            lock.release()


if __name__ == "__main__":
    sys.exit(main())
