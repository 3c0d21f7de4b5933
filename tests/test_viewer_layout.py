"""The viewer's structure (issue 15): the GPU engine (viewer/gpu/) imports nothing of the application, every
request class has exactly one handler, and the frame loop stays short enough to read on one screen."""
import ast
import dataclasses
import inspect
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
GPU = ROOT / "viewer" / "gpu"


def _imports(path: Path):
    """(module, level) of every import statement in ``path`` (function-level imports included)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                yield a.name, 0
        elif isinstance(node, ast.ImportFrom):
            yield node.module or "", node.level


def test_the_gpu_engine_imports_nothing_of_the_application():
    files = sorted(GPU.glob("*.py"))
    assert len(files) >= 9, "viewer/gpu/ holds the engine modules"
    bad = []
    for f in files:
        for module, level in _imports(f):
            if level >= 2 or (level == 0 and (module == "viewer" or module.startswith("viewer.")
                                              and not module.startswith("viewer.gpu"))):
                bad.append(f"{f.relative_to(ROOT)}: {'.' * level}{module}")
    assert not bad, "the engine imports the application: " + "; ".join(bad)


def test_the_walk_sees_an_application_import(tmp_path):
    """The check above fails on an engine file that reaches into the application (both spellings)."""
    f = tmp_path / "x.py"
    f.write_text("def f():\n    from ..ui import Stats\n")
    assert ("ui", 2) in list(_imports(f))
    f.write_text("import viewer.app\n")
    assert ("viewer.app", 0) in list(_imports(f))


def test_every_request_class_has_one_handler_and_texts_map_to_requests():
    from viewer import messages as M
    from viewer import requests as R

    classes = {c for _, c in inspect.getmembers(R, inspect.isclass)
               if issubclass(c, R.Request) and c is not R.Request}
    assert classes and set(R.HANDLERS) == classes
    assert all(dataclasses.is_dataclass(c) for c in classes)
    with pytest.raises(RuntimeError, match="two handlers"):
        R.handles(R.Quit)(lambda v, r: None)
    assert R.as_request("path:add") == R.CameraPath("path:add")
    assert R.as_request("edit:undo") == R.Studio("edit:undo")
    assert R.as_request(M.Pause()) == R.Train(M.Pause())
    assert R.as_request(R.SetMode(2)) == R.SetMode(2)
    with pytest.raises(TypeError):
        R.as_request(3)


def test_requests_reach_their_handler():
    """apply_requests dispatches each request to its handler with the viewer (a stand-in object here)."""
    from types import SimpleNamespace

    from viewer import messages as M
    from viewer import requests as R

    sent = []
    v = SimpleNamespace(settings=SimpleNamespace(mode=0, show_panels=True, fly=False), training=None,
                        train_state=None)
    R.apply_requests(v, [R.SetMode(3), R.TogglePanels(), R.ToggleFly(), M.Resume()])   # no training: dropped
    assert (v.settings.mode, v.settings.show_panels, v.settings.fly) == (3, False, True)
    v.training = SimpleNamespace(send=sent.append)
    v.train_state = SimpleNamespace(status="running")
    R.apply_requests(v, [R.ToggleTraining(), M.Step(2)])
    assert sent == [M.Pause(), M.Step(2)]


def test_the_frame_loop_reads_on_one_screen():
    from viewer.app import Viewer

    lines = sum(len(inspect.getsource(f).splitlines()) for f in (Viewer.request, Viewer.step, Viewer.run,
                                                                  Viewer._count_present))
    assert lines <= 150, lines
