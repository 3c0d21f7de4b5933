"""``rigel-render`` end to end on the bundled scene at tiny resolution, and ``orbit_transforms``."""
import argparse
import json
import math

import numpy as np
import pytest
import torch
from PIL import Image

from rigel_core import Camera, render
from rigel_core.cli.render import main, parse_background
from rigel_core.data import default_scene_path, orbit_cameras, orbit_transforms, read_transforms

io = pytest.importorskip("rigel_core.io")


def read_png(path) -> np.ndarray:
    return np.asarray(Image.open(path), dtype=np.float64) / 255.0


@pytest.fixture(scope="module")
def scene():
    return io.load_scene(default_scene_path())


def test_orbit_transforms(tmp_path, rng):
    g = np.random.default_rng(int(torch.randint(0, 2**31 - 1, (1,), generator=rng)))
    center, radius = g.normal(size=3), g.uniform(0.5, 5)
    up = g.normal(size=3)
    meta = orbit_transforms(center, radius, 5, 40, 30, 50.0, up, out=tmp_path / "o" / "transforms.json",
                            elevation_deg=30)
    assert json.loads((tmp_path / "o" / "transforms.json").read_text()) == meta
    specs, missing, total = read_transforms(tmp_path / "o" / "transforms.json", require_images=False)
    assert (missing, total) == ([], 5) and [s.name for s in specs] == [f"orbit_{i:03d}" for i in range(5)]
    u = up / np.linalg.norm(up)
    for s in specs:
        cam = s.camera
        assert (cam.width, cam.height) == (40, 30)
        assert cam.fx == pytest.approx(20 / math.tan(math.radians(25))) and cam.fy == pytest.approx(cam.fx)
        d = cam.campos - center
        assert np.linalg.norm(d) == pytest.approx(radius)
        assert np.dot(d, u) / radius == pytest.approx(math.sin(math.radians(30)))  # elevation above the plane ⟂ up
        np.testing.assert_allclose(cam.project(center[None])[0], [20, 15], atol=1e-9)  # looks at the centre
        above = cam.project((center + 0.1 * radius * u)[None])[0]
        assert above[1] < 15  # "up" is up in the image (smaller row)
    azim = [np.arctan2(*(s.camera.campos - center)[:2]) for s in specs]
    assert len({round(a, 6) for a in azim}) == 5
    with pytest.raises(ValueError):
        orbit_cameras(center, 0.0, 3, 8, 8, 40.0)


