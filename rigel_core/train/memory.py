"""What a training run needs of the GPU's memory at least, against what the GPU has (issue 37 item 4).

``rigel-train`` calls :func:`memory_problem` before the first step: a capture or a Gaussian budget that cannot fit
is refused in one line (what it needs against what the device has, exit status 2), instead of failing mid-run.

The estimate is a **floor**, so that a run that could fit is never refused:

- Gaussians: ``max_gaussians`` (the resolved budget: a run never holds more) × :func:`bytes_per_gaussian_floor` —
  every per-Gaussian parameter in float32 four times (the value, its gradient, Adam's two moments) plus the
  densification statistics (three float32). The per-step buffers (projection, binning, their gradients) come on
  top; ``bench/gaussian_memory.py`` measures the whole per-Gaussian cost beside gsplat's loop.
- Images: streamed frames (:mod:`rigel_core.data.stream`, the default) hold the current view and the few loaded
  ahead (``DEFAULT_AHEAD + 1`` of the largest training view, plus one held-out view while evaluating); preloaded
  ones every training view (image float32, mask bool) and, with coarse-to-fine, its largest coarse level.
- The render of the largest view: image, transmittance and contributor count with their gradients.

What the device has: free memory plus what this process's allocator already holds (``torch.cuda.mem_get_info``,
``memory_reserved``); None on the CPU (nothing is checked there).
"""
from __future__ import annotations

__all__ = ["bytes_per_gaussian_floor", "training_memory", "device_memory", "memory_problem"]

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


def training_memory(train_frames, test_frames, cfg, *, streamed: bool, n_gaussians: int | None = None) -> dict:
    """``{"gaussians", "images", "render", "total"}`` bytes a run of ``cfg`` on these frames needs at least
    (module docstring). Frames: anything with ``.camera`` (width, height); nothing is decoded. ``n_gaussians``:
    the count to plan for (default ``cfg.max_gaussians``, the budget)."""
    from ..data.stream import DEFAULT_AHEAD

    n = int(n_gaussians if n_gaussians is not None else (cfg.max_gaussians or 0))
    per = bytes_per_gaussian_floor(cfg.sh_degree, cfg.appearance, cfg.mlp_latent_dim)
    sizes = [(f.camera.width, f.camera.height) for f in train_frames]
    largest = max((w * h for w, h in sizes), default=0)
    test_largest = max((f.camera.width * f.camera.height for f in test_frames), default=0)
    if streamed:
        images = (DEFAULT_AHEAD + 1) * 13 * largest + 13 * test_largest
    else:
        images = sum(_view_bytes(w, h) for w, h in sizes)
        factor = cfg.coarse_to_fine if isinstance(cfg.coarse_to_fine, int) else 1
        if factor > 1:  # the first coarse level beside the full set
            images += sum(_view_bytes(max(1, w // factor), max(1, h // factor)) for w, h in sizes)
    render = 2 * 4 * 5 * max(largest, test_largest)  # image (3), final_T, n_contrib; and their gradients
    out = {"gaussians": n * per, "images": int(images), "render": int(render), "per_gaussian": per,
           "n_gaussians": n}
    out["total"] = out["gaussians"] + out["images"] + out["render"]
    return out


def device_memory(device) -> int | None:
    """Bytes of GPU memory this process can use on ``device``: free memory plus what its allocator holds already;
    None for a CPU device."""
    import torch

    device = torch.device(device)
    if device.type != "cuda":
        return None
    free, _total = torch.cuda.mem_get_info(device)
    return int(free) + int(torch.cuda.memory_reserved(device))


def _gb(n: int) -> str:
    return f"{n / 1e9:.1f} GB"


def memory_problem(need: dict, device, *, streamed: bool, have: int | None = None) -> str | None:
    """One line saying that ``need`` (:func:`training_memory`) does not fit ``device`` — what it needs, made of
    what, against what the device has, and what to change —, or None when it fits or the device is a CPU.
    ``have``: the bytes available (default :func:`device_memory`)."""
    have = device_memory(device) if have is None else have
    if have is None or need["total"] <= have:
        return None
    hint = []
    if need["gaussians"] > have // 2:
        hint.append("a smaller --max-gaussians")
    if need["images"] > have // 4:
        hint.append("streamed frames (leave out --preload-frames)" if not streamed else "a larger --downscale")
    return (f"this run needs at least {_gb(need['total'])} of GPU memory ({need['n_gaussians']:,} Gaussians x "
            f"{need['per_gaussian']} B = {_gb(need['gaussians'])}, images {_gb(need['images'])}, render "
            f"{_gb(need['render'])}) but {device} has {_gb(have)} available"
            + (f": try {' or '.join(hint)}" if hint else ""))
