"""Errors for bad input files, one family per kind of file; every message names the file and the problem.

| family | raised for |
|---|---|
| :class:`SceneFormatError` (:class:`PlyFormatError`, :class:`SpzFormatError`) | scene files: PLY, compressed PLY, SPZ |
| :class:`DatasetError` | datasets: transforms files, COLMAP models, their images and cameras |

All are :class:`InputError`, a ``ValueError``: the CLIs print ``str(err)`` as one line on stderr and exit with
status 2 (docs/RELIABILITY.md).
"""
from __future__ import annotations

import os

__all__ = ["InputError", "SceneFormatError", "PlyFormatError", "SpzFormatError", "DatasetError", "NoImageFiles"]


class InputError(ValueError):
    """An input file that cannot be used. ``str(err)`` is ``"<path>: <problem>"``; the parts are kept as
    ``err.path`` and ``err.problem`` (``err.path`` is None when the message was given whole)."""

    def __init__(self, path, problem: str | None = None):
        if problem is None:  # one pre-formatted message that already names the file
            self.path, self.problem = None, str(path)
            super().__init__(self.problem)
            return
        self.path = os.fspath(path) if path is not None else "<stream>"
        self.problem = problem
        super().__init__(f"{self.path}: {problem}")


class SceneFormatError(InputError):
    """A scene file that cannot be read as what it claims to be (``SceneFormatError(path, problem)``)."""

    def __init__(self, path, problem: str):
        super().__init__(path, problem)


class PlyFormatError(SceneFormatError):
    """A PLY file (INRIA/graphdeco or PlayCanvas compressed) that is malformed or is not a Gaussian splat."""


class SpzFormatError(SceneFormatError):
    """A Niantic ``.spz`` file that is malformed, truncated or of an unsupported version."""


class DatasetError(InputError):
    """A dataset that cannot be loaded: ``DatasetError(path, problem)``, or ``DatasetError(message)`` with a
    message that already starts with the file (``"<path>: frame 3: 'fl_x' …"``)."""


class NoImageFiles(DatasetError):
    """A dataset none of whose (training) frames has its image file: nothing to train on, but its cameras are
    usable alone — e.g. a ``--pose-opt`` run's ``RUN/transforms.json`` (poses only), which ``rigel-render
    --cameras`` and ``rigel-viewer --cameras`` read as cameras (:func:`rigel_core.cli.render.resolve_cameras`)."""
