"""MCMC Gaussian budget: ``TrainConfig.strategy = "mcmc"`` — Kheradmand, Rebain, Sharma, Sun, Tseng, Isack,
Kar, Tagliasacchi & Yi, "3D Gaussian Splatting as Markov Chain Monte Carlo" (NeurIPS 2024), re-derived here.

The paper reads the Gaussians as samples of a distribution over the scene and the Adam updates as (stochastic
gradient) Langevin steps. With ``strategy = "mcmc"`` the trainer does, instead of 3DGS's clone / split / prune and
opacity resets (:mod:`.densify`):

**Relocation** (:func:`relocate_dead`), every ``densify_interval`` iterations strictly between ``densify_from`` and
``densify_until``: every *dead* Gaussian (opacity ≤ ``mcmc_min_opacity``, 0.005) is moved onto a *live* one drawn
with probability ∝ opacity (with replacement). A live Gaussian drawn ``k`` times becomes ``n = k + 1`` identical
copies (itself and the ``k`` dead ones it receives), each with opacity and scales chosen so that the stack renders
like the original (below). Every parameter row of a dead one (position, rotation, colour, latent …) is overwritten
by its source's; the Adam moments of every touched row (sources and destinations) are zeroed — or, with
``mcmc_reset_moments = "sources"``, those of the sources only, as the paper's code and gsplat do (a moved row then
keeps its dead predecessor's moments).

**Growth** (:func:`add_gaussians`), at the same iterations, after the relocation: ``m = min(cap, ⌊(1 +
mcmc_growth)·N⌋) − N`` new Gaussians (5 % of N per step in the paper) are made the same way from Gaussians
drawn ∝ opacity among all of them, appended with zero moments, until ``N = max_gaussians`` — the budget. The cap
must be set (``max_gaussians`` not None). A model larger than the cap (an initialisation with more points, or a
cap lowered while training) is cut to the cap at the next step (:func:`trim_to_cap`: the most opaque kept).

**Splitting the mass of one Gaussian into n copies** (:func:`split_mass`). Opacity ``o``, scales ``s``; the
copies get ``o'`` and ``s' = c·s`` with the same centre, rotation and colour. Stacked copies composite to the
opacity ``α_n(x) = 1 − (1 − o'·g'(x))ⁿ`` (``g'`` the unit-peak Gaussian of scales ``s'``). The paper asks that

1. the centre keep its opacity: ``α_n(μ) = 1 − (1 − o')ⁿ = o``, so ``o' = 1 − (1 − o)^(1/n)``;
2. the integral of the opacity along a line through the centre keep its value. Expanding the compositing layer by
   layer, ``1 − (1 − a)ⁿ = Σ_{i=1}^{n} a·(1 − a)^{i−1} = Σ_{i=1}^{n} Σ_{k=0}^{i−1} C(i−1, k)(−1)^k a^{k+1}``,
   and along a line ``∫ g'(x)^{k+1} dx = √(2π)·σ'/√(k+1)`` (σ' the Gaussian's standard deviation along that
   line, c times the original's). Equating with ``∫ o·g = √(2π)·σ·o`` gives the paper's
   ``c = o / Σ_{i=1}^{n} Σ_{k=0}^{i−1} C(i−1, k)(−1)^k o'^{k+1}/√(k+1)``. The double sum collapses (hockey-stick
   identity ``Σ_{i=k+1}^{n} C(i−1, k) = C(n, k+1)``) to ``D = Σ_{j=1}^{n} C(n, j)(−1)^{j+1} o'^j/√j``, which is
   what we evaluate (float64, binomials through ``lgamma``). Since every scale gets the same factor, the line
   integral is kept along every direction through the centre, not only the axes.

``n`` is clamped to ``mcmc_max_copies`` (51, as the paper's released code: beyond that the copies of a Gaussian
drawn more often share the opacity of 51), ``o'`` to ``[mcmc_min_opacity, 1 − 2⁻²³]`` (its logit finite; a copy
at the floor still counts as dead at the next relocation, float32 rounding sigmoid(logit(0.005)) under 0.005, as in
gsplat 1.5.3: docs/BENCHMARKS.md) and ``c`` to ``(0, 1]`` (it is < 1 for every n ≥ 2: the stacked profile is wider than one
Gaussian of the same peak; the clamp only guards rounding).

**Copies that stay alive** (``mcmc_live_copies``, off by default). ``n`` copies of a source of opacity ``o`` each
get ``1 − (1 − o)^(1/n)``, which is above the dead bound ``b`` only for ``n ≤ ln(1 − o)/ln(1 − b)``
(:func:`live_copies`; a source of 0.01 shares with one copy, one of 0.05 with nine). With the option on, the draws of
a relocation or growth step beyond that many of one source are dropped (:func:`_within_share`, in draw order): the
dead rows they would have filled stay where they are until the next relocation, growth adds fewer. Off, such copies
are floored at ``b`` and born dead. Where no source is drawn beyond its share the step is bit for bit the one
without the option (the same draws from ``generator``).

**Position noise** (:func:`position_noise`), after every optimizer step (the Langevin term): ``μ ← μ + λ_noise ·
lr_μ · σ(−k(o − t)) · Σ·η``, η ~ N(0, I₃), Σ = R·diag(s²)·Rᵀ the Gaussian's covariance, ``lr_μ`` the iteration's
position learning rate (world units: × scene extent), ``λ_noise = mcmc_noise_lr`` (5·10⁵), ``k = mcmc_noise_k``
(100), ``t = mcmc_noise_t`` (0.005). The gate σ(−k(o − t)) is ≈ 1 for a transparent Gaussian and ≈ 0 for an opaque
one (≤ 4.6·10⁻⁵ above o = 0.1): opaque Gaussians stay where the loss puts them, faint ones explore. Note the
noise is ``Σ·η`` — covariance Σ² — as in the paper's update rule and its code (the 5·10⁵ is calibrated for that),
not ``Σ^{1/2}·η``. It is skipped with the rest of the update when the NaN guard drops a step. Σ is measured in
``L²`` (:func:`length_unit`, ``mcmc_units``): one world unit by default (the paper's code), or the cameras' radius,
which makes the noise's reach relative to the scene independent of the capture's arbitrary SfM scale.
``mcmc_noise_max_scale`` (0.05 by default; 0: off, the paper's) bounds the s that Σ reads at that share of the
scene extent.

**Regularisers** (:func:`regularizer`), added to the loss at every step: ``mcmc_opacity_reg · mean(o) +
mcmc_scale_reg · mean(s)`` over all Gaussians (and the three scales of each), activated values (``sigmoid`` of the
logits, ``exp`` of the log-scales), 0.01 each as in the paper; a non-finite entry counts as 0 (its Gaussian is
culled). They drive unused Gaussians to low opacity (then
relocation recycles them) and keep them small. Scales are measured in ``L`` as the noise's Σ (world units by
default, as in the paper's code; gsplat's trainer normalises its world by the cameras' distance first).

**Determinism.** Every random choice comes from the trainer's CPU ``generator`` (saved in checkpoints): the
sampling is done on the CPU (cumulative sums in float64 and ``searchsorted``); the noise is drawn on the training
device from a generator seeded, at each step, with a number drawn from that CPU generator. A resumed run
therefore continues bit for bit, and data-parallel ranks holding the same generator make the same choices. No
other state is needed (the densification statistics are not used; they are kept at the model's length).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from .. import _ext
from ..reference.project import quat_to_rotmat
from .config import TrainConfig
from .densify import DensifyReport
from .optim import append_rows, per_gaussian_tensors, select_rows

__all__ = ["MCMCReport", "split_mass", "zero_moments", "sample_indices", "relocate_dead", "add_gaussians",
           "trim_to_cap", "position_noise", "add_position_noise", "noise_generator", "seed_noise", "scheduled",
           "regularizer", "mcmc_step", "mcmc_budget", "mcmc_relocate_and_grow", "length_unit", "noise_max_scale",
           "dead_share", "live_copies"]

#: largest float32 opacity below 1 the relocation hands out (logit ≈ 15.9)
_MAX_OPACITY = 1.0 - torch.finfo(torch.float32).eps


@dataclass
class MCMCReport(DensifyReport):
    """What one MCMC budget step did. The :class:`~.densify.DensifyReport` fields keep their meaning where they
    have one (``n_clone`` = ``n_split`` = 0; ``n_prune`` = Gaussians removed by :func:`trim_to_cap`; ``capped``:
    N reached ``max_gaussians``); ``n_relocated`` dead Gaussians moved, ``n_added`` new ones; ``growth_held``: no
    growth under the cap because more than ``mcmc_growth_max_dead`` of the Gaussians were dead, ``dead_share`` that
    share (None where the rule is off)."""

    n_relocated: int = 0
    n_added: int = 0
    growth_held: bool = False
    dead_share: float | None = None


@torch.no_grad()
def split_mass(opacities: torch.Tensor, scales: torch.Tensor, n_copies: torch.Tensor, *, max_copies: int = 51,
               min_opacity: float = 0.005) -> tuple[torch.Tensor, torch.Tensor]:
    """Opacity and scales of each of ``n`` copies that together render like one Gaussian (module docstring).

    Args:
        opacities: (M,) activated opacities in (0, 1).
        scales: (M, 3) activated scales (standard deviations, world units).
        n_copies: (M,) integers ≥ 1, the number of copies (the original included); clamped to ``max_copies``.
    Returns:
        ``(new_opacities (M,), new_scales (M, 3))`` in the dtype and device of the inputs: ``o' = 1 − (1 − o)^(1/n)``
        clamped to ``[min_opacity, 1 − 2⁻²³]``, ``s' = c·s`` with ``c = o / Σ_{j=1}^{n} C(n, j)(−1)^{j+1}
        o'^j/√j`` (computed in float64 from the unclamped o') clamped to (0, 1]. n = 1 returns the inputs'
        values (c = 1).
    """
    dtype = opacities.dtype
    o = opacities.double()
    n = n_copies.to(device=o.device).long().clamp(1, max(1, int(max_copies))).double()
    a = 1.0 - torch.pow(1.0 - o, 1.0 / n)  # (M,)
    jmax = int(n.max()) if n.numel() else 1
    j = torch.arange(1, jmax + 1, dtype=torch.float64, device=o.device)  # (J,)
    log_binom = (torch.lgamma(n[:, None] + 1) - torch.lgamma(j[None] + 1)
                 - torch.lgamma((n[:, None] - j[None]).clamp_min(0) + 1))
    sign = torch.where(j.remainder(2) == 1, 1.0, -1.0).to(torch.float64)  # (−1)^{j+1}
    terms = sign[None] * torch.exp(log_binom + j[None] * torch.log(a[:, None].clamp_min(1e-300))) / torch.sqrt(j)[None]
    denom = torch.where(j[None] <= n[:, None], terms, torch.zeros_like(terms)).sum(1)
    coeff = torch.where(denom > 0, o / denom.clamp_min(1e-300), torch.ones_like(o)).clamp(1e-12, 1.0)
    coeff = torch.where(n > 1, coeff, torch.ones_like(coeff))
    new_o = torch.where(n > 1, a.clamp(min_opacity, _MAX_OPACITY), o)
    return new_o.to(dtype), scales * coeff.to(scales.dtype)[:, None]


@torch.no_grad()
def sample_indices(weights: torch.Tensor, m: int, generator: torch.Generator | None) -> torch.Tensor:
    """(m,) int64 indices into ``weights`` (N,) ≥ 0, drawn with replacement with probability ∝ weight, on the
    CPU from ``generator`` (cumulative sum in float64, then ``searchsorted`` of uniform draws: any N, and the
    same draws on every device). Returned on ``weights``' device. An index of weight 0 is never drawn. Raises
    ValueError when ``m`` > 0 and the weights sum to 0."""
    w = weights.detach().to("cpu", torch.float64).clamp_min(0.0)
    w = torch.where(torch.isfinite(w), w, torch.zeros_like(w))
    if m <= 0:
        return torch.zeros(0, dtype=torch.long, device=weights.device)
    cdf = torch.cumsum(w, 0)
    total = float(cdf[-1]) if cdf.numel() else 0.0
    if not total > 0:
        raise ValueError("sample_indices: the weights sum to 0")
    u = torch.rand(m, generator=generator, dtype=torch.float64) * total
    idx = torch.searchsorted(cdf, u, right=True).clamp_max(w.numel() - 1)
    return idx.to(weights.device)


def zero_moments(optimizer, model, rows: torch.Tensor) -> None:
    """Zero the per-row Adam state (``exp_avg``, ``exp_avg_sq``) of ``rows`` in every per-Gaussian group."""
    for p in per_gaussian_tensors(optimizer, model).values():
        for v in optimizer.state.get(p, {}).values():
            if isinstance(v, torch.Tensor) and v.shape == p.shape:
                v[rows] = 0


def _set_opacity_and_scales(model, rows: torch.Tensor, opacities: torch.Tensor, scales: torch.Tensor) -> None:
    model.opacity_logits[rows] = torch.logit(opacities.to(model.opacity_logits.dtype))
    model.log_scales[rows] = torch.log(scales.to(model.log_scales.dtype))


def _split_sampled(model, cfg: TrainConfig, src: torch.Tensor) -> torch.Tensor:
    """Give every distinct row drawn in ``src`` (k times) the opacity and scales of one of k + 1 copies; returns
    the distinct rows."""
    rows, counts = torch.unique(src, return_counts=True)
    o = model.opacities.detach()[rows]
    s = model.scales.detach()[rows]
    new_o, new_s = split_mass(o, s, counts + 1, max_copies=cfg.mcmc_max_copies, min_opacity=cfg.mcmc_min_opacity)
    _set_opacity_and_scales(model, rows, new_o, new_s)
    return rows


def live_copies(opacities: torch.Tensor, min_opacity: float) -> torch.Tensor:
    """(M,) int64: the most copies ``n`` (the original included) that one Gaussian of each opacity can be split
    into with every copy's opacity ``1 − (1 − o)^(1/n)`` above ``min_opacity`` — ``⌊ln(1 − o) / ln(1 − b)⌋`` with
    ``b = min_opacity·(1 + 10⁻⁴)``, the margin covering float32's logit / sigmoid round trip (a copy just at the
    bound reads as dead) — at least 1 (a source at or under the bound gives none), at most 2³¹."""
    o = opacities.detach().double()
    o = torch.where(torch.isfinite(o), o, torch.zeros_like(o)).clamp(0.0, 1.0 - 2.0 ** -52)
    b = float(min_opacity) * (1.0 + 1e-4)
    n = torch.floor(torch.log1p(-o) / math.log1p(-b))
    return n.clamp(1.0, 2.0 ** 31).long()


def _within_share(src: torch.Tensor, opacities: torch.Tensor, cfg: TrainConfig) -> torch.Tensor:
    """(m,) bool over the draws ``src`` (rows, in draw order): True for the first ``live_copies − 1`` draws of each
    row (its opacity can give that many copies above the dead bound), False for the draws after them."""
    if src.numel() == 0:
        return torch.ones(0, dtype=torch.bool, device=src.device)
    order = torch.argsort(src, stable=True)
    s = src[order]
    pos = torch.arange(s.numel(), device=src.device)
    first = torch.ones_like(s, dtype=torch.bool)
    first[1:] = s[1:] != s[:-1]
    rank_sorted = pos - torch.where(first, pos, torch.zeros_like(pos)).cummax(0).values
    rank = torch.empty_like(rank_sorted)
    rank[order] = rank_sorted
    extra = live_copies(opacities[src], cfg.mcmc_min_opacity).to(src.device) - 1
    return rank < extra


def _dead(opacities: torch.Tensor, cfg: TrainConfig) -> torch.Tensor:
    """(N,) bool: opacity at or under ``mcmc_min_opacity``, a NaN (a non-finite logit) counted dead."""
    return ~(opacities > cfg.mcmc_min_opacity)


@torch.no_grad()
def relocate_dead(model, optimizer, cfg: TrainConfig, generator: torch.Generator | None,
                  extent: float | None = None) -> int:
    """Move every dead Gaussian (opacity ≤ ``cfg.mcmc_min_opacity``, or, when ``cfg.mcmc_max_scale`` > 0, a largest
    scale above ``cfg.mcmc_max_scale × extent``: world units, ``extent`` the scene's) onto a live one drawn ∝ opacity
    (module docstring), in place; zero the Adam moments of the touched rows. Returns the number moved (0 when none
    is dead or none is alive). ValueError when ``cfg.mcmc_max_scale`` > 0 and ``extent`` is None."""
    o = model.opacities.detach()
    dead = _dead(o, cfg)
    if cfg.mcmc_max_scale > 0:  # a faint fog of huge Gaussians (a random start): each one covers the whole view
        if extent is None:
            raise ValueError("relocate_dead: mcmc_max_scale is set, so the scene extent must be given")
        dead |= ~(model.log_scales.detach().amax(dim=1) <= math.log(cfg.mcmc_max_scale * extent))
    n_dead = int(dead.sum())
    if n_dead == 0 or n_dead == o.numel():
        return 0
    alive_idx = torch.nonzero(~dead).flatten()
    dead_idx = torch.nonzero(dead).flatten()
    src = alive_idx[sample_indices(o[alive_idx], n_dead, generator)]
    if cfg.mcmc_live_copies:  # no copy born dead: the draws over a source's share leave their dead row in place
        keep = _within_share(src, o, cfg)
        src, dead_idx = src[keep], dead_idx[keep]
        n_dead = int(src.numel())
        if n_dead == 0:
            return 0
    rows = _split_sampled(model, cfg, src)
    for p in per_gaussian_tensors(optimizer, model).values():
        p.data[dead_idx] = p.data[src]
    zero_moments(optimizer, model, rows if cfg.mcmc_reset_moments == "sources" else torch.cat([rows, dead_idx]))
    return n_dead


@torch.no_grad()
def add_gaussians(model, optimizer, cfg: TrainConfig, generator: torch.Generator | None) -> int:
    """Append ``min(cap, ⌊(1 + mcmc_growth)·N⌋) − N`` Gaussians, copies of rows drawn ∝ opacity that share their
    source's mass (module docstring); the sources' moments are zeroed, the new rows start at zero. Returns the
    number added (0 at the cap, or when every opacity is 0)."""
    n = model.num_gaussians
    cap = cfg.max_gaussians if cfg.max_gaussians is not None else n
    m = min(int(cap), int(math.floor(n * (1.0 + cfg.mcmc_growth)))) - n
    o = model.opacities.detach()
    if m <= 0 or not bool((torch.nan_to_num(o) > 0).any()):
        return 0
    src = sample_indices(o, m, generator)
    if cfg.mcmc_live_copies:  # no copy born dead: growth adds only what its sources' opacities can share
        src = src[_within_share(src, o, cfg)]
        m = int(src.numel())
        if m == 0:
            return 0
    rows = _split_sampled(model, cfg, src)
    zero_moments(optimizer, model, rows)
    params = per_gaussian_tensors(optimizer, model)
    append_rows(optimizer, model, {k: v.detach()[src] for k, v in params.items()})
    return m


@torch.no_grad()
def trim_to_cap(model, optimizer, cap: int, generator: torch.Generator | None) -> int:
    """Remove Gaussians until ``N ≤ cap``, keeping the most opaque (ties — e.g. an initialisation where all share
    one opacity — broken by a random permutation from ``generator``; the kept rows keep their order). Returns the
    number removed."""
    n = model.num_gaussians
    if cap is None or n <= cap:
        return 0
    perm = torch.randperm(n, generator=generator)
    o = torch.nan_to_num(model.opacities.detach().to("cpu", torch.float64), nan=-1.0)
    order = torch.argsort(o[perm], descending=True, stable=True)
    keep = torch.sort(perm[order[:cap]]).values
    select_rows(optimizer, model, keep.to(model.means3D.device))
    return n - cap


_DEVICE_GENERATORS: dict = {}


def noise_generator(device: torch.device) -> torch.Generator:
    """The generator the position noise's η is drawn from on ``device``: one per device, seeded before every
    step (:func:`seed_noise`) (its state between steps never matters). The CUDA-graph step registers it with
    its graphs and seeds it before each replay (graph_step.py)."""
    device = torch.device(device)
    g = _DEVICE_GENERATORS.get(device)
    if g is None:
        g = _DEVICE_GENERATORS[device] = torch.Generator(device=device)
    return g


def seed_noise(device, generator: torch.Generator | None) -> torch.Generator:
    """:func:`noise_generator` of ``device`` seeded for this step with a number drawn from the trainer's CPU
    ``generator`` (the eager step before it draws η, the CUDA-graph step before each replay): returns it."""
    g = noise_generator(device)
    g.manual_seed(int(torch.randint(0, 2 ** 62, (1,), generator=generator)))
    return g


def scheduled(cfg: TrainConfig, iteration: int) -> bool:
    """Whether ``iteration`` relocates and grows (every ``densify_interval`` strictly between ``densify_from``
    and ``densify_until``). When it does is the trainer's to decide: it holds the run's last iteration's (nothing
    would train what it moved or added) and an evaluated one's until the next step (``Trainer._holds``,
    :func:`mcmc_step`'s ``defer``)."""
    return cfg.densify_from < iteration < cfg.densify_until and iteration % cfg.densify_interval == 0


