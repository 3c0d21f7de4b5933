"""Training checkpoints: one ``.safetensors`` file, loaded without executing any pickled code.

Layout of the file (safetensors: a JSON header + raw little-endian tensors):

| tensor | content |
|---|---|
| ``model.<name>`` | the six Gaussian parameters (``means3D``, ``log_scales``, ``quats``, ``opacity_logits``, ``sh_dc``, ``sh_rest``), pre-activation |
| ``model.appearance.<name>`` | MLP appearance only: ``latents`` (N,L), ``W1``, ``b1``, ``W2``, ``b2`` (:class:`~rigel_core.appearance.MLPAppearance`) |
| ``adam.<name>.<key>`` | the optimizer state of that parameter's group (``exp_avg``, ``exp_avg_sq``, ``step``) |
| ``stats.<key>`` | the densification accumulators (``grad_accum``, ``denom``, ``max_radii``) |
| ``rng.cpu`` | the trainer's ``torch.Generator`` state (uint8) |
| ``views.stack`` | the training views left in the current epoch's permutation (int64) |
| ``exposure.affine``, ``exposure.adam.<key>`` | only when the run has learnt per-image exposure (:mod:`rigel_core.train.exposure`): the (N_train, 3, 4) corrections ``[A_i \| b_i]`` and their Adam state. A checkpoint without them (older, or exposure never on) loads with fresh identity corrections |

The header's ``__metadata__`` holds one string entry ``"rigel"``: a JSON object with ``format`` (= 1),
``iteration``, ``nan_skips``, ``active_sh_degree``, ``extent``, ``config`` (:class:`~rigel_core.train.TrainConfig`
fields) and ``eval_history``. Restoring all of it makes the next step identical to the one the
uninterrupted run would have taken (tests/test_trainer.py checks bit equality on the CPU).

Writes are atomic: the file is written next to its destination under a temporary name, flushed, fsync'ed and
moved into place with ``os.replace``.
"""
from __future__ import annotations

import json
import os

import torch

from .model import PARAM_NAMES, GaussianModel
from .atomic import atomic_path

__all__ = ["CHECKPOINT_FORMAT", "CheckpointError", "save_checkpoint", "read_checkpoint", "load_checkpoint_model",
           "load_trainer"]

CHECKPOINT_FORMAT = 1


class CheckpointError(ValueError):
    """A checkpoint that cannot be read; the message names the file and the problem."""


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
    for g in opt.param_groups:
        state = opt.state.get(g["params"][0], {})
        for key, value in state.items():
            if isinstance(value, torch.Tensor):
                tensors[f"adam.{g['name']}.{key}"] = value.reshape(value.shape)
    for key, value in trainer.stats.state_tensors().items():
        tensors[f"stats.{key}"] = value
    tensors["rng.cpu"] = trainer.generator.get_state()
    tensors["views.stack"] = torch.tensor(trainer._view_stack, dtype=torch.int64)
    if getattr(trainer, "exposure", None) is not None:
        tensors.update(trainer.exposure.state_tensors("exposure."))
    meta = {
        "format": CHECKPOINT_FORMAT,
        "iteration": trainer.iteration,
        "nan_skips": trainer.nan_skips,
        "active_sh_degree": model.active_sh_degree,
        "extent": trainer.extent,
        "config": trainer.config.to_dict(),
        "eval_history": [e.to_dict() for e in trainer.eval_history],
    }
    _atomic_save(tensors, meta, path)


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
    if meta.get("format") != CHECKPOINT_FORMAT:
        raise CheckpointError(f"{path}: checkpoint format {meta.get('format')!r}, expected {CHECKPOINT_FORMAT}")
    missing = [n for n in PARAM_NAMES if f"model.{n}" not in tensors]
    if missing:
        raise CheckpointError(f"{path}: missing model tensors {missing}")
    return tensors, meta


def _model_from_tensors(path, tensors: dict) -> GaussianModel:
    """The GaussianModel of a checkpoint's tensors, with its MLP appearance when it has one."""
    from .appearance import MLPAppearance

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
    model = _model_from_tensors(path, tensors)
    model.active_sh_degree = min(int(meta.get("active_sh_degree", model.sh_degree)), model.sh_degree)
    return model


def load_trainer(path, dataset, *, device=None, config=None):
    """A :class:`~rigel_core.train.Trainer` on ``dataset`` restored from a checkpoint: model, Adam moments
    and step counts, densification statistics, RNG state, the epoch's remaining views, counters, and the
    per-image exposure corrections when the checkpoint has them (CheckpointError when their count is not the
    dataset's number of training images).
    ``config`` replaces the saved configuration when given."""
    from .train import TrainConfig, Trainer

    tensors, meta = read_checkpoint(path, "cpu")
    cfg = config if config is not None else TrainConfig.from_dict(meta["config"])
    model = _model_from_tensors(path, tensors)
    if model.appearance is None and model.sh_degree != cfg.sh_degree:
        raise CheckpointError(f"{path}: model has SH degree {model.sh_degree}, config asks for {cfg.sh_degree}")
    trainer = Trainer(dataset, cfg, model=model, device=device)
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
    trainer.stats.load_state_tensors({k: tensors[f"stats.{k}"].to(trainer.device)
                                      for k in ("grad_accum", "denom", "max_radii")})
    from .train.exposure import Exposure

    try:
        exposure = Exposure.from_state_tensors(tensors, "exposure.", device=trainer.device)
    except ValueError as e:
        raise CheckpointError(f"{path}: bad exposure tensors ({e})") from e
    if exposure is not None:
        if len(exposure) != len(trainer.train_frames):
            raise CheckpointError(f"{path}: exposure corrections for {len(exposure)} training images, the dataset "
                                  f"has {len(trainer.train_frames)}")
        trainer.exposure = exposure
    trainer.generator.set_state(tensors["rng.cpu"])
    trainer._view_stack = tensors["views.stack"].tolist()
    trainer.iteration = int(meta["iteration"])
    trainer.nan_skips = int(meta.get("nan_skips", 0))
    trainer.model.active_sh_degree = int(meta.get("active_sh_degree", 0))
    from .train.trainer import EvalResult

    trainer.eval_history = [EvalResult(**e) for e in meta.get("eval_history", [])]
    return trainer
