// [1] Projection, forward: one thread per Gaussian (docs/PIPELINE.md [1]). Maths in project_common.cuh.
#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>

#include "launch.h"
#include "project_common.cuh"

namespace rigel {
namespace {

__global__ void __launch_bounds__(kBlock1D) project_fwd_kernel(
    int64_t n,
    const float* __restrict__ means3D,    // [N, 3]
    const float* __restrict__ quats,      // [N, 4] (w, x, y, z), any norm
    const float* __restrict__ scales,     // [N, 3]
    const float* __restrict__ opacities,  // [N]
    const float* __restrict__ colors,     // [N, C] or nullptr: only checked for finiteness
    int colors_per_gaussian,              // C
    const float* __restrict__ viewmat,    // [4, 4] row-major world-to-camera
    const float* __restrict__ K,          // [3, 3]
    int width, int height, double near_plane, double far_plane,
    float* __restrict__ means2D,  // [N, 2] out
    float* __restrict__ conics,   // [N, 3] out
    float* __restrict__ depths,   // [N] out
    int32_t* __restrict__ radii,  // [N] out, 0 = culled
    float* __restrict__ compensations)  // [N] out or nullptr: the mip mode (2D Mip filter + opacity compensation)
{
    const bool mip = compensations != nullptr;
    const int64_t g = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
    if (g >= n) return;

    // Every culled Gaussian leaves through here with all outputs written (radius 0, zeros elsewhere).
    auto cull = [&]() {
        means2D[2 * g + 0] = 0.f;
        means2D[2 * g + 1] = 0.f;
        conics[3 * g + 0] = 0.f;
        conics[3 * g + 1] = 0.f;
        conics[3 * g + 2] = 0.f;
        depths[g] = 0.f;
        radii[g] = 0;
        if (mip) compensations[g] = 0.f;
    };

    const float mf[3] = {means3D[3 * g + 0], means3D[3 * g + 1], means3D[3 * g + 2]};
    const float4 qf = make_float4(quats[4 * g + 0], quats[4 * g + 1], quats[4 * g + 2], quats[4 * g + 3]);
    const float sf[3] = {scales[3 * g + 0], scales[3 * g + 1], scales[3 * g + 2]};
    const float of = opacities[g];
    const bool finite = isfinite(mf[0]) && isfinite(mf[1]) && isfinite(mf[2]) && isfinite(qf.x) && isfinite(qf.y) &&
                        isfinite(qf.z) && isfinite(qf.w) && isfinite(sf[0]) && isfinite(sf[1]) && isfinite(sf[2]) &&
                        isfinite(of);
    if (!finite) return cull();
    // The cull rule covers the colour too (docs/PIPELINE.md "Non-finite parameters"): the colour stages mark a
    // Gaussian with a non-finite SH coefficient or latent by a NaN colour, and a colour that overflowed is Inf.
    // Drawn, either would turn its tiles NaN (0 * Inf in the blend).
    if (colors != nullptr) {
        bool colors_finite = true;  // bitwise &: the loads do not wait on each other (sh_row_finite)
        for (int ch = 0; ch < colors_per_gaussian; ++ch)
            colors_finite &= isfinite(colors[static_cast<int64_t>(colors_per_gaussian) * g + ch]);
        if (!colors_finite) return cull();
    }
    const double qw = qf.x, qx = qf.y, qy = qf.z, qz = qf.w;
    const double qn2 = qw * qw + qx * qx + qy * qy + qz * qz;
    if (!(qn2 >= 1e-24)) return cull();  // degenerate quaternion

    const CameraD cam = load_camera(viewmat, K, width, height);
    const double m[3] = {mf[0], mf[1], mf[2]};
    double p[3];
    world_to_camera(cam, m, p);
    const double x = p[0], y = p[1], z = p[2];
    if (!(z > near_plane && z < far_plane)) return cull();

    const double inv_qn = 1.0 / sqrt(qn2);
    const double s[3] = {sf[0], sf[1], sf[2]};
    double Rq[3][3], Sc[3][3];
    Jacobian J;
    double a, b, c;
    const double det =
        screen_covariance(cam, qw * inv_qn, qx * inv_qn, qy * inv_qn, qz * inv_qn, s, x, y, z, Rq, Sc, J, a, b, c,
                          mip ? kMipFilter2D : kLowpass);
    if (!(isfinite(det) && det > 0.0)) return cull();  // degenerate

    const double u = cam.fx * x / z + cam.cx;
    const double v = cam.fy * y / z + cam.cy;
    const double mid = 0.5 * (a + c), half = 0.5 * (a - c);
    const double lam = mid + sqrt(fmax(half * half + b * b, 0.0));
    const double radius = ceil(kRadiusSigma * sqrt(fmax(lam, 0.0)));
    if (!(isfinite(radius) && isfinite(u) && isfinite(v))) return cull();
    const double r = fmin(radius, 1073741824.0);  // 2^30: any larger radius covers every tile anyway
    const int tiles_x = (width + kTileSize - 1) / kTileSize, tiles_y = (height + kTileSize - 1) / kTileSize;
    if (tile_rect<double>(u, v, r, tiles_x, tiles_y).empty()) return cull();  // off-screen

    means2D[2 * g + 0] = static_cast<float>(u);
    means2D[2 * g + 1] = static_cast<float>(v);
    conics[3 * g + 0] = static_cast<float>(c / det);
    conics[3 * g + 1] = static_cast<float>(-b / det);
    conics[3 * g + 2] = static_cast<float>(a / det);
    depths[g] = static_cast<float>(z);
    radii[g] = static_cast<int32_t>(r);
    if (mip) {
        double det0;
        compensations[g] = static_cast<float>(mip_compensation(a, b, c, det, det0));
    }
}

}  // namespace

void launch_project_fwd(const at::Tensor& means3D, const at::Tensor& quats, const at::Tensor& scales,
                        const at::Tensor& opacities, const at::Tensor* colors, const at::Tensor& viewmat,
                        const at::Tensor& K, int width,
                        int height, double near_plane, double far_plane, at::Tensor& means2D, at::Tensor& conics,
                        at::Tensor& depths, at::Tensor& radii, at::Tensor* compensations) {
    const int64_t n = means3D.size(0);
    if (n == 0) return;
    project_fwd_kernel<<<num_blocks(n, kBlock1D), kBlock1D, 0, at::cuda::getCurrentCUDAStream()>>>(
        n, means3D.data_ptr<float>(), quats.data_ptr<float>(), scales.data_ptr<float>(), opacities.data_ptr<float>(),
        colors != nullptr ? colors->data_ptr<float>() : nullptr,
        colors != nullptr ? static_cast<int>(colors->size(1)) : 0,
        viewmat.data_ptr<float>(), K.data_ptr<float>(), width, height, near_plane, far_plane,
        means2D.data_ptr<float>(), conics.data_ptr<float>(), depths.data_ptr<float>(), radii.data_ptr<int32_t>(),
        compensations != nullptr ? compensations->data_ptr<float>() : nullptr);
    RIGEL_CHECK_LAUNCH("project_fwd_kernel");
}

}  // namespace rigel
