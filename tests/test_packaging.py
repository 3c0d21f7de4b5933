"""Packaging (issue 40): one dependency list in setup.py that scripts/install.sh installs through; a missing optional
package is one line naming what to install; an isolated build on a machine with nvcc says loudly that it skips the
kernels; and a non-editable wheel, installed into a fresh venv, runs the viewer and loads a distorted capture."""
import ast
import importlib.metadata
import json
import os
import re
import subprocess
import sys
import sysconfig
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from rigel_core.deps import MissingPackage, require

ROOT = Path(__file__).resolve().parents[1]

#: third-party modules imported without being declared, and why
UNDECLARED = {"cuda": "cuda-bindings comes with CUDA builds of torch; only the GPU interop path imports it "
                      "(viewer/gpu/cuda_interop.py)"}


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _req_name(req: str) -> str:
    return _norm(re.match(r"[A-Za-z0-9_.-]+", req).group(0))


def setup_metadata():
    """(INSTALL_REQUIRES, EXTRAS_REQUIRE without 'all') as setup.py writes them (read, not executed)."""
    values = {}
    for node in ast.parse((ROOT / "setup.py").read_text()).body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name) \
                and node.targets[0].id in ("INSTALL_REQUIRES", "EXTRAS_REQUIRE"):
            values[node.targets[0].id] = ast.literal_eval(node.value)
    return values["INSTALL_REQUIRES"], values["EXTRAS_REQUIRE"]


def third_party_imports(packages=("rigel_core", "viewer")) -> dict[str, set[str]]:
    """{top-level module: files importing it} over the packages: import statements at any depth and
    ``require("module", ...)`` calls; the standard library and the packages themselves left out."""
    found: dict[str, set[str]] = {}
    for pkg in packages:
        for f in sorted((ROOT / pkg).rglob("*.py")):
            for n in ast.walk(ast.parse(f.read_text())):
                names = []
                if isinstance(n, ast.Import):
                    names = [a.name for a in n.names]
                elif isinstance(n, ast.ImportFrom) and n.level == 0 and n.module:
                    names = [n.module]
                elif isinstance(n, ast.Call) and getattr(n.func, "id", None) == "require" and n.args \
                        and isinstance(n.args[0], ast.Constant):
                    names = [n.args[0].value]
                for name in names:
                    top = name.split(".")[0]
                    if top not in sys.stdlib_module_names and top not in packages:
                        found.setdefault(top, set()).add(str(f.relative_to(ROOT)))
    return found


# ---- the one dependency list ---------------------------------------------------------------------------------
def test_every_import_is_declared_and_every_declaration_imported():
    """Each third-party module the packages import belongs to a distribution that setup.py lists (OpenCV was in no
    list, so `pip install rigel[colmap]` could not load a distorted capture), and each listed runtime distribution
    is imported somewhere (pyglm was listed and never used)."""
    core, extras = setup_metadata()
    declared = {_req_name(r) for r in core} | {_req_name(r) for k, v in extras.items() if k != "test" for r in v}
    dists = importlib.metadata.packages_distributions()
    provided = set()
    for module, files in third_party_imports().items():
        if module in UNDECLARED:
            continue
        assert module in dists, f"{module} (imported by {sorted(files)[0]}) is not installed here: cannot check it"
        names = {_norm(d) for d in dists[module]}
        assert names & declared, f"{module} (imported by {sorted(files)}) comes from {sorted(names)}, which setup.py " \
                                 "does not list"
        provided |= names
    assert not declared - provided, f"setup.py lists {sorted(declared - provided)}, which nothing imports"


def test_opencv_is_a_core_dependency():
    """Any capture with lens distortion needs OpenCV, a transforms.json one (../shared/data/real/fox) as much as a
    COLMAP one: it cannot hide in the colmap extra."""
    core, _ = setup_metadata()
    assert "opencv-python-headless" in {_req_name(r) for r in core}


