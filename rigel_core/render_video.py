"""Render a camera path (or any list of cameras) of a model to a video file.

MP4 (H.264, ``libx264``, yuv420p) through imageio-ffmpeg when it is installed; otherwise, or for a ``.gif``
destination, an animated GIF through Pillow (the same fallback as the viewer's orbit video). The file is written
under a temporary name in the destination directory and renamed into place only when every frame is in: an
error, a cancel or Ctrl-C leaves no partial file, and an existing file is never replaced unless ``force``.

Used by ``rigel-render SCENE --path path.json --video out.mp4`` and by the viewer's camera-path panel (which
passes its :class:`~viewer.ui_state.Job` for progress and cancel).
"""
from __future__ import annotations

import os
import tempfile
from pathlib import Path

import numpy as np

from .atomic import umask

__all__ = ["ffmpeg_available", "video_path", "render_path_video", "VideoCancelled"]


class VideoCancelled(RuntimeError):
    """The video was cancelled (``job.cancel()``); nothing was written."""


def ffmpeg_available() -> bool:
    """Whether imageio-ffmpeg (and so MP4 output) is importable."""
    try:
        import imageio_ffmpeg  # noqa: F401
    except ImportError:
        return False
    return True


def video_path(out) -> Path:
    """The file actually written for ``out``: ``.gif`` stays GIF; anything else becomes ``.mp4``, or ``.gif``
    when imageio-ffmpeg is missing."""
    out = Path(out)
    if out.suffix.lower() == ".gif":
        return out
    return out.with_suffix(".mp4" if ffmpeg_available() else ".gif")


def _even(cam):
    """H.264 with 4:2:0 chroma needs even sizes: round each side down to an even number ≥ 2."""
    w, h = max(2, cam.width // 2 * 2), max(2, cam.height // 2 * 2)
    return cam if (w, h) == (cam.width, cam.height) else cam.with_size(w, h)


def render_path_video(model, path, out, *, width: int | None = None, height: int | None = None,
                      fps: float | None = None, frames: int | None = None, background=None, sh_degree=None,
                      force: bool = False, job=None, progress: bool = True, quality: float = 8) -> Path:
    """Render ``path`` and encode the frames to ``out``.

    Args:
        model: a :class:`~rigel_core.GaussianModel` (rendered on its device with :func:`rigel_core.render`).
        path: a :class:`~rigel_core.camera_path.CameraPath` or a list of :class:`~rigel_core.Camera`.
        out: destination; see :func:`video_path` for the suffix actually written.
        width, height, frames: override the path's size and frame count (a camera list keeps its own).
        fps: frames per second (default the path's, else 30).
        background: (3,) RGB in [0, 1] or None (black). sh_degree: SH degree to evaluate (None: all).
        force: replace an existing file. job: object with ``progress``, ``message``, ``cancelled`` (the viewer's
            Job) or None. progress: show a tqdm bar on stderr. quality: imageio-ffmpeg quality 0..10.
    Returns: the path written.
    Raises: FileExistsError when the destination exists and not ``force``; ValueError for no frames;
        VideoCancelled when ``job.cancelled`` became true; KeyboardInterrupt passes through (no file left).
    """
    import imageio.v2 as imageio
    import torch
    from tqdm import tqdm

    from .renderer.api import render

    if isinstance(path, (list, tuple)):
        cams = list(path)
        rate = float(fps or 30.0)
    else:
        cams = path.cameras(width, height, frames=frames)
        rate = float(fps or path.fps or 30.0)
    if not cams:
        raise ValueError("render_path_video: no cameras")
    dest = video_path(out)
    if dest.exists() and not force:
        raise FileExistsError(f"{dest}: exists (use --force to replace it)")
    mp4 = dest.suffix.lower() == ".mp4"
    if mp4:
        cams = [_even(c) for c in cams]
        kwargs = {"format": "FFMPEG", "fps": rate, "codec": "libx264", "pixelformat": "yuv420p",
                  "macro_block_size": 1, "quality": quality}
    else:
        kwargs = {"format": "GIF", "duration": 1000.0 / rate, "loop": 0}
    directory = dest.absolute().parent
    directory.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix="." + dest.name + ".", suffix=".part" + dest.suffix, dir=directory)
    os.close(fd)
    bg = None if background is None else torch.tensor(background, dtype=model.dtype, device=model.device)
    stream = torch.cuda.stream(torch.cuda.Stream()) if model.device.type == "cuda" else None
    bar = tqdm(total=len(cams), desc=f"rendering {dest.name}", unit="frame", disable=not progress)
    writer = None
    try:
        writer = imageio.get_writer(tmp, **kwargs)
        if stream is not None:
            stream.__enter__()
        try:
            for i, cam in enumerate(cams):
                if job is not None and job.cancelled:
                    raise VideoCancelled("video cancelled")
                with torch.no_grad():
                    img = render(model, cam, background=bg, sh_degree=sh_degree).image
                frame = (img.clamp(0, 1) * 255.0 + 0.5).to(torch.uint8).cpu().numpy()
                writer.append_data(np.ascontiguousarray(frame))
                bar.update(1)
                if job is not None:
                    job.progress = (i + 1) / len(cams)
                    job.message = f"frame {i + 1}/{len(cams)}"
        finally:
            if stream is not None:
                stream.__exit__(None, None, None)
        writer.close()
        writer = None
        if dest.exists() and not force:   # appeared while rendering: still never overwritten
            raise FileExistsError(f"{dest}: exists (use --force to replace it)")
        os.chmod(tmp, 0o666 & ~umask())
        os.replace(tmp, dest)
    except BaseException:
        if writer is not None:
            try:
                writer.close()
            except Exception:  # noqa: BLE001 - the original error is the one to report
                pass
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    finally:
        bar.close()
    return dest


