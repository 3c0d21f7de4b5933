"""Datasets: Blender / NeRF-synthetic, instant-ngp and COLMAP loaders, load-time undistortion, format detection.

References are written independently here: camera poses from the raw matrices (OpenGL c2w → flip y, z →
invert), lens models from pycolmap's own ``img_from_cam``, compositing and box downscaling with numpy.
Distortion is checked end to end: a bright dot is drawn where the *distorted* camera sees a 3D point; after
loading, the dot must sit where the returned pinhole camera projects that point (off by pixels if the lens
were ignored or removed twice).
"""
import json
import math
import warnings

import numpy as np
import pytest
import torch
from PIL import Image

from rigel_core import Camera
from rigel_core.data import DatasetError, detect_format, load_dataset
from rigel_core.data.undistort import opencv_distort, remap_bilinear, undistort_opencv

FLIP = np.diag([1.0, -1.0, -1.0, 1.0])


def w2c_from_opengl_c2w(c2w) -> np.ndarray:
    return np.linalg.inv(np.asarray(c2w, dtype=np.float64) @ FLIP)


def np_rng(rng: torch.Generator) -> np.random.Generator:
    return np.random.default_rng(int(torch.randint(0, 2**31 - 1, (1,), generator=rng)))


def random_pose(g: np.random.Generator, dist=4.0) -> np.ndarray:
    """A world-to-camera (OpenCV) looking roughly at the origin from a random direction."""
    d = g.normal(size=3)
    d /= np.linalg.norm(d)
    if abs(d[2]) > 0.9:
        d = np.array([d[0], d[1], 0.3])
        d /= np.linalg.norm(d)
    target = g.normal(scale=0.1, size=3)
    return Camera.look_at(d * dist, target, (0, 0, 1), width=8, height=8).viewmat


def save_u8(path, arr):
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(np.clip(np.rint(arr * 255), 0, 255).astype(np.uint8)).save(path)


def blob_image(width, height, uv, sigma=1.2) -> np.ndarray:
    """(H,W,3) grey image with a Gaussian dot centred at continuous pixel position uv (pixel centres at +0.5)."""
    u = np.arange(width) + 0.5
    v = np.arange(height) + 0.5
    uu, vv = np.meshgrid(u, v)
    b = np.exp(-((uu - uv[0]) ** 2 + (vv - uv[1]) ** 2) / (2 * sigma ** 2))
    return np.repeat(b[..., None], 3, axis=-1)


def blob_centre(img: torch.Tensor, radius=5) -> np.ndarray:
    """Intensity-weighted centroid (pixel-centre coordinates) in a window around the brightest pixel."""
    a = img[..., 0].double().numpy()
    r, c = np.unravel_index(np.argmax(a), a.shape)
    r0, r1, c0, c1 = max(0, r - radius), r + radius + 1, max(0, c - radius), c + radius + 1
    w = a[r0:r1, c0:c1]
    vv, uu = np.mgrid[r0:r0 + w.shape[0], c0:c0 + w.shape[1]]
    w = np.where(w > 0.05 * w.max(), w, 0.0)
    return np.array([(w * (uu + 0.5)).sum() / w.sum(), (w * (vv + 0.5)).sum() / w.sum()])


def point_seen_at(cam: Camera, uv, depth) -> np.ndarray:
    """World point that the pinhole ``cam`` sees at pixel ``uv`` at camera depth ``depth``."""
    pc = np.array([(uv[0] - cam.cx) / cam.fx * depth, (uv[1] - cam.cy) / cam.fy * depth, depth])
    return np.linalg.inv(cam.viewmat) @ np.append(pc, 1.0)


def world_to_cam(viewmat, X) -> np.ndarray:
    return (viewmat @ np.append(X[:3], 1.0))[:3]


