"""The viewer's depth display (no Vulkan needed): colormap indices and the frame-image fill of ``viewer.render_view.colormap_depth``."""
from types import SimpleNamespace

import numpy as np
import pytest
import torch

pytest.importorskip("viewer.app")
from viewer.gpu import shaderio  # noqa: E402
from viewer.app import Viewer  # noqa: E402
from viewer.render_view import colormap_depth  # noqa: E402
from viewer.gpu.colormap import depth_colors, depth_index, depth_range, overdraw_lut  # noqa: E402
from viewer.ui import MODE_DEPTH, MODE_LABELS, ViewSettings  # noqa: E402


def test_depth_index_and_range(rng):
    d = 1 + 9 * torch.rand(13, 17, generator=rng)
    d[torch.rand(13, 17, generator=rng) < 0.25] = 0
    near, far = depth_range(d)
    assert float(near) == float(d[d > 0].min()) and float(far) == float(d.max())
    idx = depth_index(d, near, far, 256).numpy()
    dn = d.numpy()
    assert np.all(idx[dn == 0] == 0) and idx[dn > 0].min() == 1 and idx.max() == 255
    ref = 1 + np.rint((dn - float(near)) / (float(far) - float(near)) * 254)   # independent: numpy, float64
    assert np.abs(idx[dn > 0] - ref[dn > 0]).max() <= 1
    # a fixed range clips; no depth at all gives (0, 1) and index 0 everywhere
    assert set(np.unique(depth_index(d, 4.0, 6.0)[d > 0].numpy())) <= set(range(1, 256))
    assert int(depth_index(torch.tensor([3.0, 100.0]), 4.0, 6.0)[0]) == 1
    assert int(depth_index(torch.tensor([3.0, 100.0]), 4.0, 6.0)[1]) == 255
    z = torch.zeros(4, 5)
    n0, f0 = depth_range(z)
    assert (float(n0), float(f0)) == (0.0, 1.0) and not depth_index(z, n0, f0).any()


def test_colormap_depth_fills_the_frame_image(rng):
    """The depth mode is in the mode list and re-renders on range changes; ``render_view.colormap_depth`` writes the LUT
    colours of the depth into the slot's image (auto range and a fixed one)."""
    assert ("depth", MODE_DEPTH) in MODE_LABELS
    s = ViewSettings(mode=MODE_DEPTH)
    k_auto = s.render_key()
    s.depth_auto = False
    assert s.render_key() != k_auto
    s.depth_near, s.depth_far = 2.0, 5.0
    d = 1 + 6 * torch.rand(9, 11, generator=rng)
    d[0, :3] = 0
    slot = SimpleNamespace(image=torch.full((9, 11, 3), float("nan")))
    fake = SimpleNamespace(settings=s)
    lut = overdraw_lut(shaderio.C.COLORMAP_SIZE)
    for auto in (True, False):
        s.depth_auto = auto
        colormap_depth(fake, slot, d)
        near, far = (float(d[d > 0].min()), float(d.max())) if auto else (2.0, 5.0)
        want = lut[depth_index(d, near, far, lut.shape[0]).numpy()][..., :3]
        np.testing.assert_array_equal(slot.image.numpy(), want)
    assert np.all(slot.image[0, :3].numpy() == lut[0, :3])   # no depth: the darkest entry
    torch.testing.assert_close(depth_colors(d, 2.0, 5.0, torch.from_numpy(lut)), slot.image)


def test_offscreen_viewer_depth_mode():
    """The viewer in depth mode (lavapipe in CI): a frame renders and presents; its image holds LUT colours only,
    more than one (the bundled scene spans depths), the empty background the darkest."""
    from test_vulkan import VK_OK, VK_REASON

    if not VK_OK:
        pytest.skip(f"no usable Vulkan device: {VK_REASON}")
    pytest.importorskip("imgui_bundle")
    from rigel_core.data import default_scene_path
    from rigel_core.io import load_scene
    from viewer.model_slot import ModelSlot

    lut = torch.from_numpy(overdraw_lut(shaderio.C.COLORMAP_SIZE))[:, :3]
    with Viewer(ModelSlot(load_scene(default_scene_path())), size=(240, 160), device="cpu", offscreen=True,
                settings=ViewSettings(mode=MODE_DEPTH, render_scale=0.25)) as v:
        assert v.step() is not None
        img = v.ring.latest.image.reshape(-1, 3).clone()   # host-mapped Vulkan memory: copied before closing
        final_T = v.ring.latest.final_T.reshape(-1).clone()
    match = (img[:, None, :] == lut[None]).all(-1)   # (pixels, 256)
    assert match.any(1).all(), "a pixel outside the colormap"
    idx = match.float().argmax(1)
    assert len(torch.unique(idx)) > 10
    assert (idx[final_T == 1] == 0).all() and (final_T == 1).any()


def test_cli_mode_depth_offscreen(tmp_path):
    """``rigel-viewer --mode depth --offscreen`` (fresh-user finding: --mode offered only the shader modes, so the
    depth view could not be asked for from the command line): the run succeeds, summary.json says mode 'depth',
    and the presented frame holds colormap colours only."""
    from test_vulkan import VK_OK, VK_REASON

    if not VK_OK:
        pytest.skip(f"no usable Vulkan device: {VK_REASON}")
    pytest.importorskip("imgui_bundle")
    import json

    from PIL import Image

    from viewer.cli import main

    out = tmp_path / "o"
    assert main(["--offscreen", "--frames", "1", "--out", str(out), "--size", "96x64", "--device", "cpu",
                 "--mode", "depth", "--no-panels", "--render-scale", "1"]) == 0
    assert json.loads((out / "summary.json").read_text())["mode"] == "depth"
    img = torch.from_numpy(np.array(Image.open(out / "frame_0000.png").convert("RGB"))).reshape(-1, 3)
    lut = torch.from_numpy(overdraw_lut(shaderio.C.COLORMAP_SIZE))[:, :3]
    lut8 = (lut.double() * 255).round().to(torch.uint8) if lut.dtype.is_floating_point else lut
    near = (img[:, None, :].int() - lut8[None].int()).abs().amax(-1).amin(1)   # distance to the nearest LUT colour
    assert int(near.max()) <= 1 and len(torch.unique(img, dim=0)) > 10
