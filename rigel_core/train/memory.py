"""What a training run needs of the device's memory at least, against what the device has (issue 37 item 4).

``rigel-train`` calls :func:`memory_problem` before the first step: a capture or a Gaussian budget that cannot fit
is refused in one line (what it needs against what the device has, exit status 2), instead of failing mid-run. The
device is the GPU, or with ``--device cpu`` the host (its available memory). With ``--preload-frames`` it first
calls :func:`preload_problem`, from the image headers alone: the decoded capture is held in host memory whatever the
device, and one that cannot fit it was killed by the system while loading.

The estimate is a **floor**, so that a run that could fit is never refused:

- Gaussians: ``max_gaussians`` (the resolved budget: a run never holds more) × :func:`bytes_per_gaussian_floor` —
  every per-Gaussian parameter in float32 four times (the value, its gradient, Adam's two moments) plus the
  densification statistics (three float32). The per-step buffers (projection, binning, their gradients) come on
  top; ``bench/gaussian_memory.py`` measures the whole per-Gaussian cost beside gsplat's loop.
- Images: streamed frames (:mod:`rigel_core.data.stream`, the default) hold the current view and the few loaded
  ahead (``DEFAULT_AHEAD + 1`` of the largest training view, plus one held-out view while evaluating); preloaded
  ones every training view (image float32, mask bool) and, with coarse-to-fine, its largest coarse level — on the
  CPU only that coarse level: the preloaded views already lie in host memory when the check runs, and the trainer
  trains on those very tensors (counting them again against what the host has left refused runs that fit).
- The render of the largest view: image, transmittance and contributor count with their gradients.

What the device has: free memory plus what this process's allocator already holds (``torch.cuda.mem_get_info``,
``memory_reserved``); on the CPU the host's available memory (Linux ``MemAvailable``: :func:`host_memory`; nothing is
checked where it cannot be read). An "auto" MCMC budget or a ``--max-gaussians`` cap of the default strategy counts
in full (a run may grow to it): a CPU run with the default 3,000,000 cap needs about 2.9 GB available.
"""
from __future__ import annotations

__all__ = ["bytes_per_gaussian_floor", "training_memory", "device_memory", "host_memory", "memory_problem",
           "preload_problem"]

#: float32 copies of each per-Gaussian parameter during training: the value, its gradient, Adam's m and v
COPIES = 4
#: float32 densification statistics per Gaussian (gradient sum, count, largest screen radius)
STATS_FLOATS = 3


def bytes_per_gaussian_floor(sh_degree: int = 3, appearance: str = "sh", latent_dim: int = 8) -> int:
    """Bytes one Gaussian holds at least while training: its parameters (means 3, log-scales 3, quaternion 4,
    opacity 1, and 3·(degree+1)² SH coefficients — or ``latent_dim`` latents for the MLP appearance) in float32 ×
    :data:`COPIES`, plus :data:`STATS_FLOATS` float32 of statistics. 956 bytes at SH degree 3."""
    colour = int(latent_dim) if appearance == "mlp" else 3 * (int(sh_degree) + 1) ** 2
    return 4 * (COPIES * (11 + colour) + STATS_FLOATS)


def _view_bytes(width: int, height: int, masked: bool = True) -> int:
    """A view's image (float32 RGB) and mask (bool) on the device."""
    return width * height * (12 + (1 if masked else 0))


