"""``rigel-render``: render a scene from every camera of a Blender or instant-ngp transforms file, or a COLMAP
dataset, to PNGs.

    rigel-render SCENE --cameras TRANSFORMS_JSON [--split train|test] --out DIR
                 [--width W --height H] [--background R,G,B] [--device cpu|cuda] [--max-image-size N]
                 [--depth [expected|median] [--depth-range NEAR,FAR] [--force]]
    rigel-render SCENE --path PATH_JSON --video OUT.mp4 [--width W --height H] [--fps F] [--frames N] [--force]

SCENE is any file :func:`rigel_core.io.load_scene` reads (graphdeco PLY, compressed PLY, SPZ), or ``default``
for the bundled procedural scene. ``--cameras`` is a transforms ``.json`` file or a dataset directory
(Blender: ``transforms_<split>.json``; else ``transforms.json``; else a COLMAP model, ``sparse/0`` or ``sparse``,
as rigel-train and the viewer read it). The images it names need not exist: the
size comes from the file's ``w``/``h``, else from an image that does exist, else from ``--width/--height``.
A COLMAP dataset gives the pinhole cameras rigel-train trains on (its lens distortion is removed from the images
at load, so that the views rendered here match the undistorted photos), named as rigel-train names them, at the
size its model declares.
``--width``/``--height`` otherwise rescale the intrinsics to a new size (one of them alone keeps the aspect
ratio). ``--split`` with a single instant-ngp file or a COLMAP dataset renders that split of the every-8th
hold-out used by :func:`rigel_core.data.load_dataset`. Output: ``DIR/<frame name>.png`` (8-bit RGB, composited
onto the background; ``--alpha`` writes RGBA with alpha = 1 − final_T instead).
``--depth`` also writes, from the same rasterization pass, the expected depth (``--depth median``: the median
depth) of each view as ``DIR/<frame name>.depth.png`` (16-bit greyscale, 0 = no depth, else scaled linearly to
[near, far]; the scale is in the PNG's text chunks, see :mod:`rigel_core.depth_image`) and
``DIR/<frame name>.depth.npy`` (float32 (H, W), world units, 0 = no depth). [near, far] is ``--depth-range`` when
given (depths outside are clipped), else each view's own min and max depth. Existing files of those names (the
PNGs, and with ``--depth`` the depth files) are never replaced (exit 2 before anything is rendered, as
rigel-convert and rigel-import-colmap) unless ``--force``.
Image sizes (from the cameras file or ``--width/--height``) are capped at
:data:`rigel_core.limits.MAX_IMAGE_SIDE` pixels per side and :data:`~rigel_core.limits.MAX_IMAGE_PIXELS` in all;
``--max-image-size N`` raises the caps to N per side and N² in all (up to
:data:`~rigel_core.limits.MAX_CAMERA_SIDE`).

With ``--path`` (a camera path: rigel's JSON or nerfstudio's ``camera_path.json``, see
:mod:`rigel_core.camera_path`) the path is rendered to one video instead (:mod:`rigel_core.render_video`: MP4
through imageio-ffmpeg, else GIF; written atomically; an existing file is kept unless ``--force``).
Exit status 0 on success, 2 for bad arguments, input files or a refused overwrite, 130 after Ctrl-C.
(Without ``--path``: 1 when a valid scene or image is too large for the machine's memory, one line.)
"""
from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

from ..limits import MAX_CAMERA_SIDE, MAX_IMAGE_SIDE, check_image_size, out_of_memory
from .common import Parser, device_problem, path_arg

__all__ = ["main", "parse_background", "resolve_cameras"]


def parse_background(text: str) -> tuple[float, float, float]:
    """``"R,G,B"`` with components in [0, 1] (or 0..255 when any exceeds 1) → floats in [0, 1]."""
    try:
        vals = [float(v) for v in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"--background expects R,G,B numbers, got {text!r}") from None
    if len(vals) != 3 or any(not v >= 0 or math.isinf(v) for v in vals):   # NaN fails v >= 0
        raise argparse.ArgumentTypeError(f"--background expects three non-negative numbers R,G,B, got {text!r}")
    if any(v > 1 for v in vals):
        if any(v > 255 for v in vals):
            raise argparse.ArgumentTypeError(f"--background components must be in 0..1 or 0..255, got {text!r}")
        vals = [v / 255.0 for v in vals]
    return tuple(vals)


