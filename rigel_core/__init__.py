"""rigel_core — 3D Gaussian Splatting: cameras, the Gaussian model, rendering (CUDA kernels or the PyTorch
reference), scene and dataset I/O, and training.

Conventions: ../docs/PIPELINE.md and DESIGN §3 (row-major world-to-camera, OpenCV camera axes, pixels).
"""
from . import config
from .camera import Camera
from .model import GaussianModel
from .render import RenderOutput, compute_colors, rasterize_gaussians, render

__version__ = "0.1.0"
__all__ = ["config", "Camera", "GaussianModel", "RenderOutput", "rasterize_gaussians", "render", "compute_colors",
           "cuda_available"]


def cuda_available() -> bool:
    """True when PyTorch sees a CUDA device and the compiled kernels are importable."""
    import torch

    from . import _ext

    return torch.cuda.is_available() and _ext.available()
