"""What ``rigel-train`` and ``rigel-viewer --data`` share: the training flags, and building a
:class:`~rigel_core.train.Trainer` from them (new, or resumed from a run folder's checkpoint).

Both commands call :func:`add_training_args` on their parser, :func:`resume_config` before the dataset loads (a
damaged checkpoint costs nothing) and :func:`build_trainer` after; so a flag, its default and its meaning exist
once.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import re
import sys
import warnings
from pathlib import Path

from ..render_modes import RENDER_MODES
from ..run_dir import CHECKPOINT_NAME

__all__ = ["add_training_args", "config_overrides", "resume_config", "changed_settings_line", "build_trainer",
           "new_config", "load_training_data", "device_problem", "add_threads_arg", "max_threads", "threads_problem",
           "set_threads", "FLAG_FIELDS", "flag_words", "flag_dest", "limit_heap_retention", "HEAP_MMAP_THRESHOLD"]

#: the TrainConfig fields a flag of :func:`add_training_args` sets, and the flag (its argparse ``dest``: the name
#: without the dashes, ``-`` as ``_``): :func:`config_overrides` reads them, and :func:`flag_words` names a refused
#: value by the flag the user gave ("--iters must be > 0", not "TrainConfig.iterations must be > 0")
FLAG_FIELDS = {"iterations": "--iters", "max_gaussians": "--max-gaussians", "eval_every": "--eval-every",
               "seed": "--seed", "init_points": "--init-points", "exposure": "--exposure",
               "init_background_points": "--init-background", "position_lr_max_steps": "--position-lr-max-steps",
               "render_mode": "--render-mode", "strategy": "--strategy", "batch_size": "--batch-size",
               "pose_opt": "--pose-opt", "appearance_grid": "--appearance-grid", "schedule_scale": "--schedule-scale"}
#: the same for the settings a new run takes from flags and a resumed run keeps (:func:`new_config`,
#: :func:`kept_settings`)
KEPT_FLAGS = {"sh_degree": "--sh-degree", "appearance": "--appearance"}


def flag_dest(flag: str) -> str:
    """argparse's attribute name of ``flag`` ("--max-gaussians" → "max_gaussians")."""
    return flag.lstrip("-").replace("-", "_")


def flag_words(message: str, args) -> str:
    """``message`` (a refusal of :class:`~rigel_core.train.TrainConfig`, which names its fields as
    ``TrainConfig.<field>``) with each field that the command line ``args`` set named as the user set it: by its
    flag (``--iters must be > 0, got -5``) or as ``--set <field>``. Fields the command line did not set keep their
    ``TrainConfig.`` name (a resumed checkpoint's value, a default)."""
    set_fields = {item.partition("=")[0].strip() for item in getattr(args, "set_fields", None) or ()}
    flags = {**FLAG_FIELDS, **KEPT_FLAGS}

    def named(m):
        field, rest = m.group(1), m.group(2) or ""
        if field in set_fields:   # --set wins over the flags (config_overrides)
            return f"--set {field}{rest}"
        flag = flags.get(field)
        if flag is not None and getattr(args, flag_dest(flag), None) is not None:
            return flag + rest.replace(" or None", "")   # a flag's None is its absence: not a value to give
        return m.group(0)

    return re.sub(r"TrainConfig\.(\w+)( must be [^,]*)?", named, message)


