"""rigel: build ``rigel_core._C`` (the CUDA kernels) when PyTorch has CUDA and nvcc exists; otherwise install
the pure-Python package (the PyTorch reference backend serves).

The kernels compile against the torch that the build imports, so on a CUDA machine install torch first and then
``pip install --no-build-isolation '.[viewer,colmap]'`` (README "Install with pip"): a plain ``pip install .``
builds in an isolated environment that has no torch, and rigel is then installed without its kernels (said
loudly below; CUDA renders then fail naming the fix, rigel_core/_ext.py).
Environment: ``RIGEL_NO_CUDA=1`` forces a pure-Python install. ``TORCH_CUDA_ARCH_LIST`` picks the GPU
architectures the kernels are compiled for; unset, scripts/cuda_arch.py chooses (README "Install").
"""
import glob
import os
import shutil
import sys

from setuptools import find_packages, setup

ROOT = os.path.dirname(os.path.abspath(__file__))

# The one dependency list (scripts/install.sh installs through it: pip install -e '.[all]'). OpenCV is a core
# dependency: any capture with lens distortion needs it (COLMAP or transforms.json), and zstandard reads SPZ v4.
INSTALL_REQUIRES = ["torch>=2.1", "numpy", "plyfile", "tqdm", "pillow", "imageio", "scipy", "safetensors", "zstandard",
                    "opencv-python-headless"]
EXTRAS_REQUIRE = {
    "colmap": ["pycolmap"],                        # COLMAP models: rigel-train --data, rigel-import-colmap
    "viewer": ["vulkan", "glfw", "imgui-bundle"],  # plus the system's Vulkan driver (README "Install")
    "video": ["imageio-ffmpeg"],                   # MP4 camera-path videos (GIF without it)
    "test": ["pytest", "pyflakes"],
}
EXTRAS_REQUIRE["all"] = sorted({req for reqs in EXTRAS_REQUIRE.values() for req in reqs})


def _nvcc():
    """The nvcc this machine has (CUDA_HOME's, PATH's or /usr/local/cuda's), or None."""
    for cand in (os.path.join(os.environ.get("CUDA_HOME", "/nonexistent"), "bin", "nvcc"), shutil.which("nvcc"),
                 "/usr/local/cuda/bin/nvcc"):
        if cand and os.path.exists(cand):
            return cand
    return None


SKIPPED_KERNELS = """this machine has nvcc ({nvcc}), but torch is not importable in this build: pip builds in an
isolated environment without your torch unless told otherwise. rigel is being installed WITHOUT its CUDA kernels:
fine with a CPU build of PyTorch (the reference renders on the CPU), but on a GPU rendering CUDA tensors will fail.
To build them: install a CUDA build of torch, then
    pip install --no-build-isolation '.[viewer,colmap]'
(RIGEL_NO_CUDA=1 installs without the kernels and without this message; README "Install with pip".)"""


def _loud(lines):
    """Print a framed warning on stderr, and on the terminal too when pip captures stderr (pip shows a build's
    output only with -v or on failure; /dev/tty reaches the user all the same). pip runs setup.py once per build
    hook (requirements, metadata, wheel): the terminal gets the warning from the step that builds the wheel only."""
    text = "\n".join(["", "rigel: " + "*" * 100] + [f"rigel: {line}" for line in lines] + ["rigel: " + "*" * 100, ""])
    print(text, file=sys.stderr)
    if not sys.stderr.isatty() and {"bdist_wheel", "editable_wheel", "build_ext", "install"} & set(sys.argv):
        try:
            with open("/dev/tty", "w") as tty:
                tty.write(text + "\n")
        except OSError:  # no controlling terminal (CI): the build log has it
            pass


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
        nvcc = _nvcc()
        if nvcc is None:
            print("rigel: torch is not importable in the build environment and there is no nvcc; "
                  "installing without CUDA kernels", file=sys.stderr)
        else:
            _loud(SKIPPED_KERNELS.format(nvcc=nvcc).splitlines())
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
    # rigel_core.assets and viewer.gpu.shaders hold data only (the bundled scene; the GLSL, shaderio.h and SPIR-V
    # that viewer.gpu.shaderio reads at run time): listed so setuptools ships them as packages
    packages=find_packages(include=["rigel_core", "rigel_core.*", "viewer", "viewer.*"])
    + ["rigel_core.assets", "viewer.gpu.shaders"],
    package_data={"rigel_core": ["assets/*"], "viewer.gpu.shaders": ["*"]},
    include_package_data=True,
    python_requires=">=3.10",
    install_requires=INSTALL_REQUIRES,
    extras_require=EXTRAS_REQUIRE,
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
