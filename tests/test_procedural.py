"""The procedural scene, its dataset renderer, and the bundled default scene.

Geometry is checked against the analytic surfaces (sphere normal, helix tangent, plane normal) with rotations
from the core's independent ``quat_to_rotmat_np``; the dataset's "exact ground truth" claim is checked by
re-rendering the returned scene from the cameras read back through ``load_dataset``.
"""
import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch

from rigel_core import Camera, compute_colors, render
from rigel_core.renderer.camera import quat_to_rotmat_np
from rigel_core.data import default_scene_path, load_dataset, make_scene
from rigel_core.data import procedural as P
from rigel_core.model import sh_to_rgb


def seed_from(rng) -> int:
    return int(torch.randint(0, 2**31 - 1, (1,), generator=rng))


def parts(n):
    a, b = round(n * P.SHARES[0]), round(n * P.SHARES[1])
    return slice(0, a), slice(a, a + b), slice(a + b, n)


def rotmats(model) -> np.ndarray:
    return np.stack([quat_to_rotmat_np(q) for q in model.quats.double().numpy()])


def test_determinism_counts_degrees(rng):
    seed = seed_from(rng)
    a, b = make_scene(900, 3, seed), make_scene(900, 3, seed)
    for name, t in a.parameters().items():
        assert torch.equal(t, getattr(b, name)), name
    c = make_scene(900, 3, seed + 1)
    assert not torch.equal(a.means3D, c.means3D)
    for n in (3, 7, 1001):
        assert make_scene(n, 1, seed).num_gaussians == n
    for deg in range(4):
        m = make_scene(50, deg, seed)
        assert m.sh_degree == deg and m.sh_rest.shape == (50, (deg + 1) ** 2 - 1, 3)
        if deg:
            assert m.sh_rest.abs().max() < 0.1 and (m.sh_rest != 0).all()  # small but non-zero
    for bad in (dict(n=2), dict(n=100, sh_degree=4), dict(n=100, sh_degree=-1)):
        with pytest.raises(ValueError):
            make_scene(**bad)
    m64 = make_scene(20, 2, seed, dtype=torch.float64)
    assert m64.dtype == torch.float64
    np.testing.assert_allclose(m64.means3D.numpy(), make_scene(20, 2, seed).means3D.double().numpy(), atol=1e-6)


def test_surfaces_aligned(rng):
    n = 3000
    m = make_scene(n, 0, seed_from(rng))
    R = rotmats(m)
    means = m.means3D.double().numpy()
    scales = m.scales.double().numpy()
    sph, hel, pla = parts(n)
    # thin axis (local z) is the smallest and points along the surface normal
    assert np.all(scales[:, 2] < 0.3 * scales[:, :2].min(1))
    normal = means[sph] / np.linalg.norm(means[sph], axis=1, keepdims=True)
    np.testing.assert_allclose(np.linalg.norm(means[sph], axis=1), P.SPHERE_RADIUS, atol=1e-5)
    assert np.all(np.abs(np.einsum("ni,ni->n", R[sph, :, 2], normal)) > 0.9999)
    assert np.all(np.abs(R[pla, 2, 2]) > 0.9999) and np.allclose(means[pla, 2], P.PLANE_Z, atol=1e-6)
    assert np.all(np.abs(means[pla, :2]) <= P.PLANE_HALF + 1e-6)
    # helix: the longest axis follows the curve's tangent (phase from the mean's azimuth; tube offset is small)
    phase = np.arctan2(means[hel, 1], means[hel, 0])
    dz = (P.HELIX_Z[1] - P.HELIX_Z[0]) / (2 * math.pi * P.HELIX_TURNS)
    tangent = np.stack([-P.HELIX_RADIUS * np.sin(phase), P.HELIX_RADIUS * np.cos(phase), np.full_like(phase, dz)], 1)
    tangent /= np.linalg.norm(tangent, axis=1, keepdims=True)
    assert np.all(np.argmax(scales[hel], 1) == 0)
    assert np.all(np.abs(np.einsum("ni,ni->n", R[hel, :, 0], tangent)) > 0.995)
    r_axis = np.hypot(means[hel, 0], means[hel, 1])
    assert np.all(np.abs(r_axis - P.HELIX_RADIUS) <= P.HELIX_TUBE + 1e-5)
    # three turns: the unwrapped azimuth, in order of height, spans just under 3 × 2π (random ends). Its extremes, not
    # its first and last: the tube's offset moves a mean's height by up to HELIX_TUBE, ~0.08 turns of the helix's
    # rise, so the lowest mean need not be the one nearest the helix's start (2.89 turns seen at RIGEL_SEED=3695270659)
    order = np.argsort(means[hel, 2])
    unwrapped = np.unwrap(phase[order])
    span = (unwrapped.max() - unwrapped.min()) / (2 * math.pi)
    assert P.HELIX_TURNS - 0.1 < span < P.HELIX_TURNS + 0.05
    # sphere colour is 0.5 + 0.4·normal
    np.testing.assert_allclose(sh_to_rgb(m.sh_dc[sph, 0]).double().numpy(), 0.5 + 0.4 * normal, atol=1e-5)
    # plane: two checker colours, by cell parity
    cell = (np.floor(means[pla, 0] / P.CHECKER) + np.floor(means[pla, 1] / P.CHECKER)).astype(int) % 2
    rgb = sh_to_rgb(m.sh_dc[pla, 0]).double().numpy()
    assert np.ptp(rgb[cell == 0], axis=0).max() < 1e-5 and np.ptp(rgb[cell == 1], axis=0).max() < 1e-5
    assert np.abs(rgb[cell == 0][0] - rgb[cell == 1][0]).max() > 0.5


