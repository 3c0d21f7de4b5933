"""Editing a Gaussian scene: crop, select, delete, with unlimited undo/redo.

Pure functions compute boolean masks over a model's N Gaussians (numpy ``bool`` arrays of shape (N,)) from
their centres ``means3D``:

* :func:`box_mask` — centres inside an axis-aligned (optionally rotated) box;
* :func:`sphere_mask` — centres inside a ball;
* :func:`screen_rect_mask` / :func:`brush_mask` — centres in front of a camera whose projection falls in a
  pixel rectangle / within a pixel radius of a point (the same pinhole projection as
  ``rigel_core.Camera.project``: OpenCV axes, pixel centres at +0.5);
* :func:`combine` — a new mask merged into a selection (replace, add, subtract, intersect).

:class:`EditStack` holds the edit state of one loaded model: the original model (``base``, never modified), an
``alive`` mask (Gaussians not deleted) and a ``selected`` mask, both over the base's Gaussians. Every operation
(select, invert, delete, crop) is a change of these two masks; the undo history stores only the indices where
each mask flipped (applying the same flips again undoes or redoes the step), never copies of the model, so the
history is unlimited at a cost of a few bytes per changed Gaussian. :attr:`EditStack.model` is the edited model
(``base.subset(alive)``, cached), :attr:`EditStack.selection` the selection over its Gaussians.

:func:`save_model` writes the edited model (``rigel_core.io.save_scene`` when that writer exists, picking the
format from the extension; otherwise INRIA PLY through ``save_ply``).
"""
from __future__ import annotations

import os

import numpy as np
import torch

__all__ = ["box_mask", "sphere_mask", "project_means", "screen_rect_mask", "brush_mask", "combine",
           "tint_colors", "EditStack", "save_model", "SELECT_MODES"]

SELECT_MODES = ("replace", "add", "subtract", "intersect")


def _np(x) -> np.ndarray:
    if isinstance(x, torch.Tensor):
        x = x.detach().cpu().numpy()
    return np.asarray(x, dtype=np.float64)


def box_mask(means, center, half_size, rotation=None) -> np.ndarray:
    """(N,) bool: centres ``means`` (N, 3) inside the box of centre ``center`` (3,), half side lengths
    ``half_size`` (3,) or a scalar, whose axes are the columns of ``rotation`` (3, 3) (default: world axes).
    Points on the faces count as inside."""
    p = _np(means).reshape(-1, 3) - _np(center).reshape(3)
    if rotation is not None:
        p = p @ _np(rotation).reshape(3, 3)   # coordinates along the box axes
    return np.all(np.abs(p) <= np.broadcast_to(_np(half_size), (3,)), axis=1)


def sphere_mask(means, center, radius: float) -> np.ndarray:
    """(N,) bool: centres within ``radius`` (world units) of ``center`` (3,)."""
    d = _np(means).reshape(-1, 3) - _np(center).reshape(3)
    return np.einsum("ij,ij->i", d, d) <= float(radius) ** 2


def project_means(means, camera) -> tuple[np.ndarray, np.ndarray]:
    """(pixels (N, 2), depth (N,)) of the centres through ``camera`` (a ``rigel_core.Camera``); depth is the
    camera-space z (positive in front). Points at or behind the camera get pixel coordinates NaN."""
    p = _np(means).reshape(-1, 3) @ camera.R.T + camera.t
    z = p[:, 2]
    with np.errstate(divide="ignore", invalid="ignore"):
        zz = np.where(z > 0, z, np.nan)
        px = np.stack([camera.fx * p[:, 0] / zz + camera.cx, camera.fy * p[:, 1] / zz + camera.cy], -1)
    return px, z


def screen_rect_mask(means, camera, rect, near: float = 1e-6) -> np.ndarray:
    """(N,) bool: centres in front of ``camera`` (depth > ``near``) whose projection lies in the pixel rectangle
    ``rect`` = (x0, y0, x1, y1) (corners in any order, inclusive)."""
    x0, y0, x1, y1 = (float(v) for v in rect)
    x0, x1 = min(x0, x1), max(x0, x1)
    y0, y1 = min(y0, y1), max(y0, y1)
    px, z = project_means(means, camera)
    with np.errstate(invalid="ignore"):
        return (z > near) & (px[:, 0] >= x0) & (px[:, 0] <= x1) & (px[:, 1] >= y0) & (px[:, 1] <= y1)


def brush_mask(means, camera, center, radius_px: float, near: float = 1e-6) -> np.ndarray:
    """(N,) bool: centres in front of ``camera`` whose projection is within ``radius_px`` pixels of ``center``
    (x, y)."""
    px, z = project_means(means, camera)
    d = px - np.asarray(center, dtype=np.float64).reshape(2)
    with np.errstate(invalid="ignore"):
        return (z > near) & (np.einsum("ij,ij->i", d, d) <= float(radius_px) ** 2)


