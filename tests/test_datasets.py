"""Datasets: Blender / NeRF-synthetic, instant-ngp and COLMAP loaders, load-time undistortion, format detection.

References are written independently here: camera poses from the raw matrices (OpenGL c2w → flip y, z →
invert), lens models from pycolmap's own ``img_from_cam``, compositing and box downscaling with numpy.
Distortion is checked end to end: a bright dot is drawn where the *distorted* camera sees a 3D point; after
loading, the dot must sit where the returned pinhole camera projects that point (off by pixels if the lens
were ignored or removed twice).
"""
import json
import math
import time
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from rigel_core import Camera
from rigel_core.data import DatasetError, detect_format, load_dataset
from rigel_core.data.convert import c2w_opengl
from rigel_core.data.undistort import opencv_distort, remap_bilinear, undistort_opencv
from rigel_core.io.errors import NoImageFiles

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
    with pytest.warns(UserWarning, match=r"1 of 3 frames have no image file and were skipped \(first: './train/f2'\)"):
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


def test_downscale_to_tiny_images_warns_once(tmp_path, rng):
    from rigel_core.data.frames import PHOTO_PX, TINY_IMAGE_PX

    g = np_rng(rng)
    meta, _ = make_blender(tmp_path, g, w=PHOTO_PX + 32, h=PHOTO_PX, missing=())
    (tmp_path / "transforms_train.json").write_text(json.dumps(meta))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a factor that keeps the short side at the threshold: no warning
        assert load_dataset(tmp_path, downscale=PHOTO_PX / TINY_IMAGE_PX).train[0].camera.height == TINY_IMAGE_PX
    with pytest.warns(UserWarning) as record:
        ds = load_dataset(tmp_path, downscale=20)
    tiny = [str(w.message) for w in record if "too small" in str(w.message)]
    assert len(tiny) == 1, tiny  # once for the dataset, not per image
    assert str(tmp_path) in tiny[0] and "--downscale 20" in tiny[0] and f"from {PHOTO_PX + 32}x{PHOTO_PX}" in tiny[0]
    assert f"{ds.train[0].camera.width}x{ds.train[0].camera.height} px" in tiny[0]
    # an image already smaller than a photo (the tests' synthetic scenes) is not warned about, however far it shrinks
    small = tmp_path / "small"
    small.mkdir()
    meta, _ = make_blender(small, g, w=40, h=30, missing=())
    (small / "transforms_train.json").write_text(json.dumps(meta))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        load_dataset(small, downscale=10)


@pytest.mark.parametrize("size, declared, stretched", [
    ((15, 10), (30, 20), False), ((10, 7), (1000, 662), False), ((7, 10), (1000, 662), True),
    ((20, 30), (30, 20), True), ((30, 18), (30, 20), True), ((101, 100), (100, 100), False),
    ((300, 200), (504, 378), True)])
def test_other_aspect_allows_rounding_of_a_scaled_copy_only(size, declared, stretched):
    """A scaled copy of the declared size, each side rounded to whole pixels, is not stretched; a transposed or
    foreign size is (1000×662 at 10×7: 1.43 against 1.51, only rounding; 300×200 against 504×378: 1.5 against
    1.33)."""
    from rigel_core.data.images import other_aspect

    assert other_aspect(size, declared) == stretched


def test_an_image_of_another_aspect_ratio_is_refused_and_a_scaled_one_rescales(tmp_path, rng):
    """An image whose size is a scaled copy of its camera's: the intrinsics follow it, with one warning. One of
    another aspect ratio (rescaled intrinsics would stretch it; a rotated or foreign photo): DatasetError naming
    that file; nothing is trained on it."""
    g = np_rng(rng)
    meta, _ = make_blender(tmp_path, g, w=12, h=8, missing=())
    meta.update(w=24, h=16)
    (tmp_path / "transforms_train.json").write_text(json.dumps(meta))
    with pytest.warns(UserWarning, match=r"3 image\(s\) differ in size .*train/f0.png is 12x8, its camera 24x16\)"):
        ds = load_dataset(tmp_path)
    assert [(f.camera.width, f.camera.height) for f in ds.train] == [(12, 8)] * 3
    assert ds.train[0].camera.cx == pytest.approx(6.0) and ds.train[0].camera.cy == pytest.approx(4.0)
    Image.fromarray(g.integers(0, 256, size=(12, 8, 3), dtype=np.uint8)).save(tmp_path / "train" / "f2.png")
    with pytest.raises(DatasetError) as e:
        load_dataset(tmp_path)
    msg = str(e.value)
    assert "train/f2.png" in msg and "8x12" in msg and "24x16" in msg and "aspect ratio" in msg, msg
    assert "\n" not in msg