def add_training_args(p, *, data_required: bool = True, skip=()) -> list:
    """The dataset and :class:`~rigel_core.train.TrainConfig` flags (``--data`` … ``--resume``) on parser or
    argument group ``p``, but those in ``skip`` (a caller's own flag of that name). Returns the argparse actions
    added (each with its ``option_strings``, ``dest`` and ``default``)."""
    added: list[argparse.Action] = []

    def add(flag, **kw):
        if flag not in skip:
            added.append(p.add_argument(flag, **kw))

    add("--data", required=data_required, type=path_arg,
        help="dataset directory (Blender, instant-ngp or COLMAP)")
    add("--iters", type=int, default=None, help="total iterations (default 30000)")
    add("--schedule-scale", type=float, default=None, metavar="S",
        help="the 30k schedule compressed (S < 1) or stretched: densification's start, end and interval, the "
             "opacity reset's and SH degree's intervals and the coarse levels' span × S, and --iters 30000 × S "
             "unless given (lego: 0.7 gives 35.9 dB in 0.74x the 30k run's time); new runs only")
    add("--appearance", choices=["sh", "mlp"], default=None,
        help="colour model: spherical harmonics, or per-Gaussian latents decoded by a shared MLP "
             "(model.ply is then baked to SH of --sh-degree; a resumed run keeps its own)")
    add("--sh-degree", type=int, default=None, help="maximum SH degree (0..3; default 3; a resumed run keeps its own)")
    add("--white-bg", action="store_true", help="composite alpha onto white (NeRF-synthetic)")
    add("--alpha-as-mask", action="store_true",
        help="use the images' alpha channel as a mask (alpha 0 = pixel ignored) instead of compositing")
    add("--downscale", type=downscale_arg, default=None,
        help="divide image sizes by this (a finite number ≥ 1; default 1; a resumed run: the factor it was trained at)")
    add("--test-every", type=test_every_arg, default=8,
        help="hold out every Nth view of instant-ngp / COLMAP data (0: none)")
    # streamed frames (issue 37; rigel_core/data/stream.py)
    add("--frame-cache-mb", type=whole_number_arg("keep no decoded frame"), default=None, metavar="MB",
        help="host memory for decoded images (MiB; default: the whole capture when it takes at most a quarter "
             "of the available memory, else 512): images are read from disk when trained, a few ahead, never all "
             "at once on the GPU")
    add("--preload-frames", action="store_true",
        help="decode every image onto the training device before the first step instead of streaming them")
    add("--max-gaussians", type=int, default=None,
        help="the Gaussian budget: the count the mcmc strategy grows to, a larger start trimmed to it (also when "
             "auto picks mcmc: then N instead of the automatic budget); under --strategy default only a bound on "
             "growth (densification adds none past N; a start above N is kept)")
    add("--init-points", type=int, default=None, help="random initial points without SfM points")
    add("--exposure", action="store_true", default=None,
        help="learn a per-training-image affine colour correction (held-out views are also scored by "
             "fitting it on the left half and scoring the right half)")
    add("--pose-opt", action="store_true", default=None,
        help="refine each training camera's pose with the scene (refined poses in RUN/transforms.json; held-out "
             "views are also scored after fitting their pose with the scene frozen)")
    add("--appearance-grid", action="store_true", default=None,
        help="learn a per-training-image bilateral grid of colour transforms (vignetting, tone curves; held-out "
             "views are also scored by the exposure protocol)")
    add("--init-background", type=background_count, default=None, metavar="N|auto",
        help="add N background points behind the SfM points along training rays; auto (the default): 20000 "
             "when the SfM points reach under half of the median training view (and --strategy auto then "
             "picks 3DGS's densification), else 0; 0 turns them off")
    add("--position-lr-max-steps", type=int, default=None, metavar="N",
        help="iterations over which the position lr decays (default: --iters; 3DGS: 30000)")
    # anti-aliased render mode and the Gaussian budget (issue 17)
    add("--render-mode", choices=list(RENDER_MODES), default=None,
        help="mip: anti-aliased training and rendering (Mip-Splatting's 3D smoothing and 2D Mip filters; "
             "model.ply says 'SplatRenderMode: mip'); default: 3DGS's 0.3 px² dilation")
    add("--strategy", choices=["auto", "default", "mcmc"], default=None,
        help="densification: 3DGS clone/split/prune (default) or the 3DGS-MCMC budget (mcmc: relocation "
             "of dead Gaussians, growth to --max-gaussians or, without it, to the budget auto would give, position "
             "noise, regularisers); "
             "auto (the default): default for an object on a transparent background without SfM points (a "
             "synthetic render) and for a partial SfM with background points added and >= 100 views; mcmc for "
             "every other capture, with --max-gaussians as its budget (without it: one Gaussian per 32 training "
             "pixels, 10k to 1M); the log says which and why")
    # batches (issue 16; --gpus is rigel-train's own)
    add("--batch-size", type=int, default=None, metavar="B",
        help="views per step and process (global batch = N x B; default 1)")
    add("--set", action="append", default=[], metavar="FIELD=VALUE", dest="set_fields",
        help="set a TrainConfig field (repeatable; VALUE read as JSON, else as a string), "
             "e.g. --set densify_until=5000; the fields, their defaults and what was measured: the repository's "
             "docs/TRAINING.md")
    add("--eval-every", type=whole_number_arg("only at the end"), default=None,
        help="held-out evaluation interval (0 = only at the end)")
    add("--seed", type=int, default=None, help="random seed")
    add("--resume", action="store_true", help=f"continue from RUN/{CHECKPOINT_NAME}")
    return added