def test_install_sh_installs_through_the_metadata():
    """scripts/install.sh names no runtime dependency itself (its own list disagreed with setup.py's): it installs
    torch (pinned) and the build tools, then rigel with every extra."""
    text = (ROOT / "scripts" / "install.sh").read_text()
    core, extras = setup_metadata()
    pip_lines = [ln for ln in text.splitlines()
                 if re.search(r"\bpip install\b", ln) and not ln.lstrip().startswith("#")]
    named = set()
    for ln in pip_lines:
        for tok in ln.split("pip install", 1)[1].split():
            tok = tok.strip("\"'\\")
            if tok and not tok.startswith("-") and tok not in (".", ".[all]"):
                named.add(tok)
    assert named == {"pip", "setuptools", "wheel", "torch==2.14.1", "ninja"}, named
    assert re.search(r"pip install --no-build-isolation -e \"?\.\[all\]", text), "rigel is not installed with .[all]"
    every = {_req_name(r) for r in core} | {_req_name(r) for v in extras.values() for r in v}
    assert set(extras) >= {"colmap", "viewer", "test"} and "pyflakes" in every and "pytest" in every


# ---- a missing optional package ------------------------------------------------------------------------------
def test_require_says_what_to_install():
    assert require("json", package="x", purpose="y") is __import__("json")
    missing = "rigel_no_such_module_" + os.urandom(4).hex()
    with pytest.raises(MissingPackage) as e:
        require(missing, package="some-dist", extra="colmap", purpose="reading a thing")
    assert isinstance(e.value, ImportError) and e.value.name == missing
    msg = str(e.value)
    assert msg.startswith("reading a thing needs the Python package `some-dist` (rigel's 'colmap' extra)")
    assert msg.endswith(": pip install some-dist") and missing in msg and "\n" not in msg
    with pytest.raises(MissingPackage, match=r"\(a dependency of rigel\)"):
        require(missing, package="some-dist", purpose="reading a thing")


def distorted_capture(root: Path, g: np.random.Generator, n=2, w=16, h=12) -> Path:
    """A tiny instant-ngp capture with radial distortion (k1 ≠ 0): its images must be undistorted at load."""
    root.mkdir()
    (root / "images").mkdir()
    frames = []
    for i in range(n):
        Image.fromarray(g.integers(0, 256, (h, w, 3), dtype=np.uint8)).save(root / "images" / f"{i:03d}.png")
        c2w = np.eye(4)
        c2w[:3, 3] = g.uniform(-1, 1, 3) + [0, 0, 4]
        frames.append({"file_path": f"images/{i:03d}.png", "transform_matrix": c2w.tolist()})
    meta = {"w": w, "h": h, "fl_x": 14.0, "fl_y": 14.0, "cx": w / 2, "cy": h / 2, "k1": float(g.uniform(0.05, 0.2)),
            "frames": frames}
    (root / "transforms.json").write_text(json.dumps(meta))
    return root


@pytest.fixture
def np_gen(rng):
    return np.random.default_rng(rng.initial_seed())


