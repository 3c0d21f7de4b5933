// [0] Spherical-harmonics colour stage, backward: one thread per Gaussian. Gradients to the coefficients
// (v_c_k = Y_k v_raw) and, through the view direction and its normalisation, to the means.
// The clamp colour = max(raw + 0.5, 0) passes the gradient where raw + 0.5 >= 0 (torch.clamp_min).
// The block's coefficient rows are staged through shared memory by coalesced copies, and each thread writes its
// v_sh_coeffs row over its own coefficient row there, which the block then copies out coalesced
// (docs/PIPELINE.md [0]; sh_for_each_staged in sh_common.cuh).
#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>

#include "launch.h"
#include "sh_common.cuh"

namespace rigel {
namespace {

// R_CT, STAGED: as sh_fwd_kernel (sh_fwd.cu).
template <int DEGREE, int R_CT, bool STAGED>
__global__ void __launch_bounds__(kShBlock) sh_bwd_kernel(
    int64_t n, int coeffs_per_gaussian,
    const float* __restrict__ sh_coeffs,  // [N, K, 3]
    const float* __restrict__ means3D,    // [N, 3]
    const float* __restrict__ campos,     // [3]
    const float* __restrict__ v_colors,   // [N, 3]
    float* __restrict__ v_sh_coeffs,      // [N, K, 3] out (bases >= (DEGREE+1)^2 get 0)
    float* __restrict__ v_means3D)        // [N, 3] out
{
    constexpr int kBases = num_sh_bases(DEGREE);
    const int R = R_CT > 0 ? R_CT : 3 * coeffs_per_gaussian;
    const int t = static_cast<int>(threadIdx.x);
    const int64_t g0 = static_cast<int64_t>(blockIdx.x) * kShBlock;
    const int64_t g = g0 + t;
    const int rows = static_cast<int>(n - g0 < kShBlock ? n - g0 : kShBlock);  // the last block may be partial
    // row: the coefficients; vc: where the v_sh_coeffs row goes. Staged, both are the thread's own shared row:
    // the thread reads all of its coefficients before it writes a gradient over them, and no other thread touches
    // that row between the two barriers.
    const float* row;
    float* vc;
    [[maybe_unused]] float* sm = nullptr;
    if constexpr (STAGED) {
        __shared__ float sm_static[R_CT > 0 ? kShBlock * sh_row_stride(R_CT) : 1];
        extern __shared__ float sm_dynamic[];
        sm = R_CT > 0 ? sm_static : sm_dynamic;
        const float* __restrict__ span = sh_coeffs + g0 * R;  // int64: N R may exceed 2^31
        sh_for_each_staged<R_CT>(rows * R, R, [&](int e, int i) { sm[i] = span[e]; });
        __syncthreads();
        row = sm + t * sh_row_stride(R);
        vc = sm + t * sh_row_stride(R);
    } else {
        row = sh_coeffs + g * coeffs_per_gaussian * 3;
        vc = v_sh_coeffs + g * coeffs_per_gaussian * 3;
    }
    if (t < rows) {  // no return: every thread must reach the barrier before the copy out
        if (!sh_row_finite<R_CT>(row, R, means3D + 3 * g)) {  // culled: zero gradients, never NaN
            for (int i = 0; i < R; ++i) vc[i] = 0.f;
            v_means3D[3 * g + 0] = v_means3D[3 * g + 1] = v_means3D[3 * g + 2] = 0.f;
        } else {
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
        }
    }
    if constexpr (STAGED) {
        __syncthreads();  // every gradient row is in shared memory
        float* __restrict__ span = v_sh_coeffs + g0 * R;
        sh_for_each_staged<R_CT>(rows * R, R, [&](int e, int i) { span[e] = sm[i]; });
    }
}

template <int DEGREE>
void launch_sh_bwd_degree(int64_t n, int k, const float* c, const float* m, const float* cp, const float* vcol,
                          float* vc, float* vm, cudaStream_t stream) {
    const unsigned int blocks = num_blocks(n, kShBlock);
    const int64_t r = 3 * static_cast<int64_t>(k);
    if (r == 48) {
        sh_bwd_kernel<DEGREE, 48, true><<<blocks, kShBlock, 0, stream>>>(n, k, c, m, cp, vcol, vc, vm);
    } else if (r < kShMaxStride && sh_row_stride(static_cast<int>(r)) <= kShMaxStride) {
        const size_t smem = sizeof(float) * kShBlock * sh_row_stride(static_cast<int>(r));
        sh_bwd_kernel<DEGREE, 0, true><<<blocks, kShBlock, smem, stream>>>(n, k, c, m, cp, vcol, vc, vm);
    } else {
        sh_bwd_kernel<DEGREE, 0, false><<<blocks, kShBlock, 0, stream>>>(n, k, c, m, cp, vcol, vc, vm);
    }
}

}  // namespace

void launch_sh_bwd(int degree, const at::Tensor& sh_coeffs, const at::Tensor& means3D, const at::Tensor& campos,
                   const at::Tensor& v_colors, at::Tensor& v_sh_coeffs, at::Tensor& v_means3D) {
    const int64_t n = means3D.size(0);
    if (n == 0) return;
    const int k = static_cast<int>(sh_coeffs.size(1));
    const auto stream = at::cuda::getCurrentCUDAStream();
    const float *c = sh_coeffs.data_ptr<float>(), *m = means3D.data_ptr<float>(), *cp = campos.data_ptr<float>();
    const float* vcol = v_colors.data_ptr<float>();
    float *vc = v_sh_coeffs.data_ptr<float>(), *vm = v_means3D.data_ptr<float>();
    switch (degree) {
        case 0: launch_sh_bwd_degree<0>(n, k, c, m, cp, vcol, vc, vm, stream); break;
        case 1: launch_sh_bwd_degree<1>(n, k, c, m, cp, vcol, vc, vm, stream); break;
        case 2: launch_sh_bwd_degree<2>(n, k, c, m, cp, vcol, vc, vm, stream); break;
        default: launch_sh_bwd_degree<3>(n, k, c, m, cp, vcol, vc, vm, stream); break;
    }
    RIGEL_CHECK_LAUNCH("sh_bwd_kernel");
}

}  // namespace rigel
