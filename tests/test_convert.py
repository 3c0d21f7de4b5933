"""COLMAP → nerfstudio transforms.json (rigel-import-colmap) and reading nerfstudio's ply_file_path.

A small COLMAP model is built here with pycolmap (one camera per supported lens model, poses looking at the
procedural scene, images rendered from it on the CPU, SfM points taken from the scene), converted, and both
directories are loaded with ``load_dataset``: cameras, points, colours, split and the (undistorted) images must
agree. Camera poses in the JSON are also checked against an independent formula (OpenGL c2w = inv(viewmat) with
the y, z columns negated), and SfM points in a nerfstudio-re-oriented frame (``applied_transform``) must project
where the COLMAP loader's points do.
"""
import json
import os
import shutil

import numpy as np
import pytest
import torch
from PIL import Image

from rigel_core import Camera, render
from rigel_core.data import DatasetError, load_dataset, make_scene
from rigel_core.data.procedural import SCENE_RADIUS
from rigel_core.data.transforms import read_transforms
from rigel_core.data.undistort import undistort_opencv

pycolmap = pytest.importorskip("pycolmap")
plyfile = pytest.importorskip("plyfile")

from rigel_core.cli.import_colmap import main as import_main  # noqa: E402
from rigel_core.data.convert import colmap_to_transforms  # noqa: E402

FLIP = np.diag([1.0, -1.0, -1.0, 1.0])
W, H = 32, 24


def np_rng(rng: torch.Generator) -> np.random.Generator:
    return np.random.default_rng(int(torch.randint(0, 2**31 - 1, (1,), generator=rng)))


def random_params(model: str, g: np.random.Generator) -> list[float]:
    f = W * g.uniform(0.8, 1.2)
    cx, cy = W / 2 + g.uniform(-1.5, 1.5), H / 2 + g.uniform(-1.5, 1.5)
    k = lambda s: float(g.uniform(-s, s))  # noqa: E731
    return {"SIMPLE_PINHOLE": [f, cx, cy],
            "PINHOLE": [f, f * g.uniform(0.95, 1.05), cx, cy],
            "SIMPLE_RADIAL": [f, cx, cy, k(0.15)],
            "RADIAL": [f, cx, cy, k(0.15), k(0.03)],
            "OPENCV": [f, f * 1.02, cx, cy, k(0.15), k(0.03), k(0.003), k(0.003)],
            "FULL_OPENCV": [f, f * 0.98, cx, cy, k(0.15), k(0.03), k(0.003), k(0.003), k(0.01), 0.0, 0.0, 0.0],
            "OPENCV_FISHEYE": [f, f, cx, cy, k(0.05), k(0.01), k(0.003), k(0.001)]}[model]


def look_at_scene(g: np.random.Generator) -> np.ndarray:
    """A world-to-camera (OpenCV) looking at the procedural scene from a random direction."""
    while True:
        d = g.normal(size=3)
        d /= np.linalg.norm(d)
        if abs(d[2]) < 0.9:
            break
    eye = d * 2.3 * SCENE_RADIUS * g.uniform(0.9, 1.1)
    return Camera.look_at(eye, g.normal(scale=0.1, size=3), (0, 0, 1), width=W, height=H).viewmat


@pytest.fixture(scope="module")
def scene():
    return make_scene(600, sh_degree=0, seed=3)


