// [0] Spherical-harmonics colour stage, backward: one thread per Gaussian. Gradients to the coefficients
// (v_c_k = Y_k v_raw) and, through the view direction and its normalisation, to the means.
// The clamp colour = max(raw + 0.5, 0) passes the gradient where raw + 0.5 >= 0 (torch.clamp_min).
// The block's coefficient rows are staged through shared memory by coalesced copies, and each thread writes its
// v_sh_coeffs row over its own coefficient row there, which the block then copies out coalesced
// (docs/PIPELINE.md [0]; sh_stage_rows in sh_common.cuh). sh_colors_split_backward reads the model's sh_dc and
// sh_rest and writes their gradients v_sh_dc, v_sh_rest the same way (two spans each).
#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>

#include "launch.h"
#include "sh_common.cuh"

namespace rigel {
namespace {

// R_CT, STAGED, SPLIT: as sh_fwd_kernel (sh_fwd.cu). SPLIT: the coefficients are sh_dc, sh_rest and the
// coefficient gradients go to v_sh_dc, v_sh_rest, the same values sh_colors_backward writes to v_sh_coeffs.
template <int DEGREE, int R_CT, bool STAGED, bool SPLIT>
__global__ void __launch_bounds__(kShBlock) sh_bwd_kernel(
    int64_t n, int coeffs_per_gaussian,
    const float* __restrict__ sh_coeffs,  // [N, K, 3]; SPLIT: sh_dc [N, 1, 3]
    const float* __restrict__ sh_rest,    // SPLIT: [N, K-1, 3] (null when empty); else unused
    const float* __restrict__ means3D,    // [N, 3]
    const float* __restrict__ campos,     // [3]
    const float* __restrict__ v_colors,   // [N, 3]
    float* __restrict__ v_sh_coeffs,      // [N, K, 3] out (bases >= (DEGREE+1)^2 get 0); SPLIT: v_sh_dc [N, 1, 3]
    float* __restrict__ v_sh_rest,        // SPLIT: [N, K-1, 3] out (null when empty); else unused
    float* __restrict__ v_means3D)        // [N, 3] out
{
    constexpr int kBases = num_sh_bases(DEGREE);
    const int R = R_CT > 0 ? R_CT : 3 * coeffs_per_gaussian;
    const int t = static_cast<int>(threadIdx.x);
    const int64_t g0 = static_cast<int64_t>(blockIdx.x) * kShBlock;
    const int64_t g = g0 + t;
    const int rows = static_cast<int>(n - g0 < kShBlock ? n - g0 : kShBlock);  // the last block may be partial
    // One Gaussian. row: its coefficients; vc: where its v_sh_coeffs row goes (each a pointer or a ShSplitRow).
    // Staged, both are the thread's own shared row: the thread reads all of its coefficients before it writes a
    // gradient over them, and no other thread touches that row between the two barriers.
    auto shade = [&](const auto& row, const auto& vc) {
        if (!sh_row_finite<R_CT>(row, R, means3D + 3 * g)) {  // culled: zero gradients, never NaN
            for (int i = 0; i < R; ++i) vc[i] = 0.f;
            v_means3D[3 * g + 0] = v_means3D[3 * g + 1] = v_means3D[3 * g + 2] = 0.f;
            return;
        }
        // recompute the forward (the raw colour says where the clamp is active)
        const ShEval<DEGREE> e = sh_eval<DEGREE>(row, means3D + 3 * g, campos);
        const float3 d = e.d;
        const float len = e.len;
        const float* Y = e.Y;
        float v_raw[3];
#pragma unroll
        for (int ch = 0; ch < 3; ++ch) v_raw[ch] = e.raw[ch] + 0.5f >= 0.f ? v_colors[3 * g + ch] : 0.f;

        float w[kBases];  // d loss / d Y_k
#pragma unroll
        for (int k = 0; k < kBases; ++k) {
            w[k] = 0.f;
#pragma unroll
            for (int ch = 0; ch < 3; ++ch) w[k] += v_raw[ch] * row[3 * k + ch];
        }
        // only now the gradient row: staged, it overwrites the coefficients just read
#pragma unroll
        for (int k = 0; k < kBases; ++k)
#pragma unroll
            for (int ch = 0; ch < 3; ++ch) vc[3 * k + ch] = Y[k] * v_raw[ch];
        for (int i = 3 * kBases; i < R; ++i) vc[i] = 0.f;

        // Y(dir), dir = delta / |delta|: v_delta = (v_dir - dir (dir . v_dir)) / |delta| (identity at delta = 0)
        const float3 v_dir = sh_basis_vjp<DEGREE>(d.x, d.y, d.z, w);
        float3 v_delta = v_dir;
        if (len > 0.f) {
            const float dot = d.x * v_dir.x + d.y * v_dir.y + d.z * v_dir.z;
            const float inv = 1.f / len;
            v_delta = make_float3((v_dir.x - d.x * dot) * inv, (v_dir.y - d.y * dot) * inv,
                                  (v_dir.z - d.z * dot) * inv);
        }
        v_means3D[3 * g + 0] = v_delta.x;
        v_means3D[3 * g + 1] = v_delta.y;
        v_means3D[3 * g + 2] = v_delta.z;
    };
    if constexpr (STAGED) {
        __shared__ float sm_static[R_CT > 0 ? kShBlock * sh_row_stride(R_CT) : 1];
        extern __shared__ float sm_dynamic[];
        float* sm = R_CT > 0 ? sm_static : sm_dynamic;
        sh_stage_rows<R_CT, SPLIT>(sh_coeffs, sh_rest, g0, rows, R,
                                   [&](const float* __restrict__ p, int e, int i) { sm[i] = p[e]; });
        __syncthreads();
        float* own = sm + t * sh_row_stride(R);
        if (t < rows) shade(static_cast<const float*>(own), own);  // no return: all must reach the barrier below
        __syncthreads();  // every gradient row is in shared memory
        sh_stage_rows<R_CT, SPLIT>(v_sh_coeffs, v_sh_rest, g0, rows, R,
                                   [&](float* __restrict__ p, int e, int i) { p[e] = sm[i]; });
    } else {
        if (t >= rows) return;
        if constexpr (SPLIT) {
            shade(ShSplitRow<const float>{sh_coeffs + 3 * g, sh_rest + (R - 3) * g},
                  ShSplitRow<float>{v_sh_coeffs + 3 * g, v_sh_rest + (R - 3) * g});
        } else {
            shade(sh_coeffs + g * R, v_sh_coeffs + g * R);
        }
    }
}

template <int DEGREE, bool SPLIT>
void launch_sh_bwd_degree(int64_t n, int k, const float* c, const float* rest, const float* m, const float* cp,
                          const float* vcol, float* vc, float* vrest, float* vm, cudaStream_t stream) {
    const unsigned int blocks = num_blocks(n, kShBlock);
    const int64_t r = 3 * static_cast<int64_t>(k);
    if (r == 48) {
        sh_bwd_kernel<DEGREE, 48, true, SPLIT>
            <<<blocks, kShBlock, 0, stream>>>(n, k, c, rest, m, cp, vcol, vc, vrest, vm);
    } else if (r < kShMaxStride && sh_row_stride(static_cast<int>(r)) <= kShMaxStride) {
        const size_t smem = sizeof(float) * kShBlock * sh_row_stride(static_cast<int>(r));
        sh_bwd_kernel<DEGREE, 0, true, SPLIT>
            <<<blocks, kShBlock, smem, stream>>>(n, k, c, rest, m, cp, vcol, vc, vrest, vm);
    } else {
        sh_bwd_kernel<DEGREE, 0, false, SPLIT>
            <<<blocks, kShBlock, 0, stream>>>(n, k, c, rest, m, cp, vcol, vc, vrest, vm);
    }
}

// Both ops: k = K coefficients per Gaussian; c, vc = sh_coeffs and its gradient (sh_dc, v_sh_dc when SPLIT);
// rest, vrest = sh_rest and its gradient (SPLIT only).
template <bool SPLIT>
void launch_sh_bwd_any(int degree, int64_t n, int k, const float* c, const float* rest, const at::Tensor& means3D,
                       const at::Tensor& campos, const at::Tensor& v_colors, float* vc, float* vrest,
                       at::Tensor& v_means3D) {
    if (n == 0) return;
    const auto stream = at::cuda::getCurrentCUDAStream();
    const float *m = means3D.data_ptr<float>(), *cp = campos.data_ptr<float>();
    const float* vcol = v_colors.data_ptr<float>();
    float* vm = v_means3D.data_ptr<float>();
    switch (degree) {
        case 0: launch_sh_bwd_degree<0, SPLIT>(n, k, c, rest, m, cp, vcol, vc, vrest, vm, stream); break;
        case 1: launch_sh_bwd_degree<1, SPLIT>(n, k, c, rest, m, cp, vcol, vc, vrest, vm, stream); break;
        case 2: launch_sh_bwd_degree<2, SPLIT>(n, k, c, rest, m, cp, vcol, vc, vrest, vm, stream); break;
        default: launch_sh_bwd_degree<3, SPLIT>(n, k, c, rest, m, cp, vcol, vc, vrest, vm, stream); break;
    }
    RIGEL_CHECK_LAUNCH("sh_bwd_kernel");
}

}  // namespace

void launch_sh_bwd(int degree, const at::Tensor& sh_coeffs, const at::Tensor& means3D, const at::Tensor& campos,
                   const at::Tensor& v_colors, at::Tensor& v_sh_coeffs, at::Tensor& v_means3D) {
    launch_sh_bwd_any<false>(degree, means3D.size(0), static_cast<int>(sh_coeffs.size(1)), sh_coeffs.data_ptr<float>(),
                             nullptr, means3D, campos, v_colors, v_sh_coeffs.data_ptr<float>(), nullptr, v_means3D);
}

void launch_sh_bwd_split(int degree, const at::Tensor& sh_dc, const at::Tensor& sh_rest, const at::Tensor& means3D,
                         const at::Tensor& campos, const at::Tensor& v_colors, at::Tensor& v_sh_dc,
                         at::Tensor& v_sh_rest, at::Tensor& v_means3D) {
    launch_sh_bwd_any<true>(degree, means3D.size(0), 1 + static_cast<int>(sh_rest.size(1)), sh_dc.data_ptr<float>(),
                            sh_rest.data_ptr<float>(), means3D, campos, v_colors, v_sh_dc.data_ptr<float>(),
                            v_sh_rest.data_ptr<float>(), v_means3D);
}

}  // namespace rigel
