"""Held-out quality and training time of rigel beside a plain gsplat 1.5.3 training loop on real captures.

Per capture (a dataset folder ``rigel_core.data.load_dataset`` reads: COLMAP, instant-ngp / nerfstudio
``transforms.json`` — e.g. the converter's output with ``ply_file_path`` SfM points — or Blender), both methods get:

* the **same split and images**: the loader's (every 8th view, sorted by name, held out for COLMAP and
  transforms.json data), ``--downscale``, the loader's background (black unless ``--white-bg``);
* the **same start**: one initial ``GaussianModel`` built by rigel's ``Trainer`` (the dataset's SfM points and
  their colours, isotropic scales = mean distance to the 3 nearest neighbours, opacity 0.1, identity rotations,
  SH degree 3 with zero higher-order coefficients; without SfM points the random start "auto" gives (half the
  automatic budget, at most 100k, along the training pixels' rays for a photo capture); plus
  the background points ``init_background_points`` adds — by default "auto": 20000 when the SfM points reach
  under half of the median training view, as on bonsai). rigel trains from a copy of its tensors, gsplat from
  another; ``--rigel-config`` overrides that change rigel's initial model (``init_*``, ``sh_degree``) therefore
  change both starts, every other override only rigel. The rigel runs' Trainers, given that model, resolve
  "auto" (background count and strategy) from the dataset exactly as the Trainer that built it did;
* the **same objective and schedule**: (1 − 0.2)·L1 + 0.2·(1 − SSIM) with rigel's SSIM
  (``rigel_core.train.losses``: 11×11 Gaussian window σ 1.5, zero padding), Adam (eps 1e-15) at the 3DGS rates
  (means 1.6e-4·extent decaying exponentially to 1.6e-6·extent over the run — ``rigel_core.train.optim.position_lr``
  on both sides —, log-scales 5e-3, quaternions 1e-3, opacity logits 5e-2, SH DC 2.5e-3, higher SH 2.5e-3/20),
  active SH degree min(3, iteration // 1000), the same number of iterations;
* **validity masks**: where a frame carries ``frame.mask`` (H,W) (1 = valid), the gsplat loss and both methods'
  metrics use it — masked L1 and MSE are means over valid pixels, masked SSIM is the SSIM map of pred·m, gt·m
  averaged over valid pixels (rigel's own trainer applies the mask to its loss).

The two loops:

* ``rigel``: ``rigel_core.train.Trainer`` with ``TrainConfig(iterations=max(--iters), eval_every=0)`` and otherwise
  its defaults (plus ``--rigel-config key=value`` overrides), ``Trainer.step()`` in a loop. Those defaults include
  the resolution of ``coarse_to_fine = "auto"``: full-resolution training (1) on a capture with SfM points, 4 (¼ then
  ½ resolution over the first min(3000, iterations / 2) iterations) on one without (``--rigel-config
  coarse_to_fine=4`` or ``=1`` chooses; real.md notes a factor above 1). Its default strategy
  "auto" is the MCMC budget (one Gaussian per 32 training pixels, 10k to 1M) on every photo capture, 3DGS's
  densification for an object on a transparent background and where background points were added automatically
  to a partial SfM of ≥ 100 views (bonsai), and there, on CUDA, ``densify_grad = "auto"`` picks AbsGS's
  statistic at ``absgrad_threshold`` 8e-4 — rigel's default against gsplat's default loop
  (``--rigel-config strategy=default --rigel-config densify_grad=grad`` compares 3DGS's densification with 3DGS's
  statistic on both sides; real.md names each run's strategy and statistic); with ``rigel-mcmc`` in
  ``--methods`` the ``rigel`` run is ``strategy="default"`` (the comparison's base) unless ``--rigel-config
  strategy=…`` says otherwise.
* ``gsplat``: parameters in a ``torch.nn.ParameterDict`` (``means``, ``scales`` (log), ``quats``, ``opacities``
  (logits), ``sh0`` (N,1,3), ``shN`` (N,K−1,3)), one ``torch.optim.Adam`` per key, ``gsplat.rasterization(means,
  quats, exp(scales), sigmoid(opacities), colors=cat(sh0, shN) (N,K,3), viewmats, Ks, W, H, sh_degree=active,
  packed=False)`` composited onto the background, ``gsplat.DefaultStrategy()`` with its defaults
  (``check_sanity``, ``initialize_state(scene_scale=extent)``, ``step_pre_backward`` before the backward,
  ``step_post_backward(..., packed=False)`` after the Adam step, step counted from 0 — the order and
  conventions of gsplat's ``examples/simple_trainer.py``), views in a fresh random order each epoch from a
  generator seeded with ``--seed``; ``torch.manual_seed(--seed)`` for the strategy's split samples. gsplat's
  one-time CUDA JIT build is triggered before the timed loop and not counted.

Measured per scene, method and checkpoint (``--iters 7000,30000``: one run to the largest, evaluated at each):
held-out PSNR and SSIM (means over the views of per-view values; renders clamped to [0, 1]; one metric function
for both methods — rigel's ``Trainer.evaluate`` is recorded beside it in the JSON as a cross-check), Gaussian
count, training time (s: wall time of the loop up to a ``torch.cuda.synchronize()``, evaluations excluded), peak
GPU memory (``torch.cuda.max_memory_allocated``, reset before each run; images on the GPU included), and the PSNR
/ SSIM of 8 evenly spaced training views (``train_psnr`` / ``train_ssim``, in real.md's notes: a run sharp on its
training views and poor on the held-out ones has floaters or overfits), and the share of wide Gaussians with their
mean opacity (``wide_share`` / ``wide_opacity`` / ``median_scale``: :func:`shape_stats`, in real.md's notes: a fog
of wide faint Gaussians shows there); an MCMC run also the share of its Gaussians at or under the dead bound and
the mean share each relocation step since the previous checkpoint moved (``dead_share`` / ``relocated_share``,
in the notes: a model that keeps dying turns most of itself over). ``--time-limit S`` stops a run once its
training time passes S seconds (evaluated there, recorded as stopped);
Ctrl-C / SIGINT stops the current run the same way and writes what was measured. **Time to the gsplat loop's PSNR**
(issue 39): per scene and gsplat loop, the first rigel checkpoint whose PSNR is at least that loop's at its last
checkpoint (a stopped run's last), with rigel's iteration and training seconds there and their ratio to the loop's
seconds, or "not reached by it N" (:func:`time_to_psnr`; only checkpoints are seen).

Outputs (under ``--out``, default ``$OUT``, else ``real-<UTC time>``; an existing result there is never
overwritten): ``real.md`` (the table: time ratio = rigel / gsplat training seconds, ΔPSNR = rigel − gsplat at the
same iteration; then the time-to-PSNR table), ``real.json`` (everything, per-view metrics included; the time to
PSNR per scene in ``time_to_peer_psnr``), ``summary.txt`` (one line per scene) and
``real_<scene>_<view>.png`` (the first held-out view: ground truth | rigel | gsplat, at each method's last
checkpoint). Nothing is written into the datasets. stdout: one line per evaluation.

**The stronger peer** (issue 35): ``--methods rigel,gsplat,gsplat-mcmc`` adds gsplat's ``MCMCStrategy`` from the same
start, loss and schedule (plus its opacity and scale regularisers, 0.01 each, as gsplat's example trainer adds them),
capped at the ``rigel`` run's Gaussian budget (its ``max_gaussians`` under MCMC, else its final count; ``--mcmc-cap``
fixes it); real.md then has rigel's time ratio and ΔPSNR against both gsplat loops.

**The suite** (issue 35): ``--scenes suite`` runs :data:`SUITE` — the four captures and variants derived from them
at load (``NAME~VARIANT``, :data:`VARIANTS`: ``nosfm`` SfM points removed, ``halfviews`` / ``fewviews`` every 2nd /
8th training view, ``halfres`` half resolution), recipes in code rather than copies of the images.

**MCMC vs default** (issue 17): ``--methods rigel,rigel-mcmc`` runs rigel's default strategy, then rigel with
``strategy="mcmc"`` and ``max_gaussians`` = the count the default run ended with (its last checkpoint): the two
at equal Gaussian counts, the same start, seed and overrides (``--rigel-config`` applies to both,
``--mcmc-config key=value`` to the MCMC run only; ``--mcmc-cap N`` fixes the budget instead, e.g. for an MCMC run
in a lane of its own). real.md then has a second table, MCMC vs default per scene and checkpoint (PSNR, SSIM,
Gaussians, training time, peak memory, ΔPSNR = MCMC − default).

Run on the GPU machine: ``python bench/real.py [--scenes bonsai,fern,PATH] [--iters 7000,30000] [--downscale 1]
[--methods rigel,rigel-mcmc,gsplat] [--rigel-config key=value ...] [--time-limit S]``; default scenes: every
dataset folder under ``$RIGEL_SHARED_DATA/real``. CPU check: ``--device cpu --iters 20 --downscale 8 --max-frames 6``
(rigel's PyTorch reference backend; gsplat needs CUDA and is skipped with the reason). Runs made separately (``--methods
rigel`` on one GPU, ``--methods gsplat`` on another, or in two device calls) are joined by ``python bench/real.py
--merge DIR DIR --out DIR`` (no training; the protocols must match).
"""
from __future__ import annotations

import argparse
import ast
import dataclasses
import datetime
import json
import math
import os
import subprocess
import sys
import time
import traceback
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.forward import fmt  # noqa: E402
from rigel_core import config as rc_config  # noqa: E402
from rigel_core.atomic import atomic_path  # noqa: E402
from rigel_core.data.stream import stream_stats  # noqa: E402
from rigel_core.model import PARAM_NAMES, GaussianModel  # noqa: E402
from rigel_core.train import TrainConfig  # noqa: E402
from rigel_core.train.losses import l1_loss, psnr_from_mse, ssim, ssim_map  # noqa: E402
from rigel_core.train.mcmc import MCMCReport, dead_share, length_unit  # noqa: E402
from rigel_core.train.optim import position_lr  # noqa: E402
from rigel_core.train.trainer import Trainer  # noqa: E402

