// [2] Tile binning (docs/PIPELINE.md [2]): count the tiles each Gaussian's footprint ellipse touches, scan,
// emit one (tile << 32 | depth bits, gaussian) entry per touched tile, radix-sort by key, find tile ranges.
//
//   counts   [2, 3, 0, 2, 1]          per Gaussian (count_tiles_kernel)
//   offsets  [2, 5, 5, 7, 8]          inclusive scan; Gaussian g writes entries [offsets[g-1], offsets[g])
//   total    8                        the one device->host read of the frame
//
// A Gaussian whose tile rectangle has at most kLargeRect tiles is handled by one thread; a larger one (a splat
// near the camera can cover the whole image) is put on a list, and its rectangle's tiles (row-major) are cut into
// kLargeParts equal parts, each walked by one warp 32 tiles at a time, so that no thread walks thousands of tiles
// while the others wait. (One warp per large Gaussian was the bound before: on beer after 5000 steps 13k of 23k
// visible Gaussians are large, 5.4M tile tests a frame, and a warp that drew a few whole-image splats walked
// 113 rows of 32 tiles for each; docs/BENCHMARKS.md.)
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

constexpr int kLargeRect = 32;  // tiles; above this a Gaussian is counted and emitted by warps
constexpr int kLargeParts = 8;  // warps per large Gaussian (gridDim.y of the warp kernels)

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

// The warp kernels' walk over the large list: each row of the grid (blockIdx.y = part) has its warps stride over
// the first *large_count ids (warp-uniform, so the kernels may use warp collectives); a Gaussian's rectangle is
// numbered row-major, tile k at (x0 + k % width, y0 + k / width), and part p takes k in [p·per, (p+1)·per), per
// = its area / kLargeParts rounded up to whole warps (parts past the area are empty).
struct LargeWalk {
    int lane;     // of the calling thread in its warp
    int first;    // this warp's first index into the list
    int stride;   // warps in one row of the grid
    int n_large;  // length of the list
    int part;     // this warp's part of each Gaussian's tiles
};

