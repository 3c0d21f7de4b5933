"""Neural appearance: a per-Gaussian latent decoded by a small MLP shared by all Gaussians (issue 5).

**Model** (DESIGN §3–4). Gaussian ``g`` has a latent ``z_g`` (L floats, L ≤ 32, default 8). Its colour seen
from a camera at ``campos`` is

    d   = normalize(mean_g − campos)                 (the SH view direction; 0 when mean_g == campos)
    x   = [z_g, d]                                    (L + 3)
    h   = relu(W1 · x + b1)                           W1 (H, L+3), b1 (H,)      H ≤ 64, default 32
    rgb = sigmoid(W2 · h + b2)                        W2 (3, H),   b2 (3,)

so colours lie in (0, 1). The stage replaces SH evaluation and nothing else: the rasterizer is shared.

**Two backends, one function** (the template of every kernel, ``rigel_core.renderer.cuda_backend``). :func:`mlp_colors`
sends CUDA tensors (float32) to the fused kernel of ``csrc/appearance.cu`` through the autograd Function of
``rigel_core.renderer.cuda_backend`` (one thread per Gaussian, weights staged in shared memory; the backward recomputes
the hidden layer and reduces the weight gradients warp → shared memory → one global atomic per weight per
block), and CPU tensors (float32 or float64) to the PyTorch reference :func:`reference_forward`, differentiated
by autograd. :func:`reference_forward` / :func:`reference_backward` are the kernels' twins, checked against an
independent float64 MLP and by gradcheck (tests/test_appearance.py).

**Gradients** reach the latents, the five-tensor MLP (W1, b1, W2, b2) and, through the view direction, the
means (``∂d/∂mean = (I − d dᵀ)/|mean − campos|``; at ``mean == campos`` the direction is the constant 0 and
the means get ``∂L/∂d`` unchanged, as autograd gives for the reference). ``campos`` gets ``−Σ_g ∂L/∂mean_g``.

**Switching** (the viewer's SH/MLP toggle): :func:`to_mlp` distils the model's SH colours into a new
:class:`MLPAppearance` (exact for the direction-averaged colour from the first step, then a short fit of the
view dependence); :func:`to_sh` / :func:`bake_to_sh` fit SH coefficients of a chosen degree to the MLP by
least squares over a fixed Fibonacci sphere of directions (PLY export needs SH).
"""
from __future__ import annotations

import copy
import math
from dataclasses import dataclass

import torch

from .. import config
from .._ext import use_kernels
from ..model import GaussianModel, num_sh_bases, rgb_to_sh

__all__ = ["MAX_LATENT_DIM", "MAX_HIDDEN_DIM", "MLPAppearance", "mlp_colors", "reference_forward",
           "reference_backward", "view_directions", "fibonacci_sphere", "bake_to_sh", "to_sh", "to_mlp",
           "DistillReport"]

#: Limits of the fused kernel (``RIGEL_APPEARANCE_MAX_*`` of csrc/config.h, mirrored by rigel_core.config);
#: the reference enforces them too, so a model trained on the CPU always runs on the GPU.
MAX_LATENT_DIM = config.APPEARANCE_MAX_LATENT
MAX_HIDDEN_DIM = config.APPEARANCE_MAX_HIDDEN

WEIGHT_NAMES = ("W1", "b1", "W2", "b2")


