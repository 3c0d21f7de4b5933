"""CUDA backend of :func:`rigel_core.render`: the kernels of ``rigel_core._C`` behind autograd Functions.

Stages (docs/PIPELINE.md) and their Functions:

* ``_ProjectGaussians``   [1] means3D, quats, scales → means2D, conics, depths, radii (``csrc/project_*.cu``)
* ``_C.bin_gaussians``    [2] not differentiable (``csrc/binning.cu``)
* ``_RasterizeTiles``     [3] means2D, conics, colors, opacities → image, final_T, n_contrib (``csrc/rasterize_*.cu``)
* ``_RasterizeTilesDepth`` [3] the same + depths → expected depth (divided in the kernel), depth_median from the
  same pass (kernels' kDepth)
* ``_ShColors``           [0] SH coefficients, means3D → colours (``csrc/sh_*.cu``)
* ``_ShColorsSplit``      [0] the same from the model's two SH tensors sh_dc, sh_rest, never concatenated
* ``_MLPColors``          [0'] appearance latents, MLP, means3D → colours (``csrc/appearance.cu``;
  :mod:`rigel_core.renderer.appearance`)
* ``_SSIMMap``            the trainer's SSIM loss map (``csrc/ssim.cu``; :mod:`rigel_core.train.losses`)
* ``_PhotometricSums``    the trainer's whole loss in one pass: masked sums of |x − y|, SSIM, (x − y)², count
  (the same kernels' fused form; :func:`rigel_core.train.losses.loss_terms`)

Every kernel follows one template: host checks and binding in ``csrc/ops.cpp`` / ``csrc/ext.cpp`` (errors
``rigel_core._C.<op>: <argument> must be …``), one autograd Function here per stage, and one PyTorch reference
twin that the CPU takes (dispatch by the tensors' device: CUDA → these kernels, CPU → the reference).

Projection and rasterization are separate Functions, so ``RenderOutput.means2D`` is a differentiable
intermediate: ``out.means2D.retain_grad()`` gives ∂loss/∂means2D after ``backward()`` (densification), and the
raster backward also leaves ``out.means2D.absgrad`` (N,2): the per-pixel absolute gradients summed
(|∂loss/∂means2D| accumulator, as AbsGS uses). The kernels run in float32 (the projection internally in
float64); all tensors must be float32 on one CUDA device.
"""
from __future__ import annotations

import threading
import weakref

import torch

from .. import _ext, config
from .output import BinningOverflow, RenderOutput

__all__ = ["BinningOverflow", "FixedBinningCapacity", "rasterize_gaussians_cuda", "sh_colors_cuda",
           "sh_colors_split_cuda", "project_gaussians_cuda", "bin_gaussians_cuda",
           "rasterize_tiles_cuda", "mlp_colors_cuda", "ssim_map_cuda", "photometric_sums_cuda"]