def test_distorted_capture_without_opencv_names_the_package(tmp_path, np_gen, monkeypatch, capsys):
    """The loader imports OpenCV for any distorted capture: without it, load_dataset raises an ImportError that
    says `pip install opencv-python-headless`, and rigel-train prints that one line and exits 2 (it ended with
    "No module named 'cv2'")."""
    from rigel_core.cli.train import main as train_main
    from rigel_core.data import load_dataset

    data = distorted_capture(tmp_path / "cap", np_gen)
    assert len(load_dataset(data).train) == 1          # with OpenCV: loads (the capture is fine)
    monkeypatch.setitem(sys.modules, "cv2", None)       # "import cv2" now fails as on a machine without it
    with pytest.raises(MissingPackage, match=r"lens distortion needs the Python package `opencv-python-headless`"
                                             r".*: pip install opencv-python-headless$"):
        load_dataset(data)
    capsys.readouterr()
    assert train_main(["--data", str(data), "--out", str(tmp_path / "run"), "--iters", "1"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("rigel-train: undistorting the images") and "pip install opencv-python-headless" in \
        err[-1] and not any("Traceback" in ln for ln in err), err
    assert not (tmp_path / "run").exists()


def test_colmap_without_pycolmap_names_the_package(shared_data, monkeypatch):
    from rigel_core.data import load_dataset

    monkeypatch.setitem(sys.modules, "pycolmap", None)
    with pytest.raises(MissingPackage, match=r"reading a COLMAP model needs the Python package `pycolmap` "
                                             r"\(rigel's 'colmap' extra\).*: pip install pycolmap$"):
        load_dataset(shared_data / "real" / "beer", max_frames=1)


def test_viewer_without_imgui_bundle_names_the_package(tmp_path, monkeypatch, capsys):
    """The viewer's first use of imgui_bundle says what to install (and closing the half-made viewer does not
    replace that error with another import of it)."""
    from viewer.cli import main as viewer_main

    monkeypatch.setitem(sys.modules, "imgui_bundle", None)
    assert viewer_main(["--offscreen", "--frames", "1", "--out", str(tmp_path / "shots")]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["rigel-viewer: the viewer needs the Python package `imgui-bundle` (rigel's 'viewer' extra), which "
                   "did not import (import of imgui_bundle halted; None in sys.modules): pip install imgui-bundle"]


# ---- the build -----------------------------------------------------------------------------------------------
def _setup_py(tmp_path, *args, **env_changes):
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "CUDA_HOME", "RIGEL_NO_CUDA")}
    env.update(env_changes)
    return subprocess.run([sys.executable, "setup.py", *args], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=300)


def test_isolated_build_with_nvcc_warns_loudly(tmp_path):
    """A build that cannot import torch (pip's isolated build) on a machine with nvcc prints a framed warning that
    the kernels are skipped and how to build them (it printed one line that pip hid)."""
    blocker = tmp_path / "blocker" / "torch"
    blocker.mkdir(parents=True)
    (blocker / "__init__.py").write_text("raise ImportError('no torch in this build environment (test)')\n")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "nvcc").write_text("#!/bin/sh\nexit 0\n")
    (bin_dir / "nvcc").chmod(0o755)
    r = _setup_py(tmp_path, "--name", PYTHONPATH=str(tmp_path / "blocker"),
                  PATH=f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}")
    assert r.returncode == 0 and r.stdout.strip() == "rigel", r.stdout + r.stderr
    lines = [ln for ln in r.stderr.splitlines() if ln.startswith("rigel: ")]
    assert lines[0] == lines[-1] == "rigel: " + "*" * 100, r.stderr
    text = "\n".join(lines)
    assert "WITHOUT its CUDA kernels" in text and "pip install --no-build-isolation" in text and "nvcc (" in text
    quiet = _setup_py(tmp_path, "--name", PYTHONPATH=str(tmp_path / "blocker"), RIGEL_NO_CUDA="1")
    assert quiet.returncode == 0 and "*" * 100 not in quiet.stderr and "RIGEL_NO_CUDA set" in quiet.stderr


# ---- a non-editable wheel in a fresh venv --------------------------------------------------------------------
def _clean_env(**extra):
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
    env.update(extra)
    return env


def _run(cmd, **kw):
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=kw.pop("timeout", 600), **kw)
    assert r.returncode == 0, \
        f"{' '.join(map(str, cmd))} failed ({r.returncode}):\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
    return r


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """A wheel of the checkout (its tracked and unignored files, built without the kernels: RIGEL_NO_CUDA=1, no
    isolation) installed non-editable with `[viewer,colmap]` into a fresh venv. The venv sees this environment's
    site-packages through a .pth file, so pip resolves the wheel's requirements offline (--no-index) against the
    packages installed here; the venv's own site-packages comes first, so rigel is the wheel's."""
    tmp = tmp_path_factory.mktemp("packaging")
    try:
        files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=ROOT, capture_output=True,
                               check=True, timeout=60).stdout.decode().split("\0")
    except (OSError, subprocess.CalledProcessError) as e:
        pytest.skip(f"the checkout's files are listed with git, which failed here ({e})")
    src = tmp / "src"
    for name in filter(None, files):
        if (ROOT / name).is_file():
            (src / name).parent.mkdir(parents=True, exist_ok=True)
            (src / name).write_bytes((ROOT / name).read_bytes())
    _run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", str(tmp / "wheels"),
          str(src)], env=_clean_env(RIGEL_NO_CUDA="1"), cwd=tmp)
    wheel, = (tmp / "wheels").glob("rigel-*.whl")
    venv = tmp / "venv"
    _run([sys.executable, "-m", "venv", "--without-pip", str(venv)], env=_clean_env(), cwd=tmp)
    py = venv / "bin" / "python"
    purelib = _run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                   env=_clean_env(), cwd=tmp).stdout.strip()
    here = dict.fromkeys(sysconfig.get_paths()[k] for k in ("purelib", "platlib"))
    Path(purelib, "_rigel_test_parent.pth").write_text("".join(f"{p}\n" for p in here))
    _run([str(py), "-m", "pip", "install", "-q", "--no-index", f"{wheel}[viewer,colmap]"], env=_clean_env(), cwd=tmp)
    return {"tmp": tmp, "wheel": wheel, "venv": venv, "py": py, "purelib": Path(purelib)}


