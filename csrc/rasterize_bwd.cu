// [3] Tile rasterization, backward: one 16x16 block per tile, one thread per pixel, entries walked back to
// front. Each pixel recovers the transmittance in front of entry i from the one behind it,
// T_i = T_{i+1} / (1 - alpha_i), starting at final_T, and walks exactly the entries the forward blended:
// positions [0, n_contrib) of its tile list, with the forward's skips re-applied (rasterize_common.cuh); a warp
// visits only the entries before its pixels' largest n_contrib whose footprint reaches its box (box_mask), found
// 32 at a time by one ballot.
//
// With S_i = sum_{j>i} c_j alpha_j T_j + final_T * background (what lies behind entry i):
//   d image / d c_i     = alpha_i T_i
//   d image / d alpha_i = T_i c_i - S_i / (1 - alpha_i),     d final_T / d alpha_i = -final_T / (1 - alpha_i)
// Depth (kDepth): depth_sum = sum_i w_i z_i is one more channel with no background, so with
// S^z_i = sum_{j>i} z_j alpha_j T_j:  d depth_sum / d z_i = alpha_i T_i,
// d depth_sum / d alpha_i = T_i z_i - S^z_i / (1 - alpha_i). The median depth has no gradient.
// then alpha = min(ALPHA_MAX, vis) (zero gradient where clamped), vis = opacity exp(-q/2), q the conic form.
// Per-Gaussian sums are reduced across each warp by a reduce-scatter over the kG values padded
// to 16: at the step with partner lane^o (o = 16, 8, 4, 2) each lane keeps one half of its values (the upper half
// where lane & o) and adds the partner's copy of that half, sent in exchange for the other half — 8 + 4 + 2 + 1
// shuffles leave one value per lane, one more (o = 1) completes its sum in both lanes of a pair. Lane L then holds
// the total of value 8·b4 + 4·b3 + 2·b2 + b1 (b_k = bit k of L): 16 shuffles where a shuffle tree per value takes
// 5·kG (55/60 SHFL in the SASS of that design; measured against it on the H200 at df0558b: docs/BENCHMARKS.md).
// The even lanes add their totals into the tile's per-entry sums in shared memory (s_grad; a compare-and-swap loop
// on sm_90); after each batch thread t adds entry t's kG sums to the global gradients, one atomic per non-zero
// value: one global atomic per value per entry and tile instead of one per warp.
//
// Two forms of the same walk (the per-pixel maths, the staging and the flush are shared below):
// - rasterize_bwd_kernel: 256 threads, one pixel each; warp w owns the 8x4 box w.
// - rasterize_bwd_pair_kernel: 128 threads, two pixels each; warp w owns an 8x8 box, the 8x4 boxes a = (w & 1) +
//   4 (w >> 1) and b = a + 2 (the one below), lane l the pixel l of each. A lane adds its two pixels' gradients
//   before the warp's reduction, so one reduce-scatter and one shared-memory atomic serve two pixels; a pixel whose
//   box bit is clear skips the entry (as its warp does in the one-pixel form). Chosen per launch by
//   RIGEL_RASTER_BWD ("pair" or "pixel"; default below), for measuring one against the other.
#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>

#include <cstdlib>
#include <cstring>

#include "launch.h"
#include "ops.h"
#include "rasterize_common.cuh"

// Blocks per SM the pair form is compiled for (its registers: 65536 / (128 x blocks) at most).
#ifndef RIGEL_BWD_PAIR_BLOCKS
#define RIGEL_BWD_PAIR_BLOCKS 6
#endif

