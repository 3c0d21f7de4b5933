"""``rigel-viewer``: look at a Gaussian scene or watch one train, in a window or offscreen.

    rigel-viewer [SCENE] [--cameras DATASET] [--offscreen --frames N --out DIR] [--size 1280x720] [--mode image|alpha|overdraw|
                 side-by-side] [--device auto|cpu|cuda] [--render-scale S] [--up +z] [--white-bg] [--no-vsync]
                 [--debug]
    rigel-viewer --data DIR [--appearance sh|mlp] [--iters N] [--white-bg] [--downscale F] [--max-gaussians N]
                 [--eval-every N] [--device …] [--out RUN] [--paused] [--resume] [--offscreen --frames N]

SCENE is any file ``rigel_core.io.load_scene`` reads (INRIA PLY of any SH degree, compressed PLY, SPZ, rigel
checkpoint); without it the bundled default scene. ``--data`` trains on a dataset
(``rigel_core.data.load_dataset``) in a background thread while the window shows the live model; the run folder
(``--out``, default ``runs/<dataset name>``, or ``runs/<dataset name>-2``, ``-3``, … when that one holds a run)
receives ``checkpoint.safetensors`` and ``model.ply`` when the training finishes, when the window is closed, on
Ctrl-C and after a failure of the training thread. No run is ever replaced: an ``--out`` that holds one is
refused without ``--resume``; saved scenes, screenshots and videos take a new name when theirs exists.

``--cameras DATASET`` draws a dataset's training cameras as frustums in the view of a SCENE (click one to snap
to it); progressive rendering, opening files (drop / File → open) and editing live in the Studio window
(:mod:`viewer.studio`).

``--offscreen`` needs no display: it writes ``frame_XXXX.png`` (with the panels), ``image.png`` /
``alpha.png`` / ``overdraw.png`` and ``summary.json`` into ``--out`` (see :mod:`viewer.offscreen`).
``--path FILE`` opens a camera path in the Camera path section; with ``--offscreen`` it writes the path's frames
instead, ``path_XXXX.png`` (see :mod:`viewer.path_panel`).
Exit status: 0 on success, 1 when something failed, 2 for an input rigel cannot use (a bad scene, dataset or
``--cameras`` file: one line naming it) or when Vulkan or a display is unavailable (the message says what to
install), 130 after Ctrl-C (the training was saved).

The :class:`Viewer` is the UI thread of DESIGN §6: each :meth:`Viewer.step` drains the training events, applies
the pending requests, takes the latest model snapshot from its :class:`~viewer.model_slot.ModelSlot` (the
training thread publishes there), renders it into the next frame-ring slot when something changed (camera,
model, settings, size), builds the ImGui panels and presents.
"""
from __future__ import annotations

import argparse
import contextlib
import logging
import math
import os
import signal
import sys
import threading
import time
from pathlib import Path

from .camera_control import UP_AXES, OrbitCamera
from .model_slot import ModelSlot
from .offscreen import run_offscreen, run_offscreen_training
from .gpu.shaderio import C, MODE_NAMES
from .ui import Stats, ViewSettings, draw_ui
from .ui_state import ErrorView, TrainingState
from .gpu.vk_context import VulkanUnavailable

__all__ = ["Viewer", "main", "build_parser", "run_offscreen", "run_offscreen_training", "config_dir"]

#: on the CPU path the reference renderer takes ~1 s per 320×240 frame of 45k Gaussians: render scale "auto"
#: keeps the frame at about this many pixels there.
CPU_AUTO_PIXELS = 320 * 240
EXIT_INTERRUPTED = 130


def config_dir() -> Path:
    """Where the viewer keeps its settings (the ImGui window layout, ``imgui.ini``):
    ``$XDG_CONFIG_HOME/rigel`` (default ``~/.config/rigel``)."""
    base = os.environ.get("XDG_CONFIG_HOME") or os.path.join(os.path.expanduser("~"), ".config")
    return Path(base) / "rigel"


def _pick_render_device(device: str) -> str:
    import torch

    if device == "cpu":
        return "cpu"
    if device not in ("auto", "cuda"):
        raise ValueError(f"--device must be auto, cpu or cuda, got {device!r}")
    if not torch.cuda.is_available():
        if device == "cuda":
            raise RuntimeError("--device cuda: PyTorch sees no CUDA device")
        return "cpu"
    from rigel_core import _ext

    _ext.get()  # raises with the build instructions when the kernels are missing (never a silent CPU fallback)
    return "cuda"



