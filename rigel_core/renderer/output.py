"""The result type of every render, in a module of its own: :func:`rigel_core.render` dispatches to
:mod:`rigel_core.renderer.cuda_backend`, and both build a :class:`RenderOutput` (re-exported by
``rigel_core.render`` and ``rigel_core``), so neither has to import the other for it."""
from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = ["RenderOutput", "BinningOverflow"]


class BinningOverflow(RuntimeError):
    """A frame needs more (Gaussian, tile) entries than the binning may allocate (``config.MAX_ENTRIES``): nothing of
    that size was allocated. ``n_entries`` (what the frame needs), ``max_entries`` (the limit) and ``tiles_touched``
    ((N,) integer, on the render's device: each Gaussian's share; the CPU reference counts the tiles of each
    Gaussian's box, an upper bound of the kernel's) say which Gaussians to blame; the trainer retires the widest
    (``Trainer._retire_widest``) and takes the step again. Raised by both backends' binning."""

    def __init__(self, n_entries: int, max_entries: int, tiles_touched: torch.Tensor):
        super().__init__(f"binning: {n_entries:,} (Gaussian, tile) entries exceed the limit of {max_entries:,} "
                         "(config.MAX_ENTRIES); lower the resolution or prune large Gaussians")
        self.n_entries, self.max_entries, self.tiles_touched = int(n_entries), int(max_entries), tiles_touched


@dataclass
class RenderOutput:
    """What a render returns.

    image (H,W,3) float, final_T (H,W) float (transmittance left; accumulated alpha = 1 − final_T),
    n_contrib (H,W) int32 (1-based position of the last blended entry of the pixel's tile list: the overdraw
    map), radii (N,) int32 (0 = culled), means2D (N,2) px, depths (N,), conics (N,3), tiles_touched (N,)
    int32 entries per Gaussian, n_entries total duplicated entries.
    depth (H,W) expected depth Σ wᵢzᵢ / Σ wᵢ (0 where nothing was blended; differentiable) and depth_median (H,W)
    (z where transmittance crosses ½, 0 where it never does; no gradient), camera-space z in world units, from the
    colour pass itself: only when ``depth=True`` was asked, else None (docs/PIPELINE.md "Depth").
    """

    image: torch.Tensor
    final_T: torch.Tensor
    n_contrib: torch.Tensor
    radii: torch.Tensor
    means2D: torch.Tensor
    depths: torch.Tensor
    conics: torch.Tensor
    tiles_touched: torch.Tensor | None = None
    n_entries: int = 0
    gaussian_ids: torch.Tensor | None = None
    tile_ranges: torch.Tensor | None = None
    # depth output (issue 17.2)
    depth: torch.Tensor | None = None
    depth_median: torch.Tensor | None = None

    @property
    def alpha(self) -> torch.Tensor:
        """(H,W) accumulated alpha, 1 − final_T."""
        return 1.0 - self.final_T
