"""The CUDA extension was built wherever it can be (CI compiles it with nvcc 13 and torch's CUDA build)."""
import os
import shutil

import pytest
import torch


def test_extension_built_when_toolchain_present():
    from rigel_core import _ext

    can_build = torch.version.cuda is not None and (shutil.which("nvcc") or os.path.exists("/usr/local/cuda/bin/nvcc"))
    if not can_build:
        pytest.skip("no CUDA build of PyTorch or no nvcc: the pure-Python install is expected")
    if os.environ.get("RIGEL_NO_CUDA"):
        pytest.skip("RIGEL_NO_CUDA set")
    assert _ext.available(), f"rigel_core._C failed to import: {_ext._error}"


def test_cuda_tensors_without_kernels_fail_loudly(monkeypatch):
    """Never a silent fallback to the CPU reference for CUDA tensors."""
    from rigel_core import _ext

    monkeypatch.setattr(_ext, "_C", None)
    with pytest.raises(RuntimeError, match="not built"):
        _ext.get()
