"""Camera paths (rigel_core/camera_path.py), their videos (rigel_core/render_video.py, ``rigel-render --path``) and
the viewer's camera-path panel state (viewer/panels/camera_path.py, no window)."""
import json
import math
import os
import time

import numpy as np
import pytest
import torch

from rigel_core import Camera
from rigel_core.renderer.camera import quat_to_rotmat_np
from rigel_core.camera_path import (CameraPath, CameraPathError, Keyframe, load_path, rotmat_to_quat, save_nerfstudio,
                                    save_path, slerp)


@pytest.fixture
def g(rng):
    """A numpy generator seeded from the test's torch generator (fresh inputs each run)."""
    return np.random.default_rng(int(torch.randint(0, 2**31 - 1, (1,), generator=rng)))


def random_rotation(g) -> np.ndarray:
    q, r = np.linalg.qr(g.normal(size=(3, 3)))
    q = q * np.sign(np.diag(r))
    return q if np.linalg.det(q) > 0 else -q


def random_keyframes(g, n, times=False):
    """``n`` keyframes at uneven distances (spacings spread over a factor ~20), random orientations and fov."""
    steps = g.normal(size=(n, 3)) * g.uniform(0.2, 4.0, size=(n, 1))
    pos = np.cumsum(steps, axis=0)
    t = np.cumsum(g.uniform(0.2, 2.0, size=n)) if times else [None] * n
    return [Keyframe(p, rotmat_to_quat(random_rotation(g)), g.uniform(20, 90), ti) for p, ti in zip(pos, t)]


def quat_angle(a, b) -> float:
    """Rotation angle (rad) between the rotations of two unit quaternions."""
    return 2.0 * math.acos(min(abs(float(np.dot(a, b))), 1.0))


# ---- quaternions ---------------------------------------------------------------------------------------------------
def test_rotmat_quat_round_trip(g):
    for _ in range(50):
        R = random_rotation(g)
        q = rotmat_to_quat(R)
        assert abs(np.linalg.norm(q) - 1) < 1e-12 and q[0] >= 0
        np.testing.assert_allclose(quat_to_rotmat_np(q), R, atol=1e-12)
    # each pivot branch of Shepperd's method: rotations by ~π about each axis and the identity
    for axis in np.eye(3):
        R = quat_to_rotmat_np(np.concatenate([[1e-3], axis]))
        np.testing.assert_allclose(quat_to_rotmat_np(rotmat_to_quat(R)), R, atol=1e-12)
    np.testing.assert_allclose(rotmat_to_quat(np.eye(3)), [1, 0, 0, 0])


def test_slerp_unit_norm_and_short_arc(g):
    for _ in range(20):
        q0, q1 = rotmat_to_quat(random_rotation(g)), rotmat_to_quat(random_rotation(g))
        theta = quat_angle(q0, q1)   # ≤ π: the shorter way round
        for u in np.linspace(0, 1, 11):
            a, b = slerp(q0, q1, u), slerp(q0, -q1, u)
            assert abs(np.linalg.norm(a) - 1) < 1e-12
            assert quat_angle(a, b) < 1e-7          # q1 and −q1 are one rotation: one path
            # on the shortest geodesic, at the fraction u of it
            assert quat_angle(a, q0) == pytest.approx(u * theta, abs=1e-6)
            assert quat_angle(a, q1) == pytest.approx((1 - u) * theta, abs=1e-6)
    q = rotmat_to_quat(random_rotation(g))
    np.testing.assert_allclose(slerp(q, q, 0.3), q, atol=1e-12)   # the near-identical branch


# ---- interpolation ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("loop", [False, True])
@pytest.mark.parametrize("times", [False, True])
def test_passes_through_every_keyframe(g, loop, times):
    kfs = random_keyframes(g, 6, times=times)
    path = CameraPath(kfs, duration=float(g.uniform(2, 9)) if not times else kfs[-1].time + 1.0, loop=loop,
                      smoothness=float(g.uniform(0.3, 1.0)))
    t = path._times()
    for k, ti in zip(kfs, t):
        p, q, f = path.evaluate(ti)
        np.testing.assert_allclose(p, k.position, atol=1e-9)
        assert quat_angle(q, k.orientation) < 1e-7
        assert f == pytest.approx(k.fov_y_deg, abs=1e-9)
    if loop:   # the end of a loop is its start
        p, q, _ = path.evaluate(t[-1])
        np.testing.assert_allclose(p, kfs[0].position, atol=1e-9)