def _f32(name: str, t: torch.Tensor, device: torch.device) -> torch.Tensor:
    """``t`` as a contiguous float32 tensor on ``device``; TypeError for another floating dtype (no silent cast)."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
    if t.dtype != torch.float32:
        raise TypeError(f"{name}: the CUDA kernels take float32 tensors, got {t.dtype} "
                        "(use the CPU reference backend for float64)")
    if t.device != device:
        raise ValueError(f"{name}: expected a tensor on {device}, got {t.device}")
    return t.contiguous()


class _ProjectGaussians(torch.autograd.Function):
    """[1] -> (means2D, conics, depths, radii, compensations); ``mip`` selects the anti-aliased mode, whose
    compensations (N,) are the 2D Mip filter's opacity factors (an empty (0,) tensor in the default mode)."""

    @staticmethod
    def forward(ctx, means3D, quats, scales, opacities, viewmat, K, width, height, near_plane, far_plane,
                colors=None, mip=False):
        C = _ext.get()
        n = means3D.shape[0]
        compensations = torch.empty(n if mip else 0, dtype=means3D.dtype, device=means3D.device)
        means2D, conics, depths, radii = C.project_gaussians(means3D, quats, scales, opacities, viewmat, K, width,
                                                             height, near_plane, far_plane, colors,
                                                             compensations if mip else None)
        ctx.save_for_backward(means3D, quats, scales, viewmat, K, radii)
        ctx.size = (width, height)
        ctx.mip = mip
        ctx.mark_non_differentiable(radii)
        if not mip:
            ctx.mark_non_differentiable(compensations)
        return means2D, conics, depths, radii, compensations

    @staticmethod
    def backward(ctx, v_means2D, v_conics, v_depths, _v_radii, v_compensations):
        means3D, quats, scales, viewmat, K, radii = ctx.saved_tensors

        n = means3D.shape[0]

        def grad(v, *shape):  # None when that output was not used
            return torch.zeros(n, *shape, dtype=means3D.dtype, device=means3D.device) if v is None else v.contiguous()

        # a pose being optimised (train/pose.py): each Gaussian's share [v_R | v_t] of the view-matrix gradient
        parts = torch.empty(n, 3, 4, dtype=means3D.dtype, device=means3D.device) if ctx.needs_input_grad[4] else None
        v_means3D, v_quats, v_scales = _ext.get().project_gaussians_backward(
            means3D, quats, scales, viewmat, K, ctx.size[0], ctx.size[1], radii, grad(v_means2D, 2),
            grad(v_conics, 3), grad(v_depths), grad(v_compensations) if ctx.mip else None, parts)
        v_viewmat = None
        if parts is not None:  # summed in float64 (millions of terms); the last row of viewmat is not read
            v_viewmat = torch.cat([parts.sum(0, dtype=torch.float64).to(means3D.dtype),
                                   torch.zeros(1, 4, dtype=means3D.dtype, device=means3D.device)])
        return v_means3D, v_quats, v_scales, None, v_viewmat, None, None, None, None, None, None, None


class _RasterizeTiles(torch.autograd.Function):
    @staticmethod
    def forward(ctx, means2D, conics, colors, opacities, background, gaussian_ids, tile_ranges, width, height, out):
        if out is None:
            dev = means2D.device
            image = torch.empty(height, width, 3, dtype=torch.float32, device=dev)
            final_T = torch.empty(height, width, dtype=torch.float32, device=dev)
            n_contrib = torch.empty(height, width, dtype=torch.int32, device=dev)
        else:
            image, final_T, n_contrib = out
        _ext.get().rasterize_tiles(means2D, conics, colors, opacities, gaussian_ids, tile_ranges, width, height,
                                   background, image, final_T, n_contrib)
        ctx.save_for_backward(means2D, conics, colors, opacities, background, gaussian_ids, tile_ranges, final_T,
                              n_contrib)
        ctx.size = (width, height)
        ctx.means2D_ref = weakref.ref(means2D)  # the caller's tensor, to hang the |gradient| accumulator on
        ctx.mark_non_differentiable(n_contrib)
        return image, final_T, n_contrib

    @staticmethod
    def backward(ctx, v_image, v_final_T, _v_n_contrib):
        means2D, conics, colors, opacities, background, gaussian_ids, tile_ranges, final_T, n_contrib = ctx.saved_tensors
        v_image = torch.zeros(*final_T.shape, 3, dtype=final_T.dtype, device=final_T.device) if v_image is None \
            else v_image.contiguous()
        v_final_T = torch.zeros_like(final_T) if v_final_T is None else v_final_T.contiguous()
        v_means2D, v_conics, v_colors, v_opacities, v_means2D_abs, _ = _ext.get().rasterize_tiles_backward(
            means2D, conics, colors, opacities, gaussian_ids, tile_ranges, ctx.size[0], ctx.size[1], background,
            final_T, n_contrib, v_image, v_final_T)
        caller_means2D = ctx.means2D_ref()
        if caller_means2D is not None:
            caller_means2D.absgrad = v_means2D_abs
        v_background = None
        if background is not None and ctx.needs_input_grad[4]:
            v_background = (v_image * final_T[..., None]).sum((0, 1))
        return v_means2D, v_conics, v_colors, v_opacities, v_background, None, None, None, None, None