# ---- argument checks (the C++ side repeats them for direct callers of rigel_core._C) -------------------------
def _check_args(latents, means3D, campos, W1, b1, W2, b2):
    tensors = {"latents": latents, "means3D": means3D, "campos": campos, "W1": W1, "b1": b1, "W2": W2, "b2": b2}
    for name, t in tensors.items():
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"mlp_colors: {name} must be a torch.Tensor, got {type(t).__name__}")
        if not t.is_floating_point():
            raise TypeError(f"mlp_colors: {name} must be a floating tensor, got {t.dtype}")
    if latents.dim() != 2:
        raise ValueError(f"mlp_colors: latents must be (N, L), got shape {tuple(latents.shape)}")
    n, L = latents.shape
    if not 1 <= L <= MAX_LATENT_DIM:
        raise ValueError(f"mlp_colors: latent dimension L={L} outside 1..{MAX_LATENT_DIM}")
    if W1.dim() != 2:
        raise ValueError(f"mlp_colors: W1 must be (H, L+3), got shape {tuple(W1.shape)}")
    H = W1.shape[0]
    if not 1 <= H <= MAX_HIDDEN_DIM:
        raise ValueError(f"mlp_colors: hidden width H={H} outside 1..{MAX_HIDDEN_DIM}")
    expect = {"means3D": (means3D, (n, 3)), "campos": (campos, (3,)), "W1": (W1, (H, L + 3)), "b1": (b1, (H,)),
              "W2": (W2, (3, H)), "b2": (b2, (3,))}
    for name, (t, shape) in expect.items():
        if tuple(t.shape) != shape:
            raise ValueError(f"mlp_colors: {name} must have shape {shape} (N={n}, L={L}, H={H}), "
                             f"got {tuple(t.shape)}")
    devices = {t.device for t in tensors.values()}
    if len(devices) != 1:
        raise ValueError(f"mlp_colors: all tensors must be on one device, got {sorted(map(str, devices))}")
    dtypes = {t.dtype for t in tensors.values()}
    if len(dtypes) != 1:
        raise ValueError(f"mlp_colors: all tensors must share one dtype, got {sorted(map(str, dtypes))}")


