"""Image files for datasets: find a file whatever its extension, decode it to float RGB(A), composite alpha,
resize with an area filter.

All arrays here are numpy ``float32`` in [0, 1], shape (H, W, C), row 0 at the top of the image.
"""
from __future__ import annotations

import os
import struct
import warnings
import zlib
from pathlib import Path

import numpy as np

from ..limits import MAX_IMAGE_PIXELS, MAX_IMAGE_SIDE, check_image_size

__all__ = ["IMAGE_EXTENSIONS", "EXIF_TRANSPOSED", "exif_orientation",
           "names_folder", "resolve_image_path", "read_image", "UNIT8", "composite_rgb", "read_mask", "find_mask",
           "image_size", "image_header", "composite", "resize_area", "write_png", "write_render_rgba"]

#: Extensions tried, in order, when a dataset names an image without one (NeRF-synthetic ``./train/r_0``).
IMAGE_EXTENSIONS = (".png", ".jpg", ".jpeg", ".webp", ".tif", ".tiff", ".bmp", ".PNG", ".JPG", ".JPEG", ".WEBP")


def names_folder(file_path: str) -> bool:
    """Does ``file_path`` name a folder by its form: empty last component (a trailing ``/`` or ``\\``), ``.`` or
    ``..``? Checked on the text: pathlib drops a trailing ``/.``, so ``d/.`` would read as ``d``."""
    text = str(file_path).replace("\\", "/")
    return text.endswith("/") or text.rsplit("/", 1)[-1] in ("", ".", "..")


def resolve_image_path(base: Path, file_path: str) -> Path | None:
    """The existing image file that ``file_path`` (relative to ``base``) names, or None.

    ``file_path`` is used as given when that file exists; otherwise each of :data:`IMAGE_EXTENSIONS` is
    appended (NeRF-synthetic paths have none), then substituted for an extension it already has
    (a ``.png`` entry whose image was re-encoded as ``.webp``). A path that names a folder (:func:`names_folder`):
    None.
    """
    if names_folder(file_path):
        return None
    p = Path(file_path)
    if not p.is_absolute():
        p = Path(base) / p
    if p.is_file():
        return p
    for cand in [Path(str(p) + ext) for ext in IMAGE_EXTENSIONS] + [p.with_suffix(ext) for ext in IMAGE_EXTENSIONS]:
        if cand.is_file():
            return cand
    return None


#: What Pillow's decoders raise for a corrupt file (beyond OSError: a malformed chunk surfaces as any of these).
_DECODE_ERRORS = (OSError, ValueError, SyntaxError, EOFError, IndexError, TypeError, KeyError, struct.error,
                  zlib.error)


def _open_checked(path: Path, max_side: int, max_pixels: int, what: str = "image"):
    """``Image.open`` (lazy: reads the header only), then the declared size checked against the caps before any
    pixel is decoded. ValueError naming the file for an unreadable header or a size over the caps."""
    from PIL import Image

    if Image.MAX_IMAGE_PIXELS is not None and Image.MAX_IMAGE_PIXELS < max_pixels:
        # Pillow's own bomb guard (a warning from ~89 M pixels, an error from ~179 M) sat below rigel's caps, which
        # are checked below from the header before any pixel is decoded: it warned at every decode of an image
        # rigel accepts, and refused those of 179–268 M pixels that the caps allow. Raised to the caps, its warning
        # comes only for an image the caps refuse next, in their own line: not shown (one line per bad input; the
        # filter is looked for at each open, as a caller's warnings.catch_warnings may have dropped it since)
        Image.MAX_IMAGE_PIXELS = max_pixels
    if not any(f[0] == "ignore" and f[2] is Image.DecompressionBombWarning for f in warnings.filters):
        warnings.filterwarnings("ignore", category=Image.DecompressionBombWarning)   # added once, not at each open
    try:
        im = Image.open(path)
    except Image.DecompressionBombError as e:  # Pillow's own cap hit inside open()
        raise ValueError(f"{path}: {what} too large to decode ({e})") from None
    except _DECODE_ERRORS as e:
        raise ValueError(f"{path}: cannot read {what} ({type(e).__name__}: {e})") from None
    problem = check_image_size(*im.size, max_side=max_side, max_pixels=max_pixels)
    if problem:
        im.close()
        raise ValueError(f"{path}: the {what} header declares {problem}")
    return im


