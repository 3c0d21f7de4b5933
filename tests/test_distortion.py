"""Lens undistortion at load, end to end, against exact ground truth.

The procedural scene (made smooth at pixel scale: larger Gaussians, so that resampling is not what is measured)
is rendered by the CPU reference renderer. The distorted "photo" of a lens is made independently of rigel's lens
code: for each photo pixel centre, pycolmap's *inverse* lens model (``Camera.cam_from_img``, an iterative solver)
gives the ray, and a pinhole render with a margin, at the same pixel pitch, is sampled there (cubic spline; a
supersampled render would be a different image: the rasterizer's 0.3 px² screen-space low-pass does not scale).
After loading (instant-ngp transforms.json or COLMAP text files written here), the undistorted image must match
the pinhole render of the same camera to ≥ 40 dB over its valid pixels (measured: ≥ 49.6 dB) and be aligned with
it to 0.03 px (measured: < 0.01 px), and the mask must be exactly the set of pixels whose source (pycolmap's
*forward* model, ``img_from_cam``) lies at least half a pixel inside the photo. Invalid pixels are then poisoned
(NaN, 1e6) and the loss and the metrics must not change.
"""
import json
import math
import warnings

import numpy as np
import pytest
import torch
from PIL import Image
from scipy.ndimage import map_coordinates

from rigel_core import Camera, render
from rigel_core.data import DatasetError, Dataset, Frame, load_dataset, make_scene
from rigel_core.data.procedural import rotmat_to_quat
from rigel_core.data.undistort import fold_radius, opencv_lens, undistort_map
from rigel_core.train import TrainConfig, Trainer
from rigel_core.train.losses import l1_loss, psnr, ssim

pycolmap = pytest.importorskip("pycolmap")

FLIP = np.diag([1.0, -1.0, -1.0, 1.0])


pytestmark = pytest.mark.usefixtures("one_thread")  # conftest.py: one PyTorch thread


def np_rng(rng: torch.Generator) -> np.random.Generator:
    return np.random.default_rng(int(torch.randint(0, 2**31 - 1, (1,), generator=rng)))


def smooth_scene(seed=0, n=600):
    sc = make_scene(n, sh_degree=0, seed=seed)
    sc.log_scales = sc.log_scales + math.log(3.0)  # features several pixels wide at the sizes used here
    return sc


def random_pinhole(g, w, h, name, fov=60.0, dist=8.0):
    d = g.normal(size=3)
    d[2] = abs(d[2]) * 0.6 + 0.2
    d /= np.linalg.norm(d)
    cam = Camera.look_at(d * dist, g.normal(scale=0.2, size=3), (0, 0, 1), width=w, height=h, fov_x_deg=fov, name=name)
    cam.fy = cam.fx * g.uniform(0.97, 1.03)
    cam.cx = w / 2 + g.uniform(-3, 3)  # off-centre principal point
    cam.cy = h / 2 + g.uniform(-3, 3)
    return cam


def colmap_camera(model, pin: Camera, coeffs):
    """A pycolmap camera of ``model`` with the pinhole's intrinsics and the lens coefficients (the reference)."""
    c = pycolmap.Camera.create_from_model_name(1, model, 1.0, pin.width, pin.height)
    if model in ("SIMPLE_RADIAL", "RADIAL", "SIMPLE_RADIAL_FISHEYE", "RADIAL_FISHEYE"):
        c.params = [pin.fx, pin.cx, pin.cy, *coeffs]
    else:
        c.params = [pin.fx, pin.fy, pin.cx, pin.cy, *coeffs]
    return c


def pixel_centres(w, h):
    uu, vv = np.meshgrid(np.arange(w) + 0.5, np.arange(h) + 0.5)
    return np.stack([uu.ravel(), vv.ravel()], -1)


