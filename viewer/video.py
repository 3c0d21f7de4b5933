"""Orbit videos of a model: the cameras of one turn around the viewer's target, rendered and encoded with imageio.

MP4 (H.264 through imageio-ffmpeg) when ``imageio_ffmpeg`` is installed, else an animated GIF (Pillow); the
suffix of the path written says which. Rendering goes through ``rigel_core.render`` (the same renderer the
viewer shows), on the model's device, on the calling thread: the viewer runs it as a :class:`~viewer.ui_state.Job`
so the UI keeps drawing and shows the progress.
"""
from __future__ import annotations

import copy
import math
from pathlib import Path

import numpy as np

__all__ = ["orbit_cameras", "video_format", "write_orbit_video"]


def video_format() -> str:
    """"mp4" when imageio-ffmpeg is importable, else "gif"."""
    from rigel_core.render_video import ffmpeg_available

    return "mp4" if ffmpeg_available() else "gif"


def orbit_cameras(orbit, frames: int, width: int, height: int) -> list:
    """``frames`` cameras of ``width × height`` (each rounded down to an even number ≥ 2: H.264's 4:2:0 chroma
    needs even sizes) on one full turn (360° of yaw about the up axis) starting at the orbit camera's current
    view; ``orbit`` itself is not changed."""
    if frames < 1:
        raise ValueError(f"orbit_cameras: frames must be >= 1, got {frames}")
    width, height = max(2, int(width) // 2 * 2), max(2, int(height) // 2 * 2)
    oc = copy.deepcopy(orbit)
    oc.snapped = None
    oc.view_offset = 0.0      # the video has no side panel: the target in the middle
    yaw0 = oc.yaw
    cams = []
    for i in range(frames):
        oc.yaw = yaw0 + 2.0 * math.pi * i / frames
        cams.append(oc.camera(width, height, name=f"orbit_{i:04d}"))
    return cams


def write_orbit_video(job, model, cameras, path, *, fps: int = 30, background=None, sh_degree=None) -> Path:
    """Render ``cameras`` and encode them to ``path`` (its suffix replaced by ``.mp4`` or ``.gif``, see
    :func:`video_format`). ``job`` (a :class:`~viewer.ui_state.Job` or None) receives ``progress`` and is
    checked for ``cancelled`` between frames; a cancelled video is deleted (VideoCancelled). Returns the path written.
    Raises ValueError for an empty camera list; imageio's errors for an unwritable path."""
    import imageio.v2 as imageio
    import torch

    import rigel_core

    if not cameras:
        raise ValueError("write_orbit_video: no cameras")
    from rigel_core.render_video import video_path

    path = video_path(path)
    fmt = path.suffix[1:].lower()
    path.parent.mkdir(parents=True, exist_ok=True)
    kwargs = {"fps": fps, "macro_block_size": 1, "quality": 8} if fmt == "mp4" else {"duration": 1000.0 / fps,
                                                                                      "loop": 0}
    bg = None if background is None else torch.tensor(background, dtype=model.dtype, device=model.device)
    stream_ctx = torch.cuda.stream(torch.cuda.Stream()) if model.device.type == "cuda" else None
    writer = imageio.get_writer(path, **kwargs)
    ok = False
    try:
        if stream_ctx is not None:
            stream_ctx.__enter__()
        for i, cam in enumerate(cameras):
            if job is not None and job.cancelled:
                break
            with torch.no_grad():
                img = rigel_core.render(model, cam, background=bg, sh_degree=sh_degree).image
            frame = (img.clamp(0, 1) * 255.0 + 0.5).to(torch.uint8).cpu().numpy()
            writer.append_data(np.ascontiguousarray(frame))
            if job is not None:
                job.progress = (i + 1) / len(cameras)
                job.message = f"frame {i + 1}/{len(cameras)}"
        else:
            ok = True
    finally:
        if stream_ctx is not None:
            stream_ctx.__exit__(None, None, None)
        writer.close()
        if not ok:
            path.unlink(missing_ok=True)
    if not ok:
        from rigel_core.render_video import VideoCancelled

        raise VideoCancelled(f"video cancelled: {path} not written")
    return path
