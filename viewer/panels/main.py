"""The main window, **rigel-viewer**: render mode, render scale, SH degree, background, up axis, camera (orbit /
fly, reset, snap to and cycle through training cameras), appearance (viewing a scene), export (screenshot, scene
file, orbit video with a progress bar), camera path (:mod:`.camera_path`), stats (Gaussians, fps, ms per stage,
GPU memory on CUDA), and which panels are shown. It edits :class:`viewer.ui.ViewSettings` in place and appends
:mod:`viewer.requests` instances to ``requests``."""
from __future__ import annotations

import numpy as np

from .. import requests as R
from ..camera_control import UP_AXES
from ..export import format_combo
from ..gpu.shaderio import C
from . import camera_path
from .widgets import fmt as _fmt, gib as _gib, window as _window, wrapped_disabled

__all__ = ["main_window", "MODE_LABELS", "MODE_DEPTH", "PANELS"]

#: the panels that can be hidden (key → title): the main window's Stats section, the Training and PSNR windows
PANELS = {"stats": "Stats", "training": "Training", "psnr": "PSNR"}
# depth display (issue 17.2): a host-side mode, not a shader one — the frame's image buffer receives the colormapped
# expected depth (viewer.gpu.colormap.depth_colors) and is presented as MODE_IMAGE
MODE_DEPTH = 100
MODE_LABELS = (("image", C.MODE_IMAGE), ("alpha", C.MODE_ALPHA), ("overdraw", C.MODE_OVERDRAW),
               ("side-by-side", C.MODE_SIDE_BY_SIDE), ("depth", MODE_DEPTH))


def main_window(imgui, implot, settings, stats, overdraw_max: int, *, max_sh_degree, windowed, n_cameras,
                camera_index, training, appearance, jobs, requests):
    """Draw the window (settings: :class:`viewer.ui.ViewSettings`, stats: :class:`viewer.ui.Stats`)."""
    if not _window(imgui, "rigel-viewer", (10, 10)):
        imgui.end()
        return
    if imgui.collapsing_header("Render", imgui.TreeNodeFlags_.default_open):
        imgui.push_item_width(140)
        for i, (name, mode) in enumerate(MODE_LABELS):
            if i % 2:
                imgui.same_line(140)
            if imgui.radio_button(name, settings.mode == mode):
                settings.mode = mode
        _, settings.overdraw_auto = imgui.checkbox("overdraw scale: auto", settings.overdraw_auto)
        if not settings.overdraw_auto:
            _, settings.overdraw_max = imgui.slider_int("max n_contrib", settings.overdraw_max, 1, 2000)
        if settings.mode == MODE_DEPTH:   # depth display (issue 17.2)
            _, settings.depth_auto = imgui.checkbox("depth range: auto", settings.depth_auto)
            if not settings.depth_auto:
                speed = max(settings.depth_far, 1e-3) * 0.005
                _, settings.depth_near = imgui.drag_float("near", settings.depth_near, speed, 0.0, 1e6, "%.3f")
                _, settings.depth_far = imgui.drag_float("far", settings.depth_far, speed, 0.0, 1e6, "%.3f")
                settings.depth_far = max(settings.depth_far, settings.depth_near + 1e-4)
        _, settings.render_scale = imgui.slider_float("render scale", settings.render_scale, 0.1, 1.0, "%.2f")
        if stats.render_problem:  # wrapped to the window, in the panels' error red
            imgui.push_style_color(imgui.Col_.text, imgui.ImVec4(1, 0.35, 0.3, 1))
            imgui.text_wrapped(stats.render_problem)
            imgui.pop_style_color()
        if max_sh_degree > 0:
            # the slider shows the clamp but only a user's change is stored: while training raises the active
            # degree from 0, the requested degree must not be lowered by what the model had at the time
            changed, value = imgui.slider_int("SH degree", min(settings.sh_degree, max_sh_degree), 0, max_sh_degree)
            if changed:
                settings.sh_degree = value
        _, settings.white_background = imgui.checkbox("white background", settings.white_background)
        changed, mip = imgui.checkbox("anti-aliased (mip)", settings.render_mode == "mip")
        if changed:
            settings.render_mode = "mip" if mip else "default"
        if windowed:
            imgui.same_line()
            changed, settings.vsync = imgui.checkbox("vsync", settings.vsync)
            if changed:
                requests.append(R.ApplyVsync())
        if training is None:
            jobs_busy = jobs.get("appearance") is not None and not jobs["appearance"].done
            imgui.text("colour")
            for kind, label in (("sh", "SH"), ("mlp", "MLP")):
                imgui.same_line()
                if imgui.radio_button(label + "##view", appearance == kind) and appearance != kind and not jobs_busy:
                    requests.append(R.SwitchAppearance(kind))
            job = jobs.get("appearance")
            if job is not None and not job.done:
                imgui.same_line()
                imgui.text_disabled("converting...")
            elif job is not None and job.error:
                imgui.text_colored(imgui.ImVec4(1, 0.35, 0.3, 1), job.error[:80])
        imgui.pop_item_width()
    if imgui.collapsing_header("Camera", imgui.TreeNodeFlags_.default_open):
        imgui.push_item_width(140)
        if imgui.radio_button("orbit", not settings.fly):
            settings.fly = False
        imgui.same_line()
        if imgui.radio_button("fly (WASD QE)", settings.fly):
            settings.fly = True
        keys = list(UP_AXES)
        changed, idx = imgui.combo("up axis", keys.index(settings.up) if settings.up in keys else 0, keys)
        if changed:
            settings.up = keys[idx]
            requests.append(R.ApplyUp())
        if imgui.button("reset view (R)"):
            requests.append(R.ResetView())
        if n_cameras:
            imgui.same_line()
            if imgui.button("nearest (T)"):
                requests.append(R.SnapNearest())
            if imgui.button("<##cam"):
                requests.append(R.CycleCamera(-1))
            imgui.same_line()
            label = f"train view {camera_index + 1}/{n_cameras}" if camera_index is not None else \
                f"{n_cameras} train views"
            imgui.text(label)
            imgui.same_line()
            if imgui.button(">##cam"):
                requests.append(R.CycleCamera(1))
        imgui.pop_item_width()
    if imgui.collapsing_header("Export"):
        if imgui.button("screenshot (F12)"):
            requests.append(R.Screenshot())
        imgui.same_line()
        if training is None:  # save the shown scene as PLY / compressed PLY / SPZ / splat (viewer/export.py)
            if imgui.button("save scene"):
                requests.append(R.SaveScene())
            imgui.same_line()
            settings.export_format = format_combo(imgui, settings.export_format)
        imgui.push_item_width(140)
        _, settings.video_frames = imgui.slider_int("video frames", settings.video_frames, 8, 360)
        w, h = settings.video_size
        changed, wh = imgui.input_int2("video size", [int(w), int(h)])
        if changed:
            settings.video_size = (max(16, min(wh[0], 4096)), max(16, min(wh[1], 4096)))
        imgui.pop_item_width()
        job = jobs.get("video")
        if job is not None and not job.done:
            imgui.progress_bar(job.progress, imgui.ImVec2(-1, 0), job.message or "rendering")
            if imgui.button("cancel video"):
                requests.append(R.CancelVideo())
        else:
            if imgui.button("render orbit video"):
                requests.append(R.OrbitVideo())
            if job is not None:
                if job.error:
                    imgui.text_colored(imgui.ImVec4(1, 0.35, 0.3, 1), job.error[:80])
                elif job.result is not None:
                    imgui.text_wrapped(f"wrote {job.result}")
    camera_path.draw_section(imgui, settings.camera_path, jobs, requests)
    if settings.panels.get("stats", True):
        _stats_header(imgui, implot, stats, overdraw_max)
    imgui.text("show:")
    for key, title in PANELS.items():
        if key != "stats" and training is None:
            continue
        imgui.same_line()
        _, settings.panels[key] = imgui.checkbox(title, settings.panels.get(key, True))
    imgui.end()


