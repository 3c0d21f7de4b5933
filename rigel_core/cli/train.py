"""``rigel-train``: fit 3D Gaussians to a dataset, headless.

    rigel-train --data DIR --out RUN [--iters 30000] [--appearance sh|mlp] [--white-bg] [--alpha-as-mask]
                [--downscale N]
                [--max-gaussians N] [--eval-every N] [--resume] [--device cuda|cpu] [--seed S]
                [--init-points N] [--sh-degree D] [--test-every N] [--checkpoint-every N] [--n-renders K]
                [--exposure] [--init-background N] [--position-lr-max-steps N] [--set FIELD=VALUE ...]

``DIR`` is any dataset :func:`rigel_core.data.load_dataset` reads (Blender ``transforms_{train,test}.json``,
instant-ngp, COLMAP). Writes into ``RUN``:

- ``log.txt``: one line per event (densification, evaluation, skipped steps, checkpoints), appended on resume;
- ``metrics.json``: the run's configuration, the training loss curve (mean over each ``--log-every`` window:
  loss, training-view PSNR, Gaussian count, ms per iteration), held-out PSNR and SSIM at each evaluation,
  timings, peak GPU memory (CUDA), the number of steps the NaN guard skipped;
- ``checkpoint.safetensors`` (:mod:`rigel_core.checkpoint`; ``--resume`` continues from it, and an ``--out``
  that holds one is refused without ``--resume``), ``model.ply`` (INRIA layout), both written atomically;
- ``renders/it<NNNNNN>/<view>_pred.png`` and ``<view>_gt.png`` for the first ``--n-renders`` held-out views
  at each evaluation. A view with a mask (lens borders of an undistorted capture, a ``masks/`` folder) has its
  ``_gt.png`` written as RGBA with alpha 0 on the pixels that do not count (the metrics ignore them).
  ``metrics.json`` gives the masked pixel counts: ``dataset.masked_pixels`` per split, and each evaluation's
  ``masked_pixels`` (total) and per-view ``masked_pixels``;
- with ``--exposure``: ``exposure.json``, the learnt colour correction ``A``, ``b`` of every training image
  (written with the checkpoint), and each evaluation's ``psnr_exposure`` / ``ssim_exposure`` in ``metrics.json``
  (also without ``--exposure`` under ``--set eval_exposure=true``, to compare runs on equal terms).

Options for real captures (docs/TRAINING.md, "Real captures"): ``--exposure`` learns a per-training-image affine
colour correction (``TrainConfig.exposure``; held-out views are then also scored by fitting the correction on
the left half of each image and scoring the right half); ``--init-background N`` adds N background points behind
the SfM points along training rays (``TrainConfig.init_background_points``; for captures whose SfM covers only
the object); ``--position-lr-max-steps N`` sets the horizon of the position lr decay (``TrainConfig.
position_lr_max_steps``; default the run's length — 3DGS uses 30000 whatever the run's length). On ``--resume``
these keep the saved run's values unless given again. ``--set FIELD=VALUE`` (repeatable) sets any
:class:`~rigel_core.train.TrainConfig` field, the value read as JSON (``--set densify_until=5000
--set grad_threshold=4e-4 --set init_box=[-1,-1,-1,1,1,1]``), else as a string; it wins over the other flags.

Ctrl-C finishes the current iteration, saves the checkpoint, the PLY and the metrics, then exits with status
130 (a second Ctrl-C aborts at once). Exit status 0 on success, 2 for bad arguments, an unreadable dataset, a
damaged checkpoint, an ``--out`` that cannot be written or one another ``rigel-train`` is using.

Before training starts nothing is written into ``RUN``: ``--out`` is checked for writability before the dataset
loads, a ``--resume`` checkpoint is validated completely (:func:`rigel_core.checkpoint.validate_checkpoint`),
and only then is ``RUN`` created, locked (``RUN/.lock``, ``fcntl.flock``, held until exit) and cleared of the
temporary files of interrupted atomic writes (:func:`rigel_core.atomic.remove_stale_temp_files`, logged).
"""
from __future__ import annotations

