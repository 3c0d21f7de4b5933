"""Open a scene file while the viewer runs: drag-and-drop onto the window or File → Open with a path field.

:class:`SceneOpener` loads on a background thread (:func:`viewer.scene.load_scene_file`, then
:func:`viewer.scene.default_up` for the file's up axis) so that the UI keeps drawing; the panel shows a spinner
with the file name and the seconds spent, and a failure as one red line (the loader's message names the file
and the problem). The app polls :meth:`SceneOpener.poll` once per frame; a loaded scene is published into the
viewer's model slot and the view re-frames to it. No window needed: tested in tests/test_viewer_studio.py.
"""
from __future__ import annotations

import os
import time

__all__ = ["SceneOpener", "Opened", "draw_open_section", "one_line"]

SPINNER = "|/-\\"
#: the longest error line shown (characters; the panel wraps it): a loader's message names the file, then the
#: problem and any limit it hit, which a cut at 120 lost behind a long path
ERROR_LIMIT = 400


def one_line(text: str, limit: int = 120) -> str:
    """The first line of ``text``, at most ``limit`` characters (an ellipsis marks a cut)."""
    line = (str(text).strip().splitlines() or [""])[0]
    return line if len(line) <= limit else line[: limit - 3] + "..."


class Opened:
    """A loaded scene: ``model``, ``path`` (str), ``up`` (the axis name :func:`default_up` chose), ``seconds``."""

    def __init__(self, model, path: str, up: str, seconds: float):
        self.model, self.path, self.up, self.seconds = model, path, up, seconds


class SceneOpener:
    """Background loading of one scene file at a time.

    Attributes:
        path_field: the text of the panel's path field. error: one line about the last failure ("" if none).
        loading_path: the file being loaded, or None.
    """

    def __init__(self, loader=None):
        self.path_field = ""
        self.error = ""
        self.loading_path: str | None = None
        self._job = None
        self._t0 = 0.0
        self._loader = loader          # (path) -> (model, up); default: load_scene_file + default_up

    @property
    def loading(self) -> bool:
        return self._job is not None

    def start(self, path) -> bool:
        """Begin loading ``path`` (str or Path; surrounding whitespace and quotes are dropped, ``~`` expanded);
        False (and :attr:`error` set) when a load is already running or the path is empty."""
        from ..ui_state import Job

        p = os.path.expanduser(str(path).strip().strip("'\""))
        if not p:
            self.error = "open: no file given"
            return False
        if self._job is not None:
            self.error = f"open: still loading {self.loading_path}"
            return False
        self.error = ""
        self.path_field = p
        self.loading_path = p
        self._t0 = time.perf_counter()
        loader = self._loader or _load

        def run(job):
            t0 = time.perf_counter()
            model, up = loader(p)
            return Opened(model, p, up, time.perf_counter() - t0)

        self._job = Job("open", run)
        return True

    def poll(self) -> Opened | None:
        """The loaded scene once its load has finished (once), else None; a failed load sets :attr:`error`."""
        job = self._job
        if job is None or not job.done:
            return None
        self._job = None
        self.loading_path = None
        if job.error:   # the loader's whole line (it names the file, the problem and any limit hit; wrapped)
            self.error = one_line(job.error.split(": ", 1)[1] if ": " in job.error else job.error, ERROR_LIMIT)
            return None
        return job.result

    def wait(self, timeout: float | None = None) -> Opened | None:
        """Block until the running load ends (tests, scripts); then :meth:`poll`."""
        if self._job is not None:
            self._job.join(timeout)
        return self.poll()

    def status(self, now: float | None = None) -> str:
        """"loading NAME | 1.2 s" while loading (the bar turns with time), else ""."""
        if self._job is None:
            return ""
        now = time.perf_counter() if now is None else now
        t = now - self._t0
        return f"{SPINNER[int(t * 8) % 4]} loading {os.path.basename(self.loading_path)}  {t:.1f} s"


def _load(path):
    from ..scene import default_up, load_scene_file

    model = load_scene_file(path)
    return model, default_up(path, model)


def draw_open_section(imgui, opener: SceneOpener, requests: list, *, enabled: bool = True):
    """The File section: path field, Open button (Enter in the field opens too), loading line, error line."""
    if not imgui.collapsing_header("File", imgui.TreeNodeFlags_.default_open):
        return
    if not enabled:
        imgui.text_disabled("(open a scene: not while training)")
        return
    imgui.push_item_width(200)
    changed, opener.path_field = imgui.input_text("##open_path", opener.path_field,
                                                  imgui.InputTextFlags_.enter_returns_true)
    imgui.pop_item_width()
    imgui.same_line()
    if (imgui.button("open") or changed) and not opener.loading:
        requests.append("open:" + opener.path_field)
    if opener.loading:
        imgui.text_colored(imgui.ImVec4(0.5, 0.8, 1.0, 1.0), opener.status())
    elif opener.error:
        imgui.push_text_wrap_pos(imgui.get_cursor_pos_x() + 270)
        imgui.text_colored(imgui.ImVec4(1.0, 0.35, 0.3, 1.0), opener.error)
        imgui.pop_text_wrap_pos()
    else:
        imgui.text_disabled("or drop a scene file on the window")
