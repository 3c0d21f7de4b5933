"""Third-party packages imported on first use, and the one message a missing one gives.

setup.py holds the one dependency list: the core packages and the extras (``colmap``: pycolmap; ``viewer``: vulkan,
glfw, imgui-bundle; ``video``: imageio-ffmpeg; ``test``; ``all``). A module that only some paths need is imported
with :func:`require` where it is needed, so that its absence is one line saying what to install (the CLIs print an
ImportError as their error line) instead of ``No module named 'cv2'``. Imports nothing itself (torch-free).
"""
from __future__ import annotations

import importlib

__all__ = ["MissingPackage", "require"]


class MissingPackage(ImportError):
    """A package that rigel needs here is not installed (or does not import); the message says what needs it and
    the ``pip install`` that provides it."""


def require(module: str, *, package: str, purpose: str, extra: str | None = None):
    """Import and return ``module``.

    Args:
        module: the import name, e.g. ``"cv2"``.
        package: the distribution that provides it, e.g. ``"opencv-python-headless"``.
        purpose: what needs it, e.g. ``"undistorting the images of a capture with lens distortion"``.
        extra: rigel's extra that installs it (``"colmap"``), or None for a core dependency.
    Raises:
        MissingPackage (an ImportError; ``name`` = ``module``) when the import fails, naming the package and the
        pip command; the import's own error (a missing module, or a shared library it could not load) in brackets.
    """
    try:
        return importlib.import_module(module)
    except ImportError as e:
        where = f"rigel's '{extra}' extra" if extra else "a dependency of rigel"
        raise MissingPackage(f"{purpose} needs the Python package `{package}` ({where}), which did not import "
                             f"({e}): pip install {package}", name=module) from None
