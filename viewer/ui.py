"""The viewer's ImGui panels: render settings, statistics, and the labels drawn over the image.

:func:`draw_ui` only reads state and returns requests (STYLE 10: the app applies them at one point of its
loop); the settings it edits live in :class:`ViewSettings`.
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

import numpy as np

from .camera_control import UP_AXES
from .present import panel_rects, scale_bar_rect
from .shaderio import C

__all__ = ["ViewSettings", "Stats", "draw_ui", "MODE_LABELS"]

PANEL_WIDTH = 290
MODE_LABELS = (("image", C.MODE_IMAGE), ("alpha", C.MODE_ALPHA), ("overdraw", C.MODE_OVERDRAW),
               ("side-by-side", C.MODE_SIDE_BY_SIDE))


@dataclass
class ViewSettings:
    """What the user can change from the panels (and the command line)."""

    mode: int = C.MODE_IMAGE
    overdraw_auto: bool = True      # scale the overdraw colormap to the frame's max(n_contrib)
    overdraw_max: int = 64          # used when not auto
    render_scale: float = 1.0       # frame size / window size
    white_background: bool = False
    sh_degree: int = 3
    vsync: bool = True
    up: str = "+z"
    show_panels: bool = True

    def render_key(self):
        """The settings that change the rendered frame (a change triggers a re-render)."""
        return (self.mode == C.MODE_SIDE_BY_SIDE, round(self.render_scale, 4), self.white_background, self.sh_degree)


@dataclass
class Stats:
    """Numbers shown in the stats panel."""

    gaussians: int = 0
    scene: str = ""
    render_device: str = ""
    vulkan_device: str = ""
    frame_size: tuple = (0, 0)
    render_ms: float = float("nan")
    frame_ms: float = float("nan")
    renders: int = 0
    presents: int = 0
    model_info: dict = field(default_factory=dict)
    render_ms_history: deque = field(default_factory=lambda: deque(maxlen=120))

    @property
    def fps(self) -> float:
        return 1000.0 / self.frame_ms if self.frame_ms and self.frame_ms == self.frame_ms and self.frame_ms > 0 \
            else float("nan")


def _labels(imgui, settings: ViewSettings, overdraw_max: int, content, fb_scale):
    """Side-by-side panel titles and the overdraw scale-bar numbers, on the background draw list (under the
    panels), in ImGui display coordinates."""
    dl = imgui.get_background_draw_list()
    sx, sy = fb_scale
    white = imgui.get_color_u32(imgui.ImVec4(1, 1, 1, 1))
    shadow = imgui.get_color_u32(imgui.ImVec4(0, 0, 0, 0.85))

    def text(x, y, s):
        dl.add_text(imgui.ImVec2(x / sx + 1, y / sy + 1), shadow, s)
        dl.add_text(imgui.ImVec2(x / sx, y / sy), white, s)

    for mode, px, py, pw, ph in panel_rects(settings.mode, content):
        if settings.mode == C.MODE_SIDE_BY_SIDE:
            name = {C.MODE_IMAGE: "image", C.MODE_ALPHA: "alpha (1 - final_T)", C.MODE_OVERDRAW: "overdraw"}[mode]
            text(px + 6, py + 4, name)
        if mode != C.MODE_OVERDRAW:
            continue
        r = scale_bar_rect(pw, ph)
        if r is None:
            continue
        x0, y0, x1, y1 = r
        for frac in (1.0, 0.5, 0.0):
            value = int(round(overdraw_max * frac))
            label = f"{value}"
            tw = imgui.calc_text_size(label).x * sx
            y = y0 + (1.0 - frac) * (y1 - y0 - 1) - 7 * sy
            text(px + x0 - 6 - tw, py + y, label)
        label = "n_contrib"
        tw = imgui.calc_text_size(label).x * sx
        text(px + x1 - tw, py + max(y0 - 20 * sy, 0), label)


def draw_ui(settings: ViewSettings, stats: Stats, *, overdraw_max: int, content, fb_scale=(1.0, 1.0),
            max_sh_degree: int = 3, windowed: bool = True) -> list[str]:
    """Build this frame's ImGui windows (call between ``imgui.new_frame()`` and ``imgui.render()``).
    ``content``: (x, y, w, h) framebuffer area the present pass fills (labels are placed in it).

    Returns requests for the app: "reset", "screenshot", "vsync", "up".
    """
    from imgui_bundle import imgui, implot

    requests: list[str] = []
    _labels(imgui, settings, overdraw_max, content, fb_scale)
    if not settings.show_panels:
        return requests
    cond = imgui.Cond_.first_use_ever
    imgui.set_next_window_pos(imgui.ImVec2(10, 10), cond)
    imgui.set_next_window_size_constraints(imgui.ImVec2(PANEL_WIDTH, 0), imgui.ImVec2(PANEL_WIDTH, 1e6))
    imgui.set_next_window_bg_alpha(0.85)
    opened = imgui.begin("rigel-viewer", None, imgui.WindowFlags_.always_auto_resize)[0]
    if opened and imgui.collapsing_header("Render", imgui.TreeNodeFlags_.default_open):
        imgui.push_item_width(140)
        for i, (name, mode) in enumerate(MODE_LABELS):
            if i % 2:
                imgui.same_line(140)
            if imgui.radio_button(name, settings.mode == mode):
                settings.mode = mode
        _, settings.overdraw_auto = imgui.checkbox("overdraw scale: auto", settings.overdraw_auto)
        if not settings.overdraw_auto:
            _, settings.overdraw_max = imgui.slider_int("max n_contrib", settings.overdraw_max, 1, 2000)
        _, settings.render_scale = imgui.slider_float("render scale", settings.render_scale, 0.1, 1.0, "%.2f")
        if max_sh_degree > 0:
            _, settings.sh_degree = imgui.slider_int("SH degree", min(settings.sh_degree, max_sh_degree), 0,
                                                     max_sh_degree)
        _, settings.white_background = imgui.checkbox("white background", settings.white_background)
        keys = list(UP_AXES)
        changed, idx = imgui.combo("up axis", keys.index(settings.up) if settings.up in keys else 0, keys)
        if changed:
            settings.up = keys[idx]
            requests.append("up")
        if windowed:
            changed, settings.vsync = imgui.checkbox("vsync", settings.vsync)
            if changed:
                requests.append("vsync")
        if imgui.button("reset view (R)"):
            requests.append("reset")
        imgui.same_line()
        if imgui.button("screenshot (F12)"):
            requests.append("screenshot")
        imgui.pop_item_width()
    if opened and imgui.collapsing_header("Stats", imgui.TreeNodeFlags_.default_open):
        imgui.text(f"Gaussians   {stats.gaussians:,}")
        imgui.text(f"frame       {stats.frame_size[0]} x {stats.frame_size[1]}")
        imgui.text(f"render      {stats.render_ms:.1f} ms ({stats.render_device})")
        if stats.fps == stats.fps:
            imgui.text(f"fps         {stats.fps:.1f}  ({stats.frame_ms:.1f} ms)")
        imgui.text(f"overdraw    max {overdraw_max}")
        for k, v in stats.model_info.items():
            imgui.text(f"{k:<11} {v}")
        imgui.text_disabled(stats.vulkan_device[:44])
        if len(stats.render_ms_history) > 1 and implot.begin_plot("##render_ms", imgui.ImVec2(-1, 60),
                                                                     implot.Flags_.canvas_only):
            implot.setup_axes("", "", implot.AxisFlags_.no_decorations, implot.AxisFlags_.auto_fit)
            implot.plot_line("render ms", np.asarray(stats.render_ms_history, dtype=np.float32))
            implot.end_plot()
    imgui.end()
    return requests
