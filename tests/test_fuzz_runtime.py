"""Hostile and broken inputs at run time (issue 13): damaged checkpoints through ``rigel-train --resume``, the run
directory's guarantees (nothing written before training starts, a checked ``--out``, the run lock, stale
temporaries of killed writes), and renders of scenes with non-finite rows on the CPU backend.

The checkpoint fuzzer is seeded and deterministic (``FUZZ_SEED``): it starts from a real checkpoint of a
20-iteration CPU run on a tiny procedural dataset and applies one mutation per case (dropped keys, wrong shapes
and dtypes, NaN/Inf, huge or negative iterations, bad view indices, foreign tensors, truncation, bit flips).
Every mutation that damages the file must give ``CheckpointError`` naming the file; through the command line,
exit status 2 with one line on stderr naming the file, no traceback, and the run directory untouched.
"""
from __future__ import annotations

import fcntl
import json
import os
import random
import resource
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from rigel_core.atomic import atomic_path, remove_stale_temp_files, temp_name_pattern
from rigel_core.checkpoint import CheckpointError, read_checkpoint, validate_checkpoint

ROOT = Path(__file__).resolve().parents[1]
FUZZ_SEED = 1313
N_TRAIN = 6


# ---- a real run to mutate ---------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def real_run(tmp_path_factory):
    """(dataset dir, run dir) of a 20-iteration CPU rigel-train run on a tiny procedural Blender dataset."""
    from rigel_core.cli.train import main
    from rigel_core.data import make_dataset

    base = tmp_path_factory.mktemp("fuzz")
    data = base / "data"
    make_dataset(data, 300, 24, 24, n_train=N_TRAIN, n_test=1, seed=7, device="cpu", progress=False)
    run = base / "run"
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        assert main(["--data", str(data), "--out", str(run), "--device", "cpu", "--quiet", "--init-points", "80",
                     "--iters", "20", "--eval-every", "0", "--n-renders", "0", "--seed", "1"]) == 0
    finally:
        torch.set_num_threads(n)
    return data, run


def _snapshot(d: Path) -> dict:
    """Every entry under ``d`` with its size and mtime (what "nothing written" compares)."""
    if not d.exists():
        return {}
    return {str(p.relative_to(d)): (p.stat().st_size, p.stat().st_mtime_ns) for p in sorted(d.rglob("*"))}


def _save(tensors: dict, meta: dict, path: Path) -> None:
    from safetensors.torch import save_file

    save_file({k: v.contiguous() for k, v in tensors.items()}, str(path), metadata={"rigel": json.dumps(meta)})


# ---- the mutations ----------------------------------------------------------------------------------------------
def _float_keys(tensors):
    return sorted(k for k, v in tensors.items() if v.is_floating_point() and v.numel() > 0)


