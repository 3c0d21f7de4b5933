// Fused appearance MLP (issue 5): per-Gaussian latent (+) unit view direction -> ReLU layer -> sigmoid RGB.
// Kernels and launchers: appearance.cu. Argument checks: ops.cpp (mlp_colors); binding: ext.cpp; autograd
// Function: rigel_core/renderer/cuda_backend.py. PyTorch twin (and the model's documentation):
// rigel_core/renderer/appearance.py.
#pragma once

#include <ATen/ATen.h>

#include "config.h"

namespace rigel {

// Size limits of the kernel (config.h says why these values; rigel_core.config mirrors them).
constexpr int kAppearanceMaxLatent = RIGEL_APPEARANCE_MAX_LATENT;
constexpr int kAppearanceMaxHidden = RIGEL_APPEARANCE_MAX_HIDDEN;
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
