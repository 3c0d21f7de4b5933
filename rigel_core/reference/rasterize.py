"""Tile rasterization — the PyTorch reference of ``csrc/rasterize_fwd.cu`` (docs/PIPELINE.md [3]).

Front-to-back alpha compositing, C = Σ_i c_i α_i Π_{j<i}(1 − α_j) (Kerbl et al. 2023, eq. 3), with every
guard of DESIGN §3: the 3σ cut, α = min(ALPHA_MAX, o·exp(power)), skip below ALPHA_MIN, stop before T
would fall under T_MIN. Optionally, from the same walk, depth (docs/PIPELINE.md "Depth"): D = Σ_i w_i z_i with
w_i = α_i Π_{j<i}(1 − α_j) and the median depth (z of the first entry after which T ≤ ½). Vectorised over tiles
and pixels; the kernel's batches are mimicked by walking all tiles' lists a block of entries at a time.
Differentiable by autograd; the per-pixel work of a block is done a bounded chunk of tiles at a time and, with
gradients, recomputed in the backward pass instead of kept (:class:`_Blend`), so memory stays bounded at any image
size (an 800×800 render of 350k entries took 3.1 GB for its forward and backward passes in one piece).
"""
from __future__ import annotations

from typing import NamedTuple

import torch

from .. import config

__all__ = ["Raster", "RasterDepth", "rasterize_tiles", "expected_depth", "CHUNK_ELEMENTS", "chunk_tiles"]

