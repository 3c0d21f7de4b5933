"""Bilateral-grid appearance: a per-training-image colour transform that varies over the image and with brightness
(``TrainConfig.appearance_grid``), learnt with the scene.

:mod:`.exposure`'s affine correction is one 3×4 matrix per image; a phone's ISP also brightens corners (vignetting),
tone-maps shadows and highlights differently, and changes white balance with the content. Following the bilateral
guided upsampling idea (Chen et al., "Bilateral Guided Upsampling", SIGGRAPH Asia 2016) as gsplat's ``bilagrid`` and
Wang et al.'s "Bilateral Guided Radiance Field Processing" (SIGGRAPH 2024) use it, each training image ``i`` has a
small grid ``G_i`` of 3×4 affine matrices over (image x, image y, luminance), and the trainer compares image ``i``
with

    pred'(p) = A(p) · pred(p) + b(p),    [A(p) | b(p)] = G_i(x(p), y(p), lum(pred(p)))

— ``G_i`` sliced by trilinear interpolation at the pixel's position and the render's luminance
``0.299 r + 0.587 g + 0.114 b`` (clamped to [0, 1]); the slice is differentiable in the grid and in the render.
Every cell starts at ``[I | 0]`` (the identity). A total-variation term
``appearance_grid_tv · Σ_axes mean((G[k+1] − G[k])²)`` over the three grid axes keeps the transforms smooth.

Grid cell centres: the ``S`` cells along x span the image's pixel centres from the first to the last (pixel x
maps to ``(x + 0.5) / W``, cell ``k`` sits at ``k / (S − 1)``), the same for y, and the ``L`` luminance bins span
[0, 1]; outside those, the border cells hold (``grid_sample``'s ``align_corners=True``, border padding).

Held-out views have no grid; they are scored with the exposure protocol (:func:`.exposure.left_right_metrics`),
as with ``--exposure``. The scene stays free of the grids: renders for the viewer, the PLY and held-out views use
none.

Tensors: ``grid`` (n, 12, L, S, S) float32 — channel ``3·r + c`` holds row ``r``, column ``c`` of ``[A | b]``.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from .per_image import PerImageParam

__all__ = ["BilateralGrid", "slice_grid", "grid_tv", "grid_lr", "LUMA"]

#: the luminance weights of the slicing guide (ITU-R BT.601, gsplat's too)
LUMA = (0.299, 0.587, 0.114)


def slice_grid(grid: torch.Tensor, image: torch.Tensor) -> torch.Tensor:
    """``image`` (H, W, 3) through one grid (12, L, S, S) (module docstring): (H, W, 3), differentiable in both."""
    h, w, _ = image.shape
    dev, dt = image.device, image.dtype
    grid = grid.to(dt)
    xs = (torch.arange(w, device=dev, dtype=dt) + 0.5) / w
    ys = (torch.arange(h, device=dev, dtype=dt) + 0.5) / h
    lum = (image * torch.tensor(LUMA, device=dev, dtype=dt)).sum(-1).clamp(0.0, 1.0)
    # grid_sample's (x, y, z) index the input's last three axes (S_x, S_y, L) in reverse: (W, H, D)
    coords = torch.stack([xs.expand(h, w), ys[:, None].expand(h, w), lum], -1) * 2.0 - 1.0
    coef = F.grid_sample(grid[None], coords[None, None], mode="bilinear", padding_mode="border",
                         align_corners=True)  # (1, 12, 1, H, W)
    coef = coef[0, :, 0].permute(1, 2, 0).reshape(h, w, 3, 4)
    return (coef[..., :3] @ image[..., None])[..., 0] + coef[..., 3]


def grid_tv(grid: torch.Tensor) -> torch.Tensor:
    """The total-variation term of grids (…, 12, L, S, S): the sum over the three grid axes of the mean squared
    difference of neighbouring cells (0-d)."""
    return sum(((grid.narrow(d, 1, grid.shape[d] - 1) - grid.narrow(d, 0, grid.shape[d] - 1)) ** 2).mean()
               for d in (-3, -2, -1))


def grid_lr(cfg, iteration: int) -> float:
    """The grids' learning rate at ``iteration``: ``appearance_grid_lr`` × a linear warm-up from 1 % over the first
    1000 iterations × an exponential decay to 1 % at ``iterations`` (gsplat's bilateral-grid schedule)."""
    warm = 0.01 + 0.99 * min(1.0, iteration / 1000.0)
    return cfg.appearance_grid_lr * warm * 0.01 ** min(1.0, iteration / max(1, cfg.iterations))


class BilateralGrid(PerImageParam):
    """The grids of ``n`` training images (:class:`.per_image.PerImageParam`), ``bins`` luminance bins × ``size`` ×
    ``size`` cells, every cell ``[I | 0]``; fused Adam with eps 1e-15 (gsplat's). Checkpoint tensors:
    ``appearance_grid.grid``, ``appearance_grid.adam.<key>``."""

    prefix, key, item_shape = "appearance_grid.", "grid", (12, -1, -1, -1)
    trainer_attr = "appearance_grid"
    config_field = "appearance_grid"
    title = "bilateral-grid appearance"

    def __init__(self, n: int, device=None, bins: int = 8, size: int = 16):
        if not (bins >= 2 and size >= 2):
            raise ValueError(f"BilateralGrid: bins and size must be ≥ 2, got {bins}, {size}")
        eye = torch.cat([torch.eye(3), torch.zeros(3, 1)], 1).reshape(12, 1, 1, 1)
        g = eye.expand(max(int(n), 0), 12, int(bins), int(size), int(size)).to(device=device, dtype=torch.float32)
        super().__init__(g.clone(), eps=1e-15)

    @classmethod
    def for_trainer(cls, trainer, like: torch.Tensor | None = None) -> "BilateralGrid":
        cfg = trainer.config
        if like is None:
            return cls(len(trainer.train_frames), trainer.device, cfg.appearance_grid_bins, cfg.appearance_grid_size)
        problem = cls.shape_problem(tuple(like.shape))
        if problem is not None:
            raise ValueError(f"appearance_grid.grid: {problem}")
        return cls(like.shape[0], trainer.device, like.shape[2], like.shape[3])

    @classmethod
    def shape_problem(cls, shape: tuple) -> str | None:
        if len(shape) != 5 or shape[3] != shape[4] or min(shape[2:]) < 2:
            return f"shape {tuple(shape)}, expected (N, 12, L, S, S) with L, S ≥ 2"
        return None

    @property
    def grid(self) -> torch.Tensor:
        return self.param

    def apply(self, image: torch.Tensor, i: int) -> torch.Tensor:
        """(H, W, 3) ``image`` through training image ``i``'s grid (differentiable in both)."""
        return slice_grid(self.grid[i], image)

    def tv(self, i: int | None = None) -> torch.Tensor:
        """The total-variation term (0-d) of image ``i``'s grid, or of all grids (None)."""
        return grid_tv(self.grid if i is None else self.grid[i])
