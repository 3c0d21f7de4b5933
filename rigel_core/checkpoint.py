r"""Training checkpoints: one ``.safetensors`` file, loaded without executing any pickled code.

Layout of the file (safetensors: a JSON header + raw little-endian tensors):

| tensor | content |
|---|---|
| ``model.<name>`` | the six Gaussian parameters (``means3D``, ``log_scales``, ``quats``, ``opacity_logits``, ``sh_dc``, ``sh_rest``), pre-activation |
| ``model.appearance.<name>`` | MLP appearance only: ``latents`` (N,L), ``W1``, ``b1``, ``W2``, ``b2`` (:class:`~rigel_core.renderer.appearance.MLPAppearance`) |
| ``model.filter_3D`` | anti-aliased (mip) mode only: the 3D smoothing filter's variances (N,) (:mod:`rigel_core.renderer.mip`); the metadata's ``render_mode`` says the mode |
| ``adam.<name>.<key>`` | the optimizer state of that parameter's group (``exp_avg``, ``exp_avg_sq``, ``step``) |
| ``stats.<key>`` | the densification accumulators (``grad_accum``, ``denom``, ``max_radii``) |
| ``rng.cpu`` | the trainer's ``torch.Generator`` state (uint8) |
| ``views.stack`` | the training views left in the current epoch's permutation (int64) |
| ``exposure.affine``, ``exposure.adam.<key>`` | only when the run has learnt per-image exposure (:mod:`rigel_core.train.exposure`): the (N_train, 3, 4) corrections ``[A_i \| b_i]`` and their Adam state. A checkpoint without them (older, or exposure never on) loads with fresh identity corrections |
| ``appearance_grid.grid``, ``appearance_grid.adam.<key>`` | only with the bilateral-grid appearance (:mod:`rigel_core.train.bilagrid`): the (N_train, 12, L, S, S) grids and their Adam state |
| ``pose.delta``, ``pose.pivot``, ``pose.adam.<key>`` | only when the run has learnt pose corrections (:mod:`rigel_core.train.pose`): the (N_train, 6) rotation (radians) and translation (scene extents) of each training camera, the (N_train,) depths of the rotations' pivots (world units; absent in older checkpoints: 0, the camera centres) and their Adam state; without them a run starts from the given poses |

The header's ``__metadata__`` holds one string entry ``"rigel"``: a JSON object with ``format`` (= 1),
``iteration``, ``nan_skips``, ``active_sh_degree``, ``extent``, ``config`` (:class:`~rigel_core.train.TrainConfig`
fields), ``eval_history`` and, when the checkpoint's iteration held back its scheduled densification (the run's last,
or an evaluated one: ``Trainer._holds``), ``deferred_schedule`` (that iteration; ``Trainer.deferred_schedule``) with
``deferred_config`` (the config it was held under). Restoring all of it makes the next step identical to the one the
uninterrupted run would have taken (tests/test_trainer.py checks bit equality on the CPU).

Writes are atomic: the file is written next to its destination under a temporary name, flushed, fsync'ed and
moved into place with ``os.replace``.

Reading for ``--resume`` validates the whole file first (:func:`validate_checkpoint`: every key, shape, dtype
and range), so a damaged or foreign checkpoint is one :class:`CheckpointError` line naming the file and the
field, raised before anything is built or written. Nothing is ever unpickled (safetensors only). What an older
rigel wrote for a feature since removed (:data:`RETIRED_TENSORS`, :data:`RETIRED_CONFIG_FIELDS`) is ignored.
"""
from __future__ import annotations

import json
import math
import os

import torch

from .atomic import atomic_path
from .io.errors import InputError
from .config import APPEARANCE_MAX_HIDDEN, APPEARANCE_MAX_LATENT
from .reference.project import RENDER_MODES
from .model import PARAM_NAMES, GaussianModel, num_sh_bases
from .train.config import TrainConfig, training_downscale
from .train.records import EvalResult

