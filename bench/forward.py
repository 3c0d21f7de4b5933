"""Forward (and forward+backward) timings of the rigel CUDA kernels beside gsplat on identical inputs.

Scenes: the procedural scene (``rigel_core.data.procedural.make_scene``, SH degree 3) at 160k, 1M and 3M
Gaussians, and the real PLYs of ``$RIGEL_SHARED_DATA/ply`` (default ``../shared/data``); resolutions 1280x720,
1920x1080, 3840x2160. Per stage (SH + projection, binning, rasterization) and in total: median of ``--iters``
(>= 50) CUDA-event timings after warm-up. gsplat's ``rasterization`` (SH evaluated inside, as ours) runs in the
same process on the same tensors; ``speedup`` = gsplat time / rigel time (> 1: rigel is faster). Also reports the
duplicated (Gaussian, tile) entries of the ellipse test against the 3-sigma-square count, and the cost of the
depth output (``render(..., depth=True)``: expected + median depth from the same rasterization pass): the
rasterization stage timed with and without depth on the same entries, ``depth +%`` = the extra time relative to
the whole colour-only forward (SH + projection + binning + rasterization). ``fwd+bwd``: the forward and the
backward to every parameter, beside gsplat's.

Run on the GPU machine (bench/device_run.sh): ``python bench/forward.py [--scenes 160k,1M,3M,donut,fruit]
[--res 720p,1080p,4k] [--iters 50] [--no-gsplat] [--no-backward] [--no-depth]``. Writes ``$OUT/forward.md`` when
OUT is set.
"""
from __future__ import annotations

import argparse
import datetime
import math
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import rigel_core as rc  # noqa: E402
from rigel_core.renderer import cuda_backend  # noqa: E402
from rigel_core.reference import tile_rects  # noqa: E402

RESOLUTIONS = {"720p": (1280, 720), "1080p": (1920, 1080), "4k": (3840, 2160)}
PROCEDURAL = {"160k": 160_000, "300k": 300_000, "1M": 1_000_000, "3M": 3_000_000, "10M": 10_000_000, "20M": 20_000_000}
PLYS = {"donut": "donut_mipsplatting_sh0.ply", "fruit": "fruit_drops_minimal_sh3.ply"}


def load(name: str, device):
    """(model, camera factory (width, height) -> Camera) for a scene name."""
    if name in PROCEDURAL:
        from rigel_core.data.procedural import SCENE_RADIUS, make_scene

        model = make_scene(PROCEDURAL[name], sh_degree=3, seed=0, device=device)
        center, dist = np.zeros(3), 2.3 * SCENE_RADIUS
    else:
        from rigel_core.io import load_scene

        data = Path(os.environ.get("RIGEL_SHARED_DATA", ROOT.parent / "shared" / "data"))
        model = load_scene(data / "ply" / PLYS[name], device=device)
        center, dist = model.center().cpu().numpy().astype(np.float64), 1.8 * model.extent()
    el, az = math.radians(25.0), math.radians(30.0)
    eye = center + dist * np.array([math.cos(el) * math.cos(az), math.cos(el) * math.sin(az), math.sin(el)])

    def camera(width, height):
        return rc.Camera.look_at(eye, center, (0.0, 0.0, 1.0), width=width, height=height, fov_x_deg=55.0)

    return model, camera


def median_ms(fn, iters: int, warmup: int = 5, n_events: int = 2):
    """Median over ``iters`` runs of each interval between consecutive events fn(events) records (ms)."""
    for _ in range(warmup):
        fn([torch.cuda.Event(enable_timing=True) for _ in range(n_events)])
    torch.cuda.synchronize()
    runs = []
    for _ in range(iters):
        ev = [torch.cuda.Event(enable_timing=True) for _ in range(n_events)]
        fn(ev)
        runs.append(ev)
    torch.cuda.synchronize()
    cols = list(zip(*[[a.elapsed_time(b) for a, b in zip(ev[:-1], ev[1:])] + [ev[0].elapsed_time(ev[-1])]
                      for ev in runs]))
    return [statistics.median(c) for c in cols]


class Inputs:
    """Activated float32 CUDA tensors of a model seen from a camera (the same tensors go to gsplat)."""

    def __init__(self, model, cam):
        self.means3D, self.quats = model.means3D.contiguous(), model.quats.contiguous()
        self.scales, self.opacities = model.scales.contiguous(), model.opacities.contiguous()
        self.sh = model.sh_coeffs.contiguous()
        self.degree = model.sh_degree
        self.viewmat = cam.viewmat_tensor(model.device)
        self.K = cam.K_tensor(model.device)
        self.campos = torch.as_tensor(cam.campos, dtype=torch.float32, device=model.device)
        self.width, self.height = cam.width, cam.height

    def params(self):
        return [self.means3D, self.quats, self.scales, self.opacities, self.sh]


