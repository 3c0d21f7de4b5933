// A streamed frame's 8-bit codes finished on the GPU (rigel_core.data.stream.finish_codes), one thread per pixel:
//
//   value = table[code]                       (table = rigel_core.data.images.UNIT8: code / 255 in float32)
//   rgb   = value_rgb · a  (+ (1 − a) on white),   a = value_alpha        (4-channel codes)
//   rgb   = value_rgb                                                      (3-channel codes)
//
// each product, difference and sum rounded to float32 on its own (__fmul_rn / __fsub_rn / __fadd_rn: no fused
// multiply-add), in the order of rigel_core.data.images.composite_rgb, so that the result is the numpy / PyTorch
// composite's, bit for bit.
//
// Why a kernel: the PyTorch form (an int32 copy of the codes, a table lookup, a product, a difference, a sum, an
// alpha copy) is six launches and four passes over the float image for every view a step trains; with 2,000 views
// at 1080p a streamed step ran at 0.90 of the preloaded step's throughput after the first epoch (H100, issue 37).
#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>

#include <cstdint>

#include "common.cuh"
#include "launch.h"

namespace rigel {
namespace {

template <int C>
__global__ void __launch_bounds__(kBlock1D) finish_codes_kernel(
    int64_t n_pixels,
    const uint8_t* __restrict__ codes,  // [H*W, C]
    const float* __restrict__ table,    // [256]
    bool white_bg,
    float* __restrict__ rgb,            // [H*W, 3] out
    float* __restrict__ alpha)          // [H*W] out (C == 4)
{
    const int64_t p = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
    if (p >= n_pixels) return;
    const uint8_t* c = codes + C * p;
    if (C == 3) {
#pragma unroll
        for (int i = 0; i < 3; ++i) rgb[3 * p + i] = __ldg(table + c[i]);
        return;
    }
    const float a = __ldg(table + c[3]);
    const float bg = __fsub_rn(1.f, a);
#pragma unroll
    for (int i = 0; i < 3; ++i) {
        const float v = __fmul_rn(__ldg(table + c[i]), a);
        rgb[3 * p + i] = white_bg ? __fadd_rn(v, bg) : v;
    }
    alpha[p] = a;
}

}  // namespace

void launch_finish_codes(const at::Tensor& codes, const at::Tensor& table, bool white_bg, at::Tensor& rgb,
                         at::Tensor& alpha) {
    const int64_t n = codes.size(0) * codes.size(1);
    if (n == 0) return;
    const auto stream = at::cuda::getCurrentCUDAStream();
    if (codes.size(2) == 3) {
        finish_codes_kernel<3><<<num_blocks(n, kBlock1D), kBlock1D, 0, stream>>>(
            n, codes.data_ptr<uint8_t>(), table.data_ptr<float>(), white_bg, rgb.data_ptr<float>(), nullptr);
    } else {
        finish_codes_kernel<4><<<num_blocks(n, kBlock1D), kBlock1D, 0, stream>>>(
            n, codes.data_ptr<uint8_t>(), table.data_ptr<float>(), white_bg, rgb.data_ptr<float>(),
            alpha.data_ptr<float>());
    }
    RIGEL_CHECK_LAUNCH("finish_codes_kernel");
}

}  // namespace rigel
