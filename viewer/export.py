"""The viewer's scene export (Export panel → save): the format choice and a file name that never overwrites.

The writing itself is :func:`rigel_core.io.save_scene` (formats and their quantisation errors: docs/PIPELINE.md,
"Scene file formats"); this module only maps the panel's choice to a suffix and picks an unused name.
"""
from __future__ import annotations

from pathlib import Path

__all__ = ["EXPORT_CHOICES", "export_path", "format_combo"]

#: (format key of rigel_core.io.export.EXPORT_FORMATS, suffix, label shown in the panel)
EXPORT_CHOICES = (
    ("ply", ".ply", "PLY (INRIA)"),
    ("compressed_ply", ".compressed.ply", "compressed PLY"),
    ("spz", ".spz", "SPZ"),
    ("splat", ".splat", "splat (SH 0)"),
)
_KEYS = [c[0] for c in EXPORT_CHOICES]


def export_path(directory, fmt: str = "ply", stem: str = "model") -> Path:
    """``directory/stem<suffix>``, or ``stem_2<suffix>``, ``stem_3<suffix>``, … when it exists; the whole
    (possibly double, ``.compressed.ply``) suffix is kept. Raises KeyError for an unknown ``fmt``."""
    suffix = dict((k, s) for k, s, _ in EXPORT_CHOICES)[fmt]
    directory = Path(directory)
    out, k = directory / f"{stem}{suffix}", 2
    while out.exists():
        out = directory / f"{stem}_{k}{suffix}"
        k += 1
    return out


def format_combo(imgui, current: str) -> str:
    """Draw the format combo box; returns the (possibly changed) format key."""
    idx = _KEYS.index(current) if current in _KEYS else 0
    imgui.push_item_width(130)
    _, idx = imgui.combo("##export format", idx, [c[2] for c in EXPORT_CHOICES])
    imgui.pop_item_width()
    return _KEYS[idx]