@pytest.mark.parametrize("orientation, hint", [(6, True), (8, True), (5, True), (3, False), (None, False)])
def test_an_exif_turned_image_of_another_aspect_says_that_its_stored_pixels_are_read(tmp_path, rng, orientation, hint):
    """A phone JPEG stored 8x12 with an EXIF orientation that shows it 12x8, its camera 24x16: rigel reads the stored
    pixels (as COLMAP does, whose cameras are of those), so it is refused — and the line says why the image looks
    right in a viewer and how to fix it, where it said only "a rotated or foreign image?". An orientation that does
    not turn it (3: upside down) or none keeps the plain line."""
    g = np_rng(rng)
    meta, _ = make_blender(tmp_path, g, w=24, h=16, missing=())
    meta.update(w=24, h=16)   # the camera's size declared (else each frame's camera takes its image's)
    (tmp_path / "transforms_train.json").write_text(json.dumps(meta))
    path = tmp_path / "train" / "f2.jpg"
    (tmp_path / "train" / "f2.png").unlink()
    exif = Image.Exif()
    if orientation is not None:
        exif[0x0112] = orientation
    Image.fromarray(g.integers(0, 256, size=(24, 16, 3), dtype=np.uint8)).save(path, exif=exif)
    with pytest.raises(DatasetError) as e:
        load_dataset(tmp_path)
    msg = str(e.value)
    assert "train/f2.jpg: the image is 16x24, its camera 24x16: another aspect ratio" in msg and "\n" not in msg
    assert (f"its EXIF orientation tag ({orientation}) shows it turned to 24x16, but rigel reads the pixels as stored"
            in msg) == hint, msg
    assert ("a rotated or foreign image?" in msg) != hint, msg


def test_blender_errors(tmp_path, rng):
    g = np_rng(rng)
    make_blender(tmp_path, g, missing=(0, 1, 2))
    # no image at all: one error, of cameras alone (NoImageFiles: rigel-viewer --cameras reads them so), no warning
    with warnings.catch_warnings(), pytest.raises(NoImageFiles, match="transforms_train.json: none of its 3 frames"):
        warnings.simplefilter("error")
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


@pytest.mark.parametrize("n, test_every, warned", [(2, 8, True), (3, 8, True), (4, 8, False), (2, 0, False),
                                                    (6, 2, False)])
def test_a_split_that_leaves_under_three_training_views_is_said(tmp_path, rng, n, test_every, warned):
    """Every Nth view held out (``--test-every``) leaves a capture of 2 views one to train on: a warning naming the
    capture says how many train and how to train on all; none where three or more train, or nothing is held out."""
    g = np_rng(rng)
    (tmp_path / "images").mkdir()
    frames = []
    for i in range(n):
        save_u8(tmp_path / "images" / f"v{i}.png", (g.uniform(size=(12, 16, 3)) * 255).astype(np.uint8))
        c2w = np.linalg.inv(random_pose(g)) @ FLIP
        frames.append({"file_path": f"images/v{i}.png", "transform_matrix": c2w.tolist()})
    (tmp_path / "transforms.json").write_text(json.dumps({"fl_x": 20.0, "fl_y": 20.0, "cx": 8.0, "cy": 6.0,
                                                          "w": 16, "h": 12, "frames": frames}))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ds = load_dataset(tmp_path, test_every=test_every)
    said = [str(w.message) for w in caught if "training view" in str(w.message)]
    if warned:
        n_train = len(ds.train)
        assert n_train < 3 and said == [f"{tmp_path / 'transforms.json'}: {n_train} training view"
                                        f"{'s' if n_train != 1 else ''} after holding {len(ds.test)} out for "
                                        "evaluation (--test-every 0 trains on every view, with no held-out PSNR)"]
    else:
        assert said == []


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
    # one error, no warning besides; NoImageFiles: a model of cameras alone (rigel-viewer --cameras reads it so)
    with warnings.catch_warnings(), pytest.raises(NoImageFiles, match=r"sparse/0: none of its 1 registered.*images"):
        warnings.simplefilter("error")
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


# ---------------------------------------------------------------------------------------------------------
# Hostile and broken inputs (issue 13): one DatasetError naming the file, the record and the field
# ---------------------------------------------------------------------------------------------------------
def _colmap_fixture(root, g, model="PINHOLE", params=(20.0, 21.0, 8.0, 6.0), n_images=2, n_points=5):
    """A small binary COLMAP model with images present; returns the sparse dir."""
    images = []
    for i in range(n_images):
        save_u8(root / "images" / f"im{i}.png", np.zeros((12, 16, 3), np.uint8))
        images.append((f"im{i}.png", 1, random_pose(g)))
    write_colmap(root, {1: (model, 16, 12, list(params))}, images, g.normal(size=(n_points, 3)),
                 g.integers(0, 256, size=(n_points, 3), dtype=np.uint8))
    return root / "sparse" / "0"


def _assert_dataset_error(excinfo, path, *fragments):
    msg = str(excinfo.value)
    assert "\n" not in msg and str(path) in msg, msg
    for f in fragments:
        assert f in msg, f"{f!r} not in {msg!r}"


