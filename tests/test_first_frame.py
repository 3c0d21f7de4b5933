"""The viewer's first frame before ``import torch`` (issue 18: the first frame on the CPU within 2 s; viewer/loading.py).

A fresh ``rigel-viewer`` process on the CPU must present its loading frame while torch is still not imported, then
the scene's renders; the modules on that path import no torch; the numpy preview projects as rigel's Camera does;
and ``rigel_core.render`` stays the function although the package now loads its torch names lazily.
"""
from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from test_vulkan import VK_OK, VK_REASON, display  # noqa: F401

ROOT = Path(__file__).resolve().parents[1]
needs_viewer = pytest.mark.skipif(not VK_OK or importlib.util.find_spec("imgui_bundle") is None,
                                  reason=f"no usable Vulkan device or imgui-bundle: {VK_REASON}")

# Every present of the process, with whether torch was imported at that moment (the engine's Presenter.present,
# which the loading frame and the frame loop both go through).
CHILD = r"""
import json, sys
import viewer.gpu.presenter as P
_present = P.Presenter.present
seen = []
def present(self, *a, **k):
    p = _present(self, *a, **k)
    if p is not None:
        seen.append("torch" in sys.modules)
    return p
P.Presenter.present = present
from viewer.cli import main
rc = main(sys.argv[1:])
print("PRESENTS " + json.dumps(seen))
sys.exit(rc)
"""


def _env(**extra):
    return dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""), **extra)


