"""Tile rasterization — the PyTorch reference of ``csrc/rasterize_fwd.cu`` (docs/PIPELINE.md [3]).

Front-to-back alpha compositing, C = Σ_i c_i α_i Π_{j<i}(1 − α_j) (Kerbl et al. 2023, eq. 3), with every
guard of DESIGN §3: the 3σ cut, α = min(ALPHA_MAX, o·exp(power)), skip below ALPHA_MIN, stop before T
would fall under T_MIN. Vectorised over tiles and pixels;
the kernel's batches are mimicked by walking all tiles' lists a block of entries at a time. Differentiable by
autograd.
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


def rasterize_tiles(means2D, conics, colors, opacities, gaussian_ids, tile_ranges, tiles_x: int, tiles_y: int,
                    width: int, height: int, background=None, block: int = 24) -> Raster:
    """Composite the binned Gaussians into an image.

    All non-empty tiles are processed together, ``block`` list entries at a time (like the kernel's
    shared-memory batches): transmittance is carried between blocks as the first factor of a sequential
    cumulative product, so every pixel forms exactly the products ``T·(1−α₁)·(1−α₂)…`` in the kernel's
    order, and a tile leaves the working set once all of its pixels have stopped.

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
    need_grad = torch.is_grad_enabled() and any(t.requires_grad for t in (means2D, conics, colors, opacities))
    max_idx = max(gids_all.numel() - 1, 0)

    active = torch.nonzero(lens > 0).flatten()
    na = active.numel()
    Tr = torch.ones(na, P, dtype=dtype, device=dev)
    rgb = torch.zeros(na, P, nchan, dtype=dtype, device=dev)
    last = torch.zeros(na, P, dtype=torch.int32, device=dev)
    done = torch.zeros(na, P, dtype=torch.bool, device=dev)
    px = ((active % tiles_x) * T)[:, None] + torch.arange(T, device=dev)[None, :] + 0.5  # (na, T) columns
    py = ((active // tiles_x) * T)[:, None] + torch.arange(T, device=dev)[None, :] + 0.5  # (na, T) rows
    px, py = px.to(dtype), py.to(dtype)
    order_parts, rgb_parts, T_parts, n_parts = [], [], [], []
    s = 0
    while active.numel() > 0:
        L = lens[active]
        pos = s + torch.arange(block, device=dev)
        valid = pos[None, :] < L[:, None]  # (na, B)
        idx = (starts[active][:, None] + pos[None, :]).clamp_max(max_idx)
        g = torch.where(valid, gids_all[idx], torch.zeros_like(idx))
        # q over the tile, separably: dx varies along the 16 columns, dy along the 16 rows.
        mu = means2D[g]  # (na, B, 2)
        dx = px[:, None, :] - mu[:, :, 0, None]  # (na, B, T)
        dy = py[:, None, :] - mu[:, :, 1, None]  # (na, B, T)
        # power = −q/2 directly: scaling the coefficients by −1/2 (a power of two) gives bit-identical products
        # and sums, so this is exactly −0.5·q and "q ≤ 9" is exactly "power ≥ −4.5", one pass fewer.
        con = conics[g]
        nA, nB, nC = -0.5 * con[..., 0, None], -con[..., 1, None], -0.5 * con[..., 2, None]
        power = ((nA * dx * dx)[:, :, None, :] + (nB * dx)[:, :, None, :] * dy[..., None]
                 + (nC * dy * dy)[..., None]).reshape(*g.shape, P)  # (na, B, P), row-major pixels
        opac = torch.where(valid, opacities[g], torch.zeros_like(opacities[g]))  # padding: alpha 0, never used
        alpha = torch.clamp_max(opac[..., None] * torch.exp(power), config.ALPHA_MAX)
        use = ~done[:, None, :] & (power >= -0.5 * config.RADIUS_SIGMA ** 2) & (alpha >= config.ALPHA_MIN)
        a = torch.where(use, alpha, torch.zeros_like(alpha))
        with torch.no_grad():
            # T only falls along the list, so "T would drop below T_MIN" holds from the stopping entry on.
            Tfull = torch.cumprod(torch.cat([Tr.detach()[:, None], 1 - a], 1), 1)  # (na, B+1, P)
            stop = Tfull[:, 1:] < config.T_MIN
            blended = use & ~stop
        if need_grad:
            a2 = torch.where(blended, a, torch.zeros_like(a))
            Tc = torch.cumprod(torch.cat([Tr[:, None], 1 - a2], 1), 1)  # (na, B+1, P)
            w = a2 * Tc[:, :-1]
            Tr_next = Tc[:, -1]
        else:  # same values without a second scan: the stopped entries are a suffix, so T after the last
            # blended entry is Tfull at the number of entries that did not stop
            w = torch.where(blended, a * Tfull[:, :-1], torch.zeros_like(a))
            n_go = (~stop).sum(1, keepdim=True)  # (na, 1, P)
            Tr_next = Tfull.gather(1, n_go).squeeze(1)
        # padding entries read Gaussian 0: a where, not a product, so its colour (even a culled one's NaN/Inf)
        # never reaches the sum (0·NaN = NaN would poison the whole tile)
        col = torch.where(valid[..., None], colors[g], torch.zeros((), dtype=dtype, device=dev))
        rgb = rgb + torch.einsum("tbp,tbc->tpc", w, col)
        Tr = Tr_next
        pos1 = (pos + 1).to(torch.int32)[None, :, None]
        last = torch.maximum(last, torch.where(blended, pos1, torch.zeros_like(pos1)).amax(1))
        done = done | stop.any(1)
        s += block
        retire = done.all(1) | (L <= s)
        if bool(retire.any()):
            order_parts.append(active[retire])
            rgb_parts.append(rgb[retire])
            T_parts.append(Tr[retire])
            n_parts.append(last[retire])
            keep = ~retire
            active, Tr, rgb, last, done = active[keep], Tr[keep], rgb[keep], last[keep], done[keep]
            px, py = px[keep], py[keep]

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
    nc = torch.cat(n_parts)[inv].to(torch.int32)

    def untile(x):
        x = x.reshape(tiles_y, tiles_x, T, T, *x.shape[2:]).transpose(1, 2)
        return x.reshape(tiles_y * T, tiles_x * T, *x.shape[4:])[:height, :width]

    final_T = untile(fT)
    image = untile(rgb) + final_T[..., None] * bg
    return Raster(image, final_T, untile(nc))
