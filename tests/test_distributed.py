"""Data-parallel training (rigel_core/train/distributed.py, --gpus / --batch-size): 2 CPU processes over gloo.

Each multi-process test spawns 2 ranks (torch.multiprocessing, a free port) that build the same tiny procedural
scene (rendered by the CPU reference renderer), train a few steps and write their state; the parent compares.
The reference for "equal within float tolerance" is one process with ``batch_size = 2`` (the same global batch),
so the comparison checks the view split, the all-reduce, the gradient averaging and the statistics' reduction —
not the renderer.
"""
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from rigel_core.train import TrainConfig, Trainer
from rigel_core.train.step import view_forward_backward
from rigel_core.train.distributed import Comm, RanksDiverged, batch_scaling, checksum_tensors, free_port, \
    replicated_tensors

sys.path.insert(0, str(Path(__file__).parent))
from test_trainer import make_dataset, small_config  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")

ROOT = Path(__file__).resolve().parents[1]


def _config(**kw):
    # densification at 6, 9, 12 (low threshold: it clones and splits), an opacity reset at 10, the SH ramp
    base = dict(init_points=80, densify_from=5, densify_interval=3, densify_until=14, opacity_reset_interval=10,
                sh_degree_interval=4, grad_threshold=1e-5, random_background=False)
    base.update(kw)
    return small_config(**base)


def _dataset(seed):
    return make_dataset(torch.Generator().manual_seed(seed), n_gauss=60, size=24, n_train=7, n_test=0)


def _state(tr):
    """Everything that must agree: parameters, Adam moments and steps, densification sums, counters."""
    out = {k: v.detach().clone() for k, v in replicated_tensors(tr).items()}
    for g in tr.optimizer.param_groups:
        st = tr.optimizer.state.get(g["params"][0], {})
        if "step" in st:
            out[f"{g['name']}.step"] = st["step"].detach().clone()
    out["stats.grad_accum"], out["stats.denom"] = tr.stats.grad_accum.clone(), tr.stats.denom.clone()
    out["iteration"] = torch.tensor(tr.iteration)
    out["views"] = torch.tensor(tr._view_stack, dtype=torch.int64)
    return out


def _worker(rank, world, port, seed, cfg_dict, steps, out_dir, mode):
    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world))
    from rigel_core.train.distributed import init_from_env

    comm = init_from_env("cpu")
    try:
        tr = Trainer(_dataset(seed), TrainConfig(**cfg_dict), device="cpu")
        tr.comm = comm
        comm.broadcast_model(tr)
        comm.check_every = 5
        for _ in range(steps):
            tr.step()
        comm.sync_stats(tr.stats)
        torch.save(_state(tr), Path(out_dir, f"rank{rank}.pt"))
        if mode == "poison":
            if rank == 1:
                with torch.no_grad():
                    tr.model.means3D[0, 0] += 1e-6
            try:
                comm.check_identical(tr)
                msg = "no error"
            except RanksDiverged as e:
                msg = str(e)
            Path(out_dir, f"msg{rank}.txt").write_text(msg)
    finally:
        comm.close()
    # the group's threads end with close(), not at interpreter exit, where tearing them down aborted a rank now and
    # then (SIGABRT after a finished run: a group kept alive by torch._dynamo imported after it; distributed.py).
    # gloo's event-loop thread is told to stop in destroy_process_group and may still be finishing when it returns
    # (seen once in 9 runs: gloo_tcp_loop listed right after close()): allowed 5 s, far below interpreter exit.
    deadline = time.monotonic() + 5.0
    while _group_threads() and time.monotonic() < deadline:
        time.sleep(0.01)
    Path(out_dir, f"threads{rank}.txt").write_text(" ".join(_group_threads()))


def _spawn(seed, cfg, steps, out_dir, mode="train", world=2):
    import torch.multiprocessing as mp

    mp.start_processes(_worker, args=(world, free_port(), seed, cfg.to_dict(), steps, str(out_dir), mode),
                       nprocs=world, join=True, start_method="spawn")


