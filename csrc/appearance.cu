// Fused appearance MLP, forward and backward: one thread per Gaussian (rigel_core/renderer/appearance.py is the twin).
//
//   d = normalize(mean - campos)   x = [latent (L), d (3)]   h = relu(W1 x + b1)   rgb = sigmoid(W2 h + b2)
//
// Each block stages the weights in shared memory once and walks the Gaussians grid-stride (the grid is sized to
// fill the GPU, so staging and, in the backward, the final flush happen once per resident block, not once per
// 256 Gaussians). The backward recomputes the hidden layer from the inputs and the saved colours, writes the
// latent (and mean) gradients directly, and reduces the weight gradients in three levels:
//   1. over the 32 lanes of a warp, all the values of one hidden unit at once (warp_transpose_sum: one shuffle
//      per value instead of five);
//   2. over the warps of the block, with shared-memory atomics into a block copy of the gradients;
//   3. over the blocks, with ONE global atomicAdd per weight per block at the end.
#include <string>
#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>

#include "appearance.h"

namespace rigel {
namespace {

constexpr unsigned kFullMask = 0xffffffffu;

// Inside the kernels the input vector is reordered as x = [d (3), latent (L), 0 ... 0] and padded to IN_PAD
// floats (a multiple of 4, for float4 shared loads), so the direction sits at fixed register indices.
// Buckets: IN_PAD = 12 (L <= 9), 28 (L <= 25), 36 (L <= 33, covering the limit 32).
inline int input_bucket(int in_dim) { return in_dim <= 12 ? 12 : (in_dim <= 28 ? 28 : 36); }

// Shared-memory layout (floats; every array starts 16-byte aligned because IN_PAD and 4 are multiples of 4):
//   w1  [H][IN_PAD]  row j = (W1[j, L], W1[j, L+1], W1[j, L+2], W1[j, 0 .. L-1], 0 ...)
//   hid [H][4]       (W2[0, j], W2[1, j], W2[2, j], b1[j])
// The backward adds gradient sums in the same layout (v_w1, v_hid) and v_b2 [4].
// Stages w1 at s_w1, the block's dynamic shared memory, and hid right after it; returns hid (the caller syncs
// before reading either).
template <int IN_PAD>
__device__ __forceinline__ float* stage_weights(float* s_w1, int L, int H, const float* __restrict__ W1,
                                                const float* __restrict__ b1, const float* __restrict__ W2) {
    float* s_hid = s_w1 + H * IN_PAD;
    const int in_dim = L + 3;
    for (int t = threadIdx.x; t < H * IN_PAD; t += blockDim.x) {
        const int j = t / IN_PAD, c = t % IN_PAD;
        float w = 0.f;
        if (c < 3) w = W1[j * in_dim + L + c];
        else if (c - 3 < L) w = W1[j * in_dim + (c - 3)];
        s_w1[t] = w;
    }
    for (int t = threadIdx.x; t < H * 4; t += blockDim.x) {
        const int j = t / 4, k = t % 4;
        s_hid[t] = k < 3 ? W2[k * H + j] : b1[j];
    }
    return s_hid;
}

// x = [d, latent, 0...] of Gaussian g (all zero when !valid or the row is culled); len = |mean - campos| for
// the backward. A mean at the camera centre gives d = 0 (never NaN), as the reference. Returns false for a row
// the cull rule removes (a non-finite latent or mean, docs/PIPELINE.md "Non-finite parameters"): its inputs
// stay 0, so no NaN reaches the shared weight gradients.
template <int IN_PAD>
__device__ __forceinline__ bool load_input(int64_t g, bool valid, int L, const float* __restrict__ latents,
                                           const float* __restrict__ means3D, const float* __restrict__ campos,
                                           float (&x)[IN_PAD], float& len) {
#pragma unroll
    for (int i = 0; i < IN_PAD; ++i) x[i] = 0.f;
    len = 0.f;
    if (!valid) return false;
    // bitwise &: independent loads, not a chain (sh_row_finite in sh_common.cuh)
    bool finite = isfinite(means3D[3 * g + 0]) & isfinite(means3D[3 * g + 1]) & isfinite(means3D[3 * g + 2]);
    for (int i = 0; i < L; ++i) finite &= isfinite(latents[g * L + i]);
    if (!finite) return false;
    const float dx = means3D[3 * g + 0] - __ldg(campos + 0);
    const float dy = means3D[3 * g + 1] - __ldg(campos + 1);
    const float dz = means3D[3 * g + 2] - __ldg(campos + 2);
    len = sqrtf(dx * dx + dy * dy + dz * dz);
    const float den = len > 0.f ? len : 1.f;
    x[0] = dx / den;
    x[1] = dy / den;
    x[2] = dz / den;
    const float* z = latents + g * L;
#pragma unroll
    for (int i = 0; i < IN_PAD - 3; ++i) x[3 + i] = i < L ? z[i] : 0.f;
    return true;
}

// bias + <w1 row, x> (padding columns are 0 in both).
template <int IN_PAD>
__device__ __forceinline__ float hidden_pre(const float* s_w1_row, const float (&x)[IN_PAD], float bias) {
    const float4* w4 = reinterpret_cast<const float4*>(s_w1_row);
    float acc = bias;
#pragma unroll
    for (int q = 0; q < IN_PAD / 4; ++q) {
        const float4 w = w4[q];  // same address in every lane: a shared-memory broadcast
        acc = fmaf(w.x, x[4 * q + 0], acc);
        acc = fmaf(w.y, x[4 * q + 1], acc);
        acc = fmaf(w.z, x[4 * q + 2], acc);
        acc = fmaf(w.w, x[4 * q + 3], acc);
    }
    return acc;
}

__device__ __forceinline__ float sigmoidf(float z) { return 1.f / (1.f + expf(-z)); }

// ---- forward -------------------------------------------------------------------------------------------------
template <int IN_PAD>
__global__ void __launch_bounds__(kAppearanceBlock) appearance_fwd_kernel(
    int64_t n, int L, int H,
    const float* __restrict__ latents,  // [N, L]
    const float* __restrict__ means3D,  // [N, 3]
    const float* __restrict__ campos,   // [3]
    const float* __restrict__ W1,       // [H, L+3]
    const float* __restrict__ b1,       // [H]
    const float* __restrict__ W2,       // [3, H]
    const float* __restrict__ b2,       // [3]
    float* __restrict__ colors)         // [N, 3] out
{
    extern __shared__ float4 smem_fwd[];
    float* s_w1 = reinterpret_cast<float*>(smem_fwd);                 // [H][IN_PAD]
    float* s_hid = stage_weights<IN_PAD>(s_w1, L, H, W1, b1, W2);  // [H][4]
    const float c0 = __ldg(b2 + 0), c1 = __ldg(b2 + 1), c2 = __ldg(b2 + 2);
    __syncthreads();
    const float4* hid4 = reinterpret_cast<const float4*>(s_hid);

    const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
    for (int64_t g = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; g < n; g += stride) {
        float x[IN_PAD];
        float len;
        if (!load_input<IN_PAD>(g, true, L, latents, means3D, campos, x, len)) {  // culled: the NaN marker
            colors[3 * g + 0] = colors[3 * g + 1] = colors[3 * g + 2] = __int_as_float(0x7fc00000);
            continue;
        }
        float z0 = c0, z1 = c1, z2 = c2;
        for (int j = 0; j < H; ++j) {
            const float4 hv = hid4[j];
            const float h = fmaxf(hidden_pre<IN_PAD>(s_w1 + j * IN_PAD, x, hv.w), 0.f);
            z0 = fmaf(hv.x, h, z0);
            z1 = fmaf(hv.y, h, z1);
            z2 = fmaf(hv.z, h, z2);
        }
        colors[3 * g + 0] = sigmoidf(z0);
        colors[3 * g + 1] = sigmoidf(z1);
        colors[3 * g + 2] = sigmoidf(z2);
    }
}

// ---- warp reduction of many values ------------------------------------------------------------------------
// One step of the transpose-reduction: lanes whose bit O is set keep values [O, 2O) (moved to slots [0, O)),
// the others keep [0, O); each adds the partner's (lane ^ O) copy of the values it keeps.
template <int O>
__device__ __forceinline__ void transpose_step(float* v, unsigned lane) {
    if constexpr (O >= 1) {
        const bool upper = (lane & O) != 0;
#pragma unroll
        for (int k = 0; k < O; ++k) {
            const float send = upper ? v[k] : v[k + O];
            const float keep = upper ? v[k + O] : v[k];
            v[k] = keep + __shfl_xor_sync(kFullMask, send, O);
        }
        transpose_step<O / 2>(v, lane);
    }
}

// Sums each of V values (V a power of two <= 32) over the 32 lanes of the warp with V - 1 + log2(32 / V)
// shuffles. On return lane l holds, in v[0], the warp total of value (l mod V); the rest of v is clobbered.
// Example, V = 4: after the step O = 2, lanes with bit 1 set hold partial sums of values 2, 3 in slots 0, 1;
// after O = 1 each lane holds one value (index = its lane bits 1..0) summed over 4 lanes; the xor-shuffles
// with 4, 8, 16 finish the sum over the other lanes holding the same index.
template <int V>
__device__ __forceinline__ void warp_transpose_sum(float (&v)[V], unsigned lane) {
    static_assert(V >= 1 && V <= 32 && (V & (V - 1)) == 0, "V must be a power of two <= 32");
    transpose_step<V / 2>(v, lane);
#pragma unroll
    for (int o = V; o < 32; o *= 2) v[0] += __shfl_xor_sync(kFullMask, v[0], o);
}

// The weight-gradient contributions of one Gaussian for hidden unit j, as one row of R = 4 + IN_PAD values:
//   r = 0: d/db1[j] = v_pre;  r = 1..3: d/dW2[r-1, j] = v_z[r-1] * h;  r = 4 + c: d/dw1[j][c] = v_pre * x[c].
template <int IN_PAD>
__device__ __forceinline__ float row_value(int r, float v_pre, float h, float vz0, float vz1, float vz2,
                                           const float (&x)[IN_PAD]) {
    if (r == 0) return v_pre;
    if (r == 1) return vz0 * h;
    if (r == 2) return vz1 * h;
    if (r == 3) return vz2 * h;
    return (r - 4 < IN_PAD) ? v_pre * x[r - 4] : 0.f;
}

// Positions [BASE, BASE + V) of the row: warp-reduced, then added to the block's shared gradient sums.
template <int BASE, int V, int IN_PAD>
__device__ __forceinline__ void reduce_row_chunk(float v_pre, float h, float vz0, float vz1, float vz2,
                                                 const float (&x)[IN_PAD], unsigned lane, int j, float* s_vw1,
                                                 float* s_vhid) {
    float v[V];
#pragma unroll
    for (int t = 0; t < V; ++t) v[t] = row_value<IN_PAD>(BASE + t, v_pre, h, vz0, vz1, vz2, x);
    warp_transpose_sum<V>(v, lane);
    const int r = BASE + static_cast<int>(lane);
    if (lane < V && r < 4 + IN_PAD) {
        float* dst = r < 4 ? &s_vhid[4 * j + (r == 0 ? 3 : r - 1)] : &s_vw1[j * IN_PAD + (r - 4)];
        atomicAdd(dst, v[0]);
    }
}

template <int IN_PAD>
__device__ __forceinline__ void reduce_row(float v_pre, float h, float vz0, float vz1, float vz2,
                                           const float (&x)[IN_PAD], unsigned lane, int j, float* s_vw1,
                                           float* s_vhid) {
    constexpr int R = 4 + IN_PAD;  // 16, 32 or 40
    if constexpr (R <= 16) {
        reduce_row_chunk<0, 16, IN_PAD>(v_pre, h, vz0, vz1, vz2, x, lane, j, s_vw1, s_vhid);
    } else if constexpr (R <= 32) {
        reduce_row_chunk<0, 32, IN_PAD>(v_pre, h, vz0, vz1, vz2, x, lane, j, s_vw1, s_vhid);
    } else {
        static_assert(R <= 40, "row longer than the chunks below");
        reduce_row_chunk<0, 32, IN_PAD>(v_pre, h, vz0, vz1, vz2, x, lane, j, s_vw1, s_vhid);
        reduce_row_chunk<32, 8, IN_PAD>(v_pre, h, vz0, vz1, vz2, x, lane, j, s_vw1, s_vhid);
    }
}

// ---- backward -------------------------------------------------------------------------------------------------
template <int IN_PAD>
__global__ void __launch_bounds__(kAppearanceBlock) appearance_bwd_kernel(
    int64_t n, int L, int H,
    const float* __restrict__ latents,   // [N, L]
    const float* __restrict__ means3D,   // [N, 3]
    const float* __restrict__ campos,    // [3]
    const float* __restrict__ W1,        // [H, L+3]
    const float* __restrict__ b1,        // [H]
    const float* __restrict__ W2,        // [3, H]
    const float* __restrict__ colors,    // [N, 3] forward output
    const float* __restrict__ v_colors,  // [N, 3]
    float* __restrict__ v_latents,       // [N, L] out (written)
    float* __restrict__ v_means3D,       // [N, 3] out (written) or nullptr
    float* __restrict__ v_W1,            // [H, L+3] accumulated
    float* __restrict__ v_b1,            // [H] accumulated
    float* __restrict__ v_W2,            // [3, H] accumulated
    float* __restrict__ v_b2)            // [3] accumulated
{
    extern __shared__ float4 smem_bwd[];
    float* s_w1 = reinterpret_cast<float*>(smem_bwd);  // [H][IN_PAD]
    float* s_vw1 = s_w1 + H * IN_PAD + 4 * H;           // [H][IN_PAD] gradient sums, after w1 and hid
    float* s_vhid = s_vw1 + H * IN_PAD;                 // [H][4]
    float* s_vb2 = s_vhid + 4 * H;                      // [4]
    float* s_hid = stage_weights<IN_PAD>(s_w1, L, H, W1, b1, W2);  // [H][4]
    for (int t = threadIdx.x; t < H * (IN_PAD + 4) + 4; t += blockDim.x) s_vw1[t] = 0.f;
    __syncthreads();
    const float4* hid4 = reinterpret_cast<const float4*>(s_hid);
    const unsigned lane = threadIdx.x & 31u;

    // The loop bound depends on the block only, so every lane of a warp runs every iteration (the shuffles
    // below need all 32); lanes past N carry zeros.
    const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
    for (int64_t base = static_cast<int64_t>(blockIdx.x) * blockDim.x; base < n; base += stride) {
        const int64_t g = base + threadIdx.x;
        const bool in_range = g < n;
        float x[IN_PAD];
        float len;
        // a culled row (non-finite latent or mean) is carried like a lane past N: zero inputs, zero gradients
        const bool valid = load_input<IN_PAD>(g, in_range, L, latents, means3D, campos, x, len);
        float vz0 = 0.f, vz1 = 0.f, vz2 = 0.f;  // dL/d(pre-sigmoid), sigmoid' = c (1 - c)
        // a colour that overflowed to NaN from finite inputs was culled as well: no gradient from it
        if (valid && isfinite(colors[3 * g + 0]) && isfinite(colors[3 * g + 1]) && isfinite(colors[3 * g + 2])) {
            const float cr = colors[3 * g + 0], cg = colors[3 * g + 1], cb = colors[3 * g + 2];
            vz0 = v_colors[3 * g + 0] * cr * (1.f - cr);
            vz1 = v_colors[3 * g + 1] * cg * (1.f - cg);
            vz2 = v_colors[3 * g + 2] * cb * (1.f - cb);
        }
        float vx[IN_PAD];
#pragma unroll
        for (int i = 0; i < IN_PAD; ++i) vx[i] = 0.f;

        for (int j = 0; j < H; ++j) {
            const float4 hv = hid4[j];
            const float* w_row = s_w1 + j * IN_PAD;
            const float pre = hidden_pre<IN_PAD>(w_row, x, hv.w);
            const bool active = valid && pre > 0.f;  // ReLU passes gradient where pre > 0
            if (!__any_sync(kFullMask, active)) continue;  // warp-uniform: unit j adds nothing for this warp
            const float h = active ? pre : 0.f;
            const float v_pre = active ? fmaf(hv.x, vz0, fmaf(hv.y, vz1, hv.z * vz2)) : 0.f;
            const float4* w4 = reinterpret_cast<const float4*>(w_row);
#pragma unroll
            for (int q = 0; q < IN_PAD / 4; ++q) {
                const float4 w = w4[q];
                vx[4 * q + 0] = fmaf(w.x, v_pre, vx[4 * q + 0]);
                vx[4 * q + 1] = fmaf(w.y, v_pre, vx[4 * q + 1]);
                vx[4 * q + 2] = fmaf(w.z, v_pre, vx[4 * q + 2]);
                vx[4 * q + 3] = fmaf(w.w, v_pre, vx[4 * q + 3]);
            }
            reduce_row<IN_PAD>(v_pre, h, vz0, vz1, vz2, x, lane, j, s_vw1, s_vhid);
        }
        {
            float v[4] = {vz0, vz1, vz2, 0.f};
            warp_transpose_sum<4>(v, lane);
            if (lane < 3) atomicAdd(&s_vb2[lane], v[0]);
        }
        if (in_range) {  // every row's gradients are written; a culled row's are vx = 0 and x = 0, so 0
            float* vl = v_latents + g * L;
#pragma unroll
            for (int i = 0; i < IN_PAD - 3; ++i)
                if (i < L) vl[i] = vx[3 + i];
            if (v_means3D != nullptr) {
                // d = m / |m| with m = mean - campos: dL/dm = (v_d - d <d, v_d>) / |m|; at |m| = 0, d is the
                // constant 0 and dL/dm = v_d (the reference's autograd gives the same).
                const float radial = x[0] * vx[0] + x[1] * vx[1] + x[2] * vx[2];
                const float den = len > 0.f ? len : 1.f;
                v_means3D[3 * g + 0] = (vx[0] - x[0] * radial) / den;
                v_means3D[3 * g + 1] = (vx[1] - x[1] * radial) / den;
                v_means3D[3 * g + 2] = (vx[2] - x[2] * radial) / den;
            }
        }
    }

    // Flush the block's sums: one global atomic per weight per block.
    __syncthreads();
    const int in_dim = L + 3;
    for (int t = threadIdx.x; t < H * in_dim; t += blockDim.x) {
        const int j = t / in_dim, i = t % in_dim;
        const int c = i < L ? i + 3 : i - L;  // column of W1 -> column of the staged row
        atomicAdd(&v_W1[t], s_vw1[j * IN_PAD + c]);
    }
    for (int t = threadIdx.x; t < 4 * H; t += blockDim.x) {
        const int j = t / 4, k = t % 4;
        atomicAdd(k < 3 ? &v_W2[k * H + j] : &v_b1[j], s_vhid[t]);
    }
    if (threadIdx.x < 3) atomicAdd(&v_b2[threadIdx.x], s_vb2[threadIdx.x]);
}

// Blocks to launch: enough for N, at most what the GPU keeps resident (the grid-stride loop does the rest).
template <typename Kernel>
unsigned int grid_size(Kernel kernel, int64_t n, size_t smem_bytes, const char* label) {
    int per_sm = 0;
    cudaError_t err = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, kAppearanceBlock, smem_bytes);
    if (err != cudaSuccess)
        TORCH_CHECK(false, std::string("rigel: occupancy query for ") + label + " failed: " + cudaGetErrorString(err));
    if (per_sm <= 0)
        TORCH_CHECK(false, std::string("rigel: ") + label + " cannot be resident with " + std::to_string(smem_bytes) +
                               " bytes of shared memory");
    const int64_t resident = static_cast<int64_t>(per_sm) * at::cuda::getCurrentDeviceProperties()->multiProcessorCount;
    const int64_t needed = (n + kAppearanceBlock - 1) / kAppearanceBlock;
    return static_cast<unsigned int>(needed < resident ? needed : resident);
}

void check_launch(const char* label) {
    const cudaError_t err = cudaGetLastError();
    if (err != cudaSuccess)
        TORCH_CHECK(false, std::string("rigel: CUDA launch of ") + label + " failed: " + cudaGetErrorString(err));
}

template <int IN_PAD>
void fwd(const at::Tensor& latents, const at::Tensor& means3D, const at::Tensor& campos, const at::Tensor& W1,
         const at::Tensor& b1, const at::Tensor& W2, const at::Tensor& b2, at::Tensor& colors) {
    const int64_t n = latents.size(0);
    const int L = static_cast<int>(latents.size(1)), H = static_cast<int>(W1.size(0));
    const size_t smem = sizeof(float) * static_cast<size_t>(H) * (IN_PAD + 4);
    const unsigned int blocks = grid_size(appearance_fwd_kernel<IN_PAD>, n, smem, "appearance_fwd_kernel");
    appearance_fwd_kernel<IN_PAD><<<blocks, kAppearanceBlock, smem, at::cuda::getCurrentCUDAStream()>>>(
        n, L, H, latents.data_ptr<float>(), means3D.data_ptr<float>(), campos.data_ptr<float>(),
        W1.data_ptr<float>(), b1.data_ptr<float>(), W2.data_ptr<float>(), b2.data_ptr<float>(),
        colors.data_ptr<float>());
    check_launch("appearance_fwd_kernel");
}

template <int IN_PAD>
void bwd(const at::Tensor& latents, const at::Tensor& means3D, const at::Tensor& campos, const at::Tensor& W1,
         const at::Tensor& b1, const at::Tensor& W2, const at::Tensor& colors, const at::Tensor& v_colors,
         at::Tensor& v_latents, at::Tensor& v_means3D, at::Tensor& v_W1, at::Tensor& v_b1, at::Tensor& v_W2,
         at::Tensor& v_b2) {
    const int64_t n = latents.size(0);
    const int L = static_cast<int>(latents.size(1)), H = static_cast<int>(W1.size(0));
    const size_t smem = sizeof(float) * (2 * static_cast<size_t>(H) * (IN_PAD + 4) + 4);
    const unsigned int blocks = grid_size(appearance_bwd_kernel<IN_PAD>, n, smem, "appearance_bwd_kernel");
    appearance_bwd_kernel<IN_PAD><<<blocks, kAppearanceBlock, smem, at::cuda::getCurrentCUDAStream()>>>(
        n, L, H, latents.data_ptr<float>(), means3D.data_ptr<float>(), campos.data_ptr<float>(),
        W1.data_ptr<float>(), b1.data_ptr<float>(), W2.data_ptr<float>(), colors.data_ptr<float>(),
        v_colors.data_ptr<float>(), v_latents.data_ptr<float>(),
        v_means3D.defined() ? v_means3D.data_ptr<float>() : nullptr, v_W1.data_ptr<float>(),
        v_b1.data_ptr<float>(), v_W2.data_ptr<float>(), v_b2.data_ptr<float>());
    check_launch("appearance_bwd_kernel");
}

}  // namespace

