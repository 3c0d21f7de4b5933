// The one Python binding of rigel_core._C. Each function is the CUDA twin of a PyTorch reference function
// (rigel_core.reference for the render stages, named in ops.h for the others); its host checks are in ops.cpp and its
// autograd Function in rigel_core/renderer/cuda_backend.py. Docstrings give shapes (float32 unless said), all
// tensors on one CUDA device.
#include <torch/extension.h>
#include <limits>

#include "config.h"
#include "ops.h"

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
    m.doc() = "rigel CUDA kernels: projection, SH colours, tile binning, rasterization (docs/PIPELINE.md)";
    // c10 errors of this module become TypeError / ValueError / RuntimeError carrying the message alone (pybind11's
    // default translation would append the C++ backtrace). On the H200 image every raised check first crashed while
    // its message was formatted (cuda-gdb: SIGSEGV in basic_ostream::_M_insert<long> inside this .so, built by
    // /opt/gcc's g++): ops.cpp now builds messages without std::ostream.
    py::register_local_exception_translator([](std::exception_ptr p) {
        try {
            if (p) std::rethrow_exception(p);
        } catch (const c10::TypeError& e) {
            PyErr_SetString(PyExc_TypeError, e.what_without_backtrace());
        } catch (const c10::ValueError& e) {
            PyErr_SetString(PyExc_ValueError, e.what_without_backtrace());
        } catch (const c10::IndexError& e) {
            PyErr_SetString(PyExc_IndexError, e.what_without_backtrace());
        } catch (const c10::Error& e) {
            PyErr_SetString(PyExc_RuntimeError, e.what_without_backtrace());
        }
    });
    m.def("project_gaussians", &rigel::project_gaussians, py::arg("means3D"), py::arg("quats"), py::arg("scales"),
          py::arg("opacities"), py::arg("viewmat"), py::arg("K"), py::arg("width"), py::arg("height"),
          py::arg("near_plane") = RIGEL_NEAR_PLANE, py::arg("far_plane") = RIGEL_FAR_PLANE,
          py::arg("colors") = py::none(), py::arg("compensations") = py::none(),
          "[1] means3D (N,3), quats (N,4) wxyz, scales (N,3), opacities (N,), viewmat (4,4), K (3,3), colors (N,C) "
          "or None (checked for finiteness only) -> (means2D (N,2), conics (N,3), depths (N,), radii (N,) int32; "
          "culled (any non-finite parameter, degenerate, off-screen): radius 0, zeros); compensations (N,) or None: "
          "when given, the mip mode (MIP_FILTER_2D instead of LOWPASS) and its opacity compensation written there");
    m.def("sh_colors", &rigel::sh_colors, py::arg("degree"), py::arg("sh_coeffs"), py::arg("means3D"),
          py::arg("campos"), "[0] degree 0..3, sh_coeffs (N,K,3), means3D (N,3), campos (3,) -> colors (N,3)");
    m.def("bin_gaussians", &rigel::bin_gaussians, py::arg("means2D"), py::arg("conics"), py::arg("opacities"),
          py::arg("depths"), py::arg("radii"), py::arg("width"), py::arg("height"),
          py::arg("max_entries") = RIGEL_MAX_ENTRIES,
          "[2] -> (keys (E,) int64 sorted, gaussian_ids (E,) int32, tile_ranges (n_tiles,2) int32, "
          "tiles_touched (N,) int32, E); when E > max_entries nothing of size E is allocated and keys, "
          "gaussian_ids, tile_ranges come back empty (rigel_core.renderer.cuda_backend.bin_gaussians_cuda raises)");
    m.def("bin_gaussians_fixed", &rigel::bin_gaussians_fixed, py::arg("means2D"), py::arg("conics"),
          py::arg("opacities"), py::arg("depths"), py::arg("radii"), py::arg("width"), py::arg("height"),
          py::arg("capacity"),
          "[2] with a fixed capacity and no device->host read -> (keys (capacity,) int64 sorted, gaussian_ids "
          "(capacity,) int32, tile_ranges (n_tiles,2) int32, tiles_touched (N,) int32, total (1,) int64 on the "
          "device); entries past the capacity are dropped (total > capacity: the frame is incomplete), the unused "
          "rest is padding past every tile range");
    m.def("rasterize_tiles", &rigel::rasterize_tiles, py::arg("means2D"), py::arg("conics"), py::arg("colors"),
          py::arg("opacities"), py::arg("gaussian_ids"), py::arg("tile_ranges"), py::arg("width"), py::arg("height"),
          py::arg("background"), py::arg("image"), py::arg("final_T"), py::arg("n_contrib"),
          py::arg("depths") = py::none(), py::arg("depth_expected") = py::none(), py::arg("depth_median") = py::none(),
          "[3] writes image (H,W,3), final_T (H,W), n_contrib (H,W) int32 in place; background (3,) or None; "
          "with depths (N,) also depth_expected (H,W) = sum w_i z_i / (1 - final_T) (0 where nothing was blended) and depth_median (H,W) from the same pass");
    m.def("project_gaussians_backward", &rigel::project_gaussians_backward, py::arg("means3D"), py::arg("quats"),
          py::arg("scales"), py::arg("viewmat"), py::arg("K"), py::arg("width"), py::arg("height"), py::arg("radii"),
          py::arg("v_means2D"), py::arg("v_conics"), py::arg("v_depths"), py::arg("v_compensations") = py::none(),
          py::arg("v_viewmat_parts") = py::none(),
          "[1] backward -> (v_means3D (N,3), v_quats (N,4), v_scales (N,3)); zero for culled Gaussians; "
          "v_compensations (N,) or None: when given, the mip mode's backward; v_viewmat_parts (N,3,4) or None: "
          "when given, written with each Gaussian's share [v_R | v_t] of the view-matrix gradient (sum them)");
    m.def("sh_colors_backward", &rigel::sh_colors_backward, py::arg("degree"), py::arg("sh_coeffs"),
          py::arg("means3D"), py::arg("campos"), py::arg("v_colors"),
          "[0] backward -> (v_sh_coeffs (N,K,3), v_means3D (N,3))");
    m.def("sh_colors_split", &rigel::sh_colors_split, py::arg("degree"), py::arg("sh_dc"), py::arg("sh_rest"),
          py::arg("means3D"), py::arg("campos"),
          "[0] on the model's two SH tensors without concatenating them: sh_dc (N,1,3), sh_rest (N,K-1,3) -> colors "
          "(N,3), bitwise sh_colors(degree, cat([sh_dc, sh_rest], 1), means3D, campos)");
    m.def("sh_colors_split_backward", &rigel::sh_colors_split_backward, py::arg("degree"), py::arg("sh_dc"),
          py::arg("sh_rest"), py::arg("means3D"), py::arg("campos"), py::arg("v_colors"),
          "[0] split backward -> (v_sh_dc (N,1,3), v_sh_rest (N,K-1,3), v_means3D (N,3)), bitwise the parts of "
          "sh_colors_backward's v_sh_coeffs");
    m.def("rasterize_tiles_backward", &rigel::rasterize_tiles_backward, py::arg("means2D"), py::arg("conics"),
          py::arg("colors"), py::arg("opacities"), py::arg("gaussian_ids"), py::arg("tile_ranges"), py::arg("width"),
          py::arg("height"), py::arg("background"), py::arg("final_T"), py::arg("n_contrib"), py::arg("v_image"),
          py::arg("v_final_T"), py::arg("depths") = py::none(), py::arg("v_depth_sum") = py::none(),
          "[3] backward -> (v_means2D (N,2), v_conics (N,3), v_colors (N,3), v_opacities (N,), "
          "v_means2D_abs (N,2): per-pixel |d loss / d means2D| summed, for densification, "
          "v_depths (N,) when depths and v_depth_sum (H,W) are given, else None)");
    m.def("mlp_colors", &rigel::mlp_colors, py::arg("latents"), py::arg("means3D"), py::arg("campos"), py::arg("W1"),
          py::arg("b1"), py::arg("W2"), py::arg("b2"),
          "appearance: latents (N,L), means3D (N,3), campos (3,), W1 (H,L+3), b1 (H,), W2 (3,H), b2 (3,) -> colors "
          "(N,3) = sigmoid(W2 relu(W1 [latent, dir] + b1) + b2); NaN for a non-finite latent or mean "
          "(rigel_core/renderer/appearance.py)");
    m.def("mlp_colors_backward", &rigel::mlp_colors_backward, py::arg("latents"), py::arg("means3D"),
          py::arg("campos"), py::arg("W1"), py::arg("b1"), py::arg("W2"), py::arg("b2"), py::arg("colors"),
          py::arg("v_colors"), py::arg("need_means"),
          "appearance backward -> (v_latents (N,L), v_means3D (N,3) or None when not need_means, v_W1, v_b1, v_W2, "
          "v_b2)");
    m.def("ssim_map", &rigel::ssim_map, py::arg("img1"), py::arg("img2"),
          "SSIM (11x11 Gaussian window, sigma 1.5, zero 'same' padding): img1, img2 (H,W,C) or (B,H,W,C) "
          "channels-last -> (map like img1, coef (3, *img1.shape) float64 = the backward's coefficients A, "
          "dS/dsigma1^2, dS/dsigma12; rigel_core/train/losses.py)");
    m.def("ssim_map_backward", &rigel::ssim_map_backward, py::arg("img1"), py::arg("img2"), py::arg("coef"),
          py::arg("v_map"), "SSIM backward: v_map like img1 -> v_img1 like img1 (the gradient to img1 only)");
    m.def("photometric_sums", &rigel::photometric_sums, py::arg("pred"), py::arg("target"), py::arg("mask"),
          py::arg("fp32") = false,
          "the trainer's loss terms in one pass: pred, target as ssim_map's, mask (H,W) / (B,H,W) bool or None -> "
          "(totals (4,) float64 = sums over counting elements of |pred - target|, SSIM, (pred - target)^2, 1; coef); "
          "fp32: the float32 locally centred kernels (coef (5, *pred.shape) float32)");
    m.def("photometric_sums_backward", &rigel::photometric_sums_backward, py::arg("pred"), py::arg("target"),
          py::arg("mask"), py::arg("coef"), py::arg("v_totals"),
          "its backward: v_totals (4,) float64 -> v_pred like pred");
    m.def("adam_step", &rigel::adam_step, py::arg("params"), py::arg("grads"), py::arg("exp_avgs"),
          py::arg("exp_avg_sqs"), py::arg("steps"), py::arg("lrs"), py::arg("lr_tensors"), py::arg("beta1s"),
          py::arg("beta2s"), py::arg("epss"), py::arg("found_inf") = py::none(), py::arg("skip_zero_grad") = false,
          "One Adam step over <= 16 float32 CUDA parameter groups in one launch, in place (csrc/adam.cu): lists with "
          "one entry per group; lr_tensors[i] (a one-element device tensor, or None for lrs[i]) is read at run "
          "time; found_inf non-zero skips everything; skip_zero_grad leaves elements with a zero gradient as they "
          "are (rigel_core.train.optim.Adam)");
    m.def("mcmc_position_noise", &rigel::mcmc_position_noise, py::arg("means3D"), py::arg("quats"),
          py::arg("log_scales"), py::arg("opacity_logits"), py::arg("eta"), py::arg("lr_tensor"), py::arg("lr"),
          py::arg("noise_lr"), py::arg("k"), py::arg("t"), py::arg("ok") = py::none(),
          py::arg("max_scale") = std::numeric_limits<double>::infinity(),
          "The MCMC budget's position noise, in place (csrc/mcmc_noise.cu): means3D += noise_lr lr sigmoid(-k (o - t)) "
          "R diag(s^2) R^T eta, s = min(exp(log_scales), max_scale); returns the noise (N, 3) "
          "(rigel_core.train.mcmc.add_position_noise)");
    m.def("finish_codes", &rigel::finish_codes, py::arg("codes"), py::arg("table"), py::arg("white_bg"),
          "A streamed frame's 8-bit codes finished on the GPU in one launch (csrc/frames.cu): codes (H,W,3|4) uint8, "
          "table (256,) float32 -> [rgb (H,W,3) float32, alpha (H,W) float32 or undefined] "
          "(rigel_core.data.stream.finish_codes)");
    m.attr("TILE_SIZE") = RIGEL_TILE_SIZE;
    m.attr("MAX_ENTRIES") = RIGEL_MAX_ENTRIES;
}
