"""Regenerate ``docs/gallery/export_formats.png``: a real scene written in each export format, read back and
rendered on the CPU beside the original, with amplified absolute differences below (×32 by default).

    python docs/gallery/make_export_gallery.py [--data ../shared/data] [--scene ply/donut_mipsplatting_sh0.ply]
                                               [--view 0,-1,1] [--gain 32] [--size 256] [--out docs/gallery/export_formats.png]

Each column is labelled with the format, the file size and the render PSNR against the original (the .splat
column against the original cut to SH degree 0, which is all that format holds; its difference image is against
the full original, so the dropped view-dependent colour shows).
"""
from __future__ import annotations

import argparse
import math
import sys
import tempfile
import warnings
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", default=str(ROOT.parent / "shared" / "data"))
    ap.add_argument("--scene", default="ply/donut_mipsplatting_sh0.ply")
    ap.add_argument("--view", default="0,-1,1", help="direction from the scene's centre to the camera (x,y,z)")
    ap.add_argument("--gain", type=float, default=32.0, help="amplification of the difference images")
    ap.add_argument("--size", type=int, default=256)
    ap.add_argument("--out", default=str(ROOT / "docs" / "gallery" / "export_formats.png"))
    args = ap.parse_args(argv)

    import torch
    from PIL import Image, ImageDraw

    from rigel_core import Camera, render
    from rigel_core.io import load_scene, save_scene

    src = Path(args.data) / args.scene
    model = load_scene(src)
    c = model.center().double().numpy()
    d = np.array([float(v) for v in args.view.split(",")])
    cam = Camera.look_at(c + d / np.linalg.norm(d) * 2.2 * model.extent(), c, up=(0.0, -1.0, 0.0),
                         width=args.size, height=args.size, fov_x_deg=50.0)
    torch.set_num_threads(1)

    def shot(m):
        with torch.no_grad():
            return render(m, cam, background=torch.ones(3)).image.clamp(0, 1).numpy()

    ref = shot(model)
    ref0 = shot(model.with_sh_degree(0))
    cols = [("INRIA PLY (original)", src.stat().st_size, ref, None)]
    with tempfile.TemporaryDirectory() as tmp:
        for label, name in (("compressed PLY", "x.compressed.ply"), ("SPZ v3", "x.spz"), (".splat (SH 0)", "x.splat")):
            path = Path(tmp) / name
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                save_scene(model, path)
                img = shot(load_scene(path))
            base = ref0 if name.endswith(".splat") else ref
            mse = float(((img - base) ** 2).mean())
            cols.append((label, path.stat().st_size, img, 10 * math.log10(1.0 / max(mse, 1e-20))))
    s, pad, text_h = args.size, 4, 30
    canvas = Image.new("RGB", (len(cols) * (s + pad) + pad, 2 * s + 3 * pad + text_h), "white")
    draw = ImageDraw.Draw(canvas)
    for i, (label, nbytes, img, psnr) in enumerate(cols):
        x = pad + i * (s + pad)
        canvas.paste(Image.fromarray((img * 255 + 0.5).astype(np.uint8)), (x, pad))
        diff = np.clip(np.abs(img - ref) * args.gain, 0, 1)
        canvas.paste(Image.fromarray(((1 - diff) * 255 + 0.5).astype(np.uint8)), (x, 2 * pad + s))
        line2 = f"{nbytes / 1024:.0f} KB" + ("" if psnr is None else f", {psnr:.1f} dB")
        draw.text((x + 2, 2 * s + 2 * pad + 2), label, fill="black")
        draw.text((x + 2, 2 * s + 2 * pad + 15), line2 + ("" if psnr is None else f"; below: |diff| x{args.gain:g}"), fill="black")
    canvas.save(args.out, optimize=True)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
