"""Does modelling a capture's lens pay? rigel trained with the capture's lens model and with every distortion
coefficient set to 0, both scored against the same pixels (issue 12).

Held-out PSNR of each run against its own ground truth (what bench/real.py and bench/real_sweep.py report)
compares two different targets: the modelled run's held-out photos are undistorted (resampled; pixels without a
source masked), the zeroed run's are the raw photos. Here the zeroed run's held-out renders — made on the photo's
own pixel grid, the photo read as a pinhole image — are also carried through the modelled frame's undistortion
map (:func:`rigel_core.data.undistort.undistort_map` and the same bilinear ``cv2.remap`` that made the ground
truth), so both runs' predictions meet the same undistorted photos, over the pixels valid in both. Per seed:
that common-frame PSNR of both runs, and each run's PSNR in its own frame (the usual figure).

    python bench/lens_ab.py --data .data/real/beer --iters 7000 --seeds 0,1,2,3 --out $OUT/lens

The zeroed copy is written to a temporary folder (transforms.json with every lens coefficient the loader reads set to 0; everything else
linked), so only transforms.json datasets are taken (``rigel-import-colmap`` converts COLMAP). Both runs use
rigel's defaults (``--rigel-config KEY=VALUE`` overrides both) and the same seed. Outputs under ``--out`` (never
overwritten): lens.md, lens.json. CPU check: ``--device cpu --iters 20 --downscale 8 --max-frames 6``.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench.real import BenchError, parse_overrides, rigel_config, write_text  # noqa: E402
from rigel_core.data import load_dataset  # noqa: E402
from rigel_core.data.frames import with_unique_names  # noqa: E402
from rigel_core.data.transforms import read_transforms  # noqa: E402
from rigel_core.data.undistort import FISHEYE_KEYS, OPENCV_KEYS, remap, undistort_map  # noqa: E402
from rigel_core.renderer import render  # noqa: E402
from rigel_core.train.losses import psnr_from_mse  # noqa: E402
from rigel_core.train.trainer import Trainer  # noqa: E402

#: the transforms.json keys of a lens the loader reads (instant-ngp / nerfstudio), at the top level or per frame
LENS_KEYS = tuple(dict.fromkeys(OPENCV_KEYS + FISHEYE_KEYS))


def zeroed_copy(src: Path, dst: Path) -> int:
    """Write ``dst``: ``src`` with every lens coefficient of its transforms.json set to 0 and every other entry
    linked. Returns how many coefficients were non-zero. BenchError when ``src`` has no transforms.json."""
    meta_path = src / "transforms.json"
    if not meta_path.is_file():
        raise BenchError(f"{src}: no transforms.json (convert a COLMAP capture with rigel-import-colmap first)")
    meta = json.loads(meta_path.read_text())
    changed = 0
    for level in [meta] + list(meta.get("frames", [])):
        for k in LENS_KEYS:
            if isinstance(level.get(k), (int, float)) and level[k] != 0:
                level[k] = 0.0
                changed += 1
    dst.mkdir(parents=True, exist_ok=True)
    (dst / "transforms.json").write_text(json.dumps(meta))
    for entry in src.iterdir():
        if entry.name != "transforms.json":
            os.symlink(entry.resolve(), dst / entry.name)
    return changed


def masked_psnr(pred: np.ndarray, gt: np.ndarray, mask: np.ndarray | None) -> float:
    """PSNR (peak 1, :func:`rigel_core.train.losses.psnr_from_mse`) of (H, W, 3) images, ``pred`` clamped to
    [0, 1], over the pixels where ``mask`` (H, W) is True (all when None)."""
    err = (np.clip(pred, 0.0, 1.0).astype(np.float64) - gt.astype(np.float64)) ** 2
    return psnr_from_mse(float((err if mask is None else err[mask]).mean()))


def train(ds, cfg, device) -> Trainer:
    torch.manual_seed(cfg.seed)
    trainer = Trainer(ds, cfg, device=device)
    for _ in range(cfg.iterations):
        trainer.step()
    return trainer


def renders(trainer: Trainer) -> dict[str, np.ndarray]:
    """{test frame name: (H, W, 3) float32 render}."""
    out = {}
    with torch.no_grad():
        for f in trainer.dataset.test:
            img = render(trainer.model, f.camera, background=trainer.background).image
            out[f.name] = img.float().clamp(0, 1).cpu().numpy()
    return out


def score(ds_lens, ds_zero, specs, lens_renders, zero_renders) -> dict:
    """Per held-out view: the common-frame PSNR of both runs and each one's own-frame PSNR; then the means."""
    zero_frames = {f.name: f for f in ds_zero.test}
    views = {}
    for f in ds_lens.test:
        z = zero_frames[f.name]
        gt = f.image.cpu().numpy()
        mask = None if f.mask is None else f.mask.cpu().numpy().astype(bool)
        cam, photo = f.camera, z.camera
        spec = specs[f.name]
        if spec.distortion is None:  # nothing to undistort: both frames are the photo's
            mx = my = None
            common = mask
            carried = zero_renders[f.name]
        else:
            mx, my, valid = undistort_map(cam.width, cam.height, cam.fx, cam.fy, cam.cx, cam.cy, spec.distortion,
                                          (photo.width, photo.height))
            carried = remap(zero_renders[f.name], mx, my, valid)
            common = valid if mask is None else (mask & valid)
        views[f.name] = {
            "lens_common": masked_psnr(lens_renders[f.name], gt, common),
            "zero_common": masked_psnr(carried, gt, common),
            "lens_own": masked_psnr(lens_renders[f.name], gt, mask),
            "zero_own": masked_psnr(zero_renders[f.name], z.image.cpu().numpy(),
                                    None if z.mask is None else z.mask.cpu().numpy().astype(bool)),
            "common_pixels": int(common.sum()) if common is not None else int(gt.shape[0] * gt.shape[1]),
        }
    keys = ("lens_common", "zero_common", "lens_own", "zero_own")
    return {"views": views, **{k: float(np.mean([v[k] for v in views.values()])) for k in keys}}


