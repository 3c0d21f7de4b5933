// [0] Spherical-harmonics colour stage, forward: one thread per Gaussian, the block's coefficient rows staged
// through shared memory by coalesced copies (docs/PIPELINE.md [0]; sh_for_each_staged in sh_common.cuh).
#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>

#include "launch.h"
#include "sh_common.cuh"

namespace rigel {
namespace {

// colors = max(sum_k Y_k(dir) c_k + 0.5, 0), dir = normalize(mean - campos); NaN for a non-finite row (fmaxf
// would turn a NaN sum into 0, a drawn black splat).
// R_CT: the row length 3K when fixed at compile time (48: K = 16, every model of degree 3 and every training
// run while the degree ramps up), 0 for a run-time K. STAGED: rows copied to shared memory (R_CT > 0: static,
// else kShBlock * sh_row_stride(3K) floats of dynamic shared memory); false: read per thread from global memory
// (rows wider than kShMaxStride).
template <int DEGREE, int R_CT, bool STAGED>
__global__ void __launch_bounds__(kShBlock) sh_fwd_kernel(
    int64_t n, int coeffs_per_gaussian,
    const float* __restrict__ sh_coeffs,  // [N, K, 3], K = coeffs_per_gaussian >= (DEGREE+1)^2
    const float* __restrict__ means3D,    // [N, 3]
    const float* __restrict__ campos,     // [3]
    float* __restrict__ colors)           // [N, 3] out
{
    const int R = R_CT > 0 ? R_CT : 3 * coeffs_per_gaussian;
    const int t = static_cast<int>(threadIdx.x);
    const int64_t g0 = static_cast<int64_t>(blockIdx.x) * kShBlock;
    const int64_t g = g0 + t;
    const int rows = static_cast<int>(n - g0 < kShBlock ? n - g0 : kShBlock);  // the last block may be partial
    const float* row;
    if constexpr (STAGED) {
        __shared__ float sm_static[R_CT > 0 ? kShBlock * sh_row_stride(R_CT) : 1];
        extern __shared__ float sm_dynamic[];
        float* sm = R_CT > 0 ? sm_static : sm_dynamic;
        const float* __restrict__ span = sh_coeffs + g0 * R;  // int64: N R may exceed 2^31
        sh_for_each_staged<R_CT>(rows * R, R, [&](int e, int i) { sm[i] = span[e]; });
        __syncthreads();  // the only barrier: threads past the last row may leave after it
        row = sm + t * sh_row_stride(R);
    } else {
        row = sh_coeffs + g * coeffs_per_gaussian * 3;
    }
    if (t >= rows) return;
    if (!sh_row_finite<R_CT>(row, R, means3D + 3 * g)) {  // culled: the NaN marker
        colors[3 * g + 0] = colors[3 * g + 1] = colors[3 * g + 2] = __int_as_float(0x7fc00000);
        return;
    }
    const ShEval<DEGREE> e = sh_eval<DEGREE>(row, means3D + 3 * g, campos);
    // a NaN sum of finite but huge coefficients (Inf - Inf) stays NaN, as torch.clamp_min keeps it: culled too
#pragma unroll
    for (int ch = 0; ch < 3; ++ch) colors[3 * g + ch] = isnan(e.raw[ch]) ? e.raw[ch] : fmaxf(e.raw[ch] + 0.5f, 0.f);
}

template <int DEGREE>
void launch_sh_fwd_degree(int64_t n, int k, const float* c, const float* m, const float* cp, float* out,
                          cudaStream_t stream) {
    const unsigned int blocks = num_blocks(n, kShBlock);
    const int64_t r = 3 * static_cast<int64_t>(k);
    if (r == 48) {
        sh_fwd_kernel<DEGREE, 48, true><<<blocks, kShBlock, 0, stream>>>(n, k, c, m, cp, out);
    } else if (r < kShMaxStride && sh_row_stride(static_cast<int>(r)) <= kShMaxStride) {
        const size_t smem = sizeof(float) * kShBlock * sh_row_stride(static_cast<int>(r));
        sh_fwd_kernel<DEGREE, 0, true><<<blocks, kShBlock, smem, stream>>>(n, k, c, m, cp, out);
    } else {
        sh_fwd_kernel<DEGREE, 0, false><<<blocks, kShBlock, 0, stream>>>(n, k, c, m, cp, out);
    }
}

}  // namespace

void launch_sh_fwd(int degree, const at::Tensor& sh_coeffs, const at::Tensor& means3D, const at::Tensor& campos,
                   at::Tensor& colors) {
    const int64_t n = means3D.size(0);
    if (n == 0) return;
    const int k = static_cast<int>(sh_coeffs.size(1));
    const auto stream = at::cuda::getCurrentCUDAStream();
    const float* c = sh_coeffs.data_ptr<float>();
    const float* m = means3D.data_ptr<float>();
    const float* cp = campos.data_ptr<float>();
    float* out = colors.data_ptr<float>();
    switch (degree) {
        case 0: launch_sh_fwd_degree<0>(n, k, c, m, cp, out, stream); break;
        case 1: launch_sh_fwd_degree<1>(n, k, c, m, cp, out, stream); break;
        case 2: launch_sh_fwd_degree<2>(n, k, c, m, cp, out, stream); break;
        default: launch_sh_fwd_degree<3>(n, k, c, m, cp, out, stream); break;
    }
    RIGEL_CHECK_LAUNCH("sh_fwd_kernel");
}

}  // namespace rigel
