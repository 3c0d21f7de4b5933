"""Regenerate the studio screenshots (issue 18): viewer_progressive.png, viewer_cameras.png, viewer_open.png,
viewer_edit.png, viewer_crop_box.png, viewer_select_footprint.png, viewer_loading.png (and, offscreen,
viewer_camera_path.png) — a ``rigel-viewer`` window (run under
``xvfb-run -a``; any Vulkan device, lavapipe here) driven through the same requests its mouse, keys and panels
send, on the CPU renderer; the frames are the app's own read-back (panels included).

    xvfb-run -a -s "-screen 0 1400x900x24" python docs/gallery/make_studio_gallery.py [--data ../shared/data]

Offscreen on a GPU machine (no display; the CUDA renderer; files named PREFIX + the names above, progressive
left out: it is for slow backends and is off offscreen; a camera path of four keyframes drawn over the scene,
viewer_camera_path.png, added: in a window make_camera_path.py makes that picture):

    python docs/gallery/make_studio_gallery.py --offscreen --device cuda --data $RIGEL_SHARED_DATA \
        --out $OUT/gallery --prefix h200_offscreen_

Needs the donut (``ply/donut_mipsplatting_sh0.ply``) and lego's ``transforms_train.json`` under ``--data``.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))


#: set by --offscreen / --device
OPTS = {"offscreen": False, "device": "cpu", "prefix": ""}


def _viewer(model, size, frames=None, render_scale=0.5, name=""):
    from viewer.app import Viewer
    from viewer.model_slot import ModelSlot
    from viewer.ui import ViewSettings

    if OPTS["device"] != "cpu":
        render_scale = 1.0
    return Viewer(ModelSlot(model), size=size, device=OPTS["device"], frames=frames, scene_name=name,
                  offscreen=OPTS["offscreen"], settings=ViewSettings(render_scale=render_scale, up="+z"))


def _shot(v, **kw):
    return v.read_pixels(v.step(capture=True, **kw))[..., :3].copy()


def _caption(img, text):
    from PIL import Image, ImageDraw

    im = Image.new("RGB", (img.shape[1], img.shape[0] + 22), (0, 0, 0))
    im.paste(Image.fromarray(img), (0, 0))
    ImageDraw.Draw(im).text((8, img.shape[0] + 4), text, fill=(255, 255, 255))
    return np.asarray(im)


def _save(img, path):
    from PIL import Image

    path = path.with_name(OPTS["prefix"] + path.name)
    Image.fromarray(img).save(path, optimize=True)
    print(f"wrote {path} ({path.stat().st_size // 1024} kB)")


def progressive(donut, out):
    from viewer.app import Viewer
    from viewer.model_slot import ModelSlot
    from viewer.ui import ViewSettings

    size = (640, 400)
    t0 = time.perf_counter()
    with Viewer(ModelSlot(donut), size=size, device="cpu", settings=ViewSettings(render_scale=None)) as v:
        first = _shot(v, panels=False)
        t_first = time.perf_counter() - t0
        fs0 = v.stats.frame_size
        while v.stats.frame_size != size:
            v.step()
        full = _shot(v, panels=False)
        t_full = time.perf_counter() - t0
    a = _caption(first, f"first frame (moving): {fs0[0]}x{fs0[1]} after {t_first:.1f} s")
    b = _caption(full, f"camera at rest: refined to {size[0]}x{size[1]} after {t_full:.1f} s")
    _save(np.concatenate([a, np.full((size[1] + 22, 4, 3), 255, np.uint8), b], 1), out / "viewer_progressive.png")


def cameras(scene, lego, out):
    from rigel_core.data import load_dataset

    frames = list(load_dataset(lego, downscale=16, white_bg=True).train)
    with _viewer(scene, (1024, 640), frames, 0.5, "bundled scene + lego cameras") as v:
        v.studio.expand = True      # the first view as it opens: cameras and scene framed together
        for _ in range(3):
            img = _shot(v)
    _save(img, out / "viewer_cameras.png")


def open_file(scene, donut_path, out):
    size = (1024, 600)
    with _viewer(scene, size, None, 0.5, "bundled scene") as v:
        v.studio.expand = True
        v.step()
        v.requests.append(f"open:{donut_path}")
        loading = _shot(v)
        while v.studio.opener.loading:
            v.step()
        for _ in range(2):
            done = _shot(v)
    _save(np.concatenate([_caption(loading, "File > open (or a file dropped on the window): loading on a thread"),
                          np.full((4, size[0], 3), 255, np.uint8),
                          _caption(done, "loaded: the view re-frames to the new scene")], 0), out / "viewer_open.png")


def edit(donut, out):
    with _viewer(donut, (1024, 640), None, 0.5, "donut") as v:
        v.studio.expand = True
        v.step()
        ed = v.studio.editor
        ed.crop_shape, ed.show_gizmo, ed.keep_inside = "sphere", True, True
        ed.sphere_radius *= 0.8
        v.requests.append("edit:crop_sphere")       # the Apply crop button: keep inside the sphere
        v.step()
        v.requests.append("select_rect:540,180,640,620:replace")   # as a Ctrl+drag would send
        v.step()
        v.requests.append("edit:delete")            # the Delete key
        v.step()
        v.requests.append("select_rect:380,190,560,330:replace")   # the selection, tinted in the render
        for _ in range(2):
            img = _shot(v)
    _save(img, out / "viewer_edit.png")


def crop_box(scene, out):
    """The crop box drawn in the view (not applied yet) and a brush stroke's selection tinted in the one render."""
    with _viewer(scene, (1024, 640), None, 0.5, "bundled scene") as v:
        v.studio.expand = True
        v.step()
        ed = v.studio.editor
        ed.crop_shape, ed.show_gizmo = "box", True
        ed.box_half = ed.box_half * [0.55, 0.55, 0.8]
        for i, x in enumerate(range(430, 700, 12)):     # an Alt+drag: the dabs of one stroke
            v.requests.append(f"brush:{x},{300 + 40 * np.sin(x / 40):.0f},18:add:1")
        v.step()
        for _ in range(2):
            img = _shot(v)
    _save(img, out / "viewer_crop_box.png")