def test_render_default_scene(tmp_path, scene, capsys):
    cams = tmp_path / "transforms.json"
    orbit_transforms((0, 0, 0), 9.0, 3, 24, 16, 55.0, out=cams, elevation_deg=25)
    out = tmp_path / "out"
    assert main(["default", "--cameras", str(cams), "--out", str(out), "--device", "cpu"]) == 0
    names = sorted(p.name for p in out.iterdir())
    assert names == ["orbit_000.png", "orbit_001.png", "orbit_002.png"]
    ref_cams = orbit_cameras((0, 0, 0), 9.0, 3, 24, 16, 55.0, elevation_deg=25)
    img = read_png(out / "orbit_001.png")
    assert img.shape == (16, 24, 3)
    ref = render(scene, ref_cams[1]).image.double().numpy()
    assert np.abs(img - ref).max() <= 0.5 / 255 + 1e-6
    assert ref.max() > 0.3  # something is in view

    # the rendered PNGs are never replaced without --force: one line, before anything is rendered, exit 2 (a
    # refusal, as rigel-convert's and rigel-import-colmap's; it was 1)
    before = (out / "orbit_001.png").read_bytes()
    capsys.readouterr()
    assert main(["default", "--cameras", str(cams), "--out", str(out), "--background", "255,255,255",
                 "--device", "cpu"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "orbit_000.png exists (and 2 more)" in err and "--force" in err
    assert (out / "orbit_001.png").read_bytes() == before
    # white background: where nothing is, the PNG is white; --alpha writes RGBA with alpha = 1 − final_T
    assert main(["default", "--cameras", str(cams), "--out", str(out), "--background", "255,255,255",
                 "--device", "cpu", "--force"]) == 0
    r = render(scene, ref_cams[1])
    empty = (r.final_T > 0.999).numpy()
    assert empty.any() and np.all(read_png(out / "orbit_001.png")[empty] > 0.99)
    assert main(["default", "--cameras", str(cams), "--out", str(out), "--alpha", "--device", "cpu", "--force"]) == 0
    rgba = read_png(out / "orbit_001.png")
    assert rgba.shape == (16, 24, 4)
    assert np.abs(rgba[..., 3] - (1 - r.final_T).double().numpy()).max() <= 0.5 / 255 + 1e-6


def test_render_size_override_split_and_blender(tmp_path, scene):
    cams = [Camera.look_at([8 * math.cos(a), 8 * math.sin(a), 3], [0, 0, 0], width=40, height=20, fov_x_deg=50,
                           name=f"view_{i}") for i, a in enumerate(np.linspace(0, 6, 10))]
    # Blender-style file: camera_angle_x only, images absent → the size must be given
    frames = []
    for c in cams:
        c2w = np.linalg.inv(c.viewmat) @ np.diag([1.0, -1, -1, 1])
        frames.append({"file_path": f"./test/{c.name}", "transform_matrix": c2w.tolist()})
    (tmp_path / "transforms_test.json").write_text(json.dumps({"camera_angle_x": cams[0].fov_x, "frames": frames}))
    out = tmp_path / "out"
    assert main(["default", "--cameras", str(tmp_path), "--split", "test", "--out", str(out)]) == 2
    assert main(["default", "--cameras", str(tmp_path / "transforms_test.json"), "--out", str(out),
                 "--width", "20", "--height", "10", "--device", "cpu"]) == 0
    assert len(list(out.glob("*.png"))) == 10
    img = read_png(out / "view_3.png")
    ref = render(scene, cams[3].with_size(20, 10)).image.double().numpy()
    assert img.shape == (10, 20, 3) and np.abs(img - ref).max() <= 0.5 / 255 + 1e-6

    # instant-ngp file with w/h: --width alone keeps the aspect ratio; --split test is the every-8th hold-out
    ngp = tmp_path / "ngp.json"
    ngp.write_text(json.dumps({"w": 40, "h": 20, "fl_x": cams[0].fx, "frames": frames}))
    out2 = tmp_path / "out2"
    assert main(["default", "--cameras", str(ngp), "--split", "test", "--out", str(out2), "--width", "16",
                 "--device", "cpu"]) == 0
    assert sorted(p.name for p in out2.iterdir()) == ["view_0.png", "view_8.png"]
    assert read_png(out2 / "view_8.png").shape == (8, 16, 3)


def test_render_errors(tmp_path, capsys):
    cams = tmp_path / "t.json"
    orbit_transforms((0, 0, 0), 5.0, 2, 8, 8, 50.0, out=cams)
    assert main([str(tmp_path / "missing.ply"), "--cameras", str(cams), "--out", str(tmp_path / "o")]) == 2
    assert "missing.ply" in capsys.readouterr().err
    bad = tmp_path / "bad.ply"
    bad.write_bytes(b"hello")
    assert main([str(bad), "--cameras", str(cams), "--out", str(tmp_path / "o")]) == 2
    assert "bad.ply" in capsys.readouterr().err
    assert main(["default", "--cameras", str(tmp_path / "none.json"), "--out", str(tmp_path / "o")]) == 2
    assert "none.json" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["default", "--cameras", str(cams), "--out", str(tmp_path / "o"), "--background", "1,2"])
    with pytest.raises(SystemExit):
        main(["default", "--cameras", str(cams), "--out", str(tmp_path / "o"), "--width", "0"])
    assert parse_background("0.2,0.5,1") == (0.2, 0.5, 1.0)
    assert parse_background("0,128,255") == (0.0, 128 / 255, 1.0)


@pytest.mark.parametrize("device", ["gpu", "cuda:x", "mps", "cuda"])
@pytest.mark.parametrize("mode", ["cameras", "path"])
def test_render_unusable_device_is_one_line(tmp_path, capsys, monkeypatch, device, mode):
    """A --device that is not cpu/cuda, or cuda without a usable GPU and kernels, is one line naming it, exit 2,
    before the scene loads or anything is written (was a raw torch traceback)."""
    import rigel_core

    monkeypatch.setattr(rigel_core, "cuda_available", lambda: False)   # as on a CPU machine, also on the H200
    cams = tmp_path / "t.json"
    orbit_transforms((0, 0, 0), 5.0, 1, 8, 8, 50.0, out=cams)
    out = tmp_path / "o"
    argv = (["default", "--cameras", str(cams), "--out", str(out)] if mode == "cameras"
            else ["default", "--path", str(tmp_path / "p.json"), "--video", str(tmp_path / "v.mp4")])
    assert main(argv + ["--device", device]) == 2
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1 and "Traceback" not in err and "--device" in lines[0] and device in lines[0], err
    assert not out.exists() and not (tmp_path / "v.mp4").exists()


@pytest.mark.parametrize("text", ["nan,0,0", "0,inf,0", "0.5,0.5,-inf"])
def test_render_non_finite_background_is_refused(text):
    with pytest.raises(argparse.ArgumentTypeError, match="--background"):
        parse_background(text)


def test_render_image_size_caps(tmp_path, capsys):
    """Before: any declared size was rendered (20000² and 1e6² failed in the allocator, 1e300 with OverflowError)."""
    from rigel_core.io import save_ply

    scene = tmp_path / "tiny.ply"
    g = torch.Generator().manual_seed(5)
    save_ply(io_model(g, 4), scene)
    base = Camera.look_at([0, -6, 0], [0, 0, 0], width=8, height=8, fov_x_deg=50)
    c2w = (np.linalg.inv(base.viewmat) @ np.diag([1.0, -1, -1, 1])).tolist()

    def cams(w, h, fl=10.0):   # a focal length of about the image's size: a field of view rigel accepts
        p = tmp_path / f"t_{len(list(tmp_path.glob('t_*')))}.json"
        p.write_text(json.dumps({"w": w, "h": h, "fl_x": fl, "frames": [{"file_path": "v", "transform_matrix": c2w}]}))
        return str(p)

    out = str(tmp_path / "o")
    for w, h, frag in [(20000, 2, "exceeds the limit of 16384 pixels per side"), (1e300, 8, "exceeds the limit"),
                       (10**6, 10**6, "exceeds the limit"), (True, 8, "must be a number, got bool")]:
        p = cams(w, h)
        assert main([str(scene), "--cameras", p, "--out", out, "--device", "cpu"]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and p in err and "frame 0" in err and frag in err, err
    # the override raises the cap per side (and to its square in all)
    p = cams(17000, 1, fl=17000.0)
    assert main([str(scene), "--cameras", p, "--out", out, "--device", "cpu", "--max-image-size", "17000"]) == 0
    assert read_png(tmp_path / "o" / "v.png").shape == (1, 17000, 3)
    # --width/--height are capped too: an argparse error, status 2
    for extra in (["--width", "16385"], ["--height", "20000", "--max-image-size", "19999"],
                  ["--max-image-size", "0"], ["--max-image-size", str(2 ** 21)]):
        with pytest.raises(SystemExit) as e:
            main([str(scene), "--cameras", cams(8, 8), "--out", out, "--device", "cpu", *extra])
        assert e.value.code == 2
    # the aspect-kept size from --width alone is checked as well
    assert main([str(scene), "--cameras", cams(8, 16000, fl=16000.0), "--out", out, "--device", "cpu", "--width", "16",
                 "--max-image-size", "16000"]) == 2
    assert "exceeds" in capsys.readouterr().err


def io_model(g, n):
    from rigel_core import GaussianModel

    r = lambda *s: torch.randn(*s, generator=g, dtype=torch.float64).float()
    return GaussianModel(r(n, 3), r(n, 3) - 2, r(n, 4), r(n), r(n, 1, 3), r(n, 0, 3))


def test_render_out_of_memory_is_one_line(tmp_path, capsys, monkeypatch):
    """A valid scene too large for the machine (a 10 M-splat SPZ under an 8 GB cap) ended in the allocator's
    RuntimeError traceback; now one line and status 1. Other RuntimeErrors still propagate."""
    import importlib

    render_mod = importlib.import_module("rigel_core.renderer.api")  # the module of the function rigel_core.render
    cams = tmp_path / "t.json"
    orbit_transforms((0, 0, 0), 5.0, 1, 8, 8, 50.0, out=cams)

    def fake(msg):
        def f(*a, **k):
            raise RuntimeError(msg)
        return f

    monkeypatch.setattr(render_mod, "render", fake("[enforce fail at alloc_cpu.cpp:127] DefaultCPUAllocator: "
                                                   "can't allocate memory: you tried to allocate 320000000 bytes"))
    assert main(["default", "--cameras", str(cams), "--out", str(tmp_path / "o"), "--device", "cpu"]) == 1
    err = [ln for ln in capsys.readouterr().err.splitlines() if "rigel-render" in ln]
    assert len(err) == 1 and "out of memory rendering view orbit_000" in err[0]
    monkeypatch.setattr(render_mod, "render", fake("a bug"))
    with pytest.raises(RuntimeError, match="a bug"):
        main(["default", "--cameras", str(cams), "--out", str(tmp_path / "o"), "--device", "cpu"])


def _tiny_model(n, at=(0.3, -0.2, 0.1)):
    from rigel_core.model import GaussianModel

    return GaussianModel.from_tensors(torch.tensor([at] * n, dtype=torch.float32).reshape(n, 3),
                                      torch.full((n, 3), -1.0), torch.tensor([[1.0, 0, 0, 0]] * n).reshape(n, 4),
                                      torch.full((n,), 3.0), torch.full((n, 1, 3), 1.0), torch.zeros(n, 15, 3))


@pytest.mark.filterwarnings("ignore:.*0 vertices")
def test_render_empty_and_single_splat_scenes(tmp_path):
    """A valid 0-splat scene renders the background with exit 0 (issue 13); one splat is drawn."""
    cams = tmp_path / "transforms.json"
    orbit_transforms((0, 0, 0), 4.0, 2, 24, 16, 55.0, out=cams, elevation_deg=20)
    bg = (51, 102, 153)
    for name, n in (("zero", 0), ("one", 1)):
        io.save_ply(_tiny_model(n), tmp_path / f"{name}.ply")
        out = tmp_path / name
        assert main([str(tmp_path / f"{name}.ply"), "--cameras", str(cams), "--out", str(out), "--device", "cpu",
                     "--background", ",".join(map(str, bg))]) == 0
        img = read_png(out / "orbit_000.png")
        is_bg = np.all(np.abs(img * 255 - np.array(bg)) < 0.6, axis=-1)
        assert is_bg.all() if n == 0 else not is_bg.all(), name
