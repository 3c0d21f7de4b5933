"""Depth maps on disk: 16-bit PNG with its scale in text chunks, and float32 ``.npy`` (``rigel-render --depth``).

PNG encoding (greyscale, 16 bits, one sample per pixel), for a depth ``d`` in world units (camera-space z):

    v = 0                                            where there is no depth (nothing blended: d = 0)
    v = 1 + round(65534 · clamp((d − near) / (far − near), 0, 1))   elsewhere

so ``d ≈ near + (v − 1) / 65534 · (far − near)`` (step (far − near)/65534), depths outside [near, far] clipped.
The PNG's text chunks hold ``rigel:depth_near``, ``rigel:depth_far`` (repr of the floats),
``rigel:depth_kind`` (``expected`` or ``median``) and ``rigel:depth_encoding`` (the formula above); any PNG
reader returns the 16-bit samples, :func:`read_depth_png` the depths. The ``.npy`` holds the float32 (H, W) depth
itself (0 = no depth). Both are written atomically (:mod:`rigel_core.atomic`).
"""
from __future__ import annotations

import numpy as np

from .atomic import atomic_path

__all__ = ["DEPTH_LEVELS", "depth_range", "encode_depth16", "decode_depth16", "write_depth_png", "read_depth_png",
           "write_depth_npy"]

DEPTH_LEVELS = 65534  # v = 1 .. 65535 spans [near, far]; v = 0 is "no depth"
ENCODING = "v=0: no depth; else depth = near + (v - 1) / 65534 * (far - near)"


def _np(x) -> np.ndarray:
    if hasattr(x, "detach"):
        x = x.detach().float().cpu().numpy()
    return np.asarray(x, dtype=np.float32)


def depth_range(depth) -> tuple[float, float]:
    """(near, far): min and max of the positive finite depths of the (H, W) map; (0, 1) when it has none.
    near == far (a flat map) is widened to (near, near + 1e-6·max(1, |near|)) so the scale stays finite."""
    d = _np(depth)
    d = d[np.isfinite(d) & (d > 0)]
    if d.size == 0:
        return 0.0, 1.0
    near, far = float(d.min()), float(d.max())
    if far <= near:
        far = near + 1e-6 * max(1.0, abs(near))
    return near, far


def encode_depth16(depth, near: float, far: float) -> np.ndarray:
    """(H, W) uint16 samples of ``depth`` (see the module docstring); ValueError unless far > near."""
    if not (np.isfinite(near) and np.isfinite(far) and far > near):
        raise ValueError(f"depth range: need finite near < far, got near={near}, far={far}")
    d = _np(depth).astype(np.float64)
    has = np.isfinite(d) & (d > 0)
    t = np.clip((np.where(has, d, near) - near) / (far - near), 0.0, 1.0)
    return np.where(has, 1 + np.rint(t * DEPTH_LEVELS), 0).astype(np.uint16)


def decode_depth16(v, near: float, far: float) -> np.ndarray:
    """float32 depths of uint16 samples ``v`` (0 → 0)."""
    v = np.asarray(v).astype(np.float64)
    return np.where(v > 0, near + (v - 1) / DEPTH_LEVELS * (far - near), 0.0).astype(np.float32)


def write_depth_png(path, depth, near: float, far: float, kind: str = "expected") -> None:
    """Write ``depth`` (H, W) as a 16-bit greyscale PNG scaled to [near, far], the scale in text chunks."""
    from PIL import Image
    from PIL.PngImagePlugin import PngInfo

    v = encode_depth16(depth, near, far)
    info = PngInfo()
    info.add_text("rigel:depth_near", repr(float(near)))
    info.add_text("rigel:depth_far", repr(float(far)))
    info.add_text("rigel:depth_kind", kind)
    info.add_text("rigel:depth_encoding", ENCODING)
    img = Image.fromarray(v)  # uint16 → mode "I;16": a 16-bit greyscale PNG
    with atomic_path(path) as tmp:
        img.save(tmp, format="PNG", pnginfo=info)


def read_depth_png(path) -> tuple[np.ndarray, dict]:
    """(depth (H, W) float32, {near, far, kind}) of a PNG :func:`write_depth_png` wrote.

    Raises ValueError naming the file when it lacks the depth text chunks or is not 16-bit greyscale.
    """
    from PIL import Image

    with Image.open(path) as img:
        text = dict(getattr(img, "text", {}) or {})
        mode = img.mode
        v = np.asarray(img)
    if "rigel:depth_near" not in text or "rigel:depth_far" not in text:
        raise ValueError(f"{path}: not a rigel depth PNG (no rigel:depth_near / rigel:depth_far text chunks)")
    if mode not in ("I;16", "I;16B", "I"):
        raise ValueError(f"{path}: depth PNG must be 16-bit greyscale, got mode {mode}")
    near, far = float(text["rigel:depth_near"]), float(text["rigel:depth_far"])
    return decode_depth16(v, near, far), {"near": near, "far": far, "kind": text.get("rigel:depth_kind", "")}


def write_depth_npy(path, depth) -> None:
    """Write ``depth`` (H, W) as a float32 ``.npy`` atomically."""
    d = np.ascontiguousarray(_np(depth))
    with atomic_path(path) as tmp:
        with open(tmp, "wb") as f:
            np.save(f, d)
