"""Anti-aliased ("mip") render mode on the CPU (issue 17; rigel_core/renderer/mip.py, docs/PIPELINE.md
"Anti-aliased mode").

The reference's mip projection (2D Mip filter + opacity compensation) and the 3D smoothing filter are checked in
float64 against formulas written independently here (matrix determinants and inverses of the full covariance,
not the reference's closed forms), forward and — through autograd of those formulas — backward, on fresh random
inputs with the edge cases forced (a tiny covariance whose compensation → 0, a huge one where it → 1, a
near-singular one whose unfiltered determinant is ≤ 0). Tolerances: both sides are float64 evaluations of the
same quantities by different routes, so 1e-9 relative is their rounding; the brief's bar is 1e-5.
"""
import math

import numpy as np
import pytest
import torch

from rigel_core import Camera, config, rasterize_gaussians, render
from rigel_core.io import load_ply, save_ply
from rigel_core.io.ply import SceneWarning, read_ply_header
from rigel_core.renderer.mip import apply_3d_filter, bake_3d_filter, compute_filter_3d
from rigel_core.model import GaussianModel
from rigel_core.reference import project_gaussians
from helpers import cam_tensors, random_camera, random_gaussians


# ---- an independent float64 formula of the mip projection (one batch of Gaussians, torch autograd) ----------
def quat_matrix(q):
    """Rotation of (w, x, y, z) via R = (w² − |v|²) I + 2 v vᵀ + 2 w [v]× (another route than the reference's)."""
    q = q / q.norm(dim=-1, keepdim=True)
    w, v = q[:, :1], q[:, 1:]
    a, b, c = v.unbind(-1)
    z = torch.zeros_like(a)
    cross = torch.stack([z, -c, b, c, z, -a, -b, a, z], -1).reshape(-1, 3, 3)
    eye = torch.eye(3, dtype=q.dtype).expand(q.shape[0], 3, 3)
    return (w * w - (v * v).sum(-1, keepdim=True))[..., None] * eye + 2 * v[:, :, None] * v[:, None, :] \
        + 2 * w[..., None] * cross


def independent_mip(means, quats, scales, cam):
    """(means2D, conics, depths, compensations) of the mip projection for visible, unclamped Gaussians."""
    vm, K = cam_tensors(cam)
    W, t = vm[:3, :3], vm[:3, 3]
    p = means @ W.T + t
    x, y, z = p.unbind(-1)
    R = quat_matrix(quats)
    Sigma = R @ torch.diag_embed(scales ** 2) @ R.transpose(1, 2)
    zero = torch.zeros_like(z)
    J = torch.stack([torch.stack([cam.fx / z, zero, -cam.fx * x / z ** 2], -1),
                     torch.stack([zero, cam.fy / z, -cam.fy * y / z ** 2], -1)], 1)
    S0 = J @ W @ Sigma @ W.T @ J.transpose(1, 2)
    S = S0 + config.MIP_FILTER_2D * torch.eye(2, dtype=means.dtype)
    det0, det = torch.linalg.det(S0), torch.linalg.det(S)
    comp = torch.where(det0 > 0, torch.sqrt(det0.clamp_min(1e-300) / det), torch.zeros_like(det))
    inv = torch.linalg.inv(S)
    conics = torch.stack([inv[:, 0, 0], inv[:, 0, 1], inv[:, 1, 1]], -1)
    means2D = torch.stack([cam.fx * x / z + cam.cx, cam.fy * y / z + cam.cy], -1)
    return means2D, conics, z, comp


def centred_scene(gen, n, scale_range=(-4.0, -1.0)):
    """Gaussians near the optical axis (visible, inside the tangent clamp) of a random camera."""
    cam = random_camera(gen, width=80, height=60)
    means, quats, scales, opac, colors = random_gaussians(gen, n, spread=0.5, scale_range=scale_range)
    return cam, means, quats, scales, opac, colors


def force_edge_cases(scales):
    """Rows 0–2: tiny (compensation → 0), huge (→ 1), near-singular (det0 ≈ 0, either sign by rounding)."""
    scales = scales.clone()
    scales[0] = torch.tensor([1e-5, 2e-5, 1.5e-5])
    scales[1] = torch.tensor([3.0, 2.0, 2.5])
    scales[2] = torch.tensor([0.3, 1e-12, 1e-12])
    return scales


