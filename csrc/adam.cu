// Adam over every parameter group of the trainer in one launch (rigel_core.train.optim.Adam.step).
//
// For each element, with g its gradient, t = step + 1 the group's step count after this update (Kingma & Ba 2015,
// Algorithm 1; eps outside the bias-corrected root, as PyTorch's Adam):
//   m <- b1 m + (1 - b1) g,   v <- b2 v + (1 - b2) g^2,
//   p <- p - (lr / (1 - b1^t)) * m / (sqrt(v) / sqrt(1 - b2^t) + eps).
// A group's learning rate is a host float or, under CUDA-graph capture, read from a device scalar at run time.
// With skip_zero_grad (TrainConfig.sparse_adam) an element whose gradient is exactly 0 is left as it is: parameter
// and moments unchanged, nothing but its gradient read (a Gaussian no pixel of the view reached gets no update, as
// gsplat's visible Adam and 3DGS's sparse Adam; the group's step count still advances).
// When found_inf (a device float, the trainer's NaN guard) is non-zero nothing is written: parameters, moments and
// step counts keep their values (the GradScaler protocol of PyTorch's fused Adam). The step counts are read by
// the update kernel and incremented afterwards by a one-block kernel, so no block can see a half-updated count.
//
// Why one kernel: the six (or eleven, with the MLP appearance) groups are each too small for a launch of their own
// to fill the GPU (160k Gaussians: torch's fused Adam took 0.52 ms a step in six launches on the H200,
// docs/BENCHMARKS.md); here the blocks of all groups run together, each block on 2048 consecutive elements of one
// group.
#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>

#include "common.cuh"
#include "launch.h"

namespace rigel {
namespace {

constexpr int kAdamThreads = 256;
constexpr int kAdamPerThread = 8;
constexpr int64_t kAdamPerBlock = int64_t(kAdamThreads) * kAdamPerThread;

struct AdamLaunch {
    AdamGroupArgs group[kAdamMaxGroups];
    int num_groups;
    const float* found_inf;  // nullptr: always update
    bool skip_zero_grad;     // leave elements whose gradient is exactly 0 untouched
};

__global__ void __launch_bounds__(kAdamThreads) adam_update_kernel(const AdamLaunch args) {
    if (args.found_inf != nullptr && *args.found_inf != 0.f) return;
    int gi = 0;
    while (gi + 1 < args.num_groups && static_cast<int64_t>(blockIdx.x) >= args.group[gi + 1].block_start) ++gi;
    const AdamGroupArgs& a = args.group[gi];
    const float lr = a.lr_ptr != nullptr ? *a.lr_ptr : a.lr;
    const float t = *a.step + 1.f;
    const float step_size = lr / (1.f - powf(a.beta1, t));
    const float bc2_sqrt = sqrtf(1.f - powf(a.beta2, t));
    const int64_t base = (static_cast<int64_t>(blockIdx.x) - a.block_start) * kAdamPerBlock + threadIdx.x;
    float g[kAdamPerThread], m[kAdamPerThread], v[kAdamPerThread], p[kAdamPerThread];
    bool live[kAdamPerThread];
#pragma unroll
    for (int k = 0; k < kAdamPerThread; ++k) {
        const int64_t i = base + int64_t(k) * kAdamThreads;
        g[k] = i < a.n ? a.grad[i] : 0.f;
        live[k] = i < a.n && (!args.skip_zero_grad || g[k] != 0.f);
    }
#pragma unroll
    for (int k = 0; k < kAdamPerThread; ++k) {
        const int64_t i = base + int64_t(k) * kAdamThreads;
        if (live[k]) {
            m[k] = a.exp_avg[i];
            v[k] = a.exp_avg_sq[i];
            p[k] = a.param[i];
        }
    }
#pragma unroll
    for (int k = 0; k < kAdamPerThread; ++k) {
        const int64_t i = base + int64_t(k) * kAdamThreads;
        if (live[k]) {
            const float mk = a.beta1 * m[k] + (1.f - a.beta1) * g[k];
            const float vk = a.beta2 * v[k] + (1.f - a.beta2) * g[k] * g[k];
            a.exp_avg[i] = mk;
            a.exp_avg_sq[i] = vk;
            a.param[i] = p[k] - step_size * mk / (sqrtf(vk) / bc2_sqrt + a.eps);
        }
    }
}

__global__ void adam_count_kernel(const AdamLaunch args) {
    if (args.found_inf != nullptr && *args.found_inf != 0.f) return;
    const int gi = static_cast<int>(threadIdx.x);
    if (gi < args.num_groups) *args.group[gi].step += 1.f;
}

}  // namespace

void launch_adam_step(const std::vector<AdamGroupArgs>& groups, const float* found_inf, bool skip_zero_grad) {
    AdamLaunch args{};
    args.found_inf = found_inf;
    args.skip_zero_grad = skip_zero_grad;
    int64_t blocks = 0;
    for (const AdamGroupArgs& g : groups) {
        AdamGroupArgs& a = args.group[args.num_groups++];
        a = g;
        a.block_start = blocks;
        blocks += (g.n + kAdamPerBlock - 1) / kAdamPerBlock;
    }
    if (args.num_groups == 0) return;
    const auto stream = at::cuda::getCurrentCUDAStream();
    if (blocks > 0) {
        adam_update_kernel<<<static_cast<unsigned>(blocks), kAdamThreads, 0, stream>>>(args);
        RIGEL_CHECK_LAUNCH("adam_update_kernel");
    }
    adam_count_kernel<<<1, 32, 0, stream>>>(args);
    RIGEL_CHECK_LAUNCH("adam_count_kernel");
}

}  // namespace rigel