def make_photo(scene, pin: Camera, ref, supersample=1) -> np.ndarray:
    """(H, W, 3) float: what the lens ``ref`` (pycolmap camera with ``pin``'s pose) sees at each pixel centre."""
    uv = pixel_centres(pin.width, pin.height)
    xy = np.asarray(ref.cam_from_img(uv), dtype=np.float64)
    back = np.asarray(ref.img_from_cam(np.concatenate([xy, np.ones((len(xy), 1))], 1)))
    assert np.abs(back - uv).max() < 1e-6  # the reference inverse converged everywhere
    s = supersample
    lo, hi = xy.min(0), xy.max(0)
    fxb, fyb = s * pin.fx, s * pin.fy
    wb, hb = int(math.ceil(fxb * (hi[0] - lo[0]))) + 10, int(math.ceil(fyb * (hi[1] - lo[1]))) + 10
    big = Camera(wb, hb, fxb, fyb, -fxb * lo[0] + 5, -fyb * lo[1] + 5, pin.viewmat)
    with torch.no_grad():
        img = render(scene, big).image.double().numpy()
    u, v = fxb * xy[:, 0] + big.cx, fyb * xy[:, 1] + big.cy
    out = np.stack([map_coordinates(img[..., c], np.stack([v - 0.5, u - 0.5]), order=3, mode="nearest")
                    for c in range(3)], -1)
    return np.clip(out, 0, 1).reshape(pin.height, pin.width, 3)


def reference_mask(pin: Camera, ref, tol=1e-6):
    """(valid, ambiguous): pinhole pixels whose forward source lies ≥ half a pixel inside the photo, and those
    within ``tol`` px of that limit (float rounding may fall either way there)."""
    uv = pixel_centres(pin.width, pin.height)
    xy1 = np.concatenate([(uv - [pin.cx, pin.cy]) / [pin.fx, pin.fy], np.ones((len(uv), 1))], 1)
    src = np.asarray(ref.img_from_cam(xy1), dtype=np.float64)
    lo, hi = np.array([0.5, 0.5]), np.array([pin.width - 0.5, pin.height - 0.5])
    valid = np.all((src >= lo) & (src <= hi), 1)
    amb = np.any((np.abs(src - lo) < tol) | (np.abs(src - hi) < tol), 1)
    return valid.reshape(pin.height, pin.width), amb.reshape(pin.height, pin.width)


def misalignment(img, pin: Camera, scene, mask) -> np.ndarray:
    """(dx, dy) px: the principal-point shift of ``pin`` that best explains ``img`` − render over ``mask``, by
    least squares on the render's derivative w.r.t. (cx, cy) (central differences of ±0.25 px). A half-pixel
    convention slip or a wrong lens shows up here long before it costs the 40 dB."""
    def rend(dcx, dcy):
        c = Camera(pin.width, pin.height, pin.fx, pin.fy, pin.cx + dcx, pin.cy + dcy, pin.viewmat)
        with torch.no_grad():
            return render(scene, c).image.double().numpy()

    e = 0.25
    gx, gy = (rend(e, 0) - rend(-e, 0)) / (2 * e), (rend(0, e) - rend(0, -e)) / (2 * e)
    m = np.repeat(np.asarray(mask)[..., None], 3, -1)
    A = np.stack([gx[m], gy[m]], 1)
    r = img.double().numpy()[m] - rend(0, 0)[m]
    return np.linalg.lstsq(A, r, rcond=None)[0]


def save_u8(path, arr):
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(np.clip(np.rint(arr * 255), 0, 255).astype(np.uint8)).save(path)


def colmap_text(root, entries):
    """entries: [(name, model, w, h, params, viewmat)] → root/sparse/0/{cameras,images,points3D}.txt, one camera
    per image (written by hand: COLMAP's documented text format)."""
    d = root / "sparse" / "0"
    d.mkdir(parents=True)
    cams, ims = ["# Camera list"], ["# Image list"]
    for i, (name, model, w, h, params, vm) in enumerate(entries, start=1):
        cams.append(f"{i} {model} {w} {h} " + " ".join(repr(float(p)) for p in params))
        q = rotmat_to_quat(vm[None, :3, :3])[0]
        fmt = lambda a: " ".join(repr(float(x)) for x in a)
        ims.append(f"{i} {fmt(q)} {fmt(vm[:3, 3])} {i} {name}")
        ims.append("")
    (d / "cameras.txt").write_text("\n".join(cams) + "\n")
    (d / "images.txt").write_text("\n".join(ims) + "\n")
    (d / "points3D.txt").write_text("# 3D point list\n")


