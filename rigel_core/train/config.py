"""``TrainConfig``: every knob of the trainer, with the 3DGS reference trainer's defaults.

Sources: Kerbl, Kopanas, Leimkühler & Drettakis, "3D Gaussian Splatting for Real-Time Radiance Field
Rendering" (SIGGRAPH 2023) §5–6 and the defaults of its released ``arguments/__init__.py``; gsplat's
``DefaultStrategy`` uses the same numbers. Field names follow that code where the brief does not rename them.

The trainer reads the config **every step**, so a viewer may edit any field while training runs (learning
rates, loss weight, the densification schedule and thresholds, the cap). Two exceptions, fixed at
construction: ``sh_degree`` (it sizes the SH tensors) and the initialisation fields (``init_*``,
``auto_background_points``). "auto" values (``strategy``, ``init_background_points``, ``coarse_to_fine``,
``densify_grad``) are resolved by the Trainer from its dataset (and, for ``densify_grad``, its device) when it is
made; its config then holds the concrete values.
"""
from __future__ import annotations

import dataclasses
import functools
import math
from dataclasses import dataclass

from ..config import APPEARANCE_MAX_HIDDEN, APPEARANCE_MAX_LATENT
from ..renderer.modes import RENDER_MODES

#: the largest iteration count a run (or a checkpoint) may declare; rigel_core.checkpoint uses the same bound
MAX_ITERATION = 100_000_000

__all__ = ["TrainConfig", "STRATEGIES", "DENSIFY_GRADS", "SPARSE_SFM_COVERAGE", "AUTO_COARSE_TO_FINE",
           "Capture", "auto_mcmc_budget", "strategy_unresolved", "resolve_init_points", "resolve_init_mode", "resolve_strategy", "resolve_init_background", "resolve_coarse_to_fine", "resolve_densify_grad",
           "coarse_to_fine_span", "coarse_schedule_words", "training_downscale", "SCHEDULE_STEP_FIELDS",
           "resolve_schedule_scale"]

#: TrainConfig.strategy's values: "auto" is resolved to one of the other two when a Trainer is made
STRATEGIES = ("auto", "default", "mcmc")
#: TrainConfig.mcmc_reset_moments' values
MCMC_RESET_MOMENTS = ("moved", "sources")
#: TrainConfig.mcmc_units' values
MCMC_UNITS = ("world", "cameras")
#: TrainConfig.densify_grad's values: "auto" is resolved to one of the other two when a Trainer is made
DENSIFY_GRADS = ("auto", "grad", "absgrad")

#: below this SfM coverage of the median training view (``rigel_core.train.sfm_view_coverage``) a capture's SfM
#: points cover only part of the scene: ``init_background_points = "auto"`` then adds background points (and
#: ``strategy = "auto"`` picks 3DGS's densification); an explicit 0 gets a suggestion in the log
SPARSE_SFM_COVERAGE = 0.5
#: the most background points a run may ask for (10M: each is a Gaussian drawn on a random training pixel's ray;
#: far beyond any capture's need, and a bound that stops a typo from allocating tens of GB)
MAX_BACKGROUND_POINTS = 10_000_000
#: the factor ``coarse_to_fine = "auto"`` becomes on a dataset without SfM points (random initialisation); 1 (off)
#: on one with SfM points. The measurements: the ``coarse_to_fine`` field's comment
AUTO_COARSE_TO_FINE = 4
#: a capture without SfM points whose training images leave at least this fraction of their pixels transparent
#: (alpha < 0.5) is an object on a known background — a synthetic render such as NeRF-synthetic's lego — where random
#: points in the cameras' box and 3DGS's densification fit (lego 30k 36.0 dB; the MCMC budget 0.6 dB behind). Any other
#: capture without SfM points (a photo capture: fox, bonsai or fern with their points removed) trains under the MCMC
#: budget: fox 31.0 against 22.0 dB, bonsai~nosfm 27.3 against 17.2 dB, fox~halfviews 27.8 against 18.9 dB at 7k
#: (H100, 2026-12-06, docs/BENCHMARKS.md "One default for every capture")
TRANSPARENT_BACKGROUND = 0.05
#: the automatic MCMC budget: one Gaussian per this many training pixels (all training views' pixels together), at
#: least AUTO_BUDGET_MIN, at most ``TrainConfig.auto_mcmc_budget``. Measured (H100, 2026-12-06, runs sharing the GPU):
#: fern (17 views of 504×378, 3.2 M pixels) at 1M / 300k / 100k Gaussians: 27.50 / 27.28 / 27.17 dB at 7k but 26.29 /
#: 27.28 / **27.69** dB at 30k — a budget too large for its pixels overfits a small capture; fox (43 views of
#: 1080×1920, 91 M pixels) 250k / 500k / 1M: 30.66 / 31.03 / 31.03 dB at 7k
AUTO_BUDGET_PIXELS_PER_GAUSSIAN = 32
#: the pixel rule's ceiling for a run that starts from random points (``TrainConfig.auto_mcmc_budget_random``); 0: none
#: of its own (``auto_mcmc_budget``). Off, measured (H100, 2026-12-07, 7k, seeds 0 / 1, docs/BENCHMARKS.md "A random
#: start's ceiling"): 300k wins on beer~nosfm (62 phone frames of 1280×720: 20.09 / 21.34 dB against 18.76 / 18.28 at
#: 1M, whose held-out view is one flat beige, as in gsplat's MCMC at 1M) but loses on bonsai~nosfm (26.36 / 26.38
#: against 27.40 / 27.43) and fox~halfviews (27.40 / 27.58 against 27.90 / 27.72). A ceiling by kind of start is not
#: what separates them
AUTO_BUDGET_RANDOM = 0
AUTO_BUDGET_MIN = 10_000
#: the random initialisation of ``init_points = "auto"``: half the automatic budget, at most 100k (3DGS's count) — a
#: small capture no longer starts from 100k points (48×48 views: 5 s a CPU step)
AUTO_INIT_MAX = 100_000


#: the default ``coarse_to_fine_min_side`` (pixels; the shorter side a coarse level keeps at least)
COARSE_MIN_SIDE = 64


@dataclass(frozen=True)
class Capture:
    """What the "auto" rules read of a dataset's training views (``rigel_core.train.trainer.capture_facts``):
    ``n_views`` (int), ``pixels`` (int: the training views' pixels together, at the resolution trained) and
    ``transparent`` (float in [0, 1]: the median fraction of a training image's pixels whose alpha is < 0.5; 0 for
    images without alpha)."""

    n_views: int
    pixels: int
    transparent: float = 0.0

    @property
    def object_on_background(self) -> bool:
        """Images of an object on a transparent background (:data:`TRANSPARENT_BACKGROUND`)."""
        return self.transparent >= TRANSPARENT_BACKGROUND


def auto_mcmc_budget(cfg: "TrainConfig", capture: Capture | None, random_start: bool = False) -> int:
    """The MCMC budget "auto" gives a capture: one Gaussian per ``cfg.auto_budget_pixels_per_gaussian``
    (:data:`AUTO_BUDGET_PIXELS_PER_GAUSSIAN`) training pixels, in [:data:`AUTO_BUDGET_MIN`, the rule's ceiling]
    (:func:`_budget_ceiling`: ``cfg.auto_mcmc_budget``, and at most ``cfg.auto_mcmc_budget_random`` when
    ``random_start``: the run starts from random points, no SfM points); the ceiling itself when ``capture`` is None
    (not measured); ``cfg.auto_mcmc_budget`` itself when ``cfg.auto_budget_pixels_per_gaussian`` is 0 (a budget
    given: ``--max-gaussians N``, which no ceiling cuts)."""
    per = int(cfg.auto_budget_pixels_per_gaussian)
    return int(cfg.auto_mcmc_budget) if per == 0 else _pixel_budget(cfg, capture, per, random_start)


def _budget_ceiling(cfg: "TrainConfig", random_start: bool) -> int:
    """The most Gaussians the pixel rule gives: ``cfg.auto_mcmc_budget``, and for a random start at most
    ``cfg.auto_mcmc_budget_random`` (0: no ceiling of its own)."""
    top = int(cfg.auto_mcmc_budget)
    if random_start and int(cfg.auto_mcmc_budget_random) > 0:
        top = min(top, int(cfg.auto_mcmc_budget_random))
    return top