def resolve_cameras(cameras: str, split: str | None, size: tuple[int, int] | None,
                    max_image_size: int = MAX_IMAGE_SIDE):
    """Cameras (list of :class:`rigel_core.Camera`, named after the frames) of a transforms file or directory.

    Raises rigel_core.data.DatasetError naming the file when it cannot be used (including a size above
    ``max_image_size`` per side or its square in all).
    """
    from ..data.dataset import detect_format
    from ..data.frames import DatasetError, held_out_split, with_unique_names
    from ..data.transforms import read_transforms, warn_missing

    p = Path(cameras)
    held_out = False
    if p.is_dir():
        cand = p / f"transforms_{split or 'train'}.json"
        if cand.is_file():
            p = cand
        elif (p / "transforms.json").is_file():
            p, held_out = p / "transforms.json", split is not None
        elif detect_format(p)[0] == "colmap":   # raises naming what it looked for when nothing is there
            return _colmap_cameras(p, split, max_image_size)
        else:
            raise DatasetError(f"{p}: no transforms_{split or 'train'}.json or transforms.json in this directory")
    elif p.name == "transforms.json" or not p.name.startswith("transforms_"):
        held_out = split is not None
    specs = []
    if held_out:
        # rigel-train's loader drops the frames without an image file before it names and splits the others: the
        # same here, or the every-8th hold-out of the rest would shift (a file of cameras alone keeps them all)
        specs, missing, total = read_transforms(p, size=size, max_image_size=max_image_size)
        if specs:   # the loader's warning, once
            warn_missing(p, missing, total)
    if not specs:
        specs, _, total = read_transforms(p, require_images=False, size=size, max_image_size=max_image_size)
    if not specs:
        raise DatasetError(f"{p}: no frames")
    if held_out:  # the views (and names) rigel-train holds out of a transforms.json (its default --test-every 8)
        train, test = held_out_split(specs, 8)
        specs = train if split == "train" else test
    else:
        specs = with_unique_names(specs)   # the names rigel-train's loader gives the same frames
    return [s.camera for s in specs], [s.name for s in specs], p   # distinct: with_unique_names


def _colmap_cameras(root: Path, split: str | None, max_image_size: int):
    """:func:`resolve_cameras` of a COLMAP dataset folder: the undistorted pinhole cameras rigel-train's loader
    trains on (:func:`rigel_core.data.colmap.read_colmap_frames`; undistortion keeps the intrinsics), named as it
    names them, at the size the model declares. ``split``: the every-8th hold-out of the images found in
    ``images/`` (rigel-train's default ``--test-every``), as the loader splits them; without images, of all the
    registered ones; None: every registered image."""
    from ..data.colmap import read_colmap_frames
    from ..data.frames import DatasetError, split_every, with_unique_names
    from ..data.transforms import warn_missing

    sparse, _, specs, missing, total = read_colmap_frames(root, require_images=False)
    if split is not None:
        imaged = [s for s in specs if s.image_path is not None]
        if imaged:   # the loader drops the images it cannot find before it splits (the same views held out)
            warn_missing(root / "images", missing, total)
            specs = imaged
    if not specs:
        raise DatasetError(f"{sparse}: no registered image")
    specs = with_unique_names(specs)
    if split is not None:
        train, test = split_every(specs, 8)
        specs = train if split == "train" else test
    for s in specs:
        problem = check_image_size(s.camera.width, s.camera.height, max_side=max_image_size,
                                   max_pixels=max_image_size * max_image_size)
        if problem:
            raise DatasetError(sparse, f"image {s.name}: {problem} (--max-image-size raises it)")
    return [s.camera for s in specs], [s.name for s in specs], sparse


def _resized(cam, width: int | None, height: int | None, cap: int, cam_file, name: str):
    """``cam`` at ``--width``/``--height`` (one alone keeps the aspect ratio); DatasetError over the caps."""
    from ..data.frames import DatasetError

    w = width or max(1, round(cam.width * height / cam.height))
    h = height or max(1, round(cam.height * width / cam.width))
    problem = check_image_size(w, h, max_side=cap, max_pixels=cap * cap)
    if problem:
        raise DatasetError(cam_file, f"frame {name}: with --width/--height, {problem} (--max-image-size raises it)")
    return cam.with_size(w, h)


def _first_line(e: BaseException) -> str:
    return (str(e).strip().splitlines() or [type(e).__name__])[-1][:300]