def max_threads() -> int:
    """The most ``--threads`` accepted: 4 × ``os.cpu_count()`` (more only oversubscribes; far more crashes
    ``torch.set_num_threads``)."""
    return 4 * (os.cpu_count() or 1)


def add_threads_arg(p) -> None:
    """``--threads N`` (PyTorch's CPU threads) on parser ``p``: rigel-train's and rigel-viewer's, one flag, one
    bound (:func:`threads_problem`)."""
    p.add_argument("--threads", type=int, default=None,
                   help="PyTorch CPU threads, at most 4 x the CPUs (default: PyTorch's choice, one per core; 1 is "
                        "often fastest on a busy machine, and two CPU runs at once each need a share of the cores)")


def threads_problem(threads: int | None) -> str | None:
    """Why ``--threads`` cannot be used (one line naming the flag and its bounds), or None (also when not given)."""
    if threads is not None and not 1 <= threads <= max_threads():
        return f"--threads must be in [1, {max_threads()}] (4 x the {os.cpu_count() or 1} CPUs), got {threads}"
    return None


def set_threads(threads: int | None) -> None:
    """``--threads``: ``torch.set_num_threads`` (imports torch), nothing when not given."""
    if threads is not None:
        import torch

        torch.set_num_threads(threads)


#: host allocations at least this large get a mapping of their own, given back to the OS when freed
#: (:func:`limit_heap_retention`); above the CPU rasterizer's per-chunk tensors (2 MiB in float32), below an
#: 800×800 float32 image (7.7 MB)
HEAP_MMAP_THRESHOLD = 4 << 20


def limit_heap_retention(threshold: int = HEAP_MMAP_THRESHOLD) -> bool:
    """Fix glibc's mmap threshold at ``threshold`` bytes, so that freed image-sized blocks go back to the OS; True
    when set (Linux with glibc), False and nothing done elsewhere. The training commands call it at start.

    glibc serves an allocation from its heap unless it is above the mmap threshold, and raises that threshold to the
    size of every mapped block freed (up to 32 MiB): after the first, a run's image-sized temporaries (a frame's
    float finishing, the SSIM's maps, the renderer's outputs) are served from the heap, where the long-lived blocks
    allocated between them (cached frames, parameters) keep the freed space from being given back. A 3-step CPU run
    on 300 views of 800×800 kept 0.3 GB of such space (docs/TRAINING.md, "Streaming frames"). Setting the threshold
    (``mallopt(M_MMAP_THRESHOLD)``) also stops its raising. No value computed changes."""
    import ctypes

    try:
        libc = ctypes.CDLL(None)
        if not hasattr(libc, "gnu_get_libc_version"):   # musl, macOS: another allocator, other rules
            return False
        return bool(libc.mallopt(-3, int(threshold)))   # M_MMAP_THRESHOLD (malloc.h)
    except (OSError, AttributeError):
        return False


class Parser(argparse.ArgumentParser):
    """The commands' argument parser: a bad flag or value is one line, ``PROG: error: …``, exit status 2, as every
    other refusal of theirs (argparse's default prints its whole usage block first)."""

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {message} (--help lists the options)\n")


def downscale_arg(text: str) -> float:
    """``--downscale``: a finite number ≥ 1 (NaN was "cannot convert float NaN to integer" without the flag's name;
    inf trained on 1x1 images)."""
    try:
        v = float(text)
    except ValueError:
        v = math.nan
    if not (math.isfinite(v) and v >= 1.0):
        raise argparse.ArgumentTypeError(f"expected a finite number ≥ 1, got {text[:40]!r}")
    return v