@pytest.mark.parametrize("ext", ["bin", "txt"])
def test_a_colmap_model_without_points3d_loads_without_sfm_points(tmp_path, rng, ext):
    """cameras and images without points3D (a model of known poses, points3D deleted): loaded as a model without
    SfM points — the views as with an empty points3D, ``points`` None (a random start) — and the folder left as it
    was (pycolmap reads a temporary copy beside an empty points3D); before: refused as incomplete. A model missing
    its images too stays refused, in one line."""
    pycolmap = pytest.importorskip("pycolmap")
    sparse = _colmap_fixture(tmp_path, np_rng(rng))
    if ext == "txt":
        pycolmap.Reconstruction(str(sparse)).write_text(str(sparse))
        for f in sparse.glob("*.bin"):
            f.unlink()
    (sparse / f"points3D.{ext}").unlink()
    before = sorted(p.name for p in sparse.iterdir())
    ds = load_dataset(tmp_path, test_every=0)
    assert len(ds.train) == 2 and ds.points is None
    assert sorted(p.name for p in sparse.iterdir()) == before
    (sparse / f"points3D.{ext}").write_bytes(bytes(8) if ext == "bin" else b"")
    same = load_dataset(tmp_path, test_every=0)
    for a, b in zip(ds.train, same.train):
        assert torch.equal(a.image, b.image) and np.array_equal(a.camera.viewmat, b.camera.viewmat)
    (sparse / f"points3D.{ext}").unlink()
    (sparse / f"images.{ext}").unlink()
    with pytest.raises(DatasetError) as e:
        load_dataset(tmp_path)
    _assert_dataset_error(e, sparse, "incomplete COLMAP model", f"cameras.{ext}")


@pytest.mark.parametrize("model_id,name", [(17, "EQUIRECTANGULAR"), (7, "FOV"), (99, "unknown")])
def test_colmap_unsupported_model_refused_by_id(tmp_path, rng, model_id, name):
    """Before: pycolmap was asked for focal_length_x of an EQUIRECTANGULAR camera and the process segfaulted."""
    pytest.importorskip("pycolmap")
    sparse = _colmap_fixture(tmp_path, np_rng(rng))
    cams = bytearray((sparse / "cameras.bin").read_bytes())
    cams[12:16] = int(model_id).to_bytes(4, "little", signed=True)  # u64 count, i32 camera_id, i32 model_id
    (sparse / "cameras.bin").write_bytes(bytes(cams))
    with pytest.raises(DatasetError) as e:
        load_dataset(tmp_path)
    _assert_dataset_error(e, sparse / "cameras.bin", f"{name} (id {model_id})", "not supported", "camera 1")
    # the text model is refused by name the same way
    text = tmp_path / "txt"
    (text / "sparse" / "0").mkdir(parents=True)
    (text / "images").symlink_to(tmp_path / "images")
    (text / "sparse" / "0" / "cameras.txt").write_text("# c\n1 EQUIRECTANGULAR 16 12\n")
    (text / "sparse" / "0" / "images.txt").write_text("")
    (text / "sparse" / "0" / "points3D.txt").write_text("")
    with pytest.raises(DatasetError) as e:
        load_dataset(text)
    _assert_dataset_error(e, text / "sparse" / "0" / "cameras.txt", "EQUIRECTANGULAR (id 17)", "not supported")


@pytest.mark.parametrize("kind", ["cameras", "images", "points3D"])
def test_colmap_truncated_or_huge_counts_refused(tmp_path, rng, kind):
    """Before: an empty or truncated points3D.bin made pycolmap reserve ~9 GB; cameras.bin one byte short loaded."""
    pytest.importorskip("pycolmap")
    g = np_rng(rng)
    sparse = _colmap_fixture(tmp_path, g)
    f = sparse / f"{kind}.bin"
    good = f.read_bytes()
    cut = int(g.integers(1, len(good)))
    for data, frag in [(good[:-1], "truncated"),                      # one byte short
                       (good[:cut], ""),                               # a random cut: truncated or corrupt
                       (b"", "truncated"),                             # empty
                       (b"\xff" * 8 + good[8:], "declares"),           # 2^64-1 records
                       (good + b"\0" * int(g.integers(1, 9)), "after the last declared record")]:
        f.write_bytes(data)
        t0 = time.perf_counter()
        with pytest.raises(DatasetError) as e:
            load_dataset(tmp_path)
        assert time.perf_counter() - t0 < 5
        _assert_dataset_error(e, f, frag)


