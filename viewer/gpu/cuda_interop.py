"""CUDA side of the Vulkan interop, through NVIDIA's ``cuda-bindings`` (``cuda.bindings.runtime``).

* :class:`ExternalBuffer`: a Vulkan memory fd (``OPAQUE_FD``) imported with ``cudaImportExternalMemory`` and
  mapped with ``cudaExternalMemoryGetMappedBuffer``; :meth:`ExternalBuffer.tensor` wraps a byte range as a torch
  CUDA tensor without a copy (``__cuda_array_interface__``), and the tensor keeps the import alive.
* :class:`ExternalTimelineSemaphore`: a Vulkan timeline semaphore fd imported as
  ``cudaExternalSemaphoreHandleTypeTimelineSemaphoreFd``; :meth:`~ExternalTimelineSemaphore.wait` and
  :meth:`~ExternalTimelineSemaphore.signal` enqueue on a CUDA stream (no host synchronisation).

Importing this module is safe without a GPU: ``cuda.bindings`` is imported on first use. The call sequence is
the one verified on the H200 (../shared/docs/PLATFORM.md): ownership of each fd passes to CUDA when its import
succeeds (the fd must not be closed afterwards); on failure the fd is closed here.
"""
from __future__ import annotations

import os

__all__ = ["CudaInteropError", "available", "ExternalBuffer", "ExternalTimelineSemaphore"]


class CudaInteropError(RuntimeError):
    """A CUDA interop call failed; the message names the call and the CUDA error."""


def _rt():
    try:
        from cuda.bindings import runtime
    except ImportError as e:  # pragma: no cover - depends on the install
        raise CudaInteropError(f"the CUDA interop path needs NVIDIA's `cuda-bindings` package ({e}): "
                               "`pip install cuda-bindings`") from None
    return runtime


def available() -> bool:
    """True when torch sees a CUDA device and ``cuda.bindings`` imports."""
    try:
        import torch

        if not torch.cuda.is_available():
            return False
        _rt()
        return True
    except Exception:
        return False


def _check(result, what: str):
    """cuda-bindings return (err, *values); raise on an error, return the value(s)."""
    rt = _rt()
    err, *vals = result if isinstance(result, tuple) else (result,)
    if err != rt.cudaError_t.cudaSuccess:
        name = getattr(err, "name", str(err))
        raise CudaInteropError(f"{what} failed: {name}")
    if not vals:
        return None
    return vals[0] if len(vals) == 1 else vals


def _stream_handle(stream) -> int:
    """A raw cudaStream_t from a torch.cuda.Stream, an int, or None (torch's current stream)."""
    import torch

    if stream is None:
        stream = torch.cuda.current_stream()
    if isinstance(stream, torch.cuda.Stream):
        return int(stream.cuda_stream)
    return int(stream)


class _DevicePointer:
    """A ``__cuda_array_interface__`` (v3) over imported memory; holds its :class:`ExternalBuffer`."""

    def __init__(self, owner, ptr: int, shape: tuple, typestr: str):
        self.owner = owner
        self.__cuda_array_interface__ = {"shape": shape, "typestr": typestr, "data": (ptr, False),
                                         "strides": None, "version": 3, "stream": None}


_TYPESTR = {"float32": "<f4", "int32": "<i4", "uint8": "|u1", "float64": "<f8", "int64": "<i8"}


