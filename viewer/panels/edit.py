"""The viewer's Edit section: box / sphere crop, rectangle and brush selection, delete, invert, undo / redo, save.

The edit state is a :class:`rigel_core.edit.EditStack` over the model the viewer showed when the first edit
began (:class:`Editor` makes one lazily and drops it when another scene arrives). Each change publishes the
edited model into the viewer's model slot, so the one render of the scene shows it; the selection is drawn in
that same render by tinting the selected Gaussians' colours (:func:`rigel_core.edit.tint_colors`), never by a
second render. Screen-space selection uses the camera and frame size of the shown frame and selects by footprint:
every Gaussian whose visible ellipse in that frame meets the rectangle or the brush disc
(:func:`rigel_core.edit.footprint_rect_mask`, :func:`rigel_core.edit.footprint_brush_mask`), not only those whose
centre lies inside.

Requests (strings, applied by the app at one point of its loop, STYLE 10): ``edit:undo``, ``edit:redo``,
``edit:delete``, ``edit:invert``, ``edit:clear``, ``edit:all``, ``edit:crop_box``, ``edit:crop_sphere``,
``edit:save``, ``select_rect:X0,Y0,X1,Y1:MODE`` and ``brush:X,Y[,R]:MODE[:STROKE]`` (frame pixels, MODE one of
``rigel_core.edit.SELECT_MODES``; the dabs of one STROKE undo together).
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from .open import one_line

__all__ = ["Editor", "draw_edit_section"]


class Editor:
    """Viewer-side edit state: the stack, the crop gizmo's parameters, the brush, the last message."""

    def __init__(self):
        self.stack = None
        self.base_version = None      # model-slot version of the model the stack edits
        self.published_version = None  # version of the last edited model published by the editor
        self.crop_shape = "box"        # "box" | "sphere"
        self.box_center = np.zeros(3)
        self.box_half = np.ones(3)
        self.sphere_center = np.zeros(3)
        self.sphere_radius = 1.0
        self.keep_inside = True
        self.show_gizmo = False        # draw the crop box / sphere in the view
        self.brush_px = 20.0
        self.message = ""
        self.error = ""
        self.save_path = ""
        self.save_job = None

    def attach(self, model, version) -> None:
        """A new scene shown (not the editor's own result): forget the stack, centre the crop gizmo on it."""
        self.stack = None
        self.base_version = version
        self.published_version = None
        lo, hi = (t.detach().cpu().double().numpy() for t in model.bounds(0.01))
        self.box_center = 0.5 * (lo + hi)
        self.box_half = np.maximum(0.5 * (hi - lo), 1e-6)
        self.sphere_center = self.box_center.copy()
        self.sphere_radius = float(max(0.5 * np.linalg.norm(hi - lo), 1e-6))
        self.message = self.error = ""

    def ensure_stack(self, model):
        from rigel_core.edit import EditStack

        if self.stack is None:
            self.stack = EditStack(model)
        return self.stack

    def selection_for(self, model):
        """The selection over ``model``'s Gaussians when it is the edited model, else None."""
        st = self.stack
        if st is None or model is not st.model or st.num_selected == 0:
            return None
        return st.selection

    def apply(self, request: str, model, camera=None) -> bool:
        """Apply one edit request to the stack over ``model`` (``camera``: the shown frame's camera, for the
        screen-space selections). Returns whether the edited model or the selection changed."""
        from rigel_core.edit import SELECT_MODES

        st = self.ensure_stack(model)
        kind, _, arg = request.partition(":")
        before = st.version
        try:
            if kind == "edit":
                if arg == "undo":
                    label = st.undo()
                    self.message = f"undid {label}" if label else "nothing to undo"
                elif arg == "redo":
                    label = st.redo()
                    self.message = f"redid {label}" if label else "nothing to redo"
                elif arg == "delete":
                    n = st.num_selected
                    self.message = f"deleted {n:,}" if st.delete_selected() else "nothing selected"
                elif arg == "invert":
                    st.invert_selection()
                elif arg == "clear":
                    st.clear_selection()
                elif arg == "all":
                    st.select_all()
                elif arg == "crop_box":
                    n = st.num_alive
                    st.crop_box(self.box_center, self.box_half, keep_inside=self.keep_inside)
                    self.message = f"box crop removed {n - st.num_alive:,}"
                elif arg == "crop_sphere":
                    n = st.num_alive
                    st.crop_sphere(self.sphere_center, self.sphere_radius, keep_inside=self.keep_inside)
                    self.message = f"sphere crop removed {n - st.num_alive:,}"
                else:
                    raise ValueError(f"unknown edit {arg!r}")
            elif kind in ("select_rect", "brush"):
                coords, _, mode = arg.partition(":")
                mode, _, stroke = mode.partition(":")
                mode = mode or ("replace" if kind == "select_rect" else "add")
                if mode not in SELECT_MODES:
                    raise ValueError(f"unknown selection mode {mode!r}")
                v = [float(x) for x in coords.split(",")]
                if camera is None:
                    raise ValueError("no frame shown yet")
                if kind == "select_rect":
                    st.select_rect(camera, v[:4], mode)
                else:
                    st.select_brush(camera, v[:2], v[2] if len(v) > 2 else self.brush_px, mode, stroke or None)
                self.message = f"{st.num_selected:,} selected"
            else:
                return False
            self.error = ""
        except (ValueError, IndexError) as e:
            self.error = one_line(f"edit: {e}")
        return st.version != before

    def start_save(self, out_dir, path=None):
        """Write the edited model on a background thread (``rigel_core.edit.save_model``; a new name when the
        file exists). Returns the Job, or None with :attr:`error` set when nothing was edited."""
        from rigel_core.edit import save_model

        from ..ui_state import Job

        if self.stack is None:
            self.error = "save: nothing edited yet"
            return None
        target = Path(path or self.save_path or Path(out_dir) / "edited.ply")
        k, out = 2, target
        while out.exists():
            out = target.with_name(f"{target.stem}_{k}{target.suffix}")
            k += 1
        model = self.stack.model
        self.save_job = Job("save-edit", lambda job: save_model(model, out))
        return self.save_job


