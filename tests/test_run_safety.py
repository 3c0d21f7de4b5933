"""Runs are never lost (issue 15): the viewer follows rigel-train's run-folder rule, a lock keeps two processes out
of one run folder, exports never replace a file, and every CLI says a wrong ``--out`` in one line before it loads
any data. No GPU, no window: the data paths named here do not exist, so a command that looked at them first
would say so instead."""
import fcntl
import os
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch


def _one_line(err: str) -> str:
    lines = [ln for ln in err.strip().splitlines() if ln.strip()]
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


# ---- the viewer over a finished run ------------------------------------------------------------------------------
def test_viewer_refuses_an_out_holding_a_run_and_says_where_it_trains_instead(tmp_path, monkeypatch, capsys):
    from viewer.cli import main

    monkeypatch.chdir(tmp_path)
    finished = Path("runs/orbit")
    finished.mkdir(parents=True)
    (finished / "checkpoint.safetensors").write_bytes(b"a finished rigel-train run")
    (finished / "log.txt").write_text("its log\n")
    # an explicit --out holding a run: one line, status 2 (a refused argument), before the dataset is read
    assert main(["--data", "datasets/orbit", "--out", str(finished), "--offscreen"]) == 2
    line = _one_line(capsys.readouterr().err)
    assert "already holds a run" in line and "--resume" in line and "datasets/orbit" not in line
    # the default folder: a fresh one, said on stderr (then the missing dataset is reported)
    status = main(["--data", "datasets/orbit"])
    err = capsys.readouterr().err
    assert status == 2 and f"{finished} holds a run; training into runs/orbit-2" in err
    assert (finished / "checkpoint.safetensors").read_bytes() == b"a finished rigel-train run"
    assert (finished / "log.txt").read_text() == "its log\n"


# ---- two processes, one run folder -------------------------------------------------------------------------------
@pytest.mark.parametrize("cli", ["rigel-viewer", "rigel-train"])
def test_a_locked_run_folder_is_refused(tmp_path, capsys, cli):
    """Another process holds RUN/.lock (flock; here this test, through its own open file): the command says so
    in one line and exits 2, before reading the dataset, and writes nothing."""
    run = tmp_path / "run"
    run.mkdir()
    fd = os.open(run / ".lock", os.O_RDONLY | os.O_CREAT, 0o644)
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    try:
        argv = ["--data", str(tmp_path / "no-such-dataset"), "--out", str(run)]
        if cli == "rigel-viewer":
            from viewer.cli import main
        else:
            from rigel_core.cli.train import main

            argv.append("--quiet")
        assert main(argv) == 2
    finally:
        os.close(fd)
    line = _one_line(capsys.readouterr().err)
    assert "is using this run directory" in line and ".lock" in line
    assert sorted(p.name for p in run.iterdir()) == [".lock"]


@pytest.mark.parametrize("how", ["rigel-train", "rigel-train, Ctrl-C", "rigel-viewer --data"])
def test_a_run_leaves_no_lock_file(tmp_path, capsys, monkeypatch, how):
    """The run's process removes RUN/.lock when it ends, finished or stopped by Ctrl-C (a 0-byte .lock stayed in
    every run folder); the run itself is whole and resumes."""
    import signal

    from rigel_core.cli.train import main as train_main
    from rigel_core.data import make_dataset
    from rigel_core.train import Trainer

    data = tmp_path / "data"
    make_dataset(data, 50, 8, 8, n_train=3, n_test=1, device="cpu", progress=False)
    run = tmp_path / "run"
    common = ["--data", str(data), "--out", str(run), "--device", "cpu", "--init-points", "20", "--threads", "1"]
    if how == "rigel-viewer --data":
        from viewer.cli import main

        assert main(common + ["--iters", "2", "--offscreen", "--frames", "1"]) == 0
    else:
        if how.endswith("Ctrl-C"):
            real_step = Trainer.step

            def step(self):
                if self.iteration == 1:
                    os.kill(os.getpid(), signal.SIGINT)   # arrives during this step, which then completes
                return real_step(self)

            monkeypatch.setattr(Trainer, "step", step)
        status = train_main(common + ["--iters", "4", "--quiet", "--eval-every", "0"])
        assert status == (130 if how.endswith("Ctrl-C") else 0)
    assert (run / "checkpoint.safetensors").is_file() and not (run / ".lock").exists()
    monkeypatch.undo()
    capsys.readouterr()
    assert train_main(common + ["--iters", "5", "--quiet", "--resume", "--eval-every", "0"]) == 0
    assert not (run / ".lock").exists()