def whole_number_arg(zero: str):
    """An argparse type: a whole number ≥ 0 (``zero`` says what 0 means, for the error line); argparse's one-line
    error, exit 2, otherwise (a negative count was taken silently)."""
    def parse(text: str) -> int:
        try:
            n = int(text)
        except ValueError:
            n = -1
        if n < 0:
            raise argparse.ArgumentTypeError(f"expected a whole number ≥ 0 (0: {zero}), got {text[:40]!r}")
        return n

    return parse


def test_every_arg(text: str) -> int:
    """``--test-every``: a whole number ≥ 0 (0 holds no view out), not 1 (which would hold out every view)."""
    n = whole_number_arg("no held-out views")(text)
    if n == 1:
        raise argparse.ArgumentTypeError("1 would hold out every view and leave none to train on: give 0 (no "
                                         "held-out views) or N ≥ 2 (every Nth view)")
    return n


def path_arg(text: str) -> Path:
    """A path argument that is not empty: ``--out ""`` (an unset shell variable) would otherwise mean the current
    directory and write a run, renders or a dataset there. argparse's one-line error for an empty one."""
    if not text.strip():
        raise argparse.ArgumentTypeError("an empty path (an unset shell variable?)")
    return Path(text)


def background_count(text: str):
    """``--init-background``'s value: "auto", or a count ≥ 0 (an int); argparse's one-line error otherwise."""
    t = text.strip()
    if t.lower() == "auto":
        return "auto"
    try:
        n = int(t)
    except ValueError:
        n = -1
    from ..train.config import MAX_BACKGROUND_POINTS

    if not 0 <= n <= MAX_BACKGROUND_POINTS:
        raise argparse.ArgumentTypeError(f"expected a count in [0, {MAX_BACKGROUND_POINTS:,}] or 'auto', got "
                                         f"{text[:40]!r}")
    return n


@contextlib.contextmanager
def one_line_warnings(prog: str):
    """While inside: a warning (a scene file's, a dataset's) prints as one ``PROG: warning: …`` line on stderr
    instead of Python's report with the warning's source file, line and code (as rigel-viewer prints them)."""
    def one_line(message, category, filename, lineno, file=None, line=None):
        print(f"{prog}: warning: {message}", file=file or sys.stderr)

    shown = warnings.showwarning
    warnings.showwarning = one_line
    try:
        yield
    finally:
        warnings.showwarning = shown


@contextlib.contextmanager
def remembered_warnings(into: list, prefix: str = ""):
    """While inside: every warning shown (as before, e.g. by :func:`one_line_warnings`) also has its message,
    after ``prefix``, appended to ``into``: a dataset's warnings come before the run's ``log.txt`` exists, and are
    written there once it does (:func:`rigel_core.run_dir.log_to_file`)."""
    shown = warnings.showwarning

    def remember(message, category, filename, lineno, file=None, line=None):
        into.append(f"{prefix}{message}")
        shown(message, category, filename, lineno, file, line)

    warnings.showwarning = remember
    try:
        yield
    finally:
        warnings.showwarning = shown


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


def unread_settings_line(args: argparse.Namespace, cfg) -> str | None:
    """One line naming the ``--set`` fields the run's strategy never reads — the MCMC budget's ``mcmc_*`` when the
    run (``cfg``, its strategy resolved) densifies with 3DGS's clone / split / prune — or None. A setting that does
    nothing is said, not silently kept (the run still starts: the value is recorded with the config)."""
    unread = sorted(f for f in _parse_set_fields(getattr(args, "set_fields", None) or ()) if f.startswith("mcmc_"))
    if not unread or cfg.strategy == "mcmc":
        return None
    return (f"--set {', '.join(unread)}: not read by this run, which densifies with 3DGS's clone / split / prune "
            f"(strategy {cfg.strategy}); --strategy mcmc trains with the MCMC budget, which reads "
            + ("it" if len(unread) == 1 else "them"))