def test_mip_projection_forward_matches_independent_formula(rng):
    cam, means, quats, scales, opac, _ = centred_scene(rng, 200)
    scales = force_edge_cases(scales)
    vm, K = cam_tensors(cam)
    p = project_gaussians(means, quats, scales, opac, vm, K, cam.width, cam.height, render_mode="mip")
    m2, con, z, comp = independent_mip(means, quats, scales, cam)
    live = p.radii > 0
    assert int(live.sum()) > 100 and bool(live[:3].all())
    torch.testing.assert_close(p.means2D[live], m2[live], rtol=1e-12, atol=1e-9)
    torch.testing.assert_close(p.conics[live], con[live], rtol=1e-9, atol=1e-12)
    # row 2's unfiltered determinant is rounding noise (~1e-16 of its size, either sign): both sides give a
    # compensation that is 0 or below 1e-6, which rounding decides; every other row agrees to rounding
    rows = live.clone()
    rows[2] = False
    torch.testing.assert_close(p.compensations[rows], comp[rows], rtol=1e-9, atol=1e-12)
    assert (p.compensations[~live] == 0).all()
    # the forced branches: tiny → compensation far below 1, huge → ~1, near-singular → ~0 (exactly 0 when
    # det0 <= 0: test_mip_projection_zero_gradient_where_compensation_is_zero)
    assert 0 < float(p.compensations[0]) < 1e-2
    assert float(p.compensations[1]) > 0.999
    assert float(p.compensations[2]) < 1e-6 and float(comp[2]) < 1e-6
    # the mip filter, not the LOWPASS dilation, widens the covariance
    d = project_gaussians(means, quats, scales, opac, vm, K, cam.width, cam.height)
    assert d.compensations is None
    torch.testing.assert_close(p.cov2D[live] - d.cov2D[live],
                               torch.tensor([config.MIP_FILTER_2D - config.LOWPASS, 0.0,
                                             config.MIP_FILTER_2D - config.LOWPASS],
                                            dtype=torch.float64).expand(int(live.sum()), 3), rtol=0, atol=1e-12)


def test_mip_projection_backward_matches_autograd_of_independent_formula(rng):
    cam, means, quats, scales, opac, _ = centred_scene(rng, 60)
    scales = force_edge_cases(scales)
    scales[2] = torch.tensor([0.3, 1e-3, 2e-3])  # near-singular but positive: a huge, finite gradient
    vm, K = cam_tensors(cam)
    w = [torch.randn(s, generator=rng, dtype=torch.float64) for s in ((60, 2), (60, 3), (60,), (60,))]

    def loss(outs):
        return sum((o * wi).sum() for o, wi in zip(outs, w))

    leaves = [t.clone().requires_grad_() for t in (means, quats, scales)]
    p = project_gaussians(*leaves, opac, vm, K, cam.width, cam.height, render_mode="mip")
    live = p.radii > 0
    assert bool(live.all()), "the scene is built so every Gaussian is visible and unclamped"
    g_ref = torch.autograd.grad(loss([p.means2D, p.conics, p.depths, p.compensations]), leaves, retain_graph=True)
    leaves2 = [t.clone().requires_grad_() for t in (means, quats, scales)]
    g_ind = torch.autograd.grad(loss(independent_mip(*leaves2, cam)), leaves2)
    for name, a, b in zip(("means3D", "quats", "scales"), g_ref, g_ind):
        scale = b.abs().max(-1, keepdim=True).values.clamp_min(1e-12)
        err = ((a - b).abs() / scale).max()
        assert err < 1e-5, f"v_{name}: relative error {float(err):.2e}"
    # compensation's own gradient path carries weight (so the check above can fail on it)
    g_nocomp = torch.autograd.grad(loss([p.means2D, p.conics, p.depths, 0 * p.compensations]), leaves,
                                   allow_unused=True)[2]
    assert (g_nocomp - g_ref[2]).abs().max() > 1e-3


