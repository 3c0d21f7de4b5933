"""``rigel-train``: fit 3D Gaussians to a dataset, headless.

    rigel-train --data DIR --out RUN [--iters 30000] [--appearance sh|mlp] [--white-bg] [--alpha-as-mask]
                [--downscale N]
                [--max-gaussians N] [--eval-every N] [--resume] [--device cuda|cpu] [--seed S]
                [--init-points N] [--sh-degree D] [--test-every N] [--checkpoint-every N] [--n-renders K]
                [--exposure] [--pose-opt] [--appearance-grid] [--init-background N|auto] [--position-lr-max-steps N] [--render-mode default|mip]
                [--strategy default|mcmc] [--set FIELD=VALUE ...] [--batch-size B] [--gpus N] [--dist-check-every K]
                [--threads N] [--frame-cache-mb MB] [--preload-frames]

``DIR`` is any dataset :func:`rigel_core.data.load_dataset` reads (Blender ``transforms_{train,test}.json``,
instant-ngp, COLMAP). Writes into ``RUN``:

- ``log.txt``: one line per event (densification, evaluation, skipped steps, checkpoints), appended on resume;
- ``metrics.json``: the run's configuration, the training loss curve (mean over each ``--log-every`` window:
  loss, training-view PSNR, Gaussian count, ms per iteration), held-out PSNR and SSIM at each evaluation,
  ``graph_step`` (CUDA only: graphs captured, host seconds spent capturing, steps replayed, overflows, host
  seconds waiting for the device; null when every step was eager), timings (``train_s``: the steps' own seconds,
  evaluations excluded; ``loop_s``: the
  training loop's wall-clock seconds, evaluations and periodic saves excluded; ``ms_per_iter``: ``train_s`` per
  iteration; ``total_s``: the command's wall-clock seconds — a rigel-viewer session adds its loop and evaluation
  seconds, its pauses left out; each summed over the run's sessions), peak GPU memory (CUDA), the number of steps
  the NaN guard skipped;
- ``checkpoint.safetensors`` (:mod:`rigel_core.checkpoint`; ``--resume`` continues from it — a run that already
  finished its iterations is one line saying so, exit 0, nothing written: ``--iters M`` beyond them extends it —,
  and an ``--out`` that holds one is refused without ``--resume``), ``model.ply`` (INRIA layout), both written atomically;
- ``renders/it<NNNNNN>/<view>_pred.png`` and ``<view>_gt.png`` for the first ``--n-renders`` held-out views
  at each evaluation. A view with a mask (lens borders of an undistorted capture, a ``masks/`` folder) has its
  ``_gt.png`` written as RGBA with alpha 0 on the pixels that do not count (the metrics ignore them).
  ``metrics.json`` gives the masked pixel counts: ``dataset.masked_pixels`` per split, and each evaluation's
  ``masked_pixels`` (total) and per-view ``masked_pixels``;
- with ``--exposure``: ``exposure.json``, the learnt colour correction ``A``, ``b`` of every training image
  (written with the checkpoint), and each evaluation's ``psnr_exposure`` / ``ssim_exposure`` in ``metrics.json``
  (also without ``--exposure`` under ``--set eval_exposure=true``, to compare runs on equal terms);
- with ``--pose-opt``: ``transforms.json`` (nerfstudio layout, OpenGL camera-to-world), the refined pose of every
  training image beside its given one (``original_transform_matrix``), written with the checkpoint, and each
  evaluation's ``psnr_pose`` / ``ssim_pose`` (held-out poses fitted with the scene frozen; also without
  ``--pose-opt`` under ``--set eval_pose_opt=true``).

Options for real captures (docs/TRAINING.md, "Real captures"): ``--exposure`` learns a per-training-image affine
colour correction (``TrainConfig.exposure``; held-out views are then also scored by fitting the correction on
the left half of each image and scoring the right half); ``--appearance-grid`` learns a per-training-image
bilateral grid of colour transforms instead or as well (``TrainConfig.appearance_grid``; scored the same way);
``--pose-opt`` refines the training cameras' poses (``TrainConfig.pose_opt``); ``--init-background N`` adds N background points behind
the SfM points along training rays (``TrainConfig.init_background_points``; for captures whose SfM covers only
the object; the default ``auto`` adds 20000 when the SfM points reach under half of the median training view,
and ``--strategy auto`` then trains with 3DGS's densification; ``0`` turns them off);
``--position-lr-max-steps N`` sets the horizon of the position lr decay (``TrainConfig.
position_lr_max_steps``; default the run's length — 3DGS uses 30000 whatever the run's length). On ``--resume``
these keep the saved run's values unless given again. ``--set FIELD=VALUE`` (repeatable) sets any
:class:`~rigel_core.train.TrainConfig` field, the value read as JSON (``--set densify_until=5000
--set grad_threshold=4e-4 --set init_box=[-1,-1,-1,1,1,1]``), else as a string; it wins over the other flags.

Ctrl-C finishes the current iteration, saves the checkpoint, the PLY and the metrics, then exits with status
130 (a second Ctrl-C aborts at once; during the final evaluation, the evaluation finishes and the run is saved as
done, still with status 130); SIGTERM (``timeout``, ``docker stop``, schedulers) does the same, status
143, and SIGHUP (a closed terminal, a dropped ssh session) too, status 129 (one process; a rank of ``--gpus N``
still ends at SIGTERM, the launcher's way to stop a stuck rank) — unless SIGHUP was ignored when the run started
(``nohup rigel-train …``): the run then goes on after a logout. Exit
status 0 on success, 2 for bad arguments, an unreadable dataset, a damaged checkpoint, an ``--out`` that cannot be
written or one another ``rigel-train`` is using.

``--threads N`` sets PyTorch's CPU threads (1 to 4 × the CPUs, as ``rigel-viewer --threads``; default one per core):
two CPU runs at once, each with a thread per core, slow each other many times over.

Batches and several processes (docs/TRAINING.md, "Batches and multi-GPU training"; :mod:`rigel_core.train.distributed`):
``--batch-size B`` renders B views per step and process (``TrainConfig.batch_size``); ``--gpus N`` runs N processes
of this host (one GPU each, NCCL; with ``--device cpu`` N CPU processes over gloo), and the same runs under
``torchrun --nproc-per-node N -m rigel_core.cli.train ...``. Every rank trains its part of each global batch of N·B
views; rank 0 alone writes ``RUN``; ``--dist-check-every K`` checks every K steps that the ranks hold bit-identical
state. ``--resume`` works with another N (the checkpoint holds global state).

Images are streamed (:mod:`rigel_core.data.stream`): read from disk as they are trained into a host cache of
``--frame-cache-mb`` MiB (default: the whole capture when it takes at most a quarter of the available memory,
else that quarter, at least 512), a few views ahead on the device; ``--preload-frames`` decodes them all into host
memory first (float32), then onto the device. An image that turns out unreadable mid-run stops the run with one line
naming it, after the checkpoint is saved (exit status 2). A run whose Gaussian budget or images cannot fit the GPU
(with ``--device cpu``: the host's available memory) is refused before training, in one line, and so is
``--preload-frames`` for a capture whose decoded images cannot fit the host's available memory, read from the image
headers before any is decoded (:mod:`rigel_core.train.memory`, exit status 2).

Before training starts nothing is written into ``RUN``: ``--out`` is checked for writability before the dataset
loads, a ``--resume`` checkpoint is validated completely (:func:`rigel_core.checkpoint.validate_checkpoint`),
and only then is ``RUN`` created, locked (``RUN/.lock``, ``fcntl.flock``, held until exit, then removed) and
cleared of the temporary files of interrupted atomic writes (:func:`rigel_core.atomic.remove_stale_temp_files`,
logged).
"""
from __future__ import annotations

