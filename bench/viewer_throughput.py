"""Training throughput with the viewer open and presenting, against ``rigel-train`` alone (issue 15).

Issue 15's acceptance figure: on the H200, training throughput with the viewer open and presenting at 60 Hz is at
least 97 % of ``rigel-train``'s on the same data and iterations.

Protocol, per repeat (``--repeat R``: the pairs alternate A, B, A, B, …; each run a fresh process and run folder):

(a) ``python -m rigel_core.cli.train --data D --out RUN_A --iters N [--white-bg] --eval-every 0
    --checkpoint-every 0 --n-renders 0 --quiet [--device DEV] [TRAIN_ARGS]``;
(b) ``python -m viewer --data D [--white-bg] --offscreen --iters N --eval-every 0 --frames 2 --size WxH
    --fps F [--refresh-hz HZ] --out RUN_B [--device DEV] [TRAIN_ARGS]``: the viewer trains the same data in its
    thread while its frame loop renders the live model (panels included) into a 1280×720 offscreen target and
    presents at most ``--fps`` (default 60) frames per second; the training starts with that loop. With a still
    camera the viewer re-renders the live model and rebuilds its panels at most ``--refresh-hz`` times a second
    (its default, 10, unless ``--refresh-hz`` is given here) and presents the last frame again in between — or
    holds it, submitting nothing, when it is already the picture presented last (viewer/app.py); the viewer's line
    gives its renders, panel builds, repeats and held frames.

Both build the trainer from the same flags (``rigel_core.cli.common``: same configuration, same seed) and write
``metrics.json`` through ``rigel_core.run_dir.RunRecord``, whose ``timings`` are read here:

- ``loop_s``: the training loop's wall-clock seconds (first step to last, the device's work done: the loop ends on
  a read of the last step's values), held-out evaluations and saves excluded — the throughput figure,
  ``ms/it = 1000 · loop_s / N``; in the viewer it includes what its training thread does between steps
  (snapshots for the renderer, loss-curve reads) and whatever the frame loop costs the trainer (GPU time shared
  with the renders, the Python interpreter lock);
- ``train_s``: the sum of ``Trainer.step``'s own seconds (the step-time figure rigel-train has always logged).

``ratio`` = rigel-train time / viewer time (100 % = no slowdown); the issue's target is ratio ≥ 97 % on
``loop_s``. ``frames/s`` is the rate of the viewer's frame loop (``summary.json`` ``loop_fps``: presented and
held frames), ``presents/s`` the frames submitted to Vulkan (``fps``). The held-out
PSNR of both (one evaluation at the end, ``--eval-every 0``) shows they trained the same thing. The table has one
row per pair, then (R > 1) ``best`` (each side's fastest run) and ``mean``; the target line uses ``best``.

Outputs under ``--out`` (default ``$OUT``, else ``viewer-throughput-<UTC time>``; an existing
``viewer_throughput.json`` is never overwritten): ``viewer_throughput.md`` (the table, also printed),
``viewer_throughput.json`` (every run's timings, metrics and the viewer's summary), ``summary.txt`` (one line) and
``runs/<name>/`` with each run's ``metrics.json``, ``log.txt`` (and the viewer's ``summary.json``). The run folders
themselves (checkpoints, PLYs) live in a temporary folder removed at the end (``--keep-runs DIR`` keeps them there).
SIGINT (the device script's time limit) reaches the runs too: they save and stop; what finished is still written.

On the GPU machine (``--ui`` packages): ``python bench/viewer_throughput.py --repeat 2`` (default data
``$RIGEL_SHARED_DATA/lego_half``, 7000 iterations), or the ``device_all.sh`` job ``vtp[:DATA[:ITERS[:TIMEOUT]]]``.
CPU check (tiny, lavapipe): ``python bench/viewer_throughput.py --device cpu --data DIR --iters 20 --size 64x48
--threads 1 --train-args "--init-points 200 --sh-degree 1"``.
"""
from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from rigel_core.atomic import atomic_path  # noqa: E402
from bench_common import commit  # noqa: E402  (bench/ is on sys.path: run as python bench/X.py)

