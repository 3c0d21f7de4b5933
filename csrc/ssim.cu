// Fused SSIM forward and backward (ssim.h; Wang et al. 2004, eq. 13, with the 3DGS trainer's zero "same" padding).
//
// One block of 16x16 threads per 16x16 output tile of one channel plane (blockIdx.z = b * C + c). The block stages
// its tile plus a 5-pixel halo (26x26, zero outside the image: the zero padding) in shared memory, filters the rows
// (26 rows x 16 output columns, 11 taps) into shared memory, then each thread filters its column (11 taps) and
// finishes its own pixel. The window is symmetric, so correlation and convolution agree.
//
// The trainer's photometric loss runs the same two kernels in their fused form (ssim.h): the forward stages the
// masked images (0 where the per-pixel mask is false) and, instead of writing the map, adds each block's sums of
// m|x - y|, m S, m (x - y)^2 and m into four float64 totals (one atomic per total and block); the backward builds
// the upstream gradient of the map from the totals' gradients (g(p) = v_S m(p)) and adds the L1 and squared-error
// terms, so a training step's loss is two launches instead of ~25 elementwise ones.
#include <cmath>

#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>

#include "common.cuh"
#include "ssim.h"

namespace rigel {

SsimWindow ssim_window() {
    SsimWindow win{};
    double sum = 0.0;
    for (int i = 0; i < kSsimTaps; ++i) {
        const double d = static_cast<double>(i - kSsimRadius);
        win.w[i] = std::exp(-(d * d) / (2.0 * kSsimSigma * kSsimSigma));
        sum += win.w[i];
    }
    for (int i = 0; i < kSsimTaps; ++i) win.w[i] /= sum;
    return win;
}

namespace {

// Element (b, i, j, c) of a contiguous [B, H, W, C] tensor is plane_base + (i * W + j) * C, plane_base = b*H*W*C + c.
// The coefficient planes the forward leaves for the backward (coef) are stored channel-planar instead, element
// (b, i, j, c) of plane k at k * numel + ((b * C + c) * H + i) * W + j: a block's row of 16 pixels then writes and
// reads 16 consecutive values (interleaved with the other channels' blocks, every 32-byte sector of the
// channels-last layout was written by three blocks at different times, a third of it each).
struct Plane {
    int64_t base;       // offset of pixel (0, 0) of this block's channel plane
    int64_t coef_base;  // offset of pixel (0, 0) of this block's plane in a coefficient plane
    int row0;           // image row of halo row 0 (= tile row - radius)
    int col0;           // image column of halo column 0
};

__device__ __forceinline__ Plane block_plane(int H, int W, int C) {
    const int b = static_cast<int>(blockIdx.z) / C, c = static_cast<int>(blockIdx.z) % C;
    return {static_cast<int64_t>(b) * H * W * C + c, static_cast<int64_t>(blockIdx.z) * H * W,
            static_cast<int>(blockIdx.y) * kSsimTile - kSsimRadius, static_cast<int>(blockIdx.x) * kSsimTile - kSsimRadius};
}

// Offset of in-image pixel (gi, gj) of the block's plane in a coefficient plane.
__device__ __forceinline__ int64_t coef_offset(const Plane& p, int gi, int gj, int W) {
    return p.coef_base + static_cast<int64_t>(gi) * W + gj;
}

// Offset of image pixel (gi, gj) of the plane, or -1 when it lies outside the image (zero padding).
__device__ __forceinline__ int64_t pixel_offset(const Plane& p, int gi, int gj, int H, int W, int C) {
    if (gi < 0 || gi >= H || gj < 0 || gj >= W) return -1;
    return p.base + (static_cast<int64_t>(gi) * W + gj) * C;
}

// Adds the block's values of v[0..3] (float64, one per thread) into totals[0..3]: warp shuffles, then one
// shared-memory row per warp, then 4 atomics per block.
__device__ __forceinline__ void add_block_totals(double v[4], double* __restrict__ totals, int tid) {
    __shared__ double part[kSsimThreads / 32][4];
#pragma unroll
    for (int k = 0; k < 4; ++k)
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) v[k] += __shfl_xor_sync(0xffffffffu, v[k], o);
    if ((tid & 31) == 0)
#pragma unroll
        for (int k = 0; k < 4; ++k) part[tid >> 5][k] = v[k];
    __syncthreads();
    if (tid < 4) {
        double t = 0.0;
#pragma unroll
        for (int w = 0; w < kSsimThreads / 32; ++w) t += part[w][tid];
        atomicAdd(totals + tid, t);
    }
}

// The per-pixel mask of element offset o of a [B, H, W, C] tensor: mask [B, H, W] (or nullptr: every pixel counts).
__device__ __forceinline__ bool pixel_counts(const bool* __restrict__ mask, int64_t o, int C) {
    return mask == nullptr || mask[o / C];
}

__device__ __forceinline__ double fused_ma(double a, double b, double c) { return fma(a, b, c); }
__device__ __forceinline__ float fused_ma(float a, float b, float c) { return fmaf(a, b, c); }

// Row pass of NS staged signals: h[s][r][j] = sum_t w[t] * src[s][r][j + t] for the 26 halo rows r and the 16 output
// columns j (output column j's window spans halo columns j .. j + 10). T: double (SsimWindow) or float (SsimWindowF).
template <int NS, typename T, typename Win>
__device__ __forceinline__ void filter_rows(const Win& win, const T (*src)[kSsimSpan][kSsimSpan],
                                            T (*h)[kSsimSpan][kSsimTile], int tid) {
    for (int k = tid; k < kSsimSpan * kSsimTile; k += kSsimThreads) {
        const int r = k / kSsimTile, j = k % kSsimTile;
        T acc[NS];
#pragma unroll
        for (int s = 0; s < NS; ++s) acc[s] = T(0);
#pragma unroll
        for (int t = 0; t < kSsimTaps; ++t) {
#pragma unroll
            for (int s = 0; s < NS; ++s) acc[s] = fused_ma(win.w[t], src[s][r][j + t], acc[s]);
        }
#pragma unroll
        for (int s = 0; s < NS; ++s) h[s][r][j] = acc[s];
    }
}

// Column pass for this thread's output pixel (tile row ty, column tx): out[s] = sum_t w[t] * h[s][ty + t][tx].
template <int NS, typename T, typename Win>
__device__ __forceinline__ void filter_column(const Win& win, const T (*h)[kSsimSpan][kSsimTile], int ty, int tx,
                                              T* out) {
#pragma unroll
    for (int s = 0; s < NS; ++s) out[s] = T(0);
#pragma unroll
    for (int t = 0; t < kSsimTaps; ++t) {
#pragma unroll
        for (int s = 0; s < NS; ++s) out[s] = fused_ma(win.w[t], h[s][ty + t][tx], out[s]);
    }
}

// Row pass of the five SSIM signals x, y, x^2, y^2, xy of the staged images (products and sums in T): h[0..4][r][j].
template <typename T, typename Win>
__device__ __forceinline__ void moments_rows(const Win& win, const float (*sx)[kSsimSpan], const float (*sy)[kSsimSpan],
                                             T (*h)[kSsimSpan][kSsimTile], int tid) {
    for (int k = tid; k < kSsimSpan * kSsimTile; k += kSsimThreads) {
        const int r = k / kSsimTile, j = k % kSsimTile;
        T a[5] = {T(0), T(0), T(0), T(0), T(0)};
#pragma unroll
        for (int t = 0; t < kSsimTaps; ++t) {
            const T x = static_cast<T>(sx[r][j + t]), y = static_cast<T>(sy[r][j + t]);
            const T w = win.w[t];
            a[0] = fused_ma(w, x, a[0]);
            a[1] = fused_ma(w, y, a[1]);
            a[2] = fused_ma(w, x * x, a[2]);
            a[3] = fused_ma(w, y * y, a[3]);
            a[4] = fused_ma(w, x * y, a[4]);
        }
#pragma unroll
        for (int s = 0; s < 5; ++s) h[s][r][j] = a[s];
    }
}

// The backward's last step for this thread's pixel q (after the row pass into h): false when q lies outside the
// image (nothing to write) or is masked out (its gradient, 0, written: a masked-out x(q) is replaced by 0 before
// anything); else true with q's offset o and the column pass f[0..2].
template <typename T, typename Win>
__device__ __forceinline__ bool backward_pixel(const Plane& p, int H, int W, int C, const Win& win,
                                               const T (*h)[kSsimSpan][kSsimTile], const bool* __restrict__ mask,
                                               float* __restrict__ dL_dimg1, int64_t& o, T* f) {
    const int ty = static_cast<int>(threadIdx.y), tx = static_cast<int>(threadIdx.x);
    o = pixel_offset(p, p.row0 + kSsimRadius + ty, p.col0 + kSsimRadius + tx, H, W, C);
    if (o < 0) return false;
    if (!pixel_counts(mask, o, C)) {
        dL_dimg1[o] = 0.f;
        return false;
    }
    filter_column<3>(win, h, ty, tx, f);
    return true;
}

// Stages the halo of both images minus the block's constants (cx = cy = 0: the images themselves; the float32 loss:
// its centring), reading 0 outside the image and where the mask is false.
__device__ __forceinline__ void stage_images(const Plane& p, int H, int W, int C, const float* __restrict__ img1,
                                             const float* __restrict__ img2, const bool* __restrict__ mask, float cx,
                                             float cy, float (*sx)[kSsimSpan], float (*sy)[kSsimSpan], int tid) {
    for (int k = tid; k < kSsimSpan * kSsimSpan; k += kSsimThreads) {
        const int r = k / kSsimSpan, s = k % kSsimSpan;
        const int64_t o = pixel_offset(p, p.row0 + r, p.col0 + s, H, W, C);
        const bool in = o >= 0 && pixel_counts(mask, o, C);
        sx[r][s] = (in ? img1[o] : 0.f) - cx;
        sy[r][s] = (in ? img2[o] : 0.f) - cy;
    }
}

// SSIM of one pixel from its moments (var1, var2, cov central) and the backward's partials, in T:
// S = n1 n2 / (d1 d2): dS/dmu1 = (2 mu2 n2 - 2 mu1 S d2) / (d1 d2), dS/dvar1 = -S / d2, dS/dcov = 2 n1 / (d1 d2).
template <typename T>
__device__ __forceinline__ T ssim_terms(T mu1, T mu2, T var1, T var2, T cov, T& dS_dmu1, T& dS_dvar1, T& dS_dcov) {
    const T n1 = T(2) * mu1 * mu2 + T(kSsimC1), n2 = T(2) * cov + T(kSsimC2);
    const T d1 = mu1 * mu1 + mu2 * mu2 + T(kSsimC1), d2 = var1 + var2 + T(kSsimC2);
    const T S = (n1 * n2) / (d1 * d2);
    dS_dmu1 = T(2) * (mu2 * n2 - mu1 * S * d2) / (d1 * d2);
    dS_dvar1 = -S / d2;
    dS_dcov = T(2) * n1 / (d1 * d2);
    return S;
}

// A counting pixel's share of the loss totals: |x - y|, S, (x - y)^2, 1 (float64; x, y the exact image values).
__device__ __forceinline__ void pixel_sums(float x, float y, double S, double sums[4]) {
    const double d = static_cast<double>(x) - static_cast<double>(y);
    sums[0] = fabs(d);
    sums[1] = S;
    sums[2] = d * d;
    sums[3] = 1.0;
}

// sign(x - y) as autograd's |.| takes it (0 at 0).
template <typename T>
__device__ __forceinline__ T sign_of(T d) {
    return static_cast<T>((d > T(0)) - (d < T(0)));
}

// Stages x and y (float32, exact; 0 where the mask is false), filters the rows of the five signals x, y, x^2, y^2,
// xy (products and sums in float64), then the columns, to mu1, mu2, E[x^2], E[y^2], E[xy], and writes the backward
// coefficients (A, Bc, Cc) of ssim.h per pixel, and either SSIM per pixel (map) or the block's loss sums (totals).
__global__ void __launch_bounds__(kSsimThreads) ssim_fwd_kernel(int H, int W, int C, int64_t numel, SsimWindow win,
                                                                const float* __restrict__ img1,  // [B, H, W, C] x
                                                                const float* __restrict__ img2,  // [B, H, W, C] y
                                                                const bool* __restrict__ mask,   // [B, H, W] or null
                                                                float* __restrict__ map,         // [B, H, W, C] or null
                                                                double* __restrict__ coef,       // [3, B, C, H, W] out (Plane)
                                                                double* __restrict__ totals)     // [4] or null
{
    __shared__ float sx[kSsimSpan][kSsimSpan], sy[kSsimSpan][kSsimSpan];  // 5.3 KiB
    __shared__ double h[5][kSsimSpan][kSsimTile];                         // 16.25 KiB
    const Plane p = block_plane(H, W, C);
    const int tid = static_cast<int>(threadIdx.y) * kSsimTile + static_cast<int>(threadIdx.x);
    stage_images(p, H, W, C, img1, img2, mask, 0.f, 0.f, sx, sy, tid);
    __syncthreads();
    moments_rows(win, sx, sy, h, tid);
    __syncthreads();
    const int ty = static_cast<int>(threadIdx.y), tx = static_cast<int>(threadIdx.x);
    const int i = p.row0 + kSsimRadius + ty, j = p.col0 + kSsimRadius + tx;  // this thread's image pixel
    const int64_t o = pixel_offset(p, i, j, H, W, C);
    double sums[4] = {0.0, 0.0, 0.0, 0.0};  // m |x - y|, m S, m (x - y)^2, m
    if (o >= 0) {
        double m[5];
        filter_column<5>(win, h, ty, tx, m);
        const double mu1 = m[0], mu2 = m[1];
        double dS_dmu1, dS_dvar1, dS_dcov;
        const double S = ssim_terms(mu1, mu2, m[2] - mu1 * mu1, m[3] - mu2 * mu2, m[4] - mu1 * mu2, dS_dmu1, dS_dvar1,
                                    dS_dcov);
        if (map != nullptr) map[o] = static_cast<float>(S);
        const int64_t q = coef_offset(p, i, j, W);
        coef[q] = dS_dmu1 - 2.0 * mu1 * dS_dvar1 - mu2 * dS_dcov;
        coef[numel + q] = dS_dvar1;
        coef[2 * numel + q] = dS_dcov;
        if (totals != nullptr && pixel_counts(mask, o, C))
            pixel_sums(sx[ty + kSsimRadius][tx + kSsimRadius], sy[ty + kSsimRadius][tx + kSsimRadius], S, sums);
    }
    if (totals != nullptr) add_block_totals(sums, totals, tid);  // block-uniform: every thread arrives
}

// Stages g A, g Bc, g Cc (zero outside the image: only in-image pixels p have an SSIM term), filters them and
// combines them with x(q), y(q) into dL/dx(q). g = dL_dmap, or in the fused loss g(p) = v_totals[1] m(p), and then
// dL/dx(q) = m(q) (that + v_totals[0] sign(x - y) + 2 v_totals[2] (x - y)) with x, y the masked images.
__global__ void __launch_bounds__(kSsimThreads) ssim_bwd_kernel(int H, int W, int C, int64_t numel, SsimWindow win,
                                                                const float* __restrict__ dL_dmap,  // [B, H, W, C] or null
                                                                const double* __restrict__ v_totals,  // [4] or null
                                                                const bool* __restrict__ mask,      // [B, H, W] or null
                                                                const float* __restrict__ img1,     // [B, H, W, C]
                                                                const float* __restrict__ img2,     // [B, H, W, C]
                                                                const double* __restrict__ coef,    // [3, B, C, H, W]
                                                                float* __restrict__ dL_dimg1)       // [B, H, W, C] out
{
    __shared__ double sig[3][kSsimSpan][kSsimSpan];  // 15.8 KiB
    __shared__ double h[3][kSsimSpan][kSsimTile];    // 9.75 KiB
    const Plane p = block_plane(H, W, C);
    const int tid = static_cast<int>(threadIdx.y) * kSsimTile + static_cast<int>(threadIdx.x);
    const double v_S = v_totals != nullptr ? v_totals[1] : 0.0;
    for (int k = tid; k < kSsimSpan * kSsimSpan; k += kSsimThreads) {
        const int r = k / kSsimSpan, s = k % kSsimSpan;
        const int64_t o = pixel_offset(p, p.row0 + r, p.col0 + s, H, W, C);
        double a = 0.0, b = 0.0, c = 0.0;
        if (o >= 0) {
            const double g =
                dL_dmap != nullptr ? static_cast<double>(dL_dmap[o]) : (pixel_counts(mask, o, C) ? v_S : 0.0);
            const int64_t q = coef_offset(p, p.row0 + r, p.col0 + s, W);
            a = g * coef[q];
            b = g * coef[numel + q];
            c = g * coef[2 * numel + q];
        }
        sig[0][r][s] = a;
        sig[1][r][s] = b;
        sig[2][r][s] = c;
    }
    __syncthreads();
    filter_rows<3>(win, sig, h, tid);
    __syncthreads();
    int64_t o;
    double f[3];
    if (!backward_pixel(p, H, W, C, win, h, mask, dL_dimg1, o, f)) return;
    const double x = static_cast<double>(img1[o]), y = static_cast<double>(img2[o]);
    double v = f[0] + 2.0 * x * f[1] + y * f[2];
    if (v_totals != nullptr) {
        const double d = x - y;
        v += v_totals[0] * sign_of(d) + 2.0 * v_totals[2] * d;
    }
    dL_dimg1[o] = static_cast<float>(v);
}

// ---- the fused loss in float32, locally centred (photometric_sums with fp32; ssim.h) -------------------------
// The float64 kernels above exist because the moments sigma^2 = E[x^2] - mu^2 and the backward's
// A + 2x B + y Cc cancel (B, Cc ~ 1/C2 ~ 1e3 on flat regions). Both cancellations are of large centred terms, so
// here every block subtracts one constant per image (c_x, c_y: x and y at its tile's first counting pixel, or 0
// when none counts) before anything: the forward filters x' = x - c_x, y' = y - c_y (the zero padding is x = 0,
// i.e. x' = -c_x; the window sums to 1, so var(x') = var(x) exactly and mu(x) = c_x + mu(x')), and the backward
// uses dS/dsigma1^2 * 2 (x(q) - mu1(p)) = 2 B ((x(q) - c_x) - (mu1(p) - c_x)). Near-flat regions then add small
// numbers instead of subtracting large ones. The forward stores per pixel (float32) D = dS/dmu1, B = dS/dsigma1^2,
// Cc = dS/dsigma12, mu1 and mu2, from which the backward block forms its own centred A' = D - 2 (mu1 - c_x) B -
// (mu2 - c_y) Cc.
struct SsimWindowF {
    float w[kSsimTaps];
};

// The block's centring constants: x and y at the first pixel of its tile that counts (in the image, mask true; in
// thread order), or 0 when none does. Any constant is exact algebra; one near the tile's values keeps the sums
// small. Every thread of the block must call it (two barriers).
__device__ __forceinline__ void block_centre(const Plane& p, int H, int W, int C, const float* __restrict__ img1,
                                             const float* __restrict__ img2, const bool* __restrict__ mask, int tid,
                                             float& cx, float& cy) {
    __shared__ int first;
    if (tid == 0) first = kSsimThreads;
    __syncthreads();
    const int ty = tid / kSsimTile, tx = tid % kSsimTile;
    const int64_t o = pixel_offset(p, p.row0 + kSsimRadius + ty, p.col0 + kSsimRadius + tx, H, W, C);
    if (o >= 0 && pixel_counts(mask, o, C)) atomicMin(&first, tid);
    __syncthreads();
    cx = cy = 0.f;
    if (first < kSsimThreads) {
        const int64_t f = pixel_offset(p, p.row0 + kSsimRadius + first / kSsimTile,
                                       p.col0 + kSsimRadius + first % kSsimTile, H, W, C);
        cx = img1[f];
        cy = img2[f];
    }
}

__global__ void __launch_bounds__(kSsimThreads) loss32_fwd_kernel(int H, int W, int C, int64_t numel, SsimWindowF win,
                                                                  const float* __restrict__ img1,  // [B, H, W, C] x
                                                                  const float* __restrict__ img2,  // [B, H, W, C] y
                                                                  const bool* __restrict__ mask,   // [B, H, W] or null
                                                                  float* __restrict__ coef,        // [5, B, C, H, W]
                                                                  double* __restrict__ totals)     // [4]
{
    __shared__ float sx[kSsimSpan][kSsimSpan], sy[kSsimSpan][kSsimSpan];  // 5.3 KiB
    __shared__ float h[5][kSsimSpan][kSsimTile];                          // 8.1 KiB
    const Plane p = block_plane(H, W, C);
    const int tid = static_cast<int>(threadIdx.y) * kSsimTile + static_cast<int>(threadIdx.x);
    float cx, cy;
    block_centre(p, H, W, C, img1, img2, mask, tid, cx, cy);
    stage_images(p, H, W, C, img1, img2, mask, cx, cy, sx, sy, tid);
    __syncthreads();
    moments_rows(win, sx, sy, h, tid);
    __syncthreads();
    const int ty = static_cast<int>(threadIdx.y), tx = static_cast<int>(threadIdx.x);
    const int i = p.row0 + kSsimRadius + ty, j = p.col0 + kSsimRadius + tx;
    const int64_t o = pixel_offset(p, i, j, H, W, C);
    double sums[4] = {0.0, 0.0, 0.0, 0.0};  // m |x - y|, m S, m (x - y)^2, m
    if (o >= 0) {
        float m[5];
        filter_column<5>(win, h, ty, tx, m);
        const float mu1 = cx + m[0], mu2 = cy + m[1];
        // the centred moments' variances and covariance are those of the images
        const int64_t q = coef_offset(p, i, j, W);
        const float S = ssim_terms(mu1, mu2, m[2] - m[0] * m[0], m[3] - m[1] * m[1], m[4] - m[0] * m[1], coef[q],
                                   coef[numel + q], coef[2 * numel + q]);  // dS/dmu1, dS/dsigma1^2, dS/dsigma12
        coef[3 * numel + q] = mu1;
        coef[4 * numel + q] = mu2;
        if (pixel_counts(mask, o, C)) pixel_sums(img1[o], img2[o], static_cast<double>(S), sums);  // exact, not centred
    }
    add_block_totals(sums, totals, tid);  // block-uniform: every thread arrives
}

__global__ void __launch_bounds__(kSsimThreads) loss32_bwd_kernel(int H, int W, int C, int64_t numel, SsimWindowF win,
                                                                  const double* __restrict__ v_totals,  // [4]
                                                                  const bool* __restrict__ mask,   // [B, H, W] or null
                                                                  const float* __restrict__ img1,  // [B, H, W, C]
                                                                  const float* __restrict__ img2,  // [B, H, W, C]
                                                                  const float* __restrict__ coef,  // [5, B, C, H, W]
                                                                  float* __restrict__ dL_dimg1)    // [B, H, W, C] out
{
    __shared__ float sig[3][kSsimSpan][kSsimSpan];  // 7.9 KiB
    __shared__ float h[3][kSsimSpan][kSsimTile];    // 4.9 KiB
    const Plane p = block_plane(H, W, C);
    const int tid = static_cast<int>(threadIdx.y) * kSsimTile + static_cast<int>(threadIdx.x);
    float cx, cy;
    block_centre(p, H, W, C, img1, img2, mask, tid, cx, cy);
    const float v_S = static_cast<float>(v_totals[1]);
    for (int k = tid; k < kSsimSpan * kSsimSpan; k += kSsimThreads) {
        const int r = k / kSsimSpan, s = k % kSsimSpan;
        const int64_t o = pixel_offset(p, p.row0 + r, p.col0 + s, H, W, C);
        float a = 0.f, b = 0.f, c = 0.f;
        if (o >= 0 && pixel_counts(mask, o, C)) {
            const int64_t q = coef_offset(p, p.row0 + r, p.col0 + s, W);
            const float B = coef[numel + q], Cc = coef[2 * numel + q];
            a = v_S * (coef[q] - 2.f * (coef[3 * numel + q] - cx) * B - (coef[4 * numel + q] - cy) * Cc);
            b = v_S * B;
            c = v_S * Cc;
        }
        sig[0][r][s] = a;
        sig[1][r][s] = b;
        sig[2][r][s] = c;
    }
    __syncthreads();
    filter_rows<3>(win, sig, h, tid);
    __syncthreads();
    int64_t o;
    float f[3];
    if (!backward_pixel(p, H, W, C, win, h, mask, dL_dimg1, o, f)) return;
    const float x = img1[o], y = img2[o];
    const float d = x - y;
    dL_dimg1[o] = f[0] + 2.f * (x - cx) * f[1] + (y - cy) * f[2] + static_cast<float>(v_totals[0]) * sign_of(d) +
                  2.f * static_cast<float>(v_totals[2]) * d;
}

// H, W, C of a (H, W, C) or (B, H, W, C) image, as the kernels take them.
struct ImageDims {
    int H, W, C;
};
ImageDims image_dims(const at::Tensor& img) {
    return {static_cast<int>(img.size(-3)), static_cast<int>(img.size(-2)), static_cast<int>(img.size(-1))};
}

dim3 ssim_grid(const at::Tensor& img) {
    const int64_t H = img.size(-3), W = img.size(-2), C = img.size(-1), B = img.dim() == 4 ? img.size(0) : 1;
    return dim3(static_cast<unsigned int>((W + kSsimTile - 1) / kSsimTile),
                static_cast<unsigned int>((H + kSsimTile - 1) / kSsimTile), static_cast<unsigned int>(B * C));
}

const SsimWindow& window() {
    static const SsimWindow win = ssim_window();
    return win;
}

const SsimWindowF& window_f() {
    static const SsimWindowF win = [] {
        SsimWindowF f{};
        for (int i = 0; i < kSsimTaps; ++i) f.w[i] = static_cast<float>(window().w[i]);
        return f;
    }();
    return win;
}

}  // namespace