def _kink(f, t, h, speed):
    """|right − left derivative| at t relative to ``speed``: second-order one-sided differences on each side
    (error O(h²) where the function is smooth on that side), so a C1 function gives ~0 and a corner does not."""
    left = (3 * f(t) - 4 * f(t - h) + f(t - 2 * h)) / (2 * h)
    right = (-3 * f(t) + 4 * f(t + h) - f(t + 2 * h)) / (2 * h)
    return np.linalg.norm(right - left) / speed


@pytest.mark.parametrize("loop", [False, True])
def test_position_is_c1_at_keyframes(g, loop):
    kfs = random_keyframes(g, 6, times=True)
    path = CameraPath(kfs, duration=kfs[-1].time + 1.5, loop=loop)
    t = path._times()
    # the residual of a C1 curve is O(h² |P'''|): measured to fall 16x per 4x smaller h, worst 1.4e-5 at
    # h = 1.5e-5 span over 2400 random keyframes; round-off is ~1e-11 here
    h = 1e-5 * (t[-1] - t[0])
    speed = path.arc_length() / (t[-1] - t[0])          # the mean speed: a scale for velocities
    for ti in t[1:-1]:
        assert _kink(lambda s: path.evaluate(s)[0], ti, h, speed) < 1e-4
    # the same measure sees the corner of straight segments between the same keyframes (the test has power)
    P = np.stack([k.position for k in kfs])
    poly = lambda s: np.array([np.interp(s, t[: len(P)], P[:, j]) for j in range(3)])  # noqa: E731
    assert max(_kink(poly, ti, h, speed) for ti in t[1:len(P) - 1]) > 0.05


def test_constant_speed_steps_are_uniform(g):
    kfs = random_keyframes(g, 5)
    path = CameraPath(kfs, frames=60)
    pos = path.sample(constant_speed=True)[0]
    # the arc between consecutive frames, measured by 256 chords each. A chord sum falls short of the arc at a
    # tight turn, and this generator makes near-cusps: with 16 chords 2.5 % of draws measured std/mean > 2e-3
    # (RIGEL_SEED=394: one step 0.3800 against 0.3937, std/mean 4.5e-3) though 1024 chords show the steps even to
    # 6e-5. With 256 the measuring error falls 16x (1/k near a cusp, 1/k² elsewhere): std/mean at most 2.8e-4
    # over 400 draws (seed 394 again), 7x under the bound.
    k = 256
    fine = path.sample(59 * k + 1, constant_speed=True)[0]
    np.testing.assert_allclose(fine[::k], pos, atol=1e-6 * np.abs(pos).max())
    arcs = np.add.reduceat(np.linalg.norm(np.diff(fine, axis=0), axis=1), np.arange(0, 59 * k, k))
    assert arcs.std() / arcs.mean() < 2e-3
    assert arcs.sum() == pytest.approx(path.arc_length(), rel=2e-3)
    # timed by keyframes the steps vary with the uneven spacing (what the option is for)
    t_steps = np.linalg.norm(np.diff(path.sample(constant_speed=False)[0], axis=0), axis=1)
    assert t_steps.max() / t_steps.min() > 1.5


def test_two_keyframes_are_a_straight_line(g):
    a, b = random_keyframes(g, 2)
    T = float(g.uniform(1, 5))
    path = CameraPath([a, b], duration=T, frames=17)
    pos, _, fov, times = path.sample()
    for p, f, t in zip(pos, fov, times):   # uniform speed on the segment, fov linear
        np.testing.assert_allclose(p, a.position + (t / T) * (b.position - a.position), atol=1e-9)
        assert f == pytest.approx(a.fov_y_deg + (t / T) * (b.fov_y_deg - a.fov_y_deg), abs=1e-9)


def test_smoothness_zero_stops_at_keyframes(g):
    kfs = random_keyframes(g, 4, times=True)
    path = CameraPath(kfs, smoothness=0.0)
    h = 1e-5
    for k in kfs[1:-1]:
        v = (path.evaluate(k.time + h)[0] - path.evaluate(k.time)[0]) / h
        assert np.linalg.norm(v) < 1e-3 * np.linalg.norm(kfs[1].position - kfs[0].position)


