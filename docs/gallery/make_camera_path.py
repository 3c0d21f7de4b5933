"""Regenerate docs/gallery/viewer_camera_path.png: the viewer's Camera path section in use (offscreen, any Vulkan
device, e.g. lavapipe; no display needed).

    python docs/gallery/make_camera_path.py [--out docs/gallery/viewer_camera_path.png] [--size 1024x640]

The bundled scene is opened as ``rigel-viewer`` opens it, four keyframes are added from views a quarter turn
apart through the panel's requests (as the buttons send them), the second one is selected, the preview is
scrubbed to 40 % of the path, the view stepped back and up to show the path drawn over the scene (the frames'
positions as a line, numbered keyframes, the selected one in blue), and a path video is started so that its
progress bar shows; the frame with the panels is read back and saved.
"""
from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))


def stage_path_shot(v, video_dir: Path, *, file: str | None = None, poll_s: float = 0.2):
    """Put viewer ``v`` in the state the camera-path screenshots show (module docstring): four keyframes a quarter
    turn apart added through the panel's requests, the second selected, the preview scrubbed to 40 %, the view
    stepped back and up, and a path video started into ``video_dir`` and run to a quarter of its frames; ``file``
    (optional) is put in the panel's path field. Returns the video job (the caller cancels and joins it)."""
    v.settings.camera_path.expand = True
    v.settings.video_size = (160, 120)
    v.step()
    for i in range(4):                      # keyframes from the current view, a quarter turn apart
        v.camera.yaw += math.pi / 2 if i else 0.0
        v.camera.pitch = math.radians(15 + 10 * i)
        v.camera.version += 1
        v.requests.append("path:add")
        v.step()
    editor = v.settings.camera_path
    editor.selected = 1
    editor.path.loop = True
    editor.time = 0.4 * editor.span
    if file is not None:
        editor.file = file
    v.requests.append("path:scrub")
    v.step()
    v.camera.reset()                        # step back to see the whole path drawn over the scene
    v.camera.pitch = math.radians(60)
    v.camera.zoom(-14)
    v.step()
    v.screenshot_dir = video_dir
    v.requests.append("path:video")
    v.step()
    job = v.jobs["video"]
    t0 = time.time()
    while job.progress < 0.25 and not job.done and time.time() - t0 < 300:
        time.sleep(poll_s)
    return job


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=ROOT / "docs" / "gallery" / "viewer_camera_path.png")
    ap.add_argument("--size", default="1024x640")
    args = ap.parse_args(argv)
    w, h = (int(v) for v in args.size.split("x"))

    import tempfile

    import torch

    from rigel_core.data import default_scene_path
    from rigel_core.io import load_scene
    from viewer.app import Viewer
    from viewer.model_slot import ModelSlot

    torch.set_num_threads(1)
    model = load_scene(default_scene_path(), device="cpu")
    with Viewer(ModelSlot(model), offscreen=True, size=(w, h), device="cpu") as v, \
            tempfile.TemporaryDirectory() as tmp:
        job = stage_path_shot(v, Path(tmp), file="~/paths/turntable.json", poll_s=0.5)
        p = v.step(capture=True, force_render=False)
        args.out.parent.mkdir(parents=True, exist_ok=True)
        v.save_png(p, args.out)
        job.cancel()
        job.join()
    return 0


if __name__ == "__main__":
    sys.exit(main())
