"""rigel-viewer, the application: orbit camera, model hand-over, the windowed loop and the offscreen CLI.

Vulkan runs on whatever device is present (CI: lavapipe; windows under Xvfb, started by the ``display`` fixture
of tests/test_vulkan.py when DISPLAY is unset). Scenes are tiny (a few hundred Gaussians) except the one smoke
run on the bundled scene at 96×72, so that the CPU reference renderer keeps the file fast.
"""
import importlib.util
import json
import math
import os
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest
import torch

from test_trainer import blender_dataset  # noqa: F401  (a fixture)
from test_vulkan import VK_OK, VK_REASON, display, no_validation_errors  # noqa: F401  (fixtures)

ROOT = Path(__file__).resolve().parents[1]

from viewer.camera_control import OrbitCamera  # noqa: E402
from viewer.model_slot import ModelSlot  # noqa: E402
from viewer import requests as R  # noqa: E402

needs_vulkan = pytest.mark.skipif(not VK_OK, reason=f"no usable Vulkan device: {VK_REASON}")
needs_ui = pytest.mark.skipif(importlib.util.find_spec("imgui_bundle") is None,
                              reason="the viewer's UI package imgui-bundle is not installed")


def tiny_model(rng, n=300, *, offset=(0.0, 0.0, 0.0)):
    from rigel_core import GaussianModel

    d = torch.randn(n, 3, generator=rng)
    pts = d / d.norm(dim=1, keepdim=True) * torch.rand(n, 1, generator=rng) ** (1 / 3) + torch.tensor(offset)
    return GaussianModel.from_points(pts, torch.rand(n, 3, generator=rng), sh_degree=1, scale=0.12, opacity=0.8)


# ---- camera and model hand-over (no Vulkan) ---------------------------------------------------------------------
def test_orbit_camera_frames_bounds_and_follows_the_mouse(rng):
    center = (torch.rand(3, generator=rng).numpy() - 0.5) * 10
    radius = float(torch.rand(1, generator=rng)) * 5 + 0.1
    for up in ("+z", "-y", "+x"):
        oc = OrbitCamera(up=up, yaw=float(torch.rand(1, generator=rng)) * 6, pitch=0.3)
        oc.frame(center, radius, aspect=4 / 3)
        cam = oc.camera(400, 300)
        d = torch.randn(500, 3, generator=rng).double().numpy()
        sphere = center + radius * d / np.linalg.norm(d, axis=1, keepdims=True)
        uv = cam.project(sphere)
        assert (uv[:, 0] > 0).all() and (uv[:, 0] < 400).all() and (uv[:, 1] > 0).all() and (uv[:, 1] < 300).all()
        assert np.ptp(uv[:, 1]) > 0.6 * 300                      # framed, not lost in the distance
        top = cam.project([center + radius * np.asarray(oc.up)])[0]
        assert top[1] < 150                                     # world up is up in the image

    # A box is fitted tightly: every corner inside 90 % of the half-extent, one corner on that limit.
    lo = center - torch.rand(3, generator=rng).double().numpy() * 3 - 0.05
    hi = center + torch.rand(3, generator=rng).double().numpy() * 3 + 0.05
    oc.frame_box(lo, hi, aspect=2.0)
    cam = oc.camera(400, 200)
    corners = np.array([[(lo, hi)[i >> k & 1][k] for k in range(3)] for i in range(8)])
    uv = cam.project(corners)
    reach = np.maximum(np.abs(uv[:, 0] - 200) / 200, np.abs(uv[:, 1] - 100) / 100)
    assert reach.max() == pytest.approx(0.9, abs=1e-9)
    assert np.allclose(oc.target, (lo + hi) / 2)

    v = oc.version
    oc.orbit(0, 1e6)
    assert oc.pitch == pytest.approx(math.radians(89.0)) and oc.version == v + 1
    oc.orbit(0, -1e6)
    assert oc.pitch == pytest.approx(-math.radians(89.0))
    oc.pitch = 0.2
    dist = oc.distance
    oc.zoom(2)
    assert oc.distance == pytest.approx(dist * 0.81)
    # Pan: the point under the old target moves with the drag, by the same number of pixels.
    before = oc.target.copy()
    oc.pan(30, -20, 400)
    cam = oc.camera(400, 400)
    u, vv = cam.project([before])[0]
    assert (u - 200, vv - 200) == pytest.approx((30, -20), abs=1e-6)
    oc.reset()
    assert np.allclose(oc.target, (lo + hi) / 2)