def make_colmap(root, scene, g, models, *, n_images=None, text=False, missing=(), n_points=40):
    """A COLMAP dataset at ``root`` (images/ + sparse/0): camera i uses models[i]; images cycle through the
    cameras; images named in ``missing`` are registered but have no file. Returns the SfM points and colours."""
    rec = pycolmap.Reconstruction()
    for cid, model in enumerate(models, start=1):
        cam = pycolmap.Camera.create_from_model_name(cid, model, 1.0, W, H)
        cam.params = random_params(model, g)
        rec.add_camera_with_trivial_rig(cam)
    n_images = len(models) if n_images is None else n_images
    names = [f"img_{i:02d}.png" for i in range(n_images)]
    order = g.permutation(n_images)  # image ids in random order: both loaders sort by name
    for iid, i in enumerate(order, start=1):
        vm = look_at_scene(g)
        cid = 1 + i % len(models)
        rec.add_image_with_trivial_frame(pycolmap.Image(name=names[i], camera_id=cid, image_id=iid),
                                         pycolmap.Rigid3d(vm[:3, :4]))
        if names[i] in missing:
            continue
        with torch.no_grad():
            img = render(scene, Camera(W, H, W, W, W / 2, H / 2, vm)).image.numpy()
        (root / "images").mkdir(parents=True, exist_ok=True)
        Image.fromarray(np.clip(np.rint(img * 255), 0, 255).astype(np.uint8)).save(root / "images" / names[i])
    pick = g.choice(scene.means3D.shape[0], n_points, replace=False)
    pts = scene.means3D[pick].double().numpy() + g.normal(scale=1e-3, size=(n_points, 3))
    cols = g.integers(0, 256, size=(n_points, 3), dtype=np.uint8)
    for p, c in zip(pts, cols):
        rec.add_point3D(p, pycolmap.Track(), c)
    sparse = root / "sparse" / "0"
    sparse.mkdir(parents=True)
    (rec.write_text if text else rec.write_binary)(str(sparse))
    return pts, cols


def sort_rows(a):
    return a[np.lexsort(a.T[::-1])]


def assert_same_dataset(a, b, *, image_atol=1e-6):
    assert [f.name for f in a.train] == [f.name for f in b.train]
    assert [f.name for f in a.test] == [f.name for f in b.test]
    for fa, fb in zip(a.train + a.test, b.train + b.test):
        ca, cb = fa.camera, fb.camera
        assert (ca.width, ca.height) == (cb.width, cb.height)
        np.testing.assert_allclose(ca.K, cb.K, rtol=0, atol=1e-12)
        np.testing.assert_allclose(ca.viewmat, cb.viewmat, rtol=0, atol=1e-12)
        np.testing.assert_allclose(fa.image.numpy(), fb.image.numpy(), rtol=0, atol=image_atol)
    np.testing.assert_allclose(a.scene_center, b.scene_center, atol=1e-12)
    assert a.scene_extent == pytest.approx(b.scene_extent, abs=1e-12)
    np.testing.assert_array_equal(sort_rows(a.points), sort_rows(b.points))
    np.testing.assert_array_equal(sort_rows(np.hstack([a.points, a.point_colors])),
                                  sort_rows(np.hstack([b.points, b.point_colors])))


SUPPORTED = ["SIMPLE_PINHOLE", "PINHOLE", "SIMPLE_RADIAL", "RADIAL", "OPENCV", "FULL_OPENCV"]
EXPECTED_MODEL = {"SIMPLE_PINHOLE": "PINHOLE", "PINHOLE": "PINHOLE", "SIMPLE_RADIAL": "OPENCV",
                  "RADIAL": "OPENCV", "OPENCV": "OPENCV", "FULL_OPENCV": "OPENCV"}


