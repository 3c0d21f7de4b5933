// Fused SSIM loss (forward + backward) of the trainer: the CUDA twin of rigel_core/train/losses.py ssim_map_reference with
// its defaults (11x11 Gaussian window, sigma 1.5, zero "same" padding, C1 = 0.01^2, C2 = 0.03^2). Kernels and
// launchers: ssim.cu. Argument checks: ops.cpp (ssim_map); binding: ext.cpp; autograd Function:
// rigel_core/renderer/cuda_backend.py; dispatch: rigel_core/train/losses.py.
//
// Layout: images are channels-last, (B, H, W, C) contiguous float32 (an (H, W, C) image is B = 1), the layout
// rigel_core.render returns; every channel of every image is filtered on its own. Arithmetic is float64 inside the
// kernels (the moments sigma^2 = E[x^2] - mu^2 and the backward's sum of large opposite terms would otherwise lose
// ~1e-4 on flat regions), storage float32 except the per-pixel backward coefficients (float64).
#pragma once

#include <cstdint>

#include <ATen/ATen.h>

namespace rigel {

constexpr int kSsimTaps = 11;                                // window size (losses.ssim default)
constexpr int kSsimRadius = kSsimTaps / 2;                   // 5: the zero padding of "same"
constexpr int kSsimTile = 16;                                // output pixels per block side (one thread each)
constexpr int kSsimSpan = kSsimTile + 2 * kSsimRadius;       // 26: tile plus halo, per side
constexpr int kSsimThreads = kSsimTile * kSsimTile;          // 256
constexpr double kSsimSigma = 1.5;                           // window standard deviation (px)
constexpr double kSsimC1 = 0.01 * 0.01;                      // (K1 L)^2, as Python's 0.01 ** 2
constexpr double kSsimC2 = 0.03 * 0.03;                      // (K2 L)^2

// The normalised 1-D window, passed by value as a kernel parameter (constant bank: no copy, no stream sync).
struct SsimWindow {
    double w[kSsimTaps];
};

// w_i = exp(-(i - 5)^2 / (2 sigma^2)) / sum, in double, as losses.gaussian_window_1d computes it.
SsimWindow ssim_window();

// Forward. img1, img2 [B, H, W, C] -> map [B, H, W, C] float32 (SSIM per pixel and channel) and
// coef [3, B, H, W, C] float64 = (A, Bc, Cc) per pixel p, the coefficients of the backward, stored channel-planar
// (element (b, i, j, c) of plane k at k numel + ((b C + c) H + i) W + j; ssim.cu's Plane says why):
//   Bc = dS/d(sigma1^2), Cc = dS/d(sigma12), A = dS/d(mu1) - 2 mu1 Bc - mu2 Cc.
// All caller-allocated and written for every element.
// The fused photometric loss: with mask [B, H, W] bool (optional; false = the pixel does not count) x and y are
// replaced by 0 where it is false, map is nullptr and totals [4] float64 (caller-zeroed) receives the sums over the
// counting elements of |x - y|, S, (x - y)^2 and 1.
void launch_ssim_fwd(const at::Tensor& img1, const at::Tensor& img2, const c10::optional<at::Tensor>& mask,
                     at::Tensor* map, at::Tensor& coef, at::Tensor* totals);

// Backward. dL_dmap [B, H, W, C], img1, img2, coef (the forward's) -> dL_dimg1 [B, H, W, C] (written for every
// element): dL/dx(q) = [w*(g A)](q) + 2 x(q) [w*(g Bc)](q) + y(q) [w*(g Cc)](q), g = dL_dmap.
// Fused loss: dL_dmap nullptr, v_totals [4] float64 the gradients of the four totals (the fourth unused): g(p) =
// v_totals[1] m(p), and dL/dx(q) = m(q) (the above + v_totals[0] sign(x - y) + 2 v_totals[2] (x - y)).
void launch_ssim_bwd(const at::Tensor* dL_dmap, const at::Tensor* v_totals, const c10::optional<at::Tensor>& mask,
                     const at::Tensor& img1, const at::Tensor& img2, const at::Tensor& coef, at::Tensor& dL_dimg1);

// The fused loss in float32 (photometric_sums with fp32; ssim.cu explains the local centring that keeps its
// cancellations small): the forward as launch_ssim_fwd's fused form with coef [5, B, H, W, C] float32 = (dS/dmu1,
// dS/dsigma1^2, dS/dsigma12, mu1, mu2) per pixel (channel-planar as launch_ssim_fwd's); totals [4] float64 (caller-zeroed) as there. The backward as
// launch_ssim_bwd's fused form from that coef.
void launch_loss32_fwd(const at::Tensor& img1, const at::Tensor& img2, const c10::optional<at::Tensor>& mask,
                       at::Tensor& coef, at::Tensor& totals);
void launch_loss32_bwd(const at::Tensor& v_totals, const c10::optional<at::Tensor>& mask, const at::Tensor& img1,
                       const at::Tensor& img2, const at::Tensor& coef, at::Tensor& dL_dimg1);

}  // namespace rigel
