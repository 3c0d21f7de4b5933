"""Training: :class:`Trainer` (one iteration per ``step()``), :class:`TrainConfig`, losses, density control.

Layout: ``config.py`` (the knobs), ``losses.py`` (L1, SSIM, PSNR), ``optim.py`` (Adam groups and their
surgery), ``densify.py`` (adaptive density control), ``exposure.py`` (per-image colour correction),
``step.py`` (the one training step), ``strategy.py`` (what ``--strategy`` changes, as objects;
``strategy_table.py`` their live fields, torch-free), ``run.py`` (the run loop), ``trainer.py`` (the Trainer).
Checkpoints: :mod:`rigel_core.checkpoint`. Command line: :mod:`rigel_core.cli.train`.

The names below are imported on first use (PEP 562, as in :mod:`rigel_core`), so that a torch-free submodule
(``config``, ``strategy_table``) loads without ``import torch``: the viewer's messages read the strategy table
before its first frame.
"""
from .._lazy import lazy_names

__all__ = ["TrainConfig", "Trainer", "StepResult", "EvalResult", "DensifyReport", "DensifyStats", "Exposure",
           "random_init_points", "background_init_points", "sfm_view_coverage"]

_LAZY = {"TrainConfig": "config", "DensifyReport": "densify", "DensifyStats": "densify", "Exposure": "exposure",
         **{n: "trainer" for n in ("Trainer", "StepResult", "EvalResult", "random_init_points",
                                   "background_init_points", "sfm_view_coverage")}}

__getattr__, __dir__ = lazy_names(__name__, _LAZY, globals())