import argparse
import builtins
import logging
import signal
import sys
import threading
import time
from pathlib import Path

from ..run_dir import (CHECKPOINT_NAME, METRICS_NAME, RunFolderTaken, RunLock, RunRecord, choose_run_dir,
                       log_to_file, new_metrics, open_run_log, out_problem, read_metrics)
from ..train.run import RunHooks, TrainingRun, run_finished
from .common import add_training_args, build_trainer, changed_settings_line, config_overrides, device_problem, \
    kept_settings, load_training_data, new_config, new_run_problem, no_checkpoint_line, one_line_warnings, path_arg, \
    memory_problem_of, preload_problem, remembered_warnings, resolve_downscale, resume_config, \
    resumed_data_problem, unread_settings_line, whole_number_arg
from .common import Parser, add_threads_arg, limit_heap_retention, set_threads, threads_problem

__all__ = ["main", "build_parser"]

EXIT_INTERRUPTED = 130


def build_parser() -> argparse.ArgumentParser:
    p = Parser(prog="rigel-train", description="Train a 3D Gaussian Splatting model.")
    p.add_argument("--out", required=True, type=path_arg, help="run directory (created)")
    add_training_args(p)   # --data, the dataset and TrainConfig flags, --resume (shared with rigel-viewer --data)
    p.add_argument("--checkpoint-every", type=whole_number_arg("only at the end"), default=5000,
                   help="checkpoint interval (0 = only at the end)")
    p.add_argument("--log-every", type=int, default=10, help="loss-curve window in iterations")
    p.add_argument("--n-renders", type=whole_number_arg("none"), default=3,
                   help="held-out views saved as PNG at each evaluation")
    p.add_argument("--device", choices=["cuda", "cpu"], default=None, help="default: cuda when usable")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    add_threads_arg(p)   # rigel-viewer's flag, with its bound
    # data-parallel training (rigel_core/train/distributed.py; issue 16)
    p.add_argument("--gpus", type=int, default=None, metavar="N",
                   help="train on N GPUs of this host, one process each (NCCL); with --device cpu, N CPU processes "
                        "(gloo, for testing). Under torchrun, leave it out (or give torchrun's --nproc-per-node)")
    p.add_argument("--dist-check-every", type=int, default=None, metavar="K",
                   help="multi-process runs: check every K steps that all ranks hold bit-identical Gaussians "
                        "(checksum; 0 = never; default 500)")
    return p