def test_removing_the_lock_file_never_lets_two_processes_hold_it(tmp_path, monkeypatch):
    """RunLock's removal is safe: the file goes only while its holder still holds it, and only when the path still
    names the file it locked; a process that opened the file just before its holder removed it, and got the flock
    just after, takes the lock on the new file (else it would hold a removed file while a third process locks the
    new one). Each RunLock opens its own file description: for flock, another process."""
    from rigel_core.run_dir import LOCK_NAME, RunLock

    run = tmp_path / "run"
    run.mkdir()
    path = run / LOCK_NAME
    a = RunLock(run)
    assert a.acquire() and path.is_file()
    assert not RunLock(run).acquire() and not RunLock(run).try_existing()   # held: refused
    b = RunLock(run)
    real_open = os.open

    def open_then_a_finishes(*args, **kw):   # B has opened A's file; A ends (removes it) before B's flock
        fd = real_open(*args, **kw)
        if a.fd is not None:
            a.release()
        return fd

    monkeypatch.setattr(os, "open", open_then_a_finishes)
    assert b.acquire()
    monkeypatch.undo()
    assert a.fd is None and os.fstat(b.fd).st_ino == os.stat(path).st_ino   # B holds the file the path names
    assert not RunLock(run).acquire() and not RunLock(run).try_existing()   # so a third process is refused
    # the file replaced under its holder (removed by hand, then another process made and locked a new one): the
    # first holder's release leaves the new one alone
    path.unlink()
    c = RunLock(run)
    assert c.acquire()
    b.release()
    assert path.is_file() and not RunLock(run).acquire()
    c.release()
    assert not path.exists()
    # a process that only looked (refused before it claimed the folder) leaves a stale lock file as it found it;
    # the next run that claims the folder removes it at its end
    path.touch()
    d = RunLock(run)
    assert d.try_existing()
    d.release()
    assert path.is_file()
    e = RunLock(run)
    assert e.try_existing() and e.acquire()
    e.release()
    assert not path.exists()


# ---- a folder holding a run's model.ply but no checkpoint -------------------------------------------------------
@pytest.mark.parametrize("cli", ["rigel-train", "rigel-viewer"])
@pytest.mark.parametrize("resume", [False, True], ids=["new", "resume"])
@pytest.mark.parametrize("kept_file", ["model.ply", "metrics.json"])
def test_a_model_ply_without_a_checkpoint_is_never_trained_over(tmp_path, capsys, cli, resume, kept_file):
    """A run whose checkpoint was deleted (to save space) keeps its model.ply or its metrics.json: training into
    that folder, with or without --resume (nothing to continue), would replace it (--resume replaced a lone
    metrics.json with a new run's). One line naming the folder and the file, exit 2, before the dataset is read,
    nothing written."""
    run = tmp_path / "run"
    run.mkdir()
    kept = os.urandom(64)
    (run / kept_file).write_bytes(kept)
    argv = ["--data", str(tmp_path / "no-such-dataset"), "--out", str(run)] + (["--resume"] if resume else [])
    if cli == "rigel-viewer":
        from viewer.cli import main

        argv.append("--offscreen")
    else:
        from rigel_core.cli.train import main

        argv.append("--quiet")
    assert main(argv) == 2
    line = _one_line(capsys.readouterr().err)
    assert str(run) in line and kept_file in line and "no-such-dataset" not in line, line
    # the advice is one the other form takes: without --resume the line said "pass --resume", which refuses (a run
    # stopped by a second Ctrl-C before its first checkpoint sent its user in a circle)
    assert resume or "--resume" not in line, line
    assert sorted(p.name for p in run.iterdir()) == [kept_file]
    assert (run / kept_file).read_bytes() == kept


