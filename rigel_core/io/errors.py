"""Errors raised by the scene readers: one exception per bad file, naming the file and the problem."""
from __future__ import annotations

import os

__all__ = ["SceneFormatError", "PlyFormatError", "SpzFormatError"]


class SceneFormatError(ValueError):
    """A scene file that cannot be read as what it claims to be.

    ``str(err)`` is ``"<path>: <problem>"``; the two parts are kept as ``err.path`` and ``err.problem``.
    """

    def __init__(self, path, problem: str):
        self.path = os.fspath(path) if path is not None else "<stream>"
        self.problem = problem
        super().__init__(f"{self.path}: {problem}")


class PlyFormatError(SceneFormatError):
    """A PLY file (INRIA/graphdeco or PlayCanvas compressed) that is malformed or is not a Gaussian splat."""


class SpzFormatError(SceneFormatError):
    """A Niantic ``.spz`` file that is malformed, truncated or of an unsupported version."""
