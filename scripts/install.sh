#!/usr/bin/env bash
# Install rigel into ./.venv from nothing (what a new user and CI run).
#   bash scripts/install.sh [--system]
#   --system  also apt-get the Vulkan/X packages the viewer and its tests use (lavapipe, Xvfb, glslc,
#             validation layers), and python3-venv and g++ (a bare Debian/Ubuntu image lacks the venv module
#             and the compiler the extension build needs); needs root or sudo.
# Builds the CUDA kernels (rigel_core._C) when a CUDA build of PyTorch and nvcc are present; installs the
# pure-Python package otherwise (the PyTorch reference backend renders on the CPU). The dependencies come from the
# package metadata (setup.py: INSTALL_REQUIRES and the extras; '.[all]' is every extra), the one list of them.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "${1:-}" = "--system" ]; then
  SUDO=""; [ "$(id -u)" = 0 ] || SUDO=sudo
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends \
    libvulkan1 mesa-vulkan-drivers vulkan-tools vulkan-validationlayers \
    xvfb xauth x11-utils imagemagick glslc glslang-tools spirv-tools libgl1 libegl1 python3-venv g++ >/dev/null
fi
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
. .venv/bin/activate
python -m pip install -q --upgrade pip setuptools wheel
# torch 2.14.1 (a CUDA 13 build: compiles the kernels; runs on the CPU where there is no GPU) and the build tools,
# before rigel: the build below is not isolated, so that it compiles against this torch.
python -m pip install -q "torch==2.14.1" ninja
[ -d /usr/local/cuda ] && export CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
# GPU architectures: setup.py compiles for this machine's GPU, or for sm_80 + sm_90 + PTX without one
# (TORCH_CUDA_ARCH_LIST overrides; README "Install").
export MAX_JOBS=${MAX_JOBS:-2}
# The editable install compiles the CUDA kernels (minutes): skip it when rigel is installed and its _C is newer
# than every kernel source and setup.py (running the README's second command after the first, say).
so=""
for f in rigel_core/_C*.so; do [ -e "$f" ] && so=$f && break; done
if [ -n "$so" ] && pip show -q rigel >/dev/null 2>&1 && [ -z "$(find csrc setup.py -newer "$so" 2>/dev/null)" ]; then
  echo "rigel already installed and its kernels are up to date ($so)"
else
  if [ -z "${RIGEL_NO_CUDA:-}" ] && python -c "import sys, torch; sys.exit(torch.version.cuda is None)" &&
     { command -v nvcc >/dev/null || [ -x "${CUDA_HOME:-/nonexistent}/bin/nvcc" ]; }; then
    echo "rigel: compiling the CUDA kernels (several minutes; MAX_JOBS=$MAX_JOBS)…"
  elif [ -n "${RIGEL_NO_CUDA:-}" ]; then
    echo "rigel: RIGEL_NO_CUDA is set: installing without the CUDA kernels (the CPU reference renders)"
  fi
  # not -q: pip reports each dependency and, while the kernels compile, that the build is still running
  python -m pip install --no-build-isolation -e ".[all]"
fi
python -c "import rigel_core, rigel_core._ext as e; print('rigel installed; CUDA kernels built:', e.available())"
