"""``Frame`` and ``Dataset`` (what every loader returns), and the shared load step of one frame:
decode → composite alpha (or take it as a mask) → read the user's mask → undistort (+ validity mask) →
downscale (image and mask) → torch.
"""
from __future__ import annotations

import math
import os
import threading
import warnings
from collections import Counter
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import NamedTuple

import numpy as np
import torch

from ..camera import Camera
from ..io.errors import DatasetError  # defined with the other input-error families
from .images import EXIF_TRANSPOSED, composite, exif_orientation, other_aspect, read_image, read_mask, resize_area
from .undistort import Distortion, mask_all, remap, remap_mask, undistort_map

__all__ = ["Frame", "Dataset", "DatasetError", "FrameSpec", "Distortion", "load_frames", "camera_extent",
           "split_every", "cap_frames", "downscale_frame", "pad_frame", "frame_mask", "MaskFacts", "mask_facts",
           "common_size_frames", "view_sizes"]


@dataclass
class Frame:
    """One image with its camera.

    Attributes:
        camera: ideal pinhole :class:`~rigel_core.camera.Camera` of this image (distortion already removed).
        image: (H, W, 3) float32 in [0, 1]; alpha already composited onto the dataset's background. (None only
            for a camera without its image: ``rigel-viewer --cameras`` of a file of cameras alone.)
        alpha: (H, W) float32 in [0, 1], or None when the image file has no alpha channel.
        name: frame name (the image file's stem), used for output file names.
        mask: (H, W) bool (or float in {0, 1}) on the image's device: the pixels that count — True / 1 where the
            pixel has a source in the photo (lens undistortion leaves none near the borders of a distorted
            capture) and the user's mask keeps it; False / 0 pixels never enter a loss, a densification
            statistic or a metric (their ``image`` values are meaningless, 0 for pixels with no source).
            None (the usual case) means every pixel counts and costs nothing.
    """

    camera: Camera
    image: torch.Tensor
    alpha: torch.Tensor | None
    name: str
    mask: torch.Tensor | None = None


@dataclass
class Dataset:
    """A loaded dataset.

    Attributes:
        train, test: frames of each split.
        scene_center: (3,) float64 mean of the training camera centres.
        scene_extent: radius of the training camera centres around that mean × 1.1 (the 3DGS "nerf++
            normalisation" radius; world units). Learning rates and densification thresholds scale with it.
        points, point_colors: (M, 3) float64 SfM points and their colours in [0, 1] (COLMAP), else None.
        white_bg: whether alpha was composited onto white (else black).
        source: format name: ``"blender"``, ``"ngp"`` or ``"colmap"``.
        path: the directory (or file) it was loaded from.
        downscale: the factor :func:`~rigel_core.data.load_dataset` divided the image sizes by (1: as stored);
            checkpoints record it, so that ``--resume`` reads the images at the size the run was fitted to.
    """

    train: list[Frame]
    test: list[Frame]
    scene_center: np.ndarray
    scene_extent: float
    points: np.ndarray | None = None
    point_colors: np.ndarray | None = None
    white_bg: bool = False
    source: str = ""
    path: str = ""
    downscale: float = 1.0

    @property
    def background(self) -> tuple[float, float, float]:
        """The RGB background the images were composited onto."""
        return (1.0, 1.0, 1.0) if self.white_bg else (0.0, 0.0, 0.0)

    def __repr__(self) -> str:
        return (f"Dataset(source={self.source!r}, train={len(self.train)}, test={len(self.test)}, "
                f"extent={self.scene_extent:.3g}, points={None if self.points is None else len(self.points)})")


@dataclass
class FrameSpec:
    """A frame before its image is read: pinhole camera at the declared size, image path, lens model, and the
    user's mask file (nerfstudio / Brush convention: non-zero keeps, black ignores; see
    :func:`~rigel_core.data.images.read_mask`)."""

    camera: Camera
    image_path: Path | None
    name: str
    distortion: Distortion | None = None
    extra: dict = field(default_factory=dict)
    mask_path: Path | None = None