@pytest.mark.parametrize("model,params,frag", [
    ("PINHOLE", [float("nan"), 20.0, 8.0, 6.0], "focal length fx = nan"),
    ("PINHOLE", [20.0, -3.0, 8.0, 6.0], "focal length fy = -3.0"),
    ("SIMPLE_PINHOLE", [0.0, 8.0, 6.0], "focal length f = 0.0"),
    ("PINHOLE", [20.0, 20.0, float("inf"), 6.0], "principal point cx = inf"),
    ("OPENCV", [20.0, 20.0, 8.0, 6.0, float("nan"), 0, 0, 0], "params[4] = nan"),
    # absurd intrinsics (limits.focal_length_problem): a field of view over 170°, a pixel under 1e-6 rad
    ("PINHOLE", [1e-30, 20.0, 8.0, 6.0], "focal length fx: a field of view of 180° over 16 px"),
    ("PINHOLE", [20.0, 0.5, 8.0, 6.0], "focal length fy: a field of view of 170.5° over 12 px"),
    ("SIMPLE_RADIAL", [3e8, 8.0, 6.0, 0.0], "focal length f: a field of view of"),
    ("PINHOLE", [20.0, 1.1e6, 8.0, 6.0], "each pixel spans 9.09e-07 rad, under 1e-06 rad"),
])
def test_colmap_camera_numbers_refused(tmp_path, rng, model, params, frag):
    """Before: NaN/Inf/zero intrinsics loaded and rendered black (exit 0)."""
    pytest.importorskip("pycolmap")
    sparse = _colmap_fixture(tmp_path, np_rng(rng), model=model, params=params)
    with pytest.raises(DatasetError) as e:
        load_dataset(tmp_path)
    _assert_dataset_error(e, sparse / "cameras.bin", "camera 1", model, frag)


def _ngp(tmp_path, top: dict, frame: dict | None = None):
    m = np.eye(4)
    m[2, 3] = 4.0
    frame = {"file_path": "im.png", "transform_matrix": m.tolist(), **(frame or {})}
    path = tmp_path / "transforms.json"
    path.write_text(json.dumps({"frames": [frame], **top}, allow_nan=True))
    return path


@pytest.mark.parametrize("top,frame,frag", [
    ({"camera_angle_x": math.pi, "w": 8, "h": 8}, None, "camera_angle_x must be an angle in (0, pi)"),
    ({"camera_angle_x": 0, "w": 8, "h": 8}, None, "camera_angle_x must be an angle in (0, pi)"),
    ({"camera_angle_x": True, "w": 8, "h": 8}, None, "'camera_angle_x' must be a number, got bool"),
    ({"fl_x": 5, "w": 8, "h": 8, "k1": float("nan")}, None, "'k1' must be finite"),
    ({"fl_x": 5, "w": 8, "h": 8}, {"cx": float("inf")}, "'cx' must be finite"),
    ({"fl_x": 5, "w": 8, "h": 8}, {"cy": float("nan")}, "'cy' must be finite"),
    ({"fl_x": -5, "w": 8, "h": 8}, None, "'fl_x' (focal length) must be > 0"),
    ({"fl_x": 5, "fl_y": 0, "w": 8, "h": 8}, None, "'fl_y' (focal length) must be > 0"),
    ({"fl_x": "5", "w": 8, "h": 8}, None, "'fl_x' must be a number, got str"),
    # absurd intrinsics (limits.focal_length_problem): a field of view over 170°, a pixel under 1e-6 rad; the
    # field named is the one the file gave (both loaded, with exit 0, and trained garbage)
    ({"fl_x": 1e-30, "w": 800, "h": 600}, None, "'fl_x': a field of view of 180° over 800 px (focal length 1e-30 px)"),
    ({"camera_angle_x": 3e-6, "w": 800, "h": 600}, None, "'camera_angle_x': a field of view of 0.0001719° over 800 px"),
    ({"camera_angle_x": 3.1, "w": 800, "h": 600}, None, "'camera_angle_x': a field of view of 177.6°"),
    ({"fl_x": 500, "fl_y": 3e8, "w": 800, "h": 600}, None, "'fl_y': a field of view of"),
    ({"fl_x": 500, "camera_angle_y": 1e-7, "w": 800, "h": 600}, None, "'camera_angle_y': a field of view of"),
    ({"camera_angle_x": 1e-7, "w": 800, "h": 600}, None, "each pixel spans 1.25e-10 rad, under 1e-06 rad"),
    ({"fl_x": 5, "w": 8.5, "h": 8}, None, "'w' must be a whole number"),
    ({"fl_x": 5, "w": 0, "h": 8}, None, "not positive"),
    ({"fl_x": 5, "w": -8, "h": 8}, None, "not positive"),
    ({"fl_x": 5, "w": 1e300, "h": 8}, None, "exceeds the limit"),
    ({"fl_x": 5, "w": 20000, "h": 8}, None, "exceeds the limit of 16384"),
    ({"fl_x": 5, "w": 10 ** 400, "h": 8}, None, "'w'"),
    ({"fl_x": 5, "w": 8, "h": 8}, {"transform_matrix": [[1, 0, 0, 0]] * 3 + [[0, 0, 0, True]]}, "entries must be numbers"),
    ({"fl_x": 5, "w": 8, "h": 8}, {"transform_matrix": np.diag([2.0, 2, 2, 1]).tolist()}, "transform_matrix's 3x3 part is not a rotation"),
    ({"fl_x": 5, "w": 8, "h": 8}, {"transform_matrix": [[1, 0, 0, float("nan")], [0, 1, 0, 0], [0, 0, 1, 0],
                                                       [0, 0, 0, 1]]}, "transform_matrix has 1 non-finite entries"),
    ({"fl_x": 5, "w": 8, "h": 8}, {"transform_matrix": [[1, 0, 0, 0]] * 2}, "must be a 4x4 or 3x4 list of rows"),
])
def test_transforms_camera_numbers_refused(tmp_path, top, frame, frag):
    """Before: these loaded as silent black renders (exit 0) or raised ZeroDivisionError/OverflowError."""
    path = _ngp(tmp_path, top, frame)
    from rigel_core.data.transforms import read_transforms

    with pytest.raises(DatasetError) as e:
        read_transforms(path, require_images=False)
    _assert_dataset_error(e, path, "frame 0", frag)