def _pixel_budget(cfg: "TrainConfig", capture: Capture | None, per: int, random_start: bool) -> int:
    """One Gaussian per ``per`` training pixels of ``capture``, in [:data:`AUTO_BUDGET_MIN`, :func:`_budget_ceiling`];
    the ceiling itself when ``capture`` is None (not measured)."""
    top = _budget_ceiling(cfg, random_start)
    return top if capture is None else int(min(top, max(AUTO_BUDGET_MIN, capture.pixels // per)))


@dataclass
class TrainConfig:
    # ---- schedule ---------------------------------------------------------------------------------------
    iterations: int = 30_000
    seed: int = 0
    #: every step count of the schedule × this (:data:`SCHEDULE_STEP_FIELDS`: densification's start, end and
    #: interval, the opacity reset's and the SH degree's intervals, the coarse levels' span, a set
    #: ``position_lr_max_steps``) — the 30k schedule compressed into a shorter run (gsplat's ``steps_scaler``);
    #: ``rigel-train --schedule-scale S`` also makes the default ``--iters`` 30,000 × S. The Trainer applies it
    #: once (:func:`resolve_schedule_scale`): its config, and so metrics.json and the checkpoint, hold the scaled
    #: counts and 1.0. lego 800² (H100, 6cb8ed5): 0.7 over 21k, 35.92 dB in 37.4 s against 36.07 dB in 50.5 s
    #: with the 30k schedule; 0.6 over 18k 35.73 dB in 33.3 s (docs/BENCHMARKS.md "Fewer steps ... on lego")
    schedule_scale: float = 1.0

    # ---- learning rates (Adam; 3DGS defaults) -----------------------------------------------------------
    #: position lr, multiplied by the scene extent, decays exponentially from init to final over
    #: ``position_lr_max_steps`` (None = ``iterations``): lr(t) = init^(1−t)·final^t, t = it / max_steps.
    position_lr_init: float = 1.6e-4
    position_lr_final: float = 1.6e-6
    position_lr_max_steps: int | None = None
    scaling_lr: float = 5e-3  # log-scales
    rotation_lr: float = 1e-3  # quaternions
    #: opacity logits: 0.05 as in the 3DGS paper's code and gsplat (later 3DGS releases use 0.025).
    opacity_lr: float = 0.05
    feature_lr: float = 2.5e-3  # SH DC; the higher-order SH use feature_lr / sh_rest_lr_divisor
    sh_rest_lr_divisor: float = 20.0
    adam_eps: float = 1e-15  # as 3DGS (Adam's default 1e-8 is large against 1e-6 position steps)
    #: an element whose gradient is exactly 0 in a step keeps its value and Adam moments (train/optim.py Adam):
    #: Gaussians no pixel of the view reached are not updated (gsplat's visible Adam, 3DGS's sparse Adam); saves
    #: most of Adam's memory traffic at large N. Off: on the H200 it cost bonsai 0.57 dB at 7k for 5 % of the time
    #: (docs/TRAINING.md "Sparse Adam").
    sparse_adam: bool = False

    # ---- loss -------------------------------------------------------------------------------------------
    lambda_dssim: float = 0.2  # loss = (1 − λ)·L1 + λ·(1 − SSIM)
    #: on CUDA, the loss's fused kernels in float32, locally centred (csrc/ssim.cu) instead of float64: half their
    #: shared memory and arithmetic width. Off: no faster on the H200, whose float64 is fast (docs/TRAINING.md "The
    #: loss in float32"); for GPUs with slow float64.
    loss_float32: bool = False
    random_background: bool = False  # a random background colour per step (3DGS option; off by default)

    # ---- speed ------------------------------------------------------------------------------------------
    #: coarse-to-fine training resolution (issue 14; after DashGaussian, Chen et al. CVPR 2025): the training
    #: images start downscaled by this factor (a power of two in 1..64; 1 = off) and the factor halves in
    #: equal phases until full resolution at min(``coarse_to_fine_iters``, iterations × ``coarse_to_fine_share``)
    #: (e.g. 4 over 3000 iterations: ¼ for 1500, ½ for 1500, then full; an image's shorter side stays ≥
    #: ``coarse_to_fine_min_side`` px).
    #: Held-out evaluation is always at full resolution. "auto" (the default) is decided by the Trainer from the dataset
    #: (:func:`resolve_coarse_to_fine`): AUTO_COARSE_TO_FINE (4) without SfM points (random initialisation: a
    #: synthetic / Blender scene), 1 with SfM points (a real capture). Measured (H200, 2026-12-01): lego 800×800,
    #: 30k iterations, with 4: 36.03 dB in a 56.7 s training loop at commit e8efba4 (33.62 dB at 7k; 35.97 dB /
    #: 66.4 s at 914860a), without: 35.95 dB / 75.9 s (2091dcc) — no worse and faster; real captures, 7k
    #: iterations, one seed, e8efba4 (bench/real_sweep.py, 6 runs sharing the GPU): bonsai 27.91 → 28.20 dB,
    #: fern 27.03 → 26.71, beer 24.74 → 24.43 — mixed, so off where there are SfM points until measured over
    #: seeds and at 30k. The resolved config (metrics.json, checkpoint) holds the integer, never "auto".
    coarse_to_fine: int | str = "auto"
    coarse_to_fine_iters: int = 3000
    #: no coarse level makes a training image's shorter side smaller than this many pixels (a smaller factor, or
    #: full resolution, for small images). At 8 (until session 36) a 100 px capture without SfM points (lego~opaque
    #: at 1/8, the CPU) trained its first phase at 25 px and one seed of two lost every Gaussian there (11.6 dB);
    #: at 64 no capture of the GPU suite changes (fern~nosfm's ¼ level is 94 px, the smallest). In 8..4096.
    coarse_to_fine_min_side: int = COARSE_MIN_SIDE
    #: the largest share of ``iterations`` the coarse levels may take: they end at min(``coarse_to_fine_iters``,
    #: ``iterations`` × this) (in (0, 1]; 0.5 keeps a short run's second half at full resolution)
    coarse_to_fine_share: float = 0.5
    #: a coarse level is left for the next finer one as soon as the Gaussians outnumber its pixels (one training
    #: view's) this many times (0: never, the schedule alone). Where they do, a coarse step costs as much as a
    #: full-resolution one or more: bonsai~nosfm (800×533, 1M Gaussians) took 10.0 ms a step at ½ resolution and
    #: 7.0 ms at full (H100, 3c4c901, docs/BENCHMARKS.md "Where a coarse step's time goes"): every Gaussian covers
    #: at least part of a pixel and a tile, so the rasterizer's work per pixel grows as the pixels shrink. Off: at 2
    #: with ``coarse_to_fine_iters=6000`` it cost bonsai~nosfm and fox 0.34 dB each at 7k (0.86× and 1.02× the time;
    #: H100, d07bd85).
    coarse_to_fine_gaussians_per_pixel: float = 0.0
    #: CUDA only: replay each step as a captured CUDA graph (train/graph_step.py) where the configuration allows
    #: (one view per step and process, the default strategy, no exposure or random background); same result as
    #: the eager step, a fraction of its host time. Off: every step eager.
    cuda_graph: bool = True

    # ---- appearance -------------------------------------------------------------------------------------
    sh_degree: int = 3  # maximum SH degree (fixed at construction)
    sh_degree_interval: int = 1000  # active degree = min(sh_degree, iteration // sh_degree_interval)
    #: "sh", or "mlp": a per-Gaussian latent decoded by a shared MLP (rigel_core.renderer.appearance; the model is
    #: distilled from the initial SH colours). Read at construction; ``Trainer.set_appearance`` switches later.
    appearance: str = "sh"
    mlp_latent_dim: int = 8  # L, 1..32
    mlp_hidden_dim: int = 32  # H, 1..64
    #: Adam lr of the latents. 2.5e-3 is the SH DC rate: near sigmoid's midpoint a latent step moves the colour
    #: by about lr/4, what a DC step moves it (0.28·lr).
    latent_lr: float = 2.5e-3
    mlp_lr: float = 1e-3  # Adam lr of the shared MLP weights W1, b1, W2, b2

    # ---- adaptive density control (3DGS §5.2) -------------------------------------------------------------
    densify_from: int = 500
    densify_until: int = 15_000
    densify_interval: int = 100
    #: threshold on the view-averaged |∂L/∂means2D| in NDC units (pixel gradient × (W/2, H/2); see densify.py);
    #: read under densify_grad "grad" only ("absgrad" has absgrad_threshold)
    grad_threshold: float = 2e-4
    #: which views count in a Gaussian's view-averaged gradient (DensifyStats.update): "radius" (3DGS: its 3σ
    #: square reaches the image), "opacity" (gsplat's opacity-aware extent reaches the image), "contrib" (it drew
    #: a pixel in the view)
    densify_visibility: str = "radius"
    #: which gradient the densification statistic averages: "grad" (3DGS: the norm of the view's ∂L/∂means2D, a sum
    #: over pixels whose signs can cancel), "absgrad" (AbsGS, Ye et al. 2024: the norm of Σ_pixels |∂L_p/∂means2D|
    #: per axis, which does not cancel where a large Gaussian covers detail; CUDA only; compared with
    #: ``absgrad_threshold``), or "auto" (the default), decided by the Trainer (:func:`resolve_densify_grad`):
    #: "absgrad" for a real capture trained with 3DGS's densification on the CUDA kernels (bonsai at 7k, two seeds:
    #: +0.65 dB in 18 % less time), else "grad" (lego at 30k lost 0.2–0.8 dB with it). The resolved config
    #: (metrics.json, checkpoint) holds "grad" or "absgrad", never "auto". docs/TRAINING.md.
    densify_grad: str = "auto"
    #: the threshold of the "absgrad" statistic (in place of ``grad_threshold``; the absolute sum is never smaller,
    #: so it is higher: 8e-4, gsplat's suggestion for its absgrad, measured on bonsai against 6e-4)
    absgrad_threshold: float = 8e-4
    #: clone when max scale ≤ percent_dense·extent, split otherwise
    percent_dense: float = 0.01
    split_factor: float = 1.6  # children's scale = parent's / split_factor (3DGS: 0.8·N with N = 2)
    prune_opacity: float = 0.005
    #: after the first opacity reset: prune Gaussians larger than this many pixels (screen radius); 0 = off,
    #: which is what the released 3DGS code effectively does (its test never fires) and gsplat's default. With
    #: 20 px live, lego on the H200 (2026-11-29) pruned about as many Gaussians as it cloned every interval and
    #: stalled at 116k Gaussians / 33.3 dB after 30k iterations ...
    max_screen_size: float = 0.0
    #: ... or larger than this fraction of the scene extent (world-space max scale)
    max_world_size: float = 0.1
    opacity_reset_interval: int = 3000
    opacity_reset_value: float = 0.01
    #: the Gaussian budget: MCMC grows to it (a larger start is trimmed to it); under 3DGS's densification a bound on
    #: growth only — it adds at most (max_gaussians − N) new ones, the highest-gradient candidates first, and never
    #: removes any to reach it (a start above it is kept). None = no cap; under MCMC, the budget the pixel rule gives
    #: (:func:`auto_mcmc_budget`, set when the Trainer starts)
    max_gaussians: int | None = 3_000_000

    # ---- per-image exposure (exposure.py; 3DGS ``--train_test_exp``) ----------------------------------------
    #: learn an affine colour correction pred' = A_i·pred + b_i per training image (A_i init I, b_i init 0),
    #: applied to the render before the loss; held-out views are then also scored by the left/right-half
    #: protocol (exposure.py). Off by default. A viewer may switch it on mid-run (the corrections start then).
    exposure: bool = False
    #: its own Adam: lr log-linear from init to final over ``iterations`` (3DGS's exposure schedule; 3DGS's
    #: code defaults are 0.01 → 0.001, its README recommends 0.001 → 0.0001 with a 5000-step delay for
    #: ``--train_test_exp``) times the delay factor mult + (1 − mult)·sin(π/2·min(1, it / delay_steps))
    exposure_lr_init: float = 1e-2
    exposure_lr_final: float = 1e-3
    exposure_lr_delay_steps: int = 0  # 0 = no delay
    exposure_lr_delay_mult: float = 0.0
    #: score held-out views by the exposure protocol (left-half fit, right-half score) also when ``exposure``
    #: is off, so that an exposure-off run can be compared with an exposure-on one on equal terms
    eval_exposure: bool = False

    # ---- pose refinement (pose.py) and the bilateral-grid appearance (bilagrid.py): issue 38 ----------------------
    #: learn a rigid correction of each training camera (a rotation, radians, and a translation, scene extents, in the
    #: camera frame; zero at the start) with the scene. Off by default until measured (docs/TRAINING.md)
    pose_opt: bool = False
    #: its own Adam: lr log-linear from ``pose_opt_lr`` to ``pose_opt_lr_final`` over ``iterations``
    pose_opt_lr: float = 1e-4
    pose_opt_lr_final: float = 1e-6
    #: Adam's weight decay on the corrections (an L2 pull towards the given poses; 0 = none)
    pose_opt_reg: float = 0.0
    #: the corrections start learning at this iteration (the scene's first blur gives poor pose gradients)
    pose_opt_from: int = 0
    #: also score held-out views after fitting each one's pose with the scene frozen (``eval_pose_steps`` Adam steps
    #: at ``eval_pose_lr``), the pose-free NeRF protocol; on by itself with ``pose_opt``
    eval_pose_opt: bool = False
    eval_pose_steps: int = 100
    eval_pose_lr: float = 1e-3

    #: learn a bilateral grid of affine colour transforms per training image (bilagrid.py: sliced by pixel position
    #: and the render's luminance; held-out views scored by the exposure protocol). Off by default until measured
    appearance_grid: bool = False
    appearance_grid_bins: int = 8  # luminance bins L (≥ 2; read when the grids are made)
    appearance_grid_size: int = 16  # cells along the image's x and y, S (≥ 2; read when the grids are made)
    #: its own Adam: lr with a 1000-iteration warm-up from 1 % and a decay to 1 % at ``iterations`` (gsplat's)
    appearance_grid_lr: float = 2e-3
    appearance_grid_tv: float = 10.0  # weight of the grids' total-variation term (gsplat's)

    # ---- evaluation ---------------------------------------------------------------------------------------
    eval_every: int = 1000  # held-out PSNR/SSIM every this many iterations (0 = never inside step())

    # ---- initialisation (fixed at construction) ------------------------------------------------------------
    #: random points when the dataset has no SfM points; "auto" (the default): half the automatic MCMC budget, at most
    #: 100k (AUTO_INIT_MAX: 3DGS's count) — lego, fox: 100k; fern's 17 views without points: 50k; twenty 48×48 views:
    #: 5000 (:func:`resolve_init_points`). The resolved config holds the integer
    init_points: int | str = "auto"
    init_opacity: float = 0.1
    #: initial scale rule: False = mean distance to the 3 nearest neighbours (the 3DGS paper's wording); True =
    #: root of the mean *squared* distance, d² clamped ≥ 1e-7 (what the 3DGS code's ``distCUDA2`` and gsplat
    #: compute; ~4–5% larger on bonsai, fern, beer)
    init_scale_rms: bool = False
    #: a random point is kept when at least this fraction of training cameras see it (see trainer.py)
    init_min_visible: float = 0.5
    #: optional explicit init box (xmin, ymin, zmin, xmax, ymax, zmax); None = centre ± extent, then
    #: the visibility filter
    init_box: tuple | None = None
    #: where random points are drawn (:func:`~rigel_core.train.trainer.random_init_points`): "box" (uniform in
    #: ``init_box`` / the camera centres' box) or "rays" (along random training pixels' rays, log-uniform between 0.2
    #: and 50 scene extents: where the cameras look, also when the scene lies far in front of their box, as in a
    #: forward-facing capture). Both keep the points at least ``init_min_visible`` of the cameras see. "auto" (the
    #: default, :func:`resolve_init_mode`): "box" for an object on a transparent background (lego: 36.0 dB at 30k
    #: from the box), "rays" for any other capture without SfM points. Measured (H100, 2026-12-06, 7k, seed 0, runs
    #: sharing the GPU): fern~nosfm 12.24 dB from the box, **25.70** from the rays; fox 30.72 → 31.19; bonsai~nosfm
    #: 27.25 → 27.41 (runs cut at ~6,700 iterations)
    init_mode: str = "auto"
    #: extra "background" points added to the SfM points (trainer.background_init_points): drawn along
    #: rays of random training pixels, *behind* the SfM points that camera sees (beyond the 95th percentile of
    #: their depths) and outside the camera sphere (radius = scene extent), up to a sphere of
    #: ``init_background_radius`` × scene extent around the scene centre, uniform in inverse depth, coloured by
    #: their pixel. For captures whose SfM covers only the object (bonsai: the room starts empty). An integer
    #: N ≥ 0 adds N (0 = off); "auto" (the default) is decided by the Trainer (:func:`resolve_init_background`):
    #: ``auto_background_points`` when the dataset has SfM points that reach less than SPARSE_SFM_COVERAGE (50 %)
    #: of the median training view (``sfm_view_coverage``), else 0 — and ``strategy = "auto"`` then picks
    #: "default". Measured (H200, 2026-12-01, commit df0558b, 7k iterations, 2 seeds): bonsai (coverage 28 %)
    #: 22.7–25.2 dB without background points (MCMC 1M; not reproducible run to run), with 20000: 26.76 dB
    #: under MCMC 1M, **27.66 dB** under 3DGS's densification (879k Gaussians, and faster than MCMC). Fern
    #: (98 %) and beer (78 %) stay at 0: there background points did not pay. The resolved config (metrics.json,
    #: checkpoint) holds the integer, never "auto". Ignored without SfM points.
    init_background_points: int | str = "auto"
    init_background_radius: float = 3.0
    #: the count "auto" adds on a capture whose SfM points cover less than half of the median view (20000:
    #: the measured bonsai setting above)
    auto_background_points: int = 20_000

    # ---- anti-aliased render mode (issue 17; rigel_core/renderer/mip.py, docs/PIPELINE.md "Anti-aliased mode") ---
    #: "default" (the 0.3 px² dilation of 3DGS) or "mip" (Mip-Splatting: 3D smoothing filter from the training
    #: cameras' sampling rates + 2D Mip filter with opacity compensation); applied at construction and re-read
    #: whenever the trainer recomputes the 3D filter (every 100 iterations); written to the PLY header
    #: (``comment SplatRenderMode``)
    render_mode: str = "default"
    # ---- Gaussian budget: densification strategy (mcmc.py; issue 17) -------------------------------------
    #: "default": 3DGS's clone / split / prune and opacity resets (densify.py); "mcmc": 3DGS-MCMC (Kheradmand et
    #: al. 2024): no clone / split / prune / reset; dead Gaussians relocated onto live ones and new ones added
    #: (``mcmc_growth`` of N per ``densify_interval`` in (densify_from, densify_until)) until N = max_gaussians,
    #: which must then be set (the budget); position noise after each step; opacity and scale regularisers;
    #: "auto" (the default): chosen by the Trainer from the dataset (:func:`resolve_strategy`) — "default" for an
    #: object on a transparent background without SfM points (a synthetic render: lego) and where
    #: ``init_background_points = "auto"`` added background points with at least ``auto_default_min_views`` views
    #: (a partial SfM: bonsai, 27.66 dB against 26.76 under MCMC 1M with the same points; the comment of that
    #: field); "mcmc" for every other capture, SfM points or not, with ``max_gaussians`` lowered to the automatic
    #: budget (:func:`auto_mcmc_budget`: one Gaussian per ``auto_budget_pixels_per_gaussian`` training pixels).
    #: Measured (docs/BENCHMARKS.md, "Densification strategy on real captures"): MCMC +2.1 to +4.4 dB held-out
    #: on bonsai, fern and beer at 7k over two seeds each, every seed-paired difference above +1.8 dB; on lego
    #: (random initialisation) 0.6 dB behind
    strategy: str = "auto"
    #: the most Gaussians the budget "auto" gives MCMC (:func:`auto_mcmc_budget`; ``max_gaussians`` becomes the smaller
    #: of the two). ``--max-gaussians N`` under ``strategy = "auto"`` sets it to N and
    #: ``auto_budget_pixels_per_gaussian`` to 0: N is then the budget itself, not a bound on the pixel rule's
    auto_mcmc_budget: int = 1_000_000
    #: the automatic budget's rule: one Gaussian per this many training pixels, in [AUTO_BUDGET_MIN,
    #: ``auto_mcmc_budget``] (the measurements: :data:`AUTO_BUDGET_PIXELS_PER_GAUSSIAN`'s comment); 0: the budget is
    #: ``auto_mcmc_budget`` whatever the capture
    auto_budget_pixels_per_gaussian: int = AUTO_BUDGET_PIXELS_PER_GAUSSIAN
    #: the pixel rule's ceiling when the run starts from random points (a capture without SfM points), below
    #: ``auto_mcmc_budget``; 0: ``auto_mcmc_budget`` alone. Not read when a budget is given (``--max-gaussians``).
    #: (the measurements: :data:`AUTO_BUDGET_RANDOM`'s comment)
    auto_mcmc_budget_random: int = AUTO_BUDGET_RANDOM
    #: a partial SfM (``init_background_points`` "auto" added background points) keeps 3DGS's densification under
    #: ``strategy = "auto"`` only with at least this many training views: bonsai (255 views) 28.5 dB against 26.8
    #: under MCMC; with 32 of its views (bonsai~fewviews) MCMC wins, 24.64 against 23.54 dB (H100, 2026-12-06), as on
    #: a held-back 23-view capture (19.00 against 18.74 / 18.27 dB)
    auto_default_min_views: int = 100
    mcmc_min_opacity: float = 0.005  # dead (relocated) when opacity ≤ this; also the floor of a copy's opacity
    #: also dead (relocated) when its largest scale exceeds this × the scene extent (world units); 0: off. Measured
    #: and left off (H100, 2026-12-07, 7k, seed 0): 0.5 gives −0.23 dB on beer~nosfm and −0.43 on fern~nosfm, 0.1
    #: −0.91 and −10.5 dB; beer~nosfm's failure at 1M Gaussians is not cured by it (docs/BENCHMARKS.md)
    mcmc_max_scale: float = 0.0
    mcmc_growth: float = 0.05  # Gaussians added per relocation step, as a fraction of N (until the cap)
    #: no growth at a relocation step where more than this share of the Gaussians is dead (at or under
    #: ``mcmc_min_opacity``); 0: off. A run whose Gaussians die faster than the signal keeps them (beer~nosfm: from
    #: 3k half of them, then all, churned at every relocation step on the way to 1M, 17.5–18.6 dB) stops growing
    #: there instead: 0.3 gives beer~nosfm 23.6 / 24.6 dB at 390–450k Gaussians, and the six other captures stay
    #: within their seed spread (H200, 2026-12-07, 7k; docs/BENCHMARKS.md "Growth where Gaussians die")
    mcmc_growth_max_dead: float = 0.3
    #: a relocation or growth step draws a live Gaussian at most as many times as its opacity can be split into
    #: copies that stay above ``mcmc_min_opacity`` (n copies of opacity o each get 1 − (1 − o)^(1/n)); the draws
    #: over that are dropped: their dead Gaussians wait for the next relocation step, growth adds fewer. Off: the
    #: copies of a faint source are floored at the bound and born dead (the paper's code, gsplat). Where no source
    #: is drawn over its share the run is bit for bit the same. Written for a collapse found on the CPU (lego~opaque
    #: at 1/8, seed 1: every Gaussian dead by iteration 750), which it did not cure (11.59 dB either way; the run
    #: survives without its 25 px coarse level: ``coarse_to_fine_min_side``); not measured on the GPU suite, so off
    #: (docs/BENCHMARKS.md, "Small captures without SfM points")
    mcmc_live_copies: bool = False
    mcmc_max_copies: int = 51  # n of the mass-splitting formulas clamped to this (the paper's code: 51)
    #: whose Adam moments a relocation zeroes: "moved" (rigel's until now: the live Gaussians drawn and the dead
    #: ones moved onto them) or "sources" (the paper's code and gsplat's: only the live ones drawn; a dead row
    #: keeps the moments it had, which were small unless it died lately). A row with zeroed moments steps about
    #: 3× the learning rate at its next update (Adam: m = 0.1·g, v = 0.001·g²)
    mcmc_reset_moments: str = "moved"
    mcmc_noise_lr: float = 5e5  # λ_noise: noise = λ_noise · lr_means · σ(−k(o − t)) · Σ·η / L² (L: mcmc_units)
    mcmc_noise_k: float = 100.0  # k of the noise gate
    mcmc_noise_t: float = 0.005  # t of the noise gate (opacity)
    #: the largest scale the noise's Σ reads, as a share of the scene extent (0: none, the paper's Σ). The paper's
    #: noise grows as the square of a Gaussian's size, so a faint Gaussian a tenth of the scene wide is thrown
    #: several scene extents in a step early in a run; with the bound it moves as one of this size would. Measured
    #: at 0.05 against 0 (H100, 2026-12-07, 7k; docs/BENCHMARKS.md), seeds 0 / 1: bonsai~nosfm +0.60 / +0.16,
    #: beer +0.56 / +0.30, fox~halfviews +0.03 / +0.20, fox +0.08 (seed 1), fern~nosfm +0.17 (seed 1), fern −0.11 /
    #: −0.04, beer~nosfm (which fails at 1M either way) −0.19 / −1.01
    mcmc_noise_max_scale: float = 0.05
    mcmc_opacity_reg: float = 0.01  # loss += λ_o · mean(opacity)
    mcmc_scale_reg: float = 0.01  # loss += λ_s · mean(scale) / L (L: mcmc_units)
    #: the length L in which the position noise (Σ, L²) and the scale regulariser (scales, L) are measured:
    #: "world" = one world unit (the paper's code: a capture's arbitrary SfM scale then changes both, the noise's
    #: reach relative to the scene as the square of that scale); "cameras" = the cameras' radius, scene extent / 1.1
    #: (the largest distance of a training camera from their centre; gsplat's trainer, scale-free too, divides by
    #: their median distance), so the same capture in metres or in millimetres trains alike
    mcmc_units: str = "world"
    # ---- batches and data-parallel training (train/distributed.py; issue 16) ---------------------------------
    #: views rendered and backpropagated per step on each process; with N processes the global batch is N × this
    #: and one optimiser step follows the mean gradient of the global batch
    batch_size: int = 1
    #: hyper-parameters for a global batch G > 1: "sqrt" = learning rates × √G and Adam betas ^G (Grendel-GS,
    #: Zhao et al. 2024), "none" = as for G = 1
    batch_lr_scaling: str = "sqrt"

    def to_dict(self) -> dict:
        """A JSON-able dict of the fields."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "TrainConfig":
        """From :meth:`to_dict` output; unknown keys are an error naming them."""
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(d) - names)
        if unknown:
            raise ValueError(f"TrainConfig: unknown field(s) {unknown}")
        d = dict(d)
        if d.get("init_box") is not None:
            d["init_box"] = tuple(d["init_box"])
        return cls(**d)

    def _check_types(self) -> None:
        """Each field holds its annotated type: a bool for bool fields (not 1, not "maybe"), an int for int fields
        (an integral float such as 1e4 from JSON is converted), a finite number for float fields, a string, or a
        6-number tuple for ``init_box``; None only where the annotation allows it."""
        for f in dataclasses.fields(self):
            v, t = getattr(self, f.name), str(f.type).replace(" ", "")
            base, optional = t.split("|")[0], t.endswith("|None")
            where = f"TrainConfig.{f.name}"
            if f.name in ("init_background_points", "coarse_to_fine", "init_points"):  # an int, or "auto"
                if isinstance(v, float) and math.isfinite(v) and v.is_integer():
                    v = int(v)
                    setattr(self, f.name, v)
                if isinstance(v, str) and v.strip().lower() == "auto":
                    v = "auto"
                    setattr(self, f.name, v)
                if v != "auto" and (not isinstance(v, int) or isinstance(v, bool)):
                    what = {"init_background_points": "an int ≥ 0", "init_points": "an int ≥ 1"}.get(
                        f.name, "a power of two in 1..64")
                    raise ValueError(f"{where} must be {what} or 'auto', got {v!r}"[:200])
                continue
            if v is None:
                if optional:
                    continue
                raise ValueError(f"{where} must be {'a finite number' if base == 'float' else base}, got None (null: "
                                 "this field has no 'none' value)")
            if base == "bool":
                ok = isinstance(v, bool)
            elif base == "int":
                if isinstance(v, float) and math.isfinite(v) and v.is_integer():
                    v = int(v)
                    setattr(self, f.name, v)
                ok = isinstance(v, int) and not isinstance(v, bool)
            elif base == "float":
                ok = isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
            elif base == "str":
                ok = isinstance(v, str)
            elif base == "tuple":
                ok = isinstance(v, (tuple, list)) and all(
                    isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) for x in v)
            else:  # pragma: no cover - a new annotation this check does not know yet
                ok = True
            if not ok:
                raise ValueError(f"{where} must be {'a finite number' if base == 'float' else base}"
                                 f"{' or None' if optional else ''}, got {v!r}"[:200])

    def _each(self, names, ok, what: str) -> None:
        """ValueError naming the first field of ``names`` whose value fails ``ok`` (False for NaN), alone: "TrainConfig.
        <field> must be <what>, got <value>" — one field a message, which the CLIs name by its flag or ``--set``
        (:func:`rigel_core.cli.common.flag_words`)."""
        for name in names:
            v = getattr(self, name)
            if not ok(v):
                raise ValueError(f"TrainConfig.{name} must be {what}, got {v!r}")

    def validate(self) -> None:
        """Raise ValueError naming the first field whose value has the wrong type or is out of range."""
        self._check_types()
        if self.iterations > MAX_ITERATION:
            raise ValueError(f"TrainConfig.iterations must be ≤ {MAX_ITERATION:,}, got {self.iterations}")
        self._each(("iterations", "densify_interval", "sh_degree_interval", "opacity_reset_interval", "split_factor",
                    "feature_lr", "sh_rest_lr_divisor"), lambda v: v > 0, "> 0")
        if not 0 <= self.sh_degree <= 3:
            raise ValueError(f"TrainConfig.sh_degree must be in 0..3, got {self.sh_degree}")
        if not -2**63 <= self.seed < 2**64:   # torch.Generator.manual_seed's range
            raise ValueError(f"TrainConfig.seed must be in -2^63..2^64-1, got {self.seed}")
        if self.densify_visibility not in ("radius", "opacity", "contrib"):
            raise ValueError(f"TrainConfig.densify_visibility must be 'radius', 'opacity' or 'contrib', got "
                             f"{self.densify_visibility!r}")
        if self.densify_grad not in DENSIFY_GRADS:
            raise ValueError(f"TrainConfig.densify_grad must be 'auto', 'grad' or 'absgrad', got {self.densify_grad!r}")
        self._each(("grad_threshold", "absgrad_threshold"), lambda v: v >= 0, "≥ 0")
        if self.appearance not in ("sh", "mlp"):
            raise ValueError(f"TrainConfig.appearance must be 'sh' or 'mlp', got {self.appearance!r}")
        self._each(("mlp_latent_dim",), lambda v: 1 <= v <= APPEARANCE_MAX_LATENT, f"in 1..{APPEARANCE_MAX_LATENT}")
        self._each(("mlp_hidden_dim",), lambda v: 1 <= v <= APPEARANCE_MAX_HIDDEN, f"in 1..{APPEARANCE_MAX_HIDDEN}")
        self._each(("latent_lr", "mlp_lr"), lambda v: v >= 0, "≥ 0")
        if not 0.0 <= self.lambda_dssim <= 1.0:
            raise ValueError(f"TrainConfig.lambda_dssim must be in [0, 1], got {self.lambda_dssim}")
        if self.max_gaussians is not None and self.max_gaussians < 1:
            raise ValueError(f"TrainConfig.max_gaussians must be ≥ 1 or None, got {self.max_gaussians}")
        if self.init_points != "auto" and self.init_points < 1:
            raise ValueError(f"TrainConfig.init_points must be ≥ 1, got {self.init_points}")
        if self.init_background_points != "auto" and not 0 <= self.init_background_points <= MAX_BACKGROUND_POINTS:
            raise ValueError(f"TrainConfig.init_background_points must be in [0, {MAX_BACKGROUND_POINTS:,}] or "
                             f"'auto', got {self.init_background_points}"[:200])
        if not 1 <= self.auto_background_points <= MAX_BACKGROUND_POINTS:
            raise ValueError(f"TrainConfig.auto_background_points must be in [1, {MAX_BACKGROUND_POINTS:,}], got "
                             f"{self.auto_background_points}"[:200])
        # a negative rate ascends the loss; 0 freezes the group
        self._each(("position_lr_init", "position_lr_final", "scaling_lr", "rotation_lr", "opacity_lr"),
                   lambda v: v >= 0, "≥ 0")
        if not self.adam_eps > 0:
            raise ValueError(f"TrainConfig.adam_eps must be > 0, got {self.adam_eps!r}")
        if not 0.0 < self.init_opacity < 1.0:   # stored as its logit
            raise ValueError(f"TrainConfig.init_opacity must be in (0, 1), got {self.init_opacity!r}")
        if self.position_lr_max_steps is not None and self.position_lr_max_steps < 1:
            raise ValueError(f"TrainConfig.position_lr_max_steps must be ≥ 1 or None, got {self.position_lr_max_steps}")
        if not self.init_background_radius > 1.0:
            raise ValueError(f"TrainConfig.init_background_radius must be > 1 (scene extents), got "
                             f"{self.init_background_radius}")
        self._each(("exposure_lr_init", "exposure_lr_final", "exposure_lr_delay_steps", "pose_opt_lr",
                    "pose_opt_lr_final", "pose_opt_reg", "pose_opt_from", "eval_pose_steps", "eval_pose_lr",
                    "appearance_grid_lr", "appearance_grid_tv"), lambda v: v >= 0, "≥ 0")
        self._each(("exposure_lr_delay_mult",), lambda v: 0.0 <= v <= 1.0, "in [0, 1]")
        self._each(("appearance_grid_bins", "appearance_grid_size"), lambda v: v >= 2, "≥ 2")
        if self.render_mode not in RENDER_MODES:
            raise ValueError(f"TrainConfig.render_mode must be 'default' or 'mip', got {self.render_mode!r}")
        if self.strategy not in STRATEGIES:
            raise ValueError(f"TrainConfig.strategy must be one of {', '.join(map(repr, STRATEGIES))}, got "
                             f"{self.strategy!r}")
        if self.auto_default_min_views < 0:
            raise ValueError(f"TrainConfig.auto_default_min_views must be ≥ 0, got {self.auto_default_min_views}")
        if self.auto_mcmc_budget < 1:
            raise ValueError(f"TrainConfig.auto_mcmc_budget must be ≥ 1, got {self.auto_mcmc_budget}")
        if self.auto_mcmc_budget_random < 0:
            raise ValueError(f"TrainConfig.auto_mcmc_budget_random must be ≥ 0 (0: auto_mcmc_budget alone), got "
                             f"{self.auto_mcmc_budget_random}")
        if self.auto_budget_pixels_per_gaussian < 0:
            raise ValueError("TrainConfig.auto_budget_pixels_per_gaussian must be ≥ 0 (0: the budget is "
                             f"auto_mcmc_budget), got {self.auto_budget_pixels_per_gaussian}")
        self._each(("mcmc_min_opacity",), lambda v: 0.0 < v < 1.0, "in (0, 1)")
        self._each(("mcmc_noise_t",), lambda v: 0.0 <= v <= 1.0, "in [0, 1]")
        if self.mcmc_reset_moments not in MCMC_RESET_MOMENTS:
            raise ValueError(f"TrainConfig.mcmc_reset_moments must be one of "
                             f"{', '.join(map(repr, MCMC_RESET_MOMENTS))}, got {self.mcmc_reset_moments!r}")
        if self.mcmc_units not in MCMC_UNITS:
            raise ValueError(f"TrainConfig.mcmc_units must be one of {', '.join(map(repr, MCMC_UNITS))}, got "
                             f"{self.mcmc_units!r}")
        if not 1 <= self.mcmc_max_copies <= 1000:
            raise ValueError(f"TrainConfig.mcmc_max_copies must be in 1..1000, got {self.mcmc_max_copies}")
        self._each(("mcmc_max_scale", "mcmc_noise_max_scale"), lambda v: 0.0 <= v < math.inf,
                   "finite and ≥ 0 (0: off)")
        self._each(("mcmc_growth_max_dead",), lambda v: 0.0 <= v <= 1.0, "in [0, 1]")
        self._each(("mcmc_growth", "mcmc_noise_lr", "mcmc_noise_k", "mcmc_opacity_reg", "mcmc_scale_reg"),
                   lambda v: v >= 0, "≥ 0")
        c2f = self.coarse_to_fine
        if c2f != "auto" and not (1 <= c2f <= 64 and c2f & (c2f - 1) == 0):
            raise ValueError(f"TrainConfig.coarse_to_fine must be a power of two in 1..64 or 'auto', got {c2f}")
        if self.coarse_to_fine_iters < 0:
            raise ValueError(f"TrainConfig.coarse_to_fine_iters must be ≥ 0, got {self.coarse_to_fine_iters}")
        self._each(("coarse_to_fine_min_side",), lambda v: 8 <= v <= 4096, "in 8..4096")
        if not 0.0 < self.coarse_to_fine_share <= 1.0:
            raise ValueError(f"TrainConfig.coarse_to_fine_share must be in (0, 1], got {self.coarse_to_fine_share}")
        if not 0.0 < self.schedule_scale <= 100.0:
            raise ValueError(f"TrainConfig.schedule_scale must be in (0, 100], got {self.schedule_scale}")
        if not 0.0 <= self.coarse_to_fine_gaussians_per_pixel < math.inf:
            raise ValueError("TrainConfig.coarse_to_fine_gaussians_per_pixel must be a finite number ≥ 0 (0: off), "
                             f"got {self.coarse_to_fine_gaussians_per_pixel}")
        if not 1 <= self.batch_size <= 4096:
            raise ValueError(f"TrainConfig.batch_size must be in 1..4096, got {self.batch_size}")
        if self.batch_lr_scaling not in ("sqrt", "none"):
            raise ValueError(f"TrainConfig.batch_lr_scaling must be 'sqrt' or 'none', got {self.batch_lr_scaling!r}")
        if self.init_mode not in ("auto", "box", "rays"):
            raise ValueError(f"TrainConfig.init_mode must be 'auto', 'box' or 'rays', got {self.init_mode!r}")
        if self.init_box is not None and len(self.init_box) != 6:
            raise ValueError(f"TrainConfig.init_box must have 6 numbers, got {self.init_box!r}")


def resolve_init_background(cfg: TrainConfig, coverage: float | None, has_sfm_points: bool = True) -> str | None:
    """Turn ``cfg.init_background_points == "auto"`` into a count, in place: ``cfg.auto_background_points`` when
    ``coverage`` (``sfm_view_coverage`` of the training views, a float in [0, 1]; None = no SfM points, or not
    measured) is below :data:`SPARSE_SFM_COVERAGE`, else 0. An explicit count is left as it is — but for a dataset
    without SfM points (``has_sfm_points`` False), where background points have nothing to go behind: 0, the count
    the run uses. Returns a one-line note for the log, or None: what "auto" added and why, a count that could not be
    used, or — for an explicit 0 on a low coverage — the suggestion to add some. The rule and its measurement: the
    ``init_background_points`` field's comment."""
    if not has_sfm_points and cfg.init_background_points not in (0, "auto"):
        n, cfg.init_background_points = cfg.init_background_points, 0
        return (f"init_background_points={n:,} not used: the dataset has no SfM points (random initialisation, "
                f"init_points={cfg.init_points:,})")
    low = coverage is not None and coverage < SPARSE_SFM_COVERAGE
    where = (f"the SfM points reach {coverage:.0%} of the median training view (8x8 cells; under "
             f"{SPARSE_SFM_COVERAGE:.0%})" if low else "")
    if cfg.init_background_points == "auto":
        cfg.init_background_points = cfg.auto_background_points if low else 0
        if not low:
            return None
        return (f"init background auto: {where}: {cfg.init_background_points:,} background points added behind "
                "them (bonsai, 28%: 27.7 dB at 7k with 3DGS's densification, 22.7-25.2 without; docs/TRAINING.md); "
                "--init-background 0 turns this off")
    if cfg.init_background_points == 0 and low:
        return (f"{where}: the rest starts empty; --init-background auto (or N) adds points behind them "
                "(bonsai: 28%, 27.7 dB at 7k against 22.7-25.2; docs/TRAINING.md)")
    return None


def strategy_unresolved(cfg: TrainConfig) -> bool:
    """True when :func:`resolve_strategy` will change ``cfg``: ``strategy`` "auto", or "mcmc" without its budget
    (``max_gaussians`` None)."""
    return cfg.strategy == "auto" or (cfg.strategy == "mcmc" and cfg.max_gaussians is None)


def resolve_strategy(cfg: TrainConfig, has_sfm_points: bool, n_start: int = 0, *, auto_background: bool = False,
                     coverage: float | None = None, capture: Capture | None = None, init_auto: bool = False,
                     n_background: int = 0) -> str | None:
    """Turn ``cfg.strategy == "auto"`` into the strategy it stands for, in place — one rule for every kind of capture,
    from what the data is, never its name (the measurements: the constants above, docs/TRAINING.md):

    - "default" (3DGS's clone / split / prune) for a capture without SfM points whose images are an object on a
      transparent background (``capture.object_on_background``: a synthetic render such as lego);
    - "default" for a partial SfM (``auto_background`` True: ``init_background_points`` was "auto" and added points,
      :func:`resolve_init_background`) with at least ``cfg.auto_default_min_views`` training views (bonsai);
    - else "mcmc" (3DGS-MCMC's relocation: SfM points or not, few views or many) with
      ``max_gaussians = min(max_gaussians, max(auto_mcmc_budget(cfg, capture), n_start))`` (None counts as no cap;
      ``n_start``: the Gaussians the run starts from — a given model's, or the SfM points (and background points)
      of the initial model — which the budget then never cuts; ``n_background`` of them are background points,
      which the note names apart from the SfM points).

    ``strategy == "mcmc"`` with ``max_gaussians`` None (MCMC asked for, its budget not given: ``rigel-train
    --strategy mcmc``) gets the same budget, ``max(auto_mcmc_budget(cfg, capture), n_start)``.

    ``capture`` None (not measured) counts as a photo capture with many views and the fixed ``auto_mcmc_budget``.
    ``coverage`` (``sfm_view_coverage``, or None) only goes into the note. Returns a one-line note of the choice and
    why for the log, or None when ``cfg.strategy`` was already explicit with its budget (nothing changed). A resumed run keeps the
    strategy its checkpoint recorded."""
    if cfg.strategy == "mcmc" and cfg.max_gaussians is None:   # MCMC asked for, its budget not given: the rule's
        cfg.max_gaussians = max(auto_mcmc_budget(cfg, capture, not has_sfm_points), int(n_start))
        return (f"strategy mcmc, a budget of {cfg.max_gaussians:,} Gaussians"
                f"{_budget_reason(cfg, capture, n_start, not has_sfm_points)} "
                "(--max-gaussians N sets it)")
    if cfg.strategy != "auto":
        return None
    cover = f", SfM points reaching {coverage:.0%} of the median view" if coverage is not None else ""
    views = f"{capture.n_views} training views" if capture is not None else "the training views"
    if not has_sfm_points and capture is not None and capture.object_on_background:
        cfg.strategy = "default"
        return (f"strategy auto: default (3DGS's clone / split / prune: no SfM points and images of an object on a "
                f"transparent background, {capture.transparent:.0%} of their pixels: random points in the cameras' "
                "box fit it; lego 36.0 dB at 30k); --strategy mcmc for the MCMC budget (--max-gaussians N sets it)")
    few = capture is not None and capture.n_views < cfg.auto_default_min_views
    if has_sfm_points and auto_background and not few:
        cfg.strategy = "default"
        return (f"strategy auto: default (3DGS's clone / split / prune{cover}, so background points were added, and "
                f"{views} (≥ {cfg.auto_default_min_views}): bonsai 28.5 dB at 7k against 26.8 under the MCMC budget); "
                "--strategy mcmc for the MCMC budget (--max-gaussians N sets it), --init-background 0 for no background "
                "points and the MCMC budget")
    rule = auto_mcmc_budget(cfg, capture, not has_sfm_points)
    cap, budget = cfg.max_gaussians, max(rule, int(n_start))
    cfg.max_gaussians = budget if cap is None else min(cap, budget)
    cfg.strategy = "mcmc"
    if has_sfm_points:
        n_bg = min(int(n_background), int(n_start))
        start = (f": {int(n_start) - n_bg:,}" + (f", with {n_bg:,} background points," if n_bg else "") + " start it"
                 if n_start else "")
        why = (f"SfM points{start}{cover.replace(', SfM points reaching', ', reaching')}"
               + (f", {views} (< {cfg.auto_default_min_views})" if auto_background else ""))
    else:
        where = {"rays": " along the training pixels' rays", "box": " in the cameras' box"}.get(cfg.init_mode, "")
        why = (f"no SfM points, a photo capture: random points{where} start it"
               + (f", {cfg.init_points:,} of them" if isinstance(cfg.init_points, int) else "")
               + (f" (init_points auto: half the pixel rule's budget, at most {AUTO_INIT_MAX:,})" if init_auto else ""))
    return (f"strategy auto: mcmc ({why}), a budget of {cfg.max_gaussians:,} Gaussians"
            f"{_budget_reason(cfg, capture, n_start, not has_sfm_points)} (--max-gaussians N sets it; --strategy "
            "default for 3DGS's densification)")


def _budget_reason(cfg: "TrainConfig", capture: Capture | None, n_start: int, random_start: bool) -> str:
    """Where the MCMC budget ``cfg.max_gaussians`` that :func:`resolve_strategy` set comes from, for its note."""
    ppg = int(cfg.auto_budget_pixels_per_gaussian)
    top = _budget_ceiling(cfg, random_start)
    ceiling = (f"{top:,}" + (" (a random start's ceiling)" if top < int(cfg.auto_mcmc_budget) else ""))
    if ppg == 0:
        per = ": as given, the pixel rule off"   # --max-gaussians N (it sets auto_mcmc_budget, a field not named)
    elif capture is not None:
        per = f": one per {ppg} of the {capture.pixels:,} training pixels, {AUTO_BUDGET_MIN:,} to {ceiling}"
    else:
        per = f": the ceiling, {ceiling}" if top < int(cfg.auto_mcmc_budget) else ""
    if cfg.max_gaussians == int(n_start) > auto_mcmc_budget(cfg, capture, random_start):
        per += f", raised to the {int(n_start):,} Gaussians the run starts from (a budget never cuts its start)"
    return per


def resolve_init_points(cfg: TrainConfig, capture: Capture | None) -> None:
    """Turn ``cfg.init_points == "auto"`` into a count, in place: half of the pixel rule's budget (:func:`auto_mcmc_budget`
    — with the rule's default ratio when ``auto_budget_pixels_per_gaussian`` is 0, so a given budget bounds the
    start but does not set it: under 3DGS's densification ``--max-gaussians`` is only a cap), at most
    :data:`AUTO_INIT_MAX` (100k; the same whether the strategy is MCMC or 3DGS's: lego keeps its 100k) and at least
    1. Read only when the dataset has no SfM points."""
    if cfg.init_points == "auto":
        per = int(cfg.auto_budget_pixels_per_gaussian) or AUTO_BUDGET_PIXELS_PER_GAUSSIAN
        budget = _pixel_budget(cfg, capture, per, random_start=True)
        cfg.init_points = int(max(1, min(AUTO_INIT_MAX, budget // 2)))


def resolve_init_mode(cfg: TrainConfig, capture: Capture | None) -> None:
    """Turn ``cfg.init_mode == "auto"`` into where random points are drawn, in place: "box" for images of an object
    on a transparent background (``capture.object_on_background``), "rays" for any other capture (also when
    ``capture`` is None: not measured). Read only when the dataset has no SfM points (the ``init_mode`` field's
    comment gives the measurements)."""
    if cfg.init_mode == "auto":
        cfg.init_mode = "box" if capture is not None and capture.object_on_background else "rays"


def coarse_schedule_words(cfg: TrainConfig) -> str:
    """A resolved coarse-to-fine factor's schedule in words, for the log: "training starts at 1/4 resolution, full
    after min(coarse_to_fine_iters, iterations × coarse_to_fine_share) = 3,000 iterations"."""
    span = coarse_to_fine_span(cfg)
    return (f"training starts at 1/{cfg.coarse_to_fine} resolution, full after min(coarse_to_fine_iters, iterations × "
            f"coarse_to_fine_share) = {span:,} iteration{'' if span == 1 else 's'}")


def resolve_coarse_to_fine(cfg: TrainConfig, has_sfm_points: bool) -> str | None:
    """Turn ``cfg.coarse_to_fine == "auto"`` into a factor, in place: :data:`AUTO_COARSE_TO_FINE` (4) when the
    dataset has no SfM points (random initialisation: a synthetic / Blender scene such as lego), else 1 (off: a real
    capture). Returns a one-line note of the choice for the log, or None when ``cfg.coarse_to_fine`` was already
    explicit (nothing changed). The rule is the measured one (the ``coarse_to_fine`` field's comment); a resumed
    run keeps the factor its checkpoint recorded."""
    if cfg.coarse_to_fine != "auto":
        return None
    if not has_sfm_points:
        cfg.coarse_to_fine = AUTO_COARSE_TO_FINE
        return (f"coarse_to_fine auto: {cfg.coarse_to_fine} (no SfM points: {coarse_schedule_words(cfg)}; lego 30k: "
                "36.03 dB in 56.7 s against 35.95 dB / 75.9 s at full resolution); --set coarse_to_fine=1 turns it off")
    cfg.coarse_to_fine = 1
    return ("coarse_to_fine auto: 1, off (SfM points: on real captures at 7k it was mixed, bonsai +0.29 dB, "
            "fern -0.32, beer -0.30; docs/TRAINING.md); --set coarse_to_fine=4 turns it on")


def resolve_densify_grad(cfg: TrainConfig, has_sfm_points: bool, cuda: bool) -> str | None:
    """Turn ``cfg.densify_grad == "auto"`` into the statistic it stands for, in place (after
    :func:`resolve_strategy`: it depends on the resolved strategy):

    - "absgrad" (AbsGS) when the dataset has SfM points (a real capture), the strategy is "default" (3DGS's
      densification; the MCMC budget reads no gradient statistic) and the run has the CUDA kernels (the CPU
      reference leaves no absolute gradient) — measured on bonsai at 7k, seeds 0 and 1: 28.44 dB in 14.0 s
      against 27.78 dB in 17.0 s (docs/BENCHMARKS.md);
    - else "grad" (3DGS): lego at 30k (no SfM points) gave 35.25 / 35.78 dB with absgrad at thresholds 8e-4 / 6e-4,
      against 36.02 dB with it; and also "grad" where ``grad_threshold`` differs from its default (a threshold set
      for 3DGS's statistic, which "absgrad" would not read).

    Returns a one-line note for the log where the choice concerns a real capture under 3DGS's densification (what
    "auto" became and why); None when ``cfg.densify_grad`` was already explicit, under the MCMC budget (which reads
    no gradient statistic) and without SfM points (3DGS's statistic, the plain recipe: nothing to say) — except
    that an explicit "absgrad" with ``grad_threshold`` set away from its default gets a note that the latter is
    not read. A resumed run keeps the statistic its checkpoint recorded."""
    default_threshold = TrainConfig.grad_threshold   # the field's default (a dataclass keeps it on the class)
    if cfg.densify_grad != "auto":
        if cfg.densify_grad == "absgrad" and cfg.strategy != "mcmc" and cfg.grad_threshold != default_threshold:
            return (f"densify_grad absgrad: grad_threshold {cfg.grad_threshold:g} is not read under it "
                    f"(absgrad_threshold {cfg.absgrad_threshold:g} is: --set absgrad_threshold=T)")
        return None
    if cfg.strategy == "mcmc":
        cfg.densify_grad = "grad"
        return None
    if has_sfm_points and cuda and cfg.grad_threshold != default_threshold:
        cfg.densify_grad = "grad"
        return (f"densify_grad auto: grad (grad_threshold is set, {cfg.grad_threshold:g}: it is 3DGS's statistic's "
                "threshold; --set densify_grad=absgrad with --set absgrad_threshold=T for AbsGS's)")
    if has_sfm_points and cuda:
        cfg.densify_grad = "absgrad"
        return (f"densify_grad auto: absgrad (a real capture under 3DGS's densification: Σ_pixels |∂L_p/∂means2D| "
                f"against absgrad_threshold {cfg.absgrad_threshold:g}; bonsai 7k +0.65 dB in 18 % less time); "
                "--set densify_grad=grad for 3DGS's statistic")
    cfg.densify_grad = "grad"
    if has_sfm_points:
        return ("densify_grad auto: grad (the CPU backend has no absolute gradients; on the CUDA kernels a real "
                "capture under 3DGS's densification uses absgrad)")
    return None


#: the step counts :attr:`TrainConfig.schedule_scale` multiplies (0 and None stay as they are: off, or "the run's
#: length")
SCHEDULE_STEP_FIELDS = ("densify_from", "densify_until", "densify_interval", "opacity_reset_interval",
                        "sh_degree_interval", "coarse_to_fine_iters", "position_lr_max_steps")


def resolve_schedule_scale(cfg: TrainConfig) -> str | None:
    """Apply ``cfg.schedule_scale`` in place: each of :data:`SCHEDULE_STEP_FIELDS` that is a positive count becomes
    round(count × scale), at least 1; then ``schedule_scale`` is 1.0 (applied once: a resumed run's config holds
    the scaled counts). Returns a line for the log naming the counts it changed, or None when the scale is 1."""
    scale = float(cfg.schedule_scale)
    if scale == 1.0:
        return None
    changed = []
    for name in SCHEDULE_STEP_FIELDS:
        old = getattr(cfg, name)
        if old is None or int(old) <= 0:
            continue
        new = max(1, round(int(old) * scale))
        setattr(cfg, name, new)
        changed.append(f"{name} {int(old):,} → {new:,}")
    cfg.schedule_scale = 1.0
    return (f"schedule_scale {scale:g}: " + (", ".join(changed) if changed else "no step count to scale")
            + f" (a run of {cfg.iterations:,} iterations)")


def coarse_to_fine_span(cfg: TrainConfig) -> int:
    """T = min(``coarse_to_fine_iters``, ⌊``iterations`` × ``coarse_to_fine_share``⌋): the iterations the coarse
    levels take (0: none). The product is exact, of the share as written (its shortest decimal): in binary floating
    point 100 × 0.29 is 28.999999999999996, which gave 28."""
    return min(int(cfg.coarse_to_fine_iters), _share_of(int(cfg.iterations), float(cfg.coarse_to_fine_share)))


@functools.lru_cache(maxsize=64)
def _share_of(iterations: int, share: float) -> int:
    """⌊iterations × share⌋ exactly, of the share as written (:func:`coarse_to_fine_span`; cached: a step asks it)."""
    from fractions import Fraction

    return math.floor(iterations * Fraction(repr(share)))


def training_downscale(cfg: TrainConfig, iteration: int) -> int:
    """The coarse-to-fine factor the training images are divided by at ``iteration`` (1 = full resolution):
    ``coarse_to_fine`` = 2^k halves k times, in k equal phases over the first T iterations
    (:func:`coarse_to_fine_span`; ``TrainConfig.coarse_to_fine``: with the default share a short run keeps its
    second half at full resolution). Iterations count from 1; iteration T + 1 on is full. ValueError for an
    unresolved "auto" (the Trainer resolves it from its dataset: :func:`resolve_coarse_to_fine`)."""
    if cfg.coarse_to_fine == "auto":
        raise ValueError("TrainConfig.coarse_to_fine is 'auto': the Trainer resolves it from its dataset "
                         "(Trainer.config holds the factor in use)")
    k = int(cfg.coarse_to_fine).bit_length() - 1
    total = coarse_to_fine_span(cfg)
    if k <= 0 or iteration > total:
        return 1
    phase = min(k - 1, (iteration - 1) * k // max(1, total))
    return 2 ** (k - phase)
