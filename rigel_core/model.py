"""The Gaussian scene model: parameters stored pre-activation (DESIGN §3).

| parameter | shape | activation |
|---|---|---|
| ``means3D`` | (N, 3) | none (world units) |
| ``log_scales`` | (N, 3) | ``scales = exp(log_scales)`` (standard deviations, world units) |
| ``quats`` | (N, 4) (w, x, y, z) | normalised in the forward pass |
| ``opacity_logits`` | (N,) | ``opacities = sigmoid(opacity_logits)`` |
| ``sh_dc`` | (N, 1, 3) | SH degree-0 coefficient per channel |
| ``sh_rest`` | (N, K−1, 3) | higher-order SH coefficients, K = (degree+1)² |

All tensors share one device and one floating dtype (float32 or float64).
"""
from __future__ import annotations

import math

import torch

from .config import SH_C0

__all__ = ["GaussianModel", "num_sh_bases", "sh_degree_from_bases", "rgb_to_sh", "sh_to_rgb"]

PARAM_NAMES = ("means3D", "log_scales", "quats", "opacity_logits", "sh_dc", "sh_rest")


def _finite_or_nan(x: torch.Tensor, activation) -> torch.Tensor:
    """``activation(x)`` where x is finite, NaN elsewhere; the activation sees 0 there, so the gradient of a
    non-finite entry is exactly 0 (a ``where`` after the activation would give 0·Inf = NaN)."""
    ok = torch.isfinite(x)
    y = activation(torch.where(ok, x, torch.zeros((), dtype=x.dtype, device=x.device)))
    return torch.where(ok, y, torch.full((), float("nan"), dtype=y.dtype, device=y.device))


def num_sh_bases(degree: int) -> int:
    """K = (degree + 1)² SH coefficients per channel."""
    return (degree + 1) ** 2


def sh_degree_from_bases(k: int) -> int:
    """Inverse of :func:`num_sh_bases`; raises ValueError when k is not 1, 4, 9 or 16."""
    d = int(round(math.sqrt(k))) - 1
    if d < 0 or d > 3 or (d + 1) ** 2 != k:
        raise ValueError(f"{k} SH coefficients per channel is not (degree+1)^2 for a degree 0..3")
    return d


def rgb_to_sh(rgb):
    """DC coefficient whose colour (before the +0.5 offset) is ``rgb``: (rgb − 0.5) / C0."""
    return (rgb - 0.5) / SH_C0


def sh_to_rgb(sh):
    return sh * SH_C0 + 0.5


