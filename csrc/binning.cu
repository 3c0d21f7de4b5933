// [2] Tile binning (docs/PIPELINE.md [2]): count the tiles each Gaussian's footprint ellipse touches, scan,
// emit one (tile << 32 | depth bits, gaussian) entry per touched tile, radix-sort by key, find tile ranges.
//
//   counts   [2, 3, 0, 2, 1]          per Gaussian (count_tiles_kernel)
//   offsets  [2, 5, 5, 7, 8]          inclusive scan; Gaussian g writes entries [offsets[g-1], offsets[g])
//   total    8                        the one device->host read of the frame
//
// The footprint test runs in float, in the reference's order of operations (rigel_core/reference/binning.py),
// so that the entry list is identical to the reference's for the same projected inputs.
#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>
#include <cub/device/device_radix_sort.cuh>
#include <cub/device/device_scan.cuh>

#include "launch.h"
#include "project_common.cuh"
#include "rasterize_common.cuh"

namespace rigel {
namespace {

// One Gaussian's footprint: centre, conic, and the threshold Q(1 + 1e-5) + 1e-5 on min q over a tile box.
struct Footprint {
    float u, v, A, B, C, thresh;
    TileRect rect;
};

__device__ inline Footprint load_footprint(int64_t g, const float* __restrict__ means2D, const float* __restrict__ conics,
                                           const float* __restrict__ opacities, int32_t radius, int tiles_x,
                                           int tiles_y) {
    Footprint f;
    f.u = means2D[2 * g + 0];
    f.v = means2D[2 * g + 1];
    f.A = conics[3 * g + 0];
    f.B = conics[3 * g + 1];
    f.C = conics[3 * g + 2];
    // Q = min(RADIUS_SIGMA^2, 2 ln(opacity / ALPHA_MIN)) (may be < 0: then no tile passes).
    const float o = fmaxf(opacities[g], 1e-30f);
    const float Q = fminf(kCutoffQF, __fmul_rn(2.f, logf(__fdiv_rn(o, kAlphaMinF))));
    f.thresh = __fadd_rn(__fmul_rn(Q, static_cast<float>(1.0 + 1e-5)), static_cast<float>(1e-5));
    f.rect = tile_rect<float>(f.u, f.v, static_cast<float>(radius), tiles_x, tiles_y);
    return f;
}

// Does the footprint touch tile (tx, ty)? Minimum of the positive-definite q over the tile's box of pixel
// centres (clipped to the image): 0 when the centre is inside, else the least of the four edge minima, each
// at the unconstrained 1D minimiser clamped to the edge.
__device__ inline bool touches(const Footprint& f, int tx, int ty, int width, int height) {
    const float xl = static_cast<float>(tx * kTileSize) + 0.5f;
    const float xh = fminf(static_cast<float>(tx * kTileSize + kTileSize) - 0.5f, static_cast<float>(width) - 0.5f);
    const float yl = static_cast<float>(ty * kTileSize) + 0.5f;
    const float yh = fminf(static_cast<float>(ty * kTileSize + kTileSize) - 0.5f, static_cast<float>(height) - 0.5f);
    const float dxl = __fsub_rn(xl, f.u), dxh = __fsub_rn(xh, f.u);
    const float dyl = __fsub_rn(yl, f.v), dyh = __fsub_rn(yh, f.v);
    if (dxl <= 0.f && dxh >= 0.f && dyl <= 0.f && dyh >= 0.f) return 0.f <= f.thresh;
    const float B2 = __fmul_rn(2.f, f.B), nB = -f.B;
    float best;
    {  // vertical edges dx = e
        float dy = fminf(fmaxf(__fdiv_rn(__fmul_rn(nB, dxl), f.C), dyl), dyh);
        best = quadratic_form(f.A, B2, f.C, dxl, dy);
        dy = fminf(fmaxf(__fdiv_rn(__fmul_rn(nB, dxh), f.C), dyl), dyh);
        best = fminf(best, quadratic_form(f.A, B2, f.C, dxh, dy));
    }
    {  // horizontal edges dy = e
        float dx = fminf(fmaxf(__fdiv_rn(__fmul_rn(nB, dyl), f.A), dxl), dxh);
        best = fminf(best, quadratic_form(f.A, B2, f.C, dx, dyl));
        dx = fminf(fmaxf(__fdiv_rn(__fmul_rn(nB, dyh), f.A), dxl), dxh);
        best = fminf(best, quadratic_form(f.A, B2, f.C, dx, dyh));
    }
    return best <= f.thresh;
}

__global__ void __launch_bounds__(kBlock1D) count_tiles_kernel(
    int64_t n, int width, int height, int tiles_x, int tiles_y,
    const float* __restrict__ means2D,    // [N, 2]
    const float* __restrict__ conics,     // [N, 3]
    const float* __restrict__ opacities,  // [N]
    const int32_t* __restrict__ radii,    // [N], 0 = culled
    int64_t* __restrict__ counts,         // [N] out, scan input
    int32_t* __restrict__ tiles_touched)  // [N] out
{
    const int64_t g = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
    if (g >= n) return;
    int32_t count = 0;
    const int32_t radius = radii[g];
    if (radius > 0) {
        const Footprint f = load_footprint(g, means2D, conics, opacities, radius, tiles_x, tiles_y);
        for (int ty = f.rect.y0; ty < f.rect.y1; ++ty)
            for (int tx = f.rect.x0; tx < f.rect.x1; ++tx) count += touches(f, tx, ty, width, height);
    }
    counts[g] = count;
    tiles_touched[g] = count;
}

// Each Gaussian writes its own slice [offsets[g-1], offsets[g]) of the entry list, tiles in row-major order:
// no atomics, and the list is in (Gaussian index, tile) order, which the stable sort keeps for equal keys.
__global__ void __launch_bounds__(kBlock1D) emit_entries_kernel(
    int64_t n, int width, int height, int tiles_x, int tiles_y,
    const float* __restrict__ means2D,    // [N, 2]
    const float* __restrict__ conics,     // [N, 3]
    const float* __restrict__ opacities,  // [N]
    const float* __restrict__ depths,     // [N]
    const int32_t* __restrict__ radii,    // [N]
    const int64_t* __restrict__ offsets,  // [N] inclusive scan of the counts
    uint64_t* __restrict__ keys,          // [E] out, (tile_id << 32) | float_bits(depth)
    int32_t* __restrict__ gaussian_ids)   // [E] out
{
    const int64_t g = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
    if (g >= n) return;
    const int32_t radius = radii[g];
    if (radius <= 0) return;
    int64_t out = g == 0 ? 0 : offsets[g - 1];
    const int64_t end = offsets[g];
    if (out == end) return;
    const Footprint f = load_footprint(g, means2D, conics, opacities, radius, tiles_x, tiles_y);
    const uint64_t depth_bits = __float_as_uint(depths[g]);
    for (int ty = f.rect.y0; ty < f.rect.y1; ++ty) {
        for (int tx = f.rect.x0; tx < f.rect.x1; ++tx) {
            if (!touches(f, tx, ty, width, height)) continue;
            const uint64_t tile_id = static_cast<uint64_t>(ty) * tiles_x + tx;
            keys[out] = (tile_id << 32) | depth_bits;
            gaussian_ids[out] = static_cast<int32_t>(g);
            ++out;
        }
    }
}

// First index in keys[0, e) whose key is >= value (keys sorted ascending).
__device__ inline int64_t lower_bound(const uint64_t* __restrict__ keys, int64_t e, uint64_t value) {
    int64_t lo = 0, hi = e;
    while (lo < hi) {
        const int64_t mid = (lo + hi) >> 1;
        if (keys[mid] < value) lo = mid + 1;
        else hi = mid;
    }
    return lo;
}

// tile_ranges[t] = [first entry of tile t, first entry of tile t+1): an empty tile gets [k, k), k = entries
// of the tiles before it (the reference's searchsorted).
__global__ void __launch_bounds__(kBlock1D) tile_ranges_kernel(
    int n_tiles, int64_t e,
    const uint64_t* __restrict__ keys,  // [E] sorted
    int32_t* __restrict__ tile_ranges)  // [n_tiles, 2] out
{
    const int t = blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= n_tiles) return;
    tile_ranges[2 * t + 0] = static_cast<int32_t>(lower_bound(keys, e, static_cast<uint64_t>(t) << 32));
    tile_ranges[2 * t + 1] = static_cast<int32_t>(lower_bound(keys, e, static_cast<uint64_t>(t + 1) << 32));
}

int bit_width(uint32_t v) { return v == 0 ? 0 : 32 - __builtin_clz(v); }

}  // namespace

