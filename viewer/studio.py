"""The viewer's studio features in one place, hooked into :class:`viewer.app.Viewer` at a few points:

* progressive rendering (:mod:`viewer.progressive`): :meth:`Studio.begin_frame` sets :attr:`Studio.scale`, which
  ``Viewer.frame_size`` multiplies into the render scale; ``Viewer._render`` reports each frame's time back
  (:meth:`Studio.record_render`);
* training cameras as frustums (:mod:`viewer.frustums`), drawn on ImGui's background draw list with the shown
  frame's camera; a click snaps the view to the camera under it. Where poses were refined (``--pose-opt``,
  :mod:`rigel_core.train.pose`) each training camera's refined frustum is drawn beside its given one, joined to it
  by a line from centre to centre: live from the training run's latest snapshot (:class:`viewer.training.PoseSnapshot`),
  or from a run's ``transforms.json`` (:attr:`Studio.refined`, set by ``rigel-viewer RUN/model.ply --cameras DATA``);
* opening scene files (:mod:`viewer.panels.open`): drag-and-drop (``open:PATH`` from :mod:`viewer.glfw_input`)
  and the File section; the loaded scene replaces the shown one and the view re-frames to it;
* editing (:mod:`viewer.panels.edit` over :mod:`rigel_core.edit`): the selection tints the colours of the one
  render (:meth:`Studio.tint`); the crop box / sphere, the selection rectangle and the brush are drawn as lines.

All of it is shown in the **Studio** window (top right, collapsed until clicked — a click anywhere on its title bar
opens it, not only on ImGui's small arrow; its state is kept in imgui.ini). Requests are strings the app hands to
:meth:`Studio.handle`.

Framing: :meth:`Studio.frame_with_cameras` is the home view of ``--cameras`` (the cameras and the scene together,
the cameras' mean up as the orbit's up); :meth:`Studio.free_region` is the part of the image the side panel leaves
free, and :meth:`Studio.begin_frame` keeps the orbit target centred in it when the panel is hidden or shown.
"""
from __future__ import annotations

import time

import numpy as np

from .frustums import (box_segments, frame_to_target, frustum_depth, frustum_segments, pick_camera,
                       project_segments, sphere_segments, target_to_frame)
from .panels.edit import Editor, draw_edit_section
from .panels.open import SceneOpener, draw_open_section
from .progressive import Progressive

__all__ = ["Studio"]

PICK_RADIUS_PX = 10.0
#: colours of the training cameras' frustums as given and as refined by pose refinement
GIVEN_RGB = (1.0, 0.85, 0.2)
REFINED_RGB = (0.95, 0.25, 0.95)