namespace rigel {
namespace {

// v_means2D (2), v_conics (3), v_colors (3), v_opacity, |v_means2D| (2), and v_depth when kDepth
template <bool kDepth>
constexpr int kGradValues = kDepth ? 12 : 11;

// One reduce-scatter step over 2·kHalf values: keep the half selected by (lane & kOff), add the partner's.
template <int kHalf, int kOff>
__device__ __forceinline__ void scatter_step(const float* in, float* out, int lane) {
    const bool upper = (lane & kOff) != 0;
#pragma unroll
    for (int i = 0; i < kHalf; ++i) {
        const float keep = upper ? in[i + kHalf] : in[i];
        const float send = upper ? in[i] : in[i + kHalf];
        out[i] = keep + __shfl_xor_sync(0xffffffffu, send, kOff);
    }
}

// The warp's sum of grad (kG values per lane) added into the entry's shared-memory row (see the top).
template <int kG>
__device__ __forceinline__ void warp_sum_into(const float* grad, float* row, int lane) {
    float a[16], b[8], c[4], d[2], e[1];
#pragma unroll
    for (int i = 0; i < 16; ++i) a[i] = i < kG ? grad[i] : 0.f;
    scatter_step<8, 16>(a, b, lane);
    scatter_step<4, 8>(b, c, lane);
    scatter_step<2, 4>(c, d, lane);
    scatter_step<1, 2>(d, e, lane);
    const float total = e[0] + __shfl_xor_sync(0xffffffffu, e[0], 1);
    const int v = ((lane >> 4) & 1) * 8 + ((lane >> 3) & 1) * 4 + ((lane >> 2) & 1) * 2 + ((lane >> 1) & 1);
    if ((lane & 1) == 0 && v < kG) atomicAdd(row + v, total);  // shared memory
}

// One pixel's backward walk: its incoming gradients and what lies behind the entry being visited.
struct PixelWalk {
    float fx, fy;          // pixel centre
    int last;              // n_contrib: the pixel blended positions [0, last) of its tile's list
    float T, T_final;      // transmittance behind the entry being visited; final_T
    float vr, vg, vb, vT;  // d loss / d image, d loss / d final_T
    float Sr, Sg, Sb;      // colour behind the entry (incl. the background)
    float vD, SD;          // depth_sum's gradient and the depth behind (kDepth only)
};

template <bool kDepth>
__device__ __forceinline__ PixelWalk start_walk(int px, int py, int width, int height, const float* final_T,
                                                const int32_t* n_contrib, const float* v_image,
                                                const float* v_final_T, const float* v_depth_sum,
                                                const float* background) {
    PixelWalk p;
    const bool inside = px < width && py < height;
    const int pix = inside ? py * width + px : 0;
    p.fx = static_cast<float>(px) + 0.5f;
    p.fy = static_cast<float>(py) + 0.5f;
    p.last = inside ? n_contrib[pix] : 0;
    p.T_final = inside ? final_T[pix] : 1.f;
    p.T = p.T_final;
    p.vr = p.vg = p.vb = p.vT = 0.f;
    p.Sr = p.Sg = p.Sb = 0.f;
    p.vD = p.SD = 0.f;
    if (inside) {
        if constexpr (kDepth) p.vD = v_depth_sum[pix];
        p.vr = v_image[3 * pix + 0];
        p.vg = v_image[3 * pix + 1];
        p.vb = v_image[3 * pix + 2];
        p.vT = v_final_T[pix];
        if (background != nullptr) {
            p.Sr = p.T_final * __ldg(background + 0);
            p.Sg = p.T_final * __ldg(background + 1);
            p.Sb = p.T_final * __ldg(background + 2);
        }
    }
    return p;
}

// The staged copy of a batch's entries (kBatch of them) and their per-entry gradient sums.
template <bool kDepth, int kBatch>
struct BwdShared {
    static constexpr int kStride = kGradValues<kDepth> | 1;  // odd: the zeroing and flush rows hit distinct banks
    int32_t id[kBatch];
    float2 xy[kBatch];
    float4 conic_opacity[kBatch];  // (A, 2B, C, opacity)
    float3 rgb[kBatch];
    float z[kDepth ? kBatch : 1];
    uint8_t boxes[kBatch];  // box_mask of each staged entry
    float grad[kBatch * kStride];
    int max_contrib;
};

template <bool kAdd>
__device__ __forceinline__ void put(float& slot, float value) {
    if constexpr (kAdd) slot += value;
    else slot = value;
}

// Pixel p's gradient of staged entry j, at list position `position`, written (kAdd false) or added (kAdd true)
// into grad[kGradValues]; p's walk steps in front of the entry. False, with grad and p untouched, where the pixel
// did not blend the entry.
template <bool kDepth, bool kAdd, int kBatch>
__device__ __forceinline__ bool pixel_entry_grad(PixelWalk& p, int position, const BwdShared<kDepth, kBatch>& sh,
                                                 int j, float* grad) {
    constexpr int kG = kGradValues<kDepth>;
    if (position >= p.last) return false;
    const float4 co = sh.conic_opacity[j];
    const float2 xy = sh.xy[j];
    const float dx = __fsub_rn(p.fx, xy.x), dy = __fsub_rn(p.fy, xy.y);
    const float q = quadratic_form(co.x, co.y, co.z, dx, dy);
    float G, vis, alpha;
    if (!fragment_alpha(q, co.w, G, vis, alpha)) return false;
    const float one_minus = 1.f - alpha;
    const float T_i = p.T / one_minus;  // transmittance in front of this entry
    const float3 c = sh.rgb[j];
    const float w = alpha * T_i;
    put<kAdd>(grad[5], p.vr * w);  // v_colors
    put<kAdd>(grad[6], p.vg * w);
    put<kAdd>(grad[7], p.vb * w);
    const float inv = 1.f / one_minus;
    float v_alpha = p.vr * (T_i * c.x - p.Sr * inv) + p.vg * (T_i * c.y - p.Sg * inv) +
                    p.vb * (T_i * c.z - p.Sb * inv) - p.vT * p.T_final * inv;
    if constexpr (kDepth) {
        const float z = sh.z[j];
        v_alpha += p.vD * (T_i * z - p.SD * inv);
        p.SD += z * w;
        put<kAdd>(grad[kG - 1], p.vD * w);  // v_depth
    }
    p.Sr += c.x * w;
    p.Sg += c.y * w;
    p.Sb += c.z * w;
    p.T = T_i;
    const float v_vis = vis <= kAlphaMaxF ? v_alpha : 0.f;
    put<kAdd>(grad[8], v_vis * G);           // v_opacity
    const float v_q = -0.5f * v_vis * vis;  // d vis / d q = -vis / 2
    const float A = co.x, B = 0.5f * co.y, C = co.z;
    put<kAdd>(grad[2], v_q * dx * dx);        // v_A
    put<kAdd>(grad[3], v_q * 2.f * dx * dy);  // v_B
    put<kAdd>(grad[4], v_q * dy * dy);        // v_C
    // dq/du = -2 (A dx + B dy), dq/dv = -2 (B dx + C dy)
    const float g0 = -2.f * v_q * (A * dx + B * dy), g1 = -2.f * v_q * (B * dx + C * dy);
    put<kAdd>(grad[0], g0);
    put<kAdd>(grad[1], g1);
    put<kAdd>(grad[9], fabsf(g0));  // per pixel |d loss / d means2D|, summed
    put<kAdd>(grad[10], fabsf(g1));
    return true;
}

template <bool kDepth, int kBatch>
__device__ __forceinline__ void stage_entry(BwdShared<kDepth, kBatch>& sh, int slot, int32_t id,
                                            const float* means2D, const float* conics, const float* colors,
                                            const float* opacities, const float* depths, int tile_x0, int tile_y0) {
    sh.id[slot] = id;
    const float2 xy = make_float2(means2D[2 * id + 0], means2D[2 * id + 1]);
    const float4 co = make_float4(conics[3 * id + 0], 2.f * conics[3 * id + 1], conics[3 * id + 2], opacities[id]);
    sh.xy[slot] = xy;
    sh.conic_opacity[slot] = co;
    sh.boxes[slot] = static_cast<uint8_t>(box_mask(xy.x, xy.y, co.x, co.y, co.z, co.w, tile_x0, tile_y0));
    sh.rgb[slot] = make_float3(colors[3 * id + 0], colors[3 * id + 1], colors[3 * id + 2]);
    if constexpr (kDepth) sh.z[slot] = depths[id];
}

// Entry `slot`'s sums to the global gradients (one atomic per non-zero value; zero where no warp blended it);
// the row is cleared for the next batch.
template <bool kDepth, int kBatch>
__device__ __forceinline__ void flush_entry(BwdShared<kDepth, kBatch>& sh, int slot, float* v_means2D,
                                            float* v_conics, float* v_colors, float* v_opacities,
                                            float* v_means2D_abs, float* v_depths) {
    constexpr int kG = kGradValues<kDepth>;
    const int32_t id = sh.id[slot];
    float* row = sh.grad + slot * BwdShared<kDepth, kBatch>::kStride;
#pragma unroll
    for (int v = 0; v < kG; ++v) {
        const float total = row[v];
        row[v] = 0.f;
        if (total == 0.f) continue;
        float* dst = v < 2    ? v_means2D + 2 * id + v
                     : v < 5  ? v_conics + 3 * id + (v - 2)
                     : v < 8  ? v_colors + 3 * id + (v - 5)
                     : v == 8 ? v_opacities + id
                     : v < 11 ? v_means2D_abs + 2 * id + (v - 9)
                              : v_depths + id;  // v == 11 only when kDepth
        atomicAdd(dst, total);
    }
}

// The walk shared by both forms: kThreads threads, kPixels pixels per thread (1 or 2). Pixel k of thread `tid`
// lies in the 8x4 box box_of[k] (a warp-uniform choice; pixel k of every lane in the same box).
template <bool kDepth, int kThreads, int kPixels>
__device__ __forceinline__ void rasterize_bwd_walk(
    int width, int height, int tiles_x, const int32_t* __restrict__ tile_ranges,
    const int32_t* __restrict__ gaussian_ids, const float* __restrict__ means2D, const float* __restrict__ conics,
    const float* __restrict__ colors, const float* __restrict__ opacities, const float* __restrict__ background,
    const float* __restrict__ final_T, const int32_t* __restrict__ n_contrib, const float* __restrict__ v_image,
    const float* __restrict__ v_final_T, float* __restrict__ v_means2D, float* __restrict__ v_conics,
    float* __restrict__ v_colors, float* __restrict__ v_opacities, float* __restrict__ v_means2D_abs,
    const float* __restrict__ depths, const float* __restrict__ v_depth_sum, float* __restrict__ v_depths,
    BwdShared<kDepth, kThreads>& sh, const int (&box_of)[kPixels]) {
    constexpr int kG = kGradValues<kDepth>;
    constexpr int kStride = BwdShared<kDepth, kThreads>::kStride;
    const int tile = blockIdx.y * tiles_x + blockIdx.x;
    const int tid = threadIdx.x;
    const int lane = tid & 31;
    const int tile_x0 = blockIdx.x * kTileSize, tile_y0 = blockIdx.y * kTileSize;

    PixelWalk px[kPixels];
    int last = 0;
    uint32_t warp_boxes = 0u;  // the box bits of this warp's pixels
#pragma unroll
    for (int k = 0; k < kPixels; ++k) {
        int bx, by;
        box_pixel(box_of[k] * 32 + lane, bx, by);
        px[k] = start_walk<kDepth>(tile_x0 + bx, tile_y0 + by, width, height, final_T, n_contrib, v_image,
                                   v_final_T, v_depth_sum, background);
        last = max(last, px[k].last);
        warp_boxes |= 1u << box_of[k];
    }
    if (tid == 0) sh.max_contrib = 0;
#pragma unroll
    for (int i = 0; i < kStride; ++i) sh.grad[tid * kStride + i] = 0.f;
    __syncthreads();
    if (last > 0) atomicMax(&sh.max_contrib, last);
    __syncthreads();
    const int start = tile_ranges[2 * tile + 0];
    const int stop = start + sh.max_contrib;  // no pixel of the tile blended anything beyond
    const int warp_last = __reduce_max_sync(0xffffffffu, last);  // nor of this warp beyond its own position

    for (int batch_end = stop; batch_end > start; batch_end -= kThreads) {
        const int batch_start = max(start, batch_end - kThreads);
        __syncthreads();  // the previous batch is no longer read
        if (batch_start + tid < batch_end)
            stage_entry<kDepth, kThreads>(sh, tid, gaussian_ids[batch_start + tid], means2D, conics, colors,
                                          opacities, depths, tile_x0, tile_y0);
        __syncthreads();
        // Entry j of the batch, walked back to front by every lane of the warp (collectives inside).
        auto visit = [&](int j) {
            const int position = batch_start - start + j;  // 0-based place in the tile's list
            float grad[kG];
#pragma unroll
            for (int i = 0; i < kG; ++i) grad[i] = 0.f;
            bool active = false;
            if constexpr (kPixels == 1) {
                active = pixel_entry_grad<kDepth, false>(px[0], position, sh, j, grad);
            } else {
                const uint32_t bits = sh.boxes[j];
#pragma unroll
                for (int k = 0; k < kPixels; ++k)  // a clear box bit: no pixel of that box blends the entry
                    if (bits >> box_of[k] & 1u)
                        active |= pixel_entry_grad<kDepth, true>(px[k], position, sh, j, grad);
            }
            if (!__any_sync(0xffffffffu, active)) return;  // nothing for this Gaussian in this warp
            warp_sum_into<kG>(grad, sh.grad + j * kStride, lane);
        };
        // 32 entries at a time, from the back: one ballot gives the warp the entries it may have blended (inside
        // one of its boxes, before its last n_contrib; warp-uniform); a full word is walked as a plain loop, any
        // other word visits its set bits only.
        const int n = batch_end - batch_start;
        for (int j0 = (n - 1) & ~31; j0 >= 0; j0 -= 32) {
            const int jl = j0 + lane;
            uint32_t word = __ballot_sync(0xffffffffu, jl < n && batch_start - start + jl < warp_last &&
                                                           (sh.boxes[jl] & warp_boxes) != 0u);
            if (word == 0xffffffffu) {
                for (int j = j0 + 31; j >= j0; --j) visit(j);
            } else {
                while (word != 0u) {
                    const int bit = 31 - __clz(word);
                    visit(j0 + bit);
                    word &= ~(1u << bit);
                }
            }
        }
        __syncthreads();  // every warp's sums of this batch are in sh.grad
        if (tid < n)
            flush_entry<kDepth, kThreads>(sh, tid, v_means2D, v_conics, v_colors, v_opacities, v_means2D_abs,
                                          v_depths);
    }
}

#define RIGEL_BWD_PARAMS                                                                                        \
    int width, int height, int tiles_x, const int32_t *__restrict__ tile_ranges,                              \
        const int32_t *__restrict__ gaussian_ids, const float *__restrict__ means2D,                           \
        const float *__restrict__ conics, const float *__restrict__ colors, const float *__restrict__ opacities, \
        const float *__restrict__ background, const float *__restrict__ final_T,                               \
        const int32_t *__restrict__ n_contrib, const float *__restrict__ v_image,                              \
        const float *__restrict__ v_final_T, float *__restrict__ v_means2D, float *__restrict__ v_conics,      \
        float *__restrict__ v_colors, float *__restrict__ v_opacities, float *__restrict__ v_means2D_abs,      \
        const float *__restrict__ depths, const float *__restrict__ v_depth_sum, float *__restrict__ v_depths
#define RIGEL_BWD_ARGS                                                                                         \
    width, height, tiles_x, tile_ranges, gaussian_ids, means2D, conics, colors, opacities, background, final_T, \
        n_contrib, v_image, v_final_T, v_means2D, v_conics, v_colors, v_opacities, v_means2D_abs, depths,      \
        v_depth_sum, v_depths

// 5 blocks per SM: the warp boxes took the kernel from 45 to 56 registers (4 blocks); bounded, 48 and no spills.
// 5 blocks also take ~5 x 25 KB of shared memory (the gradient rows are ~half of it; sm_90 has 228 KB per SM).
template <bool kDepth>
__global__ void __launch_bounds__(kTilePixels, 5) rasterize_bwd_kernel(RIGEL_BWD_PARAMS) {
    __shared__ BwdShared<kDepth, kTilePixels> sh;
    const int box_of[1] = {static_cast<int>(threadIdx.x >> 5)};
    rasterize_bwd_walk<kDepth, kTilePixels, 1>(RIGEL_BWD_ARGS, sh, box_of);
}

constexpr int kPairThreads = kTilePixels / 2;
static_assert(kBoxCols == 2 && kBoxRows % 2 == 0, "a warp of the pair form owns two 8x4 boxes, one above the other");

template <bool kDepth>
__global__ void __launch_bounds__(kPairThreads, RIGEL_BWD_PAIR_BLOCKS) rasterize_bwd_pair_kernel(RIGEL_BWD_PARAMS) {
    __shared__ BwdShared<kDepth, kPairThreads> sh;
    const int warp = static_cast<int>(threadIdx.x >> 5);
    const int box_a = (warp & 1) + kBoxCols * 2 * (warp >> 1);
    const int box_of[2] = {box_a, box_a + kBoxCols};
    rasterize_bwd_walk<kDepth, kPairThreads, 2>(RIGEL_BWD_ARGS, sh, box_of);
}

#undef RIGEL_BWD_PARAMS
#undef RIGEL_BWD_ARGS

// RIGEL_RASTER_BWD=pair selects the pair form, "pixel" the one-pixel form (read at each launch, so that a test
// can run both in one process).
bool rasterize_bwd_pair_form() {
    const char* v = std::getenv("RIGEL_RASTER_BWD");
    return v != nullptr && std::strcmp(v, "pair") == 0;
}

template <typename Kernel>
void launch_bwd(Kernel kernel, int threads, int width, int height, const at::Tensor& means2D,
                const at::Tensor& conics, const at::Tensor& colors, const at::Tensor& opacities,
                const at::Tensor& gaussian_ids, const at::Tensor& tile_ranges, const float* bg,
                const at::Tensor& final_T, const at::Tensor& n_contrib, const at::Tensor& v_image,
                const at::Tensor& v_final_T, at::Tensor& v_means2D, at::Tensor& v_conics, at::Tensor& v_colors,
                at::Tensor& v_opacities, at::Tensor& v_means2D_abs, const float* depths, const float* v_depth_sum,
                float* v_depths) {
    const int tiles_x = (width + kTileSize - 1) / kTileSize, tiles_y = (height + kTileSize - 1) / kTileSize;
    kernel<<<dim3(tiles_x, tiles_y), threads, 0, at::cuda::getCurrentCUDAStream()>>>(
        width, height, tiles_x, tile_ranges.data_ptr<int32_t>(), gaussian_ids.data_ptr<int32_t>(),
        means2D.data_ptr<float>(), conics.data_ptr<float>(), colors.data_ptr<float>(), opacities.data_ptr<float>(),
        bg, final_T.data_ptr<float>(), n_contrib.data_ptr<int32_t>(), v_image.data_ptr<float>(),
        v_final_T.data_ptr<float>(), v_means2D.data_ptr<float>(), v_conics.data_ptr<float>(),
        v_colors.data_ptr<float>(), v_opacities.data_ptr<float>(), v_means2D_abs.data_ptr<float>(), depths,
        v_depth_sum, v_depths);
}

}  // namespace

void launch_rasterize_bwd(const at::Tensor& means2D, const at::Tensor& conics, const at::Tensor& colors,
                          const at::Tensor& opacities, const at::Tensor& gaussian_ids, const at::Tensor& tile_ranges,
                          int width, int height, const c10::optional<at::Tensor>& background,
                          const at::Tensor& final_T, const at::Tensor& n_contrib, const at::Tensor& v_image,
                          const at::Tensor& v_final_T, at::Tensor& v_means2D, at::Tensor& v_conics,
                          at::Tensor& v_colors, at::Tensor& v_opacities, at::Tensor& v_means2D_abs,
                          const c10::optional<at::Tensor>& depths, const c10::optional<at::Tensor>& v_depth_sum,
                          const c10::optional<at::Tensor>& v_depths) {
    if (means2D.size(0) == 0) return;
    const float* bg = background.has_value() ? background->data_ptr<float>() : nullptr;
    const bool pair = rasterize_bwd_pair_form();
    const int threads = pair ? kPairThreads : kTilePixels;
    if (depths.has_value()) {
        launch_bwd(pair ? rasterize_bwd_pair_kernel<true> : rasterize_bwd_kernel<true>, threads, width, height,
                   means2D, conics, colors, opacities, gaussian_ids, tile_ranges, bg, final_T, n_contrib, v_image,
                   v_final_T, v_means2D, v_conics, v_colors, v_opacities, v_means2D_abs, depths->data_ptr<float>(),
                   v_depth_sum->data_ptr<float>(), v_depths->data_ptr<float>());
    } else {
        launch_bwd(pair ? rasterize_bwd_pair_kernel<false> : rasterize_bwd_kernel<false>, threads, width, height,
                   means2D, conics, colors, opacities, gaussian_ids, tile_ranges, bg, final_T, n_contrib, v_image,
                   v_final_T, v_means2D, v_conics, v_colors, v_opacities, v_means2D_abs, nullptr, nullptr, nullptr);
    }
    RIGEL_CHECK_LAUNCH("rasterize_bwd_kernel");
}

}  // namespace rigel
