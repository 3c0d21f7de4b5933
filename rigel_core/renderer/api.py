"""``render`` and ``rasterize_gaussians``: one API, two backends.

CUDA tensors go to the kernels of ``rigel_core._C`` (through the autograd Functions of
``rigel_core.renderer.cuda_backend``); CPU tensors go to :mod:`rigel_core.reference` (the one rule:
:func:`rigel_core._ext.use_kernels`). Same guards, same outputs.
"""
from __future__ import annotations

import torch

from .. import config
from .._ext import use_kernels
from .camera import Camera
from .output import RenderOutput  # defined apart so that cuda_backend needs no import of render

__all__ = ["RenderOutput", "rasterize_gaussians", "render", "compute_colors"]


def _check_inputs(means3D, quats, scales, opacities, colors, viewmat, K, width, height):
    n = means3D.shape[0] if means3D.dim() == 2 else -1
    expect = {"means3D": (means3D, (n, 3)), "quats": (quats, (n, 4)), "scales": (scales, (n, 3)),
              "opacities": (opacities, (n,)), "viewmat": (viewmat, (4, 4)), "K": (K, (3, 3))}
    for name, (t, shape) in expect.items():
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
        if tuple(t.shape) != shape:
            raise ValueError(f"{name}: expected shape {shape}, got {tuple(t.shape)}")
    if colors.dim() != 2 or colors.shape[0] != n:
        raise ValueError(f"colors: expected shape ({n}, C), got {tuple(colors.shape)}")
    if int(width) <= 0 or int(height) <= 0:
        raise ValueError(f"image size must be positive, got {width}x{height}")
    devs = {t.device for t in (means3D, quats, scales, opacities, colors)}
    if len(devs) != 1:
        raise ValueError(f"per-Gaussian tensors must be on one device, got {devs}")


def rasterize_gaussians(means3D, quats, scales, opacities, colors, viewmat, K, width: int, height: int, *,
                        background=None, near_plane: float = config.NEAR_PLANE,
                        far_plane: float = config.FAR_PLANE, out=None, render_mode: str = "default",
                        depth: bool = False) -> RenderOutput:
    """Render activated Gaussians (docs/PIPELINE.md) — differentiable w.r.t. every float input.

    Args:
        means3D (N,3), quats (N,4) (w,x,y,z, any norm), scales (N,3) (> 0), opacities (N,) in [0,1],
        colors (N,3): one floating dtype and device (CUDA → kernels, CPU → reference; float32 or float64 on CPU).
        viewmat (4,4) row-major world-to-camera (OpenCV: x right, y down, z forward); K (3,3) pixels.
        width, height: pixels. background: (3,) tensor/sequence or None (black).
        near_plane, far_plane: camera-space depth limits (world units).
        out: optional (image (H,W,3), final_T (H,W), n_contrib (H,W) int32) tensors written in place
             (the viewer passes views of its frame buffers); they are also the returned tensors.
        render_mode: "default" (LOWPASS dilation) or "mip" (the anti-aliased mode's 2D Mip filter with opacity
             compensation, Mip-Splatting eq. 9; docs/PIPELINE.md "Anti-aliased mode"). The 3D smoothing filter is
             the caller's (``render`` applies the model's; :func:`rigel_core.renderer.mip.apply_3d_filter`).
        depth: also return ``depth`` (expected) and ``depth_median`` (H,W), computed in the same rasterization
             pass as the colour (the colour outputs are unchanged).
    Returns: :class:`RenderOutput`.
    Raises: TypeError/ValueError for wrong types, shapes or devices, or an unknown render_mode; RuntimeError when
        the image needs more than ``config.MAX_ENTRIES`` duplicated entries, or CUDA tensors are given and the kernels are not built.
    """
    _check_inputs(means3D, quats, scales, opacities, colors, viewmat, K, width, height)
    from ..reference.project import check_render_mode

    check_render_mode(render_mode)
    width, height = int(width), int(height)
    dev, dtype = means3D.device, means3D.dtype
    if background is not None:
        if isinstance(background, torch.Tensor):
            background = background.to(dev, dtype).reshape(-1)
        else:  # a sequence of floats: no synchronising copy from pageable memory
            from .camera import host_to_device

            background = host_to_device(background, dev, dtype).reshape(-1)
        if background.shape[0] != colors.shape[1]:
            raise ValueError(f"background: expected {colors.shape[1]} channels, got {background.shape[0]}")
    if use_kernels(means3D):
        from .cuda_backend import rasterize_gaussians_cuda

        return rasterize_gaussians_cuda(means3D, quats, scales, opacities, colors, viewmat.to(dev), K.to(dev),
                                        width, height, background=background, near_plane=near_plane,
                                        far_plane=far_plane, out=out, render_mode=render_mode, depth=depth)
    from ..reference import expected_depth, render_reference

    proj, binning, raster = render_reference(means3D, quats, scales, opacities, colors, viewmat.to(dev), K.to(dev),
                                             width, height, background, near_plane, far_plane, render_mode,
                                             depth=bool(depth))
    image, final_T, n_contrib = raster[:3]
    depth_out = median = None
    if depth:
        depth_out, median = expected_depth(raster.depth_sum, raster.final_T), raster.depth_median
    if out is not None:
        with torch.no_grad():
            out[0].copy_(image)
            out[1].copy_(final_T)
            out[2].copy_(n_contrib)
        image, final_T, n_contrib = out
    return RenderOutput(image, final_T, n_contrib, proj.radii, proj.means2D, proj.depths, proj.conics,
                        binning.tiles_touched, int(binning.keys.numel()), binning.gaussian_ids, binning.tile_ranges,
                        depth_out, median)


