"""``rigel-convert``: convert a Gaussian scene between file formats.

    rigel-convert IN OUT [--sh-degree D] [--spz-version 2|3] [--force]

IN is anything :func:`rigel_core.io.load_scene` reads (INRIA PLY, PlayCanvas ``.compressed.ply``, Niantic
``.spz``, antimatter15 ``.splat``, a rigel checkpoint); OUT's suffix picks the format written
(:func:`rigel_core.io.save_scene`): ``.ply``, ``.compressed.ply``, ``.spz`` or ``.splat``. OUT is never
overwritten without ``--force`` and is written atomically. Gaussians with NaN/Inf parameters, which the compact
formats cannot store, are dropped (the count is printed). After writing, OUT is read back and the round-trip
error against IN is printed (max / mean absolute error of positions, log-scales, base colours, opacities,
rotations and SH), so the loss of the lossy formats is visible.
Exit status 0 on success, 2 for bad arguments or input (one line on stderr), 1 when OUT cannot be written.
"""
from __future__ import annotations

import os
import sys
import warnings

from .common import Parser

__all__ = ["main", "convert", "ConvertError"]


class ConvertError(ValueError):
    """A conversion refused before anything is written (missing input, OUT exists, bad option)."""


def _human(nbytes: int) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if nbytes < 1024 or unit == "GB":
            return f"{nbytes:.0f} {unit}" if unit == "B" else f"{nbytes:.1f} {unit}"
        nbytes /= 1024.0


def convert(src, dst, *, sh_degree=None, force=False, spz_version=3, out=print, warn=None):
    """Convert ``src`` to ``dst`` (module docstring); returns the :class:`rigel_core.io.export.RoundTripErrors`.
    ``out`` receives the report lines, ``warn`` the input's warnings (default: stderr).

    Raises: ValueError (ConvertError, SceneFormatError, ExportError) for bad input or options, nothing written;
        OSError when ``dst`` cannot be written.
    """
    if warn is None:
        warn = lambda line: print(f"rigel-convert: {line}", file=sys.stderr)
    import torch

    from ..io import load_scene, save_scene
    from ..io.export import EXPORT_FORMATS, finite_mask, format_for_path, roundtrip_errors

    src, dst = os.fspath(src), os.fspath(dst)
    fmt = format_for_path(dst)  # an unknown suffix fails before any work
    if not os.path.exists(src):
        raise ConvertError(f"{src}: input scene not found")
    if os.path.isdir(dst):
        raise ConvertError(f"{dst}: is a directory")
    if os.path.exists(dst) and not force:
        raise ConvertError(f"{dst}: exists; pass --force to overwrite it")
    if sh_degree is not None and sh_degree not in (0, 1, 2, 3):
        raise ConvertError(f"--sh-degree {sh_degree}: must be 0-3")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:  # float64: the measured errors are then the format's, not float32's
            model = load_scene(src, dtype=torch.float64)
        except (OSError, RuntimeError) as e:  # unreadable file, or torch refusing a checkpoint
            raise ConvertError(f"{src}: cannot read: {getattr(e, 'strerror', None) or e}") from None
    for w in caught:
        warn(f"warning: {w.message}")
    if getattr(model, "appearance", None) is not None:
        from ..appearance import to_sh

        model, _ = to_sh(model, 3)
        out("note: the checkpoint's MLP appearance is baked into SH degree 3")
    n_in = model.num_gaussians
    ok = finite_mask(model)
    if not bool(ok.all()):
        model = model.subset(ok)
        out(f"note: dropped {n_in - model.num_gaussians} of {n_in} Gaussians with NaN or Inf parameters")
    if sh_degree is not None:
        model = model.with_sh_degree(sh_degree)
    if fmt == "splat" and model.sh_degree > 0:
        out(f"note: .splat holds SH degree 0 only; the degree-{model.sh_degree} coefficients are dropped")
        model = model.with_sh_degree(0)
    options = {"version": spz_version} if fmt == "spz" else {}  # save_scene picks SPZ's fractional bits
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the notes above say what the writers would warn about
        order = save_scene(model, dst, format=fmt, **options)
        decoded = load_scene(dst, dtype=torch.float64)
    errors = roundtrip_errors(model, decoded, order)
    if getattr(model, "render_mode", "default") != getattr(decoded, "render_mode", "default"):
        out(f"note: {EXPORT_FORMATS[fmt][1]} has no render-mode field: the input's '{model.render_mode}' mode "
            "(comment SplatRenderMode) is not kept, so renderers draw the output in the default mode")
    out(f"wrote {dst}: {EXPORT_FORMATS[fmt][1]}, {model.num_gaussians} Gaussians, SH degree {decoded.sh_degree}, "
        f"{_human(os.path.getsize(dst))} (from {_human(os.path.getsize(src))})")
    lines = errors.lines()
    if lines:
        out("round-trip error vs the input (max / mean abs):")
        for line in lines:
            out("  " + line)
    return errors


def main(argv=None) -> int:
    ap = Parser(prog="rigel-convert", description=__doc__.split("\n\n")[0])
    ap.add_argument("input", metavar="IN", help="scene: .ply, .compressed.ply, .spz, .splat or a rigel checkpoint")
    ap.add_argument("output", metavar="OUT", help="output file: .ply, .compressed.ply, .spz or .splat")
    ap.add_argument("--sh-degree", type=int, default=None, choices=(0, 1, 2, 3),
                    help="truncate (or zero-pad) the SH to this degree (default: keep)")
    ap.add_argument("--spz-version", type=int, default=3, choices=(2, 3),
                    help="SPZ version to write (default 3: smallest-three rotations)")
    ap.add_argument("--force", action="store_true", help="overwrite OUT when it exists")
    args = ap.parse_args(argv)
    try:
        convert(args.input, args.output, sh_degree=args.sh_degree, force=args.force, spz_version=args.spz_version)
    except ValueError as e:
        print(f"rigel-convert: error: {e}", file=sys.stderr)
        return 2
    except OSError as e:
        print(f"rigel-convert: error: cannot write {args.output}: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