def parse_depth_range(text: str) -> tuple[float, float]:
    """``"NEAR,FAR"`` with 0 ≤ NEAR < FAR, finite (world units) → (near, far)."""
    try:
        vals = [float(v) for v in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"--depth-range expects NEAR,FAR numbers, got {text!r}") from None
    if len(vals) != 2 or not all(math.isfinite(v) for v in vals) or not 0 <= vals[0] < vals[1]:
        raise argparse.ArgumentTypeError(f"--depth-range expects two finite numbers 0 <= NEAR < FAR, got {text!r}")
    return vals[0], vals[1]


def _depth_paths(out: Path, name: str) -> tuple[Path, Path]:
    return out / f"{name}.depth.png", out / f"{name}.depth.npy"


def _clear_of_depth_files(names: list[str]) -> list[str]:
    """``names`` (distinct) with each one whose colour render would be another view's depth image under ``--depth``
    (a frame "a.depth" beside a frame "a": both write a.depth.png) numbered, "a.depth_1"."""
    depth_stems = {f"{n}.depth" for n in names}
    taken = set(names) | depth_stems
    out = []
    for n in names:
        if n in depth_stems:
            k = 1
            while f"{n}_{k}" in taken or f"{n}_{k}.depth" in taken:
                k += 1
            n = f"{n}_{k}"
            taken |= {n, f"{n}.depth"}
        out.append(n)
    return out


def _load_scene(scene: str, device):
    if scene == "default":
        from ..data import default_scene_path

        scene = str(default_scene_path())
    if not Path(scene).is_file():
        raise FileNotFoundError(f"{scene}: scene file not found")
    from ..io import load_scene  # lazy: the io package pulls in the format readers

    return load_scene(scene, device=device)


def main(argv=None) -> int:
    """Run ``rigel-render`` with ``argv``; returns the exit status. Warnings print as one line each."""
    from .common import one_line_warnings

    with one_line_warnings("rigel-render"):
        try:
            return _main(argv)
        except KeyboardInterrupt:  # the views already written stay (each PNG is written whole, atomically)
            print("rigel-render: interrupted", file=sys.stderr)
            return 130