def config_overrides(args: argparse.Namespace) -> dict:
    """The TrainConfig fields the command line sets (absent flags leave the default, or a resumed run's value);
    ``--set`` wins. Raises ValueError for a bad ``--set``."""
    out = {field: v for field, flag in FLAG_FIELDS.items() if (v := getattr(args, flag_dest(flag))) is not None}
    out.update(_parse_set_fields(args.set_fields))
    # --schedule-scale S compresses the 30k schedule: the run's default length with it (an --iters given stays)
    scale = out.get("schedule_scale")
    if isinstance(scale, (int, float)) and "iterations" not in out and 0.0 < scale <= 100.0:
        from ..train import TrainConfig

        out["iterations"] = max(1, round(TrainConfig.iterations * scale))
    # --max-gaussians N (or --set max_gaussians=N) is also the budget when "auto" picks MCMC: N itself, not a bound
    # on the pixel rule's budget (an explicit --set auto_mcmc_budget / auto_budget_pixels_per_gaussian wins)
    if out.get("max_gaussians") is not None and out.get("strategy", "auto") == "auto" \
            and "auto_mcmc_budget" not in out:
        out["auto_mcmc_budget"] = out["max_gaussians"]
        out.setdefault("auto_budget_pixels_per_gaussian", 0)
    # --strategy mcmc without a budget: the one the pixel rule gives (the default max_gaussians, 3M, is a safety cap,
    # not a budget to grow to; resolve_strategy)
    if out.get("strategy") == "mcmc" and "max_gaussians" not in out:
        out["max_gaussians"] = None
    return out


#: TrainConfig fields read only where ``strategy = "auto"`` is resolved (when a run begins): a resumed run's change of
#: them changes nothing, and is neither applied nor listed (``--max-gaussians N`` implies both: config_overrides)
AUTO_STRATEGY_INPUTS = ("auto_mcmc_budget", "auto_budget_pixels_per_gaussian")


def new_run_problem(overrides: dict, args=None) -> str | None:
    """What keeps the command line's overrides (:func:`config_overrides`) from starting a *new* run, as one line
    without the command's name, or None: with the parsed ``args``, the whole configuration (:func:`new_config`) is
    checked, so that a bad ``--set`` value is refused before the dataset loads. A resumed run keeps its checkpoint's
    configuration, so this is not asked there."""
    if args is not None:
        try:
            new_config(args, overrides)
        except (ValueError, TypeError) as e:
            return flag_words(str(e), args)
    return None


def no_checkpoint_line(run_dir: Path) -> str:
    """What rigel-train and rigel-viewer say (stderr and log.txt) when ``--resume`` finds no checkpoint to continue
    and a new run starts in ``run_dir``."""
    from ..run_dir import CHECKPOINT_NAME

    return f"--resume: no {CHECKPOINT_NAME} in {run_dir}; starting a new run"


def kept_settings(args: argparse.Namespace) -> dict:
    """The settings a resumed run keeps from its checkpoint that the command line gave explicitly (``--sh-degree``,
    ``--appearance``; None where left out): :func:`resume_config` refuses one that differs."""
    return {"sh_degree": args.sh_degree, "appearance": args.appearance}


