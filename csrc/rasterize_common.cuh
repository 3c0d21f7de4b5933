// Per-fragment maths shared by rasterize_fwd.cu, rasterize_bwd.cu and binning.cu (docs/PIPELINE.md [2], [3]),
// written once so that forward, backward and the binning footprint cannot drift apart.
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

}  // namespace rigel
