"""Loading of the compiled CUDA extension ``rigel_core._C``, and the one rule that picks it or the reference.

Never falls back silently: when PyTorch sees a GPU but the extension is missing, the first CUDA render
raises with the reason (an isolated ``pip install`` has no torch and builds no kernels: README "Install with pip").
"""
from __future__ import annotations

import torch  # noqa: F401 — _C links against libtorch / libc10, which importing torch loads (else: "libc10.so:
#                cannot open shared object file", and the kernels would read as missing for the whole process)

_C = None
_error = None
try:  # pragma: no cover - depends on the build
    from . import _C  # type: ignore  # noqa: F811
except Exception as e:  # ImportError, or an undefined symbol from a mismatched torch
    _error = e


def available() -> bool:
    """True when the compiled CUDA kernels are importable."""
    return _C is not None


def use_kernels(tensor) -> bool:
    """The CUDA-or-CPU dispatch rule of every op that has a CUDA kernel and a PyTorch twin (render, SH colours,
    MLP colours, SSIM, the photometric loss, Adam, the MCMC position noise), by the device of ``tensor`` (the op's
    first tensor argument): True on a CUDA device — the op runs the compiled kernels, and what they do not take (a
    float64 tensor, ...) raises TypeError or, where the op documents it, takes the PyTorch form on that device;
    False on any other device — the PyTorch reference (:mod:`rigel_core.reference` and the ops' twins).

    Raises: RuntimeError (:func:`get`'s, how to build them) for a CUDA tensor when the kernels are not built: never
    a silent fallback to the reference."""
    if tensor.device.type != "cuda":
        return False
    get()
    return True


def get():
    """The extension module; raises RuntimeError saying how to build it when it is missing."""
    if _C is None:
        raise RuntimeError(
            "rigel_core._C (the CUDA kernels) is not built, so CUDA tensors cannot be rendered. Reinstall rigel with "
            "`pip install --no-build-isolation` (a plain `pip install` builds without torch, so without the kernels: "
            "README \"Install with pip\") on a machine with nvcc and a CUDA build of PyTorch, or move the tensors to "
            f"the CPU to use the reference backend. (import error: {_error})")
    return _C
