"""Data-parallel training over ``torch.distributed`` (NCCL on CUDA, gloo on the CPU).

One code path for every case: a step renders and backpropagates ``B = TrainConfig.batch_size`` views on each of
``N`` processes (the *global batch* ``G = N·B``), then takes one optimiser step. With ``N = 1`` nothing here is
involved but :func:`batch_scaling`; with ``N > 1`` the :class:`Comm` of each process (``Trainer.comm``) does:

- **views**: every process draws the same global batch from the same permutation (the trainer's CPU generator
  is seeded identically and advanced in lockstep); process ``r`` renders positions ``r·B … r·B + B − 1`` of it,
  so ``N`` processes × ``B`` views see exactly the views (and random backgrounds) that one process with
  ``--batch-size N·B`` sees;
- **one flattened all-reduce per step** (:meth:`Comm.reduce_step`): every parameter gradient (the six Gaussian
  tensors, an MLP appearance's, the per-image exposure corrections), the view-summed densification increments
  (``grad_accum``, ``denom`` of :class:`~.densify.DensifyStats`), the NaN-guard's "non-finite here" count and
  the Ctrl-C "stop" count travel in ONE preallocated float32 buffer
  (``torch.distributed.all_reduce``, SUM); the gradients are then divided by ``G`` (loss = mean over the
  global batch of the per-view losses). The per-view losses are not scaled before the backward, so the 2D
  gradients that feed the densification statistic are per-view gradients as in single-view training;
- the **optimiser step** is then the same computation on the same numbers on every rank (an all-reduce leaves
  bit-identical results on every rank), so the Gaussians, their Adam moments and the densification decisions
  (taken from the all-reduced statistics; ``max_radii``, a running maximum, is MAX-reduced before each
  densification and each checkpoint: :meth:`Comm.sync_stats`) stay bit-identical without ever sending a
  Gaussian;
- a **checksum** every ``check_every`` steps (:meth:`Comm.check_identical`): per tensor the sum of the float32
  bit patterns (int64) and the float64 sum, all-gathered; a rank that differs from rank 0 raises
  :class:`RanksDiverged` naming the rank, the tensor and the iteration.

No overlap of the all-reduce with the backward: the rasterizer's backward produces every parameter gradient
in its last kernel (projection backward), so there is nothing to overlap it with; bench/multi_gpu.py measures
the all-reduce's share of a step.

Learning rates for ``G > 1`` (:func:`batch_scaling`, ``TrainConfig.batch_lr_scaling``): ``"sqrt"`` multiplies every
Gaussian/appearance learning rate by √G and raises Adam's betas to the power ``G`` (β₁ = 0.9^G, β₂ = 0.999^G) —
Zhao et al., "On Scaling Up 3D Gaussian Splatting Training" (Grendel-GS, 2024), §4.2: with Adam the update of a
batch of G views should move a parameter about as far as G single-view updates of a parameter whose gradients
are independent across views (√G), and the moments should forget at the same rate per *view* (β^G).
``"none"`` leaves them as at G = 1. The per-image exposure optimiser is not scaled (each image's correction gets
one gradient per epoch whatever G).

Processes: ``rigel-train --gpus N`` spawns them (:func:`launch`; ``--device cpu --gpus N`` runs N CPU processes
over gloo, for testing), or ``torchrun --nproc-per-node N -m rigel_core.cli.train ...`` starts them (RANK,
WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT in the environment: :func:`init_from_env`).
"""
from __future__ import annotations

import datetime
import math
import os
import signal
import socket
import sys
import time

import torch

__all__ = ["Comm", "RanksDiverged", "RankLost", "batch_scaling", "scale_schedule", "SCHEDULE_FIELDS", "init_from_env", "env_world_size", "launch",
           "free_port", "checksum_tensors", "DEFAULT_CHECK_EVERY"]

#: steps between two checksums of the replicated state (rigel-train --dist-check-every)
DEFAULT_CHECK_EVERY = 500


class RanksDiverged(RuntimeError):
    """The replicated training state differs between ranks (the message names the rank, tensor and iteration)."""


class RankLost(RuntimeError):
    """A collective failed: another rank died or stopped answering (the message says which operation)."""


