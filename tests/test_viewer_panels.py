"""The viewer's panels built in a headless Dear ImGui / ImPlot context (no window, no Vulkan): what they show is
whole (wrapped at the panel's width, never cut off), the stats plot spans its history, the PSNR plot shows its
first point, and the Training panel says what the run chose (fresh-user pass over rigel-viewer --data)."""
from collections import deque

import numpy as np
import pytest

pytest.importorskip("imgui_bundle")

from imgui_bundle import imgui, implot  # noqa: E402

from viewer import messages as M  # noqa: E402
from viewer.ui import Stats  # noqa: E402
from viewer.ui_state import TrainingState  # noqa: E402

DISPLAY = (1280, 800)


@pytest.fixture
def gui():
    """A fresh ImGui + ImPlot context of DISPLAY's size that writes no imgui.ini; destroyed after the test."""
    ctx = imgui.create_context()
    pctx = implot.create_context()
    io = imgui.get_io()
    io.set_ini_filename("")
    io.display_size = imgui.ImVec2(*DISPLAY)
    io.backend_flags |= imgui.BackendFlags_.renderer_has_textures   # the font atlas needs no renderer here
    try:
        yield
    finally:
        implot.destroy_context(pctx)
        imgui.destroy_context(ctx)


def frames(n, build):
    """Build ``n`` ImGui frames with ``build()`` (windows size themselves over the first frames)."""
    for _ in range(n):
        imgui.new_frame()
        build()
        imgui.render()


class Recorder:
    """``module`` (imgui or implot) with some calls watched: each name in ``watch`` is called through and then
    ``after(name, args, result)`` runs (in the same frame, so it can read the last item's or plot's state)."""

    def __init__(self, module, watch, after):
        self._module, self._watch, self._after = module, set(watch), after

    def __getattr__(self, name):
        attr = getattr(self._module, name)
        if name not in self._watch:
            return attr

        def call(*args, **kw):
            if name == "end_plot":   # the limits of the plot that ends, read while it is current
                self._after(name, args, None)
                return attr(*args, **kw)
            result = attr(*args, **kw)
            self._after(name, args, result)
            return result
        return call


def test_the_render_time_plot_spans_every_frame_of_its_history(gui):
    """The Stats panel's render-time plot shows its whole history (its x axis stayed at ImPlot's default 0..1, so
    it drew the two oldest of 120 frames: a straight line), with a label saying what it is."""
    from viewer.panels.main import _stats_header

    rng = np.random.default_rng()
    values = rng.uniform(20.0, 900.0, size=int(rng.integers(30, 121))).astype(np.float32)
    stats = Stats(gaussians=1000, render_ms=float(values[-1]),
                  render_ms_history=deque(values.tolist(), maxlen=120))
    limits, texts = [], []

    def after(name, args, result):
        if name == "end_plot":
            lim = implot.get_plot_limits()
            limits.append((lim.x.min, lim.x.max, lim.y.min, lim.y.max))
        elif name == "text_disabled":
            texts.append(args[0])

    def build():
        imgui.begin("Stats test")
        _stats_header(Recorder(imgui, {"text_disabled"}, after), Recorder(implot, {"end_plot"}, after), stats, 5)
        imgui.end()

    frames(3, build)
    x0, x1, y0, y1 = limits[-1]
    assert x0 <= 0 and x1 >= len(values) - 1, (x0, x1, len(values))
    assert y0 <= values.min() and y1 >= values.max()
    ms = [f"{v:.0f}" if v >= 100 else f"{v:.3g}" for v in (values.min(), values.max())]
    assert f"render ms, last {len(values)} frames: {ms[0]} to {ms[1]}" in texts, texts


def _state(**kw) -> TrainingState:
    st = TrainingState()
    notes = kw.pop("notes")
    st.apply(M.TrainingStarted(0, 30, 45649, "cpu", 255, 37, kw.pop("run_dir"), True,
                               {"grad_threshold": 2e-4, "densify_interval": 100, "max_gaussians": 3_000_000}, "sh",
                               "default", notes, kw.pop("coarse"), kw.pop("start", ""), kw.pop("budget", "")))
    for ev in kw.pop("events", ()):
        st.apply(ev)
    return st


