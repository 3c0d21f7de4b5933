"""SH evaluation vs the explicit real-SH polynomials, and gradcheck through the whole reference render."""
import math

import torch

from rigel_core import config, rasterize_gaussians
from rigel_core.reference import eval_sh, sh_basis, sh_colors
from helpers import cam_tensors, random_camera, random_gaussians


def explicit_basis(d):
    """Real SH from their normalisation constants sqrt((2l+1)/4π·(l−|m|)!/(l+|m|)!), Condon–Shortley sign
    folded in as in Kerbl et al. 2023 (degree-1 terms −y, +z, −x), written out per term."""
    x, y, z = d
    pi = math.pi
    k0 = 0.5 * math.sqrt(1 / pi)
    k1 = math.sqrt(3 / (4 * pi))
    k2a, k2b, k2c = 0.5 * math.sqrt(15 / pi), 0.25 * math.sqrt(5 / pi), 0.25 * math.sqrt(15 / pi)
    k3a, k3b, k3c, k3d = 0.25 * math.sqrt(35 / (2 * pi)), 0.5 * math.sqrt(105 / pi), 0.25 * math.sqrt(21 / (2 * pi)), 0.25 * math.sqrt(7 / pi)
    k3e = 0.25 * math.sqrt(105 / pi)
    return [
        k0,
        -k1 * y, k1 * z, -k1 * x,
        k2a * x * y, -k2a * y * z, k2b * (3 * z * z - 1), -k2a * x * z, k2c * (x * x - y * y),
        -k3a * y * (3 * x * x - y * y), k3b * x * y * z, -k3c * y * (5 * z * z - 1), k3d * z * (5 * z * z - 3),
        -k3c * x * (5 * z * z - 1), k3e * z * (x * x - y * y), -k3a * x * (x * x - 3 * y * y),
    ]


def test_each_degree_matches_explicit_polynomials(rng):
    d = torch.randn(64, 3, generator=rng, dtype=torch.float64)
    d = d / d.norm(dim=-1, keepdim=True)
    ref = torch.tensor([explicit_basis(v.tolist()) for v in d], dtype=torch.float64)
    for deg in range(4):
        k = (deg + 1) ** 2
        torch.testing.assert_close(sh_basis(deg, d), ref[:, :k], rtol=1e-12, atol=1e-12)
        coeffs = torch.randn(64, 16, 3, generator=rng, dtype=torch.float64)
        torch.testing.assert_close(eval_sh(deg, coeffs, d), torch.einsum("nk,nkc->nc", ref[:, :k], coeffs[:, :k]))


def test_sh_colors_clamp_and_direction(rng):
    n = 50
    means = torch.randn(n, 3, generator=rng, dtype=torch.float64)
    campos = torch.randn(3, generator=rng, dtype=torch.float64)
    coeffs = torch.randn(n, 16, 3, generator=rng, dtype=torch.float64)
    c = sh_colors(3, coeffs, means, campos)
    d = (means - campos) / (means - campos).norm(dim=-1, keepdim=True)
    torch.testing.assert_close(c, (eval_sh(3, coeffs, d) + 0.5).clamp_min(0))
    assert (c == 0).any(), "clamp branch not exercised"
    # the clamp passes zero gradient where active
    coeffs.requires_grad_(True)
    sh_colors(3, coeffs, means, campos).sum().backward()
    clamped = (eval_sh(3, coeffs.detach(), d) + 0.5) < 0
    assert torch.all(coeffs.grad[:, 0, :][clamped] == 0)
    # a mean at the camera centre: direction 0, DC only, finite
    m0 = campos[None].clone()
    assert torch.isfinite(sh_colors(3, coeffs.detach()[:1], m0, campos)).all()


def test_gradcheck_full_reference_render(rng):
    """torch.autograd.gradcheck in float64 through SH → projection → binning → rasterization."""
    w, h = 12, 10
    cam = random_camera(rng, w, h, dist=3.0)
    means, quats, scales, opac, _ = random_gaussians(rng, 6, scale_range=(-1.5, -0.7))
    means = means * 0.3
    coeffs = torch.randn(6, 4, 3, generator=rng, dtype=torch.float64) * 0.3
    vm, K = cam_tensors(cam)
    campos = torch.as_tensor(cam.campos)
    bg = torch.tensor([0.2, 0.3, 0.4], dtype=torch.float64)

    def f(means, quats, log_scales, logits, coeffs):
        colors = sh_colors(1, coeffs, means, campos)
        out = rasterize_gaussians(means, quats, torch.exp(log_scales), torch.sigmoid(logits), colors, vm, K, w, h,
                                  background=bg)
        return out.image, out.final_T

    inputs = tuple(x.clone().requires_grad_(True) for x in (means, quats, torch.log(scales), torch.logit(opac * 0.9), coeffs))
    assert (f(*inputs)[1] < 0.99).any()
    assert torch.autograd.gradcheck(f, inputs, eps=1e-6, atol=1e-5, rtol=1e-4)