BinningResult launch_bin_gaussians(const at::Tensor& means2D, const at::Tensor& conics, const at::Tensor& opacities,
                                   const at::Tensor& depths, const at::Tensor& radii, int width, int height,
                                   int64_t max_entries) {
    const int64_t n = means2D.size(0);
    const int tiles_x = (width + kTileSize - 1) / kTileSize, tiles_y = (height + kTileSize - 1) / kTileSize;
    const int n_tiles = tiles_x * tiles_y;
    const auto stream = at::cuda::getCurrentCUDAStream();
    const auto i32 = means2D.options().dtype(at::kInt), i64 = means2D.options().dtype(at::kLong);
    const auto u8 = means2D.options().dtype(at::kByte);

    BinningResult res;
    res.tiles_touched = at::empty({n}, i32);
    res.tile_ranges = at::empty({n_tiles, 2}, i32);
    int64_t total = 0;
    at::Tensor offsets;
    if (n > 0) {
        at::Tensor counts = at::empty({n}, i64);
        count_tiles_kernel<<<num_blocks(n, kBlock1D), kBlock1D, 0, stream>>>(
            n, width, height, tiles_x, tiles_y, means2D.data_ptr<float>(), conics.data_ptr<float>(),
            opacities.data_ptr<float>(), radii.data_ptr<int32_t>(), counts.data_ptr<int64_t>(),
            res.tiles_touched.data_ptr<int32_t>());
        RIGEL_CHECK_LAUNCH("count_tiles_kernel");

        offsets = at::empty({n}, i64);
        size_t scan_bytes = 0;
        RIGEL_CHECK_CUDA(cub::DeviceScan::InclusiveSum(nullptr, scan_bytes, counts.data_ptr<int64_t>(),
                                                       offsets.data_ptr<int64_t>(), n, stream),
                         "cub::DeviceScan::InclusiveSum (size query)");
        at::Tensor scan_tmp = at::empty({static_cast<int64_t>(scan_bytes)}, u8);
        RIGEL_CHECK_CUDA(cub::DeviceScan::InclusiveSum(scan_tmp.data_ptr(), scan_bytes, counts.data_ptr<int64_t>(),
                                                       offsets.data_ptr<int64_t>(), n, stream),
                         "cub::DeviceScan::InclusiveSum");
        total = offsets[n - 1].item<int64_t>();  // the frame's one device->host synchronisation
    }
    TORCH_CHECK(total <= max_entries, "rigel.bin_gaussians: ", total, " (Gaussian, tile) entries exceed the limit of ",
                max_entries, " (RIGEL_MAX_ENTRIES); lower the resolution or prune large Gaussians");

    if (total == 0) {
        res.keys = at::empty({0}, i64);
        res.gaussian_ids = at::empty({0}, i32);
        RIGEL_CHECK_CUDA(cudaMemsetAsync(res.tile_ranges.data_ptr<int32_t>(), 0, sizeof(int32_t) * 2 * n_tiles, stream),
                         "cudaMemsetAsync(tile_ranges)");
        return res;
    }

    at::Tensor keys_a = at::empty({total}, i64), keys_b = at::empty({total}, i64);
    at::Tensor ids_a = at::empty({total}, i32), ids_b = at::empty({total}, i32);
    emit_entries_kernel<<<num_blocks(n, kBlock1D), kBlock1D, 0, stream>>>(
        n, width, height, tiles_x, tiles_y, means2D.data_ptr<float>(), conics.data_ptr<float>(),
        opacities.data_ptr<float>(), depths.data_ptr<float>(), radii.data_ptr<int32_t>(), offsets.data_ptr<int64_t>(),
        reinterpret_cast<uint64_t*>(keys_a.data_ptr<int64_t>()), ids_a.data_ptr<int32_t>());
    RIGEL_CHECK_LAUNCH("emit_entries_kernel");

    // LSD radix sort (stable) on the bits in use: 32 depth bits + enough bits for the largest tile id.
    cub::DoubleBuffer<uint64_t> kbuf(reinterpret_cast<uint64_t*>(keys_a.data_ptr<int64_t>()),
                                     reinterpret_cast<uint64_t*>(keys_b.data_ptr<int64_t>()));
    cub::DoubleBuffer<int32_t> vbuf(ids_a.data_ptr<int32_t>(), ids_b.data_ptr<int32_t>());
    const int end_bit = 32 + bit_width(static_cast<uint32_t>(n_tiles));
    const int num_items = static_cast<int>(total);
    size_t sort_bytes = 0;
    RIGEL_CHECK_CUDA(cub::DeviceRadixSort::SortPairs(nullptr, sort_bytes, kbuf, vbuf, num_items, 0, end_bit, stream),
                     "cub::DeviceRadixSort::SortPairs (size query)");
    at::Tensor sort_tmp = at::empty({static_cast<int64_t>(sort_bytes)}, u8);
    RIGEL_CHECK_CUDA(cub::DeviceRadixSort::SortPairs(sort_tmp.data_ptr(), sort_bytes, kbuf, vbuf, num_items, 0, end_bit,
                                                     stream),
                     "cub::DeviceRadixSort::SortPairs");
    const bool in_a = kbuf.selector == 0;
    res.keys = in_a ? keys_a : keys_b;
    res.gaussian_ids = vbuf.selector == 0 ? ids_a : ids_b;

    tile_ranges_kernel<<<num_blocks(n_tiles, kBlock1D), kBlock1D, 0, stream>>>(
        n_tiles, total, reinterpret_cast<const uint64_t*>(res.keys.data_ptr<int64_t>()),
        res.tile_ranges.data_ptr<int32_t>());
    RIGEL_CHECK_LAUNCH("tile_ranges_kernel");
    return res;
}

}  // namespace rigel
