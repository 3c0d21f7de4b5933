"""bench/gaussian_memory.py and bench/big_scene.py (issue 37 items 2-3) on tiny CPU sizes: what the lead runs on the
GPU later, exercised here; the CUDA-only figures are reported as skipped with their reason."""
import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench import big_scene, gaussian_memory  # noqa: E402
from rigel_core.train.memory import bytes_per_gaussian_floor  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")  # conftest.py: one PyTorch thread


def test_parse_count_and_slope():
    assert [gaussian_memory.parse_count(t) for t in ("160k", "2M", "1500", "2.5M")] == [160_000, 2_000_000, 1500,
                                                                                       2_500_000]
    rows = [{"n": 100, "peak": 5000 + 100 * 700}, {"n": 300, "peak": 5000 + 300 * 700}, {"n": 50}]
    assert gaussian_memory.slope(rows) == pytest.approx(700)
    assert gaussian_memory.slope(rows[:1]) is None


def test_gaussian_memory_inventory_is_the_refusals_floor_on_cpu(tmp_path, monkeypatch, capsys):
    """The trainer's per-Gaussian tensors, counted one by one after a step (parameters, gradients, Adam moments,
    statistics), come to bytes_per_gaussian_floor exactly — the floor rigel-train refuses with is the real static
    cost — and the CUDA-only columns say why they are empty."""
    monkeypatch.setenv("OUT", str(tmp_path))
    assert gaussian_memory.main(["--device", "cpu", "--counts", "200,400", "--res", "24x16", "--steps", "2",
                                 "--find-max"]) == 0
    result = json.loads((tmp_path / "gaussian_memory.json").read_text())
    for row in result["rigel"]:
        inv = row["inventory"]
        assert inv["params"] == inv["grads"] == inv["adam"] // 2 > 0
        assert sum(inv.values()) == row["n"] * bytes_per_gaussian_floor(3)
        assert "CUDA" in row["peak_skipped"] and row["step_ms"] > 0
    assert all("CUDA" in g["skipped"] for g in result["gsplat"]) and "CUDA" in result["find_max"]
    assert "956 B per Gaussian" in (tmp_path / "gaussian_memory.md").read_text()


def test_big_scene_trains_a_generated_capture_streamed_and_preloaded_on_cpu(tmp_path, monkeypatch):
    """The generated capture is made outside the repository, both runs train to the end, report their time to the
    first step, ms per iteration and host peak; the streamed one held a few views; the render part is skipped."""
    out = tmp_path / "out"
    out.mkdir()
    monkeypatch.setenv("OUT", str(out))
    cap = tmp_path / "capture"
    assert big_scene.main(["--device", "cpu", "--views", "30", "--res", "24x16", "--scene-gaussians", "150",
                           "--capture", str(cap), "--forward", "10M",
                           "--train-args", "--init-points 80 --sh-degree 0"]) == 0
    r = json.loads((out / "big_scene.json").read_text())
    assert r["capture"]["made"] and (cap / "transforms_train.json").is_file()
    assert r["iters"] == 30 + 300    # one epoch and 300 more by default: the first epoch and the cached steps apart
    for name in ("streamed", "preloaded"):
        run = r["runs"][name]
        assert run["status"] == 0 and run["first_step_s"] > 0 and run["ms_per_iter"] > 0, run
        assert run["ms_first_epoch"] > 0 and run["ms_after_epoch"] > 0, run
        assert run["host_peak_bytes"] > 100e6
    assert r["throughput"] == r["runs"]["preloaded"]["ms_after_epoch"] / r["runs"]["streamed"]["ms_after_epoch"]
    assert r["throughput_first_epoch"] > 0 and "first epoch" in (out / "big_scene.md").read_text()
    frames = r["runs"]["streamed"]["frames"]
    assert frames["streamed"] and 1 <= frames["peak_device_frames"] <= 5 and frames["frame_bytes"] == 24 * 16 * 13
    assert r["runs"]["preloaded"]["frames"] == {"streamed": False}
    assert r["throughput"] > 0 and "needs CUDA" in r["forward"]
    again = big_scene.make_capture(cap, 10, "24x16", 150, "cpu")  # reused, not made again
    assert not again["made"]