#: "rigel-mcmc": rigel with the 3DGS-MCMC budget (``strategy="mcmc"``, rigel_core/train/mcmc.py) capped at the
#: Gaussian count the default ``rigel`` run of the same scene ended with (or ``--mcmc-cap``): equal counts
#: "gsplat-mcmc": gsplat's MCMCStrategy (the stronger peer a gsplat user runs) from the same start, loss and schedule,
#: with the Gaussian budget of the scene's ``rigel`` run (its MCMC budget, or the count it ended with) or ``--mcmc-cap``
METHODS = ("rigel", "rigel-mcmc", "gsplat", "gsplat-mcmc")
RIGEL_METHODS = ("rigel", "rigel-mcmc")
GSPLAT_METHODS = ("gsplat", "gsplat-mcmc")
DEFAULT_ITERS = "7000,30000"
GIB = 2 ** 30


class BenchError(Exception):
    """A bad option or input: main prints its message as one line and exits with status 2."""


# ---- options --------------------------------------------------------------------------------------------
def shared_data() -> Path:
    """``$RIGEL_SHARED_DATA``, else ``../shared/data`` beside the repository (bench/forward.py's convention)."""
    return Path(os.environ.get("RIGEL_SHARED_DATA", ROOT.parent / "shared" / "data"))


#: capture variants (issue 35), applied to a loaded capture by :func:`apply_variants` — recipes, not copies of the
#: images — so that the suite holds the kinds of capture users bring: ``NAME~VARIANT[~VARIANT]`` in ``--scenes``
VARIANTS = {
    "nosfm": "SfM points removed (random initialisation, as for a capture without them)",
    "halfviews": "every other training view (the held-out views unchanged)",
    "fewviews": "every 8th training view (a small capture; the held-out views unchanged)",
    "halfres": "images at half resolution (the loader's downscale doubled)",
    "opaque": "alpha dropped after compositing onto the background (an object photographed on a plain backdrop: "
              "a photo capture to the rules, lego~opaque)",
}
#: ``--scenes suite``: the four captures and the variants that model what users bring (issue 35): SfM points removed,
#: half and an eighth of the views, half resolution, no points with a distorted lens (beer~nosfm, fox)
SUITE = ("bonsai", "fern", "beer", "fox", "bonsai~nosfm", "fern~nosfm", "beer~nosfm", "bonsai~halfviews",
         "bonsai~fewviews", "beer~halfviews", "fox~halfres", "beer~halfres")


def split_variants(item: str, flag: str = "--scenes") -> tuple[str, tuple[str, ...]]:
    """``"fern~nosfm~halfres"`` → ("fern", ("nosfm", "halfres")); BenchError naming ``flag`` (the command line's,
    which gave ``item``) for a variant :data:`VARIANTS` lacks, or no capture before the first ``~``."""
    base, *variants = item.split("~")
    if not base:
        raise BenchError(f"{flag} {item!r}: no capture before its first '~' (give DIR~VARIANT)")
    bad = [v for v in variants if v not in VARIANTS]
    if bad:
        raise BenchError(f"{flag} {item!r}: unknown variant {bad[0]!r}; variants: "
                         + ", ".join(f"{k} ({v})" for k, v in VARIANTS.items()))
    return base, tuple(dict.fromkeys(variants))


def apply_variants(ds, variants) -> None:
    """Apply :data:`VARIANTS` (except ``halfres``, which the loader's downscale does) to a loaded dataset, in place.
    The scene's centre and extent stay the capture's (they scale learning rates: the same scene)."""
    if "nosfm" in variants:
        ds.points = ds.point_colors = None
    if "halfviews" in variants:
        ds.train = ds.train[::2]
    if "fewviews" in variants:
        ds.train = ds.train[::8]
    if "opaque" in variants:   # the composited image stays; a streamed frame with alpha is loaded to drop it
        ds.train, ds.test = ([f if f.alpha is None else dataclasses.replace(loaded([f])[0], alpha=None)
                              for f in frames] for frames in (ds.train, ds.test))


def find_scenes(spec: str | None) -> list[tuple[str, Path]]:
    """(name, path, variants) of each capture: ``spec`` is comma-separated paths or names of folders under
    ``$RIGEL_SHARED_DATA/real``, each optionally followed by ``~VARIANT`` (:data:`VARIANTS`; the name keeps them, e.g.
    "fern~nosfm"), or "suite" (:data:`SUITE`, the captures that exist); None = every folder there that
    ``detect_format`` recognises (sorted). Raises BenchError naming the path when a capture is missing or holds no
    dataset."""
    from rigel_core.data import DatasetError, detect_format

    real = shared_data() / "real"
    if spec is None:
        if not real.is_dir():
            raise BenchError(f"{real}: no such directory (set RIGEL_SHARED_DATA or give --scenes)")
        found = []
        for d in sorted(p for p in real.iterdir() if p.is_dir()):
            try:
                detect_format(d)
            except DatasetError as e:
                print(f"skipping {d}: {e}", flush=True)
                continue
            found.append((d.name, d, ()))
        if not found:
            raise BenchError(f"{real}: no dataset folder found")
        return found
    out = []
    items = [s.strip() for s in spec.split(",")]
    if items == ["suite"]:
        items = [i for i in SUITE if (real / i.split("~")[0]).is_dir()]
        if not items:
            raise BenchError(f"--scenes suite: none of its captures is under {real}")
    for item in items:
        if not item:
            continue
        base, variants = split_variants(item)
        p = Path(base)
        if not p.exists():
            p = real / base
        try:
            fmt_name, root = detect_format(p)
        except DatasetError as e:
            raise BenchError(f"--scenes {item!r}: {e}") from None
        name = "~".join(((root.parent if root.is_file() else root).name, *variants))
        out.append((name, p, variants))
    if not out:
        raise BenchError("--scenes: no scene given")
    names = [n for n, _, _ in out]
    if len(set(names)) != len(names):
        raise BenchError(f"--scenes: two captures share a folder name ({', '.join(names)}); output files would clash")
    return out


def parse_iters(spec: str) -> list[int]:
    """Sorted distinct positive checkpoints from ``"7000,30000"``; BenchError otherwise."""
    try:
        its = sorted({int(s) for s in spec.split(",") if s.strip()})
    except ValueError:
        raise BenchError(f"--iters {spec!r}: expected comma-separated positive integers") from None
    if not its or its[0] < 1:
        raise BenchError(f"--iters {spec!r}: expected comma-separated positive integers")
    return its


def _parse_value(text: str, default):
    low = text.strip().lower()
    if low in ("none", "null"):
        return None
    if isinstance(default, bool):
        if low in ("1", "true", "yes", "on"):
            return True
        if low in ("0", "false", "no", "off"):
            return False
        raise ValueError("expected true or false")
    try:
        value = ast.literal_eval(text)
    except (ValueError, SyntaxError):
        value = text  # a bare word: a string option
    if isinstance(default, float) and isinstance(value, int) and not isinstance(value, bool):
        value = float(value)
    if isinstance(value, list):
        value = tuple(value)
    return value


def parse_overrides(items, flag: str = "--rigel-config") -> dict:
    """``["key=value", ...]`` → {field: value} for :class:`TrainConfig`. Values are Python literals (numbers,
    tuples, None; true/false for booleans; a bare word is a string). BenchError for a malformed item or a
    field TrainConfig does not have (the message lists them)."""
    fields = {f.name: f for f in dataclasses.fields(TrainConfig)}
    defaults = TrainConfig()
    out = {}
    for item in items or []:
        key, sep, text = item.partition("=")
        key = key.strip().replace("-", "_")
        if not sep or not key:
            raise BenchError(f"{flag} {item!r}: expected key=value")
        if key not in fields:
            raise BenchError(f"{flag} {item!r}: TrainConfig has no field {key!r} "
                             f"(fields: {', '.join(fields)})")
        if key in ("iterations", "eval_every"):
            raise BenchError(f"{flag} {item!r}: {key} is set by the benchmark (--iters; evaluation at the "
                             "checkpoints)")
        try:
            out[key] = _parse_value(text, getattr(defaults, key))
        except ValueError as e:
            raise BenchError(f"{flag} {item!r}: {e}") from None
    return out


def rigel_config(iterations: int, seed: int, overrides: dict) -> TrainConfig:
    """The rigel run's config: defaults, ``iterations``, no evaluation inside ``step()``, then the overrides.
    BenchError when TrainConfig rejects a value."""
    cfg = TrainConfig(iterations=iterations, eval_every=0, seed=seed)
    for k, v in overrides.items():
        setattr(cfg, k, v)
    try:
        cfg.validate()
    except ValueError as e:
        raise BenchError(f"--rigel-config: {e}") from None
    return cfg


def mcmc_config(cfg: TrainConfig, cap: int, overrides: dict) -> TrainConfig:
    """The ``rigel-mcmc`` run's config: ``cfg`` (the rigel run's) with ``strategy="mcmc"``, ``max_gaussians=cap``,
    then ``overrides`` (``--mcmc-config``). BenchError when TrainConfig rejects a value."""
    out = dataclasses.replace(cfg, strategy="mcmc", max_gaussians=int(cap))
    for k, v in overrides.items():
        setattr(out, k, v)
    try:
        out.validate()
    except ValueError as e:
        raise BenchError(f"--mcmc-config: {e}") from None
    return out


