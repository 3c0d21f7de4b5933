"""Typed messages between the viewer (UI thread) and its training thread (DESIGN §6, STYLE §8).

Commands go down (imperative names: :class:`Pause`, :class:`SetDensifyParams`, …); events come up (past tense:
:class:`TrainingProgress`, :class:`EvalFinished`, …). Both are frozen dataclasses, so a message cannot change
after it was sent. The UI drains its event queue once per frame; the training thread drains its command queue
between two iterations, and applies every command there (one point of the loop, STYLE §10).
"""
from __future__ import annotations

from dataclasses import dataclass, field

# the TrainConfig fields that SetDensifyParams may change, and those a strategy reads (the Training panel's sliders):
# the strategies' own table (rigel_core/train/strategy_table.py), which imports no torch
from rigel_core.train.strategy_table import DENSIFY_FIELDS, live_fields as densify_fields

__all__ = [
    # commands
    "Command", "Pause", "Resume", "Step", "SetDensifyParams", "SetAppearance", "Save", "Stop",
    # events
    "Event", "TrainingStarted", "TrainingProgress", "EvalFinished", "Densified", "TrainingPaused",
    "TrainingResumed", "DensifyParamsChanged", "AppearanceChanged", "Saved", "CommandRejected",
    "TrainingFinished", "TrainingFailed", "TrainingStopped",
    "DENSIFY_FIELDS", "densify_fields",
]


# ---- commands (UI → training thread) ------------------------------------------------------------------------
class Command:
    """Base class of the commands the training thread accepts."""


@dataclass(frozen=True)
class Pause(Command):
    """Stop stepping after the current iteration (the model stays published)."""


@dataclass(frozen=True)
class Resume(Command):
    """Step continuously again (also starts a session created paused)."""


@dataclass(frozen=True)
class Step(Command):
    """Run ``n`` iterations, then pause."""

    n: int = 1


@dataclass(frozen=True)
class SetDensifyParams(Command):
    """Set densification fields of the trainer's ``TrainConfig`` (names in :data:`DENSIFY_FIELDS`), e.g.
    ``SetDensifyParams({"grad_threshold": 3e-4})``. Applied between two iterations; an invalid value is
    rejected as a whole (:class:`CommandRejected`) and the config is left as it was."""

    params: dict = field(default_factory=dict)


@dataclass(frozen=True)
class SetAppearance(Command):
    """Switch the colour model to ``kind`` ("sh" or "mlp") with the trainer's own switch
    (``Trainer.set_appearance``), when the trainer has one."""

    kind: str


@dataclass(frozen=True)
class Save(Command):
    """Write the checkpoint and/or the PLY (``what``: "checkpoint", "ply" or "both") into the run folder."""

    what: str = "both"


@dataclass(frozen=True)
class Stop(Command):
    """End the thread; with ``save`` the checkpoint and the PLY are written first."""

    save: bool = True


# ---- events (training thread → UI) ----------------------------------------------------------------------------
class Event:
    """Base class of the events the training thread emits."""


@dataclass(frozen=True)
class TrainingStarted(Event):
    iteration: int
    iterations: int
    num_gaussians: int
    device: str
    train_views: int
    test_views: int
    run_dir: str
    running: bool
    densify: dict = field(default_factory=dict)   # the values now of the fields the strategy reads (densify_fields)
    appearance: str = "sh"
    strategy: str = "default"                     # the run's densification: "default" (3DGS) or "mcmc"
    notes: tuple = ()   # the log's start line and what "auto" chose and why (Trainer.start_line, Trainer.notes)
    coarse: str = ""    # coarse-to-fine for this session in a few words (Trainer.coarse_summary)
    start: str = ""     # where the session starts, from how many Gaussians and what (Trainer.start_words)
    budget: str = ""    # the strategy's bound on the Gaussians in words, "" without one (Trainer.budget_words)


@dataclass(frozen=True)
class TrainingProgress(Event):
    """One finished iteration: the training view's loss and PSNR (dB), the Gaussian count, seconds spent
    stepping so far (pauses excluded), and the milliseconds this iteration took."""

    iteration: int
    loss: float
    psnr: float
    num_gaussians: int
    elapsed_s: float
    ms_per_iter: float
    view: str
    skipped: bool = False


@dataclass(frozen=True)
class EvalFinished(Event):
    """Held-out PSNR (dB) and SSIM at ``iteration``."""

    iteration: int
    psnr: float
    ssim: float
    num_gaussians: int
    n_views: int


@dataclass(frozen=True)
class Densified(Event):
    iteration: int
    n_clone: int
    n_split: int
    n_prune: int
    n_after: int
    n_relocated: int | None = None   # the MCMC budget's step (train/mcmc.py): relocated and added, not clone/split
    n_added: int = 0
    dead_share: float | None = None  # MCMC: growth held because this share of the Gaussians was dead (else None)


@dataclass(frozen=True)
class TrainingPaused(Event):
    iteration: int


@dataclass(frozen=True)
class TrainingResumed(Event):
    iteration: int


@dataclass(frozen=True)
class DensifyParamsChanged(Event):
    """The config now holds ``params`` (applied before iteration ``iteration + 1``)."""

    iteration: int
    params: dict


@dataclass(frozen=True)
class AppearanceChanged(Event):
    """The model's colours are now ``kind``; ``rmse`` is the conversion error reported by the switch."""

    iteration: int
    kind: str
    rmse: float


@dataclass(frozen=True)
class Saved(Event):
    """Files written (absolute paths) and why ("request", "finished", "stopped", "failed")."""

    iteration: int
    paths: tuple
    reason: str


@dataclass(frozen=True)
class CommandRejected(Event):
    """A command the training thread did not apply. ``unsupported``: this trainer can never do it (the UI hides
    the control); ``current``: the values the trainer keeps for the fields the command tried to set (the UI shows
    them again, so a rejected slider value does not stay on screen)."""

    command: str
    reason: str
    unsupported: bool = False
    current: dict = field(default_factory=dict)


@dataclass(frozen=True)
class TrainingFinished(Event):
    """All ``iterations`` were run; ``psnr`` is the last held-out PSNR (nan when there was no evaluation)."""

    iteration: int
    psnr: float


@dataclass(frozen=True)
class TrainingFailed(Event):
    """An exception ended the training: its one-line ``message`` and full ``traceback``."""

    iteration: int
    message: str
    traceback: str


@dataclass(frozen=True)
class TrainingStopped(Event):
    """The thread has ended (after any save); nothing follows this event."""

    iteration: int
