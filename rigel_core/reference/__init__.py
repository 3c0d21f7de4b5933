"""Pure-PyTorch reference of every rendering stage: the oracle the CUDA kernels are tested against and the
CPU backend of :func:`rigel_core.render`. float32 or float64, differentiable by autograd.

Each function has a CUDA twin of the same name in ``rigel_core._C`` (STYLE §6).
"""
from .binning import Binning, bin_gaussians, depth_bits, footprint_threshold, min_q_over_box
from .project import RENDER_MODES, Projection, check_render_mode, project_gaussians, quat_to_rotmat, tile_rects
from .rasterize import Raster, rasterize_tiles
from .sh import eval_sh, sh_basis, sh_colors

__all__ = ["Binning", "bin_gaussians", "depth_bits", "footprint_threshold", "min_q_over_box", "Projection",
           "project_gaussians", "quat_to_rotmat", "tile_rects", "RENDER_MODES", "check_render_mode", "Raster",
           "rasterize_tiles", "eval_sh", "sh_basis", "sh_colors", "render_reference"]


def render_reference(means3D, quats, scales, opacities, colors, viewmat, K, width, height, background=None,
                     near_plane=None, far_plane=None, render_mode="default"):
    """Project, bin and rasterize on the tensors' device with PyTorch ops; returns (Projection, Binning, Raster).

    In ``render_mode="mip"`` binning and rasterization see the compensated opacities
    ``opacities * proj.compensations`` (Mip-Splatting's 2D filter, :func:`project_gaussians`)."""
    from .. import config

    proj = project_gaussians(means3D, quats, scales, opacities, viewmat, K, width, height,
                             config.NEAR_PLANE if near_plane is None else near_plane,
                             config.FAR_PLANE if far_plane is None else far_plane, colors=colors,
                             render_mode=render_mode)
    if proj.compensations is not None:
        opacities = opacities * proj.compensations
    binning = bin_gaussians(proj.means2D, proj.conics, opacities, proj.depths, proj.radii, width, height)
    raster = rasterize_tiles(proj.means2D, proj.conics, colors, opacities, binning.gaussian_ids,
                             binning.tile_ranges, binning.tiles_x, binning.tiles_y, width, height, background)
    return proj, binning, raster
