"""The cull rule on the CPU reference backend (docs/PIPELINE.md "Non-finite parameters"): a Gaussian with any
non-finite parameter (mean, log-scale, quaternion, opacity logit, SH coefficient, MLP latent) renders exactly as
if its row were deleted, and receives finite zero gradients.

Before the rule covered colours, NaN/Inf in 1 % of the rows' SH coefficients turned every tile they touched
(in practice the whole image) NaN — saved as black; +Inf opacity logits and −Inf log-scales were drawn.
"""
from __future__ import annotations

import pytest
import torch

import rigel_core as rc
from rigel_core.renderer.appearance import MLPAppearance
from rigel_core.model import GaussianModel

from helpers import random_camera

BAD = (float("nan"), float("inf"), float("-inf"))


def _scene(gen, n=300, degree=3, dtype=torch.float64):
    means = (torch.rand(n, 3, generator=gen, dtype=dtype) * 2 - 1)
    log_scales = -3.0 + 1.5 * torch.rand(n, 3, generator=gen, dtype=dtype)
    quats = torch.randn(n, 4, generator=gen, dtype=dtype)
    logits = torch.randn(n, generator=gen, dtype=dtype)
    sh_dc = torch.randn(n, 1, 3, generator=gen, dtype=dtype) * 0.5
    sh_rest = torch.randn(n, (degree + 1) ** 2 - 1, 3, generator=gen, dtype=dtype) * 0.1
    return GaussianModel.from_tensors(means, log_scales, quats, logits, sh_dc, sh_rest)


def _poison(model, field, rows, value, gen):
    """Put ``value`` into one random entry of ``field`` (a parameter name or 'latents') in each of ``rows``."""
    t = model.appearance.latents if field == "latents" else getattr(model, field)
    t = t.detach().clone()
    flat = t.reshape(t.shape[0], -1)
    cols = torch.randint(0, flat.shape[1], (rows.numel(),), generator=gen)
    flat[rows, cols] = value
    if field == "latents":
        model.appearance.latents = t
    else:
        setattr(model, field, t)


def _deleted(model, rows):
    keep = torch.ones(len(model), dtype=torch.bool)
    keep[rows] = False
    return model.subset(keep)


def _render(model, cam):
    return rc.render(model, cam, background=(0.2, 0.3, 0.4))


CASES = [("sh_dc", 0), ("sh_dc", 3), ("sh_rest", 3), ("sh_rest", 0), ("means3D", 3), ("quats", 3),
         ("log_scales", 3), ("opacity_logits", 3)]


def _grad_leaves(model, field):
    """``(params, per_row)``: every tensor the render reads, set to require gradients (the MLP's weights too when
    ``field`` is "latents"), and those of them with one row per Gaussian."""
    names = ("means3D", "log_scales", "quats", "opacity_logits") + (("sh_dc", "sh_rest") if field != "latents" else ())
    params = [getattr(model, p) for p in names]
    per_row = list(params)
    if model.appearance is not None:
        app = model.appearance
        params += [app.latents, app.W1, app.b1, app.W2, app.b2]
        per_row.append(app.latents)
    for p in params:
        p.requires_grad_(True)
    return params, per_row


@pytest.mark.parametrize("field,degree", CASES)
@pytest.mark.parametrize("value", BAD, ids=["nan", "inf", "-inf"])
def test_poisoned_rows_render_as_deleted(rng, field, degree, value):
    gen = rng
    model = _scene(gen)
    model.active_sh_degree = degree
    cam = random_camera(gen, 64, 48, dist=3.0)
    rows = torch.randperm(len(model), generator=gen)[:3]  # 1 %
    want = _render(_deleted(model, rows), cam)
    _poison(model, field, rows, value, gen)
    got = _render(model, cam)
    assert torch.isfinite(got.image).all()
    assert (got.radii[rows] == 0).all()
    torch.testing.assert_close(got.image, want.image, rtol=0, atol=1e-12)
    torch.testing.assert_close(got.final_T, want.final_T, rtol=0, atol=1e-12)