# ---- a dataset's own transforms.json / exposure.json, the dataset's folder itself ----------------------------------
def _train_or_view(cli: str, argv: list[str]) -> int:
    if cli == "rigel-viewer":
        from viewer.cli import main

        return main(argv + ["--offscreen"])
    from rigel_core.cli.train import main

    return main(argv + ["--quiet"])


@pytest.mark.parametrize("cli", ["rigel-train", "rigel-viewer"])
@pytest.mark.parametrize("resume", [False, True], ids=["new", "resume"])
@pytest.mark.parametrize("names", [["transforms.json"], ["exposure.json"], ["transforms.json", "exposure.json"]])
def test_a_datasets_own_transforms_json_is_never_replaced(tmp_path, capsys, cli, resume, names):
    """A run writes its refined poses to RUN/transforms.json and its exposures to RUN/exposure.json: an --out holding
    such a file without a run's checkpoint (an instant-ngp capture's own transforms.json, a log.txt beside it or not)
    is refused in one line naming the file, before the dataset is read, nothing written (a --pose-opt run replaced
    a capture's transforms.json with its poses, and the capture could no longer be loaded)."""
    out = tmp_path / "capture"
    out.mkdir()
    kept = {n: os.urandom(48) for n in names}
    for n, b in kept.items():
        (out / n).write_bytes(b)
    if resume:
        (out / "log.txt").write_text("a run killed before its first save\n")
    before = sorted(p.name for p in out.iterdir())
    argv = ["--data", str(tmp_path / "no-such-dataset"), "--out", str(out), "--pose-opt", "--exposure"]
    assert _train_or_view(cli, argv + (["--resume"] if resume else [])) == 2
    line = _one_line(capsys.readouterr().err)
    assert str(out) in line and all(n in line for n in names) and "no-such-dataset" not in line, line
    assert sorted(p.name for p in out.iterdir()) == before
    assert all((out / n).read_bytes() == b for n, b in kept.items())


def test_a_runs_own_transforms_json_resumes_a_captures_never_does(tmp_path):
    """A run's transforms.json / exposure.json sit beside its checkpoint in the run's format (each frame's
    original_transform_matrix; exposures as {model, images}): resumed. A capture's own transforms.json is foreign
    even beside a checkpoint (a run trained into a capture's folder before the rule), and so are a capture's markers
    (a COLMAP model, Blender's split files) — a run's refined transforms.json beside sparse/ made the folder read as
    an instant-ngp capture of no images."""
    import json

    from rigel_core.run_dir import RunFolderTaken, choose_run_dir, foreign_outputs

    run = tmp_path / "run"
    run.mkdir()
    ours = {"camera_model": "OPENCV", "frames": [{"file_path": "a", "transform_matrix": [[1.0]],
                                                  "original_transform_matrix": [[1.0]]}]}
    (run / "transforms.json").write_text(json.dumps(ours))
    (run / "exposure.json").write_text(json.dumps({"model": "pred' = A·pred + b", "images": {}}))
    assert foreign_outputs(run) == ["transforms.json", "exposure.json"]  # no checkpoint: not a run's
    (run / "checkpoint.safetensors").write_bytes(b"x")
    assert foreign_outputs(run) == [] and choose_run_dir(run, run, resume=True) == run
    (run / "transforms.json").write_text('{"frames": [')   # damaged: taken as the run's own (it is rewritten)
    assert foreign_outputs(run) == []
    capture = {"frames": [{"file_path": "images/0001.jpg", "transform_matrix": [[1.0]]}]}
    (run / "transforms.json").write_text(json.dumps(capture))
    assert foreign_outputs(run) == ["transforms.json"]
    with pytest.raises(RunFolderTaken, match="holds transforms.json, not a run's"):
        choose_run_dir(run, run, resume=True)
    (run / "transforms.json").write_text(json.dumps(ours))
    for marker in ("sparse", "transforms_train.json"):
        (run / marker).mkdir() if marker == "sparse" else (run / marker).write_text("{}")
        assert foreign_outputs(run) == [marker]
        with pytest.raises(RunFolderTaken, match=f"holds {marker}, not a run's"):
            choose_run_dir(run, run, resume=True)
        (run / marker).rmdir() if marker == "sparse" else (run / marker).unlink()