def test_mip_projection_zero_gradient_where_compensation_is_zero():
    cam = Camera.look_at((0, -4, 0), (0, 0, 0), (0, 0, 1), width=64, height=48, fov_x_deg=60)
    vm, K = cam_tensors(cam)
    means = torch.zeros(1, 3, dtype=torch.float64)
    quats = torch.tensor([[1.0, 0, 0, 0]], dtype=torch.float64, requires_grad=True)
    scales = torch.tensor([[0.3, 0.0, 0.0]], dtype=torch.float64, requires_grad=True)  # a line: det0 = 0
    p = project_gaussians(means, quats, scales, torch.ones(1, dtype=torch.float64), vm, K, 64, 48,
                          render_mode="mip")
    assert int(p.radii[0]) > 0 and float(p.compensations[0].detach()) == 0.0
    g = torch.autograd.grad(p.compensations.sum(), [quats, scales])
    assert all(torch.isfinite(x).all() and (x == 0).all() for x in g)


def test_default_mode_unchanged_and_bad_mode_refused(rng):
    cam = random_camera(rng)
    means, quats, scales, opac, colors = random_gaussians(rng, 80)
    vm, K = cam_tensors(cam)
    a = rasterize_gaussians(means, quats, scales, opac, colors, vm, K, cam.width, cam.height)
    b = rasterize_gaussians(means, quats, scales, opac, colors, vm, K, cam.width, cam.height, render_mode="default")
    assert torch.equal(a.image, b.image) and torch.equal(a.final_T, b.final_T)
    m = rasterize_gaussians(means, quats, scales, opac, colors, vm, K, cam.width, cam.height, render_mode="mip")
    assert not torch.equal(a.image, m.image)
    with pytest.raises(ValueError, match="render_mode: expected one of default, mip"):
        rasterize_gaussians(means, quats, scales, opac, colors, vm, K, cam.width, cam.height, render_mode="aa")


def test_mip_render_is_the_compensated_default_pipeline(rng):
    """The mip image = the raster of (mip projection, opacities · compensations): the data flow of the mode."""
    from rigel_core.reference import bin_gaussians, rasterize_tiles

    cam = random_camera(rng)
    means, quats, scales, opac, colors = random_gaussians(rng, 60)
    vm, K = cam_tensors(cam)
    out = rasterize_gaussians(means, quats, scales, opac, colors, vm, K, cam.width, cam.height, render_mode="mip")
    p = project_gaussians(means, quats, scales, opac, vm, K, cam.width, cam.height, render_mode="mip")
    o = opac * p.compensations
    bn = bin_gaussians(p.means2D, p.conics, o, p.depths, p.radii, cam.width, cam.height)
    img, T, _ = rasterize_tiles(p.means2D, p.conics, colors, o, bn.gaussian_ids, bn.tile_ranges, bn.tiles_x,
                                bn.tiles_y, cam.width, cam.height)
    assert torch.equal(out.image, img) and torch.equal(out.final_T, T)


# ---- 3D smoothing filter ------------------------------------------------------------------------------------
def test_3d_filter_is_the_convolved_gaussian(rng):
    n = 50
    _, quats, scales, opac, _ = random_gaussians(rng, n, scale_range=(-6, 0))
    f = torch.rand(n, generator=rng, dtype=torch.float64) * 0.01
    f[0] = 0.0
    s2, o2 = apply_3d_filter(scales, opac, f)
    R = quat_matrix(quats)
    Sigma = R @ torch.diag_embed(scales ** 2) @ R.transpose(1, 2)
    Sigma_f = Sigma + f[:, None, None] * torch.eye(3, dtype=torch.float64)
    Sigma_2 = R @ torch.diag_embed(s2 ** 2) @ R.transpose(1, 2)
    torch.testing.assert_close(Sigma_2, Sigma_f, rtol=1e-12, atol=1e-15)
    torch.testing.assert_close(o2, opac * torch.sqrt(torch.linalg.det(Sigma) / torch.linalg.det(Sigma_f)),
                               rtol=1e-9, atol=0)
    assert torch.equal(s2[0], scales[0]) and o2[0] == opac[0]
    # backward: gradcheck of the activation (float64)
    sub = (scales[:6].clone().requires_grad_(), opac[:6].clone().requires_grad_())
    assert torch.autograd.gradcheck(lambda s, o: apply_3d_filter(s, o, f[:6]), sub)
    with pytest.raises(ValueError, match=r"filter_3D: expected shape \(50,\)"):
        apply_3d_filter(scales, opac, f[:10])


