"""The one entry point of scene loading, :func:`load_scene`: the reader chosen from the file's content
(:mod:`rigel_core.io`'s table)."""
from __future__ import annotations

import os

import torch

from ..model import GaussianModel
from .compressed_ply import is_compressed_ply_header, load_compressed_ply
from .errors import SceneFormatError
from .ply import load_ply, read_ply_header
from .splat import load_splat
from .spz import load_spz

__all__ = ["load_scene", "CHECKPOINT_SUFFIXES"]

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
