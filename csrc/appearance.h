// Fused appearance MLP (issue 5): per-Gaussian latent (+) unit view direction -> ReLU layer -> sigmoid RGB.
// Kernels and launchers: appearance.cu. Argument checks and the Python binding: appearance_bind.cpp.
// PyTorch twin (and the model's documentation): rigel_core/appearance.py.
#pragma once

#include <ATen/ATen.h>
#ifndef __CUDACC__
#include <pybind11/pybind11.h>
#endif

namespace rigel {

// Size limits of the kernel, mirrored by MAX_LATENT_DIM / MAX_HIDDEN_DIM in rigel_core/appearance.py.
// Per-thread state is a register array of the padded input width (<= 36 floats, forward and backward), and
// the staged weights plus their gradients take 2 * H * (36 + 4) floats = 20 KiB of shared memory at H = 64.
constexpr int kAppearanceMaxLatent = 32;
constexpr int kAppearanceMaxHidden = 64;
// Threads per block (one Gaussian per thread, grid-stride over the rest). A multiple of the warp size: the
// backward reduces gradients warp by warp before the block-level shared-memory sums.
constexpr int kAppearanceBlock = 256;

// Forward. latents [N, L], means3D [N, 3], campos [3], W1 [H, L+3], b1 [H], W2 [3, H], b2 [3]
// -> colors [N, 3] (caller-allocated, written for every Gaussian). All float32, contiguous, on one CUDA device.
void launch_appearance_fwd(const at::Tensor& latents, const at::Tensor& means3D, const at::Tensor& campos,
                           const at::Tensor& W1, const at::Tensor& b1, const at::Tensor& W2, const at::Tensor& b2,
                           at::Tensor& colors);

// Backward. Inputs as the forward, colors [N, 3] (the forward's output) and v_colors [N, 3]
// -> v_latents [N, L] (written), v_means3D [N, 3] (written when defined; skipped when undefined),
//    v_W1 [H, L+3], v_b1 [H], v_W2 [3, H], v_b2 [3] (accumulated into: the caller zeroes them).
void launch_appearance_bwd(const at::Tensor& latents, const at::Tensor& means3D, const at::Tensor& campos,
                           const at::Tensor& W1, const at::Tensor& b1, const at::Tensor& W2, const at::Tensor& b2,
                           const at::Tensor& colors, const at::Tensor& v_colors, at::Tensor& v_latents,
                           at::Tensor& v_means3D, at::Tensor& v_W1, at::Tensor& v_b1, at::Tensor& v_W2,
                           at::Tensor& v_b2);

}  // namespace rigel

#ifndef __CUDACC__
// Adds appearance_fwd / appearance_bwd to the extension module (called from ext.cpp's PYBIND11_MODULE).
void bind_appearance(pybind11::module_& m);
#endif