def test_the_training_panel_says_what_the_run_chose_and_wraps_every_line(gui, tmp_path):
    """The Training panel shows the run's initialisation, budget and coarse-to-fine in plain words, and its run
    folder and messages whole, wrapped inside the panel: a message was cut at 46 characters ("[30] saved
    (finished): checkpoint.safete") and the run folder to its last 44, with nothing saying so."""
    from viewer.panels.training import training_window

    run_dir = str(tmp_path / ("a-long-run-folder-name-" * 3) / "bonsai-2")
    start = ("start: 45,649 Gaussians (25,649 SfM points + 20,000 background points), device cpu, 30 iterations, "
             "strategy default, at most 3,000,000 Gaussians")
    notes = (start, "strategy auto: default (3DGS's clone / split / prune, ...)", "coarse_to_fine auto: 1, off (...)")
    saved = (f"{run_dir}/checkpoint.safetensors", f"{run_dir}/model.ply")
    st = _state(notes=notes, run_dir=run_dir, coarse="coarse-to-fine: off",
                start="start: 45,649 Gaussians (25,649 SfM points + 20,000 background points)",
                budget="at most 3,000,000 Gaussians",
                events=[M.EvalFinished(0, 16.77, 0.417, 45649, 37), M.Saved(30, saved, "finished"),
                        M.CommandRejected("SetDensifyParams", "TrainConfig.densify_until must be ≥ densify_from, "
                                                              "got 100 < 500")])
    drawn = []   # (text, item rect max x, window right edge)

    def after(name, args, result):
        drawn.append((args[0], imgui.get_item_rect_max().x, imgui.get_window_pos().x + imgui.get_window_size().x))

    frames(3, lambda: training_window(Recorder(imgui, {"text", "text_disabled"}, after), st, DISPLAY, []))
    last = drawn[-len(drawn) // 3:]   # the third frame's items (each frame draws the same ones)
    texts = [t for t, _, _ in last]
    assert "start: 45,649 Gaussians (25,649 SfM points + 20,000 background points)" in texts
    assert "at most 3,000,000 Gaussians  (why?)" in texts and "coarse-to-fine: off" in texts
    assert run_dir in texts
    for line in st.log:   # each message whole
        assert line in texts, (line, texts)
    assert any("checkpoint.safetensors, model.ply" in t for t in texts)
    for text, right, edge in last:   # and inside the panel (placed with its right edge 10 px from the display's)
        assert right <= edge + 0.5 and abs(edge - (DISPLAY[0] - 10)) < 1, (text, right, edge)


def test_the_psnr_plot_shows_every_point_in_the_frame_it_arrives(gui):
    """The first loss-curve window is one point: a line of one point drew nothing (on the CPU the plot stayed
    empty for the first two windows, a minute and a half on bonsai), so it is drawn with a marker; and the axes hold
    a point in the frame built as it arrives (ImPlot's auto-fit lagged a frame: every offscreen frame, captured
    as progress arrives, showed the plot without its newest points)."""
    from viewer.panels.psnr import psnr_window

    st = _state(notes=("start: 10 Gaussians (the SfM points), device cpu, 30 iterations, strategy mcmc, a budget of "
                       "10,000 Gaussians",), run_dir="/r", coarse="",
                events=[M.EvalFinished(0, 16.0, 0.4, 10, 3)])
    markers, limits = {}, []

    class Plot:
        def __getattr__(self, name):
            return getattr(implot, name)

        def end_plot(self):
            lim = implot.get_plot_limits()
            limits.append((lim.x.min, lim.x.max, lim.y.min, lim.y.max))
            return implot.end_plot()

        def plot_line(self, label, xs, ys, spec=None):
            markers[label] = (len(xs), None if spec is None else spec.marker)
            return implot.plot_line(label, xs, ys, spec) if spec is not None else implot.plot_line(label, xs, ys)

    def build():
        psnr_window(imgui, Plot(), st, None, DISPLAY, [], 0)

    frames(2, build)   # the held-out point at iteration 0 alone, as the plot first shows
    rng = np.random.default_rng()
    it, db = int(rng.integers(5, 500)), float(rng.uniform(17.0, 30.0))
    st.apply(M.TrainingProgress(it, 0.2, db, 10, 40.0, 4000.0, "v0", False))

    def holds(points):
        x0, x1, y0, y1 = limits[-1]
        return all(x0 < x < x1 and y0 < y < y1 for x, y in points)
    frames(1, build)
    n, marker = markers["train view"]
    assert n == 1 and marker is not None and marker != implot.Marker_.none
    assert holds([(0, 16.0), (it, db)]), (limits[-1], it, db)
    for i in (it + 10, it + 20):
        st.apply(M.TrainingProgress(i, 0.2, db - 3.0, 10, 40.0, 4000.0, "v0", False))
    frames(1, build)
    assert markers["train view"][0] == 3 and markers["train view"][1] == implot.Marker_.none
    assert holds([(0, 16.0), (it, db), (it + 20, db - 3.0)]), limits[-1]


def test_the_error_map_has_its_colour_scale(gui):
    """The per-pixel error of a training view comes with the scale of its colours, from 0 to the map's maximum
    (it had none: a user could only guess which error a colour meant), beside the map inside the window."""
    from viewer.panels.psnr import psnr_window
    from viewer.ui_state import ErrorView

    rng = np.random.default_rng()
    values = rng.uniform(0.0, 0.6, size=(int(rng.integers(20, 60)), int(rng.integers(20, 60)))).astype(np.float32)
    ev = ErrorView(values=values, name="r_0", psnr=18.5, vmax=float(values.max()), frame_size=values.shape[::-1])
    st = _state(notes=("start: 10 Gaussians (the SfM points), device cpu, 30 iterations, strategy mcmc, a budget of "
                       "10,000 Gaussians",), run_dir="/r", coarse="")
    scales = []

    class Plot:
        def __getattr__(self, name):
            return getattr(implot, name)

        def colormap_scale(self, label, lo, hi, size=None, *a):
            implot.colormap_scale(label, lo, hi, size, *a)
            scales.append((lo, hi, imgui.get_item_rect_max().x, imgui.get_window_pos().x + imgui.get_window_size().x))

    frames(3, lambda: psnr_window(imgui, Plot(), st, ev, DISPLAY, [], 4))
    lo, hi, right, edge = scales[-1]
    assert lo == 0.0 and hi == pytest.approx(float(values.max())) and right <= edge
