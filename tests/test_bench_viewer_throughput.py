"""bench/viewer_throughput.py (issue 15's acceptance figure) and the timings it reads.

The bench runs tiny on the CPU (a 32×32 procedural dataset, 20 iterations, the offscreen viewer on lavapipe): the
figures themselves are not asserted (no timed assertion), only that both runs trained the same thing and that the
table and JSON say what the run folders hold. The timings' rules are checked on the viewer's training session
directly: ``loop_s`` covers the steps and leaves out a pause; a resumed session adds to the run's timings.
"""
import importlib.util
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "bench" / "viewer_throughput.py"

try:
    from test_vulkan import VK_OK, VK_REASON
except (ImportError, pytest.skip.Exception) as e:   # the `vulkan` package itself is missing
    VK_OK, VK_REASON = False, str(e)

needs_vulkan = pytest.mark.skipif(not VK_OK, reason=f"no usable Vulkan device: {VK_REASON}")
needs_ui = pytest.mark.skipif(importlib.util.find_spec("imgui_bundle") is None,
                              reason="the viewer's UI package imgui-bundle is not installed")


@pytest.fixture(scope="module")
def dataset_32(tmp_path_factory):
    """A 32×32 procedural dataset on disk (``rigel_core.data.make_dataset``), fresh random scene."""
    from rigel_core.data import make_dataset

    out = tmp_path_factory.mktemp("procedural32")
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        make_dataset(out, 300, 32, 32, n_train=8, n_test=2, seed=int(torch.randint(0, 2**31 - 1, (1,))),
                     progress=False, device="cpu")
    finally:
        torch.set_num_threads(n)
    return out


def _bench(*args, timeout=240):
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))
    env.pop("OUT", None)
    return subprocess.run([sys.executable, str(BENCH), *map(str, args)], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=timeout)


@needs_vulkan
@needs_ui
def test_bench_runs_tiny_and_reports_what_the_runs_wrote(dataset_32, tmp_path):
    out = tmp_path / "vtp"
    r = _bench("--device", "cpu", "--data", dataset_32, "--iters", 20, "--size", "64x48", "--threads", 1, "--fps", 60,
               "--train-args", "--init-points 200 --sh-degree 1", "--out", out)
    assert r.returncode == 0, r.stdout + r.stderr
    meta = json.loads((out / "viewer_throughput.json").read_text())
    assert meta["notes"] == [] and [x["kind"] for x in meta["runs"]] == ["train", "viewer"]
    runs = {}
    for rec in meta["runs"]:
        m = json.loads((out / "runs" / rec["name"] / "metrics.json").read_text())   # the copies of the run folders'
        assert m["iterations_done"] == 20 and rec["iterations"] == 20
        t = m["timings"]
        assert t["loop_s"] >= t["train_s"] > 0            # the loop's wall time holds the steps' own time
        runs[rec["kind"]] = m
    # the same training: configuration, seed and (the CPU, one thread: deterministic) the final held-out PSNR
    assert runs["train"]["config"] == runs["viewer"]["config"]
    p_train, p_view = runs["train"]["eval"][-1]["psnr"], runs["viewer"]["eval"][-1]["psnr"]
    assert p_train == pytest.approx(p_view, abs=1e-6)
    s = json.loads((out / "runs" / "viewer_1" / "summary.json").read_text())
    assert s["ok"] and s["max_fps"] == 60 and s["presents"] > 0 and s["fps"] > 0 and s["frame_ring"] == "host-mapped"
    # the figures: recomputed here from the run folders
    row = meta["pairs"][0]
    ms_a = 1e3 * runs["train"]["timings"]["loop_s"] / 20
    ms_b = 1e3 * runs["viewer"]["timings"]["loop_s"] / 20
    assert row["train_ms"] == pytest.approx(ms_a) and row["viewer_ms"] == pytest.approx(ms_b)
    assert row["ratio"] == pytest.approx(ms_a / ms_b) and row["fps"] == s["fps"]
    md = (out / "viewer_throughput.md").read_text()
    assert md in r.stdout
    line = next(ln for ln in md.splitlines() if ln.startswith(f"| {dataset_32.name} | 20 | pair 1 |"))
    assert f"{100 * ms_a / ms_b:.1f} %" in line and f"{p_train:.2f} dB" in line
    assert md.splitlines()[-1].startswith("issue 15 target (viewer ≥ 97 % of rigel-train's throughput, one pair): ")
    assert (out / "summary.txt").read_text().strip().endswith(md.splitlines()[-1])


