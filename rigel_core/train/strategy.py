"""Densification strategies as objects: what ``TrainConfig.strategy`` changes in a training step, in one place each.

A :class:`Strategy` gives

- its **device work inside the step** (:func:`.step.train_step`): a term added to the loss (:meth:`~Strategy.loss_term`),
  whether the step gathers the densification statistics (:meth:`~Strategy.collects_stats`), and what runs after the
  Adam step (:meth:`~Strategy.after_update`) — captured in the CUDA graph as it runs eagerly;
- its **host schedule**: after a step (:meth:`~Strategy.host_schedule`, under ``trainer.lock``), when the graph
  runner must leave an iteration to the eager step (:meth:`~Strategy.needs_eager`), what it does before each replay
  (:meth:`~Strategy.before_replay`), and the work an iteration held back (:meth:`~Strategy.run_held`,
  ``Trainer.deferred_schedule``);
- its **checkpoint state** (:meth:`~Strategy.state_tensors` / :meth:`~Strategy.load_state_tensors`);
- the **config fields the captured step reads** (:attr:`~Strategy.graph_fields`): with :data:`.step.STEP_FIELDS` the
  graph signature (:mod:`.graph_step`), so a slider of a host-only field (a densification threshold) keeps the graphs.

:class:`DefaultStrategy` is 3DGS's clone / split / prune with opacity resets (:mod:`.densify`);
:class:`MCMCStrategy` the 3DGS-MCMC budget (:mod:`.mcmc`). Which one a run uses is the config's choice
(:func:`.config.resolve_strategy`); :func:`strategy_for` turns the resolved name into the object. The objects hold
no state of their own (the run's state is the trainer's): one instance per strategy serves every trainer.
"""
from __future__ import annotations

import torch

from .densify import DensifyReport, densify_and_prune, reset_opacity
from .mcmc import add_position_noise, mcmc_budget, mcmc_relocate_and_grow, noise_generator, position_noise, \
    regularizer, scheduled, seed_noise
from .optim import group_lrs
from .strategy_table import LIVE, Live

__all__ = ["Strategy", "DefaultStrategy", "MCMCStrategy", "strategy_for"]

class Strategy:
    """The interface (module docstring); the base class is a strategy that adds nothing."""

    name = ""
    #: what the strategy lets the viewer change while it runs, and the title over it (:mod:`.strategy_table`,
    #: which the viewer reads without torch)
    live: Live = Live("")
    #: TrainConfig fields the strategy's device work reads (the captured graphs are made again when one changes)
    graph_fields: tuple = ()

    # ---- inside the step (device work; captured) ----------------------------------------------------------------
    def loss_term(self, model, cfg, extent: float | None = None) -> torch.Tensor | None:
        """A 0-d differentiable term added to every view's loss, or None (``extent``: the trainer's scene extent)."""
        return None

    def collects_stats(self, cfg, iteration: int) -> bool:
        """Does iteration ``iteration`` gather the densification statistics (``trainer.stats``)?"""
        return False

    def after_update(self, trainer, ctx, ok: torch.Tensor, inc) -> None:
        """Device work after the Adam step (``ok``: the step was applied, 0-d bool; ``inc``: the statistics'
        increments when gathered); with ``ctx.host_work`` (eager) also host work, whose outcome goes to ``ctx``."""

    # ---- on the host ----------------------------------------------------------------------------------------------
    def host_schedule(self, trainer, ctx, ok: torch.Tensor) -> tuple:
        """Host work after iteration ``ctx.iteration``'s update, under ``trainer.lock`` (both paths). Returns
        ``(report, reset)``: a :class:`~.densify.DensifyReport` or None, and whether opacities were reset."""
        return ctx.report, ctx.reset

    def needs_eager(self, trainer, iteration: int) -> bool:
        """Must iteration ``iteration`` take the eager step (host work inside the step)?"""
        return False

    def graph_generators(self, device) -> list:
        """The device generators the captured step draws from (registered with each graph)."""
        return []

    def before_replay(self, trainer) -> None:
        """Host work before each replay of the captured step (and before a plain call of it)."""

    @staticmethod
    def noise(trainer, *, seed: bool) -> torch.Generator:
        """The device generator the step's noise is drawn from (:func:`.mcmc.noise_generator`): the eager step seeds
        it here from the trainer's CPU generator (``seed``), the graph runner before the replay
        (:meth:`before_replay`)."""
        if seed:
            return seed_noise(trainer.device, trainer.generator)
        return noise_generator(trainer.device)

    def run_held(self, trainer, iteration: int, cfg) -> tuple:
        """The schedule iteration ``iteration`` held back (``Trainer.deferred_schedule``), under ``cfg``, as it would
        have run right after that iteration's update. Returns ``(report, reset)``."""
        return None, False

    # ---- checkpoint ----------------------------------------------------------------------------------------------
    def state_tensors(self, trainer) -> dict:
        """The strategy's tensors of the run, by checkpoint name: the densification accumulators (``stats.*``; the
        MCMC budget keeps them at the model's length, unused)."""
        return {f"stats.{k}": v for k, v in trainer.stats.state_tensors().items()}

    def load_state_tensors(self, trainer, tensors: dict) -> None:
        """Restore :meth:`state_tensors` from a checkpoint's ``tensors``."""
        trainer.stats.load_state_tensors({k: tensors[f"stats.{k}"].to(trainer.device)
                                          for k in ("grad_accum", "denom", "max_radii")})


