"""Bytes per Gaussian in training, rigel beside a gsplat loop in the same process, and the largest scene that trains
on this GPU (issue 37 item 2).

For each Gaussian count N (``--counts``, procedural scenes, SH degree 3), one view of ``--res``:

* **rigel**: the real ``Trainer.step()`` (eager and CUDA-graph step as rigel-train runs it; densification pushed past
  the run, statistics gathered) on a one-view dataset. Its memory is taken apart by **inventory** — the bytes of
  every per-Gaussian tensor the trainer holds: parameters, their gradients (kept by the step's last backward),
  Adam's moments, the densification statistics — on any device; and, on CUDA, by the **peak** of
  ``torch.cuda.max_memory_allocated`` over ``--steps`` steps, which adds the per-step buffers (projection,
  binning, rasterization, their gradients).
* **gsplat** (CUDA, when installed): gsplat's ``simple_trainer.py`` loop as bench/real.py runs it — parameters in a
  ``ParameterDict``, one ``torch.optim.Adam`` per parameter, ``gsplat.rasterization`` (packed), the same loss,
  ``DefaultStrategy``'s state (its gradient statistics) — peak the same way.

Bytes per Gaussian = the slope of the peak over N (a least-squares line through the counts: the fixed part — the
image, the loss's buffers, the CUDA context — drops out); the inventory gives the static part per Gaussian exactly.
``--find-max`` then grows N (doubling, then bisection to 5 %) until rigel's step runs out of memory: the largest
scene that trains here (each trial a fresh Trainer; ``torch.cuda.OutOfMemoryError`` ends a trial).

Run on the GPU machine: ``python bench/gaussian_memory.py [--counts 1M,2M,4M] [--res 1080p] [--steps 5]
[--find-max] [--no-gsplat]``; writes ``$OUT/gaussian_memory.md`` and ``.json`` when OUT is set. On a CPU
(``--device cpu``, tiny counts) only the inventory runs; the peaks, gsplat and ``--find-max`` are skipped, with the
reason in the table.
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.bench_common import commit  # noqa: E402
from bench.train_step import RES, bench_config, one_view_dataset  # noqa: E402
from rigel_core.train.memory import bytes_per_gaussian_floor  # noqa: E402

__all__ = ["parse_count", "inventory", "rigel_row", "gsplat_row", "slope", "find_max", "main"]


def parse_count(text: str) -> int:
    """``"160k"`` → 160000, ``"2M"`` → 2000000, ``"1500"`` → 1500."""
    text = text.strip()
    mult = {"k": 1_000, "K": 1_000, "M": 1_000_000, "m": 1_000_000}.get(text[-1:], 1)
    return int(float(text[:-1] if mult != 1 else text) * mult)


def _bytes(tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors if isinstance(t, torch.Tensor))


def inventory(trainer) -> dict:
    """Bytes of the trainer's per-Gaussian tensors by kind: ``params``, ``grads`` (those present now), ``adam``
    (the optimizer's state tensors with a row per Gaussian), ``stats`` (densification statistics)."""
    n = trainer.model.num_gaussians
    params = [p for g in trainer.optimizer.param_groups for p in g["params"] if p.shape[:1] == (n,)]
    adam = [v for p in params for v in trainer.optimizer.state.get(p, {}).values()
            if isinstance(v, torch.Tensor) and v.dim() > 0 and v.shape[0] == n]
    s = trainer.stats
    return {"params": _bytes(params), "grads": _bytes(p.grad for p in params), "adam": _bytes(adam),
            "stats": _bytes([s.grad_accum, s.denom, s.max_radii])}


def _scene(n: int, device, res: str):
    """The procedural scene of ``n`` Gaussians (SH degree 3) and a camera of resolution ``res`` looking at it."""
    import math

    import numpy as np

    import rigel_core as rc
    from rigel_core.data.procedural import SCENE_RADIUS, make_scene

    model = make_scene(n, sh_degree=3, seed=0, device=device)
    el, az, dist = math.radians(25.0), math.radians(30.0), 2.3 * SCENE_RADIUS
    eye = dist * np.array([math.cos(el) * math.cos(az), math.cos(el) * math.sin(az), math.sin(el)])
    w, h = RES[res] if res in RES else tuple(int(v) for v in res.split("x"))
    cam = rc.Camera.look_at(eye, (0.0, 0.0, 0.0), (0.0, 0.0, 1.0), width=w, height=h, fov_x_deg=55.0)
    return model, cam


def rigel_row(n: int, device, res: str, steps: int, keep_grads: bool = True) -> dict:
    """Rigel's Trainer on a scene of ``n`` Gaussians: the inventory after ``steps`` steps (with the last step's
    gradients when ``keep_grads``), the median wall ms of the later half of the steps and, on CUDA, the peak bytes
    allocated over the steps."""
    import rigel_core as rc
    from rigel_core.train import Trainer

    model, cam = _scene(n, device, res)
    target = rc.render(model, cam).image.detach().clamp(0, 1).roll(shifts=cam.width // 50, dims=1)
    cuda = torch.device(device).type == "cuda"
    if cuda:
        torch.cuda.synchronize()
        gc.collect()
        torch.cuda.empty_cache()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
    t = Trainer(one_view_dataset(cam, target, 2.0), bench_config(), model=model, device=device)
    del model, target
    walls = []
    for _ in range(steps):
        t0 = time.perf_counter()
        t.step()
        if cuda:
            torch.cuda.synchronize()
        walls.append(time.perf_counter() - t0)
    row = {"n": n, "device": str(device), "step_ms": 1e3 * statistics.median(walls[len(walls) // 2:])}
    if keep_grads:  # the step drops its gradients when done: one more forward/backward to count them
        out = rc.render(t.model, cam)
        out.image.sum().backward()
        del out
    row["inventory"] = inventory(t)
    if cuda:
        torch.cuda.synchronize()
        row["peak"] = torch.cuda.max_memory_allocated() - base
    else:
        row["peak_skipped"] = "the peak of the per-step buffers needs CUDA (torch.cuda.max_memory_allocated)"
    del t
    return row


def gsplat_row(n: int, device, res: str, steps: int) -> dict:
    """gsplat's loop on the same scene (bench/real.py's construction): the peak bytes allocated, on CUDA."""
    if torch.device(device).type != "cuda":
        return {"n": n, "skipped": "gsplat needs CUDA"}
    try:
        import gsplat  # noqa: F401
    except Exception as e:  # noqa: BLE001 - not installed, or its extension cannot load
        return {"n": n, "skipped": f"gsplat unavailable ({type(e).__name__}: {e})"}
    from bench.forward import Inputs, gsplat_frame
    from rigel_core.train.losses import loss_terms

    model, cam = _scene(n, device, res)
    torch.cuda.synchronize()
    gc.collect()
    torch.cuda.empty_cache()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    params = torch.nn.ParameterDict({k: torch.nn.Parameter(v.detach().clone()) for k, v in
                                     (("means", model.means3D), ("quats", model.quats),
                                      ("scales", model.log_scales), ("opacities", model.opacity_logits),
                                      ("sh", model.sh_coeffs))})
    target = gsplat_frame(Inputs(model, cam)).detach().clamp(0, 1).roll(shifts=cam.width // 50, dims=1)
    del model
    opts = {k: torch.optim.Adam([p], lr=1e-3, eps=1e-15) for k, p in params.items()}
    grad2d = torch.zeros(n, device=device)  # DefaultStrategy's state: gradient sum, count, largest radius
    count = torch.zeros(n, device=device)
    radii = torch.zeros(n, device=device)
    from types import SimpleNamespace

    for _ in range(steps):
        g = SimpleNamespace(means3D=params["means"], quats=params["quats"], scales=torch.exp(params["scales"]),
                            opacities=torch.sigmoid(params["opacities"]), sh_coeffs=params["sh"], sh_degree=3,
                            device=torch.device(device))
        image = gsplat_frame(Inputs(g, cam))
        loss = loss_terms(image, target, None, lambda_dssim=0.2)[0]
        loss.backward()
        for o in opts.values():
            o.step()
            o.zero_grad(set_to_none=False)  # gsplat's loop keeps its gradient buffers between steps
    torch.cuda.synchronize()
    row = {"n": n, "peak": torch.cuda.max_memory_allocated() - base}
    del params, opts, grad2d, count, radii, target
    return row


def slope(rows: list[dict], key: str = "peak") -> float | None:
    """Least-squares bytes per Gaussian of ``rows``' ``key`` over their counts (None with fewer than two)."""
    pts = [(r["n"], r[key]) for r in rows if key in r]
    if len(pts) < 2:
        return None
    mx = sum(n for n, _ in pts) / len(pts)
    my = sum(b for _, b in pts) / len(pts)
    den = sum((n - mx) ** 2 for n, _ in pts)
    return sum((n - mx) * (b - my) for n, b in pts) / den if den else None


def find_max(device, res: str, start: int, steps: int, tol: float = 0.05, limit: int = 200_000_000) -> dict:
    """The largest count whose rigel training steps fit: doubling from ``start``, then bisection to ``tol``."""
    def fits(n: int) -> bool:
        try:
            rigel_row(n, device, res, steps, keep_grads=False)
            return True
        except torch.cuda.OutOfMemoryError:
            return False
        finally:
            gc.collect()
            torch.cuda.empty_cache()

    lo, hi = 0, None
    n = start
    while hi is None and n <= limit:
        if fits(n):
            lo, n = n, 2 * n
        else:
            hi = n
    if hi is None:
        return {"largest": lo, "note": f"fits up to the search limit {limit:,}"}
    while hi - lo > tol * hi:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid)
    return {"largest": lo, "first_failing": hi}


def markdown(result: dict) -> str:
    rows, per = result["rigel"], result["per_gaussian"]
    lines = [f"# Bytes per Gaussian in training (commit {result['commit']}, {result['device_name']}, {result['res']}, "
             f"{result['steps']} steps)", "",
             "| N | params | grads | Adam | stats | inventory B/G | rigel peak | gsplat peak |", "|---|---|---|---|---|---|---|---|"]
    gs = {r["n"]: r for r in result["gsplat"]}
    for r in rows:
        inv = r["inventory"]
        g = gs.get(r["n"], {})
        peak = f"{r['peak']:,}" if "peak" in r else f"skipped: {r['peak_skipped']}"
        gpeak = f"{g['peak']:,}" if "peak" in g else (f"skipped: {g['skipped']}" if g else "not run")
        lines.append(f"| {r['n']:,} | {inv['params']:,} | {inv['grads']:,} | {inv['adam']:,} | {inv['stats']:,} | "
                     f"{sum(inv.values()) / r['n']:.0f} | {peak} | {gpeak} |")
    lines += ["", f"- floor used by rigel-train's refusal (train/memory.py): {per['floor']} B per Gaussian",
              f"- inventory (static part): {per['inventory']:.0f} B per Gaussian",
              f"- rigel, peak slope: {per['rigel']} B per Gaussian", f"- gsplat, peak slope: {per['gsplat']} B per Gaussian"]
    if result.get("find_max"):
        lines.append(f"- largest scene that trains here: {result['find_max']}")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--counts", default="1M,2M,4M", help="Gaussian counts, comma-separated (k/M suffixes)")
    p.add_argument("--res", default="1080p", help=f"one of {sorted(RES)} or WxH")
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--device", default=None, help="default: cuda when usable, else cpu")
    p.add_argument("--find-max", action="store_true", help="search the largest count that trains (CUDA)")
    p.add_argument("--no-gsplat", action="store_true")
    args = p.parse_args(argv)
    from rigel_core import cuda_available

    device = args.device or ("cuda" if cuda_available() else "cpu")
    counts = [parse_count(c) for c in args.counts.split(",")]
    rigel = [rigel_row(n, device, args.res, args.steps) for n in counts]
    gsplat = [] if args.no_gsplat else [gsplat_row(n, device, args.res, args.steps) for n in counts]
    inv = [sum(r["inventory"].values()) / r["n"] for r in rigel]
    result = {"commit": commit(), "res": args.res, "steps": args.steps, "counts": counts,
              "device_name": torch.cuda.get_device_name() if device.startswith("cuda") else "cpu",
              "rigel": rigel, "gsplat": gsplat,
              "per_gaussian": {"floor": bytes_per_gaussian_floor(3), "inventory": max(inv),
                               "rigel": slope(rigel), "gsplat": slope(gsplat)}}
    if args.find_max:
        result["find_max"] = find_max(device, args.res, max(counts), args.steps) if device.startswith("cuda") \
            else "skipped: needs CUDA (an out-of-memory error ends a trial)"
    text = markdown(result)
    print(text)
    out = os.environ.get("OUT")
    if out:
        Path(out).mkdir(parents=True, exist_ok=True)
        Path(out, "gaussian_memory.md").write_text(text)
        Path(out, "gaussian_memory.json").write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
