"""The viewer's background jobs (the UI keeps drawing while they run): an orbit video, saving the shown scene,
converting its colours between SH and the MLP. Each is a :class:`~viewer.ui_state.Job` in ``viewer.jobs``.

Files are never replaced: a name that exists becomes ``name_2``, ``name_3``, … (:func:`rigel_core.run_dir.
unused_path`, reserved at once), in the folder the user chose (``--out``; with ``--data`` the run folder).
"""
from __future__ import annotations

import time
from pathlib import Path

from rigel_core.run_dir import unused_path

from . import messages as M
from .ui_state import Job

__all__ = ["start_video", "start_save_ply", "start_appearance_switch"]


def start_video(v, path=None, *, frames: int | None = None, size=None) -> Job:
    """Render an orbit video of ``v``'s model (``jobs["video"]``; the running one when there is one). Default
    path: ``<screenshot dir>/rigel_orbit_<time>.mp4`` (``.gif`` without imageio-ffmpeg); the written name is
    checked, not the asked one, so no file is replaced."""
    from rigel_core.render_video import video_path

    from .video import orbit_cameras, write_orbit_video

    job = v.jobs.get("video")
    if job is not None and not job.done:
        return job
    s = v.settings
    w, h = size or s.video_size
    cams = orbit_cameras(v.camera, int(frames or s.video_frames), w, h)
    path = video_path(path or v.screenshot_dir / time.strftime("rigel_orbit_%Y%m%d_%H%M%S.mp4"))
    path = unused_path(path)
    bg = (1.0, 1.0, 1.0) if s.white_background else None
    degree = min(s.sh_degree, v.model.active_sh_degree)
    v.jobs["video"] = job = Job("video", write_orbit_video, v.model, cams, path, fps=s.video_fps, background=bg,
                                sh_degree=degree)
    return job


def start_save_ply(v, path=None, fmt=None) -> Job:
    """Write ``v``'s model (an MLP appearance baked to SH, :func:`rigel_core.io.export.bake_for_export`) in
    ``fmt`` (default: the Export panel's choice, or the suffix of ``path``) to ``path`` or
    ``<screenshot dir>/model.<suffix>``, under a new name when that one exists."""
    from rigel_core.io.export import format_for_path

    from .export import export_path

    if path:
        path = Path(path)
        fmt = fmt or format_for_path(path)
    else:
        fmt = fmt or getattr(v.settings, "export_format", "ply")
        path = export_path(v.screenshot_dir, fmt)
    path = unused_path(path, reserve=True)
    model = v.model

    def save(job):
        from rigel_core.io import save_scene
        from rigel_core.io.export import bake_for_export

        try:
            m, _ = bake_for_export(model)
            save_scene(m.to("cpu"), path, format=fmt)
        except BaseException:
            if path.is_file() and path.stat().st_size == 0:
                path.unlink()        # the reserved name, never written
            raise
        print(f"rigel-viewer: wrote {path}")
        return path

    v.jobs["save"] = job = Job("save-ply", save)
    return job


def start_appearance_switch(v, kind: str) -> Job | None:
    """Viewing a scene (no training): convert the shown model's colours to ``kind`` ("sh" or "mlp") with
    ``rigel_core.renderer.appearance`` (``to_mlp`` distils the SH colours, :func:`~rigel_core.io.export.bake_for_export`
    bakes the MLP) in the background; the result is published into the model slot when done. A training session
    switches itself (``SetAppearance`` is sent to it)."""
    if v.training is not None:
        v.training.send(M.SetAppearance(kind))
        return None
    job = v.jobs.get("appearance")
    if (job is not None and not job.done) or kind == v.appearance:
        return job
    model, slot = v.model, v.slot_source

    def convert(job):
        from rigel_core.renderer import appearance as A
        from rigel_core.io.export import bake_for_export

        if kind == "mlp":
            out, report = A.to_mlp(model)
            rmse = report.rmse
        else:
            out, rmse = bake_for_export(model)
        info = dict(slot.latest().info) if slot.latest() is not None else {}
        info["appearance"] = f"{kind} (rmse {rmse:.4f})"
        slot.publish(out, **info)
        return rmse

    v.jobs["appearance"] = job = Job("appearance", convert)
    return job
