"""The viewer's "Camera path" panel section: keyframes from the current view, preview, save / load, MP4.

Three parts, so that the logic is tested without a window:

* :class:`PathEditor` — the state (a :class:`~rigel_core.camera_path.CameraPath`, the selected keyframe, the
  file field, the preview clock) and its edits: add, replace, delete, move up / down, clear, save, load, and the
  cameras of the video (cached until the path or the size changes). No ImGui, no Vulkan.
* :func:`draw_section` — the ImGui widgets (called from :func:`viewer.panels.main.main_window`); it edits the editor's
  settings in place and returns requests ``"path:<action>"`` for the app.
* :func:`apply_request` — what the app does with such a request (called from ``Viewer._apply_requests``): it
  reads the current view for a keyframe, moves the view for the preview (``OrbitCamera.snap_to`` with the
  path's camera: the view shows exactly the video's frame, letterboxed to its aspect, until the user moves),
  and starts the video as the viewer's ``jobs["video"]`` :class:`~viewer.ui_state.Job` (one video at a time,
  shared with the orbit video: progress bar, cancel, cancelled on close) through
  :func:`rigel_core.render_video.render_path_video`.

While the preview plays, the section asks for ``"path:tick"`` every frame; the tick advances the clock by the
wall time since the last one (so playback runs at the path's speed whatever the frame rate) and shows the
frame of the video at that time.
"""
from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path

from rigel_core.camera_path import CameraPath, CameraPathError, Keyframe, load_path, path_to_dict, save_path

__all__ = ["PathEditor", "draw_section", "apply_request"]