def test_cameras_match_keyframes(g):
    kfs = random_keyframes(g, 3)
    path = CameraPath(kfs, frames=5)           # samples 0, 2, 4 are the keyframes (even times)
    cams = path.cameras(40, 30)
    assert [c.name for c in cams] == [f"path_{i:04d}" for i in range(5)]
    for k, cam in zip(kfs, cams[::2]):
        assert (cam.width, cam.height, cam.cx, cam.cy) == (40, 30, 20.0, 15.0)
        assert cam.fy == pytest.approx(15.0 / math.tan(math.radians(k.fov_y_deg) / 2)) and cam.fx == cam.fy
        np.testing.assert_allclose(cam.campos, k.position, atol=1e-9)
        np.testing.assert_allclose(cam.c2w[:3, :3], quat_to_rotmat_np(k.orientation), atol=1e-9)
        back = Keyframe.from_camera(cam)
        assert back.fov_y_deg == pytest.approx(k.fov_y_deg)


def test_one_side_of_the_size_keeps_the_paths_aspect_ratio(g, tmp_path):
    """cameras(width=W) alone: the height follows the path's own aspect ratio (else 640 × 480's), and likewise for a
    height alone (``rigel-render --path --width 64`` rendered 64 × 480 from a path without a size)."""
    kfs = random_keyframes(g, 2)
    sizes = lambda p, **kw: {(c.width, c.height) for c in p.cameras(**kw)}  # noqa: E731
    bare = CameraPath(kfs, frames=3)
    assert sizes(bare) == {(640, 480)}
    assert sizes(bare, width=64) == {(64, 48)} and sizes(bare, height=96) == {(128, 96)}
    sized = CameraPath(kfs, frames=3, width=1920, height=1080)
    assert sizes(sized, width=64) == {(64, 36)} and sizes(sized, height=9) == {(16, 9)}
    assert sizes(sized, width=3, height=5) == {(3, 5)} and sizes(sized, width=1) == {(1, 1)}
    # a path that declares one side alone: that side, the other at 4:3 (it gave 640 × 480 for width 1000 alone)
    assert sizes(CameraPath(kfs, frames=3, width=1000)) == {(1000, 750)}
    assert sizes(CameraPath(kfs, frames=3, height=300), width=40) == {(40, 30)}
    # nerfstudio's camera_path.json is written at the same size
    out = save_nerfstudio(bare, tmp_path / "ns.json", width=64)
    d = json.loads(out.read_text())
    assert (d["render_width"], d["render_height"]) == (64, 48)


def test_bad_keyframe_times():
    kf = [Keyframe(np.zeros(3), [1, 0, 0, 0], 40, 1.0), Keyframe(np.ones(3), [1, 0, 0, 0], 40, 0.5)]
    with pytest.raises(ValueError, match="strictly increasing"):
        CameraPath(kf).evaluate(0.7)
    kf[1].time = None
    with pytest.raises(ValueError, match="every keyframe"):
        CameraPath(kf).evaluate(0.7)
    with pytest.raises(ValueError, match="no keyframes"):
        CameraPath([]).sample()


# ---- files -----------------------------------------------------------------------------------------------------------
def test_json_round_trip(tmp_path, g):
    path = CameraPath(random_keyframes(g, 4, times=True), duration=9.0, fps=24, frames=7, loop=True,
                      smoothness=0.6, constant_speed=True, width=96, height=64)
    out = save_path(path, tmp_path / "p.json")
    d = json.loads(out.read_text())
    assert d["format"] == "rigel-camera-path" and d["version"] == 1
    back = load_path(out)
    for f in ("duration", "fps", "frames", "loop", "smoothness", "constant_speed", "width", "height"):
        assert getattr(back, f) == getattr(path, f), f
    for a, b in zip(path.cameras(), back.cameras()):
        np.testing.assert_allclose(a.viewmat, b.viewmat, atol=1e-12)
        assert (a.fx, a.width, a.height) == (b.fx, b.width, b.height)
    with pytest.raises(FileExistsError):
        save_path(path, out)
    save_path(path, out, force=True)


