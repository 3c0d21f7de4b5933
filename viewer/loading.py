"""The viewer's first frame before PyTorch is imported (issue 18: the first frame on the CPU backend within 2 s).

``import torch`` alone takes 1.3–2 s of a launch on a 2-core machine (docs/BENCHMARKS.md, "Viewer first frame on
the CPU"), longer than everything else up to the first render. So ``rigel-viewer`` on the CPU opens the window,
Vulkan and ImGui with an empty :class:`~viewer.model_slot.ModelSlot`, presents a loading frame (the scene's name,
what is happening, and a coarse preview of an INRIA PLY scene such as the bundled one: the splat centres in
their DC colours, point-splatted into a low-resolution image with numpy), and only then imports torch, loads the
scene and hands it to the viewer (:func:`adopt_scene`), whose renders replace the preview. The window path of
:mod:`viewer.cli` does this; ``--offscreen``, ``--data``, ``--cameras`` and the CUDA device load first as before.

Nothing here imports torch; tests/test_first_frame.py checks that no present happens with torch imported before
the loading frame.
"""
from __future__ import annotations

import ctypes
import math
import time
from pathlib import Path

import numpy as np

from .gpu.shaderio import C

__all__ = ["early_device", "bundled_scene_path", "scene_preview", "preview_size", "present_loading", "adopt_scene"]

#: the preview's pixels (about 160×90 in a 16:9 window: one splat centre is one pixel, the present stretches it)
PREVIEW_PIXELS = 160 * 90


def early_device(device: str) -> str | None:
    """The render device when it is known without torch: "cpu" for ``--device cpu``, and for ``auto`` on a
    machine without a CUDA driver (``libcuda.so.1`` cannot be loaded, so torch would find no GPU either);
    None when torch must decide (CUDA)."""
    if device == "cpu":
        return "cpu"
    if device != "auto":
        return None
    try:
        ctypes.CDLL("libcuda.so.1")
    except OSError:
        return "cpu"
    return None


def bundled_scene_path() -> Path:
    """``rigel_core/assets/default_scene.ply``, the file :func:`rigel_core.data.default_scene_path` names (that
    module imports torch); it may be missing (then :func:`viewer.scene.default_scene` generates one)."""
    import rigel_core

    return Path(rigel_core.__file__).resolve().parent / "assets" / "default_scene.ply"


def _read_points(path):
    """(means (N, 3), colours (N, 3) in [0, 1], opacities (N,)) float64 of an INRIA PLY, read by the one PLY reader
    (:func:`rigel_core.io.ply.read_ply_arrays`, torch-free), or None for any other file (compressed PLY, SPZ, a
    checkpoint, an unreadable or malformed file: the loader reports those)."""
    import warnings

    from rigel_core.config import SH_C0
    from rigel_core.io.ply import read_ply_arrays

    try:
        with warnings.catch_warnings():   # NaN values, no splats: the real load warns about them once
            warnings.simplefilter("ignore")
            arrays = read_ply_arrays(path, np.float64)
    except Exception:   # noqa: BLE001  (a preview only: the real load reports the problem in one line)
        return None
    xyz, dc, op = arrays["means3D"], arrays["sh_dc"][:, 0], arrays["opacity_logits"]
    rgb = np.clip(0.5 + SH_C0 * dc, 0.0, 1.0)                          # SH band 0
    alpha = 1.0 / (1.0 + np.exp(-np.clip(op, -30.0, 30.0)))           # the stored logit
    ok = np.isfinite(xyz).all(-1) & np.isfinite(rgb).all(-1)
    return xyz[ok], rgb[ok], alpha[ok]