@pytest.mark.parametrize("case,frag", [
    ("nul", "NUL byte"), ("long", "5000 characters"), ("component", "300-byte component"),
    ("deep", "nested too deeply"), ("deep_ok_parser", "nested more than 32 levels"), ("not_utf8", "JSON"),
])
def test_transforms_paths_and_json_refused(tmp_path, case, frag):
    """Before: RecursionError, ValueError (embedded null byte) and OSError (name too long) tracebacks."""
    path = tmp_path / "transforms.json"
    fp = {"nul": "im\0.png", "long": "d/" * 2500, "component": "x" * 300}.get(case)
    if fp is not None:
        path = _ngp(tmp_path, {"fl_x": 5, "w": 8, "h": 8}, {"file_path": fp})
    elif case == "deep":
        path.write_text("[" * 100_000 + "]" * 100_000)
    elif case == "deep_ok_parser":
        path.write_text('{"frames": [], "x": ' + "[" * 40 + "]" * 40 + "}")
    else:
        path.write_bytes(b'{"frames": [], "x": "\xff\xfe"}')
    with pytest.raises(DatasetError) as e:
        load_dataset(path)
    _assert_dataset_error(e, path, frag)


def _png_header_only(path, width, height):
    """A PNG whose IHDR declares ``width × height`` (8-bit RGB) followed by a tiny IDAT and IEND."""
    import struct
    import zlib

    def chunk(kind, data):
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    path.write_bytes(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(b"\0" * 64))
                     + chunk(b"IEND", b""))


@pytest.mark.parametrize("size,frag", [((100_000, 100_000), "too large"), ((20_000, 2), "exceeds the limit")])
def test_image_header_over_the_cap(tmp_path, size, frag):
    """Before: Pillow's DecompressionBombError escaped as a traceback; a 20000-wide image decoded in full."""
    _png_header_only(tmp_path / "im.png", *size)
    path = _ngp(tmp_path, {"fl_x": 5, "w": 8, "h": 8})
    with pytest.raises(DatasetError) as e:
        load_dataset(path, test_every=0)
    _assert_dataset_error(e, tmp_path / "im.png", frag)


def test_pillows_own_bomb_guard_does_not_override_rigels_caps(tmp_path, monkeypatch):
    """Pillow warns from ~89 M pixels and refuses from ~179 M, below rigel's caps (MAX_IMAGE_PIXELS, checked from the
    header): a 150 M pixel capture warned once per decode, and one of 200 M pixels, within the caps, was refused.
    Pillow's guard is lowered here to 100 pixels so that a 32x32 image stands for such a one."""
    import warnings

    from PIL import Image

    from rigel_core.data.images import read_image

    path = tmp_path / "im.png"
    Image.fromarray(np.full((32, 32, 3), 7, np.uint8)).save(path)
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 100)   # 1,024 pixels: more than twice Pillow's cap
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        img = read_image(path)
    assert img.shape == (32, 32, 3) and np.allclose(img, 7 / 255)


@pytest.mark.parametrize("field,value,frag", [
    ("width", 0, "width must be in 1.."), ("height", 2 ** 21, "height must be in 1.."),
    ("width", 12.5, "whole number"), ("width", True, "must be a number"), ("fx", "3", "must be a number"),
    ("fx", float("nan"), "fx (focal length) must be finite and > 0"), ("fy", -1.0, "fy (focal length)"),
    ("cx", float("inf"), "cx (principal point) must be finite"), ("cy", float("nan"), "cy (principal point)"),
    ("viewmat", np.diag([1.0, 1.0, -1.0, 1.0]), "reflection"), ("viewmat", np.diag([2.0, 2, 2, 1]), "not a rotation"),
    ("viewmat", np.full((4, 4), np.nan), "NaN or Inf"), ("viewmat", np.eye(3), "4x4"),
])
def test_camera_constructor_validates(rng, field, value, frag):
    kw = dict(width=16, height=12, fx=20.0, fy=21.0, cx=8.0, cy=6.0, viewmat=np.eye(4))
    Camera(**kw)  # the base is valid
    kw[field] = value
    with pytest.raises(ValueError, match=None) as e:
        Camera(**kw)
    assert frag in str(e.value)
    # a proper rotation with float32 round-off is accepted
    g = np_rng(rng)
    Camera(16, 12, 20.0, 20.0, 8.0, 6.0, random_pose(g).astype(np.float32))


