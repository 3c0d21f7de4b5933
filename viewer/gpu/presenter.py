"""The Vulkan half of the frame loop: present a ring slot (+ ImGui) into a target, without idling anything.

Per present number p (1, 2, …) with frame-in-flight index f = p mod F:

1. host waits ``present_done ≥ p − F`` (the previous use of f's command buffer, ImGui buffers, readback buffer);
   frees what earlier frames left behind (``garbage``);
2. the target gives an image (swapchain: acquire with f's semaphore);
3. f's command buffer records: ImGui texture uploads, the present pass (a compute dispatch over the target that
   shows the slot in the mode, then a copy of its output into the image), the render pass (ImGui on top),
   optionally a copy of the image into f's readback buffer;
4. one submit waits ``ready[s] ≥ r`` (the slot's render, at the compute stage; no wait when the ring's handover
   says the render is known finished) and the acquire semaphore (at the transfer stage), and signals
   ``free[s] = q`` (the ring's read number; the ring may overwrite s after it), ``present_done = p`` and, for a
   swapchain, the image's render-finished semaphore; then the image is presented.

No ``vkQueueWaitIdle`` / ``vkDeviceWaitIdle`` here (only in rebuilds: resize, ring growth, teardown).

**Re-presenting costs no recording.** Step 3 is skipped when the command buffer for (f, target image) already
holds exactly this frame: the same slot, mode, push constants, target image and buffers, and the same ImGui draw
data (the caller's ``ui_version``: the frame loop re-presents its last panels between two rebuilds while a training
runs, viewer/app.py). The buffer is then submitted again as it is (recorded without ONE_TIME_SUBMIT; its previous
submission is finished, step 1). Recording the ImGui pass is most of a present's Python (one ``vkCmd*`` per draw
command); a re-present is a few Vulkan calls. **Holding costs nothing:** ``present(..., hold=True)`` of the picture the last
present showed (same render of the same slot, mode, area, panels, target) submits nothing at all and returns the
last present number — the window, or the offscreen image, keeps showing it (the frame loop's repeats while a
training runs, viewer/app.py).
"""
from __future__ import annotations

import numpy as np

from .imgui_pass import ImGuiPass
from .present import PresentPass
from .shaderio import C
from .vk_context import check_result

__all__ = ["Presenter"]


def _handle(buffer):
    return buffer.handle if buffer is not None else None