__device__ __forceinline__ LargeWalk large_walk(const int32_t* __restrict__ large_count) {
    LargeWalk w;
    w.lane = threadIdx.x & 31;
    w.first = (blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    w.stride = (gridDim.x * blockDim.x) >> 5;
    w.n_large = *large_count;
    w.part = blockIdx.y;
    return w;
}

// Tiles [k0, k1) of the rectangle's row-major numbering that part `part` walks (k0 >= k1: none).
__device__ __forceinline__ void part_range(int area, int part, int& k0, int& k1) {
    const int per = (area + 32 * kLargeParts - 1) / (32 * kLargeParts) * 32;
    k0 = part * per;
    k1 = min(area, k0 + per);
}

// Tile k of the rectangle in that row-major order (a tile of it for 0 <= k < rect.area(); rect not empty).
__device__ __forceinline__ void rect_tile(const TileRect& rect, int k, int& tx, int& ty) {
    const int width = rect.x1 - rect.x0;
    tx = rect.x0 + k % width;
    ty = rect.y0 + k / width;
}

// Thread per Gaussian: counts the small ones, lists the large ones for count_large_kernel.
__global__ void __launch_bounds__(kBlock1D) count_tiles_kernel(
    int64_t n, int width, int height, int tiles_x, int tiles_y,
    const float* __restrict__ means2D,    // [N, 2]
    const float* __restrict__ conics,     // [N, 3]
    const float* __restrict__ opacities,  // [N]
    const int32_t* __restrict__ radii,    // [N], 0 = culled
    int64_t* __restrict__ counts,         // [N] out, scan input (large ones: by count_large_kernel)
    int32_t* __restrict__ tiles_touched,  // [N] out (large ones: by count_large_kernel)
    int32_t* __restrict__ large_ids,      // [N] out, the first *large_count entries
    int32_t* __restrict__ large_count)    // [1] in/out, zero on entry
{
    const int64_t g = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
    if (g >= n) return;
    int32_t count = 0;
    const int32_t radius = radii[g];
    if (radius > 0) {
        const Footprint f = load_footprint(g, means2D, conics, opacities, radius, tiles_x, tiles_y);
        if (f.rect.area() > kLargeRect) {  // counted by count_large_kernel's warps, which add their parts
            counts[g] = 0;
            tiles_touched[g] = 0;
            large_ids[atomicAdd(large_count, 1)] = static_cast<int32_t>(g);
            return;
        }
        for (int ty = f.rect.y0; ty < f.rect.y1; ++ty)
            for (int tx = f.rect.x0; tx < f.rect.x1; ++tx) count += touches(f, tx, ty, width, height);
    }
    counts[g] = count;
    tiles_touched[g] = count;
}

// Warp per part of a listed (large) Gaussian, adding the part's count; each grid row strides over the list, whose
// length only the device knows.
__global__ void __launch_bounds__(kBlock1D) count_large_kernel(
    int width, int height, int tiles_x, int tiles_y,
    const float* __restrict__ means2D,       // [N, 2]
    const float* __restrict__ conics,        // [N, 3]
    const float* __restrict__ opacities,     // [N]
    const int32_t* __restrict__ radii,       // [N]
    const int32_t* __restrict__ large_ids,   // [*large_count]
    const int32_t* __restrict__ large_count, // [1]
    int64_t* __restrict__ counts,            // [N] out
    int32_t* __restrict__ tiles_touched)     // [N] out
{
    const LargeWalk walk = large_walk(large_count);
    const int lane = walk.lane;
    for (int i = walk.first; i < walk.n_large; i += walk.stride) {
        const int32_t g = large_ids[i];
        const Footprint f = load_footprint(g, means2D, conics, opacities, radii[g], tiles_x, tiles_y);
        int k0, k1;
        part_range(f.rect.area(), walk.part, k0, k1);
        if (k0 >= k1) continue;
        unsigned int count = 0;
        for (int k = k0 + lane; k < k1; k += 32) {
            int tx, ty;
            rect_tile(f.rect, k, tx, ty);
            count += touches(f, tx, ty, width, height);
        }
        count = __reduce_add_sync(0xffffffffu, count);
        if (lane == 0 && count != 0) {
            atomicAdd(reinterpret_cast<unsigned long long*>(counts + g), static_cast<unsigned long long>(count));
            atomicAdd(tiles_touched + g, static_cast<int32_t>(count));
        }
    }
}

// Each Gaussian writes its own slice [offsets[g-1], offsets[g]) of the entry list, so the list is in Gaussian
// index order, which the stable sort keeps for equal keys (a small Gaussian's slice in row-major tile order, a
// large one's in the order its parts reach the cursor: emit_large_kernel). An entry at or past `capacity` is
// dropped (the fixed-capacity mode of launch_emit_and_sort: the frame is then incomplete, and the caller, told by
// the device-side total, discards it; which of a large Gaussian's entries straddling the capacity survive may
// then differ between runs).
__device__ inline void write_entry(uint64_t* __restrict__ keys, int32_t* __restrict__ gaussian_ids, int64_t at,
                                   int64_t capacity, int tx, int ty, int tiles_x, uint64_t depth_bits, int32_t g) {
    if (at >= capacity) return;
    const uint64_t tile_id = static_cast<uint64_t>(ty) * tiles_x + tx;
    keys[at] = (tile_id << 32) | depth_bits;
    gaussian_ids[at] = g;
}

__global__ void __launch_bounds__(kBlock1D) emit_entries_kernel(
    int64_t n, int width, int height, int tiles_x, int tiles_y,
    const float* __restrict__ means2D,    // [N, 2]
    const float* __restrict__ conics,     // [N, 3]
    const float* __restrict__ opacities,  // [N]
    const float* __restrict__ depths,     // [N]
    const int32_t* __restrict__ radii,    // [N]
    const int64_t* __restrict__ offsets,  // [N] inclusive scan of the counts
    int64_t capacity,                     // entries at or past it are dropped
    uint64_t* __restrict__ keys,          // [E] out, (tile_id << 32) | float_bits(depth)
    int32_t* __restrict__ gaussian_ids)   // [E] out
{
    const int64_t g = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
    if (g >= n) return;
    const int32_t radius = radii[g];
    if (radius <= 0) return;
    int64_t out = g == 0 ? 0 : offsets[g - 1];
    if (out == offsets[g] || out >= capacity) return;
    const Footprint f = load_footprint(g, means2D, conics, opacities, radius, tiles_x, tiles_y);
    if (f.rect.area() > kLargeRect) return;  // emit_large_kernel's
    const uint64_t depth_bits = __float_as_uint(depths[g]);
    for (int ty = f.rect.y0; ty < f.rect.y1; ++ty)
        for (int tx = f.rect.x0; tx < f.rect.x1; ++tx)
            if (touches(f, tx, ty, width, height))
                write_entry(keys, gaussian_ids, out++, capacity, tx, ty, tiles_x, depth_bits, static_cast<int32_t>(g));
}

// Warp per part of a listed Gaussian, 32 consecutive row-major tiles at a time: the parts share the Gaussian's
// slice through a cursor (one atomic per 32 tiles), and a ballot and a prefix count place the warp's entries. The
// order inside a slice is therefore not row-major and may differ between runs; the sorted list is the same, since
// a Gaussian's entries all have different tiles and so different keys (the stable sort orders equal keys, which
// only entries of different Gaussians can share, by slice, i.e. by Gaussian index).
__global__ void __launch_bounds__(kBlock1D) emit_large_kernel(
    int width, int height, int tiles_x, int tiles_y,
    const float* __restrict__ means2D,        // [N, 2]
    const float* __restrict__ conics,         // [N, 3]
    const float* __restrict__ opacities,      // [N]
    const float* __restrict__ depths,         // [N]
    const int32_t* __restrict__ radii,        // [N]
    const int64_t* __restrict__ offsets,      // [N]
    const int32_t* __restrict__ large_ids,    // [*large_count]
    const int32_t* __restrict__ large_count,  // [1]
    int32_t* __restrict__ cursor,             // [N] zero on entry: entries of the slice written so far
    int64_t capacity,                         // entries at or past it are dropped
    uint64_t* __restrict__ keys,              // [E] out
    int32_t* __restrict__ gaussian_ids)       // [E] out
{
    const LargeWalk walk = large_walk(large_count);
    const int lane = walk.lane;
    const unsigned int lanes_below = (1u << lane) - 1u;
    for (int i = walk.first; i < walk.n_large; i += walk.stride) {
        const int32_t g = large_ids[i];
        const Footprint f = load_footprint(g, means2D, conics, opacities, radii[g], tiles_x, tiles_y);
        int k0, k1;
        part_range(f.rect.area(), walk.part, k0, k1);
        if (k0 >= k1) continue;
        const uint64_t depth_bits = __float_as_uint(depths[g]);
        const int64_t slice = g == 0 ? 0 : offsets[g - 1];
        for (int base = k0; base < k1; base += 32) {
            const int k = base + lane;
            int tx, ty;
            rect_tile(f.rect, k, tx, ty);
            const bool hit = k < k1 && touches(f, tx, ty, width, height);
            const unsigned int mask = __ballot_sync(0xffffffffu, hit);
            if (mask == 0u) continue;
            int at = 0;
            if (lane == 0) at = atomicAdd(cursor + g, __popc(mask));
            at = __shfl_sync(0xffffffffu, at, 0);
            if (hit)
                write_entry(keys, gaussian_ids, slice + at + __popc(mask & lanes_below), capacity, tx, ty, tiles_x,
                            depth_bits, g);
        }
    }
}

// Fixed-capacity mode: entries [*total, capacity) get a key past every tile's ((n_tiles << 32) | 0xffffffff), so
// the sort leaves them at the end and no tile range reaches them.
__global__ void __launch_bounds__(kBlock1D) pad_entries_kernel(
    int64_t capacity, uint64_t pad_key,
    const int64_t* __restrict__ total,  // [1] entries the frame needs (the scan's last element)
    uint64_t* __restrict__ keys,        // [capacity] in/out
    int32_t* __restrict__ gaussian_ids) // [capacity] in/out
{
    const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i >= capacity || i < *total) return;
    keys[i] = pad_key;
    gaussian_ids[i] = 0;
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

// Grid of the warp kernels: kLargeParts rows of enough warps to fill the GPU; each row strides over the list.
dim3 large_grid() {
    static const int sms = at::cuda::getCurrentDeviceProperties()->multiProcessorCount;
    return dim3(static_cast<unsigned int>(sms * 4), kLargeParts);
}

}  // namespace

