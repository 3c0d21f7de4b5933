"""The render stack: a :class:`~rigel_core.model.GaussianModel` seen from a :class:`Camera` becomes an image.

| module | what |
|---|---|
| ``api.py`` | the API: :func:`render`, :func:`rasterize_gaussians`, :func:`compute_colors` — one API, two backends, chosen by the tensors' device (:func:`rigel_core._ext.use_kernels`) |
| ``camera.py`` | :class:`Camera` (``viewmat`` row-major world-to-camera, ``K`` in pixels, DESIGN §3) |
| ``cuda_backend.py`` | the CUDA backend: one ``torch.autograd.Function`` per kernel of ``rigel_core._C`` (``csrc/``) |
| ``output.py`` | :class:`RenderOutput`, what both backends return |
| ``modes.py`` | the render modes (``default``, ``mip``), torch-free |
| ``mip.py`` | the anti-aliased mode's 3D smoothing filter (Mip-Splatting) |
| ``appearance.py`` | the MLP colour model (``MLPAppearance``), the alternative to SH in the colour stage |

The CPU backend and oracle of every kernel is :mod:`rigel_core.reference`; the maths, docs/PIPELINE.md. The old
paths (``rigel_core.render``, ``rigel_core.camera``, ``rigel_core.cuda_backend``, …) import these same module
objects (``rigel_core._MOVED``). Like :mod:`rigel_core`, the package imports nothing until a name is used, so that ``modes``
loads without torch.
"""
from .._lazy import lazy_names

__all__ = ["render", "rasterize_gaussians", "compute_colors", "RenderOutput", "Camera"]

_LAZY = {"render": "api", "rasterize_gaussians": "api", "compute_colors": "api", "RenderOutput": "output",
         "Camera": "camera"}

__getattr__, __dir__ = lazy_names(__name__, _LAZY, globals())
