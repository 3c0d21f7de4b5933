"""The overdraw colormap: the definition the present pass samples and the tests compare against.

A 256-entry lookup table, piecewise linear between a few anchor colours (dark violet for 0 → red → orange →
pale yellow at the maximum; dark at 0 so empty sky stays dark and heavy overdraw glows), quantised to 8 bits so
that an 8-bit UNORM target shows exactly the table's value. A pixel with ``n`` entries walked shows entry
``(min(max(n, 0), m) * 255) // m`` where ``m = max(overdraw_max, 1)`` (viewer/gpu/shaders/shaderio.h).
"""
from __future__ import annotations

import numpy as np

__all__ = ["ANCHORS", "overdraw_lut", "overdraw_index", "depth_range", "depth_index", "depth_colors"]

#: (position in [0, 1], RGB in [0, 1]) anchor colours.
ANCHORS = (
    (0.00, (0.02, 0.01, 0.10)),
    (0.20, (0.23, 0.05, 0.45)),
    (0.45, (0.65, 0.13, 0.45)),
    (0.70, (0.95, 0.40, 0.15)),
    (0.88, (0.99, 0.72, 0.20)),
    (1.00, (0.99, 0.98, 0.75)),
)


def overdraw_lut(size: int = 256) -> np.ndarray:
    """(size, 4) float32 RGBA, alpha 1; every value is an exact multiple of 1/255."""
    pos = np.array([a[0] for a in ANCHORS])
    rgb = np.array([a[1] for a in ANCHORS])
    t = np.linspace(0.0, 1.0, size)
    out = np.stack([np.interp(t, pos, rgb[:, c]) for c in range(3)], -1)
    q = np.round(out * 255.0).astype(np.uint8)
    lut = np.ones((size, 4), np.float32)
    lut[:, :3] = q.astype(np.float32) / np.float32(255.0)
    return lut


def overdraw_index(n_contrib, overdraw_max: int, size: int = 256) -> np.ndarray:
    """LUT index of each pixel (integer arithmetic, as in the shader)."""
    m = max(int(overdraw_max), 1)
    n = np.clip(np.asarray(n_contrib, dtype=np.int64), 0, m)
    return (n * (size - 1)) // m


# ---- depth display (issue 17.2): the same table over depth ------------------------------------------------------

def depth_range(depth):
    """(near, far) 0-dim tensors: min and max of the positive depths of the frame ((0, 1) where none), on the
    depth's device without a host synchronisation."""
    import torch

    has = depth > 0
    inf = torch.tensor(float("inf"), dtype=depth.dtype, device=depth.device)
    near = torch.where(has, depth, inf).amin()
    far = torch.where(has, depth, -inf).amax()
    ok = has.any()
    near = torch.where(ok, near, torch.zeros_like(near))
    far = torch.where(ok, torch.maximum(far, near + 1e-6), torch.ones_like(far))
    return near, far


def depth_index(depth, near, far, size: int = 256):
    """LUT index of each pixel: 0 where there is no depth (d ≤ 0), else 1 + round((size − 2)·t),
    t = clamp((d − near)/(far − near), 0, 1): near is dark, far is bright, empty sky the darkest entry."""
    import torch

    span = torch.as_tensor(far, dtype=depth.dtype, device=depth.device) - near
    t = ((depth - near) / torch.clamp_min(span, 1e-12)).clamp(0, 1)
    idx = 1 + torch.round(t * (size - 2)).long()
    return torch.where(depth > 0, idx, torch.zeros_like(idx))


def depth_colors(depth, near, far, lut):
    """(H, W, 3) colours of a depth map (H, W) through ``lut`` (size, 4) (a tensor of :func:`overdraw_lut` on
    the depth's device), scaled to [near, far] (floats or 0-dim tensors)."""
    return lut[depth_index(depth, near, far, lut.shape[0])][..., :3].to(depth.dtype)
