"""GLFW window input → Dear ImGui IO and the viewer camera.

Mouse over an ImGui window goes to ImGui; elsewhere, in orbit mode: left drag orbits, right or middle drag (or
Shift + left) pans, the wheel zooms; in fly mode left drag looks around (the eye stays put). In both modes
W/S, A/D, E/Q fly forward/back, right/left, up/down while held (Shift ×10, Ctrl ×0.1), at a speed in world
units per second: the motion per frame is speed × the frame's duration, whatever the frame rate.
Keys (when ImGui does not want the keyboard): 1–4 render modes, F orbit/fly, R reset view, T snap to the nearest
training camera, [ and ] previous / next training camera, Space pause/resume training, F12 or P screenshot,
H hide panels, Esc quit, C show/hide the training cameras; editing: Ctrl+drag selects a rectangle (with Shift
adds to the selection, with Alt subtracts), Alt+drag paints with the brush, Delete deletes the selection, Ctrl+I
inverts it, Ctrl+Z undoes, Ctrl+Shift+Z or Ctrl+Y redoes. A click (no drag) on a training camera's frustum snaps
the view to it. A file dropped on the window is opened ("open:PATH").
"""
from __future__ import annotations

from . import requests as R

__all__ = ["GlfwInput"]


def _key_map(glfw, Key):
    m = {glfw.KEY_TAB: Key.tab, glfw.KEY_LEFT: Key.left_arrow, glfw.KEY_RIGHT: Key.right_arrow,
         glfw.KEY_UP: Key.up_arrow, glfw.KEY_DOWN: Key.down_arrow, glfw.KEY_PAGE_UP: Key.page_up,
         glfw.KEY_PAGE_DOWN: Key.page_down, glfw.KEY_HOME: Key.home, glfw.KEY_END: Key.end,
         glfw.KEY_INSERT: Key.insert, glfw.KEY_DELETE: Key.delete, glfw.KEY_BACKSPACE: Key.backspace,
         glfw.KEY_SPACE: Key.space, glfw.KEY_ENTER: Key.enter, glfw.KEY_ESCAPE: Key.escape,
         glfw.KEY_KP_ENTER: Key.keypad_enter, glfw.KEY_LEFT_CONTROL: Key.left_ctrl,
         glfw.KEY_RIGHT_CONTROL: Key.right_ctrl, glfw.KEY_LEFT_SHIFT: Key.left_shift,
         glfw.KEY_RIGHT_SHIFT: Key.right_shift, glfw.KEY_LEFT_ALT: Key.left_alt, glfw.KEY_RIGHT_ALT: Key.right_alt,
         glfw.KEY_MINUS: Key.minus, glfw.KEY_PERIOD: Key.period, glfw.KEY_COMMA: Key.comma,
         glfw.KEY_LEFT_BRACKET: Key.left_bracket, glfw.KEY_RIGHT_BRACKET: Key.right_bracket,
         glfw.KEY_F12: Key.f12}
    for i in range(10):
        m[getattr(glfw, f"KEY_{i}")] = getattr(Key, f"_{i}")
    for c in "ACVXYZWSDQEFRTHP":
        m[getattr(glfw, f"KEY_{c}")] = getattr(Key, c.lower())
    return m