def gsplat_mcmc_cap(sc: dict, fixed: int | None) -> int:
    """The budget of the ``gsplat-mcmc`` run of scene record ``sc``: ``fixed`` (``--mcmc-cap``) when given, else the
    ``rigel`` run's own — its ``max_gaussians`` when it trained under the MCMC budget, else the Gaussian count it
    ended with. BenchError when that run is missing or failed."""
    if fixed:
        return int(fixed)
    r = sc.get("runs", {}).get("rigel") or {}
    conf = r.get("config") or {}
    if conf.get("strategy") == "mcmc" and conf.get("max_gaussians"):
        return int(conf["max_gaussians"])
    return mcmc_cap(sc, None)


def mcmc_cap(sc: dict, fixed: int | None) -> int:
    """The MCMC budget for scene record ``sc``: ``fixed`` (``--mcmc-cap``) when given, else the Gaussian count at the
    last checkpoint of the scene's default ``rigel`` run. BenchError when that run is missing or failed."""
    if fixed:
        return int(fixed)
    r = sc.get("runs", {}).get("rigel") or {}
    if not r.get("checkpoints"):
        raise BenchError(f"{sc['scene']}: rigel-mcmc needs the default rigel run's count (it "
                         f"{'failed' if r else 'did not run'}); give --mcmc-cap N")
    return int(r["checkpoints"][-1]["num_gaussians"])


# ---- loss and metrics (one code for both methods) -------------------------------------------------------
def frame_mask(frame, device) -> torch.Tensor | None:
    """The frame's validity mask as (H,W) float32 weights on ``device`` (1 = valid), or None (every pixel).
    A boolean or integer mask counts its non-zero pixels as valid (a 0/255 mask too); a float mask is used as
    weights in [0, 1]."""
    m = getattr(frame, "mask", None)
    if m is None:
        return None
    m = torch.as_tensor(m)
    if not m.is_floating_point():
        m = m != 0
    return m.to(device=device, dtype=torch.float32)