def _group_threads() -> list:
    """Names of this process's threads that belong to a gloo process group (Linux: /proc; [] elsewhere)."""
    names = []
    for f in Path("/proc/self/task").glob("*/comm"):
        try:
            names.append(f.read_text().strip())
        except OSError:  # the thread ended meanwhile
            pass
    return sorted(n for n in names if "gloo" in n or "tcpstore" in n)


def _assert_equal(a, b, what):
    assert a.keys() == b.keys(), what
    for k in a:
        assert torch.equal(a[k], b[k]), f"{what}: {k} differs"


def test_batch_scaling_rule():
    assert batch_scaling("sqrt", 1) == (1.0, (0.9, 0.999)) == batch_scaling("none", 4)
    f, (b1, b2) = batch_scaling("sqrt", 4)
    assert f == 2.0 and b1 == pytest.approx(0.9 ** 4) and b2 == pytest.approx(0.999 ** 4)
    with pytest.raises(ValueError, match="rule"):
        batch_scaling("linear", 2)
    with pytest.raises(ValueError, match="batch"):
        batch_scaling("sqrt", 0)
    for bad in ({"batch_size": 0}, {"batch_lr_scaling": "linear"}):
        with pytest.raises(ValueError, match=next(iter(bad))):
            TrainConfig(**bad).validate()


def test_batch_of_views_is_the_mean_gradient(rng):
    """One step at batch_size 2 (scaling "none") moves the parameters as Adam on the mean of the two views'
    gradients, computed here by two separate single-view backward passes."""
    ds = _dataset(int(torch.randint(0, 10_000, (1,), generator=rng)))
    cfg = _config(batch_size=2, batch_lr_scaling="none", densify_from=100)
    tr = Trainer(ds, cfg, device="cpu")
    ref = Trainer(ds, _config(densify_from=100), device="cpu")  # same seed: same init, same permutation
    a, b = ref._next_view(), ref._next_view()
    grads = []
    for idx in (a, b):
        view_forward_backward(ref, ref._step_view(idx), ref._step_context(1))
        grads.append({g["name"]: g["params"][0].grad.clone() for g in ref.optimizer.param_groups
                      if g["params"][0].grad is not None})
        ref.optimizer.zero_grad(set_to_none=True)
    mean = {k: 0.5 * (grads[0][k] + grads[1][k]) for k in grads[0]}
    seen = {}
    real_step = tr.optimizer.step

    def capture():
        seen.update({g["name"]: g["params"][0].grad.clone() for g in tr.optimizer.param_groups
                     if g["params"][0].grad is not None})
        return real_step()

    tr.optimizer.step = capture
    tr.step()
    assert seen.keys() == mean.keys()
    for k in mean:
        torch.testing.assert_close(seen[k], mean[k], rtol=1e-5, atol=1e-9)
    # the densification statistics count each view once, with its own (unscaled) 2D gradient
    assert float(tr.stats.denom.max()) <= 2.0 and float(tr.stats.denom.sum()) > 0


def test_two_ranks_stay_identical_and_match_one_process_batch_two(tmp_path, rng):
    """... and then a checksum after poisoning one parameter of rank 1 names rank 1 and the tensor, on both ranks
    (one spawn for both checks: starting processes is the slow part)."""
    seed = int(torch.randint(0, 10_000, (1,), generator=rng))
    cfg = _config()
    steps = 16  # crosses 3 densifications, an opacity reset, the SH ramp, two epochs of 7 views, 3 checksums
    _spawn(seed, cfg, steps, tmp_path, mode="poison")
    for r in (0, 1):
        msg = (tmp_path / f"msg{r}.txt").read_text()
        assert f"ranks diverged at iteration {steps}" in msg and "rank 1's means3D differs" in msg, msg
    r0, r1 = torch.load(tmp_path / "rank0.pt"), torch.load(tmp_path / "rank1.pt")
    _assert_equal(r0, r1, "rank 0 vs rank 1")  # bit-identical replicas
    for r in (0, 1):
        assert (tmp_path / f"threads{r}.txt").read_text() == "", f"rank {r}: process-group threads outlive close()"

    single = Trainer(_dataset(seed), TrainConfig(**{**cfg.to_dict(), "batch_size": 2}), device="cpu")
    reports = [single.step().densify for _ in range(steps)]
    assert sum(r is not None and r.n_clone + r.n_split > 0 for r in reports) >= 1  # densification happened
    s = _state(single)
    assert s.keys() == r0.keys()
    for k in s:
        if s[k].is_floating_point():
            torch.testing.assert_close(r0[k], s[k], rtol=1e-5, atol=1e-7, msg=lambda m: f"{k}: {m}")
        else:
            assert torch.equal(r0[k], s[k]), k