def _save_png(path: Path, img, mask=None) -> None:
    """8-bit PNG of an (H,W,3) float image; RGBA with alpha 0 where ``mask`` (H,W) is False, when given."""
    import numpy as np
    from PIL import Image

    arr = (img.detach().clamp(0, 1).cpu().numpy() * 255.0 + 0.5).astype(np.uint8)
    if mask is not None:
        m = mask.detach().cpu().numpy()
        alpha = np.where(m if m.dtype == bool else m > 0.5, 255, 0).astype(np.uint8)
        arr = np.concatenate([arr, alpha[..., None]], axis=-1)
    Image.fromarray(arr).save(path)


class _Progress:
    """tqdm when wanted, else a no-op with the same two methods used here."""

    def __init__(self, total, initial, enabled):
        self.bar = None
        if enabled:
            from tqdm import tqdm

            self.bar = tqdm(total=total, initial=initial, dynamic_ncols=True, unit="it")

    def write(self, msg):
        if self.bar is not None:
            self.bar.write(msg, file=sys.stderr)
        else:
            print(msg, file=sys.stderr)

    def update(self, n, postfix=None):
        if self.bar is not None:
            self.bar.update(n)
            if postfix:
                self.bar.set_postfix_str(postfix, refresh=False)

    def close(self):
        if self.bar is not None:
            self.bar.close()


def main(argv=None) -> int:
    """Run ``rigel-train`` with ``argv`` (default ``sys.argv[1:]``); returns the exit status.

    ``--gpus N`` (N > 1) outside a process group spawns N ranks running this same function
    (:func:`rigel_core.train.distributed.launch`); with WORLD_SIZE > 1 in the environment (torchrun, or those
    ranks) this process joins the group and trains its part of each global batch; rank 0 alone writes."""
    with one_line_warnings("rigel-train"):   # a dataset's or scene's warning: one line, not Python's report
        try:
            status = _run(list(sys.argv[1:] if argv is None else argv))
        except KeyboardInterrupt:  # before training starts (loading a capture takes seconds), or a second Ctrl-C
            # while saving: one line, not Python's traceback (training itself catches it and saves)
            status = None
        if (status is None or status >= 128) and argv is None and threading.current_thread() is threading.main_thread():
            # an interrupted process is ending: a further Ctrl-C would only interrupt the interpreter's exit
            # handlers, which then print tracebacks after the one line (found pressing Ctrl-C twice)
            signal.signal(signal.SIGINT, signal.SIG_IGN)
        if status is None:
            print("rigel-train: interrupted", file=sys.stderr)
            return EXIT_INTERRUPTED
        return status


