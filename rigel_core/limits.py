"""The input limits every loader and CLI checks, in one place (docs/RELIABILITY.md lists them with the checks).

A limit bounds what a *declared* number in a file (a header's count, a JSON size) may ask for, so that a corrupt
or hostile file is refused with one clear line before anything is allocated, and memory stays proportional to
the bytes actually present. Each is a plain module constant; where a user may need more, the CLI that applies it
has an override flag (named in the constant's docstring).
"""
from __future__ import annotations

__all__ = ["MAX_IMAGE_SIDE", "MAX_IMAGE_PIXELS", "MAX_CAMERA_SIDE", "MAX_SCENE_SPLATS", "MAX_SPZ_POINTS",
           "MAX_DATASET_FRAMES", "MAX_JSON_BYTES", "MAX_JSON_DEPTH", "MAX_PATH_LENGTH", "MAX_NAME_BYTES",
           "MAX_COLMAP_CAMERAS", "MAX_PLY_HEADER_BYTES", "MAX_SPZ_EXTENSION_BYTES", "MAX_CAMERA_COORD",
           "MAX_FIELD_OF_VIEW_DEG", "MIN_PIXEL_ANGLE", "check_image_size", "focal_length_problem", "out_of_memory"]

MAX_IMAGE_SIDE = 16384
"""Largest image width or height (pixels) accepted from a dataset image, a transforms file's ``w``/``h`` or
``rigel-render --width/--height``. ``rigel-render --max-image-size N`` raises it (and the pixel cap to N²)."""

MAX_IMAGE_PIXELS = 1 << 28
"""Largest width × height (268 M pixels = 16384²): one such image is 4 GiB as float32 RGBA. Raised together with
:data:`MAX_IMAGE_SIDE` by ``rigel-render --max-image-size``."""

MAX_CAMERA_SIDE = 1 << 20
"""Hard bound on a :class:`rigel_core.Camera`'s width and height (no override): far above any sensor or render
target, it keeps pixel coordinates exact in float32 and width·height far from int64 overflow. The per-use cap is
:data:`MAX_IMAGE_SIDE`."""

MAX_CAMERA_COORD = 1e8
"""Largest |coordinate| of a camera's position (scene units) a :class:`rigel_core.Camera` accepts (no override).
Beyond it float32, in which the kernels and the trainer work, keeps fewer than one unit of a position's digits
and the squares in the scene extent overflow: a pose of 1e30 trained to 3.8 dB and wrote a model of infinities.
Georeferenced captures (UTM northings ~5e6 m) stay below it."""

MAX_FIELD_OF_VIEW_DEG = 170.0
"""Widest field of view, 2·atan(side / 2f) along the width (fx) or the height (fy), of a camera a dataset may declare
(no override). A pinhole image spreads its pixels as tan θ: at 170° the border pixel sees 1/131 of the centre
pixel's angle and the rest of the image crowds into the last degrees, so no pinhole image is that wide (a fisheye is
undistorted to a narrower pinhole by its lens model); a focal length of a small fraction of the image (1e-30 px
gave 180°) is a corrupt number, and trained a blur with exit 0."""

MIN_PIXEL_ANGLE = 1e-6
"""Smallest angle one pixel may span at the image centre, 1/f radians (f the focal length in pixels), of a camera a
dataset may declare (no override): f ≤ 1e6 px, a 0.06° field of view over 1000 px, 6000 mm on a full-frame 6000-px
sensor. The renderer's float32 camera-space coordinates resolve directions to ~1e-7 rad (2⁻²³), so a finer pixel
cannot be placed: a ``camera_angle_x`` of a few micro-radians trained garbage with exit 0."""

MAX_SCENE_SPLATS = 50_000_000
"""Largest number of splats a scene file (PLY, compressed PLY) may declare (a 12 GB INRIA PLY at SH degree 3);
beyond it the header is taken as corrupt. Declared counts are also checked against the file size."""

MAX_SPZ_POINTS = 10_000_000
"""Largest point count an SPZ header may declare: the limit of Niantic's reference reader
(``maxPointsToRead``), so no valid SPZ file exceeds it."""

