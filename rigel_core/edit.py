"""Editing a Gaussian scene: crop, select, delete, with unlimited undo/redo.

Pure functions compute boolean masks over a model's N Gaussians (numpy ``bool`` arrays of shape (N,)) from
their centres ``means3D``:

* :func:`box_mask` — centres inside an axis-aligned (optionally rotated) box;
* :func:`sphere_mask` — centres inside a ball;
* :func:`screen_rect_mask` / :func:`brush_mask` — centres in front of a camera whose projection falls in a
  pixel rectangle / within a pixel radius of a point (the same pinhole projection as
  ``rigel_core.Camera.project``: OpenCV axes, pixel centres at +0.5);
* :func:`footprint_rect_mask` / :func:`footprint_brush_mask` — what the viewer's rectangle and brush select:
  every Gaussian whose *visible footprint* in the rendered frame meets the rectangle / the brush disc, plus (a
  superset of the centre rule) every Gaussian whose centre projects into it (see :func:`footprint`);
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

__all__ = ["box_mask", "sphere_mask", "project_means", "screen_rect_mask", "brush_mask", "footprint",
           "footprint_rect_mask", "footprint_brush_mask", "ellipse_meets_rect", "ellipse_meets_disc", "combine",
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


def footprint(model, camera):
    """The visible footprint of each of ``model``'s N Gaussians in the frame of ``camera``: the ellipse
    ``(p − m)ᵀ Q (p − m) ≤ k²`` in pixels, where the renderer draws it (DESIGN §3, docs/PIPELINE.md): centre
    ``m`` = the projection's means2D, ``Q`` = its conic (inverse 2D covariance incl. the low-pass), and ``k²`` =
    min(RADIUS_SIGMA², 2·ln(opacity / ALPHA_MIN)) — inside it the splat is within the 3σ cut *and* its alpha
    o·exp(−½ d²) reaches ALPHA_MIN (1/255), so it changes the pixel; outside it the rasterizer skips it.

    Computed with the float64 reference projection (``rigel_core.reference.project``) on the CPU.

    Returns (m (N, 2) float64, Q (N, 2, 2) float64, k2 (N,) float64, visible (N,) bool); ``visible`` is False
    where the projection culls the Gaussian (radii == 0: behind the near plane, off-screen, degenerate or
    non-finite) or its opacity is below ALPHA_MIN (an empty footprint: k2 < 0).
    """
    from rigel_core import config
    from rigel_core.reference.project import project_gaussians

    with torch.no_grad():
        dev = torch.device("cpu")
        means = model.means3D.detach().to(dev, torch.float64)
        proj = project_gaussians(means, model.quats.detach().to(dev, torch.float64),
                                 model.scales.detach().to(dev, torch.float64),
                                 model.opacities.detach().to(dev, torch.float64),
                                 camera.viewmat_tensor(dev, torch.float64), camera.K_tensor(dev, torch.float64),
                                 int(camera.width), int(camera.height))
    m = proj.means2D.numpy()
    a, b, c = proj.conics.numpy().T
    Q = np.stack([np.stack([a, b], -1), np.stack([b, c], -1)], -2)
    with np.errstate(divide="ignore", invalid="ignore"):
        k2 = np.minimum(config.RADIUS_SIGMA ** 2, 2.0 * np.log(_np(model.opacities) / config.ALPHA_MIN))
    visible = (proj.radii.numpy() > 0) & (k2 >= 0)
    return m, Q, np.where(visible, k2, -1.0), visible


def _qform(Q, v):
    """vᵀ Q v row-wise: Q (N, 2, 2), v (N, 2) → (N,)."""
    return np.einsum("ni,nij,nj->n", v, Q, v)


def ellipse_meets_rect(m, Q, k2, rect) -> np.ndarray:
    """(N,) bool: the ellipses ``(p − m)ᵀ Q (p − m) ≤ k2`` (m (N, 2), Q (N, 2, 2) positive definite, k2 (N,))
    meet the axis-aligned rectangle ``rect`` = (x0, y0, x1, y1) (corners in any order, inclusive).

    Exact: the least ``(p − m)ᵀ Q (p − m)`` over the rectangle is 0 when the centre is inside; otherwise it is
    reached on an edge ``p(t) = a + t·e``, t ∈ [0, 1], where the quadratic in t has its minimum at
    t* = clamp(−eᵀQ(a − m) / eᵀQe, 0, 1). The ellipse meets the rectangle iff that least value is ≤ k2."""
    x0, y0, x1, y1 = (float(v) for v in rect)
    x0, x1 = min(x0, x1), max(x0, x1)
    y0, y1 = min(y0, y1), max(y0, y1)
    m, Q, k2 = np.asarray(m, np.float64), np.asarray(Q, np.float64), np.asarray(k2, np.float64)
    inside = (m[:, 0] >= x0) & (m[:, 0] <= x1) & (m[:, 1] >= y0) & (m[:, 1] <= y1)
    best = np.full(len(m), np.inf)
    corners = np.array([[x0, y0], [x1, y0], [x1, y1], [x0, y1]])
    for i in range(4):
        a, e = corners[i], corners[(i + 1) % 4] - corners[i]
        am = a - m                                              # (N, 2)
        eQe = np.einsum("i,nij,j->n", e, Q, e)
        with np.errstate(divide="ignore", invalid="ignore"):
            t = np.clip(np.where(eQe > 0, -np.einsum("i,nij,nj->n", e, Q, am) / eQe, 0.0), 0.0, 1.0)
        best = np.minimum(best, _qform(Q, am + t[:, None] * e))
    return (k2 >= 0) & (inside | (best <= k2))


def ellipse_meets_disc(m, Q, k2, center, radius: float, iters: int = 60) -> np.ndarray:
    """(N,) bool: the ellipses ``(p − m)ᵀ Q (p − m) ≤ k2`` meet the disc |p − center| ≤ ``radius``.

    The least ``f(x) = (x − d)ᵀ Q (x − d)`` over |x| ≤ r (x = p − center, d = m − center) is 0 when
    |d| ≤ r;
    otherwise it lies on the circle, where (a trust-region problem) x(λ) = (Q + λI)⁻¹ Q d for the λ ≥ 0 with
    |x(λ)| = r. In Q's eigenbasis (eigenvalues q_i, d's coordinates d_i) |x(λ)|² = Σ (q_i d_i / (q_i + λ))²
    falls monotonically in λ, from |d|² at λ = 0 to below r² at λ = q_max·|d| / r; bisection (``iters``
    halvings) finds λ, and f = Σ q_i (λ d_i / (q_i + λ))²."""
    m, Q, k2 = np.asarray(m, np.float64), np.asarray(Q, np.float64), np.asarray(k2, np.float64)
    r = float(radius)
    d = m - np.asarray(center, dtype=np.float64).reshape(2)
    dist = np.linalg.norm(d, axis=1)
    near = dist <= r
    out = (k2 >= 0) & near
    # the ellipse lies within sqrt(k2 / q_min) of its centre (q_min: Q's smaller eigenvalue): farther ones cannot meet
    a, b, c = Q[:, 0, 0], Q[:, 0, 1], Q[:, 1, 1]
    q_min = 0.5 * (a + c) - np.sqrt(0.25 * (a - c) ** 2 + b * b)
    with np.errstate(divide="ignore", invalid="ignore"):
        reach = np.sqrt(np.maximum(k2, 0.0) / q_min)
    todo = np.flatnonzero((k2 >= 0) & ~near & ~(dist - r > reach * (1 + 1e-9)))
    if len(todo) == 0:
        return out
    if r <= 0:      # a point: inside the ellipse?
        out[todo] = _qform(Q[todo], d[todo]) <= k2[todo]
        return out
    q, V = np.linalg.eigh(Q[todo])                             # (n, 2), (n, 2, 2)
    dd = np.einsum("nji,nj->ni", V, d[todo])                    # d in the eigenbasis
    lo = np.zeros(len(todo))
    hi = q.max(1) * dist[todo] / r
    for _ in range(iters):
        lam = 0.5 * (lo + hi)
        x2 = ((q * dd / (q + lam[:, None])) ** 2).sum(1)
        big = x2 > r * r
        lo, hi = np.where(big, lam, lo), np.where(big, hi, lam)
    lam = hi                                                   # |x(hi)| <= r: a feasible point, f(hi) >= min
    f = (q * (lam[:, None] * dd / (q + lam[:, None])) ** 2).sum(1)
    out[todo] = f <= k2[todo] * (1 + 1e-9)
    return out


def footprint_rect_mask(model, camera, rect, *, fp=None) -> np.ndarray:
    """(N,) bool: the Gaussians of ``model`` whose visible footprint (:func:`footprint`) meets the pixel
    rectangle ``rect`` = (x0, y0, x1, y1) of ``camera``'s frame, or whose centre projects into it
    (:func:`screen_rect_mask`: an invisible Gaussian — transparent, degenerate — among selected ones is
    selected with them). Occluded Gaussians count: the selection goes through the scene, as a crop does.
    ``fp``: :func:`footprint` of (model, camera) when already computed."""
    m, Q, k2, vis = footprint(model, camera) if fp is None else fp
    return screen_rect_mask(model.means3D, camera, rect) | (vis & ellipse_meets_rect(m, Q, k2, rect))


def footprint_brush_mask(model, camera, center, radius_px: float, *, fp=None) -> np.ndarray:
    """(N,) bool: the Gaussians whose visible footprint meets the brush disc of ``radius_px`` pixels about
    ``center`` (x, y), or whose centre projects into it (see :func:`footprint_rect_mask`; ``fp`` likewise)."""
    m, Q, k2, vis = footprint(model, camera) if fp is None else fp
    return brush_mask(model.means3D, camera, center, radius_px) | \
        (vis & ellipse_meets_disc(m, Q, k2, center, radius_px))


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
        self._fp = (None, None)   # (camera key, footprint of the base): the dabs of a stroke share one view

    # ---- views of the state --------------------------------------------------------------------------------
    @property
    def means(self) -> np.ndarray:
        """(N, 3) float64 centres of the base model (host copy, cached)."""
        if self._means is None:
            self._means = _np(self.base.means3D)
        return self._means

    def footprint(self, camera):
        """:func:`footprint` of the base model through ``camera`` (cached for the last camera)."""
        key = (camera.viewmat.tobytes(), camera.K.tobytes(), int(camera.width), int(camera.height))
        if self._fp[0] != key:
            self._fp = (key, footprint(self.base, camera))
        return self._fp[1]

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

    def select_rect(self, camera, rect, mode: str = "replace", *, by: str = "footprint") -> bool:
        """Select the alive Gaussians whose footprint meets the pixel rectangle (:func:`footprint_rect_mask`;
        ``by="centre"``: whose centres project into it, :func:`screen_rect_mask`)."""
        mask = footprint_rect_mask(self.base, camera, rect, fp=self.footprint(camera)) if by == "footprint" else \
            screen_rect_mask(self.means, camera, rect)
        return self.select_base(mask, mode, "rect select")

    def select_brush(self, camera, center, radius_px: float, mode: str = "add", stroke=None, *,
                     by: str = "footprint") -> bool:
        """Merge the Gaussians under a brush dab (:func:`footprint_brush_mask`; ``by="centre"``:
        :func:`brush_mask`) into the selection; the dabs with the same ``stroke`` key (not None) form one undo
        step."""
        mask = footprint_brush_mask(self.base, camera, center, radius_px, fp=self.footprint(camera)) if by == "footprint" else \
            brush_mask(self.means, camera, center, radius_px)
        return self.select_base(mask, mode, "brush", None if stroke is None else ("brush", stroke))

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
        from rigel_core.renderer.appearance import to_sh

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
