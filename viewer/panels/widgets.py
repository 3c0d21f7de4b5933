"""What the panels share: their width, number formatting, and a window placed once."""
from __future__ import annotations

import math

__all__ = ["PANEL_WIDTH", "gib", "fmt", "window", "wrapped_disabled"]

PANEL_WIDTH = 290


def gib(n: int) -> str:
    return f"{n / 2**30:.2f}"


def fmt(x: float, spec: str = ".2f", none: str = "-") -> str:
    return format(x, spec) if isinstance(x, (int, float)) and math.isfinite(x) else none


def wrapped_disabled(imgui, line: str) -> None:
    """``line`` greyed, wrapped at a panel's width (never cut off)."""
    imgui.push_text_wrap_pos(imgui.get_cursor_pos_x() + PANEL_WIDTH - 20)
    imgui.text_disabled(line)
    imgui.pop_text_wrap_pos()


def window(imgui, title: str, pos, pivot=(0.0, 0.0), size=None, *, auto: bool = True):
    """Begin a panel placed at ``pos`` (display coordinates, ``pivot`` the window's corner there) the first
    time it appears (afterwards where the user and the ini file put it). Returns whether it is expanded."""
    cond = imgui.Cond_.first_use_ever
    imgui.set_next_window_pos(imgui.ImVec2(*pos), cond, imgui.ImVec2(*pivot))
    if size is not None:
        imgui.set_next_window_size(imgui.ImVec2(*size), cond)
    if auto:
        imgui.set_next_window_size_constraints(imgui.ImVec2(PANEL_WIDTH, 0), imgui.ImVec2(PANEL_WIDTH, 1e6))
    imgui.set_next_window_bg_alpha(0.85)
    flags = imgui.WindowFlags_.always_auto_resize if auto else 0
    return imgui.begin(title, None, flags)[0]