class _RasterizeTilesDepth(torch.autograd.Function):
    """:class:`_RasterizeTiles` with the depth outputs (the kernels' kDepth instantiation): one pass gives image,
    final_T, n_contrib, depth = Σ wᵢzᵢ / (1 − final_T) (the expected depth, divided in the kernel; 0 where nothing
    was blended; differentiable w.r.t. depths and, through wᵢ and final_T, means2D, conics, opacities) and
    depth_median (not differentiable)."""

    @staticmethod
    def forward(ctx, means2D, conics, colors, opacities, depths, background, gaussian_ids, tile_ranges, width, height,
                out):
        dev = means2D.device
        if out is None:
            image = torch.empty(height, width, 3, dtype=torch.float32, device=dev)
            final_T = torch.empty(height, width, dtype=torch.float32, device=dev)
            n_contrib = torch.empty(height, width, dtype=torch.int32, device=dev)
        else:
            image, final_T, n_contrib = out
        depth = torch.empty(height, width, dtype=torch.float32, device=dev)
        depth_median = torch.empty(height, width, dtype=torch.float32, device=dev)
        _ext.get().rasterize_tiles(means2D, conics, colors, opacities, gaussian_ids, tile_ranges, width, height,
                                   background, image, final_T, n_contrib, depths, depth, depth_median)
        ctx.save_for_backward(means2D, conics, colors, opacities, depths, background, gaussian_ids, tile_ranges,
                              final_T, n_contrib, depth)
        ctx.size = (width, height)
        ctx.means2D_ref = weakref.ref(means2D)
        ctx.mark_non_differentiable(n_contrib, depth_median)
        return image, final_T, n_contrib, depth, depth_median

    @staticmethod
    def backward(ctx, v_image, v_final_T, _v_n_contrib, v_depth, _v_depth_median):
        (means2D, conics, colors, opacities, depths, background, gaussian_ids, tile_ranges, final_T,
         n_contrib, depth) = ctx.saved_tensors
        zeros = lambda *c: torch.zeros(*final_T.shape, *c, dtype=final_T.dtype, device=final_T.device)
        v_image = zeros(3) if v_image is None else v_image.contiguous()
        v_final_T = zeros() if v_final_T is None else v_final_T.contiguous()
        if v_depth is None:
            v_depth_sum = zeros()
        else:  # depth = S / A with S = Σ wᵢzᵢ, A = 1 − final_T (0 where A = 0): ∂/∂S = 1/A, ∂/∂final_T = depth / A
            acc = 1.0 - final_T
            inv = torch.where(acc > 0, 1.0 / torch.where(acc > 0, acc, 1.0), 0.0)
            v_depth_sum = (v_depth * inv).contiguous()
            v_final_T = (v_final_T + v_depth_sum * depth).contiguous()
        v_means2D, v_conics, v_colors, v_opacities, v_means2D_abs, v_depths = _ext.get().rasterize_tiles_backward(
            means2D, conics, colors, opacities, gaussian_ids, tile_ranges, ctx.size[0], ctx.size[1], background,
            final_T, n_contrib, v_image, v_final_T, depths, v_depth_sum)
        caller_means2D = ctx.means2D_ref()
        if caller_means2D is not None:
            caller_means2D.absgrad = v_means2D_abs
        v_background = None
        if background is not None and ctx.needs_input_grad[5]:
            v_background = (v_image * final_T[..., None]).sum((0, 1))
        return v_means2D, v_conics, v_colors, v_opacities, v_depths, v_background, None, None, None, None, None


def _campos_grad(ctx, index: int, v_means3D: torch.Tensor):
    """The SH colours depend on the camera centre only through ``dir = normalize(mean − campos)``, so its gradient is
    minus the sum of the means' (whose SH gradient is that same direction term): (3,), or None when ``campos``
    (argument ``index``) needs none (a pose being optimised needs it: train/pose.py)."""
    return -v_means3D.sum(0, dtype=torch.float64).to(v_means3D.dtype) if ctx.needs_input_grad[index] else None