def batch_scaling(rule: str, global_batch: int) -> tuple[float, tuple[float, float]]:
    """``(lr_factor, (beta1, beta2))`` for a global batch of ``global_batch`` views under ``rule``: ``"sqrt"``
    → (√G, (0.9^G, 0.999^G)) (Grendel-GS's rule, module docstring), ``"none"`` → (1, (0.9, 0.999)).
    G = 1 gives (1.0, (0.9, 0.999)) under both. ValueError for another rule or G < 1."""
    if global_batch < 1:
        raise ValueError(f"batch_scaling: global batch must be ≥ 1, got {global_batch}")
    if rule == "none" or global_batch == 1:
        return 1.0, (0.9, 0.999)
    if rule == "sqrt":
        return math.sqrt(global_batch), (0.9 ** global_batch, 0.999 ** global_batch)
    raise ValueError(f"batch_scaling: rule must be 'sqrt' or 'none', got {rule!r}")


#: the TrainConfig fields that count optimiser steps (scaled by :func:`scale_schedule`)
SCHEDULE_FIELDS = ("iterations", "densify_from", "densify_until", "densify_interval", "opacity_reset_interval",
                   "sh_degree_interval", "position_lr_max_steps", "eval_every", "exposure_lr_delay_steps")


def scale_schedule(cfg, global_batch: int):
    """A copy of ``cfg`` whose step-counted fields (:data:`SCHEDULE_FIELDS`; ``position_lr_max_steps`` None =
    ``iterations`` first) are divided by ``global_batch`` (rounded, ≥ 1 where they must be > 0): a run of G views
    per step then densifies, resets, ramps the SH degree and decays the position lr after the same numbers of
    *views* as the G = 1 run of ``cfg`` (Grendel-GS scales its schedule the same way). ``max_gaussians`` and the
    thresholds are unchanged."""
    import dataclasses

    g = int(global_batch)
    if g < 1:
        raise ValueError(f"scale_schedule: global batch must be ≥ 1, got {global_batch}")
    d = dataclasses.asdict(cfg)
    if d["position_lr_max_steps"] is None:
        d["position_lr_max_steps"] = d["iterations"]
    for k in SCHEDULE_FIELDS:
        v = d[k]
        if v is None:
            continue
        d[k] = 0 if v == 0 else max(1, int(round(v / g)))
    return type(cfg)(**d)


def env_world_size() -> int:
    """WORLD_SIZE from the environment (torchrun, or :func:`launch`'s children); 1 when unset."""
    try:
        return max(1, int(os.environ.get("WORLD_SIZE", "1")))
    except ValueError:
        return 1


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago (for MASTER_PORT)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _timeout() -> datetime.timedelta:
    """Collective timeout: RIGEL_DIST_TIMEOUT seconds (default 300: rank 0 alone evaluates and writes
    checkpoints while the others wait in the next all-reduce)."""
    try:
        s = float(os.environ.get("RIGEL_DIST_TIMEOUT", "300"))
    except ValueError:
        s = 300.0
    return datetime.timedelta(seconds=max(1.0, s))


