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
// Per-Gaussian sums over a warp's 32 pixels, in chunks of 8 entries (flush_chunk): the walk writes each entry's
// per-pixel w = alpha_i T_i and u = v_vis G (all the sequential walk has to hand on) to a row of the warp's chunk in
// shared memory, skipping entries no pixel of the warp blended. A chunk (8 entries, fewer at the end of a batch) of
// at least dense_min entries is summed transposed: lane (k, h) adds up entry k's 8 pixels of box row h in
// registers (v_colors = sum v_image w; the geometric terms from sum u, sum u dx, sum u dx^2, dy being constant
// along the row), and a 2-step butterfly over h completes the kG sums — ~20 instructions per entry where a warp
// reduction per entry takes ~16 shuffles and ~45 selects and adds. A shorter chunk takes the per-entry reduction
// instead: a reduce-scatter over the kG values padded to 16 (at the step with partner lane^o, o = 16, 8, 4, 2,
// each lane keeps one half of its values and adds the partner's copy of that half: 8 + 4 + 2 + 1 shuffles, one
// more completes each sum in a lane pair).
// Either way the totals go into the tile's per-entry sums in shared memory (s_grad; a compare-and-swap loop on
// sm_90); after each batch thread t adds entry t's kG sums to the global gradients, one atomic per non-zero value:
// one global atomic per value per entry and tile instead of one per warp.
#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>

#include "launch.h"
#include "ops.h"
#include "rasterize_common.cuh"

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

// Entries per transposed chunk (below) and the padded row of one entry's 32 per-pixel values in s_w / s_u (33:
// a lane walking its entry's row and the lanes writing one row both hit 32 distinct banks).
constexpr int kSlots = kRasterBwdChunk;
constexpr int kSlotStride = 33;
constexpr int kWarps = kTilePixels / 32;
// The transposed sum's lane (k, h) = (lane & 7, lane >> 3) is entry k and box row h: 8 entries, 8 pixels a row, 4 rows
// (the butterfly over h is lane ^ 8, lane ^ 16; value i goes to lane h = i & 3).
static_assert(kSlots == 8 && kBoxW == 8 && kBoxH == 4, "the transposed sum assumes 8 entries of 8x4 pixels");