def _run(argv: list) -> int:
    args = build_parser().parse_args(argv)
    from ..train.distributed import RankLost, RanksDiverged, env_world_size

    world = env_world_size()
    problem = threads_problem(args.threads)
    if problem:
        print(f"rigel-train: {problem}", file=sys.stderr)
        return 2
    set_threads(args.threads)
    limit_heap_retention()
    if args.gpus is not None and args.gpus < 1:
        print(f"rigel-train: --gpus must be ≥ 1, got {args.gpus}", file=sys.stderr)
        return 2
    if world > 1 and args.gpus not in (None, world):
        print(f"rigel-train: --gpus {args.gpus} but the process group has WORLD_SIZE={world} (torchrun); "
              "leave --gpus out under torchrun", file=sys.stderr)
        return 2
    if world == 1 and args.gpus and args.gpus > 1:
        return _launch(args, argv)
    comm = None
    if world > 1:
        from .. import cuda_available
        from ..train.distributed import init_from_env

        device = args.device or ("cuda" if cuda_available() else "cpu")
        try:
            comm = init_from_env(device)
        except (RuntimeError, ValueError) as e:
            print(f"rigel-train: {str(e).splitlines()[0] if str(e) else type(e).__name__}", file=sys.stderr)
            return 2
    lock = RunLock(Path(args.out))
    try:
        return _main(args, lock, comm)
    except (RankLost, RanksDiverged) as e:
        print(f"rigel-train: {e}", file=sys.stderr)
        return 1
    finally:
        lock.release()
        if comm is not None:
            if not comm.started:  # this rank stopped before training: tell the others (they wait in agree())
                try:
                    comm.agree(False)
                except RankLost:
                    pass
            comm.close()


def _launch(args, argv) -> int:
    """``--gpus N``: check the device count, then run N ranks of :func:`main` (distributed.launch)."""
    import torch

    from .. import cuda_available
    from ..train.distributed import launch

    device = args.device or "cuda"  # --gpus means GPUs: CPU processes only when --device cpu asks for them
    if device == "cuda":
        if not cuda_available():
            print("rigel-train: --gpus asked, but no CUDA device or no built kernels (rigel_core._C); "
                  "--device cpu --gpus N runs N CPU processes", file=sys.stderr)
            return 2
        if torch.cuda.device_count() < args.gpus:
            print(f"rigel-train: --gpus {args.gpus} but this host has {torch.cuda.device_count()} GPU(s)",
                  file=sys.stderr)
            return 2
    if args.device is None:  # every rank on the launcher's choice
        argv = argv + ["--device", device]
    return launch(main, argv, args.gpus)


def _busy(run_dir: Path) -> int:
    print(f"rigel-train: {RunLock(run_dir).busy_message('rigel-train')}", file=sys.stderr)
    return 2