class _ShColors(torch.autograd.Function):
    @staticmethod
    def forward(ctx, degree, sh_coeffs, means3D, campos):
        colors = _ext.get().sh_colors(degree, sh_coeffs, means3D, campos)
        ctx.save_for_backward(sh_coeffs, means3D, campos)
        ctx.degree = degree
        return colors

    @staticmethod
    def backward(ctx, v_colors):
        sh_coeffs, means3D, campos = ctx.saved_tensors
        v_sh_coeffs, v_means3D = _ext.get().sh_colors_backward(ctx.degree, sh_coeffs, means3D, campos,
                                                               v_colors.contiguous())
        return None, v_sh_coeffs, v_means3D, _campos_grad(ctx, 3, v_means3D)


class _ShColorsSplit(torch.autograd.Function):
    """[0] from sh_dc (N,1,3) and sh_rest (N,K-1,3) in place of their concatenation: the kernels read both and the
    backward writes their gradients directly (no (N,K,3) copy forward, no split of its gradient backward)."""

    @staticmethod
    def forward(ctx, degree, sh_dc, sh_rest, means3D, campos):
        colors = _ext.get().sh_colors_split(degree, sh_dc, sh_rest, means3D, campos)
        ctx.save_for_backward(sh_dc, sh_rest, means3D, campos)
        ctx.degree = degree
        return colors

    @staticmethod
    def backward(ctx, v_colors):
        sh_dc, sh_rest, means3D, campos = ctx.saved_tensors
        v_sh_dc, v_sh_rest, v_means3D = _ext.get().sh_colors_split_backward(ctx.degree, sh_dc, sh_rest, means3D,
                                                                            campos, v_colors.contiguous())
        return None, v_sh_dc, v_sh_rest, v_means3D, _campos_grad(ctx, 4, v_means3D)


def project_gaussians_cuda(means3D, quats, scales, opacities, viewmat, K, width: int, height: int,
                           near_plane: float = config.NEAR_PLANE, far_plane: float = config.FAR_PLANE, colors=None,
                           render_mode: str = "default"):
    """[1] Projection on the GPU, differentiable w.r.t. means3D, quats, scales and viewmat (the last only computed
    when it requires grad: a pose being optimised, docs/PIPELINE.md "Pose gradients").

    Shapes as :func:`rigel_core.reference.project_gaussians`; returns (means2D (N,2), conics (N,3), depths (N,),
    radii (N,) int32), culled Gaussians with radius 0 and zeros. ``colors`` (N,C) or None is only checked for
    finiteness: a Gaussian with any non-finite parameter is culled (docs/PIPELINE.md "Non-finite parameters").
    ``render_mode="mip"`` (Mip-Splatting's 2D filter) appends compensations (N,), differentiable, 0 when culled.
    """
    from ..reference.project import check_render_mode

    mip = check_render_mode(render_mode) == "mip"
    dev = means3D.device
    args = [_f32(n, t, dev) for n, t in (("means3D", means3D), ("quats", quats), ("scales", scales),
                                         ("opacities", opacities), ("viewmat", viewmat), ("K", K))]
    cols = None if colors is None else _f32("colors", colors.detach(), dev)
    out = _ProjectGaussians.apply(*args, int(width), int(height), float(near_plane), float(far_plane), cols, mip)
    return out if mip else out[:4]


class FixedBinningCapacity:
    """Context in which the CUDA binning of this thread runs with a fixed entry ``capacity`` and no device→host read
    (``_C.bin_gaussians_fixed``), so that a whole training step can be captured in a CUDA graph (issue 14).

    Each binning inside appends its device-side entry count ((1,) int64) to ``totals``; a frame whose count exceeds
    ``capacity`` dropped entries (its image is incomplete), which the caller detects from ``totals`` on the device
    (:func:`rigel_core.train.graph_step`) and discards. Raises ValueError for a capacity outside [0, MAX_ENTRIES]."""

    _local = threading.local()

    def __init__(self, capacity: int):
        capacity = int(capacity)
        if not 0 <= capacity <= config.MAX_ENTRIES:
            raise ValueError(f"binning capacity must be in [0, {config.MAX_ENTRIES:,}], got {capacity:,}")
        self.capacity = capacity
        self.totals: list[torch.Tensor] = []

    def __enter__(self):
        self._prev = getattr(self._local, "active", None)
        self._local.active = self
        return self

    def __exit__(self, *exc):
        self._local.active = self._prev
        return False

    @classmethod
    def current(cls):
        return getattr(cls._local, "active", None)


