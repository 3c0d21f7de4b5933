"""The PSNR window: train-view and held-out PSNR over the iterations, and the per-pixel error of a snapped
training view."""
from __future__ import annotations

import numpy as np

from .. import requests as R
from .widgets import PANEL_WIDTH, fmt, window

__all__ = ["psnr_window"]


#: the width (pixels) of the per-pixel error's colour scale
ERROR_SCALE_WIDTH = 56


def _fit(training):
    """((x0, x1), (y0, y1)): the plot's axis ranges holding every point of both curves with a margin (a range of
    at least 1 iteration and 0.2 dB), or None before the first point."""
    xs = list(training.train_iters) + list(training.eval_iters)
    ys = [y for y in list(training.train_psnr) + list(training.eval_psnr) if np.isfinite(y)]
    if not xs or not ys:
        return None

    def padded(lo, hi, least, margin):
        mid, half = 0.5 * (lo + hi), 0.5 * max(hi - lo, least)
        return mid - (1 + margin) * half, mid + (1 + margin) * half
    # margins that keep the first and last markers, and a flat curve, clear of the frame
    return padded(min(xs), max(xs), 1.0, 0.06), padded(min(ys), max(ys), 0.2, 0.15)


def psnr_window(imgui, implot, training, error_view, display, requests, n_cameras):
    w = max(display[0] - 2 * PANEL_WIDTH - 40, 320)
    h = 230
    if not window(imgui, "PSNR", (display[0] / 2, display[1] - 10), (0.5, 1.0), (w, h), auto=False):
        imgui.end()
        return
    avail = imgui.get_content_region_avail()
    heat_w = min(avail.y * 1.1, avail.x * 0.45)
    plot_w = max(avail.x - heat_w - 8, 100)
    if implot.begin_plot("##psnr", imgui.ImVec2(plot_w, avail.y)):
        implot.setup_axes("iteration", "PSNR (dB)")
        limits = _fit(training)   # set from the data of this frame: ImPlot's auto-fit lags a frame behind, so a
        if limits is not None:    # frame built as a point arrives (an offscreen frame is) left it out of view
            (x0, x1), (y0, y1) = limits
            implot.setup_axis_limits(implot.ImAxis_.x1, x0, x1, implot.Cond_.always)
            implot.setup_axis_limits(implot.ImAxis_.y1, y0, y1, implot.Cond_.always)
        if training.train_iters:
            spec = implot.Spec()
            if len(training.train_iters) < 2:   # a line of one point draws nothing: the first window's point shown
                spec.marker = implot.Marker_.circle
            implot.plot_line("train view", np.asarray(training.train_iters, np.float64),
                             np.asarray(training.train_psnr, np.float64), spec)
        if training.eval_iters:
            spec = implot.Spec()
            spec.marker = implot.Marker_.circle
            spec.line_weight = 2.0
            implot.plot_line("held-out", np.asarray(training.eval_iters, np.float64),
                             np.asarray(training.eval_psnr, np.float64), spec)
        implot.end_plot()
    imgui.same_line()
    imgui.begin_group()
    if error_view is not None:
        imgui.text(f"|render - GT|  {error_view.name}")
        imgui.text(f"PSNR {fmt(error_view.psnr, '.2f')} dB, max {error_view.vmax:.2f}")
        side = imgui.get_content_region_avail()
        hh, ww = error_view.values.shape
        bar_w = ERROR_SCALE_WIDTH   # the colour scale beside the map: which error each colour is
        scale = min(max(side.x - bar_w - 8, 20) / max(ww, 1), max(side.y, 20) / max(hh, 1))
        top = max(error_view.vmax, 1e-6)
        implot.push_colormap(implot.Colormap_.hot)
        flags = implot.Flags_.canvas_only | implot.Flags_.no_inputs
        if implot.begin_plot("##error", imgui.ImVec2(ww * scale, hh * scale), flags):
            implot.setup_axes("", "", implot.AxisFlags_.no_decorations, implot.AxisFlags_.no_decorations)
            implot.setup_axis_limits(implot.ImAxis_.x1, 0, 1, implot.Cond_.always)
            implot.setup_axis_limits(implot.ImAxis_.y1, 0, 1, implot.Cond_.always)
            implot.plot_heatmap("##err", error_view.values, 0.0, top, "")
            implot.end_plot()
        imgui.same_line()
        implot.colormap_scale("##error_scale", 0.0, top, imgui.ImVec2(bar_w, hh * scale), "%.2f")
        implot.pop_colormap()
    else:
        imgui.push_text_wrap_pos(imgui.get_cursor_pos_x() + heat_w)
        imgui.text_wrapped("Per-pixel error: snap the camera to a training view (T, [ ]) to compare the render "
                           "with its ground truth.")
        imgui.pop_text_wrap_pos()
        if n_cameras and imgui.button("show nearest training view"):
            requests.append(R.SnapNearest())
    imgui.end_group()
    imgui.end()
