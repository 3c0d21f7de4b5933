"""bench/decode_threads.py (issue 37: images decoded a second by loading threads) on the CPU: a table with a row per
decoder and a column per thread count, and bad input said in one line naming it (status 2), not a traceback."""
import numpy as np
import pytest
import torch
from PIL import Image

from bench.decode_threads import main


def write_images(folder, rng, n=4):
    """``n`` random RGB PNGs and one JPEG of 24 × 16 in ``folder``; returns their paths in name order."""
    g = np.random.default_rng(int(torch.randint(0, 2 ** 31 - 1, (1,), generator=rng)))
    folder.mkdir(parents=True)
    for i in range(n):
        Image.fromarray(g.integers(0, 256, (16, 24, 3), dtype=np.uint8)).save(folder / f"v{i}.png")
    Image.fromarray(g.integers(0, 256, (16, 24, 3), dtype=np.uint8)).save(folder / f"v{n}.jpg")
    return sorted(folder.iterdir())


def test_the_table_has_a_rate_per_decoder_and_thread_count(tmp_path, rng, capsys, monkeypatch):
    write_images(tmp_path / "cap" / "train", rng)
    monkeypatch.setenv("OUT", str(tmp_path))
    assert main(["--images", str(tmp_path / "cap"), "--threads", "1,2"]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"5 images of {tmp_path / 'cap' / 'train'}")
    rows = [line for line in out.splitlines() if line.startswith("| ") and "decoder" not in line]
    assert rows and rows[0].startswith("| read_image raw8 |")
    for row in rows:   # two positive rates each
        rates = [float(c) for c in row.strip("|").split("|")[1:]]
        assert len(rates) == 2 and all(r > 0 for r in rates), row
    assert "| 1 thread | 2 threads |" in out
    assert (tmp_path / "decode_threads.md").read_text() == out


@pytest.mark.parametrize("bad", ["truncated", "not an image", "missing folder", "a file", "empty", "threads 0",
                                 "threads x"])
def test_bad_input_is_one_line_naming_it(tmp_path, rng, capsys, bad):
    """A corrupt image (OpenCV reads it without a word, Pillow raises) stopped the bench with a 40-line traceback;
    so did a folder that is not one, or a thread count of 0."""
    paths = write_images(tmp_path / "imgs", rng)
    folder, threads, named = tmp_path / "imgs", "1,2", None
    if bad == "truncated":
        named = paths[2]
        named.write_bytes(named.read_bytes()[:60])
    elif bad == "not an image":
        named = paths[1]
        named.write_bytes(b"not a PNG at all")
    elif bad == "missing folder":
        folder = named = tmp_path / "nowhere"
    elif bad == "a file":
        folder = named = paths[0]
    elif bad == "empty":
        folder = named = tmp_path / "none"
        folder.mkdir()
    else:
        threads = bad.split()[1]
    with pytest.raises(SystemExit) as e:
        raise SystemExit(main(["--images", str(folder), "--threads", threads]))
    assert e.value.code == 2
    err = capsys.readouterr().err.strip()
    if named is not None:
        assert len(err.splitlines()) == 1 and str(named) in err, err
    else:   # argparse's refusal: the usage, then one line naming the flag
        assert "error: argument --threads" in err.splitlines()[-1], err
