"""``load_dataset``: Blender / NeRF-synthetic, instant-ngp and COLMAP datasets, format detected from the files."""
from __future__ import annotations

from pathlib import Path

from ..io.errors import NoImageFiles
from .assemble import assemble_dataset, warn_small_split
from .frames import Dataset, DatasetError, cap_frames, held_out_split, with_unique_names
from .transforms import read_ply_points, read_transforms, warn_missing, warn_unmasked

__all__ = ["load_dataset", "detect_format", "load_blender", "load_ngp", "FORMATS"]

FORMATS = ("blender", "ngp", "colmap")


def detect_format(path) -> tuple[str, Path]:
    """(format, root) of a dataset path.

    A directory holding ``transforms_train.json`` is Blender; one holding ``transforms.json`` is instant-ngp;
    one holding ``sparse/0/cameras.{bin,txt}`` or ``sparse/cameras.{bin,txt}`` is COLMAP. A path to a
    ``transforms_train.json`` file means Blender, any other ``.json`` file instant-ngp.
    Raises DatasetError naming the path and what was looked for when nothing matches.
    """
    p = Path(path)
    if p.is_file() and p.suffix.lower() == ".json":
        return ("blender", p.parent) if p.name == "transforms_train.json" else ("ngp", p)
    if not p.exists():
        raise DatasetError(f"{p}: no such file or directory")
    if not p.is_dir():
        raise DatasetError(f"{p}: not a dataset directory or transforms .json file")
    if (p / "transforms_train.json").is_file():
        return "blender", p
    if (p / "transforms.json").is_file():
        return "ngp", p / "transforms.json"
    for sub in ("sparse/0", "sparse"):
        if any((p / sub / f"cameras.{ext}").is_file() for ext in ("bin", "txt")):
            return "colmap", p
    raise DatasetError(
        f"{p}: no dataset found. Expected one of: transforms_train.json (+ transforms_test.json) "
        "(Blender / NeRF-synthetic), transforms.json (instant-ngp / nerfstudio), "
        "sparse/0/cameras.bin|txt with images/ (COLMAP)")


def load_dataset(path, *, white_bg: bool = False, downscale: float = 1, test_every: int = 8,
                 device="cpu", max_frames: int | None = None, format: str | None = None,
                 alpha_as_mask: bool = False, stream: bool = False, cache_mb: float | None = None) -> Dataset:
    """Load a dataset: eagerly (all images decoded into tensors on ``device``), or streamed (``stream``).

    Args:
        path: dataset directory (or a transforms ``.json`` file); the format is detected by
            :func:`detect_format` unless ``format`` (``"blender"``, ``"ngp"``, ``"colmap"``) is given.
        white_bg: composite alpha onto white (the NeRF-synthetic protocol) instead of black.
        downscale: divide the image size by this (Pillow box filter; intrinsics via ``Camera.scaled``).
        test_every: instant-ngp and COLMAP hold out every ``test_every``-th frame (indices 0, N, 2N, … of the
            frames sorted by image name — the 3DGS "llffhold" convention); ≤ 0 keeps every frame for training.
            Blender uses its own ``transforms_test.json``.
        device: torch device of the image tensors.
        max_frames: load at most this many frames per split (the first ones), e.g. for tests.
        alpha_as_mask: use each image's alpha channel as a mask (alpha 0 = ignored pixel) instead of compositing
            it onto the background (see :func:`~rigel_core.data.frames.load_frames`).
        stream: read only the image headers now; each frame's pixels are loaded when read, into a host cache of
            ``cache_mb`` MiB (default :func:`~rigel_core.data.stream.auto_cache_bytes`: the whole capture when it
            takes at most a quarter of the host's available memory, else that quarter, at least
            :data:`~rigel_core.data.stream.DEFAULT_CACHE_MB`), bit for bit the values of
            the eager load, as host tensors whatever ``device`` (:mod:`rigel_core.data.stream`). What
            ``rigel-train`` does.
    Returns:
        :class:`~rigel_core.data.frames.Dataset`. Cameras are ideal pinholes: lens distortion is removed from the
        images at load (once); pixels left without a source, and pixels that a ``masks/`` folder (instant-ngp,
        COLMAP) or ``mask_path`` marks black, are flagged in ``Frame.mask``. ``scene_center``/``scene_extent``
        come from the training cameras.
    Raises:
        DatasetError (a ValueError) naming the file: unknown layout, malformed file, no usable frame.
        MissingPackage (an ImportError) saying what to install: COLMAP data without pycolmap, a capture with lens
        distortion without OpenCV.
    """
    if downscale <= 0:
        raise ValueError(f"downscale must be positive, got {downscale}")
    if format is None:
        format, root = detect_format(path)
    else:
        if format not in FORMATS:
            raise ValueError(f"unknown dataset format {format!r}; expected one of {FORMATS}")
        root = Path(path)
        if format == "ngp" and root.is_dir():
            root = root / "transforms.json"
    kw = dict(white_bg=white_bg, downscale=downscale, device=device, max_frames=max_frames,
              alpha_as_mask=alpha_as_mask, stream=stream, cache_mb=cache_mb)
    if format == "blender":
        ds = load_blender(root, **kw)
    elif format == "ngp":
        ds = load_ngp(root, test_every=test_every, **kw)
    else:
        from .colmap import load_colmap

        ds = load_colmap(root, test_every=test_every, **kw)
    ds.downscale = float(downscale)
    return ds


