"""One training iteration of rigel beside a gsplat-based iteration on the same Gaussians and target image.

Per scene and resolution, in one process, three loops over a fixed Gaussian count (no densification), each
starting from its own copy of the same pre-activation parameters (SH degree 3; an SH-0 PLY is zero-padded):

* **rigel**: ``render(model, camera)`` (rigel's autograd path: activations, SH, project, bin, rasterize), the
  trainer's loss ``Trainer.compute_loss`` ((1 − λ)·L1 + λ·(1 − SSIM), λ = 0.2), ``loss.backward()``, the trainer's
  Adam (``rigel_core.train.optim.make_optimizer``: fused, one group per parameter, 3DGS rates, eps 1e-15),
  ``zero_grad``.
* **gsplat**: the activations in PyTorch (exp scales, sigmoid opacities, SH concatenation; quaternions raw, which
  gsplat normalises in its kernel as rigel does in its own — the convention of gsplat's ``simple_trainer.py``),
  ``gsplat.rasterization(..., sh_degree=3)`` (packed, default settings; the call of ``bench/forward.py``), then
  the very same loss code, optimiser construction and step.
* **Trainer.step**: the real ``rigel_core.train.Trainer.step()`` on a one-view dataset (learning-rate schedule,
  the NaN guard on the device, densification statistics), with densification, opacity resets and evaluation
  pushed past the run: what an iteration of ``rigel-train`` costs outside densification.

Target image: the scene's first render shifted by 2 % of the image size (image content, non-zero gradients).
Times: median of ``--iters`` (≥ 50) iterations after ``--warmup``, CUDA events at the stage boundaries (render |
loss | loss backward | render backward | Adam + zero_grad) and wall time per iteration (``perf_counter`` to a
``torch.cuda.synchronize()``; host overhead counts). ``ratio`` = rigel / gsplat per iteration (issue 4 target
≤ 0.5); ``bwd/fwd`` = ``loss.backward()`` / (render + loss) (target ≤ 1.5); the ``render`` pair isolates the
rasterizer path (SH + projection + binning + rasterization, forward and backward).

Run on the GPU machine: ``python bench/train_step.py [--scenes 160k,1M,donut,fruit] [--res 800,1080p]
[--iters 50] [--no-gsplat] [--profile [step|trainer]]``. Writes ``$OUT/train_step.md`` (and
``$OUT/train_step_profile.txt`` with ``--profile``) when OUT is set. Exit code 2 without CUDA.
"""
from __future__ import annotations

import argparse
import datetime
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import rigel_core as rc  # noqa: E402
from bench.forward import PLYS, PROCEDURAL, RESOLUTIONS, Inputs, fmt, gsplat_frame, load, median_ms, psnr  # noqa: E402
from rigel_core.model import PARAM_NAMES, GaussianModel  # noqa: E402
from rigel_core.train import TrainConfig  # noqa: E402
from rigel_core.train.optim import make_optimizer  # noqa: E402
from rigel_core.train.trainer import Trainer  # noqa: E402

RES = {"800": (800, 800), **RESOLUTIONS}
SH_DEGREE = 3
FAR = 10 ** 9  # an iteration no run reaches: densification, opacity reset and evaluation stay off
# events of one iteration: start | render | loss | ∂loss/∂image ready | backward done | Adam + zero_grad done
STAGES = ("render", "loss", "loss_bwd", "render_bwd", "adam")


def bench_config(strategy: str = "default") -> TrainConfig:
    """The trainer's defaults (learning rates, λ, Adam eps), SH degree 3 active from iteration 3, and no
    densification, opacity reset or evaluation inside the run (the statistics are still gathered); full resolution
    (the one-view dataset has no SfM points, so "auto" coarse-to-fine would time the first steps at ¼ size), and
    3DGS's densification's step: "auto" makes a photo capture without SfM points an MCMC run, whose every step adds
    its position noise and regularisers — another step than the one this bench has timed since it began (63e10e6's
    "auto" resolved to "default" here). ``strategy="mcmc"`` (``--strategy mcmc``) times the MCMC step instead, its
    budget the scene's count (``max_gaussians``: no relocation or growth inside the run)."""
    cfg = TrainConfig(sh_degree=SH_DEGREE, sh_degree_interval=1, densify_from=FAR, opacity_reset_interval=FAR,
                      eval_every=0, coarse_to_fine=1, strategy=strategy)
    if strategy == "mcmc":
        cfg.max_gaussians = 10 ** 9  # above any scene here: the cap never cuts, the step stays the graph's
    return cfg


