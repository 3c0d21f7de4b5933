"""Frames per second of the CPU reference backend (issue: ≥ 2 frames/s at 320×240 for the 45k-splat donut
on 2 cores). Run: python bench/reference_cpu.py [PLY] [--frames N]."""
import argparse
import statistics
import time
from pathlib import Path

import numpy as np
import torch

import rigel_core as rc
from rigel_core.io import load_scene

ROOT = Path(__file__).resolve().parents[1]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("scene", nargs="?", default=str(ROOT.parent / "shared/data/ply/donut_mipsplatting_sh0.ply"))
    ap.add_argument("--frames", type=int, default=12)
    ap.add_argument("--width", type=int, default=320)
    ap.add_argument("--height", type=int, default=240)
    args = ap.parse_args()
    model = load_scene(args.scene)
    c, e = model.center().numpy(), model.extent()
    times = []
    with torch.no_grad():
        for i in range(args.frames + 2):
            a = 2 * np.pi * i / args.frames
            cam = rc.Camera.look_at(c + e * np.array([2.5 * np.cos(a), 2.5 * np.sin(a), 1.2]), c, (0, 0, 1),
                                    width=args.width, height=args.height, fov_x_deg=50)
            t = time.perf_counter()
            out = rc.render(model, cam)
            if i >= 2:
                times.append(time.perf_counter() - t)
    med = statistics.median(times)
    print(f"{Path(args.scene).name}: {model.num_gaussians} Gaussians, {args.width}x{args.height}, "
          f"torch threads {torch.get_num_threads()}, median {med * 1000:.0f} ms/frame = {1 / med:.2f} frames/s "
          f"(min {min(times) * 1000:.0f} ms, max {max(times) * 1000:.0f} ms, {out.n_entries} entries last frame)")


if __name__ == "__main__":
    main()
