"""The viewer's frame loop: :class:`Viewer` shows the model of a :class:`~viewer.model_slot.ModelSlot` in a window
or offscreen, and is the UI thread of DESIGN §6.

Each :meth:`Viewer.step` is one frame: drain the training events → apply the requests (typed,
:mod:`viewer.requests`, one handler each) → take the newest model snapshot → render it into the next frame-ring
slot when something changed (camera, model, settings, size; :mod:`viewer.render_view`) → build the panels
(:mod:`viewer.ui`, :mod:`viewer.studio`) → present (:mod:`viewer.gpu`). :meth:`Viewer.run` repeats it in a
window; while a training runs it presents at most once per display refresh, even without vsync, and not at all
while the window is minimised, so the UI never takes the trainer's time for frames nobody sees. The offscreen
mode (:mod:`viewer.offscreen`) drives the same public methods.

**The live refresh cap.** The trainer runs in this process's other thread and its step is host-bound, so every
millisecond of Python the frame loop runs is taken from it (one interpreter lock; docs/BENCHMARKS.md, issue 15).
While a training runs and nothing moves — no input event, no request, the camera, the view settings and the
target unchanged — a frame only *re-presents* the last render with the last panels (the presenter submits its
recorded command buffer again: no ImGui frame, no render, no snapshot), and a full frame (newest model, render,
panels) comes at most ``settings.refresh_hz`` times a second (``--refresh-hz``, default 10). Any input, request or
camera move makes the next frame a full one at once, and input keeps frames full for :data:`INPUT_GRACE_S`.
A re-present whose picture is already the one presented last (the same render of the same slot, the same panels,
mode and overdraw scale) is *held*: nothing is submitted — the window, or the offscreen image, keeps showing it —
so between two refreshes the GPU does Vulkan work only when a newer render finished (each present is a switch of
the GPU away from the training's CUDA work, docs/BENCHMARKS.md); ``stats.held`` counts these frames.

Layout: ``viewer/gpu/`` is the engine (Vulkan, CUDA interop, frame ring, passes, presenter), importing nothing of
the application; the application is this loop, :mod:`viewer.cli` (``rigel-viewer``'s arguments, the run folder),
:mod:`viewer.requests`, :mod:`viewer.jobs`, :mod:`viewer.render_view`, :mod:`viewer.window`, the panels
(:mod:`viewer.ui`, :mod:`viewer.studio` and its sections) and the training thread (:mod:`viewer.training`).
"""
from __future__ import annotations

import logging
import math
import time
from pathlib import Path

from rigel_core.deps import require
from rigel_core.run_dir import unused_path

from . import jobs as _jobs
from .camera_control import OrbitCamera, framing_box
from .gpu.shaderio import C
from .model_slot import ModelSlot
from .render_view import ErrorMap, poll_timing, render_view
from .requests import Quit, Request, Screenshot, apply_requests  # noqa: F401  (Quit, Screenshot: public names)
from .ui import MODE_DEPTH, Stats, ViewSettings, draw_ui
from .ui_state import TrainingState
from .window import Window, sigint_flag

__all__ = ["Viewer", "framing_box", "SizeUnsupported"]

#: on the CPU path the reference renderer takes ~1 s per 320×240 frame of 45k Gaussians: render scale "auto"
#: keeps the frame at about this many pixels there.
CPU_AUTO_PIXELS = 320 * 240
#: after an input event the frames stay full (panels rebuilt every frame) this long: hover highlights, a click's
#: release and ImGui's own animations need consecutive ImGui frames
INPUT_GRACE_S = 0.5


def _pick_render_device(device: str) -> str:
    if device == "cpu":
        return "cpu"    # without importing torch: the loading frame comes first (viewer/loading.py)
    if device not in ("auto", "cuda"):
        raise ValueError(f"--device must be auto, cpu or cuda, got {device!r}")
    import torch

    if not torch.cuda.is_available():
        if device == "cuda":
            raise RuntimeError("--device cuda: PyTorch sees no CUDA device")
        return "cpu"
    from rigel_core import _ext

    _ext.get()  # raises with the build instructions when the kernels are missing (never a silent CPU fallback)
    return "cuda"