class ExternalBuffer:
    """Vulkan device memory imported into CUDA.

    Args:
        fd: from ``vkGetMemoryFdKHR`` (OPAQUE_FD); CUDA owns it once the import succeeds.
        size: the Vulkan allocation size in bytes (``VkMemoryAllocateInfo.allocationSize``).
        dedicated: the Vulkan memory is a dedicated allocation (``cudaExternalMemoryDedicated``).
        device: CUDA device index the memory belongs to (the one whose UUID matched the Vulkan device).
    Raises:
        CudaInteropError: naming the CUDA call that failed.
    """

    def __init__(self, fd: int, size: int, *, dedicated: bool = False, device: int = 0):
        self.device = device
        self.size = int(size)
        self.ext_mem = None
        self.ptr = 0
        try:
            rt = _rt()
            _check(rt.cudaSetDevice(device), f"cudaSetDevice({device})")
            desc = rt.cudaExternalMemoryHandleDesc()
            desc.type = rt.cudaExternalMemoryHandleType.cudaExternalMemoryHandleTypeOpaqueFd
            desc.handle.fd = int(fd)
            desc.size = self.size
            desc.flags = rt.cudaExternalMemoryDedicated if dedicated else 0
            self.ext_mem = _check(rt.cudaImportExternalMemory(desc), "cudaImportExternalMemory")
        except BaseException:
            os.close(fd)  # not imported: the fd is still ours
            raise
        bdesc = rt.cudaExternalMemoryBufferDesc()
        bdesc.offset = 0
        bdesc.size = self.size
        bdesc.flags = 0
        try:
            self.ptr = int(_check(rt.cudaExternalMemoryGetMappedBuffer(self.ext_mem, bdesc),
                                  "cudaExternalMemoryGetMappedBuffer"))
        except BaseException:
            self.close()
            raise

    def tensor(self, offset: int, shape: tuple, dtype: str):
        """A torch CUDA tensor of ``shape``/``dtype`` ("float32", "int32", …) at byte ``offset``, no copy.
        The tensor keeps this import alive."""
        import numpy as np
        import torch

        nbytes = int(np.prod(shape)) * np.dtype(dtype).itemsize
        if offset < 0 or offset + nbytes > self.size:
            raise ValueError(f"ExternalBuffer.tensor: bytes [{offset}, {offset + nbytes}) outside the {self.size}-byte"
                             " import")
        iface = _DevicePointer(self, self.ptr + int(offset), tuple(int(s) for s in shape), _TYPESTR[dtype])
        return torch.as_tensor(iface, device=f"cuda:{self.device}")

    def close(self):
        """Unmap and release the import (the tensors must be gone or unused by then)."""
        if self.ext_mem is None:
            return
        rt = _rt()
        if self.ptr:
            _check(rt.cudaFree(self.ptr), "cudaFree(mapped external buffer)")
            self.ptr = 0
        _check(rt.cudaDestroyExternalMemory(self.ext_mem), "cudaDestroyExternalMemory")
        self.ext_mem = None


class ExternalTimelineSemaphore:
    """A Vulkan timeline semaphore (exported OPAQUE_FD) imported into CUDA."""

    def __init__(self, fd: int, *, device: int = 0):
        self.sem = None
        self._call = None   # ([sem], [signal params], [wait params], runtime module), see _params
        try:
            rt = _rt()
            _check(rt.cudaSetDevice(device), f"cudaSetDevice({device})")
            desc = rt.cudaExternalSemaphoreHandleDesc()
            desc.type = rt.cudaExternalSemaphoreHandleType.cudaExternalSemaphoreHandleTypeTimelineSemaphoreFd
            desc.handle.fd = int(fd)
            desc.flags = 0
            self.sem = _check(rt.cudaImportExternalSemaphore(desc), "cudaImportExternalSemaphore")
        except BaseException:
            os.close(fd)  # not imported: the fd is still ours
            raise

    def _params(self):
        """The one-element semaphore list and the signal / wait parameter lists, built on first use and reused:
        each call only sets the fence value (cuda-bindings copies the parameters when the call enqueues)."""
        rt = _rt()
        sig = rt.cudaExternalSemaphoreSignalParams()
        sig.flags = 0
        wait = rt.cudaExternalSemaphoreWaitParams()
        wait.flags = 0
        self._call = ([self.sem], [sig], [wait], rt)
        return self._call

    def signal(self, value: int, stream=None):
        """Enqueue "set the semaphore to ``value``" on ``stream`` (after all work queued before it)."""
        sems, sig, _, rt = self._call or self._params()
        sig[0].params.fence.value = int(value)
        _check(rt.cudaSignalExternalSemaphoresAsync(sems, sig, 1, _stream_handle(stream)),
               "cudaSignalExternalSemaphoresAsync")

    def wait(self, value: int, stream=None):
        """Enqueue "wait until the semaphore ≥ ``value``" on ``stream``; later work on it waits too."""
        sems, _, wait, rt = self._call or self._params()
        wait[0].params.fence.value = int(value)
        _check(rt.cudaWaitExternalSemaphoresAsync(sems, wait, 1, _stream_handle(stream)),
               "cudaWaitExternalSemaphoresAsync")

    def close(self):
        if self.sem is None:
            return
        _check(_rt().cudaDestroyExternalSemaphore(self.sem), "cudaDestroyExternalSemaphore")
        self.sem = None
        self._call = None