void launch_count_tiles(const at::Tensor& means2D, const at::Tensor& conics, const at::Tensor& opacities,
                           const at::Tensor& radii, int width, int height, at::Tensor& offsets,
                           at::Tensor& tiles_touched, at::Tensor& large_ids, at::Tensor& large_count) {
    const int64_t n = means2D.size(0);
    if (n == 0) return;
    const int tiles_x = (width + kTileSize - 1) / kTileSize, tiles_y = (height + kTileSize - 1) / kTileSize;
    const auto stream = at::cuda::getCurrentCUDAStream();
    at::Tensor counts = at::empty({n}, offsets.options());
    count_tiles_kernel<<<num_blocks(n, kBlock1D), kBlock1D, 0, stream>>>(
        n, width, height, tiles_x, tiles_y, means2D.data_ptr<float>(), conics.data_ptr<float>(),
        opacities.data_ptr<float>(), radii.data_ptr<int32_t>(), counts.data_ptr<int64_t>(),
        tiles_touched.data_ptr<int32_t>(), large_ids.data_ptr<int32_t>(), large_count.data_ptr<int32_t>());
    RIGEL_CHECK_LAUNCH("count_tiles_kernel");
    count_large_kernel<<<large_grid(), kBlock1D, 0, stream>>>(
        width, height, tiles_x, tiles_y, means2D.data_ptr<float>(), conics.data_ptr<float>(),
        opacities.data_ptr<float>(), radii.data_ptr<int32_t>(), large_ids.data_ptr<int32_t>(),
        large_count.data_ptr<int32_t>(), counts.data_ptr<int64_t>(), tiles_touched.data_ptr<int32_t>());
    RIGEL_CHECK_LAUNCH("count_large_kernel");

    size_t scan_bytes = 0;
    RIGEL_CHECK_CUDA(cub::DeviceScan::InclusiveSum(nullptr, scan_bytes, counts.data_ptr<int64_t>(),
                                                   offsets.data_ptr<int64_t>(), n, stream),
                     "cub::DeviceScan::InclusiveSum (size query)");
    at::Tensor scan_tmp = at::empty({static_cast<int64_t>(scan_bytes)}, offsets.options().dtype(at::kByte));
    RIGEL_CHECK_CUDA(cub::DeviceScan::InclusiveSum(scan_tmp.data_ptr(), scan_bytes, counts.data_ptr<int64_t>(),
                                                   offsets.data_ptr<int64_t>(), n, stream),
                     "cub::DeviceScan::InclusiveSum");
}