def select_footprint(scene, out):
    """The same rectangle selected by projected centres (left) and by footprint (right, the viewer's rule): the
    splats whose visible ellipse reaches into the rectangle are selected too."""
    from PIL import Image, ImageDraw

    size, rect = (640, 400), (300, 150, 420, 260)
    imgs = []
    with _viewer(scene, size, None, 1.0, "bundled scene") as v:
        v.step(panels=False)
        for by in ("centre", "footprint"):
            v.requests.append("edit:clear")
            v.step(panels=False)
            fpts, cam, _, _ = v.studio._window_to_frame(np.reshape(rect, (2, 2)), fb=(1.0, 1.0))
            st = v.studio.editor.ensure_stack(v.model)
            st.select_rect(cam, fpts.reshape(-1), "replace", by=by)
            v.studio._publish_edit()
            for _ in range(2):
                img = _shot(v, panels=False)
            im = Image.fromarray(img)
            ImageDraw.Draw(im).rectangle(rect, outline=(255, 140, 20), width=2)
            imgs.append(_caption(np.asarray(im), f"by {by}: {st.num_selected:,} selected"))
    _save(np.concatenate([imgs[0], np.full((size[1] + 22, 4, 3), 255, np.uint8), imgs[1]], 1),
          out / "viewer_select_footprint.png")


def loading(out):
    """The window as ``rigel-viewer`` opens it on the CPU: the loading frame presented before torch is imported (the
    bundled scene's splat centres point-splatted with numpy, viewer/loading.py), then the scene's first render."""
    from viewer.app import Viewer
    from viewer.loading import adopt_scene, bundled_scene_path, present_loading, scene_preview
    from viewer.model_slot import ModelSlot
    from viewer.scene import default_scene
    from viewer.ui import ViewSettings

    size = (640, 400)
    with Viewer(ModelSlot(), size=size, device="cpu", offscreen=OPTS["offscreen"],
                settings=ViewSettings(render_scale=None)) as v:
        path = bundled_scene_path()
        first = v.read_pixels(present_loading(v, str(path), scene_preview(v, path), capture=True))[..., :3].copy()
        model, name = default_scene()
        adopt_scene(v, model, name, "+z")
        for _ in range(3):
            scene_frame = _shot(v)
    a = _caption(first, "loading frame (before import torch): splat centres, numpy")
    b = _caption(scene_frame, f"then the scene's render ({v.stats.frame_size[0]}x{v.stats.frame_size[1]}, refining)")
    _save(np.concatenate([a, np.full((size[1] + 22, 4, 3), 255, np.uint8), b], 1), out / "viewer_loading.png")


def camera_path(scene, out):
    """A camera path of four keyframes a quarter turn apart, added through the Camera path section's requests
    (as its buttons send them), drawn over the scene (the sampled positions as a line, numbered keyframes, the
    selected one in blue), the preview scrubbed to 40 % of the path and the view stepped back to show it all;
    then its video started (into a temporary folder, cancelled) so that the progress bar shows."""
    import tempfile

    from make_camera_path import stage_path_shot  # this folder (the script's own directory is on sys.path)

    with _viewer(scene, (1024, 860), None, 0.5, "bundled scene") as v, tempfile.TemporaryDirectory() as tmp:
        job = stage_path_shot(v, Path(tmp))  # the same state as make_camera_path.py's shot
        for _ in range(2):
            img = _shot(v)
        job.cancel()
        job.join()
    _save(img, out / "viewer_camera_path.png")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", type=Path, default=ROOT.parent.parent / "shared" / "data")
    ap.add_argument("--out", type=Path, default=ROOT / "docs" / "gallery")
    ap.add_argument("--only", nargs="*", default=None)
    ap.add_argument("--offscreen", action="store_true", help="no display: offscreen Vulkan (a GPU machine)")
    ap.add_argument("--device", default="cpu", help="renderer: cpu (default) or cuda")
    ap.add_argument("--prefix", default="", help="prefix of the written file names (e.g. h200_offscreen_)")
    args = ap.parse_args()
    OPTS.update(offscreen=args.offscreen, device=args.device, prefix=args.prefix)
    args.out.mkdir(parents=True, exist_ok=True)
    import torch

    torch.set_num_threads(1)
    from viewer.scene import default_scene, load_scene_file

    donut_path = args.data / "ply" / "donut_mipsplatting_sh0.ply"
    scene, _ = default_scene()
    # camera_path: offscreen only by default (the window's picture is docs/gallery/make_camera_path.py's)
    todo = args.only or (["cameras", "open", "edit", "crop_box", "footprint", "camera_path"] if args.offscreen else
                         ["progressive", "loading", "cameras", "open", "edit", "crop_box", "footprint"])
    donut = load_scene_file(donut_path) if {"progressive", "edit"} & set(todo) else None
    if "progressive" in todo:
        progressive(donut, args.out)
    if "cameras" in todo:
        cameras(scene, args.data / "lego", args.out)
    if "open" in todo:
        open_file(scene, donut_path, args.out)
    if "edit" in todo:
        edit(donut, args.out)
    if "crop_box" in todo:
        crop_box(scene, args.out)
    if "footprint" in todo:
        select_footprint(scene, args.out)
    if "loading" in todo:
        loading(args.out)
    if "camera_path" in todo:
        camera_path(scene, args.out)


if __name__ == "__main__":
    main()