def _main(args, lock: RunLock, comm=None) -> int:
    import torch

    from .. import cuda_available
    from ..data import DatasetError

    is_main = comm is None or comm.is_main  # rank 0 (or the only process) alone writes and prints
    print = builtins.print if is_main else (lambda *a, **k: None)  # noqa: A001 - other ranks stay silent

    run_dir = Path(args.out)
    ckpt = run_dir / CHECKPOINT_NAME
    problem = out_problem(run_dir)  # before the dataset loads: a bad --out costs nothing
    if problem:
        print(f"rigel-train: {problem}", file=sys.stderr)
        return 2
    if is_main and not lock.try_existing():
        return _busy(run_dir)
    try:  # a run's files (model.ply, metrics.json, log.txt, …) are never trained over; the same rule as the viewer's
        choose_run_dir(run_dir, run_dir, resume=args.resume, data=args.data)
    except RunFolderTaken as e:
        print(f"rigel-train: {e}", file=sys.stderr)
        return 2
    early = []  # what the console shows before log.txt exists (the dataset's and the trainer's warnings, …): written
    # there once it does

    def say_early(line: str) -> None:
        early.append(line)
        print(f"rigel-train: {line}", file=sys.stderr)

    if args.resume and not ckpt.is_file():
        say_early(no_checkpoint_line(run_dir))
    device = args.device or ("cuda" if cuda_available() else "cpu")
    problem = device_problem(device)
    if problem:
        print(f"rigel-train: {problem}", file=sys.stderr)
        return 2
    try:
        overrides = config_overrides(args)
    except ValueError as e:
        print(f"rigel-train: {e}", file=sys.stderr)
        return 2
    resume_cfg, changes = None, []
    if args.resume and ckpt.is_file():  # validated completely before the dataset loads and anything is written
        from ..checkpoint import CheckpointError

        try:
            resume_cfg = resume_config(ckpt, overrides, changes, kept_settings(args), args=args)
        except (CheckpointError, ValueError) as e:
            print(f"rigel-train: {e}", file=sys.stderr)
            return 2
    problem, note = resolve_downscale(args, run_dir, resume_cfg is not None)  # a resumed run: the factor it had
    if problem:
        print(f"rigel-train: {problem}", file=sys.stderr)
        return 2
    if note:
        say_early(note)
    problem = new_run_problem(overrides, args) if resume_cfg is None else None  # before the dataset loads
    if problem:
        print(f"rigel-train: {problem}", file=sys.stderr)
        return 2
    t_start = time.perf_counter()
    try:
        problem = preload_problem(args) if args.preload_frames else None   # before a single image is decoded
        if problem:
            print(f"rigel-train: {problem}", file=sys.stderr)
            return 2
        with remembered_warnings(early, prefix="warning: "):
            ds = load_training_data(args)
    except (DatasetError, ValueError, FileNotFoundError, ImportError) as e:
        print(f"rigel-train: {e}", file=sys.stderr)
        return 2
    t_loaded = time.perf_counter()

    metrics_path = run_dir / METRICS_NAME
    if resume_cfg is not None:
        problem = resumed_data_problem(run_dir, ds, args.data, args.downscale)
        if problem:
            print(f"rigel-train: --resume: {run_dir} {problem}", file=sys.stderr)
            return 2
    metrics = None
    streamed = not args.preload_frames

    def memory_refusal(cfg, n_gaussians=None) -> str | None:  # what cannot fit the device, before training
        return memory_problem_of(ds, cfg, device, streamed=streamed, n_gaussians=n_gaussians)

    try:
        # preloaded images go to the GPU as the trainer is made: their part is checked before
        problem = None if streamed else memory_refusal(resume_cfg or new_config(args, overrides), 0)
        if problem:
            print(f"rigel-train: {problem}", file=sys.stderr)
            return 2
        with remembered_warnings(early, prefix="warning: "):
            trainer = build_trainer(args, ds, device, resume_cfg=resume_cfg, ckpt=ckpt, overrides=overrides)
        problem = memory_refusal(trainer.config)  # the resolved budget ("auto"), the views as trained
        if problem:
            print(f"rigel-train: {problem}", file=sys.stderr)
            return 2
        if resume_cfg is not None and metrics_path.is_file():
            metrics = read_metrics(metrics_path)   # a damaged metrics.json starts afresh (the checkpoint holds the state)
            if metrics is None:
                say_early(f"{metrics_path}: damaged; the training curve and evaluation history start afresh "
                          "(the checkpoint holds the training state)")
    except (ValueError, TypeError) as e:  # TypeError: a --set value of the wrong type
        if isinstance(e, TypeError) and not args.set_fields:
            raise
        print(f"rigel-train: {e}", file=sys.stderr)
        return 2
    if resume_cfg is not None and run_finished(trainer):   # nothing to train or evaluate: the run's files stay as they are
        done = f"{trainer.iteration} iteration{'' if trainer.iteration == 1 else 's'}"
        print(f"rigel-train: --resume: {run_dir} already finished its {done}; nothing written "
              f"(--iters M, M > {trainer.iteration}, extends it"
              + (f"; not applied: {'; '.join(changes)})" if changes else ")"), file=sys.stderr)
        return 0
    # only now: a run that cannot start leaves nothing behind (no directory, no log, no lock file)
    stale = []
    if is_main:
        try:
            stale = lock.claim(resume=args.resume)
            if stale is None:
                return _busy(run_dir)
        except RunFolderTaken as e:
            print(f"rigel-train: {e}", file=sys.stderr)
            return 2
        except OSError as e:
            print(f"rigel-train: --out {run_dir}: {e.strerror or e}", file=sys.stderr)
            return 2
        if changes:  # said once the resume goes ahead (a refused one stays one line)
            print(f"rigel-train: {changed_settings_line(ckpt, changes)}", file=sys.stderr)
    if comm is not None:  # every rank has started (or one failed: all stop, the failing one said why)
        comm.started = True
        if not comm.agree(True):
            return 2
        trainer.comm = comm
        comm.broadcast_model(trainer)
        if args.dist_check_every is not None:
            comm.check_every = max(0, args.dist_check_every)
        comm.check_identical(trainer)
    t_init = time.perf_counter()
    cfg = trainer.config
    metrics = new_metrics(metrics, data=args.data, device=device, trainer=trainer, resumed=resume_cfg is not None)
    world = 1 if comm is None else comm.world_size
    metrics["distributed"] = {"world_size": world, "batch_size": cfg.batch_size,
                              "global_batch": world * cfg.batch_size, "batch_lr_scaling": cfg.batch_lr_scaling,
                              "backend": None if comm is None else ("nccl" if device == "cuda" else "gloo")}
    progress = _Progress(cfg.iterations, trainer.iteration, not args.quiet and is_main)
    if is_main:
        log = open_run_log(run_dir, f"rigel.train.{id(progress)}", progress.write)
    else:  # other ranks write nothing
        log = logging.getLogger(f"rigel.train.rank{comm.rank}.{id(progress)}")
        log.propagate = False
        log.handlers[:] = [logging.NullHandler()]
    record = RunRecord(run_dir, log, metrics)
    if is_main:  # a warning while training: log.txt and (through the log's console handler) the console
        log_to_file(log, early)
        record.log_warnings(echo=False)
    record.log_data(trainer)
    if stale:
        log.info(f"removed {len(stale)} stale temporary file(s) of interrupted writes: "
                 + ", ".join(p.name for p in stale))
    log.info(trainer.start_line())
    if changes:  # the resumed session's log.txt says what it changed too (the console said it before it opened)
        log_to_file(log, [changed_settings_line(ckpt, changes)])
    for note in trainer.notes:
        log.info(note)
    if is_main and (unread := unread_settings_line(args, cfg)):
        log.warning(unread)
    if world * cfg.batch_size > 1:
        from ..train.distributed import batch_scaling

        f, (b1, b2) = batch_scaling(cfg.batch_lr_scaling, world * cfg.batch_size)
        log.info(f"{world} process(es) x {cfg.batch_size} view(s) = {world * cfg.batch_size} views per step"
                 + (f" ({metrics['distributed']['backend']})" if comm is not None else "")
                 + f"; learning rates x {f:.3f}, Adam betas ({b1:.4f}, {b2:.6f}) ({cfg.batch_lr_scaling})")
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()

    # Ctrl-C, SIGTERM or SIGHUP: finish the current iteration, then save (a second one aborts at once).
    stop = threading.Event()
    old_handlers = {}
    stop_signal = [signal.SIGINT]
    if threading.current_thread() is threading.main_thread():
        def _on_sigint(signum, frame):
            if stop.is_set():
                raise KeyboardInterrupt
            stop_signal[0] = signum
            stop.set()
            if comm is not None:  # the ranks stop after the same step: the flag travels in its all-reduce
                comm.stop_requested = True
            # said at once (above the progress bar): an evaluation in progress (the pose-fitted one takes minutes on
            # a CPU) finishes first
            if is_main:
                progress.write(f"rigel-train: {signal.Signals(signum).name}: stopping after the current step or "
                               "evaluation, then saving (again to stop at once)")

        # SIGTERM only in a single process: the --gpus launcher ends a rank stuck in a collective with SIGTERM
        # (and SIGHUP: a closed terminal or a dropped ssh session, which killed the run with nothing saved)
        caught = (signal.SIGINT,) if comm is not None else (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
        # a SIGHUP the parent set to be ignored stays ignored: `nohup rigel-train …` keeps training after a logout
        # (SIGINT and SIGTERM are caught whatever: a script's background job starts with SIGINT ignored, and
        # `timeout -s INT` is how the benches stop a run with its results saved)
        caught = tuple(s for s in caught if not (s == signal.SIGHUP and signal.getsignal(s) == signal.SIG_IGN))
        old_handlers = {s: signal.signal(s, _on_sigint) for s in caught}

    timings = metrics["timings"]
    total_before = float(timings.get("total_s", 0.0))  # earlier sessions of a resumed run
    timings["load_s"] = t_loaded - t_start
    timings["init_s"] = t_init - t_loaded
    run = TrainingRun(trainer, record, window=args.log_every, checkpoint_every=args.checkpoint_every,
                      hooks=_ConsoleHooks(run_dir, trainer, progress, args.n_renders, comm, device, t_start,
                                          total_before), comm=comm)

    def interrupted_status() -> int:  # 130 after Ctrl-C, 128 + the signal's number after SIGTERM / SIGHUP
        return EXIT_INTERRUPTED if stop_signal[0] == signal.SIGINT else 128 + int(stop_signal[0])

    status = 0
    try:
        while trainer.iteration < cfg.iterations:
            if stop.is_set() and comm is None:
                raise KeyboardInterrupt
            run.step()
            if run.steps == 1:  # this session's time to its first step, from the dataset load's start
                timings["first_step_s"] = time.perf_counter() - t_start
            if comm is not None and comm.stop_all:  # some rank was asked to stop: all stop after this step
                raise KeyboardInterrupt
        if stop.is_set() and comm is None:  # asked during the last step: saved as interrupted, no final evaluation
            raise KeyboardInterrupt
        run.finish("done")
        if stop.is_set():  # asked during the final evaluation: it finished and everything is saved, but the exit
            # status still says the run was interrupted (a script waiting on it must not read success)
            status = interrupted_status()
            log.info(f"[{trainer.iteration}] {signal.Signals(stop_signal[0]).name} during the final evaluation: the "
                     f"run finished and is saved; exit status {status}")
    except DatasetError as e:  # a streamed image that cannot be read when its turn came: one line, the run saved
        status = 2
        saved = run.save_if_consistent("failed", collective=False)
        line = (f"{e} (at iteration {trainer.iteration}: "
                + ("the run is saved; replace the file, then --resume)" if saved else "the run was not saved)"))
        if is_main:
            log_to_file(log, [line])
        print(f"rigel-train: {line}", file=sys.stderr)
    except KeyboardInterrupt:
        status = interrupted_status()
        # a second Ctrl-C aborts mid-step: the ranks may not be at the same point, so no collective then
        if not run.save_if_consistent("interrupted", collective=comm is not None and comm.stop_all):
            log.info(f"[{trainer.iteration}] interrupted mid-update: state inconsistent, checkpoint not written")
    finally:
        for s, h in old_handlers.items():
            signal.signal(s, h)
        run.write_metrics()
        progress.close()
        if is_main:
            record.close()
    return status


class _ConsoleHooks(RunHooks):
    """rigel-train's part of the run loop (rigel_core/train/run.py): the progress bar, the held-out renders at each
    evaluation, the distributed and memory fields of metrics.json."""

    def __init__(self, run_dir: Path, trainer, progress: "_Progress", n_renders: int, comm, device: str,
                 t_start: float, total_before: float):
        self.run_dir, self.trainer, self.progress, self.n_renders = run_dir, trainer, progress, n_renders
        self.comm, self.device, self.t_start, self.total_before = comm, device, t_start, total_before

    def window(self, entry: dict, results: list) -> None:
        self.progress.update(len(results), f"loss {entry['loss']:.4f} psnr {entry['psnr']:.2f} "
                                           f"N {results[-1].num_gaussians}")

    def evaluating(self, ev) -> None:
        out_dir = self.run_dir / "renders" / f"it{ev.iteration:06d}"
        out_dir.mkdir(parents=True, exist_ok=True)
        for f in self.trainer.test_frames[:max(0, self.n_renders)]:
            _save_png(out_dir / f"{f.name}_pred.png", self.trainer.render_frame(f))
            _save_png(out_dir / f"{f.name}_gt.png", f.image, getattr(f, "mask", None))

    def metrics(self, metrics: dict) -> None:
        import torch

        if self.comm is not None:
            metrics["distributed"].update(allreduce_calls=self.comm.reduce_calls)
        metrics["timings"]["total_s"] = self.total_before + time.perf_counter() - self.t_start
        if self.device == "cuda":
            metrics["peak_gpu_memory_bytes"] = int(torch.cuda.max_memory_allocated())
        from ..data.stream import stream_stats

        metrics["frames"] = stream_stats(self.trainer)

if __name__ == "__main__":
    sys.exit(main())
