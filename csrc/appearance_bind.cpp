// Host side of the fused appearance MLP: argument checks, output allocation, Python binding.
// The kernels are in appearance.cu; rigel_core/appearance.py wraps these in a torch.autograd.Function.
#include <string>
#include <tuple>

#include <ATen/ATen.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/extension.h>

#include "appearance.h"
#include "check_text.h"

namespace rigel {
namespace {

// Messages are one std::string, never formatted through std::ostream (check_text.h says why).
std::string where(const char* fn, const char* name) { return std::string("rigel.") + fn + ": " + name; }

// Device, dtype, contiguity and shape of one argument; errors name the function and the argument.
// Device and dtype problems raise TypeError in Python, shapes and sizes ValueError.
void check_arg(const char* fn, const at::Tensor& t, const char* name, at::IntArrayRef shape,
               const at::Device& device) {
    if (!t.defined()) TORCH_CHECK_TYPE(false, where(fn, name) + " is undefined (None)");
    if (!t.is_cuda()) TORCH_CHECK_TYPE(false, where(fn, name) + " must be a CUDA tensor, got device " + t.device().str());
    if (t.device() != device)
        TORCH_CHECK_TYPE(false, where(fn, name) + " is on " + t.device().str() + " but latents on " + device.str() +
                                    "; all arguments must be on one device");
    if (t.scalar_type() != at::kFloat)
        TORCH_CHECK_TYPE(false, where(fn, name) + " must be float32, got " + dtype_name(t.scalar_type()));
    if (t.sizes() != shape)
        TORCH_CHECK_VALUE(false, where(fn, name) + " must have shape " + shape_text_of(shape) + ", got " +
                                     shape_text_of(t.sizes()));
    if (!t.is_contiguous()) TORCH_CHECK_VALUE(false, where(fn, name) + " must be contiguous");
}

struct Dims {
    int64_t n, L, H;
};

// latents [N, L] (1 <= L <= 32), means3D [N, 3], campos [3], W1 [H, L+3] (1 <= H <= 64), b1 [H], W2 [3, H], b2 [3].
Dims check_inputs(const char* fn, const at::Tensor& latents, const at::Tensor& means3D, const at::Tensor& campos,
                  const at::Tensor& W1, const at::Tensor& b1, const at::Tensor& W2, const at::Tensor& b2) {
    if (!(latents.defined() && W1.defined())) TORCH_CHECK_TYPE(false, where(fn, "latents and W1") + " must be tensors");
    if (latents.dim() != 2)
        TORCH_CHECK_VALUE(false, where(fn, "latents") + " must be [N, L], got shape " + shape_text_of(latents.sizes()));
    if (W1.dim() != 2) TORCH_CHECK_VALUE(false, where(fn, "W1") + " must be [H, L+3], got shape " + shape_text_of(W1.sizes()));
    const Dims d{latents.size(0), latents.size(1), W1.size(0)};
    if (!(d.L >= 1 && d.L <= kAppearanceMaxLatent))
        TORCH_CHECK_VALUE(false, where(fn, "latents") + ": latent dimension L=" + std::to_string(d.L) + " outside 1.." +
                                     std::to_string(kAppearanceMaxLatent));
    if (!(d.H >= 1 && d.H <= kAppearanceMaxHidden))
        TORCH_CHECK_VALUE(false, where(fn, "W1") + ": hidden width H=" + std::to_string(d.H) + " outside 1.." +
                                     std::to_string(kAppearanceMaxHidden));
    const at::Device device = latents.device();
    check_arg(fn, latents, "latents", {d.n, d.L}, device);
    check_arg(fn, means3D, "means3D", {d.n, 3}, device);
    check_arg(fn, campos, "campos", {3}, device);
    check_arg(fn, W1, "W1", {d.H, d.L + 3}, device);
    check_arg(fn, b1, "b1", {d.H}, device);
    check_arg(fn, W2, "W2", {3, d.H}, device);
    check_arg(fn, b2, "b2", {3}, device);
    return d;
}

at::Tensor appearance_fwd(const at::Tensor& latents, const at::Tensor& means3D, const at::Tensor& campos,
                          const at::Tensor& W1, const at::Tensor& b1, const at::Tensor& W2, const at::Tensor& b2) {
    const Dims d = check_inputs("appearance_fwd", latents, means3D, campos, W1, b1, W2, b2);
    const c10::cuda::CUDAGuard guard(latents.device());
    at::Tensor colors = at::empty({d.n, 3}, latents.options());
    launch_appearance_fwd(latents, means3D, campos, W1, b1, W2, b2, colors);
    return colors;
}

// Returns (v_latents [N, L], v_means3D [N, 3] or None when !need_means, v_W1, v_b1, v_W2, v_b2).
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> appearance_bwd(
    const at::Tensor& latents, const at::Tensor& means3D, const at::Tensor& campos, const at::Tensor& W1,
    const at::Tensor& b1, const at::Tensor& W2, const at::Tensor& b2, const at::Tensor& colors,
    const at::Tensor& v_colors, bool need_means) {
    const Dims d = check_inputs("appearance_bwd", latents, means3D, campos, W1, b1, W2, b2);
    check_arg("appearance_bwd", colors, "colors", {d.n, 3}, latents.device());
    check_arg("appearance_bwd", v_colors, "v_colors", {d.n, 3}, latents.device());
    const c10::cuda::CUDAGuard guard(latents.device());
    const auto opts = latents.options();
    at::Tensor v_latents = at::empty({d.n, d.L}, opts);
    at::Tensor v_means3D = need_means ? at::empty({d.n, 3}, opts) : at::Tensor();
    at::Tensor v_W1 = at::zeros({d.H, d.L + 3}, opts);
    at::Tensor v_b1 = at::zeros({d.H}, opts);
    at::Tensor v_W2 = at::zeros({3, d.H}, opts);
    at::Tensor v_b2 = at::zeros({3}, opts);
    launch_appearance_bwd(latents, means3D, campos, W1, b1, W2, b2, colors, v_colors, v_latents, v_means3D, v_W1,
                          v_b1, v_W2, v_b2);
    return {v_latents, v_means3D, v_W1, v_b1, v_W2, v_b2};
}

}  // namespace
}  // namespace rigel

void bind_appearance(pybind11::module_& m) {
    namespace py = pybind11;
    m.def("appearance_fwd", &rigel::appearance_fwd,
          "Fused appearance MLP forward: colors [N,3] = sigmoid(W2 relu(W1 [latent, dir] + b1) + b2) "
          "(float32 CUDA tensors; see rigel_core/appearance.py)",
          py::arg("latents"), py::arg("means3D"), py::arg("campos"), py::arg("W1"), py::arg("b1"), py::arg("W2"),
          py::arg("b2"));
    m.def("appearance_bwd", &rigel::appearance_bwd,
          "Fused appearance MLP backward: (v_latents, v_means3D or None, v_W1, v_b1, v_W2, v_b2)",
          py::arg("latents"), py::arg("means3D"), py::arg("campos"), py::arg("W1"), py::arg("b1"), py::arg("W2"),
          py::arg("b2"), py::arg("colors"), py::arg("v_colors"), py::arg("need_means"));
}