def bin_gaussians_cuda(means2D, conics, opacities, depths, radii, width: int, height: int,
                       max_entries: int | None = None):
    """[2] Binning on the GPU (not differentiable): (keys (E,) int64, gaussian_ids (E,) int32,
    tile_ranges (n_tiles,2) int32, tiles_touched (N,) int32). Raises :class:`BinningOverflow` (a RuntimeError)
    when E > ``max_entries`` (None: ``config.MAX_ENTRIES``, read at the call).
    Inside a :class:`FixedBinningCapacity` context E is that capacity (padding past every tile range at the end)
    and nothing is read back."""
    args = (means2D.detach().contiguous(), conics.detach().contiguous(), opacities.detach().contiguous(),
            depths.detach().contiguous(), radii.contiguous(), int(width), int(height))
    fixed = FixedBinningCapacity.current()
    if fixed is not None:
        keys, gaussian_ids, tile_ranges, tiles_touched, total = _ext.get().bin_gaussians_fixed(*args,
                                                                                               fixed.capacity)
        fixed.totals.append(total)
        return keys, gaussian_ids, tile_ranges, tiles_touched
    max_entries = config.MAX_ENTRIES if max_entries is None else int(max_entries)
    keys, gaussian_ids, tile_ranges, tiles_touched, n_entries = _ext.get().bin_gaussians(*args, max_entries)
    if n_entries > max_entries:  # refused by the kernel side before allocating anything of that size
        raise BinningOverflow(n_entries, max_entries, tiles_touched)
    return keys, gaussian_ids, tile_ranges, tiles_touched


def rasterize_tiles_cuda(means2D, conics, colors, opacities, gaussian_ids, tile_ranges, width: int, height: int,
                         background=None, out=None, depths=None):
    """[3] Rasterization on the GPU, differentiable w.r.t. means2D, conics, colors, opacities, background.

    Returns (image (H,W,3), final_T (H,W), n_contrib (H,W) int32), written into ``out`` when given. With
    ``depths`` (N,) (the projection's camera-space z) the same kernel pass also returns depth (H,W) = the expected
    depth Σ wᵢzᵢ / (1 − final_T), 0 where nothing was blended (differentiable, also w.r.t. depths) and depth_median (H,W) (z where T crosses ½, 0 if never; no gradient):
    a 5-tuple. See :func:`rigel_core.reference.rasterize_tiles`.
    """
    dev = means2D.device
    if out is not None:
        out = tuple(out)
        if len(out) != 3:
            raise ValueError(f"out: expected (image, final_T, n_contrib), got {len(out)} tensors")
    bg = None if background is None else _f32("background", background, dev)
    if depths is not None:
        return _RasterizeTilesDepth.apply(_f32("means2D", means2D, dev), _f32("conics", conics, dev),
                                          _f32("colors", colors, dev), _f32("opacities", opacities, dev),
                                          _f32("depths", depths, dev), bg, gaussian_ids.contiguous(),
                                          tile_ranges.contiguous(), int(width), int(height), out)
    return _RasterizeTiles.apply(_f32("means2D", means2D, dev), _f32("conics", conics, dev),
                                 _f32("colors", colors, dev), _f32("opacities", opacities, dev), bg,
                                 gaussian_ids.contiguous(), tile_ranges.contiguous(), int(width), int(height), out)


