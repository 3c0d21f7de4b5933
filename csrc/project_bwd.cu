// [1] Projection, backward: one thread per Gaussian, in double like the forward (project_common.cuh).
// Chain (forward order): p = R m + t; (u, v) = (fx x/z + cx, fy y/z + cy); depth = z;
// Sigma = M M^T, M = Rq(q/|q|) diag(s); Sc = R Sigma R^T; J(p) with the tangent clamp;
// (a, b, c) = J Sc J^T + filt I; conic = (c, -b, a) / (ac - b^2); in the mip mode (filt = MIP_FILTER_2D) also
// comp = sqrt(det0 / det), det0 = (a - filt)(c - filt) - b^2 (project_common.cuh, mip_compensation).
// Culled Gaussians (radius 0) get zero gradients, as the reference's zeroed outputs give.
// Optionally (v_viewmat_parts != nullptr: a pose being optimised) each Gaussian's share of the view-matrix gradient,
// [v_R | v_t] (3x4): p = R m + t gives v_R += v_p m^T, v_t += v_p; Sc = R Sigma R^T gives v_R += 2 v_Sc R Sigma =
// 2 v_Sc Sc R (v_Sc symmetric); the caller sums the rows (docs/PIPELINE.md "Pose gradients").
#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>

#include "launch.h"
#include "project_common.cuh"