@dataclass
class PathEditor:
    """State of the camera-path panel.

    Attributes:
        path: the path being edited (its keyframes in order).
        selected: index of the selected keyframe or None.
        file: the save / load field (a .json path).
        playing: the preview runs; time: the preview's position in seconds from the path's start.
        message: the last outcome shown under the section ("saved …", an error).
        error: whether ``message`` is an error (drawn in red).
    """

    path: CameraPath = field(default_factory=lambda: CameraPath(duration=4.0, fps=30.0))
    selected: int | None = None
    file: str = "camera_path.json"
    playing: bool = False
    time: float = 0.0
    message: str = ""
    error: bool = False
    #: open the section on the next draw (after a load, or a path given on the command line)
    expand: bool = False
    #: draw the path and its keyframes over the view
    show_markers: bool = True
    _confirm_overwrite: str = ""
    _cache_key: str = ""
    _cache: list = field(default_factory=list)
    _last_tick: float | None = None

    # ---- edits ---------------------------------------------------------------------------------------------
    def _say(self, text: str, error: bool = False):
        self.message, self.error = text, error

    def add(self, kf: Keyframe):
        """Insert ``kf`` after the selected keyframe (at the end when none is selected) and select it."""
        kf.time = None      # the panel spreads keyframes evenly over the duration
        i = len(self.path.keyframes) if self.selected is None else self.selected + 1
        self.path.keyframes.insert(i, kf)
        self.selected = i
        self._drop_times()
        self._say(f"keyframe {i + 1} added")

    def replace(self, kf: Keyframe):
        """Put ``kf`` in place of the selected keyframe (nothing when none is selected)."""
        if self.selected is None:
            return
        kf.time = None
        self.path.keyframes[self.selected] = kf
        self._drop_times()
        self._say(f"keyframe {self.selected + 1} moved to the view")

    def delete(self):
        """Remove the selected keyframe; the next one (else the previous one) becomes selected."""
        if self.selected is None:
            return
        del self.path.keyframes[self.selected]
        n = len(self.path.keyframes)
        self.selected = min(self.selected, n - 1) if n else None
        self._drop_times()

    def move(self, step: int):
        """Move the selected keyframe ``step`` places (−1 up, +1 down), staying selected; clamped at the ends."""
        if self.selected is None:
            return
        i, j = self.selected, min(max(self.selected + step, 0), len(self.path.keyframes) - 1)
        kfs = self.path.keyframes
        kfs[i], kfs[j] = kfs[j], kfs[i]
        self.selected = j

    def clear(self):
        self.path.keyframes.clear()
        self.selected = None
        self.stop()
        self.time = 0.0

    def _drop_times(self):
        """Keyframes from a loaded file may carry times; an edit spreads them evenly again (a time per
        keyframe would have to be edited with each insert)."""
        for k in self.path.keyframes:
            k.time = None

    # ---- the video's cameras and the preview -----------------------------------------------------------------
    @property
    def span(self) -> float:
        """Seconds from the path's first frame to its last (0 for fewer than two keyframes)."""
        if len(self.path.keyframes) < 2:
            return 0.0
        n = self.path.num_frames()
        return (n - 1 if not self.path.loop else n) / float(self.path.fps)

    def cameras(self, width: int, height: int) -> list:
        """The video's cameras (:meth:`CameraPath.cameras`), cached while the path and the size are unchanged."""
        if not self.path.keyframes:
            return []
        key = json.dumps([path_to_dict(self.path), width, height])
        if key != self._cache_key:
            self._cache = self.path.cameras(width, height)
            self._cache_key = key
        return self._cache

    def frame_at(self, t: float, width: int, height: int):
        """The video's camera nearest ``t`` seconds from the start (None for an empty path)."""
        cams = self.cameras(width, height)
        if not cams:
            return None
        i = int(round(max(t, 0.0) * self.path.fps))
        return cams[i % len(cams)] if self.path.loop else cams[min(i, len(cams) - 1)]

    def play(self):
        if len(self.path.keyframes) >= 1:
            if self.time >= self.span:
                self.time = 0.0
            self.playing, self._last_tick = True, None

    def stop(self):
        self.playing, self._last_tick = False, None

    def tick(self, now: float | None = None) -> float:
        """Advance the preview clock by the wall time since the last tick (a loop wraps, an open path stops
        at its end). Returns the time."""
        now = time.perf_counter() if now is None else now
        if self.playing and self._last_tick is not None:
            self.time += now - self._last_tick
            span = self.span
            if self.time > span:
                if self.path.loop and span > 0:
                    self.time %= span
                else:
                    self.time = span
                    self.stop()
        if self.playing:
            self._last_tick = now
        return self.time

    # ---- files -----------------------------------------------------------------------------------------------
    def save(self) -> Path | None:
        """Write the path to :attr:`file` (rigel's JSON). An existing file is replaced only on a second save
        of the same name (the first one asks)."""
        p = Path(self.file).expanduser()
        if not self.path.keyframes:
            self._say("nothing to save: add a keyframe", True)
            return None
        force = self._confirm_overwrite == str(p)
        if p.exists() and not force:
            self._confirm_overwrite = str(p)
            self._say(f"{p} exists: save again to replace it", True)
            return None
        self._confirm_overwrite = ""
        try:
            out = save_path(self.path, p, force=True)
        except OSError as e:
            self._say(f"{p}: cannot write: {e.strerror or e}", True)
            return None
        self._say(f"saved {out}")
        return out

    def load(self) -> bool:
        """Read :attr:`file` (rigel's JSON or nerfstudio's camera_path.json); on error the path is kept and the
        message names the file and the field."""
        try:
            path = load_path(Path(self.file).expanduser())
        except CameraPathError as e:
            self._say(str(e), True)
            return False
        self.path = path
        self.selected = 0 if path.keyframes else None
        self.time = 0.0
        self.stop()
        self.expand = True
        self._say(f"loaded {len(path.keyframes)} keyframes from {self.file}")
        return True