def mcmc_relocate_and_grow(model, optimizer, stats, cfg: TrainConfig, iteration: int,
                           generator: torch.Generator | None, n_before: int | None = None,
                           removed: int = 0, extent: float | None = None) -> MCMCReport:
    """The scheduled part of :func:`mcmc_step` for ``iteration``: :func:`relocate_dead` then :func:`add_gaussians`,
    ``stats`` resized to the new count. Also what the trainer runs for a held iteration's deferred schedule
    (``Trainer.deferred_schedule``). ``n_before``/``removed``: the count before this iteration's cap trim and what
    it removed (for the report)."""
    n_before = model.num_gaussians if n_before is None else n_before
    dead = dead_share(model, cfg) if cfg.mcmc_growth_max_dead > 0 else None
    relocated = relocate_dead(model, optimizer, cfg, generator, extent)
    # a model that lets more than mcmc_growth_max_dead of its Gaussians die between two relocation steps gets none
    # more this time (0: off)
    held = dead is not None and dead > cfg.mcmc_growth_max_dead
    added = 0 if held else add_gaussians(model, optimizer, cfg, generator)
    capped = cfg.max_gaussians is not None and model.num_gaussians >= cfg.max_gaussians
    if len(stats) != model.num_gaussians:
        stats.reset(model.num_gaussians)
    return MCMCReport(iteration, n_before, 0, 0, removed, model.num_gaussians, capped, relocated, added,
                      held and not capped, dead)


