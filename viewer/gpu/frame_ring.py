"""The frame ring: K ≥ 2 slots that the rasterizer writes into and the present passes read (DESIGN §6).

Each slot is one Vulkan buffer holding three arrays at aligned offsets::

    image      (H, W, 3) float32    offset 0
    final_T    (H, W)    float32    offset o_T
    n_contrib  (H, W)    int32      offset o_n

sized for ``capacity`` pixels (it grows, never shrinks, so a resize to a smaller window needs no rebuild).
``Slot.image`` / ``final_T`` / ``n_contrib`` are torch views of the current frame size over that memory; pass
them as ``rigel_core.render(model, camera, out=(slot.image, slot.final_T, slot.n_contrib))``.

Two paths, one protocol:

* **CUDA** (``device="cuda"``): the buffers are device-local and exportable (``OPAQUE_FD``), imported once into
  CUDA and wrapped as CUDA tensors (:mod:`viewer.gpu.cuda_interop`). Per slot two timeline semaphores, exported and
  imported into CUDA: ``ready[s]`` (value = render number r, signalled by CUDA after the render) and ``free[s]``
  (value = read number q: the ring counts the present submits that read any slot, and the submit that read s
  signals its q). For render r in slot s the CUDA stream waits ``free[s] ≥ last_read[s]`` (the last present
  that read s), renders, signals ``ready[s] = r``; the present submit waits ``ready[s] ≥ r`` and signals
  ``free[s] = q``. No host synchronisation in between.
* **CPU** (``device="cpu"``, lavapipe or any Vulkan device): host-visible coherent memory mapped as numpy →
  ``torch.from_numpy`` (or the numpy arrays themselves: ``acquire(host=True)``); the host waits ``free[s]`` (``vkWaitSemaphores``) before overwriting a slot and signals
  ``ready[s]`` (``vkSignalSemaphore``) after rendering, before the present submit (so the host writes precede the
  submission, as Vulkan's implicit host-write guarantee requires).

A slot can be presented any number of times (a still camera re-presents the last render): each present raises
``last_read[s]``, and the next render into s waits for it.

**No wait before its signal** (CUDA path). A GPU-side wait enqueued before the other API has signalled the value
is expensive on NVIDIA: presenting each render right after its release, so that the Vulkan submit waited on a
``ready[s]`` CUDA had not reached yet, made every frame ~0.27 ms slower (H200, docs/BENCHMARKS.md). So the
ring polls (``vkGetSemaphoreCounterValue``, a few µs on the host, never blocking) and keeps GPU waits for values
not reached yet: :meth:`acquire` enqueues the ``free[s]`` wait only when the last present of s has not finished,
and :meth:`newest_ready` gives the presenter the newest slot whose ``ready[s]`` has been reached, so that the
present submit's wait is already satisfied (the viewer shows a frame one render late while renders are in
flight; a capture presents :attr:`latest` and lets the GPU wait).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .vk_context import Buffer, VulkanContext

__all__ = ["FrameRing", "Slot"]

_ALIGN = 256  # ≥ minStorageBufferOffsetAlignment of every known device


def _align(x: int, a: int = _ALIGN) -> int:
    return (x + a - 1) // a * a


@dataclass
class Slot:
    """One ring slot. ``frame`` is the render number last written into it (0: never)."""

    index: int
    width: int = 0
    height: int = 0
    frame: int = 0
    image: object = None      # torch (H, W, 3) float32
    final_T: object = None    # torch (H, W) float32
    n_contrib: object = None  # torch (H, W) int32
    overdraw_max: int = 1     # max of n_contrib of `frame`, once known
    rendering: bool = False   # between acquire and release: its memory is being written


class FrameRing:
    """K slots of (image, final_T, n_contrib) shared between the renderer and Vulkan.

    Args:
        ctx: an initialised :class:`VulkanContext` (``init_device(interop=True)`` for the CUDA path).
        slots: K ≥ 2.
        device: "cpu" (host-visible memory, host-signalled semaphores) or "cuda" (exported memory and
            semaphores imported into CUDA device ``cuda_device``).
        capacity: (width, height) to allocate for up front.

    The CUDA path's two hand-overs are methods (:meth:`_wait_free`, :meth:`_signal_ready`, with :meth:`is_ready`
    and :meth:`present_wait`), so that bench/ring_variants.py can measure other protocols (every wait enqueued;
    a CUDA event instead of the ``ready[s]`` signal) without switches here.
    Raises:
        ValueError: K < 2 or an unknown device; VulkanUnavailable / CudaInteropError from the allocations.
    """

    def __init__(self, ctx: VulkanContext, slots: int = 3, *, device: str = "cpu", capacity=(640, 480),
                 cuda_device: int = 0):
        if slots < 2:
            raise ValueError(f"FrameRing needs at least 2 slots, got {slots}")
        if device not in ("cpu", "cuda"):
            raise ValueError(f"FrameRing device must be 'cpu' or 'cuda', got {device!r}")
        if device == "cuda" and not ctx.interop:
            raise ValueError("FrameRing(device='cuda') needs a context created with init_device(interop=True)")
        self.ctx = ctx
        self.vk = ctx.vk
        self.k = int(slots)
        self.device = device
        self.cuda_device = cuda_device
        self.waits_enqueued = 0   # free[s] waits put on the render stream (CUDA path)
        self.generation = 0
        self.capacity = 0
        self.render_count = 0
        self.read_count = 0
        self.latest: Slot | None = None
        self.slots = [Slot(i) for i in range(self.k)]
        self.last_read = [0] * self.k
        self.buffers: list[Buffer] = []
        self._imports: list = []
        self._stat_host = None
        self._stat_slices: list = []
        self._views: list = [None] * self.k
        self.ready, self.free = [], []
        self._ext_ready, self._ext_free = [], []
        ctx.own(self)  # from here on, ctx.close() releases whatever was made, even if a step below fails
        for _ in range(self.k):
            self.ready.append(ctx.create_timeline_semaphore(export_fd=device == "cuda"))
            self.free.append(ctx.create_timeline_semaphore(export_fd=device == "cuda"))
        if device == "cuda":
            from .cuda_interop import ExternalTimelineSemaphore

            for sem in self.ready:
                self._ext_ready.append(ExternalTimelineSemaphore(ctx.semaphore_fd(sem), device=cuda_device))
            for sem in self.free:
                self._ext_free.append(ExternalTimelineSemaphore(ctx.semaphore_fd(sem), device=cuda_device))
        self._allocate(max(1, int(capacity[0]) * int(capacity[1])))

    # ---- layout ------------------------------------------------------------------------------------------
    def _layout(self, pixels: int):
        o_T = _align(pixels * 3 * 4)
        o_n = o_T + _align(pixels * 4)
        return o_T, o_n, o_n + _align(pixels * 4)

    def ranges(self, pixels: int | None = None):
        """[(offset, size)] in bytes of image, final_T and n_contrib inside a slot buffer (whole capacity)."""
        p = self.capacity if pixels is None else pixels
        o_T, o_n, _ = self._layout(self.capacity)
        return [(0, p * 12), (o_T, p * 4), (o_n, p * 4)]

    def _allocate(self, pixels: int):
        vk = self.vk
        o_T, o_n, total = self._layout(pixels)
        usage = vk.VK_BUFFER_USAGE_STORAGE_BUFFER_BIT | vk.VK_BUFFER_USAGE_TRANSFER_SRC_BIT | \
            vk.VK_BUFFER_USAGE_TRANSFER_DST_BIT
        gpu = self.device == "cuda"
        self.buffers, self._imports, self._flat = [], [], []
        for _ in range(self.k):
            self.buffers.append(self.ctx.create_buffer(total, usage, host_visible=not gpu, export_fd=gpu))
        self.capacity = pixels
        if gpu:
            import torch

            from .cuda_interop import ExternalBuffer

            for b in self.buffers:
                self._imports.append(ExternalBuffer(self.ctx.memory_fd(b), b.alloc_size, dedicated=b.dedicated,
                                                    device=self.cuda_device))
            for imp in self._imports:
                self._flat.append((imp.tensor(0, (pixels * 3,), "float32"), imp.tensor(o_T, (pixels,), "float32"),
                                   imp.tensor(o_n, (pixels,), "int32")))
            if self._stat_host is None:
                self._stat_host = torch.zeros(self.k, dtype=torch.int32, pin_memory=True)
                self._stat_slices = [self._stat_host[i : i + 1] for i in range(self.k)]
        else:   # numpy over the mapped memory; torch views of it are made by acquire (torch is imported then)
            for b in self.buffers:
                raw = b.mapped
                self._flat.append((np.frombuffer(raw, np.float32, pixels * 3, 0),
                                   np.frombuffer(raw, np.float32, pixels, o_T),
                                   np.frombuffer(raw, np.int32, pixels, o_n)))
        for s in self.slots:
            s.image = s.final_T = s.n_contrib = None
        self._views = [None] * self.k   # per slot: ((width, height), image, final_T, n_contrib) views
        self.generation += 1

    def _release_buffers(self):
        for s in self.slots:
            s.image = s.final_T = s.n_contrib = None
        self._flat = []
        self._views = [None] * self.k
        for imp in self._imports:
            imp.close()
        self._imports = []
        for b in self.buffers:
            b.destroy()
        self.buffers = []

    def ensure_capacity(self, width: int, height: int):
        """Grow the slots to hold ``width × height`` pixels. A rebuild: waits for the device (and the CUDA
        device) to go idle — the only place the ring ever does."""
        need = int(width) * int(height)
        if need <= self.capacity:
            return
        if self.device == "cuda":
            import torch

            torch.cuda.synchronize(self.cuda_device)
        self.ctx.wait_idle()
        self._release_buffers()
        self._allocate(max(need, self.capacity * 5 // 4))
        for s in self.slots:
            s.frame = 0
            s.width = s.height = 0
        self.latest = None

    # ---- the render side ----------------------------------------------------------------------------------
    def acquire(self, width: int, height: int, stream=None, *, host: bool = False) -> Slot:
        """The next slot to render into, as views of ``height × width``.

        CPU: blocks until the last present that read the slot is done (``vkWaitSemaphores`` on ``free[s]``).
        CUDA: enqueues that wait on ``stream`` (a torch.cuda.Stream; default: torch's current stream) when the
        host does not already see it met, and returns at once.
        ``host=True`` (CPU path only): the views are numpy arrays, and torch is not imported — the viewer's
        loading frame before torch is (viewer/loading.py).
        """
        width, height = int(width), int(height)
        if width <= 0 or height <= 0:
            raise ValueError(f"frame size must be positive, got {width}x{height}")
        if host and self.device != "cpu":
            raise ValueError("FrameRing.acquire(host=True) is for the CPU path")
        self.ensure_capacity(width, height)
        s = self.render_count % self.k
        slot = self.slots[s]
        if self.device == "cuda":
            self._wait_free(s, stream)
        else:
            self.ctx.wait_timeline(self.free[s], self.last_read[s])
        views = self._views[s]
        if views is None or views[0] != (width, height, host):
            img, fT, nc = self._flat[s]
            n = width * height
            arrays = (img[: n * 3].reshape(height, width, 3), fT[:n].reshape(height, width),
                      nc[:n].reshape(height, width))
            if self.device == "cpu" and not host:
                import torch

                arrays = tuple(torch.from_numpy(a) for a in arrays)
            views = self._views[s] = ((width, height, host), *arrays)
        _, slot.image, slot.final_T, slot.n_contrib = views   # the same views while the size stays
        slot.width, slot.height = width, height
        slot.rendering = True
        return slot

    def release(self, slot: Slot, stream=None) -> int:
        """The render into ``slot`` is complete (CPU) or enqueued (CUDA): signal ``ready[s]`` with a new render
        number and make it the latest frame. Returns the render number."""
        self.render_count += 1
        r = self.render_count
        s = slot.index
        if self.device == "cuda":
            import torch

            # The overdraw scale of this frame, copied to pinned memory before the signal: readable once
            # ready[s] ≥ r, without synchronising the stream. The stream context is entered only when
            # ``stream`` is not already torch's current stream (the frame loop usually renders inside it).
            if stream is None or (isinstance(stream, torch.cuda.Stream)
                                  and stream == torch.cuda.current_stream(stream.device)):
                self._stat_slices[s].copy_(slot.n_contrib.amax().reshape(1), non_blocking=True)
            else:
                with torch.cuda.stream(stream):
                    self._stat_slices[s].copy_(slot.n_contrib.amax().reshape(1), non_blocking=True)
            self._signal_ready(s, r, stream)
        else:
            slot.overdraw_max = max(int(slot.n_contrib.max()), 1) if slot.width * slot.height else 1
            self.ctx.signal_timeline(self.ready[s], r)
        slot.frame = r
        slot.rendering = False
        self.latest = slot
        return r

    def _wait_free(self, s: int, stream) -> None:
        """CUDA: make ``stream`` wait for the last present of slot s, enqueued only when the host does not see it
        met already (a GPU wait before the other API's signal is expensive; see the module docstring)."""
        need = self.last_read[s]
        if need > 0 and self.ctx.timeline_value(self.free[s]) < need:
            self._ext_free[s].wait(need, stream)
            self.waits_enqueued += 1

    def _signal_ready(self, s: int, r: int, stream) -> None:
        """CUDA: signal ``ready[s] = r`` on ``stream`` after the render."""
        self._ext_ready[s].signal(r, stream)

    def is_ready(self, slot: Slot) -> bool:
        """The slot's render has finished (CUDA: ``ready[s]`` reached, polled; CPU: released)."""
        if slot.rendering or slot.frame <= 0:
            return False
        if self.device != "cuda":
            return True
        return self.ctx.timeline_value(self.ready[slot.index]) >= slot.frame

    def newest_ready(self) -> Slot | None:
        """The newest rendered slot whose render has finished, never waiting: :attr:`latest` when it is done,
        else an earlier frame that is (None when none is). A present of it needs no GPU-side wait."""
        done = [s for s in self.slots if s.frame > 0 and not s.rendering]
        for slot in sorted(done, key=lambda s: s.frame, reverse=True):
            if self.is_ready(slot):
                return slot
        return None

    def overdraw_max(self, slot: Slot) -> int:
        """max(n_contrib) of the slot's frame when known (CUDA: once ready[s] has been reached; polled, never
        waited for), else the slot's previous value."""
        if self.device == "cuda" and self.is_ready(slot):
            slot.overdraw_max = max(int(self._stat_host[slot.index]), 1)
        return slot.overdraw_max

    # ---- the Vulkan side ----------------------------------------------------------------------------------
    def present_wait(self, slot: Slot):
        """(semaphore, value) the present submit must wait for: ``ready[s] ≥ frame`` (None: no wait)."""
        return self.ready[slot.index], slot.frame

    def mark_read(self, slot: Slot):
        """(semaphore, value) the present submit signals: ``free[s] = q`` with q a new read number (monotonic
        over the ring's life, whichever presenter reads); later renders into s wait for it."""
        self.read_count += 1
        self.last_read[slot.index] = self.read_count
        return self.free[slot.index], self.read_count

    # ---- teardown -----------------------------------------------------------------------------------------
    def close(self):
        """Release the CUDA imports, buffers and semaphores (after the device is idle)."""
        if self.ready is None:
            return
        if self.device == "cuda" and self._ext_ready:
            import torch

            torch.cuda.synchronize(self.cuda_device)
        self.ctx.wait_idle()
        self._release_buffers()
        for ext in self._ext_ready + self._ext_free:
            ext.close()
        for sem in self.ready + self.free:
            self.vk.vkDestroySemaphore(self.ctx.device, sem, None)
        self.ready = self.free = None
        self.latest = None
        self.ctx.disown(self)
