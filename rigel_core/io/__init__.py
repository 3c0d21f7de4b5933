"""Scene file I/O: load a Gaussian scene from any supported file, save the INRIA PLY.

| file | detected by | reader |
|---|---|---|
| INRIA / graphdeco 3DGS PLY | ``ply`` magic, a ``vertex`` element without ``packed_*`` | :func:`load_ply` |
| PlayCanvas / SuperSplat compressed PLY | ``ply`` magic, elements ``chunk`` + ``vertex`` with ``packed_*`` | :func:`load_compressed_ply` |
| Niantic SPZ v2–v4 | ``NGSP`` magic (v4, or plain v2/v3) or gzip magic | :func:`load_spz` |
| antimatter15 ``.splat`` | extension ``.splat`` (no magic; size a multiple of 32) | :func:`load_splat` |
| rigel checkpoint | extension ``.pt`` / ``.pth`` / ``.ckpt`` / ``.safetensors`` | ``rigel_core.checkpoint.load_checkpoint_model`` |

Every scene comes back in rigel's conventions (DESIGN §3): pre-activation parameters, quaternions (w, x, y, z),
world axes as in the INRIA PLY / COLMAP (SPZ's RUB axes are converted on load).

:func:`save_scene` writes ``.ply``, ``.compressed.ply``, ``.spz`` or ``.splat`` by suffix (rigel_core.io.export).
"""
from __future__ import annotations

import os

import torch

from ..model import GaussianModel
from .compressed_ply import is_compressed_ply_header, load_compressed_ply
from .errors import PlyFormatError, SceneFormatError, SpzFormatError
from .ply import SceneWarning, load_ply, read_ply_header, save_ply
from .spz import load_spz
from .splat import load_splat
from .export import ExportError, save_scene

__all__ = ["load_scene", "load_ply", "load_compressed_ply", "load_spz", "save_ply", "PlyFormatError",
           "SpzFormatError", "SceneFormatError", "SceneWarning", "CHECKPOINT_SUFFIXES", "load_splat", "save_scene",
           "ExportError"]

CHECKPOINT_SUFFIXES = (".pt", ".pth", ".ckpt", ".safetensors")


def load_scene(path, device=None, dtype=torch.float32) -> GaussianModel:
    """Load a Gaussian scene, choosing the reader from the file's content (and, for checkpoints, its suffix;
    a file whose content is not recognised goes to the reader its suffix names, for a precise error).

    Args:
        path: a ``.ply`` (INRIA or PlayCanvas compressed), ``.spz``, ``.splat`` or rigel checkpoint file.
        device: torch device of the returned model (default CPU).
        dtype: floating dtype of the returned model (default float32).
    Returns: :class:`~rigel_core.model.GaussianModel`.
    Raises:
        SceneFormatError (a ValueError; PlyFormatError / SpzFormatError for those formats): unknown or malformed
            file. The message names the file. CheckpointError (a ValueError) for a damaged checkpoint.
        FileNotFoundError / IsADirectoryError / OSError: the path cannot be read.
    """
    path = os.fspath(path)
    if os.path.isdir(path):
        raise IsADirectoryError(f"{path}: is a directory, expected a scene file")
    if path.lower().endswith(CHECKPOINT_SUFFIXES):
        return _load_checkpoint(path, device, dtype)
    if path.lower().endswith(".splat"):  # no magic: by suffix, before the content tests
        return load_splat(path, device=device, dtype=dtype)
    with open(path, "rb") as f:
        magic = f.read(4)
    if magic[:3] == b"ply":
        header = read_ply_header(path)
        if is_compressed_ply_header(header):
            return load_compressed_ply(path, device=device, dtype=dtype)
        return load_ply(path, device=device, dtype=dtype)
    if magic == b"NGSP" or magic[:2] == b"\x1f\x8b":
        return load_spz(path, device=device, dtype=dtype)
    # Unrecognised content: let the reader the suffix names explain what is wrong with the file.
    if path.lower().endswith(".spz"):
        return load_spz(path, device=device, dtype=dtype)
    if path.lower().endswith(".ply"):
        return load_ply(path, device=device, dtype=dtype)
    what = "an empty file" if not magic else f"starts with {magic!r}"
    raise SceneFormatError(path, f"unknown scene format ({what}); expected a 3DGS .ply, a compressed .ply, an .spz, a .splat "
                                 f"or a rigel checkpoint ({', '.join(CHECKPOINT_SUFFIXES)})")


def _load_checkpoint(path: str, device, dtype) -> GaussianModel:
    """The model of a rigel training checkpoint (``rigel_core.checkpoint.load_checkpoint_model``)."""
    from ..checkpoint import load_checkpoint_model  # here: the checkpoint module pulls in the trainer's config

    return load_checkpoint_model(path).to(device=device, dtype=dtype)