def _random_unit(rng):
    v = torch.randn(3, generator=rng).double().numpy()
    return v / np.linalg.norm(v)


def test_fly_mode_moves_by_speed_times_time_whatever_the_frame_rate(rng):
    from viewer.camera_control import FLY_FAST, FLY_SLOW, MAX_FLY_DT

    oc = OrbitCamera(up="+z", yaw=float(torch.rand(1, generator=rng)) * 6, pitch=0.2)
    oc.frame(torch.randn(3, generator=rng).numpy(), 2.0)
    oc.fly_speed = float(torch.rand(1, generator=rng)) + 0.5
    t0, e0 = oc.target.copy(), oc.eye.copy()
    fwd = (t0 - e0) / np.linalg.norm(t0 - e0)
    # one 1 s frame and ten 0.1 s frames end at the same place: speed x time
    a = OrbitCamera(up="+z", yaw=oc.yaw, pitch=oc.pitch)
    a.target, a.distance, a.fly_speed = t0.copy(), oc.distance, oc.fly_speed
    b = OrbitCamera(up="+z", yaw=oc.yaw, pitch=oc.pitch)
    b.target, b.distance, b.fly_speed = t0.copy(), oc.distance, oc.fly_speed
    assert a.fly(1.0, forward=1.0)
    for _ in range(10):
        b.fly(0.1, forward=1.0)
    np.testing.assert_allclose(a.eye, b.eye, atol=1e-12)
    np.testing.assert_allclose(a.eye - e0, oc.fly_speed * fwd, atol=1e-12)       # W: along the view, at speed
    # Shift x10, Ctrl x0.1; E goes up the world axis; D to the right in the image; dt is clamped
    for kw, factor in (({"fast": True}, FLY_FAST), ({"slow": True}, FLY_SLOW), ({}, 1.0)):
        c = OrbitCamera(up="+z", yaw=oc.yaw, pitch=oc.pitch)
        c.target, c.distance, c.fly_speed = t0.copy(), oc.distance, oc.fly_speed
        c.fly(0.5, up=1.0, **kw)
        np.testing.assert_allclose(c.target - t0, [0, 0, 0.5 * factor * oc.fly_speed], atol=1e-12)
    d = OrbitCamera(up="+z", yaw=oc.yaw, pitch=oc.pitch)
    d.target, d.distance, d.fly_speed = t0.copy(), oc.distance, oc.fly_speed
    before = d.camera(200, 100).project([t0])[0]
    d.fly(100.0, right=1.0)
    assert np.linalg.norm(d.target - t0) == pytest.approx(MAX_FLY_DT * d.fly_speed)
    assert d.camera(200, 100).project([t0])[0][0] < before[0] - 1                 # the scene slides left
    v = d.version
    assert not d.fly(0.5) and not d.fly(0.0, forward=1.0) and d.version == v       # nothing held: no change


def test_mouse_look_turns_about_the_eye(rng):
    oc = OrbitCamera(up="-y", yaw=float(torch.rand(1, generator=rng)) * 6, pitch=-0.3)
    oc.frame(torch.randn(3, generator=rng).numpy(), 1.0, aspect=1.0)
    eye, target = oc.eye.copy(), oc.target.copy()
    oc.look(25, 0)
    np.testing.assert_allclose(oc.eye, eye, atol=1e-12)
    u, v = oc.camera(100, 100).project([target])[0]
    assert u < 50 - 5 and abs(v - 50) < 1                          # turned right: the old centre moved left
    oc.look(0, 25)
    np.testing.assert_allclose(oc.eye, eye, atol=1e-12)
    assert oc.camera(100, 100).project([target])[0][1] < v - 5     # looked down: it moved up


def _look_at_cams(rng, focus, n, up=(0.0, 0.0, 1.0), jitter=0.0):
    from rigel_core import Camera

    cams = []
    for i in range(n):
        d = _random_unit(rng)
        if abs(d @ np.asarray(up)) > 0.9:
            d = np.cross(d, up)
            d /= np.linalg.norm(d)
        eye = focus + (3.0 + float(torch.rand(1, generator=rng))) * d
        aim = focus + jitter * torch.randn(3, generator=rng).double().numpy()
        cams.append(Camera.look_at(eye, aim, up, width=64 + 2 * i, height=48, fov_x_deg=40 + i, name=f"c{i}"))
    return cams


