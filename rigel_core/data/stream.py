"""Streamed frames: a capture's images read when they are used, never all held at once (issue 37).

``load_dataset(..., stream=True)`` (what ``rigel-train`` does by default) reads only the image *headers* at load
(sizes, alpha: the cameras, the aspect checks and the load warnings of :func:`~.frames.load_frames`) and returns
:class:`StreamedFrame` s: ``frame.image`` / ``.alpha`` / ``.mask`` run the very load step of the preloaded path
(:class:`~.frames.FramePipeline`: decode → composite or alpha mask → the user's mask → undistort → downscale) when
first read, so the values are bit for bit those of ``stream=False``. The results are kept in one
:class:`FrameCache` per dataset, bounded in bytes (least recently used out first), so host memory stays bounded by
the cache's size whatever the capture's. A frame whose load step is decode → composite alone (no lens, no
``--downscale``, no alpha taken as a mask: synthetic renders, most photo captures) is cached as its 8-bit codes —
a quarter of the float32 bytes — and finished (codes → float32 through :data:`~.images.UNIT8`, alpha composite) where
it is used: on the GPU for a training view (a quarter of the bytes over PCIe, no float work on the host). Those are
the same float32 operations as the preloaded path's, so the values stay bit for bit the same. The cache's default
size fits every frame of the capture when that takes at most a quarter of the host's available memory
(:func:`auto_cache_bytes`), else :data:`DEFAULT_CACHE_MB`. The undistortion maps are made once per camera model (the pipeline's), and a
mask that comes from the lens alone (no mask file, no alpha mask) is made once per camera model too.

:class:`StreamedFrame` s give host (CPU) tensors, whatever ``device`` the dataset was loaded for. Derived frames —
:func:`~.frames.downscale_frame` (coarse-to-fine) and :func:`~.frames.pad_frame` (views of slightly different sizes
brought to one) — of a streamed frame are streamed frames too: their camera is known at once and their pixels are
computed from the source frame's when read (the same functions as on a loaded frame).

The trainer reads training views through a :class:`ViewStream`: a pool of threads runs the load step of the views
the next steps will train (the trainer's view order, known for the rest of the epoch, no random draw of its own)
into pinned memory, and copies them to the GPU on a stream of their own; the device holds the current view and the
next few (:attr:`ViewStream.peak_device_frames` counts them), never the capture. Threads rather than worker
processes: Pillow's decoders, OpenCV's remap and numpy release the GIL, and the frames need no trip through shared
memory.

A file that cannot be decoded when its turn comes raises :class:`~rigel_core.io.errors.DatasetError` naming it
(``rigel-train`` says it in one line and saves the run).
"""
from __future__ import annotations

import os
import threading
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch

from .._ext import get as get_ext, use_kernels
from ..camera import Camera
from .frames import DatasetError, Frame, FramePipeline, FrameSpec, LoadNotes, _downscale_mask, frame_mask
from .images import UNIT8, composite_rgb, image_header, image_size, other_aspect

__all__ = ["FrameCache", "FrameSource", "StreamedFrame", "ViewStream", "DEFAULT_CACHE_MB", "DEFAULT_AHEAD",
           "HOST_AHEAD_BYTES", "MAX_WORKERS", "default_host_ahead",
           "auto_cache_bytes", "cache_note", "finish_codes",
           "stream_frames", "stream_stats"]

#: the smallest default size of a streamed dataset's host cache of loaded frames, MiB (``--frame-cache-mb``;
#: :func:`auto_cache_bytes` gives more to a capture that fits a quarter of the host's available memory)
DEFAULT_CACHE_MB = 512
#: the share of the host's available memory the default cache may take to hold a whole capture
AUTO_CACHE_SHARE = 0.25
#: a cached entry not read for this many "rounds" (the number of distinct keys read) may make room for a new one
#: in a full :class:`FrameCache`
STALE_ROUNDS = 2
#: training views a :class:`ViewStream` holds on the device ahead of the step that trains them
DEFAULT_AHEAD = 4
#: the most bytes of training views a :class:`ViewStream` on a GPU keeps loading on the host ahead of the device's
#: few (pinned, as float32 at most): the decoding of the next views overlaps the steps even where one view's
#: decode takes several steps' time (a 1080p PNG: ~30 ms on one core; a step at 1M Gaussians: ~4 ms)
HOST_AHEAD_BYTES = 512 << 20
#: the most loading threads a :class:`ViewStream` uses by default (fewer on a host with fewer CPUs)
MAX_WORKERS = 8


