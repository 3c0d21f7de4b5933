"""Tile binning — the PyTorch reference of ``csrc/binning.cu`` (docs/PIPELINE.md [2]).

Each Gaussian is duplicated once per 16×16 tile its footprint ellipse actually touches (exact
ellipse–box test, not the 3σ square), keyed by ``(tile_id << 32) | float_bits(depth)`` and sorted by one
stable sort: tile-major, front-to-back, ties in Gaussian-index order.
"""
from __future__ import annotations

import math
from typing import NamedTuple

import torch

from .. import config
from ..renderer.output import BinningOverflow
from .project import tile_rects

__all__ = ["Binning", "bin_gaussians", "footprint_threshold", "min_q_over_box", "depth_bits"]


class Binning(NamedTuple):
    keys: torch.Tensor  # (E,) int64 sorted keys
    gaussian_ids: torch.Tensor  # (E,) int32, the Gaussian of each sorted entry
    tile_ranges: torch.Tensor  # (n_tiles, 2) int32 [start, end)
    tiles_touched: torch.Tensor  # (N,) int32 entries per Gaussian
    tiles_x: int
    tiles_y: int


def footprint_threshold(opacities: torch.Tensor) -> torch.Tensor:
    """Q = min(RADIUS_SIGMA², 2·ln(opacity / ALPHA_MIN)): beyond it a Gaussian is never blended (may be < 0)."""
    o = opacities.clamp_min(1e-30)
    return torch.minimum(torch.full_like(o, config.RADIUS_SIGMA ** 2), 2.0 * torch.log(o / config.ALPHA_MIN))


def min_q_over_box(A, B, C, dxl, dxh, dyl, dyh):
    """Minimum of q(d) = A dx² + 2B dx dy + C dy² over the box [dxl,dxh]×[dyl,dyh] (positive-definite q).

    0 when the box contains the origin; otherwise the least of the four edge minima, each found by
    clamping the unconstrained 1D minimiser to the edge.
    """
    def qf(dx, dy):
        return A * dx * dx + 2 * B * dx * dy + C * dy * dy

    best = None
    for e in (dxl, dxh):
        dy = torch.minimum(torch.maximum(-B * e / C, dyl), dyh)
        v = qf(e, dy)
        best = v if best is None else torch.minimum(best, v)
    for e in (dyl, dyh):
        dx = torch.minimum(torch.maximum(-B * e / A, dxl), dxh)
        best = torch.minimum(best, qf(dx, e))
    inside = (dxl <= 0) & (dxh >= 0) & (dyl <= 0) & (dyh >= 0)
    return torch.where(inside, torch.zeros_like(best), best)


def depth_bits(depths: torch.Tensor) -> torch.Tensor:
    """IEEE-754 bits of float32 depths as int64 in [0, 2³²) (monotone in value for depth > 0)."""
    return depths.detach().to(torch.float32).contiguous().view(torch.int32).to(torch.int64) & 0xFFFFFFFF


def bin_gaussians(means2D, conics, opacities, depths, radii, width: int, height: int) -> Binning:
    """Duplicate, key and sort (Gaussian, tile) entries.

    Args: means2D (N,2), conics (N,3), opacities (N,), depths (N,), radii (N,) int (0 = culled).
    Returns: :class:`Binning`.
    Raises: :class:`~rigel_core.renderer.output.BinningOverflow` (a RuntimeError) when the candidate (Gaussian,
    tile) pairs exceed ``config.MAX_ENTRIES``.
    """
    T = config.TILE_SIZE
    dev = means2D.device
    means2D, conics, opacities = means2D.detach(), conics.detach(), opacities.detach()
    n = means2D.shape[0]
    tiles_x, tiles_y = (width + T - 1) // T, (height + T - 1) // T
    n_tiles = tiles_x * tiles_y

    rect = tile_rects(means2D, radii, width, height)
    # a Gaussian whose footprint threshold is negative (opacity under ALPHA_MIN) passes no tile below (qmin ≥ 0):
    # not a candidate either, as in the kernel (csrc/rasterize_common.cuh), so it counts nowhere against the limit
    live = (radii > 0) & (footprint_threshold(opacities) >= -1e-3)
    area = torch.where(live, (rect[:, 2] - rect[:, 0]) * (rect[:, 3] - rect[:, 1]), torch.zeros_like(rect[:, 0]))
    total = int(area.sum())
    if total > config.MAX_ENTRIES:  # the candidate pairs (each Gaussian's box of tiles) are what gets allocated
        raise BinningOverflow(total, config.MAX_ENTRIES, area.to(torch.int32))
    gid = torch.repeat_interleave(torch.arange(n, device=dev), area)
    first = torch.cumsum(area, 0) - area
    local = torch.arange(total, device=dev) - first[gid]
    w = (rect[gid, 2] - rect[gid, 0]).clamp_min(1)
    tx = rect[gid, 0] + local % w
    ty = rect[gid, 1] + local // w

    # pixel-centre box of each tile, clipped to the image
    fdt = means2D.dtype
    xl = (tx * T).to(fdt) + 0.5
    xh = torch.minimum((tx * T + T).to(fdt) - 0.5, torch.tensor(width - 0.5, dtype=fdt, device=dev))
    yl = (ty * T).to(fdt) + 0.5
    yh = torch.minimum((ty * T + T).to(fdt) - 0.5, torch.tensor(height - 0.5, dtype=fdt, device=dev))
    u, v = means2D[gid, 0], means2D[gid, 1]
    A, B, C = conics[gid].unbind(-1)
    qmin = min_q_over_box(A, B, C, xl - u, xh - u, yl - v, yh - v)
    Q = footprint_threshold(opacities)[gid]
    hit = qmin <= Q * (1 + 1e-5) + 1e-5

    gid, tx, ty = gid[hit], tx[hit], ty[hit]
    tile_id = ty * tiles_x + tx
    keys = (tile_id << 32) | depth_bits(depths)[gid]
    keys, order = torch.sort(keys, stable=True)
    gaussian_ids = gid[order].to(torch.int32)
    sorted_tiles = keys >> 32
    tiles = torch.arange(n_tiles, device=dev)
    starts = torch.searchsorted(sorted_tiles, tiles, right=False)
    ends = torch.searchsorted(sorted_tiles, tiles, right=True)
    tile_ranges = torch.stack([starts, ends], -1).to(torch.int32)
    tiles_touched = torch.bincount(gid, minlength=n).to(torch.int32)
    return Binning(keys, gaussian_ids, tile_ranges, tiles_touched, tiles_x, tiles_y)
