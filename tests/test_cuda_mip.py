"""CUDA anti-aliased ("mip") projection vs the reference (GPU only; issue 17).

Forward: the kernel's compensations and conics against the float64 reference on the same float32 inputs (per-row
relative error ≤ 1e-6: the projection runs in double and rounds once to float32), cull decisions identical, edge
cases forced (tiny, huge, near-singular, non-finite, behind the camera, off-screen: ``edge_gaussians``).
Backward: float64 autograd of the reference projection with random output gradients on means2D, conics, depths
and compensations, ≤ 1e-5 per parameter group (the pattern of test_cuda_backward.py). End to end: the mip render
of real trained PLYs (the donut was trained by Mip-Splatting) against the float64 reference, ≥ 50 dB.
"""
from __future__ import annotations

import pytest
import torch

import rigel_core as rc
from rigel_core import _ext, config
from rigel_core.renderer import cuda_backend
from rigel_core.reference import project_gaussians, render_reference, sh_colors

from helpers import cam_tensors, random_camera, random_gaussians, real_scene_pair
from test_cuda_backward import TOL, assert_close, leaves
from test_cuda_forward import _ply_cameras, make_scene, psnr, rel_err_rows

pytestmark = pytest.mark.gpu
DEV = torch.device("cuda")


def with_mip_edges(rng, cam, inputs):
    """The scene plus Gaussians whose compensation is ~0 (tiny), ~1 (huge) and 0 (a line: det0 <= 0)."""
    means, quats, scales, opac, colors = inputs
    n = 3
    m = torch.zeros(n, 3, dtype=torch.float64)
    m[:] = torch.as_tensor(cam.campos) + 3.0 * torch.as_tensor(cam.R[2])  # on the optical axis, 3 units ahead
    s = torch.tensor([[1e-5, 2e-5, 1.5e-5], [2.0, 1.5, 1.0], [0.3, 0.0, 0.0]], dtype=torch.float64)
    q = torch.tensor([[1.0, 0, 0, 0]] * n, dtype=torch.float64)
    extra = (m, q, s, torch.full((n,), 0.7, dtype=torch.float64), torch.rand(n, 3, generator=rng,
                                                                               dtype=torch.float64))
    return tuple(torch.cat([a, b.to(a.dtype)]) for a, b in zip((means, quats, scales, opac, colors), extra))


def test_mip_projection_forward_matches_reference(rng):
    cam, inputs = make_scene(rng, 3000, 160, 120)
    means, quats, scales, opac, _ = with_mip_edges(rng, cam, inputs)
    vm, K = cam_tensors(cam, torch.float32)
    comp = torch.empty(means.shape[0], device=DEV)
    m2, con, dep, rad = _ext.get().project_gaussians(*(t.to(DEV) for t in (means, quats, scales, opac, vm, K)),
                                                     cam.width, cam.height, config.NEAR_PLANE, config.FAR_PLANE,
                                                     None, comp)
    d = lambda t: t.to(torch.float64)
    ref = project_gaussians(d(means), d(quats), d(scales), d(opac), d(vm), d(K), cam.width, cam.height,
                            render_mode="mip")
    assert torch.equal(rad.cpu(), ref.radii)
    live = ref.radii > 0
    assert float(rel_err_rows(con[live], ref.conics[live]).max()) <= 1e-6
    c, rc_ = comp.double().cpu(), ref.compensations
    assert float(((c - rc_).abs() / rc_.clamp_min(1e-30))[live & (rc_ > 1e-6)].max()) <= 1e-6
    assert (c[~live] == 0).all()
    tail = c[-3:]  # the line's det0 is rounding noise of either sign under a generic camera rotation: ~0
    assert 0 < float(tail[0]) < 1e-2 and float(tail[1]) > 0.999 and float(tail[2]) < 1e-6
    # the default mode's kernel output is untouched by the new argument
    m2d, cond, depd, radd = _ext.get().project_gaussians(*(t.to(DEV) for t in (means, quats, scales, opac, vm, K)),
                                                         cam.width, cam.height)
    refd = project_gaussians(d(means), d(quats), d(scales), d(opac), d(vm), d(K), cam.width, cam.height)
    assert torch.equal(radd.cpu(), refd.radii)