def rasterize_gaussians_cuda(means3D, quats, scales, opacities, colors, viewmat, K, width: int, height: int, *,
                             background=None, near_plane: float = config.NEAR_PLANE,
                             far_plane: float = config.FAR_PLANE, out=None,
                             render_mode: str = "default", depth: bool = False) -> RenderOutput:
    """Render activated Gaussians with the CUDA kernels (project → bin → rasterize); see
    :func:`rigel_core.renderer.api.rasterize_gaussians` for the arguments.

    float32 CUDA tensors only (TypeError otherwise). One device→host synchronisation per call (the entry count).
    ``out`` = (image (H,W,3) float32, final_T (H,W) float32, n_contrib (H,W) int32) contiguous CUDA tensors are
    written in place and returned; when gradients are taken, ``final_T`` is read again by the backward pass, so
    do not overwrite ``out`` between forward and backward.
    Raises: TypeError/ValueError for wrong dtypes, devices or shapes (from here or from ``rigel_core._C``);
    :class:`BinningOverflow` (a RuntimeError) when more than ``config.MAX_ENTRIES`` (Gaussian, tile) entries are
    needed.
    """
    proj = project_gaussians_cuda(means3D, quats, scales, opacities, viewmat, K, width, height, near_plane,
                                  far_plane, colors, render_mode)
    means2D, conics, depths, radii = proj[:4]
    if len(proj) == 5:  # mip: binning and rasterization see the compensated opacities
        opacities = opacities * proj[4]
    keys, gaussian_ids, tile_ranges, tiles_touched = bin_gaussians_cuda(means2D, conics, opacities, depths, radii,
                                                                        width, height)
    raster = rasterize_tiles_cuda(means2D, conics, colors, opacities, gaussian_ids, tile_ranges, width, height,
                                  background, out, depths if depth else None)
    image, final_T, n_contrib = raster[:3]
    depth_out = median = None
    if depth:
        depth_out, median = raster[3], raster[4]   # the kernel divides: no pass over the image after it
    return RenderOutput(image, final_T, n_contrib, radii, means2D, depths, conics, tiles_touched, int(keys.numel()),
                        gaussian_ids, tile_ranges, depth_out, median)


def sh_colors_cuda(degree: int, sh_coeffs, means3D, campos) -> torch.Tensor:
    """[0] View-dependent colours (N,3) ``max(SH(dir)·coeffs + 0.5, 0)``, ``dir = normalize(mean − campos)``.

    Args: degree 0..3; sh_coeffs (N,K,3) with K ≥ (degree+1)²; means3D (N,3); campos (3,): float32 CUDA.
    Differentiable w.r.t. sh_coeffs and means3D. Raises ValueError for a degree outside 0..3 or too few
    coefficients, TypeError for non-float32 tensors. Math: rigel_core/reference/sh.py (same basis).
    """
    degree = int(degree)
    if not 0 <= degree <= 3:
        raise ValueError(f"SH degree must be in 0..3, got {degree}")
    dev = means3D.device
    return _ShColors.apply(degree, _f32("sh_coeffs", sh_coeffs, dev), _f32("means3D", means3D, dev),
                           _f32("campos", campos, dev).reshape(3))


def sh_colors_split_cuda(degree: int, sh_dc, sh_rest, means3D, campos) -> torch.Tensor:
    """[0] :func:`sh_colors_cuda` of ``torch.cat([sh_dc, sh_rest], dim=1)`` without building that tensor.

    Args: degree 0..3; sh_dc (N,1,3) the DC coefficients; sh_rest (N,K-1,3) the others (K ≥ (degree+1)², K = 1:
    an (N,0,3) tensor); means3D (N,3); campos (3,): float32 CUDA — the :class:`~rigel_core.model.GaussianModel`
    parameters as they are. Differentiable w.r.t. sh_dc, sh_rest and means3D. Colours and gradients are bitwise
    those of :func:`sh_colors_cuda` on the concatenation (the kernels stage both tensors into the same shared
    rows, csrc/sh_common.cuh ``sh_stage_rows``); what it saves is the concatenation's copy in the forward and the
    split of its gradient in the backward (docs/PIPELINE.md [0]). Non-contiguous inputs are copied first. Raises
    ValueError for a degree outside 0..3, too few coefficients or mismatched shapes, TypeError for non-float32
    tensors. Math: rigel_core/reference/sh.py (same basis).
    """
    degree = int(degree)
    if not 0 <= degree <= 3:
        raise ValueError(f"SH degree must be in 0..3, got {degree}")
    dev = means3D.device
    return _ShColorsSplit.apply(degree, _f32("sh_dc", sh_dc, dev), _f32("sh_rest", sh_rest, dev),
                                _f32("means3D", means3D, dev), _f32("campos", campos, dev).reshape(3))