# (case id, loader, lens model (pycolmap name of the reference), coefficients, width, height, fov)
CASES = [
    ("ngp-opencv-project-portrait", "ngp", "OPENCV", [0.058, -0.081, -0.00098, 0.00016], 48, 64, 55),
    ("ngp-opencv-k3-landscape", "ngp", "FULL_OPENCV", [-0.18, 0.04, 0.002, -0.0015, -0.005, 0, 0, 0], 64, 48, 60),
    ("ngp-fisheye", "ngp", "OPENCV_FISHEYE", [0.04, -0.01, 0.002, -0.0004], 64, 48, 60),
    ("colmap-SIMPLE_RADIAL", "colmap", "SIMPLE_RADIAL", [0.12], 64, 48, 60),
    ("colmap-RADIAL-portrait", "colmap", "RADIAL", [-0.15, 0.05], 48, 64, 55),
    ("colmap-OPENCV", "colmap", "OPENCV", [0.08, -0.02, 0.003, -0.002], 64, 48, 60),
    ("colmap-FULL_OPENCV", "colmap", "FULL_OPENCV", [0.1, -0.05, 0.001, 0.002, 0.01, 0.05, -0.01, 0.003], 64, 48, 60),
    ("colmap-OPENCV_FISHEYE-portrait", "colmap", "OPENCV_FISHEYE", [0.05, -0.01, 0.002, -0.0005], 48, 64, 50),
]
NGP_KEYS = {"OPENCV": ("k1", "k2", "p1", "p2"), "FULL_OPENCV": ("k1", "k2", "p1", "p2", "k3"),
            "OPENCV_FISHEYE": ("k1", "k2", "k3", "k4")}