def _noise_kernel(model, lr_means, cfg: TrainConfig | None = None, ok: torch.Tensor | None = None):
    """``rigel_core._C.mcmc_position_noise`` when it applies (float32 contiguous CUDA parameters; a finite float or
    a one-element float32 device ``lr_means``; finite noise settings in ``cfg``; ``ok`` None or a one-element bool
    on the same device), else None: the PyTorch form, which also takes what the kernel's checks refuse. CUDA
    parameters without built kernels raise RuntimeError (:func:`rigel_core._ext.use_kernels`)."""
    if not _ext.use_kernels(model.means3D):
        return None
    dev = model.means3D.device
    params = (model.means3D, model.quats, model.log_scales, model.opacity_logits)
    if any(p.dtype != torch.float32 or not p.is_contiguous() or p.device != dev for p in params):
        return None
    if isinstance(lr_means, torch.Tensor):
        if lr_means.dtype != torch.float32 or lr_means.numel() != 1 or lr_means.device != dev:
            return None
    elif not math.isfinite(float(lr_means)):
        return None
    if cfg is not None and not all(math.isfinite(float(v)) for v in
                                   (cfg.mcmc_noise_lr, cfg.mcmc_noise_k, cfg.mcmc_noise_t)):
        return None
    if ok is not None and (ok.dtype != torch.bool or ok.numel() != 1 or ok.device != dev):
        return None
    return _ext.get().mcmc_position_noise


