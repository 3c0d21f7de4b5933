"""Records the trainer produces and :mod:`rigel_core.checkpoint` stores: defined apart from the trainer so that
the checkpoint format depends on them and not on :mod:`rigel_core.train.trainer` (which saves checkpoints)."""
from __future__ import annotations

from dataclasses import asdict, dataclass, field

__all__ = ["EvalResult"]


@dataclass
class EvalResult:
    """Held-out metrics at one iteration: means over the test views of the per-view PSNR (dB) and SSIM
    (renders clamped to [0, 1]; SSIM as :func:`.losses.ssim`, zero-padded 11×11 window), each over the view's
    valid pixels (``Frame.mask``); ``per_view`` entries also give ``masked_pixels`` (0 without a mask) and
    ``masked_pixels`` is their total."""

    iteration: int
    psnr: float
    ssim: float
    num_gaussians: int
    n_views: int
    seconds: float
    per_view: list = field(default_factory=list)  # [{"name", "psnr", "ssim", "masked_pixels"}]
    masked_pixels: int = 0
    #: with ``TrainConfig.exposure`` or ``eval_exposure``: the means of the left-half-fit / right-half-scored protocol
    #: (:func:`.exposure.left_right_metrics`; per view under "psnr_exposure", "ssim_exposure", "exposure_fit")
    psnr_exposure: float | None = None
    ssim_exposure: float | None = None
    #: with ``TrainConfig.pose_opt`` or ``eval_pose_opt``: the means of the pose-fitted protocol (each held-out view's
    #: pose fitted with the scene frozen, :func:`.pose.fit_pose`; per view under "psnr_pose", "ssim_pose", "pose_fit")
    psnr_pose: float | None = None
    ssim_pose: float | None = None

    def to_dict(self) -> dict:
        return asdict(self)