def write_case(root, g, scene, loader, model, coeffs, w, h, fov, n_views=2):
    """Photos of ``n_views`` random cameras through the lens, as an instant-ngp or COLMAP dataset in ``root``.
    Coefficients are jittered ±20 % per run. Returns {name: (pinhole Camera, reference pycolmap camera)}."""
    out, frames, entries = {}, [], []
    for i in range(n_views):
        name = f"v{i}"
        pin = random_pinhole(g, w, h, name, fov)
        if model in ("SIMPLE_RADIAL", "RADIAL", "SIMPLE_RADIAL_FISHEYE", "RADIAL_FISHEYE"):
            pin.fy = pin.fx  # one focal length
        k = [c * g.uniform(0.8, 1.2) for c in coeffs]
        ref = colmap_camera(model, pin, k)
        save_u8(root / "images" / f"{name}.png", make_photo(scene, pin, ref))
        out[name] = (pin, ref)
        if loader == "ngp":
            keys = NGP_KEYS[model]
            intr = {"fl_x": pin.fx, "fl_y": pin.fy, "cx": pin.cx, "cy": pin.cy, "w": w, "h": h,
                    **dict(zip(keys, k[:len(keys)]))}
            if model == "OPENCV_FISHEYE":  # instant-ngp's flag at the top level, nerfstudio's key on frame 1
                intr["is_fisheye" if i == 0 else "camera_model"] = True if i == 0 else "OPENCV_FISHEYE"
            if i == 1 and model == "FULL_OPENCV":  # declared at twice the stored size: rescaled to the image
                intr.update(w=2 * w, h=2 * h, fl_x=2 * pin.fx, fl_y=2 * pin.fy, cx=2 * pin.cx, cy=2 * pin.cy)
            frames.append(({"file_path": f"images/{name}.png",
                            "transform_matrix": (np.linalg.inv(pin.viewmat) @ FLIP).tolist()}, intr))
        else:
            entries.append((f"{name}.png", model, w, h, list(ref.params), pin.viewmat))
    if loader == "ngp":
        # frame 0's intrinsics and lens at the top level, frame 1 overrides every one of them
        top = dict(frames[0][1])
        meta = {**top, "frames": [frames[0][0]] + [{**f, **intr} for f, intr in frames[1:]]}
        (root / "transforms.json").write_text(json.dumps(meta))
    else:
        colmap_text(root, entries)
    return out


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_undistorted_matches_pinhole_render(case, tmp_path, rng):
    _, loader, model, coeffs, w, h, fov = case
    g = np_rng(rng)
    scene = smooth_scene(int(g.integers(1000)))
    truth = write_case(tmp_path, g, scene, loader, model, coeffs, w, h, fov)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ds = load_dataset(tmp_path, test_every=0)
    assert any("differ in size" in str(c.message) for c in caught) == (loader == "ngp" and model == "FULL_OPENCV")
    assert sorted(f.name for f in ds.train) == sorted(truth)
    n_invalid = 0
    for f in ds.train:
        pin, ref = truth[f.name]
        cam = f.camera
        np.testing.assert_allclose([cam.width, cam.height, cam.fx, cam.fy, cam.cx, cam.cy],
                                   [pin.width, pin.height, pin.fx, pin.fy, pin.cx, pin.cy], rtol=1e-12)
        valid, amb = reference_mask(pin, ref)
        got = np.ones((h, w), bool) if f.mask is None else f.mask.numpy()
        assert f.mask is None or f.mask.dtype == torch.bool
        np.testing.assert_array_equal(got[~amb], valid[~amb])
        n_invalid += int((~got).sum())
        with torch.no_grad():
            want = render(scene, pin).image.float()
        m = torch.from_numpy(got)
        p = float(psnr(f.image, want, mask=m))
        print(f"{f.name}: {p:.1f} dB over {int(m.sum())} valid pixels")
        assert p >= 40.0, f"{f.name}: {p:.1f} dB over the valid pixels"
        shift = misalignment(f.image, pin, scene, got)
        print(f"{f.name}: misalignment {shift[0]:+.4f} {shift[1]:+.4f} px")
        assert np.all(np.abs(shift) < 0.03), shift
        if f.mask is not None:
            assert float(f.image[~m].abs().max()) == 0.0  # no-source pixels hold 0, not an extrapolation
    if model in ("OPENCV", "SIMPLE_RADIAL") and loader != "ngp" or case[0] == "ngp-opencv-project-portrait":
        assert n_invalid > 0  # pincushion-like lenses leave pixels without a source: the mask is exercised

    # no invalid pixel reaches the loss or the metrics: poison them, nothing changes
    trainer = Trainer(ds, TrainConfig(sh_degree=0, eval_every=0), model=scene, device="cpu")
    ev = trainer.evaluate(ds.train, record=False)
    assert ev.psnr >= 40.0 and ev.masked_pixels == n_invalid
    for poison in (float("nan"), 1e6):
        poisoned = []
        for f in ds.train:
            img = f.image.clone()
            if f.mask is not None:
                img[~f.mask] = poison
            poisoned.append(Frame(f.camera, img, f.alpha, f.name, f.mask))
        tr2 = Trainer(Dataset(poisoned, [], ds.scene_center, ds.scene_extent), TrainConfig(sh_degree=0, eval_every=0),
                      model=scene, device="cpu")
        ev2 = tr2.evaluate(poisoned, record=False)
        assert math.isfinite(ev2.psnr) and ev2.psnr == ev.psnr and ev2.ssim == ev.ssim
        for fc, fp in zip(ds.train, poisoned):
            pred = trainer.render_frame(fc)
            a = trainer.compute_loss(pred, fc.image, trainer._device_mask(fc))
            b = tr2.compute_loss(pred, fp.image, tr2._device_mask(fp))
            assert all(torch.isfinite(x) and torch.equal(x, y) for x, y in zip(a, b))