def image_size(path: Path, *, max_side: int = MAX_IMAGE_SIDE, max_pixels: int = MAX_IMAGE_PIXELS) -> tuple[int, int]:
    """(width, height) of an image file, read from its header only. ValueError naming the file if unreadable or
    larger than the caps (:mod:`rigel_core.limits`)."""
    with _open_checked(path, max_side, max_pixels) as im:
        return im.size


def image_header(path: Path) -> tuple[tuple[int, int], bool]:
    """((width, height), has alpha) of an image file from its header only: whether :func:`read_image` will give
    4 channels (the same rule, :func:`_has_alpha`). ValueError naming the file as :func:`image_size`."""
    with _open_checked(path, MAX_IMAGE_SIDE, MAX_IMAGE_PIXELS) as im:
        return im.size, _has_alpha(im)


#: EXIF orientations (tag 0x0112) that show the stored image transposed (turned by 90° or 270°, maybe mirrored)
EXIF_TRANSPOSED = (5, 6, 7, 8)


def exif_orientation(path: Path) -> int | None:
    """The EXIF orientation tag (1..8) of an image file, or None without one or when it cannot be read. rigel reads
    the pixels as stored and never applies it, as COLMAP does (its cameras and poses are of the stored pixels)."""
    from PIL import Image

    try:
        with Image.open(path) as im:
            value = im.getexif().get(0x0112)
    except Exception:   # a corrupt EXIF block is no reason to fail: the caller only adds a hint
        return None
    return value if isinstance(value, int) and 1 <= value <= 8 else None


def _has_alpha(im) -> bool:
    """Does :func:`read_image` give an alpha channel for this opened (or header-read) Pillow image?"""
    if im.mode.startswith("I") or im.mode == "F":
        return False
    return im.mode in ("RGBA", "LA", "PA", "RGBa", "La") or (im.mode == "P" and "transparency" in im.info)


def read_image(path: Path, *, max_side: int = MAX_IMAGE_SIDE, max_pixels: int = MAX_IMAGE_PIXELS,
               raw8: bool = False) -> np.ndarray:
    """Decode an image file to (H, W, 3) or (H, W, 4) float32 in [0, 1] (straight, not premultiplied, alpha).

    8-bit and 16-bit greyscale, greyscale+alpha, palette (with transparency), RGB and RGBA files are accepted
    (Pillow). The size the header declares is checked against ``max_side``/``max_pixels`` before decoding.
    With ``raw8`` an 8-bit file is returned as its (H, W, 3|4) uint8 codes instead — the float32 result is
    exactly ``UNIT8[codes]`` (:data:`UNIT8`: code / 255 in float32) — and a 16-bit or float file as float32 as
    without it (the caller tells them apart by dtype): a quarter of the bytes, for caches (data/stream.py).
    Raises ValueError naming the file when it is too large or cannot be decoded.
    """
    from PIL import Image

    im = _open_checked(path, max_side, max_pixels)
    try:
        with im:
            im.load()
            mode = im.mode
            if mode.startswith("I"):  # 16-bit greyscale PNG / TIFF
                a = np.asarray(im, dtype=np.float32) / 65535.0
                return np.repeat(a[..., None], 3, axis=-1)
            if mode == "F":
                return np.repeat(np.asarray(im, dtype=np.float32)[..., None], 3, axis=-1)
            if mode not in ("RGB", "RGBA"):   # (converting to its own mode would be a copy of every pixel)
                im = im.convert("RGBA" if _has_alpha(im) else "RGB")
            if raw8:
                return np.array(im, dtype=np.uint8)   # a writable copy (torch.from_numpy shares it)
            return np.asarray(im, dtype=np.float32) / 255.0
    except (*_DECODE_ERRORS, Image.DecompressionBombError) as e:
        raise ValueError(f"{path}: cannot read image ({type(e).__name__}: {e})") from None


