// Real spherical harmonics up to degree 3, shared by sh_fwd.cu and sh_bwd.cu (docs/PIPELINE.md [0]).
// Basis: the standard real SH polynomials (Sloan, "Stupid Spherical Harmonics Tricks", 2008, appendix A2)
// with the sign convention of Kerbl et al. 2023; band constants from config.h.
#pragma once

#include "common.cuh"

namespace rigel {

constexpr float kShC0 = static_cast<float>(RIGEL_SH_C0);
constexpr float kShC1 = static_cast<float>(RIGEL_SH_C1);
constexpr float kShC2_0 = static_cast<float>(RIGEL_SH_C2_0);
constexpr float kShC2_1 = static_cast<float>(RIGEL_SH_C2_1);
constexpr float kShC2_2 = static_cast<float>(RIGEL_SH_C2_2);
constexpr float kShC2_3 = static_cast<float>(RIGEL_SH_C2_3);
constexpr float kShC2_4 = static_cast<float>(RIGEL_SH_C2_4);
constexpr float kShC3_0 = static_cast<float>(RIGEL_SH_C3_0);
constexpr float kShC3_1 = static_cast<float>(RIGEL_SH_C3_1);
constexpr float kShC3_2 = static_cast<float>(RIGEL_SH_C3_2);
constexpr float kShC3_3 = static_cast<float>(RIGEL_SH_C3_3);
constexpr float kShC3_4 = static_cast<float>(RIGEL_SH_C3_4);
constexpr float kShC3_5 = static_cast<float>(RIGEL_SH_C3_5);
constexpr float kShC3_6 = static_cast<float>(RIGEL_SH_C3_6);

__host__ __device__ constexpr int num_sh_bases(int degree) { return (degree + 1) * (degree + 1); }

// Y[k], k < (DEGREE+1)^2, at the unit direction (x, y, z).
template <int DEGREE>
__device__ inline void sh_basis(float x, float y, float z, float* Y) {
    Y[0] = kShC0;
    if (DEGREE >= 1) {
        Y[1] = -kShC1 * y;
        Y[2] = kShC1 * z;
        Y[3] = -kShC1 * x;
    }
    if (DEGREE >= 2) {
        const float xx = x * x, yy = y * y, zz = z * z;
        Y[4] = kShC2_0 * (x * y);
        Y[5] = kShC2_1 * (y * z);
        Y[6] = kShC2_2 * (2.f * zz - xx - yy);
        Y[7] = kShC2_3 * (x * z);
        Y[8] = kShC2_4 * (xx - yy);
        if (DEGREE >= 3) {
            Y[9] = kShC3_0 * y * (3.f * xx - yy);
            Y[10] = kShC3_1 * (x * y) * z;
            Y[11] = kShC3_2 * y * (4.f * zz - xx - yy);
            Y[12] = kShC3_3 * z * (2.f * zz - 3.f * xx - 3.f * yy);
            Y[13] = kShC3_4 * x * (4.f * zz - xx - yy);
            Y[14] = kShC3_5 * z * (xx - yy);
            Y[15] = kShC3_6 * x * (xx - 3.f * yy);
        }
    }
}

// Gradient of sum_k w[k] Y_k(x, y, z) with respect to the (unnormalised) polynomial arguments (x, y, z).
template <int DEGREE>
__device__ inline float3 sh_basis_vjp(float x, float y, float z, const float* w) {
    float gx = 0.f, gy = 0.f, gz = 0.f;
    if (DEGREE >= 1) {
        gy -= kShC1 * w[1];
        gz += kShC1 * w[2];
        gx -= kShC1 * w[3];
    }
    if (DEGREE >= 2) {
        gx += kShC2_0 * y * w[4];
        gy += kShC2_0 * x * w[4];
        gy += kShC2_1 * z * w[5];
        gz += kShC2_1 * y * w[5];
        gx += -2.f * kShC2_2 * x * w[6];
        gy += -2.f * kShC2_2 * y * w[6];
        gz += 4.f * kShC2_2 * z * w[6];
        gx += kShC2_3 * z * w[7];
        gz += kShC2_3 * x * w[7];
        gx += 2.f * kShC2_4 * x * w[8];
        gy += -2.f * kShC2_4 * y * w[8];
        if (DEGREE >= 3) {
            const float xx = x * x, yy = y * y, zz = z * z;
            gx += kShC3_0 * 6.f * x * y * w[9];
            gy += kShC3_0 * (3.f * xx - 3.f * yy) * w[9];
            gx += kShC3_1 * y * z * w[10];
            gy += kShC3_1 * x * z * w[10];
            gz += kShC3_1 * x * y * w[10];
            gx += kShC3_2 * -2.f * x * y * w[11];
            gy += kShC3_2 * (4.f * zz - xx - 3.f * yy) * w[11];
            gz += kShC3_2 * 8.f * y * z * w[11];
            gx += kShC3_3 * -6.f * x * z * w[12];
            gy += kShC3_3 * -6.f * y * z * w[12];
            gz += kShC3_3 * (6.f * zz - 3.f * xx - 3.f * yy) * w[12];
            gx += kShC3_4 * (4.f * zz - 3.f * xx - yy) * w[13];
            gy += kShC3_4 * -2.f * x * y * w[13];
            gz += kShC3_4 * 8.f * x * z * w[13];
            gx += kShC3_5 * 2.f * x * z * w[14];
            gy += kShC3_5 * -2.f * y * z * w[14];
            gz += kShC3_5 * (xx - yy) * w[14];
            gx += kShC3_6 * (3.f * xx - 3.f * yy) * w[15];
            gy += kShC3_6 * -6.f * x * y * w[15];
        }
    }
    return make_float3(gx, gy, gz);
}

// Unit view direction from the camera centre to the mean; a mean at the centre gives direction 0 (only the
// DC term survives), never NaN. Also returns the length for the backward pass.
__device__ inline float3 view_direction(const float* __restrict__ mean, const float* __restrict__ campos, float& len) {
    const float dx = mean[0] - __ldg(campos + 0), dy = mean[1] - __ldg(campos + 1), dz = mean[2] - __ldg(campos + 2);
    len = sqrtf(dx * dx + dy * dy + dz * dz);
    const float inv = len > 0.f ? 1.f / len : 1.f;
    return make_float3(dx * inv, dy * inv, dz * inv);
}

// ---- staging of coefficient rows through shared memory (docs/PIPELINE.md [0], "Kernels") ----
// sh_coeffs [N, K, 3] holds R = 3K floats per Gaussian. Read one row per thread, each warp-wide load touches 32
// rows R floats apart (uncoalesced). Instead a block of kShBlock threads owns Gaussians g0 .. g0 + kShBlock - 1,
// whose rows are the contiguous floats [g0 R, (g0 + kShBlock) R): the block copies that span with consecutive
// threads on consecutive floats into shared memory, row r at sm[r S ..], S = sh_row_stride(R) (R rounded up to
// odd), so that thread t reading slot s of its own row (address t S + s) hits 32 distinct banks. The backward
// writes its v_sh_coeffs row into the same shared row and the block copies the span out the same way.
// The split ops (sh_dc [N,1,3] and sh_rest [N,K-1,3], the model's two parameter tensors, never concatenated)
// copy two contiguous spans into the same shared rows: sh_dc's [3 g0, 3 (g0 + rows)) into slots 0..2 and
// sh_rest's [(R-3) g0, (R-3) (g0 + rows)) into slots 3..R-1 (sh_stage_rows below); from there on both ops run
// the same code on the same shared row.
// 128 threads: a degree-3 row (R = 48, S = 49) takes 128 * 49 * 4 = 25,088 bytes of static shared memory, under
// the 48 KB a kernel gets without opting in (256 threads would need 50,176 and cudaFuncSetAttribute), and an
// H200 SM (228 KB) still holds 9 such blocks (1,152 threads).
constexpr int kShBlock = 128;
// The widest row stride the runtime-R path stages (48 KB of dynamic shared memory, no opt-in): S <= 96, i.e.
// K <= 31. Wider rows (K >= 32, never an SH model of degree <= 3 in practice) are read per thread from global
// memory, as before the staging.
constexpr int kShMaxStride = 48 * 1024 / (4 * kShBlock);

__host__ __device__ constexpr int sh_row_stride(int row_floats) { return row_floats | 1; }

// One part of the staged rows: P floats per row, contiguous over the rows in global memory, at slots OFF ..
// OFF + P - 1 of shared rows S floats apart. Calls f(e, i) for every float e in [0, span) (span = rows P) that
// thread threadIdx.x moves, with i = its shared-memory index (row e / P, slot OFF + e % P:
// i = (e / P) S + OFF + e % P). Consecutive threads get consecutive e (coalesced global accesses).
// P_CT > 0: P = P_CT at compile time (span <= kShBlock P_CT, so at most P_CT floats per thread; the division by
// a constant is a multiply-high); P_CT = 0: P at run time, the index advanced incrementally (one division per
// thread, none per float). S_CT > 0: S = S_CT at compile time. Compile-time constants, not arguments that are
// constant after inlining: with S an argument the unrolled R = 48 loop came out 60 % longer in SASS (nvcc 13,
// sm_90: the loop is unrolled before S is known). The joined ops stage one part (P = R at OFF = 0), the split
// ops two (P = 3 at 0, P = R - 3 at 3).
template <int P_CT, int S_CT, int OFF, typename F>
__device__ __forceinline__ void sh_for_each_staged(int span, int P, int S_rt, F&& f) {
    const int t = static_cast<int>(threadIdx.x);
    const int S = S_CT > 0 ? S_CT : S_rt;
    if constexpr (P_CT > 0) {
        // (e / P) S + OFF + e % P, advanced by kShBlock per step: row += kQ, slot += kRem, with one carry at most
        constexpr int kQ = kShBlock / P_CT, kRem = kShBlock - kQ * P_CT;
        const int row0 = t / P_CT;
        int slot = t - row0 * P_CT, i = row0 * S + OFF + slot;
        if (span == kShBlock * P_CT) {  // a full block (all but the last): no bounds test, loads issue together
#pragma unroll
            for (int j = 0; j < P_CT; ++j) {
                f(t + j * kShBlock, i);
                slot += kRem;
                i += kQ * S + kRem;
                if (slot >= P_CT) {
                    slot -= P_CT;
                    i += S - P_CT;
                }
            }
        } else {
#pragma unroll
            for (int j = 0; j < P_CT; ++j) {
                const int e = t + j * kShBlock;
                if (e < span) f(e, i);
                slot += kRem;
                i += kQ * S + kRem;
                if (slot >= P_CT) {
                    slot -= P_CT;
                    i += S - P_CT;
                }
            }
        }
    } else {
        if (span <= 0) return;  // also P = 0 (the split ops' sh_rest at K = 1): no division by it
        const int pad = S - P;
        const int q = kShBlock / P, r = kShBlock - q * P;  // e += kShBlock: row += q, slot += r (with carry)
        int row = t / P, slot = t - row * P;
#pragma unroll 4
        for (int e = t; e < span; e += kShBlock) {
            f(e, e + pad * row + OFF);
            row += q;
            slot += r;
            if (slot >= P) {  // r < P: at most one carry
                slot -= P;
                ++row;
            }
        }
    }
}

// The coefficient rows of Gaussians g0 .. g0 + rows - 1 and shared memory sm (rows S = sh_row_stride(R) apart):
// f(p, e, i) for every float the calling thread moves, p[e] being the float in global memory and sm[i] its slot.
// SPLIT false: a = sh_coeffs [N, K, 3] (or its gradient), b unused. SPLIT true: a = sh_dc [N, 1, 3],
// b = sh_rest [N, K-1, 3] (either may be null when it has no elements: b at K = 1). T = const float to stage in,
// float to copy a gradient row out. R_CT > 0: R = R_CT at compile time (the parts then 3 and R_CT - 3).
template <int R_CT, bool SPLIT, typename T, typename F>
__device__ __forceinline__ void sh_stage_rows(T* a, T* b, int64_t g0, int rows, int R, F&& f) {
    constexpr int kS = R_CT > 0 ? sh_row_stride(R_CT) : 0;  // 0: S at run time
    const int S = sh_row_stride(R);
    if constexpr (SPLIT) {
        T* __restrict__ dc = a + 3 * g0;
        T* __restrict__ rest = b + (R - 3) * g0;  // int64: N R may exceed 2^31; K = 1: b + 0 (b may be null)
        sh_for_each_staged<3, kS, 0>(rows * 3, 3, S, [&](int e, int i) { f(dc, e, i); });
        sh_for_each_staged<(R_CT > 0 ? R_CT - 3 : 0), kS, 3>(rows * (R - 3), R - 3, S,
                                                               [&](int e, int i) { f(rest, e, i); });
    } else {
        T* __restrict__ span = a + g0 * R;  // int64: N R may exceed 2^31
        sh_for_each_staged<R_CT, kS, 0>(rows * R, R, S, [&](int e, int i) { f(span, e, i); });
    }
}

// A coefficient row read (T = const float) or written (T = float) in place in the split ops' two tensors: slots
// 0..2 in sh_dc's row, slots 3..R-1 in sh_rest's (rows too wide to stage). Indexed as the staged row pointer is.
template <typename T>
struct ShSplitRow {
    T* dc;
    T* rest;
    __device__ __forceinline__ T& operator[](int i) const { return i < 3 ? dc[i] : rest[i - 3]; }
};

// The cull rule (docs/PIPELINE.md "Non-finite parameters"): are all R = 3K coefficients of a row (not only the
// evaluated degree's) and its mean finite? A Gaussian that fails gets the colour NaN in the forward (the
// projection culls it by it) and zero gradients in the backward. `row` is the row's copy in shared memory (or
// the row in global memory for rows too wide to stage: a pointer, or ShSplitRow); R_CT > 0 fixes R at compile time.
template <int R_CT, typename Row>
__device__ __forceinline__ bool sh_row_finite(const Row& row, int R, const float* __restrict__ mean) {
    // Bitwise &, never &&: a short-circuit test makes each load wait for the previous one's result (a chain of
    // 48 dependent loads at degree 3, which doubled the SH stage's time on the H200); these loads are independent.
    bool ok = isfinite(mean[0]) & isfinite(mean[1]) & isfinite(mean[2]);
    const int n = R_CT > 0 ? R_CT : R;
    int i = 0;
    for (; i + 12 <= n; i += 12) {
        bool b = true;
#pragma unroll
        for (int j = 0; j < 12; ++j) b &= isfinite(row[i + j]);
        ok &= b;
    }
    for (; i < n; ++i) ok &= isfinite(row[i]);
    return ok;
}

// What the forward and the backward both evaluate for one Gaussian: the view direction d and its length, the
// bases Y at d, and the colour before the +0.5 offset and the clamp, raw[ch] = sum_k Y_k c_k[ch] (k ascending).
template <int DEGREE>
struct ShEval {
    float3 d;
    float len;
    float Y[num_sh_bases(DEGREE)];
    float raw[3];
};

// row: the Gaussian's coefficients c_k[ch] at row[3 k + ch] (shared or global memory: a pointer, or ShSplitRow);
// mean: its means3D row.
template <int DEGREE, typename Row>
__device__ __forceinline__ ShEval<DEGREE> sh_eval(const Row& row, const float* __restrict__ mean,
                                                  const float* __restrict__ campos)  // [3]
{
    constexpr int kBases = num_sh_bases(DEGREE);
    ShEval<DEGREE> e;
    e.d = view_direction(mean, campos, e.len);
    sh_basis<DEGREE>(e.d.x, e.d.y, e.d.z, e.Y);
    e.raw[0] = 0.f;
    e.raw[1] = 0.f;
    e.raw[2] = 0.f;
#pragma unroll
    for (int k = 0; k < kBases; ++k)
#pragma unroll
        for (int ch = 0; ch < 3; ++ch) e.raw[ch] += e.Y[k] * row[3 * k + ch];
    return e;
}

}  // namespace rigel