def mutate(rng: random.Random, tensors: dict, meta: dict, raw: bytes):
    """One seeded mutation: (kind, tensors, meta, raw bytes or None). ``raw`` set means "write these bytes"."""
    t = {k: v.clone() for k, v in tensors.items()}
    m = json.loads(json.dumps(meta))
    kind = rng.choice(["drop_key", "drop_meta", "shape", "dtype", "nonfinite", "iteration", "views", "adam_shape",
                       "rng_size", "rng_state", "config", "unknown_tensor", "format", "nan_skips", "adam_step",
                       "negative", "truncate", "header_flip", "foreign", "eval_history", "extent"])
    if kind == "drop_key":
        del t[rng.choice(sorted(t))]
    elif kind == "drop_meta":
        del m[rng.choice(["iteration", "config", "extent", "nan_skips", "active_sh_degree"])]
    elif kind == "shape":
        k = rng.choice(sorted(t))
        v = t[k]
        t[k] = v[: max(0, v.shape[0] - 1 - rng.randrange(3))] if v.dim() >= 1 and v.shape[0] > 0 \
            else v.reshape(1, *v.shape).repeat(2, *([1] * v.dim()))
    elif kind == "dtype":
        k = rng.choice(sorted(t))
        v = t[k]
        t[k] = v.to(torch.int32) if v.is_floating_point() else v.to(torch.float32)
    elif kind == "nonfinite":
        k = rng.choice(_float_keys(t))
        flat = t[k].reshape(-1)
        flat[rng.randrange(flat.numel())] = rng.choice([float("nan"), float("inf"), float("-inf")])
    elif kind == "iteration":
        m["iteration"] = rng.choice([10**18, -1, 2**63, "20", 2.5, None, True, 21])
    elif kind == "views":
        v = t["views.stack"]
        choice = rng.randrange(4)
        if choice == 0:
            v[rng.randrange(v.numel())] = N_TRAIN + rng.randrange(10**6)
        elif choice == 1:
            v[rng.randrange(v.numel())] = -1 - rng.randrange(5)
        elif choice == 2:
            v[-1] = v[0] if v.numel() > 1 else N_TRAIN
        else:
            t["views.stack"] = torch.arange(N_TRAIN + 1, dtype=torch.int64)
    elif kind == "adam_shape":
        k = rng.choice(sorted(k for k in t if k.endswith(".exp_avg") or k.endswith(".exp_avg_sq")))
        t[k] = torch.zeros(t[k].shape[0] + 1 + rng.randrange(4), *t[k].shape[1:])
    elif kind == "rng_size":
        t["rng.cpu"] = t["rng.cpu"][: rng.randrange(t["rng.cpu"].numel())]
    elif kind == "rng_state":  # the right size, not a Mersenne-Twister state torch accepts
        t["rng.cpu"] = torch.tensor([rng.randrange(256) for _ in range(t["rng.cpu"].numel())], dtype=torch.uint8)
    elif kind == "config":
        key, val = rng.choice([("sh_degree", 7), ("iterations", -5), ("bogus_field", 1), ("appearance", "nerf"),
                               ("lambda_dssim", 3.0), ("sh_degree", "three")])
        m["config"][key] = val
    elif kind == "unknown_tensor":
        t["optimizer.pickle"] = torch.zeros(3)
    elif kind == "format":
        m["format"] = rng.choice([0, 2, "1", None])
    elif kind == "nan_skips":
        m["nan_skips"] = rng.choice([-1, 10**9, "0"])
    elif kind == "adam_step":
        k = rng.choice(sorted(k for k in t if k.endswith(".step")))
        t[k] = torch.tensor(rng.choice([1e12, -3.0, 2.5]))
    elif kind == "negative":
        k = rng.choice([k for k in t if k.endswith("exp_avg_sq") or k.startswith("stats.")])
        t[k].reshape(-1)[0] = -1.0
    elif kind == "truncate":
        return kind, None, None, raw[: rng.randrange(len(raw))]
    elif kind == "header_flip":
        hlen = int.from_bytes(raw[:8], "little")
        b = bytearray(raw)
        for _ in range(1 + rng.randrange(4)):
            i = 8 + rng.randrange(hlen)
            b[i] = rng.choice(b'{}[]":,!\x00\xff')  # structural damage to the JSON header
        return kind, None, None, bytes(b)
    elif kind == "foreign":
        return kind, None, None, rng.choice([b"ply\nformat ascii 1.0\nend_header\n", b"\x80\x04K\x01.",
                                             os.urandom(256), b""])
    elif kind == "eval_history":
        m["eval_history"] = rng.choice([{"a": 1}, [{"iteration": 1}], [1, 2], "x"])
    elif kind == "extent":
        m["extent"] = rng.choice([float("nan"), -1.0, 0.0, "big", None])
    return kind, t, m, None


def _write_mutation(kind, t, m, raw, path: Path):
    if raw is not None:
        path.write_bytes(raw)
    else:
        _save(t, m, path)