def test_checksum_sees_one_bit(rng):
    t = {"a": torch.randn(1000, 3, generator=rng), "b": torch.randn(7, generator=rng)}
    base = checksum_tensors(t)
    i = int(torch.randint(0, 3000, (1,), generator=rng))
    flipped = {"a": t["a"].clone(), "b": t["b"]}
    flipped["a"].view(-1).view(torch.int32)[i] ^= 1  # the lowest mantissa bit of one element
    other = checksum_tensors(flipped)
    assert torch.equal(base[1], other[1]) and not torch.equal(base[0], other[0])


# ---- the command line: --gpus 2 on the CPU, resume with N = 1, Ctrl-C ---------------------------------------------
@pytest.fixture
def blender(tmp_path_factory, rng):
    from rigel_core.data import make_dataset as make_procedural

    d = tmp_path_factory.mktemp("blender")
    make_procedural(d, 200, 24, 24, n_train=6, n_test=2, seed=int(torch.randint(0, 1000, (1,), generator=rng)),
                    device="cpu", progress=False)
    return d


def _cli(args, **kw):
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    env.pop("WORLD_SIZE", None)
    return subprocess.Popen([sys.executable, "-m", "rigel_core.cli.train", *args], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kw)


def test_cli_gpus_without_a_gpu_is_one_line(blender, tmp_path, monkeypatch, capsys):
    """--gpus N names GPUs: on a machine without CUDA (or its kernels) it is refused with one line that points at
    --device cpu, rather than silently training N CPU processes (fresh-user finding); --gpus 0 is refused too.
    Nothing is written."""
    import rigel_core
    from rigel_core.cli.train import main

    monkeypatch.setattr(rigel_core, "cuda_available", lambda: False)
    common = ["--data", str(blender), "--quiet", "--init-points", "50", "--iters", "2"]
    assert main(common + ["--out", str(tmp_path / "a"), "--gpus", "2"]) == 2
    err = capsys.readouterr().err
    assert "--gpus asked, but no CUDA device" in err and "--device cpu --gpus N" in err and len(err.splitlines()) == 1
    assert main(common + ["--out", str(tmp_path / "a"), "--gpus", "0"]) == 2
    err = capsys.readouterr().err
    assert "--gpus must be ≥ 1" in err and len(err.splitlines()) == 1
    assert not (tmp_path / "a").exists()


