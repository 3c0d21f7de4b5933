"""Big captures and big scenes on one GPU (issue 37 item 3): a generated capture of thousands of views trained
streamed and preloaded, scenes of tens of millions of Gaussians trained, and a 10M+ scene rendered beside gsplat.

1. **Capture**: the procedural scene rendered into a Blender-layout capture (``--views`` training views at
   ``--res``, made on the device, written to ``--capture``, default ``/tmp/rigel_big_capture`` — never into the
   repository; reused when it is there).
2. **Streamed vs preloaded**: ``rigel-train`` on it for ``--iters`` iterations (default: one epoch of the training
   views and 300 more), each in its own process, with the streamed default and with ``--preload-frames``: time to
   the first step (``timings.first_step_s``: from the dataset load's start), ms per iteration (median of the
   loss-curve windows after the first) over the whole run, over the first epoch (every view decoded for the first
   time: ``ms_first_epoch``) and after it (``ms_after_epoch``: the views come from the host cache), peak GPU
   memory, the most views the GPU held (``frames.peak_device_frames`` × ``frame_bytes``: the GPU memory of
   images), peak host memory (``ru_maxrss`` of that process, ``os.wait4``), the exit status (2 with the refusal's
   line when the preloaded images cannot fit). ``throughput`` = preloaded ms / streamed ms after the first epoch
   (the whole run's when it is shorter; issue target ≥ 0.95), ``throughput_first_epoch`` the same over it.
3. **Gaussians**: ``--gaussians`` counts (e.g. ``10M,20M,30M``) trained a few steps each by
   :func:`bench.gaussian_memory.rigel_row` at ``--res``: step time and peak GPU memory (CUDA).
4. **Render**: ``bench/forward.py --scenes <--forward> --res 1080p,4k`` (rigel's forward stages beside gsplat's),
   when ``--forward`` names a procedural scene (``10M``, ``20M``) and CUDA is there.

Run on the GPU machine: ``python bench/big_scene.py --views 2000 --res 1080p --gaussians 10M,20M,30M
--forward 10M``; writes ``$OUT/big_scene.md`` and ``.json``. On a CPU (``--device cpu``, tiny sizes: what the tests
run) parts 1–2 run and the CUDA-only figures are reported as skipped with the reason.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.bench_common import commit  # noqa: E402
from bench.gaussian_memory import RES, parse_count, rigel_row  # noqa: E402

__all__ = ["make_capture", "train_run", "main"]


def make_capture(path: Path, views: int, res: str, gaussians: int, device: str) -> dict:
    """The generated capture at ``path`` (made unless its transforms_train.json is there): its facts."""
    from rigel_core.data import make_dataset

    w, h = RES[res] if res in RES else tuple(int(v) for v in res.split("x"))
    made, t0 = False, time.perf_counter()
    if not (path / "transforms_train.json").is_file():
        make_dataset(path, gaussians, w, h, n_train=views, n_test=max(4, views // 100), device=device, progress=False)
        made = True
    return {"path": str(path), "views": views, "width": w, "height": h, "made": made,
            "seconds": time.perf_counter() - t0, "float32_bytes": views * w * h * 12}


def _median(values: list):
    return statistics.median(values) if values else None


def train_run(capture: Path, out: Path, device: str, iters: int, extra: list[str], epoch: int = 0) -> dict:
    """One ``rigel-train`` process on ``capture``: its exit status, last stderr line, peak host memory and the
    figures of its metrics.json (module docstring)."""
    cmd = [sys.executable, "-m", "rigel_core.cli.train", "--data", str(capture), "--out", str(out), "--device", device,
           "--iters", str(iters), "--eval-every", "0", "--n-renders", "0", "--checkpoint-every", "0", "--quiet",
           "--log-every", "10", "--set", "coarse_to_fine=1"] + extra
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, env=env, text=True)
    err = proc.stderr.read()
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    row = {"args": extra, "status": proc.returncode, "wall_s": time.perf_counter() - t0,
           "host_peak_bytes": usage.ru_maxrss * 1024, "last_line": (err.strip().splitlines() or [""])[-1]}
    metrics_path = out / "metrics.json"
    if metrics_path.is_file():
        m = json.loads(metrics_path.read_text())
        windows = m.get("train", [])[1:]   # (the first window holds the first step's start-up)
        row.update(first_step_s=m["timings"].get("first_step_s"), load_s=m["timings"].get("load_s"),
                   ms_per_iter=_median([e["ms_per_iter"] for e in windows]),
                   ms_first_epoch=_median([e["ms_per_iter"] for e in windows if e["iteration"] <= epoch]),
                   ms_after_epoch=_median([e["ms_per_iter"] for e in windows if e["iteration"] > epoch + 10]),
                   gpu_peak_bytes=m.get("peak_gpu_memory_bytes"), frames=m.get("frames"))
        f = m.get("frames") or {}
        if f.get("streamed"):
            row["gpu_image_bytes"] = f["peak_device_frames"] * f["frame_bytes"]
    return row


def _gb(n) -> str:
    return "–" if n is None else f"{n / 1e9:.2f} GB"


def markdown(r: dict) -> str:
    c = r["capture"]
    lines = [f"# Big captures and scenes (commit {r['commit']}, {r['device_name']})", "",
             f"Capture: {c['views']} views {c['width']}x{c['height']} ({_gb(c['float32_bytes'])} as float32), "
             f"{'made in %.0f s' % c['seconds'] if c['made'] else 'reused'}; {r['iters']} iterations per run.", "",
             "| frames | status | first step | ms/iter | first epoch | after it | GPU peak | GPU images | host peak |",
             "|---|---|---|---|---|---|---|---|---|"]

    def ms(v):
        return "–" if v is None else "%.2f" % v

    for name, row in r["runs"].items():
        fs = row.get("first_step_s")
        lines.append(f"| {name} | {row['status']} | {'–' if fs is None else '%.1f s' % fs} | "
                     f"{ms(row.get('ms_per_iter'))} | {ms(row.get('ms_first_epoch'))} | "
                     f"{ms(row.get('ms_after_epoch'))} | {_gb(row.get('gpu_peak_bytes'))} | "
                     f"{_gb(row.get('gpu_image_bytes'))} | {_gb(row['host_peak_bytes'])} |")
        if row["status"] != 0:
            lines.append(f"|  | {row['last_line'][:200]} | | | | | | | |")
    if r.get("throughput") is not None:
        lines.append(f"\nthroughput streamed / preloaded: {r['throughput']:.3f} (target ≥ 0.95)"
                     + (f"; over the first epoch {r['throughput_first_epoch']:.3f}"
                        if r.get("throughput_first_epoch") is not None else ""))
    if r["gaussians"]:
        lines += ["", "| Gaussians | step ms | GPU peak |", "|---|---|---|"]
        for g in r["gaussians"]:
            lines.append(f"| {g['n']:,} | {g.get('step_ms', float('nan')):.1f} | "
                         f"{_gb(g['peak']) if 'peak' in g else g.get('peak_skipped', g.get('error', ''))} |")
    if r.get("forward"):
        lines += ["", f"Render: {r['forward']}"]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--views", type=int, default=2000)
    p.add_argument("--res", default="1080p")
    p.add_argument("--scene-gaussians", default="300k", help="Gaussians of the procedural scene the capture shows")
    p.add_argument("--capture", type=Path, default=Path(tempfile.gettempdir()) / "rigel_big_capture")
    p.add_argument("--iters", type=int, default=None, help="iterations per run (default: --views + 300)")
    p.add_argument("--gaussians", default="", help="counts to train a few steps (e.g. 10M,20M,30M)")
    p.add_argument("--forward", default="", help="a bench/forward.py procedural scene to render (10M, 20M)")
    p.add_argument("--device", default=None)
    p.add_argument("--train-args", default="", help="more rigel-train arguments, space-separated")
    args = p.parse_args(argv)
    import torch

    from rigel_core import cuda_available

    device = args.device or ("cuda" if cuda_available() else "cpu")
    cuda = device.startswith("cuda")
    capture = make_capture(args.capture, args.views, args.res, parse_count(args.scene_gaussians), device)
    iters = args.iters if args.iters is not None else args.views + 300
    runs = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name, extra in (("streamed", []), ("preloaded", ["--preload-frames"])):
            runs[name] = train_run(args.capture, Path(tmp) / name, device, iters,
                                   extra + args.train_args.split(), epoch=args.views)

    def ratio(*keys):
        for key in keys:
            ms = [runs[k].get(key) for k in ("preloaded", "streamed")]
            if all(ms):
                return ms[0] / ms[1]
        return None

    result = {"commit": commit(), "device_name": torch.cuda.get_device_name() if cuda else "cpu",
              "iters": iters, "capture": capture, "runs": runs,
              "throughput": ratio("ms_after_epoch", "ms_per_iter"),
              "throughput_first_epoch": ratio("ms_first_epoch"), "gaussians": []}
    save(result)  # what a run stopped by a time limit later still leaves
    for n in [parse_count(c) for c in args.gaussians.split(",") if c]:
        try:
            result["gaussians"].append(rigel_row(n, device, args.res, 5, keep_grads=False))
        except torch.cuda.OutOfMemoryError as e:
            result["gaussians"].append({"n": n, "error": f"out of memory ({str(e).splitlines()[0][:120]})"})
        torch.cuda.empty_cache() if cuda else None
        save(result)
    if args.forward:
        if cuda:
            env = dict(os.environ, OUT=os.environ.get("OUT", tempfile.gettempdir()))
            done = subprocess.run([sys.executable, str(ROOT / "bench" / "forward.py"), "--scenes", args.forward,
                                   "--res", "1080p,4k", "--no-backward", "--no-depth"], env=env)
            result["forward"] = f"bench/forward.py exit {done.returncode}: see forward.md"
        else:
            result["forward"] = "skipped: bench/forward.py needs CUDA"
    print(save(result))
    return 0


def save(result: dict) -> str:
    """The report of ``result`` so far, written (atomically) to ``$OUT``/big_scene.md and .json when OUT is set."""
    from rigel_core.atomic import atomic_path

    text = markdown(result)
    if os.environ.get("OUT"):
        for name, body in (("big_scene.md", text), ("big_scene.json", json.dumps(result, indent=1, default=str))):
            with atomic_path(Path(os.environ["OUT"], name)) as tmp:
                Path(tmp).write_text(body)
    return text


if __name__ == "__main__":
    sys.exit(main())