def combine(selection, mask, mode: str = "replace") -> np.ndarray:
    """Merge ``mask`` into ``selection`` (both (N,) bool): "replace" → mask, "add" → union, "subtract" →
    selection minus mask, "intersect" → both. Raises ValueError for another mode or mismatched shapes."""
    sel, m = np.asarray(selection, dtype=bool), np.asarray(mask, dtype=bool)
    if sel.shape != m.shape:
        raise ValueError(f"selection and mask differ in shape: {sel.shape} vs {m.shape}")
    if mode == "replace":
        return m.copy()
    if mode == "add":
        return sel | m
    if mode == "subtract":
        return sel & ~m
    if mode == "intersect":
        return sel & m
    raise ValueError(f"unknown selection mode {mode!r}; expected one of {SELECT_MODES}")


def tint_colors(colors: torch.Tensor, selection, tint=(1.0, 0.35, 0.1), amount: float = 0.6) -> torch.Tensor:
    """``colors`` (N, 3) with the selected rows blended towards ``tint`` by ``amount`` (a new tensor; the
    input is unchanged). ``selection``: (N,) bool (numpy or tensor). How the viewer shows a selection in its one
    render of the scene."""
    sel = torch.as_tensor(np.asarray(selection, dtype=bool) if not isinstance(selection, torch.Tensor) else selection,
                          device=colors.device)
    if not bool(sel.any()):
        return colors
    t = torch.tensor(tint, dtype=colors.dtype, device=colors.device)
    out = colors.clone()
    out[sel] = (1.0 - amount) * colors[sel] + amount * t
    return out