def _nbytes(value) -> int:
    """Bytes of the tensors / arrays in ``value`` (a tensor, an array, a :class:`~.frames.Frame`, None, or a tuple
    of them)."""
    if isinstance(value, Frame):
        return _nbytes((value.image, value.alpha, value.mask))
    if isinstance(value, tuple):
        return sum(_nbytes(v) for v in value)
    if isinstance(value, torch.Tensor):
        return value.numel() * value.element_size()
    if isinstance(value, np.ndarray):
        return int(value.nbytes)
    return 0


def available_host_bytes() -> int | None:
    """The host memory available to new allocations (Linux ``MemAvailable``; else free pages), or None where
    neither can be read."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return int(os.sysconf("SC_AVPHYS_PAGES")) * int(os.sysconf("SC_PAGE_SIZE"))
    except (ValueError, OSError, AttributeError):
        return None


def auto_cache_bytes(capture_bytes: int, available: int | None = None) -> int:
    """The default cache size for a capture whose frames take ``capture_bytes`` when all cached: all of them (so
    that each is decoded once) when that is at most :data:`AUTO_CACHE_SHARE` of the host's ``available`` memory
    (default: :func:`available_host_bytes`), else that share (the cached views stay: :class:`FrameCache`, so it saves
    that fraction of each epoch's decoding). Never less than :data:`DEFAULT_CACHE_MB`, which is also the size when
    the available memory is unknown."""
    floor = DEFAULT_CACHE_MB * 2 ** 20
    available = available_host_bytes() if available is None else available
    if available is None:
        return floor
    return max(floor, int(min(capture_bytes, AUTO_CACHE_SHARE * available)))


def finish_codes(codes: torch.Tensor, white_bg: bool, table: torch.Tensor | None = None) -> tuple:
    """``(rgb, alpha)`` of a decoded image's codes: (H, W, 3) float32 and (H, W) float32 or None — the float32 values
    :func:`~.images.read_image` then :func:`~.images.composite` give, bit for bit, on ``codes``' device.

    ``codes``: (H, W, 3|4) uint8 (``read_image(..., raw8=True)``), or float32 for a 16-bit / float file (used as
    is). ``table``: :data:`~.images.UNIT8` on ``codes``' device (made when None). The composite is the same float32
    operations in the same order (``rgb · a``, then ``+ (1 − a)`` on white), each correctly rounded on the CPU and
    the GPU alike. On a CUDA device 8-bit codes are finished by one kernel (csrc/frames.cu: the same operations,
    each rounded on its own), elsewhere by the PyTorch operations below."""
    if codes.dtype == torch.uint8:
        if table is None:
            table = torch.from_numpy(UNIT8).to(codes.device)
        if use_kernels(codes):
            rgb, alpha = get_ext().finish_codes(codes.contiguous(), table, bool(white_bg))
            return rgb, (alpha if codes.shape[-1] == 4 else None)
        values = table.index_select(0, codes.reshape(-1).to(torch.int32)).reshape(codes.shape)
    else:
        values = codes
    if values.shape[-1] == 3:
        return values, None
    a = values[..., 3]
    return composite_rgb(values[..., :3], a, white_bg), a.contiguous()


class FrameCache:
    """A thread-safe cache of loaded frames bounded in bytes (``max_bytes``; an entry larger than the whole cache is
    returned but not kept). ``hits`` / ``misses`` / ``peak_bytes`` for the benchmarks.

    Why not plain least-recently-used: training reads the views in a new random order each epoch, and a cache that
    holds a fraction f of them then hits about f²/2 of the reads under LRU (each view is evicted before its next
    turn), against f when the cached ones stay. So, when the cache is full, a new entry replaces the least recently
    used one only if that one has not been read for two "rounds" (:data:`STALE_ROUNDS` × the number of distinct keys
    ever read: a view of the training order is read at least once in two epochs, an entry of an earlier
    coarse-to-fine level or a lens mask no longer used is not); otherwise the new entry is returned but not kept.
    While everything fits, nothing is evicted and the rule never applies."""

    def __init__(self, max_bytes: int):
        self.max_bytes = int(max_bytes)
        self._items: OrderedDict = OrderedDict()   # key -> (value, size, tick of its last read), oldest read first
        self._bytes = 0
        self._tick = 0
        self._keys: set = set()   # every key read (the size of a "round")
        self._lock = threading.Lock()
        self.hits = self.misses = self.peak_bytes = 0

    @property
    def bytes(self) -> int:
        """Bytes held now."""
        return self._bytes

    def __len__(self) -> int:
        return len(self._items)

    def get(self, key, make):
        """The value of ``key``, made by ``make()`` (outside the lock: two threads may make the same entry once each)
        when absent, and kept while it fits (class docstring)."""
        with self._lock:
            self._tick += 1
            self._keys.add(key)
            if key in self._items:
                value, size, _ = self._items.pop(key)
                self._items[key] = (value, size, self._tick)
                self.hits += 1
                return value
            self.misses += 1
        value = make()
        size = _nbytes(value)
        with self._lock:
            if key not in self._items and size <= self.max_bytes and self._room(size):
                self._items[key] = (value, size, self._tick)
                self._bytes += size
                self.peak_bytes = max(self.peak_bytes, self._bytes)
        return value

    def _room(self, size: int) -> bool:
        """Make room for ``size`` bytes by evicting stale entries, oldest read first; False when the entries that
        would have to go are still in use (nothing evicted then). Called under the lock."""
        if self._bytes + size <= self.max_bytes:
            return True
        stale_before = self._tick - STALE_ROUNDS * len(self._keys)
        freed, victims = 0, []
        for k, (_, s, last) in self._items.items():
            if self._bytes - freed + size <= self.max_bytes:
                break
            if last > stale_before:
                return False
            victims.append(k)
            freed += s
        for k in victims:
            self._bytes -= self._items.pop(k)[1]
        return True

    def clear(self) -> None:
        with self._lock:
            self._items.clear()
            self._bytes = 0


class FrameSource:
    """The frames of one streamed dataset: their specs, cameras (probed from the image headers), the shared
    :class:`~.frames.FramePipeline` and :class:`FrameCache`.

    Args:
        specs: the frames (train then test).
        white_bg, downscale, alpha_as_mask: as :func:`~.frames.load_frames`.
        source: the dataset path (for the warnings).
        cache_mb: the cache's size in MiB; None: :func:`auto_cache_bytes` of what every frame takes cached (8-bit
            codes where :meth:`compact`, float32 otherwise).

    Raises DatasetError naming the file for an unreadable image header (or mask header) or an image of another aspect
    ratio than its camera — at load, as the preloaded path does; a file whose pixels turn out corrupt is met when
    read.
    """

    def __init__(self, specs: list[FrameSpec], *, white_bg: bool, downscale: float, source,
                 alpha_as_mask: bool = False, cache_mb: float | None = None):
        self.specs = list(specs)
        self.pipeline = FramePipeline(white_bg=white_bg, downscale=downscale, alpha_as_mask=alpha_as_mask)
        self.source = source
        notes = LoadNotes()
        self.image_cameras: list[Camera] = []  # at the image's size, before --downscale
        self.cameras: list[Camera] = []
        #: per frame: whether its loaded Frame has an alpha (the header has one and it is not taken as a mask) —
        #: read without decoding (the "auto" rules ask every frame for its alpha: a JPEG capture decoded 64 images)
        self.has_alpha: list[bool] = []
        for spec in self.specs:
            try:
                size, has_alpha = image_header(spec.image_path)
            except ValueError as e:
                raise DatasetError(str(e)) from e
            cam = self.pipeline.camera(spec, size, notes)
            notes.no_alpha += alpha_as_mask and not has_alpha
            self.has_alpha.append(bool(has_alpha) and not alpha_as_mask)
            if spec.mask_path is not None:
                self._probe_mask(spec, size, notes)
            self.image_cameras.append(cam)
            self.cameras.append(self.pipeline.output_camera(spec, cam, notes))
        notes.warn(source, len(self.specs), downscale)
        #: the capture's bytes when every frame is cached (:meth:`frame_bytes`)
        self.capture_bytes = sum(self.frame_bytes(i) for i in range(len(self.specs)))
        self.cache = FrameCache(auto_cache_bytes(self.capture_bytes) if cache_mb is None else int(cache_mb * 2 ** 20))
        self._tables: dict = {}

    def compact(self, index: int) -> bool:
        """Whether frame ``index``'s load step is decode → composite alone (no lens, no ``--downscale``, no alpha
        taken as a mask): it is then cached as its 8-bit codes and finished where it is used (:func:`finish_codes`)."""
        return (self.specs[index].distortion is None and self.pipeline.downscale == 1
                and not self.pipeline.alpha_as_mask)

    def frame_bytes(self, index: int) -> int:
        """Host bytes frame ``index`` takes in the cache: its codes (:meth:`compact`) or its float32 image, alpha and
        mask (a lens or a mask file gives one)."""
        cam, spec = self.cameras[index], self.specs[index]
        channels = 4 if self.has_alpha[index] else 3
        if self.compact(index):
            return cam.width * cam.height * channels + (0 if spec.mask_path is None else cam.width * cam.height)
        return self.float_bytes(index)

    def float_bytes(self, index: int) -> int:
        """Bytes frame ``index`` takes loaded as float32 (what ``--preload-frames`` holds of it): its image, its alpha
        (when it has one) and its mask (a lens, a mask file or the alpha taken as a mask give one)."""
        cam, spec = self.cameras[index], self.specs[index]
        channels = 4 if self.has_alpha[index] else 3
        masked = spec.distortion is not None or spec.mask_path is not None or self.pipeline.alpha_as_mask
        return cam.width * cam.height * (4 * channels + (1 if masked else 0))

    def preloaded_bytes(self) -> int:
        """Bytes every frame takes preloaded (``load_dataset(..., stream=False)`` holds them all on the host)."""
        return sum(self.float_bytes(i) for i in range(len(self.specs)))

    def codes(self, index: int) -> torch.Tensor:
        """Frame ``index``'s decoded image as a host tensor (cached): (H, W, 3|4) uint8 codes, or float32 for a
        16-bit / float file (:func:`~.images.read_image` ``raw8``). Only for :meth:`compact` frames."""
        def make():
            spec = self.specs[index]
            raw = self.pipeline.decode(spec, raw8=True)
            self._check_size(index, raw)
            return torch.from_numpy(np.ascontiguousarray(raw))
        return self.cache.get(("codes", index), make)

    def table(self, device) -> torch.Tensor:
        """:data:`~.images.UNIT8` on ``device`` (one per device)."""
        device = torch.device(device)
        if device not in self._tables:
            self._tables[device] = torch.from_numpy(UNIT8).to(device)
        return self._tables[device]

    def _check_size(self, index: int, rgba: np.ndarray) -> None:
        spec, cam = self.specs[index], self.image_cameras[index]
        if (rgba.shape[1], rgba.shape[0]) != (cam.width, cam.height):
            raise DatasetError(f"{spec.image_path}: the image is {rgba.shape[1]}x{rgba.shape[0]}, its header said "
                               f"{cam.width}x{cam.height}: the file changed while training?")

    @staticmethod
    def _probe_mask(spec: FrameSpec, size: tuple, notes: LoadNotes) -> None:
        """The header of ``spec``'s mask file: DatasetError when unreadable, the stretched-mask note as
        :func:`~.images.read_mask` gives it."""
        try:
            mw, mh = image_size(spec.mask_path)
        except ValueError as e:
            raise DatasetError(str(e).replace("image header", "mask header").replace("read image", "read mask")) \
                from e
        if (mw, mh) != tuple(size) and other_aspect((mw, mh), size):
            notes.first_mask = notes.first_mask or f"{spec.mask_path}: the mask is {mw}x{mh} for a {size[0]}x{size[1]} image"
            notes.masks_stretched += 1

    def frames(self) -> list["StreamedFrame"]:
        """One :class:`StreamedFrame` per spec."""
        return [StreamedFrame(self, i, self.cameras[i], spec.name) for i, spec in enumerate(self.specs)]

    def load(self, index: int) -> Frame:
        """Frame ``index`` loaded: a :class:`~.frames.Frame` of host tensors (cached; a :meth:`compact` frame as its
        codes, finished at each call)."""
        if self.compact(index):
            rgb, alpha = finish_codes(self.codes(index), self.pipeline.white_bg, self.table("cpu"))
            return Frame(self.cameras[index], rgb, alpha, self.specs[index].name, self.base_mask(index))

        def make():
            spec = self.specs[index]
            rgba = self.pipeline.decode(spec)
            self._check_size(index, rgba)
            cam, rgb, alpha, mask = self.pipeline.process(spec, self.image_cameras[index], rgba)
            return Frame(cam, torch.from_numpy(np.ascontiguousarray(rgb, dtype=np.float32)),
                         None if alpha is None else torch.from_numpy(np.ascontiguousarray(alpha)), spec.name,
                         None if mask is None else torch.from_numpy(np.ascontiguousarray(mask)))
        return self.cache.get(("frame", index), make)

    def base_mask(self, index: int) -> torch.Tensor | None:
        """Frame ``index``'s mask (host bool tensor or None) without decoding its image where the mask does not
        depend on it (no ``alpha_as_mask``): from the mask file and the lens; a lens-only mask is made once per
        camera model."""
        spec, pipe = self.specs[index], self.pipeline
        if pipe.alpha_as_mask:
            return self.load(index).mask
        if spec.mask_path is None and spec.distortion is None:
            return None
        cam = self.image_cameras[index]
        key = ("lens", spec.distortion.key, cam.width, cam.height, cam.fx, cam.fy, cam.cx, cam.cy) \
            if spec.mask_path is None else ("mask", index)

        def make():
            m = pipe.mask_only(spec, cam)
            return None if m is None else torch.from_numpy(np.ascontiguousarray(m))
        return self.cache.get(key, make)


class StreamedFrame:
    """A :class:`~.frames.Frame` whose pixels are loaded when read (module docstring). ``camera`` and ``name`` at
    once; ``image`` (H, W, 3) float32, ``alpha`` (H, W) float32 or None and ``mask`` (H, W) bool or None are host
    tensors, loaded through the source's bounded cache (``mask`` without decoding the image where it can).
    ``ops``: the derivations from the source frame, applied in order: ``("pad", width, height)`` or
    ``("downscale", factor)``. Read-only (the cache shares the tensors)."""

    __slots__ = ("source", "index", "camera", "name", "ops")

    def __init__(self, source: FrameSource, index: int, camera: Camera, name: str, ops: tuple = ()):
        self.source, self.index, self.camera, self.name, self.ops = source, index, camera, name, tuple(ops)

    def __repr__(self) -> str:
        return f"StreamedFrame({self.name!r}, {self.camera.width}x{self.camera.height}, ops={self.ops})"

    @property
    def image_shape(self) -> tuple:
        """(H, W, 3) without loading anything."""
        return (self.camera.height, self.camera.width, 3)

    def load(self) -> Frame:
        """This frame as a loaded :class:`~.frames.Frame` of host tensors (cached)."""
        if not self.ops:
            return self.source.load(self.index)
        return self.source.cache.get(("frame", self.index, self.ops), lambda: _apply(self.parent().load(),
                                                                                       self.ops[-1]))

    def parent(self) -> "StreamedFrame":
        """The frame this one derives from (itself when it derives from none)."""
        if not self.ops:
            return self
        cam = self.source.cameras[self.index]
        for op in self.ops[:-1]:
            cam = _op_camera(cam, op)
        return StreamedFrame(self.source, self.index, cam, self.name, self.ops[:-1])

    def derive(self, op: tuple) -> "StreamedFrame":
        """This frame with ``op`` applied (module docstring), its camera known at once."""
        return StreamedFrame(self.source, self.index, _op_camera(self.camera, op), self.name, self.ops + (op,))

    @property
    def image(self) -> torch.Tensor:
        return self.load().image

    @property
    def alpha(self) -> torch.Tensor | None:
        if not self.source.has_alpha[self.index]:   # known from the header: nothing to decode
            return None
        return self.load().alpha

    def alpha_below(self, level: float) -> torch.Tensor | None:
        """(H, W) bool host tensor, ``alpha < level`` (None for a frame without alpha): read from the cached 8-bit
        codes where the frame is cached as codes — no float image is made (the "auto" rules read 64 frames'
        transparency) — else from :attr:`alpha`; the same values either way (alpha is ``UNIT8[code]``, increasing
        in the code)."""
        if not self.source.has_alpha[self.index]:
            return None
        if not self.ops and self.source.compact(self.index):
            codes = self.source.codes(self.index)
            if codes.dtype == torch.uint8 and codes.shape[-1] == 4:
                return codes[..., 3] < int(np.count_nonzero(UNIT8 < level))
        return self.alpha < level

    @property
    def mask(self) -> torch.Tensor | None:
        if not self.ops:
            return self.source.base_mask(self.index)
        return self.source.cache.get(("mask", self.index, self.ops),
                                     lambda: _apply_mask(self.parent(), self.ops[-1], self.camera))


def _op_camera(cam: Camera, op: tuple) -> Camera:
    """The camera after one derivation (:meth:`StreamedFrame.derive`): :func:`~.frames.pad_frame`'s and
    :func:`~.frames.downscale_frame`'s."""
    if op[0] == "pad":
        return replace(cam, width=int(op[1]), height=int(op[2]))
    return cam.scaled(1.0 / op[1])