# ---------------------------------------------------------------------------------------------------------
# Blender / NeRF-synthetic
# ---------------------------------------------------------------------------------------------------------
def test_blender_lego_downscaled(shared_data):
    lego = shared_data / "lego"
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ds = load_dataset(lego, white_bg=True, downscale=16, max_frames=2)
    msgs = [str(w.message) for w in caught]
    assert len(msgs) == 1 and "175 of 200" in msgs[0] and "transforms_test.json" in msgs[0], msgs
    assert ds.source == "blender" and ds.points is None and ds.point_colors is None and ds.white_bg
    assert [f.name for f in ds.train] == ["r_0", "r_1"] and [f.name for f in ds.test] == ["r_0", "r_8"]

    meta = json.loads((lego / "transforms_train.json").read_text())
    f = 0.5 * 50 / math.tan(0.5 * meta["camera_angle_x"])
    for frame, raw in zip(ds.train, meta["frames"][:2]):
        cam = frame.camera
        assert (cam.width, cam.height) == (50, 50)
        assert cam.fx == pytest.approx(f) and cam.fy == pytest.approx(f)
        assert (cam.cx, cam.cy) == (25.0, 25.0)
        np.testing.assert_allclose(cam.viewmat, w2c_from_opengl_c2w(raw["transform_matrix"]), atol=1e-9)
        # image: independent decode, composite on white, 16×16 block mean
        rgba = np.asarray(Image.open(lego / "train" / f"{frame.name}.webp").convert("RGBA"), np.float64) / 255
        comp = rgba[..., :3] * rgba[..., 3:] + (1 - rgba[..., 3:])
        ref = comp.reshape(50, 16, 50, 16, 3).mean((1, 3))
        assert frame.image.shape == (50, 50, 3) and frame.image.dtype == torch.float32
        np.testing.assert_allclose(frame.image.numpy(), ref, atol=2e-5)
        np.testing.assert_allclose(frame.alpha.numpy(), rgba[..., 3].reshape(50, 16, 50, 16).mean((1, 3)), atol=2e-5)

    centres = np.array([np.asarray(fr["transform_matrix"])[:3, 3] for fr in meta["frames"][:2]])
    np.testing.assert_allclose(ds.scene_center, centres.mean(0), atol=1e-9)
    assert ds.scene_extent == pytest.approx(1.1 * np.linalg.norm(centres - centres.mean(0), axis=1).max())


def make_blender(root, g, *, w=12, h=8, n=3, missing=(2,), top_extra=None):
    """A Blender dir with random RGBA images: frame 0 'train/f0' (png, no extension in JSON), frame 1
    'train/f1.png' stored as lossless webp, frames in ``missing`` have no image. Returns (meta, images)."""
    frames, images = [], {}
    for i in range(n):
        c2w = np.linalg.inv(random_pose(g)) @ FLIP
        fp = f"./train/f{i}" if i % 2 == 0 else f"./train/f{i}.png"
        frames.append({"file_path": fp, "transform_matrix": c2w.tolist(), "rotation": 0.1})
        if i in missing:
            continue
        rgba = g.integers(0, 256, size=(h, w, 4), dtype=np.uint8)
        rgba[0, 0, 3], rgba[0, 1, 3] = 0, 255  # both alpha extremes present
        path = root / "train" / (f"f{i}.png" if i % 2 == 0 else f"f{i}.webp")
        path.parent.mkdir(parents=True, exist_ok=True)
        Image.fromarray(rgba, "RGBA").save(path, **({"lossless": True, "exact": True} if i % 2 else {}))
        images[i] = rgba.astype(np.float64) / 255
    meta = {"camera_angle_x": 0.8, "frames": frames, **(top_extra or {})}
    (root / "transforms_train.json").write_text(json.dumps(meta))
    return meta, images


@pytest.mark.parametrize("white_bg", [False, True])
def test_blender_composite_extensions_missing(tmp_path, rng, white_bg):
    g = np_rng(rng)
    meta, images = make_blender(tmp_path, g)
    with pytest.warns(UserWarning, match=r"1 of 3 frames have no image"):
        ds = load_dataset(tmp_path, white_bg=white_bg)
    assert ds.test == [] and [f.name for f in ds.train] == ["f0", "f1"]
    for frame, i in zip(ds.train, (0, 1)):
        rgba = images[i]
        ref = rgba[..., :3] * rgba[..., 3:] + (1 - rgba[..., 3:]) * white_bg
        np.testing.assert_allclose(frame.image.numpy(), ref, atol=1e-6)
        np.testing.assert_allclose(frame.alpha.numpy(), rgba[..., 3], atol=1e-6)
        cam = frame.camera
        f = 0.5 * 12 / math.tan(0.4)
        assert (cam.width, cam.height, cam.cx, cam.cy) == (12, 8, 6.0, 4.0)
        assert cam.fx == pytest.approx(f) and cam.fy == pytest.approx(f)
        np.testing.assert_allclose(cam.viewmat, w2c_from_opengl_c2w(meta["frames"][i]["transform_matrix"]),
                                   atol=1e-9)