TARGET = 0.97   # issue 15: viewer throughput / rigel-train throughput


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    shared = os.environ.get("RIGEL_SHARED_DATA", str(ROOT.parent / "shared" / "data"))
    ap.add_argument("--data", type=Path, default=Path(shared) / "lego_half",
                    help="dataset folder (default: $RIGEL_SHARED_DATA/lego_half)")
    ap.add_argument("--iters", type=int, default=7000, help="training iterations of each run (default 7000)")
    ap.add_argument("--repeat", type=int, default=1, help="pairs of runs, alternating rigel-train / viewer")
    ap.add_argument("--fps", type=float, default=60.0, help="the viewer's present rate cap (default 60)")
    ap.add_argument("--size", default="1280x720", help="the viewer's offscreen target (default 1280x720)")
    ap.add_argument("--device", choices=["cuda", "cpu"], default=None, help="default: each tool's choice (CUDA "
                                                                            "when usable)")
    ap.add_argument("--no-white-bg", dest="white_bg", action="store_false",
                    help="black background (default white, the NeRF-synthetic protocol)")
    ap.add_argument("--train-args", default="", help="more training flags for both runs, one string (e.g. "
                                                     "\"--init-points 200 --sh-degree 1\")")
    ap.add_argument("--refresh-hz", type=float, default=None, help="the viewer's --refresh-hz (default: its own, "
                                                                       "10)")
    ap.add_argument("--threads", type=int, default=None, help="OMP_NUM_THREADS of both runs (CPU checks)")
    ap.add_argument("--timeout", type=float, default=None, help="seconds per run (then it is interrupted: SIGINT)")
    ap.add_argument("--keep-runs", type=Path, default=None, help="keep the run folders under this folder")
    ap.add_argument("--out", type=Path, default=None)
    return ap.parse_args(argv)


def _fail(msg: str) -> int:
    print(f"bench/viewer_throughput.py: {msg}", file=sys.stderr)
    return 2


def commands(args, kind: str, run: Path) -> list:
    """The command line of run ``kind`` ("train" or "viewer") into ``run``."""
    py = [sys.executable, "-m"]
    common = ["--data", str(args.data), "--iters", str(args.iters), "--eval-every", "0"]
    common += ["--white-bg"] if args.white_bg else []
    common += ["--device", args.device] if args.device else []
    extra = shlex.split(args.train_args)
    if kind == "train":
        return py + ["rigel_core.cli.train", *common, "--out", str(run), "--checkpoint-every", "0",
                     "--n-renders", "0", "--quiet", *extra]
    refresh = ["--refresh-hz", f"{args.refresh_hz:g}"] if args.refresh_hz is not None else []
    return py + ["viewer", *common, "--offscreen", "--frames", "2", "--size", args.size, "--fps",
                 f"{args.fps:g}", *refresh, "--out", str(run), *extra]


