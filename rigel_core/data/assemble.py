"""``assemble_dataset``: what every format's loader ends with — the frames loaded (:func:`.frames.load_frames`) or
streamed (:func:`.stream.stream_frames`), the scene centre and extent."""
from __future__ import annotations

import warnings
from pathlib import Path

from .frames import Dataset, FrameSpec, camera_extent, load_frames
from .stream import stream_frames
from .undistort import require_opencv

__all__ = ["assemble_dataset"]


#: the formats whose held-out views are every Nth of one list (``--test-every``), not a file of their own
SPLIT_FORMATS = ("colmap", "ngp")
#: fewer training views than this after the held-out split are said in a warning
MIN_TRAIN_VIEWS = 3


def assemble_dataset(train: list[FrameSpec], test: list[FrameSpec], source: Path, fmt: str, white_bg, downscale,
                     device, points=None, point_colors=None, alpha_as_mask=False, stream=False,
                     cache_mb=None) -> Dataset:
    """The :class:`Dataset` of two lists of frame specs: images loaded (:func:`load_frames`) — or, with ``stream``,
    their headers only (:func:`.stream.stream_frames`, a host cache of ``cache_mb`` MiB, None: its automatic size) —, the scene centre and
    extent from the training cameras (the test ones when there are none); what every format's loader ends with."""
    kw = dict(white_bg=white_bg, downscale=downscale, source=source, alpha_as_mask=alpha_as_mask)
    if fmt in SPLIT_FORMATS and test and len(train) < MIN_TRAIN_VIEWS:
        # every Nth view held out leaves a capture of a few views one or two to train on (2 views: 1 trains)
        warnings.warn(f"{source}: {len(train)} training view{'s' if len(train) != 1 else ''} after holding "
                      f"{len(test)} out for evaluation (--test-every 0 trains on every view, with no held-out PSNR)",
                      stacklevel=3)
    if any(spec.distortion is not None for spec in train + test):
        require_opencv()   # now, not at the first streamed image: a missing OpenCV is refused before a run starts
    if stream:
        frames = stream_frames(train + test, cache_mb=cache_mb, **kw)
    else:
        frames = load_frames(train + test, device=device, **kw)   # one call: its warnings count the dataset once
    train_frames, test_frames = frames[:len(train)], frames[len(train):]
    center, extent = camera_extent([f.camera for f in (train_frames or test_frames)])
    return Dataset(train_frames, test_frames, center, extent, points, point_colors, white_bg, fmt, str(source))