std::pair<at::Tensor, at::Tensor> launch_emit_and_sort(const at::Tensor& means2D, const at::Tensor& conics,
                                                       const at::Tensor& opacities, const at::Tensor& depths,
                                                       const at::Tensor& radii, int width, int height,
                                                       const at::Tensor& offsets, const at::Tensor& large_ids,
                                                       const at::Tensor& large_count, int64_t total,
                                                       bool fixed_capacity, at::Tensor& tile_ranges) {
    const int64_t n = means2D.size(0);
    const int tiles_x = (width + kTileSize - 1) / kTileSize, tiles_y = (height + kTileSize - 1) / kTileSize;
    const int n_tiles = tiles_x * tiles_y;
    const auto stream = at::cuda::getCurrentCUDAStream();
    const auto i32 = means2D.options().dtype(at::kInt), i64 = means2D.options().dtype(at::kLong);
    if (total == 0) {  // (fixed capacity 0: nothing can be emitted; the device total tells the caller)
        RIGEL_CHECK_CUDA(cudaMemsetAsync(tile_ranges.data_ptr<int32_t>(), 0, sizeof(int32_t) * 2 * n_tiles, stream),
                         "cudaMemsetAsync(tile_ranges)");
        return {at::empty({0}, i64), at::empty({0}, i32)};
    }
    at::Tensor keys_a = at::empty({total}, i64), keys_b = at::empty({total}, i64);
    at::Tensor ids_a = at::empty({total}, i32), ids_b = at::empty({total}, i32);
    uint64_t* keys_out = reinterpret_cast<uint64_t*>(keys_a.data_ptr<int64_t>());
    if (n > 0) {  // (n = 0 reaches here only with a fixed capacity: all of it is padding)
    emit_entries_kernel<<<num_blocks(n, kBlock1D), kBlock1D, 0, stream>>>(
        n, width, height, tiles_x, tiles_y, means2D.data_ptr<float>(), conics.data_ptr<float>(),
        opacities.data_ptr<float>(), depths.data_ptr<float>(), radii.data_ptr<int32_t>(), offsets.data_ptr<int64_t>(),
        total, keys_out, ids_a.data_ptr<int32_t>());
    RIGEL_CHECK_LAUNCH("emit_entries_kernel");
    at::Tensor cursor = at::zeros({n}, i32);
    emit_large_kernel<<<large_grid(), kBlock1D, 0, stream>>>(
        width, height, tiles_x, tiles_y, means2D.data_ptr<float>(), conics.data_ptr<float>(),
        opacities.data_ptr<float>(), depths.data_ptr<float>(), radii.data_ptr<int32_t>(), offsets.data_ptr<int64_t>(),
        large_ids.data_ptr<int32_t>(), large_count.data_ptr<int32_t>(), cursor.data_ptr<int32_t>(), total, keys_out,
        ids_a.data_ptr<int32_t>());
    RIGEL_CHECK_LAUNCH("emit_large_kernel");
    }
    if (fixed_capacity) {  // the frame needs offsets[n-1] entries (device-side); pad the rest of the capacity
        at::Tensor zero;
        const int64_t* d_total = nullptr;
        if (n > 0) {
            d_total = offsets.data_ptr<int64_t>() + (n - 1);
        } else {
            zero = at::zeros({1}, i64);
            d_total = zero.data_ptr<int64_t>();
        }
        const uint64_t pad_key = (static_cast<uint64_t>(n_tiles) << 32) | 0xffffffffull;
        pad_entries_kernel<<<num_blocks(total, kBlock1D), kBlock1D, 0, stream>>>(total, pad_key, d_total, keys_out,
                                                                                 ids_a.data_ptr<int32_t>());
        RIGEL_CHECK_LAUNCH("pad_entries_kernel");
    }

    // LSD radix sort (stable) on the bits in use: 32 depth bits + enough bits for the largest tile id.
    cub::DoubleBuffer<uint64_t> kbuf(keys_out, reinterpret_cast<uint64_t*>(keys_b.data_ptr<int64_t>()));
    cub::DoubleBuffer<int32_t> vbuf(ids_a.data_ptr<int32_t>(), ids_b.data_ptr<int32_t>());
    const int end_bit = 32 + bit_width(static_cast<uint32_t>(n_tiles));
    const int num_items = static_cast<int>(total);
    size_t sort_bytes = 0;
    RIGEL_CHECK_CUDA(cub::DeviceRadixSort::SortPairs(nullptr, sort_bytes, kbuf, vbuf, num_items, 0, end_bit, stream),
                     "cub::DeviceRadixSort::SortPairs (size query)");
    at::Tensor sort_tmp = at::empty({static_cast<int64_t>(sort_bytes)}, means2D.options().dtype(at::kByte));
    RIGEL_CHECK_CUDA(cub::DeviceRadixSort::SortPairs(sort_tmp.data_ptr(), sort_bytes, kbuf, vbuf, num_items, 0, end_bit,
                                                     stream),
                     "cub::DeviceRadixSort::SortPairs");
    at::Tensor keys = kbuf.selector == 0 ? keys_a : keys_b;
    at::Tensor gaussian_ids = vbuf.selector == 0 ? ids_a : ids_b;

    tile_ranges_kernel<<<num_blocks(n_tiles, kBlock1D), kBlock1D, 0, stream>>>(
        n_tiles, total, reinterpret_cast<const uint64_t*>(keys.data_ptr<int64_t>()), tile_ranges.data_ptr<int32_t>());
    RIGEL_CHECK_LAUNCH("tile_ranges_kernel");
    return {keys, gaussian_ids};
}

}  // namespace rigel