#: the size, in elements, of one (tiles, block, 256) tensor of the walk (2 MiB in float32): a block's per-pixel
#: work is done as many tiles at a time as keep it at this size (:func:`chunk_tiles`)
CHUNK_ELEMENTS = 1 << 19


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
                    width: int, height: int, background=None, block: int = 24, depths=None, chunk: int | None = None):
    """Composite the binned Gaussians into an image.

    All non-empty tiles are walked together, ``block`` list entries at a time (like the kernel's shared-memory
    batches): transmittance is carried between blocks as the first factor of a sequential cumulative product, so
    every pixel forms exactly the products ``T·(1−α₁)·(1−α₂)…`` in the kernel's order, and a tile leaves the working
    set once all of its pixels have stopped. A block's per-pixel work — (tiles, ``block``, 256) tensors — is done
    ``chunk`` tiles at a time, and with gradients the per-pixel tensors are not kept for the backward pass: each
    block's are recomputed there, chunk by chunk, from its small inputs (the entries' Gaussian values and the
    carried transmittance). So memory is bounded by the chunk, whatever the image's size, and the values and
    gradients are bit for bit those of one chunk holding every tile (the same operations on each tile).

    Args:
        means2D (N,2), conics (N,3), colors (N,C), opacities (N,): per-Gaussian, one floating dtype;
        gaussian_ids (E,) int, tile_ranges (n_tiles,2) int from binning; background (C,) or None (black).
        depths (N,) camera-space z of the projection, or None: then the depth outputs are computed in the same
        walk — ``depth_sum`` Σ w_i z_i (differentiable w.r.t. depths and, through w_i, means2D, conics,
        opacities) and ``depth_median``, z of the first blended entry after which T ≤ ½ (T before it > ½), 0
        where T never gets there (not differentiable).
        chunk: tiles per chunk (≥ 1); None: :func:`chunk_tiles` (a (tiles, block, 256) tensor of
            :data:`CHUNK_ELEMENTS` elements).
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
    chunk = chunk_tiles(block) if chunk is None else int(chunk)
    if chunk < 1:
        raise ValueError(f"rasterize_tiles: chunk must be >= 1 tile, got {chunk}")

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
        mu = means2D[g]  # (na, B, 2)
        con = conics[g]
        opac = torch.where(valid, opacities[g], torch.zeros_like(opacities[g]))  # padding: alpha 0, never used
        # padding entries read Gaussian 0: a where, not a product, so its colour (even a culled one's NaN/Inf)
        # never reaches the sum (0·NaN = NaN would poison the whole tile)
        col = torch.where(valid[..., None], colors[g], torch.zeros((), dtype=dtype, device=dev))
        z = torch.where(valid, depths[g], torch.zeros((), dtype=dtype, device=dev)) if with_depth else None  # (na, B)
        pos1 = (pos + 1).to(torch.int32)[None, :, None]
        if need_grad:
            out = _Blend.apply(chunk, px, py, done, pos1, Tr, mu, con, opac, col, *(() if z is None else (z,)))
            Tr_next, rgb_add, stop_any, last_blk = out[:4]
            dsum_add, dmed_add = (out[4], out[5]) if with_depth else (None, None)
        else:
            Tr_next, rgb_add, dsum_add, stop_any, last_blk, dmed_add = _chunked(
                chunk, False, px, py, done, pos1, Tr, mu, con, opac, col, z)
        rgb = rgb + rgb_add
        if with_depth:
            dsum = dsum + dsum_add
            dmed = dmed + dmed_add
        Tr = Tr_next
        last = torch.maximum(last, last_blk)
        done = done | stop_any
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


def chunk_tiles(block: int = 24) -> int:
    """Tiles per chunk of the walk: as many as keep a (tiles, ``block``, 256) tensor at :data:`CHUNK_ELEMENTS`
    elements (at least 1)."""
    return max(1, CHUNK_ELEMENTS // (block * config.TILE_SIZE ** 2))


def _blend(graph: bool, px, py, done, pos1, Tr, mu, con, opac, col, z):
    """One block of entries over a set of tiles (the walk's step; every per-pixel tensor is (tiles, B, P)).

    px, py (t, 16) pixel centres; done (t, P) bool, pixels stopped; pos1 (1, B, 1) int32, the entries' 1-based list
    positions; Tr (t, P) transmittance so far; mu (t, B, 2), con (t, B, 3), opac (t, B), col (t, B, C), z (t, B) or
    None: the entries' Gaussian values (padding: opacity 0, colour 0). ``graph``: the form autograd differentiates
    (a second cumulative product over the blended entries only); otherwise the same values with one product.
    Returns (Tr_next (t, P), rgb_add (t, P, C), dsum_add (t, P) or None, stop_any (t, P) bool, last_blk (t, P)
    int32, dmed_add (t, P) or None)."""
    dx = px[:, None, :] - mu[:, :, 0, None]  # (t, B, T): dx varies along the 16 columns, dy along the 16 rows
    dy = py[:, None, :] - mu[:, :, 1, None]
    # power = −q/2 directly: scaling the coefficients by −1/2 (a power of two) gives bit-identical products
    # and sums, so this is exactly −0.5·q and "q ≤ 9" is exactly "power ≥ −4.5", one pass fewer.
    nA, nB, nC = -0.5 * con[..., 0, None], -con[..., 1, None], -0.5 * con[..., 2, None]
    power = ((nA * dx * dx)[:, :, None, :] + (nB * dx)[:, :, None, :] * dy[..., None]
             + (nC * dy * dy)[..., None]).reshape(*mu.shape[:2], -1)  # (t, B, P), row-major pixels
    alpha = torch.clamp_max(opac[..., None] * torch.exp(power), config.ALPHA_MAX)
    use = ~done[:, None, :] & (power >= -0.5 * config.RADIUS_SIGMA ** 2) & (alpha >= config.ALPHA_MIN)
    a = torch.where(use, alpha, torch.zeros_like(alpha))
    with torch.no_grad():
        # T only falls along the list, so "T would drop below T_MIN" holds from the stopping entry on.
        Tfull = torch.cumprod(torch.cat([Tr.detach()[:, None], 1 - a], 1), 1)  # (t, B+1, P)
        stop = Tfull[:, 1:] < config.T_MIN
        blended = use & ~stop
    if graph:
        a2 = torch.where(blended, a, torch.zeros_like(a))
        Tc = torch.cumprod(torch.cat([Tr[:, None], 1 - a2], 1), 1)  # (t, B+1, P)
        w = a2 * Tc[:, :-1]
        Tr_next = Tc[:, -1]
    else:  # same values without a second scan: the stopped entries are a suffix, so T after the last
        # blended entry is Tfull at the number of entries that did not stop
        w = torch.where(blended, a * Tfull[:, :-1], torch.zeros_like(a))
        n_go = (~stop).sum(1, keepdim=True)  # (t, 1, P)
        Tr_next = Tfull.gather(1, n_go).squeeze(1)
    rgb_add = torch.einsum("tbp,tbc->tpc", w, col)
    dsum_add = dmed_add = None
    if z is not None:
        dsum_add = torch.einsum("tbp,tb->tp", w, z)
        with torch.no_grad():  # T is non-increasing, so at most one blended entry per pixel crosses ½
            cross = blended & (Tfull[:, 1:] <= 0.5) & (Tfull[:, :-1] > 0.5)
            dmed_add = torch.where(cross, z.detach()[..., None], torch.zeros((), dtype=z.dtype, device=z.device)).sum(1)
    with torch.no_grad():
        last_blk = torch.where(blended, pos1, torch.zeros_like(pos1)).amax(1)
        stop_any = stop.any(1)
    return Tr_next, rgb_add, dsum_add, stop_any, last_blk, dmed_add


def _spans(n: int, chunk: int) -> list:
    """(start, stop) row ranges of at most ``chunk`` rows (``chunk`` + 1 for the last) covering 0..n, none of one row
    unless n is 1: torch's batched matrix product takes another path (matrix–vector) for a batch of one, which
    rounds differently, so a one-tile chunk of a larger block would not give the block's values."""
    cuts = list(range(0, n, max(chunk, 2))) + [n]
    if len(cuts) > 2 and cuts[-1] - cuts[-2] == 1:
        del cuts[-2]
    return list(zip(cuts[:-1], cuts[1:]))


def _rows(span, *tensors):
    """Rows ``span[0]:span[1]`` of each tensor (None stays None) as fresh detached tensors: a fresh tensor is aligned
    like the whole one (64 bytes), a slice need not be, and the BLAS calls of ``einsum`` may round differently with a
    differently aligned operand."""
    return tuple(None if t is None else t[span[0]:span[1]].detach().clone() for t in tensors)


def _chunked(chunk: int, graph: bool, px, py, done, pos1, Tr, mu, con, opac, col, z):
    """:func:`_blend` ``chunk`` tiles at a time (no gradient), its outputs gathered into whole-block tensors."""
    n = Tr.shape[0]
    if n <= chunk:
        return _blend(graph, px, py, done, pos1, Tr, mu, con, opac, col, z)
    outs = None
    for span in _spans(n, chunk):
        part = _blend(graph, *_rows(span, px, py, done), pos1, *_rows(span, Tr, mu, con, opac, col, z))
        if outs is None:
            outs = [None if p is None else p.new_empty((n, *p.shape[1:])) for p in part]
        for o, p in zip(outs, part):
            if o is not None:
                o[span[0]:span[1]] = p
    return tuple(outs)


class _Blend(torch.autograd.Function):
    """:func:`_blend` (its ``graph`` form) as one autograd node that keeps only its inputs — O(tiles × (P + B))
    values, not the O(tiles × B × P) per-pixel tensors — and recomputes the per-pixel work chunk by chunk in the
    backward pass. Each chunk's gradients are autograd's own through the same operations on the same tiles, so they
    are bit for bit those of the block differentiated in one piece.

    ``apply(chunk, px, py, done, pos1, Tr, mu, con, opac, col[, z])`` → (Tr_next, rgb_add, stop_any, last_blk[,
    dsum_add, dmed_add]); the differentiable inputs are Tr, mu, con, opac, col, z; the outputs stop_any, last_blk
    and dmed_add are not differentiable."""

    @staticmethod
    def forward(ctx, chunk, px, py, done, pos1, Tr, mu, con, opac, col, *z):
        z = z[0] if z else None
        Tr_next, rgb_add, dsum_add, stop_any, last_blk, dmed_add = _chunked(
            chunk, True, px, py, done, pos1, Tr, mu, con, opac, col, z)
        ctx.chunk = chunk
        ctx.save_for_backward(px, py, done, pos1, Tr, mu, con, opac, col, *(() if z is None else (z,)))
        ctx.set_materialize_grads(False)
        # an output needs a gradient where the inputs it depends on do, as through the block in one piece:
        # the transmittance not on the colours or depths, the colour not on the depths, the depth not on the colours
        need = ctx.needs_input_grad[5:]
        alpha = any(need[:4])   # Tr, mu, con, opac
        fixed = [stop_any, last_blk] + ([] if alpha else [Tr_next]) + ([] if alpha or need[4] else [rgb_add])
        if z is None:
            ctx.mark_non_differentiable(*fixed)
            return Tr_next, rgb_add, stop_any, last_blk
        ctx.mark_non_differentiable(dmed_add, *fixed, *([] if alpha or need[5] else [dsum_add]))
        return Tr_next, rgb_add, stop_any, last_blk, dsum_add, dmed_add

    @staticmethod
    def backward(ctx, g_Tr, g_rgb, _stop, _last, g_dsum=None, _dmed=None):
        px, py, done, pos1, *xs = ctx.saved_tensors  # xs: Tr, mu, con, opac, col[, z]
        need = ctx.needs_input_grad[5:]
        # each input's gradient a list of per-span pieces joined at the end: out of place, so that a batched
        # backward (autograd.grad(..., is_grads_batched=True), which vmaps this function) works too
        grads = [[] if n else None for n in need]
        reached = [False] * len(xs)
        wanted = [(i, g) for i, g in ((0, g_Tr), (1, g_rgb), (2, g_dsum)) if g is not None]
        if not any(need) or not wanted:
            return (None,) * 5 + tuple(torch.zeros_like(x) if n else None for x, n in zip(xs, need))
        for span in _spans(xs[0].shape[0], ctx.chunk):
            sl = slice(*span)
            part = [x.requires_grad_(n) for x, n in zip(_rows(span, *xs), need)]
            with torch.enable_grad():
                Tr_next, rgb_add, dsum_add = _blend(True, *_rows(span, px, py, done), pos1, *part[:5],
                                                    part[5] if len(part) > 5 else None)[:3]
                outs = (Tr_next, rgb_add, dsum_add)
                pairs = [(outs[i], g[sl]) for i, g in wanted if outs[i].requires_grad]  # e.g. T: not on z
                got = torch.autograd.grad([o for o, _ in pairs], [p for p, n in zip(part, need) if n],
                                          [g for _, g in pairs], allow_unused=True) if pairs else None
            got = iter(got or ())
            for k, n in enumerate(need):
                if not n:
                    continue
                gk = next(got, None)
                reached[k] |= gk is not None
                # a span no wanted output reached contributes zeros (shaped as a gradient of that span's rows)
                grads[k].append(gk if gk is not None else torch.zeros_like(part[k]))
        # an input no wanted output depends on gets None, as autograd gives it through the block in one piece
        return (None,) * 5 + tuple(torch.cat(g) if r else None for g, r in zip(grads, reached))
