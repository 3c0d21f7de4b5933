"""``rigel-render --depth`` on the CPU (bundled scene, tiny size) and the 16-bit depth PNG encoding."""
import numpy as np
import pytest
import torch
from PIL import Image

from rigel_core import render
from rigel_core.cli.render import main
from rigel_core.data import default_scene_path, orbit_cameras, orbit_transforms
from rigel_core.depth_image import (DEPTH_LEVELS, decode_depth16, depth_range, encode_depth16, read_depth_png,
                                    write_depth_png)

io = pytest.importorskip("rigel_core.io")


@pytest.fixture(scope="module")
def scene():
    return io.load_scene(default_scene_path())


def test_encoding_round_trip(tmp_path, rng):
    """Random depths with holes: the PNG decodes to within half a step of the depth (clipped to the range);
    0 stays 0; the file is a 16-bit greyscale PNG any reader opens."""
    d = (0.5 + 20 * torch.rand(17, 23, generator=rng, dtype=torch.float64)).numpy().astype(np.float32)
    d[torch.rand(17, 23, generator=rng).numpy() < 0.2] = 0
    near, far = depth_range(d)
    assert near == d[d > 0].min() and far == d.max()
    write_depth_png(tmp_path / "d.png", d, near, far)
    with Image.open(tmp_path / "d.png") as img:
        assert img.mode.startswith("I;16") or img.mode == "I"
        raw = np.asarray(img)
    assert raw.max() == DEPTH_LEVELS + 1 and raw[d > 0].min() == 1 and np.all(raw[d == 0] == 0)
    back, meta = read_depth_png(tmp_path / "d.png")
    assert (meta["near"], meta["far"], meta["kind"]) == (near, far, "expected")
    step = (far - near) / DEPTH_LEVELS
    assert np.abs(back - d).max() <= 0.5 * step + 1e-6 * far
    # a narrower range clips; a flat map still gets a valid scale
    v = encode_depth16(d, 5.0, 10.0)
    np.testing.assert_allclose(decode_depth16(v, 5.0, 10.0)[d > 0], np.clip(d[d > 0], 5, 10), atol=1e-4)
    n2, f2 = depth_range(np.full((3, 3), 2.5, np.float32))
    assert n2 == 2.5 and f2 > n2
    with pytest.raises(ValueError):
        encode_depth16(d, 3.0, 3.0)
    Image.fromarray(np.zeros((4, 4), np.uint8)).save(tmp_path / "plain.png")
    with pytest.raises(ValueError, match="plain.png"):
        read_depth_png(tmp_path / "plain.png")


def test_render_depth_cli(tmp_path, scene, capsys):
    cams = tmp_path / "transforms.json"
    orbit_transforms((0, 0, 0), 9.0, 2, 24, 16, 55.0, out=cams, elevation_deg=25)
    ref_cams = orbit_cameras((0, 0, 0), 9.0, 2, 24, 16, 55.0, elevation_deg=25)
    out = tmp_path / "out"
    assert main(["default", "--cameras", str(cams), "--out", str(out), "--device", "cpu", "--depth"]) == 0
    assert sorted(p.name for p in out.iterdir()) == ["orbit_000.depth.npy", "orbit_000.depth.png", "orbit_000.png",
                                                     "orbit_001.depth.npy", "orbit_001.depth.png", "orbit_001.png"]
    r = render(scene, ref_cams[1], depth=True)
    npy = np.load(out / "orbit_001.depth.npy")
    assert npy.dtype == np.float32 and npy.shape == (16, 24)
    np.testing.assert_allclose(npy, r.depth.numpy(), rtol=1e-6, atol=0)
    assert (npy > 0).any(), "the view sees nothing"
    png, meta = read_depth_png(out / "orbit_001.depth.png")
    near, far = meta["near"], meta["far"]
    assert near == pytest.approx(float(npy[npy > 0].min())) and far == pytest.approx(float(npy.max()))
    assert np.abs(png - npy).max() <= 0.5 * (far - near) / DEPTH_LEVELS + 1e-6 * far

    # existing PNGs and depth files are never replaced: refused before rendering, files untouched
    before = (out / "orbit_000.depth.npy").read_bytes()
    capsys.readouterr()
    assert main(["default", "--cameras", str(cams), "--out", str(out), "--device", "cpu", "--depth", "median",
                 "--depth-range", "1,20"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "orbit_000.png exists (and 5 more)" in err and "--force" in err
    assert (out / "orbit_000.depth.npy").read_bytes() == before
    # --force replaces; --depth median with a fixed range
    assert main(["default", "--cameras", str(cams), "--out", str(out), "--device", "cpu", "--depth", "median",
                 "--depth-range", "1,20", "--force"]) == 0
    np.testing.assert_array_equal(np.load(out / "orbit_001.depth.npy"), r.depth_median.numpy())
    png, meta = read_depth_png(out / "orbit_001.depth.png")
    assert (meta["near"], meta["far"], meta["kind"]) == (1.0, 20.0, "median")
    med = r.depth_median.numpy()
    assert np.abs(png - np.where(med > 0, np.clip(med, 1, 20), 0)).max() <= 0.5 * 19 / DEPTH_LEVELS + 1e-5
    assert not [p for p in out.iterdir() if p.name.startswith(".")]  # no temporary file left



def test_render_depth_names_never_clash(tmp_path):
    """A frame named "a.depth" beside a frame "a": with --depth, a's depth image and a.depth's colour render would both
    be a.depth.png (one overwrote the other); the colour render's name is numbered instead and every file written."""
    import json

    cams = tmp_path / "transforms.json"
    orbit_transforms((0, 0, 0), 9.0, 3, 24, 16, 55.0, out=cams, elevation_deg=25)
    data = json.loads(cams.read_text())
    for frame, path in zip(data["frames"], ["a.png", "a.depth.png", "b.png"]):
        frame["file_path"] = path
    cams.write_text(json.dumps(data))
    out = tmp_path / "out"
    assert main(["default", "--cameras", str(cams), "--out", str(out), "--device", "cpu", "--depth"]) == 0
    files = sorted(p.name for p in out.iterdir())
    assert len(files) == 9 and "a.depth.png" in files and "a.depth_1.png" in files, files
    with Image.open(out / "a.depth.png") as img:   # a's depth image, not a.depth's colour render
        assert img.mode.startswith("I;16") or img.mode == "I"

@pytest.mark.parametrize("args,text", [(["--depth-range", "1,2"], "needs --depth"),
                                       (["--depth", "--depth-range", "3,1"], "NEAR < FAR"),
                                       (["--depth", "--depth-range", "a,b"], "NEAR,FAR"),
                                       (["--depth", "mean"], "invalid choice")])
def test_render_depth_argument_errors(tmp_path, capsys, args, text):
    with pytest.raises(SystemExit) as e:
        main(["default", "--cameras", str(tmp_path / "t.json"), "--out", str(tmp_path / "o")] + args)
    assert e.value.code == 2
    assert text in capsys.readouterr().err
