"""Scene export: :func:`save_scene` picks the writer from the file name (the helpers the writers share are in
``write_common``, which the writers import instead of this module).

| suffix | format | writer | lossy? |
|---|---|---|---|
| ``.ply`` | INRIA / graphdeco 3DGS PLY (float32) | :func:`rigel_core.io.save_ply` | no (float32 rounding) |
| ``.compressed.ply`` | PlayCanvas / SuperSplat compressed PLY | ``compressed_ply_write.save_compressed_ply`` | yes |
| ``.spz`` | Niantic SPZ v2 / v3 (gzip) | ``spz_write.save_spz`` | yes |
| ``.splat`` | antimatter15 ``.splat`` (SH degree 0 only) | ``splat_write.save_splat`` | yes |

The quantisation error of each lossy format is stated in its writer's docstring and in docs/PIPELINE.md
("Scene file formats"); :func:`roundtrip_errors` measures it for a written file.
"""
from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np
import torch

from ..config import SH_C0
from ..model import GaussianModel
from .write_common import ExportError, finite_mask, sigmoid  # re-exported: the writers' shared helpers

__all__ = ["save_scene", "bake_for_export", "EXPORT_SH_DEGREE", "format_for_path", "ExportError", "EXPORT_FORMATS", "roundtrip_errors", "RoundTripErrors",
           "finite_mask"]

#: format name → (suffix, description). ``.compressed.ply`` is tested before ``.ply``.
EXPORT_FORMATS = {
    "compressed_ply": (".compressed.ply", "PlayCanvas / SuperSplat compressed PLY"),
    "ply": (".ply", "INRIA / graphdeco 3DGS PLY"),
    "spz": (".spz", "Niantic SPZ"),
    "splat": (".splat", "antimatter15 .splat"),
}


def format_for_path(path) -> str:
    """The :data:`EXPORT_FORMATS` key a file name asks for (by suffix, case-insensitive).

    Raises: ExportError when the suffix is none of ``.ply``, ``.compressed.ply``, ``.spz``, ``.splat``.
    """
    name = os.fspath(path).lower()
    for fmt, (suffix, _) in EXPORT_FORMATS.items():
        if name.endswith(suffix):
            return fmt
    raise ExportError(path, "unknown output format; the name must end in "
                            + ", ".join(s for s, _ in EXPORT_FORMATS.values()))


def save_scene(model: GaussianModel, path, *, format: str | None = None, **options):
    """Write ``model`` in the format its file name asks for (or ``format``, a key of :data:`EXPORT_FORMATS`),
    atomically.

    Args:
        model: the scene (any device/dtype; written from float64 copies on the CPU).
        path: output file; ``.ply``, ``.compressed.ply``, ``.spz`` or ``.splat``.
        format: overrides the suffix.
        **options: passed to the writer (e.g. ``version=2`` for SPZ). SPZ gets ``fractional_bits=None`` unless
            given: 12 as the reference, more for a small scene (the reference's 2.4e−4-unit steps are coarse for
            a scene a few tenths of a unit across), fewer for one beyond ±2048 (``save_spz``).
    Returns: for the lossy formats, the (N,) int64 array ``order`` with file row i = input Gaussian
        ``order[i]`` (compressed PLY and .splat reorder); None for the INRIA PLY (rows kept).
    Raises: ExportError (unknown suffix, values the format cannot store), OSError (directory not writable).
    """
    fmt = format or format_for_path(path)
    if fmt == "ply":
        from .ply import save_ply

        if options:
            raise TypeError(f"save_ply takes no options, got {sorted(options)}")
        save_ply(model, path)
        return None
    if fmt == "compressed_ply":
        from .compressed_ply_write import save_compressed_ply as writer
    elif fmt == "spz":
        from .spz_write import save_spz as writer

        options.setdefault("fractional_bits", None)
    elif fmt == "splat":
        from .splat_write import save_splat as writer
    else:
        raise ExportError(path, f"unknown export format {fmt!r}; one of {', '.join(EXPORT_FORMATS)}")
    return writer(model, path, **options)


#: SH degree an MLP appearance is baked into for a file when nothing else says (a trainer's ``config.sh_degree``
#: does): 3, the INRIA layout's full degree
EXPORT_SH_DEGREE = 3