@pytest.mark.parametrize("cli", ["rigel-train", "rigel-viewer"])
def test_another_colmap_capture_is_not_an_out(tmp_path, capsys, cli):
    """A COLMAP capture's folder given as --out (of a run on another capture) is refused in one line, nothing
    written: a --pose-opt run's transforms.json beside its sparse/ model made it read as another format."""
    cap = tmp_path / "fern"
    (cap / "sparse" / "0").mkdir(parents=True)
    (cap / "sparse" / "0" / "cameras.txt").write_text("# a COLMAP model\n")
    assert _train_or_view(cli, ["--data", str(tmp_path / "fox"), "--out", str(cap), "--pose-opt"]) == 2
    line = _one_line(capsys.readouterr().err)
    assert str(cap) in line and "sparse" in line and "fox" not in line.replace(str(tmp_path), ""), line
    assert sorted(p.name for p in cap.iterdir()) == ["sparse"]


@pytest.mark.parametrize("cli", ["rigel-train", "rigel-viewer"])
@pytest.mark.parametrize("as_file", [False, True], ids=["folder", "transforms-file"])
def test_the_datasets_folder_is_not_an_out(tmp_path, capsys, cli, as_file):
    """--out naming the --data folder (or the folder of a --data transforms.json) is one line, nothing written."""
    data = tmp_path / "colmap_capture"
    (data / "images").mkdir(parents=True)
    (data / "cameras.txt").write_text("# not read\n")
    argv = ["--data", str(data / "cameras.txt" if as_file else data), "--out", str(data / "images" / "..")]
    assert _train_or_view(cli, argv) == 2
    line = _one_line(capsys.readouterr().err)
    assert "is the dataset's folder" in line, line
    assert sorted(p.name for p in data.iterdir()) == ["cameras.txt", "images"]


@pytest.mark.parametrize("cli", ["rigel-train", "rigel-viewer --data"])
def test_a_run_finished_while_this_one_loaded_is_not_trained_over(cli, tmp_path, capsys, monkeypatch):
    """Both commands check --out RUN before loading the data; another process that finishes a run there meanwhile
    (its lock gone) must not be trained over: the folder is checked again once the lock is held (RunLock.claim).
    (A --resume reads the checkpoint again after the data loads, so it continues from the other process's save.)"""
    import rigel_core.cli.common as common
    import rigel_core.cli.train as train_cli
    from rigel_core.data import make_dataset

    data = tmp_path / "data"
    make_dataset(data, 50, 8, 8, n_train=2, n_test=1, device="cpu", progress=False)
    run = tmp_path / "run"
    theirs = os.urandom(32)
    module = train_cli if cli == "rigel-train" else common   # where each command looks the loader up
    real_load = module.load_training_data

    def load_while_another_run_finishes(args):
        ds = real_load(args)
        run.mkdir(exist_ok=True)
        (run / "checkpoint.safetensors").write_bytes(theirs)   # the other process's run, saved meanwhile
        (run / "model.ply").write_bytes(theirs)
        return ds

    monkeypatch.setattr(module, "load_training_data", load_while_another_run_finishes)
    args = ["--data", str(data), "--out", str(run), "--device", "cpu", "--init-points", "20", "--iters", "2"]
    if cli == "rigel-train":
        assert train_cli.main(args + ["--quiet", "--eval-every", "0", "--n-renders", "0"]) == 2
    else:
        from viewer.cli import main

        assert main(args + ["--offscreen", "--frames", "1"]) == 2
    line = _one_line(capsys.readouterr().err)
    assert str(run) in line and "holds a run" in line and "Traceback" not in line, line
    assert (run / "checkpoint.safetensors").read_bytes() == theirs and (run / "model.ply").read_bytes() == theirs