def _ms(x: float) -> str:
    """Milliseconds for a short label: whole from 100 on, else three significant digits (1.46, 27.3)."""
    return f"{x:.0f}" if x >= 100 else f"{x:.3g}"


def _stats_header(imgui, implot, stats, overdraw_max: int):
    if not imgui.collapsing_header("Stats", imgui.TreeNodeFlags_.default_open):
        return
    imgui.text(f"Gaussians   {stats.gaussians:,}")
    imgui.text(f"frame       {stats.frame_size[0]} x {stats.frame_size[1]}  ({stats.render_device})")
    if stats.fps == stats.fps:
        imgui.text(f"present fps {stats.fps:.1f}  ({stats.frame_ms:.1f} ms)")
    imgui.text(f"render      {_fmt(stats.render_ms, '.1f')} ms")
    for name in ("appearance", "rasterize", "present", "ui"):
        if name in stats.stage_ms:
            imgui.text(f"  {name:<10} {_fmt(stats.stage_ms[name], '.2f')} ms")
    imgui.text(f"overdraw    max {overdraw_max}")
    if stats.gpu_memory is not None:
        a, r, t = stats.gpu_memory
        imgui.text(f"GPU memory  {_gib(a)} / {_gib(r)} / {_gib(t)} GiB")
        imgui.text_disabled("            allocated / reserved / total")
    for k, v in stats.model_info.items():
        if not str(k).startswith("_"):
            imgui.text(f"{k:<11} {v}")
    imgui.text_disabled(stats.vulkan_device[:44])
    history = np.asarray(stats.render_ms_history, dtype=np.float32)
    if len(history) > 1:
        # every frame of the history across the plot (the x axis stayed at ImPlot's default 0..1: the two oldest)
        wrapped_disabled(imgui, f"render ms, last {len(history)} frames: {_ms(history.min())} to "
                                f"{_ms(history.max())}")
        if implot.begin_plot("##render_ms", imgui.ImVec2(-1, 50), implot.Flags_.canvas_only):
            fit = implot.AxisFlags_.no_decorations | implot.AxisFlags_.auto_fit
            implot.setup_axes("", "", fit, fit)
            implot.plot_line("render ms", history)
            implot.end_plot()
