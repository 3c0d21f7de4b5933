"""Tile rasterization — the PyTorch reference of ``csrc/rasterize_fwd.cu`` (docs/PIPELINE.md [3]).

Front-to-back alpha compositing, C = Σ_i c_i α_i Π_{j<i}(1 − α_j) (Kerbl et al. 2023, eq. 3), with every
guard of DESIGN §3: the 3σ cut, α = min(ALPHA_MAX, o·exp(power)), skip below ALPHA_MIN, stop before T
would fall under T_MIN. Vectorised: tiles are grouped by entry count into chunks, padded to the chunk's
longest list, and composited with a cumulative product along the list (the same sequential float
products the kernel forms, so termination decisions agree). Differentiable by autograd.
"""
from __future__ import annotations

from typing import NamedTuple

import torch

from .. import config

__all__ = ["Raster", "rasterize_tiles"]


class Raster(NamedTuple):
    image: torch.Tensor  # (H, W, 3)
    final_T: torch.Tensor  # (H, W)
    n_contrib: torch.Tensor  # (H, W) int32


def _tile_pixels(tile_idx, tiles_x, dtype, device):
    """(nt, T², 2) pixel-centre coordinates of the given tiles, row-major inside the tile."""
    T = config.TILE_SIZE
    ly, lx = torch.meshgrid(torch.arange(T, device=device), torch.arange(T, device=device), indexing="ij")
    ox = (tile_idx % tiles_x) * T
    oy = (tile_idx // tiles_x) * T
    px = (ox[:, None] + lx.reshape(1, -1)).to(dtype) + 0.5
    py = (oy[:, None] + ly.reshape(1, -1)).to(dtype) + 0.5
    return torch.stack([px, py], -1)


def rasterize_tiles(means2D, conics, colors, opacities, gaussian_ids, tile_ranges, tiles_x: int, tiles_y: int,
                    width: int, height: int, background=None, max_chunk_elems: int = 1 << 22) -> Raster:
    """Composite the binned Gaussians into an image.

    Args:
        means2D (N,2), conics (N,3), colors (N,C), opacities (N,): per-Gaussian, one floating dtype;
        gaussian_ids (E,) int, tile_ranges (n_tiles,2) int from binning; background (C,) or None (black).
    Returns: :class:`Raster` with image (H,W,C), final_T (H,W), n_contrib (H,W) int32.
    """
    T = config.TILE_SIZE
    P = T * T
    dev, dtype = means2D.device, means2D.dtype
    nchan = colors.shape[-1]
    n_tiles = tiles_x * tiles_y
    starts = tile_ranges[:, 0].long()
    lens = (tile_ranges[:, 1] - tile_ranges[:, 0]).long()
    bg = torch.zeros(nchan, dtype=dtype, device=dev) if background is None else background.to(dev, dtype)
    gids_all = gaussian_ids.long()

    nonempty = torch.nonzero(lens > 0).flatten()
    nonempty = nonempty[torch.argsort(lens[nonempty], stable=True)]
    ne_lens = lens[nonempty].tolist()
    order_parts, rgb_parts, T_parts, n_parts = [], [], [], []
    i = 0
    while i < len(ne_lens):
        j = i + 1
        while j < len(ne_lens) and ne_lens[j] * (j + 1 - i) * P <= max_chunk_elems:
            j += 1
        tiles = nonempty[i:j]
        L = ne_lens[j - 1]
        i = j
        pos = torch.arange(L, device=dev)
        valid = pos[None, :] < lens[tiles][:, None]  # (nt, L)
        idx = (starts[tiles][:, None] + pos[None, :]).clamp_max(max(gids_all.numel() - 1, 0))
        g = torch.where(valid, gids_all[idx], torch.zeros_like(idx))
        pix = _tile_pixels(tiles, tiles_x, dtype, dev)  # (nt, P, 2)
        d = pix[:, None, :, :] - means2D[g][:, :, None, :]  # (nt, L, P, 2)
        dx, dy = d[..., 0], d[..., 1]
        A, B, C = (conics[g][..., k, None] for k in range(3))
        q = A * dx * dx + 2 * B * dx * dy + C * dy * dy
        alpha = torch.clamp_max(opacities[g][..., None] * torch.exp(-0.5 * q), config.ALPHA_MAX)
        use = valid[..., None] & (q <= config.RADIUS_SIGMA ** 2) & (alpha >= config.ALPHA_MIN)
        a = torch.where(use, alpha, torch.zeros_like(alpha))
        with torch.no_grad():
            Tp = torch.cumprod(1 - a, dim=1)
            blended = torch.cumsum((Tp < config.T_MIN).to(torch.int32), dim=1) == 0
            blended &= use
        a2 = torch.where(blended, a, torch.zeros_like(a))
        Tp2 = torch.cumprod(1 - a2, dim=1)
        T_excl = torch.cat([torch.ones_like(Tp2[:, :1]), Tp2[:, :-1]], 1)
        w = a2 * T_excl
        col = colors[g] * valid[..., None].to(dtype)
        rgb = torch.einsum("tlp,tlc->tpc", w, col)
        n_c = ((pos + 1)[None, :, None] * blended).amax(1).to(torch.int32)
        order_parts.append(tiles)
        rgb_parts.append(rgb)
        T_parts.append(Tp2[:, -1, :])
        n_parts.append(n_c)

    empty = torch.nonzero(lens == 0).flatten()
    order_parts.append(empty)
    rgb_parts.append(torch.zeros(empty.numel(), P, nchan, dtype=dtype, device=dev))
    T_parts.append(torch.ones(empty.numel(), P, dtype=dtype, device=dev))
    n_parts.append(torch.zeros(empty.numel(), P, dtype=torch.int32, device=dev))
    order = torch.cat(order_parts)
    inv = torch.empty_like(order)
    inv[order] = torch.arange(n_tiles, device=dev)
    rgb = torch.cat(rgb_parts)[inv]
    fT = torch.cat(T_parts)[inv]
    nc = torch.cat(n_parts)[inv]

    def untile(x):
        x = x.reshape(tiles_y, tiles_x, T, T, *x.shape[2:]).transpose(1, 2)
        return x.reshape(tiles_y * T, tiles_x * T, *x.shape[4:])[:height, :width]

    final_T = untile(fT)
    image = untile(rgb) + final_T[..., None] * bg
    return Raster(image, final_T, untile(nc))
