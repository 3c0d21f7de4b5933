"""``Trainer``: 3DGS optimisation, one iteration per :meth:`Trainer.step` call.

The CLI (``rigel-train``) and the viewer's training thread drive the same object. One step (3DGS's
``train.py``, Kerbl et al. 2023):

1. learning rates for this iteration (position: exponential decay × scene extent; :mod:`.optim`), active SH
   degree = ``min(sh_degree, iteration // sh_degree_interval)``;
2. the next training view (a fresh random permutation of the training set each epoch) — ``config.batch_size``
   views per process, and with ``self.comm`` (:mod:`.distributed`) this process's slice of the global batch, the
   gradients then averaged over the batch by one all-reduce —, render, loss
   ``(1 − λ)·L1 + λ·(1 − SSIM)`` (:mod:`.losses`), backward; over the frame's valid pixels only when it has a
   ``mask`` (lens borders, user masks): a masked pixel has exactly zero effect on every gradient, hence on the
   densification statistics too;
3. **NaN guard**: a non-finite loss, parameter gradient or means2D gradient skips the update (no Adam step,
   no densification statistics; decided on the device, no host sync), and is counted in ``nan_skips`` and
   reported in the :class:`StepResult`;
4. Adam step; then, before ``densify_until``, densification statistics, densify/prune every
   ``densify_interval`` after ``densify_from``, opacity reset every ``opacity_reset_interval`` (and at
   ``densify_from`` for white-background data, as 3DGS does) (:mod:`.densify`);
5. held-out evaluation every ``eval_every`` iterations.

With ``strategy = "mcmc"`` (:mod:`.mcmc`) step 4's densification, pruning and opacity resets are replaced by the
3DGS-MCMC budget (relocation of dead Gaussians, growth to ``max_gaussians``, position noise after every step) and
the loss gains its opacity and scale regularisers.

Where the code is: steps 2–4's device work (render → loss → backward → guard → Adam → the strategy's device work)
is :func:`.step.train_step`, the one step body, which this class calls and the CUDA-graph runner
(:mod:`.graph_step`) captures; what a strategy changes is its object in :mod:`.strategy`; this class keeps the
run's state and the host side (schedule, views, learning rates, evaluation). The run loop around it (logging,
checkpoints, signals) is :mod:`.run`.

Iterations are counted from 1 (``trainer.iteration`` is the number of completed steps), so every schedule test
reads as in the reference code. The config is read at every step: a viewer may edit it while training runs.

Threading: ``trainer.lock`` is held while the parameters are modified (Adam step, densification, opacity
reset); :meth:`snapshot` takes it to copy a consistent model. Nothing else blocks.
"""
from __future__ import annotations

import dataclasses
import math
import os
import threading
import time
import warnings
from dataclasses import dataclass, field

import numpy as np
import torch

from ..camera import Camera, host_to_device
from ..data.frames import MaskFacts, common_size_frames, downscale_frame, frame_mask, mask_facts
from ..data.stream import StreamedFrame, ViewStream, map_frames
from ..mip import FILTER_3D_INTERVAL, compute_filter_3d
from ..model import GaussianModel
from ..render import render
from .config import SPARSE_SFM_COVERAGE, Capture, TrainConfig, coarse_schedule_words, coarse_to_fine_span, \
    resolve_coarse_to_fine, resolve_densify_grad, resolve_init_background, resolve_init_mode, resolve_init_points, \
    resolve_schedule_scale, resolve_strategy, strategy_unresolved, training_downscale  # noqa: F401
from .densify import DensifyReport, DensifyStats
from .exposure import Exposure, exposure_lr, left_right_metrics, log_linear_lr
from .pose import PoseCorrection, fit_pose, pose_errors
from .bilagrid import BilateralGrid, grid_lr
from .losses import loss_terms, mse, psnr_from_mse, ssim
from .distributed import batch_scaling
from .graph_step import GraphStep, graph_step_unsupported
from .corrections import correction_classes
from .optim import appearance_groups, group_lrs, make_optimizer, optimizer_group, per_gaussian_tensors, \
    set_learning_rates
from .step import StepContext, StepView, train_step
from .mcmc import zero_moments
from ..renderer.output import BinningOverflow
from .strategy import Strategy, strategy_for
from .records import EvalResult  # its own module: rigel_core.checkpoint reads it without the trainer

__all__ = ["Trainer", "StepResult", "EvalResult", "random_init_points", "background_init_points",
           "training_downscale"]


#: the opacity :meth:`Trainer._retire_widest` gives a Gaussian it retires: under the binning's alpha floor (1/255),
#: so it touches no tile, and under ``mcmc_min_opacity`` / ``prune_opacity`` (0.005), so the strategy takes it
RETIRED_OPACITY = 1e-4
#: how many times a one-view step is taken again after retiring Gaussians for a binning overflow before the error
#: stands (a batch of B views: B − 1 more)
OVERFLOW_RETRIES = 2


def shortest_side(frames) -> int:
    """The shortest image side (pixels) over ``frames``."""
    return min(min(f.camera.width, f.camera.height) for f in frames)


def fitting_factor(factor: int, frames, min_side: int) -> int:
    """``factor`` halved until the shortest side of ``frames``' images divided by it keeps ``min_side`` pixels
    (``TrainConfig.coarse_to_fine_min_side``; 1 at least): the coarse-to-fine factor small images can take."""
    shortest = shortest_side(frames)
    while factor > 1 and shortest // factor < min_side:
        factor //= 2
    return factor


@dataclass
class StepResult:
    """What one :meth:`Trainer.step` did. ``loss``, ``l1``, ``ssim``, ``psnr`` are those of the training view
    over its valid pixels (``nan`` when not finite); ``skipped`` is True when the NaN guard dropped the update; ``nan_skips`` counts
    the skipped steps so far.

    Those six values stay on the training device until first read (one small device→host copy then, cached), so
    a caller that reads them every few iterations does not add a host sync to every step."""

    iteration: int
    num_gaussians: int
    view: str
    sh_degree: int
    lr_position: float
    seconds: float
    densify: DensifyReport | None = None
    opacity_reset: bool = False
    #: the iteration whose opacity reset ``opacity_reset`` reports: this one, or the held one before it
    opacity_reset_iteration: int | None = None
    eval: EvalResult | None = None
    values: torch.Tensor | None = field(default=None, repr=False)  # (6,) loss, l1, ssim, mse, skipped, nan_skips
    _host: tuple | None = field(default=None, init=False, repr=False)

    def _get(self, i: int) -> float:
        if self._host is None:
            self._host = tuple(self.values.detach().double().tolist())
        return self._host[i]

    loss = property(lambda self: self._get(0))
    l1 = property(lambda self: self._get(1))
    ssim = property(lambda self: self._get(2))
    skipped = property(lambda self: self._get(4) != 0.0)
    nan_skips = property(lambda self: int(self._get(5)))

    @property
    def psnr(self) -> float:
        m = self._get(3)
        return psnr_from_mse(m) if math.isfinite(m) else math.nan


def _train_cameras_sample(cameras: list[Camera], k: int) -> list[Camera]:
    if len(cameras) <= k:
        return cameras
    idx = np.linspace(0, len(cameras) - 1, k).round().astype(int)
    return [cameras[i] for i in idx]


@torch.no_grad()
def random_init_points(cameras: list[Camera], n: int, center, extent: float, *, min_visible: float = 0.5,
                       box=None, generator: torch.Generator | None = None, max_cameras: int = 64,
                       device=None, mode: str = "box", ray_depths: tuple[float, float] = (0.2, 50.0)) -> torch.Tensor:
    """(n, 3) float32 CPU tensor of random points for a dataset without SfM points (Blender layout).

    3DGS draws 100k points uniformly in a fixed cube (±1.3) that happens to fit the NeRF-synthetic objects.
    We draw uniformly in ``box`` (xmin, ymin, zmin, xmax, ymax, zmax), default the cube ``center ± extent``
    (the camera centres' sphere), and keep a point when at least ``min_visible`` of the training cameras
    (up to ``max_cameras`` of them, evenly spaced) see it in front of the camera inside the image: the region
    the cameras look at, whatever the scene's scale. When fewer than ``n`` points pass after a bounded number
    of draws, the rest are plain box samples. The draws come from ``generator`` (CPU) whatever ``device``;
    the visibility test runs on ``device`` (default CPU) — the training GPU makes it a matter of milliseconds.

    ``mode="rays"`` draws the candidates along the rays of random pixels of the (sampled) training cameras instead, at
    depths log-uniform in ``ray_depths`` × ``extent`` (0.2 to 50 extents), with the same visibility test: the region the
    cameras look at also where it lies far outside the box of their centres — a forward-facing capture, whose scene is
    several box radii in front of the cameras (fern: 3–12). ``box`` is then not read (the rest, when too few pass:
    unfiltered ray samples). ValueError for another ``mode`` or depths not 0 < near < far.
    """
    if mode not in ("box", "rays"):
        raise ValueError(f"random_init_points: mode must be 'box' or 'rays', got {mode!r}")
    if not 0 < ray_depths[0] < ray_depths[1]:
        raise ValueError(f"random_init_points: ray_depths must be 0 < near < far, got {ray_depths}")
    dev = torch.device(device) if device is not None else torch.device("cpu")
    if box is None:
        c = np.asarray(center, dtype=np.float64).reshape(3)
        lo, hi = c - extent, c + extent
    else:
        lo, hi = np.asarray(box[:3], dtype=np.float64), np.asarray(box[3:], dtype=np.float64)
    lo_t, span = torch.tensor(lo, dtype=torch.float32), torch.tensor(hi - lo, dtype=torch.float32)
    cams = _train_cameras_sample(list(cameras), max_cameras)
    need = max(1, math.ceil(min_visible * len(cams))) if cams else 0
    if cams:
        vms = torch.tensor(np.stack([c.viewmat for c in cams]), dtype=torch.float32, device=dev)  # (C,4,4)
        intr = torch.tensor([[c.fx, c.fy, c.cx, c.cy, c.width, c.height] for c in cams], dtype=torch.float32,
                            device=dev)  # (C,6)
    def draw(k: int) -> torch.Tensor:
        if mode == "box" or not cams:
            return lo_t + span * torch.rand(k, 3, generator=generator)
        which = torch.randint(0, len(cams), (k,), generator=generator)
        uv = torch.rand(k, 2, generator=generator)
        log_near, log_far = math.log(ray_depths[0] * extent), math.log(ray_depths[1] * extent)
        z = torch.exp(log_near + (log_far - log_near) * torch.rand(k, generator=generator))
        ic = intr.cpu()[which]  # (k, 6): fx fy cx cy w h
        x = (uv[:, 0] * ic[:, 4] - ic[:, 2]) / ic[:, 0] * z
        y = (uv[:, 1] * ic[:, 5] - ic[:, 3]) / ic[:, 1] * z
        vm = vms.cpu()[which]  # world = R^T (p_cam − t)
        pc = torch.stack([x, y, z], -1) - vm[:, :3, 3]
        return torch.einsum("kji,kj->ki", vm[:, :3, :3], pc)

    kept, total = [], 0
    for _ in range(64):
        if total >= n or not cams:
            break
        batch = int(min(max(8 * (n - total), 65536), 2_000_000))
        p = draw(batch)
        count = torch.zeros(batch, dtype=torch.int32, device=dev)
        pd = p.to(dev)
        for i in range(len(cams)):
            pc = pd @ vms[i, :3, :3].T + vms[i, :3, 3]
            z = pc[:, 2]
            zs = z.clamp_min(1e-6)
            fx, fy, cx, cy, w, h = intr[i]
            u = fx * pc[:, 0] / zs + cx
            v = fy * pc[:, 1] / zs + cy
            count += ((z > 1e-2) & (u >= 0) & (u < w) & (v >= 0) & (v < h)).int()
        p = p[(count >= need).cpu()]
        kept.append(p)
        total += p.shape[0]
    pts = torch.cat(kept) if kept else torch.empty(0, 3)
    if pts.shape[0] < n:
        pts = torch.cat([pts, draw(n - pts.shape[0])])
    return pts[:n].contiguous()