def test_snap_to_training_cameras_shows_them_exactly(rng):
    from viewer.camera_control import focus_of_cameras, nearest_camera, up_from_cameras

    focus = torch.randn(3, generator=rng).double().numpy()
    cams = _look_at_cams(rng, focus, 6)
    np.testing.assert_allclose(focus_of_cameras(cams), focus, atol=1e-9)   # every axis passes through it
    assert up_from_cameras(cams) == "+z"
    assert up_from_cameras(_look_at_cams(rng, focus, 4, up=(0.0, -1.0, 0.0))) == "-y"

    oc = OrbitCamera(up="+z")
    oc.frame_cameras(cams, index=2)
    np.testing.assert_allclose(oc.target, focus, atol=1e-9)
    dists = [np.linalg.norm(c.campos - focus) for c in cams]
    assert oc.distance == pytest.approx(np.median(dists))                   # at the cameras' distance,
    d = cams[2].campos - focus                                              # from view 2's direction
    np.testing.assert_allclose(oc.eye, focus + oc.distance * d / np.linalg.norm(d), atol=1e-9)
    k = nearest_camera(cams, cams[4].campos + 1e-3)
    assert k == 4
    oc.snap_to(cams[k], pivot=focus)
    assert oc.snapped is cams[4]
    c = oc.camera(cams[4].width * 2, cams[4].height * 2)
    np.testing.assert_allclose(c.viewmat, cams[4].viewmat)
    assert (c.fx, c.cx) == pytest.approx((2 * cams[4].fx, 2 * cams[4].cx))
    # the orbit state behind the snapped view is the same pose (no roll in look_at cameras)
    oc.snapped = None
    np.testing.assert_allclose(oc.eye, cams[4].campos, atol=1e-9)
    np.testing.assert_allclose(oc.camera(64, 48).viewmat, cams[4].viewmat, atol=1e-9)
    oc.snap_to(cams[1], pivot=focus)
    oc.orbit(3, 0)                                                           # any move leaves the exact view
    assert oc.snapped is None
    with pytest.raises(ValueError):
        nearest_camera([], (0, 0, 0))


def test_framing_beside_a_panel_centres_the_box_in_the_free_columns(rng):
    lo = torch.randn(3, generator=rng).double().numpy()
    hi = lo + torch.rand(3, generator=rng).double().numpy() * 2 + 0.1
    oc = OrbitCamera(up="+z", yaw=float(torch.rand(1, generator=rng)) * 6, pitch=0.3)
    W, H, u0 = 640, 360, 0.35
    oc.frame_box(lo, hi, aspect=W / H, region=(u0, 1.0))
    assert oc.view_offset == pytest.approx((u0 + 1.0) / 2 - 0.5)
    cam = oc.camera(W, H)
    corners = np.array([[(lo, hi)[i >> k & 1][k] for k in range(3)] for i in range(8)])
    uv = cam.project(corners)
    cu = (u0 + 1.0) / 2 * W                                        # the free columns' centre
    reach = np.maximum(np.abs(uv[:, 0] - cu) / ((1 - u0) * W / 2), np.abs(uv[:, 1] - H / 2) / (H / 2))
    assert reach.max() == pytest.approx(0.9, abs=1e-9)            # tight, inside the free columns
    assert cam.project([oc.target])[0] == pytest.approx((cu, H / 2))
    assert oc.camera(W, H, offset=0.0).cx == W / 2                 # side-by-side / video: no shift
    # facing a point: the eye moves to its side, the pitch is kept
    far = oc.target + np.array([0.0, -50.0, 3.0])
    oc.face(far)
    assert oc.pitch == pytest.approx(0.3)
    d = oc.eye - oc.target
    assert d[1] < 0 and abs(d[0]) < 1e-9 * np.linalg.norm(d) + 1e-12


def test_default_up_axis_of_scene_files(shared_data, tmp_path):
    from viewer.scene import default_up, load_scene_file

    assert default_up(shared_data / "compressed" / "biker.spz") == "-y"           # y-up tools (RUB)
    assert default_up(shared_data / "compressed" / "guitar.compressed.ply") == "-y"
    donut = shared_data / "ply" / "donut_mipsplatting_sh0.ply"
    assert default_up(donut, load_scene_file(donut)) == "+z"                     # a Blender object at the origin
    fruit = shared_data / "ply" / "fruit_drops_minimal_sh3.ply"
    assert default_up(fruit, load_scene_file(fruit)) == "-y"                     # a crop far from the origin
    junk = tmp_path / "x.ply"
    junk.write_bytes(b"ply\nnot really")
    assert default_up(junk) == "+z"                                                # the loader reports it, not this


