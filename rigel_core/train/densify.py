"""Adaptive density control — Kerbl et al. 2023, §5.2 ("3D Gaussian Splatting"), with the schedule and
thresholds of its released code (``gaussian_model.py``: ``densify_and_clone``, ``densify_and_split``,
``prune_points``, ``reset_opacity``).

**Gradient statistic.** For every view in which a Gaussian is visible (``radii > 0``) we accumulate the norm
of the loss gradient with respect to its projected centre, and densify where the mean over those views
exceeds ``grad_threshold``. The rasterizer's ``means2D`` are in pixels; 3DGS differentiates with respect to
NDC coordinates (``x_ndc = (2·u)/W − 1`` up to a constant), so the pixel gradient is scaled by ``(W/2, H/2)``
before the norm: ``‖(∂L/∂u · W/2, ∂L/∂v · H/2)‖``. That is the quantity 3DGS's 0.0002 threshold refers to
(gsplat scales the same way), with the loss being a mean over pixels as in 3DGS.

With ``densify_grad="absgrad"`` (AbsGS, Ye et al. 2024) the statistic averages instead the norm of
``Σ_p |∂L_p/∂means2D|`` (per axis, over the view's pixels p, scaled the same way): a large Gaussian over fine detail
gets opposite-signed pixel gradients that cancel in the sum, so 3DGS's statistic leaves it unsplit and blurry; the
absolute sum does not cancel. It is never smaller than the plain norm, hence its own, larger threshold
(``absgrad_threshold``). CUDA only: the raster backward accumulates it (``means2D.absgrad``,
:func:`means2D_absgrad`). ``densify_grad="auto"`` picks it for real captures (config.resolve_densify_grad).

**Where the gradient comes from** (:func:`means2D_grad`). On the CPU reference, ``RenderOutput.means2D`` is a
non-leaf node of the autograd graph: call :func:`prepare_means2D_grad` before ``backward()`` (it calls
``retain_grad()``) and read ``out.means2D.grad`` after. A backend that computes the gradient outside the
graph may instead set ``out.means2D_grad`` (an (N,2) tensor in pixels, or a zero-argument callable returning
it) during its backward; :func:`means2D_grad` looks there when ``out.means2D.grad`` is None. A leaf
``means2D`` that the backward writes into (3DGS's ``screenspace_points`` trick) also works as is.

**Operations**, every ``densify_interval`` iterations from ``densify_from`` to ``densify_until``:

- *clone* (under-reconstruction): candidates with max scale ≤ ``percent_dense``·extent are copied as they are
  (the copy then moves with its own gradient);
- *split* (over-reconstruction): larger candidates are replaced by two children whose centres are drawn from
  the parent Gaussian (``μ + R·(σ ⊙ ε)``, ε ~ N(0, I)) and whose scales are the parent's / ``split_factor``
  (1.6 = 0.8·2 in 3DGS); other parameters are copied;
- *prune*: opacity < ``prune_opacity``; after the first opacity reset also Gaussians whose screen radius
  exceeded ``max_screen_size`` px in some view since the last densification, or whose world-space max scale
  exceeds ``max_world_size``·extent. (In the released 3DGS code the screen-size test is dead: its
  ``max_radii2D`` is zeroed by the clone/split step just before the prune. Here it works when
  ``max_screen_size`` > 0; the default 0 keeps it off, as 3DGS effectively and gsplat by default do.)
- *cap*: at most ``max_gaussians − N`` Gaussians are added (a clone or a split adds one each), the
  candidates with the largest gradient first.

New rows start with zero Adam moments; pruned rows take their moments with them (:mod:`.optim`).
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import torch

from ..reference.project import quat_to_rotmat
from .config import TrainConfig
from .optim import append_rows, per_gaussian_tensors, replace_param, select_rows

__all__ = ["DensifyStats", "DensifyReport", "prepare_means2D_grad", "means2D_grad", "means2D_absgrad", "densify_grad",
           "ndc_grad_norm",
           "densify_and_prune", "reset_opacity"]


def prepare_means2D_grad(out) -> None:
    """Ask autograd to keep ∂L/∂means2D of this render (call before ``backward()``)."""
    m = out.means2D
    if isinstance(m, torch.Tensor) and m.requires_grad and not m.is_leaf:
        m.retain_grad()


def means2D_grad(out) -> torch.Tensor | None:
    """(N,2) ∂L/∂means2D in pixels after ``backward()``: ``out.means2D.grad``, else ``out.means2D_grad``
    (tensor or callable) set by a backend, else None (no Gaussian received gradient)."""
    g = out.means2D.grad if isinstance(out.means2D, torch.Tensor) else None
    if g is None:
        g = getattr(out, "means2D_grad", None)
        if callable(g):
            g = g()
    return g


def means2D_absgrad(out) -> torch.Tensor | None:
    """(N,2) Σ over pixels of |∂L_p/∂means2D| per axis (AbsGS, Ye et al. 2024), in pixels, after ``backward()``: what
    the CUDA raster backward leaves on the render's means2D (``means2D.absgrad``, csrc/rasterize_bwd.cu); None when
    the backend left none (the CPU reference computes only the summed gradient)."""
    m = out.means2D
    return getattr(m, "absgrad", None) if isinstance(m, torch.Tensor) else None


def densify_grad(out, cfg) -> torch.Tensor | None:
    """The per-view gradient the densification statistic averages (``cfg.densify_grad``, resolved): ∂L/∂means2D
    (:func:`means2D_grad`) or its per-pixel absolute sum (:func:`means2D_absgrad`, "absgrad"), (N,2) in pixels."""
    return means2D_absgrad(out) if cfg.densify_grad == "absgrad" else means2D_grad(out)


def ndc_grad_norm(grad_px: torch.Tensor, width: int, height: int) -> torch.Tensor:
    """(N,) ‖(∂L/∂u · W/2, ∂L/∂v · H/2)‖: the pixel-space gradient (N,2) expressed in NDC units."""
    # python scalars, not a tensor built on the host: a host→device copy would synchronise the stream
    return torch.hypot(grad_px[:, 0] * (0.5 * width), grad_px[:, 1] * (0.5 * height))


class DensifyStats:
    """Per-Gaussian accumulators since the last densification: ``grad_accum`` (N,) sum of NDC gradient norms,
    ``denom`` (N,) number of views in which the Gaussian was visible, ``max_radii`` (N,) largest screen radius
    (pixels) seen. float32 on the model's device."""

    def __init__(self, n: int, device=None):
        self.reset(n, device)

    def reset(self, n: int, device=None) -> None:
        device = device if device is not None else getattr(self, "grad_accum", torch.empty(0)).device
        self.grad_accum = torch.zeros(n, device=device)
        self.denom = torch.zeros(n, device=device)
        self.max_radii = torch.zeros(n, device=device)

    def __len__(self) -> int:
        return self.grad_accum.shape[0]

    @torch.no_grad()
    def update(self, grad_px: torch.Tensor | None, radii: torch.Tensor, width: int, height: int,
               valid: torch.Tensor | bool = True, *, visibility: str = "radius", means2D=None,
               opacities=None) -> None:
        """Add one view: ``grad_px`` (N,2) pixel gradient of the means2D (None = all zero), ``radii`` (N,).
        ``valid``: a 0-d bool tensor (or bool); when False the view adds nothing (the trainer's NaN guard,
        decided on the device without a host sync). ``grad_px`` must be finite where it is added.

        ``visibility`` decides which views count in a Gaussian's average (its denominator):

        - ``"radius"`` (3DGS): ``radii > 0`` — its 3σ square reaches a tile of the image;
        - ``"opacity"`` (gsplat ≥ 1.4's projection): its *opacity-aware* extent reaches the image: the square of
          half-size ``radius · e/3`` with ``e = min(3.33, sqrt(2·ln(255·opacity)))`` (where ``opacity·exp(−d²/2)``
          falls to 1/255) intersects ``[0, W) × [0, H)``, and ``opacity ≥ 1/255``. Needs ``means2D`` (N,2) px and
          ``opacities`` (N,) activated. Faint and edge Gaussians count in fewer views, so their average gradient is
          larger: at the same ``grad_threshold`` more of them densify, as in a gsplat loop;
        - ``"contrib"``: the view's gradient is non-zero — the Gaussian drew at least one pixel.
        """
        g, d, r = self.increment(grad_px, radii, width, height, visibility=visibility, means2D=means2D,
                                 opacities=opacities)
        self.add(g, d, r, valid)

    @torch.no_grad()
    def increment(self, grad_px: torch.Tensor | None, radii: torch.Tensor, width: int, height: int, *,
                  visibility: str = "radius", means2D=None, opacities=None):
        """One view's contribution, not yet added: ``(grad (N,) float32 or None, denom (N,) float32, radii (N,)
        float32)`` — the NDC gradient norm where the Gaussian counts as visible (:meth:`update` explains
        ``visibility``), 1.0 where it does, its screen radius where it does (0 elsewhere). Sums of several views'
        increments (a batch; every rank's, all-reduced) are added by :meth:`add`."""
        visible = radii > 0
        if visibility == "opacity":
            o = opacities.detach().float()
            e = torch.sqrt(2.0 * torch.log((255.0 * o).clamp_min(1.0))).clamp_max(3.33)
            r = radii.float() * (e / 3.0)
            u, v = means2D.detach().float().unbind(-1)
            visible = visible & (o >= 1.0 / 255.0) & (u + r > 0) & (u - r < width) & (v + r > 0) & (v - r < height)
        elif visibility == "contrib" and grad_px is not None:
            visible = visible & (grad_px.detach() != 0).any(-1)
        elif visibility not in ("radius", "contrib"):
            raise ValueError(f"DensifyStats.update: visibility must be 'radius', 'opacity' or 'contrib', got "
                             f"{visibility!r}")
        g = None
        if grad_px is not None:
            norm = ndc_grad_norm(grad_px.detach().float(), width, height)
            g = torch.where(visible, norm, torch.zeros_like(norm))
        return g, visible.float(), torch.where(visible, radii.float(), 0.0)

    @torch.no_grad()
    def add(self, grad: torch.Tensor | None, denom: torch.Tensor, radii: torch.Tensor,
            valid: torch.Tensor | bool = True) -> None:
        """Add increments (:meth:`increment`, possibly summed over views; ``radii`` their maximum) when ``valid``
        (a 0-d bool tensor or bool; the NaN guard's verdict, no host sync): sums into ``grad_accum`` and
        ``denom``, running maximum into ``max_radii``. Where ``valid`` is False nothing changes, even where the
        increments are not finite."""
        if not isinstance(valid, bool):
            if grad is not None:
                grad = torch.where(valid, grad, 0.0)
            denom = torch.where(valid, denom, 0.0)
            radii = torch.where(valid, radii, 0.0)
        elif not valid:
            return
        if grad is not None:
            self.grad_accum += grad
        self.denom += denom
        torch.maximum(self.max_radii, radii, out=self.max_radii)  # in place: a CUDA-graph step replays it

    def mean_grad(self) -> torch.Tensor:
        """(N,) view-averaged gradient norm (0 where never visible)."""
        return torch.where(self.denom > 0, self.grad_accum / self.denom.clamp_min(1), torch.zeros_like(self.denom))

    def state_tensors(self) -> dict:
        return {"grad_accum": self.grad_accum, "denom": self.denom, "max_radii": self.max_radii}

    def load_state_tensors(self, d: dict) -> None:
        self.grad_accum, self.denom, self.max_radii = (d[k].float() for k in ("grad_accum", "denom", "max_radii"))


