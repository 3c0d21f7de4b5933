"""Tile rasterization — the PyTorch reference of ``csrc/rasterize_fwd.cu`` (docs/PIPELINE.md [3]).

Front-to-back alpha compositing, C = Σ_i c_i α_i Π_{j<i}(1 − α_j) (Kerbl et al. 2023, eq. 3), with every
guard of DESIGN §3: the 3σ cut, α = min(ALPHA_MAX, o·exp(power)), skip below ALPHA_MIN, stop before T
would fall under T_MIN. Optionally, from the same walk, depth (docs/PIPELINE.md "Depth"): D = Σ_i w_i z_i with
w_i = α_i Π_{j<i}(1 − α_j) and the median depth (z of the first entry after which T ≤ ½). Vectorised over tiles
and pixels; the kernel's batches are mimicked by walking all tiles' lists a block of entries at a time.
Differentiable by autograd.
"""
from __future__ import annotations

from typing import NamedTuple

import torch

from .. import config

__all__ = ["Raster", "RasterDepth", "rasterize_tiles", "expected_depth"]


class Raster(NamedTuple):
    image: torch.Tensor  # (H, W, 3)
    final_T: torch.Tensor  # (H, W)
    n_contrib: torch.Tensor  # (H, W) int32


class RasterDepth(NamedTuple):
    """:class:`Raster` plus the depth outputs of the same pass (``rasterize_tiles(..., depths=...)``)."""
    image: torch.Tensor  # (H, W, 3)
    final_T: torch.Tensor  # (H, W)
    n_contrib: torch.Tensor  # (H, W) int32
    depth_sum: torch.Tensor  # (H, W) Σ w_i z_i (differentiable)
    depth_median: torch.Tensor  # (H, W) z where T crosses ½, 0 where it never does (no gradient)


def expected_depth(depth_sum: torch.Tensor, final_T: torch.Tensor) -> torch.Tensor:
    """Expected depth Σ w_i z_i / Σ w_i (H,W) from the raster's ``depth_sum`` and ``final_T``.

    Σ_i w_i = 1 − final_T exactly (the blend weights telescope: Σ α_i T_i = 1 − Π(1 − α_i)), so no second sum is
    carried. Where nothing was blended (final_T = 1, Σ w = 0) the expected depth is 0, with zero gradient.
    Otherwise Σ w ≥ ALPHA_MIN (every blended α is), so the quotient is well conditioned. Differentiable by autograd
    w.r.t. both inputs; shared by the reference and the CUDA backend (device-agnostic torch ops).
    """
    acc = 1.0 - final_T
    has = acc > 0
    return torch.where(has, depth_sum / torch.where(has, acc, torch.ones_like(acc)), torch.zeros_like(acc))


def rasterize_tiles(means2D, conics, colors, opacities, gaussian_ids, tile_ranges, tiles_x: int, tiles_y: int,
                    width: int, height: int, background=None, block: int = 24, depths=None):
    """Composite the binned Gaussians into an image.

    All non-empty tiles are processed together, ``block`` list entries at a time (like the kernel's
    shared-memory batches): transmittance is carried between blocks as the first factor of a sequential
    cumulative product, so every pixel forms exactly the products ``T·(1−α₁)·(1−α₂)…`` in the kernel's
    order, and a tile leaves the working set once all of its pixels have stopped.

    Args:
        means2D (N,2), conics (N,3), colors (N,C), opacities (N,): per-Gaussian, one floating dtype;
        gaussian_ids (E,) int, tile_ranges (n_tiles,2) int from binning; background (C,) or None (black).
        depths (N,) camera-space z of the projection, or None: then the depth outputs are computed in the same
        walk — ``depth_sum`` Σ w_i z_i (differentiable w.r.t. depths and, through w_i, means2D, conics,
        opacities) and ``depth_median``, z of the first blended entry after which T ≤ ½ (T before it > ½), 0
        where T never gets there (not differentiable).
    Returns: :class:`Raster` with image (H,W,C), final_T (H,W), n_contrib (H,W) int32; :class:`RasterDepth`
        (the same plus depth_sum (H,W), depth_median (H,W)) when ``depths`` is given.
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
    with_depth = depths is not None
    diff_in = (means2D, conics, colors, opacities) + ((depths,) if with_depth else ())
    need_grad = torch.is_grad_enabled() and any(t.requires_grad for t in diff_in)
    max_idx = max(gids_all.numel() - 1, 0)

    active = torch.nonzero(lens > 0).flatten()
    na = active.numel()
    Tr = torch.ones(na, P, dtype=dtype, device=dev)
    rgb = torch.zeros(na, P, nchan, dtype=dtype, device=dev)
    last = torch.zeros(na, P, dtype=torch.int32, device=dev)
    done = torch.zeros(na, P, dtype=torch.bool, device=dev)
    dsum = torch.zeros(na, P, dtype=dtype, device=dev)  # Σ w z (depth only)
    dmed = torch.zeros(na, P, dtype=dtype, device=dev)  # median depth, 0 until T crosses ½
    px = ((active % tiles_x) * T)[:, None] + torch.arange(T, device=dev)[None, :] + 0.5  # (na, T) columns
    py = ((active // tiles_x) * T)[:, None] + torch.arange(T, device=dev)[None, :] + 0.5  # (na, T) rows
    px, py = px.to(dtype), py.to(dtype)
    order_parts, rgb_parts, T_parts, n_parts, ds_parts, dm_parts = [], [], [], [], [], []
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
        if with_depth:
            z = torch.where(valid, depths[g], torch.zeros((), dtype=dtype, device=dev))  # (na, B)
            dsum = dsum + torch.einsum("tbp,tb->tp", w, z)
            with torch.no_grad():  # T is non-increasing, so at most one blended entry per pixel crosses ½
                cross = blended & (Tfull[:, 1:] <= 0.5) & (Tfull[:, :-1] > 0.5)
                zero = torch.zeros((), dtype=dtype, device=dev)
                dmed = dmed + torch.where(cross, z.detach()[..., None], zero).sum(1)
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
            ds_parts.append(dsum[retire])
            dm_parts.append(dmed[retire])
            keep = ~retire
            active, Tr, rgb, last, done = active[keep], Tr[keep], rgb[keep], last[keep], done[keep]
            dsum, dmed = dsum[keep], dmed[keep]
            px, py = px[keep], py[keep]

    empty = torch.nonzero(lens == 0).flatten()
    order_parts.append(empty)
    rgb_parts.append(torch.zeros(empty.numel(), P, nchan, dtype=dtype, device=dev))
    T_parts.append(torch.ones(empty.numel(), P, dtype=dtype, device=dev))
    n_parts.append(torch.zeros(empty.numel(), P, dtype=torch.int32, device=dev))
    ds_parts.append(torch.zeros(empty.numel(), P, dtype=dtype, device=dev))
    dm_parts.append(torch.zeros(empty.numel(), P, dtype=dtype, device=dev))
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
    if not with_depth:
        return Raster(image, final_T, untile(nc))
    return RasterDepth(image, final_T, untile(nc), untile(torch.cat(ds_parts)[inv]),
                       untile(torch.cat(dm_parts)[inv]).detach())
