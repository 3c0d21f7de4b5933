"""GLFW window input → Dear ImGui IO and the orbit camera.

Mouse over an ImGui window goes to ImGui; elsewhere: left drag orbits, right or middle drag (or shift + left)
pans, the wheel zooms. Keys (when ImGui does not want the keyboard): 1–4 render modes, R reset view,
F12 / P screenshot, H hide panels, Esc quit.
"""
from __future__ import annotations

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
         glfw.KEY_MINUS: Key.minus, glfw.KEY_PERIOD: Key.period, glfw.KEY_COMMA: Key.comma}
    for i in range(10):
        m[getattr(glfw, f"KEY_{i}")] = getattr(Key, f"_{i}")
    for c in "ACVXYZ":
        m[getattr(glfw, f"KEY_{c}")] = getattr(Key, c.lower())
    return m


class GlfwInput:
    """Installs GLFW callbacks on ``window``; call :meth:`new_frame` once per frame before ``imgui.new_frame``.

    ``actions`` collects keyboard shortcuts (e.g. "mode:2", "reset", "screenshot", "toggle_panels", "quit")
    for the app to apply at one point of its loop.
    """

    def __init__(self, window, camera):
        import glfw
        from imgui_bundle import imgui

        self.glfw, self.imgui = glfw, imgui
        self.window = window
        self.camera = camera
        self.io = imgui.get_io()
        self.keys = _key_map(glfw, imgui.Key)
        self.actions: list[str] = []
        self._last = None
        self._drag = None  # (button, x, y)
        self._time = None
        glfw.set_cursor_pos_callback(window, self._on_cursor)
        glfw.set_mouse_button_callback(window, self._on_button)
        glfw.set_scroll_callback(window, self._on_scroll)
        glfw.set_key_callback(window, self._on_key)
        glfw.set_char_callback(window, self._on_char)

    def _scale(self):
        w, h = self.glfw.get_window_size(self.window)
        fw, fh = self.glfw.get_framebuffer_size(self.window)
        return (fw / w if w else 1.0), (fh / h if h else 1.0)

    def _on_cursor(self, window, x, y):
        self.io.add_mouse_pos_event(float(x), float(y))
        if self._drag is not None and not self.io.want_capture_mouse:
            button, lx, ly = self._drag
            dx, dy = x - lx, y - ly
            shift = self.glfw.get_key(window, self.glfw.KEY_LEFT_SHIFT) == self.glfw.PRESS
            if button == self.glfw.MOUSE_BUTTON_LEFT and not shift:
                self.camera.orbit(dx, dy)
            else:
                self.camera.pan(dx, dy, self.glfw.get_window_size(window)[0])
        if self._drag is not None:
            self._drag = (self._drag[0], x, y)

    def _on_button(self, window, button, action, mods):
        if 0 <= button < 5:
            self.io.add_mouse_button_event(button, action == self.glfw.PRESS)
        if action == self.glfw.PRESS and not self.io.want_capture_mouse:
            x, y = self.glfw.get_cursor_pos(window)
            self._drag = (button, x, y)
        elif action == self.glfw.RELEASE:
            self._drag = None

    def _on_scroll(self, window, dx, dy):
        self.io.add_mouse_wheel_event(float(dx), float(dy))
        if not self.io.want_capture_mouse:
            self.camera.zoom(dy)

    def _on_key(self, window, key, scancode, action, mods):
        glfw, Key = self.glfw, self.imgui.Key
        down = action != glfw.RELEASE
        k = self.keys.get(key)
        if k is not None:
            self.io.add_key_event(k, down)
        self.io.add_key_event(Key.mod_ctrl, bool(mods & glfw.MOD_CONTROL))
        self.io.add_key_event(Key.mod_shift, bool(mods & glfw.MOD_SHIFT))
        self.io.add_key_event(Key.mod_alt, bool(mods & glfw.MOD_ALT))
        if action != glfw.PRESS or self.io.want_capture_keyboard:
            return
        if glfw.KEY_1 <= key <= glfw.KEY_4:
            self.actions.append(f"mode:{key - glfw.KEY_1}")
        elif key == glfw.KEY_R:
            self.actions.append("reset")
        elif key in (glfw.KEY_F12, glfw.KEY_P):
            self.actions.append("screenshot")
        elif key == glfw.KEY_H:
            self.actions.append("toggle_panels")
        elif key == glfw.KEY_ESCAPE:
            self.actions.append("quit")

    def _on_char(self, window, char):
        if 0 < char < 0x10000:
            self.io.add_input_character(char)

    def new_frame(self):
        """Display size, framebuffer scale and delta time for ImGui's next frame."""
        glfw = self.glfw
        w, h = glfw.get_window_size(self.window)
        sx, sy = self._scale()
        self.io.display_size = self.imgui.ImVec2(float(w), float(h))
        self.io.display_framebuffer_scale = self.imgui.ImVec2(sx, sy)
        now = glfw.get_time()
        self.io.delta_time = max(now - self._time, 1e-4) if self._time is not None else 1.0 / 60.0
        self._time = now
