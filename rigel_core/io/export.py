"""Scene export: :func:`save_scene` picks the writer from the file name, and the helpers the writers share.

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

import math
import os
from dataclasses import dataclass

import numpy as np
import torch

from ..config import SH_C0
from ..model import GaussianModel

__all__ = ["save_scene", "bake_for_export", "EXPORT_SH_DEGREE", "format_for_path", "ExportError", "EXPORT_FORMATS", "roundtrip_errors", "RoundTripErrors",
           "finite_mask"]

#: format name → (suffix, description). ``.compressed.ply`` is tested before ``.ply``.
EXPORT_FORMATS = {
    "compressed_ply": (".compressed.ply", "PlayCanvas / SuperSplat compressed PLY"),
    "ply": (".ply", "INRIA / graphdeco 3DGS PLY"),
    "spz": (".spz", "Niantic SPZ"),
    "splat": (".splat", "antimatter15 .splat"),
}


class ExportError(ValueError):
    """A model that a format cannot store as asked (non-finite values, positions out of the fixed-point range,
    an unknown suffix). ``str(err)`` is ``"<path>: <problem>"``."""

    def __init__(self, path, problem: str):
        self.path = os.fspath(path) if path is not None else "<stream>"
        self.problem = problem
        super().__init__(f"{self.path}: {problem}")


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
    into SH of ``degree`` (default :data:`EXPORT_SH_DEGREE`) first (:func:`rigel_core.appearance.to_sh`:
    per-Gaussian least squares over 128 view directions; ``rmse`` in colour units); an SH model is returned as
    it is with rmse 0.0. The one place of the rule "bake the MLP, then save" (rigel-train, the viewer)."""
    from ..appearance import to_sh

    baked, rmse = to_sh(model, EXPORT_SH_DEGREE if degree is None else int(degree))
    # the render mode and a mip model's 3D filter travel with it (save_ply bakes the filter and writes the mode)
    baked.render_mode = getattr(model, "render_mode", "default")
    baked.filter_3D = getattr(model, "filter_3D", None)
    return baked, float(rmse)


# ---------------------------------------------------------------------------------------------------------
# Shared by the writers
# ---------------------------------------------------------------------------------------------------------
def finite_mask(model: GaussianModel) -> torch.Tensor:
    """(N,) bool: the Gaussians whose parameters are all finite."""
    n = model.num_gaussians
    ok = torch.ones(n, dtype=torch.bool, device=model.device)
    for t in model.parameters().values():
        ok &= torch.isfinite(t.detach().reshape(n, t[0].numel() if n else 0)).all(dim=1)
    return ok


@dataclass
class ModelArrays:
    """float64 numpy copies of a model's parameters (quaternions normalised, w ≥ 0 not enforced)."""
    means: np.ndarray       # (N, 3)
    log_scales: np.ndarray  # (N, 3)
    quats: np.ndarray       # (N, 4) (w, x, y, z), unit norm; a zero quaternion becomes the identity
    opacity_logits: np.ndarray  # (N,)
    sh_dc: np.ndarray       # (N, 3)
    sh_rest: np.ndarray     # (N, K-1, 3)

    @property
    def n(self) -> int:
        return self.means.shape[0]


def model_arrays(model: GaussianModel, path, what: str, sh_degree: int | None = None) -> ModelArrays:
    """The parameters a writer quantises, as float64 numpy arrays, SH truncated (or zero-padded) to
    ``sh_degree``. Raises ExportError naming ``path`` when any Gaussian has a NaN/Inf parameter (no lossy
    format can store one) or ``sh_degree`` is outside 0..3."""
    if sh_degree is not None:
        if sh_degree not in (0, 1, 2, 3):
            raise ExportError(path, f"SH degree {sh_degree} asked; 0-3 are supported")
        model = model.with_sh_degree(sh_degree)
    n = model.num_gaussians
    bad = int((~finite_mask(model)).sum())
    if bad:
        raise ExportError(path, f"{bad} of {n} Gaussians have NaN or Inf parameters, which {what} cannot store; "
                                f"drop them first (rigel-convert drops them and says so)")
    get = lambda t: t.detach().to(device="cpu", dtype=torch.float64).numpy()
    q = get(model.quats).reshape(n, 4).copy()
    norm = np.linalg.norm(q, axis=1)
    zero = ~(norm > 0)
    q[zero] = (1.0, 0.0, 0.0, 0.0)
    norm[zero] = 1.0
    q /= norm[:, None]
    return ModelArrays(get(model.means3D).reshape(n, 3), get(model.log_scales).reshape(n, 3), q,
                       get(model.opacity_logits).reshape(n), get(model.sh_dc).reshape(n, 3),
                       get(model.sh_rest).reshape(n, model.sh_rest.shape[1], 3))


def sigmoid(x: np.ndarray) -> np.ndarray:
    """Overflow-free logistic function."""
    return 0.5 * (1.0 + np.tanh(0.5 * x))


def round_clamp_u8(x: np.ndarray) -> np.ndarray:
    """Round half away from zero (C's ``round``, as the SPZ reference does) and clamp to 0..255 → uint8."""
    r = np.sign(x) * np.floor(np.abs(x) + 0.5)
    return np.clip(r, 0, 255).astype(np.uint8)


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


def position_bits_fit(means: np.ndarray, fractional_bits: int) -> bool:
    """True when every coordinate rounds into a 24-bit two's-complement fixed-point number."""
    if means.size == 0:
        return True
    m = float(np.abs(means).max()) * (1 << fractional_bits)
    return math.floor(m + 0.5) <= (1 << 23) - 1
