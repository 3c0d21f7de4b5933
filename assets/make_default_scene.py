"""Write ``rigel_core/assets/default_scene.ply``, the small procedural scene bundled with rigel.

    python assets/make_default_scene.py [--check]

The scene is :func:`rigel_core.data.make_scene` (sphere shell coloured by its normals, a three-turn helix,
a checkered plane) with the parameters below; the output is deterministic, so re-running this script
reproduces the committed file bit for bit (``--check`` verifies that instead of writing).
"""
import argparse
import filecmp
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from rigel_core.data import make_scene  # noqa: E402
from rigel_core.io import save_ply  # noqa: E402

#: 5000 Gaussians at SH degree 2: 41 float32 properties each → 820 kB, under the 1 MB budget for the package.
N_GAUSSIANS, SH_DEGREE, SEED = 5000, 2, 0
OUT = ROOT / "rigel_core" / "assets" / "default_scene.ply"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--check", action="store_true", help="compare with the committed file instead of writing it")
    args = ap.parse_args(argv)
    model = make_scene(N_GAUSSIANS, sh_degree=SH_DEGREE, seed=SEED)
    if args.check:
        with tempfile.TemporaryDirectory() as d:
            tmp = Path(d) / "scene.ply"
            save_ply(model, tmp)
            same = OUT.is_file() and filecmp.cmp(tmp, OUT, shallow=False)
        print(f"{OUT}: {'up to date' if same else 'DIFFERS from make_scene output'}")
        return 0 if same else 1
    OUT.parent.mkdir(parents=True, exist_ok=True)
    save_ply(model, OUT)
    print(f"wrote {OUT} ({N_GAUSSIANS} Gaussians, SH degree {SH_DEGREE}, {OUT.stat().st_size / 1e3:.0f} kB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
