"""``assemble_dataset``: what every format's loader ends with — the frames loaded (:func:`.frames.load_frames`) or
streamed (:func:`.stream.stream_frames`), the scene centre and extent."""
from __future__ import annotations

import warnings
from pathlib import Path

from .frames import Dataset, FrameSpec, camera_extent, load_frames
from .stream import stream_frames
from .undistort import require_opencv

__all__ = ["assemble_dataset", "warn_small_split"]


#: fewer training views than this after the held-out split (``--test-every``) are said in a warning
MIN_TRAIN_VIEWS = 3


def warn_small_split(source, train: list, test: list) -> None:
    """The one warning for a held-out split (every Nth view, ``--test-every``) that leaves fewer than
    :data:`MIN_TRAIN_VIEWS` views to train on (a capture of 2 views: 1 trains, 1 is held out)."""
    if test and len(train) < MIN_TRAIN_VIEWS:
        warnings.warn(f"{source}: {len(train)} training view{'s' if len(train) != 1 else ''} after holding "
                      f"{len(test)} out for evaluation (--test-every 0 trains on every view, with no held-out PSNR)",
                      stacklevel=3)


def assemble_dataset(train: list[FrameSpec], test: list[FrameSpec], source: Path, fmt: str, white_bg, downscale,
                     device, points=None, point_colors=None, alpha_as_mask=False, stream=False,
                     cache_mb=None) -> Dataset:
    """The :class:`Dataset` of two lists of frame specs: images loaded (:func:`load_frames`) — or, with ``stream``,
    their headers only (:func:`.stream.stream_frames`, a host cache of ``cache_mb`` MiB, None: its automatic size) —, the scene centre and
    extent from the training cameras (the test ones when there are none); what every format's loader ends with."""
    kw = dict(white_bg=white_bg, downscale=downscale, source=source, alpha_as_mask=alpha_as_mask)
    if any(spec.distortion is not None for spec in train + test):
        require_opencv()   # now, not at the first streamed image: a missing OpenCV is refused before a run starts
    if stream:
        frames = stream_frames(train + test, cache_mb=cache_mb, **kw)
    else:
        frames = load_frames(train + test, device=device, **kw)   # one call: its warnings count the dataset once
    train_frames, test_frames = frames[:len(train)], frames[len(train):]
    center, extent = camera_extent([f.camera for f in (train_frames or test_frames)])
    return Dataset(train_frames, test_frames, center, extent, points, point_colors, white_bg, fmt, str(source))