def rigel_stages(x: Inputs, ev):
    """One frame, events between SH+projection | binning | rasterization."""
    ev[0].record()
    colors = cuda_backend.sh_colors_cuda(x.degree, x.sh, x.means3D, x.campos)
    means2D, conics, depths, radii = cuda_backend.project_gaussians_cuda(
        x.means3D, x.quats, x.scales, x.opacities, x.viewmat, x.K, x.width, x.height)
    ev[1].record()
    keys, ids, ranges, _ = cuda_backend.bin_gaussians_cuda(means2D, conics, x.opacities, depths, radii, x.width,
                                                           x.height)
    ev[2].record()
    out = cuda_backend.rasterize_tiles_cuda(means2D, conics, colors, x.opacities, ids, ranges, x.width, x.height)
    ev[3].record()
    return out, keys.numel(), means2D, radii


def rigel_raster(x: Inputs, pre, depth: bool, ev):
    """The rasterization stage alone on prepared (means2D, conics, colors, depths, ids, ranges), with or without
    the depth outputs (the kernels' kDepth instantiation, which also divides: render() adds nothing after it)."""
    means2D, conics, colors, depths, ids, ranges = pre
    ev[0].record()
    out = cuda_backend.rasterize_tiles_cuda(means2D, conics, colors, x.opacities, ids, ranges, x.width, x.height,
                                            depths=depths if depth else None)
    del out
    ev[1].record()


def rigel_train_step(x: Inputs, ev):
    ev[0].record()
    colors = cuda_backend.sh_colors_cuda(x.degree, x.sh, x.means3D, x.campos)
    out = cuda_backend.rasterize_gaussians_cuda(x.means3D, x.quats, x.scales, x.opacities, colors, x.viewmat, x.K,
                                                x.width, x.height)
    out.image.sum().backward()
    ev[1].record()


def gsplat_frame(x: Inputs):
    from gsplat import rasterization

    img, _, _ = rasterization(x.means3D, x.quats, x.scales, x.opacities, x.sh, x.viewmat[None], x.K[None],
                              x.width, x.height, sh_degree=x.degree, near_plane=rc.config.NEAR_PLANE,
                              far_plane=rc.config.FAR_PLANE)
    return img[0]


def gsplat_timed(x: Inputs, ev):
    ev[0].record()
    gsplat_frame(x)
    ev[1].record()


def gsplat_train_step(x: Inputs, ev):
    ev[0].record()
    gsplat_frame(x).sum().backward()
    ev[1].record()


def psnr(a, b):
    mse = float(((a.float() - b.float()) ** 2).mean())
    return float("inf") if mse == 0 else 10 * math.log10(1.0 / mse)


def run(args):
    dev = torch.device("cuda")
    rows = []
    have_gsplat = not args.no_gsplat
    if have_gsplat:
        try:
            import gsplat  # noqa: F401
        except Exception as e:  # noqa: BLE001
            print(f"gsplat unavailable ({e}); rigel only", flush=True)
            have_gsplat = False
    for scene in args.scenes.split(","):
        t0 = time.time()
        model, camera = load(scene, dev)
        print(f"[{scene}] {model.num_gaussians:,} Gaussians, SH {model.sh_degree}, loaded in {time.time() - t0:.1f}s",
              flush=True)
        for res in args.res.split(","):
            w, h = RESOLUTIONS[res]
            x = Inputs(model, camera(w, h))
            row = dict(scene=scene, n=model.num_gaussians, res=f"{w}x{h}")
            with torch.no_grad():
                (img, final_T, _), n_entries, means2D, radii = rigel_stages(x, [torch.cuda.Event() for _ in range(4)])
                rect = tile_rects(means2D, radii, w, h)
                box = ((rect[:, 2] - rect[:, 0]) * (rect[:, 3] - rect[:, 1]))[radii > 0].sum()
                row.update(entries=n_entries, box_entries=int(box), coverage=float(1 - final_T.mean()))
                stage = median_ms(lambda ev: rigel_stages(x, ev), args.iters, n_events=4)
                row.update(proj_sh=stage[0], bin=stage[1], raster=stage[2], total=stage[3])
                if not args.no_depth:   # depth output (issue 17.2): same entries, raster with and without depth
                    colors = cuda_backend.sh_colors_cuda(x.degree, x.sh, x.means3D, x.campos)
                    m2, con, dep, rad = cuda_backend.project_gaussians_cuda(
                        x.means3D, x.quats, x.scales, x.opacities, x.viewmat, x.K, w, h)
                    _, ids, ranges, _ = cuda_backend.bin_gaussians_cuda(m2, con, x.opacities, dep, rad, w, h)
                    pre = (m2, con, colors, dep, ids, ranges)
                    plain = median_ms(lambda ev: rigel_raster(x, pre, False, ev), args.iters)[0]
                    with_depth = median_ms(lambda ev: rigel_raster(x, pre, True, ev), args.iters)[0]
                    row.update(raster_plain=plain, raster_depth=with_depth,
                               depth_pct=100.0 * (with_depth - plain) / stage[3])
                if have_gsplat:
                    if not getattr(run, "gsplat_warm", False):
                        t1 = time.time()
                        gsplat_frame(x)
                        torch.cuda.synchronize()
                        print(f"gsplat first call (JIT compile) {time.time() - t1:.0f}s", flush=True)
                        run.gsplat_warm = True
                    row["gsplat"] = median_ms(lambda ev: gsplat_timed(x, ev), args.iters)[0]
                    row["psnr_vs_gsplat"] = psnr(img, gsplat_frame(x).clamp(0, 1e9))
            if not args.no_backward:
                for p in x.params():
                    p.requires_grad_(True)
                row["train"] = median_ms(lambda ev: rigel_train_step(x, ev), args.iters)[0]
                if have_gsplat:
                    row["gsplat_train"] = median_ms(lambda ev: gsplat_train_step(x, ev), args.iters)[0]
                for p in x.params():
                    p.requires_grad_(False)
                    p.grad = None
            rows.append(row)
            print("  " + format_row(row), flush=True)
            del x
        del model
        torch.cuda.empty_cache()
    return rows