def load_blender(root, *, white_bg=False, downscale=1, device="cpu", max_frames=None, alpha_as_mask=False,
                 stream=False, cache_mb=None) -> Dataset:
    """A Blender / NeRF-synthetic directory: ``transforms_train.json`` (required), ``transforms_test.json``
    (optional: without it there are no held-out views, as a deliberate choice, silently; ``transforms_val.json`` is
    ignored). Frames whose image is missing are skipped with one warning per file; a training file with no usable
    frame is an error, a test file with none leaves the test split empty after that warning."""
    root = Path(root)
    splits = {}
    for split in ("train", "test"):
        f = root / f"transforms_{split}.json"
        if not f.is_file():
            if split == "train":
                raise DatasetError(f"{f}: file not found")
            splits[split] = []
            continue
        specs, missing, total = read_transforms(f)
        specs = with_unique_names(specs)   # within a split: a view's renders are named after it
        if not specs and split == "train":   # said once, by the error (a file of cameras alone: NoImageFiles)
            raise NoImageFiles(f"{f}: none of its {total} frames has an image file")
        warn_missing(f, missing, total)
        splits[split] = cap_frames(specs, max_frames)
    warn_unmasked(root / "masks", splits["train"] + splits["test"])
    return assemble_dataset(splits["train"], splits["test"], root, "blender", white_bg, downscale, device,
                            alpha_as_mask=alpha_as_mask, stream=stream, cache_mb=cache_mb)


def load_ngp(json_path, *, white_bg=False, downscale=1, device="cpu", max_frames=None, test_every=8,
             alpha_as_mask=False, stream=False, cache_mb=None) -> Dataset:
    """An instant-ngp (or nerfstudio) ``transforms.json``: one file, every ``test_every``-th frame (sorted by
    image name) held out; nerfstudio's ``ply_file_path`` gives ``points``/``point_colors``. See
    :mod:`rigel_core.data.transforms` for the keys read and ignored."""
    json_path = Path(json_path)
    specs, missing, total = read_transforms(json_path)
    if not specs:   # said once, by the error (a file of cameras alone: NoImageFiles)
        raise NoImageFiles(f"{json_path}: none of its {total} frames has an image file")
    warn_missing(json_path, missing, total)
    points, colors = read_ply_points(json_path)  # nerfstudio's ply_file_path (SfM points), else None
    warn_unmasked(json_path.parent / "masks", specs)
    train, test = held_out_split(specs, test_every)
    if max_frames is None:   # (a cap of the views is the caller's choice)
        warn_small_split(json_path, train, test)
    return assemble_dataset(cap_frames(train, max_frames), cap_frames(test, max_frames), json_path, "ngp", white_bg,
                            downscale, device, points, colors, alpha_as_mask=alpha_as_mask, stream=stream,
                            cache_mb=cache_mb)