@pytest.mark.parametrize("cli", ["rigel-train", "rigel-viewer --data"])
def test_resuming_with_fewer_iterations_than_done_is_refused(cli, tmp_path, capsys):
    """--resume --iters N below the checkpoint's iteration: one line, exit 2, the checkpoint untouched. It wrote a
    checkpoint at iteration I > N that every later --resume refused ("beyond the run's own N iterations")."""
    from rigel_core.cli.train import main as train_main
    from rigel_core.data import make_dataset

    data = tmp_path / "data"
    make_dataset(data, 50, 8, 8, n_train=2, n_test=1, device="cpu", progress=False)
    run = tmp_path / "run"
    common = ["--data", str(data), "--out", str(run), "--device", "cpu"]
    quiet = ["--quiet", "--eval-every", "0", "--n-renders", "0"]
    assert train_main(common + quiet + ["--init-points", "20", "--iters", "4"]) == 0
    capsys.readouterr()
    before = {p.name: p.read_bytes() for p in run.iterdir() if p.is_file()}
    if cli == "rigel-train":
        assert train_main(common + quiet + ["--iters", "2", "--resume"]) == 2
    else:
        from viewer.cli import main

        assert main(common + ["--iters", "2", "--resume", "--offscreen", "--frames", "1"]) == 2
    line = _one_line(capsys.readouterr().err)
    assert "--iters 2" in line and "iteration 4" in line and "checkpoint.safetensors" in line, line
    assert {p.name: p.read_bytes() for p in run.iterdir() if p.is_file()} == before
    assert train_main(common + quiet + ["--iters", "5", "--resume"]) == 0   # more iterations still continue it


@pytest.mark.parametrize("cli", ["rigel-train", "rigel-viewer --data"])
def test_the_datasets_warnings_reach_the_runs_log(cli, tmp_path, capsys):
    """A warning of the dataset (a frame without its image file) comes before the run folder exists: it is shown
    on the console as one line and also written to the run's log.txt (it was on stderr alone); so is --resume's
    note that there was nothing to resume."""
    from rigel_core.cli.train import main as train_main
    from rigel_core.data import make_dataset

    data = tmp_path / "data"
    make_dataset(data, 50, 8, 8, n_train=3, n_test=1, device="cpu", progress=False)
    (data / "train" / "r_1.png").unlink()
    run = tmp_path / "run"
    common = ["--data", str(data), "--out", str(run), "--device", "cpu", "--init-points", "20", "--iters", "2",
              "--resume"]
    if cli == "rigel-train":
        assert train_main(common + ["--quiet", "--eval-every", "0", "--n-renders", "0"]) == 0
    else:
        from viewer.cli import main

        assert main(common + ["--offscreen", "--frames", "1"]) == 0
    err = capsys.readouterr().err
    warned = [ln for ln in err.splitlines() if "have no image file" in ln]
    assert len(warned) == 1 and "'./train/r_1'" in warned[0], err
    log = (run / "log.txt").read_text()
    assert "warning: " in log and "1 of 3 frames have no image file and were skipped (first: './train/r_1')" in log, log
    assert "--resume: no checkpoint.safetensors" in log and log.count("have no image file") == 1, log