def resume_config(ckpt: Path, overrides: dict, changes: list | None = None, kept: dict | None = None, args=None):
    """The TrainConfig of the checkpoint ``ckpt`` with ``overrides``, validated completely before anything loads.
    Raises CheckpointError (naming the file and field) or ValueError (the overrides make it invalid, ask for
    fewer iterations than the checkpoint has done, or set ``schedule_scale``: new runs only). ``changes``, when
    given, receives one ``"key saved -> new"`` string per setting the overrides change (the command line prints
    them, so that no saved setting is replaced silently). ``kept`` (:func:`kept_settings`): settings the model's
    layout fixes; one given and unlike the checkpoint's raises ValueError (it was ignored without a word).
    ``args``, when given: the command line that made ``overrides``, whose flags the refusal of an invalid value
    names (:func:`flag_words`)."""
    from ..checkpoint import read_checkpoint, validate_checkpoint
    from ..train import TrainConfig

    tensors, meta = read_checkpoint(ckpt)
    saved = validate_checkpoint(ckpt, tensors, meta).to_dict()
    # any scale, 1 too: the saved counts are the scaled ones (another would scale them again), and the scale also
    # sets the run's length (config_overrides: 1 made a resumed run 30,000 iterations long)
    if "schedule_scale" in overrides:
        message = ("TrainConfig.schedule_scale applies to a new run (this run's schedule was fixed when it began); "
                   "leave it out to continue it, or give a new --out")
        raise ValueError(f"{ckpt}: {message if args is None else flag_words(message, args)}")
    if overrides.get("strategy") == "mcmc" and saved.get("strategy") != "mcmc" and "max_gaussians" not in overrides:
        # the saved max_gaussians was a cap for another strategy, not a budget chosen for this one: the pixel rule's
        overrides = {**overrides, "max_gaussians": None}
    elif overrides.get("strategy") == "default" and saved.get("strategy") == "mcmc" and "max_gaussians" not in overrides:
        # the saved max_gaussians was MCMC's budget, which it had reached: as 3DGS's cap it would stop all growth (a
        # new-user check found the switch growing nothing, unexplained); 3DGS's default cap instead, listed as changed
        overrides = {**overrides, "max_gaussians": TrainConfig.max_gaussians}
    elif saved.get("strategy") == "mcmc" and "max_gaussians" in overrides and overrides["max_gaussians"] is None:
        # --strategy mcmc again on an MCMC run (its command line repeated): the budget it chose stays
        overrides = {k: v for k, v in overrides.items() if k != "max_gaussians"}
    for k, v in (kept or {}).items():
        if v is not None and saved.get(k) != v:
            raise ValueError(f"{ckpt}: the run was trained with {k} {saved.get(k)!r}, which a resumed run keeps; "
                             f"--{k.replace('_', '-')} {v} needs a new --out")
    if overrides.get("strategy", saved.get("strategy")) != "auto":  # resolved when the run began: read no more
        overrides = {k: v for k, v in overrides.items() if k not in AUTO_STRATEGY_INPUTS}
    if changes is not None:
        # max_gaussians None: the budget the pixel rule gives when the Trainer starts (its note says how many)
        changes.extend(f"{k} {saved[k]!r} -> " + ("the pixel rule's budget" if k == "max_gaussians" and v is None
                                                  else repr(v))
                       for k, v in overrides.items() if k in saved and saved[k] != v)
    saved.update(overrides)
    cfg = TrainConfig.from_dict(saved)
    try:
        cfg.validate()
    except ValueError as e:
        raise ValueError(f"{ckpt}: config with the command line's overrides: "
                         f"{e if args is None else flag_words(str(e), args)}") from None
    done = int(meta["iteration"])
    if cfg.iterations < done:  # its next save would be a checkpoint every later --resume refuses
        raise ValueError(f"{ckpt}: --iters {cfg.iterations} is below the run's iteration {done}; give --iters "
                         f"{done} or more (or leave it out) to continue it")
    return cfg


def changed_settings_line(ckpt: Path, changes: list) -> str | None:
    """The line that says which saved settings of ``ckpt`` the command line changes (:func:`resume_config`'s
    ``changes``), without the command's name; None when it changes none."""
    return f"resuming {ckpt} with changed settings: {'; '.join(changes)}" if changes else None


def saved_downscale(run_dir: Path) -> float | None:
    """The ``--downscale`` factor the run in ``run_dir`` was trained at — its ``metrics.json``'s record, else its
    checkpoint's (a metrics.json deleted or damaged) — or None: no record (a run from before they were kept)."""
    from ..checkpoint import checkpoint_metadata
    from ..run_dir import CHECKPOINT_NAME, METRICS_NAME, read_metrics

    def factor(v):
        return float(v) if type(v) in (int, float) and math.isfinite(v) and v >= 1 else None

    path = Path(run_dir) / METRICS_NAME
    seen = ((read_metrics(path) if path.is_file() else None) or {}).get("dataset")
    found = factor(seen.get("downscale")) if isinstance(seen, dict) else None
    if found is None:
        found = factor((checkpoint_metadata(Path(run_dir) / CHECKPOINT_NAME) or {}).get("downscale"))
    return found