def _damaged(kind, t, m, raw, base_tensors, base_meta) -> bool:
    """Whether the mutation certainly damages the checkpoint (a header flip can still parse, a truncation can
    land exactly at the end)."""
    return kind not in ("header_flip",)


# ---- in-process: many seeded mutations against the validator ------------------------------------------------
def test_fuzz_checkpoint_validation(real_run, tmp_path):
    _, run = real_run
    src = run / "checkpoint.safetensors"
    raw = src.read_bytes()
    tensors, meta = read_checkpoint(src)
    validate_checkpoint(src, tensors, meta, n_train_views=N_TRAIN)  # the original is valid
    rng = random.Random(FUZZ_SEED)
    kinds = set()
    for case in range(160):
        kind, t, m, data = mutate(rng, tensors, meta, raw)
        path = tmp_path / f"case{case:03d}_{kind}.safetensors"
        _write_mutation(kind, t, m, data, path)
        try:
            tt, mm = read_checkpoint(path)
            validate_checkpoint(path, tt, mm, n_train_views=N_TRAIN)
        except CheckpointError as e:
            msg = str(e)
            assert msg.startswith(str(path) + ": ") and "\n" not in msg, msg
            kinds.add(kind)
            continue
        assert kind == "header_flip", f"case {case} ({kind}) was accepted"
    assert len(kinds) >= 19, kinds  # the generator reached (nearly) every kind


# ---- through the command line -------------------------------------------------------------------------------
def _limit_memory():
    resource.setrlimit(resource.RLIMIT_AS, (4 << 30, 4 << 30))


def _train_cli(*args, timeout=60):
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""),
               OMP_NUM_THREADS="1")
    return subprocess.run([sys.executable, "-m", "rigel_core.cli.train", *map(str, args)], capture_output=True,
                          text=True, timeout=timeout, preexec_fn=_limit_memory, env=env, cwd=ROOT)


CLI_KINDS = ["drop_key", "shape", "nonfinite", "iteration", "views", "adam_shape", "truncate", "config"]


def test_fuzz_resume_cli(real_run, tmp_path):
    data, run = real_run
    raw = (run / "checkpoint.safetensors").read_bytes()
    tensors, meta = read_checkpoint(run / "checkpoint.safetensors")
    rng = random.Random(FUZZ_SEED + 1)
    todo = list(CLI_KINDS)
    case = 0
    while todo:
        kind, t, m, data_bytes = mutate(rng, tensors, meta, raw)
        if kind not in todo:
            continue
        todo.remove(kind)
        case += 1
        rd = tmp_path / f"run{case}_{kind}"
        shutil.copytree(run, rd)
        ck = rd / "checkpoint.safetensors"
        _write_mutation(kind, t, m, data_bytes, ck)
        before = _snapshot(rd)
        r = _train_cli("--data", data, "--out", rd, "--resume", "--device", "cpu", "--quiet", "--iters", 25)
        assert r.returncode == 2, (kind, r.returncode, r.stderr[-2000:])
        assert "Traceback" not in r.stderr
        lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
        assert len(lines) == 1 and str(ck) in lines[0], (kind, r.stderr)
        assert _snapshot(rd) == before, kind  # nothing written: no log line, no lock file, no temp file


@pytest.mark.parametrize("metadata,kind", [("[1, 2, 3]", "array"), ('"rigel"', "string"), ("42", "number"),
                                           ("null", "null"), ("true", "boolean")])