@pytest.mark.slow
def test_wheel_ships_the_shaders_inside_the_viewer(installed):
    import zipfile

    names = set(zipfile.ZipFile(installed["wheel"]).namelist())
    shaders = {n for n in names if "shaders/" in n}
    assert {f"viewer/gpu/shaders/{f}" for f in ("shaderio.h", "present_modes.comp.spv", "imgui_ui.vert.spv",
                                                 "imgui_ui.frag.spv")} <= shaders, sorted(shaders)
    assert all(n.startswith("viewer/gpu/shaders/") for n in shaders), sorted(shaders)   # no top-level shaders/
    assert "rigel_core/assets/default_scene.ply" in names


@pytest.mark.slow
def test_installed_wheel_renders_the_viewer_offscreen(installed):
    from test_vulkan import VK_OK, VK_REASON

    if not VK_OK:
        pytest.skip(f"no usable Vulkan device: {VK_REASON}")
    out = installed["tmp"] / "shots"
    r = _run([str(installed["venv"] / "bin" / "rigel-viewer"), "--offscreen", "--frames", "1", "--out", str(out)],
             env=_clean_env(XDG_CONFIG_HOME=str(installed["tmp"] / "config"),
                            XDG_RUNTIME_DIR=os.environ["XDG_RUNTIME_DIR"]), cwd=installed["tmp"])
    assert str(installed["purelib"] / "rigel_core" / "assets") in r.stdout, r.stdout   # the wheel's bundled scene
    with Image.open(out / "frame_0000.png") as im:
        assert im.size[0] > 0 and np.asarray(im).std() > 0


CHILD_LOAD = """
import json, sys
import rigel_core, viewer.gpu.shaderio as s
from rigel_core.data import load_dataset
out = {"rigel_core": rigel_core.__file__, "shaders": str(s.SHADER_DIR)}
for name in sys.argv[1:]:
    ds = load_dataset(name, downscale=8, max_frames=2)
    out[name] = [len(ds.train), "cv2" in sys.modules, "pycolmap" in sys.modules]
print(json.dumps(out))
"""


@pytest.mark.slow
def test_installed_wheel_loads_distorted_captures(installed, shared_data):
    """The installed package alone loads ../shared/data/real/beer (COLMAP, SIMPLE_RADIAL) and real/fox
    (transforms.json with k1..p2: no pycolmap needed), undistorting them with OpenCV."""
    beer, fox = shared_data / "real" / "beer", shared_data / "real" / "fox"
    names = [str(p) for p in (fox, beer) if p.is_dir()]   # fox first: it must load without importing pycolmap
    if not names:
        pytest.skip(f"neither {beer} nor {fox} is present")
    r = _run([str(installed["py"]), "-c", CHILD_LOAD, *names], env=_clean_env(), cwd=installed["tmp"])
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["rigel_core"].startswith(str(installed["purelib"])), out
    assert out["shaders"].startswith(str(installed["purelib"])), out
    if fox.is_dir():
        assert out[str(fox)] == [2, True, False], out
    if beer.is_dir():
        assert out[str(beer)][:2] == [2, True], out
