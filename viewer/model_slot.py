"""The seam between a model producer (the training thread, later) and the UI thread (DESIGN §6, STYLE 9).

The producer publishes immutable snapshots; the UI takes the latest one at one point of its frame loop and
renders it. The lock guards only the hand-over (a reference swap), so neither thread waits on the other for more
than that, and the UI never sees a model in the middle of densification.
"""
from __future__ import annotations

import threading
from dataclasses import dataclass, field

__all__ = ["ModelSlot", "Snapshot"]


@dataclass(frozen=True)
class Snapshot:
    """A published model: ``version`` increases with every publish; ``info`` is free-form (iteration, PSNR…)."""

    model: object
    version: int
    info: dict = field(default_factory=dict)


class ModelSlot:
    """Lock-protected latest-model slot.

    ``publish(model, **info)`` stores a snapshot; the model must not be modified afterwards (a trainer publishes
    ``model.detach()``-style copies). ``latest()`` returns the newest :class:`Snapshot` or None.

    Snapshots on demand: a reader that calls :meth:`request` ("I will take a newer one") makes the slot
    :attr:`wanted` until the next publish, so that a producer which checks :attr:`wanted` copies its model only as
    often as the reader adopts one (the viewer: at its live refresh rate, none while it presents nothing). Before
    any request, :attr:`wanted` is always True (a producer publishes on its own schedule).
    """

    def __init__(self, model=None, **info):
        self._lock = threading.Lock()
        self._snap = Snapshot(model, 1, dict(info)) if model is not None else None
        self._wanted: bool | None = None   # None: no reader has asked; then whether one asked since the last publish

    def publish(self, model, **info) -> int:
        with self._lock:
            version = (self._snap.version if self._snap else 0) + 1
            self._snap = Snapshot(model, version, dict(info))
            if self._wanted is not None:
                self._wanted = False
            return version

    def request(self) -> None:
        """A reader will adopt a newer snapshot: :attr:`wanted` until the next publish."""
        self._wanted = True

    @property
    def wanted(self) -> bool:
        """Whether a publish now would be adopted: a reader asked since the last one, or no reader ever asked."""
        return self._wanted is not False

    def latest(self) -> Snapshot | None:
        with self._lock:
            return self._snap
