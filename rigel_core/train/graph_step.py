"""The training step as a replayed CUDA graph (issue 14): the same code as :meth:`Trainer.step`'s eager path —
:func:`.step.train_step`, the one step body — captured once with fixed buffers and replayed, so that a step costs the
host a handful of launches instead of ~90 Python/autograd hops. This module knows no strategy: what the strategy
does around a replay (its noise seed, the iterations it leaves to the eager step, the config fields its device work
reads) it asks the trainer's :class:`~.strategy.Strategy`. A plain runner (``GraphStep(trainer, capture=False)``)
calls the body on the same buffers instead of capturing it: the CPU tests compare that with the eager step bit for
bit.

What is captured, for one training view (``batch_size`` 1, one process, no per-image exposure or random
background): render (activations, colours, projection, binning, rasterization), loss, backward, the NaN guard,
the densification statistics and the fused Adam step — with the MCMC budget (``strategy = "mcmc"``) its
regularisers and its position noise instead of the statistics (η from :func:`.mcmc.noise_generator`, registered
with the graph and seeded from the trainer's CPU generator before each replay, where the eager step seeds it).
What stays on the host, between replays: the view order, the learning-rate schedule (written into device scalars
the graph reads), densification, pruning, opacity resets, MCMC relocation and growth (those iterations take the
eager step) and evaluation — every one of them replaces tensors, after which the graph is captured again
(:attr:`GraphStep.captures` counts them; about one per ``densify_interval`` iterations). Coarse-to-fine training
(``TrainConfig.coarse_to_fine``) changes the image size at each phase: graphs of a size no longer trained are
dropped then (:meth:`GraphStep.views_changed`).

**No device→host read in the step.** The eager binning reads the frame's entry count back to size its buffers;
the captured one bins into a fixed capacity (:class:`rigel_core.renderer.cuda_backend.FixedBinningCapacity`) and leaves
the count on the device. A frame that needs more entries than the capacity is incomplete: the graph then skips
the whole update on the device (the fused Adam's ``found_inf``, as the NaN guard does; no statistics are added),
the host learns of it a few steps later (``IN_FLIGHT``) from a pinned copy of the count, captures again with a
larger capacity and trains that view again ("redo that step once"). Capacity = 1.05 × the largest count seen for
that image size over the recent steps (scaled by the Gaussian count's growth since), so overflows are rare; a size
with no count yet (the first step, a resumed run) takes one eager step first, and a graph whose capacity has
become much larger than needed (pruning) is captured again (the sort pays for the whole capacity every step).

Graphs are kept per (image size, mask or not, SH degree, statistics on or off) — the trainer gives every view a
mask when some have one (``Trainer._uniform_masks``); any change of the parameters'
storage, the optimizer state, the statistics or of a configuration field the body reads (:func:`.step.graph_config`:
the loss, the statistic, the strategy's own fields — not the host-only densification thresholds or schedule)
discards them all (:attr:`GraphStep.recaptures` counts those times). A capture that
fails (e.g. an unsupported operation) turns the graph path off for the run with one warning; the eager path is
the fallback and the reference (tests/test_graph_step.py compares the two on the GPU). One that ran out of device
memory is first taken once more after emptying the allocator's cache (:meth:`GraphStep._capture_with_retry`).
"""
from __future__ import annotations

import gc
import math
import time
import warnings
from collections import deque
from dataclasses import dataclass

import torch

from .. import config
from ..limits import out_of_memory
from .corrections import correction_classes
from .step import StepView, graph_config, train_step

__all__ = ["GraphStep", "graph_step_unsupported"]