namespace rigel {
namespace {

__global__ void __launch_bounds__(kBlock1D) project_bwd_kernel(
    int64_t n,
    const float* __restrict__ means3D,    // [N, 3]
    const float* __restrict__ quats,      // [N, 4]
    const float* __restrict__ scales,     // [N, 3]
    const float* __restrict__ viewmat,    // [4, 4]
    const float* __restrict__ K,          // [3, 3]
    int width, int height,
    const int32_t* __restrict__ radii,    // [N]
    const float* __restrict__ v_means2D,  // [N, 2]
    const float* __restrict__ v_conics,   // [N, 3]
    const float* __restrict__ v_depths,   // [N]
    float* __restrict__ v_means3D,        // [N, 3] out
    float* __restrict__ v_quats,          // [N, 4] out
    float* __restrict__ v_scales,         // [N, 3] out
    const float* __restrict__ v_compensations,  // [N] or nullptr: the mip mode
    float* __restrict__ v_viewmat_parts)        // [N, 3, 4] out, or nullptr: no view-matrix gradient
{
    const bool mip = v_compensations != nullptr;
    const int64_t g = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
    if (g >= n) return;
    if (radii[g] <= 0) {
        for (int i = 0; i < 3; ++i) v_means3D[3 * g + i] = 0.f;
        for (int i = 0; i < 4; ++i) v_quats[4 * g + i] = 0.f;
        for (int i = 0; i < 3; ++i) v_scales[3 * g + i] = 0.f;
        if (v_viewmat_parts != nullptr)
            for (int i = 0; i < 12; ++i) v_viewmat_parts[12 * g + i] = 0.f;
        return;
    }
    const CameraD cam = load_camera(viewmat, K, width, height);
    const double m[3] = {means3D[3 * g + 0], means3D[3 * g + 1], means3D[3 * g + 2]};
    const double q_raw[4] = {quats[4 * g + 0], quats[4 * g + 1], quats[4 * g + 2], quats[4 * g + 3]};
    const double s[3] = {scales[3 * g + 0], scales[3 * g + 1], scales[3 * g + 2]};

    // ---- recompute the forward ----
    double p[3];
    world_to_camera(cam, m, p);
    const double x = p[0], y = p[1], z = p[2];
    const double qn = sqrt(q_raw[0] * q_raw[0] + q_raw[1] * q_raw[1] + q_raw[2] * q_raw[2] + q_raw[3] * q_raw[3]);
    const double qw = q_raw[0] / qn, qx = q_raw[1] / qn, qy = q_raw[2] / qn, qz = q_raw[3] / qn;
    double Rq[3][3], Sc[3][3];
    Jacobian J;
    double a, b, c;
    const double det =
        screen_covariance(cam, qw, qx, qy, qz, s, x, y, z, Rq, Sc, J, a, b, c, mip ? kMipFilter2D : kLowpass);
    const double inv_det2 = 1.0 / (det * det);

    // ---- conic (A, B, C) = (c, -b, a) / det  ->  (a, b, c) ----
    const double vA = v_conics[3 * g + 0], vB = v_conics[3 * g + 1], vC = v_conics[3 * g + 2];
    double va = (-c * c * vA + b * c * vB - b * b * vC) * inv_det2;
    double vb = (2.0 * b * c * vA - (a * c + b * b) * vB + 2.0 * a * b * vC) * inv_det2;
    double vc = (-b * b * vA + a * b * vB - a * a * vC) * inv_det2;
    // ---- mip: comp = sqrt(det0 / det)  ->  d comp = comp/2 (d det0 / det0 - d det / det)  (0 where comp = 0) ----
    if (mip) {
        double det0;
        const double comp = mip_compensation(a, b, c, det, det0);
        if (comp > 0.0) {
            const double h = 0.5 * comp * static_cast<double>(v_compensations[g]);
            const double i0 = 1.0 / det0, i1 = 1.0 / det;
            va += h * ((c - kMipFilter2D) * i0 - c * i1);
            vb += h * 2.0 * b * (i1 - i0);
            vc += h * ((a - kMipFilter2D) * i0 - a * i1);
        }
    }
    // symmetric gradient of the 2x2 covariance: b sits in both off-diagonal entries
    const double G00 = va, G01 = 0.5 * vb, G11 = vc;

    // ---- Sigma2 = J Sc J^T  ->  v_Sc = J^T G J,  v_J = 2 G J Sc ----
    // J as a 2x3 matrix
    const double Jm[2][3] = {{J.j00, 0.0, J.j02}, {0.0, J.j11, J.j12}};
    double GJ[2][3];  // G J
#pragma unroll
    for (int k = 0; k < 3; ++k) {
        GJ[0][k] = G00 * Jm[0][k] + G01 * Jm[1][k];
        GJ[1][k] = G01 * Jm[0][k] + G11 * Jm[1][k];
    }
    double vSc[3][3];
#pragma unroll
    for (int i = 0; i < 3; ++i)
#pragma unroll
        for (int j = 0; j < 3; ++j) vSc[i][j] = Jm[0][i] * GJ[0][j] + Jm[1][i] * GJ[1][j];
    double vJ[2][3];
#pragma unroll
    for (int r = 0; r < 2; ++r)
#pragma unroll
        for (int k = 0; k < 3; ++k)
            vJ[r][k] = 2.0 * (GJ[r][0] * Sc[0][k] + GJ[r][1] * Sc[1][k] + GJ[r][2] * Sc[2][k]);

    // ---- J(p) (tangent clamp: tx is constant in x where clamped)  and  (u, v, depth)(p) ----
    const double iz = 1.0 / z, iz2 = iz * iz;
    const double vu = v_means2D[2 * g + 0], vv = v_means2D[2 * g + 1];
    double vx = vu * cam.fx * iz;
    double vy = vv * cam.fy * iz;
    double vz = -vu * cam.fx * x * iz2 - vv * cam.fy * y * iz2 + static_cast<double>(v_depths[g]);
    // J00 = fx/z, J11 = fy/z
    vz += -vJ[0][0] * cam.fx * iz2 - vJ[1][1] * cam.fy * iz2;
    // J02 = -fx tx / z, tx = x/z unless clamped
    vz += vJ[0][2] * cam.fx * J.tx * iz2;
    vz += vJ[1][2] * cam.fy * J.ty * iz2;
    if (!J.clamped_x) {
        vx += -vJ[0][2] * cam.fx * iz2;
        vz += vJ[0][2] * cam.fx * x * iz2 * iz;
    }
    if (!J.clamped_y) {
        vy += -vJ[1][2] * cam.fy * iz2;
        vz += vJ[1][2] * cam.fy * y * iz2 * iz;
    }
    // ---- p = R m + t  ->  v_m = R^T v_p ----
#pragma unroll
    for (int i = 0; i < 3; ++i)
        v_means3D[3 * g + i] = static_cast<float>(cam.R[0][i] * vx + cam.R[1][i] * vy + cam.R[2][i] * vz);
    if (v_viewmat_parts != nullptr) {  // [v_R | v_t] = [v_p m^T + 2 v_Sc Sc R | v_p]
        const double vp[3] = {vx, vy, vz};
        double ScR[3][3], W[3][3];
        matmul3(Sc, cam.R, ScR);
        matmul3(vSc, ScR, W);
        float* out = v_viewmat_parts + 12 * g;
#pragma unroll
        for (int i = 0; i < 3; ++i) {
#pragma unroll
            for (int j = 0; j < 3; ++j) out[4 * i + j] = static_cast<float>(vp[i] * m[j] + 2.0 * W[i][j]);
            out[4 * i + 3] = static_cast<float>(vp[i]);
        }
    }

    // ---- Sc = R Sigma R^T  ->  v_Sigma = R^T v_Sc R ----
    double tmp[3][3], vSigma[3][3];
#pragma unroll
    for (int i = 0; i < 3; ++i)
#pragma unroll
        for (int j = 0; j < 3; ++j) tmp[i][j] = vSc[i][0] * cam.R[0][j] + vSc[i][1] * cam.R[1][j] + vSc[i][2] * cam.R[2][j];
#pragma unroll
    for (int i = 0; i < 3; ++i)
#pragma unroll
        for (int j = 0; j < 3; ++j)
            vSigma[i][j] = cam.R[0][i] * tmp[0][j] + cam.R[1][i] * tmp[1][j] + cam.R[2][i] * tmp[2][j];

    // ---- Sigma = M M^T  ->  v_M = (v_Sigma + v_Sigma^T) M;  M = Rq diag(s) ----
    double vRq[3][3];
    double vs[3] = {0.0, 0.0, 0.0};
#pragma unroll
    for (int i = 0; i < 3; ++i) {
#pragma unroll
        for (int k = 0; k < 3; ++k) {
            double vM = 0.0;
#pragma unroll
            for (int j = 0; j < 3; ++j) vM += (vSigma[i][j] + vSigma[j][i]) * Rq[j][k] * s[k];
            vRq[i][k] = vM * s[k];
            vs[k] += vM * Rq[i][k];
        }
    }
#pragma unroll
    for (int k = 0; k < 3; ++k) v_scales[3 * g + k] = static_cast<float>(vs[k]);

    // ---- Rq(w, x, y, z) of the unit quaternion ----
    const double (&V)[3][3] = vRq;
    const double vqw = 2.0 * (-qz * V[0][1] + qy * V[0][2] + qz * V[1][0] - qx * V[1][2] - qy * V[2][0] + qx * V[2][1]);
    const double vqx = 2.0 * (qy * V[0][1] + qz * V[0][2] + qy * V[1][0] - 2.0 * qx * V[1][1] - qw * V[1][2] +
                              qz * V[2][0] + qw * V[2][1] - 2.0 * qx * V[2][2]);
    const double vqy = 2.0 * (-2.0 * qy * V[0][0] + qx * V[0][1] + qw * V[0][2] + qx * V[1][0] + qz * V[1][2] -
                              qw * V[2][0] + qz * V[2][1] - 2.0 * qy * V[2][2]);
    const double vqz = 2.0 * (-2.0 * qz * V[0][0] - qw * V[0][1] + qx * V[0][2] + qw * V[1][0] - 2.0 * qz * V[1][1] +
                              qy * V[1][2] + qx * V[2][0] + qy * V[2][1]);
    // ---- normalisation q_hat = q / |q|:  v_q = (v_hat - q_hat (q_hat . v_hat)) / |q| ----
    const double dot = qw * vqw + qx * vqx + qy * vqy + qz * vqz;
    v_quats[4 * g + 0] = static_cast<float>((vqw - qw * dot) / qn);
    v_quats[4 * g + 1] = static_cast<float>((vqx - qx * dot) / qn);
    v_quats[4 * g + 2] = static_cast<float>((vqy - qy * dot) / qn);
    v_quats[4 * g + 3] = static_cast<float>((vqz - qz * dot) / qn);
}

}  // namespace

void launch_project_bwd(const at::Tensor& means3D, const at::Tensor& quats, const at::Tensor& scales,
                        const at::Tensor& viewmat, const at::Tensor& K, int width, int height,
                        const at::Tensor& radii, const at::Tensor& v_means2D, const at::Tensor& v_conics,
                        const at::Tensor& v_depths, at::Tensor& v_means3D, at::Tensor& v_quats, at::Tensor& v_scales,
                        const at::Tensor* v_compensations, const at::Tensor* v_viewmat_parts) {
    const int64_t n = means3D.size(0);
    if (n == 0) return;
    project_bwd_kernel<<<num_blocks(n, kBlock1D), kBlock1D, 0, at::cuda::getCurrentCUDAStream()>>>(
        n, means3D.data_ptr<float>(), quats.data_ptr<float>(), scales.data_ptr<float>(), viewmat.data_ptr<float>(),
        K.data_ptr<float>(), width, height, radii.data_ptr<int32_t>(), v_means2D.data_ptr<float>(),
        v_conics.data_ptr<float>(), v_depths.data_ptr<float>(), v_means3D.data_ptr<float>(), v_quats.data_ptr<float>(),
        v_scales.data_ptr<float>(), v_compensations != nullptr ? v_compensations->data_ptr<float>() : nullptr,
        v_viewmat_parts != nullptr ? v_viewmat_parts->data_ptr<float>() : nullptr);
    RIGEL_CHECK_LAUNCH("project_bwd_kernel");
}

}  // namespace rigel