@pytest.mark.parametrize("value", BAD, ids=["nan", "inf", "-inf"])
def test_poisoned_latents_render_as_deleted(rng, value):
    gen = rng
    model = _scene(gen, degree=0)
    model.appearance = MLPAppearance.create(len(model), 8, 16, dtype=torch.float64, generator=gen)
    cam = random_camera(gen, 64, 48, dist=3.0)
    rows = torch.randperm(len(model), generator=gen)[:3]
    want = _render(_deleted(model, rows), cam)
    _poison(model, "latents", rows, value, gen)
    got = _render(model, cam)
    assert torch.isfinite(got.image).all()
    torch.testing.assert_close(got.image, want.image, rtol=0, atol=1e-12)


@pytest.mark.parametrize("field", ["sh_dc", "sh_rest", "means3D", "log_scales", "opacity_logits", "quats",
                                   "latents"])
def test_poisoned_rows_get_zero_gradients(rng, field):
    gen = rng
    model = _scene(gen)
    if field == "latents":
        model.appearance = MLPAppearance.create(len(model), 8, 16, dtype=torch.float64, generator=gen)
    cam = random_camera(gen, 48, 32, dist=3.0)
    rows = torch.randperm(len(model), generator=gen)[:3]
    for i, v in enumerate(BAD):
        _poison(model, field, rows[i:i + 1], v, gen)
    params, per_row = _grad_leaves(model, field)
    out = _render(model, cam)
    target = torch.rand(out.image.shape, generator=gen, dtype=out.image.dtype)
    ((out.image - target) ** 2).sum().backward()
    for p in params:
        assert p.grad is not None and torch.isfinite(p.grad).all()
    for p in per_row:
        assert (p.grad[rows] == 0).all()
    assert params[0].grad.abs().sum() > 0  # the rest of the scene still learns


def test_all_rows_poisoned_gives_background(rng):
    gen = rng
    model = _scene(gen, n=20)
    _poison(model, "sh_dc", torch.arange(20), float("nan"), gen)
    out = _render(model, random_camera(gen, 40, 24, dist=3.0))
    assert (out.radii == 0).all()
    torch.testing.assert_close(out.image, torch.tensor([0.2, 0.3, 0.4], dtype=out.image.dtype).expand(24, 40, 3))


# ---- the same rule in the CUDA kernels (run on the H200; skipped without a GPU) ----------------------------

def _gpu_case(rng, field, value, degree=3, mlp=False):
    gen = rng
    model = _scene(gen, n=1000, degree=degree, dtype=torch.float32)
    if mlp:
        model.appearance = MLPAppearance.create(len(model), 8, 16, dtype=torch.float32, generator=gen)
    cam = random_camera(gen, 96, 64, dist=3.0)
    rows = torch.randperm(len(model), generator=gen)[:10]  # 1 %
    clean = _deleted(model, rows)
    _poison(model, field, rows, value, gen)
    return model, clean, cam, rows


@pytest.mark.gpu
@pytest.mark.parametrize("field", ["sh_dc", "sh_rest", "means3D", "quats", "log_scales", "opacity_logits", "latents"])
@pytest.mark.parametrize("value", BAD, ids=["nan", "inf", "-inf"])
def test_cuda_poisoned_rows_render_as_deleted(rng, field, value):
    model, clean, cam, rows = _gpu_case(rng, field, value, mlp=field == "latents")
    dev = torch.device("cuda")
    got = _render(model.to(dev), cam)
    want = _render(clean.to(dev), cam)
    assert torch.isfinite(got.image).all()
    assert (got.radii[rows.to(dev)] == 0).all()
    torch.testing.assert_close(got.image, want.image, rtol=0, atol=1e-6)
    # and the CUDA render agrees with the float64 reference of the deleted scene (test_cuda_forward's bound)
    ref = _render(clean.to(dtype=torch.float64), cam).image
    mse = float(((got.image.double().cpu() - ref) ** 2).mean())
    assert mse == 0 or -10 * torch.log10(torch.tensor(mse)) >= 60