def _apply(frame: Frame, op: tuple) -> Frame:
    """``op`` on a loaded frame: the functions the preloaded path runs."""
    from .frames import downscale_frame, pad_frame

    return pad_frame(frame, op[1], op[2]) if op[0] == "pad" else downscale_frame(frame, op[1])


def _apply_mask(parent: StreamedFrame, op: tuple, camera: Camera) -> torch.Tensor | None:
    """The mask of ``parent`` with ``op`` applied, computed from the parent's mask alone (what :func:`_apply` gives
    as the mask)."""
    m = frame_mask(parent)
    if op[0] == "pad":
        w, h = parent.camera.width, parent.camera.height
        out = torch.zeros((int(op[2]), int(op[1])), dtype=torch.bool)
        out[:h, :w] = True if m is None else m
        return out
    if m is None:
        return None
    down = _downscale_mask(m.numpy(), camera)
    return None if down is None else torch.from_numpy(np.ascontiguousarray(down))


def stream_frames(specs: list[FrameSpec], *, white_bg: bool, downscale: float, source: Path,
                  alpha_as_mask: bool = False, cache_mb: float | None = None) -> list[StreamedFrame]:
    """:func:`~.frames.load_frames`' counterpart that loads nothing: :class:`StreamedFrame` s over one
    :class:`FrameSource` (its header probe and warnings)."""
    return FrameSource(specs, white_bg=white_bg, downscale=downscale, source=source, alpha_as_mask=alpha_as_mask,
                       cache_mb=cache_mb).frames()