@pytest.mark.parametrize("text", [False, True], ids=["bin", "txt"])
def test_convert_agrees_with_colmap_loader(tmp_path, scene, rng, text):
    g = np_rng(rng)
    src, dst = tmp_path / "src", tmp_path / "out"
    pts, cols = make_colmap(src, scene, g, SUPPORTED, n_images=8, text=text, missing={"img_07.png"})
    with pytest.warns(UserWarning, match="1 of 8"):
        res = colmap_to_transforms(src, dst)
    assert (res.n_frames, res.n_missing, res.n_points) == (7, 1, len(pts))
    assert sorted(os.listdir(dst)) == ["sparse_pc.ply", "transforms.json"]  # nothing copied by default

    meta = json.loads((dst / "transforms.json").read_text())
    assert meta["applied_transform"] == np.eye(4)[:3].tolist() and meta["ply_file_path"] == "sparse_pc.ply"
    assert "camera_model" not in meta  # frames differ
    rec = pycolmap.Reconstruction(str(src / "sparse" / "0"))
    by_name = {im.name: im for im in rec.images.values()}
    assert [f["file_path"] for f in meta["frames"]] == [f"../src/images/img_{i:02d}.png" for i in range(7)]
    for fr in meta["frames"]:
        im = by_name[os.path.basename(fr["file_path"])]
        cam = rec.cameras[im.camera_id]
        p = list(cam.params)
        assert fr["camera_model"] == EXPECTED_MODEL[cam.model_name]
        assert (fr["w"], fr["h"]) == (W, H)
        assert [fr[k] for k in ("fl_x", "fl_y", "cx", "cy")] == [
            cam.focal_length_x, cam.focal_length_y, cam.principal_point_x, cam.principal_point_y]
        names, first = {"SIMPLE_RADIAL": (("k1",), 3), "RADIAL": (("k1", "k2"), 3),
                        "OPENCV": (("k1", "k2", "p1", "p2"), 4),
                        "FULL_OPENCV": (("k1", "k2", "p1", "p2", "k3"), 4)}.get(cam.model_name, ((), 0))
        coeffs = dict(zip(names, p[first:]))
        assert all(fr[k] == v for k, v in coeffs.items())
        dist = {k for k in ("k1", "k2", "k3", "k4", "p1", "p2") if k in fr}
        want = {"PINHOLE": set(), "OPENCV": {"k1", "k2", "p1", "p2"}}[fr["camera_model"]]
        assert dist == (want | {"k3"} if cam.model_name == "FULL_OPENCV" else want)
        vm = np.eye(4)
        cfw = im.cam_from_world() if callable(im.cam_from_world) else im.cam_from_world
        vm[:3] = cfw.matrix()
        np.testing.assert_allclose(fr["transform_matrix"], np.linalg.inv(vm) @ FLIP, atol=1e-12)

    with pytest.warns(UserWarning, match="1 of 8"):
        ref = load_dataset(src, test_every=3)
    conv = load_dataset(dst, test_every=3)
    assert conv.source == "ngp" and ref.source == "colmap"
    assert [f.name for f in conv.test] == ["img_00", "img_03", "img_06"]
    assert_same_dataset(conv, ref)
    np.testing.assert_array_equal(sort_rows(conv.points), sort_rows(pts))
    np.testing.assert_array_equal(sort_rows(np.hstack([pts, cols / 255.0])),
                                  sort_rows(np.hstack([conv.points, conv.point_colors])))
    # the lens was removed: a distorted frame's image differs from its raw file
    changed = {f.name for f in conv.train if not np.allclose(
        f.image.numpy(), np.asarray(Image.open(src / "images" / f"{f.name}.png"), np.float32) / 255, atol=1e-6)}
    assert changed == {"img_02", "img_04", "img_05"}  # SIMPLE_RADIAL, OPENCV, FULL_OPENCV (not PINHOLE img_01)


