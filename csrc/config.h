// rigel rendering constants: the one source of truth for every kernel (forward and backward).
// rigel_core/config.py mirrors these values; tests/test_config.py parses this file and compares.
// The exact semantics of each constant are given in docs/PIPELINE.md.
#pragma once

// Screen tiles are TILE_SIZE x TILE_SIZE pixels; one CUDA block of TILE_SIZE^2 threads renders one tile.
#define RIGEL_TILE_SIZE 16
// EWA low-pass filter (px^2) added to the diagonal of the 2D covariance so every splat covers ~1 pixel
// (Zwicker et al. 2002; Kerbl et al. 2023 use 0.3).
#define RIGEL_LOWPASS 0.3f
// Screen radius in standard deviations of the major axis; the rasterizer also cuts at this distance.
#define RIGEL_RADIUS_SIGMA 3.0f
// x/z and y/z are clamped to TAN_CLAMP times the frustum half-width before building the Jacobian,
// because the linearisation is badly wrong far off-axis.
#define RIGEL_TAN_CLAMP 1.3f
// Default near plane (camera-space z, world units); Gaussians with z <= near are culled.
#define RIGEL_NEAR_PLANE 0.01f
// Default far plane.
#define RIGEL_FAR_PLANE 1e10f
// Alpha is clamped to ALPHA_MAX so that the backward division by (1 - alpha) stays bounded (>= 0.01).
#define RIGEL_ALPHA_MAX 0.99f
// Fragments with alpha below ALPHA_MIN (1/255: invisible in 8 bits) are skipped.
#define RIGEL_ALPHA_MIN (1.0f / 255.0f)
// A pixel stops when its transmittance would drop below T_MIN.
#define RIGEL_T_MIN 1e-4f
// Refuse images whose duplicated (Gaussian, tile) entries exceed this count (clear error, not an OOM).
#define RIGEL_MAX_ENTRIES 100000000LL
// SH band constants (real spherical harmonics, sign convention of Kerbl et al. 2023).
#define RIGEL_SH_C0 0.28209479177387814f
#define RIGEL_SH_C1 0.4886025119029199f