def view_sizes(frames) -> str:
    """The views' image size in words for a log line: ``"64x48"`` when they share one, else how many sizes and
    which — up to three named (``"2 sizes (48x64, 64x48)"``), more as the smallest and largest by pixels (``"7 sizes
    (1000x656 to 1000x662)"``), ordered by pixels, then width: a capture of mixed sizes is not described by its first
    view's. ``frames``: objects with ``.camera``; "none" for none."""
    sizes = sorted({(int(f.camera.width), int(f.camera.height)) for f in frames}, key=lambda s: (s[0] * s[1], s))
    if not sizes:
        return "none"
    if len(sizes) == 1:
        return f"{sizes[0][0]}x{sizes[0][1]}"
    named = [f"{w}x{h}" for w, h in sizes]
    return f"{len(sizes)} sizes (" + (", ".join(named) if len(sizes) <= 3 else f"{named[0]} to {named[-1]}") + ")"


def camera_extent(cameras: list[Camera]) -> tuple[np.ndarray, float]:
    """(centre (3,), radius) of camera centres: their mean, and 1.1 × the largest distance to it.

    The 3DGS convention (``getNerfppNorm`` in the reference implementation). One camera gives radius 1.1·0 →
    replaced by 1.0 so that nothing downstream divides by zero.
    """
    # the translation of camera-to-world (not −Rᵀt, which assumes an exactly orthonormal R; stored poses
    # such as NeRF-synthetic's float32 matrices are orthonormal only to ~1e-7)
    centres = np.stack([c.c2w[:3, 3] for c in cameras]) if cameras else np.zeros((1, 3))
    center = centres.mean(0)
    dist = np.linalg.norm(centres - center, axis=1)
    radius = float(dist.max()) * 1.1
    far = outlier_camera(cameras, centres)
    if far is not None:
        warnings.warn(f"camera {far[0]!r} lies {far[1]:.3g}x farther from the others' median centre than the median "
                      "camera does: the scene extent, which scales the position learning rate and densification, "
                      f"becomes {radius:.3g}; check that frame's pose", stacklevel=2)
    return center, (radius if radius > 0 else 1.0)


#: a camera farther than this many times the median camera's distance from the cameras' median centre is named in a
#: warning (camera_extent): one stray pose can inflate the scene extent by orders of magnitude
OUTLIER_CAMERA_FACTOR = 50.0


def outlier_camera(cameras: list[Camera], centres: np.ndarray) -> tuple[str, float] | None:
    """(name, factor) of the camera farthest from the cameras' median centre when it is more than
    :data:`OUTLIER_CAMERA_FACTOR` times the median camera's distance from it (None otherwise, or for < 5 cameras,
    or when the median distance is 0). Medians, so that the stray pose itself does not move the yardstick."""
    if len(cameras) < 5:
        return None
    d = np.linalg.norm(centres - np.median(centres, axis=0), axis=1)
    med = float(np.median(d))
    i = int(d.argmax())
    if not med > 0 or not d[i] > OUTLIER_CAMERA_FACTOR * med:
        return None
    return cameras[i].name or f"#{i}", float(d[i] / med)


#: a photo (short side >= PHOTO_PX) downscaled below TINY_IMAGE_PX pixels on its short side gets a warning:
#: ``--downscale 100`` on a phone capture leaves images of a few pixels that train nothing useful (small synthetic
#: test images, already below PHOTO_PX, are left alone)
TINY_IMAGE_PX = 16
PHOTO_PX = 128