@pytest.mark.parametrize("far", [1e300, 1e39, 1e30, 2e8])
def test_a_camera_beyond_float32s_range_is_one_clear_error(tmp_path, rng, far):
    """A pose that puts a camera at 1e30 used to train to ~4 dB, write a model of infinities and exit 0 (extent
    inf): now the loader names the frame. Up to MAX_CAMERA_COORD (georeferenced captures) is accepted."""
    from rigel_core.limits import MAX_CAMERA_COORD

    w, h = 12, 10
    cams = [Camera.look_at((3 * math.cos(a), 3 * math.sin(a), 1), (0, 0, 0), width=w, height=h, name=f"v{i}")
            for i, a in enumerate(np.linspace(0, 2 * math.pi, 6, endpoint=False))]
    frames = []
    for cam in cams:
        save_u8(tmp_path / "images" / f"{cam.name}.png", np.zeros((h, w, 3)))
        frames.append({"file_path": f"images/{cam.name}.png", "transform_matrix": c2w_opengl(cam).tolist()})
    frames[3]["transform_matrix"][1][3] = far
    (tmp_path / "transforms.json").write_text(json.dumps({"fl_x": 10.0, "frames": frames}))
    with pytest.raises(DatasetError,
                       match=r"transforms.json: frame 3 .*transform_matrix: the camera lies at .*beyond 1e\+08"):
        load_dataset(tmp_path, test_every=0)
    frames[3]["transform_matrix"][1][3] = 0.5 * MAX_CAMERA_COORD   # far, but representable: a warning names it
    (tmp_path / "transforms.json").write_text(json.dumps({"fl_x": 10.0, "frames": frames}))
    with pytest.warns(UserWarning, match=r"camera 'v3' lies .*x farther .* check that frame's pose"):
        ds = load_dataset(tmp_path, test_every=0)
    assert ds.scene_extent > 0.25 * MAX_CAMERA_COORD   # (the mean centre moves a sixth of the way out)
    # a camera built in code is not bounded: the viewer's orbit zoomed far out renders an empty view, not an error
    Camera.look_at((3e8, 0.0, 1.0), (0.0, 0.0, 0.0), width=8, height=8)


def test_an_ordinary_camera_ring_gives_no_outlier_warning(rng):
    """The outlier rule (camera_extent) on rings with one camera pulled out by a factor: named beyond
    OUTLIER_CAMERA_FACTOR times the median distance, silent below; fewer than 5 cameras are never judged."""
    import warnings as _w

    from rigel_core.data.frames import OUTLIER_CAMERA_FACTOR, camera_extent

    g = np_rng(rng)
    for pull, named in ((1.0, False), (0.5 * OUTLIER_CAMERA_FACTOR, False), (3.0 * OUTLIER_CAMERA_FACTOR, True)):
        eyes = [g.normal(size=3) for _ in range(12)]
        eyes = [3 * e / np.linalg.norm(e) for e in eyes]
        eyes[5] = eyes[5] * pull
        cams = [Camera.look_at(tuple(e), (0, 0, 0), width=8, height=8, name=f"c{i}") for i, e in enumerate(eyes)]
        with _w.catch_warnings(record=True) as rec:
            _w.simplefilter("always")
            camera_extent(cams)
            camera_extent(cams[:4])   # too few to judge
        msgs = [str(r.message) for r in rec]
        assert (len(msgs) == 1 and "'c5'" in msgs[0]) if named else not msgs, (pull, msgs)