def _nerfstudio_file(g, n=5, w=80, h=60, fps=12):
    c2ws, fovs = [], []
    for _ in range(n):
        m = np.eye(4)
        m[:3, :3] = random_rotation(g)
        m[:3, 3] = g.normal(size=3) * 3
        c2ws.append(m)
        fovs.append(float(g.uniform(20, 80)))
    d = {"keyframes": [{"matrix": "ignored"}], "camera_type": "perspective", "render_height": h, "render_width": w,
         "camera_path": [{"camera_to_world": m.reshape(-1).tolist(), "fov": f, "aspect": w / h}
                         for m, f in zip(c2ws, fovs)], "fps": fps, "seconds": n / fps}
    return d, c2ws, fovs


def test_nerfstudio_read(tmp_path, g):
    d, c2ws, fovs = _nerfstudio_file(g)
    (tmp_path / "camera_path.json").write_text(json.dumps(d))
    path = load_path(tmp_path / "camera_path.json")
    assert (path.width, path.height, path.fps, path.num_frames()) == (80, 60, 12.0, 5)
    cams = path.cameras()
    assert len(cams) == 5
    for cam, m, fov in zip(cams, c2ws, fovs):
        f = 30.0 / math.tan(math.radians(fov) / 2)          # vertical fov over the 60-pixel height
        ref = Camera.from_c2w_opengl(m, width=80, height=60, fx=f, fy=f)
        np.testing.assert_allclose(cam.viewmat, ref.viewmat, atol=1e-9)
        assert (cam.fx, cam.fy, cam.cx, cam.cy) == pytest.approx((ref.fx, ref.fy, ref.cx, ref.cy))


def test_nerfstudio_write_round_trip(tmp_path, g):
    path = CameraPath(random_keyframes(g, 3), frames=6, width=50, height=40)
    out = save_nerfstudio(path, tmp_path / "camera_path.json")
    d = json.loads(out.read_text())
    assert len(d["camera_path"]) == 6 and len(d["camera_path"][0]["camera_to_world"]) == 16
    for a, b in zip(path.cameras(), load_path(out).cameras()):
        np.testing.assert_allclose(a.viewmat, b.viewmat, atol=1e-9)
        assert a.fy == pytest.approx(b.fy)


@pytest.mark.parametrize("text, field", [
    ("{not json", "not valid JSON"),
    ('[1, 2]', "top level"),
    ('{"format": "other"}', "'format'"),
    ('{"format": "rigel-camera-path", "version": 7, "keyframes": []}', "'version'"),
    ('{"format": "rigel-camera-path", "version": 1}', "'keyframes'"),
    ('{"format": "rigel-camera-path", "version": 1, "keyframes": [{"position": [0, 0], "orientation": [1, 0, 0, 0],'
     ' "fov_y_deg": 40}]}', "keyframes[0].position"),
    ('{"format": "rigel-camera-path", "version": 1, "keyframes": [{"position": [0, 0, 0], "orientation": [0, 0, 0, 0],'
     ' "fov_y_deg": 40}]}', "keyframes[0].orientation"),
    ('{"format": "rigel-camera-path", "version": 1, "keyframes": [{"position": [0, 0, 0], "orientation": [1, 0, 0, 0]'
     '}]}', "'fov_y_deg'"),
    ('{"format": "rigel-camera-path", "version": 1, "keyframes": [{"position": [0, 0, 0], "orientation": [1, 0, 0, 0],'
     ' "fov_y_deg": 400}]}', "keyframes[0].fov_y_deg"),
    ('{"format": "rigel-camera-path", "version": 1, "keyframes": [], "fps": -1}', "'fps'"),
    ('{"format": "rigel-camera-path", "version": 1, "keyframes": [], "loop": "yes"}', "'loop'"),
    ('{"camera_path": []}', "'camera_path'"),
    ('{"camera_path": [{"fov": 40}]}', "camera_path[0]: missing field 'camera_to_world'"),
    ('{"camera_path": [{"camera_to_world": [1, 0, 0], "fov": 40}]}', "camera_path[0].camera_to_world"),
    ('{"camera_path": [{"camera_to_world": [2,0,0,0, 0,1,0,0, 0,0,1,0, 0,0,0,1], "fov": 40}]}', "not a rotation"),
    ('{"camera_path": [{"camera_to_world": [1,0,0,0, 0,1,0,0, 0,0,1,0, 0,0,0,1]}]}', "'fov'"),
])
def test_bad_files_name_file_and_field(tmp_path, text, field):
    p = tmp_path / "bad.json"
    p.write_text(text)
    with pytest.raises(CameraPathError) as e:
        load_path(p)
    msg = str(e.value)
    assert msg.startswith(str(p) + ": ") and field in msg and "\n" not in msg
    with pytest.raises(CameraPathError, match="cannot read"):
        load_path(tmp_path / "missing.json")


