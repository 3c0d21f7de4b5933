"""Strict JSON (RFC 8259 has no NaN or Infinity): the one helper every summary writer passes its data through."""
from __future__ import annotations

import math

__all__ = ["finite_or_none"]


def finite_or_none(obj):
    """``obj`` with every non-finite float (NaN, ±inf) replaced by None, through nested dicts, lists and tuples
    (tuples become lists, as JSON writes them); everything else is returned as it is."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: finite_or_none(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [finite_or_none(v) for v in obj]
    return obj