def test_frames_in_sub_folders_keep_distinct_names_and_render_splits_like_the_loader(tmp_path):
    """``camK/imgNN.png`` frames: names shared across folders become "camK_imgNN" (they name the renders and the
    metrics' per-view entries, where "img00" twice overwrote one view's files), and ``rigel-render --split test``
    picks the views the loader holds out (it sorted by name, the loader by path)."""
    from rigel_core.cli.render import resolve_cameras

    w, h = 8, 6
    frames = []
    for k in range(4):
        for i in (0, 4, 8, 12):
            cam = Camera.look_at((3 * math.cos(k + i), 3 * math.sin(k + i), 1), (0, 0, 0), width=w, height=h)
            path = f"cam{k}/img{i:02d}.png"
            save_u8(tmp_path / path, np.zeros((h, w, 3)))
            frames.append({"file_path": path, "transform_matrix": c2w_opengl(cam).tolist()})
    frames.append({"file_path": "solo.png", "transform_matrix": frames[0]["transform_matrix"]})
    save_u8(tmp_path / "solo.png", np.zeros((h, w, 3)))
    (tmp_path / "transforms.json").write_text(json.dumps({"fl_x": 10.0, "frames": frames}))
    ds = load_dataset(tmp_path)   # every 8th held out, by path
    names = [f.name for f in ds.train + ds.test]
    assert len(set(names)) == len(names) == 17 and "solo" in names and "cam2_img08" in names
    assert all(f.camera.name == f.name for f in ds.train + ds.test)
    assert [f.name for f in ds.test] == ["cam0_img00", "cam2_img00", "solo"]
    for split, frames_ in (("test", ds.test), ("train", ds.train)):
        cams, rnames, _ = resolve_cameras(str(tmp_path), split, None)
        assert rnames == [f.name for f in frames_]
    # frames whose image is missing: the loader drops them before it names and splits, so does rigel-render
    (tmp_path / "cam0/img00.png").unlink()
    (tmp_path / "cam1/img04.png").unlink()
    with pytest.warns(UserWarning):
        ds = load_dataset(tmp_path)
    assert len(ds.train) + len(ds.test) == 15 and [f.name for f in ds.test] == ["cam0_img04", "cam2_img08"]
    for split, frames_ in (("test", ds.test), ("train", ds.train)):
        # (the file has no w/h: the frames without an image have no size either; they are not needed), with the
        # loader's warning
        with pytest.warns(UserWarning, match="2 of 17 frames have no image file"):
            assert resolve_cameras(str(tmp_path), split, None)[1] == [f.name for f in frames_]


def test_unique_names_use_trailing_path_components_whatever_the_prefix():
    """with_unique_names: the fewest trailing components that separate the views, '..' and absolute prefixes
    dropped (a converted dataset that references ../col/images/cam0/img0.png names it as loading col would), then the
    extension for x.png / x.jpg, never a name another view already has; unique names are kept."""
    from rigel_core.data.frames import FrameSpec, with_unique_names

    cam = Camera.look_at((3, 0, 1), (0, 0, 0), width=8, height=8)
    paths = ["../col/images/cam0/img0.png", "../col/images/cam1/img0.png", "/abs/a/x.png", "/abs/a/x.jpg",
             "q/r.png", "w/a_x.png"]
    specs = [FrameSpec(cam, Path(p), Path(p).stem) for p in paths]
    out = with_unique_names(specs)
    assert [s.name for s in out] == ["cam0_img0", "cam1_img0", "x_png", "x_jpg", "r", "a_x"]
    assert [s.camera.name for s in out[:4]] == ["cam0_img0", "cam1_img0", "x_png", "x_jpg"]
    kept = specs[4:]
    assert with_unique_names(kept) is kept   # nothing shared: the same list back
    # a file beside a folder holding its namesake: the folders they share (the dataset's) never enter the names
    for root in ("/data/scan_7", "../elsewhere/x"):
        side = [FrameSpec(cam, Path(f"{root}/img0.png"), "img0"), FrameSpec(cam, Path(f"{root}/sub/img0.png"), "img0")]
        assert [s.name for s in with_unique_names(side)] == ["img0", "sub_img0"], root
    # frames without an image (cameras alone) share names with nothing to separate them: numbered, never taking a
    # name another view has; a frame with an image is named as if they were not there (as the loader names it)
    bare = [FrameSpec(cam, None, "img0"), FrameSpec(cam, Path("img0.png"), "img0"), FrameSpec(cam, None, "img0"),
            FrameSpec(cam, None, "img0_1"), FrameSpec(cam, None, "v"), FrameSpec(cam, None, "v")]
    names = [s.name for s in with_unique_names(bare)]
    assert names == ["img0_2", "img0", "img0_3", "img0_1", "v", "v_1"]   # the imaged frame: the loader's name
    # two frames of one image have no distinct candidate at all: numbered
    same = [FrameSpec(cam, Path("d/c.png"), "c"), FrameSpec(cam, Path("d/c.png"), "c"), FrameSpec(cam, None, "c_1")]
    assert [s.name for s in with_unique_names(same)] == ["c_png", "c_png_1", "c_1"]
    # ... and a frame without an image that has a name the imaged frames took gets a number
    same = [FrameSpec(cam, Path("d/c.png"), "c"), FrameSpec(cam, Path("d/c.png"), "c"), FrameSpec(cam, None, "c_png")]
    assert [s.name for s in with_unique_names(same)] == ["c_png", "c_png_1", "c_png_2"]
    # an imaged frame never yields its name: a unique one is kept, even when a renamed group's candidate is the same
    taken = [FrameSpec(cam, Path("a/c.png"), "c"), FrameSpec(cam, Path("b/c.png"), "c"), FrameSpec(cam, Path("x.png"),
                                                                                                  "a_c")]
    assert [s.name for s in with_unique_names(taken)] == ["a_c_png", "b_c_png", "a_c"]