# ---- videos (rigel_core/render_video.py, rigel-render --path) --------------------------------------------------------
@pytest.fixture(scope="module")
def tiny_scene(tmp_path_factory):
    """A PLY of 60 random Gaussians (renders in milliseconds on the CPU)."""
    from rigel_core.io import save_ply
    from rigel_core.model import GaussianModel

    gen = torch.Generator().manual_seed(int.from_bytes(os.urandom(4), "little"))
    pts = (torch.rand(60, 3, generator=gen, dtype=torch.float64) * 2 - 1)
    cols = torch.rand(60, 3, generator=gen, dtype=torch.float64)
    model = GaussianModel.from_points(pts, cols, sh_degree=1, scale=0.3)
    path = tmp_path_factory.mktemp("scene") / "tiny.ply"
    save_ply(model, path)
    return path


def _path_file(tmp_path, frames=4):
    cams = [Camera.look_at([4 * math.cos(a), 4 * math.sin(a), 1.0], [0, 0, 0]) for a in (0.0, 0.8, 1.6)]
    path = CameraPath([Keyframe.from_camera(c) for c in cams], frames=frames, fps=8)
    return save_path(path, tmp_path / "path.json"), path


def _read_frames(p):
    import imageio.v2 as imageio

    with imageio.get_reader(p) as r:
        return [np.asarray(f)[..., :3] for f in r]


def _reference_frames(scene_path, path, w, h):
    from rigel_core import render
    from rigel_core.io import load_scene

    model = load_scene(scene_path, device="cpu")
    out = []
    for cam in path.cameras(w, h):
        with torch.no_grad():
            out.append((render(model, cam).image.clamp(0, 1) * 255).numpy())
    return out


def test_cli_writes_mp4(tmp_path, tiny_scene):
    pytest.importorskip("imageio_ffmpeg", reason="imageio-ffmpeg is not installed: no MP4 writer")
    from rigel_core.cli.render import main

    pj, path = _path_file(tmp_path)
    out = tmp_path / "v" / "out.mp4"
    argv = [str(tiny_scene), "--path", str(pj), "--video", str(out), "--width", "32", "--height", "24",
            "--device", "cpu"]
    assert main(argv) == 0
    frames = _read_frames(out)
    assert len(frames) == 4 and frames[0].shape == (24, 32, 3)
    ref = _reference_frames(tiny_scene, path, 32, 24)
    for f, r in zip(frames, ref):   # H.264 is lossy: the mean error of a faithful encode is a few levels
        assert np.abs(f.astype(np.float64) - r).mean() < 12
    assert np.abs(frames[0].astype(np.float64) - ref[2]).mean() > np.abs(frames[0].astype(np.float64)
                                                                          - ref[0]).mean()
    # never overwritten without --force (a refusal: exit 2); with it, replaced (here by 6 frames)
    before = out.read_bytes()
    assert main(argv) == 2 and out.read_bytes() == before
    assert main(argv + ["--frames", "6", "--force"]) == 0 and len(_read_frames(out)) == 6
    assert sorted(p.name for p in out.parent.iterdir()) == ["out.mp4"]   # no temporary file left


def test_gif_fallback_without_ffmpeg(tmp_path, tiny_scene, monkeypatch):
    import rigel_core.render_video as rv
    from rigel_core.cli.render import main

    monkeypatch.setattr(rv, "ffmpeg_available", lambda: False)
    pj, path = _path_file(tmp_path, frames=3)
    assert main([str(tiny_scene), "--path", str(pj), "--video", str(tmp_path / "out.mp4"), "--width", "20",
                 "--height", "16", "--device", "cpu"]) == 0
    assert not (tmp_path / "out.mp4").exists()
    frames = _read_frames(tmp_path / "out.gif")
    assert len(frames) == 3 and frames[0].shape == (16, 20, 3)
    for f, r in zip(frames, _reference_frames(tiny_scene, path, 20, 16)):   # GIF: a 256-colour palette
        assert np.abs(f.astype(np.float64) - r).mean() < 6