def _check_size(ctx, size) -> None:
    """Raise :class:`SizeUnsupported` when ``size`` (width, height) exceeds ``ctx``'s ``maxImageDimension2D``."""
    limit = int(ctx.limits.maxImageDimension2D)
    if max(size) > limit:
        raise SizeUnsupported(f"--size {size[0]}x{size[1]}: the Vulkan device {ctx.device_name} takes images of at "
                              f"most {limit}x{limit} pixels")


class SizeUnsupported(ValueError):
    """The window / offscreen size is larger than the Vulkan device's images can be (``maxImageDimension2D``);
    ``rigel-viewer`` says it in one line, status 2."""


class Viewer:
    """Window or offscreen viewer of the model in ``model_slot``.

    Args:
        model_slot: where the model snapshots come from (holds the scene for a plain viewer; a
            :class:`~viewer.training.TrainingSession` publishes there while it trains).
        offscreen: draw into an offscreen image (no display needed) instead of a GLFW window.
        size: (width, height) of the window / offscreen image in pixels.
        device: "auto" | "cpu" | "cuda" for rendering (CUDA uses the interop ring, CPU the host-mapped one).
        debug: Vulkan validation layer on (errors counted in ``viewer.gpu.vk_context.validation_log``).
        settings: initial :class:`ViewSettings`; ``render_scale=None`` there means automatic.
        scene_name: shown in the stats panel.
        training: the training session whose events the Training and PSNR windows show, or None.
        frames: dataset frames (camera, image) to snap to and to compare against (the training views).
        ini_path: where ImGui keeps the windows' places between runs (None: nowhere).
    Raises:
        VulkanUnavailable, DisplayUnavailable: with what to install or do instead.

    Public API (the window loop and :mod:`viewer.offscreen` use only these): :meth:`request`, :meth:`step`,
    :meth:`run`, :meth:`read_pixels`, :meth:`save_png`, :meth:`drain_events`, :meth:`take_model`,
    :meth:`poll_error`, :meth:`wait_rendered`, :meth:`close`; state: ``settings``, ``stats``, ``camera``,
    ``model``, ``train_state``, ``error_view``, ``frames``, ``jobs``, ``ring``, ``ctx``, ``target``.
    """

    def __init__(self, model_slot: ModelSlot, *, offscreen: bool = False, size=(1280, 720), device: str = "auto",
                 debug: bool = False, settings: ViewSettings | None = None, scene_name: str = "",
                 slots: int = 3, frames_in_flight: int = 2, title: str = "rigel-viewer", training=None,
                 frames=None, ini_path=None):
        self.slot_source = model_slot
        self.offscreen = offscreen
        self.settings = settings or ViewSettings()
        self.stats = Stats(scene=scene_name)
        self.render_device = _pick_render_device(device)
        self.training = training
        self.train_state = TrainingState() if training is not None else None
        self.frames = list(frames or [])
        #: the latest snapshot's pose corrections while a run refines its poses (viewer.training.PoseSnapshot)
        self.pose_snapshot = None
        self.camera_index: int | None = None
        self.jobs: dict = {}
        self.win = self.window = self.ctx = self._stream = None
        self._imgui_ctx = self._implot_ctx = None
        self.requests: list = []          # pending requests (Request, training commands, studio/path texts)
        self._rendered_key = None
        self._model_version = -1
        self._model = None
        self._last_present_t = None
        self._last_frame_t = None         # the frame loop's last frame, presented or held (the loop's pacing)
        self._screenshot = False
        self._pending_timing = None
        self._gpu_mem_t = self._model_t = 0.0
        self._last_full = None            # (time, still key, present arguments) of the last full frame
        self._input_seen = 0
        self._busy_until = 0.0
        self.interrupted = self.closed = False
        self.screenshot_dir = Path(".")
        try:
            self._setup(offscreen, size, title, debug, slots, frames_in_flight, ini_path)
        except BaseException:
            self.close()
            raise

    def _setup(self, offscreen, size, title, debug, slots, frames_in_flight, ini_path):
        require("imgui_bundle", package="imgui-bundle", extra="viewer", purpose="the viewer")
        from imgui_bundle import imgui, implot

        from .gpu.frame_ring import FrameRing
        from .gpu.presenter import Presenter
        from .gpu.targets import OffscreenTarget, SwapchainTarget, create_window_surface
        from .gpu.vk_context import VulkanContext, cuda_device_uuid
        from .studio import Studio

        self._imgui_ctx = imgui.create_context()
        self._implot_ctx = implot.create_context()
        io = imgui.get_io()
        if ini_path:
            try:
                Path(ini_path).parent.mkdir(parents=True, exist_ok=True)
            except OSError as e:   # a read-only home: the layout is simply not kept
                logging.getLogger("rigel.viewer").warning("cannot keep the panel layout in %s: %s", ini_path, e)
                ini_path = None
        io.set_ini_filename(str(ini_path) if ini_path else "")
        io.config_flags |= imgui.ConfigFlags_.docking_enable   # windows dock into each other (one viewport)
        if not offscreen:
            self.win = Window(size, title)
            self.window = self.win.handle
        self.ctx = VulkanContext(validation=debug, instance_extensions=self.win.instance_extensions if self.win else [])
        uuid = cuda_device_uuid() if self.render_device == "cuda" else None
        interop = self.render_device == "cuda"
        if offscreen:
            self.ctx.init_device(interop=interop, device_uuid=uuid)
            _check_size(self.ctx, size)
            self.target = OffscreenTarget(self.ctx, size[0], size[1], frames=frames_in_flight)
        else:
            surface = create_window_surface(self.ctx, self.window)
            self.ctx.init_device(surface=surface, interop=interop, device_uuid=uuid)
            _check_size(self.ctx, size)
            self.target = SwapchainTarget(self.ctx, self.window, surface, frames=frames_in_flight,
                                          vsync=self.settings.vsync)
        self.ring = FrameRing(self.ctx, slots, device=self.render_device, capacity=size)
        self.presenter = Presenter(self.ctx, self.target, self.ring, imgui=True, frames=frames_in_flight)
        if self.render_device == "cuda":
            import torch

            self._stream = torch.cuda.Stream()   # the viewer's own stream: renders never queue behind training
        self.errors = ErrorMap(self.frames, self.render_device, self._stream)
        self.stats.vulkan_device = self.ctx.device_name
        self.stats.render_device = self.render_device
        if self.render_device == "cpu" and self.settings.video_size == ViewSettings().video_size:
            self.settings.video_size = (320, 240)   # the CPU reference renders each frame in about a second
        self.camera = OrbitCamera(up=self.settings.up)
        self._auto_scale = self.settings.render_scale is None
        if self._auto_scale:
            self.settings.render_scale = 1.0
        self.studio = Studio(self)   # progressive rendering, frustums, open, edit (viewer/studio.py)
        self.input = None
        if not offscreen:
            from .glfw_input import GlfwInput

            self.input = GlfwInput(self.window, self.camera)
        self.take_model()   # an empty slot: the scene comes after the loading frame (viewer/loading.py)
        self.frame_first_view()
        self.build_ui()  # ImGui warm-up: auto-sized windows are measured on their first frame, not drawn
        self.requests.clear()

    # ---- scene and camera -------------------------------------------------------------------------------------
    @property
    def model(self):
        """The model snapshot shown now (read-only: it is shared with whoever published it)."""
        return self._model

    @property
    def appearance(self) -> str:
        return "mlp" if getattr(self._model, "appearance", None) is not None else "sh"

    def take_model(self) -> bool:
        """Adopt the newest published snapshot; True when it changed. On CUDA the viewer's stream first waits
        (on the GPU) for the copy the publisher recorded, and the tensors are marked as used by that stream."""
        if self._model is not None and time.perf_counter() - self._model_t < self.settings.model_refresh_s:
            return False   # CPU: the previous snapshot was adopted a moment ago; let the trainer have the cores
        if self.training is not None:
            self.slot_source.request()    # the trainer copies its model only when asked (ModelSlot.request)
        snap = self.slot_source.latest()
        if snap is None or snap.version == self._model_version:
            return False
        self._model_t = time.perf_counter()
        model = snap.model
        ready = snap.info.get("_ready_event")
        if self._stream is not None and model.device.type == "cuda":
            if ready is not None:
                self._stream.wait_event(ready)
            for t in list(model.parameters().values()) + (list(model.appearance.parameters().values())
                                                          if getattr(model, "appearance", None) is not None else []):
                t.record_stream(self._stream)
        if model.device.type != self.render_device:
            model = model.to(device=self.render_device)   # the appearance module travels with it
        self._model = model
        self.settings.render_mode = self.settings.render_mode or getattr(model, "render_mode", "default")  # mip
        self._model_version = snap.version
        self.stats.gaussians = model.num_gaussians
        self.stats.model_info = {k: v for k, v in snap.info.items() if not str(k).startswith("_")}
        self.pose_snapshot = snap.info.get("_poses")   # a training run's pose corrections (viewer/training.py)
        return True

    def frame_first_view(self):
        """The opening view: the dataset's cameras and the scene (``--cameras``), the training cameras, or the
        scene framed from the origin's side."""
        if self.frames and self.training is None:
            self.studio.frame_with_cameras()   # --cameras: the cameras and the scene together (viewer/studio.py)
        elif self.frames:
            self.camera.frame_cameras([f.camera for f in self.frames])
        else:
            self._face_origin()
            self.frame_scene()

    def frame_scene(self):
        """Fit the model's robust bounds (1 %–99 % box, ``model.bounds(0.01)``; its centre is ``model.center()``)
        into the current frame from the current viewing direction."""
        if self._model is None:
            return
        from .ui import PANEL_WIDTH

        lo, hi = framing_box(self._model)
        fw, fh = self.frame_size()
        region = (0.0, 1.0)
        tw = max(self.target.width, 1)
        if self.settings.show_panels and self.settings.mode != C.MODE_SIDE_BY_SIDE and \
                self.train_state is None and tw >= 3 * (PANEL_WIDTH + 20):
            region = ((PANEL_WIDTH + 20) / tw, 1.0)        # centred right of the main panel
        self.camera.frame_box(lo, hi, aspect=fw / fh, region=region)
        self.camera_index = None

    def _face_origin(self):
        """First view of a scene far from the world origin (a crop of a larger capture): look at it from the
        origin's side, where the capture's cameras usually were, rather than from behind."""
        import numpy as np

        from .scene import model_box, off_origin

        if self._model is None:
            return
        lo, hi = model_box(self._model)
        if off_origin(lo, hi):
            self.camera.target = 0.5 * (lo + hi)
            self.camera.face(np.zeros(3))

    def scene_center(self):
        import numpy as np

        return self._model.center().detach().cpu().numpy().astype(np.float64) if self._model is not None else None

    def snap_to_camera(self, index: int):
        """Show training view ``index`` (wrapped into range) exactly: its pose and intrinsics."""
        if not self.frames:
            return
        index %= len(self.frames)
        self.camera.snap_to(self.frames[index].camera, pivot=self.scene_center())
        self.camera_index = index

    def snap_nearest(self):
        """Snap to the training view whose centre is nearest the current eye."""
        if self.frames:
            from .camera_control import nearest_camera

            self.snap_to_camera(nearest_camera([f.camera for f in self.frames], self.camera.eye,
                                               self.camera.forward))

    # ---- one frame -----------------------------------------------------------------------------------------
    def content_rect(self, panels: bool | None = None):
        """(x, y, w, h) of the target the render modes fill: all of it, except that side-by-side leaves a left
        column to the ImGui panel (when shown and the window is wide enough) so that no panel hides a view."""
        from .ui import PANEL_WIDTH

        tw, th = max(self.target.width, 1), max(self.target.height, 1)
        show = self.settings.show_panels if panels is None else panels
        if self.settings.mode == C.MODE_SIDE_BY_SIDE and show and tw >= 3 * (PANEL_WIDTH + 20):
            x0 = PANEL_WIDTH + 20
            return (x0, 0, tw - x0, th)
        return (0, 0, tw, th)

    def frame_size(self, panels: bool | None = None):
        """(width, height) of the frame to render: the content area (one panel of it in side-by-side) times
        the render scale; a snapped training view keeps its own aspect inside that area."""
        _, _, cw, ch = self.content_rect(panels)
        s = self.settings
        if self._auto_scale and self.render_device == "cpu":
            s.render_scale = min(1.0, math.sqrt(CPU_AUTO_PIXELS / (cw * ch)))
            self._auto_scale = False
        if s.mode == C.MODE_SIDE_BY_SIDE:
            cw = max(cw // 3, 1)
        snapped = self.camera.snapped
        if snapped is not None:
            fit = min(cw / snapped.width, ch / snapped.height)
            cw, ch = snapped.width * fit, snapped.height * fit
        scale = s.render_scale * self.studio.scale   # the progressive scale (1 when off)
        return max(1, round(cw * scale)), max(1, round(ch * scale))

    _take_model = take_model   # viewer/studio.py's name for it

    # ---- the frame loop ----------------------------------------------------------------------------------------
    def request(self, *requests) -> None:
        """Queue requests (:mod:`viewer.requests` classes, training commands, studio / path texts) for the next
        frame; they are applied at its start, in order."""
        self.requests.extend(requests)

    def step(self, *, capture: bool = False, panels: bool | None = None, force_render: bool = False):
        """One frame: drain the training events, apply the requests, adopt the newest model, render when something
        changed, build the panels, present. Returns the present number, or None when nothing was presented
        (minimised window). ``capture``: keep the frame for :meth:`read_pixels`; ``panels``: override
        ``settings.show_panels`` for this frame. While a training runs and nothing moved, a frame between two live
        refreshes presents the last frame again (module docstring); ``capture``, ``panels`` and ``force_render``
        always make a full frame."""
        self.drain_events()
        if not (capture or force_render or panels is not None or self._screenshot) and self._can_repeat():
            return self._present_again()
        pending, self.requests = self.requests + (self.input.actions if self.input else []), []
        if self.input:
            self.input.actions.clear()
        apply_requests(self, pending)
        if self.camera.snapped is None:
            self.camera_index = None
        model_changed = self.take_model()
        if self._model is None:
            raise RuntimeError("the viewer has no model to show")
        self.studio.begin_frame(panels)
        fw, fh = self.frame_size(panels)
        key = (self.camera.version, self._model_version, self.settings.render_key(), (fw, fh), self.settings.up)
        if force_render or key != self._rendered_key or model_changed or self.ring.latest is None:
            render_view(self, fw, fh)
            self._rendered_key = key
        poll_timing(self)
        self.errors.poll()
        if capture and self.input is None:
            # ImGui sizes an auto-resizing panel from the previous frame's contents, so a row that appeared in this
            # frame (the render-time plot after the second frame) was cut off in the written PNG: one layout pass
            # first, its requests dropped (offscreen: no input, nothing clicked)
            queued = len(self.requests)
            self.build_ui(panels=panels)
            del self.requests[queued:]
        draw_data = self.build_ui(panels=panels)
        capture = capture or self._screenshot
        # The newest finished render, so that the present never queues a wait before CUDA's signal (FrameRing:
        # one render late while renders are in flight); a capture shows exactly the latest render.
        slot = self.ring.latest if capture else (self.ring.newest_ready() or self.ring.latest)
        t0 = time.perf_counter()
        mode = C.MODE_IMAGE if self.settings.mode == MODE_DEPTH else self.settings.mode   # depth: colormapped image
        content = self.content_rect(panels)
        p = self.presenter.present(slot, mode=mode, overdraw_max=self.overdraw_max(slot), draw_data=draw_data,
                                   capture=capture, content=content, ui_version=self.stats.ui_builds)
        self.stats.stage_ms["present"] = (time.perf_counter() - t0) * 1e3
        self._last_full = (t0, self._still_key(), (mode, draw_data, content)) if panels is None else None
        if p is not None:
            self._count_present()
            if self._screenshot:
                self._screenshot = False
                self.save_png(p, self.screenshot_dir / time.strftime("rigel_screenshot_%Y%m%d_%H%M%S.png"))
        return p

    def _still_key(self):
        """What a re-present assumes unchanged since the last full frame (a programmatic change of any of it, as
        the offscreen mode makes, makes the next frame a full one)."""
        s = self.settings
        return (self.camera.version, s.render_key(), s.mode, s.show_panels, s.overdraw_auto, s.overdraw_max,
                s.up, self.target.width, self.target.height, self.camera_index, tuple(s.panels.items()))

    def _can_repeat(self) -> bool:
        """True when this frame may present the last frame and panels again: a training runs, the live refresh
        is not due, and nothing moved (no request, no input event for :data:`INPUT_GRACE_S`, no drag or key
        held, the camera and view settings as at the last full frame)."""
        hz = self.settings.refresh_hz
        st = self.train_state
        if not hz or hz <= 0 or st is None or st.status != "running" or self._last_full is None or self.requests:
            return False
        now = time.perf_counter()
        if self.input is not None:
            if self.input.events != self._input_seen or self.input.actions or self.input.active():
                self._input_seen = self.input.events
                self._busy_until = now + INPUT_GRACE_S
                return False
            if now < self._busy_until:
                return False
        t_full, key, _ = self._last_full
        return now - t_full < 1.0 / hz and key == self._still_key() and self.ring.latest is not None

    def _present_again(self):
        """Present the newest finished render with the last full frame's panels (their ImGui draw data stays valid
        until the next ImGui frame): the presenter submits the recording it holds for them, or holds the picture
        when it is the one presented last (module docstring). Returns the present number now shown."""
        mode, draw_data, content = self._last_full[2]
        slot = self.ring.newest_ready() or self.ring.latest
        count = self.presenter.count
        p = self.presenter.present(slot, mode=mode, overdraw_max=self.overdraw_max(slot), draw_data=draw_data,
                                   content=content, ui_version=self.stats.ui_builds, hold=True)
        if p is None:
            return None
        if self.presenter.count == count:   # held: nothing submitted
            self.stats.held += 1
            self._last_frame_t = time.perf_counter()
        else:
            self._count_present()
            self.stats.repeats += 1
        return p

    def run(self, frames: int | None = None):
        """The windowed loop until the window closes, Ctrl-C (the loop ends after this frame and :meth:`close`
        saves the training; a second Ctrl-C aborts at once; sets :attr:`interrupted`), or ``frames`` frames (presented
        or held).
        While training: at most one present per display refresh (even with vsync off), none while minimised."""
        with sigint_flag(self):
            logging.getLogger("rigel.viewer").info("window open: %dx%d, %s", self.target.width, self.target.height,
                                                   self.ctx.device_name)
            period = 1.0 / self.win.refresh_hz()
            while not self.should_close() and not self.interrupted:
                self.win.poll()
                if self.training is not None:
                    if not self.win.visible():
                        self.drain_events()
                        self.win.wait(0.1)      # nobody sees a frame: leave the time to the trainer
                        continue
                    rest = period - (time.perf_counter() - (self._last_frame_t or 0.0))
                    if rest > 0:
                        self.win.wait(rest)     # input wakes it; the present waits for the next refresh
                        continue
                if self.step() is None:
                    self.win.wait(0.05)         # minimised: sleep until something happens
                if frames is not None and self.stats.presents + self.stats.held >= frames:
                    break

    def _count_present(self):
        now = time.perf_counter()
        if self._last_present_t is not None:
            dt = (now - self._last_present_t) * 1e3
            self.stats.frame_ms = dt if math.isnan(self.stats.frame_ms) else 0.9 * self.stats.frame_ms + 0.1 * dt
        self._last_present_t = self._last_frame_t = now
        self.stats.presents += 1

    def build_ui(self, *, panels: bool | None = None):
        """ImGui frame for the current state (its requests queued); returns its draw data."""
        from imgui_bundle import imgui

        from .panels import camera_path

        t0 = time.perf_counter()
        io = imgui.get_io()
        if self.input is not None:
            self.input.fly_mode = self.settings.fly
            self.input.new_frame()
            scale = (io.display_framebuffer_scale.x, io.display_framebuffer_scale.y)
        else:
            io.display_size = imgui.ImVec2(float(self.target.width), float(self.target.height))
            io.display_framebuffer_scale = imgui.ImVec2(1.0, 1.0)
            io.delta_time = 1.0 / 30.0
            scale = (1.0, 1.0)
        imgui.new_frame()
        show = self.settings.show_panels
        if panels is not None:
            self.settings.show_panels = panels
        try:
            model = self._model
            self.requests += draw_ui(self.settings, self.stats, overdraw_max=self.overdraw_max(),
                                     content=self.content_rect(), fb_scale=scale,
                                     max_sh_degree=model.active_sh_degree if model is not None else 0,
                                     windowed=self.window is not None, training=self.train_state,
                                     error_view=self.error_view, jobs=self.jobs, n_cameras=len(self.frames),
                                     camera_index=self.camera_index, appearance=self.appearance)
            self.requests += self.studio.draw(imgui)
            camera_path.draw_markers(imgui, self, scale)   # the camera path over the view (viewer/panels/camera_path.py)
        finally:
            self.settings.show_panels = show
        imgui.render()
        self.stats.ui_builds += 1   # the presenter's ui_version: a recording of the same ImGui frame is reused
        self._last_full = None   # the draw data of the last full frame is gone
        self.stats.stage_ms["ui"] = (time.perf_counter() - t0) * 1e3
        return imgui.get_draw_data()

    # ---- what the requests and the offscreen mode call --------------------------------------------------------
    def drain_events(self) -> list:
        """Fold the training thread's events into :attr:`train_state` (once per frame; never blocks)."""
        if self.training is None:
            return []
        events = self.training.drain_events()
        for ev in events:
            self.train_state.apply(ev)
        return events

    @property
    def error_view(self):
        """The per-pixel error of the snapped training view (:class:`~viewer.ui_state.ErrorView`), or None."""
        return self.errors.view

    def poll_error(self) -> None:
        """Pick up a finished error map (CUDA: without waiting)."""
        self.errors.poll()

    def wait_rendered(self) -> None:
        """Wait until the renders enqueued so far are done (CUDA: the viewer's stream; CPU: they are)."""
        if self._stream is not None:
            self._stream.synchronize()

    def overdraw_max(self, slot=None) -> int:
        """The overdraw colormap's top: the slider's value, or (auto) max(n_contrib) of ``slot`` (default: the
        latest render) once known."""
        if not self.settings.overdraw_auto:
            return max(int(self.settings.overdraw_max), 1)
        slot = slot if slot is not None else self.ring.latest
        return self.ring.overdraw_max(slot) if slot is not None else 1

    def screenshot_next(self) -> None:
        """Save the next present as ``<screenshot dir>/rigel_screenshot_<time>.png`` (a new name when taken)."""
        self._screenshot = True

    def request_close(self) -> None:
        if self.win is not None:
            self.win.request_close()

    def start_video(self, path=None, *, frames: int | None = None, size=None):
        return _jobs.start_video(self, path, frames=frames, size=size)

    def start_save_ply(self, path=None, fmt=None):
        return _jobs.start_save_ply(self, path, fmt)

    def start_appearance_switch(self, kind: str):
        return _jobs.start_appearance_switch(self, kind)

    def read_pixels(self, p: int):
        """(H, W, 4) uint8 RGBA of a captured present."""
        return self.presenter.read_pixels(p)

    def save_png(self, p: int, path) -> Path:
        """Write captured present ``p`` to ``path`` (``path_2.png``, … when it exists: never over a file)."""
        from PIL import Image

        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path = unused_path(path, reserve=True)
        Image.fromarray(self.read_pixels(p)[..., :3]).save(path)
        print(f"rigel-viewer: wrote {path}")
        return path

    def should_close(self) -> bool:
        return self.win is not None and self.win.should_close()

    def close(self, *, save: bool = True):
        """Stop the training thread (saving the checkpoint and the PLY first when ``save``), wait for the
        background jobs, then tear down in order: Vulkan objects (context closes ring, presenter, target,
        surface), ImGui (its ini file is written), window."""
        if self.closed:
            return
        self.closed = True
        try:
            if self.training is not None:
                self.training.stop(save=save)
                self.drain_events()
            for name, job in self.jobs.items():
                if job is not None:
                    if name == "video":
                        job.cancel()          # a half-written video is not worth waiting for
                    job.join()
        finally:
            if self.ctx is not None:
                self.wait_rendered()
                self.ctx.close()
            if self._implot_ctx is not None:   # imgui_bundle imported only when it made a context: a missing
                from imgui_bundle import implot  # package stays the error that _setup raised

                implot.destroy_context(self._implot_ctx)
            if self._imgui_ctx is not None:
                from imgui_bundle import imgui

                ini = imgui.get_io().get_ini_filename()
                if ini:
                    imgui.save_ini_settings_to_disk(ini)
                imgui.destroy_context(self._imgui_ctx)
            if self.win is not None:
                self.win.close()
                self.win = self.window = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


if __name__ == "__main__":  # `python -m viewer.app` as before: the same as `python -m viewer` (viewer/__main__.py)
    import runpy

    runpy.run_module("viewer", run_name="__main__", alter_sys=True)