class GlfwInput:
    """Installs GLFW callbacks on ``window``; call :meth:`new_frame` once per frame before ``imgui.new_frame``.

    ``actions`` collects keyboard shortcuts (:mod:`viewer.requests`: ``SetMode``, ``ResetView``, ``Screenshot``,
    ``TogglePanels``, ``Quit``, ``ToggleFly``, ``SnapNearest``, ``CycleCamera``, ``ToggleTraining``) and the
    Studio's texts (``"open:…"``, ``"click:…"``, ``"edit:…"``) for the app to apply at one point of its loop.
    ``fly_mode`` (set by the app) makes a left drag look around instead of orbiting.
    """

    #: (key name, axis, sign) of the held keys that fly the camera
    FLY_KEYS = (("W", 2, 1.0), ("S", 2, -1.0), ("D", 0, 1.0), ("A", 0, -1.0), ("E", 1, 1.0), ("Q", 1, -1.0))

    def __init__(self, window, camera):
        import glfw
        from imgui_bundle import imgui

        self.glfw, self.imgui = glfw, imgui
        self.window = window
        self.camera = camera
        self.io = imgui.get_io()
        self.keys = _key_map(glfw, imgui.Key)
        self.actions: list = []
        self._last = None
        self._drag = None  # (button, x, y)
        self._time = None
        self.fly_mode = False
        self.dt = 0.0
        self.select_rect = None   # (x0, y0, x1, y1) window coordinates of a Ctrl+drag in progress
        self.brush_at = None      # (x, y) of an Alt+drag in progress
        self._cursor = None       # the last cursor position reported
        self._stroke = 0          # brush strokes so far
        self._press = None        # (x, y, mods) of the left press, for clicks and selections
        self.events = 0           # input callbacks so far (the frame loop rebuilds the panels after any)
        self._held: set = set()   # keys held down now
        glfw.set_cursor_pos_callback(window, self._on_cursor)
        glfw.set_mouse_button_callback(window, self._on_button)
        glfw.set_scroll_callback(window, self._on_scroll)
        glfw.set_key_callback(window, self._on_key)
        glfw.set_char_callback(window, self._on_char)
        glfw.set_drop_callback(window, self._on_drop)
        glfw.set_framebuffer_size_callback(window, self._on_resize)

    def _on_resize(self, window, width, height):
        self.events += 1

    def _on_drop(self, window, paths):
        self.events += 1
        if paths:
            self.actions.append("open:" + str(paths[0]))

    def _brush_action(self, x, y) -> str:
        """A brush dab at window point (x, y); the dabs of one Alt+drag share a stroke number (one undo step)."""
        return f"brush:{x:.1f},{y:.1f}:{'subtract' if self._brush_sub else 'add'}:{self._stroke}"

    def _scale(self):
        w, h = self.glfw.get_window_size(self.window)
        fw, fh = self.glfw.get_framebuffer_size(self.window)
        return (fw / w if w else 1.0), (fh / h if h else 1.0)

    def _on_cursor(self, window, x, y):
        self.events += 1
        self.io.add_mouse_pos_event(float(x), float(y))
        self._cursor = (x, y)
        if self.select_rect is not None:
            self.select_rect = (*self.select_rect[:2], x, y)
            return
        if self.brush_at is not None:
            self.brush_at = (x, y)
            self.actions.append(self._brush_action(x, y))
            return
        if self._drag is not None and not self.io.want_capture_mouse:
            button, lx, ly = self._drag
            dx, dy = x - lx, y - ly
            shift = self.glfw.get_key(window, self.glfw.KEY_LEFT_SHIFT) == self.glfw.PRESS
            if button == self.glfw.MOUSE_BUTTON_LEFT and not shift:
                if self.fly_mode:
                    self.camera.look(dx, dy)
                else:
                    self.camera.orbit(dx, dy)
            else:
                self.camera.pan(dx, dy, self.glfw.get_window_size(window)[0])
        if self._drag is not None:
            self._drag = (self._drag[0], x, y)

    def _on_button(self, window, button, action, mods):
        self.events += 1
        if 0 <= button < 5:
            self.io.add_mouse_button_event(button, action == self.glfw.PRESS)
        glfw = self.glfw
        left = button == glfw.MOUSE_BUTTON_LEFT
        if action == glfw.PRESS and not self.io.want_capture_mouse:
            x, y = self._cursor or glfw.get_cursor_pos(window)
            if left and mods & glfw.MOD_CONTROL:
                self.select_rect = (x, y, x, y)
                self._select_mode = "add" if mods & glfw.MOD_SHIFT else ("subtract" if mods & glfw.MOD_ALT else
                                                                         "replace")
                return
            if left and mods & glfw.MOD_ALT:
                self.brush_at = (x, y)
                self._brush_sub = bool(mods & glfw.MOD_SHIFT)
                self._stroke += 1
                self.actions.append(self._brush_action(x, y))
                return
            self._drag = (button, x, y)
            self._press = (x, y) if left else None
        elif action == glfw.RELEASE:
            if left and self.select_rect is not None:
                x0, y0, x1, y1 = self.select_rect
                self.select_rect = None
                self.actions.append(f"select_rect:{x0:.1f},{y0:.1f},{x1:.1f},{y1:.1f}:{self._select_mode}")
            elif left and self.brush_at is not None:
                self.brush_at = None
            elif left and self._press is not None:
                x, y = self._cursor or glfw.get_cursor_pos(window)
                if abs(x - self._press[0]) + abs(y - self._press[1]) <= 3:
                    self.actions.append(f"click:{x:.1f},{y:.1f}")
            self._press = None
            self._drag = None

    def _on_scroll(self, window, dx, dy):
        self.events += 1
        self.io.add_mouse_wheel_event(float(dx), float(dy))
        if not self.io.want_capture_mouse:
            self.camera.zoom(dy)

    def _on_key(self, window, key, scancode, action, mods):
        glfw, Key = self.glfw, self.imgui.Key
        self.events += 1
        if action == glfw.RELEASE:
            self._held.discard(key)
        else:
            self._held.add(key)
        down = action != glfw.RELEASE
        k = self.keys.get(key)
        if k is not None:
            self.io.add_key_event(k, down)
        self.io.add_key_event(Key.mod_ctrl, bool(mods & glfw.MOD_CONTROL))
        self.io.add_key_event(Key.mod_shift, bool(mods & glfw.MOD_SHIFT))
        self.io.add_key_event(Key.mod_alt, bool(mods & glfw.MOD_ALT))
        if action != glfw.PRESS or self.io.want_capture_keyboard:
            return
        shortcuts = {glfw.KEY_F: R.ToggleFly(), glfw.KEY_T: R.SnapNearest(), glfw.KEY_RIGHT_BRACKET: R.CycleCamera(1),
                     glfw.KEY_LEFT_BRACKET: R.CycleCamera(-1), glfw.KEY_SPACE: R.ToggleTraining(),
                     glfw.KEY_R: R.ResetView(), glfw.KEY_F12: R.Screenshot(), glfw.KEY_P: R.Screenshot(),
                     glfw.KEY_H: R.TogglePanels(), glfw.KEY_ESCAPE: R.Quit()}
        if mods & glfw.MOD_CONTROL and key in (glfw.KEY_Z, glfw.KEY_Y, glfw.KEY_I):
            redo = key == glfw.KEY_Y or (key == glfw.KEY_Z and mods & glfw.MOD_SHIFT)
            self.actions.append("edit:invert" if key == glfw.KEY_I else ("edit:redo" if redo else "edit:undo"))
        elif key == glfw.KEY_DELETE:
            self.actions.append("edit:delete")
        elif key == glfw.KEY_C:
            self.actions.append("toggle_cameras")
        elif glfw.KEY_1 <= key <= glfw.KEY_4:
            self.actions.append(R.SetMode(key - glfw.KEY_1))
        elif key in shortcuts:
            self.actions.append(shortcuts[key])

    def _on_char(self, window, char):
        self.events += 1
        if 0 < char < 0x10000:
            self.io.add_input_character(char)

    def active(self) -> bool:
        """A drag, a selection, a brush stroke or a key is in progress: the frame loop builds every frame."""
        return bool(self._held) or self._drag is not None or self.select_rect is not None or self.brush_at is not None

    def new_frame(self):
        """Display size, framebuffer scale and delta time for ImGui's next frame."""
        glfw = self.glfw
        w, h = glfw.get_window_size(self.window)
        sx, sy = self._scale()
        self.io.display_size = self.imgui.ImVec2(float(w), float(h))
        self.io.display_framebuffer_scale = self.imgui.ImVec2(sx, sy)
        now = glfw.get_time()
        self.dt = max(now - self._time, 1e-4) if self._time is not None else 1.0 / 60.0
        self.io.delta_time = self.dt
        self._time = now
        self.fly_keys(self.dt)

    def fly_keys(self, dt: float) -> bool:
        """Move the camera for the fly keys held now, over ``dt`` seconds (not while ImGui has the keyboard).
        Returns True when it moved."""
        glfw = self.glfw
        if self.io.want_capture_keyboard:
            return False
        held = lambda k: glfw.get_key(self.window, k) == glfw.PRESS
        axes = [0.0, 0.0, 0.0]
        for name, axis, sign in self.FLY_KEYS:
            if held(getattr(glfw, f"KEY_{name}")):
                axes[axis] += sign
        if not any(axes):
            return False
        fast = held(glfw.KEY_LEFT_SHIFT) or held(glfw.KEY_RIGHT_SHIFT)
        slow = held(glfw.KEY_LEFT_CONTROL) or held(glfw.KEY_RIGHT_CONTROL)
        return self.camera.fly(dt, right=axes[0], up=axes[1], forward=axes[2], fast=fast, slow=slow)