class EditStack:
    """Edit state of one model with unlimited undo/redo.

    Args:
        model: the loaded ``GaussianModel`` (kept as ``base``, never modified).
    Attributes:
        base: that model; alive, selected: (N,) bool over its Gaussians; version: increases with each change
        (edits, undo, redo).
    """

    def __init__(self, model):
        self.base = model
        n = model.num_gaussians
        self.alive = np.ones(n, dtype=bool)
        self.selected = np.zeros(n, dtype=bool)
        self.version = 0
        self._undo: list = []   # (label, alive flips, selected flips): int index arrays
        self._redo: list = []
        self._model = model
        self._model_alive_version = 0
        self._alive_version = 0
        self._means = None

    # ---- views of the state --------------------------------------------------------------------------------
    @property
    def means(self) -> np.ndarray:
        """(N, 3) float64 centres of the base model (host copy, cached)."""
        if self._means is None:
            self._means = _np(self.base.means3D)
        return self._means

    @property
    def model(self):
        """The edited model: the base's alive Gaussians (cached until the next deletion)."""
        if self._model_alive_version != self._alive_version:
            idx = torch.from_numpy(np.flatnonzero(self.alive)).to(self.base.device)
            self._model = self.base.subset(idx)
            self._model_alive_version = self._alive_version
        return self._model

    @property
    def selection(self) -> np.ndarray:
        """(M,) bool: the selection over the edited model's M Gaussians."""
        return self.selected[self.alive]

    @property
    def num_selected(self) -> int:
        return int(np.count_nonzero(self.selected & self.alive))

    @property
    def num_alive(self) -> int:
        return int(np.count_nonzero(self.alive))

    @property
    def can_undo(self) -> bool:
        return bool(self._undo)

    @property
    def can_redo(self) -> bool:
        return bool(self._redo)

    @property
    def history(self) -> list[str]:
        """Labels of the undoable steps, oldest first."""
        return [e[0] for e in self._undo]

    def lift(self, mask_current) -> np.ndarray:
        """A mask over the edited model's Gaussians as a mask over the base's (False where deleted)."""
        m = np.asarray(mask_current, dtype=bool)
        if m.shape != (self.num_alive,):
            raise ValueError(f"mask has shape {m.shape}, the edited model has {self.num_alive} Gaussians")
        out = np.zeros_like(self.alive)
        out[self.alive] = m
        return out

    # ---- changes -------------------------------------------------------------------------------------------
    def _commit(self, label: str, alive, selected, merge=None) -> bool:
        """Make (alive, selected) the state as one undo step; ``merge``: a key that joins this change to the
        last step when that step has the same key and nothing was undone since (the dabs of one brush stroke
        undo together: consecutive flips compose by symmetric difference)."""
        alive, selected = np.asarray(alive, dtype=bool), np.asarray(selected, dtype=bool) & alive
        da = np.flatnonzero(alive != self.alive)
        ds = np.flatnonzero(selected != self.selected)
        if not len(da) and not len(ds):
            return False
        self._flip(da, ds)
        if merge is not None and self._undo and not self._redo and self._undo[-1][3] == merge:
            last = self._undo.pop()
            da, ds = np.setxor1d(last[1], da), np.setxor1d(last[2], ds)
        self._undo.append((label, da, ds, merge))
        self._redo.clear()
        return True

    def _flip(self, da, ds):
        self.alive[da] ^= True
        self.selected[ds] ^= True
        if len(da):
            self._alive_version += 1
        self.version += 1

    def undo(self) -> str | None:
        """Undo the last step; returns its label, or None when there is nothing to undo."""
        if not self._undo:
            return None
        e = self._undo.pop()
        self._flip(e[1], e[2])
        self._redo.append(e)
        return e[0]

    def redo(self) -> str | None:
        """Redo the last undone step; returns its label, or None."""
        if not self._redo:
            return None
        e = self._redo.pop()
        self._flip(e[1], e[2])
        self._undo.append(e)
        return e[0]

    def select_base(self, mask, mode: str = "replace", label: str = "select", merge=None) -> bool:
        """Merge a mask over the base's Gaussians into the selection (deleted ones never selected). Returns
        whether anything changed (an unchanged state adds no undo step). ``merge``: see :meth:`_commit`."""
        return self._commit(label, self.alive, combine(self.selected, np.asarray(mask, dtype=bool) & self.alive, mode),
                            merge)

    def select(self, mask_current, mode: str = "replace", label: str = "select") -> bool:
        """Like :meth:`select_base` for a mask over the edited model's Gaussians."""
        return self.select_base(self.lift(mask_current), mode, label)

    def select_rect(self, camera, rect, mode: str = "replace") -> bool:
        """Select the alive Gaussians whose centres project into the pixel rectangle (see :func:`screen_rect_mask`)."""
        return self.select_base(screen_rect_mask(self.means, camera, rect), mode, "rect select")

    def select_brush(self, camera, center, radius_px: float, mode: str = "add", stroke=None) -> bool:
        """Merge the Gaussians under a brush dab (see :func:`brush_mask`) into the selection; the dabs with the
        same ``stroke`` key (not None) form one undo step."""
        return self.select_base(brush_mask(self.means, camera, center, radius_px), mode, "brush",
                                None if stroke is None else ("brush", stroke))

    def select_all(self) -> bool:
        return self._commit("select all", self.alive, self.alive.copy())

    def clear_selection(self) -> bool:
        return self._commit("clear selection", self.alive, np.zeros_like(self.alive))

    def invert_selection(self) -> bool:
        """Selected ↔ unselected among the alive Gaussians."""
        return self._commit("invert selection", self.alive, self.alive & ~self.selected)

    def delete_selected(self) -> bool:
        """Delete the selected Gaussians (the selection is then empty)."""
        return self._commit("delete", self.alive & ~self.selected, np.zeros_like(self.alive))

    def crop(self, keep_base, label: str = "crop") -> bool:
        """Delete every alive Gaussian outside ``keep_base`` (a mask over the base's Gaussians)."""
        keep = np.asarray(keep_base, dtype=bool)
        if keep.shape != self.alive.shape:
            raise ValueError(f"crop mask has shape {keep.shape}, the model has {self.alive.shape[0]} Gaussians")
        return self._commit(label, self.alive & keep, self.selected & keep)

    def crop_box(self, center, half_size, rotation=None, *, keep_inside: bool = True) -> bool:
        """Delete the Gaussians outside (``keep_inside``) or inside the box of :func:`box_mask`."""
        inside = box_mask(self.means, center, half_size, rotation)
        return self.crop(inside if keep_inside else ~inside, "box crop")

    def crop_sphere(self, center, radius: float, *, keep_inside: bool = True) -> bool:
        """Delete the Gaussians outside (``keep_inside``) or inside the ball of :func:`sphere_mask`."""
        inside = sphere_mask(self.means, center, radius)
        return self.crop(inside if keep_inside else ~inside, "sphere crop")


def save_model(model, path) -> str:
    """Write ``model`` to ``path``: ``rigel_core.io.save_scene(model, path)`` when that writer exists (format
    from the extension), else an INRIA PLY with ``rigel_core.io.save_ply`` (then a non-``.ply`` path raises
    ValueError naming it). An MLP appearance is baked to SH degree 3 first. Returns the path written."""
    from rigel_core import io as rio

    path = os.fspath(path)
    if getattr(model, "appearance", None) is not None:
        from rigel_core.appearance import to_sh

        model, _ = to_sh(model, 3)
    model = model.to("cpu")
    save_scene = getattr(rio, "save_scene", None)
    if save_scene is not None:
        save_scene(model, path)
    elif path.lower().endswith(".ply"):
        rio.save_ply(model, path)
    else:
        raise ValueError(f"{path}: this rigel_core writes only .ply scenes (save_scene is not available)")
    return path