def test_blender_downscale_and_overrides(tmp_path, rng):
    g = np_rng(rng)
    # fl_x/fl_y/cx/cy at the top level override camera_angle_x; frame 1 overrides fl_x again
    meta, images = make_blender(tmp_path, g, missing=(), top_extra={"fl_x": 9.0, "fl_y": 10.0, "cx": 5.5, "cy": 4.5})
    meta["frames"][1]["fl_x"] = 7.0
    (tmp_path / "transforms_train.json").write_text(json.dumps(meta))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # nothing missing, nothing resized: no warning at all
        ds = load_dataset(tmp_path, downscale=2)
    cams = [f.camera for f in ds.train]
    assert [(c.width, c.height) for c in cams] == [(6, 4)] * 3
    assert [(c.fx, c.fy, c.cx, c.cy) for c in cams] == [(4.5, 5.0, 2.75, 2.25), (3.5, 3.5, 2.75, 2.25),
                                                        (4.5, 5.0, 2.75, 2.25)]
    for frame, i in zip(ds.train, range(3)):
        rgba = images[i]
        comp = rgba[..., :3] * rgba[..., 3:]
        np.testing.assert_allclose(frame.image.numpy(), comp.reshape(4, 2, 6, 2, 3).mean((1, 3)), atol=1e-6)
        np.testing.assert_allclose(frame.alpha.numpy(), rgba[..., 3].reshape(4, 2, 6, 2).mean((1, 3)), atol=1e-6)


def test_blender_errors(tmp_path, rng):
    g = np_rng(rng)
    make_blender(tmp_path, g, missing=(0, 1, 2))
    with pytest.warns(UserWarning, match="3 of 3"), pytest.raises(DatasetError, match="transforms_train.json"):
        load_dataset(tmp_path)
    (tmp_path / "transforms_train.json").write_text("{not json")
    with pytest.raises(DatasetError, match=r"transforms_train.json.*JSON"):
        load_dataset(tmp_path)
    meta, _ = make_blender(tmp_path, g, missing=())
    del meta["frames"][1]["transform_matrix"]
    (tmp_path / "transforms_train.json").write_text(json.dumps(meta))
    with pytest.raises(DatasetError, match=r"transforms_train.json: frame 1.*transform_matrix"):
        load_dataset(tmp_path)
    meta["frames"][1]["transform_matrix"] = np.eye(4).tolist()
    del meta["camera_angle_x"]
    (tmp_path / "transforms_train.json").write_text(json.dumps(meta))
    with pytest.raises(DatasetError, match="focal length"):
        load_dataset(tmp_path)
    (tmp_path / "train" / "f0.png").write_bytes(b"not an image")
    meta["camera_angle_x"] = 0.7
    (tmp_path / "transforms_train.json").write_text(json.dumps(meta))
    with pytest.raises(DatasetError, match=r"f0.png"):
        load_dataset(tmp_path)


def test_detect_format_errors(tmp_path):
    with pytest.raises(DatasetError, match=r"transforms.json.*sparse/0"):
        load_dataset(tmp_path)
    with pytest.raises(DatasetError, match="no such file"):
        load_dataset(tmp_path / "nope")
    with pytest.raises(ValueError, match="unknown dataset format"):
        load_dataset(tmp_path, format="nerf")
    (tmp_path / "sparse" / "0").mkdir(parents=True)
    (tmp_path / "sparse" / "0" / "cameras.txt").write_text("")
    assert detect_format(tmp_path) == ("colmap", tmp_path)
    (tmp_path / "transforms.json").write_text("{}")
    assert detect_format(tmp_path) == ("ngp", tmp_path / "transforms.json")
    assert detect_format(tmp_path / "transforms.json") == ("ngp", tmp_path / "transforms.json")
    (tmp_path / "transforms_train.json").write_text("{}")
    assert detect_format(tmp_path) == ("blender", tmp_path)


# ---------------------------------------------------------------------------------------------------------
# Undistortion
# ---------------------------------------------------------------------------------------------------------
def test_opencv_distort_matches_pycolmap(rng):
    pycolmap = pytest.importorskip("pycolmap")
    g = np_rng(rng)
    k1, k2, p1, p2, k3 = g.uniform(-0.3, 0.3), g.uniform(-0.1, 0.1), g.uniform(-0.01, 0.01), \
        g.uniform(-0.01, 0.01), g.uniform(-0.05, 0.05)
    fx, fy, cx, cy = 100.0, 110.0, 51.0, 39.0
    cam = pycolmap.Camera.create_from_model_name(1, "FULL_OPENCV", fx, 100, 80)
    cam.params = [fx, fy, cx, cy, k1, k2, p1, p2, k3, 0.0, 0.0, 0.0]
    xy = g.uniform(-0.6, 0.6, size=(200, 2))
    ref = np.asarray(cam.img_from_cam(np.concatenate([xy, np.ones((200, 1))], 1)))
    xd, yd = opencv_distort(xy[:, 0], xy[:, 1], k1, k2, p1, p2, k3)
    np.testing.assert_allclose(np.stack([fx * xd + cx, fy * yd + cy], 1), ref, atol=1e-9)