def masked_l1(pred: torch.Tensor, gt: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """Mean |pred − gt| over the valid pixels (weights ``mask`` (H,W)) and channels; the plain L1 without mask."""
    if mask is None:
        return l1_loss(pred, gt)
    return ((pred - gt).abs() * mask[..., None]).sum() / (mask.sum() * pred.shape[-1])


def masked_ssim(pred: torch.Tensor, gt: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """SSIM (``rigel_core.train.losses.ssim_map``) of pred·m and gt·m, averaged over the valid pixels; the plain
    mean SSIM without mask."""
    if mask is None:
        return ssim(pred, gt)
    m3 = mask[..., None]
    smap = ssim_map(pred * m3, gt * m3)  # (1, C, H, W)
    return (smap * mask[None, None]).sum() / (mask.sum() * smap.shape[1])


def train_loss(pred, gt, mask, lambda_dssim: float) -> torch.Tensor:
    """(1 − λ)·L1 + λ·(1 − SSIM), masked as above: the gsplat loop's loss, from the separate functions of
    :mod:`rigel_core.train.losses` (``Trainer.compute_loss``'s formula; rigel's own runs take its fused kernels on
    CUDA, the same values to float64 rounding: tests/test_losses.py)."""
    return (1.0 - lambda_dssim) * masked_l1(pred, gt, mask) + lambda_dssim * (1.0 - masked_ssim(pred, gt, mask))


@torch.no_grad()
def view_metrics(pred: torch.Tensor, gt: torch.Tensor, mask: torch.Tensor | None) -> tuple[float, float]:
    """(PSNR dB, SSIM) of one view: ``pred`` clamped to [0, 1]; MSE and SSIM over the valid pixels."""
    pred = pred.clamp(0.0, 1.0)
    if mask is None:
        mse = float(((pred - gt) ** 2).mean())
    else:
        mse = float((((pred - gt) ** 2) * mask[..., None]).sum() / (mask.sum() * pred.shape[-1]))
    return psnr_from_mse(mse), float(masked_ssim(pred, gt, mask))


@torch.no_grad()
def evaluate_views(render, frames, device) -> dict:
    """Mean PSNR and SSIM of ``render(frame) -> (H,W,3)`` over ``frames`` (per-view values kept); the first
    view's render as (H,W,3) uint8 in ``first``."""
    per_view, first = [], None
    for f in frames:
        pred = render(f).clamp(0.0, 1.0)
        if first is None:
            first = (pred * 255.0 + 0.5).to(torch.uint8).cpu().numpy()
        gt = f.image.to(device, torch.float32)
        p, s = view_metrics(pred, gt, frame_mask(f, device))
        per_view.append({"name": f.name, "psnr": p, "ssim": s})
    return {"psnr": float(np.mean([v["psnr"] for v in per_view])) if per_view else None,
            "ssim": float(np.mean([v["ssim"] for v in per_view])) if per_view else None,
            "n_views": len(per_view), "per_view": per_view, "first": first}


# ---- the shared driver ----------------------------------------------------------------------------------
def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def peak_gib(device: torch.device) -> float | None:
    return torch.cuda.max_memory_allocated(device) / GIB if device.type == "cuda" else None


def reserved_gib(device: torch.device) -> float | None:
    """The most memory the caching allocator held (``torch.cuda.max_memory_reserved``): beside :func:`peak_gib`, what
    the process took from the GPU, cached blocks and CUDA-graph pools included (beer~nosfm: 2.9 GiB allocated at the
    peak, 8–38 GiB held by the process, docs/BENCHMARKS.md)."""
    return torch.cuda.max_memory_reserved(device) / GIB if device.type == "cuda" else None


#: training views scored at each checkpoint beside the held-out ones (evenly spaced): a run whose held-out PSNR falls
#: while its training views stay sharp has floaters or overfits; one where both fall has failed everywhere
TRAIN_VIEWS_SCORED = 8

#: a Gaussian whose largest scale exceeds this share of the scene extent counts as wide in ``shape_stats`` (3DGS's
#: pruning bound, ``max_world_size``): beer~nosfm's fog was 87 % such Gaussians at 1M, at a mean opacity of 0.01
WIDE_SHARE_OF_EXTENT = 0.1
#: a Gaussian below this opacity counts as faint in ``shape_stats``: where the MCMC noise's default gate
#: σ(−k(o − t)) still passes a tenth of the noise, t + ln 9 / k (0.027). beer~nosfm's 1M run fails with the noise
#: on such Gaussians (a gate of k = 300, which closes above about 0.012, cured it)
FAINT_OPACITY = TrainConfig.mcmc_noise_t + math.log(9.0) / TrainConfig.mcmc_noise_k


@torch.no_grad()
def shape_stats(log_scales: torch.Tensor, opacity_logits: torch.Tensor, extent: float) -> dict:
    """What the model's Gaussians look like at a checkpoint, recorded beside its scores: ``wide_share`` (the share
    of Gaussians whose largest scale exceeds ``WIDE_SHARE_OF_EXTENT`` × ``extent``), ``wide_opacity`` (their mean
    opacity; None when there are none), ``median_scale`` (the median largest scale, in scene extents),
    ``faint_share`` (the share of Gaussians below ``FAINT_OPACITY``, inside the MCMC noise's gate) and
    ``median_opacity``. A fog of wide faint Gaussians shows as a large share at a low opacity. Non-finite rows
    (culled Gaussians) are left out."""
    largest = torch.exp(log_scales.detach().float()).amax(1)
    opac = torch.sigmoid(opacity_logits.detach().float().reshape(-1))
    ok = torch.isfinite(largest) & torch.isfinite(opac)
    largest, opac = largest[ok], opac[ok]
    if largest.numel() == 0:
        return {"wide_share": None, "wide_opacity": None, "median_scale": None, "faint_share": None,
                "median_opacity": None}
    wide = largest > WIDE_SHARE_OF_EXTENT * extent
    return {"wide_share": float(wide.float().mean()),
            "wide_opacity": float(opac[wide].mean()) if bool(wide.any()) else None,
            "median_scale": float(largest.median()) / extent,
            "faint_share": float((opac < FAINT_OPACITY).float().mean()),
            "median_opacity": float(opac.median())}


def loaded(frames) -> list:
    """``frames`` with each streamed one decoded (``Frame.load``), for this bench's own evaluations."""
    return [f.load() if hasattr(f, "load") else f for f in frames]


def spaced(frames, k: int) -> list:
    """At most ``k`` of ``frames``, evenly spaced (the first always), :func:`loaded`."""
    frames = list(frames)
    if len(frames) > k > 0:
        frames = [frames[round(i * (len(frames) - 1) / max(1, k - 1))] for i in range(k)]
    return loaded(frames[:max(0, k)])


def train_and_evaluate(label: str, step, render, count, test_frames, checkpoints: list[int],
                       time_limit: float | None, device: torch.device, extra_eval=None, train_frames=None) -> dict:
    """Call ``step(it)`` for it = 1 … max(checkpoints); evaluate at each checkpoint and where the run stops early
    (``time_limit`` seconds of training passed, or KeyboardInterrupt). ``train_frames`` (optional, a few training
    views: :func:`spaced`) are scored too, as ``train_psnr`` / ``train_ssim`` (evaluation time, not training time).

    Training time: wall time of the steps, each stretch closed by a device synchronize; evaluations excluded.
    Returns {"checkpoints": [...], "stopped_at": iteration or None, "stop_reason": str or None,
    "interrupted": bool, "first_view": uint8 (H,W,3) of the last evaluation or None}.
    """
    out = {"checkpoints": [], "stopped_at": None, "stop_reason": None, "interrupted": False, "first_view": None}
    last, wanted = checkpoints[-1], set(checkpoints)
    train_s, it = 0.0, 0

    def checkpoint(iteration):
        t_eval = time.perf_counter()
        ev = evaluate_views(render, test_frames, device)
        row = {"iteration": iteration, "psnr": ev["psnr"], "ssim": ev["ssim"], "num_gaussians": int(count()),
               "train_s": train_s, "peak_gib": peak_gib(device), "reserved_gib": reserved_gib(device),
               "n_views": ev["n_views"], "per_view": ev["per_view"]}
        if train_frames:
            tv = evaluate_views(render, train_frames, device)
            row["train_psnr"], row["train_ssim"] = tv["psnr"], tv["ssim"]
        if extra_eval is not None:
            row.update(extra_eval())
        row["eval_s"] = time.perf_counter() - t_eval
        out["checkpoints"].append(row)
        out["first_view"] = ev["first"]
        stop = f"  (stopped: {out['stop_reason']})" if out["stop_reason"] else ""
        seen = f" (training views {fmt(row['train_psnr'])})" if "train_psnr" in row else ""
        print(f"  {label:<24} it {iteration:>6}  PSNR {fmt(row['psnr'])} dB{seen}  SSIM {fmt(row['ssim'], '.4f')}  "
              f"N {row['num_gaussians']:,}  train {train_s:.1f} s  peak {fmt(row['peak_gib'])} GiB "
              f"(held {fmt(row['reserved_gib'])})  "
              f"(eval {row['eval_s']:.1f} s, {ev['n_views']} views){stop}", flush=True)

    sync(device)
    t0 = time.perf_counter()
    evaluating = False
    try:
        for it in range(1, last + 1):
            step(it)
            over = time_limit is not None and train_s + time.perf_counter() - t0 >= time_limit
            if it in wanted or (over and it < last):
                sync(device)
                train_s += time.perf_counter() - t0
                if over and it < last:
                    out["stopped_at"], out["stop_reason"] = it, f"time limit {time_limit:g} s"
                evaluating = True
                checkpoint(it)
                evaluating = False
                if out["stopped_at"]:
                    break
                t0 = time.perf_counter()
    except KeyboardInterrupt:
        out["interrupted"], out["stop_reason"] = True, "interrupted"
        if not evaluating and it >= 1:  # stopped inside a training step: evaluate what was trained
            sync(device)
            train_s += time.perf_counter() - t0
            out["stopped_at"] = it
            try:
                checkpoint(it)
            except Exception as e:  # noqa: BLE001  (a step cut in the middle may leave the model torn)
                print(f"  {label}: no evaluation after the interrupt ({type(e).__name__}: {e})", flush=True)
    return out


# ---- rigel ----------------------------------------------------------------------------------------------
def clone_model(model: GaussianModel, device=None) -> GaussianModel:
    """An independent copy (never aliasing: Adam updates parameters in place)."""
    return GaussianModel(*(getattr(model, p).detach().to(device or getattr(model, p).device).clone()
                           for p in PARAM_NAMES))


def initial_model(ds, cfg: TrainConfig, device) -> GaussianModel:
    """The initial model rigel's ``Trainer`` builds for ``ds`` under ``cfg`` (SH appearance), copied to the CPU."""
    probe = Trainer(ds, dataclasses.replace(cfg, appearance="sh"), device=device)
    model = clone_model(probe.model, "cpu")
    del probe
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return model


def run_rigel(ds, base: GaussianModel, cfg: TrainConfig, checkpoints, time_limit, device, label) -> dict:
    trainer = Trainer(ds, cfg, model=clone_model(base, device), device=device)
    # evaluated before that iteration's densification, as 3DGS and this bench's gsplat loop (which refines at
    # 0-based steps ≡ 0 mod 100, never at a checkpoint's step 6999) are: the schedule waits one step
    trainer.schedule_holds = set(checkpoints)

    def trainer_eval():  # rigel's own evaluation (masks as the trainer applies them), recorded as a cross-check
        ev = trainer.evaluate(record=False)
        if ev is None:
            return {}
        # with --rigel-config exposure / appearance_grid / pose_opt (or eval_exposure / eval_pose_opt): the
        # exposure protocol's and the pose-fitted protocol's means too (docs/TRAINING.md)
        extra = {f"{k}_trainer": getattr(ev, k) for k in ("psnr_exposure", "ssim_exposure", "psnr_pose", "ssim_pose")
                 if getattr(ev, k, None) is not None}
        return {"psnr_trainer": ev.psnr, "ssim_trainer": ev.ssim, **extra}

    churn = []  # MCMC: the share of the Gaussians each relocation step since the last checkpoint moved

    def step(it):
        d = trainer.step().densify
        if isinstance(d, MCMCReport) and d.n_before > 0:
            churn.append(d.n_relocated / d.n_before)

    def evaluations():
        m = trainer.model
        row = {**trainer_eval(), **shape_stats(m.log_scales, m.opacity_logits, trainer.extent)}
        row["dead_share"] = dead_share(m, trainer.config)  # what MCMC's next relocation moves
        if churn:  # a relocation moves every dead Gaussian: a model that keeps dying turns most of itself over
            row["relocated_share"] = sum(churn) / len(churn)
            churn.clear()
        return row

    # a streamed dataset's held-out views decoded once for this bench's own evaluation (the trainer streams its own)
    test = loaded(ds.test)
    res = train_and_evaluate(label, step, trainer.render_frame,
                             lambda: trainer.model.num_gaussians, test, checkpoints, time_limit, device,
                             evaluations, train_frames=spaced(ds.train, TRAIN_VIEWS_SCORED))
    res["frames"] = stream_stats(trainer)   # metrics.json's "frames": streamed or not, the stream's figures
    res["config"] = trainer.config.to_dict()  # as trained: "auto" resolved (real.md names the strategy)
    res["nan_skips"] = trainer.nan_skips
    gs = trainer.graph_step  # how much of the run the CUDA graphs served, and what re-capturing cost the host
    res["graph_step"] = None if gs is None else gs.stats()
    if gs is not None:
        print(f"  [{label}] graph step: {gs.captures} captures ({gs.capture_s:.1f} s on the host), {gs.replays} "
              f"replayed steps, {gs.overflows} overflows"
              + (f", {gs.oom_retries} captures retried for memory" if gs.oom_retries else "")
              + (f", off: {gs.disabled}" if gs.disabled else ""),
              flush=True)
    for c in res["checkpoints"]:
        if c.get("psnr_trainer") is not None and c["psnr"] is not None and abs(c["psnr_trainer"] - c["psnr"]) > 1e-3:
            print(f"  note: Trainer.evaluate gives {c['psnr_trainer']:.3f} dB at it {c['iteration']} "
                  f"(shared metric {c['psnr']:.3f} dB)", flush=True)
    del trainer
    return res


# ---- gsplat ---------------------------------------------------------------------------------------------
def gsplat_status(device: torch.device) -> tuple[bool, str | None]:
    """(usable, reason when not): gsplat importable and a CUDA device."""
    try:
        import gsplat  # noqa: F401
    except Exception as e:  # noqa: BLE001  (ImportError, or a broken install)
        return False, f"gsplat not importable ({type(e).__name__}: {e})"
    if device.type != "cuda":
        return False, f"gsplat needs a CUDA device (--device {device})"
    return True, None


def gsplat_version() -> str | None:
    try:
        import gsplat

        return getattr(gsplat, "__version__", "?")
    except Exception:  # noqa: BLE001
        return None


def gsplat_warmup(device) -> float:
    """One tiny forward+backward through ``gsplat.rasterization`` (its first call builds the CUDA extension);
    returns the seconds it took."""
    from gsplat import rasterization

    t0 = time.perf_counter()
    g = torch.Generator().manual_seed(0)
    n = 64
    means = (torch.randn(n, 3, generator=g) * 0.3 + torch.tensor([0.0, 0.0, 3.0])).to(device).requires_grad_(True)
    quats = torch.randn(n, 4, generator=g).to(device)
    scales = torch.full((n, 3), 0.05, device=device)
    opac = torch.full((n,), 0.5, device=device)
    sh = torch.randn(n, 16, 3, generator=g).to(device)
    K = torch.tensor([[40.0, 0, 32], [0, 40.0, 32], [0, 0, 1]], device=device)
    img, _, _ = rasterization(means, quats, scales, opac, sh, torch.eye(4, device=device)[None], K[None], 64, 64,
                              sh_degree=3, packed=False)
    img.sum().backward()
    sync(device)
    return time.perf_counter() - t0


class GsplatLoop:
    """The plain gsplat 1.5.3 training loop (module docstring), from ``base`` (a CPU GaussianModel); with
    ``mcmc_cap`` set, gsplat's ``MCMCStrategy(cap_max=mcmc_cap)`` in place of its ``DefaultStrategy``, run as gsplat's
    ``examples/simple_trainer.py`` runs it: no ``step_pre_backward``, the loss plus ``mcmc_opacity_reg`` ·
    mean(sigmoid(opacities)) + ``mcmc_scale_reg`` · mean(exp(scales)) / L (0.01 each, its defaults and rigel's), and
    ``step_post_backward(..., lr=<the means' learning rate of the step>)`` (the relocation, growth and noise, with
    ``noise_lr = mcmc_noise_lr / L²``). L is rigel's length unit for ``cfg.mcmc_units`` (``length_unit``; main()
    passes rigel's ``--rigel-config mcmc_units``): under "world" (the default) they are gsplat's numbers in the
    capture's own units; under "cameras" both are measured in the cameras' radius (extent / 1.1), scale-free as
    simple_trainer's world is (its default ``normalize_world_space`` divides by the cameras' *median* distance,
    so its amounts differ: (L_med / L)² of the noise)."""

    def __init__(self, ds, base: GaussianModel, cfg: TrainConfig, device, seed: int, mcmc_cap: int | None = None):
        import gsplat

        self.cfg, self.device = cfg, device
        self.extent = float(ds.scene_extent) if ds.scene_extent and ds.scene_extent > 0 else 1.0
        self.sh_degree = base.sh_degree
        src = {"means": base.means3D, "scales": base.log_scales, "quats": base.quats,
               "opacities": base.opacity_logits, "sh0": base.sh_dc, "shN": base.sh_rest}
        self.params = torch.nn.ParameterDict(
            {k: torch.nn.Parameter(v.detach().to(device, torch.float32).clone()) for k, v in src.items()})
        lrs = {"means": position_lr(cfg, 0, self.extent), "scales": cfg.scaling_lr, "quats": cfg.rotation_lr,
               "opacities": cfg.opacity_lr, "sh0": cfg.feature_lr, "shN": cfg.feature_lr / cfg.sh_rest_lr_divisor}
        self.optimizers = {k: torch.optim.Adam([{"params": self.params[k], "lr": lrs[k], "name": k}], eps=cfg.adam_eps)
                           for k in self.params}
        self.mcmc = mcmc_cap is not None
        self.unit = length_unit(cfg, self.extent)
        self.strategy = (gsplat.MCMCStrategy(cap_max=int(mcmc_cap), noise_lr=cfg.mcmc_noise_lr / self.unit ** 2)
                         if self.mcmc else gsplat.DefaultStrategy())
        self.strategy.check_sanity(self.params, self.optimizers)
        self.state = (self.strategy.initialize_state() if self.mcmc else
                      self.strategy.initialize_state(scene_scale=self.extent))
        self.frames = list(ds.train)
        self.images = [f.image.to(device, torch.float32) for f in self.frames]
        self.masks = [frame_mask(f, device) for f in self.frames]
        self.cams = [self._cam(f.camera) for f in self.frames]
        bg = 1.0 if getattr(ds, "white_bg", False) else 0.0
        self.background = torch.full((3,), bg, device=device) if bg else None
        torch.manual_seed(seed)
        self.generator = torch.Generator().manual_seed(seed)
        self.order: list[int] = []
        self.active_degree = 0

    def _cam(self, cam):
        return cam.viewmat_tensor(self.device)[None], cam.K_tensor(self.device)[None], cam.width, cam.height

    def render(self, cam_tensors, sh_degree: int):
        from gsplat import rasterization

        viewmats, Ks, w, h = cam_tensors
        p = self.params
        colors, alphas, info = rasterization(
            p["means"], p["quats"], torch.exp(p["scales"]), torch.sigmoid(p["opacities"]),
            torch.cat([p["sh0"], p["shN"]], 1), viewmats, Ks, w, h, sh_degree=sh_degree, packed=False,
            near_plane=rc_config.NEAR_PLANE, far_plane=rc_config.FAR_PLANE)
        img = colors[0]
        if self.background is not None:
            img = img + self.background * (1.0 - alphas[0])
        return img, info

    def step(self, it: int) -> None:
        """Iteration ``it`` (1-based; the strategy sees step ``it − 1``, as simple_trainer counts)."""
        cfg, step = self.cfg, it - 1
        if not self.order:
            self.order = torch.randperm(len(self.frames), generator=self.generator).tolist()
        i = self.order.pop()
        means_lr = position_lr(cfg, it, self.extent)
        self.optimizers["means"].param_groups[0]["lr"] = means_lr
        self.active_degree = min(self.sh_degree, it // max(1, cfg.sh_degree_interval))
        img, info = self.render(self.cams[i], self.active_degree)
        if not self.mcmc:
            self.strategy.step_pre_backward(self.params, self.optimizers, self.state, step, info)
        loss = train_loss(img, self.images[i], self.masks[i], cfg.lambda_dssim)
        if self.mcmc:
            loss = (loss + cfg.mcmc_opacity_reg * torch.sigmoid(self.params["opacities"]).mean()
                    + cfg.mcmc_scale_reg / self.unit * torch.exp(self.params["scales"]).mean())
        loss.backward()
        for opt in self.optimizers.values():
            opt.step()
            opt.zero_grad(set_to_none=True)
        if self.mcmc:
            self.strategy.step_post_backward(self.params, self.optimizers, self.state, step, info, lr=means_lr)
        else:
            self.strategy.step_post_backward(self.params, self.optimizers, self.state, step, info, packed=False)

    @torch.no_grad()
    def render_frame(self, frame) -> torch.Tensor:
        return self.render(self._cam(frame.camera), self.active_degree)[0].clamp(0.0, 1.0)

    def num_gaussians(self) -> int:
        return self.params["means"].shape[0]


def run_gsplat(ds, base, cfg, checkpoints, time_limit, device, seed, label, mcmc_cap: int | None = None) -> dict:
    loop = GsplatLoop(ds, base, cfg, device, seed, mcmc_cap)
    res = train_and_evaluate(label, loop.step, loop.render_frame, loop.num_gaussians, ds.test, checkpoints,
                             time_limit, device,
                             lambda: shape_stats(loop.params["scales"], loop.params["opacities"], loop.extent),
                             train_frames=spaced(ds.train, TRAIN_VIEWS_SCORED))
    s = loop.strategy  # gsplat's DefaultStrategy is a dataclass: record its settings
    res["strategy"] = dataclasses.asdict(s) if dataclasses.is_dataclass(s) else type(s).__name__
    res["strategy_name"] = type(s).__name__
    del loop
    return res


# ---- results --------------------------------------------------------------------------------------------
def compare(rig: dict, gsp: dict) -> dict:
    """{iteration: (time ratio rigel/gsplat, PSNR rigel − gsplat)} over the iterations both runs evaluated."""
    g = {c["iteration"]: c for c in gsp.get("checkpoints", [])}
    out = {}
    for c in rig.get("checkpoints", []):
        d = g.get(c["iteration"])
        if d is None:
            continue
        ratio = c["train_s"] / d["train_s"] if d["train_s"] > 0 else None
        diff = c["psnr"] - d["psnr"] if c["psnr"] is not None and d["psnr"] is not None else None
        out[c["iteration"]] = (ratio, diff)
    return out


def time_to_psnr(rigel: list, peer: list) -> dict | None:
    """When the ``rigel`` curve first reaches the PSNR the ``peer`` curve ends at (issue 39). Curves are
    [(iteration, PSNR dB or None, training s)], one per evaluated checkpoint (a stopped run's are those it has).
    The target is the peer's PSNR at its largest iteration (of two checkpoints at one iteration, the later in the
    list: the one recorded last); "reached" is the first rigel checkpoint (by iteration) with PSNR ≥ that target. A
    PSNR that is None or not finite (a diverged run) counts as no PSNR. Returns None when the peer has no PSNR
    there (no run, no held-out views, a NaN), else
    {"peer_iteration", "peer_psnr", "peer_train_s", "reached" (bool), "iteration", "psnr", "train_s" (rigel's at the
    reaching checkpoint; None when not reached), "time_ratio" (rigel s there / peer s at its last checkpoint; None
    when not reached or the peer's time is 0), "last_iteration", "best_psnr" (rigel's last iteration and best PSNR;
    None without checkpoints)}."""
    def finite(v):
        return v is not None and math.isfinite(v)

    if not peer:
        return None
    p_it, p_psnr, p_s = max(enumerate(peer), key=lambda ic: (ic[1][0], ic[0]))[1]
    if not finite(p_psnr):
        return None
    ours = sorted(rigel, key=lambda c: c[0])
    hit = next((c for c in ours if finite(c[1]) and c[1] >= p_psnr), None)
    psnrs = [c[1] for c in ours if finite(c[1])]
    it, psnr, train_s = hit if hit is not None else (None, None, None)
    return {"peer_iteration": p_it, "peer_psnr": p_psnr, "peer_train_s": p_s, "reached": hit is not None,
            "iteration": it, "psnr": psnr, "train_s": train_s,
            "time_ratio": train_s / p_s if hit is not None and p_s > 0 else None,
            "last_iteration": ours[-1][0] if ours else None, "best_psnr": max(psnrs) if psnrs else None}


def curve(run: dict | None) -> list:
    """[(iteration, PSNR, training s)] of a run record's checkpoints ([] for a missing, skipped or failed run)."""
    return [(c["iteration"], c["psnr"], c["train_s"]) for c in (run or {}).get("checkpoints") or []]


def times_to_peer_psnr(sc: dict) -> list[dict]:
    """:func:`time_to_psnr` of each rigel method against each gsplat loop measured on scene record ``sc``, as
    {"method", "peer", **result} (real.json's ``time_to_peer_psnr``)."""
    runs = sc.get("runs", {})
    out = []
    for m in RIGEL_METHODS:
        for g in GSPLAT_METHODS:
            if m in runs and g in runs:
                t = time_to_psnr(curve(runs[m]), curve(runs[g]))
                if t is not None:
                    out.append({"method": m, "peer": g, **t})
    return out


def reached_text(t: dict) -> str:
    """"it 3,000" or "not reached by it 7,000 (best 24.10 dB)" for a :func:`time_to_psnr` result."""
    if t["reached"]:
        return f"it {t['iteration']:,}"
    if t["last_iteration"] is None:
        return "not reached (no checkpoint)"
    return f"not reached by it {t['last_iteration']:,} (best {fmt(t['best_psnr'])} dB)"


PEER_HEAD = ("| scene | method | peer | peer's last it | peer PSNR | peer train s | method reaches it at | "
             "PSNR there | train s there | time ratio method/peer |")


def peer_psnr_table(results: dict) -> list[str]:
    """The lines of the "time to the gsplat loop's PSNR" table, with a heading; [] when no scene has a pair."""
    rows = []
    for sc in results["scenes"]:
        runs = sc.get("runs", {})
        for t in times_to_peer_psnr(sc):
            stops = {k: f" (stopped: {runs[k]['stop_reason']})" for k in (t["method"], t["peer"])
                     if runs[k].get("stopped_at")}
            rows.append(f"| {sc['scene']} | {t['method']} | {t['peer']} | {t['peer_iteration']:,}"
                        f"{stops.get(t['peer'], '')} | {fmt(t['peer_psnr'])} | {t['peer_train_s']:.1f} | "
                        f"{reached_text(t)}{stops.get(t['method'], '') if not t['reached'] else ''} | "
                        f"{fmt(t['psnr'])} | {fmt(t['train_s'], '.1f')} | {fmt(t['time_ratio'])} |")
    if not rows:
        return []
    return ["", "## Time to the gsplat loop's PSNR", "",
            "The gsplat loop's held-out PSNR at its last checkpoint (a stopped run's last), and the first of the rigel "
            "run's checkpoints (--iters) whose PSNR is at least that: its iteration, PSNR and training seconds, and "
            "the time ratio = those seconds / the gsplat loop's training seconds at its last checkpoint. Only "
            "checkpoints are seen: rigel may reach it between the one before and the one named.", "",
            PEER_HEAD, "|---|---|---|---:|---:|---:|---|---:|---:|---:|", *rows]


TABLE_HEAD = ("| scene | method | iters | PSNR | SSIM | N | train s | peak GiB | time ratio rigel/gsplat | "
              "ΔPSNR rigel − gsplat | time ratio rigel/gsplat-mcmc | ΔPSNR rigel − gsplat-mcmc |")


def markdown(results: dict) -> str:
    meta = results["meta"]
    title = "rigel vs gsplat" if "gsplat" in meta["methods"] else "rigel: " + ", ".join(meta["methods"])
    lines = [f"# {title} on real captures ({meta['device_name']}, {meta['date']}, commit {meta['commit']}, "
             f"torch {meta['torch']}, gsplat {meta['gsplat'] or 'absent'})", "",
             f"Downscale {meta['downscale']}, every 8th view held out, the same initial Gaussians (rigel's: the SfM "
             "points where the capture has them), loss (0.8·L1 + 0.2·(1 − SSIM)), learning rates, SH ramp and "
             "iterations on both sides; densification is each side's default (gsplat: its DefaultStrategy; rigel: "
             "the strategy its notes below name — on a capture with SfM points the MCMC budget). PSNR / SSIM: "
             "means over the held-out views. train s: training loop only (evaluations excluded). peak GiB: "
             "torch.cuda.max_memory_allocated during the run. time ratio = rigel / gsplat training time "
             "(< 1: rigel faster); ΔPSNR = rigel − gsplat at the same iteration." +
             (f" rigel config overrides: {meta['rigel_config']}." if meta["rigel_config"] else ""), "",
             TABLE_HEAD, "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    notes = []
    for sc in results["scenes"]:
        runs = sc.get("runs", {})
        if sc.get("error"):
            notes.append(f"- {sc['scene']}: {sc['error']}")
        cmp = {(m, g): compare(runs[m], runs[g]) for m in RIGEL_METHODS for g in GSPLAT_METHODS
               if m in runs and g in runs}
        for method in METHODS:
            r = runs.get(method)
            if r is None:
                continue
            if r.get("skipped") or r.get("error"):
                what = f"skipped — {r['skipped']}" if r.get("skipped") else f"failed — {r['error']}"
                notes.append(f"- {sc['scene']} {method}: {what}")
                continue
            conf = r.get("config") or {}
            if method in RIGEL_METHODS and conf.get("strategy"):
                notes.append(f"- {sc['scene']} {method}: densification {conf['strategy']}"
                             + (f" (budget {conf['max_gaussians']:,} Gaussians)" if conf["strategy"] == "mcmc" else
                                " (3DGS's clone / split / prune"
                                + (f", AbsGS's statistic at {conf.get('absgrad_threshold', 0):g})"
                                   if conf.get("densify_grad") == "absgrad" else
                                   f", threshold {conf.get('grad_threshold', 0):g})"))
                             + (f", {conf['init_background_points']:,} background points in the start"
                                if isinstance(conf.get("init_background_points"), int)
                                and conf["init_background_points"] > 0 else "")
                             + (f", coarse-to-fine from 1/{conf['coarse_to_fine']} resolution"
                                if isinstance(conf.get("coarse_to_fine"), int) and conf["coarse_to_fine"] > 1 else ""))
            seen = [f"{c['iteration']:,}: {fmt(c['train_psnr'])}" for c in r["checkpoints"]
                    if c.get("train_psnr") is not None]
            if seen:
                notes.append(f"- {sc['scene']} {method}: PSNR on {TRAIN_VIEWS_SCORED} of the training views at it "
                             + ", ".join(seen) + " dB")
            shapes = [f"{c['iteration']:,}: {100 * c['wide_share']:.1f} %"
                      + (f" (mean opacity {c['wide_opacity']:.3f})" if c.get("wide_opacity") is not None else "")
                      for c in r["checkpoints"] if c.get("wide_share") is not None]
            if shapes:
                notes.append(f"- {sc['scene']} {method}: Gaussians wider than {WIDE_SHARE_OF_EXTENT:g} × the scene "
                             "extent at it " + ", ".join(shapes))
            faint = [f"{c['iteration']:,}: {100 * c['faint_share']:.1f} % (median opacity {c['median_opacity']:.3f})"
                     for c in r["checkpoints"] if c.get("faint_share") is not None]
            if faint:
                notes.append(f"- {sc['scene']} {method}: Gaussians fainter than {FAINT_OPACITY:.3f} at it "
                             + ", ".join(faint))
            dead = [f"{c['iteration']:,}: {100 * c['dead_share']:.1f} %"
                    + (f" (each relocation step since the last checkpoint moved {100 * c['relocated_share']:.1f} %)"
                       if c.get("relocated_share") is not None else "")
                    for c in r["checkpoints"] if c.get("dead_share") is not None and conf.get("strategy") == "mcmc"]
            if dead:
                notes.append(f"- {sc['scene']} {method}: Gaussians at or under MCMC's dead bound "
                             f"{conf.get('mcmc_min_opacity', 0):g} at it " + ", ".join(dead))
            for c in r["checkpoints"]:
                it = f"{c['iteration']:,}"
                if r.get("stopped_at") == c["iteration"]:
                    it += f" (stopped: {r['stop_reason']})"
                ratio, diff = cmp.get((method, "gsplat"), {}).get(c["iteration"], (None, None))
                ratio_m, diff_m = cmp.get((method, "gsplat-mcmc"), {}).get(c["iteration"], (None, None))
                lines.append(f"| {sc['scene']} | {method} | {it} | {fmt(c['psnr'])} | {fmt(c['ssim'], '.4f')} | "
                             f"{c['num_gaussians']:,} | {c['train_s']:.1f} | {fmt(c['peak_gib'])} | {fmt(ratio)} | "
                             f"{fmt(diff, '+.2f')} | {fmt(ratio_m)} | {fmt(diff_m, '+.2f')} |")
    lines += peer_psnr_table(results)
    lines += mcmc_table(results)
    if notes:
        lines += [""] + notes
    pngs = [f"{sc['png']} ({' | '.join(sc['png_panels'])})" for sc in results["scenes"] if sc.get("png")]
    if pngs:
        lines += ["", "First held-out view, each method at its last checkpoint: " + ", ".join(pngs)]
    return "\n".join(lines) + "\n"


MCMC_HEAD = ("| scene | iters | PSNR default | PSNR MCMC | ΔPSNR MCMC − default | SSIM default | SSIM MCMC | "
             "N default | N MCMC | train s default | train s MCMC | peak GiB default | peak GiB MCMC |")


def mcmc_table(results: dict) -> list[str]:
    """The lines of the MCMC-vs-default table (rigel's two strategies at each common checkpoint of each scene where
    both ran), with a heading; [] when no scene has both."""
    rows = []
    for sc in results["scenes"]:
        runs = sc.get("runs", {})
        a, b = runs.get("rigel") or {}, runs.get("rigel-mcmc") or {}
        by_it = {c["iteration"]: c for c in a.get("checkpoints", [])}
        for m in b.get("checkpoints", []):
            d = by_it.get(m["iteration"])
            if d is None:
                continue
            diff = m["psnr"] - d["psnr"] if m["psnr"] is not None and d["psnr"] is not None else None
            rows.append(f"| {sc['scene']} | {m['iteration']:,} | {fmt(d['psnr'])} | {fmt(m['psnr'])} | "
                        f"{fmt(diff, '+.2f')} | {fmt(d['ssim'], '.4f')} | {fmt(m['ssim'], '.4f')} | "
                        f"{d['num_gaussians']:,} | {m['num_gaussians']:,} | {d['train_s']:.1f} | {m['train_s']:.1f} | "
                        f"{fmt(d['peak_gib'])} | {fmt(m['peak_gib'])} |")
    if not rows:
        return []
    meta = results["meta"]
    cap = f"--mcmc-cap {meta['mcmc_cap']:,}" if meta.get("mcmc_cap") else "the default run's final Gaussian count"
    extra = f"; MCMC overrides {meta['mcmc_config']}" if meta.get("mcmc_config") else ""
    return ["", f"## MCMC budget vs default densification (rigel; MCMC budget = {cap}{extra})", "",
            MCMC_HEAD, "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|", *rows]


def summary_line(sc: dict) -> str:
    """One line per scene: each method's last checkpoint, then the comparison at the last common iteration."""
    if sc.get("error"):
        return f"{sc['scene']}: error — {sc['error']}"
    parts = []
    runs = sc.get("runs", {})
    for method in METHODS:
        r = runs.get(method)
        if r is None:
            continue
        if r.get("skipped") or r.get("error") or not r.get("checkpoints"):
            parts.append(f"{method} skipped" if r.get("skipped") else
                         f"{method} failed ({r['error']})" if r.get("error") else f"{method} no result")
            continue
        c = r["checkpoints"][-1]
        stop = f" stopped ({r['stop_reason']})" if r.get("stopped_at") else ""
        parts.append(f"{method} it {c['iteration']} {fmt(c['psnr'])} dB SSIM {fmt(c['ssim'], '.4f')} "
                     f"N {c['num_gaussians']:,} {c['train_s']:.1f} s {fmt(c['peak_gib'])} GiB{stop}")
    for g in GSPLAT_METHODS:
        if "rigel" in runs and g in runs:
            cmp = compare(runs["rigel"], runs[g])
            if cmp:
                it = max(cmp)
                parts.append(f"vs {g} at {it}: time ratio {fmt(cmp[it][0])} ΔPSNR {fmt(cmp[it][1], '+.2f')} dB")
    for t in times_to_peer_psnr(sc):
        if t["method"] == "rigel":
            parts.append(f"{t['peer']}'s {fmt(t['peer_psnr'])} dB (it {t['peer_iteration']}, {t['peer_train_s']:.1f} s)"
                         + (f" reached by rigel at it {t['iteration']}, {t['train_s']:.1f} s, time ratio "
                            f"{fmt(t['time_ratio'])}" if t["reached"] else f": {reached_text(t)}"))
    if "rigel" in runs and "rigel-mcmc" in runs:
        cmp = compare(runs["rigel-mcmc"], runs["rigel"])
        if cmp:
            it = max(cmp)
            parts.append(f"mcmc vs default at {it}: time ratio {fmt(cmp[it][0])} ΔPSNR {fmt(cmp[it][1], '+.2f')} dB")
    return f"{sc['scene']}: " + " | ".join(parts)


def write_text(path: Path, text: str) -> None:
    with atomic_path(path) as tmp:
        Path(tmp).write_text(text)


def write_results(out: Path, results: dict) -> None:
    """real.json, real.md, summary.txt (atomic; rewritten after each scene so a stopped session keeps them)."""
    for sc in results["scenes"]:  # derived from the runs (recomputed, so a merge's is the joined runs')
        sc["time_to_peer_psnr"] = times_to_peer_psnr(sc)
    write_text(out / "real.json", json.dumps(results, indent=1, default=float) + "\n")
    write_text(out / "real.md", markdown(results))
    write_text(out / "summary.txt", "".join(summary_line(sc) + "\n" for sc in results["scenes"]))


def save_view_png(path: Path, panels: list[np.ndarray]) -> None:
    """Panels (H,W,3) uint8 side by side (2-px white gaps) as one PNG (atomic)."""
    from PIL import Image

    h = max(p.shape[0] for p in panels)
    gap = np.full((h, 2, 3), 255, np.uint8)
    row = []
    for i, p in enumerate(panels):
        if i:
            row.append(gap)
        row.append(np.pad(p, ((0, h - p.shape[0]), (0, 0), (0, 0))))
    with atomic_path(path) as tmp:
        Image.fromarray(np.concatenate(row, 1)).save(tmp, format="PNG")


def safe_name(s: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in s)


# ---- main -----------------------------------------------------------------------------------------------
def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scenes", default=None, help="comma-separated capture folders or names under "
                    "$RIGEL_SHARED_DATA/real (default: every dataset folder there)")
    ap.add_argument("--iters", default=DEFAULT_ITERS, help="comma-separated checkpoints; one run to the largest "
                    "(default: %(default)s)")
    ap.add_argument("--downscale", type=float, default=1.0, help="divide image sizes by this (default: 1)")
    ap.add_argument("--methods", default="rigel,gsplat",
                    help="comma-separated of rigel, rigel-mcmc (rigel with --strategy mcmc at the rigel run's final "
                         "Gaussian count), gsplat (its DefaultStrategy), gsplat-mcmc (its MCMCStrategy at the rigel "
                         "run's budget) (default: %(default)s)")
    ap.add_argument("--max-frames", type=int, default=None, help="at most this many frames per split (tests)")
    ap.add_argument("--device", default=None, help="cuda or cpu (default: cuda when available)")
    ap.add_argument("--out", default=None, help="output directory (default: $OUT, else real-<UTC time>)")
    ap.add_argument("--rigel-config", action="extend", nargs="+", default=[], metavar="KEY=VALUE",
                    help="TrainConfig overrides for the rigel run (repeatable), e.g. max_gaussians=1000000")
    ap.add_argument("--mcmc-config", action="extend", nargs="+", default=[], metavar="KEY=VALUE",
                    help="TrainConfig overrides for the rigel-mcmc run only (after --rigel-config), e.g. "
                         "densify_until=25000")
    ap.add_argument("--mcmc-cap", type=int, default=None, metavar="N",
                    help="the rigel-mcmc budget (default: the Gaussian count the rigel run ended with)")
    ap.add_argument("--time-limit", type=float, default=None, help="stop a run after this many seconds of training")
    ap.add_argument("--frames", choices=("stream", "preload"), default="stream",
                    help="how rigel's runs read the training images: streamed (rigel-train's default) or preloaded "
                         "(--preload-frames); the gsplat loops always train from preloaded images (loaded only "
                         "when one runs)")
    ap.add_argument("--white-bg", action="store_true", help="composite alpha onto white (default black)")
    ap.add_argument("--seed", type=int, default=0, help="random seed of both runs (default: 0)")
    ap.add_argument("--merge", nargs="+", metavar="DIR", default=None,
                    help="no training: combine the results of separate runs (e.g. --methods rigel on one GPU, "
                         "--methods gsplat on another) into one table in --out")
    args = ap.parse_args(argv)
    methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    bad = [m for m in methods if m not in METHODS]
    if bad or not methods:
        ap.error(f"--methods: unknown {bad or args.methods!r}; choose from {', '.join(METHODS)}")
    args.methods = list(dict.fromkeys(methods))
    if "rigel-mcmc" in args.methods and "rigel" in args.methods:  # the default run first: its count is the budget
        args.methods.remove("rigel-mcmc")
        args.methods.insert(args.methods.index("rigel") + 1, "rigel-mcmc")
    if "gsplat-mcmc" in args.methods and "rigel" in args.methods:  # after rigel: its budget is the cap
        args.methods.remove("gsplat-mcmc")
        args.methods.append("gsplat-mcmc")
    if "gsplat-mcmc" in args.methods and "rigel" not in args.methods and args.mcmc_cap is None:
        ap.error("--methods gsplat-mcmc: give --mcmc-cap N, or run rigel too (its budget is the cap)")
    if args.mcmc_cap is not None and args.mcmc_cap < 1:
        ap.error("--mcmc-cap must be ≥ 1")
    if args.downscale <= 0:
        ap.error("--downscale must be positive")
    if args.time_limit is not None and args.time_limit <= 0:
        ap.error("--time-limit must be positive")
    return args


def out_dir(arg: str | None) -> Path:
    if arg:
        return Path(arg)
    if os.environ.get("OUT"):
        return Path(os.environ["OUT"])
    return Path(f"real-{datetime.datetime.now(datetime.timezone.utc).strftime('%Y%m%d-%H%M%S')}")


def run(args) -> int:
    """The whole benchmark; returns the exit status (0, or 130 when interrupted)."""
    from rigel_core.data import DatasetError, load_dataset

    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if device.type == "cuda" and not torch.cuda.is_available():
        raise BenchError("--device cuda: torch.cuda.is_available() is False")
    checkpoints = parse_iters(args.iters)
    overrides = parse_overrides(args.rigel_config)
    cfg_rigel = rigel_config(checkpoints[-1], args.seed, overrides)
    if "rigel-mcmc" in args.methods and "strategy" not in overrides:
        cfg_rigel.strategy = "default"  # the comparison's base is 3DGS's densification ("auto" is MCMC on captures)
    mcmc_overrides = parse_overrides(args.mcmc_config, "--mcmc-config")
    if "rigel-mcmc" in args.methods:
        if args.mcmc_cap is None and "rigel" not in args.methods:
            raise BenchError("--methods rigel-mcmc: give --mcmc-cap N, or run rigel too (its final count is the cap)")
        mcmc_config(cfg_rigel, args.mcmc_cap or 1, mcmc_overrides)  # a bad override fails before any training
    cfg_gsplat = TrainConfig(iterations=checkpoints[-1], eval_every=0, seed=args.seed)  # the 3DGS defaults
    scenes = find_scenes(args.scenes)
    out = out_dir(args.out)
    for name, path, _ in scenes:  # never write into a dataset
        folder = Path(path) if Path(path).is_dir() else Path(path).parent
        if out.resolve().is_relative_to(folder.resolve()):
            raise BenchError(f"--out {out}: inside the dataset {path}; choose another output directory")
    for f in ("real.json", "real.md"):
        if (out / f).exists():
            raise BenchError(f"{out / f}: exists (a previous run); choose another --out")
    out.mkdir(parents=True, exist_ok=True)

    want_gsplat = any(m in args.methods for m in GSPLAT_METHODS)
    have_gsplat, why_not = gsplat_status(device) if want_gsplat else (False, None)
    if want_gsplat and not have_gsplat:
        print(f"gsplat half skipped: {why_not}", flush=True)
    commit = os.environ.get("RIGEL_COMMIT") or subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    results = {"meta": {
        "device": str(device), "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU",
        "date": datetime.date.today().isoformat(), "commit": commit or "unknown", "torch": torch.__version__,
        "gsplat": gsplat_version(), "downscale": args.downscale, "iters": checkpoints, "methods": args.methods,
        "rigel_config": overrides, "mcmc_config": mcmc_overrides, "mcmc_cap": args.mcmc_cap,
        "time_limit_s": args.time_limit, "seed": args.seed, "white_bg": args.white_bg,
        "max_frames": args.max_frames, "frames": args.frames, "argv": sys.argv[1:]}, "scenes": []}
    print(f"bench/real.py: {len(scenes)} scene(s) {', '.join(n for n, _, _ in scenes)}; "
          f"methods {', '.join(args.methods)}; "
          f"checkpoints {checkpoints}; downscale {args.downscale:g}; device {device}; output {out}", flush=True)
    warm = False
    interrupted = False
    try:
        for name, path, variants in scenes:
            sc = {"scene": name, "path": str(path), "variants": list(variants), "runs": {}}
            results["scenes"].append(sc)
            t0 = time.perf_counter()
            try:
                kw = dict(white_bg=args.white_bg, max_frames=args.max_frames,
                          downscale=args.downscale * (2 if "halfres" in variants else 1))
                # rigel's runs read their images as rigel-train does (--frames); the gsplat loops train from
                # preloaded ones, which are loaded only when one runs
                stream = args.frames == "stream"
                peers = any(m in GSPLAT_METHODS for m in args.methods)
                ds = load_dataset(path, stream=stream and not peers, **kw)
                apply_variants(ds, variants)
                ds_rigel = ds
                if stream and peers and any(m.startswith("rigel") for m in args.methods):
                    ds_rigel = load_dataset(path, stream=True, **kw)
                    apply_variants(ds_rigel, variants)
            except (DatasetError, ImportError, OSError) as e:
                sc["error"] = f"{type(e).__name__}: {e}"
                print(f"[{name}] cannot load: {sc['error']}", flush=True)
                write_results(out, results)
                continue
            cam = ds.train[0].camera
            n_masked = sum(getattr(f, "mask", None) is not None for f in ds.train + ds.test)
            sc.update(source=ds.source, n_train=len(ds.train), n_test=len(ds.test), width=cam.width,
                      height=cam.height, extent=float(ds.scene_extent), white_bg=bool(ds.white_bg),
                      sfm_points=None if ds.points is None else int(len(ds.points)), masked_frames=n_masked)
            print(f"[{name}] {ds.source} {path}: {len(ds.train)} train + {len(ds.test)} held-out views, "
                  f"{cam.width}x{cam.height}, extent {ds.scene_extent:.3g}, "
                  f"{'%d SfM points' % len(ds.points) if ds.points is not None else 'no SfM points (random init)'}"
                  f"{f', {n_masked} masked frames' if n_masked else ''}; loaded in {time.perf_counter() - t0:.1f} s",
                  flush=True)
            if not ds.test:
                print(f"[{name}] note: no held-out views; PSNR/SSIM will be empty", flush=True)
            base = initial_model(ds, cfg_rigel, device)
            sc["initial_gaussians"] = base.num_gaussians
            print(f"[{name}] initial model: {base.num_gaussians:,} Gaussians, SH degree {base.sh_degree}", flush=True)
            first_views = {}
            for method in args.methods:
                label = f"[{name}] {method}"
                if method in GSPLAT_METHODS and not have_gsplat:
                    sc["runs"][method] = {"skipped": why_not}
                    continue
                if method in GSPLAT_METHODS and not warm:
                    try:
                        print(f"  gsplat first call (JIT build) {gsplat_warmup(device):.0f} s", flush=True)
                    except Exception as e:  # noqa: BLE001  (a failed build must not cost the rigel rows)
                        have_gsplat, why_not = False, f"gsplat failed on its first call ({type(e).__name__}: {e})"
                        print(f"  {why_not}; gsplat skipped", flush=True)
                        sc["runs"][method] = {"skipped": why_not}
                        continue
                    warm = True
                if device.type == "cuda":
                    torch.cuda.empty_cache()
                    torch.cuda.reset_peak_memory_stats(device)
                try:
                    if method == "rigel":
                        r = run_rigel(ds_rigel, base, cfg_rigel, checkpoints, args.time_limit, device, label)
                    elif method == "rigel-mcmc":
                        cap = mcmc_cap(sc, args.mcmc_cap)
                        print(f"{label}: budget {cap:,} Gaussians"
                              + ("" if args.mcmc_cap else " (the default run's final count)"), flush=True)
                        r = run_rigel(ds_rigel, base, mcmc_config(cfg_rigel, cap, mcmc_overrides), checkpoints,
                                      args.time_limit, device, label)
                    elif method == "gsplat-mcmc":
                        cap = gsplat_mcmc_cap(sc, args.mcmc_cap)
                        print(f"{label}: budget {cap:,} Gaussians"
                              + ("" if args.mcmc_cap else " (the rigel run's)"), flush=True)
                        # in rigel's length unit (--rigel-config mcmc_units=…), so both sides measure alike
                        r = run_gsplat(ds, base, dataclasses.replace(cfg_gsplat, mcmc_units=cfg_rigel.mcmc_units),
                                       checkpoints, args.time_limit, device, args.seed, label, mcmc_cap=cap)
                    else:
                        r = run_gsplat(ds, base, cfg_gsplat, checkpoints, args.time_limit, device, args.seed, label)
                except Exception as e:  # noqa: BLE001  (one failed run must not cost the others)
                    traceback.print_exc()
                    sc["runs"][method] = {"error": f"{type(e).__name__}: {e}"}
                    print(f"  {label} failed: {sc['runs'][method]['error']}", flush=True)
                    continue
                first_views[method] = r.pop("first_view")
                sc["runs"][method] = r
                interrupted = interrupted or r["interrupted"]
                if device.type == "cuda":
                    torch.cuda.empty_cache()
                if interrupted:
                    break
            panels = [m for m in args.methods if first_views.get(m) is not None]
            if panels and ds.test:
                gt = (ds.test[0].image.clamp(0, 1) * 255.0 + 0.5).to(torch.uint8).cpu().numpy()
                png = f"real_{safe_name(name)}_{safe_name(ds.test[0].name)}.png"
                save_view_png(out / png, [gt] + [first_views[m] for m in panels])
                sc["png"], sc["png_panels"], sc["png_width"] = png, ["gt"] + panels, int(gt.shape[1])
            write_results(out, results)
            print(summary_line(sc), flush=True)
            del ds, base
            if interrupted:
                break
    except KeyboardInterrupt:
        interrupted = True
    finally:
        if results["scenes"]:
            results["meta"]["interrupted"] = interrupted
            write_results(out, results)
    print("\n" + markdown(results), flush=True)
    return 130 if interrupted else 0


PROTOCOL_KEYS = ("downscale", "iters", "seed", "white_bg", "max_frames", "time_limit_s")


def split_panels(png: Path, names: list[str], width: int) -> dict:
    """{panel name: (H,W,3) uint8} of a PNG written by :func:`save_view_png` (panels ``width`` px, 2-px gaps)."""
    from PIL import Image

    a = np.asarray(Image.open(png).convert("RGB"))
    return {n: a[:, i * (width + 2): i * (width + 2) + width] for i, n in enumerate(names)}


def merge(dirs: list[str], out: Path) -> dict:
    """Combine the real.json of runs made separately (e.g. rigel on one GPU, gsplat on another, or two device
    calls) into one result: scenes matched by name, each method taken from the run that measured it, the PNG
    panels joined. BenchError when a file is missing, the runs' protocols differ (downscale, checkpoints, seed,
    background, frame cap, time limit) or two runs measured the same method on the same scene."""
    results, sources = None, {}
    for d in dirs:
        f = Path(d) / "real.json"
        try:
            r = json.loads(f.read_text())
            meta, scenes = r["meta"], r["scenes"]
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise BenchError(f"{f}: not a bench/real.py result ({type(e).__name__}: {e})") from None
        if results is None:
            results = {"meta": dict(meta, merged_from=[str(d)]), "scenes": []}
        else:
            for k in PROTOCOL_KEYS:
                if meta.get(k) != results["meta"].get(k):
                    raise BenchError(f"{f}: {k} = {meta.get(k)!r} differs from {results['meta'].get(k)!r} "
                                     f"in {dirs[0]}; only runs of one protocol merge")
            results["meta"]["merged_from"].append(str(d))
            for k in ("commit", "device_name", "torch", "gsplat", "rigel_config"):
                if meta.get(k) != results["meta"].get(k):
                    results["meta"][k] = f"{results['meta'][k]} / {meta.get(k)}"
        for sc in scenes:
            tgt = next((t for t in results["scenes"] if t["scene"] == sc["scene"]), None)
            if tgt is None:
                tgt = dict(sc, runs={})
                for k in ("png", "png_panels", "png_width"):
                    tgt.pop(k, None)
                results["scenes"].append(tgt)
            for m, run in sc.get("runs", {}).items():
                have = tgt["runs"].get(m)
                measured = have is not None and not (have.get("skipped") or have.get("error"))
                if measured and not (run.get("skipped") or run.get("error")):
                    raise BenchError(f"{f}: {sc['scene']} {m} measured in two of the merged runs")
                if not measured:
                    tgt["runs"][m] = run
            if sc.get("png"):
                src = sources.setdefault(sc["scene"], {"png": sc["png"], "panels": {}})
                for k, v in split_panels(Path(d) / sc["png"], sc["png_panels"], sc["png_width"]).items():
                    src["panels"].setdefault(k, v)
    results["meta"]["methods"] = [m for m in METHODS if any(m in sc["runs"] for sc in results["scenes"])]
    for sc in results["scenes"]:
        src = sources.get(sc["scene"])
        if src is None:
            continue
        names = [n for n in ("gt", *METHODS) if n in src["panels"]]
        save_view_png(out / src["png"], [src["panels"][n] for n in names])
        sc["png"], sc["png_panels"] = src["png"], names
    return results


def main(argv=None) -> int:
    args = parse_args(argv)
    try:
        if args.merge:
            out = out_dir(args.out)
            for f in ("real.json", "real.md"):
                if (out / f).exists():
                    raise BenchError(f"{out / f}: exists (a previous run); choose another --out")
            if any(out.resolve() == Path(d).resolve() for d in args.merge):
                raise BenchError(f"--out {out}: one of the merged runs; choose another output directory")
            out.mkdir(parents=True, exist_ok=True)
            results = merge(args.merge, out)
            write_results(out, results)
            print(markdown(results), flush=True)
            return 0
        return run(args)
    except BenchError as e:
        print(f"bench/real.py: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