def noise_max_scale(cfg: TrainConfig, extent: float | None) -> float:
    """The largest scale (world units) the position noise's Σ reads: ``mcmc_noise_max_scale × extent``, or +inf
    when ``mcmc_noise_max_scale`` is 0 (the paper's Σ). ValueError when the bound is on and ``extent`` is None or
    not a positive finite number."""
    share = float(cfg.mcmc_noise_max_scale)
    if share == 0:
        return math.inf
    if extent is None or not math.isfinite(float(extent)) or float(extent) <= 0:
        raise ValueError(f"mcmc_noise_max_scale={share} needs the scene extent (a positive finite number), got "
                         f"{extent!r}")
    return share * float(extent)


def length_unit(cfg: TrainConfig, extent: float | None) -> float:
    """The length L (world units) in which the position noise and the scale regulariser are measured
    (``TrainConfig.mcmc_units``): 1 for "world"; for "cameras" the cameras' radius ``extent / 1.1`` (``extent`` the
    trainer's scene extent, 1.1 × the largest camera distance from the cameras' centre). ValueError under "cameras"
    when ``extent`` is None or not a positive finite number (a caller that forgot it would otherwise train in world
    units unawares)."""
    if cfg.mcmc_units == "world":
        return 1.0
    if extent is None or not math.isfinite(float(extent)) or float(extent) <= 0:
        raise ValueError(f"mcmc_units={cfg.mcmc_units!r} needs the scene extent (a positive finite number), got "
                         f"{extent!r}")
    return float(extent) / 1.1


