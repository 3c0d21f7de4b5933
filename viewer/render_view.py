"""One render of the viewer: the shown model into the next frame-ring slot, the stage timings (read back without
waiting), and the per-pixel error against a snapped training view (:class:`ErrorMap`)."""
from __future__ import annotations

import contextlib
import math
import time

from .gpu.shaderio import C
from .ui_state import ErrorView

__all__ = ["render_view", "poll_timing", "ErrorMap"]


def render_view(v, fw: int, fh: int) -> None:
    """Render ``v``'s model from its camera into the next ring slot of ``v.ring`` (CPU: blocking; CUDA: enqueued
    on the viewer's stream), timing the appearance and rasterization stages into ``v.stats``. A view that needs more
    binning entries than the limit (``BinningOverflow``) leaves the background in the slot and its reason in
    ``v.stats.render_problem`` (None after a render that succeeded), which the Render section shows."""
    import torch

    from rigel_core.renderer.mip import effective_scales_opacities
    from rigel_core.renderer import compute_colors, rasterize_gaussians
    from rigel_core.renderer.output import BinningOverflow

    from .ui import MODE_DEPTH

    side = v.settings.mode == C.MODE_SIDE_BY_SIDE        # the panel has its own column there
    cam = v.camera.camera(fw, fh, offset=0.0 if side else None)
    stream, model, stats = v._stream, v.model, v.stats
    dev, dtype = model.device, model.dtype
    bg = torch.ones(3, dtype=dtype, device=dev) if v.settings.white_background else None
    degree = min(v.settings.sh_degree, model.active_sh_degree)
    ctx = torch.cuda.stream(stream) if stream is not None else contextlib.nullcontext()
    with ctx, torch.no_grad():
        slot = v.ring.acquire(fw, fh, stream)
        t0 = time.perf_counter()
        if stream is not None:
            ev = [torch.cuda.Event(enable_timing=True) for _ in range(3)]
            ev[0].record(stream)
        colors = v.studio.tint(compute_colors(model, cam, degree), model)   # the selection overlay
        if stream is not None:
            ev[1].record(stream)
        t1 = time.perf_counter()
        mode = v.settings.render_mode or getattr(model, "render_mode", "default")
        scales, opacities = effective_scales_opacities(model, mode)   # the mip mode's 3D filter, if any
        depth = v.settings.mode == MODE_DEPTH   # depth display (issue 17.2)
        try:
            r = rasterize_gaussians(model.means3D, model.quats, scales, opacities, colors,
                                    cam.viewmat_tensor(dev, dtype), cam.K_tensor(dev, dtype), cam.width, cam.height,
                                    background=bg, out=(slot.image, slot.final_T, slot.n_contrib), render_mode=mode,
                                    depth=depth)
            stats.render_problem = None
        except BinningOverflow as e:  # a camera amid huge splats: an empty frame and one line, not a crash
            slot.image.copy_(bg.to(slot.image.dtype).expand_as(slot.image) if bg is not None else
                             torch.zeros_like(slot.image))
            slot.final_T.fill_(1.0)
            slot.n_contrib.zero_()
            stats.render_problem = (f"this view needs {e.n_entries:,} tile entries, over the limit of "
                                    f"{e.max_entries:,}: move the camera back or lower the render scale")
            r, depth = None, False
        if depth:
            colormap_depth(v, slot, r.depth)
        if stream is not None:
            ev[2].record(stream)
            v._pending_timing = ev
        else:
            t2 = time.perf_counter()
            _set_times(stats, (t1 - t0) * 1e3, (t2 - t1) * 1e3)
            v.studio.record_render(stats.render_ms, fw * fh)
        v.errors.update(slot, v.camera_index if v.camera.snapped is not None else None)
        v.ring.release(slot, stream)
    stats.frame_size = (fw, fh)
    stats.renders += 1


def colormap_depth(v, slot, depth) -> None:
    """Depth display (issue 17.2): the frame's image becomes the overdraw colormap over the expected depth,
    scaled to the near/far of the Render panel or (auto) to the frame's own depth range."""
    import torch

    from .gpu.colormap import depth_colors, depth_range, overdraw_lut

    lut = getattr(v, "_depth_lut", None)
    if lut is None or lut.device != depth.device:
        lut = v._depth_lut = torch.from_numpy(overdraw_lut(C.COLORMAP_SIZE)).to(depth.device)
    s = v.settings
    near, far = depth_range(depth) if s.depth_auto else (s.depth_near, s.depth_far)
    slot.image.copy_(depth_colors(depth, near, far, lut))