def test_cli_gpus_2_on_cpu_then_resume_with_one_process(blender, tmp_path):
    from rigel_core.checkpoint import read_checkpoint
    from rigel_core.cli.train import main

    common = ["--data", str(blender), "--device", "cpu", "--quiet", "--init-points", "100", "--eval-every", "0",
              "--set", "densify_from=4", "--set", "densify_interval=4", "--set", "grad_threshold=1e-5",
              "--position-lr-max-steps", "12",  # the same lr schedule in the 8- and 12-iteration runs
              "--set", "coarse_to_fine_iters=4"]  # and the same coarse-to-fine one ("auto": 4 here, no SfM points)
    run = tmp_path / "run"
    p = _cli(common + ["--out", str(run), "--gpus", "2", "--iters", "8", "--dist-check-every", "4"])
    out, err = p.communicate(timeout=240)
    assert p.returncode == 0, err
    metrics = json.loads((run / "metrics.json").read_text())
    assert metrics["distributed"]["world_size"] == 2 and metrics["distributed"]["global_batch"] == 2
    assert metrics["distributed"]["allreduce_calls"] == 8 and metrics["iterations_done"] == 8
    assert metrics["config"]["coarse_to_fine"] == 4
    assert "2 process(es) x 1 view(s) = 2 views per step (gloo)" in (run / "log.txt").read_text()
    assert sorted(p.name for p in run.iterdir()) == ["checkpoint.safetensors", "log.txt", "metrics.json",
                                                      "model.ply", "renders"]  # rank 0 alone wrote (no .lock left)

    # resume with N = 1 and --batch-size 2 (the same global batch) == a one-process --batch-size 2 run from start
    assert main(common + ["--out", str(run), "--resume", "--iters", "12", "--batch-size", "2"]) == 0
    ref = tmp_path / "ref"
    assert main(common + ["--out", str(ref), "--iters", "12", "--batch-size", "2"]) == 0
    a, meta_a = read_checkpoint(run / "checkpoint.safetensors")
    b, meta_b = read_checkpoint(ref / "checkpoint.safetensors")
    assert meta_a["iteration"] == meta_b["iteration"] == 12 and a.keys() == b.keys()
    for k in a:
        if a[k].is_floating_point() and k != "rng.cpu":
            torch.testing.assert_close(a[k], b[k], rtol=1e-5, atol=1e-7, msg=lambda m: f"{k}: {m}")
        else:
            assert torch.equal(a[k], b[k]), k


def _wait_for_training(run, timeout=180):
    """Until rank 0 has logged the line it writes just before its training loop."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        log = run / "log.txt"
        if log.is_file() and "views per step" in log.read_text():
            return
        time.sleep(0.2)
    raise AssertionError("the ranks did not start training")


def test_cli_ctrl_c_stops_every_rank_and_saves(blender, tmp_path):
    from rigel_core.checkpoint import read_checkpoint

    run = tmp_path / "run"
    p = _cli(["--data", str(blender), "--device", "cpu", "--quiet", "--init-points", "100", "--eval-every", "0",
              "--out", str(run), "--gpus", "2", "--iters", "100000", "--log-every", "1", "--checkpoint-every", "0"])
    _wait_for_training(run)
    time.sleep(1.0)
    p.send_signal(signal.SIGINT)
    out, err = p.communicate(timeout=120)
    assert p.returncode == 130, err
    meta = read_checkpoint(run / "checkpoint.safetensors")[1]
    assert meta["iteration"] > 0 and "interrupted" in (run / "log.txt").read_text()
    assert json.loads((run / "metrics.json").read_text())["iterations_done"] == meta["iteration"]


def test_cli_dead_rank_stops_the_others(blender, tmp_path):
    run = tmp_path / "run"
    p = _cli(["--data", str(blender), "--device", "cpu", "--quiet", "--init-points", "100", "--eval-every", "0",
              "--out", str(run), "--gpus", "2", "--iters", "100000", "--checkpoint-every", "0"])
    # the rank processes are the launcher's children whose command line is multiprocessing's spawn
    _wait_for_training(run)
    ranks = []
    kids = Path(f"/proc/{p.pid}/task/{p.pid}/children").read_text().split()
    for k in kids:
        cmd = Path(f"/proc/{k}/cmdline").read_bytes().replace(b"\0", b" ")
        if b"spawn_main" in cmd:
            ranks.append(int(k))
    assert len(ranks) == 2
    time.sleep(1.0)
    os.kill(max(ranks), signal.SIGKILL)  # the second-started child: rank 1
    out, err = p.communicate(timeout=120)
    assert p.returncode != 0
    assert "killed by signal 9" in err and "another rank died or stopped answering" in err, err
