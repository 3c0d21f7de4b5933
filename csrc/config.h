// rigel rendering constants: the one source of truth for every kernel (forward and backward).
// rigel_core/config.py mirrors these values; tests/test_config.py parses this file and compares.
// The exact semantics of each constant are given in docs/PIPELINE.md.
//
// Values are written as plain (double) literals, exactly as Python writes them, so that the double-precision
// projection uses the very values of the float64 reference and float kernels get float(value), the same
// rounding torch applies when it combines a Python constant with a float32 tensor. Kernels convert them once,
// in the k* constexprs of the *_common.cuh headers, and never use a bare RIGEL_* in float arithmetic.
#pragma once

// Screen tiles are TILE_SIZE x TILE_SIZE pixels; one CUDA block of TILE_SIZE^2 threads renders one tile.
#define RIGEL_TILE_SIZE 16
// EWA low-pass filter (px^2) added to the diagonal of the 2D covariance so every splat covers ~1 pixel
// (Zwicker et al. 2002; Kerbl et al. 2023 use 0.3).
#define RIGEL_LOWPASS 0.3
// Anti-aliased ("mip") mode (issue 17; Yu et al., "Mip-Splatting", CVPR 2024; docs/PIPELINE.md "Anti-aliased
// mode"). MIP_FILTER_2D: the 2D Mip filter's variance (px^2), added to the screen covariance INSTEAD of LOWPASS,
// with the opacity compensation sqrt(det(cov2D) / det(cov2D + MIP_FILTER_2D I)); it approximates the one-pixel
// box filter of the sensor (a box of width 1 px has variance 1/12 ~ 0.083 px^2); 0.1 is Mip-Splatting's value and
// the one Brush applies to files tagged "SplatRenderMode: mip".
#define RIGEL_MIP_FILTER_2D 0.1
// MIP_FILTER_3D: the 3D smoothing filter's variance in units of the squared world-space sample spacing: each
// Gaussian gets Sigma + MIP_FILTER_3D * (depth / focal)^2 I, at the highest sampling rate focal / depth over the
// training cameras that see it (Mip-Splatting eq. 7-8, s = 0.2). Applied in Python (rigel_core/renderer/mip.py) only.
#define RIGEL_MIP_FILTER_3D 0.2
// Screen radius in standard deviations of the major axis; the rasterizer also cuts at this distance.
#define RIGEL_RADIUS_SIGMA 3.0
// x/z and y/z are clamped to TAN_CLAMP times the frustum half-width before building the Jacobian,
// because the linearisation is badly wrong far off-axis.
#define RIGEL_TAN_CLAMP 1.3
// Default near plane (camera-space z, world units); Gaussians with z <= near are culled.
#define RIGEL_NEAR_PLANE 0.01
// Default far plane.
#define RIGEL_FAR_PLANE 1e10
// Alpha is clamped to ALPHA_MAX so that the backward division by (1 - alpha) stays bounded (>= 0.01).
#define RIGEL_ALPHA_MAX 0.99
// Fragments with alpha below ALPHA_MIN (1/255: invisible in 8 bits) are skipped.
#define RIGEL_ALPHA_MIN (1.0 / 255.0)
// A pixel stops when its transmittance would drop below T_MIN.
#define RIGEL_T_MIN 1e-4
// Refuse images whose duplicated (Gaussian, tile) entries exceed this count (clear error, not an OOM).
#define RIGEL_MAX_ENTRIES 100000000LL
// SH band constants (real spherical harmonics, sign convention of Kerbl et al. 2023).
#define RIGEL_SH_C0 0.28209479177387814
#define RIGEL_SH_C1 0.4886025119029199
// Degree-2 and degree-3 band constants with the Condon-Shortley phase folded in (Sloan 2008, appendix A2);
// mirrored by SH_C2 / SH_C3 in rigel_core/reference/sh.py.
#define RIGEL_SH_C2_0 1.0925484305920792
#define RIGEL_SH_C2_1 -1.0925484305920792
#define RIGEL_SH_C2_2 0.31539156525252005
#define RIGEL_SH_C2_3 -1.0925484305920792
#define RIGEL_SH_C2_4 0.5462742152960396
#define RIGEL_SH_C3_0 -0.5900435899266435
#define RIGEL_SH_C3_1 2.890611442640554
#define RIGEL_SH_C3_2 -0.4570457994644658
#define RIGEL_SH_C3_3 0.3731763325901154
#define RIGEL_SH_C3_4 -0.4570457994644658
#define RIGEL_SH_C3_5 1.445305721320277
#define RIGEL_SH_C3_6 -0.5900435899266435

// Size limits of the fused appearance MLP (csrc/appearance.cu): latent width L and hidden width H. Per-thread
// state is a register array of the padded input width (<= 36 floats), and the staged weights plus their gradients
// take 2 * H * (36 + 4) floats = 20 KiB of shared memory at H = 64. Every check of L and H (kernels, reference,
// TrainConfig, checkpoints) reads these values.
#define RIGEL_APPEARANCE_MAX_LATENT 32
#define RIGEL_APPEARANCE_MAX_HIDDEN 64

// ---- kernel launch parameters (no Python mirror: they change speed, never results) ----------------------
// Threads per block of the one-thread-per-Gaussian / per-tile kernels (projection, SH, binning).
#define RIGEL_KERNEL_BLOCK_1D 256
