"""Training: :class:`Trainer` (one iteration per ``step()``), :class:`TrainConfig`, losses, density control.

Layout: ``config.py`` (the knobs), ``losses.py`` (L1, SSIM, PSNR), ``optim.py`` (Adam groups and their
surgery), ``densify.py`` (adaptive density control), ``trainer.py`` (the loop). Checkpoints:
:mod:`rigel_core.checkpoint`. Command line: :mod:`rigel_core.cli.train`.
"""
from .config import TrainConfig
from .densify import DensifyReport, DensifyStats
from .trainer import EvalResult, StepResult, Trainer, random_init_points

__all__ = ["TrainConfig", "Trainer", "StepResult", "EvalResult", "DensifyReport", "DensifyStats",
           "random_init_points"]