def test_rotmat_to_quat_all_branches(rng):
    g = np.random.default_rng(seed_from(rng))
    q = g.normal(size=(400, 4))
    q[0:100, 0] += 5  # w dominant
    q[100:200, 1] += 5  # x dominant (rotation near 180° about x)
    q[200:300, 2] += 5
    q[300:400, 3] += 5
    q /= np.linalg.norm(q, axis=1, keepdims=True)
    R = np.stack([quat_to_rotmat_np(x) for x in q])
    back = P.rotmat_to_quat(R)
    np.testing.assert_allclose(np.abs(np.einsum("ni,ni->n", back, q)), 1.0, atol=1e-12)  # q and −q are one rotation
    assert np.all(back[:, 0] >= 0)


def test_view_dependence_bounded(rng):
    m = make_scene(300, 3, seed_from(rng))
    a = Camera.look_at([8, 0, 2], [0, 0, 0])
    b = Camera.look_at([0, -8, 2], [0, 0, 0])
    ca, cb = compute_colors(m, a), compute_colors(m, b)
    assert (ca - cb).abs().max() > 0.01
    # from many directions, colours stay within SH_BAND_SHIFT per degree of the base colour, inside (0, 1)
    g = torch.Generator().manual_seed(seed_from(rng))
    base = sh_to_rgb(m.sh_dc[:, 0])
    for d in torch.nn.functional.normalize(torch.randn(20, 3, generator=g), dim=1):
        c = compute_colors(m, Camera.look_at((d * 9).tolist(), [0, 0, 0.05], (0.3, 0.1, 1.0)))
        assert (c - base).abs().max() <= 3 * P.SH_BAND_SHIFT + 1e-5
        assert c.min() > 0 and c.max() < 1
    m0 = m.with_sh_degree(0)
    assert torch.allclose(compute_colors(m0, a), compute_colors(m0, b))


def test_make_dataset_ground_truth(tmp_path, rng):
    seed = seed_from(rng) % 1000
    calls = []

    def counting_render(model, cam, background=None):
        calls.append(cam.name)
        return render(model, cam, background=background)

    model = P.make_dataset(tmp_path, 500, 32, 24, n_train=3, n_test=2, seed=seed, renderer=counting_render,
                           sh_degree=2, progress=False)
    assert len(calls) == 5 and model.num_gaussians == 500 and model.sh_degree == 2
    for split, n in (("train", 3), ("test", 2)):
        meta = json.loads((tmp_path / f"transforms_{split}.json").read_text())
        assert len(meta["frames"]) == n and meta["frames"][0]["file_path"] == f"./{split}/r_0"
        assert all((tmp_path / split / f"r_{i}.png").is_file() for i in range(n))
    assert (tmp_path / "scene.ply").is_file()
    for white in (False, True):
        ds = load_dataset(tmp_path, white_bg=white)
        assert len(ds.train) == 3 and len(ds.test) == 2
        for frame in ds.train + ds.test:
            assert frame.image.shape == (24, 32, 3)
            bg = torch.full((3,), float(white))
            r = render(model, frame.camera, background=bg)
            # straight-alpha 8-bit PNG: colour and alpha each rounded by ≤ 0.5/255 → ≤ 1/255 after compositing
            assert (frame.image - r.image).abs().max() <= 1 / 255 + 1e-5
            assert (frame.alpha - (1 - r.final_T)).abs().max() <= 0.5 / 255 + 1e-5
            assert frame.alpha.max() > 0.5  # the scene is in view
    # test views: an orbit at one elevation and distance; train views from other directions
    test_c = np.stack([f.camera.campos for f in ds.test])
    np.testing.assert_allclose(np.linalg.norm(test_c, axis=1), 2.3 * P.SCENE_RADIUS, rtol=1e-6)
    np.testing.assert_allclose(test_c[:, 2], 2.3 * P.SCENE_RADIUS * math.sin(math.radians(25)), rtol=1e-6)
    train_c = np.stack([f.camera.campos for f in ds.train])
    assert np.all(np.abs(np.linalg.norm(train_c, axis=1) / (2.3 * P.SCENE_RADIUS) - 1) <= 0.1 + 1e-9)
    assert np.linalg.norm(train_c[0] - train_c[1]) > 1e-3


