"""Scene loading for the viewer: any file ``rigel_core.io.load_scene`` reads, or the bundled default scene."""
from __future__ import annotations

import os

__all__ = ["load_scene_file", "default_scene", "default_up", "off_origin", "model_box"]


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


def default_up(path, model=None, *, box=None, inria_ply: bool = False) -> str:
    """The world up axis to open a scene file with (``--up`` and the Camera section's control override it).

    SPZ and PlayCanvas compressed PLY come from y-up tools (RUB axes, converted to rigel's RDF axes on load),
    so their up is ``"-y"``. An INRIA PLY or a checkpoint says nothing about its axes. Objects made in Blender
    (NeRF-synthetic, the bundled scene, the donut) are z-up and centred on the origin; a scene whose robust
    box lies farther from the origin than twice its own size (:func:`off_origin`) is a crop of a larger
    capture, and captures reconstructed with COLMAP are y-down: ``"-y"`` for those, ``"+z"`` otherwise.

    The box is ``box`` ((lo (3,), hi (3,)), the 1 %–99 % box of the means), else :func:`model_box` of ``model``,
    else none. ``inria_ply``: the caller has read ``path`` as an INRIA PLY already (the loading frame's numpy
    preview, viewer/loading.py), so the file's header is not read again (that reader imports torch). The
    viewer's loading preview and its first view both take their up from here.
    """
    if box is None and model is not None:
        box = model_box(model)
    if box is not None and off_origin(*box):
        return "-y"
    if inria_ply:
        return "+z"
    path = os.fspath(path)
    if path.lower().endswith(".spz"):
        return "-y"
    try:
        with open(path, "rb") as f:
            magic = f.read(4)
        if magic == b"NGSP" or magic[:2] == b"\x1f\x8b":
            return "-y"
        if magic[:3] == b"ply":
            from rigel_core.io.compressed_ply import is_compressed_ply_header
            from rigel_core.io.ply import read_ply_header

            if is_compressed_ply_header(read_ply_header(path)):
                return "-y"
    except (OSError, ValueError):
        pass        # the loader reports unreadable files
    return "+z"


def model_box(model):
    """(lo (3,), hi (3,)) float64 numpy: ``model.bounds(0.01)``, the robust box of its finite means."""
    return tuple(t.detach().cpu().double().numpy() for t in model.bounds(0.01))


def off_origin(lo, hi) -> bool:
    """True when the box ``lo``–``hi`` (3-vectors) lies farther from the world origin than twice its own
    diagonal: a crop of a larger capture, whose first view looks from the origin's side
    (``Viewer._face_origin``) with up ``"-y"`` (:func:`default_up`)."""
    import numpy as np

    lo, hi = np.asarray(lo, np.float64), np.asarray(hi, np.float64)
    return float(np.linalg.norm(0.5 * (lo + hi))) > 2.0 * float(np.linalg.norm(hi - lo))