def resolve_downscale(args: argparse.Namespace, run_dir: Path, resuming: bool) -> tuple[str | None, str | None]:
    """Set ``args.downscale`` before the dataset loads and return ``(problem, note)``, one line each without the
    command's name, or None. A new run: the flag, or 1. ``resuming``: left out, the factor the run was trained at
    (:func:`saved_downscale`; 1 without a record), with a note when it is not 1; given and another, the problem (a
    run goes on at the images it was fitted to; the check after loading catches a run without a record)."""
    if not resuming:
        args.downscale = 1.0 if args.downscale is None else args.downscale
        return None, None
    saved = saved_downscale(run_dir)
    if args.downscale is None:
        args.downscale = saved if saved is not None else 1.0
        note = (f"--resume: at --downscale {args.downscale:g}, the factor {run_dir} was trained at"
                if args.downscale != 1 else None)
        return None, note
    given = float(args.downscale)
    if saved is not None and abs(given - saved) > 1e-9 * saved:   # the same factor written another way is the same
        return (f"--resume: {run_dir} was trained at --downscale {saved:.12g}, not {given:.12g} (leave --downscale "
                f"out to continue at {saved:.12g}, or train into a new --out)"), None
    return None, None


def resumed_data_problem(run_dir: Path, ds, data, downscale: float | None = None) -> str | None:
    """Why ``--resume`` must not continue the run in ``run_dir`` on dataset ``ds`` (loaded from ``data``), or None:
    the run's ``metrics.json`` (when missing or damaged there is nothing to compare) names the training views it was
    trained on — their number, resolution and scene extent (facts of the data, not of its path, so a moved dataset
    still resumes). Another dataset, or the same at another ``--downscale``, would train the model on images it was
    not fitted to and overwrite its model.ply."""
    from ..run_dir import METRICS_NAME, read_metrics

    path = Path(run_dir) / METRICS_NAME
    previous = read_metrics(path) if path.is_file() else None
    seen = (previous or {}).get("dataset")
    if not isinstance(seen, dict):
        return None
    res, n, ext = seen.get("resolution"), seen.get("train_views"), seen.get("scene_extent")
    if not (isinstance(n, int) and isinstance(res, list) and len(res) == 2 and all(isinstance(v, int) for v in res)
            and type(ext) in (int, float) and math.isfinite(ext)):
        return None   # an older or damaged record: nothing to compare
    train = list(ds.train)
    now = {"train_views": len(train), "resolution": [train[0].camera.width, train[0].camera.height],
           "scene_extent": float(ds.scene_extent or 1.0)}
    same = (n == now["train_views"] and res == now["resolution"]
            and abs(ext - now["scene_extent"]) <= 1e-6 * max(1.0, abs(now["scene_extent"])))
    if same:
        return None

    def facts(d):
        w, h = d["resolution"]
        return f"{d['train_views']} training views of {w}x{h}, extent {d['scene_extent']:.4g}"

    hint = ""
    if downscale is not None and n == now["train_views"] and res != now["resolution"] and res[0] > 0:
        # the same views at another size: the factor that gives the run's size (metrics.json had no record of it)
        hint = f"; its size is that of about --downscale {float(downscale) * now['resolution'][0] / res[0]:.3g}"
    return (f"was trained on {previous.get('data', 'another dataset')} ({facts(seen)}); --data {data} gives "
            f"{facts(now)}: another dataset, --downscale or --test-every (train it into a new --out){hint}")


def load_training_data(args: argparse.Namespace):
    """The dataset ``--data`` names, read with the dataset flags (``rigel_core.data.load_dataset``): streamed
    (``--frame-cache-mb``) unless ``--preload-frames``."""
    from ..data import load_dataset
    from ..io.errors import NoImageFiles
    from ..run_dir import CHECKPOINT_NAME, POSES_NAME

    try:
        return load_dataset(args.data, white_bg=args.white_bg, downscale=args.downscale or 1, test_every=args.test_every,
                            alpha_as_mask=args.alpha_as_mask, stream=not getattr(args, "preload_frames", False),
                            cache_mb=getattr(args, "frame_cache_mb", None))
    except NoImageFiles as e:   # a run folder given as --data: its transforms.json holds poses, not a capture
        folder = Path(args.data) if Path(args.data).is_dir() else Path(args.data).parent
        if (folder / CHECKPOINT_NAME).is_file() and (folder / POSES_NAME).is_file():
            raise NoImageFiles(f"--data {args.data}: a run's folder, not a capture: its {POSES_NAME} holds the "
                               "refined poses of the views it trained on, without images; give the capture it "
                               "trained on as --data (or this folder's transforms.json as --cameras)") from e
        raise