@torch.no_grad()
def add_position_noise(model, lr_means, cfg: TrainConfig, eta_generator: torch.Generator,
                       ok: torch.Tensor | None = None, extent: float | None = None) -> torch.Tensor:
    """Add the Langevin noise ``mcmc_noise_lr · lr_means · σ(−k(o − t)) · Σ·η / L²`` to ``model.means3D`` in place
    (module docstring) and return it (N, 3); η ~ N(0, I) from ``eta_generator`` (on the means' device, seeded by the
    caller). ``lr_means``: the position learning rate, a float or a 0-d tensor on the device (the captured step's).
    L = :func:`length_unit` of ``cfg`` and the scene ``extent`` (Σ measured in L², so under "cameras" the noise is
    the same fraction of the scene whatever its scale; ``extent`` is needed then). ``ok`` (0-d bool tensor): the
    noise is zero where it is False (the NaN guard's skipped step), decided on the device. No host synchronisation
    (capturable in a CUDA graph). ``mcmc_noise_max_scale`` > 0 bounds s in Σ at that share of ``extent``
    (:func:`noise_max_scale`)."""
    noise_lr = float(cfg.mcmc_noise_lr) / length_unit(cfg, extent) ** 2
    max_scale = noise_max_scale(cfg, extent)
    means = model.means3D
    if max_scale >= torch.finfo(means.dtype).max:  # a bound past the parameters' range never binds (and clamp
        max_scale = math.inf                        # refuses a float32 bound of 1e300 × extent with a traceback)
    eta = torch.randn(means.shape, generator=eta_generator, device=means.device, dtype=means.dtype)
    kernel = _noise_kernel(model, lr_means, cfg, ok)
    if kernel is not None:  # csrc/mcmc_noise.cu: the same formula in one launch (the PyTorch form below is its twin)
        lr_t = lr_means.reshape(1) if isinstance(lr_means, torch.Tensor) else None
        return kernel(means, model.quats.detach(), model.log_scales.detach(), model.opacity_logits.detach(), eta,
                      lr_t, 0.0 if lr_t is not None else float(lr_means), noise_lr,
                      float(cfg.mcmc_noise_k), float(cfg.mcmc_noise_t), None if ok is None else ok.reshape(1),
                      max_scale)
    rot = quat_to_rotmat(model.quats.detach())  # (N,3,3)
    s2 = model.scales.detach().clamp(max=max_scale) ** 2  # clamp keeps NaN (a non-finite Gaussian stays culled)
    # Σ·η = R·diag(s²)·Rᵀ·η, as broadcast products and sums over 3: as einsums these ran as two batched cuBLAS
    # gemvs of N 3×3 matrices, 82 µs per step at 44k Gaussians on an H200 (3 % of beer's step; bench/profile_trainer)
    local = (rot * eta[:, :, None]).sum(1) * s2  # Rᵀη: Σ_j R[n, j, i] η[n, j]
    noise = (rot * local[:, None, :]).sum(2)  # R·(s² ⊙ Rᵀη)
    gate = torch.sigmoid(-cfg.mcmc_noise_k * (model.opacities.detach() - cfg.mcmc_noise_t))
    noise = noise * (gate * (noise_lr * lr_means))[:, None]
    noise = torch.nan_to_num(noise, nan=0.0, posinf=0.0, neginf=0.0)  # a non-finite Gaussian stays culled
    if ok is not None:
        noise = torch.where(ok, noise, torch.zeros_like(noise))
    means.add_(noise)
    return noise


