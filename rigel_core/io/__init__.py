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

from .._lazy import lazy_names

__all__ = ["load_scene", "load_ply", "load_compressed_ply", "load_spz", "save_ply", "PlyFormatError",
           "SpzFormatError", "SceneFormatError", "SceneWarning", "CHECKPOINT_SUFFIXES", "load_splat", "save_scene",
           "ExportError"]

# The names are imported on first use (PEP 562, as in rigel_core), so that the torch-free readers (the PLY's numpy
# part, rigel_core.io.ply.read_ply_arrays; the errors) load without ``import torch``: the viewer's loading frame
# previews the scene before torch is imported (viewer/loading.py).
_LAZY = {"load_scene": "load", "CHECKPOINT_SUFFIXES": "load", "load_ply": "ply", "save_ply": "ply",
         "read_ply_header": "ply", "SceneWarning": "ply", "load_compressed_ply": "compressed_ply",
         "load_spz": "spz", "load_splat": "splat", "save_scene": "export", "ExportError": "export",
         "PlyFormatError": "errors", "SpzFormatError": "errors", "SceneFormatError": "errors"}

__getattr__, __dir__ = lazy_names(__name__, _LAZY, globals())
