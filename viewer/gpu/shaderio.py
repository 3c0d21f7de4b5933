"""Host side of ``viewer/gpu/shaders/shaderio.h`` (the header shared with the shaders) and the committed SPIR-V.

The integer ``#define`` lines of the header are the constants the host needs (render modes, flags, colormap
size, scale-bar geometry, bindings); :data:`C` holds them, read from the same file the shaders include, so the
two sides cannot drift. SPIR-V is committed next to its GLSL as ``<name>.spv``
(``present_modes.comp`` → ``present_modes.comp.spv``) and built with :data:`GLSLC_ARGS`;
``python -m viewer.gpu.shaderio`` rebuilds it and tests/test_vulkan.py checks that it is up to date. The folder
:data:`SHADER_DIR` lives inside this package, so a wheel ships it as package data (setup.py) and an installed
viewer reads the same files as a source checkout.
"""
from __future__ import annotations

import re
import shutil
import struct
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

__all__ = ["SHADER_DIR", "C", "SHADERS", "GLSLC_ARGS", "spirv", "compile_glsl", "present_params"]

#: The GLSL sources, the shared header and the committed SPIR-V (package data of ``viewer.gpu``).
SHADER_DIR = Path(__file__).resolve().parent / "shaders"
#: GLSL sources that are compiled to SPIR-V (shaderio.h is included, not compiled).
SHADERS = ("present_modes.comp", "imgui_ui.vert", "imgui_ui.frag")
#: glslc flags used for the committed SPIR-V (Vulkan 1.2 target, optimised, no debug info).
GLSLC_ARGS = ("--target-env=vulkan1.2", "-O")

_DEFINE = re.compile(r"^\s*#define\s+([A-Z_][A-Z0-9_]*)\s+(-?\d+)\b", re.M)


def _read_header(path: Path = SHADER_DIR / "shaderio.h") -> SimpleNamespace:
    try:
        text = path.read_text()
    except OSError as e:
        raise FileNotFoundError(f"{path}: the shared shader header is missing ({e}); this rigel install lacks its "
                                "package data: reinstall it") from None
    return SimpleNamespace(**{k: int(v) for k, v in _DEFINE.findall(text)})


#: Constants of shaderio.h (``C.MODE_OVERDRAW``, ``C.COLORMAP_SIZE``, …).
C = _read_header()

MODE_NAMES = {"image": C.MODE_IMAGE, "alpha": C.MODE_ALPHA, "overdraw": C.MODE_OVERDRAW,
              "side-by-side": C.MODE_SIDE_BY_SIDE}


def present_params(frame_w: int, frame_h: int, content: tuple, target: tuple, mode: int, overdraw_max: int,
                   flags: int, background: float) -> bytes:
    """The 48-byte ``PresentParams`` push-constant block of shaderio.h (std430: 11 int32 then 1 float32).
    ``content`` = (x, y, width, height) of the area the mode fills, ``target`` = (width, height) of the target,
    in target pixels."""
    x, y, w, h = (int(v) for v in content)
    tw, th = (int(v) for v in target)
    return struct.pack("<11if", frame_w, frame_h, x, y, w, h, tw, th, mode, max(int(overdraw_max), 1), flags,
                       float(background))


#: size in bytes of the PresentParams block
PRESENT_PARAMS_SIZE = 48


def spirv(name: str) -> bytes:
    """The committed SPIR-V of shader ``name`` (e.g. ``"present_modes.comp"``)."""
    path = SHADER_DIR / f"{name}.spv"
    try:
        return path.read_bytes()
    except OSError as e:
        raise FileNotFoundError(f"{path}: compiled shader missing ({e}); run `python -m viewer.gpu.shaderio` "
                                "(needs glslc: `apt-get install glslc`)") from None


def compile_glsl(name: str, out: Path | None = None) -> bytes:
    """Compile ``SHADER_DIR/<name>`` with glslc and :data:`GLSLC_ARGS`; return the SPIR-V (and write it to ``out``).

    Raises FileNotFoundError when glslc is missing, RuntimeError with glslc's message when compilation fails.
    """
    glslc = shutil.which("glslc")
    if glslc is None:
        raise FileNotFoundError("glslc is not installed: `apt-get install glslc`")
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        dst = Path(tmp) / "out.spv"
        # Run from the shader folder with a relative source name, so the output never depends on the caller.
        r = subprocess.run([glslc, *GLSLC_ARGS, name, "-o", str(dst)], cwd=SHADER_DIR, capture_output=True,
                           text=True)
        if r.returncode != 0:
            raise RuntimeError(f"glslc failed on {SHADER_DIR / name}:\n{r.stderr}")
        data = dst.read_bytes()
    if out is not None:
        Path(out).write_bytes(data)
    return data


def main(argv=None) -> int:
    """Rebuild every committed .spv from its GLSL."""
    for name in SHADERS:
        compile_glsl(name, SHADER_DIR / f"{name}.spv")
        print(SHADER_DIR / f"{name}.spv")
    return 0


if __name__ == "__main__":
    sys.exit(main())