def map_frames(fn, frames: list, workers: int | None = None) -> list:
    """``[fn(f) for f in frames]``, computed by up to ``workers`` threads (default min(:data:`MAX_WORKERS`, CPUs)):
    for reads of :class:`StreamedFrame` s that decode (a mask taken from the image's alpha with ``alpha_as_mask``, or
    from a mask file), which the trainer makes of every view at its start and at each coarse level — one thread
    read a 2,000-view capture's one after another before the first step. The first error in ``frames``' order is
    raised, as one thread would raise it. Frames that are not all streamed (tensors in memory, perhaps on the GPU)
    are mapped here, in turn."""
    workers = max(1, min(workers or MAX_WORKERS, os.cpu_count() or 1, len(frames)))
    if workers == 1 or not all(isinstance(f, StreamedFrame) for f in frames):
        return [fn(f) for f in frames]
    with ThreadPoolExecutor(workers, thread_name_prefix="rigel-frames") as pool:
        return list(pool.map(fn, frames))


def default_host_ahead(frames: list, device, ahead: int, workers: int) -> int:
    """How many views a :class:`ViewStream` loads on the host ahead of their step by default: on a GPU two per
    loading thread, at most as many as :data:`HOST_AHEAD_BYTES` hold at the largest of ``frames``' float32 size, at
    least ``ahead``; elsewhere ``ahead``."""
    if torch.device(device).type != "cuda" or not frames:
        return ahead
    view = max(4 * 3 * f.camera.width * f.camera.height for f in frames)
    return max(ahead, min(2 * workers, HOST_AHEAD_BYTES // max(view, 1)))


class ViewStream:
    """The training views' pixels on the training device, loaded ahead of their step (module docstring).

    Args:
        frames: the training views (:class:`StreamedFrame` s, or any frames: then loaded on the calling thread).
        device: the training device.
        masked: per view, whether it trains with a mask (the trainer's rule: a mask with a pixel that does not
            count); ``uniform``: views without one get an all-True mask (one per image size) — the trainer's
            ``_uniform_masks``.
        ahead: views held on the device ahead of their step (the device holds at most ``ahead + 1`` views).
        workers: loading threads (default min(:data:`MAX_WORKERS`, CPUs)).
        host_ahead: views loaded on the host ahead of their step, at least ``ahead``; default on a GPU: two per
            worker, as many as :data:`HOST_AHEAD_BYTES` hold at the largest view's float32 size (so that the
            decoding of the next views keeps up with short steps); on the CPU ``ahead`` (there a step outlasts a
            decode).

    ``images[i]`` / ``masks[i]`` (what the trainer's ``_train_images`` / ``_train_masks`` were as lists): view
    ``i``'s (H, W, 3) float32 image and (H, W) bool mask (or None) on the device. :meth:`prefetch` names the views
    the next steps train. :attr:`peak_device_frames`: the most views held on the device at once. With
    :attr:`with_alpha` set (the trainer's random backgrounds) the views loaded from then on bring their alpha too,
    :meth:`alpha` (a view of codes finished on the GPU always does: the kernel makes it anyway).
    """

    def __init__(self, frames: list, device, masked: list[bool], uniform: bool, *, ahead: int = DEFAULT_AHEAD,
                 workers: int | None = None, host_ahead: int | None = None):
        self.frames = list(frames)
        self.device = torch.device(device)
        self.masked = list(masked)
        self.uniform = bool(uniform)
        self.ahead = max(0, int(ahead))
        self._workers = workers or min(MAX_WORKERS, os.cpu_count() or 1)
        if host_ahead is None:
            host_ahead = default_host_ahead(self.frames, self.device, self.ahead, self._workers)
        self.host_ahead = max(self.ahead, int(host_ahead))
        self._pool: ThreadPoolExecutor | None = None
        self._host: OrderedDict = OrderedDict()   # view -> Future of (image, mask) host tensors (pinned on CUDA)
        self._dev: OrderedDict = OrderedDict()    # view -> (image, mask, event or None) on the device
        self._full: dict = {}
        self._want: list[int] = []  # the views the next steps train (prefetch)
        self._copy_stream = torch.cuda.Stream(self.device) if self.device.type == "cuda" else None
        self.peak_device_frames = 0
        self.loads = 0
        #: load each view's alpha with it (:meth:`alpha`): the trainer sets it while random backgrounds are on
        self.with_alpha = False
        self.images = _Column(self, 0)
        self.masks = _Column(self, 1)

    def __len__(self) -> int:
        return len(self.frames)

    @property
    def device_frames(self) -> int:
        """Views held on the device now."""
        return len(self._dev)

    def _load_host(self, i: int) -> tuple:
        """View ``i``'s (image, mask, codes, alpha) host tensors as the trainer trains them (pinned for an
        asynchronous copy): a :meth:`FrameSource.compact` view on CUDA as its codes (image and alpha None: finished
        on the device), any other as its float32 image (codes None) and, with :attr:`with_alpha`, its float32 alpha
        (None without one)."""
        f = self.frames[i]
        pin = self._copy_stream is not None
        if pin and isinstance(f, StreamedFrame) and not f.ops and f.source.compact(f.index):
            m = frame_mask(f)
            mask = None if m is None or not self.masked[i] else m.pin_memory()
            return None, mask, f.source.codes(f.index).pin_memory(), None
        frame = f.load() if isinstance(f, StreamedFrame) else f
        image = frame.image.to("cpu", torch.float32)
        m = frame_mask(frame)
        mask = None if m is None or not self.masked[i] else m.cpu()
        alpha = frame.alpha.to("cpu", torch.float32) if self.with_alpha and frame.alpha is not None else None
        if pin:
            image, mask, alpha = (None if x is None else x.pin_memory() for x in (image, mask, alpha))
        return image, mask, None, alpha

    def _submit(self, i: int) -> None:
        if i in self._host or i in self._dev:
            return
        if self._pool is None:
            self._pool = ThreadPoolExecutor(self._workers, thread_name_prefix="rigel-frames")
        self._host[i] = self._pool.submit(self._load_host, i)

    def prefetch(self, upcoming: list[int]) -> None:
        """The views the next steps train, in order: the host loads of the first ``host_ahead`` start, and those of
        the first ``ahead`` whose host load finished are copied to the device on the copy stream."""
        coming = list(dict.fromkeys(upcoming))[: self.host_ahead]
        want = self._want = coming[: self.ahead]
        for i in coming:
            self._submit(i)
        for i in want:
            fut = self._host.get(i)
            if fut is not None and fut.done() and fut.exception() is None:
                self._to_device(i)
        # loads of views no longer coming (a new permutation) are dropped when done
        keep = set(coming)
        for i in [k for k in self._host if k not in keep and self._host[k].done()]:
            del self._host[i]

    def _to_device(self, i: int) -> None:
        """Copy view ``i``'s host load to the device (asynchronously on CUDA), keeping at most ``ahead + 1`` views
        there: the least recently used one that is not coming next is dropped first."""
        image, mask, codes, alpha = self._host.pop(i).result()   # a load's error (DatasetError naming the file)
        event = None
        if self._copy_stream is not None:
            with torch.cuda.stream(self._copy_stream):
                if codes is not None:   # finished here, on the copy stream: the preloaded path's values
                    f = self.frames[i]
                    image, alpha = finish_codes(codes.to(self.device, non_blocking=True), f.source.pipeline.white_bg,
                                                f.source.table(self.device))
                else:
                    image = image.to(self.device, non_blocking=True)
                    alpha = None if alpha is None else alpha.to(self.device, non_blocking=True)
                mask = None if mask is None else mask.to(self.device, non_blocking=True)
                event = torch.cuda.Event()
                event.record(self._copy_stream)
        else:
            image = image.to(self.device)
            mask = None if mask is None else mask.to(self.device)
            alpha = None if alpha is None else alpha.to(self.device)
        self.loads += 1
        self._dev[i] = (image, mask, event, alpha)
        while len(self._dev) > self.ahead + 1:
            keep = set(self._want) | {i}
            del self._dev[next((k for k in self._dev if k not in keep), next(k for k in self._dev if k != i))]
        self.peak_device_frames = max(self.peak_device_frames, len(self._dev))

    def view(self, i: int) -> tuple:
        """View ``i``'s (image, mask) on the device, ready for the current stream (loaded now when it was not
        ahead). Raises DatasetError naming a file that cannot be decoded."""
        if i not in self._dev:
            self._submit(i)
            self._to_device(i)
        self._dev.move_to_end(i)
        image, mask, event, alpha = self._dev[i]
        if event is not None:
            current = torch.cuda.current_stream(self.device)
            current.wait_event(event)
            for x in (image, mask, alpha):   # the allocator must not hand this memory out while the step reads it
                if x is not None:
                    x.record_stream(current)
            self._dev[i] = (image, mask, None, alpha)
        if mask is None and self.uniform and not self.masked[i]:
            size = tuple(image.shape[:2])
            if size not in self._full:
                self._full[size] = torch.ones(size, dtype=torch.bool, device=self.device)
            mask = self._full[size]
        return image, mask

    def alpha(self, i: int) -> torch.Tensor | None:
        """View ``i``'s (H, W) float32 alpha on the device as its load brought it (:attr:`with_alpha`), ready for the
        current stream; None when the view has none or was loaded without it (the caller reads ``frame.alpha``)."""
        self.view(i)
        return self._dev[i][3]

    def release(self) -> None:
        """Drop every view held on the device and every pending load (the trainer moved to other views)."""
        self._dev.clear()
        for fut in self._host.values():
            fut.cancel()
        self._host.clear()

    def close(self) -> None:
        """:meth:`release` and stop the loading threads."""
        self.release()
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None


class _Column:
    """``stream.images`` / ``stream.masks``: indexable like the trainer's lists of device tensors."""

    def __init__(self, stream: ViewStream, which: int):
        self.stream, self.which = stream, which

    def __len__(self) -> int:
        return len(self.stream)

    def __getitem__(self, i: int):
        if self.which == 1 and not self.stream.masked[i] and not self.stream.uniform:
            return None  # no mask: known without loading anything
        return self.stream.view(i)[self.which]

    def prefetch(self, upcoming: list[int]) -> None:
        self.stream.prefetch(upcoming)


def cache_note(frames) -> str | None:
    """One line for the run's log on how a streamed dataset's ``frames`` are held (None for preloaded frames)."""
    source = next((f.source for f in frames if isinstance(f, StreamedFrame)), None)
    if source is None:
        return None
    cap, need = source.cache.max_bytes / 2 ** 20, source.capture_bytes / 2 ** 20
    if need <= cap:
        return f"frames streamed: a host cache of {_mib(cap)} MiB holds all {len(source.specs)} (each decoded once)"
    again = "them again" if cap == 0 else f"again the {1 - cap / need:.0%} it does not hold"
    return (f"frames streamed: a host cache of {_mib(cap)} MiB for the {_mib(need)} MiB they take: each epoch decodes "
            f"{again} (--frame-cache-mb MB holds more)")


def _mib(x: float) -> str:
    """A size in MiB for a log line: whole MiB from 10 on, else two significant digits (a small capture's 0.28 MiB
    read "0 MiB"; 0 stays "0")."""
    return f"{x:,.0f}" if x >= 10 or x == 0 else f"{x:.2g}"


def stream_stats(trainer) -> dict:
    """``metrics.json``'s ``frames``: ``{"streamed": False}`` for preloaded training views, else the full-resolution
    views' stream (``peak_device_frames``, ``loads``, ``frame_bytes``: one view's image and mask) and the host cache
    (``cache_mb``, ``cache_peak_bytes``, ``cache_hits``, ``cache_misses``)."""
    column = trainer._full_views[1]
    stream = getattr(column, "stream", None)
    if not isinstance(stream, ViewStream):
        return {"streamed": False}
    cache = stream.frames[0].source.cache
    cam = stream.frames[0].camera
    return {"streamed": True, "peak_device_frames": stream.peak_device_frames, "loads": stream.loads,
            "frame_bytes": cam.width * cam.height * 13, "cache_mb": cache.max_bytes / 2 ** 20,
            "cache_peak_bytes": cache.peak_bytes, "cache_hits": cache.hits, "cache_misses": cache.misses}