def test_remap_identity_and_zero_distortion(rng):
    img = torch.rand(9, 13, 3, generator=rng).numpy()
    np.testing.assert_allclose(undistort_opencv(img, 10.0, 11.0, 6.5, 4.5, {}), img, atol=1e-6)
    # a shift by one pixel moves the content; the last column then samples beyond the image border: black
    u, v = np.meshgrid(np.arange(13) + 0.5, np.arange(9) + 0.5)
    out = remap_bilinear(img, np.stack([u + 1.0, v], -1))
    np.testing.assert_allclose(out[:, :-1], img[:, 1:], atol=1e-6)
    assert np.all(out[:, -1] == 0)
    # half a pixel: the mean of neighbours; at the border itself (u = width) the edge value
    out = remap_bilinear(img, np.stack([u + 0.5, v - 0.5], -1))
    np.testing.assert_allclose(out[1:, :-1], (img[:-1, :-1] + img[:-1, 1:] + img[1:, :-1] + img[1:, 1:]) / 4,
                               atol=1e-6)
    np.testing.assert_allclose(out[0, 0], (img[0, 0] + img[0, 1]) / 2, atol=1e-6)  # v = 0: top border
    np.testing.assert_allclose(out[1:, -1], (img[:-1, -1] + img[1:, -1]) / 2, atol=1e-6)


def test_ngp_distortion_overrides_split(tmp_path, rng):
    pycolmap = pytest.importorskip("pycolmap")
    g = np_rng(rng)
    W, H = 64, 56
    shared = {"fl_x": 52.0, "fl_y": 50.0, "cx": 31.0, "cy": 29.0, "w": W, "h": H,
              "k1": -0.3, "k2": 0.08, "p1": 0.003, "p2": -0.002, "k3": 0.01,
              "aabb_scale": 16, "scale": 0.33, "offset": [0.5, 0.5, 0.5]}
    portrait = {"w": 40, "h": 60, "fl_x": 45.0, "fl_y": 46.0, "cx": 19.0, "cy": 31.0, "k1": -0.25}
    frames, expect = [], {}
    for i in range(7):
        vm = random_pose(g)
        name = f"img_{i:02d}"
        frame = {"file_path": f"images/{name}.png", "transform_matrix": (np.linalg.inv(vm) @ FLIP).tolist()}
        intr = dict(shared)
        if i == 4:
            frame.update(portrait)
            intr.update(portrait)
        frames.append(frame)
        if i == 6:
            continue  # image missing
        pin = Camera(intr["w"], intr["h"], intr["fl_x"], intr["fl_y"], intr["cx"], intr["cy"], vm)
        X = point_seen_at(pin, (0.88 * intr["w"], 0.15 * intr["h"]), 3.5)  # near a corner: strong distortion
        colmap_cam = pycolmap.Camera.create_from_model_name(1, "FULL_OPENCV", 1.0, intr["w"], intr["h"])
        colmap_cam.params = [intr["fl_x"], intr["fl_y"], intr["cx"], intr["cy"], intr["k1"], intr.get("k2", 0),
                             intr.get("p1", 0), intr.get("p2", 0), intr.get("k3", 0), 0, 0, 0]
        uv_d = np.asarray(colmap_cam.img_from_cam(world_to_cam(vm, X)[None]))[0]
        assert np.linalg.norm(uv_d - pin.project(X[None, :3])[0]) > 1.5  # the lens matters here
        save_u8(tmp_path / "images" / f"{name}.png", blob_image(intr["w"], intr["h"], uv_d))
        expect[name] = (pin, X)
    # shuffled order in the file: the split follows the sorted names
    order = g.permutation(7)
    (tmp_path / "transforms.json").write_text(json.dumps({**shared, "frames": [frames[i] for i in order]}))
    with pytest.warns(UserWarning, match="1 of 7 frames have no image"):
        ds = load_dataset(tmp_path, test_every=3)
    assert ds.source == "ngp" and ds.points is None
    assert [f.name for f in ds.test] == ["img_00", "img_03"]
    assert [f.name for f in ds.train] == ["img_01", "img_02", "img_04", "img_05"]
    for frame in ds.train + ds.test:
        pin, X = expect[frame.name]
        cam = frame.camera
        assert (cam.width, cam.height, cam.fx, cam.fy, cam.cx, cam.cy) == \
               (pin.width, pin.height, pin.fx, pin.fy, pin.cx, pin.cy)
        np.testing.assert_allclose(cam.viewmat, pin.viewmat, atol=1e-9)  # aabb_scale/scale/offset ignored
        assert frame.image.shape == (pin.height, pin.width, 3) and frame.alpha is None
        np.testing.assert_allclose(blob_centre(frame.image), cam.project(X[None, :3])[0], atol=0.3)