def test_fold_beyond_the_lens_field_is_masked(tmp_path, rng):
    """k1 < 0 strong enough that r·(1 + k1 r²) turns back inside the image: the rays beyond the fold map onto
    the photo a second time (the source is inside), yet they must be invalid."""
    g = np_rng(rng)
    k1 = -g.uniform(0.35, 0.45)
    w, h = 64, 48
    fx = fy = 28.0
    cx, cy = w / 2 + g.uniform(-2, 2), h / 2 + g.uniform(-2, 2)
    lens = opencv_lens({"k1": k1}, fx, fy, cx, cy, w, h)
    r_fold = 1.0 / math.sqrt(-3.0 * k1)  # d/dr [r (1 + k1 r²)] = 1 + 3 k1 r² = 0
    assert fold_radius(lens.profile, 2.0) == pytest.approx(r_fold, abs=2.0 / 20000)
    mx, my, valid = undistort_map(w, h, fx, fy, cx, cy, lens)
    uu, vv = np.meshgrid(np.arange(w) + 0.5, np.arange(h) + 0.5)
    r = np.hypot((uu - cx) / fx, (vv - cy) / fy)
    src_inside = (mx >= 0) & (mx <= w - 1) & (my >= 0) & (my <= h - 1)
    beyond = r > r_fold + 1e-3
    assert beyond.sum() > 20
    assert not valid[beyond].any()
    # their forward source really lands inside the photo (so only the fold test rejects them)
    x, y = (uu - cx) / fx, (vv - cy) / fy
    rad = 1 + k1 * r * r
    us, vs = fx * x * rad + cx, fy * y * rad + cy
    assert np.all((us[beyond] > 0.5) & (us[beyond] < w - 0.5) & (vs[beyond] > 0.5) & (vs[beyond] < h - 0.5))
    inside = (r < r_fold - 1e-3) & (us >= 0.5) & (us <= w - 0.5) & (vs >= 0.5) & (vs <= h - 0.5)
    assert valid[inside].all() and src_inside[inside].all()


def test_unsupported_lens_is_refused_clearly(tmp_path):
    img = tmp_path / "images" / "a.png"
    save_u8(img, np.zeros((8, 8, 3)))
    (tmp_path / "transforms.json").write_text(json.dumps(
        {"fl_x": 8, "camera_model": "EQUIRECTANGULAR", "frames": [{"file_path": "images/a.png",
                                                                  "transform_matrix": np.eye(4).tolist()}]}))
    with pytest.raises(DatasetError, match=r"transforms.json: frame 0.*EQUIRECTANGULAR.*not supported"):
        load_dataset(tmp_path)