class Presenter:
    """Presents frame-ring slots into ``target``.

    Args:
        ctx, target, ring: the context, an OffscreenTarget or SwapchainTarget, the FrameRing.
        imgui: create the ImGui pass (an ImGui context must exist).
        frames: frames in flight F (the target must have been created with the same F).
    """

    def __init__(self, ctx, target, ring, *, imgui: bool = True, frames: int = 2):
        vk = self.vk = ctx.vk
        self.ctx, self.target, self.ring = ctx, target, ring
        self.frames = frames
        self.present_pass = PresentPass(ctx, ring, frames)
        self.imgui_pass = ImGuiPass(ctx, target.render_pass, frames) if imgui else None
        self.present_done = ctx.create_timeline_semaphore()
        self.cmds = ctx.allocate_command_buffers(frames)
        self._extra_cmds: dict = {}    # (f, image index) -> command buffer, for index != f (swapchains)
        self._recorded: dict = {}      # command buffer (by id) -> the key of what it holds (None: nothing reusable)
        self._textures_version = None  # the ui_version whose texture requests were honoured
        self._draw_version = None      # the ui_version being recorded (ImGuiPass caches its draw list by it)
        self.rerecords = self.reuses = 0
        self.count = 0                 # present numbers handed out so far
        self._shown = None             # what present `count` showed (_shown_key): a present with hold=True of
        #                                the same picture submits nothing
        self.garbage: list = []        # (p, callable): run once present_done ≥ p
        self.readback = [None] * frames
        self.captured: dict[int, int] = {}  # present number -> frame index holding its capture
        self.background = 0.08   # grey level around and behind the shown frame
        self._init_frame_structs()
        ctx.own(self)

    def _init_frame_structs(self):
        """The per-frame Vulkan structs as plain cffi objects, built once and filled in place each frame (the
        binding's ``vk.VkXxx(...)`` constructors cost tens of µs of Python each; the frame needs ~10)."""
        vk = self.vk
        ffi = vk.ffi
        self._c_cmd_begin = ffi.new("VkCommandBufferBeginInfo*", {
            "sType": vk.VK_STRUCTURE_TYPE_COMMAND_BUFFER_BEGIN_INFO,
            "flags": 0})   # not ONE_TIME_SUBMIT: a re-present submits the same recording again
        self._c_pass_begin = ffi.new("VkRenderPassBeginInfo*", {
            "sType": vk.VK_STRUCTURE_TYPE_RENDER_PASS_BEGIN_INFO})   # loads (no clear); renderArea.offset (0, 0)
        self._c_waits = ffi.new("VkSemaphore[2]")            # acquire semaphore, ready[s]
        self._c_wait_values = ffi.new("uint64_t[2]")
        self._c_stages = ffi.new("VkPipelineStageFlags[2]")
        self._c_signals = ffi.new("VkSemaphore[3]")          # present_done, free[s], render-finished
        self._c_signal_values = ffi.new("uint64_t[3]")
        self._c_cmds = ffi.new("VkCommandBuffer[1]")
        self._c_timeline = ffi.new("VkTimelineSemaphoreSubmitInfo*", {
            "sType": vk.VK_STRUCTURE_TYPE_TIMELINE_SEMAPHORE_SUBMIT_INFO,
            "pWaitSemaphoreValues": self._c_wait_values, "pSignalSemaphoreValues": self._c_signal_values})
        self._c_submit = ffi.new("VkSubmitInfo*", {
            "sType": vk.VK_STRUCTURE_TYPE_SUBMIT_INFO, "pNext": self._c_timeline,
            "pWaitSemaphores": self._c_waits, "pWaitDstStageMask": self._c_stages, "commandBufferCount": 1,
            "pCommandBuffers": self._c_cmds, "pSignalSemaphores": self._c_signals})

    # ---- helpers -----------------------------------------------------------------------------------------
    def _collect(self, done: int):
        keep = []
        for p, fn in self.garbage:
            if p <= done:
                fn()
            else:
                keep.append((p, fn))
        self.garbage = keep

    def _readback_buffer(self, f: int):
        need = self.target.width * self.target.height * 4
        b = self.readback[f]
        if b is None or b.size != need:
            if b is not None:
                b.destroy()
            b = self.readback[f] = self.ctx.create_buffer(need, self.vk.VK_BUFFER_USAGE_TRANSFER_DST_BIT,
                                                          host_visible=True)
        return b

    # ---- the frame -----------------------------------------------------------------------------------------
    def _record_passes(self, cmd, f: int, slot, index: int, *, mode, overdraw_max, scale_bar, content, draw_data):
        """Record the present pass (slot → target image ``index``) and the ImGui pass over it into ``cmd``
        (bench/ring_variants.py records less, to break the present's cost down)."""
        vk, lib = self.vk, self.vk.lib
        w, h = self.target.width, self.target.height
        self.present_pass.record(cmd, f, slot, self.target.image(index), w, h, bgra=self.target.bgra, mode=mode,
                                 overdraw_max=overdraw_max, scale_bar=scale_bar, background=self.background,
                                 content=content)
        if self.imgui_pass is not None and draw_data is not None:
            begin = self._c_pass_begin
            begin.renderPass = self.target.render_pass
            begin.framebuffer = self.target.framebuffer(index)
            begin.renderArea.extent.width = w
            begin.renderArea.extent.height = h
            lib.vkCmdBeginRenderPass(cmd, begin, vk.VK_SUBPASS_CONTENTS_INLINE)
            self.imgui_pass.record(cmd, draw_data, f, w, h, version=self._draw_version)
            lib.vkCmdEndRenderPass(cmd)
        else:   # nothing to draw on top: no render pass, a barrier takes the copied image to the target's layout
            self.present_pass.finish(cmd, self.target.image(index), self.target.final_layout)

    def _command_buffer(self, f: int, index: int):
        """The command buffer of frame f for target image ``index`` (one per pair, so that a swapchain whose
        image index runs out of step with f still finds its recording; the offscreen target's index is f)."""
        if index == f:
            return self.cmds[f]
        cmd = self._extra_cmds.get((f, index))
        if cmd is None:
            (cmd,) = self.ctx.allocate_command_buffers(1)
            self._extra_cmds[(f, index)] = cmd
        return cmd

    def _frame_key(self, f, index, slot, mode, overdraw_max, scale_bar, content, ui_version, capture):
        """What a recording of frame f into image ``index`` depends on (None: never reuse)."""
        if ui_version is None:
            return None
        readback = _handle(self.readback[f]) if capture else None
        shown = slot is not None and slot.frame > 0
        ip = self.imgui_pass
        return (index, self.target.image(index), self.target.framebuffer(index), self.target.width,
                self.target.height, slot.index if shown else None, slot.width if shown else 0,
                slot.height if shown else 0, mode, overdraw_max, scale_bar, content, self.background, ui_version,
                self.ring.generation, _handle(self.present_pass.outputs[f]),
                (_handle(ip.vtx[f]), _handle(ip.idx[f])) if ip is not None else None, capture, readback)

    def _shown_key(self, slot, mode, overdraw_max, scale_bar, content, ui_version):
        """What a present shows: the render in the slot (index and render number), the ring generation, mode,
        overdraw scale, scale bar, area, background, target size and ImGui frame (None: unknown, never held)."""
        if ui_version is None or slot is None:
            return None
        return (slot.index, slot.frame, self.ring.generation, mode, overdraw_max, scale_bar, content,
                self.background, self.target.width, self.target.height, ui_version)

    def present(self, slot, *, mode: int = C.MODE_IMAGE, overdraw_max: int | None = None, draw_data=None,
                capture: bool = False, scale_bar: bool = True, content=None, ui_version=None, hold: bool = False):
        """Draw ``slot`` in ``mode`` (+ ImGui ``draw_data``) and present it.

        Returns the present number p, or None when the target could not take a frame now (minimised window,
        swapchain being rebuilt) — then nothing was submitted and the slot's bookkeeping is unchanged.
        ``capture``: also copy the result to host memory; fetch it with :meth:`read_pixels` (p).
        ``content``: (x, y, w, h) area of the target the mode fills (default: all of it).
        ``ui_version``: a number that changes whenever ``draw_data`` does (a new ImGui frame); with it, a present of
        what the frame's command buffer already holds submits that recording again (module docstring). None:
        always record. ``hold``: when this present would show exactly the picture the last one showed (the same
        render of the same slot, mode, area, panels — ``ui_version`` must be given), submit nothing and return the
        last present number: the target keeps showing it.
        """
        if overdraw_max is None:
            overdraw_max = self.ring.overdraw_max(slot)
        shown = self._shown_key(slot, mode, overdraw_max, scale_bar, content, ui_version)
        if hold and not capture and shown is not None and shown == self._shown:
            return self.count
        vk = self.vk
        p = self.count + 1
        f = p % self.frames
        self.ctx.wait_timeline(self.present_done, p - self.frames)
        self._collect(self.ctx.timeline_value(self.present_done))
        got = self.target.acquire(f)
        if got is None:
            return None
        index, wait_sem = got
        capture = capture and self.target.can_capture
        frame_garbage: list = []

        cmd = self._command_buffer(f, index)
        lib = vk.lib
        key = self._frame_key(f, index, slot, mode, overdraw_max, scale_bar, content, ui_version, capture)
        if key is not None and self._recorded.get(id(cmd)) == key:
            self.reuses += 1      # its last submission is finished (the wait above): submit it again
        else:
            self.rerecords += 1
            check_result(vk, lib.vkResetCommandBuffer(cmd, 0), "vkResetCommandBuffer")
            check_result(vk, lib.vkBeginCommandBuffer(cmd, self._c_cmd_begin), "vkBeginCommandBuffer")
            if self.imgui_pass is not None and (ui_version is None or ui_version != self._textures_version):
                self.imgui_pass.update_textures(cmd, draw_data, frame_garbage)   # once per ImGui frame
                self._textures_version = ui_version
            self._draw_version = ui_version
            self._record_passes(cmd, f, slot, index, mode=mode, overdraw_max=overdraw_max, scale_bar=scale_bar,
                                content=content, draw_data=draw_data)
            if capture:
                self.target.record_capture(cmd, index, self._readback_buffer(f))
            check_result(vk, lib.vkEndCommandBuffer(cmd), "vkEndCommandBuffer")
            # the key after recording (it may have regrown frame f's buffers); never reused when it holds texture
            # uploads, whose staging buffers are freed once this present is done
            self._recorded[id(cmd)] = None if frame_garbage else \
                self._frame_key(f, index, slot, mode, overdraw_max, scale_bar, content, ui_version, capture)

        # The submit's arrays are filled in place: waits = [acquire semaphore?, ready[s]?], signals =
        # [present_done, free[s]?, render-finished?] (vkQueueSubmit reads them before it returns).
        n_wait = 0
        if wait_sem is not None:
            self._c_waits[0] = wait_sem
            self._c_wait_values[0] = 0
            self._c_stages[0] = vk.VK_PIPELINE_STAGE_TRANSFER_BIT   # the image's first use: the barrier + copy
            n_wait = 1
        self._c_signals[0] = self.present_done
        self._c_signal_values[0] = p
        n_signal = 1
        if slot is not None and slot.frame > 0:
            wait = self.ring.present_wait(slot)
            if wait is not None:
                self._c_waits[n_wait], self._c_wait_values[n_wait] = wait
                self._c_stages[n_wait] = vk.VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT
                n_wait += 1
            sem, value = self.ring.mark_read(slot)
            self._c_signals[n_signal] = sem
            self._c_signal_values[n_signal] = value
            n_signal += 1
        done_sem = self.target.signal_semaphore(index)
        if done_sem is not None:
            self._c_signals[n_signal] = done_sem
            self._c_signal_values[n_signal] = 0
            n_signal += 1
        self._c_cmds[0] = cmd
        self._c_timeline.waitSemaphoreValueCount = n_wait
        self._c_timeline.signalSemaphoreValueCount = n_signal
        submit = self._c_submit
        submit.waitSemaphoreCount = n_wait
        submit.signalSemaphoreCount = n_signal
        check_result(vk, lib.vkQueueSubmit(self.ctx.queue, 1, submit, vk.ffi.NULL), "vkQueueSubmit")
        self.count = p
        self._shown = shown
        self.garbage.extend((p, fn) for fn in frame_garbage)
        if capture:
            self.captured = {q: g for q, g in self.captured.items() if q > p - self.frames}
            self.captured[p] = f
        self.target.present(index)
        return p

    def wait(self, p: int, timeout_ns: int = 10_000_000_000) -> bool:
        """Host wait until present p has finished on the GPU (one semaphore, not the queue)."""
        return self.ctx.wait_timeline(self.present_done, p, timeout_ns)

    def read_pixels(self, p: int) -> np.ndarray:
        """(H, W, 4) uint8 RGBA of present ``p`` (which was made with ``capture=True`` and is one of the last F).
        Waits for it on the host. The target's BGRA bytes are swizzled to RGBA here."""
        if p not in self.captured:
            raise ValueError(f"present {p} was not captured or its readback buffer was reused (last {self.frames} "
                             "captures are kept)")
        if not self.wait(p):
            raise TimeoutError(f"present {p} did not finish within 10 s")
        buf = self.readback[self.captured[p]]
        w, h = self.target.width, self.target.height
        px = np.frombuffer(buf.mapped, np.uint8, w * h * 4).reshape(h, w, 4).copy()
        if self.target.format == self.vk.VK_FORMAT_B8G8R8A8_UNORM:
            px = px[..., [2, 1, 0, 3]]
        return px

    def close(self):
        if self.present_done is None:
            return
        vk = self.vk
        self.ctx.wait_idle()
        self._collect(1 << 62)
        for b in self.readback:
            if b is not None:
                b.destroy()
        self.readback = [None] * self.frames
        self.ctx.free_command_buffers(self.cmds + list(self._extra_cmds.values()))
        self._extra_cmds, self._recorded = {}, {}
        vk.vkDestroySemaphore(self.ctx.device, self.present_done, None)
        self.present_done = None
        if self.imgui_pass is not None:
            self.imgui_pass.close()
        self.present_pass.close()
        self.ctx.disown(self)
