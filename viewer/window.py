"""The viewer's GLFW window: opening it (one line saying what to install or do when it cannot), its close flag,
the display's refresh rate (the frame loop's pacing while training), and Ctrl-C as a flag."""
from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading

from .gpu.targets import DisplayUnavailable

__all__ = ["Window", "sigint_flag"]

#: refresh rate assumed when the monitor does not say (a virtual display, a headless X server)
DEFAULT_REFRESH_HZ = 60.0


class Window:
    """A GLFW window without a client API (Vulkan draws into it).

    Raises:
        DisplayUnavailable: no display, no ``glfw`` package, no Vulkan loader, or GLFW could not create it.
    """

    def __init__(self, size, title: str):
        if not (os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY")):
            raise DisplayUnavailable("no display (DISPLAY / WAYLAND_DISPLAY unset): run with --offscreen, or under a "
                                     "virtual display: `apt-get install xvfb` then `xvfb-run -a rigel-viewer …`")
        try:
            import glfw
        except ImportError as e:
            raise DisplayUnavailable(f"the Python package `glfw` is missing ({e}): `pip install glfw` "
                                     "(rigel's 'viewer' extra)") from None
        if not glfw.init():
            raise DisplayUnavailable("GLFW could not initialise the display "
                                     f"({os.environ.get('DISPLAY') or os.environ.get('WAYLAND_DISPLAY')}): "
                                     "use --offscreen or check the X server")
        self.glfw = glfw
        self.handle = None
        if not glfw.vulkan_supported():
            self.close()
            raise DisplayUnavailable("GLFW finds no Vulkan loader: `apt-get install libvulkan1 mesa-vulkan-drivers`")
        glfw.window_hint(glfw.CLIENT_API, glfw.NO_API)
        self.handle = glfw.create_window(int(size[0]), int(size[1]), title, None, None)
        if not self.handle:
            self.close()
            raise DisplayUnavailable("GLFW could not create a window on this display: use --offscreen")
        exts = list(glfw.get_required_instance_extensions() or [])
        if not exts:
            self.close()
            raise DisplayUnavailable("GLFW reports no Vulkan surface support on this display: use --offscreen")
        self.instance_extensions = exts

    def refresh_hz(self) -> float:
        """The refresh rate of the monitor showing the window (the primary one; :data:`DEFAULT_REFRESH_HZ` when
        it does not say)."""
        glfw = self.glfw
        monitor = glfw.get_window_monitor(self.handle) or glfw.get_primary_monitor()
        mode = glfw.get_video_mode(monitor) if monitor else None
        hz = float(getattr(mode, "refresh_rate", 0) or 0) if mode is not None else 0.0
        return hz if hz > 0 else DEFAULT_REFRESH_HZ

    def visible(self) -> bool:
        """False while minimised or hidden: a frame would not be seen."""
        glfw = self.glfw
        return not glfw.get_window_attrib(self.handle, glfw.ICONIFIED) and \
            bool(glfw.get_window_attrib(self.handle, glfw.VISIBLE))

    def should_close(self) -> bool:
        return bool(self.glfw.window_should_close(self.handle))

    def request_close(self) -> None:
        self.glfw.set_window_should_close(self.handle, True)

    def poll(self) -> None:
        self.glfw.poll_events()

    def wait(self, timeout_s: float) -> None:
        """Sleep until an input event or ``timeout_s``."""
        self.glfw.wait_events_timeout(max(float(timeout_s), 0.0))

    def close(self) -> None:
        if self.handle is not None:
            self.glfw.destroy_window(self.handle)
            self.handle = None
        self.glfw.terminate()


def closing_words(viewer) -> str:
    """What a Ctrl-C or SIGTERM of ``viewer`` does, for its one line: "saving the training and closing" while a
    training session has something unsaved, else "closing" (a session that trained nothing saves nothing)."""
    training = getattr(viewer, "training", None)
    return "saving the training and closing" if training is not None and training.unsaved else "closing"


@contextlib.contextmanager
def sigint_flag(viewer):
    """While inside: the first SIGINT or SIGTERM (``kill``, ``timeout``, ``docker stop``, a scheduler; as
    rigel-train) sets ``viewer.interrupted`` and ``viewer.stop_signal`` (the loop ends cleanly and the training is
    saved), a second one raises KeyboardInterrupt. Only on the main thread (elsewhere a no-op)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum, frame):
        if viewer.interrupted:
            raise KeyboardInterrupt
        viewer.interrupted = True
        viewer.stop_signal = signum
        what = closing_words(viewer)
        how = "interrupted" if signum == signal.SIGINT else "terminated"
        print(f"rigel-viewer: {how}, {what} (Ctrl-C again to abort)", file=sys.stderr)

    old = {s: signal.signal(s, handler) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for s, h in old.items():
            signal.signal(s, h)
