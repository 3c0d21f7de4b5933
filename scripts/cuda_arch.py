"""Which GPU architectures the CUDA kernels are compiled for: the one policy, used by setup.py (and so by
scripts/install.sh and CI) and tested by tests/test_build.py. Imports nothing of rigel (setup.py loads it by path).

The environment's ``TORCH_CUDA_ARCH_LIST`` when set; else the compute capabilities of this machine's GPUs (torch's
view, else ``nvidia-smi --query-gpu=compute_cap``); else :data:`DEFAULT_CUDA_ARCH_LIST`.
"""
from __future__ import annotations

import os
import shutil
import subprocess

#: Without a visible GPU (a CI runner, a build host): sm_80 machine code (A100; sm_86 and sm_89 GPUs, e.g. RTX
#: 30xx/40xx, A10, L4, L40, run sm_80 code too), sm_90 machine code (H100/H200), and compute_90 PTX, which newer GPUs
#: (Blackwell, sm_100/sm_120) compile just in time at first use. Two machine-code targets, not one per GPU
#: generation, so the build takes about twice the time of a single-architecture one (README "Install").
DEFAULT_CUDA_ARCH_LIST = "8.0;9.0+PTX"


def nvidia_smi_caps() -> set[str]:
    """Compute capabilities ("8.6", …) that ``nvidia-smi`` reports; empty without the tool or a GPU."""
    if not shutil.which("nvidia-smi"):
        return set()
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=compute_cap", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=30, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return set()
    return {line.strip() for line in out.splitlines() if line.strip()[:1].isdigit()}


def torch_caps(torch) -> set[str]:
    """Compute capabilities of the GPUs torch sees; empty without one (or with a broken driver)."""
    try:
        if torch is None or not torch.cuda.is_available():
            return set()
        return {"%d.%d" % torch.cuda.get_device_capability(i) for i in range(torch.cuda.device_count())}
    except Exception:  # a driver that fails to initialise: fall through to nvidia-smi / the default
        return set()


def cuda_arch_list(torch=None, env=None, smi=nvidia_smi_caps) -> tuple[str, str]:
    """(TORCH_CUDA_ARCH_LIST value, the reason in words) by the rule of the module docstring."""
    env = os.environ if env is None else env
    given = env.get("TORCH_CUDA_ARCH_LIST", "").strip()
    if given:
        return given, "TORCH_CUDA_ARCH_LIST"
    caps = torch_caps(torch) or smi()
    if caps:
        return ";".join(sorted(caps, key=lambda c: tuple(int(x) for x in c.split(".")))), "the GPU(s) of this machine"
    return DEFAULT_CUDA_ARCH_LIST, "no GPU visible: the default"
