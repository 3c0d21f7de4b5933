"""Adam over the six Gaussian parameter tensors, one parameter group each, and the surgery that keeps the
optimizer's per-Gaussian state (``exp_avg``, ``exp_avg_sq``) aligned with the parameters when densification
adds, removes or resets rows.

Each group holds exactly one tensor and carries its name: ``group["name"]`` is the attribute path of the tensor
on the model (``"means3D"`` …, or a dotted path such as ``"appearance.latents"`` for a tensor of the model's
appearance module), and ``group["per_gaussian"]`` (default True) says whether its rows follow the Gaussians.
The model's attribute and the group's tensor are always the same object: every function here replaces both
at once, and densification edits every per-Gaussian group (so an appearance module's latents, added as an
extra group, follow clones, splits and prunes without further code).
Learning rates follow 3DGS (Kerbl et al. 2023, ``gaussian_model.py``): an exponential decay for positions
scaled by the scene extent, constants for the rest, the higher-order SH at 1/20 of the DC rate.
"""
from __future__ import annotations

import math

import torch

from .. import _ext
from ..model import PARAM_NAMES
from .config import TrainConfig

__all__ = ["Adam", "make_optimizer", "position_lr", "group_lrs", "set_learning_rates", "select_rows", "append_rows",
           "replace_param", "optimizer_group", "per_gaussian_tensors", "get_tensor", "appearance_groups"]


def get_tensor(model, name: str) -> torch.Tensor:
    """The tensor at attribute path ``name`` (e.g. ``"sh_dc"``, ``"appearance.latents"``) of ``model``."""
    obj = model
    for part in name.split("."):
        obj = getattr(obj, part)
    return obj


def _set_tensor(model, name: str, value: torch.Tensor) -> None:
    *head, last = name.split(".")
    obj = model
    for part in head:
        obj = getattr(obj, part)
    setattr(obj, last, value)


def per_gaussian_tensors(optimizer: torch.optim.Optimizer, model) -> dict:
    """The tensors whose rows are Gaussians, by group name (the six parameters and any extra such group)."""
    return {g["name"]: get_tensor(model, g["name"]) for g in optimizer.param_groups if g.get("per_gaussian", True)}


def position_lr(cfg: TrainConfig, iteration: int, extent: float) -> float:
    """Position learning rate at ``iteration``: log-linear from ``position_lr_init`` to ``position_lr_final``
    over ``position_lr_max_steps`` (default: ``iterations``), times the scene extent (world units)."""
    steps = cfg.position_lr_max_steps or cfg.iterations
    t = min(max(iteration / max(steps, 1), 0.0), 1.0)
    lr0, lr1 = cfg.position_lr_init, cfg.position_lr_final
    if lr0 <= 0 or lr1 <= 0:
        lr = lr0 * (1 - t) + lr1 * t
    else:
        lr = math.exp(math.log(lr0) * (1 - t) + math.log(lr1) * t)
    return lr * extent


def group_lrs(cfg: TrainConfig, iteration: int, extent: float) -> dict:
    """Learning rate of each parameter group by name at ``iteration``."""
    return {
        "means3D": position_lr(cfg, iteration, extent),
        "log_scales": cfg.scaling_lr,
        "quats": cfg.rotation_lr,
        "opacity_logits": cfg.opacity_lr,
        "sh_dc": cfg.feature_lr,
        "sh_rest": cfg.feature_lr / cfg.sh_rest_lr_divisor,
        # the MLP appearance's groups (present only in MLP mode; see appearance_groups)
        "appearance.latents": cfg.latent_lr,
        **{f"appearance.{w}": cfg.mlp_lr for w in ("W1", "b1", "W2", "b2")},
    }


def appearance_groups(model, cfg: TrainConfig) -> list:
    """``extra_groups`` for :func:`make_optimizer` covering ``model.appearance`` (an
    ``rigel_core.renderer.appearance.MLPAppearance``): its latents per Gaussian (so densification clones, splits and
    prunes them with the Gaussians), its weights shared. Empty when the model has no appearance module."""
    app = getattr(model, "appearance", None)
    if app is None:
        return []
    lrs = group_lrs(cfg, 0, 1.0)
    return [{"name": f"appearance.{n}", "lr": lrs[f"appearance.{n}"], "per_gaussian": n in app.PER_GAUSSIAN}
            for n in app.parameters()]


