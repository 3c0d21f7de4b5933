"""Data-parallel training, 1 vs N processes (issue 16): throughput, quality at equal views, time to a PSNR target,
and the all-reduce's share of a step at 300k / 1M / 3M Gaussians.

Jobs (``--runs``, comma-separated; each spawns its ranks with torch.multiprocessing, NCCL on CUDA / gloo on CPU):

* ``DATA:N`` — train on ``DATA`` with N processes × ``--batch-size`` views per step (global batch G = N·B) for
  ``--views`` views in all: ``--views / G`` iterations with every step-counted schedule field divided by G
  (:func:`rigel_core.train.distributed.scale_schedule`: densification, opacity resets, SH ramp, position-lr horizon
  after the same numbers of *views* as the G = 1 run), the learning rates and Adam betas by the config's
  ``batch_lr_scaling`` (default √G, β^G). Rank 0 evaluates the held-out views every ``--eval-views`` views (the
  evaluation's time is left out of the training time; the other ranks wait in the next all-reduce, which costs
  them nothing that is counted). Measured: views per second (views / training seconds), held-out PSNR / SSIM at
  each evaluation and at the end, training seconds until the held-out PSNR first reaches ``--target`` (35.8 dB for
  lego; None when never), Gaussian count, the all-reduce's seconds (flatten + all-reduce + unflatten, from
  ``Comm.reduce_seconds``). ``DATA`` is ``lego`` ($RIGEL_SHARED_DATA/lego, white background), a folder name under
  ``$RIGEL_SHARED_DATA/real`` (e.g. ``bonsai``, at ``--real-downscale``), a path, or ``tiny`` (a procedural
  Blender scene made in a temporary folder: the CPU check).
* ``allreduce:N`` — for each size in ``--sizes`` (default 300000,1000000,3000000): a random model of that many
  Gaussians (SH degree 3) in front of the cameras of ``--allreduce-data`` (default lego), densification off;
  ``--steps`` timed steps after ``--warmup`` (synchronised), on N processes: the step time and the all-reduce's
  seconds per step (its share of the step), and the all-reduce's payload (bytes per step).

Outputs under ``--out`` (default ``$OUT/multi_gpu`` else ``multi_gpu-<UTC>``): ``<job>.json`` per job (an existing
one is never overwritten: that job is skipped with a note — so jobs can be split over several device calls into
one folder), and ``multi_gpu.md``, the table of every job found there (rebuilt each time; ``--report-only`` rebuilds
it without running anything). stdout: one line per job.

GPU (two H200; see bench/device_all.sh job ``multigpu``)::

    python bench/multi_gpu.py --runs lego:1,lego:2,bonsai:1,bonsai:2,allreduce:2 --views 60000

CPU check (seconds; gloo)::

    python bench/multi_gpu.py --device cpu --runs tiny:1,tiny:2,allreduce:2 --views 40 --eval-views 20 \\
        --sizes 300,1000 --steps 3 --warmup 1 --out /tmp/mg
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402


def shared_data() -> Path:
    return Path(os.environ.get("RIGEL_SHARED_DATA", ROOT.parent / "shared" / "data"))


def _dataset(spec: str, args):
    from rigel_core.data import load_dataset

    if spec == "tiny":
        from rigel_core.data import make_dataset as make_procedural

        d = Path(tempfile.gettempdir()) / f"rigel_mg_tiny_{args.tiny_size}"
        if not (d / "transforms_test.json").is_file():
            make_procedural(d, 300, args.tiny_size, args.tiny_size, n_train=8, n_test=3, seed=0, device="cpu",
                            progress=False)
        return load_dataset(d, white_bg=False), "tiny"
    if spec == "lego":
        return load_dataset(shared_data() / "lego", white_bg=True, downscale=args.lego_downscale), "lego"
    p = Path(spec)
    if not p.is_dir():
        p = shared_data() / "real" / spec
    if not p.is_dir():
        raise SystemExit(f"multi_gpu.py: no dataset {spec!r} ({p} is not a directory; set RIGEL_SHARED_DATA)")
    return load_dataset(p, downscale=args.real_downscale), p.name


def _sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize()


# ---- workers (one per rank) ---------------------------------------------------------------------------------------
def _init(rank, world, port, device):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), LOCAL_RANK=str(rank),
                      WORLD_SIZE=str(world))
    if device == "cpu":
        torch.set_num_threads(1)
    if world == 1:
        if device.startswith("cuda"):
            torch.cuda.set_device(0)
        return None
    from rigel_core.train.distributed import init_from_env

    comm = init_from_env(device)
    comm.check_every = 0  # one check at the end instead: the bench times steps
    comm.timing = True  # a device sync before each all-reduce: its seconds are its own
    return comm


def _train_worker(rank, world, port, job, args, out_path):
    from rigel_core.train import TrainConfig, Trainer
    from rigel_core.train.distributed import scale_schedule

    comm = _init(rank, world, port, args.device)
    try:
        ds, name = _dataset(job["data"], args)
        g = world * args.batch_size
        iters = max(1, args.views // g)
        base = TrainConfig(iterations=args.views, eval_every=0, seed=args.seed, batch_size=args.batch_size,
                           **({"init_points": args.tiny_init} if job["data"] == "tiny" else {}))
        for kv in args.set:
            k, v = kv.split("=", 1)
            setattr(base, k, json.loads(v))
        cfg = scale_schedule(base, g)
        cfg.iterations = iters
        tr = Trainer(ds, cfg, device=args.device)
        if comm is not None:
            tr.comm = comm
            comm.broadcast_model(tr)
        dev = tr.device
        evals, t_train, t_target = [], 0.0, None
        eval_every = max(1, args.eval_views // g)
        _sync(dev)
        t0 = time.perf_counter()
        while tr.iteration < iters:
            tr.step()
            if tr.iteration % eval_every == 0 or tr.iteration == iters:
                _sync(dev)
                t_train += time.perf_counter() - t0
                if rank == 0:
                    ev = tr.evaluate(record=False)
                    evals.append({"views": tr.iteration * g, "iteration": tr.iteration, "train_s": t_train,
                                  "psnr": ev.psnr, "ssim": ev.ssim, "num_gaussians": ev.num_gaussians})
                    if t_target is None and args.target and ev.psnr >= args.target:
                        t_target = t_train
                    print(f"  [{name}:{world}] {tr.iteration * g} views  {t_train:.1f} s  psnr {ev.psnr:.2f}  "
                          f"N {ev.num_gaussians}", flush=True)
                _sync(dev)
                t0 = time.perf_counter()
        if comm is not None:
            comm.check_identical(tr)
        if rank == 0:
            res = {"job": f"{name}:{world}", "kind": "train", "data": name, "world_size": world,
                   "batch_size": args.batch_size, "global_batch": g, "iterations": iters, "views": iters * g,
                   "train_s": t_train, "views_per_s": iters * g / t_train if t_train > 0 else None,
                   "final_psnr": evals[-1]["psnr"], "final_ssim": evals[-1]["ssim"],
                   "num_gaussians": tr.model.num_gaussians, "target_db": args.target, "time_to_target_s": t_target,
                   "allreduce_s": comm.reduce_seconds if comm is not None else 0.0,
                   "evals": evals, "config": tr.config.to_dict(), "device": _device_name(dev)}
            Path(out_path).write_text(json.dumps(res, indent=1))
    finally:
        if comm is not None:
            comm.close()


def _random_model(n, ds, generator):
    """n Gaussians uniform in the cube scene centre ± 0.3 × scene extent (the region the cameras look at), SH degree
    3, scales so that they tile the cube about once."""
    from rigel_core.model import GaussianModel

    mid = torch.as_tensor(ds.scene_center, dtype=torch.float32).reshape(3)
    half = 0.3 * float(ds.scene_extent)
    pts = mid + half * (2 * torch.rand(n, 3, generator=generator) - 1)
    m = GaussianModel.from_points(pts, torch.rand(n, 3, generator=generator), sh_degree=3,
                                  scale=half / max(n, 1) ** (1 / 3), opacity=0.5)
    m.sh_rest = 0.05 * torch.randn(m.sh_rest.shape, generator=generator)
    return m


def _allreduce_worker(rank, world, port, job, args, out_path):
    from rigel_core.train import TrainConfig, Trainer

    comm = _init(rank, world, port, args.device)
    try:
        ds, name = _dataset(args.allreduce_data, args)
        rows = []
        for n in [int(x) for x in args.sizes.split(",")]:
            cfg = TrainConfig(iterations=10 ** 6, eval_every=0, densify_until=0, sh_degree_interval=1, seed=args.seed,
                              coarse_to_fine=1)  # steps at full size
            model = _random_model(n, ds, torch.Generator().manual_seed(args.seed))
            tr = Trainer(ds, cfg, model=model, device=args.device)
            if comm is not None:
                tr.comm = comm
                comm.broadcast_model(tr)
            for _ in range(args.warmup):
                tr.step()
            _sync(tr.device)
            if comm is not None:
                comm.reduce_seconds, comm.reduce_calls = 0.0, 0
            t0 = time.perf_counter()
            for _ in range(args.steps):
                tr.step()
            _sync(tr.device)
            step_s = (time.perf_counter() - t0) / args.steps
            ar = comm.reduce_seconds / max(1, comm.reduce_calls) if comm is not None else 0.0
            payload = sum(p.numel() for g in tr.optimizer.param_groups for p in g["params"]) + 2 * n
            rows.append({"num_gaussians": n, "step_s": step_s, "allreduce_s": ar,
                         "share": ar / step_s if step_s > 0 else None, "payload_bytes": 4 * payload})
            if rank == 0:
                print(f"  [allreduce:{world}] {n:,} Gaussians: step {1e3 * step_s:.2f} ms, all-reduce "
                      f"{1e3 * ar:.2f} ms ({100 * ar / step_s:.1f} %), {4 * payload / 2 ** 20:.1f} MiB", flush=True)
            del tr, model
        if rank == 0:
            Path(out_path).write_text(json.dumps({"job": f"allreduce:{world}", "kind": "allreduce",
                                                  "data": name, "world_size": world, "rows": rows,
                                                  "device": _device_name(torch.device(args.device))}, indent=1))
    finally:
        if comm is not None:
            comm.close()


def _device_name(dev) -> str:
    if dev.type == "cuda":
        return f"{torch.cuda.get_device_name()} x {torch.cuda.device_count()}"
    return f"cpu ({os.cpu_count()} cores)"


# ---- the parent ---------------------------------------------------------------------------------------------------
def run_job(spec: str, args, out_dir: Path) -> Path | None:
    import torch.multiprocessing as mp

    from rigel_core.train.distributed import free_port

    kind, _, n = spec.rpartition(":")
    world = int(n)
    out = out_dir / f"{spec.replace(':', '_').replace('/', '_')}.json"
    if out.exists():
        print(f"{spec}: {out} exists, skipped (never overwritten)")
        return None
    if args.device == "cuda" and torch.cuda.device_count() < world:
        print(f"{spec}: skipped, {torch.cuda.device_count()} GPU(s) here")
        return None
    worker = _allreduce_worker if kind == "allreduce" else _train_worker
    job = {"data": kind}
    t0 = time.time()
    mp.start_processes(worker, args=(world, free_port(), job, args, str(out)), nprocs=world, join=True,
                       start_method="spawn")
    print(f"{spec}: done in {time.time() - t0:.0f} s -> {out}")
    return out


def report(out_dir: Path) -> str:
    """multi_gpu.md from every job JSON in ``out_dir``."""
    res = [json.loads(p.read_text()) for p in sorted(out_dir.glob("*.json"))]
    train = {r["job"]: r for r in res if r.get("kind") == "train"}
    lines = ["# Data-parallel training, 1 vs N processes (bench/multi_gpu.py)", ""]
    if train:
        lines += ["| job | device | global batch | views | views/s | speed-up | held-out PSNR | Δ vs 1 | SSIM | "
                  "Gaussians | time to target | all-reduce share |", "|---|---|---|---|---|---|---|---|---|---|---|---|"]
        for key, r in sorted(train.items()):
            one = train.get(f"{r['data']}:1")
            speed = r["views_per_s"] / one["views_per_s"] if one and one.get("views_per_s") else None
            dpsnr = r["final_psnr"] - one["final_psnr"] if one else None
            tt = r["time_to_target_s"]
            share = r["allreduce_s"] / r["train_s"] if r["train_s"] else 0.0
            lines.append(f"| {key} | {r['device']} | {r['global_batch']} | {r['views']:,} | {r['views_per_s']:.1f} | "
                         + (f"{speed:.2f}×" if speed else "–") + f" | {r['final_psnr']:.2f} dB | "
                         + (f"{dpsnr:+.2f} dB" if dpsnr is not None else "–") + f" | {r['final_ssim']:.4f} | "
                         f"{r['num_gaussians']:,} | " + (f"{tt:.1f} s ({r['target_db']} dB)" if tt is not None
                                                        else f"not reached ({r['target_db']} dB)")
                         + f" | {100 * share:.1f} % |")
        lines.append("")
    for r in res:
        if r.get("kind") != "allreduce":
            continue
        lines += [f"All-reduce share of a step, {r['world_size']} processes, {r['data']} cameras, {r['device']}:", "",
                  "| Gaussians | payload / step | step | all-reduce | share |", "|---|---|---|---|---|"]
        for row in r["rows"]:
            lines.append(f"| {row['num_gaussians']:,} | {row['payload_bytes'] / 2 ** 20:.1f} MiB | "
                         f"{1e3 * row['step_s']:.2f} ms | {1e3 * row['allreduce_s']:.2f} ms | "
                         f"{100 * (row['share'] or 0):.1f} % |")
        lines.append("")
    text = "\n".join(lines)
    (out_dir / "multi_gpu.md").write_text(text)
    return text


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--runs", default="lego:1,lego:2,bonsai:1,bonsai:2,allreduce:2")
    p.add_argument("--device", choices=["cuda", "cpu"], default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--views", type=int, default=60_000, help="views seen per training job (G=1: iterations)")
    p.add_argument("--eval-views", type=int, default=6_000, help="evaluate every this many views")
    p.add_argument("--batch-size", type=int, default=1, help="views per step and process")
    p.add_argument("--target", type=float, default=35.8, help="held-out PSNR target (dB) for time-to-target")
    p.add_argument("--lego-downscale", type=float, default=1)
    p.add_argument("--real-downscale", type=float, default=4)
    p.add_argument("--sizes", default="300000,1000000,3000000")
    p.add_argument("--allreduce-data", default="lego")
    p.add_argument("--steps", type=int, default=50)
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--set", action="append", default=[], metavar="FIELD=JSON", help="TrainConfig override")
    p.add_argument("--tiny-size", type=int, default=24, help="image size of the procedural 'tiny' scene")
    p.add_argument("--tiny-init", type=int, default=200, help="random initial points of the 'tiny' scene")
    p.add_argument("--out", default=None)
    p.add_argument("--report-only", action="store_true")
    args = p.parse_args(argv)
    out_dir = Path(args.out or (Path(os.environ["OUT"]) / "multi_gpu" if os.environ.get("OUT")
                                else f"multi_gpu-{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}"))
    out_dir.mkdir(parents=True, exist_ok=True)
    if not args.report_only:
        for spec in [s.strip() for s in args.runs.split(",") if s.strip()]:
            run_job(spec, args, out_dir)
    print(report(out_dir))
    return 0


if __name__ == "__main__":
    sys.exit(main())