#: float32 value of each 8-bit code, code / 255 — the very values :func:`read_image` gives (one division per
#: element in float32 either way), as a lookup table: ``UNIT8[codes]`` turns :func:`read_image`'s ``raw8`` codes into
#: its float result bit for bit, on any device
UNIT8 = np.arange(256, dtype=np.float32) / 255.0


def other_aspect(size: tuple[int, int], declared: tuple[int, int]) -> bool:
    """Whether an image of ``size`` (width, height) resized to ``declared`` would be stretched: aspect ratios more
    than 1 % apart, and more than rounding each side of a scaled copy to whole pixels explains (a 1000×662 photo
    shipped at 10×7 is a scaled copy; a transposed or foreign image is not)."""
    (w, h), (dw, dh) = size, declared
    if abs(w * dh - h * dw) <= 0.01 * w * dh:
        return False
    # some scale s with |s·dw − w| ≤ 1 and |s·dh − h| ≤ 1: the two intervals of s overlap
    return max((w - 1) / dw, (h - 1) / dh) > min((w + 1) / dw, (h + 1) / dh)


def read_mask(path: Path, size: tuple[int, int] | None = None, on_other_aspect=None) -> np.ndarray:
    """Decode a mask image to an (H, W) bool array: True (keep) where the mask is non-zero, False (ignore) where
    it is black — the nerfstudio / Brush convention. Colour masks are reduced to their luminance (any
    non-black colour keeps); an alpha channel, if present, is ignored. Store masks losslessly (PNG): JPEG noise
    turns black into small non-zero values.

    ``size`` (width, height): the photo's size; a mask of another size is resized to it (nearest neighbour), with a
    warning naming the file when its aspect ratio differs (a transposed or foreign mask, not a scaled copy) — or,
    with ``on_other_aspect`` given, that callable called with the warning's text instead (a loader that groups them).
    Raises ValueError naming the file when it cannot be decoded or its header declares a size over the caps of
    :mod:`rigel_core.limits` (as :func:`read_image`).
    """
    from PIL import Image

    im = _open_checked(path, MAX_IMAGE_SIDE, MAX_IMAGE_PIXELS, "mask")
    try:
        with im:
            im.load()
            if im.mode in ("I", "I;16", "I;16B", "I;16L", "F"):
                a = np.asarray(im, dtype=np.float64)
            else:
                im = im.convert("RGB").convert("L") if im.mode not in ("L", "1") else im.convert("L")
                a = np.asarray(im, dtype=np.float64)
            if size is not None and (a.shape[1], a.shape[0]) != tuple(size):
                if other_aspect((a.shape[1], a.shape[0]), size):
                    what = f"{path}: the mask is {a.shape[1]}x{a.shape[0]} for a {size[0]}x{size[1]} image"
                    if on_other_aspect is not None:
                        on_other_aspect(what)
                    else:
                        warnings.warn(f"{what}, another aspect ratio: stretched to fit (check that it belongs to this "
                                      "image)", stacklevel=2)
                a = np.asarray(Image.fromarray(a.astype(np.float32), mode="F").resize(tuple(size), Image.NEAREST))
    except (*_DECODE_ERRORS, Image.DecompressionBombError) as e:
        raise ValueError(f"{path}: cannot read mask ({type(e).__name__}: {e})") from None
    return a > 0


def find_mask(masks_dir: Path, image_name: str) -> Path | None:
    """The mask file of an image in ``masks_dir``, or None: the same relative name (``a/b.jpg``), that name
    plus an image extension (COLMAP's ``b.jpg.png``), or the same stem with any of :data:`IMAGE_EXTENSIONS`."""
    if not Path(masks_dir).is_dir():
        return None
    return resolve_image_path(masks_dir, image_name)


