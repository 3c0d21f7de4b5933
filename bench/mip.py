"""Multi-resolution quality of the anti-aliased ("mip") render mode against the default mode (issue 17).

The Mip-Splatting protocol (Yu et al., CVPR 2024, §6, "single-scale training, multi-scale testing"): train once at
one resolution, then render the held-out views at other resolutions — zoomed out (½, ¼: the default mode's 0.3 px²
dilation makes thin structures too thick and aliased) and zoomed in (2×: a model without the 3D filter shows
high-frequency erosion artefacts) — and score them against ground truth at that resolution.

Per mode (``--modes default,mip``): ``rigel_core.train.Trainer`` with ``TrainConfig(iterations=--iters,
eval_every=0, render_mode=MODE)`` (otherwise the defaults, plus ``--set key=value``) on ``--data`` loaded with
``--train-downscale`` (default 2: lego's 800×800 images box-filtered to 400×400, so that the 800×800 originals are
the ground truth at 2×), white background (the NeRF-synthetic protocol). Then for every scale in ``--scales``
(default 0.25,0.5,1,2, relative to the training resolution) the held-out split is loaded again at downscale
``train_downscale / scale`` (Pillow box filter of the original images; intrinsics scaled with them — the same
images and cameras for both modes) and ``Trainer.evaluate`` gives PSNR and SSIM (means over views, renders clamped
to [0, 1]). A scale that would need images finer than the originals is skipped with a note.

Outputs under ``--out`` (default ``$OUT``, else ``mip-<UTC time>``; existing results are never overwritten):
``mip.md`` (the markdown table, also printed), ``mip.json`` (everything, per-view metrics included), ``summary.txt``
(one line per mode) and ``model_<mode>.ply``. SIGINT (the device script's time limit) stops the current training
where it is; that mode is then evaluated and recorded as stopped.

On the GPU machine: ``python bench/mip.py --data $RIGEL_SHARED_DATA/lego --iters 30000`` (or the device_all.sh
job ``mip:ITERS[:TIMEOUT[:MODES]]``). CPU check: ``python bench/mip.py --device cpu --iters 20 --train-downscale 16
--max-frames 4 --data ../shared/data/lego``.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from rigel_core.atomic import atomic_path  # noqa: E402
from bench_common import commit  # noqa: E402  (bench/ is on sys.path: run as python bench/X.py)
from rigel_core.data import load_dataset  # noqa: E402
from rigel_core.train import TrainConfig, Trainer  # noqa: E402


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    shared = os.environ.get("RIGEL_SHARED_DATA", str(ROOT.parent / "shared" / "data"))
    ap.add_argument("--data", default=os.path.join(shared, "lego"), help="Blender-layout dataset (default: lego)")
    ap.add_argument("--iters", type=int, default=30_000)
    ap.add_argument("--train-downscale", type=float, default=2.0, help="training resolution = original / this")
    ap.add_argument("--scales", default="0.25,0.5,1,2", help="evaluation resolutions relative to the training one")
    ap.add_argument("--modes", default="default,mip")
    ap.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE", dest="set_fields",
                    help="TrainConfig override (VALUE read as JSON, else as a string); repeatable")
    ap.add_argument("--max-frames", type=int, default=None, help="frames per split (a quick check)")
    ap.add_argument("--device", choices=["cuda", "cpu"], default=None)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=None)
    return ap.parse_args(argv)


def parse_set(items) -> dict:
    out = {}
    for item in items:
        if "=" not in item:
            raise SystemExit(f"bench/mip.py: --set expects FIELD=VALUE, got {item!r}")
        k, v = item.split("=", 1)
        try:
            out[k] = json.loads(v)
        except ValueError:
            out[k] = v
    return out


def train(args, mode: str, device: str, overrides: dict) -> tuple[Trainer, dict]:
    ds = load_dataset(args.data, white_bg=True, downscale=args.train_downscale, max_frames=args.max_frames)
    cfg = TrainConfig(**{"iterations": args.iters, "eval_every": 0, "seed": args.seed, **overrides,
                         "render_mode": mode})
    trainer = Trainer(ds, cfg, device=device)
    stopped = None
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    sync()
    t0 = time.perf_counter()
    try:
        for _ in range(args.iters):
            trainer.step()
    except KeyboardInterrupt:
        stopped = trainer.iteration
        print(f"{mode}: interrupted at iteration {stopped}; evaluating what was trained", flush=True)
    sync()
    info = {"mode": mode, "iterations": trainer.iteration, "stopped_at": stopped,
            "train_s": time.perf_counter() - t0, "num_gaussians": trainer.model.num_gaussians,
            "train_size": [ds.train[0].camera.width, ds.train[0].camera.height]}
    return trainer, info


def main(argv=None) -> int:
    args = parse_args(argv)
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    out = Path(args.out or os.environ.get("OUT") or f"mip-{datetime.datetime.utcnow():%Y%m%d-%H%M%S}")
    out.mkdir(parents=True, exist_ok=True)
    if (out / "mip.json").exists():
        print(f"bench/mip.py: {out / 'mip.json'} exists; choose another --out", file=sys.stderr)
        return 2
    modes = [m for m in args.modes.split(",") if m]
    scales = [float(s) for s in args.scales.split(",") if s]
    overrides = parse_set(args.set_fields)
    eval_sets, notes = {}, []
    results = []
    for mode in modes:
        try:
            trainer, info = train(args, mode, device, overrides)
        except KeyboardInterrupt:
            print(f"{mode}: interrupted while loading; stopping", flush=True)
            break
        trainer.export_ply(out / f"model_{mode}.ply")
        info["scales"] = {}
        for scale in scales:
            d = args.train_downscale / scale
            if d < 1:
                if mode == modes[0]:
                    notes.append(f"scale {scale:g}: would need images {1 / d:g}× finer than the originals; skipped")
                continue
            if scale not in eval_sets:
                eval_sets[scale] = list(load_dataset(args.data, white_bg=True, downscale=d,
                                                     max_frames=args.max_frames).test)
            frames = eval_sets[scale]
            res = trainer.evaluate(frames, record=False)
            info["scales"][f"{scale:g}"] = {"psnr": res.psnr, "ssim": res.ssim, "views": res.n_views,
                                           "size": [frames[0].camera.width, frames[0].camera.height],
                                           "per_view": res.per_view}
            print(f"{mode} scale {scale:g} ({frames[0].camera.width}x{frames[0].camera.height}): "
                  f"psnr {res.psnr:.2f} ssim {res.ssim:.4f}", flush=True)
        results.append(info)
        del trainer
        if info["stopped_at"] is not None and mode != modes[-1]:
            notes.append(f"stopped during {mode}: {', '.join(modes[modes.index(mode) + 1:])} not run")
            break
        if device == "cuda":
            torch.cuda.empty_cache()
    table = markdown(results, scales, args, device)
    print(table + "".join(f"\n{n}" for n in notes))
    meta = {"date": datetime.datetime.utcnow().isoformat(timespec="seconds") + "Z", "device": device,
            "gpu": torch.cuda.get_device_name() if device == "cuda" else None, "commit": commit(),
            "args": vars(args), "notes": notes, "results": results}
    for name, text in (("mip.md", table + "".join(f"\n{n}" for n in notes) + "\n"),
                       ("mip.json", json.dumps(meta, indent=1)),
                       ("summary.txt", "".join(summary_line(r) + "\n" for r in results))):
        with atomic_path(out / name) as tmp:
            Path(tmp).write_text(text)
    return 0


def markdown(results, scales, args, device) -> str:
    shown = [s for s in scales if args.train_downscale / s >= 1]
    head = "| mode | iterations | Gaussians | train s | " + " | ".join(
        f"{s:g}× PSNR / SSIM" for s in shown) + " | mean PSNR |"
    rows = [head, "|" + "---|" * 4 + "---:|" * (len(shown) + 1)]
    for r in results:
        cells = []
        ps = []
        for s in shown:
            m = r["scales"].get(f"{s:g}")
            cells.append("–" if m is None else f"{m['psnr']:.2f} / {m['ssim']:.4f}")
            if m is not None:
                ps.append(m["psnr"])
        it = f"{r['iterations']:,}" + (" (stopped)" if r["stopped_at"] is not None else "")
        mean = f"{sum(ps) / len(ps):.2f}" if ps else "–"
        rows.append(f"| {r['mode']} | {it} | {r['num_gaussians']:,} | {r['train_s']:.1f} | " + " | ".join(cells)
                    + f" | {mean} |")
    size = results[0]["train_size"] if results else ["?", "?"]
    return (f"Trained at {size[0]}×{size[1]} ({Path(args.data).name}, downscale {args.train_downscale:g}), "
            f"{device}; scale = evaluation resolution / training resolution\n\n" + "\n".join(rows))


def summary_line(r) -> str:
    parts = [f"{k}×: {v['psnr']:.2f} dB / {v['ssim']:.4f}" for k, v in r["scales"].items()]
    return f"{r['mode']}: it {r['iterations']} N {r['num_gaussians']} train {r['train_s']:.1f}s | " + ", ".join(parts)


if __name__ == "__main__":
    sys.exit(main())
