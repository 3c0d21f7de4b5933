"""Scene loading for the viewer: any file ``rigel_core.io.load_scene`` reads, or the bundled default scene."""
from __future__ import annotations

import os

__all__ = ["load_scene_file", "default_scene"]


def load_scene_file(path, device=None):
    """A GaussianModel from ``path`` (INRIA PLY, compressed PLY, SPZ, checkpoint: ``rigel_core.io.load_scene``).

    Raises FileNotFoundError naming the path when it does not exist; the loader's own error (naming the file
    and the problem) for a file it cannot read.
    """
    path = os.fspath(path)
    if not os.path.exists(path):
        raise FileNotFoundError(f"{path}: no such scene file")
    from rigel_core.io import load_scene

    return load_scene(path, device=device)


def default_scene(device=None):
    """(model, description) of the bundled default scene (``rigel_core.data.default_scene_path()``); when the
    package was installed without it, the same procedural scene generated in memory (a few thousand Gaussians)."""
    try:
        from rigel_core.data import default_scene_path

        path = default_scene_path()
        return load_scene_file(path, device=device), str(path)
    except (ImportError, FileNotFoundError):
        from rigel_core.data import make_scene

        return make_scene(n=5000, sh_degree=2, device=device), "procedural scene (generated; bundled file missing)"