def fmt(v, spec=".2f"):
    return "-" if v is None else format(v, spec)


def format_row(r):
    sp = r["gsplat"] / r["total"] if "gsplat" in r else None
    spt = r["gsplat_train"] / r["train"] if "gsplat_train" in r and "train" in r else None
    return (f"{r['scene']:>6} {r['n']:>9,} {r['res']:>9} | entries {r['entries']:>11,} box {r['box_entries']:>11,} "
            f"({r['entries'] / max(r['box_entries'], 1):.2f}) | proj+SH {r['proj_sh']:.3f} bin {r['bin']:.3f} "
            f"raster {r['raster']:.3f} total {r['total']:.3f} ms | gsplat {fmt(r.get('gsplat'), '.3f')} "
            f"x{fmt(sp)} | fwd+bwd {fmt(r.get('train'), '.3f')} gsplat {fmt(r.get('gsplat_train'), '.3f')} "
            f"x{fmt(spt)} | PSNR vs gsplat {fmt(r.get('psnr_vs_gsplat'), '.1f')} | "
            f"raster+depth {fmt(r.get('raster_depth'), '.3f')} (raster alone {fmt(r.get('raster_plain'), '.3f')}) "
            f"depth +{fmt(r.get('depth_pct'), '.1f')} % of forward")


def markdown(rows, meta):
    lines = [f"# rigel forward benchmark ({meta})", "",
             "Median of CUDA-event timings after warm-up (ms). speedup = gsplat / rigel (> 1: rigel faster). "
             "entries: duplicated (Gaussian, tile) pairs after the ellipse test; box: the 3-sigma square's count. "
             "raster+depth: the rasterization stage with the depth outputs (expected + median depth, same pass); "
             "depth +%: its extra time over the colour-only raster, relative to the whole forward (total).", "",
             "| scene | N | resolution | entries | box | ratio | SH+proj | bin | raster | total | gsplat | speedup | "
             "fwd+bwd | gsplat fwd+bwd | speedup | PSNR vs gsplat | raster+depth | depth +% |",
             "|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        sp = r["gsplat"] / r["total"] if "gsplat" in r else None
        spt = r["gsplat_train"] / r["train"] if "gsplat_train" in r and "train" in r else None
        lines.append(f"| {r['scene']} | {r['n']:,} | {r['res']} | {r['entries']:,} | {r['box_entries']:,} | "
                     f"{r['entries'] / max(r['box_entries'], 1):.2f} | {r['proj_sh']:.3f} | {r['bin']:.3f} | "
                     f"{r['raster']:.3f} | {r['total']:.3f} | {fmt(r.get('gsplat'), '.3f')} | {fmt(sp)} | "
                     f"{fmt(r.get('train'), '.3f')} | {fmt(r.get('gsplat_train'), '.3f')} | {fmt(spt)} | "
                     f"{fmt(r.get('psnr_vs_gsplat'), '.1f')} | {fmt(r.get('raster_depth'), '.3f')} | "
                     f"{fmt(r.get('depth_pct'), '.1f')} |")
    return "\n".join(lines) + "\n"


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scenes", default="160k,1M,3M,donut,fruit")
    ap.add_argument("--res", default="720p,1080p,4k")
    ap.add_argument("--iters", type=int, default=50)
    ap.add_argument("--no-gsplat", action="store_true")
    ap.add_argument("--no-backward", action="store_true", help="skip the forward+backward timings")
    ap.add_argument("--no-depth", action="store_true", help="skip the depth-output timings")
    args = ap.parse_args()
    if args.iters < 50:
        print("note: fewer than 50 timed iterations", file=sys.stderr)
    if not rc.cuda_available():
        sys.exit("bench/forward.py needs a CUDA GPU and the compiled kernels (rigel_core._C)")
    rows = run(args)
    commit = os.environ.get("RIGEL_COMMIT") or subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    meta = (f"{torch.cuda.get_device_name()}, {datetime.date.today()}, commit {commit or 'unknown'}, "
            f"torch {torch.__version__}")
    table = markdown(rows, meta)
    if os.environ.get("OUT"):
        Path(os.environ["OUT"], "forward.md").write_text(table)
    print("\n" + table)


if __name__ == "__main__":
    main()
