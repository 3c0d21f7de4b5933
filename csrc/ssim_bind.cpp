// Host side of the fused SSIM loss: argument checks, output allocation, Python binding (kernels: ssim.cu).
// rigel_core/train/ssim_cuda.py wraps these in a torch.autograd.Function.
#include <string>
#include <tuple>
#include <vector>

#include <ATen/ATen.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/extension.h>

#include "check_text.h"
#include "ssim.h"

namespace rigel {
namespace {

// Messages are one std::string, never formatted through std::ostream (check_text.h says why).
std::string where(const char* fn, const char* name) { return std::string("rigel_core._C.") + fn + ": " + name; }

// img1 must be a contiguous float32 CUDA tensor (H, W, C) or (B, H, W, C) of a size the kernels' grid takes.
void check_image(const char* fn, const at::Tensor& t) {
    if (!t.defined()) TORCH_CHECK_TYPE(false, where(fn, "img1") + " is undefined (None)");
    if (!t.is_cuda()) TORCH_CHECK_TYPE(false, where(fn, "img1") + " must be a CUDA tensor, got device " + t.device().str());
    if (t.scalar_type() != at::kFloat)
        TORCH_CHECK_TYPE(false, where(fn, "img1") + " must be float32, got " + dtype_name(t.scalar_type()));
    if (t.dim() != 3 && t.dim() != 4)
        TORCH_CHECK_VALUE(false, where(fn, "img1") + " must be (H, W, C) or (B, H, W, C) channels-last, got shape " +
                                     shape_text_of(t.sizes()));
    if (!t.is_contiguous()) TORCH_CHECK_VALUE(false, where(fn, "img1") + " must be contiguous");
    const int64_t H = t.size(-3), C = t.size(-1), B = t.dim() == 4 ? t.size(0) : 1;
    const int64_t max_h = int64_t(65535) * kSsimTile;
    if (!(B * C <= 65535 && H <= max_h && t.size(-2) < (int64_t(1) << 31) - kSsimTile))
        TORCH_CHECK_VALUE(false, where(fn, "img1") + " of shape " + shape_text_of(t.sizes()) +
                                     " is too large for the kernels' grid (need B*C <= 65535, H <= " +
                                     std::to_string(max_h) + ")");
}

// t must be a contiguous `dtype` tensor of `shape` on `ref`'s device.
void check_like(const char* fn, const char* name, const at::Tensor& t, const at::Tensor& ref, at::ScalarType dtype,
                at::IntArrayRef shape) {
    if (!t.defined()) TORCH_CHECK_TYPE(false, where(fn, name) + " is undefined (None)");
    if (t.device() != ref.device())
        TORCH_CHECK_TYPE(false, where(fn, name) + " is on " + t.device().str() + " but img1 on " + ref.device().str() +
                                    "; all arguments must be on one device");
    if (t.scalar_type() != dtype)
        TORCH_CHECK_TYPE(false, where(fn, name) + " must be " + dtype_name(dtype) + ", got " +
                                    dtype_name(t.scalar_type()));
    if (t.sizes() != shape)
        TORCH_CHECK_VALUE(false, where(fn, name) + " must have shape " + shape_text_of(shape) + " (as img1), got " +
                                     shape_text_of(t.sizes()));
    if (!t.is_contiguous()) TORCH_CHECK_VALUE(false, where(fn, name) + " must be contiguous");
}

std::vector<int64_t> coef_shape(const at::Tensor& img) {
    std::vector<int64_t> s{3};
    for (int64_t d : img.sizes()) s.push_back(d);
    return s;
}

// -> (map [B,H,W,C] float32, coef [3,B,H,W,C] float64)
std::tuple<at::Tensor, at::Tensor> ssim_fwd(const at::Tensor& img1, const at::Tensor& img2) {
    check_image("ssim_fwd", img1);
    check_like("ssim_fwd", "img2", img2, img1, at::kFloat, img1.sizes());
    const c10::cuda::CUDAGuard guard(img1.device());
    at::Tensor map = at::empty_like(img1);
    at::Tensor coef = at::empty(coef_shape(img1), img1.options().dtype(at::kDouble));
    launch_ssim_fwd(img1, img2, map, coef);
    return {map, coef};
}

// -> dL_dimg1 [B,H,W,C] float32
at::Tensor ssim_bwd(const at::Tensor& dL_dmap, const at::Tensor& img1, const at::Tensor& img2,
                    const at::Tensor& coef) {
    check_image("ssim_bwd", img1);
    check_like("ssim_bwd", "img2", img2, img1, at::kFloat, img1.sizes());
    check_like("ssim_bwd", "dL_dmap", dL_dmap, img1, at::kFloat, img1.sizes());
    check_like("ssim_bwd", "coef", coef, img1, at::kDouble, coef_shape(img1));
    const c10::cuda::CUDAGuard guard(img1.device());
    at::Tensor dL_dimg1 = at::empty_like(img1);
    launch_ssim_bwd(dL_dmap, img1, img2, coef, dL_dimg1);
    return dL_dimg1;
}

}  // namespace
}  // namespace rigel

void bind_ssim(pybind11::module_& m) {
    namespace py = pybind11;
    m.def("ssim_fwd", &rigel::ssim_fwd,
          "Fused SSIM forward (11x11 Gaussian window, sigma 1.5, zero 'same' padding): img1, img2 (H,W,C) or "
          "(B,H,W,C) float32 contiguous channels-last -> (map like img1 float32, coef (3, *img1.shape) float64 = "
          "the backward coefficients A, dS/dsigma1^2, dS/dsigma12); see rigel_core/train/ssim_cuda.py",
          py::arg("img1"), py::arg("img2"));
    m.def("ssim_bwd", &rigel::ssim_bwd,
          "Fused SSIM backward: dL_dmap, img1, img2 (like img1, float32), coef (the forward's) -> dL_dimg1",
          py::arg("dL_dmap"), py::arg("img1"), py::arg("img2"), py::arg("coef"));
}