# ---- ImGui -------------------------------------------------------------------------------------------------------
def draw_section(imgui, editor: PathEditor, jobs: dict, requests: list):
    """The "Camera path" collapsing header of the main panel; appends ``"path:<action>"`` requests."""
    if editor.playing:   # the preview runs on with the section collapsed
        requests.append("path:tick")
    if editor.expand:
        imgui.set_next_item_open(True)
        editor.expand = False
    if not imgui.collapsing_header("Camera path"):
        return
    kfs = editor.path.keyframes
    imgui.text(f"{len(kfs)} keyframes" + (f", {editor.span:.1f} s" if len(kfs) > 1 else ""))
    if imgui.begin_list_box("##keyframes", imgui.ImVec2(-1, 4.5 * imgui.get_text_line_height_with_spacing())):
        for i, k in enumerate(kfs):
            x, y, z = k.position
            label = f"{i + 1:>2}  ({x:.2f}, {y:.2f}, {z:.2f})  {k.fov_y_deg:.0f} deg##kf{i}"
            if imgui.selectable(label, editor.selected == i)[0]:
                editor.selected = i
        imgui.end_list_box()
    # two rows of buttons: (label, action, enabled); each row's first button starts a new line
    for label, action, enabled in (("add view", "add", True), ("replace", "replace", editor.selected is not None),
                                   ("delete", "delete", editor.selected is not None),
                                   ("up", "up", editor.selected not in (None, 0)),
                                   ("down", "down", editor.selected is not None and editor.selected < len(kfs) - 1),
                                   ("clear", "clear", bool(kfs))):
        if action not in ("add", "up"):
            imgui.same_line()
        imgui.begin_disabled(not enabled)
        if imgui.button(label + "##path"):
            requests.append(f"path:{action}")
        imgui.end_disabled()
    imgui.push_item_width(140)
    p = editor.path
    changed, duration = imgui.slider_float("duration (s)", float(p.duration), 0.5, 60.0, "%.1f")
    if changed:   # a loaded file's frame count and keyframe times give way to the slider
        p.duration, p.frames = duration, None
        editor._drop_times()
    _, p.smoothness = imgui.slider_float("smoothness", float(p.smoothness), 0.0, 1.0, "%.2f")
    _, p.loop = imgui.checkbox("loop", p.loop)
    imgui.same_line()
    _, p.constant_speed = imgui.checkbox("constant speed", p.constant_speed)
    _, editor.show_markers = imgui.checkbox("show path in the view", editor.show_markers)
    imgui.begin_disabled(len(kfs) < 2)
    if imgui.button("stop##path" if editor.playing else "play##path"):
        requests.append("path:stop" if editor.playing else "path:play")
    imgui.same_line()
    changed, t = imgui.slider_float("##scrub", float(min(editor.time, editor.span)), 0.0, max(editor.span, 1e-3),
                                    "%.2f s")
    if changed:
        editor.time = t
        requests.append("path:scrub")
    imgui.end_disabled()
    imgui.pop_item_width()
    style = imgui.get_style()
    buttons = imgui.calc_text_size("saveload").x + 4 * style.frame_padding.x + 2 * style.item_spacing.x
    imgui.push_item_width(-buttons)
    _, editor.file = imgui.input_text("##pathfile", editor.file)
    imgui.pop_item_width()
    imgui.same_line()
    if imgui.button("save##path"):
        requests.append("path:save")
    imgui.same_line()
    if imgui.button("load##path"):
        requests.append("path:load")
    job = jobs.get("video")
    if job is not None and not job.done:
        imgui.progress_bar(job.progress, imgui.ImVec2(-1, 0), job.message or "rendering")
        if imgui.button("cancel video##path"):
            requests.append("path:cancel_video")
    else:
        imgui.begin_disabled(len(kfs) < 2)
        if imgui.button("render path video"):
            requests.append("path:video")
        imgui.end_disabled()
    if editor.message:
        imgui.push_text_wrap_pos(0.0)
        if editor.error:
            imgui.text_colored(imgui.ImVec4(1, 0.35, 0.3, 1), editor.message)
        else:
            imgui.text_disabled(editor.message)
        imgui.pop_text_wrap_pos()


def screen_points(cam, points, frame_size, content, fb_scale=(1.0, 1.0)):
    """Where world ``points`` (M, 3) appear on screen: the pinhole projection by ``cam`` (a Camera of the frame's
    size) mapped as the present pass maps the frame into the content area (scaled to fit, keeping its aspect,
    centred: viewer/gpu/shaders/present_modes.comp), in ImGui display coordinates (target pixels / ``fb_scale``).
    Returns (M, 2) float64 and (M,) bool, True where the point is in front of the camera."""
    import numpy as np

    pts = np.asarray(points, dtype=np.float64).reshape(-1, 3)
    fw, fh = frame_size
    cx, cy, cw, ch = content
    s = min(cw / fw, ch / fh)
    sw, sh = max(int(np.floor(fw * s + 0.5)), 1), max(int(np.floor(fh * s + 0.5)), 1)
    ox, oy = cx + (cw - sw) // 2, cy + (ch - sh) // 2
    z = (pts @ cam.R.T + cam.t)[:, 2]
    front = z > 1e-6
    uv = cam.project(np.where(front[:, None], pts, pts + cam.R[2]))   # behind: any finite value, masked
    xy = np.stack([ox + uv[:, 0] * sw / fw, oy + uv[:, 1] * sh / fh], axis=1)
    return xy / np.asarray(fb_scale, dtype=np.float64), front