def test_copy_link_force_cli(tmp_path, scene, rng, capsys):
    g = np_rng(rng)
    src = tmp_path / "src"
    make_colmap(src, scene, g, ["OPENCV", "PINHOLE"], n_images=4)
    ref = load_dataset(src, test_every=2)

    copy = tmp_path / "copy"
    assert import_main([str(src), str(copy), "--copy-images"]) == 0
    assert "4 frames" in capsys.readouterr().out
    meta = json.loads((copy / "transforms.json").read_text())
    assert [f["file_path"] for f in meta["frames"]] == [f"images/img_{i:02d}.png" for i in range(4)]
    for i in range(4):
        name = f"img_{i:02d}.png"
        assert not (copy / "images" / name).is_symlink()
        assert (copy / "images" / name).read_bytes() == (src / "images" / name).read_bytes()

    link = tmp_path / "link"
    assert import_main([str(src), str(link), "--link-images"]) == 0
    assert os.readlink(link / "images" / "img_01.png") == str((src / "images" / "img_01.png").resolve())
    assert_same_dataset(load_dataset(link, test_every=2), ref)

    # the copy is self-contained: it loads the same with the source gone
    shutil.move(src, tmp_path / "gone")
    assert_same_dataset(load_dataset(copy, test_every=2), ref)

    # no silent overwrite; --force replaces
    shutil.move(tmp_path / "gone", src)
    before = (copy / "transforms.json").read_bytes()
    assert import_main([str(src), str(copy)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "transforms.json" in err and "--force" in err
    assert (copy / "transforms.json").read_bytes() == before
    assert import_main([str(src), str(copy), "--force"]) == 0
    assert json.loads((copy / "transforms.json").read_text())["frames"][0]["file_path"] == "../src/images/img_00.png"
    # nor any file a conversion would write into a DST that has no transforms.json: an image, the points file
    other = tmp_path / "other"
    (other / "images").mkdir(parents=True)
    (other / "images" / "img_02.png").write_bytes(b"precious")
    for mode in ("--copy-images", "--link-images"):
        assert import_main([str(src), str(other), mode]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "img_02.png: already exists" in err and "--force" in err
    assert (other / "images" / "img_02.png").read_bytes() == b"precious" and not (other / "transforms.json").exists()
    (other / "images" / "img_02.png").unlink()
    (other / "sparse_pc.ply").write_bytes(b"precious")
    assert import_main([str(src), str(other)]) == 2 and "sparse_pc.ply: already exists" in capsys.readouterr().err
    assert (other / "sparse_pc.ply").read_bytes() == b"precious"
    assert import_main([str(src), str(other), "--copy-images", "--force"]) == 0
    assert (other / "images" / "img_02.png").read_bytes() == (src / "images" / "img_02.png").read_bytes()
    assert import_main([str(src), str(link), "--link-images", "--force"]) == 0   # its own links are no conflict
    capsys.readouterr()
    # same camera model everywhere → also at the top level
    single = tmp_path / "single"
    make_colmap(single, scene, g, ["RADIAL"], n_images=1)
    assert import_main([str(single), str(tmp_path / "s_out")]) == 0
    assert json.loads((tmp_path / "s_out" / "transforms.json").read_text())["camera_model"] == "OPENCV"


@pytest.mark.parametrize("kind", ["file", "under-a-file"])
def test_import_colmap_dst_that_is_a_file_is_one_line(tmp_path, capsys, kind):
    """DST a file (or below one): one line naming DST, exit 2, before SRC is read; was '[Errno 17] File exists:
    ...' (or Errno 20) naming neither the argument nor what is wrong with it."""
    afile = tmp_path / "afile"
    afile.write_text("not a folder")
    dst = afile if kind == "file" else afile / "sub"
    assert import_main([str(tmp_path / "no-such-src"), str(dst)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Errno" not in err and f"DST {dst}" in err and "no-such-src" not in err, err
    assert afile.read_text() == "not a folder"


def test_import_colmap_src_missing_or_a_file_says_so(tmp_path, capsys):
    """SRC that does not exist: "no such directory" (was "no COLMAP model (sparse/0/…)", as if the folder were
    there but empty); SRC a file: "not a directory"; a folder without a model still names what was looked for.
    One line naming SRC, exit 2, nothing written."""
    afile = tmp_path / "afile"
    afile.write_text("x")
    (tmp_path / "empty").mkdir()
    for src, says in ((tmp_path / "nothere", "no such directory"), (afile, "not a directory"),
                      (tmp_path / "empty", "no COLMAP model")):
        assert import_main([str(src), str(tmp_path / "dst")]) == 2, src
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and f"{src}: {says}" in err, err
        assert not (tmp_path / "dst").exists()


def test_render_cameras_of_a_colmap_folder(tmp_path, scene, rng, capsys):
    """``rigel-render SCENE --cameras COLMAP_DIR`` (was refused: "no transforms_train.json") renders the views
    rigel-train's loader makes of the folder: with --split, the same names and (undistorted pinhole) cameras of
    each split, images missing from images/ dropped before the split as the loader does; without, every
    registered image, the missing ones included."""
    from rigel_core.cli.render import main as render_main
    from rigel_core.io import save_ply

    g = np_rng(rng)
    src = tmp_path / "src"
    save = tmp_path / "scene.ply"
    save_ply(scene, save)
    make_colmap(src, scene, g, ["PINHOLE", "OPENCV", "SIMPLE_RADIAL"], n_images=11, missing={"img_03.png"})
    with pytest.warns(UserWarning, match="1 of 11"):
        ds = load_dataset(src)   # rigel-train's view of the folder (every 8th held out)
    for split, frames in (("train", ds.train), ("test", ds.test)):
        out = tmp_path / split
        assert render_main([str(save), "--cameras", str(src), "--split", split, "--out", str(out),
                            "--device", "cpu"]) == 0
        err = capsys.readouterr().err   # the loader's warning, one line (Python shows a repeated warning once)
        assert split == "test" or ("warning:" in err and "1 of 11 frames have no image file" in err), err
        assert sorted(p.stem for p in out.iterdir()) == sorted(f.name for f in frames)
        for f in frames:
            with torch.no_grad():
                ref = render(scene, f.camera).image.clamp(0, 1).double().numpy()
            png = np.asarray(Image.open(out / f"{f.name}.png"), dtype=np.float64) / 255.0
            assert np.abs(png - ref).max() <= 0.5 / 255 + 1e-6, f.name
    out = tmp_path / "all"
    assert render_main([str(save), "--cameras", str(src), "--out", str(out), "--device", "cpu"]) == 0
    assert sorted(p.stem for p in out.iterdir()) == [f"img_{i:02d}" for i in range(11)]


def test_images_dir_and_no_points(tmp_path, scene, rng):
    g = np_rng(rng)
    src = tmp_path / "src"
    make_colmap(src, scene, g, ["PINHOLE"], n_images=2, n_points=0)
    (src / "images").rename(src / "images_x")
    with pytest.warns(UserWarning, match="2 of 2"), \
            pytest.raises(DatasetError, match=r"none of its 2 registered images.*images\b"):
        colmap_to_transforms(src, tmp_path / "a")
    assert not (tmp_path / "a" / "transforms.json").exists()
    res = colmap_to_transforms(src, tmp_path / "b", images_dir="images_x")
    meta = json.loads(res.path.read_text())
    assert res.n_points == 0 and "ply_file_path" not in meta and meta["camera_model"] == "PINHOLE"
    assert load_dataset(tmp_path / "b").points is None


def test_fisheye_keys(tmp_path, scene, rng):
    g = np_rng(rng)
    src, dst = tmp_path / "src", tmp_path / "out"
    make_colmap(src, scene, g, ["OPENCV_FISHEYE"], n_images=2)
    colmap_to_transforms(src, dst)
    meta = json.loads((dst / "transforms.json").read_text())
    cam = pycolmap.Reconstruction(str(src / "sparse" / "0")).cameras[1]
    assert meta["camera_model"] == "OPENCV_FISHEYE"
    for fr in meta["frames"]:
        assert fr["camera_model"] == "OPENCV_FISHEYE" and "p1" not in fr
        assert [fr[k] for k in ("fl_x", "fl_y", "cx", "cy", "k1", "k2", "k3", "k4")] == list(cam.params)
    try:
        conv = load_dataset(dst, test_every=0)
    except DatasetError as e:  # the loader does not read fisheye lenses (yet): it must say so
        assert "fisheye" in str(e)
        return
    assert_same_dataset(conv, load_dataset(src, test_every=0), image_atol=1e-5)


@pytest.mark.parametrize("model", ["EQUIRECTANGULAR", "FOV", "RADIAL_FISHEYE", "FULL_OPENCV_RATIONAL"])
def test_unsupported_models(tmp_path, rng, model, capsys):
    g = np_rng(rng)
    rec = pycolmap.Reconstruction()
    name = "FULL_OPENCV" if model == "FULL_OPENCV_RATIONAL" else model
    cam = pycolmap.Camera.create_from_model_name(1, name, 20.0, W, H)
    if model == "FULL_OPENCV_RATIONAL":
        cam.params = random_params("FULL_OPENCV", g)[:9] + [0.0, float(g.uniform(0.01, 0.1)), 0.0]
    rec.add_camera_with_trivial_rig(cam)
    rec.add_image_with_trivial_frame(pycolmap.Image(name="a.png", camera_id=1, image_id=1),
                                     pycolmap.Rigid3d(look_at_scene(g)[:3, :4]))
    (tmp_path / "sparse" / "0").mkdir(parents=True)
    rec.write_binary(str(tmp_path / "sparse" / "0"))
    (tmp_path / "images").mkdir()
    Image.new("RGB", (W, H)).save(tmp_path / "images" / "a.png")  # the image exists: the model alone is refused
    assert import_main([str(tmp_path), str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and name in err and "sparse/0" in err
    if model == "FULL_OPENCV_RATIONAL":
        assert "k4..k6" in err
    assert not (tmp_path / "out" / "transforms.json").exists()


def write_ply(path, xyz, rgb=None, *, text=False, xyz_type="f8", rgb_type="u1"):
    fields = [("x", xyz_type), ("y", xyz_type), ("z", xyz_type)]
    if rgb is not None:
        fields += [("red", rgb_type), ("green", rgb_type), ("blue", rgb_type)]
    v = np.empty(len(xyz), dtype=fields)
    for i, k in enumerate("xyz"):
        v[k] = xyz[:, i]
    if rgb is not None:
        for i, k in enumerate(("red", "green", "blue")):
            v[k] = rgb[:, i]
    plyfile.PlyData([plyfile.PlyElement.describe(v, "vertex")], text=text).write(str(path))


def random_rotation(g):
    q, r = np.linalg.qr(g.normal(size=(3, 3)))
    q *= np.sign(np.diag(r))
    return q if np.linalg.det(q) > 0 else -q


def test_nerfstudio_frame_points_project_like_colmap(tmp_path, scene, rng):
    """ns-process-data writes poses and PLY in a re-oriented world (``applied_transform`` A: COLMAP world →
    that frame). Both are used as stored: every SfM point must land on the same pixel as in the COLMAP loader."""
    g = np_rng(rng)
    src, dst = tmp_path / "src", tmp_path / "out"
    make_colmap(src, scene, g, ["PINHOLE", "OPENCV"], n_images=4, n_points=60)
    colmap_to_transforms(src, dst, images="copy")
    meta = json.loads((dst / "transforms.json").read_text())
    ns_axes = np.eye(4)[[0, 2, 1, 3]]  # nerfstudio's own: swap y and z, then negate the new z
    ns_axes[2] *= -1
    A = np.eye(4)
    A[:3, :3], A[:3, 3] = random_rotation(g), g.normal(size=3)
    A = A @ ns_axes
    meta["applied_transform"] = A[:3].tolist()
    for fr in meta["frames"]:
        fr["transform_matrix"] = (A @ np.asarray(fr["transform_matrix"])).tolist()
    ref = load_dataset(src, test_every=0)
    pts_ns = ref.points @ A[:3, :3].T + A[:3, 3]
    write_ply(dst / "points_ns.ply", pts_ns, np.rint(ref.point_colors * 255).astype(np.uint8), text=True)
    meta["ply_file_path"] = "points_ns.ply"
    (dst / "transforms.json").write_text(json.dumps(meta))

    ns = load_dataset(dst, test_every=0)
    np.testing.assert_allclose(ns.points, pts_ns, atol=1e-12)  # read as stored (ASCII PLY)
    np.testing.assert_array_equal(ns.point_colors, ref.point_colors)
    on_image = 0
    for fa, fb in zip(ns.train, ref.train):
        uv_ns, uv_ref = fa.camera.project(ns.points), fb.camera.project(ref.points)
        np.testing.assert_allclose(uv_ns, uv_ref, atol=1e-8)
        on_image += int(np.all((uv_ref > 0) & (uv_ref < [W, H]), axis=1).sum())
        # the control: points left in COLMAP's frame (or A applied twice) would land elsewhere
        assert np.abs(fa.camera.project(ref.points) - uv_ref).max() > 1.0
    assert on_image >= 20


def test_ply_errors_and_colour_types(tmp_path):
    img = tmp_path / "a.png"
    Image.new("RGB", (8, 6)).save(img)
    meta = {"fl_x": 8.0, "frames": [{"file_path": "a.png", "transform_matrix": np.eye(4).tolist()}]}

    def load_with(ply_key):
        (tmp_path / "transforms.json").write_text(json.dumps({**meta, "ply_file_path": ply_key}))
        return load_dataset(tmp_path)

    with pytest.raises(DatasetError, match=r"nope\.ply \(ply_file_path of .*transforms\.json\): file not found"):
        load_with("nope.ply")
    (tmp_path / "bad.ply").write_bytes(b"ply\nformat binary_little_endian 1.0\nelement vertex 5\nproperty flo")
    with pytest.raises(DatasetError, match=r"bad\.ply .*not a readable PLY"):
        load_with("bad.ply")
    with pytest.raises(DatasetError, match="ply_file_path"):
        load_with(3)
    xyz = np.random.default_rng().normal(size=(5, 3))
    v = np.empty(5, dtype=[("x", "f4"), ("y", "f4")])
    plyfile.PlyData([plyfile.PlyElement.describe(v, "vertex")]).write(str(tmp_path / "noz.ply"))
    with pytest.raises(DatasetError, match=r"noz\.ply.*'z'"):
        load_with("noz.ply")
    write_ply(tmp_path / "nan.ply", np.vstack([xyz, [[np.nan, 0, 0]]]))
    with pytest.raises(DatasetError, match=r"nan\.ply.*1 vertices have non-finite"):
        load_with("nan.ply")
    write_ply(tmp_path / "huge.ply", np.vstack([xyz, [[0, 1e300, 0]], [[-1e39, 0, 0]]]))  # Inf once float32
    with pytest.raises(DatasetError, match=r"huge\.ply.*2 vertices have non-finite.*float32"):
        load_with("huge.ply")
    write_ply(tmp_path / "f.ply", xyz, np.full((5, 3), 1.5), rgb_type="f4")
    with pytest.raises(DatasetError, match=r"f\.ply.*\[0, 1\]"):
        load_with("f.ply")

    write_ply(tmp_path / "plain.ply", xyz, xyz_type="f4")  # no colours: None (the trainer uses grey)
    ds = load_with("plain.ply")
    np.testing.assert_array_equal(ds.points, xyz.astype(np.float32).astype(np.float64))
    assert ds.points.dtype == np.float64 and ds.point_colors is None
    rgb = np.random.default_rng().integers(0, 65536, size=(5, 3))
    write_ply(tmp_path / "u16.ply", xyz, rgb, rgb_type="u2", text=True)
    np.testing.assert_allclose(load_with("u16.ply").point_colors, rgb / 65535.0, atol=1e-15)
    write_ply(tmp_path / "empty.ply", np.zeros((0, 3)))
    assert load_with("empty.ply").points is None


def test_per_frame_intrinsics_and_distortion(tmp_path, rng):
    """nerfstudio writes fl_x fl_y cx cy w h and k1 k2 p1 p2 per frame: each frame's own values are used,
    top-level ones only where a frame lacks the key."""
    g = np_rng(rng)
    shared = {"fl_x": 30.0, "fl_y": 31.0, "cx": 16.0, "cy": 12.0, "w": W, "h": H, "k1": 0.1}
    own = [{}, {"fl_x": 28.0, "fl_y": 29.5, "cx": 15.2, "cy": 12.7, "k1": -0.12, "k2": 0.02, "p1": 0.004,
                "p2": -0.002, "camera_model": "OPENCV"},
           {"w": 2 * W, "h": 2 * H, "fl_x": 60.0, "fl_y": 62.0, "cx": 32.0, "cy": 24.0, "k1": 0.0}]
    frames, raw = [], []
    for i, o in enumerate(own):
        img = g.uniform(size=(H, W, 3))
        Image.fromarray(np.rint(img * 255).astype(np.uint8)).save(tmp_path / f"f{i}.png")
        raw.append(np.asarray(Image.open(tmp_path / f"f{i}.png"), np.float32) / 255)
        frames.append({"file_path": f"f{i}.png", "transform_matrix": np.linalg.inv(look_at_scene(g)) @ FLIP, **o})
    for f in frames:
        f["transform_matrix"] = f["transform_matrix"].tolist()
    (tmp_path / "transforms.json").write_text(json.dumps({**shared, "frames": frames}))
    with pytest.warns(UserWarning, match="rescaled"):  # frame 2 declares twice its image size
        ds = load_dataset(tmp_path, test_every=0)
    for i, (f, o) in enumerate(zip(ds.train, own)):
        k = {**shared, **o}
        s = W / k["w"]
        np.testing.assert_allclose([f.camera.fx, f.camera.fy, f.camera.cx, f.camera.cy],
                                   [k["fl_x"] * s, k["fl_y"] * s, k["cx"] * s, k["cy"] * s], atol=1e-12)
        np.testing.assert_allclose(f.camera.viewmat, np.linalg.inv(np.asarray(frames[i]["transform_matrix"]) @ FLIP),
                                   atol=1e-12)
        dist = {c: k.get(c, 0.0) for c in ("k1", "k2", "p1", "p2")}
        want = raw[i] if not any(dist.values()) else undistort_opencv(
            raw[i], f.camera.fx, f.camera.fy, f.camera.cx, f.camera.cy, dist)
        np.testing.assert_allclose(f.image.numpy(), want, atol=1e-6)
    assert not np.allclose(ds.train[0].image.numpy(), ds.train[1].image.numpy())


@pytest.mark.parametrize("name", ["bonsai", "fern", "beer"])
def test_real_captures(shared_data, tmp_path, name):
    src = shared_data / "real" / name
    if not (src / "sparse").is_dir():
        pytest.skip(f"{src}: real capture not present")
    res = colmap_to_transforms(src, tmp_path / name)
    rec = pycolmap.Reconstruction(str(src / "sparse" / "0"))
    registered = sorted(im.name for im in rec.images.values() if (src / "images" / im.name).is_file())
    assert res.n_frames == len(registered) and res.n_points == len(rec.points3D)
    specs, missing, total = read_transforms(res.path)
    assert missing == [] and total == len(registered)
    for spec, im_name in zip(specs, registered):  # every camera, without decoding images
        im = next(i for i in rec.images.values() if i.name == im_name)
        cam = rec.cameras[im.camera_id]
        K = cam.calibration_matrix()
        assert (spec.camera.width, spec.camera.height) == (cam.width, cam.height)
        np.testing.assert_allclose(spec.camera.K, K, atol=1e-12)
        cfw = im.cam_from_world() if callable(im.cam_from_world) else im.cam_from_world
        np.testing.assert_allclose(spec.camera.viewmat[:3], cfw.matrix(), atol=1e-12)
    a = load_dataset(res.path, max_frames=1)
    b = load_dataset(src, max_frames=1)
    assert_same_dataset(a, b)


def test_corrupt_model_files_are_checked_before_pycolmap(tmp_path, scene, rng, capsys):
    """The converter runs the loader's COLMAP pre-check: a cameras.bin one byte short or long was converted
    (exit 0), a truncated points3D.bin reached pycolmap's multi-GB allocation."""
    g = np_rng(rng)
    make_colmap(tmp_path / "src", scene, g, ["PINHOLE", "SIMPLE_RADIAL"])
    sparse = tmp_path / "src" / "sparse" / "0"
    good = {f: (sparse / f).read_bytes() for f in ("cameras.bin", "points3D.bin")}
    for k, (f, data) in enumerate([("cameras.bin", good["cameras.bin"][:-1]),
                                   ("cameras.bin", good["cameras.bin"] + b"\0"),
                                   ("points3D.bin", good["points3D.bin"][: len(good["points3D.bin"]) // 2])]):
        (sparse / f).write_bytes(data)
        out = tmp_path / f"out{k}"
        assert import_main([str(tmp_path / "src"), str(out)]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and f in err, err
        assert not (out / "transforms.json").exists()
        (sparse / f).write_bytes(good[f])
    assert import_main([str(tmp_path / "src"), str(tmp_path / "ok")]) == 0


def test_colmap_points_beyond_float32_are_one_clear_error(tmp_path, scene, rng):
    """A point finite in float64 but beyond float32's range (the model's dtype) became Inf at initialisation and
    crashed the nearest-neighbour scales with a raw traceback; the loader now names it like a NaN point."""
    make_colmap(tmp_path, scene, np_rng(rng), ["PINHOLE"])
    sparse = tmp_path / "sparse" / "0"
    rec = pycolmap.Reconstruction(str(sparse))
    pid = next(iter(rec.points3D))
    rec.points3D[pid].xyz = np.array([0.0, 1e300, 0.0])
    rec.write(str(sparse))
    with pytest.raises(DatasetError, match=r"points3D: 1 points have NaN or Inf coordinates \(or beyond float32"):
        load_dataset(tmp_path)
