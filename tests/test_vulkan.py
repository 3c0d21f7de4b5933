"""Vulkan presentation (DESIGN §6): context, frame ring, present passes, ImGui pass, swapchain and offscreen targets.

Runs on any Vulkan device (CI: Mesa's lavapipe on the CPU; windowed tests under Xvfb, started here when DISPLAY
is unset). The validation layer is on whenever it is installed, and every test fails if it reports an error.
The passes are checked against their definitions (viewer/gpu/shaders/shaderio.h, viewer/gpu/colormap.py) written
out here with numpy: 8-bit UNORM conversion is round(clamp(x, 0, 1) · 255) (Vulkan spec "Conversion from
Floating-Point to Normalized Fixed-Point": round to nearest), exact for every pixel.
"""
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]

if not os.environ.get("XDG_RUNTIME_DIR"):
    _xdg = Path("/tmp") / f"rigel-xdg-{os.getuid()}"
    _xdg.mkdir(mode=0o700, exist_ok=True)
    os.environ["XDG_RUNTIME_DIR"] = str(_xdg)

vkc = pytest.importorskip("viewer.gpu.vk_context", reason="the viewer needs the `vulkan` package")


def ring_class(elide_waits: bool = True, handover: str = "semaphore"):
    """The production FrameRing for its own protocol, else bench/ring_variants.py's BenchRing (the variants the
    benchmark measures live there, not in viewer/gpu/)."""
    from viewer.gpu.frame_ring import FrameRing

    if (elide_waits, handover) == (True, "semaphore"):
        return FrameRing, {}
    sys.path.insert(0, str(ROOT / "bench"))
    from ring_variants import BenchRing

    return BenchRing, {"elide_waits": elide_waits, "handover": handover}


def _probe():
    """(ok, reason, validation_available) for this machine."""
    try:
        ctx = vkc.VulkanContext()
    except vkc.VulkanUnavailable as e:
        return False, str(e), False
    try:
        ctx.init_device()
    except vkc.VulkanUnavailable as e:
        ctx.close()
        return False, str(e), False
    ctx.close()
    vk = vkc.load_vulkan()
    layers = {l.layerName for l in vk.vkEnumerateInstanceLayerProperties()}
    return True, "", vkc.VALIDATION_LAYER in layers


try:
    VK_OK, VK_REASON, VALIDATION = _probe()
except Exception as e:  # pragma: no cover - a broken driver
    VK_OK, VK_REASON, VALIDATION = False, f"Vulkan probe failed: {e}", False

pytestmark = pytest.mark.skipif(not VK_OK, reason=f"no usable Vulkan device: {VK_REASON}")

if VK_OK:
    from viewer.gpu.colormap import overdraw_lut
    from viewer.gpu.frame_ring import FrameRing
    from viewer.gpu.presenter import Presenter
    from viewer.gpu.shaderio import C
    from viewer.gpu.targets import OffscreenTarget


# ---- fixtures shared with tests/test_viewer.py ------------------------------------------------------------
@pytest.fixture(autouse=True)
def no_validation_errors():
    """Fail a test when the validation layer reported an error during it."""
    log = vkc.validation_log
    before = log.errors
    yield
    new = log.errors - before
    assert new == 0, "validation errors:\n" + "\n".join(log.messages[-new:])


@pytest.fixture
def ctx():
    c = vkc.VulkanContext(validation=VALIDATION)
    c.init_device()
    yield c
    c.close()