def test_file_path_naming_a_folder_is_no_image(tmp_path):
    """A frame whose file_path ends in ".", ".." or a separator names a folder: no image is looked up next to it (a
    sibling "<folder>.png" is not it; Path(".").with_suffix raised), and the frame takes the fallback name."""
    from rigel_core.data.images import resolve_image_path
    from rigel_core.data.transforms import frame_name

    (tmp_path / "d").mkdir()
    (tmp_path / "d.png").write_bytes(b"not read")
    for fp in (".", "..", "d/..", "d/.", "d/", "d\\"):
        assert resolve_image_path(tmp_path / "d", fp) is None, fp
        assert frame_name({"file_path": fp}, 3) == "frame_00003", fp
    assert resolve_image_path(tmp_path, "d") == tmp_path / "d.png"   # a stem still finds its image
    assert frame_name({"file_path": "a/b.png"}, 3) == "b"


def test_render_names_a_blender_split_with_missing_images_as_the_loader(tmp_path):
    """transforms_<split>.json frames sharing a stem across folders, one of them without its image: the loader drops
    it and names the other plainly ("r_0"); rigel-render, which reads the split's cameras with or without images,
    must give that view the same name and number the imageless one (it gave "r_0" to the imageless camera and
    "a_r_0" to the view the trainer calls "r_0")."""
    from rigel_core.cli.render import resolve_cameras

    w, h = 8, 6
    frames = []
    for k, path in enumerate(["a/r_0.png", "b/r_0.png", "a/r_1.png"]):
        cam = Camera.look_at((3 * math.cos(k), 3 * math.sin(k), 1), (0, 0, 0), width=w, height=h)
        frames.append({"file_path": path, "transform_matrix": c2w_opengl(cam).tolist()})
        if path != "b/r_0.png":
            save_u8(tmp_path / path, np.zeros((h, w, 3)))
    for split in ("train", "test"):
        (tmp_path / f"transforms_{split}.json").write_text(
            json.dumps({"camera_angle_x": 0.7, "w": w, "h": h, "frames": frames}))
    with pytest.warns(UserWarning):
        ds = load_dataset(tmp_path)
    assert sorted(f.name for f in ds.train) == ["r_0", "r_1"]
    cams, names, _ = resolve_cameras(str(tmp_path), "train", None)
    assert names == ["r_0", "r_0_1", "r_1"]
    loader = {f.name: f.camera.viewmat for f in ds.train}
    for cam, name in zip(cams, names):   # the same name is the same view
        if name in loader:
            np.testing.assert_allclose(cam.viewmat, loader[name], atol=1e-6)


def test_the_data_line_names_every_size_of_a_capture_of_mixed_sizes(tmp_path, rng, capsys):
    """rigel-train's data line gave the first training view's size for a capture of several (portrait and landscape
    views of one phone capture read as "48x64"); it names the sizes now, and one size as before."""
    from rigel_core.cli.train import main

    g = np_rng(rng)
    sizes = [(24, 16), (16, 24), (24, 16), (16, 24), (24, 16)]   # view 0 (held out by --test-every) is 24x16 too
    frames = []
    (tmp_path / "cap").mkdir()
    for i, (w, h) in enumerate(sizes):
        save_u8(tmp_path / "cap" / f"{i}.png", g.integers(0, 256, size=(h, w, 3), dtype=np.uint8))
        c2w = np.linalg.inv(random_pose(g)) @ np.diag([1.0, -1, -1, 1])
        frames.append({"file_path": f"{i}.png", "w": w, "h": h, "cx": w / 2, "cy": h / 2,
                       "transform_matrix": c2w.tolist()})
    (tmp_path / "cap" / "transforms.json").write_text(json.dumps({"fl_x": 20.0, "frames": frames}))
    for mixed in (True, False):
        run = tmp_path / f"run{mixed}"
        args = ["--data", str(tmp_path / "cap"), "--out", str(run), "--device", "cpu", "--iters", "1", "--quiet",
                "--init-points", "20", "--n-renders", "0", "--test-every", "4" if mixed else "2"]
        assert main(args) == 0
        line = next(l for l in (run / "log.txt").read_text().splitlines() if " test views, " in l)
        # the training views: 1, 2, 3 (mixed) or 1, 3 (both 16x24)
        assert (", 2 sizes (16x24, 24x16), extent" if mixed else ", 16x24, extent") in line, line
    capsys.readouterr()
    from rigel_core.data.frames import view_sizes

    class V:
        def __init__(self, w, h):
            self.camera = Camera(w, h, 10.0, 10.0, w / 2, h / 2, np.eye(4))

    assert view_sizes([V(1000, 662), V(1000, 656), V(1000, 660), V(1000, 656), V(1000, 658)]) == \
        "4 sizes (1000x656 to 1000x662)"
    assert view_sizes([V(8, 6)] * 3) == "8x6" and view_sizes([]) == "none"
