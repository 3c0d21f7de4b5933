// [0] Spherical-harmonics colour stage, backward: one thread per Gaussian. Gradients to the coefficients
// (v_c_k = Y_k v_raw) and, through the view direction and its normalisation, to the means.
// The clamp colour = max(raw + 0.5, 0) passes the gradient where raw + 0.5 >= 0 (torch.clamp_min).
#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>

#include "launch.h"
#include "sh_common.cuh"

namespace rigel {
namespace {

template <int DEGREE>
__global__ void __launch_bounds__(kBlock1D) sh_bwd_kernel(
    int64_t n, int coeffs_per_gaussian,
    const float* __restrict__ sh_coeffs,  // [N, K, 3]
    const float* __restrict__ means3D,    // [N, 3]
    const float* __restrict__ campos,     // [3]
    const float* __restrict__ v_colors,   // [N, 3]
    float* __restrict__ v_sh_coeffs,      // [N, K, 3] out (bases >= (DEGREE+1)^2 get 0)
    float* __restrict__ v_means3D)        // [N, 3] out
{
    const int64_t g = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
    if (g >= n) return;
    constexpr int kBases = num_sh_bases(DEGREE);
    if (!sh_row_finite(g, coeffs_per_gaussian, sh_coeffs, means3D)) {  // culled: zero gradients, never NaN
        float* vz = v_sh_coeffs + g * coeffs_per_gaussian * 3;
        for (int i = 0; i < 3 * coeffs_per_gaussian; ++i) vz[i] = 0.f;
        v_means3D[3 * g + 0] = v_means3D[3 * g + 1] = v_means3D[3 * g + 2] = 0.f;
        return;
    }
    // recompute the forward (the raw colour says where the clamp is active)
    const ShEval<DEGREE> e = sh_eval<DEGREE>(g, coeffs_per_gaussian, sh_coeffs, means3D, campos);
    const float3 d = e.d;
    const float len = e.len;
    const float* Y = e.Y;
    const float* c = sh_coeffs + g * coeffs_per_gaussian * 3;
    float* vc = v_sh_coeffs + g * coeffs_per_gaussian * 3;
    float v_raw[3];
#pragma unroll
    for (int ch = 0; ch < 3; ++ch) v_raw[ch] = e.raw[ch] + 0.5f >= 0.f ? v_colors[3 * g + ch] : 0.f;

    float w[kBases];  // d loss / d Y_k
#pragma unroll
    for (int k = 0; k < kBases; ++k) {
        w[k] = 0.f;
#pragma unroll
        for (int ch = 0; ch < 3; ++ch) {
            vc[3 * k + ch] = Y[k] * v_raw[ch];
            w[k] += v_raw[ch] * c[3 * k + ch];
        }
    }
    for (int k = kBases; k < coeffs_per_gaussian; ++k)
#pragma unroll
        for (int ch = 0; ch < 3; ++ch) vc[3 * k + ch] = 0.f;

    // Y(dir), dir = delta / |delta|: v_delta = (v_dir - dir (dir . v_dir)) / |delta| (identity at delta = 0)
    const float3 v_dir = sh_basis_vjp<DEGREE>(d.x, d.y, d.z, w);
    float3 v_delta = v_dir;
    if (len > 0.f) {
        const float dot = d.x * v_dir.x + d.y * v_dir.y + d.z * v_dir.z;
        const float inv = 1.f / len;
        v_delta = make_float3((v_dir.x - d.x * dot) * inv, (v_dir.y - d.y * dot) * inv, (v_dir.z - d.z * dot) * inv);
    }
    v_means3D[3 * g + 0] = v_delta.x;
    v_means3D[3 * g + 1] = v_delta.y;
    v_means3D[3 * g + 2] = v_delta.z;
}

}  // namespace

void launch_sh_bwd(int degree, const at::Tensor& sh_coeffs, const at::Tensor& means3D, const at::Tensor& campos,
                   const at::Tensor& v_colors, at::Tensor& v_sh_coeffs, at::Tensor& v_means3D) {
    const int64_t n = means3D.size(0);
    if (n == 0) return;
    const int k = static_cast<int>(sh_coeffs.size(1));
    const auto stream = at::cuda::getCurrentCUDAStream();
    const unsigned int blocks = num_blocks(n, kBlock1D);
    const float *c = sh_coeffs.data_ptr<float>(), *m = means3D.data_ptr<float>(), *cp = campos.data_ptr<float>();
    const float* vcol = v_colors.data_ptr<float>();
    float *vc = v_sh_coeffs.data_ptr<float>(), *vm = v_means3D.data_ptr<float>();
    switch (degree) {
        case 0: sh_bwd_kernel<0><<<blocks, kBlock1D, 0, stream>>>(n, k, c, m, cp, vcol, vc, vm); break;
        case 1: sh_bwd_kernel<1><<<blocks, kBlock1D, 0, stream>>>(n, k, c, m, cp, vcol, vc, vm); break;
        case 2: sh_bwd_kernel<2><<<blocks, kBlock1D, 0, stream>>>(n, k, c, m, cp, vcol, vc, vm); break;
        default: sh_bwd_kernel<3><<<blocks, kBlock1D, 0, stream>>>(n, k, c, m, cp, vcol, vc, vm); break;
    }
    RIGEL_CHECK_LAUNCH("sh_bwd_kernel");
}

}  // namespace rigel