import argparse
import json
import logging
import math
import signal
import sys
import threading
import time
from pathlib import Path
from ..atomic import atomic_path, remove_stale_temp_files
from ..strict_json import finite_or_none as _finite_or_none

__all__ = ["main", "build_parser"]

CHECKPOINT_NAME = "checkpoint.safetensors"
LOCK_NAME = ".lock"
#: the files of RUN written through rigel_core.atomic (their stale temporaries are removed at start)
ATOMIC_NAMES = (CHECKPOINT_NAME, "model.ply", "metrics.json")
EXIT_INTERRUPTED = 130


def _out_problem(run_dir: Path) -> str | None:
    """Why ``run_dir`` cannot be used as a run directory (one line), or None: it (or, when it does not exist yet,
    its nearest existing ancestor) must be a directory this process may write into."""
    import os

    if run_dir.exists() or run_dir.is_symlink():
        if not run_dir.is_dir():
            return f"--out {run_dir}: exists and is not a directory"
        if not os.access(run_dir, os.W_OK | os.X_OK):
            return f"--out {run_dir}: directory is not writable"
        return None
    parent = run_dir.absolute().parent
    while not parent.exists():
        parent = parent.parent
    if not parent.is_dir():
        return f"--out {run_dir}: cannot be created, {parent} is not a directory"
    if not os.access(parent, os.W_OK | os.X_OK):
        return f"--out {run_dir}: cannot be created, {parent} is not writable"
    return None


class _RunLock:
    """An exclusive ``fcntl.flock`` on ``RUN/.lock`` held until :meth:`release` (or process exit): two
    ``rigel-train`` on one ``--out`` never interleave. The file is left in place (removing it would let a third
    process lock a new inode while a second still holds the old one)."""

    def __init__(self, run_dir: Path):
        self.path = run_dir / LOCK_NAME
        self.fd = None

    def try_existing(self) -> bool:
        """Lock the lock file if it exists already (writes nothing); False when another process holds it."""
        import os

        if self.fd is not None or not self.path.is_file():
            return True
        try:
            fd = os.open(self.path, os.O_RDONLY)
        except OSError:
            return True  # vanished or unreadable: acquire() decides
        return self._lock(fd)

    def acquire(self) -> bool:
        """Create (if needed) and lock the file; False when another process holds it."""
        import os

        if self.fd is not None:
            return True
        return self._lock(os.open(self.path, os.O_RDONLY | os.O_CREAT, 0o644))

    def _lock(self, fd) -> bool:
        import fcntl
        import os

        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            return False
        self.fd = fd
        return True

    def release(self) -> None:
        import os

        if self.fd is not None:
            os.close(self.fd)  # closing the descriptor releases the flock
            self.fd = None


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="rigel-train", description="Train a 3D Gaussian Splatting model.")
    p.add_argument("--data", required=True, help="dataset directory (Blender, instant-ngp or COLMAP)")
    p.add_argument("--out", required=True, help="run directory (created)")
    p.add_argument("--iters", type=int, default=None, help="total iterations (default 30000)")
    p.add_argument("--appearance", choices=["sh", "mlp"], default="sh",
                   help="colour model: spherical harmonics, or per-Gaussian latents decoded by a shared MLP "
                        "(model.ply is then baked to SH of --sh-degree; a resumed run keeps its own)")
    p.add_argument("--sh-degree", type=int, default=3, help="maximum SH degree (0..3)")
    p.add_argument("--white-bg", action="store_true", help="composite alpha onto white (NeRF-synthetic)")
    p.add_argument("--alpha-as-mask", action="store_true",
                   help="use the images' alpha channel as a mask (alpha 0 = pixel ignored) instead of compositing")
    p.add_argument("--downscale", type=float, default=1, help="divide image sizes by this")
    p.add_argument("--test-every", type=int, default=8, help="hold-out stride for instant-ngp / COLMAP data")
    p.add_argument("--max-gaussians", type=int, default=None, help="hard cap on the Gaussian count")
    p.add_argument("--init-points", type=int, default=None, help="random initial points without SfM points")
    p.add_argument("--exposure", action="store_true", default=None,
                   help="learn a per-training-image affine colour correction (held-out views are also scored by "
                        "fitting it on the left half and scoring the right half)")
    p.add_argument("--init-background", type=int, default=None, metavar="N",
                   help="add N background points behind the SfM points along training rays (default 0)")
    p.add_argument("--position-lr-max-steps", type=int, default=None, metavar="N",
                   help="iterations over which the position lr decays (default: --iters; 3DGS: 30000)")
    p.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE", dest="set_fields",
                   help="set a TrainConfig field (repeatable; VALUE read as JSON, else as a string), "
                        "e.g. --set densify_until=5000")
    p.add_argument("--eval-every", type=int, default=None, help="held-out evaluation interval (0 = only at the end)")
    p.add_argument("--checkpoint-every", type=int, default=5000, help="checkpoint interval (0 = only at the end)")
    p.add_argument("--log-every", type=int, default=10, help="loss-curve window in iterations")
    p.add_argument("--n-renders", type=int, default=3, help="held-out views saved as PNG at each evaluation")
    p.add_argument("--seed", type=int, default=None, help="random seed")
    p.add_argument("--resume", action="store_true", help=f"continue from RUN/{CHECKPOINT_NAME}")
    p.add_argument("--device", choices=["cuda", "cpu"], default=None, help="default: cuda when usable")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    return p