def test_checkpoint_metadata_that_is_not_an_object(real_run, tmp_path, capsys, metadata, kind):
    """The held-back hostile corpus: a checkpoint whose rigel metadata is valid JSON but not an object (a list, a
    string, a number, null) gave an AttributeError traceback in rigel-train --resume and in the viewer. Now one
    line naming the file and the problem, exit 2, nothing written: --resume of rigel-train and of rigel-viewer
    --data, and the viewer opening the checkpoint as a scene (before any window)."""
    from safetensors.torch import save_file

    from rigel_core.cli.train import main
    from viewer.cli import main as viewer_main

    data, run = real_run
    rd = tmp_path / "run"
    shutil.copytree(run, rd)
    ck = rd / "checkpoint.safetensors"
    tensors, _ = read_checkpoint(ck)
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(ck), metadata={"rigel": metadata})
    with pytest.raises(CheckpointError, match=f"rigel metadata is a JSON {kind}, expected an object"):
        read_checkpoint(ck)
    before = _snapshot(rd)
    for argv, m in ((["--data", str(data), "--out", str(rd), "--resume", "--device", "cpu", "--quiet"], main),
                    (["--data", str(data), "--out", str(rd), "--resume", "--device", "cpu", "--offscreen"],
                     viewer_main),
                    ([str(ck), "--offscreen", "--out", str(tmp_path / "o"), "--device", "cpu"], viewer_main)):
        assert m(argv) == 2, argv
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and f"{ck}: rigel metadata is a JSON {kind}" in err, err
        assert _snapshot(rd) == before and not (tmp_path / "o").exists()


