"""Several seeds × several rigel settings on the real captures: which default is better, beyond seed noise.

One ``bench/real.py --methods rigel`` run per (variant, scene, seed), ``--parallel P`` of them at once on the one
GPU (rigel's step is host-bound, so a few share an H200 without changing their PSNR; their training times are
then not comparable with single runs and are not reported as such). The result, ``sweep.md`` and
``sweep.json`` under ``--out``: per scene and variant the held-out PSNR of every seed, its mean, and the mean
difference to the first variant with its per-seed range — a variant counts as better on a scene only where its
worst seed-paired difference is above zero.

    python bench/real_sweep.py --scenes .data/real/fern,.data/real/beer --iters 7000 --seeds 0,1 \\
        --variant default --variant gt15=grad_threshold=1.5e-4 --variant bg=init_background_points=20000 \\
        --parallel 3 --out $OUT/sweep

``--variant NAME[=KEY=VALUE[;KEY=VALUE...]]``: a name and TrainConfig overrides (``--rigel-config``). CPU check:
``--device cpu --iters 20 --extra "--downscale 8 --max-frames 6"``.
"""
from __future__ import annotations

import argparse
import json
import shlex
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

HERE = Path(__file__).resolve().parent
#: the second evaluation protocols a run may score besides its held-out PSNR, with their column names
PROTOCOLS = {"psnr_pose": "pose-fitted PSNR", "psnr_exposure": "exposure PSNR"}
#: the extra columns of the table, where a run has them: the protocols above, the PSNR on a few training views
#: (bench/real.py's ``train_psnr``: high while the held-out PSNR is low means floaters or overfitting) and the
#: percentage of wide Gaussians (bench/real.py's ``wide_share``: a fog of wide faint ones shows there)
COLUMNS = {**PROTOCOLS, "train_psnr": "training-view PSNR", "wide_pct": "% wider than 0.1 extent",
           "faint_pct": "% fainter than 0.027", "faint_path": "% fainter than 0.027 at each checkpoint",
           "dead_path": "% dead (% a relocation step moved) at each checkpoint"}


def run_tag(variant: str, scene: str, seed: int) -> str:
    """The folder and log name of one run: ``VARIANT-SCENE-sSEED``, a derived capture's ``~`` written ``.``
    (``fox~halfviews`` → ``fox.halfviews``) so that every name is plain letters, digits, ``-``, ``_`` and ``.``
    (the GPU machine's tool returns no file with another character in its name)."""
    return f"{variant}-{Path(scene).name.replace('~', '.')}-s{seed}"