def test_compute_filter_3d_is_the_highest_sampling_rate(rng):
    cams = []
    for i in range(4):  # on the −y side, looking at the origin from different distances and focal lengths
        jitter = (torch.rand(2, generator=rng, dtype=torch.float64) - 0.5).tolist()
        cams.append(Camera.look_at((jitter[0], -2.0 - i, jitter[1]), (0, 0, 0), (0, 0, 1), width=40, height=30,
                                   fov_x_deg=40 + 10 * i))
    means = (torch.rand(30, 3, generator=rng, dtype=torch.float64) - 0.5) * 0.6
    means[0] = torch.tensor([0.0, -100.0, 0.0])  # behind every camera: the largest filter of the seen ones
    means[1] = float("nan")
    f = compute_filter_3d(means, cams)
    for i in range(2, 30):
        best = 0.0
        for c in cams:
            p = c.viewmat[:3, :3] @ means[i].numpy() + c.viewmat[:3, 3]
            u, v = c.fx * p[0] / p[2] + c.cx, c.fy * p[1] / p[2] + c.cy
            if p[2] > config.NEAR_PLANE and -0.15 * c.width <= u <= 1.15 * c.width and \
                    -0.15 * c.height <= v <= 1.15 * c.height:
                best = max(best, max(c.fx, c.fy) / p[2])
        assert best > 0
        assert math.isclose(float(f[i]), config.MIP_FILTER_3D / best ** 2, rel_tol=1e-12)
    assert math.isclose(float(f[0]), float(f[2:].max()), rel_tol=1e-12)
    assert float(f[1]) == 0.0


def mip_model(rng, n=40, dtype=torch.float64):
    means, quats, scales, opac, colors = random_gaussians(rng, n, dtype=dtype, scale_range=(-4, -1.5))
    model = GaussianModel.from_tensors(means, torch.log(scales), quats, torch.logit(opac),
                                       (colors - 0.5) / config.SH_C0)
    model.render_mode = "mip"
    model.filter_3D = torch.rand(n, generator=rng, dtype=dtype) * 4e-3
    return model


def test_bake_is_exact(rng):
    """Baked model rendered in mip mode (2D filter only) == the unbaked model with its 3D filter, float64."""
    model = mip_model(rng)
    cam = random_camera(rng)
    baked = bake_3d_filter(model)
    assert baked.filter_3D is None and baked.render_mode == "mip" and model.filter_3D is not None
    a = render(model, cam)
    b = render(baked, cam)
    torch.testing.assert_close(b.image, a.image, rtol=0, atol=1e-12)
    torch.testing.assert_close(b.final_T, a.final_T, rtol=0, atol=1e-12)
    # and the filter does something
    raw = render(model.to(), cam, render_mode="mip")
    raw.image  # noqa: B018
    nofilter = model.to()
    nofilter.filter_3D = None
    assert (render(nofilter, cam).image - a.image).abs().max() > 1e-3


def test_render_uses_the_models_mode(rng):
    model = mip_model(rng)
    cam = random_camera(rng)
    own = render(model, cam)
    explicit = render(model, cam, render_mode="mip")
    assert torch.equal(own.image, explicit.image)
    d = render(model, cam, render_mode="default")  # no 2D filter and no 3D filter: the raw Gaussians
    vm, K = cam_tensors(cam)
    from rigel_core.renderer import compute_colors

    ref = rasterize_gaussians(model.means3D, model.quats, model.scales, model.opacities,
                              compute_colors(model, cam), vm, K, cam.width, cam.height)
    assert torch.equal(d.image, ref.image) and not torch.equal(d.image, own.image)