#: the capacity is this factor above the largest entry count seen recently (the sort runs over the whole
#: capacity: a larger margin costs sort time on every step, a smaller one more overflows)
CAPACITY_MARGIN = 1.05
#: ... over this many recent steps of the same image size
RECENT_STEPS = 256
#: the smallest capacity
MIN_CAPACITY = 1 << 16
#: replays the host may run ahead of the device (it waits for the one before): a few, so that a short stall of the
#: host (the viewer's frame loop holding the interpreter lock) does not leave the GPU idle
IN_FLIGHT = 3
#: every this many replays a graph whose capacity exceeds REFIT_SLACK × what a capture would get now is captured
#: again (entry counts fall when pruning removes Gaussians; the sort pays for the whole capacity on every step)
REFIT_EVERY = 200
REFIT_SLACK = 1.3


def capacity_for(seen, n_now: int) -> int:
    """Binning capacity for a capture: ``CAPACITY_MARGIN`` × the largest of the recent entry counts ``seen``
    (``(entries, N then)`` pairs), each scaled by the Gaussian count's growth since (``n_now / N``, never below 1),
    within [``MIN_CAPACITY``, ``config.MAX_ENTRIES``]."""
    want = max(e * max(1.0, n_now / max(1, n)) for e, n in seen)
    return int(min(config.MAX_ENTRIES, max(MIN_CAPACITY, math.ceil(CAPACITY_MARGIN * want))))


def graph_step_unsupported(trainer) -> str | None:
    """Why ``trainer``'s configuration cannot use the graph step (a short reason), or None when it can: it needs
    CUDA, the config's ``cuda_graph``, no per-image exposure, pose refinement or bilateral grid (their learning rate and
    image index would be baked into the graph), and what any runner needs (:func:`plain_unsupported`)."""
    cfg = trainer.config
    if not getattr(cfg, "cuda_graph", True):
        return "TrainConfig.cuda_graph is off"
    if trainer.device.type != "cuda":
        return "not a CUDA device"
    for cls in correction_classes():  # the view's correction and its learning rate would be baked into the graph
        if getattr(cfg, cls.config_field):
            return cls.title
    return plain_unsupported(trainer)


def plain_unsupported(trainer) -> str | None:
    """Why ``trainer``'s configuration cannot use a plain (uncaptured) runner (:class:`GraphStep` with ``capture``
    False), or None: a runner takes one view of one process on the dataset background."""
    cfg = trainer.config
    if trainer.comm is not None:
        return "data-parallel training"
    if int(cfg.batch_size) != 1:
        return "batch_size > 1"
    if cfg.random_background:
        return "random background"
    return None


class _StaticCamera:
    """A camera whose ``viewmat``/``K``/``campos`` tensors are fixed device buffers (read by the captured graph);
    :meth:`GraphStep.step` copies the training view's values into them before each replay."""

    def __init__(self, packed: torch.Tensor, width: int, height: int):
        self.packed = packed  # (28,) float32: viewmat (16) | K (9) | campos (3)
        self.width, self.height = int(width), int(height)
        self._viewmat = packed[:16].view(4, 4)
        self._K = packed[16:25].view(3, 3)
        self._campos = packed[25:28]

    def viewmat_tensor(self, device=None, dtype=torch.float32):
        return self._viewmat

    def K_tensor(self, device=None, dtype=torch.float32):
        return self._K

    def campos_tensor(self, device=None, dtype=torch.float32):
        return self._campos


@dataclass
class _Captured:
    graph: torch.cuda.CUDAGraph | None  # None for a plain runner (the body is called instead)
    view: StepView  # the fixed buffers: static camera, image and mask copies
    total: torch.Tensor | None  # (1,) int64: entries the replayed frame needed (None: plain runner)
    values: torch.Tensor | None  # (6,) float64: StepResult.values (None: plain runner)
    capacity: int | None
    call: object = None  # plain runner: the body on these buffers, (iteration, view index) -> (values, context)