class GaussianModel:
    """A set of N anisotropic 3D Gaussians with SH appearance (degree 0–3).

    Construct with :meth:`from_tensors`, :meth:`from_points` or a loader (``rigel_core.io.load_scene``).
    ``active_sh_degree`` (≤ ``sh_degree``) is what rendering evaluates; the trainer raises it over time.

    Raises:
        ValueError: inconsistent shapes, dtypes or devices, or an SH degree outside 0..3.
    """

    def __init__(self, means3D, log_scales, quats, opacity_logits, sh_dc, sh_rest, *, active_sh_degree=None):
        self.means3D = means3D
        self.log_scales = log_scales
        self.quats = quats
        self.opacity_logits = opacity_logits
        self.sh_dc = sh_dc
        self.sh_rest = sh_rest
        self.validate()
        self.active_sh_degree = self.sh_degree if active_sh_degree is None else int(active_sh_degree)
        #: optional appearance module (e.g. the fused MLP); None means spherical harmonics.
        self.appearance = None
        # anti-aliased mode (issue 17, rigel_core/renderer/mip.py): how ``render`` draws this model by default
        # ("default" or "mip", read from / written to the PLY header), and the 3D smoothing filter's per-Gaussian variances (N,)
        # (world units², not trained; None = no 3D filter, e.g. a loaded PLY whose filter is baked in)
        self.render_mode = "default"
        self.filter_3D: torch.Tensor | None = None

    # ---- construction -------------------------------------------------------------------------------
    @classmethod
    def from_tensors(cls, means3D, log_scales, quats, opacity_logits, sh_dc, sh_rest=None, **kw) -> "GaussianModel":
        means3D = torch.as_tensor(means3D)
        dtype, device = means3D.dtype if means3D.is_floating_point() else torch.float32, means3D.device
        conv = lambda x: torch.as_tensor(x, dtype=dtype, device=device)
        sh_dc = conv(sh_dc)
        if sh_dc.dim() == 2:
            sh_dc = sh_dc[:, None, :]
        if sh_rest is None:
            sh_rest = torch.zeros(sh_dc.shape[0], 0, 3, dtype=dtype, device=device)
        return cls(conv(means3D), conv(log_scales), conv(quats), conv(opacity_logits).reshape(-1), sh_dc,
                   conv(sh_rest), **kw)

    @classmethod
    def from_points(cls, points, colors=None, *, sh_degree: int = 3, scale: float | torch.Tensor | None = None,
                    opacity: float = 0.1, dtype=torch.float32, device=None) -> "GaussianModel":
        """Isotropic Gaussians at ``points`` (N,3) with RGB ``colors`` in [0,1] (N,3) (grey if None).

        ``scale`` defaults to the mean distance to the 3 nearest neighbours (computed in chunks).
        """
        pts = torch.as_tensor(points, dtype=dtype, device=device)
        n = pts.shape[0]
        if colors is None:
            colors = torch.full((n, 3), 0.5, dtype=dtype, device=device)
        colors = torch.as_tensor(colors, dtype=dtype, device=device)
        if scale is None:
            scale = knn_mean_distance(pts, k=3).clamp_min(1e-7)
        scale = torch.as_tensor(scale, dtype=dtype, device=device)
        log_scales = torch.log(scale).reshape(-1, 1).expand(n, 3).clone() if scale.dim() <= 1 else torch.log(scale)
        if log_scales.shape[0] != n:
            log_scales = log_scales.expand(n, 3).clone()
        quats = torch.zeros(n, 4, dtype=dtype, device=device)
        quats[:, 0] = 1
        logits = torch.full((n,), math.log(opacity / (1 - opacity)), dtype=dtype, device=device)
        sh_dc = rgb_to_sh(colors)[:, None, :]
        sh_rest = torch.zeros(n, num_sh_bases(sh_degree) - 1, 3, dtype=dtype, device=device)
        return cls(pts, log_scales, quats, logits, sh_dc, sh_rest)

    def validate(self) -> None:
        n = self.means3D.shape[0] if self.means3D.dim() == 2 else -1
        expect = {"means3D": (n, 3), "log_scales": (n, 3), "quats": (n, 4), "opacity_logits": (n,)}
        for name, shape in expect.items():
            t = getattr(self, name)
            if tuple(t.shape) != shape:
                raise ValueError(f"GaussianModel.{name}: expected shape {shape}, got {tuple(t.shape)}")
        if self.sh_dc.shape != (n, 1, 3):
            raise ValueError(f"GaussianModel.sh_dc: expected shape ({n}, 1, 3), got {tuple(self.sh_dc.shape)}")
        if self.sh_rest.dim() != 3 or self.sh_rest.shape[0] != n or self.sh_rest.shape[2] != 3:
            raise ValueError(f"GaussianModel.sh_rest: expected shape ({n}, K-1, 3), got {tuple(self.sh_rest.shape)}")
        sh_degree_from_bases(self.sh_rest.shape[1] + 1)
        dtypes = {getattr(self, p).dtype for p in PARAM_NAMES}
        devices = {getattr(self, p).device for p in PARAM_NAMES}
        if len(dtypes) != 1 or not next(iter(dtypes)).is_floating_point:
            raise ValueError(f"GaussianModel parameters must share one floating dtype, got {dtypes}")
        if len(devices) != 1:
            raise ValueError(f"GaussianModel parameters must share one device, got {devices}")

    # ---- activations and derived quantities ---------------------------------------------------------
    def __len__(self) -> int:
        return self.means3D.shape[0]

    @property
    def num_gaussians(self) -> int:
        return self.means3D.shape[0]

    @property
    def sh_degree(self) -> int:
        return sh_degree_from_bases(self.sh_rest.shape[1] + 1)

    @property
    def device(self) -> torch.device:
        return self.means3D.device

    @property
    def dtype(self) -> torch.dtype:
        return self.means3D.dtype

    @property
    def scales(self) -> torch.Tensor:
        """(N,3) standard deviations, ``exp(log_scales)``; NaN where a log-scale is non-finite (±Inf too: exp(−Inf)
        = 0 would be drawn as a point), so the projection culls that Gaussian (docs/PIPELINE.md "Non-finite
        parameters"); its gradient there is 0."""
        return _finite_or_nan(self.log_scales, torch.exp)

    @property
    def opacities(self) -> torch.Tensor:
        """(N,) opacities in (0, 1), ``sigmoid(opacity_logits)``; NaN where a logit is non-finite (sigmoid(+Inf) = 1
        would be drawn), so the projection culls that Gaussian (docs/PIPELINE.md "Non-finite parameters")."""
        return _finite_or_nan(self.opacity_logits, torch.sigmoid)

    @property
    def sh_coeffs(self) -> torch.Tensor:
        """(N, K, 3) all SH coefficients, DC first."""
        return torch.cat([self.sh_dc, self.sh_rest], dim=1)

    def parameters(self) -> dict:
        """The six parameter tensors by name."""
        return {p: getattr(self, p) for p in PARAM_NAMES}

    def bounds(self, quantile: float = 0.0):
        """(min (3,), max (3,)) of the finite means; with ``quantile`` > 0 robust to outliers."""
        m = self.means3D.detach()
        m = m[torch.isfinite(m).all(-1)]
        if m.shape[0] == 0:
            z = torch.zeros(3, dtype=self.dtype, device=self.device)
            return z, z.clone()
        if quantile > 0:
            # torch.quantile refuses inputs over 2**24 elements: a regular stride of at most 1M rows is plenty
            m = m[:: max(1, m.shape[0] // 1_000_000)]
            q = torch.tensor([quantile, 1 - quantile], dtype=m.dtype, device=m.device)
            lohi = torch.quantile(m, q, dim=0)
            return lohi[0], lohi[1]
        return m.min(0).values, m.max(0).values

    def center(self) -> torch.Tensor:
        """(3,) centre of the robust (1 %–99 %) bounding box of the finite means; the origin when there is none
        (0 Gaussians, or none with a finite mean), the mean itself for one Gaussian."""
        lo, hi = self.bounds(0.01)
        return 0.5 * (lo + hi)

    def extent(self) -> float:
        """Half-diagonal of the robust bounding box (world units); 0.0 for fewer than two distinct finite means
        (callers that divide by it need a floor — the viewer frames such scenes by the splats' scales)."""
        lo, hi = self.bounds(0.01)
        return float(0.5 * torch.linalg.norm(hi - lo))

    def to(self, device=None, dtype=None) -> "GaussianModel":
        """A copy on ``device`` / in ``dtype`` (detached; the appearance module too, when it has ``to``)."""
        # copy=True: without it ``.to`` of a tensor already on that device and dtype returns the same storage, and
        # a "copy" (Trainer.snapshot, the viewer's published model) would change under Adam's in-place steps
        conv = lambda t: t.detach().to(device=device or t.device, dtype=dtype or t.dtype, copy=True)
        out = GaussianModel(*(conv(getattr(self, p)) for p in PARAM_NAMES), active_sh_degree=self.active_sh_degree)
        # an appearance module with its own tensors (MLPAppearance) is copied alongside, never aliased
        app = self.appearance
        out.appearance = app.to(device=device, dtype=dtype) if hasattr(app, "to") else app
        out.render_mode = self.render_mode
        out.filter_3D = None if self.filter_3D is None else conv(self.filter_3D)
        return out

    def detach(self) -> "GaussianModel":
        return self.to()

    def subset(self, mask_or_index) -> "GaussianModel":
        """The Gaussians selected by a boolean mask or index tensor (detached; with the appearance module's
        per-Gaussian rows when it has ``subset``)."""
        out = GaussianModel(*(getattr(self, p).detach()[mask_or_index] for p in PARAM_NAMES),
                            active_sh_degree=self.active_sh_degree)
        app = self.appearance  # per-Gaussian rows of an appearance module (MLP latents) follow the selection
        out.appearance = app.subset(mask_or_index) if hasattr(app, "subset") else app
        out.render_mode = self.render_mode
        out.filter_3D = None if self.filter_3D is None else self.filter_3D.detach()[mask_or_index]
        return out

    def with_sh_degree(self, degree: int) -> "GaussianModel":
        """A copy truncated or zero-padded to SH ``degree``."""
        k = num_sh_bases(degree) - 1
        rest = self.sh_rest.detach()
        if rest.shape[1] >= k:
            rest = rest[:, :k]
        else:
            rest = torch.cat([rest, rest.new_zeros(rest.shape[0], k - rest.shape[1], 3)], 1)
        out = GaussianModel(self.means3D.detach(), self.log_scales.detach(), self.quats.detach(),
                            self.opacity_logits.detach(), self.sh_dc.detach(), rest,
                            active_sh_degree=min(self.active_sh_degree, degree))
        out.render_mode, out.filter_3D = self.render_mode, self.filter_3D
        return out

    def __repr__(self) -> str:
        return (f"GaussianModel(N={self.num_gaussians}, sh_degree={self.sh_degree}, "
                f"dtype={self.dtype}, device={self.device})")


def knn_distances(points: torch.Tensor, k: int = 3):
    """(N, min(k, N−1)) float64 numpy distances of each point to its nearest other points, nearest first
    (scipy's cKDTree in float64); None for N ≤ 1."""
    from scipy.spatial import cKDTree

    n = points.shape[0]
    if n <= 1:
        return None
    p = points.detach().cpu().double().numpy()
    d, _ = cKDTree(p).query(p, k=min(k, n - 1) + 1)
    return d[:, 1:]


def knn_mean_distance(points: torch.Tensor, k: int = 3) -> torch.Tensor:
    """(N,) mean Euclidean distance of each point to its ``k`` nearest other points (:func:`knn_distances`);
    1 for a single point."""
    d = knn_distances(points, k)
    if d is None:
        return torch.ones(points.shape[0], dtype=points.dtype, device=points.device)
    return torch.as_tensor(d.mean(-1), dtype=points.dtype, device=points.device)
