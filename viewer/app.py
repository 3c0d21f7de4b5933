"""``rigel-viewer``: look at a Gaussian scene in a window, or render the viewer's frames offscreen.

    rigel-viewer [SCENE] [--offscreen --frames N --out DIR] [--size 1280x720] [--mode image|alpha|overdraw|
                 side-by-side] [--device auto|cpu|cuda] [--render-scale S] [--up +z] [--white-bg] [--no-vsync]
                 [--debug]

SCENE is any file ``rigel_core.io.load_scene`` reads (INRIA PLY, compressed PLY, SPZ, checkpoint); without it
the bundled default scene. ``--offscreen`` needs no display: it renders N frames on an orbit around the scene
and writes ``frame_XXXX.png`` (with the panels), ``image.png`` / ``alpha.png`` / ``overdraw.png`` of the last
view and ``summary.json`` into DIR. Exit status: 0 on success, 1 when something failed, 2 when Vulkan or a
display is unavailable (the message says what to install).

The :class:`Viewer` is the UI thread of DESIGN §6: each :meth:`Viewer.step` applies the pending requests, takes
the latest model snapshot from its :class:`~viewer.model_slot.ModelSlot` (a trainer thread can publish there),
renders it into the next frame-ring slot when something changed (camera, model, settings, size), builds the
ImGui panels and presents.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from pathlib import Path

from .camera_control import UP_AXES, OrbitCamera
from .model_slot import ModelSlot
from .shaderio import C, MODE_NAMES
from .ui import Stats, ViewSettings, draw_ui
from .vk_context import VulkanUnavailable

__all__ = ["Viewer", "main"]

#: on the CPU path the reference renderer takes ~1 s per 320×240 frame of 45k Gaussians: render scale "auto"
#: keeps the frame at about this many pixels there.
CPU_AUTO_PIXELS = 320 * 240


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


class Viewer:
    """Window or offscreen viewer of the model in ``model_slot``.

    Args:
        model_slot: where the model snapshots come from (holds the scene for a plain viewer).
        offscreen: draw into an offscreen image (no display needed) instead of a GLFW window.
        size: (width, height) of the window / offscreen image in pixels.
        device: "auto" | "cpu" | "cuda" for rendering (CUDA uses the interop ring, CPU the host-mapped one).
        debug: Vulkan validation layer on (errors counted in ``viewer.vk_context.validation_log``).
        settings: initial :class:`ViewSettings`; ``render_scale=None`` there means automatic.
        scene_name: shown in the stats panel.
    Raises:
        VulkanUnavailable, DisplayUnavailable: with what to install or do instead.
    """

    def __init__(self, model_slot: ModelSlot, *, offscreen: bool = False, size=(1280, 720), device: str = "auto",
                 debug: bool = False, settings: ViewSettings | None = None, scene_name: str = "",
                 slots: int = 3, frames_in_flight: int = 2, title: str = "rigel-viewer"):
        from imgui_bundle import imgui, implot

        from .frame_ring import FrameRing
        from .presenter import Presenter
        from .targets import DisplayUnavailable, OffscreenTarget, SwapchainTarget, create_window_surface
        from .vk_context import VulkanContext, cuda_device_uuid

        self.slot_source = model_slot
        self.offscreen = offscreen
        self.settings = settings or ViewSettings()
        self.stats = Stats(scene=scene_name)
        self.render_device = _pick_render_device(device)
        self.window = None
        self.ctx = None
        self._glfw = None
        self._imgui_ctx = self._implot_ctx = None
        self.requests: list[str] = []
        self._rendered_key = None
        self._model_version = -1
        self._model = None
        self._last_present_t = None
        self._pending_screens: list = []
        self.screenshot_dir = Path(".")
        self.closed = False
        try:
            self._imgui_ctx = imgui.create_context()
            self._implot_ctx = implot.create_context()
            io = imgui.get_io()
            io.set_ini_filename("")
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
            self.stats.vulkan_device = self.ctx.device_name
            self.stats.render_device = self.render_device
            self.camera = OrbitCamera(up=self.settings.up)
            self._auto_scale = self.settings.render_scale is None
            if self._auto_scale:
                self.settings.render_scale = 1.0
            self.input = None
            if not offscreen:
                from .glfw_input import GlfwInput

                self.input = GlfwInput(self.window, self.camera)
            self._take_model()
            self.frame_scene()
            self.build_ui()  # ImGui warm-up: auto-sized windows are measured on their first frame, not drawn
            self.requests.clear()
        except BaseException:
            self.close()
            raise

    # ---- window --------------------------------------------------------------------------------------------
    def _open_window(self, size, title):
        from .targets import DisplayUnavailable

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
    def _take_model(self) -> bool:
        """Adopt the newest published snapshot; True when it changed."""
        snap = self.slot_source.latest()
        if snap is None or snap.version == self._model_version:
            return False
        model = snap.model
        if model.device.type != self.render_device:
            model = model.to(device=self.render_device)
        self._model = model
        self._model_version = snap.version
        self.stats.gaussians = model.num_gaussians
        self.stats.model_info = dict(snap.info)
        self.settings.sh_degree = min(self.settings.sh_degree, model.sh_degree)
        return True

    def frame_scene(self):
        """Fit the model's robust bounds (1 %–99 % box, ``model.bounds(0.01)``; its centre is ``model.center()``)
        into the current frame from the current viewing direction."""
        if self._model is None:
            return
        lo, hi = self._model.bounds(0.01)
        fw, fh = self.frame_size()
        self.camera.frame_box(lo.detach().cpu().numpy(), hi.detach().cpu().numpy(), aspect=fw / fh)

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
        the render scale."""
        _, _, cw, ch = self.content_rect(panels)
        s = self.settings
        if self._auto_scale and self.render_device == "cpu":
            s.render_scale = min(1.0, math.sqrt(CPU_AUTO_PIXELS / (cw * ch)))
            self._auto_scale = False
        if s.mode == C.MODE_SIDE_BY_SIDE:
            cw = max(cw // 3, 1)
        return max(1, round(cw * s.render_scale)), max(1, round(ch * s.render_scale))

    def _apply_requests(self):
        for r in self.requests + (self.input.actions if self.input else []):
            if r.startswith("mode:"):
                self.settings.mode = int(r[5:])
            elif r == "reset":
                self.frame_scene()
            elif r == "screenshot":
                self._pending_screens.append(None)
            elif r == "toggle_panels":
                self.settings.show_panels = not self.settings.show_panels
            elif r == "vsync" and hasattr(self.target, "set_vsync"):
                self.target.set_vsync(self.settings.vsync)
            elif r == "up":
                self.camera.set_up(self.settings.up)
            elif r == "quit" and self.window is not None:
                self._glfw.set_window_should_close(self.window, True)
        self.requests = []
        if self.input:
            self.input.actions.clear()

    def _render(self, fw: int, fh: int):
        """Render the model into the next ring slot (CPU: blocking; CUDA: enqueued on the current stream)."""
        import torch

        import rigel_core

        cam = self.camera.camera(fw, fh)
        stream = torch.cuda.current_stream() if self.render_device == "cuda" else None
        slot = self.ring.acquire(fw, fh, stream)
        bg = (1.0, 1.0, 1.0) if self.settings.white_background else None
        t0 = time.perf_counter()
        if stream is not None:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record(stream)
        with torch.no_grad():
            rigel_core.render(self._model, cam, background=bg, sh_degree=self.settings.sh_degree,
                              out=(slot.image, slot.final_T, slot.n_contrib))
        if stream is not None:
            end.record(stream)
            self._pending_timing = (start, end)
        else:
            self.stats.render_ms = (time.perf_counter() - t0) * 1e3
            self.stats.render_ms_history.append(self.stats.render_ms)
        self.ring.release(slot, stream)
        self.stats.frame_size = (fw, fh)
        self.stats.renders += 1

    def _poll_timing(self):
        pending = getattr(self, "_pending_timing", None)
        if pending is not None and pending[1].query():  # never waits
            self.stats.render_ms = pending[0].elapsed_time(pending[1])
            self.stats.render_ms_history.append(self.stats.render_ms)
            self._pending_timing = None

    def overdraw_max(self) -> int:
        if not self.settings.overdraw_auto:
            return max(int(self.settings.overdraw_max), 1)
        slot = self.ring.latest
        return self.ring.overdraw_max(slot) if slot is not None else 1

    def build_ui(self, *, panels: bool | None = None):
        """ImGui frame for the current state; returns its draw data."""
        from imgui_bundle import imgui

        io = imgui.get_io()
        if self.input is not None:
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
            self.requests += draw_ui(self.settings, self.stats, overdraw_max=self.overdraw_max(),
                                     content=self.content_rect(), fb_scale=scale,
                                     max_sh_degree=self._model.sh_degree if self._model is not None else 0,
                                     windowed=self.window is not None)
        finally:
            self.settings.show_panels = show
        imgui.render()
        return imgui.get_draw_data()

    def step(self, *, capture: bool = False, panels: bool | None = None, force_render: bool = False):
        """One iteration of the UI loop. Returns the present number, or None when nothing was presented
        (minimised window). ``capture``: keep the frame for :meth:`read_pixels`."""
        self._apply_requests()
        model_changed = self._take_model()
        if self._model is None:
            raise RuntimeError("the viewer has no model to show")
        fw, fh = self.frame_size(panels)
        key = (self.camera.version, self._model_version, self.settings.render_key(), (fw, fh), self.settings.up)
        if force_render or key != self._rendered_key or model_changed or self.ring.latest is None:
            self._render(fw, fh)
            self._rendered_key = key
        self._poll_timing()
        draw_data = self.build_ui(panels=panels)
        capture = capture or bool(self._pending_screens)
        p = self.presenter.present(self.ring.latest, mode=self.settings.mode, overdraw_max=self.overdraw_max(),
                                   draw_data=draw_data, capture=capture, content=self.content_rect(panels))
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
                self.save_png(p, self.screenshot_dir / time.strftime("rigel_screenshot_%Y%m%d_%H%M%S.png"))
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
        """The windowed loop: poll events, step, until the window closes (or ``frames`` presents)."""
        glfw = self._glfw
        while not self.should_close():
            glfw.poll_events()
            p = self.step()
            if p is None:
                glfw.wait_events_timeout(0.05)  # minimised: sleep until something happens
            if frames is not None and self.stats.presents >= frames:
                break

    def close(self):
        """Tear down in order: Vulkan objects (context closes ring, presenter, target, surface), ImGui, window."""
        if self.closed:
            return
        self.closed = True
        if self.ctx is not None:
            self.ctx.close()
        from imgui_bundle import imgui, implot

        if self._implot_ctx is not None:
            implot.destroy_context(self._implot_ctx)
        if self._imgui_ctx is not None:
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


# ---- offscreen run ------------------------------------------------------------------------------------------
def run_offscreen(viewer: Viewer, frames: int, out_dir, *, orbit_degrees: float = 360.0) -> dict:
    """Render ``frames`` views on an orbit (``orbit_degrees`` in all), each with the panels, to
    ``out_dir/frame_XXXX.png``; then ``image.png``, ``alpha.png``, ``overdraw.png`` of the last view; returns the
    summary (also written to ``summary.json``)."""
    import numpy as np

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    files, per_frame = [], []
    yaw0 = viewer.camera.yaw
    step = math.radians(orbit_degrees) / max(frames, 1)
    t_start = time.perf_counter()
    for i in range(frames):
        viewer.camera.yaw = yaw0 + i * step
        viewer.camera.version += 1
        t0 = time.perf_counter()
        p = viewer.step(capture=True)
        px = viewer.read_pixels(p)
        dt = (time.perf_counter() - t0) * 1e3
        path = out / f"frame_{i:04d}.png"
        _save_rgb(px, path)
        files.append(path.name)
        per_frame.append({"frame": i, "present": p, "render_ms": round(viewer.stats.render_ms, 3),
                          "frame_ms": round(dt, 3)})
    elapsed = time.perf_counter() - t_start
    slot = viewer.ring.latest
    views = {}
    for name, mode in (("image", C.MODE_IMAGE), ("alpha", C.MODE_ALPHA), ("overdraw", C.MODE_OVERDRAW)):
        keep = viewer.settings.mode
        viewer.settings.mode = mode
        try:
            p = viewer.step(capture=True, panels=False)
        finally:
            viewer.settings.mode = keep
        px = viewer.read_pixels(p)
        _save_rgb(px, out / f"{name}.png")
        files.append(f"{name}.png")
        views[name] = px
    slot = viewer.ring.latest
    alpha = (1.0 - slot.final_T.float()).cpu().numpy()
    n = slot.n_contrib.cpu().numpy()
    img = slot.image.float().cpu().numpy()
    summary = {
        "ok": True,
        "scene": viewer.stats.scene,
        "gaussians": viewer.stats.gaussians,
        "sh_degree": viewer._model.sh_degree,
        "render_device": viewer.render_device,
        "vulkan_device": viewer.ctx.device_name,
        "target_size": [viewer.target.width, viewer.target.height],
        "frame_size": list(viewer.stats.frame_size),
        "mode": next(k for k, v in MODE_NAMES.items() if v == viewer.settings.mode),
        "frames": frames,
        "seconds": round(elapsed, 3),
        "fps": round(frames / elapsed, 3) if elapsed > 0 else None,
        "median_render_ms": float(np.median([f["render_ms"] for f in per_frame])) if per_frame else None,
        "per_frame": per_frame,
        "last_frame": {"image_mean_rgb": [round(float(x), 5) for x in img.reshape(-1, 3).mean(0)],
                       "alpha_coverage": round(float((alpha > 0.5).mean()), 5),
                       "alpha_mean": round(float(alpha.mean()), 5),
                       "n_contrib_max": int(n.max()), "n_contrib_mean": round(float(n.mean()), 3)},
        "files": files,
    }
    from .vk_context import validation_log

    if viewer.ctx.validation:
        summary["validation_errors"] = validation_log.errors
    if not (alpha > 0).any():
        summary["ok"] = False
        summary["error"] = "the last frame is empty: the camera sees no Gaussian"
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    return summary


def _save_rgb(px, path):
    from PIL import Image

    Image.fromarray(px[..., :3]).save(path)


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
    ap = argparse.ArgumentParser(prog="rigel-viewer", description="View a 3D Gaussian Splatting scene (Vulkan).")
    ap.add_argument("scene", nargs="?", help="scene file (.ply, compressed .ply, .spz, checkpoint); default: the "
                                             "bundled scene")
    ap.add_argument("--offscreen", action="store_true", help="no window: render frames to PNG files (needs --out)")
    ap.add_argument("--frames", type=int, default=None, help="offscreen: frames to render (default 8); windowed: "
                                                             "quit after this many")
    ap.add_argument("--out", type=Path, default=None, help="output folder (offscreen frames, screenshots)")
    ap.add_argument("--size", type=_parse_size, default=(1280, 720), help="window / image size, e.g. 1280x720")
    ap.add_argument("--mode", choices=list(MODE_NAMES), default="image", help="initial render mode")
    ap.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto", help="render device")
    ap.add_argument("--render-scale", type=float, default=None,
                    help="frame size / window size (default 1 on CUDA, ~320x240 pixels on the CPU)")
    ap.add_argument("--up", choices=list(UP_AXES), default="+z", help="world up axis of the scene")
    ap.add_argument("--white-bg", action="store_true", help="white background")
    ap.add_argument("--no-vsync", action="store_true", help="present without waiting for vertical sync")
    ap.add_argument("--no-panels", action="store_true", help="hide the ImGui panels")
    ap.add_argument("--slots", type=int, default=3, help="frame ring slots K (>= 2)")
    ap.add_argument("--debug", action="store_true", help="Vulkan validation layer on")
    return ap


def main(argv=None) -> int:
    """Entry point of ``rigel-viewer``; returns the exit status."""
    args = build_parser().parse_args(argv)
    from .targets import DisplayUnavailable

    if args.offscreen and args.out is None:
        print("rigel-viewer: --offscreen needs --out DIR", file=sys.stderr)
        return 1
    if args.render_scale is not None and not 0 < args.render_scale <= 4:
        print(f"rigel-viewer: --render-scale must be in (0, 4], got {args.render_scale}", file=sys.stderr)
        return 1
    if args.slots < 2:
        print(f"rigel-viewer: --slots must be >= 2, got {args.slots}", file=sys.stderr)
        return 1
    settings = ViewSettings(mode=MODE_NAMES[args.mode], render_scale=args.render_scale,
                            white_background=args.white_bg, vsync=not args.no_vsync, up=args.up,
                            show_panels=not args.no_panels)
    viewer = None
    try:
        from .scene import default_scene, load_scene_file

        if args.scene:
            model, name = load_scene_file(args.scene), str(args.scene)
        else:
            model, name = default_scene()
        viewer = Viewer(ModelSlot(model), offscreen=args.offscreen, size=args.size, device=args.device,
                        debug=args.debug, settings=settings, scene_name=name, slots=args.slots)
        if args.out is not None:
            viewer.screenshot_dir = args.out
        if args.offscreen:
            summary = run_offscreen(viewer, 8 if args.frames is None else args.frames, args.out)
            print(f"rigel-viewer: {summary['frames']} frames of {name} ({summary['gaussians']:,} Gaussians, "
                  f"{viewer.render_device}, {viewer.ctx.device_name}) in {summary['seconds']} s -> {args.out}")
            if not summary["ok"]:
                print(f"rigel-viewer: {summary['error']}", file=sys.stderr)
                return 1
        else:
            viewer.run(frames=args.frames)
        if args.debug:
            from .vk_context import validation_log

            if validation_log.errors:
                print(f"rigel-viewer: the validation layer reported {validation_log.errors} error(s)",
                      file=sys.stderr)
                return 1
        return 0
    except (VulkanUnavailable, DisplayUnavailable) as e:
        print(f"rigel-viewer: {e}", file=sys.stderr)
        return 2
    except (FileNotFoundError, ValueError, RuntimeError, OSError) as e:
        print(f"rigel-viewer: {e}", file=sys.stderr)
        return 1
    finally:
        if viewer is not None:
            viewer.close()


if __name__ == "__main__":
    sys.exit(main())