def draw_markers(imgui, viewer, fb_scale=(1.0, 1.0)):
    """The path (its frames' positions, a polyline) and its keyframes (numbered dots, the selected one larger)
    over the view, on ImGui's background draw list (under the panels). Only in the single-image modes."""
    from ..gpu.shaderio import C

    editor: PathEditor = viewer.settings.camera_path
    if not (editor.show_markers and editor.path.keyframes and viewer.settings.show_panels) \
            or viewer.settings.mode == C.MODE_SIDE_BY_SIDE:
        return
    import numpy as np

    fw, fh = viewer.frame_size()
    cam = viewer.camera.camera(fw, fh)
    content = viewer.content_rect()
    w, h = viewer.settings.video_size
    track = np.stack([c.campos for c in editor.cameras(w, h)])
    keys = np.stack([k.position for k in editor.path.keyframes])
    dl = imgui.get_background_draw_list()
    line = imgui.get_color_u32(imgui.ImVec4(1.0, 0.8, 0.2, 0.9))
    dot = imgui.get_color_u32(imgui.ImVec4(1.0, 0.55, 0.1, 1.0))
    sel = imgui.get_color_u32(imgui.ImVec4(0.3, 0.8, 1.0, 1.0))
    white = imgui.get_color_u32(imgui.ImVec4(1, 1, 1, 1))
    if len(track) > 1:
        xy, front = screen_points(cam, track, (fw, fh), content, fb_scale)
        for i in range(len(track) - 1):
            if front[i] and front[i + 1]:
                dl.add_line(imgui.ImVec2(*xy[i]), imgui.ImVec2(*xy[i + 1]), line, 2.0)
    xy, front = screen_points(cam, keys, (fw, fh), content, fb_scale)
    for i, (p, f) in enumerate(zip(xy, front)):
        if f:
            chosen = editor.selected == i
            dl.add_circle_filled(imgui.ImVec2(*p), 7.0 if chosen else 5.0, sel if chosen else dot)
            dl.add_text(imgui.ImVec2(p[0] + 8, p[1] - 8), white, str(i + 1))


# ---- the app's side --------------------------------------------------------------------------------------------------
def _show(viewer, editor: PathEditor):
    """Move the view to the video's frame at the editor's time."""
    w, h = viewer.settings.video_size
    cam = editor.frame_at(editor.time, w, h)
    if cam is not None:
        viewer.camera.snap_to(cam, pivot=viewer.scene_center())
        viewer.camera_index = None


def apply_request(viewer, request: str):
    """Carry out a ``"path:<action>"`` request on ``viewer`` (a :class:`viewer.app.Viewer`)."""
    editor: PathEditor = viewer.settings.camera_path
    action = request.split(":", 1)[1]
    if action in ("add", "replace"):
        fw, fh = viewer.frame_size()
        kf = Keyframe.from_camera(viewer.camera.camera(fw, fh, offset=0.0))
        editor.add(kf) if action == "add" else editor.replace(kf)
    elif action == "delete":
        editor.delete()
    elif action in ("up", "down"):
        editor.move(-1 if action == "up" else 1)
    elif action == "clear":
        editor.clear()
    elif action == "play":
        editor.play()
        _show(viewer, editor)
    elif action == "stop":
        editor.stop()
    elif action in ("tick", "scrub"):
        if action == "tick":
            editor.tick()
        _show(viewer, editor)
    elif action == "save":
        editor.save()
    elif action == "load":
        if editor.load():
            editor.time = 0.0
            _show(viewer, editor)
    elif action == "video":
        start_path_video(viewer)
    elif action == "cancel_video" and viewer.jobs.get("video") is not None:
        viewer.jobs["video"].cancel()