def composite(rgba: np.ndarray, white_bg: bool) -> tuple[np.ndarray, np.ndarray | None]:
    """Composite straight alpha onto a white or black background.

    Args: rgba (H, W, 3|4) float32 in [0, 1].
    Returns: rgb (H, W, 3) = rgb·a + bg·(1 − a), and alpha (H, W) (None for a 3-channel input).
    """
    if rgba.shape[-1] == 3:
        return rgba, None
    rgb, a = rgba[..., :3], rgba[..., 3]
    return composite_rgb(rgb, a, white_bg).astype(np.float32), a.astype(np.float32)


def composite_rgb(rgb, a, white_bg: bool):
    """``rgb · a`` (+ ``(1 − a)`` on white): the composite's arithmetic, written once for numpy arrays (:func:`composite`)
    and torch tensors (the streamed frames' ``finish_codes``): the same float32 operations in the same order, so both
    give the same bits. ``rgb`` (…, 3), ``a`` (…)."""
    out = rgb * a[..., None]
    return out + (1.0 - a[..., None]) if white_bg else out


def resize_area(img: np.ndarray, width: int, height: int) -> np.ndarray:
    """Resize (H, W) or (H, W, C) float32 to ``width × height`` with Pillow's box (area-averaging) filter.

    For an integer factor this is the mean of each factor×factor block. Each channel is resized as a
    32-bit float image, so no 8-bit rounding happens.
    """
    from PIL import Image

    if img.shape[1] == width and img.shape[0] == height:
        return img
    chans = img[..., None] if img.ndim == 2 else img
    out = np.stack([np.asarray(Image.fromarray(np.ascontiguousarray(chans[..., c]), mode="F")
                               .resize((width, height), Image.BOX)) for c in range(chans.shape[-1])], axis=-1)
    return out[..., 0] if img.ndim == 2 else out


def write_png(path, rgb, alpha=None) -> None:
    """Write float [0, 1] rgb (H, W, 3) (numpy or torch) and optional alpha (H, W) as an 8-bit PNG.

    Values are clamped to [0, 1] and rounded to the nearest of 256 levels. Written to a temporary name and
    renamed, so a reader never sees a partial file.
    """
    from PIL import Image

    rgb = _to_numpy(rgb)
    if alpha is not None:
        rgb = np.concatenate([rgb, _to_numpy(alpha)[..., None]], axis=-1)
    u8 = np.clip(np.rint(np.clip(rgb, 0.0, 1.0) * 255.0), 0, 255).astype(np.uint8)
    path = Path(path)
    tmp = path.with_name(f".{path.stem}.tmp{os.getpid()}.png")
    Image.fromarray(u8, mode="RGBA" if u8.shape[-1] == 4 else "RGB").save(tmp)
    os.replace(tmp, path)


def write_render_rgba(path, image, final_T) -> None:
    """Write a render made on a black background as a straight-alpha RGBA PNG.

    ``image`` (H,W,3) is the premultiplied colour (what the rasterizer returns with no background) and
    alpha = 1 − ``final_T`` (H,W); the stored colour is image / alpha (0 where alpha = 0), so that compositing
    the PNG onto any background reproduces the render on that background up to 8-bit rounding.
    """
    a = np.clip(1.0 - _to_numpy(final_T), 0.0, 1.0)
    img = _to_numpy(image)
    with np.errstate(divide="ignore", invalid="ignore"):
        straight = np.where(a[..., None] > 0, img / np.maximum(a, 1e-12)[..., None], 0.0)
    write_png(path, straight, a)


def _to_numpy(x) -> np.ndarray:
    if hasattr(x, "detach"):
        x = x.detach().float().cpu().numpy()
    return np.asarray(x, dtype=np.float32)
