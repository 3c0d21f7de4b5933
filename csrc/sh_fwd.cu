// [0] Spherical-harmonics colour stage, forward: one thread per Gaussian (docs/PIPELINE.md [0]).
#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>

#include "launch.h"
#include "sh_common.cuh"

namespace rigel {
namespace {

// colors = max(sum_k Y_k(dir) c_k + 0.5, 0), dir = normalize(mean - campos); NaN for a non-finite row (fmaxf
// would turn a NaN sum into 0, a drawn black splat).
template <int DEGREE>
__global__ void __launch_bounds__(kBlock1D) sh_fwd_kernel(
    int64_t n, int coeffs_per_gaussian,
    const float* __restrict__ sh_coeffs,  // [N, K, 3], K = coeffs_per_gaussian >= (DEGREE+1)^2
    const float* __restrict__ means3D,    // [N, 3]
    const float* __restrict__ campos,     // [3]
    float* __restrict__ colors)           // [N, 3] out
{
    const int64_t g = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
    if (g >= n) return;
    if (!sh_row_finite(g, coeffs_per_gaussian, sh_coeffs, means3D)) {  // culled: the NaN marker
        colors[3 * g + 0] = colors[3 * g + 1] = colors[3 * g + 2] = __int_as_float(0x7fc00000);
        return;
    }
    const ShEval<DEGREE> e = sh_eval<DEGREE>(g, coeffs_per_gaussian, sh_coeffs, means3D, campos);
    // a NaN sum of finite but huge coefficients (Inf - Inf) stays NaN, as torch.clamp_min keeps it: culled too
#pragma unroll
    for (int ch = 0; ch < 3; ++ch) colors[3 * g + ch] = isnan(e.raw[ch]) ? e.raw[ch] : fmaxf(e.raw[ch] + 0.5f, 0.f);
}

}  // namespace

void launch_sh_fwd(int degree, const at::Tensor& sh_coeffs, const at::Tensor& means3D, const at::Tensor& campos,
                   at::Tensor& colors) {
    const int64_t n = means3D.size(0);
    if (n == 0) return;
    const int k = static_cast<int>(sh_coeffs.size(1));
    const auto stream = at::cuda::getCurrentCUDAStream();
    const unsigned int blocks = num_blocks(n, kBlock1D);
    const float* c = sh_coeffs.data_ptr<float>();
    const float* m = means3D.data_ptr<float>();
    const float* cp = campos.data_ptr<float>();
    float* out = colors.data_ptr<float>();
    switch (degree) {
        case 0: sh_fwd_kernel<0><<<blocks, kBlock1D, 0, stream>>>(n, k, c, m, cp, out); break;
        case 1: sh_fwd_kernel<1><<<blocks, kBlock1D, 0, stream>>>(n, k, c, m, cp, out); break;
        case 2: sh_fwd_kernel<2><<<blocks, kBlock1D, 0, stream>>>(n, k, c, m, cp, out); break;
        default: sh_fwd_kernel<3><<<blocks, kBlock1D, 0, stream>>>(n, k, c, m, cp, out); break;
    }
    RIGEL_CHECK_LAUNCH("sh_fwd_kernel");
}

}  // namespace rigel