# ---- the PyTorch reference (twin of csrc/appearance.cu) -------------------------------------------------
def view_directions(means3D: torch.Tensor, campos: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(dirs (N,3), lengths (N,1)): ``dirs = (mean − campos)/|mean − campos|``, 0 where the length is 0
    (same rule as ``rigel_core.reference.sh.sh_colors``)."""
    d = means3D - campos
    length = torch.linalg.norm(d, dim=-1, keepdim=True)
    return d / torch.where(length > 0, length, torch.ones_like(length)), length


def reference_forward(latents, means3D, campos, W1, b1, W2, b2) -> torch.Tensor:
    """(N,3) colours in (0,1) — plain PyTorch, any float dtype and device, differentiable by autograd.

    Args: latents (N,L), means3D (N,3) world units, campos (3,) camera centre, W1 (H,L+3), b1 (H,),
    W2 (3,H), b2 (3,). Input order of W1's columns: the L latent entries, then the direction (x, y, z).

    Cull rule (docs/PIPELINE.md "Non-finite parameters"): a row with a non-finite latent or mean gets the
    colour NaN (the projection culls it by it) and zero gradients; its inputs are replaced before any arithmetic.
    """
    ok, latents, means3D = _finite_rows(latents, means3D, campos)
    dirs, _ = view_directions(means3D, campos)
    x = torch.cat([latents, dirs], dim=-1)
    hidden = torch.relu(x @ W1.T + b1)
    colors = torch.sigmoid(hidden @ W2.T + b2)
    return torch.where(ok[:, None], colors, torch.full_like(colors, float("nan")))


def _finite_rows(latents, means3D, campos):
    """(ok (N,) bool, latents, means3D) with the rows of non-finite latents or means replaced by harmless values
    (latent 0, mean = campos) — the cull of :func:`reference_forward` and :func:`reference_backward`."""
    ok = torch.isfinite(latents).all(-1) & torch.isfinite(means3D).all(-1)
    latents = torch.where(ok[:, None], latents, torch.zeros((), dtype=latents.dtype, device=latents.device))
    means3D = torch.where(ok[:, None], means3D, campos.to(means3D).reshape(1, 3).expand_as(means3D))
    return ok, latents, means3D


def reference_backward(latents, means3D, campos, W1, b1, W2, b2, colors, v_colors, *, need_means: bool = True):
    """Hand-written vector–Jacobian product of :func:`reference_forward`, step for step what the CUDA
    backward computes (it recomputes the hidden layer; the sigmoid's derivative uses the saved ``colors``).

    Args: the forward's inputs, ``colors`` (N,3) its output, ``v_colors`` (N,3) = ∂L/∂colors.
    Returns: ``(v_latents (N,L), v_means3D (N,3) or None, v_W1 (H,L+3), v_b1 (H,), v_W2 (3,H), v_b2 (3,))``.
    ReLU passes gradient where its input is > 0 (0 at exactly 0, as ``torch.relu``).
    """
    L = latents.shape[1]
    ok, latents, means3D = _finite_rows(latents, means3D, campos)  # culled rows: zero gradients
    dirs, length = view_directions(means3D, campos)
    x = torch.cat([latents, dirs], dim=-1)
    pre = x @ W1.T + b1
    hidden = torch.relu(pre)
    v_z = v_colors * colors * (1 - colors)  # through the sigmoid
    ok = ok & torch.isfinite(colors).all(-1)  # a colour that overflowed to NaN was culled too
    v_z = torch.where(ok[:, None], v_z, torch.zeros((), dtype=v_z.dtype, device=v_z.device))
    v_W2 = v_z.T @ hidden
    v_b2 = v_z.sum(0)
    v_pre = (v_z @ W2) * (pre > 0).to(pre.dtype)  # through the ReLU
    v_W1 = v_pre.T @ x
    v_b1 = v_pre.sum(0)
    v_x = v_pre @ W1
    v_means = None
    if need_means:
        v_dir = v_x[:, L:]
        radial = (dirs * v_dir).sum(-1, keepdim=True)
        v_means = (v_dir - dirs * radial) / torch.where(length > 0, length, torch.ones_like(length))
    return v_x[:, :L], v_means, v_W1, v_b1, v_W2, v_b2


def mlp_colors(latents, means3D, campos, W1, b1, W2, b2) -> torch.Tensor:
    """(N,3) MLP colours in (0,1) (module docstring), differentiable with respect to every input.

    Args: latents (N,L) with 1 ≤ L ≤ 32; means3D (N,3) world units; campos (3,) camera centre;
    W1 (H,L+3) with 1 ≤ H ≤ 64 (columns: latent, then direction x, y, z); b1 (H,); W2 (3,H); b2 (3,).
    One device and one floating dtype. Dispatch by device (:func:`rigel_core._ext.use_kernels`, as every op):
    CUDA → the fused kernel (:func:`rigel_core.renderer.cuda_backend.mlp_colors_cuda`, float32 only), CPU →
    :func:`reference_forward` (float32 or float64, differentiated by autograd).
    Raises: TypeError / ValueError naming the argument for a wrong type, shape, size limit, device or dtype
    mix (TypeError for CUDA tensors that are not float32); RuntimeError when CUDA tensors are given and the
    extension is not built.
    """
    _check_args(latents, means3D, campos, W1, b1, W2, b2)
    if use_kernels(latents):
        from .cuda_backend import mlp_colors_cuda

        return mlp_colors_cuda(latents, means3D, campos, W1, b1, W2, b2)
    return reference_forward(latents, means3D, campos, W1, b1, W2, b2)


# ---- the appearance module ------------------------------------------------------------------------------
class MLPAppearance:
    """Per-Gaussian latents and a shared two-layer MLP; plugs into ``GaussianModel.appearance``.

    ``rigel_core.renderer.api.compute_colors`` calls ``model.appearance(model, campos)``, which returns
    :func:`mlp_colors` of this module's tensors at ``model.means3D``.

    Attributes:
        latents (N,L): per-Gaussian, row g belongs to Gaussian g; densification must select/append its rows
            together with the Gaussian parameters (``PER_GAUSSIAN`` names it).
        W1 (H,L+3), b1 (H,), W2 (3,H), b2 (3,): shared (``SHARED``).
    All five share one device and floating dtype. Raises ValueError (via :func:`mlp_colors`'s checks) when
    shapes or limits do not fit.
    """

    PER_GAUSSIAN = ("latents",)
    SHARED = WEIGHT_NAMES

    def __init__(self, latents, W1, b1, W2, b2):
        self.latents, self.W1, self.b1, self.W2, self.b2 = latents, W1, b1, W2, b2
        self.validate()

    def validate(self) -> None:
        """Check shapes, limits, device and dtype (ValueError/TypeError naming the tensor)."""
        campos = torch.zeros(3, dtype=self.latents.dtype, device=self.latents.device)
        means = campos.reshape(1, 3).expand(self.latents.shape[0], 3)
        _check_args(self.latents, means, campos, self.W1, self.b1, self.W2, self.b2)

    @classmethod
    def create(cls, n: int, latent_dim: int = 8, hidden_dim: int = 32, *, dtype=torch.float32, device=None,
               generator: torch.Generator | None = None, latent_std: float = 0.1) -> "MLPAppearance":
        """A freshly initialised module for ``n`` Gaussians: latents ~ N(0, latent_std²); W1 ~ He-normal
        (std √(2/(L+3)), for the ReLU); W2 ~ N(0, 1/H); biases 0 (so colours start near 0.5 grey).
        ``generator`` (CPU) makes it reproducible."""
        L, H = int(latent_dim), int(hidden_dim)
        g = dict(generator=generator, dtype=torch.float64)
        lat = torch.randn(n, L, **g) * latent_std
        W1 = torch.randn(H, L + 3, **g) * math.sqrt(2.0 / (L + 3))
        W2 = torch.randn(3, H, **g) * math.sqrt(1.0 / H)
        conv = lambda t: t.to(dtype=dtype, device=device)
        return cls(conv(lat), conv(W1), conv(torch.zeros(H, dtype=torch.float64)), conv(W2),
                   conv(torch.zeros(3, dtype=torch.float64)))

    # ---- properties -------------------------------------------------------------------------------------
    @property
    def latent_dim(self) -> int:
        return self.latents.shape[1]

    @property
    def hidden_dim(self) -> int:
        return self.W1.shape[0]

    @property
    def num_gaussians(self) -> int:
        return self.latents.shape[0]

    @property
    def device(self) -> torch.device:
        return self.latents.device

    @property
    def dtype(self) -> torch.dtype:
        return self.latents.dtype

    def parameters(self) -> dict:
        """The five tensors by name: ``latents``, ``W1``, ``b1``, ``W2``, ``b2``."""
        return {n: getattr(self, n) for n in self.PER_GAUSSIAN + self.SHARED}

    # ---- evaluation -------------------------------------------------------------------------------------
    def __call__(self, model, campos: torch.Tensor) -> torch.Tensor:
        """(N,3) colours of ``model``'s Gaussians seen from ``campos`` (3,). Raises ValueError when the
        latents do not have one row per Gaussian (e.g. a model pruned without its latents)."""
        means = model.means3D
        if means.shape[0] != self.latents.shape[0]:
            raise ValueError(f"MLPAppearance: {self.latents.shape[0]} latents for {means.shape[0]} Gaussians; "
                             "densification/pruning must select the latents' rows with the Gaussians'")
        campos = torch.as_tensor(campos, dtype=means.dtype, device=means.device).reshape(3)
        return mlp_colors(self.latents, means, campos, self.W1, self.b1, self.W2, self.b2)

    # ---- copies ---------------------------------------------------------------------------------------------
    def to(self, device=None, dtype=None) -> "MLPAppearance":
        """A detached copy on ``device`` / in ``dtype`` (a new object even when nothing changes, so that a
        snapshot never aliases tensors the trainer replaces)."""
        conv = lambda t: t.detach().to(device=device or t.device, dtype=dtype or t.dtype, copy=True)
        return MLPAppearance(*(conv(getattr(self, n)) for n in ("latents",) + WEIGHT_NAMES))

    def subset(self, mask_or_index) -> "MLPAppearance":
        """A detached copy keeping the latents of the selected Gaussians (boolean mask or index tensor)."""
        return MLPAppearance(self.latents.detach()[mask_or_index],
                             *(getattr(self, n).detach().clone() for n in WEIGHT_NAMES))

    # ---- persistence --------------------------------------------------------------------------------------
    def state_tensors(self, prefix: str = "appearance.") -> dict:
        """``{prefix + name: tensor}`` for the five tensors (checkpoints)."""
        return {prefix + n: t for n, t in self.parameters().items()}

    @classmethod
    def from_state_tensors(cls, tensors: dict, prefix: str = "appearance.") -> "MLPAppearance | None":
        """Inverse of :meth:`state_tensors`; None when ``tensors`` holds no ``prefix + "latents"``. Raises
        KeyError naming a missing weight and ValueError for shapes that do not fit."""
        if prefix + "latents" not in tensors:
            return None
        missing = [prefix + n for n in WEIGHT_NAMES if prefix + n not in tensors]
        if missing:
            raise KeyError(f"MLP appearance tensors missing: {missing}")
        return cls(*(tensors[prefix + n] for n in ("latents",) + WEIGHT_NAMES))

    def __repr__(self) -> str:
        return (f"MLPAppearance(N={self.num_gaussians}, L={self.latent_dim}, H={self.hidden_dim}, "
                f"dtype={self.dtype}, device={self.device})")


# ---- directions -------------------------------------------------------------------------------------------
def fibonacci_sphere(n: int, dtype=torch.float64, device=None) -> torch.Tensor:
    """(n,3) near-uniform unit vectors: the spherical Fibonacci lattice (z_i = 1 − (2i+1)/n, longitude
    stepped by the golden angle π(3 − √5)); González, "Measurement of areas on a sphere using Fibonacci and
    latitude–longitude lattices", Math. Geosci. 2010."""
    i = torch.arange(n, dtype=torch.float64)
    z = 1.0 - (2.0 * i + 1.0) / n
    r = torch.sqrt(torch.clamp(1.0 - z * z, min=0.0))
    phi = i * math.pi * (3.0 - math.sqrt(5.0))
    return torch.stack([r * torch.cos(phi), r * torch.sin(phi), z], -1).to(dtype=dtype, device=device)


def _probe(model, direction: torch.Tensor):
    """A shallow copy of ``model`` whose means are ``direction`` (3,) for every Gaussian: evaluated from
    campos = 0, every Gaussian is seen along ``direction`` — how any appearance is sampled at a direction
    through its ``appearance(model, campos)`` seam."""
    probe = copy.copy(model)
    probe.means3D = direction.to(model.means3D).reshape(1, 3).expand(model.num_gaussians, 3)
    return probe


def _sh_colors_at(model, degree: int, direction: torch.Tensor) -> torch.Tensor:
    """(N,3) rendered SH colours of ``model`` along ``direction`` (clamped at 0, as rendering does)."""
    from ..reference.sh import sh_basis

    d = direction.to(model.dtype).to(model.device).reshape(1, 3)
    basis = sh_basis(degree, d)[0]  # (K,)
    coeffs = model.sh_coeffs.detach()[:, : basis.shape[0]]
    return torch.clamp_min(torch.einsum("k,nkc->nc", basis, coeffs) + 0.5, 0.0)


# ---- baking: MLP → SH ---------------------------------------------------------------------------------------
@torch.no_grad()
def bake_to_sh(model, degree: int = 3, *, n_dirs: int = 128) -> tuple[GaussianModel, float]:
    """Fit SH coefficients of ``degree`` to ``model.appearance`` for every Gaussian (PLY export, ``to_sh``).

    Per Gaussian, least squares over the ``n_dirs`` directions ``d_k`` of :func:`fibonacci_sphere`:
    ``min_c Σ_k ‖Y(d_k)·c + 0.5 − colour(d_k)‖²`` (the pre-clamp SH colour against the appearance's
    colour). The design matrix ``Y`` (n_dirs, K) is the same for all Gaussians, so ``c = pinv(Y)·(colour − 0.5)``
    with one float64 pseudo-inverse, applied direction by direction (memory O(N·K), no (N, n_dirs, 3) array).
    The appearance is sampled through its own seam ``appearance(probe, 0)`` with probe means on the unit
    sphere (so any appearance module can be baked), on the model's device (the fused kernel on CUDA).

    Args:
        model: a GaussianModel whose ``appearance`` is not None.
        degree: SH degree 0..3 of the result. n_dirs: directions sampled (≥ (degree+1)², default 128).
    Returns: ``(sh_model, rmse)``: a new GaussianModel (same geometry, detached, ``appearance`` None,
        ``active_sh_degree = degree``) and the RMSE of the fit over all Gaussians, directions and channels
        (colour units; the residual on the sampled directions).
    Raises: ValueError for a model without appearance, a degree outside 0..3 or too few directions.
    """
    if getattr(model, "appearance", None) is None:
        raise ValueError("bake_to_sh: the model has no appearance module to bake (it already uses SH)")
    if not 0 <= degree <= 3:
        raise ValueError(f"bake_to_sh: SH degree must be in 0..3, got {degree}")
    from ..reference.sh import sh_basis

    K = num_sh_bases(degree)
    if n_dirs < K:
        raise ValueError(f"bake_to_sh: {n_dirs} directions cannot determine {K} SH coefficients")
    n, dtype, dev = model.num_gaussians, model.dtype, model.device
    dirs = fibonacci_sphere(n_dirs)
    Y = sh_basis(degree, dirs)  # (D, K) float64
    pinv = torch.linalg.pinv(Y).to(dtype=dtype, device=dev)  # (K, D)
    Yd = Y.to(dtype=dtype, device=dev)
    campos = torch.zeros(3, dtype=dtype, device=dev)
    coeffs = torch.zeros(n, K, 3, dtype=dtype, device=dev)
    for k in range(n_dirs):
        col = model.appearance(_probe(model, dirs[k]), campos).detach()
        coeffs += pinv[:, k].reshape(1, K, 1) * (col - 0.5).unsqueeze(1)
    sq = torch.zeros((), dtype=torch.float64, device=dev)
    for k in range(n_dirs):
        col = model.appearance(_probe(model, dirs[k]), campos).detach()
        fit = torch.einsum("k,nkc->nc", Yd[k], coeffs) + 0.5
        sq += ((fit - col).double() ** 2).sum()
    rmse = math.sqrt(float(sq) / max(1, n * n_dirs * 3))
    out = GaussianModel(model.means3D.detach().clone(), model.log_scales.detach().clone(),
                        model.quats.detach().clone(), model.opacity_logits.detach().clone(),
                        coeffs[:, :1].contiguous(), coeffs[:, 1:].contiguous(), active_sh_degree=degree)
    return out, rmse


def to_sh(model, degree: int = 3, *, n_dirs: int = 128) -> tuple[GaussianModel, float]:
    """Switch to spherical harmonics: :func:`bake_to_sh` when ``model`` has an appearance module; a model
    that already uses SH is returned as it is, with RMSE 0.0. Returns ``(model, rmse)``."""
    if getattr(model, "appearance", None) is None:
        return model, 0.0
    return bake_to_sh(model, degree, n_dirs=n_dirs)


# ---- distillation: SH → MLP -----------------------------------------------------------------------------------
@dataclass
class DistillReport:
    """How well the new MLP reproduces the SH colours: RMSE (colour units) over up to ``eval_gaussians``
    Gaussians × the Fibonacci directions, after the exact initialisation and after the fit (the better of the
    two is kept: ``kept``)."""

    rmse_init: float
    rmse_fit: float
    steps: int
    kept: str  # "fit" or "init"

    @property
    def rmse(self) -> float:
        return min(self.rmse_init, self.rmse_fit)


def _mlp_colors_along(app: MLPAppearance, rows, direction) -> torch.Tensor:
    """(M,3) MLP colours of the latents ``rows`` (index tensor or slice) along ``direction`` (3,)."""
    lat = app.latents[rows]
    means = direction.to(lat).reshape(1, 3).expand(lat.shape[0], 3)
    return mlp_colors(lat, means, torch.zeros(3, dtype=lat.dtype, device=lat.device), app.W1, app.b1, app.W2, app.b2)


@torch.no_grad()
def _distill_rmse(model, app: MLPAppearance, degree: int, rows, dirs) -> float:
    sub = model.subset(rows) if not isinstance(rows, slice) else model
    sq, count = 0.0, 0
    for d in dirs:
        target = _sh_colors_at(sub, degree, d).clamp(0.0, 1.0)
        pred = _mlp_colors_along(app, rows, d)
        sq += float(((pred - target).double() ** 2).sum())
        count += target.numel()
    return math.sqrt(sq / max(1, count))


def to_mlp(model, latent_dim: int = 8, hidden_dim: int = 32, *, steps: int = 200, batch: int = 65536,
           dirs_per_step: int = 8, lr: float = 1e-2, eval_dirs: int = 64, eval_gaussians: int = 65536,
           generator: torch.Generator | None = None) -> tuple[GaussianModel, DistillReport]:
    """Switch to the MLP appearance by distilling the model's current SH colours (the viewer's toggle).

    1. **Exact start.** With ``H ≥ 6`` and ``L ≥ 3``, hidden units 2k and 2k+1 compute relu(±z_k) and W2
       recombines them, so ``rgb_k = sigmoid(z_k)`` exactly; latent k (k < 3) is set to
       ``logit(c̄_k)``, c̄ the Gaussian's rendered SH colour averaged over ``eval_dirs`` Fibonacci directions
       and clamped to [1e-3, 1 − 1e-3]. The remaining hidden units start with random W1 rows and zero W2
       columns (no effect), the remaining latent entries at 0: the scene keeps its direction-averaged colours
       (no black frame), whatever ``steps`` is. Smaller sizes start from :meth:`MLPAppearance.create`.
    2. **Fit.** ``steps`` Adam steps (lr ``lr`` for every tensor) of the mean squared error against the SH
       colour (clamped to [0, 1]) on ``batch`` random Gaussians × ``dirs_per_step`` random directions;
       skipped when the SH colours do not depend on the direction (active degree 0, or zero higher bands,
       as for a freshly initialised model), where step 1 is already exact. What the fit can learn is view
       dependence shared across Gaussians (measured: RMSE 0.09–0.16 → 0.02–0.03 in 50 steps for one random
       degree-1 band common to all); random per-Gaussian view dependence mostly exceeds an 8-float latent
       (measured: RMSE 0.033 → 0.031 after 200 steps for 0.03-std random degree-3 bands).
    3. The RMSE over ``eval_gaussians`` fixed Gaussians × ``eval_dirs`` Fibonacci directions is measured
       after 1 and 2; the better state is kept (reported in the :class:`DistillReport`).

    The returned model shares nothing with ``model``: same geometry (detached copies), SH reduced to degree 0
    holding the direction-averaged colour (a sensible flat-colour fallback; the MLP is what renders),
    ``appearance`` the new :class:`MLPAppearance` in the model's dtype and device (fits run there: the kernel
    on CUDA). A model that already has an appearance module is returned unchanged (report with zeros).

    Returns: ``(mlp_model, report)``. Raises ValueError for sizes outside 1..32 / 1..64.
    """
    if getattr(model, "appearance", None) is not None:
        return model, DistillReport(0.0, 0.0, 0, "init")
    L, H = int(latent_dim), int(hidden_dim)
    if not 1 <= L <= MAX_LATENT_DIM or not 1 <= H <= MAX_HIDDEN_DIM:
        raise ValueError(f"to_mlp: latent_dim must be in 1..{MAX_LATENT_DIM} and hidden_dim in 1..{MAX_HIDDEN_DIM}, "
                         f"got {L}, {H}")
    n, dtype, dev = model.num_gaussians, model.dtype, model.device
    degree = model.active_sh_degree
    gen = generator if generator is not None else torch.Generator().manual_seed(0)
    fib = fibonacci_sphere(eval_dirs)

    with torch.no_grad():
        mean_rgb = torch.zeros(n, 3, dtype=dtype, device=dev)
        for d in fib:
            mean_rgb += _sh_colors_at(model, degree, d)
        mean_rgb = (mean_rgb / eval_dirs).clamp(1e-3, 1 - 1e-3)
        app = MLPAppearance.create(n, L, H, dtype=dtype, device=dev, generator=gen)
        if H >= 6 and L >= 3:
            app.latents.zero_()
            app.latents[:, :3] = torch.logit(mean_rgb)
            app.W1[:6].zero_()
            app.W2.zero_()
            for k in range(3):
                app.W1[2 * k, k], app.W1[2 * k + 1, k] = 1.0, -1.0
                app.W2[k, 2 * k], app.W2[k, 2 * k + 1] = 1.0, -1.0
            app.b1.zero_()
            app.b2.zero_()
    eval_rows = slice(None) if n <= eval_gaussians else \
        torch.randperm(n, generator=gen)[:eval_gaussians].sort().values.to(dev)
    rmse_init = _distill_rmse(model, app, degree, eval_rows, fib) if n else 0.0
    init_state = app.to()

    k_rest = num_sh_bases(degree) - 1
    if degree == 0 or n == 0 or not bool(model.sh_rest.detach()[:, :k_rest].abs().max() > 0):
        steps = 0  # view-independent colours: the exact start is already exact
    if steps > 0:
        params = [t.requires_grad_(True) for t in app.parameters().values()]
        opt = torch.optim.Adam(params, lr=lr)
        coeffs = model.sh_coeffs.detach()
        from ..reference.sh import sh_basis

        for _ in range(int(steps)):
            rows = torch.randint(0, n, (min(batch, n),), generator=gen).to(dev)
            dirs = torch.randn(dirs_per_step, 3, generator=gen, dtype=torch.float64)
            dirs = dirs / dirs.norm(dim=-1, keepdim=True)
            basis = sh_basis(degree, dirs).to(dtype=dtype, device=dev)  # (S, K)
            target = torch.einsum("sk,mkc->smc", basis, coeffs[rows, : basis.shape[1]]).add(0.5).clamp(0.0, 1.0)
            lat = app.latents[rows].unsqueeze(0).expand(dirs_per_step, -1, -1).reshape(-1, L)
            means = dirs.to(dtype=dtype, device=dev).unsqueeze(1).expand(-1, rows.shape[0], -1).reshape(-1, 3)
            pred = mlp_colors(lat, means, torch.zeros(3, dtype=dtype, device=dev), app.W1, app.b1, app.W2, app.b2)
            loss = ((pred - target.reshape(-1, 3)) ** 2).mean()
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
        app = app.to()  # detached leaves, optimizer state dropped
    fitted = steps > 0
    rmse_fit = _distill_rmse(model, app, degree, eval_rows, fib) if fitted else rmse_init
    kept = "fit" if fitted else "init"
    if rmse_fit > rmse_init:
        app, kept = init_state, "init"

    out = GaussianModel(model.means3D.detach().clone(), model.log_scales.detach().clone(),
                        model.quats.detach().clone(), model.opacity_logits.detach().clone(),
                        rgb_to_sh(mean_rgb).unsqueeze(1).contiguous(),
                        torch.zeros(n, 0, 3, dtype=dtype, device=dev), active_sh_degree=0)
    out.appearance = app
    return out, DistillReport(rmse_init, rmse_fit, int(steps), kept)