def test_model_slot_hands_over_snapshots_between_threads():
    slot = ModelSlot()
    assert slot.latest() is None
    seen = []
    done = threading.Event()

    def producer():
        for i in range(300):
            slot.publish({"id": i}, iteration=i)
        done.set()

    t = threading.Thread(target=producer)
    t.start()
    while not done.is_set() or not seen or seen[-1][0] != 300:
        s = slot.latest()
        if s is not None and (not seen or s.version != seen[-1][0]):
            seen.append((s.version, s.model["id"], s.info["iteration"]))
    t.join()
    versions = [v for v, _, _ in seen]
    assert versions == sorted(set(versions)) and versions[-1] == 300
    assert all(m == v - 1 and it == v - 1 for v, m, it in seen)   # model and info always from the same publish


# ---- the command line --------------------------------------------------------------------------------------------
@needs_vulkan
def test_offscreen_cli_on_the_bundled_scene(tmp_path):
    from PIL import Image

    from test_vulkan import VALIDATION
    from viewer.cli import main

    out = tmp_path / "out"
    args = ["--offscreen", "--frames", "1", "--out", str(out), "--size", "96x72", "--render-scale", "1"]
    with pytest.MonkeyPatch.context() as mp:   # offscreen needs no display
        mp.delenv("DISPLAY", raising=False)
        mp.delenv("WAYLAND_DISPLAY", raising=False)
        rc = main(args + (["--debug"] if VALIDATION else []))
    assert rc == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["ok"] and summary["frames"] == 1 and summary["gaussians"] > 0
    assert summary["frame_size"] == [96, 72] and summary["last_frame"]["alpha_coverage"] > 0.05
    assert summary.get("validation_errors", 0) == 0
    for name in ("frame_0000.png", "image.png", "alpha.png", "overdraw.png"):
        assert name in summary["files"]
        assert Image.open(out / name).size == (96, 72)
    alpha = np.asarray(Image.open(out / "alpha.png"))
    assert (alpha[..., 0] == alpha[..., 1]).all() and alpha.max() > 200
    image = np.asarray(Image.open(out / "image.png"))
    frame = np.asarray(Image.open(out / "frame_0000.png"))
    assert (frame != image).any(-1)[12:40, 12:80].mean() > 0.9        # the panel is in the frame, top left
    assert not np.array_equal(np.asarray(Image.open(out / "overdraw.png")), image)

    # side-by-side renders one panel's worth: the summary gives that frame, not the single-mode views' size
    out2 = tmp_path / "sbs"
    with pytest.MonkeyPatch.context() as mp:
        mp.delenv("DISPLAY", raising=False)
        assert main(args[:4] + [str(out2)] + args[5:] + ["--mode", "side-by-side", "--no-panels"]) == 0
    summary = json.loads((out2 / "summary.json").read_text())
    assert summary["mode"] == "side-by-side" and summary["frame_size"] == [96 // 3, 72]


def test_screenshot_names_never_overwrite(tmp_path):
    from rigel_core.run_dir import unused_path as _unused
    from viewer.cli import _db

    first = tmp_path / "shot.png"
    assert _unused(first) == first
    first.write_bytes(b"x")
    assert _unused(first) == tmp_path / "shot_2.png"
    (tmp_path / "shot_2.png").write_bytes(b"x")
    assert _unused(first) == tmp_path / "shot_3.png"
    assert (_db(7.153824538), _db(None), _db(float("nan"))) == ("7.15", "n/a", "n/a")


def test_cli_reports_bad_input(tmp_path, capsys):
    from viewer.cli import main

    missing = tmp_path / "nope.ply"
    assert main([str(missing), "--offscreen", "--out", str(tmp_path)]) == 2  # bad input: 2
    assert str(missing) in capsys.readouterr().err
    junk = tmp_path / "junk.ply"
    junk.write_bytes(b"this is not a scene")
    assert main([str(junk), "--offscreen", "--out", str(tmp_path)]) == 2  # an InputError: status 2 (issue 13)
    assert "junk.ply" in capsys.readouterr().err
    assert main(["--offscreen"]) == 2
    assert "--out" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["--size", "wide"])