void launch_ssim_fwd(const at::Tensor& img1, const at::Tensor& img2, const c10::optional<at::Tensor>& mask,
                     at::Tensor* map, at::Tensor& coef, at::Tensor* totals) {
    const int64_t numel = img1.numel();
    if (numel == 0) return;
    const auto [H, W, C] = image_dims(img1);
    ssim_fwd_kernel<<<ssim_grid(img1), dim3(kSsimTile, kSsimTile), 0, at::cuda::getCurrentCUDAStream()>>>(
        H, W, C, numel, window(), img1.data_ptr<float>(), img2.data_ptr<float>(),
        mask.has_value() ? mask->data_ptr<bool>() : nullptr, map != nullptr ? map->data_ptr<float>() : nullptr,
        coef.data_ptr<double>(), totals != nullptr ? totals->data_ptr<double>() : nullptr);
    RIGEL_CHECK_LAUNCH("ssim_fwd_kernel");
}

void launch_ssim_bwd(const at::Tensor* dL_dmap, const at::Tensor* v_totals, const c10::optional<at::Tensor>& mask,
                     const at::Tensor& img1, const at::Tensor& img2, const at::Tensor& coef, at::Tensor& dL_dimg1) {
    const int64_t numel = img1.numel();
    if (numel == 0) return;
    const auto [H, W, C] = image_dims(img1);
    ssim_bwd_kernel<<<ssim_grid(img1), dim3(kSsimTile, kSsimTile), 0, at::cuda::getCurrentCUDAStream()>>>(
        H, W, C, numel, window(), dL_dmap != nullptr ? dL_dmap->data_ptr<float>() : nullptr,
        v_totals != nullptr ? v_totals->data_ptr<double>() : nullptr,
        mask.has_value() ? mask->data_ptr<bool>() : nullptr, img1.data_ptr<float>(), img2.data_ptr<float>(),
        coef.data_ptr<double>(), dL_dimg1.data_ptr<float>());
    RIGEL_CHECK_LAUNCH("ssim_bwd_kernel");
}