def load_frames(specs: list[FrameSpec], *, white_bg: bool, downscale: float, device, source: Path,
                alpha_as_mask: bool = False) -> list[Frame]:
    """Read, composite, mask, undistort and downscale the images of ``specs``.

    When an image's size differs from the size its camera declares, the intrinsics are rescaled to the image
    (a dataset shipped with downsampled images); a warning says so once per call. An image of another aspect ratio
    (:func:`~rigel_core.data.images.other_aspect`: rotated, or not this camera's) is refused.

    Masks (``Frame.mask``; None when every pixel counts): the AND of the lens-validity mask
    (:func:`~rigel_core.data.undistort.undistort_map`), the user's mask file (``spec.mask_path``, undistorted
    with the image: an output pixel is kept only when every photo pixel it interpolates with a non-zero weight is
    kept) and, with ``alpha_as_mask``, the image's alpha channel (alpha > 0 keeps; the colour is then used as
    stored, not composited, and ``Frame.alpha`` is None). ``--downscale``: :func:`downscale_frame`'s rule, applied
    last (after undistortion), to the arrays before they become tensors.

    The one frame's work is :class:`FramePipeline`'s, which the streamed frames (:mod:`.stream`) run too.

    Raises DatasetError naming the image (or mask) when it cannot be decoded, or the image is of another aspect
    ratio than its camera.
    """
    pipe = FramePipeline(white_bg=white_bg, downscale=downscale, alpha_as_mask=alpha_as_mask)
    notes = LoadNotes()
    frames = []
    for spec, rgba in _decoded_in_order(pipe, specs):
        cam = pipe.camera(spec, (rgba.shape[1], rgba.shape[0]), notes)
        cam, rgb, alpha, mask = pipe.process(spec, cam, rgba, notes)
        frames.append(Frame(cam, torch.from_numpy(np.ascontiguousarray(rgb, dtype=np.float32)).to(device),
                            None if alpha is None else torch.from_numpy(np.ascontiguousarray(alpha)).to(device),
                            spec.name,
                            None if mask is None else torch.from_numpy(np.ascontiguousarray(mask)).to(device)))
        notes.no_alpha += alpha_as_mask and rgba.shape[-1] != 4
    notes.warn(source, len(specs), downscale)
    return frames


#: threads decoding the images of :func:`load_frames` (the rest of each frame's work stays on the calling thread)
LOAD_THREADS = 8
#: bytes of decoded images :func:`load_frames` holds ahead of the frame it is making, at most (besides that one
#: image): 26 photos of 12 megapixels preloaded at --downscale 8 peaked at 3.8 GB of host memory with 2 × 8 of them
#: decoded ahead (float32, 144 MB each), 2.2 GB with this bound, 1.1 GB one at a time; a 1080p capture (33 MB an
#: RGBA image) still gets its 2 × threads images ahead
LOAD_AHEAD_BYTES = 1 << 30