@pytest.mark.parametrize("flags,named", [
    (["--offscreen"], "--out"), (["--fps", "0"], "--fps"), (["--fps", "nan"], "--fps"),
    (["--refresh-hz", "-1"], "--refresh-hz"), (["--threads", "0"], "--threads"), (["--frames", "0"], "--frames"),
    (["--render-scale", "0"], "--render-scale"), (["--render-scale", "4.5"], "--render-scale"),
    (["--slots", "1"], "--slots"), (["--data", "d", "scene.ply"], "either"), (["--data", "d", "--cameras", "c"],
                                                                            "--cameras"),
    # bounds (before: a Vulkan traceback, a size beyond the device accepted, a segfault, hangs)
    (["--size", "99999999x99999999"], "--size must be at most 16384x16384"),
    (["--size", "20000x8"], "--size must be at most 16384x16384"),
    (["--threads", "100000"], "--threads must be in [1, "),
    (["--slots", "100000"], "--slots must be in [2, 16]"), (["--slots", "17"], "--slots must be in [2, 16]"),
    (["--fps", "1e-9"], "--fps must be in [1, 1000]"), (["--fps", "0.5"], "--fps must be in [1, 1000]"),
    (["--fps", "1e9"], "--fps must be in [1, 1000]"), (["--refresh-hz", "61"], "--refresh-hz must be in [0, 60]"),
    (["--refresh-hz", "1e9"], "--refresh-hz must be in [0, 60]")]
    + [(["--fps", bad], f"--fps must be in [1, 1000] frames per second, got {float(bad)}")
       for bad in ("0", "-5", "nan", "inf")]
    + [(["--refresh-hz", bad], f"--refresh-hz must be in [0, 60] (the Training panel's slider), got {float(bad)}")
       for bad in ("-1", "nan", "inf")])
def test_refused_flag_values_exit_2_with_one_line(tmp_path, capsys, flags, named):
    """The viewer's own refusals of a flag value exit 2 with one line naming the flag, as argparse's errors and
    rigel-train's refusals do (they exited 1); nothing is written and no window opens."""
    from viewer.cli import main

    out = tmp_path / "o"
    argv = flags + (["--offscreen", "--out", str(out)] if flags != ["--offscreen"] else [])
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("rigel-viewer: ") and named in err, err
    assert not out.exists()