def knn_rms_distance(points: torch.Tensor, k: int = 3, min_sq: float = 1e-7) -> torch.Tensor:
    """(N,) ``sqrt(max(mean of the squared distances to the k nearest other points, min_sq))`` — the initial
    scale of the 3DGS code (``distCUDA2`` then ``sqrt``, d² clamped ≥ 1e-7) and of gsplat. scipy's cKDTree in
    float64 (:func:`rigel_core.model.knn_distances`); same dtype and device as ``points``; 1 for a single point."""
    from ..model import knn_distances

    d = knn_distances(points, k)
    if d is None:
        return torch.ones(points.shape[0], dtype=points.dtype, device=points.device)
    sq = np.maximum((d ** 2).mean(-1), min_sq)
    return torch.as_tensor(np.sqrt(sq), dtype=points.dtype, device=points.device)


@torch.no_grad()
def background_init_points(frames, points, n: int, center, extent: float, *, radius: float = 3.0,
                           depth_percentile: float = 95.0, generator: torch.Generator | None = None
                           ) -> tuple[torch.Tensor, torch.Tensor]:
    """``(points (n,3), colours (n,3))`` float32 CPU tensors: background points for a capture whose SfM points
    cover only part of the scene (e.g. Mip-NeRF 360 bonsai: the bonsai and its table, not the room).

    Each point lies on the ray of a random pixel of a random training frame (uniform over frames, then over the
    image), at a depth (camera z) drawn uniformly in *inverse* depth between ``t_near`` and ``t_far``:

    - ``t_near``: the larger of (a) the ``depth_percentile``-th percentile of the depths of the SfM ``points``
      that this camera sees (in front, inside the image; 0 when it sees none) — behind (almost) all the SfM
      structure of that view — and (b) where the ray leaves the *camera sphere*, radius ``extent`` around
      ``center`` (``extent`` = 1.1 × the cameras' largest distance to ``center``, so every camera is inside);
    - ``t_far``: where the ray leaves the sphere of radius ``radius`` × ``extent`` around ``center``; 2 ×
      ``t_near`` when that is not beyond ``t_near`` (SfM points beyond the sphere: e.g. a forward-facing scene
      far from small camera motions).

    (b) matters for 360° captures: a point just behind the object in one view is in front of it, between
    camera and object, in the opposite view. Outside the camera sphere that cannot happen: the segment from any
    camera to any point inside the sphere stays inside it (convexity), so these points never occlude anything
    within the camera sphere from a training camera. Uniform in inverse depth puts as many points per pixel in
    each depth octave — denser close by, where a point covers more pixels. Colour: the pixel's (so a point
    starts with the colour its ray sees). Where the SfM points cover the whole scene, these points start behind
    its surfaces in the view they come from; the densification's pruning and the opacity resets apply to them
    as to every Gaussian.

    ``frames``: objects with ``.camera`` (:class:`~rigel_core.camera.Camera`, OpenCV axes) and ``.image``
    (H, W, 3); ``points``: (M, 3) array-like (M may be 0). Draws come from ``generator`` (CPU).
    Raises ValueError for no frames or ``radius`` ≤ 1."""
    frames = list(frames)
    if not frames:
        raise ValueError("background_init_points: no training frames")
    if not radius > 1.0:
        raise ValueError(f"background_init_points: radius must be > 1 (scene extents), got {radius}")
    c = torch.as_tensor(np.asarray(center, dtype=np.float64).reshape(3))
    big_r = float(radius) * float(extent)
    sfm = torch.as_tensor(np.asarray(points, dtype=np.float64).reshape(-1, 3)) if points is not None \
        else torch.zeros(0, 3, dtype=torch.float64)
    which = torch.randint(0, len(frames), (n,), generator=generator)
    uv01 = torch.rand(n, 2, generator=generator, dtype=torch.float64)
    s = torch.rand(n, generator=generator, dtype=torch.float64)
    out_p = torch.empty(n, 3, dtype=torch.float64)
    out_c = torch.empty(n, 3, dtype=torch.float32)
    for k, f in enumerate(frames):
        sel = torch.nonzero(which == k).flatten()
        if sel.numel() == 0:
            continue
        cam = f.camera
        vm = torch.as_tensor(np.asarray(cam.viewmat, dtype=np.float64))
        rot, trans = vm[:3, :3], vm[:3, 3]
        t_near = 0.0
        if sfm.shape[0]:
            pc = sfm @ rot.T + trans
            z = pc[:, 2]
            zs = z.clamp_min(1e-9)
            u, v = cam.fx * pc[:, 0] / zs + cam.cx, cam.fy * pc[:, 1] / zs + cam.cy
            seen = (z > 0) & (u >= 0) & (u < cam.width) & (v >= 0) & (v < cam.height)
            if bool(seen.any()):
                t_near = float(torch.quantile(z[seen], depth_percentile / 100.0))
        u = uv01[sel, 0] * cam.width
        v = uv01[sel, 1] * cam.height
        d_cam = torch.stack([(u - cam.cx) / cam.fx, (v - cam.cy) / cam.fy, torch.ones_like(u)], 1)  # z = 1
        d = d_cam @ rot  # world direction per unit camera depth (rot is orthonormal: Rᵀ·d_cam)
        o = -(rot.T @ trans)  # camera centre
        # |o + t·d − c|² = r²  →  a t² + 2 b t + q = 0, the positive root (o is inside the sphere)
        oc = o - c
        a = (d * d).sum(1)
        b = d @ oc
        exit_at = lambda r: (-b + torch.sqrt((b * b - a * (float(oc @ oc) - r * r)).clamp_min(0.0))) / a
        t_near = torch.maximum(exit_at(float(extent)), torch.full_like(a, t_near))
        exit_far = exit_at(big_r)
        t_far = torch.where(exit_far > t_near, exit_far, 2.0 * t_near)
        inv = (1.0 / t_near) * (1.0 - s[sel]) + (1.0 / t_far) * s[sel]
        out_p[sel] = o + d * (1.0 / inv)[:, None]
        img = f.image
        iu = u.floor().long().clamp(0, cam.width - 1).to(img.device)
        iv = v.floor().long().clamp(0, cam.height - 1).to(img.device)
        out_c[sel] = img[iv, iu].float().cpu()
    return out_p.float(), out_c


def _has_alpha(frame) -> bool:
    """Whether ``frame`` has an alpha channel: a streamed frame's from its image header (nothing decoded)."""
    if isinstance(frame, StreamedFrame):
        return bool(frame.source.has_alpha[frame.index])
    return getattr(frame, "alpha", None) is not None


def _alpha_below_half(frame) -> torch.Tensor | None:
    """(H, W) bool, ``frame``'s alpha < 0.5, or None without alpha (a streamed frame reads its 8-bit codes)."""
    if isinstance(frame, StreamedFrame):
        return frame.alpha_below(0.5)
    alpha = getattr(frame, "alpha", None)
    return None if alpha is None else alpha < 0.5


def capture_facts(frames, max_frames: int = 64) -> Capture:
    """What the "auto" rules read of the training ``frames`` (:class:`~.config.Capture`): their count, their pixels
    together (each camera's width × height) and the median fraction of an image's pixels whose alpha is < 0.5 (over
    at most ``max_frames`` frames, evenly spaced; a frame without alpha counts 0) — the median, so that a few images
    with a transparent background in a capture of opaque photos do not make it "an object on a background"."""
    frames = list(frames)
    pixels = sum(int(f.camera.width) * int(f.camera.height) for f in frames)
    sample = frames if len(frames) <= max_frames else \
        [frames[i] for i in np.linspace(0, len(frames) - 1, max_frames).round().astype(int)]
    def fraction(f) -> float:
        b = _alpha_below_half(f)
        return float(b.float().mean()) if b is not None else 0.0

    if sum(isinstance(f, StreamedFrame) and f.source.has_alpha[f.index] for f in sample) > 1:
        # streamed frames with alpha are decoded here (then cached for training): on loading threads, as the
        # trainer's stream does — 64 frames of 1080p PNG one after another were ~2-4 s before the first step
        from concurrent.futures import ThreadPoolExecutor

        from ..data.stream import MAX_WORKERS
        with ThreadPoolExecutor(min(MAX_WORKERS, os.cpu_count() or 1), thread_name_prefix="rigel-facts") as pool:
            fr = list(pool.map(fraction, sample))
    else:
        fr = [fraction(f) for f in sample]
    return Capture(n_views=len(frames), pixels=pixels, transparent=float(np.median(fr)) if fr else 0.0)