def _parse_set_fields(items: list[str]) -> dict:
    """``{field: value}`` of ``--set FIELD=VALUE`` arguments; ValueError naming a malformed item or an unknown
    field."""
    import dataclasses

    from ..train import TrainConfig

    names = {f.name for f in dataclasses.fields(TrainConfig)}
    out = {}
    for item in items:
        key, sep, raw = item.partition("=")
        key = key.strip()
        if not sep or not key:
            raise ValueError(f"--set {item!r}: expected FIELD=VALUE")
        if key not in names:
            raise ValueError(f"--set {item!r}: TrainConfig has no field {key!r}")
        try:
            value = json.loads(raw)
        except json.JSONDecodeError:
            value = raw
        out[key] = tuple(value) if isinstance(value, list) else value
    return out


def _write_json_atomic(path: Path, obj) -> None:
    obj = _finite_or_none(obj)
    with atomic_path(path) as tmp:
        with open(tmp, "w") as f:
            json.dump(obj, f, indent=1, allow_nan=False)


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


def _masked_pixels(frames) -> int:
    """Pixels that do not count (``Frame.mask`` False), summed over ``frames``."""
    n = 0
    for f in frames:
        m = getattr(f, "mask", None)
        if m is not None:
            n += int(m.numel() - int((m > 0.5).sum())) if m.is_floating_point() else int((~m).sum())
    return n


def _make_logger(run_dir: Path, progress) -> logging.Logger:
    log = logging.getLogger(f"rigel.train.{id(progress)}")
    for h in list(log.handlers):  # an id can come back in a later run of the same process: drop its handlers
        log.removeHandler(h)
        h.close()
    log.setLevel(logging.INFO)
    log.propagate = False
    fh = logging.FileHandler(run_dir / "log.txt")
    fh.setFormatter(logging.Formatter("%(asctime)s %(message)s", "%Y-%m-%d %H:%M:%S"))
    log.addHandler(fh)

    class _Console(logging.Handler):
        def emit(self, record):
            progress.write(self.format(record))

    log.addHandler(_Console())
    return log


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
    """Run ``rigel-train`` with ``argv`` (default ``sys.argv[1:]``); returns the exit status."""
    args = build_parser().parse_args(argv)
    lock = _RunLock(Path(args.out))
    try:
        return _main(args, lock)
    finally:
        lock.release()


def _busy(run_dir: Path) -> int:
    print(f"rigel-train: --out {run_dir}: another rigel-train is using this run directory ({LOCK_NAME} is locked)",
          file=sys.stderr)
    return 2


