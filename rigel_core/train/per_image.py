"""What every per-training-image correction learnt with the scene shares: one parameter tensor with a row per training
image, its own Adam, the NaN guard's skip, and its place in a checkpoint.

The corrections (:mod:`.exposure`'s affine colour transform, :mod:`.pose`'s camera correction, :mod:`.bilagrid`'s
bilateral grid) are each a subclass naming its checkpoint ``prefix`` (``"exposure."``), its tensor's ``key``
(``"affine"``) and the shape of one image's row (``item_shape``); the trainer keeps them in
:attr:`~rigel_core.train.Trainer.corrections` and treats them alike: their gradients join the finiteness check and the
batch mean, their Adam steps after the Gaussians' (skipped on the device with them), the checkpoint holds
``<prefix><key>`` and ``<prefix>adam.<state>``.
"""
from __future__ import annotations

import torch

__all__ = ["PerImageParam"]


class PerImageParam:
    """A leaf tensor ``param`` of shape ``(n, *item_shape)`` float32 requiring grad, row ``i`` for training image
    ``i``, and ``optimizer``, a fused Adam over it alone (betas 0.9, 0.999; ``eps``; learning rate set each step by
    :meth:`set_lr`). Its ``found_inf`` protocol lets the trainer's NaN guard skip the update on the device.

    Subclasses set the class attributes ``prefix``, ``key``, ``item_shape``, ``config_field``, ``trainer_attr``,
    make the initial values and, when they read more of the trainer than its device, override :meth:`for_trainer`."""

    prefix: str = ""
    key: str = "param"
    item_shape: tuple = ()  # one image's row; -1: any size (the checkpoint reads it from the tensor)
    #: further per-image tensors it keeps (not learnt): attributes of these names, (n,) float32, finite and ≥ 0, held
    #: in a checkpoint as ``<prefix><name>``; one a checkpoint lacks is :meth:`legacy_extra`'s
    extra_keys: tuple = ()
    #: the TrainConfig switch under which the trainer steps it, the Trainer attribute that holds it, and what it is
    #: called in the log and the messages (the start line, the graph step's reason, a removed file's line)
    config_field: str = ""
    trainer_attr: str = ""
    title: str = ""

    def __init__(self, initial: torch.Tensor, *, eps: float = 1e-8, weight_decay: float = 0.0):
        if initial.dim() < 1 or initial.shape[0] < 1:
            raise ValueError(f"{type(self).__name__}: need at least one training image, got shape "
                             f"{tuple(initial.shape)}")
        self.param = initial.to(torch.float32).contiguous().requires_grad_(True)
        self.optimizer = torch.optim.Adam([self.param], lr=0.0, eps=eps, weight_decay=weight_decay, fused=True)

    def __len__(self) -> int:
        return self.param.shape[0]

    def set_lr(self, lr: float) -> None:
        for g in self.optimizer.param_groups:
            g["lr"] = float(lr)

    def grads(self) -> list:
        """The gradient tensors to include in the trainer's finiteness check (empty when none)."""
        return [] if self.param.grad is None else [self.param.grad]

    def step(self, found_inf: torch.Tensor | None = None) -> None:
        """One Adam step; when ``found_inf`` (a 0-d float tensor) is non-zero the update is skipped on the
        device (no host sync)."""
        if self.param.grad is None:
            return
        if found_inf is not None:
            self.optimizer.found_inf = found_inf.to(self.param.device, torch.float32)
        self.optimizer.step()

    def zero_grad(self) -> None:
        self.optimizer.zero_grad(set_to_none=True)

    # ---- persistence ----------------------------------------------------------------------------------
    def state_tensors(self) -> dict:
        """``{prefix + key: (n, *item_shape), prefix + "adam.<state>": …}`` for a checkpoint."""
        prefix = self.prefix
        out = {prefix + self.key: self.param.detach()}
        out.update({prefix + k: getattr(self, k) for k in self.extra_keys})
        for k, value in self.optimizer.state.get(self.param, {}).items():
            if isinstance(value, torch.Tensor):
                out[f"{prefix}adam.{k}"] = value
        return out

    def legacy_extra(self, name: str) -> torch.Tensor:
        """The value of extra tensor ``name`` (:attr:`extra_keys`) for a checkpoint written before it existed."""
        raise NotImplementedError(name)

    @classmethod
    def shape_problem(cls, shape: tuple) -> str | None:
        """Why a stored ``param`` of ``shape`` cannot be this class's (beyond ``item_shape``), or None."""
        return None

    @classmethod
    def for_trainer(cls, trainer, like: torch.Tensor | None = None) -> "PerImageParam":
        """A fresh correction of the trainer's training views on its device, with what else the subclass reads of it
        (the scene extent, the config); shaped as ``like`` (a stored ``param``: its row count, and its item shape
        where the class allows several) when given."""
        return cls(len(trainer.train_frames) if like is None else like.shape[0], trainer.device)

    @classmethod
    def from_state_tensors(cls, tensors: dict, trainer):
        """The correction stored under the class's ``prefix`` (made by :meth:`for_trainer`, its :attr:`extra_keys`
        the stored ones), or None when the tensors hold none. Raises ValueError for a tensor of the wrong shape."""
        prefix = cls.prefix
        name = prefix + cls.key
        a = tensors.get(name)
        if a is None:
            return None
        if a.dim() != 1 + len(cls.item_shape) or any(w not in (-1, d) for w, d in zip(cls.item_shape, a.shape[1:])):
            want = ", ".join(["N"] + [str(d) if d >= 0 else "any" for d in cls.item_shape])
            raise ValueError(f"{name} has shape {tuple(a.shape)}, expected ({want})")
        out = cls.for_trainer(trainer, a)
        with torch.no_grad():
            out.param.copy_(a.to(out.param.device, torch.float32))
        for k in cls.extra_keys:
            v = tensors.get(prefix + k)
            if v is not None and tuple(v.shape) != (a.shape[0],):
                raise ValueError(f"{prefix + k} has shape {tuple(v.shape)}, expected ({a.shape[0]},)")
            setattr(out, k, out.legacy_extra(k) if v is None else v.to(out.param.device, torch.float32))
        state = {}
        for k, value in tensors.items():
            if k.startswith(prefix + "adam."):
                # fused Adam keeps every state tensor, ``step`` included, on the parameter's device
                state[k[len(prefix + "adam."):]] = value.to(out.param.device)
        if state:
            out.optimizer.state[out.param] = state
        return out