class DefaultStrategy(Strategy):
    """3DGS's adaptive density control (:mod:`.densify`): gradient statistics before ``densify_until``; every
    ``densify_interval`` after ``densify_from`` clone / split / prune; opacity reset every
    ``opacity_reset_interval`` (and at ``densify_from`` for white-background data)."""

    name = "default"
    live = LIVE["default"]

    def collects_stats(self, cfg, iteration: int) -> bool:
        return iteration < cfg.densify_until

    def after_update(self, trainer, ctx, ok, inc) -> None:
        if inc is not None:
            trainer.stats.add(inc[0], inc[1], inc[2], valid=ok)

    def host_schedule(self, trainer, ctx, ok) -> tuple:
        if not ctx.stats_on:
            return None, False
        return self.schedule(trainer, ctx.iteration)

    def run_held(self, trainer, iteration: int, cfg) -> tuple:
        return self.schedule(trainer, iteration, deferred=True, cfg=cfg)

    def schedule(self, trainer, it: int, *, deferred: bool = False, cfg=None) -> tuple:
        """The host-side schedule after iteration ``it``'s update (before ``densify_until``): densify and prune
        every ``densify_interval`` after ``densify_from``, opacity reset every ``opacity_reset_interval`` (and at
        ``densify_from`` for white-background data). Returns (report, reset). An iteration that holds
        (``Trainer._holds``) does neither but records itself in ``trainer.deferred_schedule`` (``deferred=True``
        then runs it at the next step, for the last iteration when the run is extended): no later step would train
        the new rows or bring the reset opacities back, so the saved and evaluated model would carry untrained
        clones and splits, or every opacity at ``opacity_reset_value`` (a ``--iters 3000`` run ended fully
        transparent). 3DGS saves and evaluates before its densification of the same iteration. ``cfg``: the config
        to decide and act under (default: the trainer's)."""
        t = trainer
        cfg = t.config if cfg is None else cfg
        report: DensifyReport | None = None
        reset = False
        densify_now = it > cfg.densify_from and it % cfg.densify_interval == 0
        reset_now = it % cfg.opacity_reset_interval == 0 or (t.white_bg and it == cfg.densify_from)
        if not (densify_now or reset_now):
            return report, reset
        if t._holds(it) and not deferred:
            t._hold(it, cfg)
            return report, reset
        if densify_now:
            if t.comm is not None:
                t.comm.sync_stats(t.stats)
            report = densify_and_prune(t.model, t.optimizer, t.stats, cfg, t.extent, it, t.generator)
            t.last_densify = report
        if reset_now:
            reset_opacity(t.model, t.optimizer, cfg.opacity_reset_value)
            reset = True
        return report, reset