def test_interrupt_and_cancel_leave_no_file(tmp_path, tiny_scene, monkeypatch):
    import importlib

    from rigel_core.cli.render import main
    from rigel_core.io import load_scene
    from rigel_core.render_video import VideoCancelled, render_path_video

    rrender = importlib.import_module("rigel_core.renderer.api")   # the module of the function rigel_core.render
    pj, path = _path_file(tmp_path, frames=4)
    real, calls = rrender.render, []

    def interrupted(*a, **k):
        calls.append(1)
        if len(calls) == 3:
            raise KeyboardInterrupt
        return real(*a, **k)

    monkeypatch.setattr(rrender, "render", interrupted)
    out = tmp_path / "v" / "out.gif"
    assert main([str(tiny_scene), "--path", str(pj), "--video", str(out), "--width", "16", "--height", "12",
                 "--device", "cpu"]) == 130
    assert len(calls) == 3 and list(out.parent.iterdir()) == []
    monkeypatch.setattr(rrender, "render", real)

    class FakeJob:      # the viewer's Job as render_path_video sees it; the user cancels at half way
        progress, message = 0.0, ""

        @property
        def cancelled(self):
            return self.progress >= 0.5

    job = FakeJob()
    model = load_scene(tiny_scene, device="cpu")
    with pytest.raises(VideoCancelled):
        render_path_video(model, path.cameras(16, 12), out, progress=False, job=job)
    assert job.progress == pytest.approx(0.5) and list(out.parent.iterdir()) == []


