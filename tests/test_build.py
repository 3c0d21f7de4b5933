"""The CUDA extension was built wherever it can be (CI compiles it with nvcc 13 and torch's CUDA build)."""
import ast
import importlib.util
import os
import re
import shutil
import subprocess
from pathlib import Path

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


def test_the_kernels_load_whatever_was_imported_first():
    """``rigel_core._ext`` imported before torch (rigel_core defers torch for the viewer's first frame; install.sh
    checks the build that way) still finds the kernels: it loads torch itself, whose libraries ``_C`` links to."""
    from rigel_core import _ext

    if not _ext.available():
        pytest.skip(f"rigel_core._C is not built here ({_ext._error})")
    code = ("import sys, rigel_core._ext as e; assert 'torch' in sys.modules; "
            "print(e.available(), e._error)")
    r = subprocess.run([os.sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                       cwd=Path(__file__).resolve().parents[1])
    assert r.returncode == 0 and r.stdout.split()[0] == "True", r.stdout + r.stderr


def test_cuda_tensors_without_kernels_fail_loudly(monkeypatch):
    """Never a silent fallback to the CPU reference for CUDA tensors."""
    from rigel_core import _ext

    monkeypatch.setattr(_ext, "_C", None)
    with pytest.raises(RuntimeError, match="not built"):
        _ext.get()


def test_one_dispatch_rule_by_device(monkeypatch):
    """``_ext.use_kernels`` decides for every op: a CUDA tensor takes the kernels (RuntimeError when they are not
    built), any other device the reference, built or not; and the ops decide through it, not by an idiom of their
    own (a device or dtype test of their own, or ``hasattr`` on the extension)."""
    from types import SimpleNamespace

    from rigel_core import _ext

    cuda = SimpleNamespace(device=torch.device("cuda", 0))   # stands for a CUDA tensor on a machine without one
    for built in (None, SimpleNamespace()):
        monkeypatch.setattr(_ext, "_C", built)
        assert _ext.use_kernels(torch.zeros(2)) is False and _ext.use_kernels(torch.zeros(2, device="meta")) is False
        if built is None:
            with pytest.raises(RuntimeError, match="not built"):
                _ext.use_kernels(cuda)
        else:
            assert _ext.use_kernels(cuda) is True
    for rel in ("renderer/api.py", "renderer/appearance.py", "train/losses.py", "train/optim.py", "train/mcmc.py"):
        text = (ROOT / "rigel_core" / rel).read_text()
        assert "use_kernels(" in text, rel
        for idiom in (".is_cuda", 'type == "cuda"', "hasattr(_ext", "hasattr(C,", "_ext.available()"):
            assert idiom not in text, f"{rel}: {idiom}"


# ---- what the build compiles for, and what it installs ------------------------------------------------------------
ROOT = Path(__file__).resolve().parents[1]


def _arch_policy():
    spec = importlib.util.spec_from_file_location("rigel_cuda_arch", ROOT / "scripts" / "cuda_arch.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class _FakeTorch:
    """torch.cuda as the build sees it: the given compute capabilities, or no GPU."""

    def __init__(self, caps, fail=False):
        self.cuda = self
        self.caps, self.fail = caps, fail

    def is_available(self):
        if self.fail:
            raise RuntimeError("CUDA driver initialization failed")
        return bool(self.caps)

    def device_count(self):
        return len(self.caps)

    def get_device_capability(self, i):
        return self.caps[i]


def test_cuda_arch_policy():
    arch = _arch_policy()
    none = lambda: set()  # noqa: E731  (no nvidia-smi)
    # the environment wins
    got = arch.cuda_arch_list(_FakeTorch([(8, 6)]), {"TORCH_CUDA_ARCH_LIST": "7.5"}, none)
    assert got == ("7.5", "TORCH_CUDA_ARCH_LIST")
    # the GPUs present, each capability once, in order
    got, why = arch.cuda_arch_list(_FakeTorch([(9, 0), (8, 6), (9, 0)]), {}, none)
    assert got == "8.6;9.0" and "GPU" in why
    # torch sees none (or its driver fails): nvidia-smi's answer
    assert arch.cuda_arch_list(_FakeTorch([]), {"TORCH_CUDA_ARCH_LIST": " "}, lambda: {"12.0"})[0] == "12.0"
    assert arch.cuda_arch_list(_FakeTorch([(8, 0)], fail=True), {}, lambda: {"8.9"})[0] == "8.9"
    # no GPU anywhere: the documented default, machine code for sm_80 and sm_90 plus PTX for newer GPUs
    got, why = arch.cuda_arch_list(None, {}, none)
    assert got == arch.DEFAULT_CUDA_ARCH_LIST == "8.0;9.0+PTX" and "default" in why


def test_nvidia_smi_caps_parses_the_query(monkeypatch):
    arch = _arch_policy()
    monkeypatch.setattr(arch.shutil, "which", lambda name: "/usr/bin/nvidia-smi")
    monkeypatch.setattr(arch.subprocess, "run", lambda *a, **k: subprocess.CompletedProcess(a, 0, "8.6\n9.0\n\n", ""))
    assert arch.nvidia_smi_caps() == {"8.6", "9.0"}
    monkeypatch.setattr(arch.shutil, "which", lambda name: None)
    assert arch.nvidia_smi_caps() == set()


def test_console_scripts_exist():
    """Every console script of setup.py names a module of the checkout that defines the function it calls
    (rigel-bench named a module that did not exist)."""
    text = (ROOT / "setup.py").read_text()
    scripts = re.findall(r'"([\w-]+)=([\w.]+):(\w+)"', text)
    assert len(scripts) >= 5
    for name, module, func in scripts:
        path = ROOT / (module.replace(".", "/") + ".py")
        assert path.is_file(), f"{name}: {module} has no file {path.relative_to(ROOT)}"
        defined = {n.name for n in ast.parse(path.read_text()).body if isinstance(n, ast.FunctionDef)}
        assert func in defined, f"{name}: {module} defines no {func}()"