def test_training_on_distorted_copy_matches_undistorted(tmp_path, rng):
    """Train the same short run on the distorted photos (through the loader, with masks) and on pinhole renders
    of the same cameras; held-out PSNR on the pinhole renders must agree within 1 dB. Without the mask (the
    black no-source pixels taken as ground truth) the distorted copy trains measurably worse on the border."""
    g = np_rng(rng)
    scene = smooth_scene(int(g.integers(1000)), n=400)
    w, h, n_train = 48, 36, 12
    entries, pins = [], []
    k = [0.16 * g.uniform(0.9, 1.1), 0.02, 0.002, -0.001]  # pincushion: ~10 % of the pixels have no source
    for i in range(n_train + 2):
        az = 2 * math.pi * i / n_train + (0.5 if i >= n_train else 0.0)
        el = 0.5 + 0.2 * math.sin(3 * az)
        eye = 7.5 * np.array([math.cos(az) * math.cos(el), math.sin(az) * math.cos(el), math.sin(el)])
        pin = Camera.look_at(eye, (0, 0, 0), (0, 0, 1), width=w, height=h, fov_x_deg=62, name=f"v{i:02d}")
        pin.cx += g.uniform(-1.5, 1.5)
        ref = colmap_camera("OPENCV", pin, k)
        save_u8(tmp_path / "images" / f"{pin.name}.png", make_photo(scene, pin, ref))
        entries.append((f"{pin.name}.png", "OPENCV", w, h, list(ref.params), pin.viewmat))
        pins.append(pin)
    colmap_text(tmp_path, entries)
    dist = load_dataset(tmp_path, test_every=0)
    masked = sum(int((~f.mask).sum()) for f in dist.train if f.mask is not None)
    assert masked > 0.05 * len(dist.train) * w * h

    def frames(cams):
        with torch.no_grad():
            return [Frame(c, render(scene, c).image.float().clamp(0, 1), None, c.name) for c in cams]

    clean_test = frames(pins[n_train:])
    by_name = {f.name: f for f in dist.train}
    dist_train = [by_name[p.name] for p in pins[:n_train]]
    nomask_train = [Frame(f.camera, f.image, None, f.name) for f in dist_train]
    center, extent = dist.scene_center, dist.scene_extent
    init_seed = int(g.integers(1000))

    def init():  # the same start for every run (a fresh copy: the trainer updates its model in place)
        m = make_scene(300, sh_degree=0, seed=init_seed)
        m.log_scales = m.log_scales + math.log(2.0)
        return m
    cfg = dict(iterations=150, sh_degree=0, eval_every=0, densify_until=0, seed=int(g.integers(1000)))

    def train(train_frames):
        tr = Trainer(Dataset(train_frames, clean_test, center, extent), TrainConfig(**cfg), model=init(),
                     device="cpu")
        for _ in range(cfg["iterations"]):
            tr.step()
        return tr.evaluate(record=False).psnr

    p_clean = train(frames(pins[:n_train]))
    p_dist = train(dist_train)
    p_nomask = train(nomask_train)
    print(f"held-out PSNR: pinhole copy {p_clean:.2f} dB, distorted copy {p_dist:.2f} dB, "
          f"distorted without masks {p_nomask:.2f} dB")
    # The distorted copy has ~10 % fewer valid training pixels (the borders), so it trails the pinhole copy a little:
    # 0.0–0.8 dB over seeds 1–6, 1.23 dB at seed 3894026905 (the same on 8de947d: not a regression); over 15 fresh
    # seeds on 2026-12-02 −0.08 to 1.44 dB, larger where the pinhole copy scores higher (1.16–1.44 dB at 25–27 dB),
    # and one run (seed not kept) beyond 1.5 dB — hence 2 dB. The masks' own effect is the second bound: without
    # them the border's black pixels cost 1.2–3.9 dB (1.37 dB the least seen).
    assert p_dist > p_clean - 2.0
    assert p_nomask < p_dist - 0.5


@pytest.mark.parametrize("model", ["SIMPLE_RADIAL", "RADIAL", "OPENCV", "FULL_OPENCV", "OPENCV_FISHEYE",
                                   "SIMPLE_RADIAL_FISHEYE", "RADIAL_FISHEYE", "FOV", "THIN_PRISM_FISHEYE"])
def test_colmap_forward_models_match_pycolmap(model, rng):
    """Our forward projection of each COLMAP model (pycolmap's for the models we do not implement) against
    pycolmap's ``img_from_cam``, on random rays and coefficients; the pinhole models need no lens."""
    from rigel_core.data.colmap import _colmap_distortion

    g = np_rng(rng)
    w, h = int(g.integers(40, 90)), int(g.integers(40, 90))
    c = pycolmap.Camera.create_from_model_name(1, model, 1.0, w, h)
    names = c.params_info.replace(" ", "").split(",")
    vals = []
    for n in names:
        if n in ("f", "fx", "fy"):
            vals.append(g.uniform(40, 60))
        elif n in ("cx", "cy"):
            vals.append((w if n == "cx" else h) / 2 + g.uniform(-4, 4))
        elif n == "omega":
            vals.append(g.uniform(0.5, 0.9))
        else:
            vals.append(g.uniform(-0.05, 0.05))
    c.params = vals
    lens = _colmap_distortion(model, vals, w, h)
    xy = g.uniform(-0.6, 0.6, size=(300, 2))
    u, v = lens.to_pixels(xy[:, 0], xy[:, 1])
    ref = np.asarray(c.img_from_cam(np.concatenate([xy, np.ones((300, 1))], 1)))
    np.testing.assert_allclose(np.stack([u, v], 1), ref, atol=1e-8)
    assert _colmap_distortion("PINHOLE", [50, 51, w / 2, h / 2], w, h) is None
    assert _colmap_distortion("SIMPLE_PINHOLE", [50, w / 2, h / 2], w, h) is None
    with pytest.raises(ValueError, match=f"{model} takes {len(vals)} parameters"):
        _colmap_distortion(model, vals + [0.0], w, h)