def test_cli_path_errors(tmp_path, tiny_scene, capsys):
    from rigel_core.cli.render import main

    bad = tmp_path / "bad.json"
    bad.write_text('{"format": "rigel-camera-path", "version": 1, "keyframes": [{"position": [0, 0]}]}')
    assert main([str(tiny_scene), "--path", str(bad), "--video", str(tmp_path / "o.mp4"), "--device", "cpu"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and str(bad) in err and "keyframes[0]" in err
    folder = tmp_path / "videos"
    folder.mkdir()   # a folder as --video became videos.mp4 beside it
    assert main([str(tiny_scene), "--path", str(bad), "--video", str(folder), "--device", "cpu"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "is a folder" in err and not (tmp_path / "videos.mp4").exists()
    with pytest.raises(SystemExit):
        main([str(tiny_scene), "--path", str(bad)])          # --video missing
    with pytest.raises(SystemExit):
        main([str(tiny_scene), "--out", str(tmp_path)])      # neither --cameras nor --path


# ---- the viewer's panel state (viewer/panels/camera_path.py, no window) ------------------------------------------------------
def _kf(x):
    return Keyframe([x, 0.0, 0.0], [1, 0, 0, 0], 40.0)


def test_editor_add_replace_delete_reorder_clear():
    from viewer.panels.camera_path import PathEditor

    e = PathEditor()
    for x in (1, 2, 3):
        e.add(_kf(x))
    xs = lambda: [k.position[0] for k in e.path.keyframes]  # noqa: E731
    assert xs() == [1, 2, 3] and e.selected == 2
    e.selected = 0
    e.add(_kf(9))                        # inserted after the selection, and selected
    assert xs() == [1, 9, 2, 3] and e.selected == 1
    e.replace(_kf(5))
    assert xs() == [1, 5, 2, 3] and e.selected == 1
    e.move(+1)
    assert xs() == [1, 2, 5, 3] and e.selected == 2
    e.move(-1)
    e.move(-1)
    e.move(-1)                           # clamped at the top
    assert xs() == [5, 1, 2, 3] and e.selected == 0
    e.selected = 3
    e.delete()                           # the last one: the selection moves to the new last
    assert xs() == [5, 1, 2] and e.selected == 2
    e.selected = 0
    e.delete()
    assert xs() == [1, 2] and e.selected == 0
    e.selected = None
    e.replace(_kf(7))
    e.delete()
    e.move(1)                            # nothing selected: no change
    assert xs() == [1, 2]
    e.clear()
    assert xs() == [] and e.selected is None and not e.playing


def test_editor_preview_clock_and_frames():
    from viewer.panels.camera_path import PathEditor

    e = PathEditor()
    for x in (0, 1, 2):
        e.add(_kf(x))
    e.path.duration, e.path.fps = 2.0, 10.0             # 20 frames: the span is 19 / 10 s
    assert e.span == pytest.approx(1.9)
    cams = e.cameras(32, 24)
    assert len(cams) == 20 and e.cameras(32, 24) is cams          # cached
    assert e.cameras(40, 24) is not cams                           # size changed
    assert e.frame_at(0.0, 32, 24).campos == pytest.approx([0, 0, 0])
    assert e.frame_at(0.95, 32, 24).campos == pytest.approx([1, 0, 0], abs=0.06)
    e.play()
    e.tick(100.0)                                      # the first tick only starts the clock
    assert e.time == 0.0
    e.tick(100.5)
    assert e.time == pytest.approx(0.5) and e.playing
    e.tick(103.0)                                      # an open path stops at its end
    assert e.time == pytest.approx(1.9) and not e.playing
    e.play()                                           # played again from the start
    assert e.time == 0.0
    e.path.loop = True
    e.tick(0.0)
    e.tick(2.5)
    assert e.time == pytest.approx(2.5 % e.span) and e.playing
    assert e.frame_at(e.span + 0.1, 32, 24).name == "path_0001"   # a loop wraps


def test_editor_save_and_load(tmp_path):
    from viewer.panels.camera_path import PathEditor

    e = PathEditor()
    e.file = str(tmp_path / "p.json")
    assert e.save() is None and e.error                # nothing to save
    e.add(_kf(1))
    e.add(_kf(2))
    assert e.save() == tmp_path / "p.json" and not e.error
    e.add(_kf(3))
    assert e.save() is None and e.error and "exists" in e.message   # asks first
    assert len(load_path(tmp_path / "p.json").keyframes) == 2
    assert e.save() == tmp_path / "p.json"                         # the second save replaces it
    f = PathEditor(file=str(tmp_path / "p.json"))
    assert f.load() and len(f.path.keyframes) == 3 and f.selected == 0 and f.expand
    (tmp_path / "bad.json").write_text('{"format": "rigel-camera-path", "version": 1, "keyframes": 3}')
    f.file = str(tmp_path / "bad.json")
    assert not f.load() and f.error and "bad.json" in f.message and "'keyframes'" in f.message
    assert len(f.path.keyframes) == 3                               # the path is kept


def test_viewer_panel_requests_offscreen(tmp_path):
    """The panel's requests in an offscreen viewer (Vulkan, e.g. lavapipe): keyframes from the view, the
    preview moves the view onto the video's frames, the video job writes every frame."""
    pytest.importorskip("imgui_bundle", reason="the viewer's UI package imgui-bundle is not installed")
    from test_vulkan import VK_OK, VK_REASON

    if not VK_OK:
        pytest.skip(f"no usable Vulkan device: {VK_REASON}")
    from rigel_core.data import make_scene
    from viewer.app import Viewer
    from viewer.model_slot import ModelSlot
    from viewer.ui import ViewSettings

    n = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        slot = ModelSlot(make_scene(n=200, sh_degree=1, seed=4))
        with Viewer(slot, offscreen=True, size=(320, 240), device="cpu", settings=ViewSettings(render_scale=0.2)) as v:
            e = v.settings.camera_path
            v.settings.video_size = (32, 24)
            eyes = []
            for i in range(3):
                v.camera.orbit(150.0 * (i > 0), 0.0)
                eyes.append(v.camera.eye.copy())
                v.requests.append("path:add")
                v.step()
            assert len(e.path.keyframes) == 3
            for k, eye in zip(e.path.keyframes, eyes):
                np.testing.assert_allclose(k.position, eye, atol=1e-9)
            fw, fh = v.frame_size()
            v.requests.append("path:replace")   # the selected (last) keyframe takes the current view
            v.step()
            e.path.duration, e.path.fps = 1.0, 6.0
            e.time = 0.5
            v.requests.append("path:scrub")
            v.step()
            cam = e.frame_at(0.5, 32, 24)
            assert v.camera.snapped is cam and cam.name == "path_0003"
            v.requests.append("path:play")
            v.step()
            assert e.playing and v.requests == ["path:tick"]   # the section asks for a tick each frame
            time.sleep(0.05)
            v.step()
            v.step()
            assert e.time > 0.05 and v.camera.snapped is e.frame_at(e.time, 32, 24)
            v.requests.append("path:stop")
            v.screenshot_dir = tmp_path
            v.requests.append("path:video")
            v.step()
            job = v.jobs["video"]
            assert job.join(120) and not job.error, job.traceback
            import imageio.v2 as imageio

            with imageio.get_reader(job.result) as r:
                assert len([f for f in r]) == 6
            assert job.result.parent == tmp_path
            assert e.message == f"wrote {job.result}"
            e.path.duration = 30.0                       # 180 frames: cancelled long before the end
            v.requests.append("path:video")
            v.step()
            v.requests.append("path:cancel_video")
            v.step()
            job2 = v.jobs["video"]
            assert job2 is not job and job2.join(120) and not job2.error and job2.result is None
            assert e.message == "video cancelled" and list(tmp_path.iterdir()) == [job.result]
    finally:
        torch.set_num_threads(n)


def test_viewer_offscreen_path_frames(tmp_path, capsys):
    """``rigel-viewer SCENE --offscreen --path P --out DIR`` writes one PNG per frame of the path."""
    pytest.importorskip("imgui_bundle", reason="the viewer's UI package imgui-bundle is not installed")
    from test_vulkan import VK_OK, VK_REASON

    if not VK_OK:
        pytest.skip(f"no usable Vulkan device: {VK_REASON}")
    from rigel_core.data import make_scene
    from rigel_core.io import save_ply
    from viewer.cli import main

    save_ply(make_scene(n=200, sh_degree=1, seed=5), tmp_path / "s.ply")
    cams = [Camera.look_at([6 * math.cos(a), 6 * math.sin(a), 2.0], [0, 0, 0]) for a in (0.0, 1.0)]
    save_path(CameraPath([Keyframe.from_camera(c) for c in cams], frames=3, width=40, height=30), tmp_path / "p.json")
    out = tmp_path / "out"
    n = torch.get_num_threads()
    try:
        assert main([str(tmp_path / "s.ply"), "--offscreen", "--path", str(tmp_path / "p.json"), "--out", str(out),
                     "--size", "200x150", "--device", "cpu", "--threads", "1"]) == 0
    finally:
        torch.set_num_threads(n)
    s = json.loads((out / "summary.json").read_text())
    assert s["ok"] and s["frames"] == 3 and s["size"] == [40, 30]
    assert sorted(p.name for p in out.glob("path_*.png")) == ["path_0000.png", "path_0001.png", "path_0002.png"]
    (tmp_path / "bad.json").write_text("{}")
    assert main([str(tmp_path / "s.ply"), "--offscreen", "--path", str(tmp_path / "bad.json"), "--out",
                 str(tmp_path / "out_bad"), "--size", "200x150", "--device", "cpu"]) == 1
    err = capsys.readouterr().err
    assert "bad.json: field 'format'" in err


def test_markers_land_where_the_present_pass_puts_the_frame(g):
    from viewer.panels.camera_path import screen_points

    eye = g.normal(size=3) * 5
    target = g.normal(size=3) * 0.5
    fw, fh = int(g.integers(20, 200)), int(g.integers(20, 200))
    cam = Camera.look_at(eye, target, (0, 0, 1), width=fw, height=fh, fov_x_deg=float(g.uniform(30, 90)))
    content = (int(g.integers(0, 300)), int(g.integers(0, 50)), int(g.integers(100, 900)), int(g.integers(100, 700)))
    # the target projects to the frame's centre, shown at the centre of the fitted frame, i.e. of the content
    xy, front = screen_points(cam, [target, eye - (target - eye)], (fw, fh), content, fb_scale=(2.0, 2.0))
    cx, cy, cw, ch = content
    assert front.tolist() == [True, False]
    np.testing.assert_allclose(xy[0], [(cx + cw / 2) / 2, (cy + ch / 2) / 2], atol=0.51)
    # a frame corner lands on the corner of the fitted rectangle (scale min(cw/fw, ch/fh), centred)
    s = min(cw / fw, ch / fh)
    corner = cam.c2w[:3, :3] @ np.array([-cam.cx / cam.fx, -cam.cy / cam.fy, 1.0]) + cam.campos
    xy, _ = screen_points(cam, [corner], (fw, fh), content)
    np.testing.assert_allclose(xy[0], [cx + (cw - round(fw * s)) // 2, cy + (ch - round(fh * s)) // 2], atol=1e-6)