def parse_variant(spec: str) -> tuple[str, list[str]]:
    name, _, rest = spec.partition("=")
    if not name or any(not c.isalnum() and c not in "-_." for c in name):
        raise SystemExit(f"--variant {spec!r}: the name must be letters, digits, '-', '_' or '.'")
    return name, [kv for kv in rest.split(";") if kv]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scenes", required=True, help="comma-separated capture folders or names (bench/real.py)")
    ap.add_argument("--iters", default="7000")
    ap.add_argument("--seeds", default="0,1")
    ap.add_argument("--variant", action="append", required=True, help="NAME[=KEY=VALUE[;KEY=VALUE...]]")
    ap.add_argument("--parallel", type=int, default=2)
    ap.add_argument("--device", default=None)
    ap.add_argument("--extra", default="", help="more bench/real.py arguments (one string)")
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    variants = [parse_variant(v) for v in args.variant]
    seeds = [int(s) for s in args.seeds.split(",") if s.strip()]
    scenes = [s for s in args.scenes.split(",") if s.strip()]
    out = Path(args.out)
    if (out / "sweep.json").exists():
        raise SystemExit(f"{out / 'sweep.json'}: exists (a previous sweep); choose another --out")
    out.mkdir(parents=True, exist_ok=True)
    # seed-major order: a sweep cut short by its time limit still has every variant of the first seeds
    jobs = [(v, kv, sc, s) for s in seeds for sc in scenes for v, kv in variants]

    def one(job):
        v, kv, sc, seed = job
        tag = run_tag(v, sc, seed)
        cmd = [sys.executable, str(HERE / "real.py"), "--scenes", sc, "--iters", args.iters, "--methods", "rigel",
               "--seed", str(seed), "--out", str(out / tag)] + shlex.split(args.extra)
        if args.device:
            cmd += ["--device", args.device]
        if kv:
            cmd += ["--rigel-config", *kv]
        t0 = time.perf_counter()
        with open(out / f"{tag}.log", "w") as log:
            rc = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT).returncode
        res = {"variant": v, "overrides": kv, "scene": Path(sc).name, "seed": seed, "rc": rc,
               "wall_s": time.perf_counter() - t0}
        try:
            cps = json.loads((out / tag / "real.json").read_text())["scenes"][0]["runs"]["rigel"]["checkpoints"]
            r = cps[-1]
            res.update(psnr=r["psnr"], ssim=r["ssim"], n=r.get("num_gaussians"), train_s=r.get("train_s"))
            # the pose-fitted and exposure protocols' PSNR (eval_pose_opt / pose_opt, eval_exposure / exposure /
            # appearance_grid: docs/TRAINING.md), where the run scored them
            res.update({k: r[f"{k}_trainer"] for k in PROTOCOLS if r.get(f"{k}_trainer") is not None})
            if r.get("train_psnr") is not None:
                res["train_psnr"] = r["train_psnr"]
            if r.get("wide_share") is not None:
                res["wide_pct"] = 100.0 * r["wide_share"]
            if r.get("faint_share") is not None:  # inside the MCMC noise's gate (bench/real.py FAINT_OPACITY)
                res["faint_pct"] = 100.0 * r["faint_share"]
            if len(cps) > 1 and all(c.get("faint_share") is not None for c in cps):  # how the share grew
                res["faint_path"] = " → ".join(f"{100.0 * c['faint_share']:.0f}" for c in cps)
            if all(c.get("dead_share") is not None for c in cps):  # MCMC's dead bound, and the relocations' churn
                res["dead_path"] = " → ".join(
                    f"{100.0 * c['dead_share']:.0f}"
                    + (f" ({100.0 * c['relocated_share']:.0f})" if c.get("relocated_share") is not None else "")
                    for c in cps)
        except (OSError, KeyError, IndexError, ValueError) as e:
            res["error"] = f"{type(e).__name__}: {e}"
        print(f"{tag}: rc={rc} psnr={res.get('psnr', 'n/a')}", flush=True)
        return res

    def cell(value) -> str:
        return "—" if value is None else value if isinstance(value, str) else f"{value:.2f}"

    def write(results) -> list[str]:
        (out / "sweep.json").write_text(json.dumps(results, indent=1) + "\n")
        protocols = [k for k in COLUMNS if any(r.get(k) is not None for r in results)]
        lines = [f"iterations {args.iters}, seeds {seeds}; Δ = variant − {variants[0][0]} per seed (mean [min, max])", "",
                 "| scene | variant | PSNR per seed | mean | Δ mean [min, max] | N (mean) | train s (mean) ¹ |"
                 + "".join(f" {COLUMNS[k]} per seed |" for k in protocols),
                 "|---|---|---|---:|---|---:|---:|" + "---|" * len(protocols)]
        for sc in dict.fromkeys(Path(s).name for s in scenes):
            base = {r["seed"]: r.get("psnr") for r in results if r["scene"] == sc and r["variant"] == variants[0][0]}
            for v, _ in variants:
                rows = [r for r in results if r["scene"] == sc and r["variant"] == v]
                ps = [r.get("psnr") for r in rows]
                ok = [p for p in ps if p is not None]
                mean = sum(ok) / len(ok) if ok else float("nan")
                ds = [r["psnr"] - base[r["seed"]] for r in rows if r.get("psnr") is not None and base.get(r["seed"])]
                delta = f"{sum(ds) / len(ds):+.2f} [{min(ds):+.2f}, {max(ds):+.2f}]" if ds and v != variants[0][0] else ""
                ns = [r["n"] for r in rows if r.get("n")]
                ts = [r["train_s"] for r in rows if r.get("train_s")]
                lines.append(f"| {sc} | {v} | {' / '.join('—' if p is None else f'{p:.2f}' for p in ps)} | {mean:.2f} | "
                             f"{delta} | {sum(ns) / len(ns) if ns else 0:,.0f} | "
                             f"{f'{sum(ts) / len(ts):.1f}' if ts else '—'} |"
                             + "".join(f" {' / '.join(cell(r.get(k)) for r in rows)} |"
                                       for k in protocols))
        lines += ["", f"¹ runs {args.parallel} at a time on one GPU: times compare variants within this sweep only."]
        (out / "sweep.md").write_text("\n".join(lines) + "\n")
        return lines

    results, lines = [], []
    pool = ThreadPoolExecutor(max(1, args.parallel))
    futures = [pool.submit(one, job) for job in jobs]
    try:  # the tables are written after every finished run, so a sweep cut short keeps what it finished
        for f in futures:
            results.append(f.result())
            lines = write(results)
    except KeyboardInterrupt:  # (a time limit's SIGINT reaches the runs too: they stop and report)
        pool.shutdown(wait=True, cancel_futures=True)
        results += [f.result() for f in futures[len(results):] if f.done() and not f.cancelled()]
        lines = write(results)
        print(f"interrupted: {len(results)} of {len(jobs)} runs in the tables", flush=True)
    pool.shutdown()
    print("\n".join(lines))
    return 0 if all(r["rc"] == 0 for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
