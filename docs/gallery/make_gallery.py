"""Regenerate the viewer gallery: real X screenshots of ``rigel-viewer`` windows (Xvfb + any Vulkan device).

    python docs/gallery/make_gallery.py [--data ../shared/data] [--out docs/gallery] [--size 1024x640]

For the bundled scene and each real scene in ``../shared/data`` (the donut, the fruit crop, the guitar
compressed PLY, the biker SPZ) a window is opened exactly as ``rigel-viewer FILE`` opens it (same default up axis and first view), a few
frames are presented, and the X root window is captured with ImageMagick's ``import`` (what a user sees on
the screen, not the app's own read-back; both are compared). Then a small procedural dataset is trained live
in the window's training thread and the screenshot shows the Training and PSNR panels with the per-pixel error
of a training view. PNGs are palette-quantised when needed to stay under 300 kB.

Needs: ``Xvfb`` (started here when DISPLAY is unset), ``import`` (imagemagick), a Vulkan driver.
"""
from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

SCENES = (("donut", "ply/donut_mipsplatting_sh0.ply"), ("fruit", "ply/fruit_drops_minimal_sh3.ply"),
          ("guitar", "compressed/guitar.compressed.ply"), ("biker", "compressed/biker.spz"))
MAX_BYTES = 300_000


def start_xvfb(size):
    if os.environ.get("DISPLAY"):
        return None
    r, w = os.pipe()
    proc = subprocess.Popen(["Xvfb", "-displayfd", str(w), "-screen", "0", f"{size[0]}x{size[1]}x24", "-nolisten",
                             "tcp"], pass_fds=(w,), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    os.close(w)
    with os.fdopen(r) as f:
        os.environ["DISPLAY"] = ":" + f.readline().strip()
    return proc


def grab(viewer, path: Path):
    """Capture the X screen (the window sits at the origin of a bare Xvfb), check it against the presented
    frame, save it under MAX_BYTES."""
    from PIL import Image

    p = viewer.step(capture=True)
    viewer.presenter.wait(p)
    presented = viewer.read_pixels(p)[..., :3]
    with tempfile.TemporaryDirectory() as tmp:
        shot = Path(tmp) / "root.png"
        subprocess.run(["import", "-window", "root", str(shot)], check=True)
        screen = np.asarray(Image.open(shot).convert("RGB"))
    h, w = presented.shape[:2]
    same = (screen[:h, :w] == presented).all(-1).mean()
    print(f"{path.name}: {same:.4f} of the pixels on the X screen equal the presented frame")
    img = Image.fromarray(screen[:h, :w])
    img.save(path, optimize=True)
    if path.stat().st_size > MAX_BYTES:
        img.quantize(colors=256, method=Image.Quantize.MEDIANCUT, dither=Image.Dither.NONE).save(path, optimize=True)
    print(f"wrote {path} ({path.stat().st_size // 1000} kB)")


def scene_shots(data: Path, out: Path, size, frames: int = 3):
    import glfw

    from viewer.app import Viewer
    from viewer.model_slot import ModelSlot
    from viewer.scene import default_up, load_scene_file
    from viewer.ui import ViewSettings

    from rigel_core.data import default_scene_path

    for name, rel in (("bundled", None),) + SCENES:
        path = default_scene_path() if rel is None else data / rel
        rel = rel or "bundled scene"
        model = load_scene_file(path)
        settings = ViewSettings(render_scale=0.5, up=default_up(path, model))
        with Viewer(ModelSlot(model), size=size, device="cpu", settings=settings, scene_name=rel) as v:
            for _ in range(frames):
                glfw.poll_events()
                v.step()
            grab(v, out / f"viewer_{name}.png")


def training_shot(out: Path, size, iters: int, work: Path):
    import glfw
    import torch

    from rigel_core.data import load_dataset, make_dataset
    from rigel_core.train import TrainConfig, Trainer
    from viewer.app import Viewer
    from viewer.camera_control import up_from_cameras
    from viewer.model_slot import ModelSlot
    from viewer.training import TrainingSession
    from viewer.ui import ViewSettings

    data = work / "procedural"
    make_dataset(data, 8000, 96, 96, n_train=32, n_test=6, progress=False, device="cpu")
    ds = load_dataset(data)
    trainer = Trainer(ds, TrainConfig(iterations=iters, eval_every=max(iters // 6, 1), init_points=3000,
                                      densify_from=100, densify_interval=50), device="cpu")
    slot = ModelSlot()
    session = TrainingSession(trainer, slot, work / "run").start()
    while slot.latest() is None:
        time.sleep(0.05)
    cams = [f.camera for f in ds.train]
    settings = ViewSettings(render_scale=0.5, up=up_from_cameras(cams), model_refresh_s=1.0)
    with Viewer(slot, size=size, device="cpu", settings=settings, scene_name="procedural 96x96 (live)",
                training=session, frames=ds.train) as v:
        while v.train_state.status not in ("finished", "failed"):
            glfw.poll_events()
            v.step()
            time.sleep(0.05)
        v.snap_to_camera(3)
        for _ in range(3):
            v.step()
        grab(v, out / "viewer_training.png")
    del torch


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", type=Path, default=ROOT.parent / "shared" / "data")
    ap.add_argument("--out", type=Path, default=ROOT / "docs" / "gallery")
    ap.add_argument("--size", default="1024x640")
    ap.add_argument("--iters", type=int, default=600)
    ap.add_argument("--only", choices=["scenes", "training"], default=None)
    args = ap.parse_args(argv)
    size = tuple(int(v) for v in args.size.split("x"))
    if shutil.which("import") is None:
        print("needs ImageMagick's `import` (apt-get install imagemagick)", file=sys.stderr)
        return 2
    import torch

    torch.set_num_threads(1)
    xvfb = start_xvfb(size)
    args.out.mkdir(parents=True, exist_ok=True)
    try:
        if args.only in (None, "scenes"):
            scene_shots(args.data, args.out, size)
        if args.only in (None, "training"):
            with tempfile.TemporaryDirectory() as tmp:
                training_shot(args.out, size, args.iters, Path(tmp))
    finally:
        if xvfb is not None:
            xvfb.terminate()
            xvfb.wait(10)
    return 0


if __name__ == "__main__":
    sys.exit(main())
