"""rigel: build ``rigel_core._C`` (the CUDA kernels) when PyTorch has CUDA and nvcc exists; otherwise install
the pure-Python package (the PyTorch reference backend serves).

Install with ``pip install --no-build-isolation -e .`` so that the build sees the installed torch
(an isolated build has no torch, and would silently skip the kernels — ../shared/docs/PLATFORM.md).
Environment: ``RIGEL_NO_CUDA=1`` forces a pure-Python install. ``TORCH_CUDA_ARCH_LIST`` picks the GPU
architectures the kernels are compiled for; unset, scripts/cuda_arch.py chooses (README "Install").
"""
import glob
import os
import shutil
import sys

from setuptools import find_packages, setup

ROOT = os.path.dirname(os.path.abspath(__file__))


def _cuda_arch_policy():
    """scripts/cuda_arch.py (the architecture rule), loaded by path: setup.py cannot import the package."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("rigel_cuda_arch", os.path.join(ROOT, "scripts", "cuda_arch.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def cuda_extension():
    if os.environ.get("RIGEL_NO_CUDA"):
        print("rigel: RIGEL_NO_CUDA set, installing without CUDA kernels", file=sys.stderr)
        return [], {}
    sources = sorted(glob.glob(os.path.join("csrc", "*.cu")) + glob.glob(os.path.join("csrc", "*.cpp")))
    if not sources:
        return [], {}
    try:
        import torch
    except ImportError:
        print("rigel: torch is not importable in the build environment (use --no-build-isolation); "
              "installing without CUDA kernels", file=sys.stderr)
        return [], {}
    if torch.version.cuda is None:
        print("rigel: this PyTorch has no CUDA; installing without CUDA kernels", file=sys.stderr)
        return [], {}
    # ../shared/docs/PLATFORM.md: nvcc on PATH may be a wrapper in /usr/local/bin, which makes torch guess CUDA_HOME=/usr/local.
    if "CUDA_HOME" not in os.environ:
        for cand in ("/usr/local/cuda", os.path.dirname(os.path.dirname(shutil.which("nvcc") or "/x/x"))):
            if os.path.exists(os.path.join(cand, "bin", "nvcc")) and os.path.exists(os.path.join(cand, "include", "cuda.h")):
                os.environ["CUDA_HOME"] = cand
                break
    if "CUDA_HOME" not in os.environ:
        print("rigel: no CUDA toolkit found (CUDA_HOME / nvcc); installing without CUDA kernels", file=sys.stderr)
        return [], {}
    arch, why = _cuda_arch_policy().cuda_arch_list(torch)
    os.environ["TORCH_CUDA_ARCH_LIST"] = arch
    print(f"rigel: compiling the CUDA kernels for TORCH_CUDA_ARCH_LIST={arch} ({why})", file=sys.stderr)
    from torch.utils.cpp_extension import BuildExtension, CUDAExtension

    include_dirs = [os.path.join(ROOT, "csrc")]
    # torch's pip CUDA headers (cusparse.h, cublas_v2.h) that ATen/cuda/CUDAContext.h includes.
    for p in sys.path:
        for sub in ("nvidia/cu13/include", "nvidia/cuda_runtime/include"):
            cand = os.path.join(p, sub)
            if os.path.isdir(cand):
                include_dirs.append(cand)
    ext = CUDAExtension(
        name="rigel_core._C",
        sources=sources,
        include_dirs=include_dirs,
        # no -std flag: each torch adds the standard it was built with (C++17 for 2.11, C++20 for 2.14)
        # -g0: no DWARF in the host objects (Python's CFLAGS add -g), nothing for a backtrace symboliser to parse
        extra_compile_args={"cxx": ["-O3", "-g0"],
                            "nvcc": ["-O3", "--use_fast_math" if os.environ.get("RIGEL_FAST_MATH") else "-lineinfo",
                                     "--expt-relaxed-constexpr"]},
    )
    return [ext], {"build_ext": BuildExtension.with_options(use_ninja=True)}


ext_modules, cmdclass = cuda_extension()

setup(
    name="rigel",
    version="0.1.0",
    description="3D Gaussian Splatting renderer, trainer and viewer with from-scratch CUDA kernels",
    # rigel_core.assets holds data only (the bundled scene): listed so setuptools ships it as a package
    packages=find_packages(include=["rigel_core", "rigel_core.*", "viewer", "viewer.*"]) + ["rigel_core.assets"],
    # viewer.gpu reads its shaders at run time (the SPIR-V and shaderio.h's constants): shipped inside the package
    package_data={"viewer.gpu": ["shaders/*"], "rigel_core": ["assets/*"]},
    include_package_data=True,
    python_requires=">=3.10",
    install_requires=["torch", "numpy", "plyfile", "tqdm", "pillow", "imageio", "scipy", "safetensors"],
    extras_require={
        "colmap": ["pycolmap"],
        "viewer": ["vulkan", "glfw", "imgui-bundle", "pyglm"],
        "test": ["pytest"],
    },
    entry_points={"console_scripts": [
        "rigel-render=rigel_core.cli.render:main",
        "rigel-train=rigel_core.cli.train:main",
        "rigel-import-colmap=rigel_core.cli.import_colmap:main",
        "rigel-convert=rigel_core.cli.convert:main",
        "rigel-viewer=viewer.cli:main",
    ]},
    ext_modules=ext_modules,
    cmdclass=cmdclass,
)