// 4 blocks per SM: 41.8 KiB of static shared memory per block (44.8 KiB with depth; the static limit is 48 KiB, sm_90
// has 228 KB per SM), 64 registers (5 blocks would cap them at 48: spills).
template <bool kDepth>
__global__ void __launch_bounds__(kTilePixels, 4) rasterize_bwd_kernel(
    int width, int height, int tiles_x,
    const int32_t* __restrict__ tile_ranges,   // [n_tiles, 2]
    const int32_t* __restrict__ gaussian_ids,  // [E]
    const float* __restrict__ means2D,         // [N, 2]
    const float* __restrict__ conics,          // [N, 3]
    const float* __restrict__ colors,          // [N, 3]
    const float* __restrict__ opacities,       // [N]
    const float* __restrict__ background,      // [3] or nullptr
    const float* __restrict__ final_T,         // [H, W]
    const int32_t* __restrict__ n_contrib,     // [H, W]
    const float* __restrict__ v_image,         // [H, W, 3]
    const float* __restrict__ v_final_T,       // [H, W]
    float* __restrict__ v_means2D,             // [N, 2] accumulated
    float* __restrict__ v_conics,              // [N, 3] accumulated
    float* __restrict__ v_colors,              // [N, 3] accumulated
    float* __restrict__ v_opacities,           // [N] accumulated
    float* __restrict__ v_means2D_abs,         // [N, 2] accumulated
    const float* __restrict__ depths,          // [N] (kDepth only)
    const float* __restrict__ v_depth_sum,     // [H, W] (kDepth only)
    float* __restrict__ v_depths,              // [N] accumulated (kDepth only)
    int dense_min)                             // chunks of at least this many entries are summed transposed
{
    constexpr int kG = kGradValues<kDepth>;
    __shared__ int32_t s_id[kTilePixels];
    __shared__ float2 s_xy[kTilePixels];
    __shared__ float4 s_conic_opacity[kTilePixels];  // (A, 2B, C, opacity)
    __shared__ float3 s_rgb[kTilePixels];
    __shared__ float s_z[kDepth ? kTilePixels : 1];
    __shared__ uint8_t s_boxes[kTilePixels];  // box_mask of each staged entry
    // Per-entry sums of the batch over the block's warps, flushed to the global gradients once per entry and tile
    // (stride kStride, odd: in the zeroing and the flush, where each lane walks its own row, the 32 lanes hit
    // distinct banks).
    constexpr int kStride = kG | 1;
    __shared__ float s_grad[kTilePixels * kStride];
    // Per warp, the chunk of up to kSlots entries it blended, one row each: w = alpha T_i and u = v_vis G of every
    // pixel of its box (zero where the pixel did not blend the entry); s_pix holds each pixel's upstream gradient.
    __shared__ float s_w[kWarps][kSlots * kSlotStride];
    __shared__ float s_u[kWarps][kSlots * kSlotStride];
    // (v_r, v_g, v_b, v_depth_sum) of each pixel, box row h of warp w at w * kPixStride + 9 h (rows 9 float4 apart:
    // the transposed sum's 4 rows read at once fall in 4 different bank groups)
    constexpr int kPixRow = kBoxW + 1, kPixStride = kBoxH * kPixRow;
    __shared__ float4 s_pix[kWarps * kPixStride];
    __shared__ int s_max_contrib;

    const int tile = blockIdx.y * tiles_x + blockIdx.x;
    const int tid = threadIdx.y * kTileSize + threadIdx.x;
    const int lane = tid & 31, warp = tid >> 5;
    int bx, by;
    box_pixel(tid, bx, by);
    const int tile_x0 = blockIdx.x * kTileSize, tile_y0 = blockIdx.y * kTileSize;
    const int px = tile_x0 + bx, py = tile_y0 + by;
    const bool inside = px < width && py < height;
    const int pix = inside ? py * width + px : 0;
    const float fx = static_cast<float>(px) + 0.5f, fy = static_cast<float>(py) + 0.5f;

    const int last = inside ? n_contrib[pix] : 0;
    if (tid == 0) s_max_contrib = 0;
#pragma unroll
    for (int i = 0; i < kStride; ++i) s_grad[tid * kStride + i] = 0.f;
    __syncthreads();
    if (last > 0) atomicMax(&s_max_contrib, last);
    __syncthreads();
    const int start = tile_ranges[2 * tile + 0];
    const int stop = start + s_max_contrib;  // no pixel of the tile blended anything beyond
    const int warp_last = __reduce_max_sync(0xffffffffu, last);  // nor of this warp beyond its own position

    const float T_final = inside ? final_T[pix] : 1.f;
    float T = T_final;
    float vr = 0.f, vg = 0.f, vb = 0.f, vT = 0.f;
    float Sr = 0.f, Sg = 0.f, Sb = 0.f;
    float vD = 0.f, SD = 0.f;  // kDepth only
    if (inside) {
        if constexpr (kDepth) vD = v_depth_sum[pix];
        vr = v_image[3 * pix + 0];
        vg = v_image[3 * pix + 1];
        vb = v_image[3 * pix + 2];
        vT = v_final_T[pix];
        if (background != nullptr) {
            Sr = T_final * __ldg(background + 0);
            Sg = T_final * __ldg(background + 1);
            Sb = T_final * __ldg(background + 2);
        }
    }
    s_pix[warp * kPixStride + (lane / kBoxW) * kPixRow + lane % kBoxW] = make_float4(vr, vg, vb, vD);  // own warp
    // A non-finite upstream gradient anywhere in the warp: the per-entry sums only, where a pixel adds to the entries
    // it blended alone (the transposed sum multiplies every pixel's by its w, 0 x NaN where it blended nothing).
    const bool warp_finite = __all_sync(0xffffffffu, isfinite(vr) && isfinite(vg) && isfinite(vb) && isfinite(vD));
    float* const my_w = s_w[warp];
    float* const my_u = s_u[warp];
    // In the transposed sum lane (k, h) = (lane & 7, lane >> 3) takes slot k's pixels 8h .. 8h + 7: box row h,
    // columns 0..7 (box_pixel's layout).
    const int k_slot = lane & (kSlots - 1), h_row = lane / kSlots;
    const int box_x0 = tile_x0 + (warp % kBoxCols) * kBoxW;
    const float fy_row = static_cast<float>(tile_y0 + (warp / kBoxCols) * kBoxH + h_row) + 0.5f;
    int slot_j = 0;  // the batch index of the entry in slot k_slot

    // The kG sums of one entry, gathered over the warp (lane L contributing grad[]), added to its s_grad row.
    auto reduce_to_shared = [&](const float* grad, int j) {
        float a[16], b[8], c[4], d[2], e[1];
#pragma unroll
        for (int i = 0; i < 16; ++i) a[i] = i < kG ? grad[i] : 0.f;
        scatter_step<8, 16>(a, b, lane);
        scatter_step<4, 8>(b, c, lane);
        scatter_step<2, 4>(c, d, lane);
        scatter_step<1, 2>(d, e, lane);
        const float total = e[0] + __shfl_xor_sync(0xffffffffu, e[0], 1);
        const int v = ((lane >> 4) & 1) * 8 + ((lane >> 3) & 1) * 4 + ((lane >> 2) & 1) * 2 + ((lane >> 1) & 1);
        if ((lane & 1) == 0 && v < kG) atomicAdd(&s_grad[j * kStride + v], total);  // shared memory
    };

    // Sum the gradients of the chunk's n entries (rows 0..n-1 of my_w / my_u; warp-uniform n, slot_j set) into
    // s_grad. Transposed (n >= dense_min): lane (k, h) adds up its 8 pixels of entry k in registers, then one
    // butterfly over h; no per-entry warp reduction. Otherwise one warp reduction per entry, each lane its pixel.
    // Either way from the per-fragment (w, u), u = v_vis G, vis = opacity G:
    //   v_color = v_image w,  v_opacity = u,  v_q = -opacity u / 2,
    //   v_conic (A, B, C) = v_q (dx^2, 2 dx dy, dy^2),  v_means2D = opacity u (A dx + B dy, B dx + C dy)
    // (dq/du = -2 (A dx + B dy), dq/dv = -2 (B dx + C dy)); a pixel with u = 0 adds nothing, even to |v_means2D|.
    // A warp with a non-finite upstream gradient (v_image, v_depth_sum) takes the per-entry sums (warp_finite).
    auto flush_chunk = [&](int n) {
        __syncwarp();  // the rows and s_pix are written
        if (n >= dense_min && warp_finite) {
            float g[kG];
#pragma unroll
            for (int i = 0; i < kG; ++i) g[i] = 0.f;
            if (k_slot < n) {
                const float4 co = s_conic_opacity[slot_j];
                const float2 xy = s_xy[slot_j];
                const float A = co.x, B = 0.5f * co.y, C = co.z, op = co.w;
                const float dy = __fsub_rn(fy_row, xy.y);
                const float Bdy = B * dy, Cdy = C * dy;
                float su = 0.f, sux = 0.f, suxx = 0.f, cr = 0.f, cg = 0.f, cb = 0.f, cd = 0.f, au = 0.f, av = 0.f;
                const float* wr = my_w + k_slot * kSlotStride + kBoxW * h_row;
                const float* ur = my_u + k_slot * kSlotStride + kBoxW * h_row;
                const float4* pv = s_pix + warp * kPixStride + kPixRow * h_row;
#pragma unroll
                for (int p = 0; p < kBoxW; ++p) {
                    const float w = wr[p], u = ur[p];
                    const float4 vp = pv[p];
                    const float dx = __fsub_rn(static_cast<float>(box_x0 + p) + 0.5f, xy.x);
                    cr = fmaf(vp.x, w, cr);
                    cg = fmaf(vp.y, w, cg);
                    cb = fmaf(vp.z, w, cb);
                    if constexpr (kDepth) cd = fmaf(vp.w, w, cd);
                    const float t = u * dx;
                    su += u;
                    sux += t;
                    suxx = fmaf(t, dx, suxx);
                    const float mu = fabsf(u * fmaf(A, dx, Bdy)), mv = fabsf(u * fmaf(B, dx, Cdy));
                    au += u != 0.f ? mu : 0.f;
                    av += u != 0.f ? mv : 0.f;
                }
                const float hq = -0.5f * op;  // v_q = hq u
                g[0] = op * (A * sux + Bdy * su);
                g[1] = op * (B * sux + Cdy * su);
                g[2] = hq * suxx;
                g[3] = 2.f * hq * dy * sux;
                g[4] = hq * dy * dy * su;
                g[5] = cr;
                g[6] = cg;
                g[7] = cb;
                g[8] = su;
                g[9] = fabsf(op) * au;
                g[10] = fabsf(op) * av;
                if constexpr (kDepth) g[kG - 1] = cd;
            }
#pragma unroll
            for (int i = 0; i < kG; ++i) {  // over h: the 4 lanes k, k + 8, k + 16, k + 24
                g[i] += __shfl_xor_sync(0xffffffffu, g[i], 8);
                g[i] += __shfl_xor_sync(0xffffffffu, g[i], 16);
            }
            // lane h adds values h, h + 4, h + 8: picked by selects, so that every lane runs the same 3 atomics (a
            // compare-and-swap loop each) instead of 11 divergent ones
#pragma unroll
            for (int r = 0; r < (kG + 3) / 4; ++r) {
                float val = 0.f;
#pragma unroll
                for (int q = 0; q < 4; ++q)
                    if (4 * r + q < kG) val = q == h_row ? g[4 * r + q] : val;
                const int i = 4 * r + h_row;
                if (k_slot < n && i < kG && val != 0.f) atomicAdd(&s_grad[slot_j * kStride + i], val);
            }
        } else {
            for (int k = 0; k < n; ++k) {
                const int j = __shfl_sync(0xffffffffu, slot_j, k);
                const float w = my_w[k * kSlotStride + lane], u = my_u[k * kSlotStride + lane];
                float grad[kG];
#pragma unroll
                for (int i = 0; i < kG; ++i) grad[i] = 0.f;
                if (w != 0.f || u != 0.f) {
                    const float4 co = s_conic_opacity[j];
                    const float2 xy = s_xy[j];
                    const float dx = __fsub_rn(fx, xy.x), dy = __fsub_rn(fy, xy.y);
                    const float A = co.x, B = 0.5f * co.y, C = co.z, op = co.w;
                    grad[5] = vr * w;
                    grad[6] = vg * w;
                    grad[7] = vb * w;
                    if constexpr (kDepth) grad[kG - 1] = vD * w;
                    grad[8] = u;
                    const float v_q = -0.5f * op * u;
                    grad[2] = v_q * dx * dx;
                    grad[3] = v_q * 2.f * dx * dy;
                    grad[4] = v_q * dy * dy;
                    grad[0] = -2.f * v_q * (A * dx + B * dy);
                    grad[1] = -2.f * v_q * (B * dx + C * dy);
                    grad[9] = fabsf(grad[0]);
                    grad[10] = fabsf(grad[1]);
                }
                reduce_to_shared(grad, j);
            }
        }
        __syncwarp();  // the rows may be written again
    };

    for (int batch_end = stop; batch_end > start; batch_end -= kTilePixels) {
        const int batch_start = max(start, batch_end - kTilePixels);
        __syncthreads();  // the previous batch is no longer read
        const int k = batch_start + tid;
        if (k < batch_end) {
            const int32_t id = gaussian_ids[k];
            s_id[tid] = id;
            stage_entry<kDepth>(tid, id, tile_x0, tile_y0, means2D, conics, colors, opacities, depths, s_xy,
                                s_conic_opacity, s_rgb, s_z, s_boxes);
        }
        __syncthreads();
        int n_slots = 0;  // rows of the chunk filled (warp-uniform)
        // Entry j of the batch, walked back to front by every lane of the warp: the transmittance and what lies
        // behind are carried on, and the entry's (w, u) per pixel take the next row of the chunk when any pixel of
        // the warp blended it.
        auto visit = [&](int j) {
            const int position = batch_start - start + j;  // 0-based place in the tile's list
            float w = 0.f, u = 0.f;
            bool active = false;
            if (position < last) {
                const float4 co = s_conic_opacity[j];
                const float2 xy = s_xy[j];
                const float dx = __fsub_rn(fx, xy.x), dy = __fsub_rn(fy, xy.y);
                const float q = quadratic_form(co.x, co.y, co.z, dx, dy);
                float G, vis, alpha;
                if (fragment_alpha(q, co.w, G, vis, alpha)) {
                    active = true;
                    const float one_minus = 1.f - alpha;
                    const float T_i = T / one_minus;  // transmittance in front of this entry
                    const float3 c = s_rgb[j];
                    w = alpha * T_i;
                    const float inv = 1.f / one_minus;
                    float v_alpha = vr * (T_i * c.x - Sr * inv) + vg * (T_i * c.y - Sg * inv) +
                                    vb * (T_i * c.z - Sb * inv) - vT * T_final * inv;
                    if constexpr (kDepth) {
                        const float z = s_z[j];
                        v_alpha += vD * (T_i * z - SD * inv);
                        SD += z * w;
                    }
                    Sr += c.x * w;
                    Sg += c.y * w;
                    Sb += c.z * w;
                    T = T_i;
                    const float v_vis = vis <= kAlphaMaxF ? v_alpha : 0.f;  // zero where alpha was clamped
                    u = v_vis * G;
                }
            }
            if (!__any_sync(0xffffffffu, active)) return;  // nothing for this Gaussian in this warp
            my_w[n_slots * kSlotStride + lane] = w;
            my_u[n_slots * kSlotStride + lane] = u;
            if (k_slot == n_slots) slot_j = j;
            if (++n_slots == kSlots) {
                flush_chunk(kSlots);
                n_slots = 0;
            }
        };
        // 32 entries at a time, from the back: one ballot gives the warp the entries it may have blended (inside
        // its box, before its last n_contrib; warp-uniform); a full word is walked as a plain loop, any other word
        // visits its set bits only.
        const int n = batch_end - batch_start;
        for (int j0 = (n - 1) & ~31; j0 >= 0; j0 -= 32) {
            const int jl = j0 + lane;
            uint32_t word = __ballot_sync(0xffffffffu, jl < n && batch_start - start + jl < warp_last &&
                                                           (s_boxes[jl] >> warp & 1u));
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
        if (n_slots > 0) flush_chunk(n_slots);  // the staged entries are replaced after this batch
        __syncthreads();  // every warp's sums of this batch are in s_grad
        // One global atomic per value of each entry the tile touched (zero where no warp blended it), instead of
        // one per warp; the slot is cleared for the next batch.
        if (tid < batch_end - batch_start) {
            const int32_t id = s_id[tid];
            float* row = s_grad + tid * kStride;
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
    }
}

}  // namespace

void launch_rasterize_bwd(const at::Tensor& means2D, const at::Tensor& conics, const at::Tensor& colors,
                          const at::Tensor& opacities, const at::Tensor& gaussian_ids, const at::Tensor& tile_ranges,
                          int width, int height, const c10::optional<at::Tensor>& background,
                          const at::Tensor& final_T, const at::Tensor& n_contrib, const at::Tensor& v_image,
                          const at::Tensor& v_final_T, at::Tensor& v_means2D, at::Tensor& v_conics,
                          at::Tensor& v_colors, at::Tensor& v_opacities, at::Tensor& v_means2D_abs,
                          const c10::optional<at::Tensor>& depths, const c10::optional<at::Tensor>& v_depth_sum,
                          const c10::optional<at::Tensor>& v_depths, int dense_min) {
    if (means2D.size(0) == 0) return;
    const int tiles_x = (width + kTileSize - 1) / kTileSize, tiles_y = (height + kTileSize - 1) / kTileSize;
    const dim3 grid(tiles_x, tiles_y), block(kTileSize, kTileSize);
    const auto stream = at::cuda::getCurrentCUDAStream();
    const float* bg = background.has_value() ? background->data_ptr<float>() : nullptr;
    if (depths.has_value()) {
        rasterize_bwd_kernel<true><<<grid, block, 0, stream>>>(
            width, height, tiles_x, tile_ranges.data_ptr<int32_t>(), gaussian_ids.data_ptr<int32_t>(),
            means2D.data_ptr<float>(), conics.data_ptr<float>(), colors.data_ptr<float>(),
            opacities.data_ptr<float>(), bg, final_T.data_ptr<float>(), n_contrib.data_ptr<int32_t>(),
            v_image.data_ptr<float>(), v_final_T.data_ptr<float>(), v_means2D.data_ptr<float>(),
            v_conics.data_ptr<float>(), v_colors.data_ptr<float>(), v_opacities.data_ptr<float>(),
            v_means2D_abs.data_ptr<float>(), depths->data_ptr<float>(), v_depth_sum->data_ptr<float>(),
            v_depths->data_ptr<float>(), dense_min);
    } else {
        rasterize_bwd_kernel<false><<<grid, block, 0, stream>>>(
            width, height, tiles_x, tile_ranges.data_ptr<int32_t>(), gaussian_ids.data_ptr<int32_t>(),
            means2D.data_ptr<float>(), conics.data_ptr<float>(), colors.data_ptr<float>(),
            opacities.data_ptr<float>(), bg, final_T.data_ptr<float>(), n_contrib.data_ptr<int32_t>(),
            v_image.data_ptr<float>(), v_final_T.data_ptr<float>(), v_means2D.data_ptr<float>(),
            v_conics.data_ptr<float>(), v_colors.data_ptr<float>(), v_opacities.data_ptr<float>(),
            v_means2D_abs.data_ptr<float>(), nullptr, nullptr, nullptr, dense_min);
    }
    RIGEL_CHECK_LAUNCH("rasterize_bwd_kernel");
}

}  // namespace rigel