class Studio:
    """Studio state of one :class:`~viewer.app.Viewer` (``viewer``); ``progressive``: None = on for the CPU
    renderer of a scene in a window (off offscreen, where frames must not depend on timing, and while
    training, where the trainer needs the cores), or a bool."""

    def __init__(self, viewer, *, progressive: bool | None = None):
        self.v = viewer
        if progressive is None:
            progressive = viewer.render_device == "cpu" and viewer._auto_scale and viewer.training is None \
                and not viewer.offscreen
        self.progressive: Progressive | None = None
        self.scale = 1.0
        self.set_progressive(progressive)
        self.show_cameras = True
        #: refined poses read from a run folder (a Camera or None per training camera), else None: the live training's
        #: are taken from ``viewer.pose_snapshot``
        self.refined: list | None = None
        self.show_refined = True
        self._refined_cache = (None, None)
        self._refined_segs = (None, None)
        self.opener = SceneOpener()
        self.editor = Editor()
        self._seg_cache = (None, None)
        self._line_cache: dict = {}   # projected frustum lines per view (Studio._lines)
        self._last_error, self._error_t = "", 0.0
        self._tint_mask = (None, None)
        self.expand = False      # open the (first collapsed) Studio window on the next frame

    # ---- progressive -------------------------------------------------------------------------------------------
    def set_progressive(self, on: bool):
        """Progressive rendering on (the resting frame is the full window size times the slider's scale, which
        becomes 1) or off (the CPU's automatic ~320×240 scale comes back)."""
        v = self.v
        if on and self.progressive is None:
            self.progressive = Progressive()
            if v._auto_scale:
                v._auto_scale = False
                v.settings.render_scale = 1.0
        elif not on and self.progressive is not None:
            self.progressive = None
            if v.render_device == "cpu":
                v._auto_scale = True
        self.scale = 1.0

    def record_render(self, ms: float, pixels: int):
        if self.progressive is not None:
            self.progressive.record(ms, pixels)

    # ---- once per frame ------------------------------------------------------------------------------------------
    def begin_frame(self, panels=None):
        """After the app adopted the newest model: take a finished load, (re)attach the editor, choose the
        progressive scale."""
        v = self.v
        got = self.opener.poll()
        if got is not None:
            self._show_opened(got)
        if v.training is None and v._model is not None and \
                v._model_version not in (self.editor.base_version, self.editor.published_version):
            self.editor.attach(v._model, v._model_version)
        v.camera.set_region(self.free_region(panels))   # the target stays centred in the free part of the view
        if self.progressive is not None:
            self.scale = 1.0
            fw, fh = v.frame_size(panels)
            self.scale = self.progressive.update(time.perf_counter(), v.camera.version, fw * fh)
        else:
            self.scale = 1.0

    def free_region(self, panels: bool | None = None):
        """(u0, u1): the image columns (fractions of the width) the main panel leaves free — right of it when the
        panels are shown in a window at least three panel widths wide (not in side-by-side, which gives the
        panel its own column, nor while training, whose panels sit on both sides), else the whole width. The rule
        of ``Viewer.frame_scene``."""
        from .gpu.shaderio import C
        from .ui import PANEL_WIDTH

        v = self.v
        show = v.settings.show_panels if panels is None else panels
        tw = max(v.target.width, 1)
        if show and v.settings.mode != C.MODE_SIDE_BY_SIDE and v.train_state is None and tw >= 3 * (PANEL_WIDTH + 20):
            return ((PANEL_WIDTH + 20) / tw, 1.0)
        return (0.0, 1.0)

    def frame_with_cameras(self):
        """Home view of a scene shown with a dataset's cameras: the camera centres, their frustums and the
        scene's framing box (``viewer.camera_control.framing_box``) fitted together, world up the cameras' mean up
        (:meth:`viewer.camera_control.OrbitCamera.frame_with_cameras`); the Camera section's up-axis combo shows
        the nearest axis (:func:`viewer.camera_control.up_from_cameras`)."""
        from .camera_control import framing_box
        from .camera_control import up_from_cameras

        v = self.v
        cams = [f.camera for f in v.frames]
        pts = []
        if v._model is not None:
            lo, hi = framing_box(v._model)
            pts.append(np.array([[(lo, hi)[i >> k & 1][k] for k in range(3)] for i in range(8)]))
        segs = self.camera_segments()
        if segs is not None:
            pts.append(segs.reshape(-1, 3))
        fw, fh = v.frame_size()
        v.camera.frame_with_cameras(cams, np.concatenate(pts) if pts else (), aspect=fw / fh,
                                    region=self.free_region())
        v.settings.up = up_from_cameras(cams)
        v.camera_index = None

    def _show_opened(self, got):
        v = self.v
        info = {"file": got.path, "load": f"{got.seconds:.2f} s"}
        if self.progressive is not None:
            self.progressive.reset_costs()
        v.slot_source.publish(got.model, **info)
        v._model_t = 0.0
        v._take_model()
        v.stats.scene = got.path
        if got.up != v.settings.up:
            v.settings.up = got.up
            v.camera.set_up(got.up)
        v._face_origin()
        v.frame_scene()

    def tint(self, colors, model):
        """The render's colours with the selected Gaussians tinted (the selection overlay); unchanged when
        nothing is selected."""
        sel = self.editor.selection_for(model)
        if sel is None or sel.shape[0] != colors.shape[0]:
            return colors
        import torch

        from rigel_core.edit import tint_colors

        key = (self.editor.stack.version, colors.device)
        if self._tint_mask[0] != key:      # one host -> device copy per selection change, not per frame
            self._tint_mask = (key, torch.from_numpy(sel).to(colors.device))
        return tint_colors(colors, self._tint_mask[1])

    # ---- geometry of the shown frame --------------------------------------------------------------------------
    def _frame_geometry(self):
        """(view camera, frame size, panel rect in target pixels) of the latest render."""
        from .gpu.present import panel_rects
        from .gpu.shaderio import C

        v = self.v
        fw, fh = v.stats.frame_size
        if not fw or not fh:
            fw, fh = v.frame_size()
        side = v.settings.mode == C.MODE_SIDE_BY_SIDE
        cam = v.camera.camera(fw, fh, offset=0.0 if side else None)
        panel = panel_rects(v.settings.mode, v.content_rect())[0][1:]
        return cam, (fw, fh), panel

    def _fb_scale(self):
        from imgui_bundle import imgui

        io = imgui.get_io()
        return float(io.display_framebuffer_scale.x or 1.0), float(io.display_framebuffer_scale.y or 1.0)

    def _window_to_frame(self, pts, fb=None):
        cam, fsize, panel = self._frame_geometry()
        sx, sy = fb or self._fb_scale()
        t = np.asarray(pts, dtype=np.float64).reshape(-1, 2) * [sx, sy]
        return target_to_frame(t, fsize, panel), cam, fsize, panel

    def camera_segments(self):
        """(N, E, 2, 3) world segments of the training cameras' frustums (cached per camera list)."""
        frames = self.v.frames
        key = (id(frames), len(frames))
        if self._seg_cache[0] != key:
            cams = [f.camera for f in frames]
            size = self.v._model.extent() if self.v._model is not None else None
            self._seg_cache = (key, frustum_segments(cams, frustum_depth(cams, size)) if cams else None)
        return self._seg_cache[1]

    def refined_cameras(self):
        """The training cameras' refined poses (a list, a Camera or None per training camera), or None when there
        are none: :attr:`refined` (a run folder's), else the training run's latest pose snapshot (recomputed when a
        new one comes; the previous one is kept while a new one's copy is still on its way)."""
        if self.refined is not None:
            return self.refined if len(self.refined) == len(self.v.frames) else None
        snap = self.v.pose_snapshot
        if snap is None:
            return None
        if self._refined_cache[0] is not snap:
            cams = snap.cameras([f.camera for f in self.v.frames])
            if cams is None:
                return self._refined_cache[1]
            self._refined_cache = (snap, cams)
        return self._refined_cache[1]

    def refined_segments(self):
        """((M, E, 2, 3) world segments of the refined frustums, (M, 1, 2, 3) the lines from each given camera
        centre to its refined one) for the M training cameras that have a refined pose, at the given frustums'
        depth; None when none has."""
        refined = self.refined_cameras()
        if not refined:
            return None
        if self._refined_segs[0] is refined:
            return self._refined_segs[1]
        frames = self.v.frames
        pairs = [(f.camera, r) for f, r in zip(frames, refined) if r is not None]
        if not pairs:
            self._refined_segs = (refined, None)
            return None
        cams = [f.camera for f in frames]
        size = self.v._model.extent() if self.v._model is not None else None
        segs = frustum_segments([r for _, r in pairs], frustum_depth(cams, size))
        links = np.stack([np.stack([c.campos, r.campos]) for c, r in pairs])[:, None]
        self._refined_segs = (refined, (segs, links))   # holds ``refined``: the identity test stays sound
        return segs, links

    # ---- requests ------------------------------------------------------------------------------------------------
    def handle(self, r) -> bool:
        """Apply a studio request; False when ``r`` is not one."""
        if not isinstance(r, str):
            return False
        v = self.v
        if r.startswith("open:"):
            if v.training is not None:
                self.opener.error = "open: not while training"
            else:
                self.opener.start(r[5:])
            return True
        if r.startswith("click:"):
            self.click(*(float(x) for x in r[6:].split(",")))
            return True
        if r == "toggle_cameras":
            self.show_cameras = not self.show_cameras
            return True
        if r.startswith(("edit:", "select_rect:", "brush:")):
            if v.training is not None or v._model is None:
                return True
            if r == "edit:save":
                self.editor.start_save(v.screenshot_dir)
                return True
            kind, _, arg = r.partition(":")
            cam = None
            if kind in ("select_rect", "brush"):
                coords, _, mode = arg.partition(":")   # mode may carry ":STROKE"
                vals = [float(x) for x in coords.split(",")]
                n = 2 if kind == "select_rect" else 1
                fpts, cam, fsize, panel = self._window_to_frame(np.reshape(vals[:2 * n], (n, 2)))
                if kind == "brush":
                    radius = vals[2] if len(vals) > 2 else self.editor.brush_px
                    sx, _ = self._fb_scale()
                    ratio = fsize[0] / max(frame_to_target([[fsize[0], 0]], fsize, panel)[0, 0]
                                           - frame_to_target([[0, 0]], fsize, panel)[0, 0], 1e-9)
                    vals = [fpts[0, 0], fpts[0, 1], radius * sx * ratio]
                else:
                    vals = list(fpts.reshape(-1))
                r = f"{kind}:{','.join(f'{x:.3f}' for x in vals)}:{mode}"
            if self.editor.apply(r, v._model, cam):
                self._publish_edit()
            return True
        return False

    def _publish_edit(self):
        v = self.v
        st = self.editor.stack
        info = {k: x for k, x in (v.slot_source.latest().info.items() if v.slot_source.latest() else [])}
        info["edited"] = f"{st.num_alive:,} of {st.base.num_gaussians:,}"
        self.editor.published_version = v.slot_source.publish(st.model, **info)
        v._model_t = 0.0
        v._take_model()

    def click(self, x: float, y: float):
        """A click at window point (x, y): snap to the training camera whose frustum centre is there."""
        v = self.v
        if not (self.show_cameras and v.frames):
            return None
        cam, fsize, panel = self._frame_geometry()
        cams = [f.camera for f in v.frames]
        depth = frustum_depth(cams, v._model.extent() if v._model is not None else None)
        sx, sy = self._fb_scale()
        i = pick_camera(cams, depth, cam, (x * sx, y * sy), frame_size=fsize, panel=panel,
                        radius=PICK_RADIUS_PX * sx)
        if i is not None:
            v.snap_to_camera(i)
        return i

    # ---- drawing -----------------------------------------------------------------------------------------------
    def _lines(self, imgui, dl, segs, cam, fsize, panel, fb, color, thickness=1.0, key=None):
        """Draw ``segs`` projected through ``cam``. ``key``: what the projection depends on besides the view (the
        segments' identity); with it the ImVec2 end points are kept while the view is unchanged, so that a
        panel rebuild with a still camera only re-adds the lines (hundreds of training cameras: thousands)."""
        if key is not None:
            key = (key, self.v.camera.version, fsize, tuple(panel), tuple(fb), segs.shape)
        pts = self._line_cache.get(key) if key is not None else None
        if pts is None:
            px, vis = project_segments(segs.reshape(-1, 2, 3), cam)
            t = frame_to_target(px, fsize, panel)[vis] / np.asarray(fb)
            pts = [(imgui.ImVec2(x0, y0), imgui.ImVec2(x1, y1)) for (x0, y0), (x1, y1) in t.tolist()]
            if key is not None:
                if len(self._line_cache) > 8:
                    self._line_cache.clear()
                self._line_cache[key] = pts
        for a, b in pts:
            dl.add_line(a, b, color, thickness)

    def draw_overlay(self, imgui):
        """Frustums, crop gizmo, selection rectangle and brush circle on the background draw list."""
        v = self.v
        dl = imgui.get_background_draw_list()
        fb = self._fb_scale()
        cam, fsize, panel = self._frame_geometry()
        x0, y0, pw, ph = panel
        dl.push_clip_rect(imgui.ImVec2(x0 / fb[0], y0 / fb[1]), imgui.ImVec2((x0 + pw) / fb[0], (y0 + ph) / fb[1]),
                          True)
        col = lambda r, g, b, a=1.0: imgui.get_color_u32(imgui.ImVec4(r, g, b, a))
        try:
            if self.show_cameras and v.frames:
                segs = self.camera_segments()
                if segs is not None:
                    sel = v.camera_index if v.camera.snapped is not None else None
                    others = segs if sel is None else np.delete(segs, sel, axis=0)
                    ident = (id(segs), sel)   # segs: the cached frustums of the camera list
                    self._lines(imgui, dl, others, cam, fsize, panel, fb, col(*GIVEN_RGB, 0.9), key=("o", ident))
                    if sel is not None:
                        self._lines(imgui, dl, segs[sel:sel + 1], cam, fsize, panel, fb, col(0.2, 1.0, 0.4), 2.0,
                                    key=("s", ident))
                refined = self.refined_segments() if self.show_refined else None
                if refined is not None:
                    self._lines(imgui, dl, refined[0], cam, fsize, panel, fb, col(*REFINED_RGB, 0.9),
                                key=("r", id(refined[0])))
                    self._lines(imgui, dl, refined[1], cam, fsize, panel, fb, col(*REFINED_RGB, 0.9), 2.0,
                                key=("l", id(refined[1])))
            ed = self.editor
            if ed.show_gizmo and v.training is None and v.settings.show_panels:
                segs = box_segments(ed.box_center, ed.box_half) if ed.crop_shape == "box" else \
                    sphere_segments(ed.sphere_center, ed.sphere_radius)
                self._lines(imgui, dl, segs, cam, fsize, panel, fb, col(0.3, 0.8, 1.0, 0.9), 1.5)
            self._status_text(imgui, dl, fb, panel, col)
            inp = v.input
            if inp is not None and getattr(inp, "select_rect", None) is not None:
                ax, ay, bx, by = inp.select_rect
                dl.add_rect(imgui.ImVec2(min(ax, bx), min(ay, by)), imgui.ImVec2(max(ax, bx), max(ay, by)),
                            col(1.0, 0.5, 0.1), 0.0, 0, 1.5)
            if inp is not None and getattr(inp, "brush_at", None) is not None:
                bx, by = inp.brush_at
                dl.add_circle(imgui.ImVec2(bx, by), ed.brush_px, col(1.0, 0.5, 0.1), 32, 1.5)
        finally:
            dl.pop_clip_rect()

    def _status_text(self, imgui, dl, fb, panel, col):
        """The loading line (and a failed load's error, for 10 s) at the bottom of the view, visible with
        the Studio window collapsed or the panels hidden."""
        op = self.opener
        if op.error != self._last_error:
            self._last_error, self._error_t = op.error, time.perf_counter()
        text, c = "", None
        if op.loading:
            text, c = op.status(), col(0.5, 0.8, 1.0)
        elif op.error and time.perf_counter() - self._error_t < 10.0:
            text, c = op.error, col(1.0, 0.4, 0.35)
        if text:
            w = imgui.calc_text_size(text).x
            x, y = (panel[0] + 0.5 * panel[2]) / fb[0] - 0.5 * w, (panel[1] + panel[3]) / fb[1] - 28
            dl.add_text(imgui.ImVec2(x + 1, y + 1), col(0, 0, 0, 0.9), text)
            dl.add_text(imgui.ImVec2(x, y), c, text)

    def draw(self, imgui) -> list:
        """This frame's overlay and the Studio window; returns requests."""
        v = self.v
        requests: list = []
        if v.model is not None:   # none while the scene loads (viewer/loading.py)
            self.draw_overlay(imgui)
        io = imgui.get_io()
        if not v.settings.show_panels or min(io.display_size.x, io.display_size.y) < 64:
            return requests
        from .ui import PANEL_WIDTH

        x = io.display_size.x - 10 - (PANEL_WIDTH + 10 if v.training is not None else 0)
        imgui.set_next_window_pos(imgui.ImVec2(x, 10), imgui.Cond_.first_use_ever, imgui.ImVec2(1.0, 0.0))
        imgui.set_next_window_size_constraints(imgui.ImVec2(PANEL_WIDTH + 40, 0), imgui.ImVec2(PANEL_WIDTH + 40, 1e6))
        imgui.set_next_window_bg_alpha(0.85)
        # collapsed the first time (a title bar in the corner: the view stays free); expand=True opens it once
        imgui.set_next_window_collapsed(not self.expand, imgui.Cond_.always if self.expand else imgui.Cond_.first_use_ever)
        self.expand = False
        expanded = imgui.begin("Studio", None, imgui.WindowFlags_.always_auto_resize)[0]
        if not expanded and imgui.is_window_hovered() and imgui.is_mouse_released(0):
            d = imgui.get_mouse_drag_delta(0)
            if d.x == 0 and d.y == 0:   # a click on the collapsed title bar (not a drag of the window): open it
                self.expand = True
        if expanded:
            draw_open_section(imgui, self.opener, requests, enabled=v.training is None)
            if imgui.collapsing_header("View", imgui.TreeNodeFlags_.default_open):
                ch, on = imgui.checkbox("progressive (low-res while moving)", self.progressive is not None)
                if ch:
                    self.set_progressive(on)
                if self.progressive is not None:
                    fw, fh = v.stats.frame_size
                    imgui.text_disabled(f"{self.progressive.label()}  ({fw}x{fh})")
                if v.frames:
                    _, self.show_cameras = imgui.checkbox(f"training cameras ({len(v.frames)})", self.show_cameras)
                    if self.show_cameras:
                        imgui.same_line()
                        imgui.text_disabled("click one: snap")
                        refined = self.refined_cameras()
                        if refined:
                            n = sum(r is not None for r in refined)
                            _, self.show_refined = imgui.checkbox(f"refined poses ({n})", self.show_refined)
                            imgui.same_line()
                            imgui.text_colored(imgui.ImVec4(*GIVEN_RGB, 1.0), "given")
                            imgui.same_line()
                            imgui.text_colored(imgui.ImVec4(*REFINED_RGB, 1.0), "refined")
            draw_edit_section(imgui, self.editor, requests, enabled=v.training is None)
        imgui.end()
        return requests