def scene_preview(viewer, path, up: str | None = None) -> np.ndarray | None:
    """A coarse (H, W, 3) float32 image of the INRIA PLY ``path`` seen from ``viewer``'s opening view, or None.

    The world up is ``up`` (the user's ``--up``) or, as for the loaded scene, :func:`viewer.scene.default_up` of
    the splat centres' 1 %–99 % box; it is set on ``viewer.settings`` and its camera. The viewer's camera is
    framed on that box as :meth:`Viewer.frame_first_view` frames the loaded model (same up, same direction, same
    box, same panel region); each centre is projected with that camera
    (pinhole, horizontal field of view ``camera.fov_deg``, principal point shifted by ``view_offset``) into an
    image of about :data:`PREVIEW_PIXELS`; per pixel the nearest centre's colour, blended over the background
    by its opacity. Pure numpy: no torch."""
    pts = _read_points(path)
    if pts is None or len(pts[0]) == 0:
        return None
    xyz, rgb, alpha = pts
    cam = viewer.camera
    fw, fh = viewer.frame_size()
    lo, hi = np.quantile(xyz, [0.01, 0.99], axis=0)
    if float(np.linalg.norm(hi - lo)) <= 0.0:
        return None
    from .scene import default_up, off_origin
    from .ui import PANEL_WIDTH

    viewer.settings.up = up or default_up(path, box=(lo, hi), inria_ply=True)
    cam.set_up(viewer.settings.up)
    if off_origin(lo, hi):       # as Viewer._face_origin
        cam.target = 0.5 * (lo + hi)
        cam.face(np.zeros(3))

    tw = max(viewer.target.width, 1)
    region = ((PANEL_WIDTH + 20) / tw, 1.0) if viewer.settings.show_panels and tw >= 3 * (PANEL_WIDTH + 20) \
        else (0.0, 1.0)
    cam.frame_box(lo, hi, aspect=fw / fh, region=region)
    w, h = preview_size(viewer)
    return project_points(xyz, rgb, alpha, cam.rotation(), cam.eye, cam.fov_deg, cam.view_offset, w, h,
                          background=1.0 if viewer.settings.white_background else 0.0)


def preview_size(viewer) -> tuple[int, int]:
    """(width, height) of the loading frame's image: the area the present fills (:meth:`Viewer.content_rect`)
    scaled down to about :data:`PREVIEW_PIXELS`, the first width from there whose image the present pass stretches
    over the whole area (it fits an image keeping its aspect and rounds the shown size,
    viewer/gpu/shaders/present_modes.comp: a rounded height off by a pixel would leave a one-pixel bar); the area's
    own size at the latest."""
    fw, fh = viewer.content_rect()[2:]
    w0 = max(1, round(fw * min(1.0, math.sqrt(PREVIEW_PIXELS / (fw * fh)))))
    for w in range(min(w0, fw), fw + 1):
        h = max(1, round(w * fh / fw))
        k = min(fw / w, fh / h)
        if math.floor(w * k + 0.5) == fw and math.floor(h * k + 0.5) == fh:
            return w, h
    return fw, fh


def project_points(xyz, rgb, alpha, R, eye, fov_x_deg, view_offset, width, height, *, background=0.0):
    """Point-splat: (height, width, 3) float32, each pixel the colour of the nearest point projecting into it
    (``R`` world → camera rows right/down/forward, ``eye`` the camera centre; fx = fy from the horizontal field of
    view; principal point ((0.5 + view_offset)·width, height / 2); pixel (u, v) covers [u, u+1) × [v, v+1)),
    composited over ``background`` by its ``alpha``; points behind the near plane (config.NEAR_PLANE) are left out."""
    img = np.full((height, width, 3), background, np.float32)
    pc = (np.asarray(xyz, np.float64) - np.asarray(eye, np.float64)) @ np.asarray(R, np.float64).T
    f = 0.5 * width / math.tan(0.5 * math.radians(fov_x_deg))
    z = pc[:, 2]
    front = z > 0.01
    zf = np.where(front, z, 1.0)
    u = np.floor(f * pc[:, 0] / zf + (0.5 + view_offset) * width).astype(np.int64)
    v = np.floor(f * pc[:, 1] / zf + 0.5 * height).astype(np.int64)
    keep = front & (u >= 0) & (u < width) & (v >= 0) & (v < height)
    if not keep.any():
        return img
    pix, depth = (v * width + u)[keep], z[keep]
    order = np.lexsort((depth, pix))                      # by pixel, nearest first
    first = order[np.unique(pix[order], return_index=True)[1]]
    a = np.asarray(alpha, np.float64)[keep][first, None]
    col = a * np.asarray(rgb, np.float64)[keep][first] + (1.0 - a) * background
    img.reshape(-1, 3)[pix[first]] = col
    return img


