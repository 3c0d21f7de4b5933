"""The training step's body — written once, run by both paths (issue 36).

:func:`train_step` is one iteration's device work for a list of training views: render → loss (+ the strategy's loss
term) → backward → non-finite guard → (with several views or processes: the batch mean, the all-reduce) → fused Adam
→ the strategy's device work after the update (:mod:`.strategy`: the densification statistics, or MCMC's position
noise) → the step's values. The eager step (:meth:`.Trainer.step`) calls it with the trainer's views; the graph
runner (:mod:`.graph_step`) captures the very same call with its fixed buffers (a static camera, copies of the
view's image and mask, device learning rates, a fixed binning capacity) and replays it. What differs between the two
is said by the arguments, never by a second copy of the code:

- ``capacity`` (graph runner): the binning runs with that fixed entry capacity (no device→host read) and a frame
  that needs more entries skips its update on the device, as a non-finite one does;
- :attr:`StepContext.host_work` (eager): the strategy may do host work between the Adam step and its device work
  (MCMC's relocation, growth and cap trim, drawn from the CPU generator before the noise seed); the graph runner
  replays no iteration that needs it (:meth:`.strategy.Strategy.needs_eager`);
- ``lock`` / ``after_update``: the eager step holds ``trainer.lock`` over the update and runs the strategy's host
  schedule (densify / prune / reset, MCMC bookkeeping) inside it; the graph runner holds the lock around the replay
  and runs the same schedule after it.

Nothing here reads the device back or branches on the strategy's name.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from ..renderer.cuda_backend import FixedBinningCapacity
from ..renderer.api import render
from .densify import densify_grad, means2D_grad, prepare_means2D_grad

__all__ = ["StepView", "StepContext", "StepOutcome", "train_step", "view_forward_backward", "STEP_FIELDS",
           "graph_config"]

#: TrainConfig fields the step body reads whatever the strategy: the loss, the densification statistic, the Adam
#: variant, and the strategy itself
STEP_FIELDS = ("strategy", "lambda_dssim", "loss_float32", "densify_grad", "densify_visibility", "sparse_adam")


def graph_config(cfg, strategy) -> dict:
    """``{field: value}`` of the TrainConfig fields a captured step of ``cfg`` reads: :data:`STEP_FIELDS` and the
    ``strategy``'s ``graph_fields`` — the config part of the graph signature (:mod:`.graph_step`): a change of any
    other field (a densification threshold, the schedule) keeps the captured graphs."""
    return {k: getattr(cfg, k) for k in STEP_FIELDS + tuple(strategy.graph_fields)}


@dataclass
class StepView:
    """One training view of a step: ``camera`` (a :class:`~rigel_core.renderer.camera.Camera`, or the graph runner's
    static camera), ``gt`` (H, W, 3) float32 target, ``mask`` (H, W) bool or None, ``background`` (3,) on the device,
    ``index`` (the training view's index: its exposure correction)."""

    camera: Any
    gt: torch.Tensor
    mask: torch.Tensor | None
    background: torch.Tensor
    index: int


@dataclass
class StepContext:
    """What one call of :func:`train_step` needs beyond the views.

    ``iteration``: the iteration being taken; ``strategy``: the :class:`~.strategy.Strategy` of the config;
    ``lr_means``: the position learning rate (a float, or the graph runner's device scalar) for the strategy's
    device work; ``stats_on``: whether the densification statistics are gathered; ``host_work``: whether the strategy
    may work on the host inside the step (eager: True); ``noise``: returns the generator the strategy draws its device
    noise from, seeded for this step (eager: seeded when called; graph runner: seeded before the replay).
    The strategy fills ``report`` / ``defer`` (its host work's outcome, eager only)."""

    iteration: int
    strategy: Any
    lr_means: float | torch.Tensor
    stats_on: bool
    host_work: bool
    noise: Callable[[], torch.Generator]
    report: Any = None
    reset: bool = False
    defer: bool = False


@dataclass
class StepOutcome:
    """``values`` (6,) float64 on the device (loss, l1, ssim, mse, skipped, nan_skips: ``StepResult.values``),
    ``ok`` 0-d bool (the update was applied), ``views`` (per view: frame-independent records ``out``, ``loss`` …),
    ``total`` the binning's device entry count ((1,) int64) under a fixed capacity, else None."""

    values: torch.Tensor
    ok: torch.Tensor
    views: list = field(default_factory=list)
    total: torch.Tensor | None = None


def view_forward_backward(trainer, view: StepView, ctx: StepContext) -> dict:
    """Render ``view`` (through its pose correction when ``config.pose_opt`` is on), its loss (through the exposure
    correction when ``config.exposure`` is on and the bilateral grid when ``config.appearance_grid`` is, plus the
    strategy's loss term and the grids' TV term), backward (gradients accumulate into
    ``.grad``); returns the view's record (render output, loss terms, means2D gradient, the densification statistic's
    gradient)."""
    cfg = trainer.config
    camera = trainer._step_camera(view.camera, view.index, ctx.iteration)  # view.camera when pose_opt is off
    out = render(trainer.model, camera, background=view.background)
    prepare_means2D_grad(out)
    pred = trainer._apply_exposure(out.image, view.index, ctx.iteration)  # out.image when exposure is off
    pred, tv = trainer._apply_grid(pred, view.index, ctx.iteration)  # (pred, None) when appearance_grid is off
    loss, l1, s, m_t = trainer.loss_terms(pred, view.gt, view.mask)
    for extra in (ctx.strategy.loss_term(trainer.model, cfg, trainer.extent), tv):
        if extra is not None:
            loss = loss + extra
    g2d = g_stat = None
    if loss.requires_grad:
        loss.backward()
        g2d = means2D_grad(out)
        g_stat = densify_grad(out, cfg)  # what the densification statistic averages
    return {"view": view, "out": out, "loss": loss, "l1": l1, "ssim": s, "mse": m_t, "g2d": g2d, "g_stat": g_stat}


def _increments(trainer, records: list):
    """This process's densification increments of the step's views, summed (``DensifyStats.increment``)."""
    cfg, model = trainer.config, trainer.model
    vis = cfg.densify_visibility
    inc = None
    for v in records:
        out, cam = v["out"], v["view"].camera
        g, d, r = trainer.stats.increment(v["g_stat"], out.radii, cam.width, cam.height, visibility=vis,
                                          means2D=out.means2D if vis == "opacity" else None,
                                          opacities=model.opacities if vis == "opacity" else None)
        if inc is None:
            inc = [g, d, r]
        else:  # a view without a 2D gradient (None) adds nothing to the gradient sum
            inc = [g if inc[0] is None else inc[0] if g is None else inc[0] + g, inc[1] + d, torch.maximum(inc[2], r)]
    return inc


def train_step(trainer, views: list[StepView], ctx: StepContext, *, capacity: int | None = None,
               lock=None, after_update: Callable[[torch.Tensor], None] | None = None) -> StepOutcome:
    """One training step's device work on ``views`` (module docstring); no host read, no host sync of its own.

    ``capacity``: bin with that fixed entry capacity and skip the update (on the device) when a frame needs more;
    ``lock``: held over the update (the Adam step, the strategy's work, ``after_update``); ``after_update(ok)``: host
    work run inside it after the strategy's device work (the eager step's schedule). The caller zeroes the gradients
    afterwards. With ``trainer.comm`` the gradients, the statistics and the guard's verdict are all-reduced; with
    several views of one process the gradients are averaged over them."""
    t, cfg = trainer, trainer.config
    comm = t.comm
    binning = FixedBinningCapacity(capacity) if capacity is not None else contextlib.nullcontext()
    with binning as fixed:
        records = [view_forward_backward(t, v, ctx) for v in views]
    total = fixed.totals[0] if capacity is not None else None
    loss = records[0]["loss"] if len(records) == 1 else torch.stack([v["loss"].detach() for v in records]).sum()
    g2ds = [v["g2d"] for v in records if v["g2d"] is not None]
    finite = t._all_finite(loss, g2ds[0] if len(g2ds) == 1 else (torch.cat(g2ds) if g2ds else None))
    inc = _increments(t, records) if ctx.stats_on else None
    batch = len(records)
    if comm is not None:  # one flattened all-reduce: gradients (→ global-batch mean), statistics, flags
        gi = None if inc is None else (inc[0] if inc[0] is not None else torch.zeros_like(inc[1]))
        finite, gi, di = comm.reduce_step(t, finite, gi, None if inc is None else inc[1], batch * comm.world_size)
        if inc is not None:
            inc = [gi, di, inc[2]]
    elif batch > 1:  # the gradients of the views were summed by the backward passes: their mean
        grads = [p.grad for g in t.optimizer.param_groups for p in g["params"] if p.grad is not None]
        for c in t.corrections:
            grads += c.grads()
        torch._foreach_mul_(grads, 1.0 / batch)
    ok = finite if total is None else finite & (total[0] <= capacity)
    t._nan_skips += (~finite).double()
    with lock if lock is not None else contextlib.nullcontext():
        # fused Adam skips the whole update on the device when found_inf is set (the GradScaler protocol)
        t.optimizer.found_inf = (~ok).float()
        t.optimizer.step()
        for c in t.corrections:  # those whose config switch is on (the viewer may turn one off mid-run)
            if getattr(cfg, c.config_field):
                c.step(t.optimizer.found_inf)
        ctx.strategy.after_update(t, ctx, ok, inc)
        if after_update is not None:
            after_update(ok)
    with torch.no_grad():
        terms = [torch.stack([v["loss"].detach(), v["l1"].detach(), v["ssim"].detach(), v["mse"]]).double()
                 for v in records]
        values = terms[0] if len(terms) == 1 else torch.stack(terms).mean(0)
        values = torch.cat([values, (~ok).double().reshape(1), t._nan_skips.reshape(1)])
    return StepOutcome(values, ok, records, total)
