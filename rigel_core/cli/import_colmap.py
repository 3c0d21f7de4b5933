"""``rigel-import-colmap``: convert a COLMAP dataset to a nerfstudio ``transforms.json`` (+ ``sparse_pc.ply``).

    rigel-import-colmap SRC DST [--copy-images | --link-images] [--images-dir images] [--force]

SRC holds ``sparse/0`` (or ``sparse``) and the images (``SRC/images`` unless ``--images-dir``). DST gets
``transforms.json`` and ``sparse_pc.ply``; the result loads with ``rigel-train --data DST`` without pycolmap.
By default each ``file_path`` points at the original image (relative to DST) and nothing is copied;
``--copy-images`` copies the images into ``DST/images`` (a self-contained folder, e.g. to move to another
machine), ``--link-images`` puts symbolic links there. Poses stay in COLMAP's world frame
(``applied_transform`` is the identity). Nothing in DST is replaced unless ``--force``: an existing
``DST/transforms.json``, or an image or points file the conversion would write, stops it with one line.
See :mod:`rigel_core.data.convert` for the keys written. Exit status 0 on success, 2 for bad arguments or input.
"""
from __future__ import annotations

import argparse
import sys
import warnings
from pathlib import Path

from .common import Parser, path_arg

__all__ = ["main"]


def build_parser() -> argparse.ArgumentParser:
    p = Parser(prog="rigel-import-colmap",
                                description="Convert a COLMAP dataset to a nerfstudio transforms.json "
                                            "with the SfM points in sparse_pc.ply.")
    p.add_argument("src", metavar="SRC", type=path_arg,
                   help="COLMAP dataset directory (sparse/0 or sparse, and images/)")
    p.add_argument("dst", metavar="DST", type=path_arg,
                   help="output directory for transforms.json and sparse_pc.ply")
    g = p.add_mutually_exclusive_group()
    g.add_argument("--copy-images", dest="images", action="store_const", const="copy", default="reference",
                   help="copy the images into DST/images (default: reference them in place)")
    g.add_argument("--link-images", dest="images", action="store_const", const="link",
                   help="symlink the images into DST/images")
    p.add_argument("--images-dir", default="images",
                   help="folder of SRC holding the images (default: images)")
    p.add_argument("--force", action="store_true",
                   help="replace an existing DST/transforms.json and the images / points file the conversion writes")
    return p


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    from ..data.convert import colmap_to_transforms
    from ..data.frames import DatasetError
    from ..run_dir import out_problem

    problem = out_problem(Path(args.dst), "DST")   # before SRC is read: a DST that is a file costs nothing
    if problem:
        print(f"rigel-import-colmap: {problem}", file=sys.stderr)
        return 2

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            res = colmap_to_transforms(args.src, args.dst, images=args.images, images_dir=args.images_dir,
                                       force=args.force)
        except (DatasetError, FileExistsError, ImportError, OSError) as e:
            print(f"rigel-import-colmap: {e}", file=sys.stderr)
            return 2
    for w in caught:
        print(f"rigel-import-colmap: warning: {w.message}", file=sys.stderr)
    how = {"reference": "referenced in place", "copy": "copied", "link": "linked"}[args.images]
    print(f"{res.path}: {res.n_frames} frames ({', '.join(res.camera_models)}; images {how}), "
          f"{res.n_points} SfM points")
    return 0


if __name__ == "__main__":
    sys.exit(main())
