// The one Python binding of rigel_core._C. Each function is the CUDA twin of the rigel_core.reference
// function of the same name; docstrings give shapes (float32 unless said), all tensors on one CUDA device.
#include <torch/extension.h>

#include "config.h"
#include "ops.h"
#if __has_include("appearance.h")
#include "appearance.h"  // the fused appearance MLP (its own engineer's files): binds itself through bind_appearance
#define RIGEL_HAS_APPEARANCE 1
#endif
#include "ssim.h"  // the fused SSIM loss of the trainer: binds itself through bind_ssim

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
          "gaussian_ids, tile_ranges come back empty (rigel_core.cuda_backend.bin_gaussians_cuda raises)");
    m.def("rasterize_tiles", &rigel::rasterize_tiles, py::arg("means2D"), py::arg("conics"), py::arg("colors"),
          py::arg("opacities"), py::arg("gaussian_ids"), py::arg("tile_ranges"), py::arg("width"), py::arg("height"),
          py::arg("background"), py::arg("image"), py::arg("final_T"), py::arg("n_contrib"),
          py::arg("depths") = py::none(), py::arg("depth_sum") = py::none(), py::arg("depth_median") = py::none(),
          "[3] writes image (H,W,3), final_T (H,W), n_contrib (H,W) int32 in place; background (3,) or None; "
          "with depths (N,) also depth_sum (H,W) = sum w_i z_i and depth_median (H,W) from the same pass");
    m.def("project_gaussians_backward", &rigel::project_gaussians_backward, py::arg("means3D"), py::arg("quats"),
          py::arg("scales"), py::arg("viewmat"), py::arg("K"), py::arg("width"), py::arg("height"), py::arg("radii"),
          py::arg("v_means2D"), py::arg("v_conics"), py::arg("v_depths"), py::arg("v_compensations") = py::none(),
          "[1] backward -> (v_means3D (N,3), v_quats (N,4), v_scales (N,3)); zero for culled Gaussians; "
          "v_compensations (N,) or None: when given, the mip mode's backward");
    m.def("sh_colors_backward", &rigel::sh_colors_backward, py::arg("degree"), py::arg("sh_coeffs"),
          py::arg("means3D"), py::arg("campos"), py::arg("v_colors"),
          "[0] backward -> (v_sh_coeffs (N,K,3), v_means3D (N,3))");
    m.def("rasterize_tiles_backward", &rigel::rasterize_tiles_backward, py::arg("means2D"), py::arg("conics"),
          py::arg("colors"), py::arg("opacities"), py::arg("gaussian_ids"), py::arg("tile_ranges"), py::arg("width"),
          py::arg("height"), py::arg("background"), py::arg("final_T"), py::arg("n_contrib"), py::arg("v_image"),
          py::arg("v_final_T"), py::arg("depths") = py::none(), py::arg("v_depth_sum") = py::none(),
          "[3] backward -> (v_means2D (N,2), v_conics (N,3), v_colors (N,3), v_opacities (N,), "
          "v_means2D_abs (N,2): per-pixel |d loss / d means2D| summed, for densification, "
          "v_depths (N,) when depths and v_depth_sum (H,W) are given, else None)");
#ifdef RIGEL_HAS_APPEARANCE
    bind_appearance(m);
#endif
    bind_ssim(m);
    m.attr("TILE_SIZE") = RIGEL_TILE_SIZE;
    m.attr("MAX_ENTRIES") = RIGEL_MAX_ENTRIES;
}