def _main(args, lock: _RunLock) -> int:
    import torch

    from .. import cuda_available
    from ..data import DatasetError, load_dataset
    from ..train import TrainConfig, Trainer

    run_dir = Path(args.out)
    ckpt = run_dir / CHECKPOINT_NAME
    problem = _out_problem(run_dir)  # before the dataset loads: a bad --out costs nothing
    if problem:
        print(f"rigel-train: {problem}", file=sys.stderr)
        return 2
    if not lock.try_existing():
        return _busy(run_dir)
    if ckpt.is_file() and not args.resume:
        print(f"rigel-train: {run_dir} already holds a run ({CHECKPOINT_NAME}); pass --resume to continue it, "
              "or choose another --out", file=sys.stderr)
        return 2
    if args.resume and not ckpt.is_file():
        print(f"rigel-train: --resume: no {CHECKPOINT_NAME} in {run_dir}; starting a new run", file=sys.stderr)
    device = args.device or ("cuda" if cuda_available() else "cpu")
    if device == "cuda" and not cuda_available():
        print("rigel-train: --device cuda asked, but no CUDA device or no built kernels (rigel_core._C)",
              file=sys.stderr)
        return 2
    overrides = {k: v for k, v in {"iterations": args.iters, "max_gaussians": args.max_gaussians,
                                   "eval_every": args.eval_every, "seed": args.seed,
                                   "init_points": args.init_points, "exposure": args.exposure,
                                   "init_background_points": args.init_background,
                                   "position_lr_max_steps": args.position_lr_max_steps}.items() if v is not None}
    try:
        overrides.update(_parse_set_fields(args.set_fields))
    except ValueError as e:
        print(f"rigel-train: {e}", file=sys.stderr)
        return 2
    resume_cfg = None
    if args.resume and ckpt.is_file():  # validated completely before the dataset loads and anything is written
        from ..checkpoint import CheckpointError, read_checkpoint, validate_checkpoint

        try:
            tensors, meta = read_checkpoint(ckpt)
            saved = validate_checkpoint(ckpt, tensors, meta).to_dict()
            saved.update(overrides)
            cfg = TrainConfig.from_dict(saved)
            cfg.validate()
        except CheckpointError as e:
            print(f"rigel-train: {e}", file=sys.stderr)
            return 2
        except ValueError as e:
            print(f"rigel-train: {ckpt}: config with the command line's overrides: {e}", file=sys.stderr)
            return 2
        resume_cfg = cfg
    t_start = time.perf_counter()
    try:
        ds = load_dataset(args.data, white_bg=args.white_bg, downscale=args.downscale, test_every=args.test_every,
                          alpha_as_mask=args.alpha_as_mask)
    except (DatasetError, ValueError, FileNotFoundError, ImportError) as e:
        print(f"rigel-train: {e}", file=sys.stderr)
        return 2
    t_loaded = time.perf_counter()

    metrics_path = run_dir / "metrics.json"
    metrics = None
    try:
        if resume_cfg is not None:
            trainer = Trainer.from_checkpoint(ckpt, ds, device=device, config=resume_cfg)
            if metrics_path.is_file():
                try:
                    metrics = json.loads(metrics_path.read_text())
                except (OSError, ValueError):
                    metrics = None
                # a damaged metrics.json starts afresh (the checkpoint holds the training state)
                if not (isinstance(metrics, dict) and isinstance(metrics.get("timings"), dict)
                        and all(isinstance(metrics.get(k), list) for k in ("train", "eval", "densify"))
                        and isinstance(metrics.get("resumed_at", []), list)):
                    metrics = None
        else:
            cfg = TrainConfig(**{"sh_degree": args.sh_degree, "appearance": args.appearance, **overrides})
            trainer = Trainer(ds, cfg, device=device)
    except (ValueError, TypeError) as e:  # TypeError: a --set value of the wrong type
        if isinstance(e, TypeError) and not args.set_fields:
            raise
        print(f"rigel-train: {e}", file=sys.stderr)
        return 2
    # only now: a run that cannot start leaves nothing behind (no directory, no log, no lock file)
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        if not lock.acquire():
            return _busy(run_dir)
        stale = remove_stale_temp_files(run_dir, ATOMIC_NAMES)
    except OSError as e:
        print(f"rigel-train: --out {run_dir}: {e.strerror or e}", file=sys.stderr)
        return 2
    t_init = time.perf_counter()
    cfg = trainer.config
    if metrics is None:
        metrics = {"train": [], "eval": [], "densify": [], "timings": {}, "resumed_at": []}
    if resume_cfg is not None:
        metrics.setdefault("resumed_at", []).append(trainer.iteration)
    metrics.update({"data": str(args.data), "device": device, "config": cfg.to_dict(),
                    "dataset": {"train_views": len(ds.train), "test_views": len(ds.test),
                                "scene_extent": trainer.extent, "white_bg": trainer.white_bg,
                                "resolution": [ds.train[0].camera.width, ds.train[0].camera.height],
                                "masked_pixels": {"train": _masked_pixels(ds.train), "test": _masked_pixels(ds.test)},
                                "masked_views": {"train": sum(f.mask is not None for f in ds.train),
                                                 "test": sum(f.mask is not None for f in ds.test)}}})

    progress = _Progress(cfg.iterations, trainer.iteration, not args.quiet)
    log = _make_logger(run_dir, progress)
    log.info(f"data {args.data}: {len(ds.train)} train / {len(ds.test)} test views, "
             f"{ds.train[0].camera.width}x{ds.train[0].camera.height}, extent {trainer.extent:.3f}, "
             f"{'white' if trainer.white_bg else 'black'} background"
             + (f", {metrics['dataset']['masked_views']['train']} train views with masked pixels "
                f"({metrics['dataset']['masked_pixels']['train']} pixels ignored)"
                if metrics['dataset']['masked_views']['train'] else ""))
    if stale:
        log.info(f"removed {len(stale)} stale temporary file(s) of interrupted writes: "
                 + ", ".join(p.name for p in stale))
    log.info(f"{'resumed at iteration ' + str(trainer.iteration) if trainer.iteration else 'start'}: "
             f"{trainer.model.num_gaussians} Gaussians, device {device}, {cfg.iterations} iterations")
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()

    # Ctrl-C: finish the current iteration, then save (a second one aborts at once).
    stop = threading.Event()
    old_handler = None
    if threading.current_thread() is threading.main_thread():
        def _on_sigint(signum, frame):
            if stop.is_set():
                raise KeyboardInterrupt
            stop.set()

        old_handler = signal.signal(signal.SIGINT, _on_sigint)

    timings = metrics["timings"]
    total_before = float(timings.get("total_s", 0.0))  # earlier sessions of a resumed run
    timings["load_s"] = t_loaded - t_start
    timings["init_s"] = t_init - t_loaded
    train_s = float(timings.get("train_s", 0.0))
    eval_s = float(timings.get("eval_s", 0.0))
    window = []

    def save_all(reason: str) -> None:
        t0 = time.perf_counter()
        trainer.save_checkpoint(ckpt)
        try:
            rmse = trainer.export_ply(run_dir / "model.ply")
            if trainer.model.appearance is not None:   # other tools cannot run the MLP: the PLY holds SH
                metrics["ply_bake_rmse"] = rmse
                log.info(f"[{trainer.iteration}] model.ply: the MLP appearance baked into SH degree "
                         f"{trainer.config.sh_degree}, RMSE {rmse:.4f} (colour units, 128 view directions)")
        except ImportError as e:  # rigel_core.io missing: keep the checkpoint
            log.info(f"model.ply not written ({e})")
        if trainer.exposure is not None:
            names = [f.name for f in trainer.train_frames]
            _write_json_atomic(run_dir / "exposure.json", trainer.exposure.to_dict(names))
        log.info(f"[{trainer.iteration}] {reason}: checkpoint and model.ply written "
                 f"({trainer.model.num_gaussians} Gaussians, {time.perf_counter() - t0:.1f} s)")

    def write_metrics() -> None:
        timings.update(train_s=train_s, eval_s=eval_s, total_s=total_before + time.perf_counter() - t_start,
                       ms_per_iter=1e3 * train_s / max(1, trainer.iteration))
        metrics.update(iterations_done=trainer.iteration, num_gaussians=trainer.model.num_gaussians,
                       nan_skips=trainer.nan_skips)
        if device == "cuda":
            metrics["peak_gpu_memory_bytes"] = int(torch.cuda.max_memory_allocated())
        _write_json_atomic(metrics_path, metrics)

    def on_eval(ev) -> None:
        nonlocal eval_s
        eval_s += ev.seconds
        metrics["eval"].append({k: v for k, v in ev.to_dict().items()})
        log.info(f"[{ev.iteration}] test psnr {ev.psnr:.2f}  ssim {ev.ssim:.4f}  gaussians {ev.num_gaussians}  "
                 f"({ev.n_views} views, {ev.seconds:.1f} s)"
                 + (f"; exposure protocol (right halves) psnr {ev.psnr_exposure:.2f} ssim {ev.ssim_exposure:.4f}"
                    if ev.psnr_exposure is not None else ""))
        out_dir = run_dir / "renders" / f"it{ev.iteration:06d}"
        out_dir.mkdir(parents=True, exist_ok=True)
        for f in trainer.test_frames[:max(0, args.n_renders)]:
            _save_png(out_dir / f"{f.name}_pred.png", trainer.render_frame(f))
            _save_png(out_dir / f"{f.name}_gt.png", f.image, getattr(f, "mask", None))
        write_metrics()

    status = 0
    try:
        while trainer.iteration < cfg.iterations:
            if stop.is_set():
                raise KeyboardInterrupt
            r = trainer.step()
            train_s += r.seconds - (r.eval.seconds if r.eval else 0.0)
            window.append(r)
            if r.densify:
                d = r.densify
                metrics["densify"].append(d.to_dict())
                log.info(f"[{d.iteration}] densify clone {d.n_clone} split {d.n_split} prune {d.n_prune} "
                         f"-> {d.n_after}{' (capped)' if d.capped else ''}")
            if r.opacity_reset:
                log.info(f"[{r.iteration}] opacity reset")
            if len(window) >= args.log_every or trainer.iteration == cfg.iterations:
                # the step values are read here, once per window (reading them waits for the device)
                for w in window:
                    if w.skipped:
                        log.info(f"[{w.iteration}] non-finite loss or gradient: update skipped "
                                 f"({w.nan_skips} so far)")
                fin = [w for w in window if not w.skipped]
                mean = lambda xs: float(sum(xs) / len(xs)) if xs else math.nan
                entry = {"iteration": r.iteration, "loss": mean([w.loss for w in fin]),
                         "psnr": mean([w.psnr for w in fin]), "num_gaussians": r.num_gaussians,
                         "ms_per_iter": 1e3 * mean([w.seconds - (w.eval.seconds if w.eval else 0) for w in window])}
                metrics["train"].append(entry)
                progress.update(len(window), f"loss {entry['loss']:.4f} psnr {entry['psnr']:.2f} "
                                             f"N {r.num_gaussians}")
                window = []
            if r.eval:
                on_eval(r.eval)
            if args.checkpoint_every and trainer.iteration % args.checkpoint_every == 0 \
                    and trainer.iteration < cfg.iterations:
                save_all("periodic")
                write_metrics()
        progress.update(len(window))
        if not trainer.eval_history or trainer.eval_history[-1].iteration != trainer.iteration:
            ev = trainer.evaluate()
            if ev is not None:
                on_eval(ev)
        save_all("done")
        final = trainer.eval_history[-1] if trainer.eval_history else None
        log.info(f"final: {trainer.iteration} iterations, {trainer.model.num_gaussians} Gaussians"
                 + (f", test psnr {final.psnr:.2f} ssim {final.ssim:.4f}" if final else "")
                 + f", {train_s:.1f} s training, {trainer.nan_skips} skipped steps")
    except KeyboardInterrupt:
        status = EXIT_INTERRUPTED
        trainer.optimizer.zero_grad(set_to_none=True)
        if trainer.is_consistent():
            save_all("interrupted")
        else:
            log.info(f"[{trainer.iteration}] interrupted mid-update: state inconsistent, checkpoint not written")
    finally:
        if old_handler is not None:
            signal.signal(signal.SIGINT, old_handler)
        write_metrics()
        progress.close()
        for h in list(log.handlers):
            log.removeHandler(h)
            h.close()
    return status


if __name__ == "__main__":
    sys.exit(main())