void launch_appearance_fwd(const at::Tensor& latents, const at::Tensor& means3D, const at::Tensor& campos,
                           const at::Tensor& W1, const at::Tensor& b1, const at::Tensor& W2, const at::Tensor& b2,
                           at::Tensor& colors) {
    if (latents.size(0) == 0) return;
    switch (input_bucket(static_cast<int>(latents.size(1)) + 3)) {
        case 12: fwd<12>(latents, means3D, campos, W1, b1, W2, b2, colors); break;
        case 28: fwd<28>(latents, means3D, campos, W1, b1, W2, b2, colors); break;
        default: fwd<36>(latents, means3D, campos, W1, b1, W2, b2, colors); break;
    }
}

void launch_appearance_bwd(const at::Tensor& latents, const at::Tensor& means3D, const at::Tensor& campos,
                           const at::Tensor& W1, const at::Tensor& b1, const at::Tensor& W2, const at::Tensor& b2,
                           const at::Tensor& colors, const at::Tensor& v_colors, at::Tensor& v_latents,
                           at::Tensor& v_means3D, at::Tensor& v_W1, at::Tensor& v_b1, at::Tensor& v_W2,
                           at::Tensor& v_b2) {
    (void)b2;  // the backward needs the saved colours, not b2
    if (latents.size(0) == 0) return;
    switch (input_bucket(static_cast<int>(latents.size(1)) + 3)) {
        case 12: bwd<12>(latents, means3D, campos, W1, b1, W2, colors, v_colors, v_latents, v_means3D, v_W1, v_b1, v_W2, v_b2); break;
        case 28: bwd<28>(latents, means3D, campos, W1, b1, W2, colors, v_colors, v_latents, v_means3D, v_W1, v_b1, v_W2, v_b2); break;
        default: bwd<36>(latents, means3D, campos, W1, b1, W2, colors, v_colors, v_latents, v_means3D, v_W1, v_b1, v_W2, v_b2); break;
    }
}

}  // namespace rigel