__all__ = ["CHECKPOINT_FORMAT", "MAX_ITERATION", "CheckpointError", "save_checkpoint", "read_checkpoint",
           "validate_checkpoint", "validate_view_stack", "load_checkpoint_model", "load_trainer"]

CHECKPOINT_FORMAT = 1
#: the largest iteration count a checkpoint may hold (a 30k-iteration run is the usual; 10^18 is damage)
from .train.config import MAX_ITERATION  # noqa: E402  (one bound for runs and checkpoints)
ADAM_KEYS = ("exp_avg", "exp_avg_sq", "step")
STATS_KEYS = ("grad_accum", "denom", "max_radii")
#: tensors and TrainConfig fields an older rigel wrote for a feature since removed: a checkpoint holding them loads
#: as one without them, without a word. The fog rule's (``mcmc.fog_at``: the iteration it acted at, int64 (1,);
#: ``mcmc.noise_scale``, its first form's multiplier, float64 (1,); ``mcmc_fog_share`` / ``mcmc_fog_from`` /
#: ``mcmc_fog_noise``), measured and removed (docs/TRAINING.md)
RETIRED_TENSORS = ("mcmc.fog_at", "mcmc.noise_scale")
RETIRED_CONFIG_FIELDS = ("mcmc_fog_share", "mcmc_fog_from", "mcmc_fog_noise")
#: what a run trained with before each of these TrainConfig fields existed (its default then), which a checkpoint
#: without the field resumes with, not the field's default now (_config_of says why for each)
BEFORE_THE_FIELD = {"strategy": "default", "init_background_points": 0, "coarse_to_fine": 1, "densify_grad": "grad",
                    "init_mode": "box", "mcmc_noise_max_scale": 0.0, "mcmc_growth_max_dead": 0.0,
                    "coarse_to_fine_min_side": 8}


class CheckpointError(InputError):
    """A checkpoint that cannot be read; the message names the file and the problem. An
    :class:`~rigel_core.io.errors.InputError` (a ValueError), as a damaged scene file: the CLIs print it as one line
    and exit with status 2, rigel-viewer opening a checkpoint as a scene too (it exited 1)."""


def _corrections() -> tuple:
    """The per-training-image correction classes a checkpoint may hold (:mod:`rigel_core.train.corrections`)."""
    from .train.corrections import CORRECTIONS

    return CORRECTIONS


def _atomic_save(tensors: dict, meta: dict, path) -> None:
    from safetensors.torch import save_file

    with atomic_path(path) as tmp:
        save_file({k: v.detach().contiguous().cpu() for k, v in tensors.items()}, tmp,
                  metadata={"rigel": json.dumps(meta)})


def save_checkpoint(trainer, path) -> None:
    """Write ``trainer``'s full state to ``path`` (module docstring). Callers hold ``trainer.lock``
    (``Trainer.save_checkpoint`` does)."""
    model, opt = trainer.model, trainer.optimizer
    tensors = {f"model.{n}": getattr(model, n) for n in PARAM_NAMES}
    if getattr(model, "appearance", None) is not None:
        tensors.update(model.appearance.state_tensors("model.appearance."))
    if getattr(model, "filter_3D", None) is not None:  # anti-aliased mode's 3D filter (rigel_core/renderer/mip.py)
        tensors["model.filter_3D"] = model.filter_3D
    for g in opt.param_groups:
        state = opt.state.get(g["params"][0], {})
        for key, value in state.items():
            if isinstance(value, torch.Tensor):
                tensors[f"adam.{g['name']}.{key}"] = value.reshape(value.shape)
    tensors.update(trainer.strategy.state_tensors(trainer))  # the densification accumulators (train/strategy.py)
    tensors["rng.cpu"] = trainer.generator.get_state()
    tensors["views.stack"] = torch.tensor(trainer._view_stack, dtype=torch.int64)
    for c in getattr(trainer, "corrections", ()):  # per-image exposure, poses (train/per_image.py)
        tensors.update(c.state_tensors())
    meta = {
        "format": CHECKPOINT_FORMAT,
        "iteration": trainer.iteration,
        "nan_skips": trainer.nan_skips,
        "active_sh_degree": model.active_sh_degree,
        "coarse_floor": int(getattr(trainer, "coarse_floor", 1)),  # the finest coarse-to-fine factor reached
        "render_mode": getattr(model, "render_mode", "default"),
        "extent": trainer.extent,
        # the factor the training images were loaded at (rigel-train --resume reads them at it again)
        "downscale": float(getattr(getattr(trainer, "dataset", None), "downscale", 1.0)),
        "config": trainer.config.to_dict(),
        "eval_history": [e.to_dict() for e in trainer.eval_history],
    }
    if getattr(trainer, "deferred_schedule", None) is not None:  # a held iteration's schedule (Trainer._holds)
        meta["deferred_schedule"] = int(trainer.deferred_schedule)
        if getattr(trainer, "_deferred_config", None) is not None:  # the config it was held under
            meta["deferred_config"] = trainer._deferred_config.to_dict()
    _atomic_save(tensors, meta, path)


