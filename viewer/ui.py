"""The viewer's panel state (:class:`ViewSettings`, :class:`Stats`), the labels drawn over the image, and
:func:`draw_ui`, which draws the panels of :mod:`viewer.panels` (one module per panel) each frame.

Windows (dockable into each other when ImGui's docking is on; their places are kept in the imgui ini file):

* **rigel-viewer** (:mod:`viewer.panels.main`) — render mode, render scale, SH degree, background, up axis, camera
  (orbit / fly, reset, snap to and cycle through training cameras), appearance (viewing a scene), export
  (screenshot, PLY, orbit video with a progress bar), camera path (keyframes, preview, save / load, path video:
  :mod:`viewer.panels.camera_path`), stats (Gaussians, fps, ms per stage: appearance, rasterize, present, UI; GPU
  memory on CUDA), and which panels are shown;
* **Training** (:mod:`viewer.panels.training`) — start / pause / step, iteration, loss, elapsed, the view's
  live refresh rate (``ViewSettings.refresh_hz``), densification sliders applied live, appearance SH ↔ MLP, save
  checkpoint / PLY, and any failure of the training thread, in red;
* **PSNR** (:mod:`viewer.panels.psnr`) — train PSNR per window of steps and held-out PSNR at each evaluation
  (implot), beside the per-pixel error of the training view the camera is snapped to.

:func:`draw_ui` only reads state and returns requests (STYLE 10: the app applies them at one point of its
loop): :mod:`viewer.requests` instances and, for the training thread, :mod:`viewer.messages` commands. What it edits
in place lives in :class:`ViewSettings` and in the densification dict of the training state.
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from .gpu.present import panel_rects, scale_bar_rect
from .gpu.shaderio import C
from .panels import camera_path
from .panels.main import MODE_DEPTH, MODE_LABELS, PANELS, main_window as _main_window
from .panels.psnr import psnr_window as _psnr_window
from .panels.training import DENSIFY_SLIDERS, training_window as _training_window  # noqa: F401  (DENSIFY_SLIDERS)
from .panels.widgets import PANEL_WIDTH

__all__ = ["ViewSettings", "Stats", "draw_ui", "MODE_LABELS", "PANEL_WIDTH", "PANELS"]


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
    fly: bool = False               # left drag looks around (fly) instead of orbiting
    panels: dict = field(default_factory=lambda: {k: True for k in PANELS})
    video_frames: int = 60
    video_size: tuple = (640, 480)
    video_fps: int = 30
    export_format: str = "ply"      # Export → save scene: a key of viewer.export.EXPORT_CHOICES
    #: adopt a new training snapshot at most this often (s); the CLI sets 0.5 when the CPU renders, so that the
    #: reference renderer does not take the cores the trainer needs
    model_refresh_s: float = 0.0
    #: while a training runs and nothing moves (no input, no request, the camera and these settings unchanged),
    #: re-render the live model and rebuild the panels at most this many times per second; the presents in between
    #: show the last frame and panels again at no Python cost (viewer/app.py). 0: every present (the frame loop
    #: then shares the interpreter with the trainer at the display's rate). ``rigel-viewer --refresh-hz``
    refresh_hz: float = 10.0     # in [0, viewer.panels.training.REFRESH_HZ_MAX] (the panel's slider)
    camera_path: camera_path.PathEditor = field(default_factory=camera_path.PathEditor)   # the Camera path section
    render_mode: str | None = None  # "default" | "mip" (anti-aliased); None: the scene's own, adopted at first render
    # depth display (issue 17.2): colormap range, the frame's own min/max depth when auto
    depth_auto: bool = True
    depth_near: float = 0.5
    depth_far: float = 20.0

    @property
    def mode_name(self) -> str:
        """The render mode's name in MODE_LABELS (``rigel-viewer --mode``, summary.json): image, ..., depth."""
        return next(name for name, m in MODE_LABELS if m == self.mode)

    def render_key(self):
        """The settings that change the rendered frame (a change triggers a re-render)."""
        return (self.mode == C.MODE_SIDE_BY_SIDE, round(self.render_scale, 4), self.white_background, self.sh_degree,
                self.render_mode, self.depth_key())

    def depth_key(self):
        """None unless the depth mode is shown; then its colormap range (a change re-renders)."""
        if self.mode != MODE_DEPTH:
            return None
        return True if self.depth_auto else (round(self.depth_near, 6), round(self.depth_far, 6))


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
    ui_builds: int = 0             # ImGui frames built (a re-present of the last frame builds none)
    repeats: int = 0               # presents of the last frame and panels again (the live refresh cap)
    held: int = 0                  # frames that showed the picture already presented: nothing submitted
    model_info: dict = field(default_factory=dict)
    render_ms_history: deque = field(default_factory=lambda: deque(maxlen=120))
    stage_ms: dict = field(default_factory=dict)   # "appearance", "rasterize", "present", "ui" → ms
    gpu_memory: tuple | None = None                # (allocated, reserved, total) bytes on CUDA
    render_problem: str | None = None              # why the last render shows nothing (render_view), else None

    @property
    def fps(self) -> float:
        return 1000.0 / self.frame_ms if self.frame_ms and self.frame_ms == self.frame_ms and self.frame_ms > 0 \
            else float("nan")


#: Below this display size (pixels, either side) the panels are not drawn: ImGui keeps a window's corner on
#: screen by moving it, so a window shrunk to a few pixels would leave them shifted off-screen when it grows.
MIN_DISPLAY_FOR_PANELS = 64

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
            if imgui.calc_text_size(name).x * sx + 12 <= pw:   # a title wider than its panel would run into the next
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
            max_sh_degree: int = 3, windowed: bool = True, training=None, error_view=None, jobs=None,
            n_cameras: int = 0, camera_index=None, appearance: str = "sh") -> list:
    """Build this frame's ImGui windows (call between ``imgui.new_frame()`` and ``imgui.render()``).

    Args:
        content: (x, y, w, h) framebuffer area the present pass fills (labels are placed in it).
        training: the :class:`~viewer.ui_state.TrainingState` when a training thread runs (Training and PSNR
            windows), else None. error_view: the :class:`~viewer.ui_state.ErrorView` to show, or None.
        jobs: {"video": Job, "appearance": Job} running or finished background jobs.
        n_cameras, camera_index: training cameras available and the one the view is snapped to.
        appearance: "sh" or "mlp", the colour model of the scene shown.
    Returns: requests for the app — :mod:`viewer.requests` instances, the camera path's ``"path:<action>"`` texts
    and :mod:`viewer.messages` commands for the training thread.
    """
    from imgui_bundle import imgui, implot

    requests: list = []
    _labels(imgui, settings, overdraw_max, content, fb_scale)
    if not settings.show_panels:
        return requests
    io = imgui.get_io()
    display = (io.display_size.x, io.display_size.y)
    if min(display) < MIN_DISPLAY_FOR_PANELS:
        return requests   # a (nearly) collapsed window: ImGui would push the panels off-screen for good
    jobs = jobs or {}
    _main_window(imgui, implot, settings, stats, overdraw_max, max_sh_degree=max_sh_degree, windowed=windowed,
                 n_cameras=n_cameras, camera_index=camera_index, training=training, appearance=appearance, jobs=jobs,
                 requests=requests)
    if training is not None and settings.panels.get("training", True):
        _training_window(imgui, training, display, requests, settings)
    if training is not None and settings.panels.get("psnr", True):
        _psnr_window(imgui, implot, training, error_view, display, requests, n_cameras)
    return requests