def test_make_dataset_cli(tmp_path):
    import rigel_core.data
    from rigel_core.data.make_dataset import main

    assert main(["--out", str(tmp_path), "--res", "16", "--train", "2", "--test", "1", "--gaussians", "200",
                 "--device", "cpu"]) == 0
    ds = load_dataset(tmp_path)
    assert len(ds.train) == 2 and len(ds.test) == 1 and ds.train[0].image.shape == (12, 16, 3)
    # importing the CLI module must not hide the function of the same name
    assert callable(rigel_core.data.make_dataset)
    with pytest.raises(SystemExit):
        main(["--out", str(tmp_path), "--gaussians", "2"])


def test_default_scene():
    io = pytest.importorskip("rigel_core.io")
    path = default_scene_path()
    assert path.is_file() and path.stat().st_size < 1_000_000
    scene = io.load_scene(path)
    assert 1000 <= scene.num_gaussians <= 10_000 and 1 <= scene.sh_degree <= 3
    # it is what assets/make_default_scene.py says it is (float32 in the file; libm may differ in the last ulp)
    import importlib.util

    spec = importlib.util.spec_from_file_location("mds", path.parents[2] / "assets" / "make_default_scene.py")
    mds = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mds)
    ref = make_scene(mds.N_GAUSSIANS, sh_degree=mds.SH_DEGREE, seed=mds.SEED)
    for name, t in ref.parameters().items():
        torch.testing.assert_close(getattr(scene, name), t, rtol=1e-5, atol=1e-6, msg=name)


@pytest.mark.gpu
def test_make_dataset_cuda_matches_cpu(tmp_path):
    """The same dataset rendered by the CUDA kernels and re-rendered by the CPU reference: within a few 8-bit levels
    (float32 kernels vs the reference differ by ~1e-5; the PNG rounding adds ≤ 1/255)."""
    model = P.make_dataset(tmp_path, 3000, 64, 48, n_train=2, n_test=1, seed=3, device="cuda", progress=False)
    assert model.device.type == "cuda"
    ds = load_dataset(tmp_path)
    cpu = model.to("cpu")
    for frame in ds.train + ds.test:
        ref = render(cpu, frame.camera).image
        assert (frame.image - ref).abs().max() <= 2 / 255


def test_make_dataset_writers_write_the_same_files(tmp_path, rng, monkeypatch):
    """PNGs encoded by several threads while the next views render: the same files as written in turn, and a
    write's error surfaces (no transforms file naming images that were not written)."""
    seed = seed_from(rng) % 1000
    for writers in (1, 3):
        P.make_dataset(tmp_path / str(writers), 300, 24, 16, n_train=7, n_test=2, seed=seed, sh_degree=1,
                       progress=False, writers=writers)
    one, three = tmp_path / "1", tmp_path / "3"
    names = sorted(p.relative_to(one) for p in one.rglob("*.png"))
    assert len(names) == 9 and names == sorted(p.relative_to(three) for p in three.rglob("*.png"))
    for n in names + [Path("transforms_train.json"), Path("transforms_test.json")]:
        assert (one / n).read_bytes() == (three / n).read_bytes(), n
    import rigel_core.data.images as images

    def failing(path, image, final_T):
        if path.name == "r_4.png":
            raise OSError(f"{path}: disk full")
        return write(path, image, final_T)

    write = images.write_render_rgba
    monkeypatch.setattr(images, "write_render_rgba", failing)
    with pytest.raises(OSError, match="r_4.png: disk full"):
        P.make_dataset(tmp_path / "fail", 300, 24, 16, n_train=7, n_test=2, seed=seed, progress=False, writers=3)
    assert not (tmp_path / "fail" / "transforms_train.json").exists()
