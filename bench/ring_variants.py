"""The frame ring and presenter variants bench/ring_overhead.py measures against the production ones (issue 15:
benchmark-only switches live here, not in viewer/gpu/).

* :class:`BenchRing` — a :class:`~viewer.gpu.frame_ring.FrameRing` whose CUDA hand-over can be switched between
  frames: ``elide_waits=False`` enqueues the ``free[s]`` wait for every render (the protocol as first written);
  ``handover="event"`` records a CUDA event after the render instead of signalling ``ready[s]``: the host polls it
  (:meth:`is_ready`) and a present of a finished render needs no wait (:meth:`present_wait` gives None; one of an
  unfinished render waits for the event on the host first).
* :class:`DiagnosticPresenter` — a :class:`~viewer.gpu.presenter.Presenter` whose ``diagnostic`` records less, to
  break the present's cost down (the target then shows nothing usable): "compute" = the present pass's dispatch
  alone, "empty" = a submit with no commands.
"""
from __future__ import annotations

from viewer.gpu.frame_ring import FrameRing
from viewer.gpu.presenter import Presenter

__all__ = ["BenchRing", "DiagnosticPresenter"]


class BenchRing(FrameRing):
    """FrameRing with the switches ``elide_waits`` (default True, as production) and ``handover``
    ("semaphore", as production, or "event"). Raises ValueError for another handover."""

    def __init__(self, ctx, slots: int = 3, *, elide_waits: bool = True, handover: str = "semaphore", **kwargs):
        if handover not in ("semaphore", "event"):
            raise ValueError(f"FrameRing handover must be 'semaphore' or 'event', got {handover!r}")
        super().__init__(ctx, slots, **kwargs)
        self.elide_waits = bool(elide_waits)
        self.handover = handover
        self._slot_handover = ["semaphore"] * self.k   # how each slot's last render was published
        self._done = []
        if self.device == "cuda":
            import torch

            with torch.cuda.device(self.cuda_device):
                self._done = [torch.cuda.Event() for _ in range(self.k)]   # per slot: end of its last render

    def _wait_free(self, s, stream):
        need = self.last_read[s]
        if self.elide_waits:
            super()._wait_free(s, stream)
        elif need > 0:
            self._ext_free[s].wait(need, stream)
            self.waits_enqueued += 1

    def _signal_ready(self, s, r, stream):
        import torch

        self._slot_handover[s] = self.handover
        if self.handover == "event":
            self._done[s].record(stream if stream is not None else torch.cuda.current_stream(self.cuda_device))
        else:
            super()._signal_ready(s, r, stream)

    def _event_slot(self, slot) -> bool:
        return self.device == "cuda" and self._slot_handover[slot.index] == "event"

    def is_ready(self, slot):
        if self._event_slot(slot) and not slot.rendering and slot.frame > 0:
            return self._done[slot.index].query()
        return super().is_ready(slot)

    def present_wait(self, slot):
        if self._event_slot(slot):
            self._done[slot.index].synchronize()   # returns at once for a finished render (newest_ready's)
            return None
        return super().present_wait(slot)


class DiagnosticPresenter(Presenter):
    """Presenter with ``diagnostic``: None (as production), "compute" or "empty" (see the module docstring)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.diagnostic: str | None = None

    def _record_passes(self, cmd, f, slot, index, *, mode, overdraw_max, scale_bar, content, draw_data):
        if self.diagnostic is None:
            return super()._record_passes(cmd, f, slot, index, mode=mode, overdraw_max=overdraw_max,
                                          scale_bar=scale_bar, content=content, draw_data=draw_data)
        if self.diagnostic == "compute":   # no copy, no render pass: the image is not presentable
            w, h = self.target.width, self.target.height
            self.present_pass.record(cmd, f, slot, self.target.image(index), w, h, bgra=self.target.bgra, mode=mode,
                                     overdraw_max=overdraw_max, scale_bar=scale_bar, background=self.background,
                                     content=content, copy=False)
