"""Time the trainer's SSIM term, forward + backward, on the GPU: PyTorch path vs the fused kernels (csrc/ssim.cu).

    PYTHONPATH=. python3 bench/ssim.py [--iters 50]

Prints, per resolution (800x800, 720x1280, 1920x1080; W x H), the mean milliseconds of ``ssim(pred, gt)`` +
``backward()`` on (H, W, 3) float32 images (CUDA events around ``iters`` iterations after warm-up), and the largest
difference of the two paths' values and gradients. One line per resolution, "WxH: torch T ms, fused F ms ..."
(bench/kernel_ab.sh --ssim parses it). A second line, "WxH loss: ...", times the trainer's whole loss
(``losses.loss_terms``: L1 + D-SSIM + the MSE metric, forward + backward) in the fused kernels' float64 and float32
forms (``TrainConfig.loss_float32``), without and with a mask (a 16-px border masked, as a lens mask), and the
float32 form's difference from the float64 one. Those are timed as replays of a CUDA graph of forward + backward
(as the trainer's graph step runs them): launched eagerly, the loss's few small autograd launches keep the host
busier than the GPU, and the times would be the host's.
"""
import argparse

import torch

from rigel_core.train.losses import loss_terms, ssim, ssim_map_reference


def ms_per_call(fn, iters: int) -> float:
    """Mean milliseconds of ``fn()`` over ``iters`` back-to-back calls (CUDA events around them)."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / iters


def run(loss, pred, gt, iters):
    x = pred.clone().requires_grad_(True)
    for _ in range(3):
        loss(x, gt).backward()
    x.grad = None
    ms = ms_per_call(lambda: loss(x, gt).backward(), iters)
    x.grad = None
    s = loss(x, gt)
    s.backward()
    return ms, float(s.detach()), x.grad.clone()


def run_graph(loss, pred, gt, iters):
    """As :func:`run`, the forward + backward captured once in a CUDA graph and replayed ``iters`` times."""
    x = pred.clone().requires_grad_(True)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up off the capture stream (torch.cuda.graphs' rule)
        for _ in range(3):
            x.grad = None
            loss(x, gt).backward()
    torch.cuda.current_stream().wait_stream(side)
    x.grad = None
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        s = loss(x, gt)
        s.backward()  # x.grad is allocated in the graph's pool: each replay rewrites it
    graph.replay()
    return ms_per_call(graph.replay, iters), float(s.detach()), x.grad.clone()


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--iters", type=int, default=50)
    args = ap.parse_args()
    g = torch.Generator(device="cuda").manual_seed(0)
    for h, w in ((800, 800), (1280, 720), (1080, 1920)):  # 720x1280: the beer capture (bench/profile_trainer.py)
        gt = torch.rand(h, w, 3, device="cuda", generator=g)
        pred = (gt + 0.1 * torch.randn(h, w, 3, device="cuda", generator=g)).clamp(0, 1)
        t_torch, s_torch, g_torch = run(lambda p, t: ssim_map_reference(p, t).mean(), pred, gt, args.iters)
        t_fused, s_fused, g_fused = run(ssim, pred, gt, args.iters)
        rel = float((g_fused - g_torch).norm() / g_torch.norm())
        print(f"{w}x{h}: torch {t_torch:.3f} ms, fused {t_fused:.3f} ms (x{t_torch / t_fused:.1f}); "
              f"|dSSIM| {abs(s_fused - s_torch):.2e}, grad rel diff {rel:.2e}")
        mask = torch.zeros(h, w, dtype=torch.bool, device="cuda")
        mask[16:-16, 16:-16] = True
        cols = []
        for m in (None, mask):
            res = {fp32: run_graph(lambda p, t, fp32=fp32, m=m: loss_terms(p, t, m, fp32=fp32)[0], pred, gt,
                                   args.iters)
                   for fp32 in (False, True)}
            (t64, l64, g64), (t32, l32, g32) = res[False], res[True]
            rel = float((g32 - g64).norm() / g64.norm())
            cols.append(f"{'masked' if m is not None else 'unmasked'} f64 {t64:.3f} ms, f32 {t32:.3f} ms "
                        f"(x{t64 / t32:.2f}; |dloss| {abs(l32 - l64):.1e}, grad rel diff {rel:.1e})")
        print(f"{w}x{h} loss: " + "; ".join(cols))


if __name__ == "__main__":
    main()
