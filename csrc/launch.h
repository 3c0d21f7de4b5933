// Kernel launchers, one per stage and direction, implemented beside their kernels in the .cu files.
// Arguments are already checked by ops.cpp (device, dtype, contiguity, shapes); shapes are noted here.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include <ATen/ATen.h>
#include <c10/util/Optional.h>

namespace rigel {

// project_fwd.cu. means3D [N,3], quats [N,4], scales [N,3], opacities [N], viewmat [4,4], K [3,3]
// -> means2D [N,2], conics [N,3], depths [N], radii [N] int32 (all written, culled = 0); compensations [N] or
// nullptr: when given, the mip mode (MIP_FILTER_2D instead of LOWPASS) and its opacity compensation written there.
void launch_project_fwd(const at::Tensor& means3D, const at::Tensor& quats, const at::Tensor& scales,
                        const at::Tensor& opacities, const at::Tensor* colors, const at::Tensor& viewmat,
                        const at::Tensor& K, int width,
                        int height, double near_plane, double far_plane, at::Tensor& means2D, at::Tensor& conics,
                        at::Tensor& depths, at::Tensor& radii, at::Tensor* compensations);

// project_bwd.cu. Inputs as the forward plus radii [N]; v_means2D [N,2], v_conics [N,3], v_depths [N]
// -> v_means3D [N,3], v_quats [N,4], v_scales [N,3] (zero for culled Gaussians); v_compensations [N] or nullptr:
// when given, the mip mode's backward (through its filter and the compensation); v_viewmat_parts [N,3,4] or nullptr:
// when given, each Gaussian's share [v_R | v_t] of the view-matrix gradient (zero for culled ones).
void launch_project_bwd(const at::Tensor& means3D, const at::Tensor& quats, const at::Tensor& scales,
                        const at::Tensor& viewmat, const at::Tensor& K, int width, int height,
                        const at::Tensor& radii, const at::Tensor& v_means2D, const at::Tensor& v_conics,
                        const at::Tensor& v_depths, at::Tensor& v_means3D, at::Tensor& v_quats, at::Tensor& v_scales,
                        const at::Tensor* v_compensations, const at::Tensor* v_viewmat_parts);

// sh_fwd.cu. sh_coeffs [N,K,3], means3D [N,3], campos [3] -> colors [N,3].
void launch_sh_fwd(int degree, const at::Tensor& sh_coeffs, const at::Tensor& means3D, const at::Tensor& campos,
                   at::Tensor& colors);

// sh_bwd.cu. v_colors [N,3] -> v_sh_coeffs [N,K,3] (bases beyond the degree get 0), v_means3D [N,3].
void launch_sh_bwd(int degree, const at::Tensor& sh_coeffs, const at::Tensor& means3D, const at::Tensor& campos,
                   const at::Tensor& v_colors, at::Tensor& v_sh_coeffs, at::Tensor& v_means3D);

// The same two stages reading the model's sh_dc [N,1,3] and sh_rest [N,K-1,3] (K >= 1; sh_rest may have no
// elements) in place of sh_coeffs = cat(sh_dc, sh_rest) and writing v_sh_dc, v_sh_rest (bitwise the two parts of
// v_sh_coeffs).
void launch_sh_fwd_split(int degree, const at::Tensor& sh_dc, const at::Tensor& sh_rest, const at::Tensor& means3D,
                         const at::Tensor& campos, at::Tensor& colors);
void launch_sh_bwd_split(int degree, const at::Tensor& sh_dc, const at::Tensor& sh_rest, const at::Tensor& means3D,
                         const at::Tensor& campos, const at::Tensor& v_colors, at::Tensor& v_sh_dc,
                         at::Tensor& v_sh_rest, at::Tensor& v_means3D);

// binning.cu, in two steps so that the host can refuse an oversized frame between them.
// Step 1: per-Gaussian tile counts (the ellipse test) and their inclusive scan; offsets[N-1] is the frame's entry
// count, which the exact mode reads on the host (its one device->host read). Writes counts-scan offsets [N] int64, tiles_touched [N] int32, and the
// list of Gaussians whose tile rectangle is large (large_ids [N] int32, large_count [1] int32), which step 2
// processes one warp per Gaussian.
void launch_count_tiles(const at::Tensor& means2D, const at::Tensor& conics, const at::Tensor& opacities,
                           const at::Tensor& radii, int width, int height, at::Tensor& offsets,
                           at::Tensor& tiles_touched, at::Tensor& large_ids, at::Tensor& large_count);
// Step 2: emit the `total` entries, radix-sort them, find tile_ranges [n_tiles, 2] int32.
// Returns (keys [E] int64 sorted, gaussian_ids [E] int32), E = total. With fixed_capacity, `total` is a capacity
// chosen by the caller and the frame's true count stays on the device (offsets[N-1]): entries past the capacity
// are dropped, the unused rest is padded with keys past every tile (sorted last, in no tile's range). No
// device->host read either way; the count for an exact `total` is the caller's read of offsets[N-1].
std::pair<at::Tensor, at::Tensor> launch_emit_and_sort(const at::Tensor& means2D, const at::Tensor& conics,
                                                       const at::Tensor& opacities, const at::Tensor& depths,
                                                       const at::Tensor& radii, int width, int height,
                                                       const at::Tensor& offsets, const at::Tensor& large_ids,
                                                       const at::Tensor& large_count, int64_t total,
                                                       bool fixed_capacity, at::Tensor& tile_ranges);

// rasterize_fwd.cu. Writes image [H,W,3], final_T [H,W], n_contrib [H,W] int32 (caller-provided); with depths [N]
// also depth_sum [H,W] and depth_median [H,W] (all three given or none).
void launch_rasterize_fwd(const at::Tensor& means2D, const at::Tensor& conics, const at::Tensor& colors,
                          const at::Tensor& opacities, const at::Tensor& gaussian_ids, const at::Tensor& tile_ranges,
                          int width, int height, const c10::optional<at::Tensor>& background, at::Tensor& image,
                          at::Tensor& final_T, at::Tensor& n_contrib, const c10::optional<at::Tensor>& depths,
                          const c10::optional<at::Tensor>& depth_sum, const c10::optional<at::Tensor>& depth_median);

// rasterize_bwd.cu. v_image [H,W,3], v_final_T [H,W] -> v_means2D [N,2], v_conics [N,3], v_colors [N,3],
// v_opacities [N], v_means2D_abs [N,2] (sum over pixels of |per-pixel d loss / d means2D|, for densification);
// with depths [N] and v_depth_sum [H,W] also v_depths [N] (all three given or none);
// the outputs must be zeroed by the caller (the kernel accumulates).
void launch_rasterize_bwd(const at::Tensor& means2D, const at::Tensor& conics, const at::Tensor& colors,
                          const at::Tensor& opacities, const at::Tensor& gaussian_ids, const at::Tensor& tile_ranges,
                          int width, int height, const c10::optional<at::Tensor>& background,
                          const at::Tensor& final_T, const at::Tensor& n_contrib, const at::Tensor& v_image,
                          const at::Tensor& v_final_T, at::Tensor& v_means2D, at::Tensor& v_conics,
                          at::Tensor& v_colors, at::Tensor& v_opacities, at::Tensor& v_means2D_abs,
                          const c10::optional<at::Tensor>& depths, const c10::optional<at::Tensor>& v_depth_sum,
                          const c10::optional<at::Tensor>& v_depths, int dense_min);
// The backward sums a warp's gradients in chunks of kRasterBwdChunk entries; a chunk of at least dense_min entries
// transposed, a shorter one by a warp reduction per entry (rasterize_bwd.cu). dense_min: 0 .. kRasterBwdChunk + 1
// (0: always transposed, kRasterBwdChunk + 1: never); ops.cpp passes kRasterBwdDenseMin unless
// RIGEL_RASTER_BWD_DENSE_MIN says otherwise (the tests force each way).
constexpr int kRasterBwdChunk = 8;
constexpr int kRasterBwdDenseMin = 3;

// adam.cu. One Adam step over up to kAdamMaxGroups groups in one launch (then one launch for the step counts).
// Each group: n float32 elements of param, grad, exp_avg, exp_avg_sq (contiguous, one device); step a device
// float32 scalar (the count before this step); lr_ptr a device float32 scalar read at run time, or nullptr to use
// lr. found_inf: a device float32 scalar (non-zero: skip everything) or nullptr. block_start is set by the
// launcher.
constexpr int kAdamMaxGroups = 16;
struct AdamGroupArgs {
    float* param;
    const float* grad;
    float* exp_avg;
    float* exp_avg_sq;
    float* step;
    const float* lr_ptr;
    float lr, beta1, beta2, eps;
    int64_t n;
    int64_t block_start;
};
void launch_adam_step(const std::vector<AdamGroupArgs>& groups, const float* found_inf, bool skip_zero_grad);

// mcmc_noise.cu. means3D [N,3] in/out, quats [N,4], log_scales [N,3], opacity_logits [N], eta [N,3] -> noise [N,3]
// (written); lr_ptr a device float32 read at run time or nullptr (lr); max_scale > 0 bounds s in Σ (+inf: none);
// ok a device bool or nullptr.
void launch_mcmc_noise(at::Tensor& means3D, const at::Tensor& quats, const at::Tensor& log_scales,
                       const at::Tensor& opacity_logits, const at::Tensor& eta, const float* lr_ptr, float lr,
                       float noise_lr, float k, float t, float max_scale, const bool* ok, at::Tensor& noise);

// frames.cu. codes [H,W,3|4] uint8, table [256] float32 -> rgb [H,W,3] float32 (written), alpha [H,W] float32
// (written; 4-channel codes only).
void launch_finish_codes(const at::Tensor& codes, const at::Tensor& table, bool white_bg, at::Tensor& rgb,
                         at::Tensor& alpha);

}  // namespace rigel