def present_loading(viewer, scene: str, preview: np.ndarray | None = None, status: str = "loading the scene", *,
                    capture: bool = False) -> int | None:
    """Present a loading frame in ``viewer`` (whose slot is still empty): ``preview`` (or the background) in the
    frame ring's next slot, with an ImGui window naming ``scene`` and ``status``. The frame loop's counters are
    not touched (``--frames N`` counts renders of the scene). Returns the present number (None: minimised);
    ``capture``: keep it for :meth:`Viewer.read_pixels`."""
    from imgui_bundle import imgui

    bg = 1.0 if viewer.settings.white_background else 0.0
    # no preview: the plain background over the whole view (an image of the frame's aspect, not a letterboxed square)
    img = preview if preview is not None else np.full((*preview_size(viewer)[::-1], 3), bg, np.float32)
    h, w = img.shape[:2]
    ring = viewer.ring
    slot = ring.acquire(w, h, host=True)
    slot.image[...] = img
    slot.final_T[...] = 0.0
    slot.n_contrib[...] = 0
    ring.release(slot)
    io = imgui.get_io()
    if viewer.input is not None:
        viewer.input.new_frame()
        viewer.input.actions.clear()
    else:
        io.display_size = imgui.ImVec2(float(viewer.target.width), float(viewer.target.height))
        io.display_framebuffer_scale = imgui.ImVec2(1.0, 1.0)
        io.delta_time = 1.0 / 30.0
    imgui.new_frame()
    # drawn on the foreground list, not as a window: ImGui does not draw an auto-sized window on its first frame
    dots = "." * (1 + int(time.monotonic() * 3) % 3)
    lines = [(f"Loading {Path(scene).name}", (1.0, 1.0, 1.0, 1.0)), (f"{status}{dots}", (0.75, 0.75, 0.75, 1.0))]
    if preview is not None:
        lines.append(("preview: the splat centres, coarse", (0.6, 0.6, 0.6, 1.0)))
    pad, lh = 12.0, imgui.get_text_line_height_with_spacing()
    bw = max(imgui.calc_text_size(t).x for t, _ in lines) + 2 * pad
    bh = len(lines) * lh + 2 * pad
    x0, y0 = 0.5 * (io.display_size.x - bw), 0.5 * (io.display_size.y - bh)
    dl = imgui.get_foreground_draw_list()
    dl.add_rect_filled(imgui.ImVec2(x0, y0), imgui.ImVec2(x0 + bw, y0 + bh),
                       imgui.get_color_u32(imgui.ImVec4(0.08, 0.08, 0.1, 0.85)), 6.0)
    for i, (text, c) in enumerate(lines):
        dl.add_text(imgui.ImVec2(x0 + pad, y0 + pad + i * lh), imgui.get_color_u32(imgui.ImVec4(*c)), text)
    imgui.render()
    return viewer.presenter.present(slot, mode=C.MODE_IMAGE, overdraw_max=1, draw_data=imgui.get_draw_data(),
                                    capture=capture, content=viewer.content_rect())


def adopt_scene(viewer, model, name: str, up: str) -> None:
    """Give ``viewer`` (opened with an empty slot) its scene: publish ``model``, turn the world up to ``up``, and
    frame the opening view (:meth:`Viewer.frame_first_view`); the next :meth:`Viewer.step` renders it."""
    viewer.settings.up = up
    viewer.camera.set_up(up)
    viewer.stats.scene = name
    viewer.slot_source.publish(model)
    viewer.take_model()
    viewer.frame_first_view()
