"""Throwaway: why is the graph step slower than eager at 1M Gaussians, 800x800?"""
import sys, time
sys.path.insert(0, "bench")
import torch
import train_step as ts
import rigel_core as rc
import rigel_core.train.trainer as trmod
import rigel_core.train.graph_step as gmod
from rigel_core.cuda_backend import FixedBinningCapacity
from rigel_core.train.trainer import Trainer

dev = torch.device("cuda")
base, camera = ts.load("1M", dev)
base = base.to(device=dev, dtype=torch.float32)
if base.sh_degree != 3:
    base = base.with_sh_degree(3)
cam = camera(800, 800)
with torch.no_grad():
    first = rc.render(base, cam).image.clamp(0, 1)
    target = torch.roll(first, shifts=(16, 16), dims=(0, 1)).contiguous()
ds = ts.one_view_dataset(cam, target, base.extent())

def make(graph):
    cfg = ts.bench_config(); cfg.cuda_graph = graph
    return Trainer(ds, cfg, model=ts.clone_model(base), device=dev)

t = make(True); print("graph", ts.trainer_throughput(t, 50, 10), flush=True)
gs = t.graph_step; cap = max(c.capacity for c in gs.graphs.values())
print("capacity", cap, "seen", max(e for e, _ in gs._recent[(800, 800)]), "captures", gs.captures, "overflows", gs.overflows)
print(ts.profile(t.step, 20, "graph step")[:6000])
del t; torch.cuda.empty_cache()
t = make(False); print("eager", ts.trainer_throughput(t, 50, 10), flush=True)
orig = trmod.render
def fixed_render(*a, **k):
    with FixedBinningCapacity(cap):
        return orig(*a, **k)
trmod.render = fixed_render
print("eager + fixed capacity binning", ts.trainer_throughput(t, 50, 10), flush=True)
trmod.render = orig
print(ts.profile(t.step, 20, "eager step")[:6000])
del t; torch.cuda.empty_cache()
gmod.CAPACITY_MARGIN = 1.0
t = make(True); print("graph margin 1.0", ts.trainer_throughput(t, 50, 10), flush=True)