def markdown(data: str, results: list[dict]) -> str:
    lines = [f"# rigel with the lens modelled against zeroed: {data}", "",
             "PSNR means over the held-out views. common: both runs' renders against the undistorted photos over "
             "the pixels valid in both (the zeroed run's renders carried through the same undistortion map); own: "
             "each run against its own ground truth (undistorted and masked, or raw).", "",
             "| seed | modelled, common | zeroed, common | Δ common | modelled, own | zeroed, own | Δ own |",
             "|---:|---:|---:|---:|---:|---:|---:|"]
    for r in results:
        lines.append(f"| {r['seed']} | {r['lens_common']:.2f} | {r['zero_common']:.2f} | "
                     f"{r['lens_common'] - r['zero_common']:+.2f} | {r['lens_own']:.2f} | {r['zero_own']:.2f} | "
                     f"{r['lens_own'] - r['zero_own']:+.2f} |")
    if len(results) > 1:
        d = [r["lens_common"] - r["zero_common"] for r in results]
        lines += ["", f"Δ common (modelled − zeroed): mean {np.mean(d):+.2f} dB, min {min(d):+.2f}, "
                      f"max {max(d):+.2f} over {len(d)} seeds."]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", required=True, help="a transforms.json capture with a lens model")
    ap.add_argument("--iters", type=int, default=7000)
    ap.add_argument("--seeds", default="0")
    ap.add_argument("--downscale", type=float, default=1.0)
    ap.add_argument("--max-frames", type=int, default=None, help="at most this many frames per split (tests)")
    ap.add_argument("--device", default=None, help="cuda or cpu (default: cuda when available)")
    ap.add_argument("--rigel-config", action="extend", nargs="+", default=[], metavar="KEY=VALUE")
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    out = Path(args.out)
    if (out / "lens.json").exists():
        print(f"lens_ab.py: {out / 'lens.json'} exists (an earlier run); choose another --out", file=sys.stderr)
        return 2
    src = Path(args.data)
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    try:
        seeds = [int(s) for s in args.seeds.split(",") if s.strip()]
        overrides = parse_overrides(args.rigel_config)
        with tempfile.TemporaryDirectory(prefix="lens_ab_") as tmp:
            zero_dir = Path(tmp) / src.name
            if zeroed_copy(src, zero_dir) == 0:
                raise BenchError(f"{src}: transforms.json has no non-zero lens coefficient: nothing to compare")
            kw = dict(downscale=args.downscale, max_frames=args.max_frames)
            ds_lens, ds_zero = load_dataset(src, **kw), load_dataset(zero_dir, **kw)
            specs = {s.name: s for s in with_unique_names(read_transforms(src / "transforms.json")[0])}
            results = []
            for seed in seeds:
                cfg = rigel_config(args.iters, seed, overrides)
                lens_r = renders(train(ds_lens, cfg, device))
                zero_r = renders(train(ds_zero, cfg, device))
                r = {"seed": seed, **score(ds_lens, ds_zero, specs, lens_r, zero_r)}
                results.append(r)
                print(f"seed {seed}: common {r['lens_common']:.2f} (modelled) vs {r['zero_common']:.2f} (zeroed) dB; "
                      f"own {r['lens_own']:.2f} vs {r['zero_own']:.2f} dB", flush=True)
    except (BenchError, ValueError) as e:
        print(f"lens_ab.py: {e}", file=sys.stderr)
        return 2
    out.mkdir(parents=True, exist_ok=True)
    payload = {"data": str(src), "iters": args.iters, "downscale": args.downscale, "results": results}
    write_text(out / "lens.json", json.dumps(payload, indent=1))
    write_text(out / "lens.md", markdown(str(src), results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
