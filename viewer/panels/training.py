"""The Training window: start / pause / step, the live densification sliders, the appearance switch, saving."""
from __future__ import annotations

from rigel_core.train.strategy_table import live_for

from .. import messages as M
from .widgets import PANEL_WIDTH, fmt, window, wrapped_disabled

__all__ = ["DENSIFY_SLIDERS", "training_window", "densify_sliders", "REFRESH_HZ_MAX"]

#: the highest live refresh rate (Hz): the "view refresh" slider's end and ``rigel-viewer --refresh-hz``'s bound
REFRESH_HZ_MAX = 60.0

#: densification sliders: field → (label, kind, min, max, format)
DENSIFY_SLIDERS = {
    "grad_threshold": ("grad threshold", "float_log", 1e-5, 1e-2, "%.1e"),
    "absgrad_threshold": ("absgrad threshold", "float_log", 1e-5, 1e-2, "%.1e"),
    "densify_interval": ("interval", "int", 10, 2000, "%d"),
    "densify_from": ("start iteration", "int_iters", 0, None, "%d"),
    "densify_until": ("stop iteration", "int_iters", 0, None, "%d"),
    "opacity_reset_interval": ("opacity reset every", "int", 100, 30000, "%d"),
    "prune_opacity": ("prune opacity", "float_log", 1e-4, 0.2, "%.4f"),
    "max_gaussians": ("max Gaussians", "int_log", 1000, 10_000_000, "%d"),
}


def densify_sliders(imgui, training, requests):
    d = training.densify
    changed_fields = {}
    imgui.push_item_width(130)
    top = max(training.iterations, 1)
    for name, (label, kind, lo, hi, fmt) in DENSIFY_SLIDERS.items():
        if name not in d:
            continue
        v = d[name]
        if kind == "float_log":
            ch, nv = imgui.slider_float(label, float(v), lo, hi, fmt, imgui.SliderFlags_.logarithmic)
        elif kind == "int_log":
            ch, nv = imgui.slider_int(label, int(v if v is not None else hi), lo, hi, fmt,
                                      imgui.SliderFlags_.logarithmic)
        elif kind == "int_iters":
            ch, nv = imgui.slider_int(label, int(v), lo, max(top, int(v)), fmt)
        else:
            ch, nv = imgui.slider_int(label, int(v), lo, hi, fmt)
        if ch:
            d[name] = nv
            changed_fields[name] = nv
    imgui.pop_item_width()
    if changed_fields:
        requests.append(M.SetDensifyParams(changed_fields))


def strategy_why(imgui, training):
    """What the run chose, in plain words (the strategy is the section's title): where it started — the initial
    Gaussians and what they came from —, its Gaussian budget and coarse-to-fine; with notes of what "auto" chose,
    "(why?)" beside the budget shows them on hover, wrapped (the same lines as the run's log.txt)."""
    if not training.notes:
        return
    if training.start:
        wrapped_disabled(imgui, training.start)
    why = training.notes[1:]   # after the start line: what "auto" chose and why
    wrapped_disabled(imgui, (training.budget or "no Gaussian budget") + ("  (why?)" if why else ""))
    if why:
        if imgui.is_item_hovered():   # the budget line, however many lines it wraps to
            imgui.begin_tooltip()
            imgui.push_text_wrap_pos(2 * PANEL_WIDTH)
            for line in why:
                imgui.text_wrapped(line)
            imgui.pop_text_wrap_pos()
            imgui.end_tooltip()
    if training.coarse:
        wrapped_disabled(imgui, training.coarse)


def training_window(imgui, training, display, requests, settings=None):
    t = training
    if not window(imgui, "Training", (display[0] - 10, 10), (1.0, 0.0)):
        imgui.end()
        return
    colours = {"running": (0.4, 0.9, 0.4, 1), "paused": (1.0, 0.8, 0.3, 1), "finished": (0.5, 0.8, 1.0, 1),
               "failed": (1.0, 0.35, 0.3, 1), "stopped": (0.7, 0.7, 0.7, 1), "starting": (0.7, 0.7, 0.7, 1)}
    imgui.text_colored(imgui.ImVec4(*colours.get(t.status, (1, 1, 1, 1))), t.status.upper())
    imgui.same_line()
    imgui.text_disabled(f"({t.device})" if t.device else "")
    active = t.status in ("running", "paused", "starting")
    if t.status == "running":
        if imgui.button("pause (space)"):
            requests.append(M.Pause())
    elif imgui.button("start" if t.iteration == 0 else "resume") and active:
        requests.append(M.Resume())
    imgui.same_line()
    if imgui.button("step") and active:
        requests.append(M.Step(1))
    imgui.same_line()
    if imgui.button("step 10") and active:
        requests.append(M.Step(10))
    frac = t.iteration / t.iterations if t.iterations else 0.0
    imgui.progress_bar(frac, imgui.ImVec2(-1, 0), f"{t.iteration:,} / {t.iterations:,}")
    imgui.text(f"loss        {fmt(t.loss, '.4f')}")
    imgui.text(f"train PSNR  {fmt(t.psnr, '.2f')} dB")
    last = f"{fmt(t.last_eval_psnr, '.2f')} dB" + (f" (it {t.eval_iters[-1]:,})" if t.eval_iters else "")
    imgui.text(f"test PSNR   {last}")
    imgui.text(f"Gaussians   {t.num_gaussians:,}")
    imgui.text(f"elapsed     {t.elapsed_s:.1f} s  ({fmt(t.ms_per_iter, '.1f')} ms/it)")
    if settings is not None:   # the live refresh cap (viewer/app.py): 0 = every present
        imgui.push_item_width(130)
        _, hz = imgui.slider_float("view refresh (Hz)", float(settings.refresh_hz or 0.0), 0.0, REFRESH_HZ_MAX,
                                   "%.0f")
        settings.refresh_hz = max(hz, 0.0)
        imgui.pop_item_width()
        if imgui.is_item_hovered():
            imgui.set_tooltip("re-render the training model and rebuild these panels at most this often while the "
                              "camera is still (0: every frame); fewer leaves more of Python to the trainer")
    if imgui.collapsing_header(f"{live_for(t.strategy).title}###densification", imgui.TreeNodeFlags_.default_open):
        strategy_why(imgui, t)
        densify_sliders(imgui, t, requests)
    if imgui.collapsing_header("Appearance", imgui.TreeNodeFlags_.default_open):
        for kind, label in (("sh", "spherical harmonics"), ("mlp", "MLP")):
            if kind == "mlp":
                imgui.same_line()
            if imgui.radio_button(label, t.appearance == kind) and t.appearance != kind and active:
                requests.append(M.SetAppearance(kind))
        if not t.appearance_switchable:
            imgui.text_disabled("(this trainer cannot switch yet)")
    if imgui.button("save checkpoint"):
        requests.append(M.Save("checkpoint"))
    imgui.same_line()
    if imgui.button("save PLY"):
        requests.append(M.Save("ply"))
    if t.run_dir:
        wrapped_disabled(imgui, t.run_dir)
    if t.error:
        imgui.separator()
        imgui.push_text_wrap_pos(imgui.get_cursor_pos_x() + PANEL_WIDTH - 20)
        imgui.text_colored(imgui.ImVec4(1.0, 0.35, 0.3, 1), "training failed: " + t.error)
        imgui.pop_text_wrap_pos()
        if imgui.tree_node("traceback"):
            imgui.text_wrapped(t.error_traceback[-2000:])
            imgui.tree_pop()
    for line in list(t.log)[-4:]:
        wrapped_disabled(imgui, line)
    imgui.end()
