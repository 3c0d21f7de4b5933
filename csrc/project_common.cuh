// Projection maths shared by project_fwd.cu, project_bwd.cu and binning.cu (docs/PIPELINE.md [1]).
//
// The projection runs in double: one thread per Gaussian does a few hundred flops against ~60 bytes of
// memory traffic, so double costs nothing measurable on sm_90, and it makes the cull mask, radii and tile
// rectangles those of the float64 reference (thresholds such as ceil(3*sqrt(lambda)) are then decided on the
// same values), while means2D / conics come out as the float32 rounding of the float64 answer.
// Math: Zwicker et al. 2002 eq. 29 (EWA local affine approximation); Kerbl et al. 2023 eq. 5-6.
#pragma once

#include <cmath>

#include "common.cuh"

namespace rigel {

// A pinhole camera read from device memory: R, t of the row-major world-to-camera viewmat, intrinsics,
// and the tangent-clamp limits lim = TAN_CLAMP * 0.5 * size / focal.
struct CameraD {
    double R[3][3];
    double t[3];
    double fx, fy, cx, cy;
    double lim_x, lim_y;
};

__device__ inline CameraD load_camera(const float* __restrict__ viewmat,  // [4, 4] row-major
                                      const float* __restrict__ K,        // [3, 3]
                                      int width, int height) {
    CameraD c;
#pragma unroll
    for (int i = 0; i < 3; ++i) {
#pragma unroll
        for (int j = 0; j < 3; ++j) c.R[i][j] = static_cast<double>(__ldg(viewmat + 4 * i + j));
        c.t[i] = static_cast<double>(__ldg(viewmat + 4 * i + 3));
    }
    c.fx = __ldg(K + 0);
    c.cx = __ldg(K + 2);
    c.fy = __ldg(K + 4);
    c.cy = __ldg(K + 5);
    c.lim_x = kTanClamp * 0.5 * width / c.fx;
    c.lim_y = kTanClamp * 0.5 * height / c.fy;
    return c;
}

// Rotation matrix of the unit quaternion (w, x, y, z) (already normalised by the caller), in T (the projection's
// double, the MCMC noise's float: mcmc_noise.cu).
template <typename T>
__device__ inline void quat_to_rotmat(T w, T x, T y, T z, T Rq[3][3]) {
    Rq[0][0] = T(1) - T(2) * (y * y + z * z);
    Rq[0][1] = T(2) * (x * y - w * z);
    Rq[0][2] = T(2) * (x * z + w * y);
    Rq[1][0] = T(2) * (x * y + w * z);
    Rq[1][1] = T(1) - T(2) * (x * x + z * z);
    Rq[1][2] = T(2) * (y * z - w * x);
    Rq[2][0] = T(2) * (x * z - w * y);
    Rq[2][1] = T(2) * (y * z + w * x);
    Rq[2][2] = T(1) - T(2) * (x * x + y * y);
}

// World covariance Sigma = M M^T with M = Rq diag(s).
__device__ inline void covariance_3d(const double Rq[3][3], const double s[3], double Sigma[3][3]) {
    double M[3][3];
#pragma unroll
    for (int i = 0; i < 3; ++i)
#pragma unroll
        for (int k = 0; k < 3; ++k) M[i][k] = Rq[i][k] * s[k];
#pragma unroll
    for (int i = 0; i < 3; ++i)
#pragma unroll
        for (int j = 0; j < 3; ++j) Sigma[i][j] = M[i][0] * M[j][0] + M[i][1] * M[j][1] + M[i][2] * M[j][2];
}

// out = A B for 3x3 matrices.
__device__ inline void matmul3(const double A[3][3], const double B[3][3], double out[3][3]) {
#pragma unroll
    for (int i = 0; i < 3; ++i)
#pragma unroll
        for (int j = 0; j < 3; ++j) out[i][j] = A[i][0] * B[0][j] + A[i][1] * B[1][j] + A[i][2] * B[2][j];
}

// Camera-space covariance Sigma_c = R Sigma R^T.
__device__ inline void covariance_camera(const double R[3][3], const double Sigma[3][3], double Sc[3][3]) {
    double RS[3][3];
    matmul3(R, Sigma, RS);
#pragma unroll
    for (int i = 0; i < 3; ++i)
#pragma unroll
        for (int j = 0; j < 3; ++j) Sc[i][j] = RS[i][0] * R[j][0] + RS[i][1] * R[j][1] + RS[i][2] * R[j][2];
}

// The EWA Jacobian of the perspective projection at camera point (x, y, z), with x/z and y/z clamped to
// +-lim (the clamp makes J constant in x (resp. y) outside the limits: clamped_x/clamped_y say so).
// J = [[fx/z, 0, -fx tx/z], [0, fy/z, -fy ty/z]].
struct Jacobian {
    double j00, j02, j11, j12;
    double tx, ty;
    bool clamped_x, clamped_y;
};

__device__ inline Jacobian ewa_jacobian(const CameraD& cam, double x, double y, double z) {
    Jacobian J;
    const double rx = x / z, ry = y / z;
    J.clamped_x = !(rx >= -cam.lim_x && rx <= cam.lim_x);
    J.clamped_y = !(ry >= -cam.lim_y && ry <= cam.lim_y);
    J.tx = fmin(fmax(rx, -cam.lim_x), cam.lim_x);
    J.ty = fmin(fmax(ry, -cam.lim_y), cam.lim_y);
    J.j00 = cam.fx / z;
    J.j02 = -cam.fx * J.tx / z;
    J.j11 = cam.fy / z;
    J.j12 = -cam.fy * J.ty / z;
    return J;
}

// Screen covariance (a, b, c) = J Sc J^T + filt I (filt = kLowpass, or kMipFilter2D in the mip mode).
__device__ inline void covariance_2d(const Jacobian& J, const double Sc[3][3], double filt, double& a, double& b,
                                     double& c) {
    // rows of J Sc
    const double t00 = J.j00 * Sc[0][0] + J.j02 * Sc[2][0];
    const double t01 = J.j00 * Sc[0][1] + J.j02 * Sc[2][1];
    const double t02 = J.j00 * Sc[0][2] + J.j02 * Sc[2][2];
    const double t11 = J.j11 * Sc[1][1] + J.j12 * Sc[2][1];
    const double t12 = J.j11 * Sc[1][2] + J.j12 * Sc[2][2];
    a = t00 * J.j00 + t02 * J.j02 + filt;
    b = t01 * J.j11 + t02 * J.j12;
    c = t11 * J.j11 + t12 * J.j12 + filt;
}

// The anti-aliased ("mip") mode's opacity compensation (Yu et al., "Mip-Splatting", CVPR 2024, eq. 9): the
// screen Gaussian convolved with the 2D Mip filter, Sigma2D + s I, keeps the integral of the unfiltered one
// when its peak is scaled by comp = sqrt(det0 / det), det0 = det(Sigma2D), det = det(Sigma2D + s I).
// (a, b, c) is the FILTERED covariance and det its determinant; det0 <= 0 (degenerate, or negative by rounding)
// gives comp = 0: the Gaussian vanishes, with zero gradient.
__device__ inline double mip_compensation(double a, double b, double c, double det, double& det0) {
    det0 = (a - kMipFilter2D) * (c - kMipFilter2D) - b * b;
    return det0 > 0.0 ? sqrt(det0 / det) : 0.0;
}

// Camera-space point p = R m + t.
__device__ __forceinline__ void world_to_camera(const CameraD& cam, const double m[3], double p[3]) {
#pragma unroll
    for (int i = 0; i < 3; ++i) p[i] = cam.R[i][0] * m[0] + cam.R[i][1] * m[1] + cam.R[i][2] * m[2] + cam.t[i];
}

// The forward chain from the unit quaternion (qw, qx, qy, qz), the scales and the camera point p = (x, y, z) to
// the screen covariance, as both the forward and the backward (which recomputes it) evaluate it:
// Rq = Rq(q), Sigma = Rq diag(s)^2 Rq^T, Sc = R Sigma R^T, J = J(p), (a, b, c) = J Sc J^T + filt I.
// Returns det = ac - b^2; Rq, Sc and J are written out for the backward.
__device__ __forceinline__ double screen_covariance(const CameraD& cam, double qw, double qx, double qy, double qz,
                                                   const double s[3], double x, double y, double z, double Rq[3][3],
                                                   double Sc[3][3], Jacobian& J, double& a, double& b, double& c,
                                                   double filt) {
    double Sigma[3][3];
    quat_to_rotmat(qw, qx, qy, qz, Rq);
    covariance_3d(Rq, s, Sigma);
    covariance_camera(cam.R, Sigma, Sc);
    J = ewa_jacobian(cam, x, y, z);
    covariance_2d(J, Sc, filt, a, b, c);
    return a * c - b * b;
}

// Tile rectangle [x0, x1) x [y0, y1) of a splat at (u, v) with pixel radius r, clamped to the tile grid in
// floating point BEFORE the integer conversion (NaN -> 0, +-inf -> the grid's ends), so no value can
// become an out-of-range tile index. Scalar is double in projection, float in binning (as the reference).
template <typename Scalar>
__device__ inline int tile_lo(Scalar c, Scalar r, int n) {
    Scalar f = floor((c - r) / static_cast<Scalar>(kTileSize));
    if (isnan(f)) f = 0;
    return static_cast<int>(fmin(fmax(f, static_cast<Scalar>(0)), static_cast<Scalar>(n)));
}

template <typename Scalar>
__device__ inline int tile_hi(Scalar c, Scalar r, int n) {
    Scalar f = floor((c + r) / static_cast<Scalar>(kTileSize)) + static_cast<Scalar>(1);
    if (isnan(f)) f = 0;
    return static_cast<int>(fmin(fmax(f, static_cast<Scalar>(0)), static_cast<Scalar>(n)));
}

struct TileRect {
    int x0, y0, x1, y1;
    __device__ bool empty() const { return x1 <= x0 || y1 <= y0; }
    __device__ int area() const { return empty() ? 0 : (x1 - x0) * (y1 - y0); }
};

template <typename Scalar>
__device__ inline TileRect tile_rect(Scalar u, Scalar v, Scalar r, int tiles_x, int tiles_y) {
    return TileRect{tile_lo(u, r, tiles_x), tile_lo(v, r, tiles_y), tile_hi(u, r, tiles_x), tile_hi(v, r, tiles_y)};
}

}  // namespace rigel
