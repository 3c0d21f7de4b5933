"""What each densification strategy offers to change while it runs, and under which title, without PyTorch.

The strategy objects (:mod:`.strategy`) take their :attr:`~.strategy.Strategy.live` entry from :data:`LIVE`; the
viewer (:mod:`viewer.messages`, :mod:`viewer.panels.training`) reads the same table without importing torch.
"""
from __future__ import annotations

from dataclasses import dataclass

__all__ = ["DENSIFY_FIELDS", "Live", "LIVE", "live_for", "live_fields"]

#: TrainConfig fields that may change while a run steps (the viewer's ``SetDensifyParams``, its Training panel's
#: sliders); which of them a run reads is its strategy's (:func:`live_fields`)
DENSIFY_FIELDS = ("grad_threshold", "absgrad_threshold", "densify_interval", "densify_from", "densify_until",
                  "opacity_reset_interval", "prune_opacity", "max_gaussians")


@dataclass(frozen=True)
class Live:
    """One strategy's live fields: ``title`` heads them in the Training panel; ``unused`` are the fields of
    :data:`DENSIFY_FIELDS` it never reads; ``one_threshold``: it compares the densification statistic of
    ``TrainConfig.densify_grad`` with that statistic's threshold only (``grad_threshold`` or
    ``absgrad_threshold``), so the other is unused too."""

    title: str
    unused: tuple = ()
    one_threshold: bool = False

    def fields(self, densify_grad: str = "grad") -> tuple:
        """The fields of :data:`DENSIFY_FIELDS` the strategy reads under the (resolved) statistic ``densify_grad``
        ("grad" or "absgrad")."""
        unused = set(self.unused)
        if self.one_threshold:
            unused.add("grad_threshold" if densify_grad == "absgrad" else "absgrad_threshold")
        return tuple(f for f in DENSIFY_FIELDS if f not in unused)


#: resolved ``TrainConfig.strategy`` → its :class:`Live`: 3DGS's densification (:mod:`.densify`) reads every field
#: but the other statistic's threshold; the MCMC budget (:mod:`.mcmc`) has no gradient threshold, opacity reset or
#: pruning
LIVE = {
    "default": Live("Densification (live)", one_threshold=True),
    "mcmc": Live("MCMC budget (live)",
                 unused=("grad_threshold", "absgrad_threshold", "opacity_reset_interval", "prune_opacity")),
}


def live_for(strategy: str) -> Live:
    """The :class:`Live` of a resolved strategy name ("default" or "mcmc"). Raises ValueError for another."""
    try:
        return LIVE[strategy]
    except KeyError:
        raise ValueError(f"no training strategy {strategy!r} (expected one of {', '.join(map(repr, LIVE))})") \
            from None


def live_fields(strategy: str, densify_grad: str = "grad") -> tuple:
    """The fields of :data:`DENSIFY_FIELDS` that the (resolved) ``strategy`` reads under the (resolved) statistic
    ``densify_grad`` ("grad" or "absgrad")."""
    return live_for(strategy).fields(densify_grad)