def build_trainer(args: argparse.Namespace, dataset, device: str, *, resume_cfg=None, ckpt: Path | None = None,
                  overrides: dict | None = None):
    """The Trainer: resumed from ``ckpt`` with ``resume_cfg`` (:func:`resume_config`) when given, else new with
    ``--sh-degree``, ``--appearance`` and the overrides (:func:`config_overrides`). Raises ValueError / TypeError
    (a ``--set`` value of the wrong type) for a configuration the trainer refuses, naming the flags the command
    line gave (:func:`flag_words`)."""
    from ..train import Trainer

    try:
        if resume_cfg is not None:
            return Trainer.from_checkpoint(ckpt, dataset, device=device, config=resume_cfg)
        overrides = config_overrides(args) if overrides is None else overrides
        return Trainer(dataset, new_config(args, overrides), device=device)
    except (ValueError, TypeError) as e:
        worded = flag_words(str(e), args)
        if type(e) not in (ValueError, TypeError) or worded == str(e):   # a DatasetError, …: as it was
            raise
        raise type(e)(worded) from None


def preload_problem(args) -> str | None:
    """The line refusing ``--preload-frames`` for a capture whose decoded frames cannot fit the host's available
    memory (:func:`rigel_core.train.memory.preload_problem`), read from the image headers alone (the load's warnings
    are said by the load that follows); None when they fit."""
    import warnings

    from ..train import memory

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        probe = load_training_data(argparse.Namespace(**{**vars(args), "preload_frames": False, "frame_cache_mb": 0}))
    return memory.preload_problem(probe.train + probe.test)


def memory_problem_of(ds, cfg, device, *, streamed: bool, n_gaussians: int | None = None) -> str | None:
    """The line refusing a run of ``cfg`` on ``ds`` whose Gaussian budget (``n_gaussians`` when given, else the
    config's) and images cannot fit ``device`` (the host's available memory on the CPU), or None
    (:func:`rigel_core.train.memory.memory_problem`; the estimate is a floor, so a run that could fit is never refused).
    Preloaded frames on the CPU are in host memory already: they are not counted again."""
    from ..train.memory import memory_problem, training_memory

    held = not streamed and not str(device).startswith("cuda")
    need = training_memory(ds.train, ds.test, cfg, streamed=streamed, n_gaussians=n_gaussians, held=held)
    return memory_problem(need, device, streamed=streamed)


def new_config(args, overrides: dict):
    """The TrainConfig of a new run: ``--sh-degree``, ``--appearance`` and the overrides
    (:func:`config_overrides`), validated. Raises ValueError / TypeError (a ``--set`` value of the wrong type), so
    a command can refuse it before its dataset loads."""
    from ..train import TrainConfig

    cfg = TrainConfig(**{"sh_degree": 3 if args.sh_degree is None else args.sh_degree,
                         "appearance": args.appearance or "sh", **overrides})
    cfg.validate()
    return cfg


def device_problem(device: str | None) -> str | None:
    """Why ``--device`` cannot render here (one line), or None: it must be ``cpu``, ``cuda`` or ``cuda:N``, and
    CUDA needs a visible GPU and the built kernels (``rigel_core._C``)."""
    if device is None:
        return None
    import torch

    from .. import cuda_available

    try:
        kind = torch.device(device).type
    except (RuntimeError, ValueError):
        kind = None
    if kind not in ("cpu", "cuda"):
        return f"--device {device!r}: expected cpu or cuda"
    if kind == "cuda" and not cuda_available():
        return f"--device {device}: no CUDA device or no built kernels (rigel_core._C); --device cpu runs on the CPU"
    return None