def test_a_resume_drops_the_curve_points_past_its_checkpoint(tmp_path):
    """A session that ended without saving (a second Ctrl-C, kill -9) left loss-curve and evaluation points past
    the checkpoint's iteration in metrics.json; the resumed run redoes those steps, so those points go and the
    curve stays monotonic (it read 40, 58, …, 118, 58, 68, …)."""
    import json

    from rigel_core.cli.train import main as train_main
    from rigel_core.data import make_dataset

    data = tmp_path / "data"
    make_dataset(data, 50, 8, 8, n_train=2, n_test=1, device="cpu", progress=False)
    run = tmp_path / "run"
    common = ["--data", str(data), "--out", str(run), "--device", "cpu", "--quiet", "--n-renders", "0",
              "--eval-every", "2"]
    assert train_main(common + ["--init-points", "20", "--iters", "4"]) == 0
    m = json.loads((run / "metrics.json").read_text())
    assert m["train"] and m["eval"]
    lost = {"iteration": 9, "loss": 0.5, "psnr": 10.0, "num_gaussians": 20, "ms_per_iter": 1.0}
    m["train"].append(lost)
    m["eval"].append({**m["eval"][-1], "iteration": 8})
    (run / "metrics.json").write_text(json.dumps(m))
    assert train_main(common + ["--iters", "10", "--resume"]) == 0
    m = json.loads((run / "metrics.json").read_text())
    for key in ("train", "eval"):
        its = [e["iteration"] for e in m[key]]
        assert its == sorted(set(its)) and its[-1] == 10, (key, its)
    assert lost not in m["train"] and m["resumed_at"] == [4]


@pytest.mark.parametrize("flag", [["--sh-degree", "1"], ["--appearance", "mlp"]])
def test_a_resume_refuses_a_model_setting_it_would_ignore(tmp_path, capsys, flag):
    """--resume kept the checkpoint's SH degree and appearance and dropped --sh-degree / --appearance without a
    word: a different explicit value is one line naming it, exit 2, nothing written; the run's own value (or
    leaving it out) resumes."""
    from rigel_core.cli.train import main as train_main
    from rigel_core.data import make_dataset

    data = tmp_path / "data"
    make_dataset(data, 50, 8, 8, n_train=2, n_test=1, device="cpu", progress=False)
    run = tmp_path / "run"
    common = ["--data", str(data), "--out", str(run), "--device", "cpu", "--quiet", "--eval-every", "0",
              "--n-renders", "0"]
    assert train_main(common + ["--init-points", "20", "--iters", "2", "--sh-degree", "2"]) == 0
    capsys.readouterr()
    before = {p.name: p.read_bytes() for p in run.iterdir() if p.is_file()}
    assert train_main(common + ["--iters", "3", "--resume"] + flag) == 2
    line = _one_line(capsys.readouterr().err)
    assert flag[0] in line and "checkpoint.safetensors" in line and "new --out" in line, line
    assert {p.name: p.read_bytes() for p in run.iterdir() if p.is_file()} == before
    same = ["--sh-degree", "2"] if flag[0] == "--sh-degree" else ["--appearance", "sh"]
    assert train_main(common + ["--iters", "3", "--resume"] + same) == 0


@pytest.mark.parametrize("flag, value", [("--test-every", "-3"), ("--test-every", "x"), ("--test-every", "1.5"),
                                         ("--test-every", "1"), ("--eval-every", "-1"),
                                         ("--checkpoint-every", "-1"), ("--n-renders", "-2")])
def test_counts_must_be_whole_numbers_of_at_least_zero(tmp_path, capsys, flag, value):
    """--test-every -3 held nothing out without a word (split_every treats N ≤ 0 as none), and --test-every 1 held
    out every view ("the dataset has no training frames"); negative --eval-every / --checkpoint-every /
    --n-renders were taken silently: refused as argparse does, before anything loads."""
    from rigel_core.cli.train import main as train_main

    with pytest.raises(SystemExit) as e:
        train_main(["--data", str(tmp_path), "--out", str(tmp_path / "run"), flag, value])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert flag in err and ("whole number ≥ 0" in err or "every view" in err) and not (tmp_path / "run").exists(), err