# ---- PLY header ---------------------------------------------------------------------------------------------
def test_ply_render_mode_round_trip(rng, tmp_path):
    model = mip_model(rng, dtype=torch.float32)
    save_ply(model, tmp_path / "mip.ply")
    assert "SplatRenderMode: mip" in read_ply_header(tmp_path / "mip.ply").comments
    back = load_ply(tmp_path / "mip.ply")
    assert back.render_mode == "mip" and back.filter_3D is None
    baked = bake_3d_filter(model)
    torch.testing.assert_close(back.log_scales, baked.log_scales)
    torch.testing.assert_close(back.opacity_logits, baked.opacity_logits)
    assert not torch.allclose(back.log_scales, model.log_scales)

    model.render_mode, model.filter_3D = "default", None
    save_ply(model, tmp_path / "default.ply")
    assert "SplatRenderMode: default" in read_ply_header(tmp_path / "default.ply").comments
    back = load_ply(tmp_path / "default.ply")
    assert back.render_mode == "default"
    assert torch.equal(back.log_scales, model.log_scales)


def test_ply_without_or_with_unknown_comment(rng, tmp_path):
    from plyfile import PlyData, PlyElement

    from rigel_core.io.ply import model_to_ply_array

    model = mip_model(rng, dtype=torch.float32)
    arr = model_to_ply_array(model)
    PlyData([PlyElement.describe(arr, "vertex")], byte_order="<").write(str(tmp_path / "plain.ply"))
    assert load_ply(tmp_path / "plain.ply").render_mode == "default"
    PlyData([PlyElement.describe(arr, "vertex")], byte_order="<",
            comments=["Exported from elsewhere", "SplatRenderMode: MIP"]).write(str(tmp_path / "upper.ply"))
    assert load_ply(tmp_path / "upper.ply").render_mode == "mip"
    PlyData([PlyElement.describe(arr, "vertex")], byte_order="<",
            comments=["SplatRenderMode: 2dgs"]).write(str(tmp_path / "odd.ply"))
    with pytest.warns(SceneWarning, match=r"odd\.ply: unknown 'SplatRenderMode: 2dgs'"):
        assert load_ply(tmp_path / "odd.ply").render_mode == "default"


# ---- training in the mip mode ---------------------------------------------------------------------------------
@pytest.mark.usefixtures("one_thread")
def test_trainer_mip_mode_filter_densify_checkpoint_export(rng, tmp_path):
    """The 3D filter follows the Gaussians through densification, lives in checkpoints (and their reload), and
    export bakes it under a 'SplatRenderMode: mip' header."""
    from test_trainer import make_dataset, small_config

    from rigel_core.checkpoint import load_checkpoint_model
    from rigel_core.train import Trainer

    ds = make_dataset(rng, n_gauss=40, size=16, n_train=4, n_test=1)
    tr = Trainer(ds, small_config(iterations=30, init_points=100, densify_from=5, densify_interval=10,
                                  densify_until=30, grad_threshold=1e-6, render_mode="mip"), device="cpu")
    m = tr.model
    assert m.render_mode == "mip" and m.filter_3D is not None and m.filter_3D.shape == (m.num_gaussians,)
    torch.testing.assert_close(m.filter_3D, compute_filter_3d(m.means3D, [f.camera for f in tr.train_frames]))
    n0, densified = m.num_gaussians, False
    for _ in range(30):
        r = tr.step()
        densified |= r.densify is not None and tr.model.num_gaussians != n0
        assert tr.model.filter_3D.shape == (tr.model.num_gaussians,)
    assert densified, "the run densified, so the filter was recomputed for a new N"
    assert tr.model.log_scales.grad is None  # the filter is not a trained tensor
    tr.save_checkpoint(tmp_path / "ck.safetensors")
    back = load_checkpoint_model(tmp_path / "ck.safetensors")
    assert back.render_mode == "mip" and torch.equal(back.filter_3D, tr.model.filter_3D)
    tr.export_ply(tmp_path / "model.ply")
    loaded = load_ply(tmp_path / "model.ply")
    assert loaded.render_mode == "mip" and loaded.filter_3D is None
    cam = ds.test[0].camera
    torch.testing.assert_close(render(loaded, cam).image, render(tr.model, cam).image, rtol=0, atol=2e-5)
    assert (render(tr.model, cam, render_mode="default").image - render(tr.model, cam).image).abs().max() > 1e-4
    with pytest.raises(ValueError, match="TrainConfig.render_mode must be 'default' or 'mip'"):
        small_config(render_mode="aa").validate()