def test_bench_refuses_bad_input_in_one_line(tmp_path):
    r = _bench("--data", tmp_path / "missing", "--out", tmp_path / "o", timeout=60)
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr.strip().splitlines() == [f"bench/viewer_throughput.py: --data {tmp_path / 'missing'}: no such "
                                             "dataset folder"]
    r = _bench("--data", tmp_path, "--fps", 0, "--out", tmp_path / "o", timeout=60)
    assert r.returncode == 2 and "--fps must be a positive number" in r.stderr
    (tmp_path / "o").mkdir()
    (tmp_path / "o" / "viewer_throughput.json").write_text("{}")   # never overwritten
    r = _bench("--data", tmp_path, "--out", tmp_path / "o", timeout=60)
    assert r.returncode == 2 and "exists" in r.stderr
    assert (tmp_path / "o" / "viewer_throughput.json").read_text() == "{}"


def _wait(session, kind, timeout=120):
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < timeout:
        for e in session.drain_events():
            if type(e).__name__ == "TrainingFailed":
                raise AssertionError(e.message)
            if type(e).__name__ == kind:
                return e
        time.sleep(0.01)
    raise AssertionError(f"no {kind} within {timeout} s")


def test_session_loop_time_leaves_out_a_pause_and_resumed_sessions_add_up(dataset_32, tmp_path):
    pytest.importorskip("viewer.training", reason="the viewer package does not import")
    from rigel_core.data import load_dataset
    from rigel_core.run_dir import CHECKPOINT_NAME, METRICS_NAME
    from rigel_core.train import TrainConfig, Trainer
    from viewer import messages as M
    from viewer.model_slot import ModelSlot
    from viewer.training import TrainingSession

    ds = load_dataset(dataset_32, white_bg=True)
    cfg = dict(init_points=150, sh_degree=1, eval_every=0, densify_from=3, densify_interval=3, densify_until=12)
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        trainer = Trainer(ds, TrainConfig(iterations=10, **cfg), device="cpu")
        t0 = time.perf_counter()
        s = TrainingSession(trainer, ModelSlot(), tmp_path, running=False, eval_at_start=False).start()
        s.send(M.Step(4))
        assert _wait(s, "TrainingPaused").iteration == 4
        pause = 1.0
        time.sleep(pause)                                  # paused: not loop time
        s.send(M.Resume())
        _wait(s, "TrainingFinished")
        assert s.stop()
        wall = time.perf_counter() - t0
        t1 = json.loads((tmp_path / METRICS_NAME).read_text())["timings"]
        assert t1["loop_s"] >= t1["train_s"] > 0
        assert t1["loop_s"] <= wall - pause
        assert t1["ms_per_iter"] == pytest.approx(1e3 * t1["train_s"] / 10)
        # a second session on the resumed run: the timings are the run's, summed
        resumed = Trainer.from_checkpoint(tmp_path / CHECKPOINT_NAME, ds, device="cpu",
                                          config=TrainConfig(iterations=16, **cfg))
        s2 = TrainingSession(resumed, ModelSlot(), tmp_path, eval_at_start=False).start()
        _wait(s2, "TrainingFinished")
        assert s2.stop()
    finally:
        torch.set_num_threads(n)
    m2 = json.loads((tmp_path / METRICS_NAME).read_text())
    t2 = m2["timings"]
    assert m2["iterations_done"] == 16 and m2["resumed_at"] == [10]
    assert t2["train_s"] > t1["train_s"] and t2["loop_s"] > t1["loop_s"] and t2["loop_s"] >= t2["train_s"]
    assert t2["ms_per_iter"] == pytest.approx(1e3 * t2["train_s"] / 16)