# ---------------------------------------------------------------------------------------------------------
# COLMAP
# ---------------------------------------------------------------------------------------------------------
def write_colmap(root, cams, images, points, colors):
    """cams: {id: (model, w, h, params)}; images: [(name, camera_id, viewmat)]; writes root/sparse/0."""
    import pycolmap

    rec = pycolmap.Reconstruction()
    for cid, (model, w, h, params) in cams.items():
        c = pycolmap.Camera.create_from_model_name(cid, model, 1.0, w, h)
        c.params = params
        rec.add_camera_with_trivial_rig(c)
    for iid, (name, cid, vm) in enumerate(images, start=1):
        im = pycolmap.Image(name=name, camera_id=cid, image_id=iid)
        rec.add_image_with_trivial_frame(im, pycolmap.Rigid3d(np.asarray(vm)[:3, :4]))
    for p, c in zip(points, colors):
        rec.add_point3D(p, pycolmap.Track(), c)
    (root / "sparse" / "0").mkdir(parents=True)
    rec.write(str(root / "sparse" / "0"))


def test_colmap_pinhole_distorted_points_split(tmp_path, rng):
    pycolmap = pytest.importorskip("pycolmap")
    g = np_rng(rng)
    cams = {1: ("PINHOLE", 40, 30, [35.0, 36.0, 20.5, 14.5]),
            2: ("SIMPLE_RADIAL", 48, 36, [40.0, 24.0, 18.0, -0.15]),
            3: ("OPENCV", 36, 48, [38.0, 39.0, 18.5, 24.5, -0.12, 0.02, 0.002, -0.003])}
    images, expect = [], {}
    for i in range(10):
        cid = 1 + i % 3
        model, w, h, params = cams[cid]
        name = f"frame_{i:02d}.png"
        vm = random_pose(g)
        images.append((name, cid, vm))
        if i == 9:
            continue  # registered but no image file
        ccam = pycolmap.Camera.create_from_model_name(cid, model, 1.0, w, h)
        ccam.params = params
        K = ccam.calibration_matrix()
        pin = Camera(w, h, K[0, 0], K[1, 1], K[0, 2], K[1, 2], vm)
        X = point_seen_at(pin, (0.2 * w, 0.8 * h), 3.0)
        uv = np.asarray(ccam.img_from_cam(world_to_cam(vm, X)[None]))[0]
        save_u8(tmp_path / "images" / name, blob_image(w, h, uv))
        expect[name[:-4]] = (pin, X)
    pts = g.normal(size=(17, 3))
    cols = g.integers(0, 256, size=(17, 3), dtype=np.uint8)
    g.shuffle(images)  # image ids in random order; the split follows names
    write_colmap(tmp_path, cams, images, pts, cols)

    with pytest.warns(UserWarning, match="1 of 10"):
        ds = load_dataset(tmp_path, downscale=1)
    assert ds.source == "colmap"
    assert [f.name for f in ds.test] == ["frame_00", "frame_08"]
    assert [f.name for f in ds.train] == [f"frame_{i:02d}" for i in (1, 2, 3, 4, 5, 6, 7)]
    order = np.lexsort(pts.T[::-1])
    got = np.lexsort(ds.points.T[::-1])
    np.testing.assert_allclose(ds.points[got], pts[order], atol=1e-12)
    np.testing.assert_allclose(ds.point_colors[got], cols[order] / 255.0, atol=1e-12)
    for frame in ds.train + ds.test:
        pin, X = expect[frame.name]
        cam = frame.camera
        assert (cam.width, cam.height) == (pin.width, pin.height)
        np.testing.assert_allclose([cam.fx, cam.fy, cam.cx, cam.cy], [pin.fx, pin.fy, pin.cx, pin.cy])
        np.testing.assert_allclose(cam.viewmat, pin.viewmat, atol=1e-9)
        np.testing.assert_allclose(blob_centre(frame.image), cam.project(X[None, :3])[0], atol=0.3)
    # downscale: sizes and intrinsics follow Camera.scaled
    with pytest.warns(UserWarning, match="1 of 10"):
        ds2 = load_dataset(tmp_path, downscale=2, test_every=0, max_frames=3)
    assert ds2.test == [] and len(ds2.train) == 3
    for f in ds2.train:
        pin = expect[f.name][0].scaled(0.5)
        assert (f.camera.width, f.camera.height, f.camera.fx, f.camera.cx) == (pin.width, pin.height, pin.fx, pin.cx)
        assert f.image.shape == (pin.height, pin.width, 3)