def compute_colors(model, camera: Camera, sh_degree: int | None = None) -> torch.Tensor:
    """(N,3) view-dependent colours of ``model`` seen from ``camera``: its appearance module if it has one,
    else SH of degree ``sh_degree`` (default ``model.active_sh_degree``) — DESIGN §3."""
    campos = camera.campos_tensor(model.device, model.dtype)
    if getattr(model, "appearance", None) is not None:
        return model.appearance(model, campos)
    degree = model.active_sh_degree if sh_degree is None else sh_degree
    degree = min(degree, model.sh_degree)
    if use_kernels(model.means3D):
        from .cuda_backend import sh_colors_cuda, sh_colors_split_cuda

        sh_dc, sh_rest = getattr(model, "sh_dc", None), getattr(model, "sh_rest", None)
        if sh_dc is not None and sh_rest is not None:  # the parameters themselves: no torch.cat per call
            return sh_colors_split_cuda(degree, sh_dc, sh_rest, model.means3D, campos)
        return sh_colors_cuda(degree, model.sh_coeffs, model.means3D, campos)
    from ..reference import sh_colors

    return sh_colors(degree, model.sh_coeffs, model.means3D, campos)


def render(model, camera: Camera, *, background=None, sh_degree: int | None = None,
           near_plane: float = config.NEAR_PLANE, far_plane: float = config.FAR_PLANE, out=None,
           render_mode: str | None = None, depth: bool = False) -> RenderOutput:
    """Render a :class:`~rigel_core.model.GaussianModel` from a :class:`~rigel_core.renderer.camera.Camera`.

    Activations (exp scales, sigmoid opacities, quaternion normalisation, and in the mip mode the 3D smoothing
    filter of ``model.filter_3D``, :mod:`rigel_core.renderer.mip`) and the appearance stage run here, so gradients reach
    the model's pre-activation parameters. ``render_mode`` None: the model's own (``model.render_mode``, read
    from the PLY header). See :func:`rasterize_gaussians`.
    """
    from .mip import effective_scales_opacities

    mode = getattr(model, "render_mode", "default") if render_mode is None else render_mode
    colors = compute_colors(model, camera, sh_degree)
    dev, dtype = model.device, model.dtype
    scales, opacities = effective_scales_opacities(model, mode)
    return rasterize_gaussians(model.means3D, model.quats, scales, opacities, colors,
                               camera.viewmat_tensor(dev, dtype), camera.K_tensor(dev, dtype),
                               camera.width, camera.height, background=background, near_plane=near_plane,
                               far_plane=far_plane, out=out, render_mode=mode, depth=depth)
