"""The appearance stage alone on the GPU: the fused MLP kernel against the SH kernel (issue 5).

Times the raw kernels of ``rigel_core._C`` (no autograd bookkeeping): ``sh_colors`` / ``sh_colors_backward``
at SH degree 3, and ``mlp_colors`` / ``mlp_colors_backward`` at several (latent L, hidden H) sizes, for
N Gaussians spread around a camera. Median of CUDA-event timings after a warm-up; prints a table with the
GPU, date and commit.

Run (GPU machine): python bench/appearance.py [--n 160000 1000000] [--iters 100]
"""
import argparse
import datetime
import os
import statistics
import subprocess
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run from a checkout without installing


def cuda_median_ms(fn, iters: int, warmup: int) -> float:
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(iters):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def commit() -> str:
    """$RIGEL_COMMIT (the GPU machine's checkout has a stale .git), else git's HEAD."""
    if os.environ.get("RIGEL_COMMIT"):
        return os.environ["RIGEL_COMMIT"]
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                              check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, nargs="+", default=[160_000, 1_000_000], help="Gaussian counts")
    ap.add_argument("--sizes", default="8x32,16x64,29x64,32x64", help="comma-separated LxH MLP sizes")
    ap.add_argument("--iters", type=int, default=100)
    ap.add_argument("--warmup", type=int, default=10)
    args = ap.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("bench/appearance.py needs a CUDA GPU")
    from rigel_core import _ext

    C = _ext.get()
    dev = torch.device("cuda")
    gen = torch.Generator(device=dev).manual_seed(0)
    sizes = [tuple(int(v) for v in s.split("x")) for s in args.sizes.split(",")]
    print(f"# appearance stage, {torch.cuda.get_device_name(0)}, torch {torch.__version__}, "
          f"{datetime.date.today()}, commit {commit()}; median of {args.iters} CUDA-event timings after "
          f"{args.warmup} warm-up calls")
    print(f"{'N':>9}  {'stage':<16} {'floats/G':>8}  {'fwd ms':>8}  {'bwd ms':>8}  {'fwd vs SH3':>10}  {'bwd vs SH3':>10}")
    for n in args.n:
        campos = torch.zeros(3, device=dev)
        means = torch.randn(n, 3, device=dev, generator=gen) * 3 + torch.tensor([0.0, 0.0, 6.0], device=dev)
        v_colors = torch.randn(n, 3, device=dev, generator=gen)
        coeffs = torch.randn(n, 16, 3, device=dev, generator=gen) * 0.1
        sh_f = cuda_median_ms(lambda: C.sh_colors(3, coeffs, means, campos), args.iters, args.warmup)
        sh_b = cuda_median_ms(lambda: C.sh_colors_backward(3, coeffs, means, campos, v_colors), args.iters,
                              args.warmup)
        print(f"{n:>9,}  {'SH degree 3':<16} {48:>8}  {sh_f:>8.3f}  {sh_b:>8.3f}  {1.0:>10.2f}  {1.0:>10.2f}")
        for L, H in sizes:
            lat = torch.randn(n, L, device=dev, generator=gen)
            W1 = torch.randn(H, L + 3, device=dev, generator=gen) * (2.0 / (L + 3)) ** 0.5
            b1 = torch.zeros(H, device=dev)
            W2 = torch.randn(3, H, device=dev, generator=gen) * (1.0 / H) ** 0.5
            b2 = torch.zeros(3, device=dev)
            colors = C.mlp_colors(lat, means, campos, W1, b1, W2, b2)
            f = cuda_median_ms(lambda: C.mlp_colors(lat, means, campos, W1, b1, W2, b2), args.iters,
                               args.warmup)
            b = cuda_median_ms(
                lambda: C.mlp_colors_backward(lat, means, campos, W1, b1, W2, b2, colors, v_colors, True),
                args.iters, args.warmup)
            print(f"{n:>9,}  {f'MLP L={L} H={H}':<16} {L:>8}  {f:>8.3f}  {b:>8.3f}  {f / sh_f:>10.2f}  "
                  f"{b / sh_b:>10.2f}")
            del lat, colors
        del means, v_colors, coeffs
        torch.cuda.empty_cache()
    print("floats/G: per-Gaussian appearance parameters (the optimiser's per-Gaussian traffic). "
          "bwd includes the output allocation and zeroing of the gradients.")


if __name__ == "__main__":
    main()
