"""Images decoded per second by loading threads (issue 37: the first epoch of a streamed capture is decode-bound).

Decodes every image of ``--images`` (a folder, or a capture's ``train`` folder) with 1..``--threads`` threads, two
ways: rigel's :func:`rigel_core.data.images.read_image` (``raw8``: the 8-bit codes a streamed capture caches) and
OpenCV's ``cv2.imread`` (``IMREAD_UNCHANGED``), and prints a table of images/s. Where the rate stops growing with
the threads, the decode holds the GIL (or the cores are spent). ``python bench/decode_threads.py --images DIR
[--threads 1,4,8,15]``; writes ``$OUT/decode_threads.md`` when OUT is set. A file either decoder cannot read, or
a folder that is not one, stops it with one line naming it (status 2).
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def rate(paths: list[Path], threads: int, decode) -> float:
    """Images per second decoding ``paths`` with ``threads`` threads (after one warm-up image)."""
    decode(paths[0])
    with ThreadPoolExecutor(threads) as pool:
        t0 = time.perf_counter()
        for _ in pool.map(decode, paths):
            pass
        return len(paths) / (time.perf_counter() - t0)


def thread_counts(text: str) -> list[int]:
    """``--threads``: comma-separated counts ≥ 1 (argparse's error otherwise)."""
    try:
        counts = [int(t) for t in text.split(",")]
    except ValueError:
        counts = []
    if not counts or min(counts) < 1:
        raise argparse.ArgumentTypeError(f"expected counts >= 1 separated by commas, got {text!r}")
    return counts


def opencv_read(path: Path):
    """``cv2.imread`` (``IMREAD_UNCHANGED``); ValueError naming a file it cannot read (it returns None for one, and
    would be timed reading nothing)."""
    import cv2

    image = cv2.imread(str(path), cv2.IMREAD_UNCHANGED)
    if image is None:
        raise ValueError(f"{path}: OpenCV cannot read it")
    return image


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--images", type=Path, required=True)
    p.add_argument("--threads", type=thread_counts, default="1,4,8,15")
    args = p.parse_args(argv)
    from rigel_core.data.images import read_image

    folder = args.images / "train" if (args.images / "train").is_dir() else args.images
    if not folder.is_dir():
        print(f"decode_threads: {folder}: not a folder", file=sys.stderr)
        return 2
    paths = sorted(q for q in folder.iterdir() if q.suffix.lower() in (".png", ".jpg", ".jpeg"))
    if not paths:
        print(f"decode_threads: {folder}: no images", file=sys.stderr)
        return 2
    ways = {"read_image raw8": lambda q: read_image(q, raw8=True)}
    try:
        import cv2  # noqa: F401
        ways["cv2.imread"] = opencv_read
    except ImportError:
        pass
    counts = args.threads
    lines = [f"{len(paths)} images of {folder} ({os.cpu_count()} CPUs); images/s", "",
             "| decoder | " + " | ".join(f"{t} thread{'s' if t > 1 else ''}" for t in counts) + " |",
             "|---|" + "---:|" * len(counts)]
    try:
        for name, decode in ways.items():
            lines.append(f"| {name} | " + " | ".join(f"{rate(paths, t, decode):.0f}" for t in counts) + " |")
    except ValueError as e:   # a file that cannot be decoded (read_image and opencv_read name it)
        print(f"decode_threads: {e}", file=sys.stderr)
        return 2
    text = "\n".join(lines)
    print(text)
    if os.environ.get("OUT"):
        Path(os.environ["OUT"], "decode_threads.md").write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
