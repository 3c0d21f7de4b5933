// Host side of rigel_core._C: argument checks, output allocation, launches (declarations in ops.h).
#include "ops.h"

#include <cmath>
#include <cstdlib>
#include <string>
#include <vector>

#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>

#include "appearance.h"
#include "check_text.h"
#include "config.h"
#include "launch.h"
#include "ssim.h"

namespace rigel {
namespace {

std::string describe(const at::Tensor& t) {
    if (!t.defined()) return "an undefined tensor";
    return std::string("a ") + (t.is_contiguous() ? "" : "non-contiguous ") + dtype_name(t.scalar_type()) +
           " tensor on " + t.device().str() + " of shape " + shape_text_of(t.sizes());
}

std::string prefix(const char* op) { return std::string("rigel_core._C.") + op + ": "; }

// t must be a contiguous tensor of `dtype` on `device` whose sizes match `shape` (-1 = any size). `shape_text`
// says the expected shape in the docs' words, e.g. "(N, 3)".
void check(const char* op, const char* name, const at::Tensor& t, at::ScalarType dtype, const at::Device& device,
           const std::vector<int64_t>& shape, const char* shape_text) {
    bool ok = t.defined() && t.scalar_type() == dtype && t.device() == device && t.is_contiguous() &&
              t.dim() == static_cast<int64_t>(shape.size());
    for (size_t i = 0; ok && i < shape.size(); ++i) ok = shape[i] < 0 || t.size(static_cast<int64_t>(i)) == shape[i];
    if (ok) return;
    std::string expected = std::string("a contiguous ") + dtype_name(dtype) + " tensor on " + device.str() +
                           " of shape " + shape_text;
    bool first = true;
    for (size_t i = 0; i < shape.size(); ++i) {
        if (shape[i] < 0) continue;
        expected += (first ? " = (" : ", ") + std::to_string(shape[i]);
        first = false;
    }
    if (!first) expected += ")";
    const std::string msg = prefix(op) + name + " must be " + expected + "; got " + describe(t);
    if (t.defined() && (t.scalar_type() != dtype || t.device() != device)) TORCH_CHECK_TYPE(false, msg);
    TORCH_CHECK_VALUE(false, msg);
}

// The device of the first per-Gaussian tensor: it must be a CUDA device.
at::Device cuda_device(const char* op, const char* name, const at::Tensor& t) {
    if (!(t.defined() && t.is_cuda()))
        TORCH_CHECK_TYPE(false, prefix(op) + name + " must be a CUDA tensor (CPU tensors go to the PyTorch reference); got " +
                                    describe(t));
    return t.device();
}

int64_t num_gaussians(const char* op, const at::Tensor& means) {
    if (means.dim() != 2) TORCH_CHECK_VALUE(false, prefix(op) + "expected a per-Gaussian (N, C) tensor; got " + describe(means));
    if (means.size(0) >= (int64_t(1) << 31))
        TORCH_CHECK_VALUE(false, prefix(op) + std::to_string(means.size(0)) + " Gaussians exceed the int32 index range");
    return means.size(0);
}

void check_image_size(const char* op, int64_t width, int64_t height) {
    // one block row per tile row (grid.y <= 65535) and int32 pixel indices.
    const int64_t max_h = int64_t(65535) * RIGEL_TILE_SIZE;
    if (!(width > 0 && height > 0 && height <= max_h && width * height * 3 < (int64_t(1) << 31)))
        TORCH_CHECK_VALUE(false, prefix(op) + "unsupported image size " + std::to_string(width) + "x" +
                                     std::to_string(height) + " (need width, height > 0, height <= " +
                                     std::to_string(max_h) + " and width*height*3 < 2^31)");
}

// The degree is in 0..3 and `coeffs` (sh_coeffs, or sh_rest of the split ops: `extra` = 1 for its missing DC
// column) holds at least (degree+1)^2 coefficients per Gaussian.
void check_sh_degree(const char* op, int64_t degree, const at::Tensor& coeffs, const char* name = "sh_coeffs",
                     int64_t extra = 0) {
    if (!(degree >= 0 && degree <= 3))
        TORCH_CHECK_VALUE(false, prefix(op) + "SH degree must be in 0..3, got " + std::to_string(degree));
    const int64_t k = (degree + 1) * (degree + 1);
    if (coeffs.size(1) + extra < k)
        TORCH_CHECK_VALUE(false, prefix(op) + "degree " + std::to_string(degree) + " needs K >= " + std::to_string(k) +
                                     " coefficients, got " + name + " of shape " + shape_text_of(coeffs.sizes()));
}

void check_background(const char* op, const c10::optional<at::Tensor>& background, const at::Device& dev) {
    if (background.has_value()) check(op, "background", *background, at::kFloat, dev, {3}, "(3,)");
}

int64_t tile_count(int64_t width, int64_t height) {
    return ((width + RIGEL_TILE_SIZE - 1) / RIGEL_TILE_SIZE) * ((height + RIGEL_TILE_SIZE - 1) / RIGEL_TILE_SIZE);
}

// The device of an op's inputs and their Gaussian count N, as the shared checks below found them.
struct CheckedInputs {
    at::Device device;
    int64_t n;
};

// The inputs project_gaussians and its backward share, in the order both check them: means3D, quats, scales,
// opacities (the forward's only: nullptr skips it), viewmat, K, then the image size.
CheckedInputs check_projection_inputs(const char* op, const at::Tensor& means3D, const at::Tensor& quats,
                                      const at::Tensor& scales, const at::Tensor* opacities, const at::Tensor& viewmat,
                                      const at::Tensor& K, int64_t width, int64_t height) {
    const at::Device dev = cuda_device(op, "means3D", means3D);
    const int64_t n = num_gaussians(op, means3D);
    check(op, "means3D", means3D, at::kFloat, dev, {n, 3}, "(N, 3)");
    check(op, "quats", quats, at::kFloat, dev, {n, 4}, "(N, 4)");
    check(op, "scales", scales, at::kFloat, dev, {n, 3}, "(N, 3)");
    if (opacities != nullptr) check(op, "opacities", *opacities, at::kFloat, dev, {n}, "(N,)");
    check(op, "viewmat", viewmat, at::kFloat, dev, {4, 4}, "(4, 4)");
    check(op, "K", K, at::kFloat, dev, {3, 3}, "(3, 3)");
    check_image_size(op, width, height);
    return {dev, n};
}

// The inputs sh_colors and its backward share: the degree, means3D, sh_coeffs (enough bases for the degree),
// campos.
CheckedInputs check_sh_inputs(const char* op, int64_t degree, const at::Tensor& sh_coeffs, const at::Tensor& means3D,
                              const at::Tensor& campos) {
    if (!(degree >= 0 && degree <= 3))
        TORCH_CHECK_VALUE(false, prefix(op) + "SH degree must be in 0..3, got " + std::to_string(degree));
    const at::Device dev = cuda_device(op, "means3D", means3D);
    const int64_t n = num_gaussians(op, means3D);
    check(op, "means3D", means3D, at::kFloat, dev, {n, 3}, "(N, 3)");
    check(op, "sh_coeffs", sh_coeffs, at::kFloat, dev, {n, -1, 3}, "(N, K, 3)");
    check_sh_degree(op, degree, sh_coeffs);
    check(op, "campos", campos, at::kFloat, dev, {3}, "(3,)");
    return {dev, n};
}

// The inputs sh_colors_split and its backward share: as check_sh_inputs with sh_dc (N, 1, 3) and sh_rest
// (N, K-1, 3) for sh_coeffs (K = 1 + sh_rest's columns).
CheckedInputs check_sh_split_inputs(const char* op, int64_t degree, const at::Tensor& sh_dc, const at::Tensor& sh_rest,
                                    const at::Tensor& means3D, const at::Tensor& campos) {
    if (!(degree >= 0 && degree <= 3))
        TORCH_CHECK_VALUE(false, prefix(op) + "SH degree must be in 0..3, got " + std::to_string(degree));
    const at::Device dev = cuda_device(op, "means3D", means3D);
    const int64_t n = num_gaussians(op, means3D);
    check(op, "means3D", means3D, at::kFloat, dev, {n, 3}, "(N, 3)");
    check(op, "sh_dc", sh_dc, at::kFloat, dev, {n, 1, 3}, "(N, 1, 3)");
    check(op, "sh_rest", sh_rest, at::kFloat, dev, {n, -1, 3}, "(N, K-1, 3)");
    check_sh_degree(op, degree, sh_rest, "sh_rest", 1);
    check(op, "campos", campos, at::kFloat, dev, {3}, "(3,)");
    return {dev, n};
}

// The inputs rasterize_tiles and its backward share: the image size, the per-Gaussian tensors, the entry list,
// the tile ranges and the optional background.
CheckedInputs check_raster_inputs(const char* op, const at::Tensor& means2D, const at::Tensor& conics,
                                  const at::Tensor& colors, const at::Tensor& opacities,
                                  const at::Tensor& gaussian_ids, const at::Tensor& tile_ranges, int64_t width,
                                  int64_t height, const c10::optional<at::Tensor>& background) {
    const at::Device dev = cuda_device(op, "means2D", means2D);
    const int64_t n = num_gaussians(op, means2D);
    check_image_size(op, width, height);
    check(op, "means2D", means2D, at::kFloat, dev, {n, 2}, "(N, 2)");
    check(op, "conics", conics, at::kFloat, dev, {n, 3}, "(N, 3)");
    check(op, "colors", colors, at::kFloat, dev, {n, 3}, "(N, 3)");
    check(op, "opacities", opacities, at::kFloat, dev, {n}, "(N,)");
    check(op, "gaussian_ids", gaussian_ids, at::kInt, dev, {-1}, "(E,)");
    check(op, "tile_ranges", tile_ranges, at::kInt, dev, {tile_count(width, height), 2}, "(n_tiles, 2)");
    check_background(op, background, dev);
    return {dev, n};
}


// The inputs mlp_colors and its backward share: latents (N, L), means3D (N, 3), campos (3,), W1 (H, L+3), b1 (H,),
// W2 (3, H), b2 (3,), with L and H within the kernel's limits (config.h).
struct MlpInputs {
    at::Device device;
    int64_t n, L, H;
};

MlpInputs check_mlp_inputs(const char* op, const at::Tensor& latents, const at::Tensor& means3D,
                           const at::Tensor& campos, const at::Tensor& W1, const at::Tensor& b1, const at::Tensor& W2,
                           const at::Tensor& b2) {
    const at::Device dev = cuda_device(op, "latents", latents);
    const int64_t n = num_gaussians(op, latents);
    if (!(W1.defined() && W1.dim() == 2))
        TORCH_CHECK_VALUE(false, prefix(op) + "W1 must be a (H, L+3) tensor; got " + describe(W1));
    const int64_t L = latents.size(1), H = W1.size(0);
    if (!(L >= 1 && L <= RIGEL_APPEARANCE_MAX_LATENT))
        TORCH_CHECK_VALUE(false, prefix(op) + "latent dimension L=" + std::to_string(L) + " outside 1.." +
                                     std::to_string(RIGEL_APPEARANCE_MAX_LATENT));
    if (!(H >= 1 && H <= RIGEL_APPEARANCE_MAX_HIDDEN))
        TORCH_CHECK_VALUE(false, prefix(op) + "hidden width H=" + std::to_string(H) + " outside 1.." +
                                     std::to_string(RIGEL_APPEARANCE_MAX_HIDDEN));
    check(op, "latents", latents, at::kFloat, dev, {n, L}, "(N, L)");
    check(op, "means3D", means3D, at::kFloat, dev, {n, 3}, "(N, 3)");
    check(op, "campos", campos, at::kFloat, dev, {3}, "(3,)");
    check(op, "W1", W1, at::kFloat, dev, {H, L + 3}, "(H, L+3)");
    check(op, "b1", b1, at::kFloat, dev, {H}, "(H,)");
    check(op, "W2", W2, at::kFloat, dev, {3, H}, "(3, H)");
    check(op, "b2", b2, at::kFloat, dev, {3}, "(3,)");
    return {dev, n, L, H};
}

// The image ssim_map and its backward share: img1 (H, W, C) or (B, H, W, C) of a size the kernels' grid takes;
// img2 must then match it (checked by the callers with img1's sizes).
at::Device check_ssim_image(const char* op, const at::Tensor& img1) {
    const at::Device dev = cuda_device(op, "img1", img1);
    if (!(img1.dim() == 3 || img1.dim() == 4))
        TORCH_CHECK_VALUE(false, prefix(op) + "img1 must be a channels-last (H, W, C) or (B, H, W, C) image; got " +
                                     describe(img1));
    check(op, "img1", img1, at::kFloat, dev, std::vector<int64_t>(img1.dim(), -1),
          img1.dim() == 4 ? "(B, H, W, C)" : "(H, W, C)");
    const int64_t h = img1.size(-3), c = img1.size(-1), b = img1.dim() == 4 ? img1.size(0) : 1;
    const int64_t max_h = int64_t(65535) * kSsimTile;  // one block row per tile row, one grid z per (image, channel)
    if (!(b * c <= 65535 && h <= max_h && img1.size(-2) < (int64_t(1) << 31) - kSsimTile))
        TORCH_CHECK_VALUE(false, prefix(op) + "img1 of shape " + shape_text_of(img1.sizes()) +
                                     " is too large for the kernels' grid (need B*C <= 65535, H <= " +
                                     std::to_string(max_h) + ")");
    return dev;
}

// coef's shape: (planes, *img1.shape) — 3 float64 planes, or 5 float32 ones for the float32 loss kernels.
std::vector<int64_t> ssim_coef_shape(const at::Tensor& img1, int64_t planes = 3) {
    std::vector<int64_t> s{planes};
    for (int64_t d : img1.sizes()) s.push_back(d);
    return s;
}

}  // namespace

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> project_gaussians(
    const at::Tensor& means3D, const at::Tensor& quats, const at::Tensor& scales, const at::Tensor& opacities,
    const at::Tensor& viewmat, const at::Tensor& K, int64_t width, int64_t height, double near_plane,
    double far_plane, const c10::optional<at::Tensor>& colors, const c10::optional<at::Tensor>& compensations) {
    const auto [dev, n] =
        check_projection_inputs("project_gaussians", means3D, quats, scales, &opacities, viewmat, K, width, height);
    if (colors.has_value()) check("project_gaussians", "colors", *colors, at::kFloat, dev, {n, -1}, "(N, C)");
    at::Tensor comp_out;  // a handle to the caller's tensor (written in place), undefined in the default mode
    if (compensations.has_value()) {
        check("project_gaussians", "compensations", *compensations, at::kFloat, dev, {n}, "(N,)");
        comp_out = *compensations;
    }
    const c10::cuda::CUDAGuard guard(dev);
    const auto f32 = means3D.options();
    at::Tensor means2D = at::empty({n, 2}, f32), conics = at::empty({n, 3}, f32), depths = at::empty({n}, f32);
    at::Tensor radii = at::empty({n}, f32.dtype(at::kInt));
    launch_project_fwd(means3D, quats, scales, opacities, colors.has_value() ? &*colors : nullptr, viewmat, K,
                       static_cast<int>(width), static_cast<int>(height), near_plane, far_plane, means2D, conics,
                       depths, radii, comp_out.defined() ? &comp_out : nullptr);
    return {means2D, conics, depths, radii};
}

at::Tensor sh_colors(int64_t degree, const at::Tensor& sh_coeffs, const at::Tensor& means3D, const at::Tensor& campos) {
    const auto [dev, n] = check_sh_inputs("sh_colors", degree, sh_coeffs, means3D, campos);
    const c10::cuda::CUDAGuard guard(dev);
    at::Tensor colors = at::empty({n, 3}, means3D.options());
    launch_sh_fwd(static_cast<int>(degree), sh_coeffs, means3D, campos, colors);
    return colors;
}

at::Tensor sh_colors_split(int64_t degree, const at::Tensor& sh_dc, const at::Tensor& sh_rest,
                           const at::Tensor& means3D, const at::Tensor& campos) {
    const auto [dev, n] = check_sh_split_inputs("sh_colors_split", degree, sh_dc, sh_rest, means3D, campos);
    const c10::cuda::CUDAGuard guard(dev);
    at::Tensor colors = at::empty({n, 3}, means3D.options());
    launch_sh_fwd_split(static_cast<int>(degree), sh_dc, sh_rest, means3D, campos, colors);
    return colors;
}

namespace {
// What both binnings share: the input checks, then the per-Gaussian tile counts and their inclusive prefix sum
// (offsets[N-1] = the frame's entry count, on the device) and the list of Gaussians with large footprints.
struct TileCounts {
    at::Device dev;
    int64_t n;
    at::Tensor offsets, tiles_touched, large_ids, large_count;
};

TileCounts count_bin_tiles(const char* op, const at::Tensor& means2D, const at::Tensor& conics,
                           const at::Tensor& opacities, const at::Tensor& depths, const at::Tensor& radii,
                           int64_t width, int64_t height, int64_t max_entries, const char* max_name) {
    const at::Device dev = cuda_device(op, "means2D", means2D);
    const int64_t n = num_gaussians(op, means2D);
    check(op, "means2D", means2D, at::kFloat, dev, {n, 2}, "(N, 2)");
    check(op, "conics", conics, at::kFloat, dev, {n, 3}, "(N, 3)");
    check(op, "opacities", opacities, at::kFloat, dev, {n}, "(N,)");
    check(op, "depths", depths, at::kFloat, dev, {n}, "(N,)");
    check(op, "radii", radii, at::kInt, dev, {n}, "(N,)");
    check_image_size(op, width, height);
    if (!(max_entries >= 0 && max_entries < (int64_t(1) << 31)))
        TORCH_CHECK_VALUE(false, prefix(op) + max_name + " " + std::to_string(max_entries) + " must be in [0, 2^31)");
    const c10::cuda::CUDAGuard guard(dev);
    const auto i32 = means2D.options().dtype(at::kInt);
    TileCounts c{dev, n, at::empty({n}, means2D.options().dtype(at::kLong)), at::empty({n}, i32), at::empty({n}, i32),
                 at::zeros({1}, i32)};
    launch_count_tiles(means2D, conics, opacities, radii, static_cast<int>(width), static_cast<int>(height),
                       c.offsets, c.tiles_touched, c.large_ids, c.large_count);
    return c;
}
}  // namespace

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, int64_t> bin_gaussians(
    const at::Tensor& means2D, const at::Tensor& conics, const at::Tensor& opacities, const at::Tensor& depths,
    const at::Tensor& radii, int64_t width, int64_t height, int64_t max_entries) {
    TileCounts c = count_bin_tiles("bin_gaussians", means2D, conics, opacities, depths, radii, width, height,
                                   max_entries, "max_entries");
    const c10::cuda::CUDAGuard guard(c.dev);
    const int64_t total = c.n == 0 ? 0 : c.offsets[c.n - 1].item<int64_t>();  // the frame's one device->host read
    if (total > max_entries) {
        // Refused before anything of size `total` is allocated. Reported by value, not thrown: the Python side
        // (cuda_backend.bin_gaussians_cuda) raises the RuntimeError.
        const at::Tensor none = at::empty({0}, means2D.options().dtype(at::kInt));
        return {at::empty({0}, means2D.options().dtype(at::kLong)), none, none, c.tiles_touched, total};
    }
    at::Tensor tile_ranges = at::empty({tile_count(width, height), 2}, means2D.options().dtype(at::kInt));
    auto [keys, gaussian_ids] = launch_emit_and_sort(means2D, conics, opacities, depths, radii, static_cast<int>(width),
                                                     static_cast<int>(height), c.offsets, c.large_ids, c.large_count,
                                                     total, false, tile_ranges);
    return {keys, gaussian_ids, tile_ranges, c.tiles_touched, total};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> bin_gaussians_fixed(
    const at::Tensor& means2D, const at::Tensor& conics, const at::Tensor& opacities, const at::Tensor& depths,
    const at::Tensor& radii, int64_t width, int64_t height, int64_t capacity) {
    TileCounts c = count_bin_tiles("bin_gaussians_fixed", means2D, conics, opacities, depths, radii, width, height,
                                   capacity, "capacity");
    const c10::cuda::CUDAGuard guard(c.dev);
    at::Tensor tile_ranges = at::empty({tile_count(width, height), 2}, means2D.options().dtype(at::kInt));
    // capacity 0: launch_emit_and_sort emits nothing and returns empty keys and ids
    auto [keys, gaussian_ids] = launch_emit_and_sort(means2D, conics, opacities, depths, radii, static_cast<int>(width),
                                                     static_cast<int>(height), c.offsets, c.large_ids, c.large_count,
                                                     capacity, true, tile_ranges);
    at::Tensor total = c.n == 0 ? at::zeros({1}, means2D.options().dtype(at::kLong))
                                : c.offsets.narrow(0, c.n - 1, 1);  // a view: no copy, no read
    return {keys, gaussian_ids, tile_ranges, c.tiles_touched, total};
}

void rasterize_tiles(const at::Tensor& means2D, const at::Tensor& conics, const at::Tensor& colors,
                     const at::Tensor& opacities, const at::Tensor& gaussian_ids, const at::Tensor& tile_ranges,
                     int64_t width, int64_t height, const c10::optional<at::Tensor>& background, at::Tensor image,
                     at::Tensor final_T, at::Tensor n_contrib, const c10::optional<at::Tensor>& depths,
                     const c10::optional<at::Tensor>& depth_sum, const c10::optional<at::Tensor>& depth_median) {
    const char* op = "rasterize_tiles";
    const auto [dev, n] = check_raster_inputs(op, means2D, conics, colors, opacities, gaussian_ids, tile_ranges, width,
                                              height, background);
    check(op, "image", image, at::kFloat, dev, {height, width, 3}, "(H, W, 3)");
    check(op, "final_T", final_T, at::kFloat, dev, {height, width}, "(H, W)");
    check(op, "n_contrib", n_contrib, at::kInt, dev, {height, width}, "(H, W)");
    // depth output (issue 17.2): depths, depth_sum and depth_median come together or not at all
    if (depths.has_value() != depth_sum.has_value() || depths.has_value() != depth_median.has_value())
        TORCH_CHECK_VALUE(false, prefix(op) + "depths, depth_expected and depth_median must be given together");
    if (depths.has_value()) {
        check(op, "depths", *depths, at::kFloat, dev, {n}, "(N,)");
        check(op, "depth_expected", *depth_sum, at::kFloat, dev, {height, width}, "(H, W)");
        check(op, "depth_median", *depth_median, at::kFloat, dev, {height, width}, "(H, W)");
    }
    const c10::cuda::CUDAGuard guard(dev);
    launch_rasterize_fwd(means2D, conics, colors, opacities, gaussian_ids, tile_ranges, static_cast<int>(width),
                         static_cast<int>(height), background, image, final_T, n_contrib, depths, depth_sum,
                         depth_median);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> project_gaussians_backward(
    const at::Tensor& means3D, const at::Tensor& quats, const at::Tensor& scales, const at::Tensor& viewmat,
    const at::Tensor& K, int64_t width, int64_t height, const at::Tensor& radii, const at::Tensor& v_means2D,
    const at::Tensor& v_conics, const at::Tensor& v_depths, const c10::optional<at::Tensor>& v_compensations,
    const c10::optional<at::Tensor>& v_viewmat_parts) {
    const char* op = "project_gaussians_backward";
    const auto [dev, n] = check_projection_inputs(op, means3D, quats, scales, nullptr, viewmat, K, width, height);
    check(op, "radii", radii, at::kInt, dev, {n}, "(N,)");
    check(op, "v_means2D", v_means2D, at::kFloat, dev, {n, 2}, "(N, 2)");
    check(op, "v_conics", v_conics, at::kFloat, dev, {n, 3}, "(N, 3)");
    check(op, "v_depths", v_depths, at::kFloat, dev, {n}, "(N,)");
    if (v_compensations.has_value()) check(op, "v_compensations", *v_compensations, at::kFloat, dev, {n}, "(N,)");
    if (v_viewmat_parts.has_value())
        check(op, "v_viewmat_parts", *v_viewmat_parts, at::kFloat, dev, {n, 3, 4}, "(N, 3, 4)");
    const c10::cuda::CUDAGuard guard(dev);
    at::Tensor v_means3D = at::empty({n, 3}, means3D.options()), v_quats = at::empty({n, 4}, means3D.options());
    at::Tensor v_scales = at::empty({n, 3}, means3D.options());
    launch_project_bwd(means3D, quats, scales, viewmat, K, static_cast<int>(width), static_cast<int>(height), radii,
                       v_means2D, v_conics, v_depths, v_means3D, v_quats, v_scales,
                       v_compensations.has_value() ? &*v_compensations : nullptr,
                       v_viewmat_parts.has_value() ? &*v_viewmat_parts : nullptr);
    return {v_means3D, v_quats, v_scales};
}

std::tuple<at::Tensor, at::Tensor> sh_colors_backward(int64_t degree, const at::Tensor& sh_coeffs,
                                                      const at::Tensor& means3D, const at::Tensor& campos,
                                                      const at::Tensor& v_colors) {
    const char* op = "sh_colors_backward";
    const auto [dev, n] = check_sh_inputs(op, degree, sh_coeffs, means3D, campos);
    check(op, "v_colors", v_colors, at::kFloat, dev, {n, 3}, "(N, 3)");
    const c10::cuda::CUDAGuard guard(dev);
    at::Tensor v_sh_coeffs = at::empty_like(sh_coeffs), v_means3D = at::empty({n, 3}, means3D.options());
    launch_sh_bwd(static_cast<int>(degree), sh_coeffs, means3D, campos, v_colors, v_sh_coeffs, v_means3D);
    return {v_sh_coeffs, v_means3D};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> sh_colors_split_backward(int64_t degree, const at::Tensor& sh_dc,
                                                                        const at::Tensor& sh_rest,
                                                                        const at::Tensor& means3D,
                                                                        const at::Tensor& campos,
                                                                        const at::Tensor& v_colors) {
    const char* op = "sh_colors_split_backward";
    const auto [dev, n] = check_sh_split_inputs(op, degree, sh_dc, sh_rest, means3D, campos);
    check(op, "v_colors", v_colors, at::kFloat, dev, {n, 3}, "(N, 3)");
    const c10::cuda::CUDAGuard guard(dev);
    at::Tensor v_sh_dc = at::empty_like(sh_dc), v_sh_rest = at::empty_like(sh_rest);
    at::Tensor v_means3D = at::empty({n, 3}, means3D.options());
    launch_sh_bwd_split(static_cast<int>(degree), sh_dc, sh_rest, means3D, campos, v_colors, v_sh_dc, v_sh_rest,
                        v_means3D);
    return {v_sh_dc, v_sh_rest, v_means3D};
}

// kRasterBwdDenseMin, or RIGEL_RASTER_BWD_DENSE_MIN when set (launch.h; read per call so that a test can switch).
static int raster_bwd_dense_min() {
    const char* v = std::getenv("RIGEL_RASTER_BWD_DENSE_MIN");
    if (v == nullptr || *v == '\0') return kRasterBwdDenseMin;
    char* end = nullptr;
    const long x = std::strtol(v, &end, 10);
    if (end == v || *end != '\0' || x < 0 || x > kRasterBwdChunk + 1)
        TORCH_CHECK_VALUE(false, prefix("rasterize_tiles_backward") + "RIGEL_RASTER_BWD_DENSE_MIN must be an integer in [0, " +
                                     std::to_string(kRasterBwdChunk + 1) + "], not '" + v + "'");
    return static_cast<int>(x);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> rasterize_tiles_backward(
    const at::Tensor& means2D, const at::Tensor& conics, const at::Tensor& colors, const at::Tensor& opacities,
    const at::Tensor& gaussian_ids, const at::Tensor& tile_ranges, int64_t width, int64_t height,
    const c10::optional<at::Tensor>& background, const at::Tensor& final_T, const at::Tensor& n_contrib,
    const at::Tensor& v_image, const at::Tensor& v_final_T, const c10::optional<at::Tensor>& depths,
    const c10::optional<at::Tensor>& v_depth_sum) {
    const char* op = "rasterize_tiles_backward";
    const auto [dev, n] = check_raster_inputs(op, means2D, conics, colors, opacities, gaussian_ids, tile_ranges, width,
                                              height, background);
    check(op, "final_T", final_T, at::kFloat, dev, {height, width}, "(H, W)");
    check(op, "n_contrib", n_contrib, at::kInt, dev, {height, width}, "(H, W)");
    check(op, "v_image", v_image, at::kFloat, dev, {height, width, 3}, "(H, W, 3)");
    check(op, "v_final_T", v_final_T, at::kFloat, dev, {height, width}, "(H, W)");
    // depth output (issue 17.2): depths and v_depth_sum come together or not at all
    if (depths.has_value() != v_depth_sum.has_value())
        TORCH_CHECK_VALUE(false, prefix(op) + "depths and v_depth_sum must be given together");
    if (depths.has_value()) {
        check(op, "depths", *depths, at::kFloat, dev, {n}, "(N,)");
        check(op, "v_depth_sum", *v_depth_sum, at::kFloat, dev, {height, width}, "(H, W)");
    }
    const c10::cuda::CUDAGuard guard(dev);
    const auto f32 = means2D.options();
    at::Tensor v_means2D = at::zeros({n, 2}, f32), v_conics = at::zeros({n, 3}, f32);
    at::Tensor v_colors = at::zeros({n, 3}, f32), v_opacities = at::zeros({n}, f32);
    at::Tensor v_means2D_abs = at::zeros({n, 2}, f32);
    c10::optional<at::Tensor> v_depths;
    if (depths.has_value()) v_depths = at::zeros({n}, f32);
    launch_rasterize_bwd(means2D, conics, colors, opacities, gaussian_ids, tile_ranges, static_cast<int>(width),
                         static_cast<int>(height), background, final_T, n_contrib, v_image, v_final_T, v_means2D,
                         v_conics, v_colors, v_opacities, v_means2D_abs, depths, v_depth_sum, v_depths,
                         raster_bwd_dense_min());
    return {v_means2D, v_conics, v_colors, v_opacities, v_means2D_abs,
            v_depths.has_value() ? *v_depths : at::Tensor()};
}

at::Tensor mlp_colors(const at::Tensor& latents, const at::Tensor& means3D, const at::Tensor& campos,
                      const at::Tensor& W1, const at::Tensor& b1, const at::Tensor& W2, const at::Tensor& b2) {
    const auto [dev, n, L, H] = check_mlp_inputs("mlp_colors", latents, means3D, campos, W1, b1, W2, b2);
    const c10::cuda::CUDAGuard guard(dev);
    at::Tensor colors = at::empty({n, 3}, latents.options());
    launch_appearance_fwd(latents, means3D, campos, W1, b1, W2, b2, colors);
    return colors;
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> mlp_colors_backward(
    const at::Tensor& latents, const at::Tensor& means3D, const at::Tensor& campos, const at::Tensor& W1,
    const at::Tensor& b1, const at::Tensor& W2, const at::Tensor& b2, const at::Tensor& colors,
    const at::Tensor& v_colors, bool need_means) {
    const char* op = "mlp_colors_backward";
    const auto [dev, n, L, H] = check_mlp_inputs(op, latents, means3D, campos, W1, b1, W2, b2);
    check(op, "colors", colors, at::kFloat, dev, {n, 3}, "(N, 3)");
    check(op, "v_colors", v_colors, at::kFloat, dev, {n, 3}, "(N, 3)");
    const c10::cuda::CUDAGuard guard(dev);
    const auto f32 = latents.options();
    at::Tensor v_latents = at::empty({n, L}, f32);
    at::Tensor v_means3D = need_means ? at::empty({n, 3}, f32) : at::Tensor();
    at::Tensor v_W1 = at::zeros({H, L + 3}, f32), v_b1 = at::zeros({H}, f32);  // accumulated into
    at::Tensor v_W2 = at::zeros({3, H}, f32), v_b2 = at::zeros({3}, f32);
    launch_appearance_bwd(latents, means3D, campos, W1, b1, W2, b2, colors, v_colors, v_latents, v_means3D, v_W1,
                          v_b1, v_W2, v_b2);
    return {v_latents, v_means3D, v_W1, v_b1, v_W2, v_b2};
}

std::tuple<at::Tensor, at::Tensor> ssim_map(const at::Tensor& img1, const at::Tensor& img2) {
    const char* op = "ssim_map";
    const at::Device dev = check_ssim_image(op, img1);
    check(op, "img2", img2, at::kFloat, dev, img1.sizes().vec(), "(as img1)");
    const c10::cuda::CUDAGuard guard(dev);
    at::Tensor map = at::empty_like(img1);
    at::Tensor coef = at::empty(ssim_coef_shape(img1), img1.options().dtype(at::kDouble));
    launch_ssim_fwd(img1, img2, c10::nullopt, &map, coef, nullptr);
    return {map, coef};
}

at::Tensor ssim_map_backward(const at::Tensor& img1, const at::Tensor& img2, const at::Tensor& coef,
                             const at::Tensor& v_map) {
    const char* op = "ssim_map_backward";
    const at::Device dev = check_ssim_image(op, img1);
    check(op, "img2", img2, at::kFloat, dev, img1.sizes().vec(), "(as img1)");
    check(op, "coef", coef, at::kDouble, dev, ssim_coef_shape(img1), "(3, *img1.shape)");
    check(op, "v_map", v_map, at::kFloat, dev, img1.sizes().vec(), "(as img1)");
    const c10::cuda::CUDAGuard guard(dev);
    at::Tensor v_img1 = at::empty_like(img1);
    launch_ssim_bwd(&v_map, nullptr, c10::nullopt, img1, img2, coef, v_img1);
    return v_img1;
}

namespace {

// The photometric loss's optional mask: bool, (H, W) or (B, H, W) of img1's batch, contiguous, on its device.
void check_photometric_mask(const char* op, const c10::optional<at::Tensor>& mask, const at::Tensor& img1,
                            const at::Device& dev) {
    if (!mask.has_value()) return;
    std::vector<int64_t> shape(img1.sizes().begin(), img1.sizes().end() - 1);  // (H, W) or (B, H, W)
    check(op, "mask", *mask, at::kBool, dev, shape, img1.dim() == 4 ? "(B, H, W) of img1" : "(H, W) of img1");
}

}  // namespace

std::tuple<at::Tensor, at::Tensor> photometric_sums(const at::Tensor& pred, const at::Tensor& target,
                                                    const c10::optional<at::Tensor>& mask, bool fp32) {
    const char* op = "photometric_sums";
    const at::Device dev = check_ssim_image(op, pred);
    check(op, "target", target, at::kFloat, dev, pred.sizes().vec(), "(as pred)");
    check_photometric_mask(op, mask, pred, dev);
    const c10::cuda::CUDAGuard guard(dev);
    at::Tensor totals = at::zeros({4}, pred.options().dtype(at::kDouble));
    if (fp32) {
        at::Tensor coef = at::empty(ssim_coef_shape(pred, 5), pred.options());
        launch_loss32_fwd(pred, target, mask, coef, totals);
        return {totals, coef};
    }
    at::Tensor coef = at::empty(ssim_coef_shape(pred), pred.options().dtype(at::kDouble));
    launch_ssim_fwd(pred, target, mask, nullptr, coef, &totals);
    return {totals, coef};
}

at::Tensor photometric_sums_backward(const at::Tensor& pred, const at::Tensor& target,
                                     const c10::optional<at::Tensor>& mask, const at::Tensor& coef,
                                     const at::Tensor& v_totals) {
    const char* op = "photometric_sums_backward";
    const at::Device dev = check_ssim_image(op, pred);
    check(op, "target", target, at::kFloat, dev, pred.sizes().vec(), "(as pred)");
    check_photometric_mask(op, mask, pred, dev);
    check(op, "v_totals", v_totals, at::kDouble, dev, {4}, "(4,)");
    const c10::cuda::CUDAGuard guard(dev);
    at::Tensor v_pred = at::empty_like(pred);
    if (coef.defined() && coef.scalar_type() == at::kFloat) {  // the fp32 forward's
        check(op, "coef", coef, at::kFloat, dev, ssim_coef_shape(pred, 5),
              "(5, *pred.shape) float32 or (3, *pred.shape) float64");
        launch_loss32_bwd(v_totals, mask, pred, target, coef, v_pred);
        return v_pred;
    }
    check(op, "coef", coef, at::kDouble, dev, ssim_coef_shape(pred),
          "(3, *pred.shape) float64 or (5, *pred.shape) float32");
    launch_ssim_bwd(nullptr, &v_totals, mask, pred, target, coef, v_pred);
    return v_pred;
}

namespace {

// A one-element float32 tensor on `dev` (a device scalar the kernels read), or refuse naming it.
void check_scalar(const char* op, const std::string& name, const at::Tensor& t, const at::Device& dev) {
    if (t.defined() && t.scalar_type() == at::kFloat && t.device() == dev && t.numel() == 1) return;
    const std::string msg = prefix(op) + name + " must be a one-element float32 tensor on " + dev.str() + "; got " +
                            describe(t);
    if (t.defined() && (t.scalar_type() != at::kFloat || t.device() != dev)) TORCH_CHECK_TYPE(false, msg);
    TORCH_CHECK_VALUE(false, msg);
}

}  // namespace

void adam_step(const std::vector<at::Tensor>& params, const std::vector<at::Tensor>& grads,
               const std::vector<at::Tensor>& exp_avgs, const std::vector<at::Tensor>& exp_avg_sqs,
               const std::vector<at::Tensor>& steps, const std::vector<double>& lrs,
               const std::vector<c10::optional<at::Tensor>>& lr_tensors, const std::vector<double>& beta1s,
               const std::vector<double>& beta2s, const std::vector<double>& epss,
               const c10::optional<at::Tensor>& found_inf, bool skip_zero_grad) {
    const char* op = "adam_step";
    const size_t G = params.size();
    for (const size_t len : {grads.size(), exp_avgs.size(), exp_avg_sqs.size(), steps.size(), lrs.size(),
                             lr_tensors.size(), beta1s.size(), beta2s.size(), epss.size()})
        if (len != G)
            TORCH_CHECK_VALUE(false, prefix(op) + "every argument list must have one entry per group (" +
                                         std::to_string(G) + " params, got a list of " + std::to_string(len) + ")");
    if (G > static_cast<size_t>(kAdamMaxGroups))
        TORCH_CHECK_VALUE(false, prefix(op) + "at most " + std::to_string(kAdamMaxGroups) + " groups per call, got " +
                                     std::to_string(G));
    if (G == 0) return;
    const at::Device dev = cuda_device(op, "params[0]", params[0]);
    std::vector<AdamGroupArgs> groups;
    for (size_t i = 0; i < G; ++i) {
        const std::string k = "[" + std::to_string(i) + "]";
        const at::Tensor& p = params[i];
        check(op, ("params" + k).c_str(), p, at::kFloat, dev, std::vector<int64_t>(p.dim(), -1), "(any)");
        const std::vector<int64_t> shape = p.sizes().vec();
        check(op, ("grads" + k).c_str(), grads[i], at::kFloat, dev, shape, "(as params[i])");
        check(op, ("exp_avgs" + k).c_str(), exp_avgs[i], at::kFloat, dev, shape, "(as params[i])");
        check(op, ("exp_avg_sqs" + k).c_str(), exp_avg_sqs[i], at::kFloat, dev, shape, "(as params[i])");
        check_scalar(op, "steps" + k, steps[i], dev);
        if (lr_tensors[i].has_value()) check_scalar(op, "lr_tensors" + k, *lr_tensors[i], dev);
        const bool betas_ok = beta1s[i] >= 0 && beta1s[i] < 1 && beta2s[i] >= 0 && beta2s[i] < 1;
        if (!betas_ok || !(epss[i] >= 0) || !std::isfinite(lrs[i]))
            TORCH_CHECK_VALUE(false, prefix(op) + "group " + std::to_string(i) + ": need 0 <= beta1, beta2 < 1, eps >= 0 "
                                         "and a finite lr; got beta1 " + std::to_string(beta1s[i]) + ", beta2 " +
                                         std::to_string(beta2s[i]) + ", eps " + std::to_string(epss[i]) + ", lr " +
                                         std::to_string(lrs[i]));
        AdamGroupArgs a{};
        a.param = p.data_ptr<float>();
        a.grad = grads[i].data_ptr<float>();
        a.exp_avg = exp_avgs[i].data_ptr<float>();
        a.exp_avg_sq = exp_avg_sqs[i].data_ptr<float>();
        a.step = steps[i].data_ptr<float>();
        a.lr_ptr = lr_tensors[i].has_value() ? lr_tensors[i]->data_ptr<float>() : nullptr;
        a.lr = static_cast<float>(lrs[i]);
        a.beta1 = static_cast<float>(beta1s[i]);
        a.beta2 = static_cast<float>(beta2s[i]);
        a.eps = static_cast<float>(epss[i]);
        a.n = p.numel();
        groups.push_back(a);
    }
    if (found_inf.has_value()) check_scalar(op, "found_inf", *found_inf, dev);
    const c10::cuda::CUDAGuard guard(dev);
    launch_adam_step(groups, found_inf.has_value() ? found_inf->data_ptr<float>() : nullptr, skip_zero_grad);
}

// The MCMC budget's position noise, in place (csrc/mcmc_noise.cu; rigel_core.train.mcmc.add_position_noise).
at::Tensor mcmc_position_noise(at::Tensor& means3D, const at::Tensor& quats, const at::Tensor& log_scales,
                               const at::Tensor& opacity_logits, const at::Tensor& eta,
                               const c10::optional<at::Tensor>& lr_tensor, double lr, double noise_lr, double k,
                               double t, const c10::optional<at::Tensor>& ok, double max_scale) {
    const char* op = "mcmc_position_noise";
    const at::Device dev = cuda_device(op, "means3D", means3D);
    const int64_t n = num_gaussians(op, means3D);
    check(op, "means3D", means3D, at::kFloat, dev, {n, 3}, "(N, 3)");
    check(op, "quats", quats, at::kFloat, dev, {n, 4}, "(N, 4)");
    check(op, "log_scales", log_scales, at::kFloat, dev, {n, 3}, "(N, 3)");
    check(op, "opacity_logits", opacity_logits, at::kFloat, dev, {n}, "(N,)");
    check(op, "eta", eta, at::kFloat, dev, {n, 3}, "(N, 3)");
    if (lr_tensor.has_value()) check_scalar(op, "lr_tensor", *lr_tensor, dev);
    if (ok.has_value()) check(op, "ok", *ok, at::kBool, dev, {1}, "(1,)");
    if (!std::isfinite(lr) || !std::isfinite(noise_lr) || !std::isfinite(k) || !std::isfinite(t))
        TORCH_CHECK_VALUE(false, prefix(op) + "lr, noise_lr, k and t must be finite; got " + std::to_string(lr) + ", " +
                                     std::to_string(noise_lr) + ", " + std::to_string(k) + ", " + std::to_string(t));
    if (!(max_scale > 0))  // NaN fails too; +inf is "no bound"
        TORCH_CHECK_VALUE(false, prefix(op) + "max_scale must be > 0 (+inf: no bound); got " + std::to_string(max_scale));
    const c10::cuda::CUDAGuard guard(dev);
    at::Tensor noise = at::empty({n, 3}, means3D.options());
    launch_mcmc_noise(means3D, quats, log_scales, opacity_logits, eta,
                      lr_tensor.has_value() ? lr_tensor->data_ptr<float>() : nullptr, static_cast<float>(lr),
                      static_cast<float>(noise_lr), static_cast<float>(k), static_cast<float>(t),
                      static_cast<float>(max_scale), ok.has_value() ? ok->data_ptr<bool>() : nullptr, noise);
    return noise;
}

// A streamed frame's codes finished on the GPU (csrc/frames.cu; rigel_core.data.stream.finish_codes).
std::vector<at::Tensor> finish_codes(const at::Tensor& codes, const at::Tensor& table, bool white_bg) {
    const char* op = "finish_codes";
    const at::Device dev = cuda_device(op, "codes", codes);
    const int64_t channels = codes.dim() == 3 ? codes.size(2) : 0;
    if (channels != 3 && channels != 4)
        TORCH_CHECK_VALUE(false, prefix(op) + "codes must be (H, W, 3) or (H, W, 4); got " + describe(codes));
    check(op, "codes", codes, at::kByte, dev, {-1, -1, channels}, "(H, W, C)");
    check(op, "table", table, at::kFloat, dev, {256}, "(256,)");
    const c10::cuda::CUDAGuard guard(dev);
    at::Tensor rgb = at::empty({codes.size(0), codes.size(1), 3}, table.options());
    at::Tensor alpha = channels == 4 ? at::empty({codes.size(0), codes.size(1)}, table.options()) : at::Tensor();
    launch_finish_codes(codes, table, white_bg, rgb, alpha);
    return {rgb, alpha};
}

}  // namespace rigel