@torch.no_grad()
def position_noise(model, lr_means: float, cfg: TrainConfig, generator: torch.Generator | None,
                   ok: torch.Tensor | None = None, extent: float | None = None) -> torch.Tensor:
    """:func:`add_position_noise` with η drawn on the means' device from :func:`seed_noise` of the CPU
    ``generator``; returns the noise (N, 3)."""
    return add_position_noise(model, lr_means, cfg, seed_noise(model.means3D.device, generator), ok, extent)


@torch.no_grad()
def dead_share(model, cfg: TrainConfig) -> float:
    """The share of ``model``'s Gaussians at or under ``mcmc_min_opacity`` (a non-finite opacity counts, as
    :func:`relocate_dead` counts it), 0 for an empty model: what the next relocation moves. One host
    synchronisation. ``mcmc_growth_max_dead`` reads it."""
    n = model.num_gaussians
    return float(_dead(model.opacities.detach(), cfg).sum()) / n if n else 0.0


class _Regularizer(torch.autograd.Function):
    """``w_o · Σ sigmoid(x) + w_s · Σ exp(s)`` over the finite entries, with its gradient written out: the activated
    values are kept from the forward pass, ∂/∂x = w_o · o(1 − o), ∂/∂s = w_s · exp(s). About ten elementwise
    launches where autograd through the model's NaN-safe activations (``GaussianModel.opacities`` / ``scales``) took
    about forty over the N Gaussians at every MCMC step. A non-finite entry (a Gaussian the projection culls) contributes 0
    and gets a zero gradient: through the activations its NaN made the loss NaN, so the NaN guard skipped every step
    while one such Gaussian lived."""

    @staticmethod
    def forward(ctx, logits, log_scales, w_o: float, w_s: float):
        o = torch.sigmoid(logits).where(torch.isfinite(logits), 0.0)  # +inf would count as 1
        s = torch.nan_to_num(torch.exp(log_scales), nan=0.0, posinf=0.0)  # exp(−inf) = 0 already
        ctx.save_for_backward(o, s)
        ctx.w = (w_o, w_s)
        return w_o * o.sum() + w_s * s.sum()

    @staticmethod
    def backward(ctx, g):
        o, s = ctx.saved_tensors
        w_o, w_s = ctx.w
        g_logits = torch.addcmul(o, o, o, value=-1.0).mul_(g * w_o) if ctx.needs_input_grad[0] else None
        g_scales = s * (g * w_s) if ctx.needs_input_grad[1] else None
        return g_logits, g_scales, None, None


