"""Names of a package imported on first use (PEP 562): ``rigel_core.train`` and ``rigel_core.io`` export names
whose modules import torch, beside torch-free modules the viewer loads before ``import torch`` (its first frame)."""
from __future__ import annotations

import importlib


def lazy_names(package: str, table: dict, namespace: dict):
    """The ``(__getattr__, __dir__)`` of ``package`` (its ``__name__``) whose name N is
    ``package.<table[N]>.N``, imported on first use and then kept in ``namespace`` (the package's globals); an
    unknown name is an AttributeError."""

    def __getattr__(name):
        if name in table:
            value = getattr(importlib.import_module(f".{table[name]}", package), name)
            namespace[name] = value
            return value
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    def __dir__():
        return sorted(set(namespace) | set(table))

    return __getattr__, __dir__