def run_one(args, kind: str, run: Path, keep: Path, log) -> dict:
    """Run ``kind`` into the fresh folder ``run``; returns its record (timings, PSNR, the viewer's present rate)."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p))
    if args.threads:
        env["OMP_NUM_THREADS"] = str(args.threads)
    env.pop("WAYLAND_DISPLAY", None)
    env.pop("DISPLAY", None)        # offscreen: no display is needed, and none is used
    cmd = commands(args, kind, run)
    rec = {"kind": kind, "name": run.name, "command": shlex.join(cmd)}
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    interrupted = False
    try:
        output, _ = proc.communicate(timeout=args.timeout)
    except subprocess.TimeoutExpired:
        proc.send_signal(2)         # SIGINT: the run saves and stops
        output, _ = proc.communicate()
        interrupted = True
    except KeyboardInterrupt:       # the signal reached the run too (same process group): let it finish saving
        output, _ = proc.communicate()
        interrupted = True
    rec.update(rc=proc.returncode, process_s=round(time.perf_counter() - t0, 3), interrupted=interrupted)
    log.write(f"== {kind} {run.name}: {rec['command']}\n{output}\n")
    log.flush()
    dest = keep / run.name
    dest.mkdir(parents=True, exist_ok=True)
    for name in ("metrics.json", "log.txt", "summary.json"):
        if (run / name).is_file():
            shutil.copy2(run / name, dest / name)
    try:
        m = json.loads((run / "metrics.json").read_text())
    except (OSError, ValueError) as e:
        rec["error"] = f"no metrics.json ({type(e).__name__}); rc {proc.returncode}: {output.strip()[-300:]}"
        return rec
    t = m.get("timings") or {}
    ev = (m.get("eval") or [{}])[-1]
    rec.update(iterations=m.get("iterations_done"), num_gaussians=m.get("num_gaussians"), config=m.get("config"),
               train_s=t.get("train_s"), loop_s=t.get("loop_s"), psnr=ev.get("psnr"), ssim=ev.get("ssim"),
               device=m.get("device"))
    if kind == "viewer":
        try:
            s = json.loads((run / "summary.json").read_text())
            rec.update(fps=s.get("fps"), max_fps=s.get("max_fps"), presents=s.get("presents"),
                       frame_ring=s.get("frame_ring"), vulkan_device=s.get("vulkan_device"),
                       render_device=s.get("render_device"), target_size=s.get("target_size"),
                       frame_size=s.get("frame_size"), ok=s.get("ok"), summary_error=s.get("error"),
                       refresh_hz=s.get("refresh_hz"), renders=s.get("renders"), ui_builds=s.get("ui_builds"),
                       repeats=s.get("repeats"), held=s.get("held"), loop_fps=s.get("loop_fps"))
        except (OSError, ValueError) as e:
            rec["error"] = f"no summary.json ({type(e).__name__}); rc {proc.returncode}: {output.strip()[-300:]}"
    if proc.returncode != 0 and "error" not in rec:
        rec["error"] = f"rc {proc.returncode}: {output.strip()[-300:]}"
    return rec


def _ms(rec, key="loop_s"):
    v, n = rec.get(key), rec.get("iterations")
    return 1e3 * v / n if isinstance(v, (int, float)) and n else None


def _ratio(a, b):
    return a / b if a and b else None


def pair_row(a: dict, b: dict) -> dict:
    """One comparison: ms per iteration of both, the ratios (loop wall time and step time), present rate, PSNR."""
    return {"train_ms": _ms(a), "viewer_ms": _ms(b), "train_step_ms": _ms(a, "train_s"),
            "viewer_step_ms": _ms(b, "train_s"), "ratio": _ratio(_ms(a), _ms(b)),
            "ratio_steps": _ratio(_ms(a, "train_s"), _ms(b, "train_s")), "fps": b.get("fps"), "loop_fps": b.get("loop_fps"),
            "max_fps": b.get("max_fps"), "train_psnr": a.get("psnr"), "viewer_psnr": b.get("psnr"),
            "iterations": [a.get("iterations"), b.get("iterations")]}


def aggregate(pairs: list) -> dict:
    """``best``: each side's fastest run (by loop time); ``mean``: the means of the pairs' ms per iteration."""
    out = {}
    ok = [(a, b) for a, b in pairs if _ms(a) and _ms(b)]
    if len(ok) < 2:
        return out
    fa = min((a for a, _ in ok), key=_ms)
    fb = min((b for _, b in ok), key=_ms)
    out["best"] = pair_row(fa, fb)

    def mean(xs):
        xs = [x for x in xs if isinstance(x, (int, float)) and math.isfinite(x)]
        return sum(xs) / len(xs) if xs else None

    rows = [pair_row(a, b) for a, b in ok]
    m = {k: mean([r[k] for r in rows]) for k in ("train_ms", "viewer_ms", "train_step_ms", "viewer_step_ms", "fps",
                                                 "loop_fps", "train_psnr", "viewer_psnr")}
    m.update(ratio=_ratio(m["train_ms"], m["viewer_ms"]), ratio_steps=_ratio(m["train_step_ms"], m["viewer_step_ms"]),
             max_fps=rows[0]["max_fps"], iterations=rows[0]["iterations"])
    out["mean"] = m
    return out


def _f(x, fmt="{:.2f}", unit=""):
    return fmt.format(x) + unit if isinstance(x, (int, float)) and math.isfinite(x) else "–"


def markdown(args, rows: list, agg: dict) -> str:
    head = ("| data | iterations | run | rigel-train ms/it | viewer ms/it | frames/s (presents/s; cap) | ratio | ratio, step "
            "time | held-out PSNR rigel-train | held-out PSNR viewer |")
    lines = [head, "|---|---:|---|---:|---:|---:|---:|---:|---:|---:|"]
    data = args.data.name
    for label, r in [(f"pair {i + 1}", r) for i, r in enumerate(rows)] + list(agg.items()):
        its = r["iterations"]
        it = str(its[0]) if its[0] == its[1] else f"{its[0]} / {its[1]}"
        pct = [_f(x and 100 * x, "{:.1f}", " %") for x in (r["ratio"], r["ratio_steps"])]
        lines.append(f"| {data} | {it} | {label} | {_f(r['train_ms'], '{:.3f}')} ({_f(r['train_step_ms'], '{:.3f}')})"
                     f" | {_f(r['viewer_ms'], '{:.3f}')} ({_f(r['viewer_step_ms'], '{:.3f}')}) | "
                     f"{_f(r.get('loop_fps'), '{:.1f}')} ({_f(r['fps'], '{:.1f}')}; {_f(r['max_fps'], '{:g}')}) | "
                     f"{pct[0]} | {pct[1]} | "
                     f"{_f(r['train_psnr'], unit=' dB')} | {_f(r['viewer_psnr'], unit=' dB')} |")
    lines.append("")
    lines.append("ms/it: the training loop's wall time per iteration (`timings.loop_s`), in parentheses the steps' own "
                 "time (`timings.train_s`); ratio = rigel-train time / viewer time; frames/s: the viewer's frame loop "
                 "(held frames, the picture already presented, included), presents/s: those submitted to Vulkan.")
    return "\n".join(lines)


def verdict(rows: list, agg: dict) -> str:
    r = agg.get("best") or (rows[0] if rows else None)
    if r is None or r["ratio"] is None:
        return "issue 15 target (viewer ≥ 97 % of rigel-train's throughput): not measured"
    which = "best of each side" if "best" in agg else "one pair"
    met = "met" if r["ratio"] >= TARGET else "NOT met"
    return (f"issue 15 target (viewer ≥ 97 % of rigel-train's throughput, {which}): {100 * r['ratio']:.1f} % at "
            f"{_f(r.get('loop_fps'), '{:.1f}')} frames/s ({_f(r['fps'], '{:.1f}')} presented): {met}")


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.iters < 1 or args.repeat < 1:
        return _fail(f"--iters and --repeat must be ≥ 1, got {args.iters} and {args.repeat}")
    if not (args.fps > 0 and math.isfinite(args.fps)):
        return _fail(f"--fps must be a positive number, got {args.fps}")
    if not args.data.is_dir():
        return _fail(f"--data {args.data}: no such dataset folder")
    out = args.out or Path(os.environ.get("OUT") or f"viewer-throughput-{datetime.datetime.utcnow():%Y%m%d-%H%M%S}")
    out.mkdir(parents=True, exist_ok=True)
    if (out / "viewer_throughput.json").exists():
        return _fail(f"{out / 'viewer_throughput.json'} exists; choose another --out")
    tmp = None
    if args.keep_runs is not None:
        base = args.keep_runs
        base.mkdir(parents=True, exist_ok=True)
    else:
        base = tmp = Path(tempfile.mkdtemp(prefix="rigel_vtp_"))
    runs, pairs, notes = [], [], []
    try:
        with open(out / "runs.log", "a") as log:
            for i in range(args.repeat):
                pair = []
                for kind in ("train", "viewer"):
                    run = base / f"{kind}_{i + 1}"
                    if run.exists():
                        return _fail(f"{run} exists; choose another --keep-runs")
                    rec = run_one(args, kind, run, out / "runs", log)
                    runs.append(rec)
                    pair.append(rec)
                    print(f"{kind} {i + 1}: rc {rec['rc']}, {rec.get('iterations')} iterations, "
                          f"loop {_f(rec.get('loop_s'), '{:.2f}', ' s')}, "
                          f"steps {_f(rec.get('train_s'), '{:.2f}', ' s')}"
                          + (f", {_f(rec.get('fps'), '{:.1f}')} presents/s ({rec.get('renders')} renders, "
                             f"{rec.get('ui_builds')} panel builds, {rec.get('repeats')} repeats, "
                             f"{rec.get('held')} held, {_f(rec.get('loop_fps'), '{:.1f}')} frames/s; refresh "
                             f"{rec.get('refresh_hz')} Hz)" if kind == "viewer" else "")
                          + f", PSNR {_f(rec.get('psnr'), unit=' dB')}"
                          + (f"; {rec['error']}" if rec.get("error") else ""), flush=True)
                    if rec.get("interrupted"):
                        notes.append(f"{kind} {i + 1} was interrupted (time limit or SIGINT): not a full run")
                        break
                pairs.append(pair)
                if any(r.get("interrupted") for r in pair):
                    break
    finally:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
    full = [(a, b) for a, b in (p for p in pairs if len(p) == 2)
            if not a.get("error") and not b.get("error") and a.get("iterations") == b.get("iterations") == args.iters]
    for a, b in full:
        if a.get("config") != b.get("config"):
            diff = sorted(k for k in set(a["config"] or {}) | set(b["config"] or {})
                          if (a["config"] or {}).get(k) != (b["config"] or {}).get(k))
            notes.append(f"{a['name']} / {b['name']}: the training configurations differ in {diff}")
    rows = [pair_row(a, b) for a, b in full]
    agg = aggregate(full)
    table = markdown(args, rows, agg)
    line = verdict(rows, agg)
    text = table + "\n\n" + line + "".join(f"\n{n}" for n in notes) + "\n"
    print("\n" + text, end="")
    meta = {"date": datetime.datetime.utcnow().isoformat(timespec="seconds") + "Z", "commit": commit(),
            "args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()}, "target": TARGET,
            "gpu": gpu_name(runs), "pairs": rows, "aggregate": agg, "verdict": line, "notes": notes,
            "runs": runs}
    for name, content in (("viewer_throughput.md", text), ("viewer_throughput.json", json.dumps(meta, indent=1)),
                          ("summary.txt", f"{args.data.name} {args.iters} it: {line}\n")):
        with atomic_path(out / name) as t:
            Path(t).write_text(content)
    ok = len(full) == args.repeat and not notes
    return 0 if ok else 1


def gpu_name(runs) -> str | None:
    for r in runs:
        if r.get("vulkan_device"):
            return r["vulkan_device"]
    return None


if __name__ == "__main__":
    sys.exit(main())
