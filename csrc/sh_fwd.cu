// [0] Spherical-harmonics colour stage, forward: one thread per Gaussian, the block's coefficient rows staged
// through shared memory by coalesced copies (docs/PIPELINE.md [0]; sh_stage_rows in sh_common.cuh), from one
// sh_coeffs tensor (sh_colors) or from the model's sh_dc and sh_rest (sh_colors_split).
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
// (rows wider than kShMaxStride). SPLIT: the coefficients come as the model's two tensors sh_dc, sh_rest
// (sh_colors_split) instead of one sh_coeffs; only the staging (or, unstaged, the row's addressing) differs.
template <int DEGREE, int R_CT, bool STAGED, bool SPLIT>
__global__ void __launch_bounds__(kShBlock) sh_fwd_kernel(
    int64_t n, int coeffs_per_gaussian,
    const float* __restrict__ sh_coeffs,  // [N, K, 3], K = coeffs_per_gaussian >= (DEGREE+1)^2; SPLIT: sh_dc [N, 1, 3]
    const float* __restrict__ sh_rest,    // SPLIT: [N, K-1, 3] (null when empty); else unused
    const float* __restrict__ means3D,    // [N, 3]
    const float* __restrict__ campos,     // [3]
    float* __restrict__ colors)           // [N, 3] out
{
    const int R = R_CT > 0 ? R_CT : 3 * coeffs_per_gaussian;
    const int t = static_cast<int>(threadIdx.x);
    const int64_t g0 = static_cast<int64_t>(blockIdx.x) * kShBlock;
    const int64_t g = g0 + t;
    const int rows = static_cast<int>(n - g0 < kShBlock ? n - g0 : kShBlock);  // the last block may be partial
    // one Gaussian from its coefficient row (shared memory, a global row, or ShSplitRow)
    auto shade = [&](const auto& row) {
        if (!sh_row_finite<R_CT>(row, R, means3D + 3 * g)) {  // culled: the NaN marker
            colors[3 * g + 0] = colors[3 * g + 1] = colors[3 * g + 2] = __int_as_float(0x7fc00000);
            return;
        }
        const ShEval<DEGREE> e = sh_eval<DEGREE>(row, means3D + 3 * g, campos);
        // a NaN sum of finite but huge coefficients (Inf - Inf) stays NaN, as torch.clamp_min keeps it: culled too
#pragma unroll
        for (int ch = 0; ch < 3; ++ch)
            colors[3 * g + ch] = isnan(e.raw[ch]) ? e.raw[ch] : fmaxf(e.raw[ch] + 0.5f, 0.f);
    };
    if constexpr (STAGED) {
        __shared__ float sm_static[R_CT > 0 ? kShBlock * sh_row_stride(R_CT) : 1];
        extern __shared__ float sm_dynamic[];
        float* sm = R_CT > 0 ? sm_static : sm_dynamic;
        sh_stage_rows<R_CT, SPLIT>(sh_coeffs, sh_rest, g0, rows, R,
                                   [&](const float* __restrict__ p, int e, int i) { sm[i] = p[e]; });
        __syncthreads();  // the only barrier: threads past the last row may leave after it
        if (t >= rows) return;
        shade(static_cast<const float*>(sm + t * sh_row_stride(R)));
    } else {
        if (t >= rows) return;
        if constexpr (SPLIT) {
            shade(ShSplitRow<const float>{sh_coeffs + 3 * g, sh_rest + (R - 3) * g});
        } else {
            shade(sh_coeffs + g * R);
        }
    }
}

template <int DEGREE, bool SPLIT>
void launch_sh_fwd_degree(int64_t n, int k, const float* c, const float* rest, const float* m, const float* cp,
                          float* out, cudaStream_t stream) {
    const unsigned int blocks = num_blocks(n, kShBlock);
    const int64_t r = 3 * static_cast<int64_t>(k);
    if (r == 48) {
        sh_fwd_kernel<DEGREE, 48, true, SPLIT><<<blocks, kShBlock, 0, stream>>>(n, k, c, rest, m, cp, out);
    } else if (r < kShMaxStride && sh_row_stride(static_cast<int>(r)) <= kShMaxStride) {
        const size_t smem = sizeof(float) * kShBlock * sh_row_stride(static_cast<int>(r));
        sh_fwd_kernel<DEGREE, 0, true, SPLIT><<<blocks, kShBlock, smem, stream>>>(n, k, c, rest, m, cp, out);
    } else {
        sh_fwd_kernel<DEGREE, 0, false, SPLIT><<<blocks, kShBlock, 0, stream>>>(n, k, c, rest, m, cp, out);
    }
}

// Both ops: k = K coefficients per Gaussian, c = sh_coeffs (or sh_dc when SPLIT), rest = sh_rest (SPLIT only).
template <bool SPLIT>
void launch_sh_fwd_any(int degree, int64_t n, int k, const float* c, const float* rest, const at::Tensor& means3D,
                       const at::Tensor& campos, at::Tensor& colors) {
    if (n == 0) return;
    const auto stream = at::cuda::getCurrentCUDAStream();
    const float* m = means3D.data_ptr<float>();
    const float* cp = campos.data_ptr<float>();
    float* out = colors.data_ptr<float>();
    switch (degree) {
        case 0: launch_sh_fwd_degree<0, SPLIT>(n, k, c, rest, m, cp, out, stream); break;
        case 1: launch_sh_fwd_degree<1, SPLIT>(n, k, c, rest, m, cp, out, stream); break;
        case 2: launch_sh_fwd_degree<2, SPLIT>(n, k, c, rest, m, cp, out, stream); break;
        default: launch_sh_fwd_degree<3, SPLIT>(n, k, c, rest, m, cp, out, stream); break;
    }
    RIGEL_CHECK_LAUNCH("sh_fwd_kernel");
}

}  // namespace

void launch_sh_fwd(int degree, const at::Tensor& sh_coeffs, const at::Tensor& means3D, const at::Tensor& campos,
                   at::Tensor& colors) {
    launch_sh_fwd_any<false>(degree, means3D.size(0), static_cast<int>(sh_coeffs.size(1)), sh_coeffs.data_ptr<float>(),
                             nullptr, means3D, campos, colors);
}

void launch_sh_fwd_split(int degree, const at::Tensor& sh_dc, const at::Tensor& sh_rest, const at::Tensor& means3D,
                         const at::Tensor& campos, at::Tensor& colors) {
    launch_sh_fwd_any<true>(degree, means3D.size(0), 1 + static_cast<int>(sh_rest.size(1)), sh_dc.data_ptr<float>(),
                            sh_rest.data_ptr<float>(), means3D, campos, colors);
}

}  // namespace rigel
