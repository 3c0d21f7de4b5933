"""The per-training-image corrections a run may learn (each a :class:`.per_image.PerImageParam`), in the order their
Adam steps: exposure, pose refinement, the bilateral grid. One list read by the trainer, the graph step and the
checkpoint; kept apart from :mod:`.per_image`, which each correction's module imports."""
from __future__ import annotations

from .bilagrid import BilateralGrid
from .exposure import Exposure
from .pose import PoseCorrection

__all__ = ["CORRECTIONS", "correction_classes"]

CORRECTIONS: tuple = (Exposure, PoseCorrection, BilateralGrid)


def correction_classes() -> tuple:
    """:data:`CORRECTIONS`: the correction classes, in the order their Adam steps."""
    return CORRECTIONS