@pytest.mark.usefixtures("one_thread")
def test_rigel_train_render_mode_flag(rng, tmp_path):
    from rigel_core.cli.train import main
    from rigel_core.data import make_dataset as make_procedural
    from rigel_core.io import load_scene

    data = tmp_path / "data"
    make_procedural(data, 100, 16, 16, n_train=3, n_test=1, seed=int(torch.randint(0, 1000, (1,), generator=rng)),
                    device="cpu", progress=False)
    run = tmp_path / "run"
    assert main(["--data", str(data), "--out", str(run), "--device", "cpu", "--quiet", "--init-points", "60",
                 "--iters", "3", "--eval-every", "0", "--n-renders", "0", "--render-mode", "mip"]) == 0
    assert "SplatRenderMode: mip" in read_ply_header(run / "model.ply").comments
    assert load_scene(run / "model.ply").render_mode == "mip"
    import json

    assert json.loads((run / "metrics.json").read_text())["config"]["render_mode"] == "mip"


def test_viewer_follows_the_scene_mode_and_its_toggle(rng):
    """The viewer starts in the scene's mode, the Render panel's checkbox (settings.render_mode) re-renders in the
    other one, and the frame is the library's render in that mode (Vulkan: lavapipe in CI)."""
    test_viewer = pytest.importorskip("test_viewer")
    if not test_viewer.VK_OK:
        pytest.skip(f"no usable Vulkan device: {test_viewer.VK_REASON}")
    pytest.importorskip("imgui_bundle", reason="the viewer's UI package imgui-bundle is not installed")
    from viewer.app import Viewer
    from viewer.model_slot import ModelSlot
    from viewer.ui import ViewSettings

    model = test_viewer.tiny_model(rng, 200)
    model.render_mode = "mip"
    model.filter_3D = torch.full((200,), 1e-3)
    with Viewer(ModelSlot(model, iteration=0), size=(96, 64), device="cpu", offscreen=True,
                settings=ViewSettings(render_scale=1.0)) as v:
        v.step()
        assert v.settings.render_mode == "mip"
        renders = v.stats.renders
        v.settings.render_mode = "default"
        v.step()
        assert v.stats.renders > renders


def test_cli_unknown_render_mode_warns_in_one_line(rng, tmp_path):
    """``comment SplatRenderMode: banana``: rigel-render renders the file in the default mode and says so in one
    ``rigel-render: warning:`` line naming the file, not Python's warning report with its source line
    (fresh-user finding; rigel-viewer already printed its warnings so)."""
    import subprocess
    import sys
    from pathlib import Path

    from plyfile import PlyData, PlyElement

    from rigel_core.data import orbit_transforms
    from rigel_core.io.ply import model_to_ply_array

    model = mip_model(rng, dtype=torch.float32)
    PlyData([PlyElement.describe(model_to_ply_array(model), "vertex")], byte_order="<",
            comments=["SplatRenderMode: banana"]).write(str(tmp_path / "banana.ply"))
    orbit_transforms((0, 0, 0), 6.0, 1, 12, 8, 55.0, out=tmp_path / "transforms.json")
    root = Path(__file__).resolve().parents[1]
    r = subprocess.run([sys.executable, "-m", "rigel_core.cli.render", str(tmp_path / "banana.ply"), "--cameras",
                        str(tmp_path / "transforms.json"), "--out", str(tmp_path / "r"), "--device", "cpu"],
                       cwd=root, env={**__import__("os").environ, "PYTHONPATH": str(root)}, capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    lines = [ln for ln in r.stderr.splitlines() if ln.strip() and not ln.startswith("rendering ")]   # tqdm
    assert lines == [f"rigel-render: warning: {tmp_path / 'banana.ply'}: unknown 'SplatRenderMode: banana' in the "
                     "PLY header; rendering it in the default mode"], r.stderr
    assert len(list((tmp_path / "r").glob("*.png"))) == 1