def _decoded_in_order(pipe: "FramePipeline", specs: list):
    """``(spec, pipe.decode(spec))`` for each of ``specs`` in order, decoded by up to :data:`LOAD_THREADS` threads at
    most ``2 × threads`` images ahead of the caller, and no more of them than :data:`LOAD_AHEAD_BYTES` holds at the
    size of the largest image decoded so far (the first is decoded alone): host memory bounded whatever the
    capture's size and its images'. A decode's error is raised when its image's turn comes, so the file named is the
    first bad one in order, as one by one.
    Why: a 2,000-view 1080p capture took 228 s to preload decoded one image after another (H100 machine, issue 37)."""
    from collections import deque
    from concurrent.futures import ThreadPoolExecutor

    threads = max(1, min(LOAD_THREADS, os.cpu_count() or 1, len(specs)))
    if threads == 1:
        for spec in specs:
            yield spec, pipe.decode(spec)
        return
    todo = iter(specs)
    largest = 0   # bytes of the largest image decoded so far (none yet: one image ahead)
    with ThreadPoolExecutor(threads, thread_name_prefix="rigel-load") as pool:
        pending: deque = deque()
        try:
            while True:
                ahead = min(2 * threads, LOAD_AHEAD_BYTES // largest) if largest else 1
                while len(pending) < max(1, ahead):
                    nxt = next(todo, None)
                    if nxt is None:
                        break
                    pending.append((nxt, pool.submit(pipe.decode, nxt)))
                if not pending:
                    return
                spec, fut = pending.popleft()
                rgba = fut.result()
                largest = max(largest, rgba.nbytes)
                yield spec, rgba
        finally:
            for _, fut in pending:
                fut.cancel()


@dataclass
class LoadNotes:
    """What :func:`load_frames` (and a streamed dataset's probe) warns about once for the whole dataset."""

    resized: int = 0
    first_resized: str = ""
    masks_stretched: int = 0
    first_mask: str = ""
    no_alpha: int = 0
    tiny: tuple | None = None

    def warn(self, source, n: int, downscale: float) -> None:
        """The warnings of a loaded (or probed) dataset of ``n`` frames from ``source``."""
        if self.no_alpha:
            warnings.warn(f"{source}: alpha as mask asked, but {self.no_alpha} of {n} image(s) have no alpha "
                          "channel: every pixel of those counts", stacklevel=4)
        if self.masks_stretched:
            warnings.warn(f"{source}: {self.masks_stretched} mask(s) have another aspect ratio than their image "
                          f"(first: {self.first_mask}): stretched to fit (check that they belong to those images)",
                          stacklevel=4)
        if self.resized:
            warnings.warn(f"{source}: {self.resized} image(s) differ in size from their camera's declared size "
                          f"(first: {self.first_resized}); intrinsics were rescaled to the image size", stacklevel=4)
        if self.tiny is not None:
            (w0, h0), (w1, h1) = self.tiny
            warnings.warn(f"{source}: --downscale {downscale:g} makes the images {w1}x{h1} px (from {w0}x{h0}): "
                          f"below {TINY_IMAGE_PX} px on a side, too small to train or judge a scene", stacklevel=4)


class FramePipeline:
    """One frame's load step (decode → composite alpha or take it as a mask → the user's mask → undistort →
    downscale), written once for :func:`load_frames` and the streamed frames (:mod:`.stream`), so that both give
    the same float32 values. Holds the undistortion maps, made once per camera model and image size (thread-safe:
    a streaming loader's workers share them)."""

    def __init__(self, *, white_bg: bool, downscale: float, alpha_as_mask: bool = False):
        self.white_bg, self.downscale, self.alpha_as_mask = bool(white_bg), float(downscale), bool(alpha_as_mask)
        self._maps: dict = {}
        self._lock = threading.Lock()

    @staticmethod
    def decode(spec: FrameSpec, raw8: bool = False) -> np.ndarray:
        """The image of ``spec`` as (H, W, 3|4) float32 (:func:`~.images.read_image`; with ``raw8`` an 8-bit file's
        uint8 codes); DatasetError naming it."""
        try:
            return read_image(spec.image_path, raw8=raw8)
        except ValueError as e:
            raise DatasetError(str(e)) from e

    @staticmethod
    def camera(spec: FrameSpec, size: tuple[int, int], notes: LoadNotes | None = None) -> Camera:
        """``spec.camera`` at the image's ``size`` (width, height): rescaled (counted in ``notes``) when the image is
        a scaled copy; DatasetError for an image of another aspect ratio."""
        cam = spec.camera
        w, h = size
        if (w, h) != (cam.width, cam.height):
            if other_aspect((w, h), (cam.width, cam.height)):  # rescaled intrinsics would stretch it: a wrong image
                turned = exif_orientation(spec.image_path)
                why = ("a rotated or foreign image?" if turned not in EXIF_TRANSPOSED
                       or other_aspect((h, w), (cam.width, cam.height)) else
                       f"its EXIF orientation tag ({turned}) shows it turned to {h}x{w}, but rigel reads the pixels "
                       "as stored, as COLMAP does: save it turned, e.g. with ImageMagick's -auto-orient")
                raise DatasetError(f"{spec.image_path}: the image is {w}x{h}, its camera {cam.width}x{cam.height}: "
                                   f"another aspect ratio ({why}); give the camera this image's size or the image its "
                                   "camera's")
            if notes is not None:
                if not notes.resized:
                    notes.first_resized = f"{spec.image_path} is {w}x{h}, its camera {cam.width}x{cam.height}"
                notes.resized += 1
            cam = cam.with_size(w, h)
        return cam

    def output_camera(self, spec: FrameSpec, cam: Camera, notes: LoadNotes | None = None) -> Camera:
        """The frame's camera after ``--downscale`` (``cam``: at the image's size); counts a tiny result."""
        if self.downscale == 1:
            return cam
        out = cam.scaled(1.0 / self.downscale)
        if notes is not None and min(out.width, out.height) < TINY_IMAGE_PX and min(cam.width, cam.height) >= PHOTO_PX \
                and notes.tiny is None:
            notes.tiny = ((cam.width, cam.height), (out.width, out.height))
        return out

    def user_mask(self, spec: FrameSpec, size: tuple[int, int], notes: LoadNotes | None = None):
        """(H, W) bool of the user's mask file at the photo's ``size``, or None without one; DatasetError naming it."""
        if spec.mask_path is None:
            return None
        stretched = []  # a mask of another aspect ratio: one warning for all of them (LoadNotes)
        try:
            keep = read_mask(spec.mask_path, size, on_other_aspect=stretched.append)
        except ValueError as e:
            raise DatasetError(str(e)) from e
        if stretched and notes is not None:
            notes.first_mask = notes.first_mask or stretched[0]
            notes.masks_stretched += 1
        return keep

    def maps(self, spec: FrameSpec, cam: Camera):
        """(map_x, map_y, valid) of ``spec``'s lens at the image size of ``cam`` (made once per camera model)."""
        w, h = cam.width, cam.height
        key = (spec.distortion.key, w, h, cam.fx, cam.fy, cam.cx, cam.cy)
        with self._lock:
            if key not in self._maps:
                self._maps[key] = undistort_map(w, h, cam.fx, cam.fy, cam.cx, cam.cy, spec.distortion, (w, h))
            return self._maps[key]

    def process(self, spec: FrameSpec, cam: Camera, rgba: np.ndarray, notes: LoadNotes | None = None) -> tuple:
        """(camera, rgb, alpha, mask) of one decoded frame (``cam``: its camera at the image's size): numpy arrays,
        rgb (H, W, 3) float32, alpha (H, W) float32 or None, mask (H, W) bool or None (every pixel counts)."""
        w, h = cam.width, cam.height
        keep = self.user_mask(spec, (w, h), notes)  # (h, w) bool in the photo's pixels
        if self.alpha_as_mask and rgba.shape[-1] == 4:
            rgb, alpha = np.ascontiguousarray(rgba[..., :3]), None
            keep = rgba[..., 3] > 0 if keep is None else keep & (rgba[..., 3] > 0)
        else:
            rgb, alpha = composite(rgba, self.white_bg)
        mask = mask_all(keep)
        if spec.distortion is not None:
            mx, my, valid = self.maps(spec, cam)
            rgb = remap(rgb, mx, my, valid)
            alpha = None if alpha is None else remap(alpha, mx, my, valid)
            mask = mask_all(remap_mask(mask, mx, my, valid)) if mask is not None else mask_all(valid)
        out = self.output_camera(spec, cam, notes)
        if out is not cam:
            _, rgb, alpha, mask = _downscale_arrays(cam, rgb, alpha, mask, self.downscale)
        return out, rgb, alpha, mask

    def mask_only(self, spec: FrameSpec, cam: Camera) -> np.ndarray | None:
        """The mask :meth:`process` gives for ``spec`` (``cam`` at the image's size) without decoding the image —
        the user's mask file and the lens alone; not for ``alpha_as_mask`` (the alpha is in the image)."""
        if self.alpha_as_mask:
            raise ValueError("FramePipeline.mask_only: with alpha_as_mask the mask needs the image")
        mask = mask_all(self.user_mask(spec, (cam.width, cam.height)))
        if spec.distortion is not None:
            mx, my, valid = self.maps(spec, cam)
            mask = mask_all(remap_mask(mask, mx, my, valid)) if mask is not None else mask_all(valid)
        out = self.output_camera(spec, cam)
        return mask if out is cam else _downscale_mask(mask, out)


def frame_mask(frame) -> torch.Tensor | None:
    """``frame.mask`` as a bool tensor on its own device (a float mask keeps where > 0.5; the :class:`Frame`
    convention), or None when the frame has none."""
    m = getattr(frame, "mask", None)
    if m is None:
        return None
    m = torch.as_tensor(m)
    return m if m.dtype == torch.bool else m > 0.5


class MaskFacts(NamedTuple):
    """What one frame's mask says (:func:`mask_facts`). ``shape``: the mask's shape ((H, W) when it matches the
    camera), or None when the frame has none; ``ignored``: how many of its pixels do not count (0 without a mask)."""

    shape: tuple | None
    ignored: int

    @property
    def blind(self) -> bool:
        """Whether the frame has a mask that keeps no pixel (nothing to train on or to score)."""
        return self.shape is not None and self.ignored == math.prod(self.shape)

    @property
    def masked(self) -> bool:
        """Whether some pixel does not count (a mask that keeps every pixel is as good as none)."""
        return self.ignored > 0


def mask_facts(frame) -> MaskFacts:
    """:class:`MaskFacts` of ``frame``'s mask, read once through :func:`frame_mask` (its rule: a float mask keeps
    where > 0.5). For a :class:`~.stream.StreamedFrame` the read may be a decode (``alpha_as_mask``): the trainer
    reads each view's once, on loading threads (``Trainer.view_mask_facts``)."""
    m = frame_mask(frame)
    if m is None:
        return MaskFacts(None, 0)
    return MaskFacts(tuple(m.shape), int((~m).sum()))


def _downscale_arrays(camera: Camera, rgb: np.ndarray, alpha: np.ndarray | None, mask: np.ndarray | None,
                      factor: float) -> tuple:
    """(camera, rgb, alpha, mask) of one frame's numpy arrays divided by ``factor``: :func:`downscale_frame`'s
    rule (the one place it is written; :func:`load_frames` and :func:`downscale_frame` both call it). ``rgb``
    (H, W, 3) and ``alpha`` (H, W) float32, ``mask`` (H, W) bool or None; the returned mask is None when every
    downscaled pixel is valid."""
    cam = camera.scaled(1.0 / factor)
    rgb = resize_area(rgb, cam.width, cam.height)
    alpha = None if alpha is None else resize_area(alpha, cam.width, cam.height)
    return cam, rgb, alpha, _downscale_mask(mask, cam)


def _downscale_mask(mask: np.ndarray | None, cam: Camera) -> np.ndarray | None:
    """A (H, W) bool mask at ``cam``'s (smaller) size: a pixel is valid only when the box-filtered *ignored* mask is
    exactly 0 there (:func:`_downscale_arrays`' rule); None when every pixel is valid (or ``mask`` is None)."""
    if mask is None:
        return None
    return mask_all(resize_area((~mask).astype(np.float32), cam.width, cam.height) == 0.0)


def downscale_frame(frame: Frame, factor: float, device=None) -> Frame:
    """``frame`` with its image divided by ``factor`` — exactly what ``load_dataset(..., downscale=factor)`` gives
    for that frame when ``frame`` was loaded at ``downscale=1`` (the same code: :func:`load_frames` calls it too).

    Camera: :meth:`Camera.scaled` (``1 / factor``; the size rounds, intrinsics follow the exact size ratio).
    Image (H, W, 3) and alpha (H, W): Pillow's box (area-averaging) filter in float32
    (:func:`~rigel_core.data.images.resize_area`), computed on the host from the frame's values as float32
    (for an integer factor that divides the size, the mean of each factor × factor block). Mask: a downscaled
    pixel is valid only when every full-resolution pixel its box filter averages with a non-zero weight is valid
    (the box-filtered *ignored* mask is exactly 0); None when every downscaled pixel is valid (or the frame has no
    mask). ``Frame.mask`` may be bool or float in {0, 1} (> 0.5 keeps).

    Args:
        frame: the :class:`Frame` to divide (its tensors on any device).
        factor: > 0; 1 returns ``frame`` itself.
        device: where the new tensors go (default: the device of ``frame.image``).

    Returns a new :class:`Frame` (same name): image float32, alpha float32 or None, mask bool or None; for a
    :class:`~.stream.StreamedFrame`, a streamed frame that computes exactly that when read (``device`` unused).
    """
    if not factor > 0:
        raise ValueError(f"downscale_frame: factor must be > 0, got {factor!r}")
    if factor == 1:
        return frame
    if hasattr(frame, "derive"):  # a streamed frame (.stream): streamed too, computed from its pixels when read
        return frame.derive(("downscale", factor))
    device = frame.image.device if device is None else torch.device(device)

    def host(x: torch.Tensor) -> np.ndarray:
        return x.detach().to("cpu", torch.float32).numpy()

    m = frame_mask(frame)
    if m is not None:
        m = m.detach().cpu().numpy()
    cam, rgb, alpha, mask = _downscale_arrays(frame.camera, host(frame.image),
                                              None if frame.alpha is None else host(frame.alpha), m, factor)
    return replace(frame, camera=cam,
                   image=torch.from_numpy(np.ascontiguousarray(rgb, dtype=np.float32)).to(device),
                   alpha=None if alpha is None else torch.from_numpy(np.ascontiguousarray(alpha)).to(device),
                   mask=None if mask is None else torch.from_numpy(np.ascontiguousarray(mask)).to(device))


def pad_frame(frame: Frame, width: int, height: int) -> Frame:
    """``frame`` on a larger canvas: the same intrinsics and pose with image size ``width`` × ``height`` (≥ the
    frame's), its pixels at the top left, the new right and bottom margins masked out.

    A pixel keeps its continuous position, so rendering the padded camera gives the frame's render in the top-left
    block (projection and rasterization are per pixel). Image and alpha are 0 in the margins, the mask is the
    frame's (all True when it has none) with False margins; tensors stay on the frame's device. The frame itself
    for its own size. Raises ValueError for a smaller size."""
    w, h = frame.camera.width, frame.camera.height
    if width < w or height < h:
        raise ValueError(f"pad_frame: {width}x{height} is smaller than frame {frame.name!r} ({w}x{h})")
    if (width, height) == (w, h):
        return frame
    if hasattr(frame, "derive"):  # a streamed frame (.stream): streamed too, padded when read
        return frame.derive(("pad", int(width), int(height)))
    img = frame.image
    image = img.new_zeros((height, width, img.shape[-1]))
    image[:h, :w] = img
    alpha = None
    if frame.alpha is not None:
        alpha = frame.alpha.new_zeros((height, width))
        alpha[:h, :w] = frame.alpha
    mask = torch.zeros((height, width), dtype=torch.bool, device=img.device)
    m = frame_mask(frame)
    mask[:h, :w] = True if m is None else m.to(img.device)
    return replace(frame, camera=replace(frame.camera, width=width, height=height), image=image, alpha=alpha,
                   mask=mask)


#: :func:`common_size_frames` pads a frame only when the common size adds at most this fraction of its pixels
PAD_MAX_EXTRA = 0.1


def common_size_frames(frames: list[Frame], max_extra: float = PAD_MAX_EXTRA) -> list[Frame]:
    """Training views of slightly different sizes (COLMAP's undistorter crops each image differently: heights
    656–662 px in one 23-view capture) brought to one size: every frame whose padding to (largest width, largest
    height) adds at most ``max_extra`` of its pixels is :func:`pad_frame`-ed to it; the others, and every frame
    when all share one size, are returned as they are. One size means one CUDA graph of the training step instead
    of one per size, each re-captured after every densification (graph_step.py). The margins are masked, so the
    loss of a render is unchanged. Two small differences remain: a Gaussian that reaches a margin but none of the
    frame's pixels counts as in view for the densification average (with a zero gradient), and the projection's
    clamp of far off-screen Gaussians (1.3 × the field of view, from the image size) is a little wider — on a CPU
    toy whose random initial Gaussians reach far outside the views, the parameter gradients of a view padded by
    two rows differed by ~2 % in norm (the loss by 1e-4 relative)."""
    sizes = {(f.camera.width, f.camera.height) for f in frames}
    if len(sizes) < 2:
        return list(frames)
    width, height = max(w for w, _ in sizes), max(h for _, h in sizes)
    return [pad_frame(f, width, height) if width * height <= (1.0 + max_extra) * f.camera.width * f.camera.height
            else f for f in frames]


def held_out_split(specs: list[FrameSpec], test_every: int) -> tuple[list[FrameSpec], list[FrameSpec]]:
    """(train, held-out) of a transforms.json's frames: unique names (:func:`with_unique_names`), then every
    ``test_every``-th frame in image-path order held out (:func:`split_every`). ``load_ngp`` and ``rigel-render
    --split`` both call it, so that they name and pick the same views."""
    return split_every(sorted(with_unique_names(specs), key=lambda s: str(s.image_path) if s.image_path is not None
                              else s.name), test_every)


def free_name(name: str, taken, numbered: bool = False) -> str:
    """``name`` when it is not in ``taken`` (and ``numbered`` is False), else the first of "name_1", "name_2", …
    that is not."""
    if not numbered and name not in taken:
        return name
    k = 1
    while f"{name}_{k}" in taken:
        k += 1
    return f"{name}_{k}"


def with_unique_names(specs: list[FrameSpec]) -> list[FrameSpec]:
    """``specs`` with the names that two or more of them share (``cam0/img0.png`` and ``cam1/img0.png`` are both
    "img0") replaced, on the frame and its camera, by the image path's last components joined by "_" — as few as
    make them distinct ("cam0_img0"), else with the extension (``x.png`` / ``x.jpg``: "x_png", "x_jpg"). Trailing
    components, so the names do not depend on where the dataset lies or how a file refers to the images
    (``../col/images/cam0/img0.png`` is "cam0_img0" too). A name becomes the file name of the view's renders and its
    key in metrics.json, where a shared one overwrote the other view's files. The folders every frame of a group lies
    in are left out ("img0" and "sub_img0" for img0.png beside sub/img0.png).

    The frames with an image path are named among themselves alone, so that they get the names a loader that drops
    the frames without an image gives them (rigel-render reads a file's cameras with or without their images). The
    frames without one are then named around them: a name another frame has is numbered ("img0_1", …); so are
    frames of the same image, which no path separates. Unique names are kept as they are."""
    imaged = [i for i, s in enumerate(specs) if s.image_path is not None]
    counts = Counter(specs[i].name for i in imaged)
    taken = {n for n, c in counts.items() if c == 1}
    new: dict[int, str] = {}
    for name in [n for n, c in counts.items() if c > 1]:
        group = [i for i in imaged if specs[i].name == name]
        paths = [Path(specs[i].image_path) for i in group]
        parts = [[p for p in path.with_suffix("").parts if p not in ("", ".", "..", "/")] for path in paths]
        # the folders all of them lie in (the dataset's own, and above) never enter a name: img0.png beside
        # sub/img0.png are "img0" and "sub_img0" wherever the dataset lies
        common = 0
        while all(len(p) > common + 1 for p in parts) and len({p[common] for p in parts}) == 1:
            common += 1
        parts = [p[common:] for p in parts]
        longest = max((len(p) for p in parts), default=1)
        for k, ext in [(k, False) for k in range(2, longest + 1)] + [(k, True) for k in range(1, longest + 1)]:
            cand = ["_".join(p[-k:]) + (f"_{path.suffix.lstrip('.')}" if ext and path.suffix else "")
                    for p, path in zip(parts, paths)]
            if len(set(cand)) == len(cand) and not taken & set(cand):
                break
        for i, c in zip(group, cand):
            new[i] = c
        taken |= set(cand)
    # two frames of one image (``c`` and ``c.png`` both resolved to c.png) have no distinct candidate: the later
    # ones are numbered (a frame that kept its name, unique from the start, keeps it)
    final = {i: new.get(i, specs[i].name) for i in imaged}
    everything = set(final.values())
    seen = {final[i] for i in imaged if i not in new}
    for i in sorted(new):
        if final[i] in seen:
            new[i] = final[i] = free_name(final[i], everything, numbered=True)
            everything.add(final[i])
        seen.add(final[i])
    # frames without an image path have nothing to tell them apart: a name no other frame has is kept; of a shared
    # one the first keeps it unless a frame with an image has it, the others are numbered
    everyone = Counter(s.name for s in specs)
    alone = {i for i, s in enumerate(specs) if s.image_path is None and everyone[s.name] == 1 and s.name not in seen}
    seen |= {specs[i].name for i in alone}
    for i, s in enumerate(specs):
        if s.image_path is None and i not in alone:
            name = free_name(s.name, seen)
            seen.add(name)
            if name != s.name:
                new[i] = name
    if not new:
        return specs
    return [replace(s, name=new[i], camera=replace(s.camera, name=new[i])) if i in new else s
            for i, s in enumerate(specs)]


def split_every(items: list, test_every: int) -> tuple[list, list]:
    """(train, test): items at indices 0, N, 2N, … go to test (N = ``test_every``; none when N ≤ 0)."""
    if test_every is None or test_every <= 0:
        return list(items), []
    return ([x for i, x in enumerate(items) if i % test_every != 0],
            [x for i, x in enumerate(items) if i % test_every == 0])


def cap_frames(specs: list, max_frames: int | None) -> list:
    """The first ``max_frames`` frame specs (all of them for None): ``load_dataset(max_frames=…)``."""
    return specs if max_frames is None else specs[: max(0, int(max_frames))]
