"""bench/lens_ab.py (issue 12: the lens modelled against zeroed, scored on the same pixels) on the CPU: the zeroed
copy, the common frame's mapping (a perfect prediction in either frame scores exactly), and a tiny end-to-end run."""
import json
import math

import numpy as np
import pytest
import torch
from PIL import Image

from bench.lens_ab import main, masked_psnr, score, zeroed_copy
from rigel_core import Camera
from rigel_core.data import load_dataset
from rigel_core.data.frames import with_unique_names
from rigel_core.data.transforms import read_transforms

FLIP = np.diag([1.0, -1.0, -1.0, 1.0])  # OpenCV camera axes -> the transforms.json (OpenGL) convention


def write_capture(root, g: np.random.Generator, n=10, w=40, h=30, k1=0.12):
    """n smooth random photos of cameras on a circle, one OPENCV lens (k1, a little p1) at the top level of a
    transforms.json; returns the coefficients written."""
    (root / "images").mkdir(parents=True)
    yy, xx = np.mgrid[0:h, 0:w] / max(w, h)
    frames = []
    for i in range(n):
        az = 2 * math.pi * i / n
        eye = 6.0 * np.array([math.cos(az), math.sin(az), 0.4])
        cam = Camera.look_at(eye, (0, 0, 0), (0, 0, 1), width=w, height=h, fov_x_deg=60, name=f"v{i:02d}")
        f = g.uniform(8, 20, size=(3, 2))  # a few cycles across the frame: the lens moves them visibly
        img = 0.5 + 0.4 * np.stack([np.sin(f[c, 0] * xx + f[c, 1] * yy + i) for c in range(3)], -1)
        Image.fromarray((img * 255).round().astype(np.uint8)).save(root / "images" / f"{cam.name}.png")
        frames.append({"file_path": f"images/{cam.name}.png",
                       "transform_matrix": (np.linalg.inv(cam.viewmat) @ FLIP).tolist()})
    lens = {"k1": k1, "k2": 0.0, "p1": 0.002, "p2": 0.0}
    meta = {"camera_model": "OPENCV", "fl_x": cam.fx, "fl_y": cam.fy, "cx": cam.cx, "cy": cam.cy, "w": w, "h": h,
            **lens, "frames": frames}
    (root / "transforms.json").write_text(json.dumps(meta))
    return lens


def test_zeroed_copy_and_the_common_frame(tmp_path, rng):
    g = np.random.default_rng(int(torch.randint(0, 2 ** 31, (1,), generator=rng)))
    src = tmp_path / "cap"
    write_capture(src, g)
    zero = tmp_path / "zero"
    assert zeroed_copy(src, zero) == 2  # k1 and p1
    meta = json.loads((zero / "transforms.json").read_text())
    assert all(meta[k] == 0 for k in ("k1", "k2", "p1", "p2")) and (zero / "images").is_symlink()
    ds_lens, ds_zero = load_dataset(src), load_dataset(zero)
    assert ds_zero.test[0].mask is None and ds_lens.test[0].mask is not None  # pincushion: corners without a source
    specs = {s.name: s for s in with_unique_names(read_transforms(src / "transforms.json")[0])}
    gts = {f.name: f.image.numpy() for f in ds_lens.test}
    photos = {f.name: f.image.numpy() for f in ds_zero.test}
    # a perfect prediction in each run's own frame is perfect in the common frame too: the raw photo carried through
    # the undistortion map is the undistorted ground truth, pixel for pixel where both are valid
    r = score(ds_lens, ds_zero, specs, gts, photos)
    assert r["lens_common"] == math.inf and r["zero_common"] == math.inf
    assert r["lens_own"] == math.inf and r["zero_own"] == math.inf
    v = next(iter(r["views"].values()))
    assert 0 < v["common_pixels"] < 40 * 30
    # the zeroed run's photo-frame prediction is not the undistorted image: scored uncarried it would be off
    raw = score(ds_lens, ds_zero, specs, photos, photos)
    assert raw["lens_common"] < 40 and raw["zero_common"] == math.inf


def test_masked_psnr():
    a = np.zeros((2, 2, 3), np.float32)
    b = a.copy()
    b[0, 0] = 0.1
    m = np.array([[False, True], [True, True]])
    assert masked_psnr(a, b, m) == math.inf
    assert masked_psnr(a, b, None) == pytest.approx(-10 * math.log10(0.01 / 4))


def test_end_to_end_on_the_cpu(tmp_path, rng):
    g = np.random.default_rng(int(torch.randint(0, 2 ** 31, (1,), generator=rng)))
    src = tmp_path / "cap"
    write_capture(src, g)
    out = tmp_path / "out"
    args = ["--data", str(src), "--iters", "3", "--seeds", "0,1", "--device", "cpu", "--out", str(out),
            "--rigel-config", "init_points=300"]
    assert main(args) == 0
    res = json.loads((out / "lens.json").read_text())
    assert [r["seed"] for r in res["results"]] == [0, 1]
    assert all(math.isfinite(r["lens_common"]) and math.isfinite(r["zero_common"]) for r in res["results"])
    assert "Δ common" in (out / "lens.md").read_text()
    assert main(args) == 2  # never overwrites
    none = tmp_path / "none"
    zeroed_copy(src, none)
    assert main(["--data", str(none), "--iters", "1", "--device", "cpu", "--out", str(tmp_path / "o2")]) == 2