class MCMCStrategy(Strategy):
    """The 3DGS-MCMC budget (:mod:`.mcmc`): the opacity and scale regularisers in the loss, the Langevin position
    noise after every update (device work, captured), relocation of dead Gaussians and growth to
    ``max_gaussians`` every ``densify_interval`` strictly between ``densify_from`` and ``densify_until``, and the cut
    to the cap (host work: those iterations take the eager step)."""

    name = "mcmc"
    live = LIVE["mcmc"]
    graph_fields = ("mcmc_opacity_reg", "mcmc_scale_reg", "mcmc_noise_lr", "mcmc_noise_k", "mcmc_noise_t",
                    "mcmc_noise_max_scale", "mcmc_units")

    def loss_term(self, model, cfg, extent: float | None = None) -> torch.Tensor:
        return regularizer(model, cfg, extent)

    def after_update(self, trainer, ctx, ok, inc) -> None:
        t, cfg = trainer, trainer.config
        if ctx.host_work:  # the eager step: cap, relocation and growth to the budget first (mcmc.py)
            it = ctx.iteration
            # a held iteration (Trainer._holds), when scheduled, defers its relocation and growth and (to keep their
            # order with the noise draws of the steps after) its position noise: Trainer.deferred_schedule
            ctx.defer = t._holds(it) and scheduled(cfg, it)
            ctx.report = mcmc_budget(t.model, t.optimizer, t.stats, cfg, it, t.generator, defer=ctx.defer,
                                     extent=t.extent)
        if not ctx.defer:  # the Langevin position noise after the update, zero where the update was skipped
            add_position_noise(t.model, ctx.lr_means, cfg, ctx.noise(), ok, t.extent)

    def host_schedule(self, trainer, ctx, ok) -> tuple:
        t = trainer
        t.last_densify = ctx.report or t.last_densify
        if ctx.defer:
            t._hold(ctx.iteration, t.config, ok)
        return ctx.report, False

    def needs_eager(self, trainer, iteration: int) -> bool:
        cfg = trainer.config
        # relocation / growth / the cap's trim: host work, done by the eager step
        return scheduled(cfg, iteration) or (cfg.max_gaussians is not None
                                             and trainer.model.num_gaussians > cfg.max_gaussians)

    def graph_generators(self, device) -> list:
        return [noise_generator(device)]  # its seed and offset are read at each replay (set before it)

    def before_replay(self, trainer) -> None:
        seed_noise(trainer.device, trainer.generator)  # this step's noise seed, drawn where the eager step draws it

    def run_held(self, trainer, iteration: int, cfg) -> tuple:
        t = trainer
        report = mcmc_relocate_and_grow(t.model, t.optimizer, t.stats, cfg, iteration, t.generator, extent=t.extent)
        t.last_densify = report or t.last_densify
        # that iteration's noise, at its learning rate under the extended schedule (what a run planned this long
        # used); after --resume the skip flag is not kept: the step is taken as applied
        position_noise(t.model, group_lrs(cfg, iteration, t.extent)["means3D"] * t._batch_scaling()[0], cfg,
                       t.generator, t._deferred_ok, t.extent)
        t._deferred_ok = None
        return report, False


_STRATEGIES = {s.name: s for s in (DefaultStrategy(), MCMCStrategy())}


def strategy_for(name: str) -> Strategy:
    """The :class:`Strategy` of a resolved ``TrainConfig.strategy`` ("default" or "mcmc"). Raises ValueError for
    another name ("auto" is resolved by the Trainer first)."""
    try:
        return _STRATEGIES[name]
    except KeyError:
        raise ValueError(f"no training strategy {name!r} (expected one of {', '.join(map(repr, _STRATEGIES))})") \
            from None