def test_mip_projection_backward_matches_float64_autograd(rng):
    cam, inputs = make_scene(rng, 1500, 96, 72)
    means, quats, scales, opac, _ = (t.float() for t in with_mip_edges(rng, cam, inputs))
    # well-conditioned versions of the edges (the line's det0 is rounding noise, its gradient too): small,
    # huge, and near-singular but positive
    scales[-3:] = torch.tensor([[1e-3, 2e-3, 1.5e-3], [2.0, 1.5, 1.0], [0.3, 2e-3, 1e-3]])
    w, h = cam.width, cam.height
    vm, K = cam_tensors(cam, torch.float32)
    n = means.shape[0]
    ws = [torch.randn(n, 2, generator=rng), torch.randn(n, 3, generator=rng), torch.randn(n, generator=rng),
          torch.randn(n, generator=rng)]
    grads = []
    for dev, dt in ((DEV, torch.float32), ("cpu", torch.float64)):
        x = leaves((means, quats, scales), dev, dt)
        o, v, k = (t.to(dev, dt) for t in (opac, vm, K))
        if dt == torch.float32:
            m2, con, dep, rad, comp = cuda_backend.project_gaussians_cuda(*x, o, v, k, w, h, render_mode="mip")
        else:
            p = project_gaussians(*x, o, v, k, w, h, render_mode="mip")
            m2, con, dep, rad, comp = p.means2D, p.conics, p.depths, p.radii, p.compensations
        sum((t * wi.to(dev, dt)).sum() for t, wi in zip((m2, con, dep, comp), ws)).backward()
        grads.append([t.grad for t in x] + [rad])
    (gm, gq, gs, rad), (rm, rq, rs, rrad) = grads
    assert torch.equal(rad.cpu(), rrad)
    assert_close([("means3D", gm, rm), ("quats", gq, rq), ("scales", gs, rs)], TOL)
    for gi in (gm, gq, gs):
        assert torch.isfinite(gi).all() and torch.count_nonzero(gi[rad == 0]) == 0


def test_mip_render_end_to_end_gradients(rng):
    """rasterize_gaussians(render_mode="mip") forward and backward against the float64 reference pipeline."""
    cam = random_camera(rng, 64, 48)
    means, quats, scales, opac, colors = random_gaussians(rng, 300, spread=1.0, scale_range=(-3.5, -2.0))
    base = (means, quats, scales, opac, colors)
    vm, K = cam_tensors(cam, torch.float32)
    w_img = torch.randn(48, 64, 3, generator=rng)
    x32 = leaves(base, DEV, torch.float32)
    out = rc.rasterize_gaussians(*x32, vm.to(DEV), K.to(DEV), 64, 48, render_mode="mip")
    (out.image * w_img.to(DEV)).sum().backward()
    x64 = leaves(base, "cpu", torch.float64)
    ref = rc.rasterize_gaussians(*x64, vm.double(), K.double(), 64, 48, render_mode="mip")
    (ref.image * w_img.double()).sum().backward()
    assert psnr(out.image, ref.image) >= 60
    # float32 entries may differ from float64 ones only at tile corners; gradients at the end-to-end bar of
    # test_cuda_backward's end-to-end tests
    assert_close([(nm, a.grad, b.grad) for nm, a, b in zip(("means3D", "quats", "scales", "opacities", "colors"),
                                                          x32, x64)], 1e-4)


@pytest.mark.parametrize("name", ["ply/donut_mipsplatting_sh0.ply", "ply/fruit_drops_minimal_sh3.ply"])
def test_real_scene_mip_psnr(shared_data, name):
    model, model64 = real_scene_pair(shared_data, name, DEV)
    for cam in _ply_cameras(model):
        got = rc.render(model, cam, render_mode="mip")
        colors = sh_colors(model64.sh_degree, model64.sh_coeffs, model64.means3D,
                           torch.as_tensor(cam.campos, device=DEV))
        _, _, rr = render_reference(model64.means3D, model64.quats, model64.scales, model64.opacities, colors,
                                    cam.viewmat_tensor(DEV, torch.float32).double(),
                                    cam.K_tensor(DEV, torch.float32).double(), cam.width, cam.height,
                                    render_mode="mip")
        assert float(got.final_T.min()) < 0.5, "camera does not see the scene"
        p = psnr(got.image, rr.image)
        assert p >= 50, f"{name}: mip PSNR {p:.1f} dB < 50"
