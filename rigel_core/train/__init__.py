"""Training: :class:`Trainer` (one iteration per ``step()``), :class:`TrainConfig`, losses, density control.

Layout: ``config.py`` (the knobs), ``losses.py`` (L1, SSIM, PSNR), ``optim.py`` (Adam groups and their
surgery), ``densify.py`` (adaptive density control), ``exposure.py`` (per-image colour correction),
``trainer.py`` (the loop). Checkpoints: :mod:`rigel_core.checkpoint`. Command line: :mod:`rigel_core.cli.train`.
"""
from .config import TrainConfig
from .densify import DensifyReport, DensifyStats
from .exposure import Exposure
from .trainer import EvalResult, StepResult, Trainer, background_init_points, random_init_points, sfm_view_coverage

__all__ = ["TrainConfig", "Trainer", "StepResult", "EvalResult", "DensifyReport", "DensifyStats", "Exposure",
           "random_init_points", "background_init_points", "sfm_view_coverage"]