def training_memory(train_frames, test_frames, cfg, *, streamed: bool, n_gaussians: int | None = None,
                    held: bool = False) -> dict:
    """``{"gaussians", "images", "render", "total"}`` bytes a run of ``cfg`` on these frames needs at least
    (module docstring). Frames: anything with ``.camera`` (width, height); nothing is decoded. ``n_gaussians``:
    the count to plan for (default ``cfg.max_gaussians``, the budget). ``held``: preloaded (not ``streamed``)
    frames that already lie in the device's memory (on the CPU), so that only their first coarse level is to come."""
    from ..data.stream import DEFAULT_AHEAD

    n = int(n_gaussians if n_gaussians is not None else (cfg.max_gaussians or 0))
    per = bytes_per_gaussian_floor(cfg.sh_degree, cfg.appearance, cfg.mlp_latent_dim)
    sizes = [(f.camera.width, f.camera.height) for f in train_frames]
    largest = max((w * h for w, h in sizes), default=0)
    test_largest = max((f.camera.width * f.camera.height for f in test_frames), default=0)
    if streamed:
        images = (DEFAULT_AHEAD + 1) * 13 * largest + 13 * test_largest
    else:
        images = 0 if held else sum(_view_bytes(w, h) for w, h in sizes)
        factor = cfg.coarse_to_fine if isinstance(cfg.coarse_to_fine, int) else 1
        if factor > 1:  # the first coarse level beside the full set
            images += sum(_view_bytes(max(1, w // factor), max(1, h // factor)) for w, h in sizes)
    render = 2 * 4 * 5 * max(largest, test_largest)  # image (3), final_T, n_contrib; and their gradients
    out = {"gaussians": n * per, "images": int(images), "render": int(render), "per_gaussian": per,
           "n_gaussians": n}
    out["total"] = out["gaussians"] + out["images"] + out["render"]
    return out


def host_memory() -> int | None:
    """Bytes of host memory available to new allocations (:func:`~rigel_core.data.stream.available_host_bytes`), or
    None where that cannot be read."""
    from ..data.stream import available_host_bytes

    return available_host_bytes()


def device_memory(device) -> int | None:
    """Bytes of memory this process can use on ``device``: on a GPU its free memory plus what the allocator holds
    already; on the CPU :func:`host_memory` (None where unknown)."""
    import torch

    device = torch.device(device)
    if device.type != "cuda":
        return host_memory()
    free, _total = torch.cuda.mem_get_info(device)
    return int(free) + int(torch.cuda.memory_reserved(device))


def _gb(n: int) -> str:
    """Bytes in GB, or in TB from 1,000 GB on (a refused budget of 10^12 Gaussians reads "956.0 TB", not
    "956,000.0 GB")."""
    return f"{n / 1e12:,.1f} TB" if n >= 1e12 else f"{n / 1e9:,.1f} GB"


def memory_problem(need: dict, device, *, streamed: bool, have: int | None = None) -> str | None:
    """One line saying that ``need`` (:func:`training_memory`) does not fit ``device`` — what it needs, made of
    what, against what the device has, and what to change —, or None when it fits or what the device has is
    unknown. ``have``: the bytes available (default :func:`device_memory`: the GPU's, or the host's for a CPU)."""
    have = device_memory(device) if have is None else have
    if have is None or need["total"] <= have:
        return None
    hint = []
    if need["gaussians"] > have // 2:
        hint.append("a smaller --max-gaussians")
    if need["images"] > have // 4:
        hint.append("streamed frames (leave out --preload-frames)" if not streamed else "a larger --downscale")
    gpu = str(device).startswith("cuda")
    return (f"this run needs at least {_gb(need['total'])} of {'GPU' if gpu else 'host'} memory "
            f"({need['n_gaussians']:,} Gaussians x {need['per_gaussian']} B = {_gb(need['gaussians'])}, images "
            f"{_gb(need['images'])}, render {_gb(need['render'])}) but {device if gpu else 'the host'} has "
            f"{_gb(have)} available"
            + (f": try {' or '.join(hint)}" if hint else ""))


def preload_problem(frames, have: int | None = None) -> str | None:
    """One line saying that ``--preload-frames`` cannot hold ``frames`` in host memory — the bytes the preloaded
    frames take (:meth:`~rigel_core.data.stream.FrameSource.preloaded_bytes`: float32 images, alphas, masks) against
    ``have`` (default :func:`host_memory`) —, or None when they fit or the memory is unknown. ``frames``: the
    capture's frames streamed (``load_dataset(..., stream=True)``: headers only, nothing decoded)."""
    sources = {id(f.source): f.source for f in frames if hasattr(f, "source")}
    need = sum(src.preloaded_bytes() for src in sources.values())
    have = host_memory() if have is None else have
    if have is None or need <= have:
        return None
    return (f"--preload-frames: the {len(frames)} images take {_gb(need)} decoded (float32) but the host has "
            f"{_gb(have)} available: leave out --preload-frames (streamed frames keep a bounded host cache, "
            "--frame-cache-mb)")