void launch_loss32_fwd(const at::Tensor& img1, const at::Tensor& img2, const c10::optional<at::Tensor>& mask,
                       at::Tensor& coef, at::Tensor& totals) {
    const int64_t numel = img1.numel();
    if (numel == 0) return;
    const auto [H, W, C] = image_dims(img1);
    loss32_fwd_kernel<<<ssim_grid(img1), dim3(kSsimTile, kSsimTile), 0, at::cuda::getCurrentCUDAStream()>>>(
        H, W, C, numel, window_f(), img1.data_ptr<float>(), img2.data_ptr<float>(),
        mask.has_value() ? mask->data_ptr<bool>() : nullptr, coef.data_ptr<float>(), totals.data_ptr<double>());
    RIGEL_CHECK_LAUNCH("loss32_fwd_kernel");
}

void launch_loss32_bwd(const at::Tensor& v_totals, const c10::optional<at::Tensor>& mask, const at::Tensor& img1,
                       const at::Tensor& img2, const at::Tensor& coef, at::Tensor& dL_dimg1) {
    const int64_t numel = img1.numel();
    if (numel == 0) return;
    const auto [H, W, C] = image_dims(img1);
    loss32_bwd_kernel<<<ssim_grid(img1), dim3(kSsimTile, kSsimTile), 0, at::cuda::getCurrentCUDAStream()>>>(
        H, W, C, numel, window_f(), v_totals.data_ptr<double>(), mask.has_value() ? mask->data_ptr<bool>() : nullptr,
        img1.data_ptr<float>(), img2.data_ptr<float>(), coef.data_ptr<float>(), dL_dimg1.data_ptr<float>());
    RIGEL_CHECK_LAUNCH("loss32_bwd_kernel");
}

}  // namespace rigel