@dataclass
class DensifyReport:
    """What one densification step did (counts of Gaussians)."""

    iteration: int
    n_before: int
    n_clone: int
    n_split: int  # parents split (each becomes two children)
    n_prune: int  # removed by the opacity / size tests (split parents not counted)
    n_after: int
    capped: bool  # candidates were dropped because of max_gaussians

    def to_dict(self) -> dict:
        return asdict(self)


def _apply_cap(cand: torch.Tensor, grads: torch.Tensor, budget: int) -> tuple[torch.Tensor, bool]:
    """Keep at most ``budget`` candidates, the largest gradients first (ties by index)."""
    idx = torch.nonzero(cand).flatten()
    if idx.numel() <= budget:
        return cand, False
    order = torch.argsort(grads[idx], descending=True, stable=True)
    keep = torch.zeros_like(cand)
    keep[idx[order[:budget]]] = True
    return keep, True


@torch.no_grad()
def densify_and_prune(model, optimizer, stats: DensifyStats, cfg: TrainConfig, extent: float, iteration: int,
                      generator: torch.Generator | None = None) -> DensifyReport:
    """Clone, split and prune (module docstring), updating ``model``'s tensors and ``optimizer``'s moments
    together, then reset ``stats``. ``generator`` (CPU) draws the split offsets. Returns a :class:`DensifyReport`."""
    n = model.num_gaussians
    grads = stats.mean_grad()
    scales = model.scales
    max_scale = scales.max(dim=1).values
    cand = grads >= (cfg.absgrad_threshold if cfg.densify_grad == "absgrad" else cfg.grad_threshold)
    budget = n if cfg.max_gaussians is None else max(0, int(cfg.max_gaussians) - n)
    cand, capped = _apply_cap(cand, grads, budget)
    small = max_scale <= cfg.percent_dense * extent
    clone = cand & small
    split = cand & ~small

    params = per_gaussian_tensors(optimizer, model)
    new_rows = {k: v.detach()[clone] for k, v in params.items()}
    n_clone, n_split = int(clone.sum()), int(split.sum())
    if n_split:
        s = scales[split]  # (S,3)
        rot = quat_to_rotmat(model.quats.detach()[split])  # (S,3,3)
        eps = torch.randn((2, n_split, 3), generator=generator, dtype=torch.float32).to(s)
        offsets = torch.einsum("sij,ksj->ksi", rot, eps * s[None])  # (2,S,3)
        child = {k: v.detach()[split].repeat(2, *([1] * (v.dim() - 1))) for k, v in params.items()}
        child["means3D"] = (model.means3D.detach()[split][None] + offsets).reshape(-1, 3)
        child["log_scales"] = torch.log(s / cfg.split_factor).repeat(2, 1)
        new_rows = {k: torch.cat([new_rows[k], child[k]], 0) for k in new_rows}
    n_new = n_clone + 2 * n_split
    if n_new:
        append_rows(optimizer, model, new_rows)

    # Prune over the extended set: split parents, then the opacity and (after the first reset) size tests.
    prune = torch.zeros(n + n_new, dtype=torch.bool, device=grads.device)
    prune[:n] = split
    test = model.opacities.detach() < cfg.prune_opacity
    if iteration > cfg.opacity_reset_interval:
        too_big = model.scales.detach().max(dim=1).values > cfg.max_world_size * extent
        if cfg.max_screen_size and cfg.max_screen_size > 0:
            radii = torch.cat([stats.max_radii, torch.zeros(n_new, device=grads.device)])
            too_big |= radii > cfg.max_screen_size
        test |= too_big
    if bool((~(prune | test)).any()):  # never prune the model to nothing
        prune |= test
    n_prune = int((prune & ~torch.cat([split, torch.zeros(n_new, dtype=torch.bool, device=grads.device)])).sum())
    if bool(prune.any()):
        select_rows(optimizer, model, ~prune)
    stats.reset(model.num_gaussians, grads.device)
    return DensifyReport(iteration, n, n_clone, n_split, n_prune, model.num_gaussians, capped)


@torch.no_grad()
def reset_opacity(model, optimizer, value: float = 0.01) -> None:
    """Clamp every opacity to at most ``value`` (logits to ``logit(value)``) and zero the opacity moments
    (3DGS ``reset_opacity``)."""
    cap = math.log(value / (1.0 - value))
    logits = model.opacity_logits.detach()
    replace_param(optimizer, model, "opacity_logits", torch.clamp_max(logits, cap))