def _python(code: str, *args: str) -> str:
    """Run ``code`` in a fresh interpreter (the test environment); its stdout. Fails the test on a non-zero exit,
    with the end of its stderr."""
    out = subprocess.run([sys.executable, "-c", code, *args], env=_env(), capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, " ".join(args) + ": " + out.stderr[-2000:]
    return out.stdout


def _presents(args, tmp_path):
    out = subprocess.run([sys.executable, "-c", CHILD, *args], env=_env(XDG_CONFIG_HOME=str(tmp_path)),
                         capture_output=True, text=True, timeout=240, cwd=tmp_path)
    line = next((ln for ln in out.stdout.splitlines() if ln.startswith("PRESENTS ")), None)
    assert out.returncode == 0 and line is not None, out.stdout[-2000:] + out.stderr[-2000:]
    return json.loads(line.split(" ", 1)[1])


@needs_viewer
def test_window_presents_before_torch_is_imported(display, tmp_path):  # noqa: F811
    """rigel-viewer (the bundled scene, --device cpu, a window under Xvfb): the first present happens with torch not
    imported, and the scene's own frame (--frames 1) follows with torch imported."""
    seen = _presents(["--device", "cpu", "--threads", "1", "--frames", "1", "--size", "320x200"], tmp_path)
    assert len(seen) >= 2, seen
    assert seen[0] is False, "torch was imported before the first present"
    assert seen[-1] is True            # the scene's render came after the import


@needs_viewer
def test_offscreen_and_cuda_paths_load_first(tmp_path):
    """--offscreen keeps the old order (the scene first; no loading frame is written): every present has torch,
    and the run writes its frames as before."""
    seen = _presents(["--offscreen", "--out", str(tmp_path / "o"), "--frames", "1", "--device", "cpu",
                      "--size", "160x100"], tmp_path)
    assert seen and all(seen)
    assert (tmp_path / "o" / "frame_0000.png").is_file()


def test_modules_before_the_first_present_import_no_torch():
    """Everything ``rigel-viewer`` imports up to the loading frame, in a fresh interpreter: no torch (one eager
    ``import torch`` at the top of any of these modules costs the 2 s target)."""
    code = ("import sys\n"
            "import viewer.cli, viewer.app, viewer.loading, viewer.offscreen, viewer.gpu.frame_ring, "
            "viewer.gpu.presenter, viewer.gpu.targets\n"
            "import rigel_core.cli.common, rigel_core.camera_path, rigel_core.run_dir, rigel_core.train.config, "
            "rigel_core.train.strategy_table, viewer.messages, viewer.panels.training, rigel_core.io.ply\n"
            "import rigel_core.io as rio\n"
            "assert rio.read_ply_header and rio.SceneWarning and rio.PlyFormatError   # its torch-free names\n"
            "viewer.cli.build_parser().parse_args([])\n"
            "print(sorted(m for m in sys.modules if m == 'torch' or m.startswith('torch.')))\n")
    out = _python(code)
    assert out.strip() == "[]", out[-500:]


def test_rigel_core_render_is_the_function_whichever_import_comes_first():
    """The package loads Camera, GaussianModel, render … on first use; importing the submodule rigel_core.render
    first must not leave the package's ``render`` as the module (``rigel_core.render(model, cam)``,
    ``from rigel_core import render``)."""
    code = ("import types\n"
            "from rigel_core.render import compute_colors\n"      # the submodule first
            "import rigel_core\n"
            "from rigel_core import render, Camera, GaussianModel\n"
            "import rigel_core.render as again\n"
            "assert not isinstance(render, types.ModuleType) and callable(render), render\n"
            "assert rigel_core.render is render and again is render\n"
            "import sys; assert sys.modules['rigel_core.render'].render is render\n"
            "assert rigel_core.compute_colors is compute_colors\n"
            "try:\n    rigel_core.no_such_name\nexcept AttributeError as e:\n    print('ok', e)\n")
    out = _python(code)
    assert out.startswith("ok") and "no_such_name" in out


def test_rigel_core_submodules_are_attributes_after_import_rigel_core():
    """``import rigel_core; rigel_core.camera`` gives the submodule (every one found in the source tree, in a random
    order in a fresh interpreter, most of them not imported yet when asked for), as the eager imports once made it;
    ``rigel_core.render`` stays the function; ``dir(rigel_core)`` lists the public names and submodules (without
    importing torch) and not the private ones; an unknown name is still an AttributeError."""
    pkg = ROOT / "rigel_core"
    subs = sorted({p.stem for p in pkg.glob("*.py")} | {p.parent.name for p in pkg.glob("*/__init__.py")}
                  | {"render", "camera", "cuda_backend", "mip", "render_modes", "render_output", "appearance"})  # moved
    subs = [m for m in subs if not m.startswith("_")]
    assert {"camera", "model", "io", "render", "run_dir"} <= set(subs)
    np.random.default_rng().shuffle(subs)
    code = ("import sys, types\n"
            "import rigel_core\n"
            "names = dir(rigel_core)\n"
            "assert 'torch' not in sys.modules\n"
            "print('DIR', ' '.join(names))\n"
            "fresh = 0\n"
            "for name in sys.argv[1:]:\n"
            "    fresh += f'rigel_core.{name}' not in sys.modules\n"
            "    got = getattr(rigel_core, name)\n"
            "    if name == 'render':\n"
            "        assert callable(got) and not isinstance(got, types.ModuleType), got\n"
            "        assert sys.modules['rigel_core.renderer.api'].render is got\n"
            "    else:\n"
            "        assert got is sys.modules[f'rigel_core.{name}'], (name, got)\n"
            "assert not hasattr(rigel_core, 'no_such_submodule')\n"
            "print('FRESH', fresh)\n")
    lines = dict(ln.split(" ", 1) for ln in _python(code, *subs).splitlines() if ln[:4] in ("DIR ", "FRES"))
    assert int(lines["FRESH"]) >= 1
    listed = set(lines["DIR"].split())
    import rigel_core

    assert set(subs) | set(rigel_core.__all__) | {"__version__"} <= listed
    assert not {n for n in listed if n.startswith("_") and not n.startswith("__")}, listed


def test_the_render_stacks_old_paths_are_its_modules():
    """The render stack moved into rigel_core/renderer/ (issue 36); every old module path imports the very same module
    object (so a patch through either name is seen by both; no file left at the old path), and the public names are
    its objects."""
    import importlib

    import rigel_core

    moved = {"render": "api", "camera": "camera", "cuda_backend": "cuda_backend", "mip": "mip", "render_modes": "modes",
             "render_output": "output", "appearance": "appearance"}
    assert {p.stem for p in (ROOT / "rigel_core" / "renderer").glob("*.py")} == set(moved.values()) | {"__init__"}
    for old, new in moved.items():
        module = importlib.import_module(f"rigel_core.renderer.{new}")
        assert importlib.import_module(f"rigel_core.{old}") is module and module.__name__ == f"rigel_core.renderer.{new}"
        assert module.__spec__.name == module.__name__ and not (ROOT / "rigel_core" / f"{old}.py").exists()
        assert getattr(rigel_core, old) is (module.render if old == "render" else module)
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module("rigel_core.no_such_module")
    from rigel_core.renderer import api, camera, output

    assert rigel_core.render is api.render and rigel_core.Camera is camera.Camera
    assert rigel_core.RenderOutput is output.RenderOutput and rigel_core.renderer.render is api.render


def test_orbit_rotation_is_the_cameras():
    from viewer.camera_control import UP_AXES, OrbitCamera

    rng = np.random.default_rng()
    for up in UP_AXES:
        cam = OrbitCamera(target=rng.normal(size=3), distance=rng.uniform(0.5, 5), yaw=rng.uniform(-3, 3),
                          pitch=rng.uniform(-1.2, 1.2), up=up)
        np.testing.assert_allclose(cam.rotation(), cam.camera(64, 48).viewmat[:3, :3], atol=1e-12)


def test_preview_projects_as_the_camera_and_keeps_the_nearest():
    """project_points against rigel_core's Camera (K @ viewmat, an independent path): each point lands in the
    pixel floor(projection), in its colour blended over the background by its opacity; of two points in one pixel
    the nearer wins; points behind the camera or outside the image are left out."""
    from rigel_core import Camera
    from viewer.loading import project_points

    rng = np.random.default_rng()
    w, h, fov, off = 96, 64, 55.0, rng.uniform(-0.2, 0.2)
    eye, target = rng.normal(size=3) * 3, rng.normal(size=3) * 0.2
    cam = Camera.look_at(eye, target, (0, 0, 1), width=w, height=h, fov_x_deg=fov)
    # points spread in front of the camera: one per pixel cell of a coarse grid, so none share a pixel
    R, t = cam.viewmat[:3, :3], cam.viewmat[:3, 3]
    us, vs = np.meshgrid(np.arange(3, w - 3, 9) + 0.5, np.arange(3, h - 3, 9) + 0.5)
    z = rng.uniform(1.0, 4.0, size=us.size)
    cx = cam.cx + off * w
    pc = np.stack([(us.ravel() - cx) / cam.fx * z, (vs.ravel() - cam.cy) / cam.fy * z, z], -1)
    xyz = (pc - t) @ R                                   # camera → world
    rgb, alpha = rng.uniform(size=(len(z), 3)), rng.uniform(0.2, 1.0, size=len(z))
    behind = eye - 2.0 * (target - eye)                   # behind the camera: projects, but must be dropped
    img = project_points(np.vstack([xyz, behind]), np.vstack([rgb, [[1, 1, 1]]]), np.append(alpha, 1.0),
                         R, eye, fov, off, w, h, background=0.25)
    K = np.array([[cam.fx, 0, cx], [0, cam.fy, cam.cy], [0, 0, 1.0]])
    proj = (K @ (xyz @ R.T + t).T).T
    px = np.floor(proj[:, :2] / proj[:, 2:]).astype(int)
    expect = np.full((h, w, 3), 0.25)
    expect[px[:, 1], px[:, 0]] = alpha[:, None] * rgb + (1 - alpha[:, None]) * 0.25
    np.testing.assert_allclose(img, expect, atol=1e-5)
    # two points on one ray: the nearer one's colour
    d = (xyz[0] - eye) / np.linalg.norm(xyz[0] - eye)
    two = np.stack([eye + 2.0 * d, eye + 1.0 * d])
    img2 = project_points(two, np.array([[1.0, 0, 0], [0, 1.0, 0]]), np.ones(2), R, eye, fov, off, w, h)
    np.testing.assert_allclose(img2[px[0, 1], px[0, 0]], [0, 1, 0])
    assert np.count_nonzero(img2.sum(-1)) == 1


@needs_viewer
def test_loading_frame_then_the_scene_in_one_viewer(one_thread):
    """Offscreen: a viewer opened with an empty slot presents the loading frame (the preview of the bundled scene
    and the text box: not all background), then, given the scene, renders it through the same ring slots (torch
    views after the numpy ones); --frames counting is untouched by the loading frame."""
    from viewer.app import Viewer
    from viewer.loading import adopt_scene, bundled_scene_path, present_loading, scene_preview
    from viewer.model_slot import ModelSlot
    from viewer.scene import default_scene
    from viewer.ui import ViewSettings

    with Viewer(ModelSlot(), offscreen=True, size=(320, 200), device="cpu",
                settings=ViewSettings(render_scale=None)) as v:
        assert v.model is None
        preview = scene_preview(v, bundled_scene_path())
        assert preview is not None and preview.shape[2] == 3 and (preview > 0).any()
        p = present_loading(v, str(bundled_scene_path()), preview, capture=True)
        px = v.read_pixels(p)[..., :3].astype(int)
        assert v.stats.presents == 0
        # the preview's colours fill part of the view; the text box (dark grey, light text) sits in the middle
        assert (px.sum(-1) > 60).mean() > 0.02
        model, name = default_scene()
        adopt_scene(v, model, name, "+z")
        for _ in range(v.ring.k + 1):            # every slot once: numpy views, then torch views of the same memory
            p = v.step(capture=True, force_render=True)
        import torch

        assert isinstance(v.ring.latest.image, torch.Tensor)
        assert v.stats.presents == v.ring.k + 1 and v.stats.scene == name
        assert v.read_pixels(p)[..., :3].any()
    # the empty-slot viewer refuses to step without a model (one clear error, not a crash in the renderer)
    with Viewer(ModelSlot(), offscreen=True, size=(64, 48), device="cpu") as v:
        with pytest.raises(RuntimeError, match="no model"):
            v.step()


def test_early_device():
    from viewer.loading import early_device

    assert early_device("cpu") == "cpu"
    assert early_device("cuda") is None
    try:
        import ctypes

        ctypes.CDLL("libcuda.so.1")
        driver = True
    except OSError:
        driver = False
    assert early_device("auto") == (None if driver else "cpu")


@needs_viewer
@pytest.mark.parametrize("far", [True, False], ids=["crop-far-from-origin", "centred"])
def test_preview_opens_with_the_first_views_up_and_orbit(one_thread, tmp_path, far):
    """The loading preview's camera (up axis, orbit target, direction, distance) is the one the loaded scene opens
    with: a scene far from the origin (a crop of a COLMAP capture) gets "-y" and is looked at from the origin's side
    in both, a centred one "+z" in both (before, the preview always drew "+z")."""
    import torch

    from rigel_core.data import make_scene
    from rigel_core.io import save_ply
    from viewer.app import Viewer
    from viewer.loading import adopt_scene, scene_preview
    from viewer.model_slot import ModelSlot
    from viewer.scene import default_up, load_scene_file
    from viewer.ui import ViewSettings

    rng = np.random.default_rng()
    model = make_scene(n=400, sh_degree=0, seed=int(rng.integers(2**31)))
    if far:   # a random direction, 5–20 box diagonals out
        d = rng.normal(size=3)
        shift = d / np.linalg.norm(d) * rng.uniform(5.0, 20.0) * 2.0 * float((model.bounds(0.01)[1] -
                                                                                model.bounds(0.01)[0]).norm())
        with torch.no_grad():
            model.means3D += torch.as_tensor(shift, dtype=model.means3D.dtype)
    path = tmp_path / "scene.ply"
    save_ply(model, path)

    with Viewer(ModelSlot(), offscreen=True, size=(320, 200), device="cpu",
                settings=ViewSettings(render_scale=None)) as v:
        assert scene_preview(v, path) is not None
        c = v.camera
        seen = (v.settings.up, c.up.copy(), c.target.copy(), c.yaw, c.pitch, c.distance, c.view_offset)
        loaded = load_scene_file(path)
        up = default_up(path, loaded)
        assert up == ("-y" if far else "+z")
        adopt_scene(v, loaded, str(path), up)
        assert seen[0] == v.settings.up == up
        np.testing.assert_array_equal(seen[1], c.up)
        scale = float(np.linalg.norm(c.target)) + c.distance
        np.testing.assert_allclose(seen[2], c.target, atol=1e-5 * scale)
        np.testing.assert_allclose(seen[3:], (c.yaw, c.pitch, c.distance, c.view_offset), rtol=1e-4, atol=1e-6)
    # --up wins in the preview as in the first view
    with Viewer(ModelSlot(), offscreen=True, size=(320, 200), device="cpu",
                settings=ViewSettings(render_scale=None)) as v:
        scene_preview(v, path, "+x")
        assert v.settings.up == "+x" and v.camera.up_name == "+x"


@needs_viewer
@pytest.mark.parametrize("white", [False, True], ids=["black-bg", "white-bg"])
def test_loading_frame_without_a_preview_fills_the_view_with_the_background(tmp_path, white):
    """A scene with nothing to preview (an INRIA PLY whose every value is NaN): the loading frame is the plain
    background over the whole view with the text box in the middle — not a square image letterboxed in the
    window (the 2×2 placeholder, drawn at its own aspect)."""
    from rigel_core.data import make_scene
    from rigel_core.io import save_ply
    from viewer.app import Viewer
    from viewer.loading import present_loading, scene_preview
    from viewer.model_slot import ModelSlot
    from viewer.ui import ViewSettings

    rng = np.random.default_rng()
    n = int(rng.integers(3, 40))
    good = tmp_path / "good.ply"
    save_ply(make_scene(n=n, sh_degree=int(rng.integers(0, 4))), good)
    raw = good.read_bytes()
    head = raw[:raw.index(b"end_header\n") + len(b"end_header\n")]
    assert b"float x" in head and b"double" not in head
    path = tmp_path / "all_nan.ply"
    path.write_bytes(head + np.full((len(raw) - len(head)) // 4, np.nan, "<f4").tobytes())

    w, h = int(rng.integers(300, 480)), int(rng.integers(120, 200))   # wider than tall, as a window
    with Viewer(ModelSlot(), offscreen=True, size=(w, h), device="cpu",
                settings=ViewSettings(render_scale=None, white_background=white)) as v:
        assert scene_preview(v, path) is None
        p = present_loading(v, str(path), None, capture=True)
        px = v.read_pixels(p)[..., :3].astype(int)
    bg = 255 if white else 0
    other = np.nonzero((px != bg).any(-1))
    assert other[0].size, "the text box is drawn"
    top, bottom, left, right = other[0].min(), other[0].max(), other[1].min(), other[1].max()
    # everything not the background is the text box, centred, away from every edge
    assert 0 < top and bottom < h - 1 and 0 < left and right < w - 1, (top, bottom, left, right, w, h)
    assert abs((top + bottom) / 2 - (h - 1) / 2) <= 2 and abs((left + right) / 2 - (w - 1) / 2) <= 2
