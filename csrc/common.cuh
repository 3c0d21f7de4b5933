// Helpers shared by every kernel file: constants converted from config.h once, launch sizing, error checks.
#pragma once

#include <cstdint>
#include <string>

#include <cuda_runtime.h>
#include <c10/util/Exception.h>

#include "config.h"

namespace rigel {

// ---- constants of config.h in the precision each stage computes in (never a bare RIGEL_* in arithmetic) ----
constexpr int kTileSize = RIGEL_TILE_SIZE;
constexpr int kTilePixels = RIGEL_TILE_SIZE * RIGEL_TILE_SIZE;  // threads of a raster block = batch size
constexpr int kBlock1D = RIGEL_KERNEL_BLOCK_1D;

// float kernels (binning, rasterization, SH): float(value), as torch rounds a Python constant for float32.
constexpr float kRadiusSigmaF = static_cast<float>(RIGEL_RADIUS_SIGMA);
constexpr float kCutoffQF = static_cast<float>(RIGEL_RADIUS_SIGMA * RIGEL_RADIUS_SIGMA);  // 3-sigma cut on q
constexpr float kAlphaMaxF = static_cast<float>(RIGEL_ALPHA_MAX);
constexpr float kAlphaMinF = static_cast<float>(RIGEL_ALPHA_MIN);
constexpr float kTMinF = static_cast<float>(RIGEL_T_MIN);

// double projection: the exact decimal values of the float64 reference.
constexpr double kLowpass = RIGEL_LOWPASS;
constexpr double kMipFilter2D = RIGEL_MIP_FILTER_2D;
constexpr double kRadiusSigma = RIGEL_RADIUS_SIGMA;
constexpr double kTanClamp = RIGEL_TAN_CLAMP;

inline unsigned int num_blocks(int64_t n, int per_block) {
    return static_cast<unsigned int>((n + per_block - 1) / per_block);
}

}  // namespace rigel

// Messages are one std::string, never formatted through std::ostream (see ops.cpp: that crashed on the H200 image).
// Check the launch that just happened (configuration errors, and with CUDA_LAUNCH_BLOCKING=1 faults too).
#define RIGEL_CHECK_LAUNCH(label)                                                                        \
    do {                                                                                                 \
        cudaError_t rigel_err_ = cudaGetLastError();                                                     \
        if (rigel_err_ != cudaSuccess)                                                                   \
            TORCH_CHECK(false, std::string("rigel: CUDA launch of ") + (label) + " failed: " +            \
                                   cudaGetErrorString(rigel_err_));                                      \
    } while (0)

// Check a CUDA runtime / CUB call that returns cudaError_t.
#define RIGEL_CHECK_CUDA(call, label)                                                                    \
    do {                                                                                                 \
        cudaError_t rigel_err_ = (call);                                                                 \
        if (rigel_err_ != cudaSuccess)                                                                   \
            TORCH_CHECK(false, std::string("rigel: ") + (label) + " failed: " + cudaGetErrorString(rigel_err_)); \
    } while (0)