def _set_times(stats, appearance_ms: float, rasterize_ms: float) -> None:
    stats.stage_ms["appearance"] = appearance_ms
    stats.stage_ms["rasterize"] = rasterize_ms
    stats.render_ms = appearance_ms + rasterize_ms
    stats.render_ms_history.append(stats.render_ms)


def poll_timing(v) -> None:
    """Take the CUDA render timings once their events are done (never waits); GPU memory twice a second."""
    ev = v._pending_timing
    if ev is not None and ev[2].query():
        _set_times(v.stats, ev[0].elapsed_time(ev[1]), ev[1].elapsed_time(ev[2]))
        v._pending_timing = None
    if v.render_device == "cuda" and time.perf_counter() - v._gpu_mem_t > 0.5:
        import torch

        v._gpu_mem_t = time.perf_counter()
        total = torch.cuda.get_device_properties(torch.cuda.current_device()).total_memory
        v.stats.gpu_memory = (torch.cuda.memory_allocated(), torch.cuda.memory_reserved(), total)


class ErrorMap:
    """|render − ground truth| of a snapped training view, for the PSNR window.

    Args:
        frames: the dataset frames (camera, image, name); a frame whose ``image`` is None (a camera alone:
            ``rigel-viewer --cameras`` of a file of cameras alone) has no error map.
        device: the render device; stream: the viewer's CUDA stream (None on the CPU).
    """

    def __init__(self, frames, device: str, stream=None):
        self.frames = frames
        self.device = device
        self.stream = stream
        self.view: ErrorView | None = None
        self._pending = None
        self._gt_cache: dict = {}

    def ground_truth(self, index: int, width: int, height: int):
        """The training image ``index`` at ``width × height`` (area-averaged when smaller), on the render device,
        cached for the last size asked."""
        import torch
        import torch.nn.functional as F

        key = (index, width, height)
        gt = self._gt_cache.get(key)
        if gt is None:
            img = self.frames[index].image.to(self.device, torch.float32)
            if tuple(img.shape[:2]) != (height, width):
                img = F.interpolate(img.permute(2, 0, 1)[None], size=(height, width), mode="area")[0].permute(1, 2, 0)
            self._gt_cache = {key: img.contiguous()}
            gt = self._gt_cache[key]
        return gt

    def update(self, slot, index: int | None) -> None:
        """After a render of training view ``index`` (None: not snapped to one): |render − GT| per pixel (mean
        over RGB), downsampled, and the frame's PSNR. CPU: computed now; CUDA: enqueued on the stream with a
        non-blocking copy to the host, picked up by :meth:`poll` once done (never waited for)."""
        import torch

        if index is None or not self.frames or self.frames[index].image is None:   # None: a camera alone
            self.view = None
            return
        gt = self.ground_truth(index, slot.width, slot.height)
        diff = slot.image.clamp(0.0, 1.0) - gt
        err = diff.abs().mean(-1)
        mse = (diff * diff).mean()
        f = max(1, math.ceil(max(slot.width, slot.height) / 96))
        small = torch.nn.functional.avg_pool2d(err[None, None], f)[0, 0] if f > 1 else err
        name = self.frames[index].name
        if slot.image.is_cuda:
            host = torch.empty(small.numel() + 1, dtype=torch.float32, pin_memory=True)
            host[:-1].copy_(small.reshape(-1), non_blocking=True)
            host[-1:].copy_(mse.reshape(1), non_blocking=True)
            done = torch.cuda.Event()
            done.record(self.stream)
            self._pending = (done, host, tuple(small.shape), name, (slot.width, slot.height))
        else:
            self._set(small.numpy().copy(), float(mse), name, (slot.width, slot.height))

    def _set(self, values, mse: float, name: str, frame_size):
        psnr = math.inf if mse <= 0 else 10.0 * math.log10(1.0 / mse)
        self.view = ErrorView(name, values.astype("float32"), psnr, float(values.max()) if values.size else 0.0,
                              frame_size)

    def poll(self) -> None:
        pending = self._pending
        if pending is not None and pending[0].query():
            _, host, shape, name, size = pending
            arr = host.numpy()
            self._set(arr[:-1].reshape(shape).copy(), float(arr[-1]), name, size)
            self._pending = None
