"""Where a real training run's time goes: ``Trainer.step()`` on a capture, after ``--warm`` steps, with the
CUDA-graph step and without it (issue 14: beer trains at 2.8 ms per iteration where bench/train_step.py's
160k-Gaussian 1080p row takes 2.0 ms).

    python bench/profile_trainer.py --data ../shared/data/real/beer --warm 2000 --steps 300 [--set KEY=VALUE ...]
    python bench/profile_trainer.py --data .data/real/bonsai~nosfm --iters 7000 --warm 6990 --steps 0 \
        --profile 0 --modes graph --timeline 500      # where a whole 7k run's time goes, window by window

``--data`` takes bench/real.py's derived captures too (``DIR~nosfm``, ``~halfviews``, ...).

Per mode (graph, eager) it prints: ms per step over ``--steps`` back-to-back steps (one synchronize at each end;
densification and the strategy run as in training), the host's own time per step (perf_counter around
``step()`` alone, no synchronize; with the graph step also without the time it blocked on replays in flight,
``GraphStep.wait_s``: when the host's own time is close to the ms per step, the host is the limit), and
torch.profiler's top ops by self GPU and self CPU time over ``--profile`` steps. ``--out DIR`` also writes the
text there (profile_trainer.txt). Needs a CUDA device.
"""
from __future__ import annotations

import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench.real import BenchError, apply_variants, parse_overrides, rigel_config, split_variants  # noqa: E402
from bench.train_step import profile  # noqa: E402
from rigel_core.cli.common import Parser, downscale_arg, path_arg, whole_number_arg  # noqa: E402
from rigel_core.data import load_dataset  # noqa: E402
from rigel_core.train.trainer import Trainer  # noqa: E402


def timeline_line(trainer, iteration: int, seconds_per_step: float) -> str:
    """One ``--timeline`` line: the window's ms per step (synchronized at both ends, so a window's densification and
    graph captures count in it), the Gaussians, the coarse-to-fine factor of the images now, the graph's captures and
    overflows so far."""
    from rigel_core.train.config import training_downscale

    gs = trainer.graph_step
    graph = "" if gs is None else f"  captures {gs.captures}  overflows {gs.overflows}"
    return (f"  it {iteration:>6}  {1e3 * seconds_per_step:7.3f} ms/it  N {trainer.model.num_gaussians:>9,}  "
            f"1/{training_downscale(trainer.config, iteration)}{graph}")


def measure(ds, cfg, args, label: str) -> str:
    torch.manual_seed(cfg.seed)
    trainer = Trainer(ds, cfg, device=torch.device("cuda"))
    t0 = time.perf_counter()
    tw, iw = t0, 0
    for i in range(args.warm):
        trainer.step()
        if args.timeline and ((i + 1) % args.timeline == 0 or i + 1 == args.warm):
            torch.cuda.synchronize()
            now = time.perf_counter()
            print(timeline_line(trainer, i + 1, (now - tw) / (i + 1 - iw)), flush=True)
            tw, iw = now, i + 1
    torch.cuda.synchronize()
    warm_s = time.perf_counter() - t0
    host = 0.0
    gs = trainer.graph_step
    wait0 = gs.wait_s if gs is not None else 0.0
    t0 = time.perf_counter()
    for _ in range(args.steps):
        h = time.perf_counter()
        trainer.step()
        host += time.perf_counter() - h
    torch.cuda.synchronize()
    wall = time.perf_counter() - t0
    own = "" if gs is None else f" (own work {1e3 * (host - (gs.wait_s - wait0)) / max(args.steps, 1):.3f})"
    lines = [f"## {label}: {args.warm} warm-up steps in {warm_s:.2f} s ({1e3 * warm_s / max(args.warm, 1):.3f} ms/it); "
             f"then {args.steps} steps: {1e3 * wall / max(args.steps, 1):.3f} ms/it, "
             f"host {1e3 * host / max(args.steps, 1):.3f}{own} ms/it; "
             f"N {trainer.model.num_gaussians:,}; iteration {trainer.iteration}"
             + ("" if gs is None else f"; graph: {gs.captures} captures, {gs.replays} replays, {gs.overflows} overflows"
                + (f", off: {gs.disabled}" if gs.disabled else ""))]
    if args.profile:
        lines.append(profile(trainer.step, args.profile, label))
    del trainer
    torch.cuda.empty_cache()
    return "\n".join(lines)