# ---- a wrong --out: one line, before any data loads --------------------------------------------------------------
@pytest.mark.parametrize("cli", ["rigel-train", "rigel-render", "rigel-viewer --data", "rigel-viewer SCENE"])
@pytest.mark.parametrize("kind", ["file", "under-a-file"])
def test_a_wrong_out_is_one_line_before_loading_data(tmp_path, capsys, cli, kind):
    afile = tmp_path / "afile"
    afile.write_text("not a folder")
    out = afile if kind == "file" else afile / "sub"
    missing = str(tmp_path / "missing")
    if cli == "rigel-train":
        from rigel_core.cli.train import main

        argv = ["--data", missing, "--out", str(out), "--quiet"]
    elif cli == "rigel-render":
        from rigel_core.cli.render import main

        argv = [missing + ".ply", "--cameras", missing + ".json", "--out", str(out)]
    else:
        from viewer.cli import main

        argv = (["--data", missing] if cli.endswith("--data") else [missing + ".ply"]) + ["--offscreen", "--out",
                                                                                            str(out)]
    assert main(argv) == 2
    line = _one_line(capsys.readouterr().err)
    assert "--out" in line and str(out) in line and "missing" not in line.replace(str(out), ""), line
    assert afile.read_text() == "not a folder"


@pytest.mark.parametrize("cli", ["rigel-train --out", "rigel-train --data", "rigel-render", "rigel-import-colmap",
                                 "rigel-viewer"])
def test_an_empty_path_is_refused_not_taken_for_the_current_directory(tmp_path, capsys, cli, monkeypatch):
    """``--out ""`` (an unset shell variable) meant the current directory: a run, renders or a dataset were written
    there. Now argparse's one line, exit 2, and nothing is written."""
    monkeypatch.chdir(tmp_path)
    missing = str(tmp_path / "missing")
    if cli.startswith("rigel-train"):
        from rigel_core.cli.train import main

        argv = ["--data", "" if cli.endswith("--data") else missing, "--out", "" if cli.endswith("--out") else
                str(tmp_path / "run"), "--quiet"]
    elif cli == "rigel-render":
        from rigel_core.cli.render import main

        argv = ["default", "--cameras", missing + ".json", "--out", ""]
    elif cli == "rigel-import-colmap":
        from rigel_core.cli.import_colmap import main

        argv = [missing, ""]
    else:
        from viewer.cli import main

        argv = ["default", "--offscreen", "--out", ""]
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2
    assert "an empty path" in _one_line(capsys.readouterr().err.splitlines()[-1] + "\n")
    assert not any(tmp_path.iterdir())


# ---- exports never replace a file --------------------------------------------------------------------------------
def _stand_in_viewer(tmp_path):
    from rigel_core.data import make_scene
    from viewer.camera_control import OrbitCamera
    from viewer.ui import ViewSettings

    model = make_scene(n=60, sh_degree=0, seed=int(torch.randint(0, 2**31 - 1, (1,))))
    cam = OrbitCamera()
    cam.frame_box(*(t.numpy() for t in model.bounds(0.01)), aspect=1.0)
    settings = ViewSettings()
    settings.video_size, settings.video_frames = (16, 16), 2
    return SimpleNamespace(jobs={}, settings=settings, camera=cam, model=model, _model=model,
                           screenshot_dir=tmp_path, training=None)


def test_an_orbit_video_never_replaces_a_file(tmp_path, monkeypatch):
    """Without imageio-ffmpeg the video is a GIF: the name written (not the .mp4 asked for) must be a new one
    (before, an existing orbit.gif was silently replaced)."""
    from viewer.app import Viewer

    monkeypatch.setitem(sys.modules, "imageio_ffmpeg", None)      # import fails: GIF
    old = tmp_path / "orbit.gif"
    old.write_bytes(b"an earlier video")
    v = _stand_in_viewer(tmp_path)
    job = Viewer.start_video(v, tmp_path / "orbit.mp4")
    assert job.join(60) and not job.error, job.traceback
    assert old.read_bytes() == b"an earlier video"
    assert Path(job.result) == tmp_path / "orbit_2.gif" and Path(job.result).stat().st_size > 0