def test_a_training_budget_or_preload_that_cannot_fit_is_refused_as_rigel_train_does(blender_dataset, tmp_path,  # noqa: F811
                                                                                    capsys, monkeypatch):
    """``rigel-viewer --data`` had no memory refusal: an MCMC budget of 10^12 Gaussians started on the CPU and grew
    until the system killed it, and --preload-frames of a capture bigger than the host decoded until killed. Both are
    one line now, exit 2, nothing written, as rigel-train (tests/test_stream.py); a budget that fits still opens."""
    from rigel_core.train import memory
    from viewer.cli import main

    out = tmp_path / "o"
    common = ["--data", str(blender_dataset), "--offscreen", "--out", str(out), "--device", "cpu", "--frames", "1",
              "--iters", "2", "--init-points", "80", "--sh-degree", "0", "--strategy", "mcmc"]
    assert main(common + ["--max-gaussians", str(10 ** 12)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("rigel-viewer: ") and "of host memory" in err, err
    assert "1,000,000,000,000 Gaussians" in err and not out.exists()
    monkeypatch.setattr(memory, "host_memory", lambda: 1000)
    assert main(common + ["--max-gaussians", "2000", "--preload-frames"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--preload-frames: the 8 images take" in err, err
    assert not out.exists()


def test_argparse_refusals_exit_2_too():
    from viewer.cli import build_parser, main

    with pytest.raises(SystemExit) as e:
        main(["--fps", "fast"])
    assert e.value.code == 2
    assert build_parser().parse_args(["--refresh-hz", "15"]).refresh_hz == 15.0

@needs_vulkan
def test_offscreen_refuses_an_out_holding_an_earlier_run(tmp_path, capsys, rng, one_thread):
    """--offscreen into a folder holding any file an offscreen run writes (its frames, image.png, alpha.png,
    overdraw.png, summary.json …): one line naming the folder, status 2, nothing written (before, a 1-frame run left
    frame_0001.png … of an earlier 2-frame run beside its summary.json, and a user's own image.png was replaced);
    files the viewer does not write do not count. The names are taken from what a run really wrote."""
    from rigel_core.io import save_ply
    from viewer.cli import main

    scene = tmp_path / "tiny.ply"
    save_ply(tiny_model(rng, 40), scene)
    out = tmp_path / "out"
    out.mkdir()
    (out / "notes.txt").write_text("mine\n")
    (out / "image.jpg").write_bytes(b"not the viewer's")
    run = [str(scene), "--offscreen", "--out", str(out), "--size", "64x48", "--device", "cpu", "--threads", "1"]
    assert main(run + ["--frames", "2"]) == 0, capsys.readouterr().err
    capsys.readouterr()
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    written = set(before) - {"notes.txt", "image.jpg"}
    assert {"frame_0000.png", "frame_0001.png", "summary.json", "image.png", "alpha.png", "overdraw.png"} <= written
    assert main(run + ["--frames", "1"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and str(out) in err and "earlier" in err and "alpha.png" in err, err
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    # each name a run wrote (and a path run's frame) alone marks a folder; what the viewer does not write does not
    for name in sorted(written) + ["frame_0007.png", "path_0000.png", "training_view.png"]:
        other = tmp_path / f"only_{name}"
        other.mkdir()
        (other / name).write_bytes(b"x")
        (other / "notes.txt").write_text("mine\n")
        assert main([str(scene), "--offscreen", "--out", str(other), "--frames", "1"]) == 2, name
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and str(other) in err and name in err, err
        assert sorted(p.name for p in other.iterdir()) == sorted([name, "notes.txt"])

def test_up_takes_a_negative_axis_as_a_separate_word(tmp_path, capsys):
    """``--up -y`` (as the help lists the axes) is read as ``--up=-y``; before, argparse stopped with "expected one
    argument". Only a value of --up is joined: another flag's dash-word stays an option."""
    from viewer.camera_control import UP_AXES
    from viewer.cli import main, parse_args

    for axis in UP_AXES:
        assert parse_args(["--up", axis]).up == axis and parse_args([f"--up={axis}"]).up == axis
        assert parse_args(["scene.ply", "--up", axis, "--offscreen"]).scene == "scene.ply"
    assert parse_args(["--up", "-y", "--", "-x.ply"]).scene == "-x.ply"
    with pytest.raises(SystemExit):
        parse_args(["--up", "-w"])
    with pytest.raises(SystemExit):
        parse_args(["--mode", "-y"])
    capsys.readouterr()
    # through main: the run gets past parsing to the flag check (one line, status 2, about --out)
    assert main(["--up", "-y", "--offscreen"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--offscreen needs --out" in err, err


def test_flag_bounds_accept_their_ends(tmp_path):
    """The ends of each range pass the flag check (the refusals above are of values just outside)."""
    import os

    from rigel_core.cli.common import max_threads
    from viewer.cli import _flag_problem, build_parser

    assert max_threads() == 4 * (os.cpu_count() or 1)
    for flags in (["--size", "16384x16384"], ["--size", "1x1"], ["--threads", str(max_threads())], ["--threads", "1"],
                  ["--slots", "2"], ["--slots", "16"], ["--fps", "1"], ["--fps", "1000"], ["--refresh-hz", "0"],
                  ["--refresh-hz", "60"]):
        assert _flag_problem(build_parser().parse_args(flags + ["--offscreen", "--out", str(tmp_path / "o")])) is None
    args = build_parser().parse_args(["--threads", str(max_threads() + 1)])
    assert "--threads" in _flag_problem(args)


@needs_vulkan
def test_size_beyond_the_vulkan_devices_limit_is_refused(tmp_path, capsys, monkeypatch, rng, one_thread):
    """A --size within 16384 but above the device's maxImageDimension2D (here made 40): one line naming the flag and
    the limit, status 2, no traceback (before: accepted, then Vulkan failed)."""
    from types import SimpleNamespace

    from rigel_core.io import save_ply
    from viewer.cli import main
    from viewer.gpu.vk_context import VulkanContext

    init = VulkanContext.init_device

    def small_limit(self, **kw):
        init(self, **kw)
        self.limits = SimpleNamespace(maxImageDimension2D=40)
        return self

    monkeypatch.setattr(VulkanContext, "init_device", small_limit)
    save_ply(tiny_model(rng, 20), tmp_path / "s.ply")
    assert main([str(tmp_path / "s.ply"), "--offscreen", "--out", str(tmp_path / "o"), "--size", "64x32",
                 "--device", "cpu", "--threads", "1"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--size 64x32" in err and "at most 40x40" in err, err
    assert not any((tmp_path / "o").glob("*.png"))


@needs_vulkan
def test_cli_without_display_or_driver_says_what_to_do(tmp_path, monkeypatch, capsys, rng):
    from viewer.cli import main

    scene = tmp_path / "tiny.ply"
    from rigel_core.io import save_ply

    save_ply(tiny_model(rng, 50), scene)
    monkeypatch.delenv("DISPLAY", raising=False)
    monkeypatch.delenv("WAYLAND_DISPLAY", raising=False)
    assert main([str(scene)]) == 2
    err = capsys.readouterr().err
    assert "--offscreen" in err and "xvfb" in err.lower()

    env = dict(os.environ, VK_DRIVER_FILES=str(tmp_path / "none.json"), VK_ICD_FILENAMES=str(tmp_path / "none.json"))
    r = subprocess.run([sys.executable, "-m", "viewer", str(scene), "--offscreen", "--frames", "1", "--out",
                        str(tmp_path / "o")], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 2, r.stderr
    assert r.stderr.count("\n") == 1 and "mesa-vulkan-drivers" in r.stderr    # one clear line


# ---- the windowed viewer -----------------------------------------------------------------------------------------
@needs_vulkan
def test_viewer_renders_when_something_changes_and_presents_otherwise(display, rng, tmp_path):  # noqa: F811
    from test_vulkan import VALIDATION
    from viewer.app import Viewer
    from viewer.gpu.shaderio import C
    from viewer.ui import ViewSettings

    slot = ModelSlot(tiny_model(rng), iteration=0)
    settings = ViewSettings(render_scale=0.25)
    with Viewer(slot, size=(480, 320), device="cpu", debug=VALIDATION, settings=settings) as v:
        import glfw

        for _ in range(3):
            glfw.poll_events()
            assert v.step() is not None
        assert v.stats.renders == 1 and v.stats.presents == 3      # a still view is rendered once
        assert v.stats.frame_size == (120, 80)
        # Input (the GLFW callbacks, called as GLFW would): a drag away from the panel orbits, the wheel zooms,
        # key 3 picks the overdraw mode.
        v.input._on_cursor(v.window, 400.0, 250.0)
        v.step()
        yaw, dist = v.camera.yaw, v.camera.distance
        v.input._on_button(v.window, glfw.MOUSE_BUTTON_LEFT, glfw.PRESS, 0)
        v.input._on_cursor(v.window, 430.0, 260.0)
        v.input._on_button(v.window, glfw.MOUSE_BUTTON_LEFT, glfw.RELEASE, 0)
        v.input._on_scroll(v.window, 0.0, 1.0)
        assert v.camera.yaw != yaw and v.camera.distance == pytest.approx(dist * 0.9)
        v.step()
        assert v.stats.renders == 2
        v.input._on_key(v.window, glfw.KEY_3, 0, glfw.PRESS, 0)   # another pass over the same frame
        v.step()
        assert v.settings.mode == C.MODE_OVERDRAW and v.stats.renders == 2
        v.settings.show_panels = False
        v.settings.mode = C.MODE_SIDE_BY_SIDE                      # three panels: a narrower frame
        v.step()
        assert v.stats.renders == 3 and v.stats.frame_size == (40, 80)   # a third of the window, scaled
        slot.publish(tiny_model(rng, 120, offset=(0.2, 0, 0)), iteration=500)   # a trainer's new snapshot
        v.settings.mode = C.MODE_IMAGE
        v.step()
        assert v.stats.renders == 4 and v.stats.gaussians == 120 and v.stats.model_info == {"iteration": 500}
        v.screenshot_dir = tmp_path
        v.request(R.Screenshot())
        p = v.step()
        shots = list(tmp_path.glob("rigel_screenshot_*.png"))
        assert len(shots) == 1
        from PIL import Image

        np.testing.assert_array_equal(np.asarray(Image.open(shots[0])), v.read_pixels(p)[..., :3])
        glfw.set_window_should_close(v.window, True)
        v.run()                                                     # returns at once: the window is closing


@needs_vulkan
@needs_ui
def test_panels_stay_in_place_when_the_window_is_shrunk_to_nothing(rng):
    """A window resized to 1x1 and back: the panel is where it was (ImGui moves a window to keep its corner on
    screen, so the panels are not drawn below MIN_DISPLAY_FOR_PANELS)."""
    from imgui_bundle import imgui

    from viewer.app import Viewer
    from viewer.ui import ViewSettings

    slot = ModelSlot(tiny_model(rng), iteration=0)
    with Viewer(slot, size=(240, 160), device="cpu", offscreen=True, settings=ViewSettings(render_scale=0.25)) as v:
        for _ in range(2):
            v.step()
        before = imgui.internal.find_window_by_name("rigel-viewer").pos
        before = (before.x, before.y)
        for size in ((1, 1), (7, 5), (240, 160)):
            v.target.resize(*size)
            assert v.step() is not None
        after = imgui.internal.find_window_by_name("rigel-viewer").pos
        assert (after.x, after.y) == before


@needs_vulkan
@needs_ui
def test_a_captured_frame_shows_the_panel_sized_to_its_own_contents(rng):
    """ImGui sizes an auto-resizing panel from the previous frame's contents, so a row that appeared in a frame (the
    render-time plot and its label over the first frames) was cut off in that frame's PNG (the offscreen --frames 3
    PNG showed the last row cut). In each captured frame the panel's contents, as laid out in that frame, must end
    inside the panel."""
    from imgui_bundle import imgui

    from viewer.app import Viewer
    from viewer.ui import ViewSettings

    slot = ModelSlot(tiny_model(rng), iteration=0)
    with Viewer(slot, size=(900, 800), device="cpu", offscreen=True, settings=ViewSettings(render_scale=0.25)) as v:
        v.build_ui()   # as run_offscreen does before its first frame
        heights = []
        for _ in range(4):
            assert v.step(capture=True) is not None
            w = imgui.internal.find_window_by_name("rigel-viewer")
            bottom = w.pos.y + w.size.y - w.window_padding.y   # where the panel's contents may end
            heights.append((w.size.y, w.dc.cursor_max_pos.y, bottom))
        assert all(end <= bottom + 0.5 for _, end, bottom in heights), heights
        assert heights[0][0] < heights[-1][0]   # the panel grew over the frames: the case is exercised


@needs_vulkan
@needs_ui
def test_a_view_over_the_entry_limit_shows_the_background_and_says_why(rng, monkeypatch):
    """A camera whose view needs more binning entries than the limit (``BinningOverflow``; the limit lowered here)
    gets the background and one red line in the Render section, not a crash; the next view under the limit renders
    the model again and the line goes."""
    from rigel_core import config as rconfig
    from viewer.app import Viewer
    from viewer.ui import ViewSettings

    slot = ModelSlot(tiny_model(rng), iteration=0)
    with Viewer(slot, size=(240, 160), device="cpu", offscreen=True,
                settings=ViewSettings(white_background=True)) as v:
        assert v.step() is not None and v.stats.render_problem is None
        shown = v.ring.latest.image.clone()
        assert float((shown < 0.99).float().mean()) > 0.01  # the model is in the frame
        monkeypatch.setattr(rconfig, "MAX_ENTRIES", 1)
        v.camera.version += 1  # a new view: rendered again
        assert v.step() is not None
        assert v.stats.render_problem is not None and "over the limit of 1:" in v.stats.render_problem
        assert bool((v.ring.latest.image == 1.0).all()) and bool((v.ring.latest.final_T == 1.0).all())
        monkeypatch.undo()
        v.camera.version += 1
        assert v.step() is not None and v.stats.render_problem is None
        torch.testing.assert_close(v.ring.latest.image, shown)


# ---- GPU ------------------------------------------------------------------------------------------------------------
@pytest.mark.gpu
@needs_ui
def test_gpu_offscreen_viewer_on_the_bundled_scene(tmp_path):
    from test_vulkan import VALIDATION
    from viewer.cli import main

    out = tmp_path / "gpu"
    assert main(["--offscreen", "--device", "cuda", "--frames", "12", "--out", str(out), "--size", "640x480"]
                + (["--debug"] if VALIDATION else [])) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["render_device"] == "cuda" and summary["frame_size"] == [640, 480]
    assert summary["frame_ring"] == "cuda-interop"          # CUDA wrote into the imported Vulkan memory
    assert summary["ok"] and summary.get("validation_errors", 0) == 0