def clone_model(model: GaussianModel) -> GaussianModel:
    """An independent copy (``GaussianModel.to`` on the same device shares storage, and Adam updates in place)."""
    return GaussianModel(*(getattr(model, p).detach().clone() for p in PARAM_NAMES))


def one_view_dataset(camera, image: torch.Tensor, extent: float):
    """The smallest dataset ``Trainer`` accepts: one training frame (``camera``, ``image`` (H,W,3)), no test set."""
    frame = SimpleNamespace(camera=camera, image=image, alpha=None, name="bench")
    return SimpleNamespace(train=[frame], test=[], scene_extent=extent, scene_center=(0.0, 0.0, 0.0), points=None,
                           point_colors=None, white_bg=False)


def shifted_target(base: GaussianModel, camera) -> tuple[torch.Tensor, torch.Tensor]:
    """(``base``'s render from ``camera`` clamped to [0, 1], that render shifted by 2 % of the image size): the
    benches' target image (image content, non-zero gradients); both (H, W, 3) float32 on the model's device."""
    with torch.no_grad():
        first = rc.render(base, camera).image.clamp(0.0, 1.0)
        h, w = first.shape[:2]
        return first, torch.roll(first, shifts=(max(1, h // 50), max(1, w // 50)), dims=(0, 1)).contiguous()


class Loop:
    """One optimisation loop: a model copy, its optimiser (the trainer's construction), camera, target, loss."""

    def __init__(self, base: GaussianModel, cfg: TrainConfig, extent: float, camera, target, loss_fn):
        self.model = clone_model(base)
        self.optimizer = make_optimizer(self.model, cfg, extent)
        self.camera, self.target, self.loss_fn = camera, target, loss_fn
        self.walls: list[float] = []

    def rigel_render(self) -> torch.Tensor:
        return rc.render(self.model, self.camera).image

    def gsplat_render(self) -> torch.Tensor:
        return gsplat_frame(Inputs(self.model, self.camera))

    def step(self, render, ev) -> None:
        """One iteration, six events (``STAGES``); appends its wall time (s) to ``walls``."""
        t0 = time.perf_counter()
        ev[0].record()
        image = render()
        ev[1].record()
        image.register_hook(lambda g: ev[3].record())  # fires when ∂loss/∂image is ready, before the render bwd
        loss = self.loss_fn(image, self.target)[0]
        ev[2].record()
        loss.backward()
        ev[4].record()
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        ev[5].record()
        torch.cuda.synchronize()
        self.walls.append(time.perf_counter() - t0)


def time_loop(loop: Loop, render, iters: int, warmup: int) -> dict:
    """Median ms of each stage, of the iteration (events) and of its wall time."""
    loop.walls.clear()
    ms = median_ms(lambda ev: loop.step(render, ev), iters, warmup=warmup, n_events=len(STAGES) + 1)
    r = dict(zip(STAGES, ms[:-1]))
    r["total"] = ms[-1]
    r["wall"] = 1e3 * statistics.median(loop.walls[-iters:])
    return r


def time_trainer(trainer: Trainer, iters: int, warmup: int) -> float:
    """Median wall ms of ``Trainer.step()``, each step between two ``torch.cuda.synchronize()``."""
    for _ in range(warmup):
        trainer.step()
    walls = []
    for _ in range(iters):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        trainer.step()
        torch.cuda.synchronize()
        walls.append(time.perf_counter() - t0)
    return 1e3 * statistics.median(walls)


def profile(fn, n: int, title: str) -> str:
    """torch.profiler over ``n`` calls of ``fn``: the top 25 ops by self GPU time, then by self CPU time."""
    from torch.autograd.profiler_util import FunctionEventAvg
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    # torch ≥ 2.4 names it self_device_time_total (self_cuda_time_total remains, deprecated)
    gpu_key = "self_device_time_total" if hasattr(FunctionEventAvg, "self_device_time_total") \
        else "self_cuda_time_total"
    torch.cuda.synchronize()
    with torch_profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(n):
            fn()
        torch.cuda.synchronize()
    avg = prof.key_averages()
    return (f"== {title}: {n} iterations, by self GPU time ==\n{avg.table(sort_by=gpu_key, row_limit=25)}\n"
            f"== {title}: {n} iterations, by self CPU time ==\n"
            f"{avg.table(sort_by='self_cpu_time_total', row_limit=25)}\n")


def fresh_events(n: int = len(STAGES) + 1):
    return [torch.cuda.Event(enable_timing=True) for _ in range(n)]


def gsplat_available(wanted: bool) -> bool:
    if not wanted:
        return False
    try:
        import gsplat  # noqa: F401
    except Exception as e:  # noqa: BLE001
        print(f"gsplat unavailable ({e}); rigel only", flush=True)
        return False
    return True


def trainer_throughput(trainer: Trainer, iters: int, warmup: int) -> tuple[float, float | None]:
    """(ms per ``Trainer.step()`` over ``iters`` back-to-back steps, one synchronize at each end: what a training
    loop gets, with the host free to run ahead of the device (the graph step's case); the host's own ms per step:
    that wall time minus the time the graph step blocked on replays in flight (GraphStep.wait_s), or None without
    a graph step (the eager step never waits but at the end: its wall time is its host time))."""
    for _ in range(warmup):
        trainer.step()
    torch.cuda.synchronize()
    gs_ = trainer.graph_step
    wait0 = gs_.wait_s if gs_ is not None else 0.0
    t0 = time.perf_counter()
    for _ in range(iters):
        trainer.step()
    torch.cuda.synchronize()
    wall = time.perf_counter() - t0
    host = None if gs_ is None or gs_.disabled else 1e3 * (wall - (gs_.wait_s - wait0)) / iters
    return 1e3 * wall / iters, host


def run(args, device=None):
    """Measure every (scene, resolution) row; returns (rows, profile text)."""
    dev = torch.device(device or "cuda")
    cfg = bench_config(args.strategy)
    have_gsplat = gsplat_available(not args.no_gsplat)
    rows, prof_text = [], []
    for scene in args.scenes.split(","):
        t0 = time.time()
        base, camera = load(scene, dev)
        base = base.to(device=dev, dtype=torch.float32)
        if base.sh_degree != SH_DEGREE:
            base = base.with_sh_degree(SH_DEGREE)
        extent = base.extent()
        print(f"[{scene}] {base.num_gaussians:,} Gaussians, SH {SH_DEGREE}, loaded in {time.time() - t0:.1f}s",
              flush=True)
        for res in args.res.split(","):
            w, h = RES[res]
            cam = camera(w, h)
            row = dict(scene=scene, n=base.num_gaussians, res=f"{w}x{h}")
            first, target = shifted_target(base, cam)
            trainer = Trainer(one_view_dataset(cam, target, extent), cfg, model=clone_model(base), device=dev)
            loss_fn = trainer.compute_loss  # the trainer's loss code, shared by both loops

            loop = Loop(base, cfg, extent, cam, target, loss_fn)
            row["rigel"] = time_loop(loop, loop.rigel_render, args.iters, args.warmup)
            if args.profile == "step":
                prof_text.append(profile(lambda: loop.step(loop.rigel_render, fresh_events()), 20,
                                         f"rigel iteration, {scene} {w}x{h}"))
            del loop

            if have_gsplat:
                loop = Loop(base, cfg, extent, cam, target, loss_fn)
                if not getattr(run, "gsplat_warm", False):
                    t1 = time.time()
                    try:
                        loop.step(loop.gsplat_render, fresh_events())
                    except Exception as e:  # noqa: BLE001  (a failed JIT build must not cost the rigel rows)
                        print(f"gsplat failed on its first iteration ({type(e).__name__}: {e}); rigel only",
                              flush=True)
                        have_gsplat = False
                    else:
                        print(f"gsplat first iteration (JIT compile) {time.time() - t1:.0f}s", flush=True)
                    run.gsplat_warm = True
                    loop = Loop(base, cfg, extent, cam, target, loss_fn)  # start from the same parameters
            if have_gsplat:
                with torch.no_grad():
                    row["psnr_vs_gsplat"] = psnr(first, loop.gsplat_render().clamp(0.0, 1.0))
                row["gsplat"] = time_loop(loop, loop.gsplat_render, args.iters, args.warmup)
                del loop

            row["trainer"] = time_trainer(trainer, args.iters, args.warmup)
            del trainer
            # Each loop below starts from the base model, as rigel's and gsplat's loops above do. The graph loop
            # used to reuse the trainer of time_trainer, whose model had already trained warmup + iters steps
            # towards the shifted target, while the eager loop started fresh: at 1M it read 5.23 ms (graph)
            # against 4.40 ms (eager) at 800x800 (H200, 2026-12-02, aee63a1), not a like-for-like pair.
            trainer = Trainer(one_view_dataset(cam, target, extent), cfg, model=clone_model(base), device=dev)
            row["trainer_tp"], row["trainer_tp_host"] = trainer_throughput(trainer, args.iters, args.warmup)
            gs_ = trainer.graph_step
            row["graph"] = "off" if gs_ is None else (f"off ({gs_.disabled})" if gs_.disabled else
                                                       f"{gs_.captures} capture(s), {gs_.overflows} overflow(s)")
            if args.profile == "trainer":
                prof_text.append(profile(trainer.step, 20, f"Trainer.step, {scene} {w}x{h}"))
            del trainer
            eager_cfg = bench_config(args.strategy)
            eager_cfg.cuda_graph = False
            trainer = Trainer(one_view_dataset(cam, target, extent), eager_cfg, model=clone_model(base), device=dev)
            row["trainer_tp_eager"] = trainer_throughput(trainer, args.iters, args.warmup)[0]
            del trainer
            rows.append(row)
            print("  " + format_row(row), flush=True)
        del base
        torch.cuda.empty_cache()
    return rows, "".join(prof_text)


def derived(r: dict) -> dict:
    """The ratios of a row (None where a side is missing)."""
    rg, gs = r["rigel"], r.get("gsplat")
    fwd, bwd = rg["render"] + rg["loss"], rg["loss_bwd"] + rg["render_bwd"]
    return dict(fwd=fwd, bwd=bwd, bwd_fwd=bwd / fwd if fwd > 0 else None,
                render_bwd_fwd=rg["render_bwd"] / rg["render"] if rg["render"] > 0 else None,
                loss_ms=rg["loss"] + rg["loss_bwd"],
                ratio=rg["total"] / gs["total"] if gs else None, ratio_wall=rg["wall"] / gs["wall"] if gs else None,
                g_fwd=gs["render"] + gs["loss"] if gs else None,
                g_bwd=gs["loss_bwd"] + gs["render_bwd"] if gs else None)


def format_row(r: dict) -> str:
    d, rg, gs = derived(r), r["rigel"], r.get("gsplat") or {}
    return (f"{r['scene']:>6} {r['n']:>9,} {r['res']:>9} | rigel {rg['total']:.3f} ms (wall {rg['wall']:.3f}) | "
            f"gsplat {fmt(gs.get('total'), '.3f')} ms (wall {fmt(gs.get('wall'), '.3f')}) | ratio {fmt(d['ratio'])} "
            f"(wall {fmt(d['ratio_wall'])}) | fwd {d['fwd']:.3f} bwd {d['bwd']:.3f} bwd/fwd {fmt(d['bwd_fwd'])} | "
            f"render fwd {rg['render']:.3f} bwd {rg['render_bwd']:.3f} ({fmt(d['render_bwd_fwd'])}) | "
            f"Adam {rg['adam']:.3f} | Trainer.step {r['trainer']:.3f} ms | loop: graph {r['trainer_tp']:.3f} "
            f"(host {fmt(r.get('trainer_tp_host'), '.3f')}) eager {r['trainer_tp_eager']:.3f} ms/it "
            f"({r['graph']})")


def markdown(rows, meta: str, iters: int) -> str:
    lines = [f"# rigel training iteration vs gsplat ({meta})", "",
             f"Median of {iters} iterations after warm-up (ms), fixed Gaussian count, SH degree 3, same target "
             "image, loss ((1 − 0.2)·L1 + 0.2·D-SSIM, the trainer's code) and Adam (the trainer's groups and "
             "learning rates) on both sides. ms/it: CUDA events around the iteration; wall: perf_counter to a "
             "synchronize. ratio = rigel / gsplat (target ≤ 0.5). fwd = render + loss, bwd = loss.backward() "
             "(target bwd/fwd ≤ 1.5); render = activations + SH + projection + binning + rasterization alone. "
             "Trainer.step: the full `Trainer.step()` (NaN guard, densification statistics; densification itself "
             "off), wall, each step between two synchronizes. Trainer loop: ms per step over back-to-back steps "
             "(one synchronize at each end), each from the base model, with the CUDA-graph step (train/graph_step.py) "
             "and without it (eager); graph host: the graph loop's wall time minus the time its host blocked on "
             "replays in flight (the host's own work per step; below the graph loop's ms/it = the GPU bounds it); "
             "loop ratio = graph loop / gsplat ms/it.", "",
             "| scene | N | resolution | rigel ms/it | rigel wall | gsplat ms/it | gsplat wall | ratio | ratio wall | "
             "rigel fwd | rigel bwd | bwd/fwd | render fwd | render bwd | render bwd/fwd | loss fwd+bwd | Adam | "
             "gsplat fwd | gsplat bwd | Trainer.step wall | Trainer loop graph | graph host | Trainer loop eager | "
             "loop ratio | PSNR vs gsplat |",
             "|---|---:|---|" + "---:|" * 22]
    for r in rows:
        d, rg, gs = derived(r), r["rigel"], r.get("gsplat") or {}
        cells = [r["scene"], f"{r['n']:,}", r["res"], fmt(rg["total"], ".3f"), fmt(rg["wall"], ".3f"),
                 fmt(gs.get("total"), ".3f"), fmt(gs.get("wall"), ".3f"), fmt(d["ratio"]), fmt(d["ratio_wall"]),
                 fmt(d["fwd"], ".3f"), fmt(d["bwd"], ".3f"), fmt(d["bwd_fwd"]), fmt(rg["render"], ".3f"),
                 fmt(rg["render_bwd"], ".3f"), fmt(d["render_bwd_fwd"]), fmt(d["loss_ms"], ".3f"),
                 fmt(rg["adam"], ".3f"), fmt(d["g_fwd"], ".3f"), fmt(d["g_bwd"], ".3f"), fmt(r["trainer"], ".3f"),
                 fmt(r["trainer_tp"], ".3f"), fmt(r.get("trainer_tp_host"), ".3f"), fmt(r["trainer_tp_eager"], ".3f"),
                 fmt(r["trainer_tp"] / gs["total"] if gs.get("total") else None),
                 fmt(r.get("psnr_vs_gsplat"), ".1f")]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scenes", default="160k,1M,donut,fruit",
                    help="comma-separated: procedural 160k, 300k, 1M, 3M, 10M, 20M; real PLYs donut, fruit (default: "
                         "%(default)s)")
    ap.add_argument("--res", default="800,1080p", help=f"comma-separated of {', '.join(RES)} (default: %(default)s)")
    ap.add_argument("--iters", type=int, default=50, help="timed iterations per loop (default: %(default)s)")
    ap.add_argument("--warmup", type=int, default=10, help="untimed iterations first (default: %(default)s)")
    ap.add_argument("--no-gsplat", action="store_true", help="rigel only")
    ap.add_argument("--strategy", choices=("default", "mcmc"), default="default",
                    help="the Trainer loop's step: 3DGS's densification's (default) or the MCMC budget's (its position "
                         "noise and regularisers every step)")
    ap.add_argument("--profile", nargs="?", const="step", choices=("step", "trainer"), default=None,
                    help="also run torch.profiler over 20 rigel iterations (step: the bare iteration, default; "
                         "trainer: Trainer.step) and print the top ops by self GPU and self CPU time")
    args = ap.parse_args(argv)
    for r in args.res.split(","):
        if r not in RES:
            ap.error(f"unknown resolution {r!r}; choose from {', '.join(RES)}")
    for name in args.scenes.split(","):
        if name not in PROCEDURAL and name not in PLYS:
            ap.error(f"unknown scene {name!r}; choose from {', '.join([*PROCEDURAL, *PLYS])}")
    if args.iters < 1 or args.warmup < 1:
        ap.error("--iters and --warmup must be at least 1")
    return args


def main():
    args = parse_args()
    if args.iters < 50:
        print("note: fewer than 50 timed iterations", file=sys.stderr)
    if not rc.cuda_available():
        print("bench/train_step.py needs a CUDA GPU and the compiled kernels (rigel_core._C): "
              f"torch.cuda.is_available() = {torch.cuda.is_available()}", file=sys.stderr)
        sys.exit(2)
    rows, prof_text = run(args)
    commit = os.environ.get("RIGEL_COMMIT") or subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    meta = (f"{torch.cuda.get_device_name()}, {datetime.date.today()}, commit {commit or 'unknown'}, "
            f"torch {torch.__version__}")
    table = markdown(rows, meta, args.iters)
    if prof_text:
        print("\n" + prof_text)
    if os.environ.get("OUT"):
        Path(os.environ["OUT"]).mkdir(parents=True, exist_ok=True)
        Path(os.environ["OUT"], "train_step.md").write_text(table)
        if prof_text:
            Path(os.environ["OUT"], "train_step_profile.txt").write_text(prof_text)
    print("\n" + table)


if __name__ == "__main__":
    main()