@pytest.fixture(scope="session")
def display():
    """An X display: $DISPLAY, or an Xvfb started here (skips when neither exists)."""
    if os.environ.get("DISPLAY"):
        yield os.environ["DISPLAY"]
        return
    xvfb = shutil.which("Xvfb")
    if xvfb is None:
        pytest.skip("no DISPLAY and no Xvfb (apt-get install xvfb xauth)")
    r, w = os.pipe()
    proc = subprocess.Popen([xvfb, "-displayfd", str(w), "-screen", "0", "640x480x24", "-nolisten", "tcp"],
                            pass_fds=(w,), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    os.close(w)
    with os.fdopen(r) as f:
        num = f.readline().strip()
    if not num:
        proc.kill()
        pytest.skip("Xvfb did not start")
    os.environ["DISPLAY"] = f":{num}"
    try:
        yield os.environ["DISPLAY"]
    finally:
        del os.environ["DISPLAY"]
        proc.terminate()
        proc.wait(10)


def unorm8(x):
    """Vulkan float → 8-bit UNORM, as lavapipe does it: clamp to [0, 1], multiply by 255 in float32, round to
    nearest, ties to even. (The spec allows either nearest value at an exact tie: :func:`assert_unorm` accepts
    both there.)"""
    p = np.clip(np.asarray(x, np.float32), np.float32(0), np.float32(1)) * np.float32(255)
    return np.rint(p).astype(np.uint8)


def assert_unorm(actual, x):
    """``actual`` (uint8) is a UNORM conversion of float ``x``: one of the two 8-bit values closest to
    255·clamp(x, 0, 1). The Vulkan spec ("Conversion from Floating-Point to Normalized Fixed-Point":
    convertFloatToUint returns one of the two closest integers; rounding to nearest is only recommended) allows
    either: lavapipe rounds to nearest (ties to even), the NVIDIA H200 driver was seen rounding down
    (1.53 -> 1, 68.502 -> 68; 2026-11-29). Anything further away fails."""
    p = np.clip(np.asarray(x, np.float32), np.float32(0), np.float32(1)) * np.float32(255)
    actual = np.asarray(actual)
    ok = (actual == np.floor(p)) | (actual == np.ceil(p))
    if not ok.all():
        bad = np.argwhere(~ok)[:5]
        raise AssertionError(f"{(~ok).sum()} values differ from their UNORM conversion, e.g. at "
                             + ", ".join(f"{tuple(i)}: got {actual[tuple(i)]}, x={np.asarray(x)[tuple(i)]!r}"
                                         for i in bad))


def lut8():
    """The overdraw colormap as 8-bit RGB (entries are exact multiples of 1/255)."""
    return unorm8(overdraw_lut(C.COLORMAP_SIZE)[:, :3])


def fill_slot(ring, w, h, rng, *, image=None, final_T=None, n_contrib=None):
    """Render stand-in: write known data into the next slot and release it."""
    slot = ring.acquire(w, h)
    image = torch.rand(h, w, 3, generator=rng) * 1.4 - 0.2 if image is None else image  # outside [0,1] too
    final_T = torch.rand(h, w, generator=rng) if final_T is None else final_T
    n_contrib = torch.randint(0, 300, (h, w), generator=rng, dtype=torch.int32) if n_contrib is None else n_contrib
    slot.image.copy_(image)
    slot.final_T.copy_(final_T)
    slot.n_contrib.copy_(n_contrib)
    ring.release(slot)
    return slot, image.numpy().copy(), final_T.numpy().copy(), n_contrib.numpy().copy()


def offscreen(ctx, w, h, *, slots=3, imgui=False):
    ring = FrameRing(ctx, slots, capacity=(w, h))
    target = OffscreenTarget(ctx, w, h)
    return ring, target, Presenter(ctx, target, ring, imgui=imgui)


def show(pr, slot, **kw):
    p = pr.present(slot, capture=True, **kw)
    assert p is not None
    return pr.read_pixels(p)


# ---- shaders -----------------------------------------------------------------------------------------------
@pytest.mark.skipif(shutil.which("glslc") is None, reason="glslc not installed (apt-get install glslc)")
def test_committed_spirv_equals_glslc_output():
    from viewer.gpu import shaderio

    for name in shaderio.SHADERS:
        assert shaderio.compile_glsl(name) == shaderio.spirv(name), \
            f"viewer/gpu/shaders/{name}.spv is stale: run `python -m viewer.gpu.shaderio`"


def test_shader_header_constants_and_push_block():
    from viewer.gpu import shaderio

    modes = {C.MODE_IMAGE, C.MODE_ALPHA, C.MODE_OVERDRAW, C.MODE_SIDE_BY_SIDE}
    assert len(modes) == 4
    assert C.COLORMAP_SIZE == overdraw_lut().shape[0] == 256
    blk = shaderio.present_params(3, 4, (5, 6, 7, 8), (9, 10), C.MODE_OVERDRAW, 0, 1, 0.25)
    assert len(blk) == shaderio.PRESENT_PARAMS_SIZE == 48
    assert np.frombuffer(blk[:44], np.int32).tolist() == [3, 4, 5, 6, 7, 8, 9, 10, C.MODE_OVERDRAW, 1, 1]  # max ≥ 1
    assert np.frombuffer(blk[44:], np.float32)[0] == 0.25
    assert len({C.FLAG_SCALE_BAR, C.FLAG_BGRA}) == 2 and C.FLAG_SCALE_BAR & C.FLAG_BGRA == 0


# ---- context ------------------------------------------------------------------------------------------------
def test_context_reopens_without_leaks(rng):
    """Open, use and close everything five times: no file descriptors or Vulkan objects left behind
    (the validation layer reports any object alive at vkDestroyDevice)."""
    fds0 = len(os.listdir("/proc/self/fd"))
    for i in range(5):
        c = vkc.VulkanContext(validation=VALIDATION)
        c.init_device()
        ring, target, pr = offscreen(c, 32, 24, slots=2)
        slot, img, _, _ = fill_slot(ring, 32, 24, rng)
        assert_unorm(show(pr, slot)[..., :3], img)
        c.close()
        c.close()  # idempotent
    assert len(os.listdir("/proc/self/fd")) <= fds0 + 1


@pytest.mark.skipif(not VALIDATION, reason="VK_LAYER_KHRONOS_validation not installed (apt-get install "
                                           "vulkan-validationlayers)")
def test_validation_layer_catches_a_leak():
    """Negative control for the leak checks: a buffer left alive is reported at vkDestroyDevice."""
    log = vkc.validation_log
    before, echo = log.errors, log.echo
    log.echo = False
    try:
        c = vkc.VulkanContext(validation=True)
        c.init_device()
        c.create_buffer(256, c.vk.VK_BUFFER_USAGE_STORAGE_BUFFER_BIT)  # never destroyed
        c.close()
        assert log.errors > before and "vkDestroyDevice" in " ".join(log.messages[-(log.errors - before):])
    finally:
        log.errors, log.echo = before, echo  # expected errors: not counted against the suite


def test_missing_driver_gives_one_clear_message(tmp_path):
    env = dict(os.environ, VK_DRIVER_FILES=str(tmp_path / "none.json"), VK_ICD_FILENAMES=str(tmp_path / "none.json"))
    code = "from viewer.gpu.vk_context import VulkanContext\nVulkanContext().init_device()"
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode != 0
    last = r.stderr.strip().splitlines()[-1]
    assert "VulkanUnavailable" in last and "apt-get install" in last and "mesa-vulkan-drivers" in last, r.stderr


def test_missing_extension_is_named(ctx):
    with pytest.raises(vkc.VulkanUnavailable, match="VK_KHR_not_an_extension"):
        vkc.VulkanContext(instance_extensions=["VK_KHR_not_an_extension"])


# ---- present passes -------------------------------------------------------------------------------------------
@pytest.mark.parametrize("size", [(160, 120), (37, 23)])
def test_image_pass_reads_back_the_rendered_image_exactly(ctx, rng, size):
    w, h = size
    ring, target, pr = offscreen(ctx, w, h)
    for _ in range(2):
        slot, img, _, _ = fill_slot(ring, w, h, rng)
        px = show(pr, slot, mode=C.MODE_IMAGE)
        assert px.shape == (h, w, 4) and (px[..., 3] == 255).all()
        assert_unorm(px[..., :3], img)


def test_alpha_and_overdraw_passes_follow_their_definitions(ctx, rng):
    w, h = 160, 120
    ring, target, pr = offscreen(ctx, w, h)
    n = torch.randint(0, 400, (h, w), generator=rng, dtype=torch.int32)
    n[:5] = 0                        # nothing walked
    n[5:10] = 100000                 # far beyond the scale
    slot, _, fT, nc = fill_slot(ring, w, h, rng, n_contrib=n)
    a = show(pr, slot, mode=C.MODE_ALPHA, scale_bar=False)
    assert_unorm(a[..., :3], np.repeat((np.float32(1.0) - fT)[..., None], 3, -1))

    m = int(torch.randint(1, 300, (1,), generator=rng))
    o = show(pr, slot, mode=C.MODE_OVERDRAW, overdraw_max=m, scale_bar=False)
    idx = np.minimum(nc.astype(np.int64), m) * 255 // m        # integer bucket of n in [0, m]
    np.testing.assert_array_equal(o[..., :3], lut8()[idx])
    assert (o[:5, :, :3] == lut8()[0]).all() and (o[5:10, :, :3] == lut8()[255]).all()

    # With the scale bar: outside its frame the same pixels; inside, the ramp from entry 0 (bottom) to 255 (top).
    ob = show(pr, slot, mode=C.MODE_OVERDRAW, overdraw_max=m, scale_bar=True)
    x0, y0 = w - C.SCALE_BAR_MARGIN - C.SCALE_BAR_WIDTH, C.SCALE_BAR_MARGIN
    x1, y1 = w - C.SCALE_BAR_MARGIN, h - C.SCALE_BAR_MARGIN
    b = C.SCALE_BAR_BORDER
    outside = np.ones((h, w), bool)
    outside[y0 - b:y1 + b, x0 - b:x1 + b] = False
    np.testing.assert_array_equal(ob[outside], o[outside])
    rows = np.arange(y0, y1)
    ramp = lut8()[(y1 - 1 - rows) * 255 // (y1 - y0 - 1)]
    np.testing.assert_array_equal(ob[y0:y1, x0:x1, :3], np.repeat(ramp[:, None], x1 - x0, 1))
    assert (ob[y0 - b, x0:x1, :3] == 255).all() and (ob[y0:y1, x1, :3] == 255).all()  # white frame
    assert (ob[y1 - 1, x0] != ob[y0, x0]).any()


def test_side_by_side_panels_content_area_and_letterbox(ctx, rng):
    w, h = 170, 40
    ring, target, pr = offscreen(ctx, w, h)
    slot, img, fT, nc = fill_slot(ring, 50, 40, rng)  # frame = one panel: shown 1:1
    # content area x ∈ [20, 170): a 20-pixel column for the UI, then image | alpha | overdraw
    px = show(pr, slot, mode=C.MODE_SIDE_BY_SIDE, overdraw_max=299, scale_bar=False, content=(20, 0, 150, 40))
    assert (px[:, :20, :3] == unorm8(0.08)).all()
    assert_unorm(px[:, 20:70, :3], img)
    assert_unorm(px[:, 70:120, 0], np.float32(1.0) - fT)
    np.testing.assert_array_equal(px[:, 120:, :3], lut8()[np.minimum(nc, 299) * 255 // 299])

    # A smaller frame is scaled up by nearest sampling and centred; the rest is the background grey.
    ring2, target2, pr2 = offscreen(ctx, 160, 100)
    slot, img, _, _ = fill_slot(ring2, 20, 10, rng)
    px = show(pr2, slot, mode=C.MODE_IMAGE)
    up = np.repeat(np.repeat(img, 8, 0), 8, 1)                  # s = min(160/20, 100/10) = 8 → 160 × 80
    assert_unorm(px[10:90, :, :3], up)
    assert (px[:10, :, :3] == unorm8(0.08)).all() and (px[90:, :, :3] == unorm8(0.08)).all()


def test_ring_keeps_every_frame_and_grows(ctx, rng):
    """Frames through a 2-slot ring, each presented and read back after the next render was queued: each
    readback shows its own frame (a slot is not overwritten before its present is done); growth rebinds."""
    ring, target, pr = offscreen(ctx, 48, 32, slots=2)
    pending = []
    for i in range(12):
        slot, img, _, _ = fill_slot(ring, 48, 32, rng)
        pending.append((pr.present(slot, mode=C.MODE_IMAGE, capture=True), img))
        if len(pending) == 2:   # read one frame late: the next render has waited on free[s]
            p, want = pending.pop(0)
            assert_unorm(pr.read_pixels(p)[..., :3], want)
    assert ring.read_count == 12 and ring.render_count == 12
    gen = ring.generation
    target.resize(96, 64)
    slot, img, _, _ = fill_slot(ring, 96, 64, rng)
    assert ring.generation > gen and ring.capacity >= 96 * 64
    assert_unorm(show(pr, slot, mode=C.MODE_IMAGE)[..., :3], img)
    with pytest.raises(ValueError):
        ring.acquire(0, 10)
    with pytest.raises(ValueError, match="at least 2"):
        FrameRing(ctx, 1)
    with pytest.raises(ValueError, match="handover"):
        ring_class(handover="fence")[0](ctx, 2, handover="fence")


def test_newest_ready_never_offers_a_slot_being_written(ctx, rng):
    """newest_ready: None before any render; a slot between acquire and release is never offered (its memory is
    being written) even though its previous frame was finished; after release the newest render is."""
    ring, _, _ = offscreen(ctx, 16, 8, slots=2)
    assert ring.newest_ready() is None
    first = ring.acquire(16, 8)
    assert ring.newest_ready() is None and not ring.is_ready(first)
    ring.release(first)
    assert ring.newest_ready() is first and ring.is_ready(first)
    second, *_ = fill_slot(ring, 16, 8, rng)
    assert ring.newest_ready() is second
    again = ring.acquire(16, 8)            # the 2-slot ring comes back to the first slot: frame 1 is finished,
    assert again is first and again.frame == 1
    assert ring.newest_ready() is second   # but the slot is being overwritten
    ring.release(again)
    assert ring.newest_ready() is again and again.frame == 3


# ---- ImGui ------------------------------------------------------------------------------------------------------
def _imgui_frame(w, h, pos=(10, 8), size=(120, 100)):
    from imgui_bundle import imgui, implot

    io = imgui.get_io()
    io.display_size = imgui.ImVec2(w, h)
    io.delta_time = 1 / 60
    imgui.new_frame()
    imgui.set_next_window_pos(imgui.ImVec2(*pos))
    imgui.set_next_window_size(imgui.ImVec2(*size))
    imgui.begin("panel")
    imgui.slider_float("value", 0.25, 0.0, 1.0)
    if implot.begin_plot("plot", imgui.ImVec2(-1, 50)):
        implot.plot_line("psnr", np.linspace(20, 30, 16).astype(np.float32))
        implot.end_plot()
    imgui.end()
    imgui.render()
    return imgui.get_draw_data()


def test_imgui_window_slider_plot_render_where_the_window_is(ctx, rng):
    from imgui_bundle import imgui, implot

    ic, pc = imgui.create_context(), implot.create_context()
    imgui.get_io().set_ini_filename("")
    try:
        w, h = 200, 150
        ring, target, pr = offscreen(ctx, w, h, imgui=True)
        slot, img, _, _ = fill_slot(ring, w, h, rng)
        plain = show(pr, slot, mode=C.MODE_IMAGE)[..., :3]     # the same frame without draw data
        for _ in range(2):  # the first frame also uploads the font atlas
            px = show(pr, slot, mode=C.MODE_IMAGE, draw_data=_imgui_frame(w, h))
        diff = (px[..., :3] != plain).any(-1)
        inside = diff[8:108, 10:130]
        assert inside.mean() > 0.9, inside.mean()     # the window's background covers it
        assert not diff[:, 131:].any() and not diff[109:, :].any()   # untouched outside (scissor, no stray quads)
        # The font atlas was uploaded through the texture hand-over; a second presenter on the same ImGui
        # context re-creates it and draws the same pixels.
        assert any(t.status == imgui.ImTextureStatus.ok for t in imgui.get_platform_io().textures)
        pr.close()
        pr2 = Presenter(ctx, target, ring, imgui=True)
        for _ in range(2):
            px2 = show(pr2, slot, mode=C.MODE_IMAGE, draw_data=_imgui_frame(w, h))
        np.testing.assert_array_equal(px2, px)
    finally:
        ctx.close()
        implot.destroy_context(pc)
        imgui.destroy_context(ic)


# ---- window (Xvfb + swapchain) ------------------------------------------------------------------------------------
@pytest.fixture
def window(display):
    glfw = pytest.importorskip("glfw")
    if not glfw.init():
        pytest.skip("GLFW cannot open the display")
    glfw.window_hint(glfw.CLIENT_API, glfw.NO_API)
    win = glfw.create_window(160, 120, "rigel test", None, None)
    yield glfw, win
    if win:
        glfw.destroy_window(win)
    glfw.terminate()


def _window_stack(glfw, win, vsync=True):
    from viewer.gpu.targets import SwapchainTarget, create_window_surface

    c = vkc.VulkanContext(validation=VALIDATION, instance_extensions=glfw.get_required_instance_extensions())
    surface = create_window_surface(c, win)
    c.init_device(surface=surface)
    ring = FrameRing(c, 3, capacity=(160, 120))
    target = SwapchainTarget(c, win, surface, vsync=vsync)
    return c, ring, target, Presenter(c, target, ring, imgui=False)


@pytest.mark.skipif(shutil.which("import") is None, reason="ImageMagick `import` missing (apt-get install imagemagick)")
def test_window_presents_frames_and_screen_matches(window, rng):
    from PIL import Image

    glfw, win = window
    c, ring, target, pr = _window_stack(glfw, win)
    try:
        assert target.format == c.vk.VK_FORMAT_B8G8R8A8_UNORM
        for i in range(10):
            glfw.poll_events()
            slot, img, _, _ = fill_slot(ring, target.width, target.height, rng)
            p = pr.present(slot, mode=C.MODE_IMAGE, capture=True)
            assert p == i + 1
        presented = pr.read_pixels(p)[..., :3]
        assert_unorm(presented, img)
        time.sleep(0.1)
        shot_path = Path(os.environ["XDG_RUNTIME_DIR"]) / "rigel_shot.png"
        subprocess.run(["import", "-window", "root", str(shot_path)], check=True, timeout=30)
        shot = np.asarray(Image.open(shot_path).convert("RGB"))
        x, y = glfw.get_window_pos(win)
        np.testing.assert_array_equal(shot[y:y + target.height, x:x + target.width], presented)
    finally:
        c.close()


def test_window_resize_minimise_vsync_and_close_mid_frame(window, rng):
    glfw, win = window
    c, ring, target, pr = _window_stack(glfw, win, vsync=False)
    slot, *_ = fill_slot(ring, 160, 120, rng)
    assert pr.present(slot) is not None
    glfw.set_window_size(win, 1, 1)
    for _ in range(3):
        glfw.poll_events()
        pr.present(slot)
    assert (target.width, target.height) == (1, 1)
    glfw.iconify_window(win)
    for _ in range(3):
        glfw.poll_events()
        pr.present(slot)            # minimised (where a window manager honours it): frames are skipped
    glfw.restore_window(win)
    glfw.set_window_size(win, 200, 90)
    for _ in range(5):
        glfw.poll_events()
        pr.present(slot)
        time.sleep(0.01)
    assert (target.width, target.height) == (200, 90)
    target.set_vsync(True)
    rebuilds = target.rebuilds
    assert pr.present(slot) is not None and target.rebuilds == rebuilds + 1
    # A zero-sized framebuffer (what a minimised window reports): nothing is acquired or submitted.
    real_size = glfw.get_framebuffer_size
    glfw.get_framebuffer_size = lambda w: (0, 0)
    try:
        count = pr.count
        assert pr.present(slot) is None and pr.count == count
    finally:
        glfw.get_framebuffer_size = real_size
    # OUT_OF_DATE from acquire: the frame is skipped and the swapchain rebuilt on the next one.
    real_acquire, real_present = target._acquire, target._present

    def out_of_date(*a):
        target._acquire = real_acquire
        raise c.vk.VkErrorOutOfDateKhr()

    target._acquire = out_of_date
    assert pr.present(slot) is None and target.needs_rebuild
    rebuilds = target.rebuilds
    assert pr.present(slot) is not None and target.rebuilds == rebuilds + 1
    # SUBOPTIMAL from present (after the image was queued): rebuilt before the next frame.

    def suboptimal(*a):
        real_present(*a)
        raise c.vk.VkSuboptimalKhr()

    target._present = suboptimal
    assert pr.present(slot) is not None and target.needs_rebuild
    target._present = real_present
    assert pr.present(slot) is not None and target.rebuilds == rebuilds + 2
    slot, *_ = fill_slot(ring, 200, 90, rng)
    pr.present(slot)                 # submitted, not waited for
    c.close()                        # closing mid-frame tears down in order


# ---- CUDA interop ---------------------------------------------------------------------------------------------------
def test_cuda_interop_failure_names_the_call_and_closes_the_fd(ctx):
    """Any failed import (here: no GPU, or a pipe that is no Vulkan memory) raises CudaInteropError naming the
    CUDA call, and the fd — still ours when the import failed — is closed."""
    pytest.importorskip("cuda.bindings", reason="cuda-bindings not installed")
    from viewer.gpu.cuda_interop import CudaInteropError, ExternalBuffer, ExternalTimelineSemaphore

    for make in (lambda fd: ExternalBuffer(fd, 4096), lambda fd: ExternalTimelineSemaphore(fd)):
        r, w = os.pipe()
        with pytest.raises(CudaInteropError, match=r"cuda\w+\(?.*failed"):
            make(r)
        with pytest.raises(OSError):
            os.fstat(r)
        os.close(w)
    with pytest.raises(ValueError, match="interop=True"):
        FrameRing(ctx, 2, device="cuda")


# ---- GPU: CUDA interop -------------------------------------------------------------------------------------------
@pytest.mark.gpu
@pytest.mark.parametrize("elide_waits, handover", [(True, "semaphore"), (False, "semaphore"), (True, "event")],
                         ids=["elided", "every-wait", "event"])
def test_gpu_ring_200_frames_with_slow_vulkan_side(elide_waits, handover):
    """CUDA writes a per-frame pattern into slot s; Vulkan, slowed by big fills before each copy, copies the
    slot to its own host region per frame. Every one of 200 frames must read back as written: CUDA waited on
    free[s] before overwriting, Vulkan waited on ready[s] before reading. With the waits elided the ring still
    enqueued waits the slow Vulkan side made necessary; without, every render after the first k did. With the
    "event" handover the copy waits for nothing on the GPU: present_wait has seen the render finish."""
    c = vkc.VulkanContext(validation=VALIDATION)
    c.init_device(interop=True, device_uuid=vkc.cuda_device_uuid())
    vk = c.vk
    try:
        w, h, k, n_frames = 64, 48, 3, 200
        cls, switches = ring_class(elide_waits, handover)
        ring = cls(c, k, device="cuda", capacity=(w, h), **switches)
        slot_bytes = ring.buffers[0].size
        host = c.create_buffer(slot_bytes * n_frames, vk.VK_BUFFER_USAGE_TRANSFER_DST_BIT, host_visible=True)
        scratch = c.create_buffer(256 << 20, vk.VK_BUFFER_USAGE_TRANSFER_DST_BIT, host_visible=False)
        cmds = c.allocate_command_buffers(n_frames)
        stream = torch.cuda.current_stream()
        for n in range(n_frames):
            slot = ring.acquire(w, h, stream)
            if n % 3 == 1:
                torch.cuda._sleep(2_000_000)             # a slow render now and then
            slot.image.fill_(float(n))
            slot.final_T.fill_(float(n) + 0.5)
            slot.n_contrib.fill_(n * 7)
            ring.release(slot, stream)
            cmd = cmds[n]
            vk.vkBeginCommandBuffer(cmd, vk.VkCommandBufferBeginInfo(
                flags=vk.VK_COMMAND_BUFFER_USAGE_ONE_TIME_SUBMIT_BIT))
            for _ in range(8):                           # the slow Vulkan side: ~2 GB of fills per frame
                vk.vkCmdFillBuffer(cmd, scratch.handle, 0, scratch.size, n)
            region = vk.VkBufferCopy(srcOffset=0, dstOffset=n * slot_bytes, size=slot_bytes)
            vk.vkCmdCopyBuffer(cmd, ring.buffers[slot.index].handle, host.handle, 1, [region])
            to_host = vk.VkBufferMemoryBarrier(srcAccessMask=vk.VK_ACCESS_TRANSFER_WRITE_BIT,
                                               dstAccessMask=vk.VK_ACCESS_HOST_READ_BIT,
                                               srcQueueFamilyIndex=vk.VK_QUEUE_FAMILY_IGNORED,
                                               dstQueueFamilyIndex=vk.VK_QUEUE_FAMILY_IGNORED, buffer=host.handle,
                                               offset=n * slot_bytes, size=slot_bytes)
            vk.vkCmdPipelineBarrier(cmd, vk.VK_PIPELINE_STAGE_TRANSFER_BIT, vk.VK_PIPELINE_STAGE_HOST_BIT, 0, 0, None,
                                    1, [to_host], 0, None)
            vk.vkEndCommandBuffer(cmd)
            wait = ring.present_wait(slot)
            assert (wait is None) == (handover != "semaphore")
            waits = [wait] if wait is not None else []
            fsem, fval = ring.mark_read(slot)
            tl = vk.VkTimelineSemaphoreSubmitInfo(waitSemaphoreValueCount=len(waits),
                                                  pWaitSemaphoreValues=[v for _, v in waits] or None,
                                                  signalSemaphoreValueCount=1, pSignalSemaphoreValues=[fval])
            submit = vk.VkSubmitInfo(pNext=tl, waitSemaphoreCount=len(waits),
                                     pWaitSemaphores=[sem for sem, _ in waits] or None,
                                     pWaitDstStageMask=[vk.VK_PIPELINE_STAGE_TRANSFER_BIT] * len(waits) or None,
                                     commandBufferCount=1, pCommandBuffers=[cmd], signalSemaphoreCount=1,
                                     pSignalSemaphores=[fsem])
            vk.vkQueueSubmit(c.queue, 1, [submit], None)
        assert c.wait_timeline(ring.free[slot.index], ring.last_read[slot.index], 30_000_000_000)
        data = np.frombuffer(host.mapped, np.uint8, slot_bytes * n_frames).reshape(n_frames, slot_bytes)
        (o_i, _), (o_t, _), (o_n, _) = ring.ranges()
        npx = w * h
        for n in range(n_frames):
            row = data[n]
            assert (row[o_i:o_i + npx * 12].view(np.float32) == n).all(), f"frame {n}: image"
            assert (row[o_t:o_t + npx * 4].view(np.float32) == n + 0.5).all(), f"frame {n}: final_T"
            assert (row[o_n:o_n + npx * 4].view(np.int32) == n * 7).all(), f"frame {n}: n_contrib"
        if elide_waits:   # the event handover's host waits for each render can leave no wait to enqueue
            assert (0 if handover == "event" else 1) <= ring.waits_enqueued <= n_frames - k
        else:
            assert ring.waits_enqueued == n_frames - k
        c.free_command_buffers(cmds)
        host.destroy()
        scratch.destroy()
    finally:
        c.close()


@pytest.mark.gpu
@pytest.mark.parametrize("handover", ["semaphore", "event"])
def test_gpu_newest_ready_waits_for_the_render_to_finish(handover):
    """CUDA path: a released render still running on the stream is not offered (ready[s] not reached); the
    previous finished one is; once the stream is done the new one is. Every slot's content is what its frame
    wrote."""
    c = vkc.VulkanContext(validation=VALIDATION)
    c.init_device(interop=True, device_uuid=vkc.cuda_device_uuid())
    try:
        cls, switches = ring_class(handover=handover)
        ring = cls(c, 3, device="cuda", capacity=(32, 16), **switches)
        stream = torch.cuda.current_stream()
        first = ring.acquire(32, 16, stream)
        first.image.fill_(1.0)
        ring.release(first, stream)
        torch.cuda.synchronize()
        assert ring.newest_ready() is first
        second = ring.acquire(32, 16, stream)
        torch.cuda._sleep(200_000_000)          # ~0.1 s of GPU time before the render's writes and its signal
        second.image.fill_(2.0)
        ring.release(second, stream)
        assert ring.latest is second and not ring.is_ready(second)
        assert ring.newest_ready() is first
        torch.cuda.synchronize()
        assert ring.is_ready(second) and ring.newest_ready() is second
        assert float(second.image.min()) == 2.0 and float(first.image.max()) == 1.0
    finally:
        c.close()


@pytest.mark.gpu
@pytest.mark.parametrize("handover", ["semaphore", "event"])
def test_gpu_ring_render_is_bit_identical_and_presents(rng, handover):
    import rigel_core
    from rigel_core import Camera, GaussianModel

    c = vkc.VulkanContext(validation=VALIDATION)
    c.init_device(interop=True, device_uuid=vkc.cuda_device_uuid())
    try:
        n = 3000
        model = GaussianModel.from_points(torch.randn(n, 3, generator=rng), torch.rand(n, 3, generator=rng),
                                          sh_degree=1, scale=0.05, opacity=0.6).to(device="cuda")
        cam = Camera.look_at((0.0, -6.0, 2.0), (0.0, 0.0, 0.0), width=200, height=150)
        cls, switches = ring_class(handover=handover)
        ring = cls(c, 3, device="cuda", capacity=(200, 150), **switches)
        target = OffscreenTarget(c, 200, 150)
        pr = Presenter(c, target, ring, imgui=False)
        ref = rigel_core.render(model, cam)
        for _ in range(5):
            slot = ring.acquire(200, 150)
            rigel_core.render(model, cam, out=(slot.image, slot.final_T, slot.n_contrib))
            ring.release(slot)
            px = show(pr, slot, mode=C.MODE_IMAGE)
            torch.cuda.synchronize()
            assert torch.equal(slot.image, ref.image) and torch.equal(slot.final_T, ref.final_T)
            assert torch.equal(slot.n_contrib, ref.n_contrib)
            assert_unorm(px[..., :3], ref.image.cpu().numpy())
        assert ring.overdraw_max(slot) == int(ref.n_contrib.max())
    finally:
        c.close()