def test_a_saved_scene_never_replaces_a_file(tmp_path):
    from viewer.app import Viewer

    v = _stand_in_viewer(tmp_path)
    for name in ("model.ply", "model_2.ply"):
        (tmp_path / name).write_bytes(b"kept")
    job = Viewer.start_save_ply(v, tmp_path / "model.ply")
    assert job.join(60) and not job.error, job.traceback
    assert Path(job.result) == tmp_path / "model_3.ply"
    assert [(tmp_path / n).read_bytes() for n in ("model.ply", "model_2.ply")] == [b"kept", b"kept"]
    job = Viewer.start_save_ply(v, None, "compressed_ply")   # the Export panel's default name, its double suffix
    assert job.join(60) and not job.error, job.traceback
    assert Path(job.result).name == "model.compressed.ply"


def test_unused_path_reserves_the_name(tmp_path):
    from rigel_core.run_dir import unused_path

    p = tmp_path / "model.compressed.ply"
    assert unused_path(p) == p and not p.exists()
    assert unused_path(p, reserve=True) == p and p.is_file()             # taken at once: a second writer …
    assert unused_path(p, reserve=True) == tmp_path / "model_2.compressed.ply"   # … gets the next name


@pytest.mark.parametrize("module, argv", [("rigel_core.cli.train", ["--data", "d", "--out", "o", "--downscale", "0"]),
                                          ("rigel_core.cli.render", ["--no-such-flag"]),
                                          ("rigel_core.cli.convert", []),
                                          ("rigel_core.cli.import_colmap", ["only-one"]),
                                          ("viewer.cli", ["--size", "abc"])])
def test_a_bad_flag_is_one_line(module, argv):
    """argparse's own refusals (a bad value, a missing argument, an unknown flag) are one line and status 2, as every
    other refusal of the commands (they printed the whole usage block first)."""
    import subprocess

    r = subprocess.run([sys.executable, "-m", module, *argv], capture_output=True, text=True, timeout=120,
                       cwd=Path(__file__).resolve().parents[1])
    assert r.returncode == 2 and r.stdout == "", (r.returncode, r.stdout)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and ": error: " in lines[0] and "--help" in lines[0], r.stderr


def test_the_log_tells_a_non_finite_step_from_a_graph_capacity_overflow(tmp_path):
    """A skipped step is "non-finite" only when the NaN guard's count grew; a finite step skipped because its view
    outgrew the CUDA graph's binning capacity (redone with a larger one) is said as that — also on a resumed run
    whose count starts above 0."""
    import logging

    from rigel_core.run_dir import RunRecord

    lines = []

    class Keep(logging.Handler):
        def emit(self, record):
            lines.append(record.getMessage())
    log = logging.getLogger(f"test.skips.{id(lines)}")
    log.propagate, log.handlers[:] = False, [Keep()]
    log.setLevel(logging.INFO)
    rec = RunRecord(tmp_path, log, {"train": []})

    def step(it, skipped, count):
        return SimpleNamespace(iteration=it, skipped=skipped, nan_skips=count, loss=0.1, psnr=20.0,
                               num_gaussians=5, seconds=0.01, eval=None)
    rec.steps([step(10, False, 3), step(11, True, 3), step(12, True, 4), step(13, False, 4)])
    rec.steps([step(14, True, 4), step(15, True, 5)])
    assert [line.split("]")[0] for line in lines] == ["[11", "[12", "[14", "[15"]
    assert "tile capacity" in lines[0] and "non-finite" in lines[1] and "(4 so far)" in lines[1]
    assert "tile capacity" in lines[2] and "non-finite" in lines[3]
    first = RunRecord(tmp_path, log, {"train": []})  # the first step seen is skipped: the count says which
    lines.clear()
    first.steps([step(1, True, 7)])
    assert "non-finite" in lines[0]
