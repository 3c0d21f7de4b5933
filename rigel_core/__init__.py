"""rigel_core — 3D Gaussian Splatting: cameras, the Gaussian model, rendering (CUDA kernels or the PyTorch
reference), scene and dataset I/O, and training.

Layout: ``renderer/`` the render stack (camera, the render API, the CUDA backend, render modes, mip filter, MLP
appearance), ``reference/`` its PyTorch twin (the CPU backend), ``model.py`` the Gaussians, ``io/`` scene files,
``data/`` datasets, ``train/`` training, ``cli/`` the commands; beside them the run services (``run_dir``,
``checkpoint``, ``atomic``, ``limits``, ``strict_json``, ``deps``, ``render_video``, ``camera_path``, ``edit``,
``depth_image``) and ``config.py`` (the constants of ``csrc/config.h``). The render stack's old module paths
(``rigel_core.camera``, ``rigel_core.render``, ``rigel_core.cuda_backend``, ``rigel_core.mip``,
``rigel_core.render_modes``, ``rigel_core.render_output``, ``rigel_core.appearance``) still import the same module
objects from ``renderer/`` (:data:`_MOVED`).

Conventions: ../docs/PIPELINE.md and DESIGN §3 (row-major world-to-camera, OpenCV camera axes, pixels).
"""
import sys as _sys
import types as _types

from . import config
from ._lazy import MovedModules as _MovedModules

__version__ = "0.1.0"
__all__ = ["config", "Camera", "GaussianModel", "RenderOutput", "rasterize_gaussians", "render", "compute_colors",
           "cuda_available"]

# The names that need PyTorch are imported on first use (PEP 562), so that the torch-free modules (run_dir, atomic,
# limits, config, io.errors, camera_path, cli.common's parser) load without the ~1.5 s of ``import torch``: the
# viewer presents its first frame before torch is imported (issue 18, tests/test_first_frame.py). A submodule is
# imported on first use of its name as well (``import rigel_core; rigel_core.camera``), as the eager imports of the
# names above once made it.
_LAZY = {"Camera": "renderer.camera", "GaussianModel": "model", "RenderOutput": "renderer.output",
         "compute_colors": "renderer.api", "rasterize_gaussians": "renderer.api", "render": "renderer.api"}


#: the render stack's modules that moved into renderer/ (issue 36): old name → new one, still importable by the old
#: name (rigel_core._lazy.MovedModules: the same module object, no file)
_MOVED = {"render": "renderer.api", "camera": "renderer.camera", "cuda_backend": "renderer.cuda_backend",
          "mip": "renderer.mip", "render_modes": "renderer.modes", "render_output": "renderer.output",
          "appearance": "renderer.appearance"}
# first: an editable install's finder of another checkout would find the old files there
_sys.meta_path.insert(0, _MovedModules(__name__, _MOVED))


def __getattr__(name):
    import importlib
    import importlib.util

    if name in _LAZY:
        value = getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
        globals()[name] = value
        return value
    if not name.startswith("__") and importlib.util.find_spec(f"{__name__}.{name}") is not None:
        importlib.import_module(f".{name}", __name__)   # the import system sets the package's attribute
        return globals()[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__():
    """The public names (the lazy ones too: :data:`__all__`) and the public submodules (the moved ones by their old
    names too), imported or not, with the module's dunder attributes; private names (``_ext``, ``_LAZY``) are left
    out."""
    import pkgutil

    names = set(_LAZY) | set(_MOVED) | {m.name for m in pkgutil.iter_modules(__path__)} | set(globals())
    return sorted(n for n in names if not n.startswith("_") or n.startswith("__"))


class _Package(_types.ModuleType):
    """``rigel_core.render`` is the function, as the eager ``from .render import render`` made it, also when the
    submodule ``rigel_core.render`` is imported first: the import system's ``setattr(package, "render", module)``
    stores the module's function instead."""

    def __setattr__(self, name, value):
        if name == "render" and isinstance(value, _types.ModuleType):
            value = value.render
        super().__setattr__(name, value)


_sys.modules[__name__].__class__ = _Package


def cuda_available() -> bool:
    """True when PyTorch sees a CUDA device and the compiled kernels are importable."""
    import torch

    from . import _ext

    return torch.cuda.is_available() and _ext.available()
