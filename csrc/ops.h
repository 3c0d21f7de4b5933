// The operations rigel_core._C exposes, each the CUDA twin of the rigel_core.reference function of the same
// name (docs/PIPELINE.md). ops.cpp checks every argument (device, dtype, contiguity, shape) with an error
// saying what was expected, allocates the outputs and calls the launchers of launch.h.
#pragma once

#include <tuple>
#include <vector>

#include <ATen/ATen.h>
#include <c10/util/Optional.h>

namespace rigel {

// [1] -> (means2D [N,2], conics [N,3], depths [N], radii [N] int32); colors [N,C] (optional) are only checked
// for finiteness (the cull rule: any non-finite parameter culls the Gaussian). compensations [N] (optional, written
// in place): when given, the anti-aliased (mip) mode — MIP_FILTER_2D replaces LOWPASS and the opacity
// compensation sqrt(det(cov2D) / det(cov2D + MIP_FILTER_2D I)) is written there (0 for culled Gaussians).
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> project_gaussians(
    const at::Tensor& means3D, const at::Tensor& quats, const at::Tensor& scales, const at::Tensor& opacities,
    const at::Tensor& viewmat, const at::Tensor& K, int64_t width, int64_t height, double near_plane,
    double far_plane, const c10::optional<at::Tensor>& colors,
    const c10::optional<at::Tensor>& compensations = c10::nullopt);

// [1] backward -> (v_means3D [N,3], v_quats [N,4], v_scales [N,3]); v_compensations [N] (optional): when given,
// the mip mode's backward; v_viewmat_parts [N,3,4] (optional, written in place): each Gaussian's share of the
// view-matrix gradient [v_R | v_t].
std::tuple<at::Tensor, at::Tensor, at::Tensor> project_gaussians_backward(
    const at::Tensor& means3D, const at::Tensor& quats, const at::Tensor& scales, const at::Tensor& viewmat,
    const at::Tensor& K, int64_t width, int64_t height, const at::Tensor& radii, const at::Tensor& v_means2D,
    const at::Tensor& v_conics, const at::Tensor& v_depths,
    const c10::optional<at::Tensor>& v_compensations = c10::nullopt,
    const c10::optional<at::Tensor>& v_viewmat_parts = c10::nullopt);

// [0] -> colors [N,3]
at::Tensor sh_colors(int64_t degree, const at::Tensor& sh_coeffs, const at::Tensor& means3D, const at::Tensor& campos);

// [0] backward -> (v_sh_coeffs [N,K,3], v_means3D [N,3])
std::tuple<at::Tensor, at::Tensor> sh_colors_backward(int64_t degree, const at::Tensor& sh_coeffs,
                                                      const at::Tensor& means3D, const at::Tensor& campos,
                                                      const at::Tensor& v_colors);

// [0] on the model's two SH tensors, sh_dc [N,1,3] and sh_rest [N,K-1,3] (K >= 1), without concatenating them:
// -> colors [N,3], bitwise sh_colors(degree, cat(sh_dc, sh_rest, dim=1), means3D, campos).
at::Tensor sh_colors_split(int64_t degree, const at::Tensor& sh_dc, const at::Tensor& sh_rest,
                           const at::Tensor& means3D, const at::Tensor& campos);

// [0] split backward -> (v_sh_dc [N,1,3], v_sh_rest [N,K-1,3], v_means3D [N,3]), bitwise the parts of
// sh_colors_backward's v_sh_coeffs and its v_means3D.
std::tuple<at::Tensor, at::Tensor, at::Tensor> sh_colors_split_backward(int64_t degree, const at::Tensor& sh_dc,
                                                                        const at::Tensor& sh_rest,
                                                                        const at::Tensor& means3D,
                                                                        const at::Tensor& campos,
                                                                        const at::Tensor& v_colors);

// [2] -> (keys [E] int64, gaussian_ids [E] int32, tile_ranges [n_tiles,2] int32, tiles_touched [N] int32, E).
// When E > max_entries nothing of size E is allocated: keys, gaussian_ids and tile_ranges come back empty and the
// caller raises (returned, not thrown).
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, int64_t> bin_gaussians(
    const at::Tensor& means2D, const at::Tensor& conics, const at::Tensor& opacities, const at::Tensor& depths,
    const at::Tensor& radii, int64_t width, int64_t height, int64_t max_entries);

// [2] with a fixed entry capacity and no device->host read (a CUDA-graph-capturable step): -> (keys [capacity]
// int64 sorted, gaussian_ids [capacity] int32, tile_ranges, tiles_touched [N] int32, total [1] int64 on the device
// = the entries the frame needs). total > capacity: the frame dropped entries (incomplete); the caller decides.
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> bin_gaussians_fixed(
    const at::Tensor& means2D, const at::Tensor& conics, const at::Tensor& opacities, const at::Tensor& depths,
    const at::Tensor& radii, int64_t width, int64_t height, int64_t capacity);

// [3] writes image [H,W,3], final_T [H,W], n_contrib [H,W] int32 in place; with depths [N] (camera-space z) also
// depth_sum [H,W] (sum_i w_i z_i) and depth_median [H,W] from the same pass (all three or none).
void rasterize_tiles(const at::Tensor& means2D, const at::Tensor& conics, const at::Tensor& colors,
                     const at::Tensor& opacities, const at::Tensor& gaussian_ids, const at::Tensor& tile_ranges,
                     int64_t width, int64_t height, const c10::optional<at::Tensor>& background, at::Tensor image,
                     at::Tensor final_T, at::Tensor n_contrib, const c10::optional<at::Tensor>& depths,
                     const c10::optional<at::Tensor>& depth_sum, const c10::optional<at::Tensor>& depth_median);

// [3] backward -> (v_means2D [N,2], v_conics [N,3], v_colors [N,3], v_opacities [N], v_means2D_abs [N,2],
// v_depths [N] when depths and v_depth_sum [H,W] are given, else undefined (None))
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> rasterize_tiles_backward(
    const at::Tensor& means2D, const at::Tensor& conics, const at::Tensor& colors, const at::Tensor& opacities,
    const at::Tensor& gaussian_ids, const at::Tensor& tile_ranges, int64_t width, int64_t height,
    const c10::optional<at::Tensor>& background, const at::Tensor& final_T, const at::Tensor& n_contrib,
    const at::Tensor& v_image, const at::Tensor& v_final_T, const c10::optional<at::Tensor>& depths,
    const c10::optional<at::Tensor>& v_depth_sum);

// ---- fused appearance MLP (csrc/appearance.cu) and SSIM loss (csrc/ssim.cu): the same template ---------------

// Appearance -> colors [N,3] = sigmoid(W2 relu(W1 [latents, normalize(means3D - campos)] + b1) + b2).
// latents [N,L] (1 <= L <= RIGEL_APPEARANCE_MAX_LATENT), means3D [N,3], campos [3], W1 [H,L+3]
// (1 <= H <= RIGEL_APPEARANCE_MAX_HIDDEN), b1 [H], W2 [3,H], b2 [3]. Twin:
// rigel_core.renderer.appearance.reference_forward.
at::Tensor mlp_colors(const at::Tensor& latents, const at::Tensor& means3D, const at::Tensor& campos,
                      const at::Tensor& W1, const at::Tensor& b1, const at::Tensor& W2, const at::Tensor& b2);

// Appearance backward -> (v_latents [N,L], v_means3D [N,3] (undefined when !need_means), v_W1, v_b1, v_W2, v_b2).
// colors [N,3] is the forward's output. Twin: rigel_core.renderer.appearance.reference_backward.
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> mlp_colors_backward(
    const at::Tensor& latents, const at::Tensor& means3D, const at::Tensor& campos, const at::Tensor& W1,
    const at::Tensor& b1, const at::Tensor& W2, const at::Tensor& b2, const at::Tensor& colors,
    const at::Tensor& v_colors, bool need_means);

// SSIM -> (map like img1, coef [3, *img1.shape] float64: the backward's per-pixel coefficients, opaque: stored
// channel-planar inside that shape, csrc/ssim.h). img1, img2
// channels-last (H,W,C) or (B,H,W,C); 11x11 Gaussian window, sigma 1.5, zero "same" padding (csrc/ssim.h).
// Twin: rigel_core.train.losses.ssim_map_reference.
std::tuple<at::Tensor, at::Tensor> ssim_map(const at::Tensor& img1, const at::Tensor& img2);

// SSIM backward -> v_img1 like img1 (the gradient to img1 only; img2 is a constant).
at::Tensor ssim_map_backward(const at::Tensor& img1, const at::Tensor& img2, const at::Tensor& coef,
                             const at::Tensor& v_map);

// The trainer's photometric loss terms in one pass (csrc/ssim.cu, fused form): pred, target as ssim_map's img1,
// img2; mask (H,W) or (B,H,W) bool, optional (false = the pixel does not count: both images read as 0 there)
// -> (totals [4] float64 = sums over counting elements of |pred - target|, SSIM, (pred - target)^2 and 1; coef as
// ssim_map's, or with fp32 [5, *pred.shape] float32: the float32 locally centred kernels, ssim.cu).
// Twin: rigel_core.train.losses l1_loss / ssim / mse with the mask.
std::tuple<at::Tensor, at::Tensor> photometric_sums(const at::Tensor& pred, const at::Tensor& target,
                                                    const c10::optional<at::Tensor>& mask, bool fp32);

// Its backward: v_totals [4] float64 (the gradients of the totals; the count's is ignored) -> v_pred like pred;
// the forward's coef says which kernels (float64 (3, ...) or float32 (5, ...)).
at::Tensor photometric_sums_backward(const at::Tensor& pred, const at::Tensor& target,
                                     const c10::optional<at::Tensor>& mask, const at::Tensor& coef,
                                     const at::Tensor& v_totals);

// One Adam step over G <= 16 parameter groups in one launch (csrc/adam.cu; rigel_core.train.optim.Adam). Per group:
// params, grads, exp_avgs, exp_avg_sqs float32 tensors of one shape on one CUDA device (updated in place), steps a
// one-element float32 count (incremented unless skipped), lrs the learning rate or lr_tensors a one-element device
// float32 read at run time (CUDA-graph capture), beta1s, beta2s in [0, 1), epss >= 0. found_inf: a one-element
// device float32; non-zero skips the whole step. skip_zero_grad: an element whose gradient is exactly 0 keeps its
// value and moments (TrainConfig.sparse_adam). Raises TypeError / ValueError naming the argument.
void adam_step(const std::vector<at::Tensor>& params, const std::vector<at::Tensor>& grads,
               const std::vector<at::Tensor>& exp_avgs, const std::vector<at::Tensor>& exp_avg_sqs,
               const std::vector<at::Tensor>& steps, const std::vector<double>& lrs,
               const std::vector<c10::optional<at::Tensor>>& lr_tensors, const std::vector<double>& beta1s,
               const std::vector<double>& beta2s, const std::vector<double>& epss,
               const c10::optional<at::Tensor>& found_inf, bool skip_zero_grad);

// The MCMC budget's Langevin position noise (csrc/mcmc_noise.cu; rigel_core.train.mcmc.add_position_noise):
// means3D (N,3) float32 moved in place by noise = noise_lr · lr · sigmoid(−k (o − t)) · R diag(s²) Rᵀ η (R of the
// normalised quats (N,4), s = min(exp(log_scales (N,3)), max_scale), o = sigmoid(opacity_logits (N,)), eta (N,3)),
// max_scale > 0 (+inf: s unbounded, the paper's Σ); non-finite
// components 0; returns the noise (N,3). lr_tensor: a one-element device float32 read at run time instead of lr
// (CUDA-graph capture); ok: a (1,) bool on the device, false: nothing moves, noise 0. Raises TypeError /
// ValueError naming the argument.
at::Tensor mcmc_position_noise(at::Tensor& means3D, const at::Tensor& quats, const at::Tensor& log_scales,
                               const at::Tensor& opacity_logits, const at::Tensor& eta,
                               const c10::optional<at::Tensor>& lr_tensor, double lr, double noise_lr, double k,
                               double t, const c10::optional<at::Tensor>& ok, double max_scale);

// A streamed frame's 8-bit codes finished on the GPU (csrc/frames.cu; rigel_core.data.stream.finish_codes):
// codes (H,W,3|4) uint8, table (256,) float32 (code / 255) on the same CUDA device -> [rgb (H,W,3) float32,
// alpha (H,W) float32] (alpha undefined for 3-channel codes); rgb = table[codes]·a (+ (1 − a) when white_bg).
// Raises TypeError / ValueError naming the argument.
std::vector<at::Tensor> finish_codes(const at::Tensor& codes, const at::Tensor& table, bool white_bg);

}  // namespace rigel