def checkpoint_metadata(path) -> dict | None:
    """The rigel metadata of the checkpoint at ``path`` without reading its tensors, or None when it has none that
    reads as an object (missing, damaged, another file): for a fact of the run before anything loads."""
    try:
        from safetensors import safe_open

        with safe_open(os.fspath(path), framework="pt") as f:
            meta = json.loads((f.metadata() or {}).get("rigel") or "null")
    except Exception:   # any unreadable file: no fact to read (read_checkpoint names the problem when it loads)
        return None
    return meta if isinstance(meta, dict) else None


def read_checkpoint(path, device="cpu") -> tuple[dict, dict]:
    """(tensors by name on ``device``, metadata dict) of a checkpoint. Raises CheckpointError naming the file
    when it is missing, not a safetensors file, or not a rigel checkpoint of a known format."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    path = os.fspath(path)
    if not os.path.isfile(path):
        raise CheckpointError(f"{path}: no such checkpoint file")
    try:
        from safetensors import safe_open

        with safe_open(path, framework="pt") as f:
            raw = (f.metadata() or {}).get("rigel")
        tensors = load_file(path, device=str(device))
    except (SafetensorError, OSError, ValueError) as e:
        raise CheckpointError(f"{path}: not a readable safetensors checkpoint ({e})") from e
    if raw is None:
        raise CheckpointError(f"{path}: safetensors file without rigel metadata (not a rigel checkpoint)")
    try:
        meta = json.loads(raw)
    except json.JSONDecodeError as e:
        raise CheckpointError(f"{path}: corrupt rigel metadata ({e})") from e
    if not isinstance(meta, dict):   # every field below is read from an object (a list gave a traceback)
        kind = {list: "array", str: "string", bool: "boolean", int: "number", float: "number"}.get(type(meta), "null")
        raise CheckpointError(f"{path}: rigel metadata is a JSON {kind}, expected an object")
    if meta.get("format") != CHECKPOINT_FORMAT:
        raise CheckpointError(f"{path}: checkpoint format {meta.get('format')!r}, expected {CHECKPOINT_FORMAT}")
    missing = [n for n in PARAM_NAMES if f"model.{n}" not in tensors]
    if missing:
        raise CheckpointError(f"{path}: missing model tensors {missing}")
    return tensors, meta


def _fail(path, field: str, problem: str):
    raise CheckpointError(f"{path}: {field}: {problem}")


def _describe(t: torch.Tensor) -> str:
    return f"{str(t.dtype).replace('torch.', '')} {tuple(t.shape)}"


def _check_tensor(path, tensors: dict, name: str, shape: tuple, dtypes, *, finite: bool = False,
                  nonneg: bool = False) -> torch.Tensor:
    """tensors[name] must exist with exactly ``shape`` (-1 = any size) and a dtype in ``dtypes``; optionally all
    finite / ≥ 0. CheckpointError naming the file and the tensor otherwise."""
    t = tensors.get(name)
    if t is None:
        _fail(path, name, "missing")
    if t.dtype not in dtypes:
        _fail(path, name, f"dtype {str(t.dtype).replace('torch.', '')}, expected "
                          + " or ".join(str(d).replace("torch.", "") for d in dtypes))
    if t.dim() != len(shape) or any(e >= 0 and a != e for a, e in zip(t.shape, shape)):
        want = "(" + ", ".join("*" if e < 0 else str(e) for e in shape) + ("," if len(shape) == 1 else "") + ")"
        _fail(path, name, f"shape {tuple(t.shape)}, expected {want}")
    if finite and t.is_floating_point() and not bool(torch.isfinite(t).all()):
        _fail(path, name, f"{int((~torch.isfinite(t)).sum())} non-finite value(s)")
    if nonneg and bool((t < 0).any()):
        _fail(path, name, "negative value(s)")
    return t


def _meta_int(path, meta: dict, key: str, lo: int, hi: int) -> int:
    v = meta.get(key)
    if isinstance(v, bool) or not isinstance(v, int):
        _fail(path, f"metadata {key}", f"expected an integer, got {v!r}"[:200])
    if not lo <= v <= hi:
        _fail(path, f"metadata {key}", f"{v} outside [{lo}, {hi}]")
    return v


def validate_checkpoint(path, tensors: dict, meta: dict, *, for_training: bool = True, n_train_views=None):
    """Check a checkpoint completely before anything uses it; returns its saved TrainConfig (None when
    ``for_training`` is False).

    Every tensor name must be known; the model tensors have the shapes of one model of N Gaussians (float32 or
    float64, one dtype); the MLP appearance, when present, fits that N. With ``for_training`` (``--resume``) also:
    metadata ``iteration`` in [0, MAX_ITERATION] and ≤ the saved config's ``iterations``, ``nan_skips`` in
    [0, iteration], ``active_sh_degree`` in 0..3, ``extent`` finite > 0, ``config`` a valid TrainConfig
    (``from_dict`` + ``validate``) whose SH degree / appearance match the model, ``eval_history`` a list of
    evaluation records; every model tensor finite; for every optimiser group the Adam state complete
    (``exp_avg`` and ``exp_avg_sq`` of the parameter's shape and dtype, finite, ``exp_avg_sq`` ≥ 0, a scalar
    integral ``step`` in [0, iteration]) — only the SH groups of an MLP model, and every group at iteration 0,
    may have none; the densification statistics (N,) float32, finite, ≥ 0; ``rng.cpu`` a uint8 generator state
    of the right size that torch accepts; ``views.stack`` distinct int64 view indices (in [0,
    ``n_train_views``) when given).

    Raises: CheckpointError "<file>: <field>: <problem>".
    """
    from .renderer.appearance import WEIGHT_NAMES

    path = os.fspath(path)
    floats = (torch.float32, torch.float64)
    n = tensors["model.means3D"].shape[0] if tensors["model.means3D"].dim() >= 1 else -1
    if n < 0:
        _fail(path, "model.means3D", f"shape {tuple(tensors['model.means3D'].shape)}, expected (N, 3)")
    sh_rest = tensors["model.sh_rest"]
    k_rest = sh_rest.shape[1] if sh_rest.dim() == 3 else -1
    if k_rest not in (0, 3, 8, 15):
        _fail(path, "model.sh_rest", f"shape {tuple(sh_rest.shape)}, expected (N, K-1, 3) with K in 1, 4, 9, 16")
    shapes = {"means3D": (n, 3), "log_scales": (n, 3), "quats": (n, 4), "opacity_logits": (n,),
              "sh_dc": (n, 1, 3), "sh_rest": (n, k_rest, 3)}
    dtype = tensors["model.means3D"].dtype
    for name, shape in shapes.items():
        _check_tensor(path, tensors, f"model.{name}", shape, floats if name == "means3D" else (dtype,),
                      finite=for_training)
    app = None
    if "model.appearance.latents" in tensors:
        lat = _check_tensor(path, tensors, "model.appearance.latents", (n, -1), (dtype,), finite=for_training)
        L = lat.shape[1]
        W1 = _check_tensor(path, tensors, "model.appearance.W1", (-1, L + 3), (dtype,), finite=for_training)
        H = W1.shape[0]
        if not (1 <= L <= APPEARANCE_MAX_LATENT and 1 <= H <= APPEARANCE_MAX_HIDDEN):
            _fail(path, "model.appearance", f"latent dimension {L} / hidden dimension {H} outside "
                                            f"1..{APPEARANCE_MAX_LATENT} / 1..{APPEARANCE_MAX_HIDDEN}")
        for name, shape in {"b1": (H,), "W2": (3, H), "b2": (3,)}.items():
            _check_tensor(path, tensors, f"model.appearance.{name}", shape, (dtype,), finite=for_training)
        app = {"latents": lat.shape, **{w: tensors[f"model.appearance.{w}"].shape for w in WEIGHT_NAMES}}
    known = {f"model.{p}" for p in PARAM_NAMES}
    if "model.filter_3D" in tensors:
        _check_tensor(path, tensors, "model.filter_3D", (n,), (dtype,), finite=True)
        known.add("model.filter_3D")
    if app is not None:
        known |= {f"model.appearance.{w}" for w in app}
    if not for_training:
        stray = sorted(k for k in tensors if k.startswith("model.") and k not in known)
        if stray:
            _fail(path, stray[0], "unknown model tensor")
        return None

    # ---- the training state (--resume) ----
    it = _meta_int(path, meta, "iteration", 0, MAX_ITERATION)
    _meta_int(path, meta, "nan_skips", 0, it)
    if meta.get("deferred_schedule") is not None:
        _meta_int(path, meta, "deferred_schedule", it, it)  # only ever the checkpoint's own iteration
        if "deferred_config" in meta:
            _config_of(path, meta, "deferred_config")
    _meta_int(path, meta, "active_sh_degree", 0, 3)
    if "coarse_floor" in meta:
        floor = _meta_int(path, meta, "coarse_floor", 1, 64)
        if floor & (floor - 1):
            _fail(path, "metadata coarse_floor", f"expected a power of two, got {floor}")
    extent = meta.get("extent")
    if isinstance(extent, bool) or not isinstance(extent, (int, float)) or not math.isfinite(extent) or extent <= 0:
        _fail(path, "metadata extent", f"expected a finite number > 0, got {extent!r}"[:200])
    cfg = _config_of(path, meta)
    if it > cfg.iterations:
        _fail(path, "metadata iteration", f"{it} beyond the run's own {cfg.iterations} iterations")
    if app is None and cfg.appearance == "mlp" or app is not None and cfg.appearance != "mlp":
        _fail(path, "config.appearance", f"{cfg.appearance!r} but the model {'has' if app else 'has no'} "
                                         "MLP appearance tensors")
    if app is None and num_sh_bases(cfg.sh_degree) != k_rest + 1:
        _fail(path, "config.sh_degree", f"{cfg.sh_degree} but the model holds {k_rest + 1} SH coefficients")
    history = meta.get("eval_history", [])
    if not isinstance(history, list):
        _fail(path, "metadata eval_history", "expected a list")
    for i, e in enumerate(history):
        try:
            r = EvalResult(**e)
            ok = all(isinstance(getattr(r, f), (int, float)) and not isinstance(getattr(r, f), bool)
                     for f in ("iteration", "psnr", "ssim", "num_gaussians", "n_views", "seconds"))
        except TypeError:
            ok = False
        if not ok:
            _fail(path, f"metadata eval_history[{i}]", "not an evaluation record")

    params = {p: shapes[p] for p in PARAM_NAMES}
    if app is not None:
        params.update({f"appearance.{w}": tuple(s) for w, s in app.items()})
    for name, shape in params.items():
        present = [k for k in ADAM_KEYS if f"adam.{name}.{k}" in tensors]
        optional = it == 0 or (app is not None and name in ("sh_dc", "sh_rest"))
        if not present and optional:
            continue
        for k in ("exp_avg", "exp_avg_sq"):
            _check_tensor(path, tensors, f"adam.{name}.{k}", shape, (dtype,), finite=True,
                          nonneg=k == "exp_avg_sq")
        step = _check_tensor(path, tensors, f"adam.{name}.step", (), floats + (torch.int64,), finite=True)
        sv = float(step)
        if not (sv == int(sv) and 0 <= sv <= it):
            _fail(path, f"adam.{name}.step", f"{sv} is not an integer in [0, {it}]")
    known |= {f"adam.{name}.{k}" for name in params for k in ADAM_KEYS}
    for k in STATS_KEYS:
        _check_tensor(path, tensors, f"stats.{k}", (n,), (torch.float32,), finite=True, nonneg=True)
    rng_size = torch.Generator().get_state().numel()
    _check_tensor(path, tensors, "rng.cpu", (rng_size,), (torch.uint8,))
    try:  # torch checks the Mersenne-Twister state's own consistency: a flipped bit can break it
        torch.Generator().set_state(tensors["rng.cpu"])
    except RuntimeError as e:
        _fail(path, "rng.cpu", f"not a generator state ({e})")
    _check_tensor(path, tensors, "views.stack", (-1,), (torch.int64,))
    validate_view_stack(path, tensors, n_train_views)
    known |= {f"stats.{k}" for k in STATS_KEYS} | {"rng.cpu", "views.stack"}
    known |= set(RETIRED_TENSORS)  # a removed feature's: ignored, whatever they hold
    for cls in _corrections():  # per-image exposure, poses (train/per_image.py); counts checked against the dataset
        name, pre = cls.prefix + cls.key, cls.prefix
        if name not in tensors:
            continue
        val = _check_tensor(path, tensors, name, (-1, *cls.item_shape), (torch.float32,), finite=True)
        if val.shape[0] < 1:
            _fail(path, name, f"no corrections (shape {tuple(val.shape)})")
        if cls.shape_problem(tuple(val.shape)) is not None:
            _fail(path, name, cls.shape_problem(tuple(val.shape)))
        for k in cls.extra_keys:
            if pre + k in tensors:
                _check_tensor(path, tensors, pre + k, (val.shape[0],), (torch.float32,), finite=True, nonneg=True)
        present = [k for k in ADAM_KEYS if f"{pre}adam.{k}" in tensors]
        if present or it > 0 and getattr(cfg, cls.config_field):
            for k in ("exp_avg", "exp_avg_sq"):
                _check_tensor(path, tensors, f"{pre}adam.{k}", tuple(val.shape), (torch.float32,), finite=True,
                              nonneg=k == "exp_avg_sq")
            step = _check_tensor(path, tensors, f"{pre}adam.step", (), floats + (torch.int64,), finite=True)
            sv = float(step)
            if not (sv == int(sv) and 0 <= sv <= it):
                _fail(path, f"{pre}adam.step", f"{sv} is not an integer in [0, {it}]")
        known |= {name} | {f"{pre}adam.{k}" for k in ADAM_KEYS} | {pre + k for k in cls.extra_keys}
    stray = sorted(set(tensors) - known)
    if stray:
        _fail(path, stray[0], "unknown tensor (not written by rigel-train)")
    return cfg


def validate_view_stack(path, tensors: dict, n_train_views=None) -> None:
    """``views.stack`` must hold distinct indices ≥ 0 (a part of a permutation of the training views), each
    < ``n_train_views`` when given. CheckpointError naming the file otherwise."""
    v = tensors["views.stack"]
    if v.numel() and int(v.min()) < 0:
        _fail(path, "views.stack", f"negative view index {int(v.min())}")
    if v.unique().numel() != v.numel():
        _fail(path, "views.stack", "repeated view indices (not part of a permutation)")
    if n_train_views is not None:
        if v.numel() > n_train_views:
            _fail(path, "views.stack", f"{v.numel()} views left, the dataset has {n_train_views} training views")
        if v.numel() and int(v.max()) >= n_train_views:
            _fail(path, "views.stack", f"view index {int(v.max())} out of range for {n_train_views} training views")


def _config_of(path, meta: dict, key: str = "config"):
    """The saved TrainConfig (``meta[key]``), validated; CheckpointError naming the file and the field. A config without
    ``strategy`` was saved before the field existed, when every run used 3DGS's densification: it stays
    "default" (the field's default now, "auto", would turn such a run into the MCMC budget on resume). Likewise a
    config without ``init_background_points`` started without background points: it stays 0 (not "auto", which
    on a partial SfM would also switch an "auto" strategy), and one without ``coarse_to_fine`` trained at full
    resolution: it stays 1 (not "auto", which on a dataset without SfM points would restart coarse), and one
    without ``densify_grad`` densified with 3DGS's statistic: it stays "grad" (not "auto", which on a real capture
    would switch the statistic and its threshold mid-run), and one without ``init_mode`` drew its random points in the
    cameras' box: it stays "box"; one without ``mcmc_noise_max_scale`` or ``mcmc_growth_max_dead`` ran MCMC with
    the unbounded noise and growth at every relocation step: they stay 0 (off); one without
    ``coarse_to_fine_min_side`` kept coarse levels down to 8 px: it stays 8; one with "absgrad" but no
    ``absgrad_threshold`` compared
    it with ``grad_threshold`` (before the field existed): that value becomes its ``absgrad_threshold``. rigel saves
    resolved configs: integers and "grad" / "absgrad" there, kept. These values are :data:`BEFORE_THE_FIELD`. The
    fields of a removed feature (:data:`RETIRED_CONFIG_FIELDS`) are dropped, whatever their values."""
    d = meta.get(key)
    if not isinstance(d, dict):
        _fail(path, f"metadata {key}", "missing or not an object")
    d = {**BEFORE_THE_FIELD, **{k: v for k, v in d.items() if k not in RETIRED_CONFIG_FIELDS}}
    if d.get("densify_grad") == "absgrad" and "absgrad_threshold" not in d and "grad_threshold" in d:
        d = {**d, "absgrad_threshold": d["grad_threshold"]}   # then "absgrad" compared with grad_threshold
    try:
        cfg = TrainConfig.from_dict(d)
        cfg.validate()
    except (TypeError, ValueError) as e:
        _fail(path, key, str(e).splitlines()[0][:300] if str(e) else type(e).__name__)
    return cfg


def _model_from_tensors(path, tensors: dict) -> GaussianModel:
    """The GaussianModel of a checkpoint's tensors, with its MLP appearance when it has one."""
    from .renderer.appearance import MLPAppearance

    model = GaussianModel(*(tensors[f"model.{n}"] for n in PARAM_NAMES))
    try:
        model.appearance = MLPAppearance.from_state_tensors(tensors, "model.appearance.")
    except (KeyError, ValueError, TypeError) as e:
        raise CheckpointError(f"{path}: bad MLP appearance tensors ({e})") from e
    if model.appearance is not None and model.appearance.num_gaussians != model.num_gaussians:
        raise CheckpointError(f"{path}: {model.appearance.num_gaussians} latents for {model.num_gaussians} Gaussians")
    return model