class GraphStep:
    """Captures and replays :class:`~rigel_core.train.Trainer`'s step for one view (module docstring). Made by the
    trainer; :meth:`step` is called from ``Trainer.step`` with the host-side decisions already taken."""

    def __init__(self, trainer, *, capture: bool = True):
        self.trainer = trainer
        #: False: a plain runner — the same body on the same fixed buffers, called instead of captured and replayed
        #: (no CUDA needed: the CPU tests compare it with the eager step bit for bit); no fixed binning capacity then
        self.capture = bool(capture)
        self.graphs: dict = {}
        self.captures = 0  # graphs captured so far
        self.capture_s = 0.0  # host seconds spent in those captures (warm-up and instantiation included)
        self.replays = 0  # steps taken by replaying a graph (the others of the run were eager)
        self.overflows = 0  # replays that needed more entries than their capacity (trained again)
        self.oom_retries = 0  # captures taken again after one ran out of device memory (_capture_with_retry)
        self.wait_s = 0.0  # host seconds blocked on replays in flight (check_pending): a loop's wall time minus
        # this is the host's own work (bench/train_step.py's "graph loop host")
        self.disabled: str | None = None  # why the graph path was turned off for the run
        self.recaptures = 0  # times a changed signature (storage, optimizer state, captured config fields) dropped
        # the graphs: a host-only setting (a densification threshold) changes none of it
        self._signature = None
        self._lr: dict[str, torch.Tensor] = {}  # device learning rates the captured Adam reads, by group name
        self._lr_host: dict[str, float] = {}
        self._recent: dict[tuple, deque] = {}  # (W, H) -> recent (entries, N)
        self._pending: deque = deque()  # (event, pinned total, capacity, view index, (W, H), N)
        self._slot = 0
        self._cam_table: torch.Tensor | None = None
        self._steps = 0
        self._pool = None  # memory pool of the live graphs (see _drop)
        #: image sizes whose last frame needed more entries than the binning's limit (``config.MAX_ENTRIES``): no
        #: capacity can serve them, so their next step is eager, where the trainer repairs the model
        #: (``Trainer._retire_widest``); one eager step each, then captures as before
        self._over_limit: set = set()
        if self.capture:
            self._pinned = [torch.zeros(1, dtype=torch.int64).pin_memory() for _ in range(IN_FLIGHT + 2)]
            self._events = [torch.cuda.Event() for _ in self._pinned]  # one per pinned slot, recorded again
            self._stream = torch.cuda.Stream(device=trainer.device)

    def unsupported(self) -> str | None:
        """Why the trainer's configuration cannot use this runner now, or None (:func:`graph_step_unsupported`;
        for a plain runner :func:`plain_unsupported`)."""
        return graph_step_unsupported(self.trainer) if self.capture else plain_unsupported(self.trainer)

    # ---- bookkeeping ------------------------------------------------------------------------------------
    def _current_signature(self):
        t = self.trainer
        ptrs = []
        for g in t.optimizer.param_groups:
            for p in g["params"]:
                ptrs.append(p.data_ptr())
                for v in t.optimizer.state.get(p, {}).values():
                    if isinstance(v, torch.Tensor):
                        ptrs.append(v.data_ptr())
            ptrs.append((g["betas"], g["eps"], g["weight_decay"]))
        s = t.stats
        ptrs += [s.grad_accum.data_ptr(), s.denom.data_ptr(), s.max_radii.data_ptr(), t._nan_skips.data_ptr(),
                 t.background.data_ptr()]
        f3d = getattr(t.model, "filter_3D", None)
        ptrs.append(f3d.data_ptr() if isinstance(f3d, torch.Tensor) else None)
        # the config: only the fields the captured body reads (step.graph_config): a slider of a host-only field
        # (a densification threshold) keeps every graph
        return tuple(ptrs), graph_config(t.config, t.strategy), getattr(t.model, "render_mode", "default")

    def _camera_table(self) -> torch.Tensor:
        """(V, 28) float32 on the device: every training view's viewmat | K | campos, converted as the eager
        path converts them (Camera.*_tensor), so both paths render from the same float32 values."""
        if self._cam_table is None:
            t = self.trainer
            rows = []
            for f in t.train_frames:
                c = f.camera
                rows.append(torch.cat([c.viewmat_tensor(t.device).reshape(-1), c.K_tensor(t.device).reshape(-1),
                                       c.campos_tensor(t.device).reshape(-1)]))
            self._cam_table = torch.stack(rows).contiguous()
        return self._cam_table

    def views_changed(self) -> None:
        """The trainer's training views were replaced (coarse-to-fine): their camera table is made again, and the
        graphs of image sizes no training view has any more are dropped (with their copies of a view's image and
        mask) once the replays still in flight have finished (their entry counts are read as usual: a view that
        overflowed is trained again). Graphs of sizes still trained stay valid: each replay copies the trainer's
        current ``_train_images[idx]`` / ``_train_masks[idx]`` into its own buffers."""
        self._cam_table = None
        sizes = {(f.camera.width, f.camera.height) for f in self.trainer.train_frames}
        stale = [k for k in self.graphs if k[:2] not in sizes]
        if stale:
            self.trainer._redo_views += self.check_pending(keep=0)
            for key in stale:
                self._drop(key)

    def stats(self) -> dict:
        """``{"captures", "capture_s", "replays", "overflows", "wait_s", "recaptures", "oom_retries", "disabled"}`` of
        the run so far (for metrics.json and bench/real.py: how much of a run the graphs served, what re-capturing
        cost the host, how long the host waited for the device — most of the loop's time when the GPU is the bound —,
        how often a changed signature dropped every graph and a capture short of memory was taken again)."""
        return {"captures": self.captures, "capture_s": self.capture_s, "replays": self.replays,
                "overflows": self.overflows, "wait_s": self.wait_s, "recaptures": self.recaptures,
                "oom_retries": self.oom_retries, "disabled": self.disabled}

    def record_entries(self, size: tuple, entries: int) -> None:
        """Note a frame of image size ``size`` (W, H) that needed ``entries`` binning entries (e.g. from an eager
        step), so the next capture for that size is made large enough."""
        self._recent.setdefault(size, deque(maxlen=RECENT_STEPS)).append((int(entries),
                                                                          self.trainer.model.num_gaussians))

    def _drop(self, key=None) -> None:
        """Discard the graph of ``key`` (every graph when None)."""
        if key is None:
            self.graphs.clear()
        else:
            self.graphs.pop(key, None)

    def _capacity(self, size: tuple) -> int | None:
        """The capacity a capture for image size ``size`` gets now, or None when no count is known for it yet."""
        seen = self._recent.get(size)
        if not seen:
            return None
        return capacity_for(seen, self.trainer.model.num_gaussians)

    def _learning_rates(self) -> None:
        """Write the groups' current (host) learning rates into the device scalars the captured Adam reads."""
        for g in self.trainer.optimizer.param_groups:
            name, lr = g["name"], float(g["lr"])
            t = self._lr.get(name)
            if t is None:
                self._lr[name] = t = torch.full((), lr, dtype=torch.float32, device=self.trainer.device)
                self._lr_host[name] = lr
            elif self._lr_host[name] != lr:
                t.fill_(lr)
                self._lr_host[name] = lr

    def check_pending(self, keep: int = 1) -> list[int]:
        """Read the entry counts of finished replays (all but the last ``keep``; waits for them); returns the
        view indices whose frame overflowed its capacity (their update was skipped on the device)."""
        redo = []
        while len(self._pending) > keep:
            event, pinned, capacity, idx, size, n = self._pending.popleft()
            t0 = time.perf_counter()
            event.synchronize()
            self.wait_s += time.perf_counter() - t0
            total = int(pinned.item())
            if total <= config.MAX_ENTRIES:  # a count past the limit would size every capture at the limit; the
                # eager step that repairs the model records what the view needs then
                self._recent.setdefault(size, deque(maxlen=RECENT_STEPS)).append((total, n))
            if total > capacity:
                self.overflows += 1
                redo.append(idx)
                if total > config.MAX_ENTRIES:
                    self._over_limit.add(size)
                for key in [k for k in self.graphs if k[:2] == size and self.graphs[k].capacity < total]:
                    self._drop(key)
        return redo

    # ---- capture ----------------------------------------------------------------------------------------
    def _capture_with_retry(self, key, idx: int) -> _Captured:
        """:meth:`_capture`, once more after ``torch.cuda.empty_cache()`` when it ran out of device memory.

        A capture cannot free memory: the caching allocator does not release its cached blocks (those of dropped
        graphs' pools among them) while a stream captures, so a capture can fail for want of memory that is only
        cached, not in use. Seen on beer~nosfm (H100, 2026-12-07, runs sharing the GPU): at most 2.9 GiB allocated
        by a run, its captures failing with the GPU's 79 GiB taken, after which it trained eagerly. Emptying the
        cache outside the capture gives that memory back; a second failure stands (the caller turns the graph
        path off)."""
        try:
            return self._capture(key, idx)
        except Exception as exc:  # noqa: BLE001 — torch's OutOfMemoryError, or the extension's plain RuntimeError
            if not out_of_memory(exc):
                raise
        self.oom_retries += 1
        torch.cuda.empty_cache()  # outside the except: the error's traceback (the failed graph, the partial step's
        return self._capture(key, idx)  # tensors) is gone by now, so their blocks are free to give back

    def _capture(self, key, idx: int) -> _Captured:
        t = self.trainer
        opt = t.optimizer
        width, height, has_mask, _, stats_on = key
        dev = t.device
        cam = _StaticCamera(self._camera_table()[idx].clone(), width, height)
        mask = t._train_masks[idx].clone() if has_mask else None
        view = StepView(cam, t._train_images[idx].clone(), mask, t.background, idx)
        if not self.capture:  # the body on these buffers, called at every step
            def call(it: int, index: int):
                view.index = index  # its exposure correction (the buffers hold its image)
                ctx = t._step_context(it, host_work=False)
                return train_step(t, [view], ctx).values, ctx
            self.captures += 1
            return _Captured(None, view, None, None, None, call)
        capacity = self._capacity((width, height))
        strategy = t.strategy
        saved = [(g, g["lr"], g.get("capturable", False)) for g in opt.param_groups]
        opt.zero_grad(set_to_none=True)
        graph = torch.cuda.CUDAGraph()
        for gen in strategy.graph_generators(dev):  # their seed and offset are read at each replay
            graph.register_generator_state(gen)
        side = self._stream
        side.wait_stream(torch.cuda.current_stream(dev))
        gc_was_on = gc.isenabled()
        try:
            for g in opt.param_groups:  # the captured Adam reads its learning rates from device scalars
                g["lr"], g["capturable"] = self._lr[g["name"]], True
            with torch.cuda.stream(side):
                # One pool for the live graphs: safe in any replay order because nothing in it outlives a replay
                # but `values` and `total`, which stay referenced (gradients, found_inf and every temporary are
                # written and read within one replay; parameters, moments and statistics live outside it). A
                # pool whose graphs are all gone cannot take a capture again (the allocator asserts), so a capture
                # with no live graph starts a new one, however the graphs were dropped.
                if self._pool is None or not self.graphs:
                    self._pool = torch.cuda.graph_pool_handle()
                # No garbage collection while capturing: a collection can free another run's graphs (a Trainer and
                # its GraphStep form a reference cycle, so a dropped trainer waits for the collector), and
                # destroying a graph is illegal while this stream captures; the capture then fails and the run
                # falls back to the eager step for good. Collected afterwards as usual.
                gc.disable()
                graph.capture_begin(pool=self._pool, capture_error_mode="thread_local")
                try:
                    ctx = t._step_context(t.iteration + 1, host_work=False, lr_means=self._lr["means3D"])
                    ctx.stats_on = bool(stats_on)
                    outcome = train_step(t, [view], ctx, capacity=capacity)
                except BaseException:
                    # A capture cut short may hold no kernel yet, and torch then warns "The CUDA Graph is empty":
                    # a second message about the same failure, which under warnings-as-errors would even replace
                    # the body's error (an out-of-memory one that _capture_with_retry takes again). The body's
                    # error is the one raised. (Seen in the GPU test of the retry, H100, 2026-12-07.)
                    with warnings.catch_warnings():
                        warnings.simplefilter("ignore")
                        graph.capture_end()
                    raise
                graph.capture_end()
        finally:
            if gc_was_on:
                gc.enable()
            for g, lr, cap in saved:
                g["lr"], g["capturable"] = lr, cap
            opt.found_inf = None
            opt.zero_grad(set_to_none=True)  # the graph owns its gradient buffers; eager steps start from None
        torch.cuda.current_stream(dev).wait_stream(side)
        self.captures += 1
        return _Captured(graph, view, outcome.total, outcome.values, capacity)

    # ---- one step ---------------------------------------------------------------------------------------
    def step(self, idx: int, it: int):
        """Replay the step of iteration ``it`` for training view ``idx`` (capturing first if needed; a plain runner
        calls the body on its buffers): returns ``(values, context)`` — the (6,) float64 ``values`` of the
        StepResult and the :class:`~.step.StepContext` the strategy's host schedule reads —, or None when the graph
        path is off (the caller then runs the eager step)."""
        if self.disabled:
            return None
        t = self.trainer
        frame = t.train_frames[idx]
        width, height = frame.camera.width, frame.camera.height
        mask = t._train_masks[idx]
        stats_on = t.strategy.collects_stats(t.config, it)
        key = (width, height, mask is not None, t.model.active_sh_degree, bool(stats_on))
        sig = self._current_signature()
        if sig != self._signature:
            if self.graphs:
                self.recaptures += 1
            self._drop()
            self._signature = sig
        if self.capture:
            self._learning_rates()
        if (width, height) in self._over_limit:  # only the eager step can bring it under the limit
            self._over_limit.discard((width, height))
            return None
        cap = self.graphs.get(key)
        self._steps += 1
        if self.capture and cap is not None and self._steps % REFIT_EVERY == 0:  # counts fell (pruning): re-size
            want = self._capacity((width, height))
            if want is not None and cap.capacity > REFIT_SLACK * want:
                self._drop(key)
                cap = None
        if self.capture and cap is None and self._capacity((width, height)) is None:
            return None  # no entry count known for this size (a resumed run, a new size): one eager step first
        if cap is None:
            t0 = time.perf_counter()
            try:
                cap = self._capture_with_retry(key, idx)
            except Exception as exc:  # noqa: BLE001 — any capture failure: eager for the rest of the run
                self.disabled = f"{type(exc).__name__}: {exc}".splitlines()[0][:200]
                self._drop()
                warnings.warn(f"training step: CUDA graph capture failed, continuing without it ({self.disabled})",
                              stacklevel=3)
                return None
            self.capture_s += time.perf_counter() - t0
            self.graphs[key] = cap
            self._signature = self._current_signature()
        view = cap.view
        view.camera.packed.copy_(self._camera_table()[idx])
        view.gt.copy_(t._train_images[idx])
        if view.mask is not None:
            view.mask.copy_(mask)
        t.strategy.before_replay(t)  # e.g. this step's noise seed, drawn where the eager step draws it
        self.replays += 1
        if not self.capture:
            values, ctx = cap.call(it, idx)
            t._zero_grad()
            return values, ctx
        cap.graph.replay()
        values = cap.values.clone()
        pinned, event = self._pinned[self._slot], self._events[self._slot]
        self._slot = (self._slot + 1) % len(self._pinned)
        if len(self._pending) >= len(self._pinned) - 1:
            t._redo_views += self.check_pending(keep=0)
        pinned.copy_(cap.total, non_blocking=True)
        event.record()
        self._pending.append((event, pinned, cap.capacity, idx, (width, height), t.model.num_gaussians))
        t._redo_views += self.check_pending(keep=IN_FLIGHT)
        return values, t._step_context(it, host_work=False, lr_means=self._lr["means3D"])