# ---- fused appearance MLP and SSIM loss: the same template (ops.cpp checks, one Function per stage) ----------
class _MLPColors(torch.autograd.Function):
    """Appearance colours (csrc/appearance.cu); twin: :func:`rigel_core.renderer.appearance.reference_forward` /
    ``reference_backward``."""

    @staticmethod
    def forward(ctx, latents, means3D, campos, W1, b1, W2, b2):
        colors = _ext.get().mlp_colors(latents, means3D, campos, W1, b1, W2, b2)
        ctx.save_for_backward(latents, means3D, campos, W1, b1, W2, b2, colors)
        return colors

    @staticmethod
    def backward(ctx, v_colors):
        latents, means3D, campos, W1, b1, W2, b2, colors = ctx.saved_tensors
        need_means = ctx.needs_input_grad[1] or ctx.needs_input_grad[2]
        v_latents, v_means, v_W1, v_b1, v_W2, v_b2 = _ext.get().mlp_colors_backward(
            latents, means3D, campos, W1, b1, W2, b2, colors, v_colors.contiguous(), need_means)
        v_campos = -v_means.sum(0) if ctx.needs_input_grad[2] else None
        return v_latents, v_means if ctx.needs_input_grad[1] else None, v_campos, v_W1, v_b1, v_W2, v_b2


def mlp_colors_cuda(latents, means3D, campos, W1, b1, W2, b2) -> torch.Tensor:
    """Appearance colours (N,3) on the GPU, differentiable w.r.t. every input (``campos`` gets
    ``−Σ_g ∂L/∂mean_g``). Shapes and the model: :func:`rigel_core.renderer.appearance.mlp_colors`; float32 tensors
    on one CUDA device (TypeError otherwise, as every kernel here)."""
    dev = latents.device
    args = [_f32(n, t, dev) for n, t in (("latents", latents), ("means3D", means3D), ("campos", campos),
                                         ("W1", W1), ("b1", b1), ("W2", W2), ("b2", b2))]
    return _MLPColors.apply(*args)


class _SSIMMap(torch.autograd.Function):
    """SSIM map (csrc/ssim.cu) of (pred, target), gradient to ``pred`` only; twin:
    :func:`rigel_core.train.losses.ssim_map_reference`."""

    @staticmethod
    def forward(ctx, pred, target):
        smap, coef = _ext.get().ssim_map(pred, target)
        ctx.save_for_backward(pred, target, coef)
        return smap

    @staticmethod
    def backward(ctx, v_map):
        if not ctx.needs_input_grad[0]:
            return None, None
        pred, target, coef = ctx.saved_tensors
        return _ext.get().ssim_map_backward(pred, target, coef, v_map.to(torch.float32).contiguous()), None