def _float3(imgui, label, v):
    changed, vals = imgui.input_float3(label, [float(x) for x in v], "%.3f")
    return (np.asarray(vals, dtype=np.float64) if changed else v), changed


def draw_edit_section(imgui, editor: Editor, requests: list, *, enabled: bool = True):
    """The Edit section of the Studio window."""
    if not imgui.collapsing_header("Edit", imgui.TreeNodeFlags_.default_open):
        return
    if not enabled:
        imgui.text_disabled("(editing: not while training)")
        return
    st = editor.stack
    imgui.push_item_width(190)
    if imgui.radio_button("box", editor.crop_shape == "box"):
        editor.crop_shape = "box"
    imgui.same_line()
    if imgui.radio_button("sphere", editor.crop_shape == "sphere"):
        editor.crop_shape = "sphere"
    imgui.same_line()
    _, editor.show_gizmo = imgui.checkbox("show", editor.show_gizmo)
    if editor.crop_shape == "box":
        editor.box_center, _ = _float3(imgui, "centre##box", editor.box_center)
        half, ch = _float3(imgui, "half size", editor.box_half)
        if ch:
            editor.box_half = np.maximum(half, 1e-6)
    else:
        editor.sphere_center, _ = _float3(imgui, "centre##sph", editor.sphere_center)
        _, r = imgui.drag_float("radius", float(editor.sphere_radius), max(editor.sphere_radius, 1e-3) * 0.01,
                                1e-6, 1e9, "%.3f")
        editor.sphere_radius = max(r, 1e-6)
    imgui.pop_item_width()
    if imgui.radio_button("keep inside", editor.keep_inside):
        editor.keep_inside = True
    imgui.same_line()
    if imgui.radio_button("keep outside", not editor.keep_inside):
        editor.keep_inside = False
    imgui.same_line()
    if imgui.button("apply crop"):
        requests.append("edit:crop_box" if editor.crop_shape == "box" else "edit:crop_sphere")
    imgui.text_disabled("Ctrl+drag: select rectangle")
    imgui.text_disabled("  +Shift add, +Alt subtract")
    imgui.text_disabled("Alt+drag: brush (+Shift subtract)")
    imgui.text_disabled("  (selects every splat drawn there)")
    imgui.push_item_width(120)
    _, editor.brush_px = imgui.slider_float("brush px", float(editor.brush_px), 2.0, 200.0, "%.0f")
    imgui.pop_item_width()
    for label, req in (("delete (Del)", "edit:delete"), ("invert", "edit:invert"), ("all", "edit:all"),
                       ("none", "edit:clear")):
        if label != "delete (Del)":
            imgui.same_line()
        if imgui.button(label):
            requests.append(req)
    if imgui.button("undo (Ctrl+Z)"):
        requests.append("edit:undo")
    imgui.same_line()
    if imgui.button("redo (Ctrl+Shift+Z)"):
        requests.append("edit:redo")
    if st is not None:
        imgui.text(f"{st.num_alive:,} of {st.base.num_gaussians:,} kept, {st.num_selected:,} selected")
        imgui.text_disabled(f"{len(st.history)} steps to undo, {len(st._redo)} to redo")
    imgui.push_item_width(200)
    _, editor.save_path = imgui.input_text("##save_path", editor.save_path)
    imgui.pop_item_width()
    imgui.same_line()
    job = editor.save_job
    if imgui.button("save") and (job is None or job.done):
        requests.append("edit:save")
    if job is not None and not job.done:
        imgui.text_disabled("saving...")
    elif job is not None and job.error:
        imgui.text_colored(imgui.ImVec4(1, 0.35, 0.3, 1), one_line(job.error, 80))
    elif job is not None and job.result:
        imgui.text_disabled(one_line(f"wrote {job.result}", 60))
    if editor.error:
        imgui.text_colored(imgui.ImVec4(1, 0.35, 0.3, 1), editor.error)
    elif editor.message:
        imgui.text_disabled(editor.message)