def start_path_video(viewer, path=None):
    """Render the edited path to ``path`` (default ``<screenshot dir>/rigel_path_<time>.mp4``, ``.gif``
    without imageio-ffmpeg) as the viewer's ``jobs["video"]``; returns the Job (the running one when a video
    is already being rendered; None for fewer than two keyframes)."""
    from rigel_core.render_video import VideoCancelled, render_path_video, video_path

    from ..ui_state import Job

    editor: PathEditor = viewer.settings.camera_path
    job = viewer.jobs.get("video")
    if job is not None and not job.done:
        return job
    if len(editor.path.keyframes) < 2:
        editor._say("a path needs two keyframes", True)
        return None
    s = viewer.settings
    w, h = s.video_size
    cams = list(editor.cameras(w, h))
    if path is None:
        base = Path(viewer.screenshot_dir) / time.strftime("rigel_path_%Y%m%d_%H%M%S.mp4")
        path, k = video_path(base), 2
        while path.exists():
            path, k = video_path(base.with_name(f"{base.stem}_{k}{base.suffix}")), k + 1
    bg = (1.0, 1.0, 1.0) if s.white_background else None
    degree = min(s.sh_degree, viewer.model.active_sh_degree)

    def render(job):
        try:
            out = render_path_video(viewer.model, cams, path, fps=editor.path.fps, background=bg,
                                    sh_degree=degree, progress=False, job=job)
        except VideoCancelled:   # asked for: not an error (nothing was written)
            editor._say("video cancelled")
            return None
        except Exception as e:   # the Job keeps and logs the traceback; the section shows the line
            editor._say(f"video failed: {type(e).__name__}: {e}", True)
            raise
        editor._say(f"wrote {out}")
        return out

    viewer.jobs["video"] = job = Job("video", render)
    editor._say(f"rendering {len(cams)} frames to {Path(path).name}")
    return job


# ---- rigel-viewer --path -----------------------------------------------------------------------------------------------
def open_path(viewer, file) -> PathEditor:
    """Load ``file`` into the Camera path section (opened on the next draw); the video size becomes the path's
    own when it has one. Raises :class:`~rigel_core.camera_path.CameraPathError` (one line naming the file and
    the field)."""
    editor: PathEditor = viewer.settings.camera_path
    editor.file = str(file)
    editor.path = load_path(file)
    editor.selected = 0 if editor.path.keyframes else None
    editor.expand = True
    if editor.path.width and editor.path.height:
        viewer.settings.video_size = (editor.path.width, editor.path.height)
    return editor


def run_offscreen_path(viewer, out_dir, frames: int | None = None) -> dict:
    """``rigel-viewer SCENE --offscreen --path P --out DIR``: the view moved onto each camera of the path (its
    frame count, or ``frames``), each frame written with the panels to ``DIR/path_XXXX.png``; returns the
    summary (also ``DIR/summary.json``; ``ok`` false with an ``error`` for a path without keyframes)."""
    from rigel_core.run_dir import write_json_atomic

    from ..offscreen import PATH_FRAME_NAME, SUMMARY_NAME, _capture

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    editor: PathEditor = viewer.settings.camera_path
    summary = {"ok": True, "scene": viewer.stats.scene, "path": editor.file, "files": []}
    if not editor.path.keyframes:
        summary.update(ok=False, error=f"{editor.file}: the path has no keyframes")
    else:
        w, h = viewer.settings.video_size
        cams = editor.path.cameras(w, h, frames=frames)
        viewer.build_ui()      # ImGui measures auto-sized panels on their first frame
        t0 = time.perf_counter()
        for i, cam in enumerate(cams):
            viewer.camera.snap_to(cam, pivot=viewer.scene_center())
            editor.selected, editor.time = None, i / float(editor.path.fps)
            name = PATH_FRAME_NAME.format(i)
            _capture(viewer, out / name)
            summary["files"].append(name)
        summary.update(frames=len(cams), seconds=round(time.perf_counter() - t0, 3), size=[w, h])
    write_json_atomic(out / SUMMARY_NAME, summary, indent=2)
    return summary
