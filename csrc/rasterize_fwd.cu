// [3] Tile rasterization, forward (docs/PIPELINE.md [3]): one 16x16 block per tile, one thread per pixel,
// front-to-back alpha compositing C = sum_i c_i alpha_i prod_{j<i} (1 - alpha_j) (Kerbl et al. 2023, eq. 3).
// The block stages its tile's entries in shared memory, kTilePixels at a time (one load per thread), with the
// warp boxes each entry can reach (rasterize_common.cuh stage_entry, box_mask; the backward pass stages alike); each warp takes a batch 32 entries at a time,
// one ballot of its box bits, and visits the set ones only (all of them in a plain loop when all are set). A warp
// leaves the batch once all its pixels are done (__all_sync), the block as soon as every pixel of the tile is done
// (__syncthreads_count vote).
// Depth (docs/PIPELINE.md "Depth") comes from the same walk when kDepth: the expected depth sum_i w_i z_i / (1 - T)
// (written into the depth_sum buffer) and the median
// depth (z of the first blended entry after which T <= 1/2; 0 if none). kDepth = false is the colour-only kernel,
// compiled without the depth loads, shared memory or arithmetic.
#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>

#include "launch.h"
#include "rasterize_common.cuh"

namespace rigel {
namespace {

// 6 blocks per SM: the bit-walk took the colour-only kernel from 39 to 47 registers (5 blocks); bounded, 40
// registers and no spills for both instantiations (H200 A/B at aee63a1: raster -5 % at 4K, even at 720p;
// docs/BENCHMARKS.md "Again at aee63a1").
template <bool kDepth>
__global__ void __launch_bounds__(kTilePixels, 6) rasterize_fwd_kernel(
    int width, int height, int tiles_x,
    const int32_t* __restrict__ tile_ranges,   // [n_tiles, 2] [start, end) into gaussian_ids
    const int32_t* __restrict__ gaussian_ids,  // [E] sorted entries
    const float* __restrict__ means2D,         // [N, 2]
    const float* __restrict__ conics,          // [N, 3] (A, B, C)
    const float* __restrict__ colors,          // [N, 3]
    const float* __restrict__ opacities,       // [N]
    const float* __restrict__ background,      // [3] or nullptr (black)
    float* __restrict__ image,                 // [H, W, 3] out
    float* __restrict__ final_T,               // [H, W] out
    int32_t* __restrict__ n_contrib,           // [H, W] out
    const float* __restrict__ depths,          // [N] camera-space z (kDepth only)
    float* __restrict__ depth_sum,             // [H, W] out, sum_i w_i z_i (kDepth only)
    float* __restrict__ depth_median)          // [H, W] out (kDepth only)
{
    __shared__ float2 s_xy[kTilePixels];
    __shared__ float4 s_conic_opacity[kTilePixels];  // (A, 2B, C, opacity)
    __shared__ float3 s_rgb[kTilePixels];
    __shared__ float s_z[kDepth ? kTilePixels : 1];
    __shared__ uint8_t s_boxes[kTilePixels];  // box_mask of each staged entry

    const int tile = blockIdx.y * tiles_x + blockIdx.x;
    const int tid = threadIdx.y * kTileSize + threadIdx.x;
    const int warp = tid >> 5, lane = tid & 31;
    int bx, by;
    box_pixel(tid, bx, by);
    const int tile_x0 = blockIdx.x * kTileSize, tile_y0 = blockIdx.y * kTileSize;
    const int px = tile_x0 + bx, py = tile_y0 + by;
    const bool inside = px < width && py < height;
    const float fx = static_cast<float>(px) + 0.5f, fy = static_cast<float>(py) + 0.5f;

    const int start = tile_ranges[2 * tile + 0], end = tile_ranges[2 * tile + 1];
    bool done = !inside;
    float T = 1.f, r = 0.f, g = 0.f, b = 0.f;
    float dsum = 0.f, dmed = 0.f;  // kDepth only
    int last = 0;
    for (int base = start; base < end; base += kTilePixels) {
        // Everyone votes (and the barrier protects the previous batch); all done -> the block leaves.
        if (__syncthreads_count(done) == kTilePixels) break;
        const int k = base + tid;
        if (k < end)
            stage_entry<kDepth>(tid, gaussian_ids[k], tile_x0, tile_y0, means2D, conics, colors, opacities, depths,
                                s_xy, s_conic_opacity, s_rgb, s_z, s_boxes);
        __syncthreads();
        const int batch = min(kTilePixels, end - base);
        // Blend staged entry j into this pixel (the walk of PIPELINE [3]); sets done at T_MIN.
        auto blend = [&](int j) {
            const float4 co = s_conic_opacity[j];
            const float2 xy = s_xy[j];
            const float q = quadratic_form(co.x, co.y, co.z, __fsub_rn(fx, xy.x), __fsub_rn(fy, xy.y));
            float G, vis, alpha;
            if (!fragment_alpha(q, co.w, G, vis, alpha)) return;
            const float T_new = T * (1.f - alpha);
            if (T_new < kTMinF) {
                done = true;
                return;
            }
            const float w = alpha * T;
            const float3 c = s_rgb[j];
            r += c.x * w;
            g += c.y * w;
            b += c.z * w;
            if constexpr (kDepth) {
                const float z = s_z[j];
                dsum += z * w;
                if (T > 0.5f && T_new <= 0.5f) dmed = z;  // T only falls: this happens once at most
            }
            T = T_new;
            last = base - start + j + 1;
        };
        // 32 entries at a time: one ballot gives the warp the entries whose box bit is set (warp-uniform); a full
        // word walks them in order as a plain loop, any other word visits its set bits only.
        for (int j0 = 0; j0 < batch; j0 += 32) {
            if (__all_sync(0xffffffffu, done)) break;
            const int jl = j0 + lane;
            uint32_t word = __ballot_sync(0xffffffffu, jl < batch && (s_boxes[jl] >> warp & 1u));
            if (word == 0xffffffffu) {
                for (int j = j0; j < j0 + 32 && !done; ++j) blend(j);
            } else {
                while (word != 0u && !done) {
                    blend(j0 + __ffs(word) - 1);
                    word &= word - 1u;  // clear the lowest set bit
                }
            }
        }
    }
    if (!inside) return;
    const int pix = py * width + px;
    float bg_r = 0.f, bg_g = 0.f, bg_b = 0.f;
    if (background != nullptr) {
        bg_r = __ldg(background + 0);
        bg_g = __ldg(background + 1);
        bg_b = __ldg(background + 2);
    }
    image[3 * pix + 0] = r + T * bg_r;
    image[3 * pix + 1] = g + T * bg_g;
    image[3 * pix + 2] = b + T * bg_b;
    final_T[pix] = T;
    n_contrib[pix] = last;
    if constexpr (kDepth) {
        // expected depth sum_i w_i z_i / sum_i w_i, with sum_i w_i = 1 - T exactly (the weights telescope); 0 where
        // nothing was blended. Divided here, so that no pass over the image follows the kernel.
        const float acc = 1.f - T;
        depth_sum[pix] = acc > 0.f ? dsum / acc : 0.f;
        depth_median[pix] = dmed;
    }
}

}  // namespace

void launch_rasterize_fwd(const at::Tensor& means2D, const at::Tensor& conics, const at::Tensor& colors,
                          const at::Tensor& opacities, const at::Tensor& gaussian_ids, const at::Tensor& tile_ranges,
                          int width, int height, const c10::optional<at::Tensor>& background, at::Tensor& image,
                          at::Tensor& final_T, at::Tensor& n_contrib, const c10::optional<at::Tensor>& depths,
                          const c10::optional<at::Tensor>& depth_sum, const c10::optional<at::Tensor>& depth_median) {
    const int tiles_x = (width + kTileSize - 1) / kTileSize, tiles_y = (height + kTileSize - 1) / kTileSize;
    const dim3 grid(tiles_x, tiles_y), block(kTileSize, kTileSize);
    const auto stream = at::cuda::getCurrentCUDAStream();
    const float* bg = background.has_value() ? background->data_ptr<float>() : nullptr;
    if (depths.has_value()) {
        rasterize_fwd_kernel<true><<<grid, block, 0, stream>>>(
            width, height, tiles_x, tile_ranges.data_ptr<int32_t>(), gaussian_ids.data_ptr<int32_t>(),
            means2D.data_ptr<float>(), conics.data_ptr<float>(), colors.data_ptr<float>(),
            opacities.data_ptr<float>(), bg, image.data_ptr<float>(), final_T.data_ptr<float>(),
            n_contrib.data_ptr<int32_t>(), depths->data_ptr<float>(), depth_sum->data_ptr<float>(),
            depth_median->data_ptr<float>());
    } else {
        rasterize_fwd_kernel<false><<<grid, block, 0, stream>>>(
            width, height, tiles_x, tile_ranges.data_ptr<int32_t>(), gaussian_ids.data_ptr<int32_t>(),
            means2D.data_ptr<float>(), conics.data_ptr<float>(), colors.data_ptr<float>(),
            opacities.data_ptr<float>(), bg, image.data_ptr<float>(), final_T.data_ptr<float>(),
            n_contrib.data_ptr<int32_t>(), nullptr, nullptr, nullptr);
    }
    RIGEL_CHECK_LAUNCH("rasterize_fwd_kernel");
}

}  // namespace rigel
