// Per-fragment maths shared by rasterize_fwd.cu, rasterize_bwd.cu and binning.cu (docs/PIPELINE.md [2], [3]), and
// the raster kernels' tile staging, written once so that forward, backward and the binning footprint cannot drift
// apart.
#pragma once

#include "common.cuh"

namespace rigel {

// q = A dx^2 + 2B dx dy + C dy^2, evaluated as the reference writes it, left to right with every product
// rounded (no fused multiply-add), so that the 3-sigma cut and the footprint test decide on the very float
// the float32 reference computes. B2 = 2B (exact).
__device__ __forceinline__ float quadratic_form(float A, float B2, float C, float dx, float dy) {
    return __fadd_rn(__fadd_rn(__fmul_rn(__fmul_rn(A, dx), dx), __fmul_rn(__fmul_rn(B2, dx), dy)),
                     __fmul_rn(__fmul_rn(C, dy), dy));
}

// Opacity-weighted Gaussian of a fragment: G = exp(-q/2), vis = opacity G, alpha = min(ALPHA_MAX, vis).
// False when the fragment is skipped (beyond the 3-sigma cut, alpha < ALPHA_MIN, or NaN).
__device__ __forceinline__ bool fragment_alpha(float q, float opacity, float& G, float& vis, float& alpha) {
    if (!(q <= kCutoffQF)) return false;
    G = expf(__fmul_rn(-0.5f, q));
    vis = __fmul_rn(opacity, G);
    alpha = fminf(kAlphaMaxF, vis);
    return alpha >= kAlphaMinF;
}

// ---- warp boxes (docs/PIPELINE.md [3] "Warp boxes") ----
// A raster block's 8 warps each own an 8x4 box of the 16x16 tile: warp w covers columns 8 (w & 1) .. +7 and
// rows 4 (w >> 1) .. +3, lane l the pixel (l & 7, l >> 3) of its box. When an entry is staged, its loader
// computes which boxes its footprint {q <= Q} can reach (a bit per warp); the raster kernels gather a warp's bits
// 32 entries at a time with one ballot and visit only the set ones, so a clear bit costs the warp nothing per
// entry.
constexpr int kBoxW = 8, kBoxH = 4, kBoxCols = kTileSize / kBoxW, kBoxRows = kTileSize / kBoxH;
static_assert(kBoxW * kBoxH == 32 && kBoxCols * kBoxRows * 32 == kTilePixels && kBoxCols * kBoxRows <= 8,
              "one warp per box, at most 8 boxes (a byte of bits)");

// Pixel (x, y) within the tile of raster thread tid (tid = threadIdx.y * kTileSize + threadIdx.x).
__device__ __forceinline__ void box_pixel(int tid, int& x, int& y) {
    const int warp = tid >> 5, lane = tid & 31;
    x = (warp % kBoxCols) * kBoxW + lane % kBoxW;
    y = (warp / kBoxCols) * kBoxH + lane / kBoxW;
}

// Bit w clear => no pixel of warp w's box passes fragment_alpha (a set bit promises nothing). Conservative:
//  - Q = min(RADIUS_SIGMA^2, 2 ln(opacity / ALPHA_MIN)), as binning's footprint;
//  - the float q a pixel computes differs from the exact form by at most ~6 ulp of its terms
//    A dx^2 + 2|B dx dy| + C dy^2 <= 2 kappa q, kappa = lambda_max / lambda_min <= (A + C)^2 / det, so the
//    test uses Q' = Q (1 + 1e-6 kappa) + 1e-3; kappa 1e5 and above, or any non-finite or non-positive-definite
//    input: every bit set;
//  - only below that kappa is the float q of a positive-definite conic >= q (1 - 6 ulp kappa) >= 0, so G <= 1
//    and an opacity under ALPHA_MIN (Q < -1e-3) passes nowhere: no bit set. (A needle of kappa ~3e7 can round
//    q to -0.03 and blend at 0.99 ALPHA_MIN: hence the kappa test first.)
//  - det = AC - B^2 is taken with Kahan's difference of products (an fma recovers B^2's rounding), so a
//    needle's determinant keeps its digits;
//  - the ellipse q <= Q' lies inside |dx| <= sqrt(Q' C / det), |dy| <= sqrt(Q' A / det); the box test pads
//    both by 1e-5 relative and 1e-3 px. __logf (absolute error ~2^-21 near 1), __frcp_rn (correctly rounded) and
//    rsqrtf (2 ulp) keep the staging cheap; the margins dwarf their error.
// u, v: means2D; A, B2 = 2B, C: the conic as staged; tile_x0/y0: the tile's first pixel.
__device__ __forceinline__ uint32_t box_mask(float u, float v, float A, float B2, float C, float opacity,
                                             int tile_x0, int tile_y0) {
    constexpr uint32_t kAll = 0xffu;
    const float B = 0.5f * B2;
    const float bb = B * B;
    const float det = fmaf(A, C, -bb) + fmaf(-B, B, bb);  // AC - B^2, Kahan
    if (!(A > 0.f) || !(C > 0.f) || !(det > 0.f) || !(opacity == opacity)) return kAll;
    const float trace = A + C;
    const float inv_det = __frcp_rn(det);
    const float kappa = trace * trace * inv_det;
    if (!(kappa < 1e5f)) return kAll;
    const float Q = fminf(kCutoffQF, 2.f * __logf(fmaxf(opacity, 1e-30f) * (1.f / kAlphaMinF)));
    if (Q < -1e-3f) return 0u;
    const float Qm = (fmaxf(Q, 0.f) * (1.f + 1e-6f * kappa) + 1e-3f) * inv_det;
    const float ex2 = Qm * C, ey2 = Qm * A;  // > 0 here
    const float ex = ex2 * rsqrtf(ex2) * (1.f + 1e-5f) + 1e-3f, ey = ey2 * rsqrtf(ey2) * (1.f + 1e-5f) + 1e-3f;
    if (!(ex < 1e30f) || !(ey < 1e30f) || !(fabsf(u) < 1e30f) || !(fabsf(v) < 1e30f)) return kAll;
    // pixel centres of box column bx: x in [tile_x0 + 8 bx + 0.5, tile_x0 + 8 bx + 7.5]; rows likewise.
    uint32_t cols = 0u, rows = 0u;
#pragma unroll
    for (int bx = 0; bx < kBoxCols; ++bx) {
        const float lo = static_cast<float>(tile_x0 + bx * kBoxW) + 0.5f, hi = lo + static_cast<float>(kBoxW - 1);
        if (u + ex >= lo && u - ex <= hi) cols |= 1u << bx;
    }
#pragma unroll
    for (int by = 0; by < kBoxRows; ++by) {
        const float lo = static_cast<float>(tile_y0 + by * kBoxH) + 0.5f, hi = lo + static_cast<float>(kBoxH - 1);
        if (v + ey >= lo && v - ey <= hi) rows |= 1u << by;
    }
    uint32_t mask = 0u;
#pragma unroll
    for (int by = 0; by < kBoxRows; ++by)
        if (rows >> by & 1u) mask |= cols << (kBoxCols * by);
    return mask;
}

// ---- tile staging (rasterize_fwd.cu, rasterize_bwd.cu) ----
// A raster block stages its tile's sorted entries in shared memory kTilePixels at a time, one entry per thread:
// thread `slot` writes Gaussian `id`'s means2D (s_xy), conic as (A, 2B, C) with its opacity (s_conic_opacity),
// colour (s_rgb), camera-space depth (s_z, kDepth only) and the warp boxes its footprint can reach (s_boxes,
// box_mask). The forward pass walks the batch front to back, the backward pass back to front; both read the same
// staged values, so they cannot disagree on what an entry is.
template <bool kDepth>
__device__ __forceinline__ void stage_entry(
    int slot, int32_t id, int tile_x0, int tile_y0,
    const float* __restrict__ means2D, const float* __restrict__ conics, const float* __restrict__ colors,
    const float* __restrict__ opacities, const float* __restrict__ depths,
    float2* s_xy, float4* s_conic_opacity, float3* s_rgb, float* s_z, uint8_t* s_boxes) {
    const float2 xy = make_float2(means2D[2 * id + 0], means2D[2 * id + 1]);
    const float4 co = make_float4(conics[3 * id + 0], 2.f * conics[3 * id + 1], conics[3 * id + 2], opacities[id]);
    s_xy[slot] = xy;
    s_conic_opacity[slot] = co;
    s_boxes[slot] = static_cast<uint8_t>(box_mask(xy.x, xy.y, co.x, co.y, co.z, co.w, tile_x0, tile_y0));
    s_rgb[slot] = make_float3(colors[3 * id + 0], colors[3 * id + 1], colors[3 * id + 2]);
    if constexpr (kDepth) s_z[slot] = depths[id];
}

}  // namespace rigel
