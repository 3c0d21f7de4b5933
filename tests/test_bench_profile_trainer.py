"""bench/profile_trainer.py's command line on the CPU (its measurement needs CUDA): every bad argument is one line
naming the flag, exit status 2, before the CUDA check — so that a GPU session is not where a typo is found."""
import pytest
import torch

from bench.profile_trainer import main


def refusal(capsys, argv) -> str:
    """The one line ``main(argv)`` refuses ``argv`` with (status 2, through argparse or its own check)."""
    try:
        rc = main(argv)
    except SystemExit as e:
        rc = e.code
    err = capsys.readouterr().err.strip()
    assert rc == 2 and err and "\n" not in err, (rc, err)
    assert err.startswith("profile_trainer.py: "), err
    return err


def test_bad_arguments_are_one_line_naming_the_flag(tmp_path, capsys):
    data = tmp_path / "cap"
    data.mkdir()
    for argv, words in (
            (["--data", f"{data}~bogus"], ["--data", "unknown variant 'bogus'", "nosfm"]),
            (["--data", "~nosfm"], ["--data '~nosfm'", "no capture before its first '~'"]),
            (["--data", f"{data}~"], ["--data", "unknown variant ''"]),
            (["--data", str(tmp_path / "none") + "~nosfm"], ["--data", "none: no such file or directory"]),
            (["--data", ""], ["--data", "empty path"]),
            (["--data", str(data), "--timeline", "abc"], ["--timeline", "'abc'"]),
            (["--data", str(data), "--timeline", "-1"], ["--timeline", "'-1'"]),
            (["--data", str(data), "--iters", "-3"], ["--iters", "'-3'"]),
            (["--data", str(data), "--warm", "-1"], ["--warm", "'-1'"]),
            (["--data", str(data), "--steps", "-5"], ["--steps", "'-5'"]),
            (["--data", str(data), "--profile", "-2"], ["--profile", "'-2'"]),
            (["--data", str(data), "--downscale", "0"], ["--downscale", "'0'"]),
            (["--data", str(data), "--downscale", "nan"], ["--downscale", "'nan'"]),
            (["--data", str(data), "--modes", "fast"], ["--modes", "'fast'"]),
            (["--data", str(data), "--set", "nosuchfield=1"], ["--set", "nosuchfield"]),
            # --iters is the run's configured length: below the steps the run takes, it was raised without a word
            (["--data", str(data), "--iters", "100", "--warm", "200", "--steps", "0", "--profile", "0"],
             ["--iters 100", "210 steps"]),
    ):
        err = refusal(capsys, argv)
        assert "--scenes" not in err and "CUDA" not in err, (argv, err)
        for w in words:
            assert w in err, (argv, err)


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU's refusal")
def test_good_arguments_reach_the_cuda_check(tmp_path, capsys):
    data = tmp_path / "cap"
    data.mkdir()
    for argv in (["--data", f"{data}~nosfm~halfres", "--timeline", "500", "--iters", "7000", "--warm", "6990",
                  "--steps", "0", "--profile", "0", "--modes", "graph"],
                 ["--data", str(data), "--iters", "0", "--timeline", "0", "--downscale", "2"]):
        assert refusal(capsys, argv) == "profile_trainer.py: needs a CUDA device"