def bake_for_export(model: GaussianModel, degree: int | None = None):
    """``(model, rmse)``: the model to write to a file. Other tools cannot run an MLP appearance, so it is baked
    into SH of ``degree`` (default :data:`EXPORT_SH_DEGREE`) first (:func:`rigel_core.renderer.appearance.to_sh`:
    per-Gaussian least squares over 128 view directions; ``rmse`` in colour units); an SH model is returned as
    it is with rmse 0.0. The one place of the rule "bake the MLP, then save" (rigel-train, the viewer)."""
    from ..renderer.appearance import to_sh

    baked, rmse = to_sh(model, EXPORT_SH_DEGREE if degree is None else int(degree))
    # the render mode and a mip model's 3D filter travel with it (save_ply bakes the filter and writes the mode)
    baked.render_mode = getattr(model, "render_mode", "default")
    baked.filter_3D = getattr(model, "filter_3D", None)
    return baked, float(rmse)


# ---------------------------------------------------------------------------------------------------------
# Measuring a round trip
# ---------------------------------------------------------------------------------------------------------
@dataclass
class RoundTripErrors:
    """Max and mean absolute error per quantity of a decoded model against its source (rows matched).

    Quantities: ``positions`` (world units), ``log_scales`` (natural log; a relative scale error),
    ``colors`` (base colour 0.5 + C0·f_dc, in [0, 1] units), ``opacities`` (sigmoid of the logit),
    ``rotations`` (components of the unit quaternion, sign-aligned), ``sh_rest`` (higher SH coefficients).
    Each value is a (max, mean) pair; None where the quantity is absent (no Gaussians, no SH rest).
    """
    n: int
    positions: tuple | None
    log_scales: tuple | None
    colors: tuple | None
    opacities: tuple | None
    rotations: tuple | None
    sh_rest: tuple | None

    def lines(self) -> list[str]:
        out = []
        for name in ("positions", "log_scales", "colors", "opacities", "rotations", "sh_rest"):
            v = getattr(self, name)
            if v is not None:
                out.append(f"{name:<11} max {v[0]:.3g}  mean {v[1]:.3g}")
        return out


def roundtrip_errors(source: GaussianModel, decoded: GaussianModel, order=None) -> RoundTripErrors:
    """Compare ``decoded`` (a written file read back) with ``source``; ``order`` as returned by
    :func:`save_scene` (file row i holds source row ``order[i]``; None = same order). SH is compared up to the
    lower of the two degrees. Raises ValueError when the counts differ."""
    get = lambda t: t.detach().to(device="cpu", dtype=torch.float64).numpy()
    n = source.num_gaussians
    if decoded.num_gaussians != n:
        raise ValueError(f"decoded model has {decoded.num_gaussians} Gaussians, the source {n}")
    idx = np.arange(n) if order is None else np.asarray(order)

    def stat(a, b):
        if a.size == 0:
            return None
        d = np.abs(a - b)
        return float(d.max()), float(d.mean())

    q0 = get(source.quats)[idx]
    q0 = q0 / np.maximum(np.linalg.norm(q0, axis=1, keepdims=True), 1e-300)
    q1 = get(decoded.quats)
    q1 = q1 / np.maximum(np.linalg.norm(q1, axis=1, keepdims=True), 1e-300)
    q1 = q1 * np.where((q0 * q1).sum(1) < 0, -1.0, 1.0)[:, None]
    k = min(source.sh_rest.shape[1], decoded.sh_rest.shape[1])
    return RoundTripErrors(
        n=n,
        positions=stat(get(source.means3D)[idx], get(decoded.means3D)),
        log_scales=stat(get(source.log_scales)[idx], get(decoded.log_scales)),
        colors=stat(0.5 + SH_C0 * get(source.sh_dc)[idx], 0.5 + SH_C0 * get(decoded.sh_dc)),
        opacities=stat(sigmoid(get(source.opacity_logits)[idx]), sigmoid(get(decoded.opacity_logits))),
        rotations=stat(q0, q1),
        sh_rest=stat(get(source.sh_rest)[idx][:, :k], get(decoded.sh_rest)[:, :k]),
    )