def ssim_map_cuda(pred, target) -> torch.Tensor:
    """Per-pixel SSIM of two (H, W, C) or (B, H, W, C) float32 CUDA images, in their channels-last layout (same
    shape as ``pred``), by the fused kernels; differentiable w.r.t. ``pred`` only (``target`` is detached).

    The contract of :func:`rigel_core.train.losses.ssim_map` with its defaults: Wang et al. 2004, eq. 13, an
    11×11 Gaussian window of σ = 1.5 (separable, normalised in float64), zero "same" padding by 5 px,
    C1 = 0.01², C2 = 0.03². The kernels compute in float64 and store the map in float32.

    Gradient (``pred`` = x; ``target`` = y is a constant). With μ1 = w⋆x, σ1² = w⋆x² − μ1², σ12 = w⋆(xy) − μ1μ2
    (w the window, ⋆ correlation over in-image pixels) and S = (2μ1μ2+C1)(2σ12+C2) / ((μ1²+μ2²+C1)(σ1²+σ2²+C2))
    = n1·n2 / (d1·d2), per pixel p:

        ∂S/∂μ1 = 2(μ2·n2 − μ1·S·d2) / (d1·d2),   ∂S/∂σ1² = −S / d2,   ∂S/∂σ12 = 2·n1 / (d1·d2).

    Since ∂μ1(p)/∂x(q) = w(p−q), ∂σ1²(p)/∂x(q) = 2w(p−q)(x(q) − μ1(p)), ∂σ12(p)/∂x(q) = w(p−q)(y(q) − μ2(p)),
    an upstream gradient g(p) gives

        ∂L/∂x(q) = [w⋆(g·A)](q) + 2·x(q)·[w⋆(g·B)](q) + y(q)·[w⋆(g·Cc)](q),
        A = ∂S/∂μ1 − 2μ1·∂S/∂σ1² − μ2·∂S/∂σ12,   B = ∂S/∂σ1²,   Cc = ∂S/∂σ12,

    summing only over in-image p (the window is symmetric, so correlation = convolution). The forward stores A, B,
    Cc per pixel (float64: A and 2x·B cancel on flat regions, where they are ~1/C2 ≈ 1100 times the result).
    Non-contiguous inputs are copied. Raises TypeError / ValueError (the kernels' host checks) for other dtypes,
    shapes, or images too large for the grid (B·C > 65535).
    """
    dev = pred.device
    return _SSIMMap.apply(_f32("pred", pred, dev), _f32("target", target.detach(), dev))


class _PhotometricSums(torch.autograd.Function):
    """(4,) float64 sums of the fused loss (csrc/ssim.cu), gradient to ``pred`` only; twin: the masked
    :func:`rigel_core.train.losses.l1_loss`, :func:`~rigel_core.train.losses.ssim` and
    :func:`~rigel_core.train.losses.mse` (times their count)."""

    @staticmethod
    def forward(ctx, pred, target, mask, fp32):
        totals, coef = _ext.get().photometric_sums(pred, target, mask, fp32=fp32)
        ctx.save_for_backward(pred, target, mask, coef)
        return totals

    @staticmethod
    def backward(ctx, v_totals):
        if not ctx.needs_input_grad[0]:
            return None, None, None, None
        pred, target, mask, coef = ctx.saved_tensors
        v = _ext.get().photometric_sums_backward(pred, target, mask, coef, v_totals.to(torch.float64).contiguous())
        return v, None, None, None


def photometric_sums_cuda(pred, target, mask=None, fp32: bool = False) -> torch.Tensor:
    """The trainer's loss terms of two (H, W, C) or (B, H, W, C) float32 CUDA images in one pass of the SSIM
    kernels: a (4,) float64 tensor ``(Σ m|x − y|, Σ m·S, Σ m(x − y)², Σ m)`` over every element (pixel and channel),
    x = ``pred``, y = ``target``, S the SSIM map of :func:`ssim_map_cuda` and m the pixel's ``mask`` value (bool
    (H, W) or (B, H, W); None: every pixel counts). Where the mask is false both images read as 0 before anything
    is computed (:func:`rigel_core.train.losses.apply_mask`'s rule), so a masked-out pixel's value has no effect on
    the sums or on any gradient. Differentiable w.r.t. ``pred`` only: with v = ∂L/∂(the sums),
    ∂L/∂x(q) = m(q)·(v₀·sign(x − y) + [the SSIM gradient of :func:`ssim_map_cuda` with g(p) = v₁·m(p)] + 2v₂(x − y))
    (sign(0) = 0, as autograd's |·|). The sums are float64 atomics, one per block: their last bits may differ
    between runs. ``fp32``: the float32 kernels (csrc/ssim.cu, "the fused loss in float32": every block subtracts
    one value per image before filtering, so the moments and the backward's sum cancel small terms, not large
    ones; TrainConfig.loss_float32) instead of the float64 ones. Raises as :func:`ssim_map_cuda`; ``mask`` must be
    bool of the images' (B,) H, W."""
    dev = pred.device
    if mask is not None:
        if mask.dtype != torch.bool:
            raise TypeError(f"mask: expected a bool tensor, got {mask.dtype}")
        mask = mask.to(dev).contiguous()
    return _PhotometricSums.apply(_f32("pred", pred, dev), _f32("target", target.detach(), dev), mask, bool(fp32))