def cli_path_video(ap, args, load_scene) -> int:
    """``rigel-render SCENE --path PATH --video OUT`` (called by :mod:`rigel_core.cli.render` with its parser,
    parsed arguments and scene loader). Returns the exit status: 0 written, 2 bad arguments or input
    or a refused overwrite, 130 interrupted (no file left)."""
    import sys

    from . import cuda_available
    from .camera_path import load_path

    if args.path is None or args.video is None:
        ap.error("--path and --video go together")
    if args.cameras is not None or args.out is not None:
        ap.error("--path renders a video: use --video, not --cameras/--out")
    if args.alpha or args.split is not None:
        ap.error("--alpha and --split are for --cameras (PNG frames), not --path")
    for name in ("width", "height", "frames"):
        v = getattr(args, name)
        if v is not None and v <= 0:
            ap.error(f"--{name} must be positive")
    if args.fps is not None and not args.fps > 0:
        ap.error("--fps must be positive")
    if Path(args.video).is_dir():   # it became DIR.mp4 beside the folder
        print(f"rigel-render: error: --video {args.video} is a folder: give the video's file name, e.g. "
              f"{Path(args.video) / 'video.mp4'}", file=sys.stderr)
        return 2
    dest = video_path(args.video)
    if dest.exists() and not args.force:
        print(f"rigel-render: error: {dest} exists (use --force to replace it)", file=sys.stderr)
        return 2
    device = args.device or ("cuda" if cuda_available() else "cpu")
    try:
        try:
            path = load_path(args.path)
            if not path.keyframes:
                raise ValueError(f"{args.path}: field 'keyframes' is empty")
            if args.width and not args.height and path.width and path.height:   # keep the path's aspect
                args.height = max(1, round(path.height * args.width / path.width))
            elif args.height and not args.width and path.width and path.height:
                args.width = max(1, round(path.width * args.height / path.height))
            model = load_scene(args.scene, device)
        except (OSError, ValueError) as e:   # CameraPathError and the scene readers' errors are ValueErrors
            print(f"rigel-render: error: {e}", file=sys.stderr)
            return 2
        if dest.suffix != Path(args.video).suffix:
            why = "imageio-ffmpeg is not installed" if dest.suffix == ".gif" else "videos are MP4 or GIF"
            print(f"rigel-render: {why}: writing {dest}", file=sys.stderr)
        written = render_path_video(model, path, dest, width=args.width, height=args.height, fps=args.fps,
                                    frames=args.frames, background=args.background, sh_degree=args.sh_degree,
                                    force=args.force)
    except KeyboardInterrupt:
        print("rigel-render: interrupted; no video written", file=sys.stderr)
        return 130
    except FileExistsError as e:
        print(f"rigel-render: error: {e}", file=sys.stderr)
        return 2
    n = args.frames or path.num_frames()
    print(f"rendered {n} frames of {args.scene} along {args.path} to {written}")
    return 0