def sfm_view_coverage(frames, points, cells: int = 8, max_frames: int = 64, max_points: int = 100_000) -> float:
    """How much of the training views the SfM points reach: for each frame, the fraction of a ``cells`` × ``cells``
    grid over its image (cells of W/cells × H/cells px) that holds at least one SfM point projected in front of the
    camera; the median over the frames (a float in [0, 1]; 0 for no points).

    It tells a capture whose SfM covers only the object (Mip-NeRF 360 bonsai: 0.28 — the room starts empty) from
    one covered throughout (LLFF fern 0.98, the phone capture beer 0.78), before training: the former is where
    background points (``init_background_points``) pay (docs/BENCHMARKS.md, "Background points and the lens").
    ``frames``: objects with ``.camera`` (pinhole, OpenCV axes); ``points``: (M, 3) array-like. A large model is
    sampled — at most ``max_frames`` frames, evenly spaced, and ``max_points`` points, every k-th — so the check
    stays well under a second at start-up (1M points × 300 views took 45 s in full on a 2-core box, 0.4 s sampled;
    bonsai: 0.28 from 64 evenly spaced views). Raises ValueError for no frames or ``cells`` < 1."""
    frames = list(frames)
    if not frames:
        raise ValueError("sfm_view_coverage: no frames")
    if cells < 1:
        raise ValueError(f"sfm_view_coverage: cells must be ≥ 1, got {cells}")
    pts = np.asarray(points, dtype=np.float64).reshape(-1, 3) if points is not None else np.zeros((0, 3))
    if pts.shape[0] == 0:
        return 0.0
    if len(frames) > max_frames:
        frames = [frames[i] for i in np.linspace(0, len(frames) - 1, max_frames).round().astype(int)]
    if pts.shape[0] > max_points:
        pts = pts[:: -(-pts.shape[0] // max_points)]
    fractions = []
    for f in frames:
        cam = f.camera
        front = pts @ cam.R[2] + cam.t[2] > 1e-9  # camera z
        uv = cam.project(pts[front])
        u, v = uv[:, 0] * (cells / cam.width), uv[:, 1] * (cells / cam.height)
        inside = (u >= 0) & (u < cells) & (v >= 0) & (v < cells)
        hit = np.zeros((cells, cells), dtype=bool)
        hit[v[inside].astype(np.int64), u[inside].astype(np.int64)] = True
        fractions.append(float(hit.mean()))
    return float(np.median(fractions))


class Trainer:
    """Optimises a :class:`~rigel_core.model.GaussianModel` on a dataset, one iteration per :meth:`step`.

    Args:
        dataset: a ``rigel_core.data.Dataset`` (or anything with ``train``/``test`` lists of frames having
            ``camera``, ``image`` (H,W,3) float in [0,1], ``alpha``, ``name``, optionally ``mask`` (H,W) bool:
            the pixels that count, None = all); ``scene_center``,
            ``scene_extent``, ``points``, ``point_colors``, ``white_bg``).
        config: a :class:`TrainConfig` (default: 3DGS defaults); edited live, read at every step. One whose
            ``strategy``, ``init_background_points``, ``coarse_to_fine`` or ``densify_grad`` is "auto" is copied and
            resolved from the dataset (:meth:`_resolve_auto`): :attr:`config` is then the copy in use, holding no
            "auto".
        model: start from this model (its SH are padded/truncated to ``config.sh_degree``); default: SfM
            points when the dataset has them, else :func:`random_init_points`.
        device: where to train (default: CUDA when available with built kernels, else CPU).

    Raises: ValueError for an empty training set, images or masks that do not match their camera, or a bad
    config.
    """

    def __init__(self, dataset, config: TrainConfig | None = None, *, model: GaussianModel | None = None,
                 device=None):
        cfg = config if config is not None else TrainConfig()
        cfg.validate()
        if device is None:
            from .. import cuda_available

            device = "cuda" if cuda_available() else "cpu"
        self.device = torch.device(device)
        if cfg.densify_grad == "absgrad" and self.device.type != "cuda":  # ("auto" becomes "grad" on the CPU)
            raise ValueError("TrainConfig.densify_grad='absgrad' needs the CUDA kernels (their raster backward sums "
                             "the per-pixel |gradient|); the CPU reference does not: use densify_grad='grad' there")
        self.dataset = dataset
        self.train_frames = list(dataset.train)
        self.test_frames = list(dataset.test)
        if not self.train_frames:
            raise ValueError("Trainer: the dataset has no training frames")
        for f in self.train_frames + self.test_frames:
            h, w = f.camera.height, f.camera.width
            if not isinstance(f, StreamedFrame) and tuple(f.image.shape) != (h, w, 3):  # (streamed: by construction)
                raise ValueError(f"Trainer: frame {f.name!r} image has shape {tuple(f.image.shape)}, "
                                 f"its camera expects ({h}, {w}, 3)")
        self.config = cfg = self._resolve_auto(cfg, model)
        src = getattr(dataset, "path", "") or "the dataset"

        # every view's mask read once, streamed ones on the loading threads (with alpha_as_mask each is a decode;
        # the first error in the views' order is raised): what it says is kept for the run (view_mask_facts)
        n_train, every = len(self.train_frames), self.train_frames + self.test_frames
        self._known_masks: dict[int, tuple] = {}
        facts = self.view_mask_facts(every)
        #: id(frame) -> (frame, its MaskFacts) of the dataset's views at the start (each frame held: none else takes
        #: its id)
        self._known_masks = {id(f): (f, m) for f, m in zip(every, facts)}
        blind = [m.blind for m in facts]
        if all(blind[:n_train]):
            raise ValueError(f"{src}: every pixel of every training image is masked (masks/, mask_path, alpha or a "
                             "lens that covers none of the image): nothing to train on")
        def without_blind(frames: list, blind: list, what: str) -> list:
            """``frames`` without those with no valid pixel (``blind``), naming them in one warning: a training view
            has nothing to learn from (its steps would report loss λ and PSNR inf), a held-out view has no PSNR."""
            if not any(blind):
                return frames
            names = [f.name for f, b in zip(frames, blind) if b]
            warnings.warn(f"{src}: {len(names)} {what}: " + ", ".join(names[:5]) + (" …" if len(names) > 5 else ""),
                          stacklevel=3)
            return [f for f, b in zip(frames, blind) if not b]

        self.train_frames = without_blind(self.train_frames, blind[:n_train],
                                          "training view(s) have every pixel masked and are left out of training")
        self.test_frames = without_blind(self.test_frames, blind[n_train:],
                                         "held-out view(s) have every pixel masked and are not evaluated")
        self.extent = float(dataset.scene_extent) if dataset.scene_extent and dataset.scene_extent > 0 else 1.0
        self.white_bg = bool(getattr(dataset, "white_bg", False))
        self.background = torch.full((3,), 1.0 if self.white_bg else 0.0, device=self.device)
        # the views as trained: sizes that differ by a few pixels padded to one, with masked margins
        # (common_size_frames; self.train_frames becomes this list once the initial model is made from the loaded
        # frames, whose pixels the background initialisation samples)
        views = common_size_frames(self.train_frames)
        #: per training frame: its image (H, W, 3) float32 and its mask as a bool tensor on the device, or None
        #: (every pixel counts; all None or none: :meth:`_uniform_masks`) — lists, or for streamed frames the
        #: columns of a :class:`~rigel_core.data.stream.ViewStream` that loads them ahead (:meth:`_view_pixels`)
        self._train_images, self._train_masks = self._view_pixels(views)
        #: the full-resolution training views (frames, images, masks): kept for the whole run (the coarse-to-fine
        #: levels are made from them, and the final phase trains on them)
        self._full_views = (views, self._train_images, self._train_masks)
        self.train_downscale = 1  # the factor the current train_frames / _train_images / _train_masks have
        #: coarse-to-fine factors asked → used when a mask made the level smaller (:meth:`_use_downscale`)
        self._coarse_used: dict[int, int] = {}
        #: the finest coarse-to-fine factor the schedule has reached: a run never goes back to a coarser one, also
        #: when ``iterations`` grows (``--resume --iters``, the viewer extending a run: the schedule's length
        #: min(coarse_to_fine_iters, iterations × coarse_to_fine_share) grows with it); a resumed run starts from
        #: the factor its own schedule had reached (rigel_core.checkpoint.load_trainer)
        self.coarse_floor = int(cfg.coarse_to_fine)
        if self.coarse_note and self.coarse_floor > 1:  # say what this run will actually do
            start = fitting_factor(self.coarse_floor, views, cfg.coarse_to_fine_min_side)
            if coarse_to_fine_span(cfg) == 0:
                self.coarse_note += " (this run is too short for it: full resolution throughout)"
            elif start < self.coarse_floor:
                where = "trains at full resolution" if start == 1 else f"starts at 1/{start}"
                self.coarse_note += (f" (this run {where}: the images are {shortest_side(views)} px on their shorter "
                                     f"side, and a level keeps at least {cfg.coarse_to_fine_min_side} px: "
                                     "coarse_to_fine_min_side)")
        #: CPU generator for every random choice (view order, split offsets, init, random background):
        #: saved in checkpoints so a resumed run continues bit for bit.
        self.generator = torch.Generator().manual_seed(int(cfg.seed))
        #: what the run starts from, for the start line: "the SfM points", "N SfM points + M background points",
        #: "random along the training pixels' rays" / "random in the cameras' box", or "a given model"
        self.init_source = "a given model" if model is not None else self._init_source()
        if model is None:
            model = self.initial_model()
        self.train_frames = views
        model = model.to(device=self.device, dtype=torch.float32)
        if model.appearance is None and model.sh_degree != cfg.sh_degree:
            model = model.with_sh_degree(cfg.sh_degree)
        if cfg.appearance == "mlp" and model.appearance is None:
            from ..appearance import to_mlp

            model, _ = to_mlp(model, cfg.mlp_latent_dim, cfg.mlp_hidden_dim, generator=self.generator)
        model.active_sh_degree = 0
        self.model = model
        self._update_filter_3d()  # anti-aliased mode (rigel_core/mip.py): the 3D filter of the training cameras
        self.optimizer = make_optimizer(model, cfg, self.extent, appearance_groups(model, cfg))
        #: per-training-image colour corrections (:mod:`.exposure`), made when ``config.exposure`` is first on
        self.exposure: Exposure | None = Exposure.for_trainer(self) if cfg.exposure else None
        #: per-training-camera pose corrections (:mod:`.pose`), made when ``config.pose_opt`` is first on
        self.pose: PoseCorrection | None = PoseCorrection.for_trainer(self) if cfg.pose_opt else None
        #: per-training-image bilateral grids (:mod:`.bilagrid`), made when ``config.appearance_grid`` is first on
        self.appearance_grid: BilateralGrid | None = \
            BilateralGrid.for_trainer(self) if cfg.appearance_grid else None
        self.stats = DensifyStats(model.num_gaussians, self.device)
        self.iteration = 0
        self._nan_skips = torch.zeros((), dtype=torch.float64, device=self.device)
        #: Gaussians made transparent because a training or held-out view needed more binning entries than the limit
        #: (:meth:`_retire_widest`), over the run so far in this process
        self.retired_wide = 0
        self.eval_history: list[EvalResult] = []
        self.last_densify: DensifyReport | None = None
        #: the last iteration when it held back its scheduled densification / opacity reset / MCMC relocation
        #: (:meth:`_holds`: the run's last one, nothing would train the result; an evaluation's, which then sees the
        #: model as trained): applied first thing at the next step (for the last one, if the run is extended: a
        #: larger ``iterations``, live or by --resume), so the run equals one that never held. Saved in checkpoints.
        self.deferred_schedule: int | None = None
        #: the config in force when the schedule was held: the held work runs under it (only ``iterations`` follows
        #: the run), so settings changed in between (the viewer's sliders, ``--resume --set``) act from the next
        #: scheduled iteration on, as they would without the hold. Saved in checkpoints.
        self._deferred_config: TrainConfig | None = None
        #: more iterations to hold the schedule at (an outside evaluation's, e.g. bench/real.py's checkpoints)
        self.schedule_holds: set[int] = set()
        self._deferred_ok: torch.Tensor | None = None  # MCMC: that step's NaN-guard verdict, for its deferred noise
        self.lock = threading.Lock()
        self._view_stack: list[int] = []
        #: views to train again first: their graph-step replay overflowed its binning capacity (graph_step.py)
        self._redo_views: list[int] = []
        #: the CUDA-graph step (:mod:`.graph_step`), made at the first step that can use it
        self.graph_step: GraphStep | None = None
        #: the process group of a data-parallel run (:class:`.distributed.Comm`), None for one process
        self.comm = None

    # ---- initialisation -------------------------------------------------------------------------------
    def _resolve_auto(self, cfg: TrainConfig, model: GaussianModel | None) -> TrainConfig:
        """The config this run uses: ``cfg`` itself when nothing in it is "auto", else a resolved copy (the caller's
        config may start other runs, on other data). ``init_background_points = "auto"`` and ``strategy = "auto"``
        are decided together, from the dataset alone (:func:`~.config.resolve_init_background`, then
        :func:`~.config.resolve_strategy`): the same with or without a given ``model`` (a run started from another
        Trainer's initial model, bench/real.py, resolves as that Trainer did), so the resolved config — what
        metrics.json and the checkpoint record, never "auto" — re-runs the same way. ``coarse_to_fine = "auto"``
        follows from the SfM points alone (:func:`~.config.resolve_coarse_to_fine`: 4 without, 1 with);
        ``densify_grad = "auto"`` from the SfM points, the resolved strategy and the device
        (:func:`~.config.resolve_densify_grad`). Sets :attr:`sfm_coverage`, :attr:`init_note` (only when this
        Trainer builds the initial model), :attr:`strategy_note`, :attr:`coarse_note` and :attr:`densify_grad_note`.
        ``schedule_scale`` is applied first (:func:`~.config.resolve_schedule_scale`, :attr:`schedule_note`): the
        coarse levels' span the coarse note names is the scaled one.

        The SfM coverage (:func:`sfm_view_coverage`, sampled: well under a second) is measured once, from the
        loaded training frames' cameras and the SfM points (the frames :meth:`initial_model` samples, before
        :func:`common_size_frames` pads them), and only when something reads it: an "auto" count, or an explicit
        0 whose initialisation may deserve the suggestion."""
        pts = getattr(self.dataset, "points", None)
        has_sfm = pts is not None and len(pts) > 0
        auto_bg = cfg.init_background_points == "auto"
        if auto_bg or strategy_unresolved(cfg) or "auto" in (cfg.coarse_to_fine, cfg.densify_grad, cfg.init_points,
                                                            cfg.init_mode) \
                or (not has_sfm and cfg.init_background_points != 0) or cfg.schedule_scale != 1.0:
            cfg = dataclasses.replace(cfg)
        #: the step counts ``schedule_scale`` changed (one line for the log), or None (1: nothing to change)
        self.schedule_note = resolve_schedule_scale(cfg)
        #: what the "auto" rules read of the training views (:func:`capture_facts`: views, pixels, transparency)
        self.capture = capture_facts(self.train_frames)
        init_auto = cfg.init_points == "auto"
        resolve_init_points(cfg, self.capture)
        resolve_init_mode(cfg, self.capture)
        #: ``sfm_view_coverage`` of the training views (median fraction of 8x8 cells the SfM points reach), or None
        #: when not measured (no SfM points, or an explicit count that needs no note)
        self.sfm_coverage: float | None = None
        if has_sfm and (auto_bg or (cfg.init_background_points == 0 and model is None)):
            self.sfm_coverage = sfm_view_coverage(self.train_frames, pts)
        note = resolve_init_background(cfg, self.sfm_coverage, has_sfm)
        if auto_bg and cfg.init_background_points > 0 and self.device.type != "cuda" and note:
            note += ("; on the CPU backend these far, wide splats make each step slower (~1.5x on bonsai; "
                     "--init-background 0 leaves them out)")
        #: a line for the log about the initialisation (what "auto" added and why, the suggestion to add
        #: background points when the SfM points leave most of the views empty, or a count that could not be
        #: used), or None
        self.init_note: str | None = note if model is None else None
        #: a line for the log when an explicit ``init_points`` goes unused: the SfM points start the run
        #: (``--init-points N`` on a capture with them would otherwise vanish without a word), or None
        self.init_points_note: str | None = (
            f"init_points={cfg.init_points:,} not used: the dataset's {len(pts):,} SfM points start the run (random "
            "points start only a dataset without them)" if has_sfm and not init_auto and model is None else None)
        #: what ``strategy = "auto"`` became and why (one line for the log), None when it was explicit
        # the Gaussians the run starts from, which the budget never cuts: a given model's, else the SfM points and the
        # background points the initial model adds (a tiny capture's budget of 10,000 trimmed fern's 10,091 points)
        n_start = model.num_gaussians if model is not None else \
            (len(pts) + int(cfg.init_background_points) if has_sfm else 0)
        self.strategy_note = resolve_strategy(cfg, has_sfm, n_start, init_auto=init_auto and model is None,
                                              n_background=int(cfg.init_background_points) if has_sfm and model is None
                                              else 0,
                                              auto_background=auto_bg and cfg.init_background_points > 0,
                                              coverage=self.sfm_coverage, capture=self.capture)
        #: what ``coarse_to_fine = "auto"`` became and why, or the schedule a factor set for a new run follows (one
        #: line for the log); None for an explicit 1 or a resumed run
        self.coarse_note = resolve_coarse_to_fine(cfg, has_sfm)
        if self.coarse_note is None and model is None and int(cfg.coarse_to_fine) > 1:   # set: said as well
            self.coarse_note = f"coarse_to_fine {cfg.coarse_to_fine} (set): {coarse_schedule_words(cfg)}"
        #: what ``densify_grad = "auto"`` became and why (one line for the log), None when it was explicit or
        #: does not matter (the MCMC budget reads no gradient statistic)
        self.densify_grad_note = resolve_densify_grad(cfg, has_sfm, self.device.type == "cuda")
        return cfg

    def start_line(self) -> str:
        """The log's first line of a session (rigel-train and the viewer): where it starts, the Gaussians, the device,
        the iterations, and the strategy in use with its budget — given, resolved by "auto" (whose note follows) or
        restored from a checkpoint."""
        cfg = self.config
        budget = self.budget_words()
        learnt = [c.title for c in correction_classes() if getattr(cfg, c.config_field)]
        its = f"{cfg.iterations:,} iteration{'' if cfg.iterations == 1 else 's'}"
        return (f"{self.start_words()}, device {self.device}, {its}, strategy {cfg.strategy}"
                + (f", {budget}" if budget else "") + (f"; learning {', '.join(learnt)}" if learnt else ""))

    def start_words(self) -> str:
        """Where the session starts and from how many Gaussians, and (a new run) what they came from: "start: 45,649
        Gaussians (25,649 SfM points + 20,000 background points)", "resumed at iteration 7000: 1,000,000 Gaussians"
        (:meth:`start_line`'s head; the viewer's Training panel)."""
        where = f"resumed at iteration {self.iteration}" if self.iteration else "start"
        init = f" ({self.init_source})" if not self.iteration and self.init_source else ""
        return f"{where}: {self.model.num_gaussians:,} Gaussians{init}"

    def budget_words(self) -> str:
        """The strategy's bound on the Gaussians in words: MCMC's budget ("a budget of N Gaussians"), 3DGS's cap ("at
        most N Gaussians", with what a start above it means), or "" without one (:meth:`start_line`; the viewer's
        Training panel)."""
        cfg = self.config
        cap = cfg.max_gaussians
        if cap is None:
            return ""
        if cfg.strategy == "mcmc":
            return f"a budget of {cap:,} Gaussians"
        over = self.model.num_gaussians > cap
        return f"at most {cap:,} Gaussians" + (" (the start is above it: densification adds none until pruning "
                                                 "brings it below)" if over else "")

    def coarse_summary(self) -> str:
        """Coarse-to-fine for this session in a few words (the viewer's Training panel): "off", "off (the run is too
        short for it)", the resolution the session starts at and the iteration from which it is full, or "done"."""
        cfg = self.config
        span = coarse_to_fine_span(cfg)
        if int(cfg.coarse_to_fine) <= 1:
            return "coarse-to-fine: off"
        if span == 0:
            return "coarse-to-fine: off (the run is too short for it)"
        now = fitting_factor(min(self.coarse_floor, training_downscale(cfg, self.iteration + 1)), self._full_views[0],
                             cfg.coarse_to_fine_min_side)
        if now <= 1 and not self.iteration:   # images too small for a coarser level (coarse_note says so)
            return "coarse-to-fine: off (the images are too small for it)"
        if now <= 1:                          # a resumed run past its coarse levels
            return "coarse-to-fine: done, full resolution"
        return f"coarse-to-fine: from 1/{now} resolution, full from iteration {span + 1:,}"

    @property
    def notes(self) -> list[str]:
        """The lines that say what "auto" became for this run, in the order they follow from each other (the
        initialisation, then the strategy it may decide, then coarse-to-fine and the densification statistic); what
        rigel-train and the viewer log at the start."""
        return [n for n in (self.schedule_note, self.init_note, self.init_points_note, self.strategy_note,
                            self.coarse_note, self.densify_grad_note) if n]

    def _init_source(self) -> str:
        """What :meth:`initial_model` starts from, in words (:attr:`init_source`)."""
        cfg = self.config
        pts = getattr(self.dataset, "points", None)
        if pts is not None and len(pts) > 0:
            bg = int(cfg.init_background_points)
            return f"{len(pts):,} SfM points + {bg:,} background points" if bg > 0 else "the SfM points"
        where = ("in the given box" if cfg.init_box is not None else "in the cameras' box") if cfg.init_mode == "box" \
            else "along the training pixels' rays"
        return f"random {where}"

    def initial_model(self) -> GaussianModel:
        """SfM points (with their colours) when the dataset has them — plus ``init_background_points``
        background points (:func:`background_init_points`) when that is > 0 — else ``init_points`` random points;
        isotropic scales = mean distance to the 3 nearest neighbours (root mean square with ``init_scale_rms``,
        :func:`knn_rms_distance`), opacity ``init_opacity``, identity
        rotations, SH degree ``config.sh_degree`` with zero higher-order coefficients (3DGS
        ``create_from_pcd``)."""
        cfg = self.config
        pts = getattr(self.dataset, "points", None)
        cols = getattr(self.dataset, "point_colors", None)
        if pts is not None and len(pts) > 0:
            pts = torch.as_tensor(np.asarray(pts), dtype=torch.float32)
            if cols is not None:
                cols = torch.as_tensor(np.asarray(cols), dtype=torch.float32)
                if cols.numel() and cols.max() > 1.0:  # 8-bit colours
                    cols = cols / 255.0
            if cfg.init_background_points > 0:
                bp, bc = background_init_points(self.train_frames, pts, cfg.init_background_points,
                                                self.dataset.scene_center, self.extent,
                                                radius=cfg.init_background_radius, generator=self.generator)
                if cols is None:
                    cols = torch.full((pts.shape[0], 3), 0.5)
                pts, cols = torch.cat([pts, bp]), torch.cat([cols, bc])
        else:
            pts = random_init_points([f.camera for f in self.train_frames], cfg.init_points,
                                     self.dataset.scene_center, self.extent, min_visible=cfg.init_min_visible,
                                     box=cfg.init_box, generator=self.generator, device=self.device,
                                     mode=cfg.init_mode)
            cols = None
        scale = knn_rms_distance(pts) if cfg.init_scale_rms else None  # None: from_points' mean distance
        return GaussianModel.from_points(pts, cols, sh_degree=cfg.sh_degree, scale=scale, opacity=cfg.init_opacity)

    # ---- one iteration --------------------------------------------------------------------------------
    def _next_view(self) -> int:
        if self._redo_views:
            idx = self._redo_views.pop(0)
        else:
            if not self._view_stack:
                self._view_stack = torch.randperm(len(self.train_frames), generator=self.generator).tolist()
            idx = self._view_stack.pop()
        prefetch = getattr(self._train_images, "prefetch", None)
        if prefetch is not None:  # streamed views: load the next ones of this epoch ahead (no random draw)
            prefetch([idx] + self._redo_views + self._view_stack[::-1])
        return idx

    def view_mask_facts(self, frames) -> list[MaskFacts]:
        """Per frame of ``frames``, :class:`~rigel_core.data.frames.MaskFacts` of its mask (its shape or None, the
        pixels that do not count; a float mask keeps where > 0.5, :func:`~rigel_core.data.frames.frame_mask`): for
        the dataset's views as the Trainer was made (training and held-out, also those left out for having no valid
        pixel), what their one read at the start found; for any other frame (a padded or coarse view, another
        dataset's), its mask read now, streamed frames on the loading threads
        (:func:`~rigel_core.data.stream.map_frames`: the first error in ``frames``' order is raised) and not kept.
        A frame is known by its identity: a view's mask is not expected to change during a run."""
        frames, known = list(frames), self._known_masks
        new = list({id(f): f for f in frames if id(f) not in known}.values())
        read = dict(zip(map(id, new), map_frames(mask_facts, new)))
        return [known[id(f)][1] if id(f) in known else read[id(f)] for f in frames]

    def _view_pixels(self, frames, facts: list[MaskFacts] | None = None) -> tuple:
        """``(images, masks)`` of training views ``frames``: lists of device tensors (image float32, mask bool or
        None: :meth:`_device_mask`, :meth:`_uniform_masks`) — or, for streamed frames, the ``images`` / ``masks``
        columns of a :class:`~rigel_core.data.stream.ViewStream` giving the same tensors, loaded ahead of their step,
        a few at a time on the device (which views have a mask: ``facts``, the frames' :meth:`view_mask_facts`
        when not given). Raises ValueError for a mask of another size than its camera (the first in order)."""
        if frames and all(isinstance(f, StreamedFrame) for f in frames):
            facts = self.view_mask_facts(frames) if facts is None else facts
            for f, m in zip(frames, facts):
                if m.shape is not None:
                    self._check_mask_shape(f, m.shape)
            flags = [m.masked for m in facts]
            stream = ViewStream(frames, self.device, flags, any(flags) and not all(flags))
            return stream.images, stream.masks
        images = [f.image.to(self.device, torch.float32) for f in frames]
        return images, self._uniform_masks(frames, [self._device_mask(f) for f in frames])

    def _release_views(self) -> None:
        """Drop the device copies of the current coarse level's streamed views (the full-resolution ones are kept
        as their own stream's few)."""
        column = self._train_images
        if isinstance(getattr(column, "stream", None), ViewStream) and column is not self._full_views[1]:
            column.stream.close()

    def _device_mask(self, frame) -> torch.Tensor | None:
        """``frame.mask`` as a bool tensor on the training device, or None when absent (or all valid)."""
        m = frame_mask(frame)
        if m is None:
            return None
        self._check_mask_shape(frame, tuple(m.shape))
        m = m.to(self.device)
        return None if bool(m.all()) else m

    @staticmethod
    def _check_mask_shape(frame, shape: tuple) -> None:
        """ValueError naming ``frame`` when its mask's ``shape`` is not its camera's (H, W)."""
        h, w = frame.camera.height, frame.camera.width
        if tuple(shape) != (h, w):
            raise ValueError(f"Trainer: frame {frame.name!r} mask has shape {tuple(shape)}, its camera expects "
                             f"({h}, {w})")

    def _uniform_masks(self, frames, masks: list) -> list:
        """``masks`` (per frame: a bool tensor or None) with every None replaced by an all-True mask (one shared,
        read-only tensor per image size) when some frames have a mask and others not — a distorted capture whose
        lens leaves some frames fully covered (beer: 65 of 71 masked). Every view then takes the same (masked)
        loss, equal to the unmasked one up to rounding, so the CUDA-graph step keeps one graph per image size
        instead of two and re-captures half as often. Unchanged when all or none have a mask."""
        if all(m is None for m in masks) or all(m is not None for m in masks):
            return masks
        full: dict[tuple, torch.Tensor] = {}
        out = []
        for f, m in zip(frames, masks):
            if m is None:
                size = (f.camera.height, f.camera.width)
                if size not in full:
                    full[size] = torch.ones(size, dtype=torch.bool, device=self.device)
                m = full[size]
            out.append(m)
        return out

    def compute_loss(self, pred: torch.Tensor, gt: torch.Tensor, mask: torch.Tensor | None = None):
        """``(loss, l1, ssim)`` 0-d tensors: loss = (1 − λ)·L1 + λ·(1 − SSIM), λ = ``lambda_dssim``.

        ``mask`` (H, W) bool (True = counts), or None for every pixel: L1 and SSIM are then means over the valid
        pixels of the masked images (:mod:`.losses`), so a masked pixel of ``pred`` or ``gt`` has exactly zero
        effect on the loss and its gradient. (:func:`.losses.loss_terms`, which also gives the MSE.)"""
        return self.loss_terms(pred, gt, mask)[:3]

    def loss_terms(self, pred: torch.Tensor, gt: torch.Tensor, mask: torch.Tensor | None = None):
        """``(loss, l1, ssim, mse)``: :meth:`compute_loss` and the MSE of the same pixels (detached), by
        :func:`.losses.loss_terms` (on CUDA the fused kernels: two launches). The eager and the graph step's loss."""
        return loss_terms(pred, gt, mask, lambda_dssim=self.config.lambda_dssim, fp32=self.config.loss_float32)

    def _all_finite(self, loss: torch.Tensor, g2d: torch.Tensor | None) -> torch.Tensor:
        """0-d bool tensor on the device: the loss, every parameter gradient and the means2D gradient are finite.
        (A norm is finite exactly when every element is, barring overflow of huge gradients, which counts as
        non-finite too.) No host sync."""
        grads = [p.grad for g in self.optimizer.param_groups for p in g["params"] if p.grad is not None]
        if g2d is not None:
            grads.append(g2d)
        for c in self.corrections:
            grads += c.grads()
        total = loss.detach().float().reshape(())
        if grads:
            total = total + torch.stack([n.float() for n in torch._foreach_norm(grads)]).sum()
        return torch.isfinite(total)

    @property
    def nan_skips(self) -> int:
        """Steps the NaN guard skipped so far (reading it waits for the device)."""
        return int(self._nan_skips.item())

    @nan_skips.setter
    def nan_skips(self, value: int) -> None:
        self._nan_skips.fill_(float(value))

    def _apply_exposure(self, image: torch.Tensor, idx: int, it: int) -> torch.Tensor:
        """The render ``image`` of training view ``idx`` through its learnt colour correction when
        ``config.exposure`` is on (the corrections are made at the first such step, and their lr set for
        iteration ``it``); ``image`` itself otherwise."""
        cfg = self.config
        if not cfg.exposure:
            return image
        if self.exposure is None:
            self.exposure = Exposure.for_trainer(self)
        self.exposure.set_lr(exposure_lr(cfg, it))
        return self.exposure.apply(image, idx)

    @property
    def corrections(self) -> list:
        """The per-training-image corrections this run has (:class:`.per_image.PerImageParam`: exposure, poses), in
        the order their Adam steps."""
        return [c for c in (getattr(self, cls.trainer_attr) for cls in correction_classes()) if c is not None]

    def _apply_grid(self, image: torch.Tensor, idx: int, it: int):
        """``(image, None)`` when ``config.appearance_grid`` is off; else the render ``image`` of training view ``idx``
        through its bilateral grid and the grids' total-variation term (:mod:`.bilagrid`; the grids are made at the
        first such step, and their lr set for ``it``)."""
        cfg = self.config
        if not cfg.appearance_grid:
            return image, None
        if self.appearance_grid is None:
            self.appearance_grid = BilateralGrid.for_trainer(self)
        self.appearance_grid.set_lr(grid_lr(cfg, it))
        tv = self.appearance_grid.tv() * cfg.appearance_grid_tv if cfg.appearance_grid_tv > 0 else None
        return self.appearance_grid.apply(image, idx), tv

    def _step_camera(self, camera, idx: int, it: int):
        """The camera training view ``idx`` renders from at iteration ``it``: through its learnt pose correction
        when ``config.pose_opt`` is on from ``pose_opt_from`` (the corrections are made at the first such step, and
        their lr set for ``it``); ``camera`` itself otherwise."""
        cfg = self.config
        if not cfg.pose_opt or it < cfg.pose_opt_from:
            return camera
        if self.pose is None:
            self.pose = PoseCorrection.for_trainer(self)
        self.pose.set_lr(log_linear_lr(cfg.pose_opt_lr, cfg.pose_opt_lr_final, it, cfg.iterations))
        for g in self.pose.optimizer.param_groups:  # the viewer may change the regulariser live
            g["weight_decay"] = float(cfg.pose_opt_reg)
        return self.pose.camera(camera, idx)

    def refined_cameras(self) -> list:
        """The training views' cameras as refined by the pose corrections (full resolution; the given cameras when
        the run has none)."""
        cams = [f.camera for f in self._full_views[0]]
        return cams if self.pose is None else self.pose.cameras(cams)

    def refined_poses_json(self) -> dict:
        """The refined training poses as a nerfstudio ``transforms.json`` (:func:`.pose.transforms_json`), each
        frame's given pose beside its refined one."""
        from .pose import transforms_json

        frames = self._full_views[0]
        return transforms_json(frames, self.refined_cameras(), [f.camera for f in frames])

    def _batch_views(self, batch: int, world: int, rank: int) -> list:
        """This process's ``[(view index, background or None), …]`` of the step: the global batch of
        ``batch·world`` views is drawn from the shared permutation (and, with ``random_background``, a colour
        drawn per view that has alpha) identically on every rank; rank ``r`` keeps positions ``r·batch …``."""
        cfg = self.config
        stream = getattr(self._train_images, "stream", None)
        if stream is not None:  # streamed views bring their alpha for the re-composite (_step_view) while it is on
            stream.with_alpha = bool(cfg.random_background)
        picked = []
        for j in range(batch * world):
            idx = self._next_view()
            bg = None
            if cfg.random_background and _has_alpha(self.train_frames[idx]):
                bg = torch.rand(3, generator=self.generator)
            picked.append((idx, bg))
        return picked[rank * batch:(rank + 1) * batch]

    def _step_view(self, idx: int, bg_host=None) -> StepView:
        """Training view ``idx`` as the step body takes it (:class:`.step.StepView`); with ``bg_host`` (a random
        background colour, (3,) CPU) its target re-composited onto that colour."""
        frame, gt = self.train_frames[idx], self._train_images[idx]
        bg = self.background
        if bg_host is not None:
            bg = host_to_device(bg_host, self.device)
            stream = getattr(self._train_images, "stream", None)
            a = None if stream is None else stream.alpha(idx)   # loaded with the view (not decoded again)
            if a is None:   # preloaded, or loaded before random backgrounds were turned on
                a = frame.alpha
                a = None if a is None else a.to(self.device, torch.float32)
            if a is not None:   # (None: a file rewritten without alpha since its header was read)
                gt = gt + (1.0 - a[..., None]) * (bg - self.background)  # re-composite onto the random colour
        return StepView(frame.camera, gt, self._train_masks[idx], bg, idx)

    def _step_context(self, it: int, *, host_work: bool = True, lr_means=None) -> StepContext:
        """The :class:`.step.StepContext` of iteration ``it`` under the current config: its strategy, the position
        learning rate the optimizer holds (``lr_means``: the graph runner's device scalar instead), whether the
        statistics are gathered; ``host_work`` False for the graph runner (the noise generator is then seeded before
        the replay, not inside the step)."""
        strategy = self.strategy
        if lr_means is None:
            lr_means = optimizer_group(self.optimizer, "means3D")["lr"]
        return StepContext(it, strategy, lr_means, strategy.collects_stats(self.config, it), host_work,
                           lambda: strategy.noise(self, seed=host_work))

    @property
    def strategy(self) -> Strategy:
        """The :class:`.strategy.Strategy` of ``config.strategy`` (read at every step, as the rest of the config)."""
        return strategy_for(self.config.strategy)

    def _zero_grad(self) -> None:
        """Drop every gradient (the step body's callers do, after it)."""
        self.optimizer.zero_grad(set_to_none=True)
        for c in self.corrections:
            c.zero_grad()

    def step(self) -> StepResult:
        """Run one training iteration (module docstring) and return its :class:`StepResult`.

        ``config.batch_size`` views per process (:mod:`.distributed`: with ``self.comm`` set, every rank renders
        its part of the global batch and one all-reduce averages the gradients); the StepResult's loss terms
        are the means over this process's views. The step's device work is :func:`.step.train_step`, here called
        directly, from the graph runner (:mod:`.graph_step`) replayed."""
        t0 = time.perf_counter()
        cfg, model, comm = self.config, self.model, self.comm
        held = None  # (iteration, report, reset) of the schedule an earlier iteration held back, run now
        if self.deferred_schedule is not None and cfg.iterations > self.deferred_schedule:
            held = self._run_deferred_schedule()
        it = self.iteration + 1
        world, rank = (comm.world_size, comm.rank) if comm is not None else (1, 0)
        lr_factor, betas = self._batch_scaling()
        lrs = group_lrs(cfg, it, self.extent)
        set_learning_rates(self.optimizer, {k: v * lr_factor for k, v in lrs.items()} if lr_factor != 1.0 else lrs,
                           cfg.adam_eps)
        for g in self.optimizer.param_groups:
            g["betas"] = betas
        model.active_sh_degree = min(model.sh_degree, it // max(1, cfg.sh_degree_interval))
        self.coarse_floor = self._uncrowded(min(self.coarse_floor, training_downscale(cfg, it)))
        self._use_downscale(self.coarse_floor)

        if it > 1 and self._graph_runner_usable():  # step 1 is eager: it makes the optimizer state
            res = self._graph_step(it, lrs, t0)
            if res is not None:
                return self._with_held(res, held)
        views = [self._step_view(idx, bg) for idx, bg in self._batch_views(int(cfg.batch_size), world, rank)]
        ctx = self._step_context(it)
        result: list = []

        def schedule(ok):  # under the lock, after the strategy's device work
            result.extend(ctx.strategy.host_schedule(self, ctx, ok))
            if result[0] is not None or it % FILTER_3D_INTERVAL == 0:
                self._update_filter_3d()

        def again():  # after an overflow (raised in a forward pass): nothing was updated, only gradients exist
            nonlocal ctx
            self._zero_grad()
            ctx = self._step_context(it)  # `schedule` and the next try read this one

        # each view of a batch may need its own repair
        outcome = self._within_entry_limit(lambda: train_step(self, views, ctx, lock=self.lock, after_update=schedule),
                                           OVERFLOW_RETRIES + len(views) - 1, it, before_retry=again)
        report, reset = result
        if self.graph_step is None and graph_step_unsupported(self) is None:
            self.graph_step = GraphStep(self)
        if self.graph_step is not None:  # sizes the graph's binning capacity for this image size
            for v in outcome.views:
                cam = v["view"].camera
                self.graph_step.record_entries((cam.width, cam.height), v["out"].n_entries)
        self._zero_grad()
        self.iteration = it
        res = StepResult(it, model.num_gaussians, self.train_frames[views[0].index].name, model.active_sh_degree,
                         lrs["means3D"] * lr_factor, 0.0, report, reset, values=outcome.values)
        if self._evaluates(it) and (comm is None or comm.is_main):
            res.eval = self.evaluate()
        if comm is not None:
            comm.maybe_check(self)
        res.seconds = time.perf_counter() - t0
        return self._with_held(res, held)

    def _within_entry_limit(self, attempt, retries: int, it: int, *, held_out: bool = False, before_retry=None):
        """``attempt()``, taken again up to ``retries`` times after a :class:`BinningOverflow`, each time once
        :meth:`_retire_widest` has repaired the model (and ``before_retry()`` has run); the last try's error stands,
        and with ``comm`` the first's (the ranks must keep one model: no rank repairs it alone)."""
        for _ in range(retries):
            try:
                return attempt()
            except BinningOverflow as e:
                if self.comm is not None:
                    raise
                self._retire_widest(e, it, held_out)
                if before_retry is not None:
                    before_retry()
        return attempt()

    @torch.no_grad()
    def _retire_widest(self, e: BinningOverflow, it: int, held_out: bool = False) -> int:
        """A training view (``held_out``: a held-out view being evaluated) at iteration ``it`` needed ``e.n_entries``
        (Gaussian, tile) entries, more than the limit ``e.max_entries`` (a fog of huge faint Gaussians, which a
        random start can grow under MCMC): make transparent
        (opacity :data:`RETIRED_OPACITY`, under the binning's alpha floor, so they touch no tile; the Adam moments of
        their rows zeroed) the fewest Gaussians, widest first by ``e.tiles_touched``, that bring the view to half
        the limit. MCMC relocates them at its next relocation (dead: under ``mcmc_min_opacity``), 3DGS's
        densification prunes them at its next prune (``prune_opacity``). Warns in one line; returns how many."""
        touched = e.tiles_touched.to(torch.int64).flatten()
        order = torch.argsort(touched, descending=True)
        cum = torch.cumsum(touched[order], 0)
        excess = e.n_entries - e.max_entries // 2
        k = min(int(torch.searchsorted(cum, torch.tensor([excess], device=cum.device)).item()) + 1, touched.numel())
        rows = order[:k]
        self.model.opacity_logits[rows] = math.log(RETIRED_OPACITY / (1.0 - RETIRED_OPACITY))
        zero_moments(self.optimizer, self.model, rows)
        self.retired_wide += k
        least = int(touched[order[k - 1]]) if k else 0
        warnings.warn(f"iteration {it:,}: a {'held-out' if held_out else 'training'} view needed {e.n_entries:,} "
                      f"(Gaussian, tile) entries, over the limit of {e.max_entries:,}: the {k:,} Gaussians covering "
                      f"the most tiles (≥ {least:,} each) were made transparent and "
                      + ("it was rendered again" if held_out else "the step taken again"), stacklevel=3)
        return k

    def _graph_runner_usable(self) -> bool:
        """Can this step go to the graph runner? A capturing one (made by the trainer on CUDA) when
        :func:`~.graph_step.graph_step_unsupported` has nothing against the config; a plain one (set by a test) when
        :meth:`~.graph_step.GraphStep.unsupported` has not."""
        if self.graph_step is not None and not self.graph_step.capture:
            return self.graph_step.unsupported() is None
        return graph_step_unsupported(self) is None

    def _holds(self, it: int) -> bool:
        """Does iteration ``it`` hold back its scheduled densification / reset / relocation (until the next step,
        :attr:`deferred_schedule`)? The run's last iteration (nothing would train the result), one evaluated by
        the step (``eval_every``: 3DGS evaluates before densifying the same iteration, so the model is scored as
        trained, not with untrained clones and splits), and :attr:`schedule_holds`. The same on every rank."""
        return it >= self.config.iterations or it in self.schedule_holds or self._evaluates(it)

    def _evaluates(self, it: int) -> bool:
        """Does the step evaluate after iteration ``it`` (``eval_every``; on the main rank only, which the caller
        checks: :meth:`_holds` must be the same on every rank)?"""
        every = self.config.eval_every
        return bool(every and it % every == 0 and self.test_frames)

    def _hold(self, it: int, cfg: TrainConfig, ok: torch.Tensor | None = None) -> None:
        """Record that iteration ``it`` held back its schedule under ``cfg`` (MCMC: with its NaN-guard verdict
        ``ok``, for the deferred noise); :meth:`_run_deferred_schedule` runs it."""
        self.deferred_schedule = it
        self._deferred_config = dataclasses.replace(cfg)
        self._deferred_ok = ok

    @staticmethod
    def _with_held(res: StepResult, held) -> StepResult:
        """Report the held-back schedule that ran at the start of this step with this step (where the step has a
        report of its own, with an interval of 1, that one is reported; both ran)."""
        if res.opacity_reset:
            res.opacity_reset_iteration = res.iteration
        if held is not None:
            it, report, reset = held
            res.densify = res.densify if res.densify is not None else report
            if reset and not res.opacity_reset:
                res.opacity_reset, res.opacity_reset_iteration = True, it
        return res

    def _uncrowded(self, factor: int) -> int:
        """``factor`` halved while the Gaussians outnumber its level's pixels (one full training view's divided by
        factor²) ``TrainConfig.coarse_to_fine_gaussians_per_pixel`` times (0: ``factor`` as it is)."""
        per = float(self.config.coarse_to_fine_gaussians_per_pixel)
        if per <= 0.0 or factor <= 1:
            return factor
        cam = self._full_views[0][0].camera
        n, pixels = self.model.num_gaussians, cam.width * cam.height
        while factor > 1 and n > per * pixels / (factor * factor):
            factor //= 2
        return factor

    def _use_downscale(self, factor: int) -> None:
        """Make ``train_frames``, ``_train_images`` and ``_train_masks`` the training views divided by ``factor``:
        :func:`~rigel_core.data.frames.downscale_frame` of each full-resolution view (what
        ``load_dataset(..., downscale=factor)`` gives for it; made once per phase). At most two image sets are held:
        the full-resolution one and the current coarse level; a coarse level is released when training moves to
        another factor (before the next one is made). A smaller factor is used for images whose shorter side would
        fall under ``coarse_to_fine_min_side`` (said once, in :attr:`coarse_note`, when "auto" chose the factor), and,
        with one warning, for masks that would leave a view with valid pixels no valid coarse pixel (the strict mask rule: ignored pixels reaching every factor × factor block)."""
        asked = factor
        factor = self._coarse_used.get(asked, asked)  # a factor a mask made smaller (below) stays smaller
        if factor == self.train_downscale:  # every step but a phase's first
            return
        full_frames = self._full_views[0]
        factor = fitting_factor(factor, full_frames, self.config.coarse_to_fine_min_side)  # small images: a smaller one
        if factor == self.train_downscale:
            return
        # release the current coarse level first (no reference to it is kept anywhere else: the graph step copies
        # the view it replays into its own buffers), so that two coarse levels never coexist
        self._release_views()
        self.train_frames, self._train_images, self._train_masks = self._full_views
        self.train_downscale = 1
        while factor != 1:
            frames = [downscale_frame(f, factor, device=self.device) for f in full_frames]
            facts = self.view_mask_facts(frames)  # each coarse mask read once (streamed: on the loading threads)
            # the strict mask rule can leave a view with valid pixels no valid coarse pixel (a mask whose ignored
            # pixels reach every factor x factor block): that view would train on nothing, so a smaller factor
            blind = [(f, ff) for f, ff, m in zip(frames, full_frames, facts) if m.blind]
            lost = [f.name for (f, _), m in zip(blind, self.view_mask_facts([ff for _, ff in blind])) if not m.blind]
            if not lost:
                self.train_frames = frames
                # float32 on the device (downscale_frame), or streamed
                self._train_images, self._train_masks = self._view_pixels(frames, facts)
                self.train_downscale = factor
                break
            del frames
            warnings.warn(f"coarse-to-fine: at 1/{factor} resolution {len(lost)} training view(s) would keep no "
                          f"valid pixel of their mask ({', '.join(lost[:3])}{' …' if len(lost) > 3 else ''}): "
                          f"1/{factor // 2} instead", stacklevel=3)
            factor //= 2
        self._coarse_used[asked] = factor
        if self.graph_step is not None:
            self.graph_step.views_changed()
        if self.config.render_mode == "mip":  # the 3D filter follows the training cameras' sampling rate
            self._update_filter_3d()

    def _batch_scaling(self) -> tuple:
        """(learning-rate factor, Adam betas) for this run's global batch (``batch_size`` × processes;
        :func:`~.distributed.batch_scaling`)."""
        world = self.comm.world_size if self.comm is not None else 1
        return batch_scaling(self.config.batch_lr_scaling, int(self.config.batch_size) * world)

    def _run_deferred_schedule(self) -> tuple:
        """The densification / reset / relocation an iteration held back (:attr:`deferred_schedule`), now that
        the run goes on: as it would have run right after that iteration's update. Returns (that iteration, report,
        reset)."""
        it = self.deferred_schedule
        held = self._deferred_config if self._deferred_config is not None else self.config
        # as held, but ``iterations`` is the run's: an extended run equals one planned that long
        cfg = dataclasses.replace(held, iterations=self.config.iterations)
        self.deferred_schedule, self._deferred_config = None, None
        with self.lock:
            report, reset = strategy_for(cfg.strategy).run_held(self, it, cfg)
            if report is not None:
                self._update_filter_3d()
        return it, report, reset

    def _graph_step(self, it: int, lrs: dict, t0: float) -> StepResult | None:
        """Iteration ``it`` as a replay of the captured step (:mod:`.graph_step`), with the same host-side
        schedule as the eager path; None when the graph path is off or the strategy needs the eager step for this
        iteration (the caller runs the eager step)."""
        model = self.model
        if self.graph_step is None:
            self.graph_step = GraphStep(self)
        if self.graph_step.disabled or self.strategy.needs_eager(self, it):
            return None
        idx = self._next_view()
        with self.lock:
            replayed = self.graph_step.step(idx, it)
            if replayed is None:
                self._redo_views.insert(0, idx)  # the eager step takes this view
                return None
            values, ctx = replayed
            report, reset = ctx.strategy.host_schedule(self, ctx, None)
            if report is not None or it % FILTER_3D_INTERVAL == 0:
                self._update_filter_3d()
        self.iteration = it
        res = StepResult(it, model.num_gaussians, self.train_frames[idx].name, model.active_sh_degree,
                         lrs["means3D"], 0.0, report, reset, values=values)
        if self._evaluates(it):
            res.eval = self.evaluate()
        res.seconds = time.perf_counter() - t0
        return res

    def _update_filter_3d(self) -> None:
        """Anti-aliased mode: set ``model.render_mode`` from the config and (re)compute ``model.filter_3D`` from
        the training cameras (:func:`rigel_core.mip.compute_filter_3d`); the default mode clears both. With an
        unchanged Gaussian count the new values go into the existing tensor, whose address a captured CUDA-graph step
        reads (a new tensor would make it capture every graph again, every :data:`~rigel_core.mip.FILTER_3D_INTERVAL`
        steps)."""
        model = self.model
        model.render_mode = self.config.render_mode
        if model.render_mode == "mip":
            f3d = compute_filter_3d(model.means3D, [f.camera for f in self.train_frames])
            old = getattr(model, "filter_3D", None)
            if isinstance(old, torch.Tensor) and old.shape == f3d.shape and old.dtype == f3d.dtype:
                old.copy_(f3d)
            else:
                model.filter_3D = f3d
        else:
            model.filter_3D = None

    # ---- evaluation, snapshots ------------------------------------------------------------------------
    @torch.no_grad()
    def render_frame(self, frame) -> torch.Tensor:
        """(H,W,3) render of ``frame``'s camera on the dataset background, clamped to [0, 1]."""
        return render(self.model, frame.camera, background=self.background).image.clamp(0.0, 1.0)

    @torch.no_grad()
    def evaluate(self, frames=None, *, record: bool = True) -> EvalResult | None:
        """PSNR and SSIM over ``frames`` (default: the held-out split); None when there are none.
        Appended to ``eval_history`` when ``record``."""
        frames = self.test_frames if frames is None else list(frames)
        if not frames:
            return None
        t0 = time.perf_counter()
        pose_fit = self.config.pose_opt or self.config.eval_pose_opt
        exposure_protocol = self.config.exposure or self.config.eval_exposure or self.config.appearance_grid
        per_view = []
        for f in frames:
            # a fog a run grew must not end it at its final evaluation: repaired as a training step is
            pred = self._within_entry_limit(lambda: self.render_frame(f), OVERFLOW_RETRIES, self.iteration,
                                            held_out=True)
            gt = f.image.to(self.device, torch.float32)
            mask = self._device_mask(f)
            m = float(mse(pred, gt, mask))
            per_view.append({"name": f.name, "psnr": psnr_from_mse(m), "ssim": float(ssim(pred, gt, mask=mask)),
                             "masked_pixels": 0 if mask is None else int((~mask).sum())})
            if exposure_protocol:  # fit left half, score right half (exposure.py)
                ex = left_right_metrics(pred, gt, mask)
                per_view[-1].update(psnr_exposure=ex["psnr"], ssim_exposure=ex["ssim"],
                                    exposure_fit={"A": ex["A"], "b": ex["b"]})
            if pose_fit:  # the pose-free protocol: the view's pose fitted with the scene frozen (pose.py)
                per_view[-1].update(self._pose_fit_metrics(f, gt, mask))
        res = EvalResult(self.iteration, float(np.mean([v["psnr"] for v in per_view])),
                         float(np.mean([v["ssim"] for v in per_view])), self.model.num_gaussians, len(frames),
                         time.perf_counter() - t0, per_view, sum(v["masked_pixels"] for v in per_view))
        if exposure_protocol:
            res.psnr_exposure = float(np.mean([v["psnr_exposure"] for v in per_view]))
            res.ssim_exposure = float(np.mean([v["ssim_exposure"] for v in per_view]))
        if pose_fit:
            res.psnr_pose = float(np.mean([v["psnr_pose"] for v in per_view]))
            res.ssim_pose = float(np.mean([v["ssim_pose"] for v in per_view]))
        if record:
            self.eval_history.append(res)
        return res

    def _pose_fit_metrics(self, frame, gt: torch.Tensor, mask) -> dict:
        """The pose-free protocol's metrics of held-out ``frame``: its pose fitted to ``gt`` with the scene frozen
        (:func:`.pose.fit_pose`: ``eval_pose_steps`` Adam steps at ``eval_pose_lr``, L1), then PSNR / SSIM of the
        render from the fitted pose; also the fitted pose's distance from the given one (``pose_fit``)."""
        cfg = self.config
        cam, _ = fit_pose(self.model, frame.camera, gt, steps=cfg.eval_pose_steps, lr=cfg.eval_pose_lr,
                          extent=self.extent, mask=mask, background=self.background)
        pred = render(self.model, cam, background=self.background).image.clamp(0.0, 1.0)
        err = pose_errors([cam], [frame.camera])
        return {"psnr_pose": psnr_from_mse(float(mse(pred, gt, mask))), "ssim_pose": float(ssim(pred, gt, mask=mask)),
                "pose_fit": {"rotation_deg": err["rotation_deg"][0], "translation": err["translation"][0]}}

    def set_appearance(self, kind: str) -> float:
        """Switch the colour model while training: ``"mlp"`` distils the current SH colours into a new MLP
        (:func:`rigel_core.appearance.to_mlp`, sizes from the config), ``"sh"`` bakes the MLP into SH of degree
        ``config.sh_degree`` (:func:`rigel_core.appearance.to_sh`). The geometry's Adam moments are kept, the
        appearance parameters start with fresh moments; ``config.appearance`` follows. Returns the switch's
        RMSE (colour units; 0.0 when the model already uses ``kind``). Raises ValueError for another kind."""
        from ..appearance import to_mlp, to_sh

        if kind not in ("sh", "mlp"):
            raise ValueError(f"set_appearance: kind must be 'sh' or 'mlp', got {kind!r}")
        cfg = self.config
        with self.lock:
            old_model, old_opt = self.model, self.optimizer
            if kind == "mlp":
                model, report = to_mlp(old_model, cfg.mlp_latent_dim, cfg.mlp_hidden_dim, generator=self.generator)
                rmse = report.rmse
            else:
                model, rmse = to_sh(old_model, cfg.sh_degree)
            if model is old_model:
                return 0.0
            model.active_sh_degree = min(model.sh_degree, self.iteration // max(1, cfg.sh_degree_interval))
            opt = make_optimizer(model, cfg, self.extent, appearance_groups(model, cfg))
            for g in opt.param_groups:  # carry the geometry's moments over
                if g["name"] in ("means3D", "log_scales", "quats", "opacity_logits"):
                    state = old_opt.state.get(optimizer_group(old_opt, g["name"])["params"][0])
                    if state:
                        opt.state[g["params"][0]] = state
            self.model, self.optimizer = model, opt
            self._update_filter_3d()
            cfg.appearance = kind
        return float(rmse)

    def is_consistent(self) -> bool:
        """True when every per-Gaussian tensor, its Adam moments and the densification statistics have the
        model's row count and the model validates. An exception inside densification (or an interrupt) can leave
        them torn; the CLI and the viewer save a checkpoint only of a consistent state."""
        try:
            self.model.validate()
            n = self.model.num_gaussians
            for p in per_gaussian_tensors(self.optimizer, self.model).values():
                if p.shape[0] != n:
                    return False
                for v in self.optimizer.state.get(p, {}).values():
                    if getattr(v, "dim", lambda: 0)() > 0 and v.shape[0] != n:
                        return False
            return len(self.stats) == n
        except Exception:  # noqa: BLE001 - anything odd here means "do not trust this state"
            return False

    def snapshot(self) -> GaussianModel:
        """A detached copy of the current model, consistent (taken under ``lock``)."""
        with self.lock:
            return self.model.to()

    # ---- persistence ----------------------------------------------------------------------------------
    def save_checkpoint(self, path) -> None:
        """Write the full training state atomically (see :mod:`rigel_core.checkpoint`)."""
        from ..checkpoint import save_checkpoint

        with self.lock:
            save_checkpoint(self, path)

    @classmethod
    def from_checkpoint(cls, path, dataset, *, device=None, config: TrainConfig | None = None) -> "Trainer":
        """Resume from :meth:`save_checkpoint` output. ``config`` overrides the saved one (e.g. a longer run)."""
        from ..checkpoint import load_trainer

        return load_trainer(path, dataset, device=device, config=config, trainer_cls=cls)

    def export_ply(self, path) -> float:
        """Write the model as an INRIA-layout PLY (``rigel_core.io.save_ply``, atomic); an MLP appearance is
        baked into SH of degree ``config.sh_degree`` first (:func:`rigel_core.appearance.to_sh`: per-Gaussian
        least squares over 128 view directions). Returns the baking RMSE in colour units (0.0 for an SH model):
        how far the PLY's colours are from the MLP's on the sampled directions."""
        from ..io.export import bake_for_export
        from ..io.ply import save_ply

        model, rmse = bake_for_export(self.snapshot(), self.config.sh_degree)  # keeps a mip model's filter
        save_ply(model, path)
        return rmse
