// The MCMC budget's Langevin position noise (rigel_core.train.mcmc.add_position_noise; Kheradmand et al. 2024,
// "3D Gaussian Splatting as Markov Chain Monte Carlo", eq. 9 and its opacity gate), one thread per Gaussian:
//
//   noise = c · σ(−k (o − t)) · Σ η,   Σ = R diag(s²) Rᵀ,   c = mcmc_noise_lr · lr_means,
//
// with R the rotation of the normalised quaternion (w, x, y, z), s = min(exp(log_scales), max_scale) (max_scale =
// TrainConfig.mcmc_noise_max_scale × the scene extent, or +inf: the paper's Σ), o = sigmoid(logit), η the
// caller's standard normal draw (N, 3). A non-finite log-scale or logit reads as NaN (the model's activations,
// rigel_core.model), and a non-finite noise component is written as 0 (a non-finite Gaussian stays culled, it is
// not moved). When *ok is false (the NaN guard's skipped step) nothing moves and the noise is 0.
//
// Why a kernel: the PyTorch form is ~60 elementwise launches (the rotation matrices alone ~25); with it beer's
// CUDA-graph step took 3.37 ms after 5000 steps on an H200, with this kernel 2.78 ms (same build and call;
// docs/BENCHMARKS.md, "beer's step again").
#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>

#include "common.cuh"
#include "launch.h"
#include "project_common.cuh"

namespace rigel {
namespace {

// f where v is finite, else NaN (the model's activations of a non-finite parameter)
__device__ __forceinline__ float finite_or_nan(float v, float f) {
    return isfinite(v) ? f : __int_as_float(0x7fc00000);
}

__global__ void __launch_bounds__(kBlock1D) mcmc_noise_kernel(
    int64_t n,
    float* __restrict__ means3D,               // [N, 3] in/out
    const float* __restrict__ quats,           // [N, 4] (w, x, y, z), any norm
    const float* __restrict__ log_scales,      // [N, 3]
    const float* __restrict__ opacity_logits,  // [N]
    const float* __restrict__ eta,             // [N, 3] standard normal
    const float* __restrict__ lr_ptr,          // [1] lr_means on the device, or nullptr: lr
    float lr, float noise_lr, float k, float t, float max_scale,
    const bool* __restrict__ ok,               // [1] or nullptr (always)
    float* __restrict__ noise)                 // [N, 3] out
{
    const int64_t g = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
    if (g >= n) return;
    if (ok != nullptr && !*ok) {
        noise[3 * g + 0] = noise[3 * g + 1] = noise[3 * g + 2] = 0.f;
        return;
    }
    float w = quats[4 * g + 0], x = quats[4 * g + 1], y = quats[4 * g + 2], z = quats[4 * g + 3];
    const float norm = sqrtf(w * w + x * x + y * y + z * z);
    w /= norm, x /= norm, y /= norm, z /= norm;
    float R[3][3];
    quat_to_rotmat(w, x, y, z, R);
    const float e[3] = {eta[3 * g + 0], eta[3 * g + 1], eta[3 * g + 2]};
    float local[3];
#pragma unroll
    for (int i = 0; i < 3; ++i) {  // diag(s²) Rᵀ η
        const float ls = log_scales[3 * g + i];
        const float s = finite_or_nan(ls, fminf(expf(ls), max_scale));  // a non-finite log-scale stays NaN
        local[i] = (R[0][i] * e[0] + R[1][i] * e[1] + R[2][i] * e[2]) * (s * s);
    }
    const float logit = opacity_logits[g];
    const float o = finite_or_nan(logit, 1.f / (1.f + expf(-logit)));
    const float gate = 1.f / (1.f + expf(k * (o - t)));  // sigmoid(−k (o − t))
    const float c = gate * (noise_lr * (lr_ptr != nullptr ? *lr_ptr : lr));
#pragma unroll
    for (int i = 0; i < 3; ++i) {
        float v = (R[i][0] * local[0] + R[i][1] * local[1] + R[i][2] * local[2]) * c;
        v = isfinite(v) ? v : 0.f;
        noise[3 * g + i] = v;
        means3D[3 * g + i] += v;
    }
}

}  // namespace

void launch_mcmc_noise(at::Tensor& means3D, const at::Tensor& quats, const at::Tensor& log_scales,
                       const at::Tensor& opacity_logits, const at::Tensor& eta, const float* lr_ptr, float lr,
                       float noise_lr, float k, float t, float max_scale, const bool* ok, at::Tensor& noise) {
    const int64_t n = means3D.size(0);
    if (n == 0) return;
    mcmc_noise_kernel<<<num_blocks(n, kBlock1D), kBlock1D, 0, at::cuda::getCurrentCUDAStream()>>>(
        n, means3D.data_ptr<float>(), quats.data_ptr<float>(), log_scales.data_ptr<float>(),
        opacity_logits.data_ptr<float>(), eta.data_ptr<float>(), lr_ptr, lr, noise_lr, k, t, max_scale, ok,
        noise.data_ptr<float>());
    RIGEL_CHECK_LAUNCH("mcmc_noise_kernel");
}

}  // namespace rigel