def test_colmap_no_images_error(tmp_path, rng):
    pytest.importorskip("pycolmap")
    write_colmap(tmp_path, {1: ("SIMPLE_PINHOLE", 8, 8, [8.0, 4.0, 4.0])},
                 [("a.png", 1, random_pose(np_rng(rng)))], np.zeros((0, 3)), np.zeros((0, 3), np.uint8))
    with pytest.warns(UserWarning, match="1 of 1"), pytest.raises(DatasetError, match=r"sparse/0.*images"):
        load_dataset(tmp_path)


# ---------------------------------------------------------------------------------------------------------
# The same camera in all three formats
# ---------------------------------------------------------------------------------------------------------
def test_cameras_agree_across_formats(shared_data, tmp_path, rng):
    pytest.importorskip("pycolmap")
    lego = shared_data / "lego"
    n, size = 6, 100
    with pytest.warns(UserWarning, match="175 of 200"):
        blender = load_dataset(lego, downscale=8, max_frames=n, white_bg=True)
    meta = json.loads((lego / "transforms_train.json").read_text())
    f = 0.5 * size / math.tan(0.5 * meta["camera_angle_x"])
    raw = [fr["transform_matrix"] for fr in meta["frames"][:n]]
    blank = np.zeros((size, size, 3))

    ngp_dir = tmp_path / "ngp"
    frames = []
    for i, m in enumerate(raw):
        frames.append({"file_path": f"images/r_{i}", "transform_matrix": m})
        save_u8(ngp_dir / "images" / f"r_{i}.png", blank)
    # frame 2 declares 2× the size (and focal, principal point): its 100×100 image rescales it back
    frames[2].update({"w": 2 * size, "h": 2 * size, "fl_x": 2 * f, "cx": size, "cy": size})
    (ngp_dir / "transforms.json").write_text(json.dumps(
        {"fl_x": f, "fl_y": f, "cx": size / 2, "cy": size / 2, "w": size, "h": size,
         "k1": 0.05, "k2": -0.01, "p1": 0.001, "p2": 0.001, "frames": frames}))
    with pytest.warns(UserWarning, match="rescaled"):
        ngp = load_dataset(ngp_dir, test_every=0)

    colmap_dir = tmp_path / "colmap"
    for i in range(n):
        save_u8(colmap_dir / "images" / f"r_{i}.png", blank)
    write_colmap(colmap_dir, {1: ("PINHOLE", size, size, [f, f, size / 2, size / 2])},
                 [(f"r_{i}.png", 1, w2c_from_opengl_c2w(m)) for i, m in enumerate(raw)], [], [])
    colmap = load_dataset(colmap_dir, test_every=0)

    g = np_rng(rng)
    pts = g.uniform(-1.0, 1.0, size=(200, 3))
    for i in range(n):
        cams = [blender.train[i].camera, ngp.train[i].camera, colmap.train[i].camera]
        assert {c.name for c in cams} == {f"r_{i}"}
        assert {(c.width, c.height) for c in cams} == {(size, size)}
        ref = cams[0].project(pts)
        in_view = np.all((ref > 0) & (ref < size), axis=1)
        assert in_view.sum() >= 20  # enough points in view for a meaningful comparison
        # 1e-4 px: COLMAP stores the rotation as a unit quaternion, re-orthonormalising lego's float32
        # matrices (orthonormal to ~1e-7), which moves projections by ~1e-6 px; a convention error moves pixels.
        for c in cams[1:]:
            np.testing.assert_allclose(c.project(pts[in_view]), ref[in_view], atol=1e-4)