class Adam(torch.optim.Adam):
    """PyTorch's Adam (same arguments, state and ``state_dict``), whose :meth:`step` runs every group in one CUDA
    launch (``rigel_core._C.adam_step``, csrc/adam.cu) when every parameter with a gradient is a float32 CUDA
    tensor (the kernels then must be built: :func:`rigel_core._ext.use_kernels`); anything else (CPU, float64,
    amsgrad, weight decay, maximize, a closure, a grad scaler) goes to ``torch.optim.Adam.step`` unchanged.

    The update is Adam's (Kingma & Ba 2015, Algorithm 1), with eps outside the bias-corrected root as in PyTorch:
    per group, the step count ``t`` after this step, ``m ← β₁m + (1−β₁)g``, ``v ← β₂v + (1−β₂)g²``,
    ``p ← p − lr/(1−β₁ᵗ) · m / (√v/√(1−β₂ᵗ) + eps)``. State per parameter as PyTorch's fused Adam keeps it:
    ``step`` a 0-d float32 tensor on the parameter's device, ``exp_avg``, ``exp_avg_sq`` like the parameter
    (so checkpoints and the densification surgery of this module see the same layout). A group's ``lr`` may be a
    one-element device tensor (read when the step runs: CUDA-graph capture, train/graph_step.py). When the
    attribute ``found_inf`` (a device float scalar, PyTorch's GradScaler protocol, set by the trainer's NaN
    guard) is non-zero the whole step is skipped on the device: parameters, moments and counts unchanged.
    With the attribute ``sparse`` True (``TrainConfig.sparse_adam``) an element whose gradient is exactly 0 keeps its
    value and both moments (not decayed); the groups' step counts advance as usual — on either path.
    Why: torch's fused Adam launches once per group; the trainer's six groups at 160k Gaussians took 0.52 ms a
    step on the H200, most of it launches too small to fill the GPU (docs/BENCHMARKS.md)."""

    def _kernel_groups(self):
        """The (group, params with a gradient) pairs for the one-launch path, or None when it does not apply."""
        if getattr(self, "grad_scale", None) is not None:
            return None
        out, dev = [], None
        for g in self.param_groups:
            if g.get("amsgrad") or g.get("weight_decay", 0) != 0 or g.get("maximize") or g.get("differentiable"):
                return None
            for p in g["params"]:
                if not _ext.use_kernels(p) or p.dtype != torch.float32 or (dev is not None and p.device != dev) \
                        or not p.is_contiguous():
                    return None
                dev = p.device
                if p.grad is not None and (p.grad.is_sparse or p.grad.dtype != torch.float32
                                           or not p.grad.is_contiguous()):
                    return None
            ps = [p for p in g["params"] if p.grad is not None]
            out.append((g, ps))
        return out

    sparse = False

    @torch.no_grad()
    def step(self, closure=None):
        groups = None if closure is not None else self._kernel_groups()
        if groups is None:
            return self._sparse_fallback_step(closure) if self.sparse else super().step(closure)
        lists = [[] for _ in range(10)]
        for g, ps in groups:
            b1, b2 = g["betas"]
            lr = g["lr"]
            for p in ps:
                st = self.state[p]
                if len(st) == 0:
                    st["step"] = torch.zeros((), dtype=torch.float32, device=p.device)
                    st["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                    st["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                lt = lr if isinstance(lr, torch.Tensor) else None
                for lst, v in zip(lists, (p, p.grad, st["exp_avg"], st["exp_avg_sq"], st["step"],
                                          0.0 if lt is not None else float(lr), lt, float(b1), float(b2),
                                          float(g["eps"]))):
                    lst.append(v)
        found_inf = getattr(self, "found_inf", None)
        if found_inf is not None:
            found_inf = found_inf.reshape(1).to(lists[0][0].device, torch.float32) if lists[0] else None
        C = _ext.get()
        for i in range(0, len(lists[0]), 16):  # the kernel takes at most 16 groups a launch
            C.adam_step(*(lst[i:i + 16] for lst in lists), found_inf, skip_zero_grad=bool(self.sparse))
        return None

    def _sparse_fallback_step(self, closure):
        """``sparse`` on the torch path: the dense step, then the elements whose gradient is 0 put back (value and
        moments as before the step; moments created by this step start at 0 there). A closure runs first, so the
        zero pattern is that of the gradients it computes."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        kept = []
        for g in self.param_groups:
            for p in g["params"]:
                if p.grad is None:
                    continue
                zero = p.grad == 0
                st = self.state[p]
                kept.append((p, zero, p[zero].clone(), *(st[k][zero].clone() if k in st else None
                                                         for k in ("exp_avg", "exp_avg_sq"))))
        super().step()
        for p, zero, value, m, v in kept:
            p[zero] = value
            st = self.state[p]
            st["exp_avg"][zero] = m if m is not None else 0.0
            st["exp_avg_sq"][zero] = v if v is not None else 0.0
        return loss


def make_optimizer(model, cfg: TrainConfig, extent: float, extra_groups: list | None = None) -> Adam:
    """Fused Adam (betas 0.9, 0.999; eps ``cfg.adam_eps``) with one group per model parameter, made leaf tensors
    requiring grad. ``extra_groups``: dicts ``{"name": path, "lr": float, "per_gaussian": bool}`` for further
    tensors of the model (e.g. an appearance module); their lr is kept as given."""
    groups = []
    lrs = group_lrs(cfg, 0, extent)
    specs = [{"name": n, "lr": lrs[n], "per_gaussian": True} for n in PARAM_NAMES] + list(extra_groups or [])
    n = model.num_gaussians
    for spec in specs:
        # contiguous: a PLY's sh_rest is a channel-major transpose; the one-launch Adam takes dense rows only
        p = get_tensor(model, spec["name"]).detach().contiguous().requires_grad_(True)
        per_gaussian = bool(spec.get("per_gaussian", True))
        if per_gaussian and p.shape[0] != n:
            raise ValueError(f"make_optimizer: {spec['name']} has {p.shape[0]} rows, the model {n} Gaussians")
        _set_tensor(model, spec["name"], p)
        groups.append({"params": [p], "lr": float(spec["lr"]), "name": spec["name"], "per_gaussian": per_gaussian})
    # on CUDA all groups in one launch (Adam above); elsewhere torch's fused Adam: one kernel per group instead of
    # a handful. Both skip a non-finite step on the device (``optimizer.found_inf``, see Trainer.step)
    opt = Adam(groups, lr=0.0, eps=cfg.adam_eps, fused=True)
    opt.sparse = bool(cfg.sparse_adam)
    return opt


def set_learning_rates(optimizer: torch.optim.Optimizer, lrs: dict, eps: float | None = None) -> None:
    """Write ``lrs[name]`` into each group named in ``lrs`` (and ``eps`` into every group when given)."""
    for g in optimizer.param_groups:
        if g["name"] in lrs:
            g["lr"] = lrs[g["name"]]
        if eps is not None:
            g["eps"] = eps


def optimizer_group(optimizer: torch.optim.Optimizer, name: str) -> dict:
    """The parameter group called ``name``; KeyError when absent."""
    for g in optimizer.param_groups:
        if g.get("name") == name:
            return g
    raise KeyError(f"optimizer has no parameter group {name!r}")


def _is_row_state(value, param: torch.Tensor) -> bool:
    """True for per-element state (the moments), False for scalars such as Adam's ``step``."""
    return isinstance(value, torch.Tensor) and value.shape == param.shape


def _swap(optimizer, model, name: str, new_param: torch.Tensor, remap_state) -> None:
    """Install ``new_param`` (detached, made a leaf requiring grad) as group ``name`` and model attribute,
    mapping each per-row state tensor through ``remap_state(old_state_tensor) -> new_state_tensor``."""
    g = optimizer_group(optimizer, name)
    old = g["params"][0]
    new_param = new_param.detach().requires_grad_(True)
    state = optimizer.state.pop(old, None)
    if state:
        state = {k: (remap_state(v) if _is_row_state(v, old) else v) for k, v in state.items()}
        optimizer.state[new_param] = state
    g["params"][0] = new_param
    _set_tensor(model, name, new_param)


@torch.no_grad()
def select_rows(optimizer, model, index_or_mask: torch.Tensor) -> None:
    """Keep only the Gaussians selected by a boolean mask (N,) or an index tensor, in every parameter and in
    its Adam moments (used for pruning, and for reordering)."""
    for name, p in per_gaussian_tensors(optimizer, model).items():
        _swap(optimizer, model, name, p[index_or_mask], lambda s: s[index_or_mask])


@torch.no_grad()
def append_rows(optimizer, model, new_rows: dict) -> None:
    """Append Gaussians: ``new_rows[name]`` (M, …) is concatenated to each parameter; the new rows' Adam
    moments start at zero (as 3DGS's ``densification_postfix``)."""
    m = None
    for name, p in per_gaussian_tensors(optimizer, model).items():
        if name not in new_rows:
            raise KeyError(f"append_rows: no new rows given for {name!r}")
        extra = new_rows[name].to(dtype=p.dtype, device=p.device)
        if extra.shape[1:] != p.shape[1:] or (m is not None and extra.shape[0] != m):
            raise ValueError(f"append_rows: {name} rows of shape {tuple(extra.shape)} do not fit {tuple(p.shape)}")
        m = extra.shape[0]
        _swap(optimizer, model, name, torch.cat([p, extra], 0),
              lambda s, extra=extra: torch.cat([s, torch.zeros_like(extra)], 0))


@torch.no_grad()
def replace_param(optimizer, model, name: str, value: torch.Tensor, reset_mask: torch.Tensor | None = None) -> None:
    """Replace parameter ``name`` by ``value`` (same shape); its moments are zeroed on the rows of
    ``reset_mask`` (all rows when None), kept elsewhere (the opacity reset of 3DGS zeroes all of them)."""
    p = get_tensor(model, name)
    if value.shape != p.shape:
        raise ValueError(f"replace_param: {name} of shape {tuple(value.shape)} does not fit {tuple(p.shape)}")

    def remap(s):
        if reset_mask is None:
            return torch.zeros_like(s)
        s = s.clone()
        s[reset_mask] = 0
        return s

    _swap(optimizer, model, name, value.to(p), remap)