def main(argv=None) -> int:
    # rigel's parser: a bad value is one line naming its flag (argparse's own printed its usage block first)
    ap = Parser(prog="profile_trainer.py", description=__doc__.split("\n\n")[0],
                                 epilog="Example: python bench/profile_trainer.py --data ../shared/data/real/beer "
                                        "--warm 2000 --modes graph --profile 20")
    ap.add_argument("--data", required=True, type=path_arg, help="a dataset folder rigel_core.data.load_dataset reads")
    ap.add_argument("--warm", type=whole_number_arg("no warm-up"), default=2000,
                    help="steps before measuring (densification under way)")
    ap.add_argument("--steps", type=whole_number_arg("none timed"), default=300,
                    help="steps timed back to back after the warm-up")
    ap.add_argument("--profile", type=whole_number_arg("none"), default=50,
                    help="steps under torch.profiler after those (0: none)")
    ap.add_argument("--modes", default="graph,eager",
                    help="comma-separated: graph (the CUDA-graph step) and/or eager; one fresh run each")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="a TrainConfig override")
    ap.add_argument("--downscale", type=downscale_arg, default=1.0, help="image downscale factor, as rigel-train's")
    ap.add_argument("--out", type=Path, default=None, help="folder for profile_trainer.txt (created)")
    ap.add_argument("--timeline", type=whole_number_arg("none"), default=0, metavar="K",
                    help="during the warm-up, a line every K steps: ms per step over the window, Gaussians, the "
                         "coarse-to-fine factor, graph captures and overflows (0: none)")
    ap.add_argument("--iters", type=whole_number_arg("the steps taken"), default=0,
                    help="the run's length as configured (schedules, coarse-to-fine span), at least the steps "
                         "taken (--warm + --steps + --profile + 10); default those")
    args = ap.parse_args(argv)
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    bad = [m for m in modes if m not in ("graph", "eager")]
    if bad or not modes:
        print(f"profile_trainer.py: --modes {args.modes!r}: give graph and/or eager", file=sys.stderr)
        return 2
    try:
        base, variants = split_variants(str(args.data), "--data")
    except BenchError as e:
        print(f"profile_trainer.py: {e}", file=sys.stderr)
        return 2
    if not Path(base).exists():
        print(f"profile_trainer.py: --data {base}: no such file or directory", file=sys.stderr)
        return 2
    taken = args.warm + args.steps + args.profile + 10   # the steps each mode's run takes
    if 0 < args.iters < taken:   # (a run configured shorter than its steps: it was raised to them without a word)
        print(f"profile_trainer.py: --iters {args.iters} is below the {taken} steps the run takes (--warm "
              f"{args.warm} + --steps {args.steps} + --profile {args.profile} + 10): give --iters {taken} or more, "
              "or fewer steps", file=sys.stderr)
        return 2
    try:
        overrides = parse_overrides(args.set, "--set")
    except BenchError as e:  # one line naming the item
        print(f"profile_trainer.py: {e}", file=sys.stderr)
        return 2
    if not torch.cuda.is_available():
        print("profile_trainer.py: needs a CUDA device", file=sys.stderr)
        return 2
    ds = load_dataset(base, downscale=args.downscale * (2 if "halfres" in variants else 1))
    apply_variants(ds, variants)
    text = [f"# Trainer.step() on {args.data} ({torch.cuda.get_device_name()}, torch {torch.__version__})"]
    for mode in modes:
        cfg = rigel_config(args.iters or taken, 0, {**overrides, "cuda_graph": mode == "graph"})
        text.append(measure(ds, cfg, args, mode))
        print(text[-1], flush=True)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "profile_trainer.txt").write_text("\n".join(text) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