def framing_box(model):
    """(lo (3,), hi (3,)) float64 numpy: the box the first view fits — the model's robust bounds
    (``model.bounds(0.01)``), widened by 3σ of its largest finite scale where the means alone span (almost)
    nothing: one splat, or several at one point. An empty scene (or one without a finite mean) gets the unit
    box around the origin, so there is always a camera to show the background from."""
    import numpy as np
    import torch

    lo, hi = (t.detach().cpu().double().numpy() for t in model.bounds(0.01))
    size = float(np.linalg.norm(hi - lo))
    if size > 1e-9 * max(1.0, float(np.abs(lo).max()), float(np.abs(hi).max())):
        return lo, hi
    pad = 0.0
    if model.num_gaussians > 0:
        s = model.scales.detach().double()
        s = s[torch.isfinite(s).all(-1)]
        if s.numel():
            pad = 3.0 * float(s.max())
    if not pad > 0 or not np.isfinite(pad):
        pad = 1.0
    return lo - pad, hi + pad

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
    """

    def __init__(self, model_slot: ModelSlot, *, offscreen: bool = False, size=(1280, 720), device: str = "auto",
                 debug: bool = False, settings: ViewSettings | None = None, scene_name: str = "",
                 slots: int = 3, frames_in_flight: int = 2, title: str = "rigel-viewer", training=None,
                 frames=None, ini_path=None):
        from imgui_bundle import imgui, implot

        from .gpu.frame_ring import FrameRing
        from .gpu.presenter import Presenter
        from .gpu.targets import DisplayUnavailable, OffscreenTarget, SwapchainTarget, create_window_surface
        from .gpu.vk_context import VulkanContext, cuda_device_uuid

        self.slot_source = model_slot
        self.offscreen = offscreen
        self.settings = settings or ViewSettings()
        self.stats = Stats(scene=scene_name)
        self.render_device = _pick_render_device(device)
        self.training = training
        self.train_state = TrainingState() if training is not None else None
        self.frames = list(frames or [])
        self.camera_index: int | None = None
        self.error_view: ErrorView | None = None
        self.jobs: dict = {}
        self.window = None
        self.ctx = None
        self._glfw = None
        self._imgui_ctx = self._implot_ctx = None
        self.requests: list = []
        self._rendered_key = None
        self._model_version = -1
        self._model = None
        self._last_present_t = None
        self._pending_screens: list = []
        self._pending_timing = None
        self._pending_error = None
        self._gt_cache = {}
        self._gpu_mem_t = 0.0
        self._model_t = 0.0
        self._stream = None
        self.interrupted = False
        self.screenshot_dir = Path(".")
        self.closed = False
        try:
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
            instance_exts = []
            if not offscreen:
                self._open_window(size, title)
                import glfw

                instance_exts = list(glfw.get_required_instance_extensions() or [])
                if not instance_exts:
                    raise DisplayUnavailable("GLFW reports no Vulkan surface support on this display: use --offscreen")
            self.ctx = VulkanContext(validation=debug, instance_extensions=instance_exts)
            uuid = cuda_device_uuid() if self.render_device == "cuda" else None
            interop = self.render_device == "cuda"
            if offscreen:
                self.ctx.init_device(interop=interop, device_uuid=uuid)
                self.target = OffscreenTarget(self.ctx, size[0], size[1], frames=frames_in_flight)
            else:
                surface = create_window_surface(self.ctx, self.window)
                self.ctx.init_device(surface=surface, interop=interop, device_uuid=uuid)
                self.target = SwapchainTarget(self.ctx, self.window, surface, frames=frames_in_flight,
                                              vsync=self.settings.vsync)
            self.ring = FrameRing(self.ctx, slots, device=self.render_device, capacity=size)
            self.presenter = Presenter(self.ctx, self.target, self.ring, imgui=True, frames=frames_in_flight)
            if self.render_device == "cuda":
                import torch

                self._stream = torch.cuda.Stream()   # the viewer's own stream: renders never queue behind training
            self.stats.vulkan_device = self.ctx.device_name
            self.stats.render_device = self.render_device
            if self.render_device == "cpu" and self.settings.video_size == ViewSettings().video_size:
                self.settings.video_size = (320, 240)   # the CPU reference renders each frame in about a second
            self.camera = OrbitCamera(up=self.settings.up)
            self._auto_scale = self.settings.render_scale is None
            if self._auto_scale:
                self.settings.render_scale = 1.0
            from .studio import Studio

            self.studio = Studio(self)   # progressive rendering, frustums, open, edit (viewer/studio.py)
            self.input = None
            if not offscreen:
                from .glfw_input import GlfwInput

                self.input = GlfwInput(self.window, self.camera)
            self._take_model()
            if self.frames:
                self.camera.frame_cameras([f.camera for f in self.frames])
            else:
                self._face_origin()
                self.frame_scene()
            self.build_ui()  # ImGui warm-up: auto-sized windows are measured on their first frame, not drawn
            self.requests.clear()
        except BaseException:
            self.close()
            raise

    # ---- window --------------------------------------------------------------------------------------------
    def _open_window(self, size, title):
        from .gpu.targets import DisplayUnavailable

        if not (os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY")):
            raise DisplayUnavailable("no display (DISPLAY / WAYLAND_DISPLAY unset): run with --offscreen, or under a "
                                     "virtual display: `apt-get install xvfb` then `xvfb-run -a rigel-viewer …`")
        try:
            import glfw
        except ImportError as e:
            raise DisplayUnavailable(f"the Python package `glfw` is missing ({e}): `pip install glfw`") from None
        if not glfw.init():
            raise DisplayUnavailable("GLFW could not initialise the display "
                                     f"({os.environ.get('DISPLAY') or os.environ.get('WAYLAND_DISPLAY')}): "
                                     "use --offscreen or check the X server")
        self._glfw = glfw
        if not glfw.vulkan_supported():
            raise DisplayUnavailable("GLFW finds no Vulkan loader: `apt-get install libvulkan1 mesa-vulkan-drivers`")
        glfw.window_hint(glfw.CLIENT_API, glfw.NO_API)
        self.window = glfw.create_window(int(size[0]), int(size[1]), title, None, None)
        if not self.window:
            raise DisplayUnavailable("GLFW could not create a window on this display: use --offscreen")

    # ---- scene and camera -------------------------------------------------------------------------------------
    @property
    def model(self):
        """The model snapshot shown now (read-only: it is shared with whoever published it)."""
        return self._model

    @property
    def appearance(self) -> str:
        return "mlp" if getattr(self._model, "appearance", None) is not None else "sh"

    def _take_model(self) -> bool:
        """Adopt the newest published snapshot; True when it changed. On CUDA the viewer's stream first waits
        (on the GPU) for the copy the publisher recorded, and the tensors are marked as used by that stream."""
        snap = self.slot_source.latest()
        if snap is None or snap.version == self._model_version:
            return False
        if self._model is not None and time.perf_counter() - self._model_t < self.settings.model_refresh_s:
            return False   # CPU: the previous snapshot was adopted a moment ago; let the trainer have the cores
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
        self._model_version = snap.version
        self.stats.gaussians = model.num_gaussians
        self.stats.model_info = {k: v for k, v in snap.info.items() if not str(k).startswith("_")}
        return True

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

        if self._model is None:
            return
        lo, hi = (t.detach().cpu().double().numpy() for t in self._model.bounds(0.01))
        center, size = 0.5 * (lo + hi), float(np.linalg.norm(hi - lo))
        if np.linalg.norm(center) > 2.0 * size:
            self.camera.target = center
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

    def _apply_requests(self):
        from . import messages as M

        pending = self.requests + (self.input.actions if self.input else [])
        self.requests = []
        if self.input:
            self.input.actions.clear()
        for r in pending:
            if isinstance(r, M.Command):
                if self.training is not None:
                    self.training.send(r)
            elif self.studio.handle(r):
                pass
            elif r.startswith("mode:"):
                self.settings.mode = int(r[5:])
            elif r == "reset":
                if self.frames:
                    self.camera.reset()       # the home view of the dataset (frame_cameras)
                else:
                    self.frame_scene()        # fit the scene's bounds again, from the current direction
                self.camera_index = None
            elif r == "screenshot":
                self._pending_screens.append(None)
            elif r == "toggle_panels":
                self.settings.show_panels = not self.settings.show_panels
            elif r == "vsync" and hasattr(self.target, "set_vsync"):
                self.target.set_vsync(self.settings.vsync)
            elif r == "up":
                self.camera.set_up(self.settings.up)
            elif r == "fly":
                self.settings.fly = not self.settings.fly
            elif r == "snap":
                self.snap_nearest()
            elif r in ("next_camera", "prev_camera") and self.frames:
                step = 1 if r == "next_camera" else -1
                if self.camera_index is None or self.camera.snapped is None:
                    self.snap_nearest()
                else:
                    self.snap_to_camera(self.camera_index + step)
            elif r == "toggle_training" and self.training is not None:
                running = self.train_state.status == "running"
                self.training.send(M.Pause() if running else M.Resume())
            elif r.startswith("appearance:"):
                self.start_appearance_switch(r.split(":", 1)[1])
            elif r == "save_ply":
                self.start_save_ply()
            elif r == "video":
                self.start_video()
            elif r == "cancel_video" and self.jobs.get("video") is not None:
                self.jobs["video"].cancel()
            elif r.startswith("path:"):
                from .path_panel import apply_request

                apply_request(self, r)
            elif r == "quit" and self.window is not None:
                self._glfw.set_window_should_close(self.window, True)
        if self.camera.snapped is None:
            self.camera_index = None

    # ---- background jobs (the UI keeps drawing) -------------------------------------------------------------
    def start_video(self, path=None, *, frames: int | None = None, size=None):
        """Render an orbit video of the shown model on a background thread (``jobs["video"]``); returns the Job.
        Default path: ``<screenshot dir>/rigel_orbit_<time>.mp4`` (``.gif`` without imageio-ffmpeg)."""
        from .ui_state import Job
        from .video import orbit_cameras, write_orbit_video

        job = self.jobs.get("video")
        if job is not None and not job.done:
            return job
        s = self.settings
        w, h = size or s.video_size
        cams = orbit_cameras(self.camera, int(frames or s.video_frames), w, h)
        path = path or _unused(self.screenshot_dir / time.strftime("rigel_orbit_%Y%m%d_%H%M%S.mp4"))
        bg = (1.0, 1.0, 1.0) if s.white_background else None
        degree = min(s.sh_degree, self._model.active_sh_degree)
        self.jobs["video"] = job = Job("video", write_orbit_video, self._model, cams, path, fps=s.video_fps,
                                       background=bg, sh_degree=degree)
        return job

    def start_save_ply(self, path=None, fmt=None):
        """Write the shown model on a background thread (an MLP appearance is baked to SH), in ``fmt`` (default:
        the Export panel's choice: INRIA PLY, compressed PLY, SPZ or .splat; viewer/export.py)."""
        from .export import export_path
        from .ui_state import Job

        if path:  # never overwrite a file
            from rigel_core.io.export import format_for_path

            path = _unused(Path(path))
            fmt = fmt or format_for_path(path)
        else:
            fmt = fmt or getattr(self.settings, "export_format", "ply")
            path = export_path(self.screenshot_dir, fmt)
        model = self._model

        def save(job):
            from rigel_core.io import save_scene

            m = model
            if getattr(m, "appearance", None) is not None:
                from rigel_core.appearance import to_sh

                m, _ = to_sh(m, 3)
            save_scene(m.to("cpu"), path, format=fmt)
            print(f"rigel-viewer: wrote {path}")
            return path

        self.jobs["save"] = job = Job("save-ply", save)
        return job

    def start_appearance_switch(self, kind: str):
        """Viewing a scene (no training): convert the shown model's colours to ``kind`` ("sh" or "mlp") with
        ``rigel_core.appearance`` (``to_mlp`` distils the SH colours, ``to_sh`` bakes the MLP) on a background
        thread; the result is published into the model slot when done. A training session switches itself
        (the Training window sends ``SetAppearance``)."""
        from .ui_state import Job

        if self.training is not None:
            from . import messages as M

            self.training.send(M.SetAppearance(kind))
            return None
        job = self.jobs.get("appearance")
        if (job is not None and not job.done) or kind == self.appearance:
            return job
        model, slot = self._model, self.slot_source

        def convert(job):
            from rigel_core import appearance as A

            if kind == "mlp":
                out, report = A.to_mlp(model)
                rmse = report.rmse
            else:
                out, rmse = A.to_sh(model, 3)
            info = dict(slot.latest().info) if slot.latest() is not None else {}
            info["appearance"] = f"{kind} (rmse {rmse:.4f})"
            slot.publish(out, **info)
            return rmse

        self.jobs["appearance"] = job = Job("appearance", convert)
        return job

    # ---- rendering ----------------------------------------------------------------------------------------
    def _render(self, fw: int, fh: int):
        """Render the model into the next ring slot (CPU: blocking; CUDA: enqueued on the viewer's stream),
        timing the appearance and rasterization stages."""
        import torch

        from rigel_core.render import compute_colors, rasterize_gaussians

        side = self.settings.mode == C.MODE_SIDE_BY_SIDE        # the panel has its own column there
        cam = self.camera.camera(fw, fh, offset=0.0 if side else None)
        stream = self._stream
        model = self._model
        dev, dtype = model.device, model.dtype
        bg = torch.ones(3, dtype=dtype, device=dev) if self.settings.white_background else None
        degree = min(self.settings.sh_degree, model.active_sh_degree)
        ctx = torch.cuda.stream(stream) if stream is not None else contextlib.nullcontext()
        with ctx, torch.no_grad():
            slot = self.ring.acquire(fw, fh, stream)
            t0 = time.perf_counter()
            if stream is not None:
                ev = [torch.cuda.Event(enable_timing=True) for _ in range(3)]
                ev[0].record(stream)
            colors = self.studio.tint(compute_colors(model, cam, degree), model)   # the selection overlay
            if stream is not None:
                ev[1].record(stream)
            t1 = time.perf_counter()
            rasterize_gaussians(model.means3D, model.quats, model.scales, model.opacities, colors,
                                cam.viewmat_tensor(dev, dtype), cam.K_tensor(dev, dtype), cam.width, cam.height,
                                background=bg, out=(slot.image, slot.final_T, slot.n_contrib))
            if stream is not None:
                ev[2].record(stream)
                self._pending_timing = ev
            else:
                t2 = time.perf_counter()
                self.stats.stage_ms["appearance"] = (t1 - t0) * 1e3
                self.stats.stage_ms["rasterize"] = (t2 - t1) * 1e3
                self.stats.render_ms = (t2 - t0) * 1e3
                self.stats.render_ms_history.append(self.stats.render_ms)
                self.studio.record_render(self.stats.render_ms, fw * fh)
            self._update_error(slot)
            self.ring.release(slot, stream)
        self.stats.frame_size = (fw, fh)
        self.stats.renders += 1

    def _poll_timing(self):
        ev = self._pending_timing
        if ev is not None and ev[2].query():  # never waits
            self.stats.stage_ms["appearance"] = ev[0].elapsed_time(ev[1])
            self.stats.stage_ms["rasterize"] = ev[1].elapsed_time(ev[2])
            self.stats.render_ms = ev[0].elapsed_time(ev[2])
            self.stats.render_ms_history.append(self.stats.render_ms)
            self._pending_timing = None
        if self.render_device == "cuda" and time.perf_counter() - self._gpu_mem_t > 0.5:
            import torch

            self._gpu_mem_t = time.perf_counter()
            total = torch.cuda.get_device_properties(torch.cuda.current_device()).total_memory
            self.stats.gpu_memory = (torch.cuda.memory_allocated(), torch.cuda.memory_reserved(), total)

    # ---- per-pixel error of a training view -----------------------------------------------------------------
    def _ground_truth(self, index: int, width: int, height: int):
        """The training image ``index`` at ``width × height`` (area-averaged when smaller), on the render
        device, cached for the last size asked."""
        import torch
        import torch.nn.functional as F

        key = (index, width, height)
        gt = self._gt_cache.get(key)
        if gt is None:
            img = self.frames[index].image.to(self.render_device, torch.float32)
            if tuple(img.shape[:2]) != (height, width):
                img = F.interpolate(img.permute(2, 0, 1)[None], size=(height, width), mode="area")[0].permute(1, 2, 0)
            self._gt_cache = {key: img.contiguous()}
            gt = self._gt_cache[key]
        return gt

    def _update_error(self, slot):
        """After a render of a snapped training view: |render − GT| per pixel (mean over RGB), downsampled for
        the PSNR window, and the frame's PSNR. CPU: computed now; CUDA: enqueued on the viewer's stream with a
        non-blocking copy to the host, picked up by :meth:`_poll_error` once done (never waited for)."""
        import torch

        idx = self.camera_index
        if idx is None or self.camera.snapped is None or not self.frames:
            self.error_view = None
            return
        gt = self._ground_truth(idx, slot.width, slot.height)
        diff = slot.image.clamp(0.0, 1.0) - gt
        err = diff.abs().mean(-1)
        mse = (diff * diff).mean()
        f = max(1, math.ceil(max(slot.width, slot.height) / 96))
        small = torch.nn.functional.avg_pool2d(err[None, None], f)[0, 0] if f > 1 else err
        name = self.frames[idx].name
        if slot.image.is_cuda:
            host = torch.empty(small.numel() + 1, dtype=torch.float32, pin_memory=True)
            host[:-1].copy_(small.reshape(-1), non_blocking=True)
            host[-1:].copy_(mse.reshape(1), non_blocking=True)
            done = torch.cuda.Event()
            done.record(self._stream)
            self._pending_error = (done, host, tuple(small.shape), name, (slot.width, slot.height))
        else:
            self._set_error(small.numpy().copy(), float(mse), name, (slot.width, slot.height))

    def _set_error(self, values, mse: float, name: str, frame_size):
        psnr = math.inf if mse <= 0 else 10.0 * math.log10(1.0 / mse)
        self.error_view = ErrorView(name, values.astype("float32"), psnr, float(values.max()) if values.size else 0.0,
                                    frame_size)

    def _poll_error(self):
        pending = self._pending_error
        if pending is not None and pending[0].query():
            _, host, shape, name, size = pending
            arr = host.numpy()
            self._set_error(arr[:-1].reshape(shape).copy(), float(arr[-1]), name, size)
            self._pending_error = None

    # ---- UI ----------------------------------------------------------------------------------------------------
    def overdraw_max(self, slot=None) -> int:
        """The overdraw colormap's top: the slider's value, or (auto) max(n_contrib) of ``slot`` (default: the
        latest render) once known."""
        if not self.settings.overdraw_auto:
            return max(int(self.settings.overdraw_max), 1)
        slot = slot if slot is not None else self.ring.latest
        return self.ring.overdraw_max(slot) if slot is not None else 1

    def drain_events(self) -> list:
        """Fold the training thread's events into :attr:`train_state` (once per frame; never blocks)."""
        if self.training is None:
            return []
        events = self.training.drain_events()
        for ev in events:
            self.train_state.apply(ev)
        return events

    def build_ui(self, *, panels: bool | None = None):
        """ImGui frame for the current state; returns its draw data."""
        from imgui_bundle import imgui

        from . import path_panel

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
            path_panel.draw_markers(imgui, self, scale)   # the camera path over the view (viewer/path_panel.py)
        finally:
            self.settings.show_panels = show
        imgui.render()
        self.stats.stage_ms["ui"] = (time.perf_counter() - t0) * 1e3
        return imgui.get_draw_data()

    def step(self, *, capture: bool = False, panels: bool | None = None, force_render: bool = False):
        """One iteration of the UI loop: drain the training events, apply the requests, adopt the newest model,
        render when something changed, build the panels, present. Returns the present number, or None when
        nothing was presented (minimised window). ``capture``: keep the frame for :meth:`read_pixels`."""
        self.drain_events()
        self._apply_requests()
        model_changed = self._take_model()
        if self._model is None:
            raise RuntimeError("the viewer has no model to show")
        self.studio.begin_frame(panels)
        fw, fh = self.frame_size(panels)
        key = (self.camera.version, self._model_version, self.settings.render_key(), (fw, fh), self.settings.up)
        if force_render or key != self._rendered_key or model_changed or self.ring.latest is None:
            self._render(fw, fh)
            self._rendered_key = key
        self._poll_timing()
        self._poll_error()
        draw_data = self.build_ui(panels=panels)
        capture = capture or bool(self._pending_screens)
        # The newest finished render, so that the present never queues a wait before CUDA's signal (FrameRing:
        # one render late while renders are in flight); a capture shows exactly the latest render.
        slot = self.ring.latest if capture else (self.ring.newest_ready() or self.ring.latest)
        t0 = time.perf_counter()
        p = self.presenter.present(slot, mode=self.settings.mode, overdraw_max=self.overdraw_max(slot),
                                   draw_data=draw_data, capture=capture, content=self.content_rect(panels))
        self.stats.stage_ms["present"] = (time.perf_counter() - t0) * 1e3
        if p is not None:
            now = time.perf_counter()
            if self._last_present_t is not None:
                dt = (now - self._last_present_t) * 1e3
                self.stats.frame_ms = dt if self.stats.frame_ms != self.stats.frame_ms else \
                    0.9 * self.stats.frame_ms + 0.1 * dt
            self._last_present_t = now
            self.stats.presents += 1
            if self._pending_screens:
                self._pending_screens.clear()
                self.save_png(p, _unused(self.screenshot_dir / time.strftime("rigel_screenshot_%Y%m%d_%H%M%S.png")))
        return p

    def read_pixels(self, p: int):
        """(H, W, 4) uint8 RGBA of a captured present."""
        return self.presenter.read_pixels(p)

    def save_png(self, p: int, path) -> Path:
        from PIL import Image

        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        Image.fromarray(self.read_pixels(p)[..., :3]).save(path)
        print(f"rigel-viewer: wrote {path}")
        return path

    def should_close(self) -> bool:
        return self.window is not None and bool(self._glfw.window_should_close(self.window))

    def run(self, frames: int | None = None):
        """The windowed loop: poll events, step, until the window closes, Ctrl-C (SIGINT: the loop ends after
        this frame and :meth:`close` saves the training; a second Ctrl-C aborts at once), or ``frames``
        presents. Sets :attr:`interrupted` after a Ctrl-C."""
        glfw = self._glfw
        with _sigint_flag(self):
            logging.getLogger("rigel.viewer").info("window open: %dx%d, %s", self.target.width, self.target.height,
                                                   self.ctx.device_name)
            while not self.should_close() and not self.interrupted:
                glfw.poll_events()
                p = self.step()
                if p is None:
                    glfw.wait_events_timeout(0.05)  # minimised: sleep until something happens
                if frames is not None and self.stats.presents >= frames:
                    break

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
                if self._stream is not None:
                    self._stream.synchronize()
                self.ctx.close()
            from imgui_bundle import imgui, implot

            if self._implot_ctx is not None:
                implot.destroy_context(self._implot_ctx)
            if self._imgui_ctx is not None:
                ini = imgui.get_io().get_ini_filename()
                if ini:
                    imgui.save_ini_settings_to_disk(ini)
                imgui.destroy_context(self._imgui_ctx)
            if self.window is not None:
                self._glfw.destroy_window(self.window)
                self.window = None
            if self._glfw is not None:
                self._glfw.terminate()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


@contextlib.contextmanager
def _sigint_flag(viewer):
    """While inside: the first SIGINT sets ``viewer.interrupted`` (the loop ends cleanly and the training is
    saved), a second one raises KeyboardInterrupt. Only on the main thread (elsewhere a no-op)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum, frame):
        if viewer.interrupted:
            raise KeyboardInterrupt
        viewer.interrupted = True
        what = "saving the training and closing" if getattr(viewer, "training", None) is not None else "closing"
        print(f"rigel-viewer: interrupted, {what} (Ctrl-C again to abort)", file=sys.stderr)

    old = signal.signal(signal.SIGINT, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, old)


# ---- command line -----------------------------------------------------------------------------------------------
def _parse_size(s: str):
    try:
        w, h = (int(v) for v in s.lower().split("x"))
        if w <= 0 or h <= 0:
            raise ValueError
        return w, h
    except ValueError:
        raise argparse.ArgumentTypeError(f"--size must look like 1280x720, got {s!r}") from None


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="rigel-viewer", description="View or train a 3D Gaussian Splatting scene "
                                                                  "(Vulkan).")
    ap.add_argument("scene", nargs="?", help="scene file (.ply, compressed .ply, .spz, .splat, checkpoint); default: "
                                             "the bundled scene")
    ap.add_argument("--offscreen", action="store_true", help="no window: render frames to PNG files (needs --out)")
    ap.add_argument("--frames", type=int, default=None, help="offscreen: frames to write (default 8); windowed: "
                                                             "quit after this many")
    ap.add_argument("--out", type=Path, default=None, help="output folder (offscreen frames, screenshots, videos; "
                                                           "with --data the run folder)")
    ap.add_argument("--path", type=Path, default=None, help="camera path .json to open in the Camera path section; "
                                                            "with --offscreen: write its frames")
    ap.add_argument("--size", type=_parse_size, default=(1280, 720), help="window / image size, e.g. 1280x720")
    ap.add_argument("--mode", choices=list(MODE_NAMES), default="image", help="initial render mode")
    ap.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto",
                    help="render (and training) device")
    ap.add_argument("--render-scale", type=float, default=None,
                    help="frame size / window size (default 1 on CUDA, ~320x240 pixels on the CPU)")
    ap.add_argument("--up", choices=list(UP_AXES), default=None,
                    help="world up axis (default: -y for .spz and compressed PLY, +z for other scenes; with "
                         "--data guessed from the cameras)")
    ap.add_argument("--white-bg", action="store_true", help="white background (with --data: composite the "
                                                            "images' alpha onto white, as NeRF-synthetic)")
    ap.add_argument("--no-vsync", action="store_true", help="present without waiting for vertical sync")
    ap.add_argument("--no-panels", action="store_true", help="hide the ImGui panels")
    ap.add_argument("--slots", type=int, default=3, help="frame ring slots K (>= 2)")
    ap.add_argument("--debug", action="store_true", help="Vulkan validation layer on")
    ap.add_argument("--cameras", type=Path, default=None,
                    help="dataset folder or transforms .json whose training cameras are drawn in the scene (click "
                         "one to snap to it; [ ] cycle); images downscaled by --downscale")
    ap.add_argument("--threads", type=int, default=None, help="PyTorch CPU threads (default: PyTorch's choice; 1 "
                                                              "is often fastest on a busy machine)")
    t = ap.add_argument_group("live training (--data)")
    t.add_argument("--data", type=Path, default=None, help="dataset folder to train on (Blender, instant-ngp, "
                                                           "COLMAP)")
    t.add_argument("--appearance", choices=["sh", "mlp"], default="sh", help="colour model to train")
    t.add_argument("--iters", type=int, default=None, help="training iterations (default 30000)")
    t.add_argument("--downscale", type=float, default=1, help="divide image sizes by this")
    t.add_argument("--max-gaussians", type=int, default=None, help="hard cap on the Gaussian count")
    t.add_argument("--eval-every", type=int, default=None, help="held-out evaluation interval")
    t.add_argument("--sh-degree", type=int, default=3, help="maximum SH degree (0..3)")
    t.add_argument("--init-points", type=int, default=None, help="random initial points (datasets without SfM)")
    t.add_argument("--test-every", type=int, default=8, help="hold-out stride for instant-ngp / COLMAP data")
    t.add_argument("--seed", type=int, default=None, help="random seed")
    t.add_argument("--paused", action="store_true", help="open with the training paused (press start)")
    t.add_argument("--resume", action="store_true", help="continue from RUN/checkpoint.safetensors")
    return ap


def _setup_logging(run_dir: Path | None) -> logging.Logger:
    log = logging.getLogger("rigel.viewer")
    log.setLevel(logging.INFO)
    log.propagate = False
    for h in list(log.handlers):
        log.removeHandler(h)
        h.close()
    console = logging.StreamHandler(sys.stderr)
    console.setFormatter(logging.Formatter("rigel-viewer: %(message)s"))
    console.setLevel(logging.WARNING)
    log.addHandler(console)
    if run_dir is not None:
        run_dir.mkdir(parents=True, exist_ok=True)
        fh = logging.FileHandler(run_dir / "viewer.log")
        fh.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s", "%Y-%m-%d %H:%M:%S"))
        log.addHandler(fh)
    return log


def _make_trainer(args, device: str, run_dir: Path):
    """The Trainer for ``--data`` (resumed from the run folder's checkpoint with ``--resume``) and the dataset."""
    import dataclasses

    from rigel_core.data import load_dataset
    from rigel_core.train import TrainConfig, Trainer

    from .training import CHECKPOINT_NAME

    ds = load_dataset(args.data, white_bg=args.white_bg, downscale=args.downscale, test_every=args.test_every)
    overrides = {k: v for k, v in {"iterations": args.iters, "max_gaussians": args.max_gaussians,
                                   "eval_every": args.eval_every, "seed": args.seed,
                                   "init_points": args.init_points}.items() if v is not None}
    fields = {f.name for f in dataclasses.fields(TrainConfig)}
    if args.appearance == "mlp":
        if "appearance" in fields:
            overrides["appearance"] = "mlp"
        elif not hasattr(Trainer, "set_appearance"):
            raise ValueError("--appearance mlp: this rigel_core's trainer cannot train the MLP appearance yet "
                             "(TrainConfig.appearance / Trainer.set_appearance missing)")
    ckpt = run_dir / CHECKPOINT_NAME
    if args.resume and ckpt.is_file():
        from rigel_core.checkpoint import read_checkpoint, validate_checkpoint

        saved = validate_checkpoint(ckpt, *read_checkpoint(ckpt)).to_dict()  # CheckpointError naming the field
        saved.update(overrides)
        trainer = Trainer.from_checkpoint(ckpt, ds, device=device, config=TrainConfig.from_dict(saved))
    else:
        trainer = Trainer(ds, TrainConfig(sh_degree=args.sh_degree, **overrides), device=device)
        if args.appearance == "mlp" and "appearance" not in fields:
            trainer.set_appearance("mlp")
    return trainer, ds



def _db(x) -> str:
    """A PSNR for a message: two decimals, or "n/a"."""
    return f"{x:.2f}" if isinstance(x, (int, float)) and math.isfinite(x) else "n/a"


from . import training as _training  # noqa: E402  (the run folder's file names live there)

#: files whose presence means a folder holds a run (of rigel-train or of the viewer)
RUN_FILES = (_training.CHECKPOINT_NAME, _training.PLY_NAME, "metrics.json", "log.txt", "viewer.log")


class RunFolderTaken(ValueError):
    """``--out`` names a folder that already holds a run and ``--resume`` was not given."""


def _holds_run(d: Path) -> bool:
    return d.is_dir() and any((d / f).exists() for f in RUN_FILES)


def _choose_run_dir(args) -> Path:
    """The run folder of ``--data`` training; never one that holds another run.

    ``--resume``: ``--out`` or ``runs/<dataset name>`` as it is. An explicit ``--out`` that holds a run
    (:data:`RUN_FILES`) without ``--resume`` raises :class:`RunFolderTaken`. The default ``runs/<dataset name>``
    becomes ``runs/<dataset name>-2``, ``-3``, … when it holds a run (a finished ``rigel-train`` run, say), so
    training in the viewer never replaces another run's checkpoint or model.
    """
    base = Path("runs") / Path(args.data).resolve().name
    if args.resume:
        return args.out or base
    if args.out is not None:
        if args.out.exists() and not args.out.is_dir():
            raise RunFolderTaken(f"--out {args.out} is a file, not a folder")
        if _holds_run(args.out):
            raise RunFolderTaken(f"{args.out} already holds a run ({', '.join(f for f in RUN_FILES if (args.out / f).exists())}); "
                                 "pass --resume to continue it, or choose another --out")
        return args.out
    out, k = base, 2
    while _holds_run(out) or (out.exists() and not out.is_dir()):
        out = base.with_name(f"{base.name}-{k}")
        k += 1
    return out


def _unused(path: Path) -> Path:
    """``path``, or ``stem_2.png``, ``stem_3.png``, … when it exists (two screenshots in one second)."""
    k = 2
    out = path
    while out.exists():
        out = path.with_name(f"{path.stem}_{k}{path.suffix}")
        k += 1
    return out

def main(argv=None) -> int:
    """Entry point of ``rigel-viewer``; returns the exit status. Warnings (a scene file's, a dataset's) print as one
    ``rigel-viewer: warning: …`` line, not as Python's two-line source report."""
    import warnings

    def one_line(message, category, filename, lineno, file=None, line=None):
        print(f"rigel-viewer: warning: {message}", file=file or sys.stderr)

    shown = warnings.showwarning
    warnings.showwarning = one_line
    try:
        return _main(argv)
    finally:
        warnings.showwarning = shown


def _main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    from rigel_core.io.errors import InputError

    from .gpu.targets import DisplayUnavailable

    if args.offscreen and args.out is None:
        print("rigel-viewer: --offscreen needs --out DIR", file=sys.stderr)
        return 1
    if args.render_scale is not None and not 0 < args.render_scale <= 4:
        print(f"rigel-viewer: --render-scale must be in (0, 4], got {args.render_scale}", file=sys.stderr)
        return 1
    if args.slots < 2:
        print(f"rigel-viewer: --slots must be >= 2, got {args.slots}", file=sys.stderr)
        return 1
    if args.data is not None and args.cameras is not None:
        print("rigel-viewer: --cameras is for viewing a SCENE; with --data the dataset's cameras are shown",
              file=sys.stderr)
        return 1
    if args.data is not None and args.scene:
        print("rigel-viewer: give either a SCENE to view or --data DIR to train, not both", file=sys.stderr)
        return 1
    if args.frames is not None and args.frames < 1:
        print(f"rigel-viewer: --frames must be >= 1, got {args.frames}", file=sys.stderr)
        return 1
    if args.threads is not None:
        if args.threads < 1:
            print(f"rigel-viewer: --threads must be >= 1, got {args.threads}", file=sys.stderr)
            return 1
        import torch

        torch.set_num_threads(args.threads)
    settings = ViewSettings(mode=MODE_NAMES[args.mode], render_scale=args.render_scale,
                            white_background=args.white_bg, vsync=not args.no_vsync, up=args.up or "+z",
                            show_panels=not args.no_panels)
    viewer = session = None
    run_dir = None
    interrupted = False
    try:
        if args.data is not None:
            from .camera_control import up_from_cameras
            from .training import TrainingSession

            run_dir = _choose_run_dir(args)
            log = _setup_logging(run_dir)
            device = _pick_render_device(args.device)
            trainer, ds = _make_trainer(args, device, run_dir)
            frames = list(ds.train)
            if args.up is None:
                settings.up = up_from_cameras([f.camera for f in frames])
            settings.white_background = bool(getattr(ds, "white_bg", args.white_bg))
            if device == "cpu":
                settings.model_refresh_s = 0.5
            slot = ModelSlot()
            session = TrainingSession(trainer, slot, run_dir, running=not args.paused)
            log.info("training %s: %d train / %d test views, %d iterations, run folder %s", args.data,
                     len(ds.train), len(ds.test), trainer.config.iterations, run_dir)
            session.start()
            while slot.latest() is None and session.alive:   # the first snapshot (after the initial evaluation)
                time.sleep(0.01)
            if slot.latest() is None:
                events = session.drain_events()
                failed = [e for e in events if type(e).__name__ == "TrainingFailed"]
                raise RuntimeError(failed[0].message if failed else "the training thread ended before starting")
            viewer = Viewer(slot, offscreen=args.offscreen, size=args.size, device=device, debug=args.debug,
                            settings=settings, scene_name=str(args.data), slots=args.slots, training=session,
                            frames=frames, ini_path=None if args.offscreen else config_dir() / "imgui.ini")
            viewer.screenshot_dir = run_dir
        else:
            from .scene import default_scene, default_up, load_scene_file

            _setup_logging(None)
            if args.scene:
                model, name = load_scene_file(args.scene), str(args.scene)
                settings.up = args.up or default_up(args.scene, model)
            else:
                model, name = default_scene()
            frames = None
            if args.cameras is not None:   # a dataset's training cameras, drawn as frustums (viewer/studio.py)
                from rigel_core.data import load_dataset

                frames = list(load_dataset(args.cameras, downscale=args.downscale).train)
            viewer = Viewer(ModelSlot(model), offscreen=args.offscreen, size=args.size, device=args.device,
                            debug=args.debug, settings=settings, scene_name=name, slots=args.slots, frames=frames,
                            ini_path=None if args.offscreen else config_dir() / "imgui.ini")
            if args.out is not None:
                viewer.screenshot_dir = args.out
        status = 0
        if args.path is not None:   # the Camera path section (viewer/path_panel.py)
            from .path_panel import open_path, run_offscreen_path

            open_path(viewer, args.path)
        if args.offscreen:
            n = 8 if args.frames is None else args.frames
            if args.path is not None and session is None:
                summary = run_offscreen_path(viewer, args.out, args.frames)
                print(f"rigel-viewer: {summary.get('frames', 0)} frames of {args.path} -> {args.out}")
                if not summary["ok"]:
                    print(f"rigel-viewer: {summary['error']}", file=sys.stderr)
                return 0 if summary["ok"] else 1
            if session is not None:
                with _sigint_flag(viewer):
                    summary = run_offscreen_training(viewer, n, args.out)
                interrupted = viewer.interrupted
                print(f"rigel-viewer: trained {summary['iterations']} iterations on {summary['training_device']}, "
                      f"held-out PSNR {_db(summary['psnr_initial'])} -> {_db(summary['psnr'])} dB, "
                      f"{summary['frames']} frames "
                      f"({summary['frame_ring']}) in {summary['seconds']} s -> {args.out}")
            else:
                summary = run_offscreen(viewer, n, args.out)
                print(f"rigel-viewer: {summary['frames']} frames of {summary['scene']} ({summary['gaussians']:,} "
                      f"Gaussians, {viewer.render_device}, {viewer.ctx.device_name}) in {summary['seconds']} s "
                      f"-> {args.out}")
            if not summary["ok"]:
                print(f"rigel-viewer: {summary['error']}", file=sys.stderr)
                status = 1
        else:
            viewer.run(frames=args.frames)
            interrupted = viewer.interrupted
        if viewer.train_state is not None:
            viewer.close()   # stops the training thread, which saves
            if viewer.train_state.status == "failed":
                print(f"rigel-viewer: training failed: {viewer.train_state.error} (see {run_dir / 'viewer.log'})",
                      file=sys.stderr)
                status = 1
        if args.debug:
            from .gpu.vk_context import validation_log

            if validation_log.errors:
                print(f"rigel-viewer: the validation layer reported {validation_log.errors} error(s)",
                      file=sys.stderr)
                status = 1
        return EXIT_INTERRUPTED if interrupted else status
    except (VulkanUnavailable, DisplayUnavailable) as e:
        print(f"rigel-viewer: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("rigel-viewer: interrupted" + (", saving the run" if session is not None else ""), file=sys.stderr)
        return EXIT_INTERRUPTED
    except (InputError, FileNotFoundError, IsADirectoryError) as e:  # a bad or missing scene / dataset file: one
        print(f"rigel-viewer: {e}", file=sys.stderr)                 # line naming it, status 2 as rigel-render/-train
        return 2
    except (FileNotFoundError, ValueError, RuntimeError, OSError, ImportError) as e:
        print(f"rigel-viewer: {e}", file=sys.stderr)
        return 1
    finally:
        if viewer is not None:
            viewer.close()       # with a training thread: stops it and saves the checkpoint and the PLY first
        elif session is not None:
            session.stop(save=True)


if __name__ == "__main__":
    sys.exit(main())