def regularizer(model, cfg: TrainConfig, extent: float | None = None) -> torch.Tensor:
    """0-d tensor ``mcmc_opacity_reg · mean(sigmoid(opacity_logits)) + mcmc_scale_reg · mean(exp(log_scales)) / L``
    (the mean of the scales over all N·3 entries, measured in L = :func:`length_unit` of ``cfg`` and the scene
    ``extent``), differentiable; the paper's L1 terms (the values are positive). A non-finite logit or log-scale (a Gaussian the
    projection culls) counts as 0 with a zero gradient, so the loss stays finite (:class:`_Regularizer`)."""
    n = max(1, model.num_gaussians)
    return _Regularizer.apply(model.opacity_logits, model.log_scales, float(cfg.mcmc_opacity_reg) / n,
                              float(cfg.mcmc_scale_reg) / (3 * n * length_unit(cfg, extent)))


@torch.no_grad()
def mcmc_step(model, optimizer, stats, cfg: TrainConfig, iteration: int, lr_means: float,
              generator: torch.Generator | None, ok: torch.Tensor | None = None, *,
              defer: bool = False, extent: float | None = None) -> MCMCReport | None:
    """Everything ``strategy = "mcmc"`` does after the optimizer step of ``iteration`` (``Trainer.step``): cut the
    model to ``max_gaussians`` when above it; every ``densify_interval`` iterations strictly between
    ``densify_from`` and ``densify_until``, :func:`relocate_dead` then :func:`add_gaussians`; then
    :func:`position_noise` (scaled by this iteration's position lr ``lr_means``). ``stats`` (the densification
    accumulators, unused here) is resized when the count changes. Returns an :class:`MCMCReport` when Gaussians
    were relocated, added or removed at a scheduled step (or removed by the cap at any step), else None.
    ``defer``: the trainer holds this iteration's relocation, growth and noise (``Trainer._holds``) and runs them,
    in this order, at its next step (:func:`mcmc_relocate_and_grow`, :func:`position_noise`); only the cap acts."""
    report = mcmc_budget(model, optimizer, stats, cfg, iteration, generator, defer=defer, extent=extent)
    if not defer:
        position_noise(model, lr_means, cfg, generator, ok, extent)
    return report


@torch.no_grad()
def mcmc_budget(model, optimizer, stats, cfg: TrainConfig, iteration: int, generator: torch.Generator | None, *,
                defer: bool = False, extent: float | None = None) -> MCMCReport | None:
    """The host part of :func:`mcmc_step` (everything but the position noise), in its order: cut the model to
    ``max_gaussians`` when above it, then at a scheduled iteration (unless ``defer``) :func:`mcmc_relocate_and_grow`;
    ``stats`` resized to the new count. Returns the :class:`MCMCReport` (None when nothing moved or was removed).
    The eager training step runs it between the Adam step and the noise (``strategy.MCMCStrategy``)."""
    n_before = model.num_gaussians
    removed = trim_to_cap(model, optimizer, cfg.max_gaussians, generator)
    report = None
    if scheduled(cfg, iteration) and not defer:
        report = mcmc_relocate_and_grow(model, optimizer, stats, cfg, iteration, generator, n_before, removed, extent)
    elif removed:
        report = MCMCReport(iteration, n_before, 0, 0, removed, model.num_gaussians, True, 0, 0)
    if len(stats) != model.num_gaussians:
        stats.reset(model.num_gaussians)
    return report