def init_from_env(device: str) -> "Comm":
    """Join the process group described by the environment (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT;
    LOCAL_RANK picks the GPU): NCCL for ``device == "cuda"`` (after ``torch.cuda.set_device(LOCAL_RANK)``),
    gloo for ``"cpu"``. Returns the :class:`Comm`. RuntimeError with one line when the environment is
    incomplete or LOCAL_RANK has no GPU."""
    import torch.distributed as dist

    missing = [k for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT") if k not in os.environ]
    if missing:
        raise RuntimeError(f"distributed run: environment variable(s) {', '.join(missing)} not set "
                           "(start it with torchrun or rigel-train --gpus N)")
    local = int(os.environ.get("LOCAL_RANK", os.environ["RANK"]))
    if device.startswith("cuda"):
        if local >= torch.cuda.device_count():
            raise RuntimeError(f"distributed run: LOCAL_RANK {local} but only {torch.cuda.device_count()} GPU(s)")
        torch.cuda.set_device(local)
    if not dist.is_initialized():
        # torch._dynamo, imported after the group exists (torch.optim imports it at its first step), keeps a
        # reference to the group that destroy_process_group does not drop: the group's C++ threads then outlive
        # Comm.close() and are torn down during interpreter finalisation, where a rank aborts now and then
        # ("terminate called without an active exception", SIGABRT after a finished run; torch 2.14). Imported
        # first, it holds nothing and close() joins the threads. tests/test_distributed.py checks they are gone.
        import torch._dynamo  # noqa: F401

        dist.init_process_group("nccl" if device.startswith("cuda") else "gloo", timeout=_timeout())
    return Comm(dist.get_rank(), dist.get_world_size(), torch.device(device))


# ---- checksums ------------------------------------------------------------------------------------------------
def replicated_tensors(trainer) -> dict:
    """The state every rank must hold identically, by name: each optimiser group's parameter and its Adam moments
    (``<name>``, ``<name>.exp_avg``, ``<name>.exp_avg_sq``), and the per-image corrections when present."""
    out = {}
    opt = trainer.optimizer
    for g in opt.param_groups:
        p = g["params"][0]
        out[g["name"]] = p.detach()
        for k in ("exp_avg", "exp_avg_sq"):
            v = opt.state.get(p, {}).get(k)
            if isinstance(v, torch.Tensor):
                out[f"{g['name']}.{k}"] = v
    for c in getattr(trainer, "corrections", ()):  # per-image exposure, pose corrections (train/per_image.py)
        out[c.prefix + c.key] = c.param.detach()
    out["rng.cpu"] = trainer.generator.get_state()  # the lockstep of view order, backgrounds, split offsets
    out["views.stack"] = torch.tensor(trainer._view_stack, dtype=torch.int64)
    return out


@torch.no_grad()
def checksum_tensors(tensors: dict) -> torch.Tensor:
    """(T, 3) int64 CPU tensor, per tensor: element count, the sum of its float32 bit patterns
    read as int32 (summed exactly in int64, so any single changed bit changes it), and the bits of its float64
    sum. Chunked (16M elements) so no full-size temporary is made."""
    rows = []
    for t in tensors.values():
        flat = t.detach().reshape(-1)
        if flat.dtype != torch.float32:  # integer state (generator, view order): exact in float32 below 2^24
            flat = flat.to(torch.float32)
        bits = torch.zeros((), dtype=torch.int64, device=flat.device)
        total = torch.zeros((), dtype=torch.float64, device=flat.device)
        for s in range(0, flat.numel(), 1 << 24):
            chunk = flat[s:s + (1 << 24)]
            bits += chunk.view(torch.int32).sum(dtype=torch.int64)
            total += chunk.sum(dtype=torch.float64)
        count = torch.full((), flat.numel(), dtype=torch.int64, device=flat.device)
        rows.append(torch.stack([count, bits, total.reshape(1).view(torch.int64)[0]]).cpu())
    if not rows:
        return torch.zeros(0, 3, dtype=torch.int64)
    return torch.stack(rows)


class Comm:
    """One rank's view of the process group; ``Trainer.comm`` holds it (None = single process).

    Attributes: ``rank``, ``world_size``, ``device``; ``check_every`` (steps between checksums, 0 = never);
    ``stop_requested`` (set by this rank's Ctrl-C handler) and ``stop_all`` (True once any rank asked to stop,
    known to every rank after the same step)."""

    def __init__(self, rank: int, world_size: int, device, check_every: int = DEFAULT_CHECK_EVERY):
        self.rank, self.world_size = int(rank), int(world_size)
        self.device = torch.device(device)
        self.check_every = int(check_every)
        self.stop_requested = False
        self.stop_all = False
        #: set by the CLI once this rank has started training (before: a failing rank calls agree(False))
        self.started = False
        self._buf: torch.Tensor | None = None
        self._stop_host: torch.Tensor | None = None
        self._stop_event = None
        #: seconds spent in the step's all-reduce (flatten + all-reduce + unflatten, waiting for the slowest rank
        #: included), summed, and the count. Exact only with ``timing`` True (a device synchronisation before
        #: each all-reduce; bench/multi_gpu.py sets it); otherwise it also holds whatever GPU work was still queued
        self.timing = False
        self.reduce_seconds = 0.0
        self.reduce_calls = 0

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    # ---- collectives with one clear error ----
    def _call(self, what: str, fn, *args, **kw):
        try:
            return fn(*args, **kw)
        except Exception as e:  # noqa: BLE001 - gloo/NCCL raise RuntimeError subclasses with long texts
            import re

            first = (str(e).strip().splitlines() or [type(e).__name__])[0]
            first = re.sub(r"^\[[^\]]*\]\s*", "", first)[:160]  # gloo prefixes its source path
            raise RankLost(f"rank {self.rank}: {what} failed — another rank died or stopped answering ({first})") \
                from e

    def agree(self, ok: bool) -> bool:
        """True when every rank passes ``ok`` True (a start-up barrier that lets a rank that failed to start stop
        the others instead of leaving them waiting)."""
        import torch.distributed as dist

        t = torch.tensor([0.0 if ok else 1.0], device=self.device)
        self._call("start-up agreement", dist.all_reduce, t)
        return float(t.item()) == 0.0

    def broadcast_model(self, trainer) -> None:
        """Copy rank 0's parameters into every rank's (at start: identical seeds already give identical
        initialisations; this makes it so whatever the platform's kernels did)."""
        import torch.distributed as dist

        with torch.no_grad():
            for g in trainer.optimizer.param_groups:
                self._call("broadcast of the initial model", dist.broadcast, g["params"][0].data, 0)

    # ---- the step's all-reduce ----
    def reduce_step(self, trainer, ok: torch.Tensor, grad_inc: torch.Tensor | None, denom_inc: torch.Tensor | None,
                    global_batch: int):
        """All-reduce one step (module docstring). ``ok``: this rank's 0-d bool "everything finite";
        ``grad_inc``/``denom_inc`` (N,) float32: this rank's view-summed densification increments (None: no
        statistics this step). Sets every gradient to the global-batch mean (no host sync on CUDA).
        Returns ``(ok, grad_inc, denom_inc)`` global. Sets ``stop_all``."""
        import torch.distributed as dist

        if self.timing and self.device.type == "cuda":
            torch.cuda.synchronize()  # time the all-reduce alone, not the backward still running before it
        t0 = time.perf_counter()
        params = [g["params"][0] for g in trainer.optimizer.param_groups]
        params += [c.param for c in getattr(trainer, "corrections", ())]
        n = trainer.model.num_gaussians
        sizes = [p.numel() for p in params]
        n_stats = 2 * n if grad_inc is not None else 0
        total = sum(sizes) + n_stats + 2
        if self._buf is None or self._buf.numel() < total or self._buf.device != self.device:
            self._buf = torch.empty(int(total * 1.25) + 64, dtype=torch.float32, device=self.device)
        buf = self._buf[:total]
        # which tensors have a gradient is known on the host without a sync; it is the same on every rank (every
        # rank renders the same model with the same config) — a rank where it is not would diverge, and the
        # checksum would say so
        present = [p.grad is not None for p in params]
        off = 0
        for p, k, has in zip(params, sizes, present):
            if has:
                buf[off:off + k].copy_(p.grad.reshape(-1))
            else:
                buf[off:off + k].zero_()
            off += k
        if grad_inc is not None:
            buf[off:off + n].copy_(grad_inc)
            buf[off + n:off + 2 * n].copy_(denom_inc)
            off += 2 * n
        flags = buf[off:]
        flags[0] = (~ok).float()
        flags[1] = 1.0 if self.stop_requested else 0.0
        self._call(f"all-reduce of iteration {trainer.iteration + 1}", dist.all_reduce, buf)
        off = 0
        inv = 1.0 / float(global_batch)
        for p, k, has in zip(params, sizes, present):
            if has:
                torch.mul(buf[off:off + k].view_as(p), inv, out=p.grad)
            off += k
        if grad_inc is not None:
            grad_inc, denom_inc = buf[off:off + n].clone(), buf[off + n:off + 2 * n].clone()
        ok = flags[0] == 0.0
        self._read_stop(flags[1:2])
        self.reduce_seconds += time.perf_counter() - t0
        self.reduce_calls += 1
        return ok, grad_inc, denom_inc

    def _read_stop(self, flag: torch.Tensor) -> None:
        """``stop_all`` from the all-reduced stop count. On the CPU at once; on CUDA without a host sync: the count
        is copied to pinned memory behind the all-reduce and read one step later (every rank reads the same
        step's count at the same step, so they still stop together, one step after the request)."""
        if self.device.type != "cuda":
            self.stop_all = self.stop_all or float(flag.item()) > 0.0
            return
        if self._stop_event is not None:
            self._stop_event.synchronize()  # recorded a step ago: long complete
            self.stop_all = self.stop_all or float(self._stop_host[0]) > 0.0
        if self._stop_host is None:
            self._stop_host = torch.zeros(1, dtype=torch.float32, pin_memory=True)
        self._stop_host.copy_(flag, non_blocking=True)
        self._stop_event = torch.cuda.Event()
        self._stop_event.record()

    def sync_stats(self, stats) -> None:
        """MAX-reduce ``stats.max_radii`` (every rank then holds the global running maximum; the sums are global
        already). Call on every rank: before a densification and before a checkpoint."""
        import torch.distributed as dist

        self._call("all-reduce (max) of the screen radii", dist.all_reduce, stats.max_radii, op=dist.ReduceOp.MAX)

    def check_identical(self, trainer) -> None:
        """All-gather the checksums of :func:`replicated_tensors` and raise :class:`RanksDiverged` (on every rank,
        naming the first diverging rank and tensor) when a rank's differ from rank 0's."""
        import torch.distributed as dist

        tensors = replicated_tensors(trainer)
        mine = checksum_tensors(tensors).to(self.device)
        if mine.numel() == 0:
            return
        gathered = [torch.empty_like(mine) for _ in range(self.world_size)]
        self._call(f"checksum all-gather at iteration {trainer.iteration}", dist.all_gather, gathered, mine)
        names = list(tensors)
        ref = gathered[0].cpu()
        for r in range(1, self.world_size):
            other = gathered[r].cpu()
            if other.shape != ref.shape:
                raise RanksDiverged(f"ranks diverged at iteration {trainer.iteration}: rank {r} holds "
                                    f"{other.shape[0]} tensors, rank 0 {ref.shape[0]}")
            diff = (other != ref).any(dim=1).nonzero().flatten().tolist()
            if diff:
                name = names[diff[0]]
                raise RanksDiverged(f"ranks diverged at iteration {trainer.iteration}: rank {r}'s {name} differs from "
                                    f"rank 0's (checksum); the replicated training state is no longer identical")

    def maybe_check(self, trainer) -> None:
        """:meth:`check_identical` when ``check_every`` divides the iteration."""
        if self.check_every and trainer.iteration % self.check_every == 0:
            self.check_identical(trainer)

    def close(self) -> None:
        import torch.distributed as dist

        if dist.is_initialized():
            try:
                dist.destroy_process_group()
            except Exception:  # noqa: BLE001 - a broken group at exit: nothing left to do
                pass


# ---- the --gpus N launcher ------------------------------------------------------------------------------------
def _set_parent_death_signal() -> None:
    """Linux: SIGTERM this process when its parent dies (best effort; a no-op elsewhere)."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG = 1
    except Exception:  # noqa: BLE001
        pass


def _child(target, argv, rank: int, world: int, port: int) -> None:
    os.setpgrp()  # the terminal's Ctrl-C goes to the launcher alone, which forwards exactly one SIGINT per press
    _set_parent_death_signal()
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world), LOCAL_WORLD_SIZE=str(world),
                      MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    sys.exit(target(argv))


def launch(target, argv: list, world: int, *, grace_s: float = 30.0) -> int:
    """Run ``target(argv)`` (returns an exit status) in ``world`` spawned processes of ranks 0…world−1 on this
    host, and wait. Ctrl-C (SIGINT) here is forwarded once to every rank (they agree on the step to stop at,
    rank 0 saves; a second Ctrl-C is forwarded too and aborts). When a rank exits with a failure while others
    still run, they get ``grace_s`` seconds to stop by themselves (their next collective fails), then SIGTERM.
    Returns the first non-zero exit status (0 when all succeed)."""
    import multiprocessing as mp

    ctx = mp.get_context("spawn")
    port = free_port()
    procs = [ctx.Process(target=_child, args=(target, argv, r, world, port), daemon=False) for r in range(world)]

    def forward(signum, frame):
        for p in procs:
            if p.pid is not None and p.exitcode is None:
                try:
                    os.kill(p.pid, signal.SIGINT)
                except OSError:
                    pass

    old = signal.signal(signal.SIGINT, forward) if _main_thread() else None
    try:
        for p in procs:
            p.start()
        first_fail, failed_at = 0, None
        while any(p.exitcode is None for p in procs):
            for r, p in enumerate(procs):
                p.join(timeout=0.1)
                if p.exitcode not in (None, 0) and first_fail == 0:
                    first_fail, failed_at = p.exitcode, time.monotonic()
                    if p.exitcode < 0:
                        print(f"rigel-train: rank {r} was killed by signal {-p.exitcode}", file=sys.stderr)
            if failed_at is not None and time.monotonic() - failed_at > grace_s:
                for p in procs:
                    if p.exitcode is None:
                        p.terminate()
                failed_at = math.inf
        codes = [p.exitcode for p in procs]
        fails = [c for c in codes if c != 0]
        if first_fail != 0:
            return first_fail if first_fail > 0 else 1
        return fails[0] if fails else 0
    finally:
        if old is not None:
            signal.signal(signal.SIGINT, old)
        for p in procs:
            if p.exitcode is None:
                p.terminate()
                p.join(5)


def _main_thread() -> bool:
    import threading

    return threading.current_thread() is threading.main_thread()