def load_checkpoint_model(path, device="cpu") -> GaussianModel:
    """The :class:`~rigel_core.model.GaussianModel` stored in a training checkpoint (detached, on ``device``,
    with the active SH degree it was trained to). Raises CheckpointError (see :func:`read_checkpoint`) or
    ValueError from the model's shape checks."""
    tensors, meta = read_checkpoint(path, device)
    validate_checkpoint(path, tensors, meta, for_training=False)
    model = _model_from_tensors(path, tensors)
    model.filter_3D = tensors.get("model.filter_3D")
    model.render_mode = meta.get("render_mode") if meta.get("render_mode") in RENDER_MODES else "default"
    deg = meta.get("active_sh_degree", model.sh_degree)
    deg = deg if isinstance(deg, int) and not isinstance(deg, bool) else model.sh_degree
    model.active_sh_degree = max(0, min(deg, model.sh_degree))
    return model


def load_trainer(path, dataset, *, device=None, config=None, trainer_cls):
    """A ``trainer_cls`` (:class:`~rigel_core.train.Trainer`, which passes itself: ``Trainer.from_checkpoint`` is
    the public entry, and this module never imports the trainer that saves through it) on ``dataset`` restored
    from a checkpoint: model, Adam moments and step counts, densification statistics, RNG state, the epoch's
    remaining views, counters, and the per-image exposure, pose and bilateral-grid corrections when the checkpoint has them
    (CheckpointError when their count is not the dataset's number of training images).
    ``config`` replaces the saved configuration when given."""
    tensors, meta = read_checkpoint(path, "cpu")
    saved_cfg = validate_checkpoint(path, tensors, meta, n_train_views=len(dataset.train))
    cfg = config if config is not None else saved_cfg
    model = _model_from_tensors(path, tensors)
    if model.appearance is None and model.sh_degree != cfg.sh_degree:
        raise CheckpointError(f"{path}: model has SH degree {model.sh_degree}, config asks for {cfg.sh_degree}")
    trainer = trainer_cls(dataset, cfg, model=model, device=device)
    trainer.extent = float(meta.get("extent", trainer.extent))
    opt = trainer.optimizer
    for g in opt.param_groups:
        p = g["params"][0]
        prefix = f"adam.{g['name']}."
        state = {}
        for key, value in tensors.items():
            if key.startswith(prefix):
                on_param = value.shape == p.shape or g.get("capturable") or g.get("fused")
                state[key[len(prefix):]] = value.to(p.device if on_param else "cpu")
        if state:
            opt.state[p] = state
    trainer.strategy.load_state_tensors(trainer, tensors)
    for cls in _corrections():
        try:
            corr = cls.from_state_tensors(tensors, trainer)
        except ValueError as e:
            raise CheckpointError(f"{path}: bad {cls.prefix[:-1]} tensors ({e})") from e
        if corr is not None:
            if len(corr) != len(trainer.train_frames):
                raise CheckpointError(f"{path}: {cls.prefix[:-1]} corrections for {len(corr)} training images, the "
                                      f"dataset has {len(trainer.train_frames)}")
            setattr(trainer, cls.trainer_attr, corr)
    trainer.generator.set_state(tensors["rng.cpu"])
    trainer._view_stack = tensors["views.stack"].tolist()
    trainer.iteration = int(meta["iteration"])
    # the finest coarse-to-fine factor the saved run had reached: the resumed run never goes back to a coarser one
    # (Trainer.coarse_floor), also when --iters extends it (older checkpoints: the saved run's own schedule)
    if "coarse_floor" in meta:
        trainer.coarse_floor = min(trainer.coarse_floor, int(meta["coarse_floor"]))
    elif saved_cfg.coarse_to_fine != "auto":
        trainer.coarse_floor = min(trainer.coarse_floor, training_downscale(saved_cfg, trainer.iteration))
    deferred = meta.get("deferred_schedule")
    trainer.deferred_schedule = None if deferred is None else int(deferred)
    # the config the schedule was held under (older checkpoints: none, the held work then takes the current one)
    trainer._deferred_config = _config_of(path, meta, "deferred_config") if "deferred_config" in meta else None
    trainer.nan_skips = int(meta.get("nan_skips", 0))
    trainer.model.active_sh_degree = int(meta.get("active_sh_degree", 0))
    trainer.eval_history = [EvalResult(**e) for e in meta.get("eval_history", [])]
    return trainer