@pytest.mark.gpu
@pytest.mark.parametrize("field", ["sh_dc", "sh_rest", "means3D", "log_scales", "opacity_logits", "latents"])
def test_cuda_poisoned_rows_get_zero_gradients(rng, field):
    gen = rng
    model, _, cam, rows = _gpu_case(rng, field, float("nan"), mlp=field == "latents")
    for i, v in enumerate(BAD):  # NaN, +Inf, −Inf in different rows
        _poison(model, field, rows[i * 3:(i + 1) * 3], v, gen)
    model = model.to(torch.device("cuda"))
    params, per_row = _grad_leaves(model, field)
    out = _render(model, cam)
    target = torch.rand(out.image.shape, generator=gen).to(out.image)
    ((out.image - target) ** 2).sum().backward()
    r = rows.to(out.image.device)
    for p in params:
        assert p.grad is not None and torch.isfinite(p.grad).all()
    for p in per_row:
        assert (p.grad[r] == 0).all()


@pytest.mark.gpu
@pytest.mark.parametrize("degree", [0, 3])
def test_cuda_sh_colors_mark_poisoned_rows(rng, degree):
    from rigel_core.renderer.cuda_backend import sh_colors_cuda
    from rigel_core.reference import sh_colors

    model, _, cam, rows = _gpu_case(rng, "sh_rest", float("inf"), degree=3)
    campos = cam.campos_tensor(torch.device("cpu"), torch.float32)
    want = sh_colors(degree, model.sh_coeffs, model.means3D, campos)
    got = sh_colors_cuda(degree, model.sh_coeffs.cuda(), model.means3D.cuda(), campos.cuda()).cpu()
    assert torch.isnan(got[rows]).all() and torch.isnan(want[rows]).all()
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6, equal_nan=True)


@pytest.mark.gpu
def test_cuda_mlp_kernel_marks_poisoned_rows(rng):
    """The fused appearance kernel against the reference on rows with non-finite latents or means: NaN colour
    rows in both, equal elsewhere; backward: zero rows, finite weight gradients equal to the reference's."""
    from rigel_core.renderer.appearance import mlp_colors

    gen = rng
    n, L, H = 3000, 8, 32
    app = MLPAppearance.create(n, L, H, generator=gen)
    means = torch.rand(n, 3, generator=gen) * 2 - 1
    campos = torch.tensor([0.3, -2.5, 1.0])
    rows = torch.randperm(n, generator=gen)[:30]
    lat = app.latents.clone()
    lat[rows[:10], 0] = float("nan")
    lat[rows[10:20], L - 1] = float("inf")
    means[rows[20:], 1] = float("-inf")
    v = torch.rand(n, 3, generator=gen)
    outs = []
    for dev in ("cpu", "cuda"):
        args = [t.detach().to(dev).requires_grad_(True)  # a fresh leaf on each device
                for t in (lat, means, campos, app.W1, app.b1, app.W2, app.b2)]
        c = mlp_colors(*args)
        (c.nan_to_num(0.0) * v.to(dev)).sum().backward()
        outs.append((c.detach().cpu(), [a.grad.cpu() for a in args]))
    (c0, g0), (c1, g1) = outs
    assert torch.isnan(c1[rows]).all() and torch.isfinite(c1[~torch.isin(torch.arange(n), rows)]).all()
    torch.testing.assert_close(c1, c0, rtol=1e-5, atol=1e-6, equal_nan=True)
    for a, b in zip(g1, g0):
        assert torch.isfinite(a).all()
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)
    assert (g1[0][rows] == 0).all() and (g1[1][rows] == 0).all()