def test_huge_iteration_no_longer_completes(real_run, tmp_path, capsys):
    from rigel_core.cli.train import main

    data, run = real_run
    rd = tmp_path / "run"
    shutil.copytree(run, rd)
    tensors, meta = read_checkpoint(rd / "checkpoint.safetensors")
    meta["iteration"] = 10**18
    _save(tensors, meta, rd / "checkpoint.safetensors")
    before = _snapshot(rd)
    assert main(["--data", str(data), "--out", str(rd), "--resume", "--device", "cpu", "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "metadata iteration" in err and str(rd / "checkpoint.safetensors") in err
    assert _snapshot(rd) == before


# ---- the run directory --------------------------------------------------------------------------------------
def test_out_checked_before_the_dataset_loads(tmp_path, capsys):
    from rigel_core.cli.train import main

    f = tmp_path / "a_file"
    f.write_text("x")
    missing_data = tmp_path / "no_such_dataset"  # would be the error if the dataset were loaded first
    for out in (f, f / "run"):
        assert main(["--data", str(missing_data), "--out", str(out), "--device", "cpu", "--quiet"]) == 2
        err = capsys.readouterr().err.strip()
        assert err.count("\n") == 0 and str(out) in err and "no_such_dataset" not in err, err
    assert f.read_text() == "x"


def test_nothing_written_when_the_run_cannot_start(tmp_path, capsys):
    from rigel_core.cli.train import main

    out = tmp_path / "new" / "run"
    assert main(["--data", str(tmp_path / "missing"), "--out", str(out), "--device", "cpu", "--quiet"]) == 2
    assert not (tmp_path / "new").exists()
    empty = tmp_path / "empty"
    empty.mkdir()
    assert main(["--data", str(tmp_path / "missing"), "--out", str(empty), "--device", "cpu", "--quiet"]) == 2
    assert list(empty.iterdir()) == []
    capsys.readouterr()


def test_second_run_on_a_locked_out_is_refused(real_run, tmp_path, capsys):
    from rigel_core.cli.train import main

    data, run = real_run
    rd = tmp_path / "run"
    shutil.copytree(run, rd)
    fd = os.open(rd / ".lock", os.O_RDONLY | os.O_CREAT)  # "another rigel-train" holds the lock
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        before = _snapshot(rd)
        assert main(["--data", str(data), "--out", str(rd), "--resume", "--device", "cpu", "--quiet"]) == 2
        err = capsys.readouterr().err.strip()
        assert "another rigel-train" in err and err.count("\n") == 0
        assert _snapshot(rd) == before
    finally:
        os.close(fd)


def test_stale_temporaries_of_a_killed_write_are_removed_at_start(real_run, tmp_path, capsys):
    """kill -9 inside atomic_path leaves its temporary file; the next run removes exactly those (and says so),
    leaves look-alikes alone, and takes/releases the run lock."""
    from rigel_core.cli.train import main

    data, run = real_run
    rd = tmp_path / "run"
    shutil.copytree(run, rd)
    script = ("import os, sys; from rigel_core.atomic import atomic_path\n"
              "with atomic_path(sys.argv[1]) as tmp:\n"
              "    open(tmp, 'wb').close()\n"
              "    os.kill(os.getpid(), 9)\n")
    r = subprocess.run([sys.executable, "-c", script, str(rd / "checkpoint.safetensors")], cwd=ROOT,
                       env=dict(os.environ, PYTHONPATH=str(ROOT)), capture_output=True)
    assert r.returncode == -9
    stale = [p for p in rd.iterdir() if p.name.endswith(".tmp")]
    assert len(stale) == 1 and stale[0].stat().st_size == 0
    keep = [".checkpoint.safetensors.tmp", ".notes.txt.abcdefgh.tmp", "checkpoint.safetensors.abcdefgh.tmp",
            ".model.ply.abcdefghi.tmp", ".metrics.json.ABCDEFGH.tmp"]
    for name in keep:
        (rd / name).write_text("user data")
    (rd / ".model.ply.abc_1234.tmp").mkdir()  # a directory of a matching name: not rigel's
    # --iters beyond the 20 done: a resume of a finished run at its own count writes nothing (not even this clean-up)
    assert main(["--data", str(data), "--out", str(rd), "--resume", "--device", "cpu", "--quiet",
                 "--iters", "22"]) == 0
    capsys.readouterr()
    assert not stale[0].exists()
    assert all((rd / n).is_file() for n in keep) and (rd / ".model.ply.abc_1234.tmp").is_dir()
    assert f"removed 1 stale temporary file(s) of interrupted writes: {stale[0].name}" in (rd / "log.txt").read_text()
    assert not (rd / ".lock").exists()   # released, and removed, at exit


def test_temp_name_pattern_is_atomic_paths_naming(tmp_path):
    names = []
    for _ in range(20):
        with pytest.raises(KeyboardInterrupt):
            with atomic_path(tmp_path / "model.ply") as tmp:
                names.append(Path(tmp).name)
                raise KeyboardInterrupt
    assert not list(tmp_path.iterdir())  # cleaned up on the error path
    pat = temp_name_pattern("model.ply")
    assert all(pat.match(n) for n in names)
    assert not pat.match(".model.ply.tmp") and not pat.match(".model.plyX.abcdefgh.tmp")
    for n in names[:3]:
        (tmp_path / n).write_bytes(b"")
    (tmp_path / "model.ply").write_bytes(b"keep")
    removed = remove_stale_temp_files(tmp_path, ["model.ply"])
    assert sorted(p.name for p in removed) == sorted(names[:3])
    assert [p.name for p in tmp_path.iterdir()] == ["model.ply"]


# ---- renders of scenes with non-finite rows -----------------------------------------------------------------
def test_fuzz_nonfinite_rows_never_black(rng):
    """Seeded scenes with NaN/±Inf in random fields (those the render reads) of random rows: the CPU render
    equals the render without those rows, in particular never black (or NaN) where the finite rows cover the
    image."""
    import rigel_core as rc
    from rigel_core.renderer.appearance import MLPAppearance
    from rigel_core.model import GaussianModel

    from helpers import random_camera

    fields = ["means3D", "log_scales", "quats", "opacity_logits", "sh_dc", "sh_rest", "latents"]
    for case in range(9):
        n = 50 + int(torch.randint(0, 200, (1,), generator=rng))
        model = GaussianModel.from_tensors(torch.rand(n, 3, generator=rng) * 2 - 1,
                                           -3.0 + 1.5 * torch.rand(n, 3, generator=rng),
                                           torch.randn(n, 4, generator=rng), torch.randn(n, generator=rng),
                                           torch.randn(n, 1, 3, generator=rng) * 0.5,
                                           torch.randn(n, 15, 3, generator=rng) * 0.1)
        model.active_sh_degree = int(torch.randint(0, 4, (1,), generator=rng))
        if case % 3 == 2:
            model.appearance = MLPAppearance.create(n, 4, 8, generator=rng)
        bad = torch.rand(n, generator=rng) < 0.05
        bad[0] = True  # Gaussian 0 is what the blend's padding entries read
        keep = model.subset(~bad)
        for i in torch.nonzero(bad).flatten().tolist():
            # the parameters the render reads: an MLP model's SH coefficients are not among them
            usable = fields[:6] if model.appearance is None else fields[:4] + ["latents"]
            field = usable[int(torch.randint(0, len(usable), (1,), generator=rng))]
            t = model.appearance.latents if field == "latents" else getattr(model, field)
            row = t[i].reshape(-1)
            row[int(torch.randint(0, row.numel(), (1,), generator=rng))] = \
                [float("nan"), float("inf"), float("-inf")][int(torch.randint(0, 3, (1,), generator=rng))]
        cam = random_camera(rng, 48, 32, dist=3.0)
        got = rc.render(model, cam).image
        want = rc.render(keep, cam).image
        assert torch.isfinite(got).all(), case
        covered = want.amax(-1) > 1e-3
        assert (got.amax(-1)[covered] > 0).all(), case
        torch.testing.assert_close(got, want, rtol=0, atol=1e-5)


def test_checkpoint_opened_as_a_scene(real_run, tmp_path):
    """load_checkpoint_model (rigel-render / the viewer opening a checkpoint) checks the model part: wrong shapes
    are one CheckpointError naming the file; non-finite values load (the cull rule draws the rest)."""
    from rigel_core.checkpoint import load_checkpoint_model
    from rigel_core.model import GaussianModel

    _, run = real_run
    tensors, meta = read_checkpoint(run / "checkpoint.safetensors")
    bad = dict(tensors, **{"model.quats": tensors["model.quats"][:, :3]})
    _save(bad, meta, tmp_path / "bad.safetensors")
    with pytest.raises(CheckpointError, match=r"bad\.safetensors: model\.quats: shape"):
        load_checkpoint_model(tmp_path / "bad.safetensors")
    nan = {k: v.clone() for k, v in tensors.items()}
    nan["model.sh_dc"][0, 0, 0] = float("nan")
    _save(nan, meta, tmp_path / "nan.safetensors")
    m = load_checkpoint_model(tmp_path / "nan.safetensors")
    assert isinstance(m, GaussianModel) and torch.isnan(m.sh_dc[0, 0, 0])
    assert (m.center() == m.center()).all() and GaussianModel.from_tensors(
        torch.zeros(0, 3), torch.zeros(0, 3), torch.zeros(0, 4), torch.zeros(0), torch.zeros(0, 1, 3)).extent() == 0.0


def test_resume_with_a_damaged_metrics_json(real_run, tmp_path, capsys):
    """metrics.json is a report, not state: a damaged one is started afresh on --resume (no traceback)."""
    from rigel_core.cli.train import main

    data, run = real_run
    for i, junk in enumerate(['{"train": 5}', "[1, 2", '"text"']):
        rd = tmp_path / f"run{i}"
        shutil.copytree(run, rd)
        (rd / "metrics.json").write_text(junk)
        # one iteration more: a finished run resumed at its own count is left as it is (nothing to do)
        assert main(["--data", str(data), "--out", str(rd), "--resume", "--device", "cpu", "--quiet",
                     "--eval-every", "0", "--n-renders", "0", "--iters", "21"]) == 0
        m = json.loads((rd / "metrics.json").read_text())
        assert m["iterations_done"] == 21 and m["resumed_at"] == [20]
        err = [ln for ln in capsys.readouterr().err.splitlines() if "metrics.json" in ln]
        assert len(err) == 1 and "damaged" in err[0] and str(rd / "metrics.json") in err[0]  # said, in one line
        assert f"{rd / 'metrics.json'}: damaged" in (rd / "log.txt").read_text()   # and in the run's log