def _main(argv=None) -> int:
    ap = Parser(prog="rigel-render", description=__doc__.split("\n\n")[0])
    ap.add_argument("scene",
                    help="scene file (.ply, .compressed.ply, .spz, .splat) or 'default' for the bundled scene")
    ap.add_argument("--cameras", type=path_arg, help="transforms .json file (Blender or instant-ngp) or dataset "
                                                     "directory (Blender, instant-ngp or COLMAP)")
    ap.add_argument("--split", choices=("train", "test"), default=None,
                    help="Blender: which transforms_<split>.json of a directory; instant-ngp, COLMAP: every-8th "
                         "hold-out")
    ap.add_argument("--out", type=path_arg, help="output directory for <frame>.png")
    ap.add_argument("--width", type=int, default=None, help="image width (default: from the cameras file)")
    ap.add_argument("--height", type=int, default=None, help="image height (default: from the cameras file)")
    ap.add_argument("--background", type=parse_background, default=(0.0, 0.0, 0.0), metavar="R,G,B",
                    help="background colour, 0..1 or 0..255 (default 0,0,0)")
    ap.add_argument("--alpha", action="store_true", help="write RGBA with alpha = 1 - final_T")
    ap.add_argument("--sh-degree", type=int, default=None, help="evaluate SH up to this degree (default: all)")
    ap.add_argument("--device", default=None, help="cpu or cuda (default: cuda when the kernels are available)")
    ap.add_argument("--path", type=path_arg,
                    help="camera path .json (rigel or nerfstudio camera_path.json): render a video")
    ap.add_argument("--video", type=path_arg, help="with --path: output video (.mp4; .gif without imageio-ffmpeg)")
    ap.add_argument("--fps", type=float, default=None, help="with --path: frames per second (default: the path's)")
    ap.add_argument("--frames", type=int, default=None, help="with --path: number of frames (default: the path's)")
    ap.add_argument("--force", action="store_true",
                    help="replace existing files: the views' PNGs (and depth files), or with --path the video")
    # depth output (issue 17.2)
    ap.add_argument("--depth", nargs="?", const="expected", default=None, choices=("expected", "median"),
                    help="also write <frame>.depth.png (16-bit) and <frame>.depth.npy (float32): the expected "
                         "depth (default) or the median depth")
    ap.add_argument("--depth-range", type=parse_depth_range, default=None, metavar="NEAR,FAR",
                    help="with --depth: the PNG's depth range in world units (default: each view's min and max)")
    ap.add_argument("--max-image-size", type=int, default=MAX_IMAGE_SIDE, metavar="N",
                    help=f"largest image side accepted, in pixels; the pixel count is capped at N² "
                         f"(default {MAX_IMAGE_SIDE}, at most {MAX_CAMERA_SIDE})")
    args = ap.parse_args(argv)
    cap = args.max_image_size
    if not 1 <= cap <= MAX_CAMERA_SIDE:
        ap.error(f"--max-image-size must be in 1..{MAX_CAMERA_SIDE}, got {cap}")
    if args.depth_range is not None and args.depth is None:
        ap.error("--depth-range needs --depth")
    problem = device_problem(args.device)
    if problem:
        print(f"rigel-render: error: {problem}", file=sys.stderr)
        return 2
    if args.path is not None or args.video is not None:   # a camera-path video (rigel_core/render_video.py)
        if args.depth is not None:
            ap.error("--depth writes per-view files: use it with --cameras/--out, not --path")
        from ..render_video import cli_path_video

        return cli_path_video(ap, args, _load_scene)
    if args.cameras is None or args.out is None:
        ap.error("--cameras and --out are required (or --path with --video)")
    for name in ("width", "height"):
        v = getattr(args, name)
        if v is not None and v <= 0:
            ap.error(f"--{name} must be positive")
        if v is not None and v > cap:
            ap.error(f"--{name} {v} exceeds the limit of {cap} pixels per side (--max-image-size raises it)")

    from ..run_dir import out_problem

    problem = out_problem(Path(args.out))   # before the cameras and the scene load: a bad --out costs nothing
    if problem:
        print(f"rigel-render: error: {problem}", file=sys.stderr)
        return 2

    import torch
    from tqdm import tqdm

    from .. import cuda_available
    from ..data.images import write_png, write_render_rgba
    from ..render import render

    device = args.device or ("cuda" if cuda_available() else "cpu")
    size = (args.width, args.height) if args.width and args.height else None
    try:
        cams, names, cam_file = resolve_cameras(args.cameras, args.split, size, cap)
        if args.depth is not None:
            names = _clear_of_depth_files(names)
        if args.width or args.height:
            cams = [_resized(cam, args.width, args.height, cap, cam_file, name) for cam, name in zip(cams, names)]
        model = _load_scene(args.scene, device)
    except (OSError, ValueError) as e:  # InputError (DatasetError, SceneFormatError) is a ValueError
        print(f"rigel-render: error: {e}", file=sys.stderr)
        return 2
    except (MemoryError, RuntimeError) as e:
        if not out_of_memory(e):
            raise
        print(f"rigel-render: error: {args.scene}: out of memory loading the scene ({_first_line(e)})",
              file=sys.stderr)
        return 1
    out = Path(args.out)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        print(f"rigel-render: error: {out}: cannot create the output directory ({e.strerror or e})", file=sys.stderr)
        return 2
    if not args.force:  # refused before anything is rendered or written
        existing = [p for name in names for p in ((out / f"{name}.png",) + (_depth_paths(out, name) if args.depth
                                                                              is not None else ())) if p.exists()]
        if existing:
            more = f" (and {len(existing) - 1} more)" if len(existing) > 1 else ""
            print(f"rigel-render: error: {existing[0]} exists{more} (use --force to replace the rendered files)",
                  file=sys.stderr)
            return 2
    bg = torch.tensor(args.background, dtype=model.dtype, device=model.device)
    for cam, name in zip(tqdm(cams, desc=f"rendering {len(cams)} views", unit="view"), names):
        try:
            with torch.no_grad():
                r = render(model, cam, background=None if args.alpha else bg, sh_degree=args.sh_degree,
                           depth=args.depth is not None)
        except (MemoryError, RuntimeError) as e:  # a valid but too large scene or image for this machine
            if not out_of_memory(e):
                raise
            print(f"rigel-render: error: out of memory rendering view {name} ({cam.width}x{cam.height}) of "
                  f"{args.scene} ({model.num_gaussians} Gaussians, {device}): {_first_line(e)}", file=sys.stderr)
            return 1
        if args.alpha:
            write_render_rgba(out / f"{name}.png", r.image, r.final_T)
        else:
            write_png(out / f"{name}.png", r.image)
        if args.depth is not None:
            from ..depth_image import depth_range, write_depth_npy, write_depth_png

            d = r.depth if args.depth == "expected" else r.depth_median
            near, far = args.depth_range or depth_range(d)
            png, npy = _depth_paths(out, name)
            write_depth_png(png, d, near, far, kind=args.depth)
            write_depth_npy(npy, d)
    print(f"rendered {len(cams)} views of {args.scene} ({model.num_gaussians} Gaussians) from {cam_file} to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