MAX_PLY_HEADER_BYTES = 1 << 20
"""Longest PLY header read (1 MiB; 3DGS headers are ~1–2 KB): a file without ``end_header`` within it is corrupt."""

MAX_SPZ_EXTENSION_BYTES = 1 << 20
"""Most bytes of extension records, or of trailing data, accepted after a v2/v3 SPZ's splats (their size is only
known by inflating): a gzip stream that inflates past the splats and this is refused, naming the limit, and is not
inflated further (a 16-byte header for one splat before 300 MB of zeros loaded as one invisible splat)."""

MAX_DATASET_FRAMES = 100_000
"""Most frames (images) one transforms file or COLMAP model may list."""

MAX_COLMAP_CAMERAS = 100_000
"""Most cameras a COLMAP ``cameras.bin|txt`` may declare (one per physical camera or image)."""

MAX_JSON_BYTES = 256 << 20
"""Largest transforms ``.json`` file read (256 MiB; a 100 000-frame file is ~50 MB)."""

MAX_JSON_DEPTH = 32
"""Deepest nesting of arrays/objects accepted in a transforms file (the format needs 4: object → frames →
frame → matrix row); deeper files are refused, and Python's parser recursion limit is never reached."""

MAX_PATH_LENGTH = 4096
"""Longest image path (characters) a dataset may name (Linux ``PATH_MAX``)."""

MAX_NAME_BYTES = 255
"""Longest single path component (UTF-8 bytes) a dataset may name (Linux ``NAME_MAX``); frame names become
output file names."""


def check_image_size(width: int, height: int, *, max_side: int = MAX_IMAGE_SIDE,
                     max_pixels: int = MAX_IMAGE_PIXELS) -> str | None:
    """None when a ``width × height`` image is within the caps, else the problem as a phrase for an error message.

    ``width``/``height`` are Python ints (any size: no overflow).
    """
    size = f"{_n(width)}x{_n(height)}"
    if width < 1 or height < 1:
        return f"image size {size} is not positive"
    if width > max_side or height > max_side:
        return f"image size {size} exceeds the limit of {max_side} pixels per side"
    if width * height > max_pixels:
        return f"image size {size} ({_n(width * height)} pixels) exceeds the limit of {max_pixels} pixels"
    return None


def _n(v: int) -> str:
    return str(v) if abs(v) < 10**12 else f"{float(v):.3g}"


def focal_length_problem(focal: float, size: int) -> str | None:
    """None when a focal length of ``focal`` pixels (finite, > 0) over ``size`` pixels (the image width for fx, the
    height for fy) is a camera rigel can use, else the problem as a phrase for an error message: a field of view
    over :data:`MAX_FIELD_OF_VIEW_DEG`, or a pixel under :data:`MIN_PIXEL_ANGLE` radians."""
    import math

    fov = math.degrees(2.0 * math.atan(size / (2.0 * focal)))
    what = f"a field of view of {fov:.4g}° over {size} px (focal length {focal:.4g} px)"
    if fov > MAX_FIELD_OF_VIEW_DEG:
        return f"{what}: wider than {MAX_FIELD_OF_VIEW_DEG:g}°, more than a pinhole image holds (docs/RELIABILITY.md)"
    if 1.0 / focal < MIN_PIXEL_ANGLE:
        return (f"{what}: each pixel spans {1.0 / focal:.3g} rad, under {MIN_PIXEL_ANGLE:g} rad, finer than the "
                "renderer's float32 resolves directions (docs/RELIABILITY.md)")
    return None


def out_of_memory(e: BaseException) -> bool:
    """Is ``e`` a failure to allocate memory: a MemoryError, or PyTorch's allocator failure (a RuntimeError on the
    CPU; ``torch.cuda.OutOfMemoryError`` on CUDA, or a plain RuntimeError saying so from an extension's kernels)?"""
    text = str(e)
    return isinstance(e, MemoryError) or "can't allocate memory" in text or "out of memory" in text.lower()
