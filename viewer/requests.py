"""What the panels and the keyboard ask the viewer to do: one small class per request, one handler per class.

The panels (:mod:`viewer.ui`, :mod:`viewer.panels`) and the input (:mod:`viewer.glfw_input`) only read state and return requests;
:meth:`viewer.app.Viewer.frame` applies them at one point of the frame through :data:`HANDLERS` (STYLE 10).
A new button is one request class here and one ``@handles`` function. The Studio's and the camera path's own
text requests (``"open:…"``, ``"edit:…"``, ``"path:…"``) pass through as :class:`Studio` / :class:`CameraPath`;
commands for the training thread (:mod:`viewer.messages`) as :class:`Train`.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from . import messages as M

__all__ = ["Request", "SetMode", "ResetView", "Screenshot", "TogglePanels", "ApplyVsync", "ApplyUp", "ToggleFly",
           "SnapNearest", "CycleCamera", "ToggleTraining", "SwitchAppearance", "SaveScene", "OrbitVideo",
           "CancelVideo", "Quit", "Studio", "CameraPath", "Train", "HANDLERS", "as_request", "apply_requests"]


class Request:
    """Base of the viewer's requests (frozen dataclasses)."""


@dataclass(frozen=True)
class SetMode(Request):
    mode: int                      # shaderio.h MODE_* (keys 1–4)


@dataclass(frozen=True)
class ResetView(Request):
    """The dataset's home view, or the scene's bounds fitted again (R)."""


@dataclass(frozen=True)
class Screenshot(Request):
    """Save the next present as PNG in the screenshot folder (F12 / P)."""


@dataclass(frozen=True)
class TogglePanels(Request):
    """Show / hide the ImGui panels (H)."""


@dataclass(frozen=True)
class ApplyVsync(Request):
    """The vsync checkbox changed ``settings.vsync``: recreate the swapchain with it."""


@dataclass(frozen=True)
class ApplyUp(Request):
    """The up-axis combo changed ``settings.up``: turn the camera's up to it."""


@dataclass(frozen=True)
class ToggleFly(Request):
    """Orbit ↔ fly camera (F)."""


@dataclass(frozen=True)
class SnapNearest(Request):
    """Snap to the training view nearest the eye (T)."""


@dataclass(frozen=True)
class CycleCamera(Request):
    step: int                      # +1 next (]), -1 previous ([)


@dataclass(frozen=True)
class ToggleTraining(Request):
    """Pause a running training, resume a paused one (space)."""


@dataclass(frozen=True)
class SwitchAppearance(Request):
    kind: str                      # "sh" or "mlp"


@dataclass(frozen=True)
class SaveScene(Request):
    """Write the shown scene (Export panel's format) into the screenshot folder, under a new name."""


@dataclass(frozen=True)
class OrbitVideo(Request):
    """Render an orbit video of the shown model in the background."""


@dataclass(frozen=True)
class CancelVideo(Request):
    """Stop the video being rendered (its partial file is removed)."""


@dataclass(frozen=True)
class Quit(Request):
    """Close the window (Esc)."""


@dataclass(frozen=True)
class Studio(Request):
    text: str                      # a viewer/studio.py request ("open:PATH", "click:x,y", "edit:undo", …)


@dataclass(frozen=True)
class CameraPath(Request):
    text: str                      # a viewer/panels/camera_path.py request ("path:add", "path:play", …)


@dataclass(frozen=True)
class Train(Request):
    command: M.Command             # forwarded to the training thread


#: request class -> handler(viewer, request)
HANDLERS: dict[type, Callable] = {}


def handles(cls):
    def register(fn):
        if cls in HANDLERS:
            raise RuntimeError(f"two handlers for {cls.__name__}")
        HANDLERS[cls] = fn
        return fn
    return register


def as_request(r) -> Request:
    """``r`` as a Request: a training command becomes :class:`Train`, a ``"path:…"`` text :class:`CameraPath`,
    any other text (the Studio's) :class:`Studio`. Raises TypeError for anything else."""
    if isinstance(r, Request):
        return r
    if isinstance(r, M.Command):
        return Train(r)
    if isinstance(r, str):
        return CameraPath(r) if r.startswith("path:") else Studio(r)
    raise TypeError(f"not a viewer request: {r!r}")


def apply_requests(viewer, pending) -> None:
    """Apply ``pending`` in order, each through its one handler."""
    for r in pending:
        r = as_request(r)
        HANDLERS[type(r)](viewer, r)


@handles(SetMode)
def _set_mode(v, r: SetMode):
    v.settings.mode = int(r.mode)


@handles(ResetView)
def _reset_view(v, r):
    if v.frames:
        v.camera.reset()       # the home view of the dataset (frame_cameras)
    else:
        v.frame_scene()        # fit the scene's bounds again, from the current direction
    v.camera_index = None


@handles(Screenshot)
def _screenshot(v, r):
    v.screenshot_next()


@handles(TogglePanels)
def _toggle_panels(v, r):
    v.settings.show_panels = not v.settings.show_panels


@handles(ApplyVsync)
def _vsync(v, r):
    if hasattr(v.target, "set_vsync"):
        v.target.set_vsync(v.settings.vsync)


@handles(ApplyUp)
def _up(v, r):
    v.camera.set_up(v.settings.up)


@handles(ToggleFly)
def _fly(v, r):
    v.settings.fly = not v.settings.fly


@handles(SnapNearest)
def _snap(v, r):
    v.snap_nearest()


@handles(CycleCamera)
def _cycle(v, r: CycleCamera):
    if not v.frames:
        return
    if v.camera_index is None or v.camera.snapped is None:
        v.snap_nearest()
    else:
        v.snap_to_camera(v.camera_index + r.step)


@handles(ToggleTraining)
def _toggle_training(v, r):
    if v.training is not None:
        v.training.send(M.Pause() if v.train_state.status == "running" else M.Resume())


@handles(SwitchAppearance)
def _appearance(v, r: SwitchAppearance):
    v.start_appearance_switch(r.kind)


@handles(SaveScene)
def _save(v, r):
    v.start_save_ply()


@handles(OrbitVideo)
def _video(v, r):
    v.start_video()


@handles(CancelVideo)
def _cancel_video(v, r):
    job = v.jobs.get("video")
    if job is not None:
        job.cancel()


@handles(Quit)
def _quit(v, r):
    v.request_close()


@handles(Studio)
def _studio(v, r: Studio):
    v.studio.handle(r.text)


@handles(CameraPath)
def _camera_path(v, r: CameraPath):
    from .panels.camera_path import apply_request

    apply_request(v, r.text)


@handles(Train)
def _train(v, r: Train):
    if v.training is not None:
        v.training.send(r.command)
