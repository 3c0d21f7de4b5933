"""``python -m rigel_core.data.make_dataset``: render the procedural scene into a Blender-layout dataset.

Example: ``python -m rigel_core.data.make_dataset --out DIR --res 64 --train 20 --test 6 --gaussians 4000``.
"""
from __future__ import annotations

import argparse
import sys
import time
import types

from .procedural import make_dataset


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m rigel_core.data.make_dataset",
                                 description="Render the procedural scene (sphere shell, helix, checkered plane) "
                                             "into transforms_{train,test}.json + RGBA PNGs with exact ground truth.")
    ap.add_argument("--out", required=True, help="output directory")
    ap.add_argument("--res", type=int, default=128, help="image width in pixels (default 128)")
    ap.add_argument("--height", type=int, default=None, help="image height (default: 3/4 of --res)")
    ap.add_argument("--train", type=int, default=40, help="number of training views (default 40)")
    ap.add_argument("--test", type=int, default=8, help="number of test views, an orbit (default 8)")
    ap.add_argument("--gaussians", type=int, default=20_000, help="Gaussians in the scene (default 20000)")
    ap.add_argument("--sh-degree", type=int, default=3, help="SH degree of the scene, 0..3 (default 3)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--device", default=None, help="cpu or cuda (default: cuda when the kernels are available)")
    args = ap.parse_args(argv)
    width = args.res
    height = args.height if args.height is not None else max(1, round(args.res * 3 / 4))
    if width <= 0 or height <= 0 or args.train < 0 or args.test < 0 or args.gaussians < 3:
        ap.error("--res/--height must be positive, --train/--test non-negative, --gaussians >= 3")
    t0 = time.perf_counter()
    make_dataset(args.out, args.gaussians, width, height, n_train=args.train, n_test=args.test, seed=args.seed,
                 sh_degree=args.sh_degree, device=args.device)
    print(f"wrote {args.train}+{args.test} views of {width}x{height} ({args.gaussians} Gaussians) to {args.out} "
          f"in {time.perf_counter() - t0:.1f} s")
    return 0


class _CallableModule(types.ModuleType):
    """Importing this module sets ``rigel_core.data.make_dataset`` to the module, hiding the function of the
    same name; making the module callable keeps ``rigel_core.data.make_dataset(...)`` working either way."""

    def __call__(self, *args, **kwargs):
        return make_dataset(*args, **kwargs)


sys.modules[__name__].__class__ = _CallableModule

if __name__ == "__main__":
    sys.exit(main())
