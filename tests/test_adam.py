"""rigel_core.train.optim.Adam: every group in one CUDA launch (csrc/adam.cu) against PyTorch's own Adam run
independently in float64 on the CPU (foreach and fused off: the plain per-tensor loop), fresh random inputs."""
import copy
import math

import pytest
import torch

from rigel_core import _ext
from rigel_core.train.optim import Adam

gpu = pytest.mark.gpu  # skipped with the reason by conftest.py where there is no GPU or no built kernels
DEV = torch.device("cuda")

# odd sizes (one element, not a multiple of the 2048 a block takes, several blocks), as the trainer's groups
SHAPES = [(1,), (3,), (4097, 3), (2049, 15, 3), (70001, 4), (5, 1, 3)]


def make_groups(rng, shapes, device, dtype):
    """Parameters ~ N(0, 1), one group each, with its own lr, betas and eps."""
    groups = []
    for i, shape in enumerate(shapes):
        p = torch.randn(shape, generator=rng, dtype=torch.float64).to(device, dtype).requires_grad_()
        lr = float(10 ** (-4 + 2 * torch.rand((), generator=rng)))
        betas = (0.9, 0.999) if i % 2 == 0 else (0.81, 0.998)
        groups.append({"params": [p], "lr": lr, "betas": betas, "eps": 1e-15 if i % 3 else 1e-8, "name": f"g{i}"})
    return groups


def twin(groups, device, dtype):
    """The same groups with copies of the parameters on ``device`` in ``dtype``."""
    out = []
    for g in groups:
        h = {k: v for k, v in g.items() if k != "params"}
        h["params"] = [g["params"][0].detach().to(device, dtype).clone().requires_grad_()]
        out.append(h)
    return out


def set_grads(rng, groups_list):
    """The same fresh N(0, 1) gradient on the corresponding parameter of every list of groups."""
    for gs in zip(*groups_list):
        g = torch.randn(gs[0]["params"][0].shape, generator=rng, dtype=torch.float64)
        for grp in gs:
            p = grp["params"][0]
            p.grad = g.to(p.device, p.dtype).clone()


def rel(a, b):
    a, b = a.detach().double().cpu(), b.detach().double().cpu()
    return float((a - b).norm() / b.norm().clamp_min(1e-300))


def assert_matches(opt, ref):
    """Parameters to 1e-6 absolute (steps are ~lr ≤ 1e-2 each), moments in norm: exp_avg to 1e-5 relative, exp_avg_sq
    to 2e-4 — in float32 1 − β₂ itself carries up to ulp(1)/(1 − β₂) ≈ 6e-5 relative at β₂ = 0.999 (torch's fused
    Adam as much; seen on the H200). Elementwise relative checks of the moments would fail on honest rounding where
    two steps' gradients cancel."""
    for g, h in zip(opt.param_groups, ref.param_groups):
        p, q = g["params"][0], h["params"][0]
        torch.testing.assert_close(p.detach().cpu().double(), q.detach(), rtol=1e-5, atol=1e-6, msg=g["name"])
        s, t = opt.state[p], ref.state[q]
        if not t:  # never had a gradient: no state on either side
            assert not s, g["name"]
            continue
        errors = {k: rel(s[k], t[k]) for k in ("exp_avg", "exp_avg_sq")}
        assert errors["exp_avg"] <= 1e-5 and errors["exp_avg_sq"] <= 2e-4, f"{g['name']}: {errors}"
        assert float(s["step"]) == float(t["step"])
        assert s["step"].dtype == torch.float32 and s["step"].device == p.device and s["step"].dim() == 0


def test_cpu_parameters_take_torch_adam(rng):
    """On the CPU (the reference backend) the class is PyTorch's Adam: same result as torch.optim.Adam, bit for
    bit, and the one-launch path declines."""
    groups = make_groups(rng, SHAPES[:3], "cpu", torch.float32)
    ours, theirs = Adam(groups, eps=1e-15), torch.optim.Adam(twin(groups, "cpu", torch.float32), eps=1e-15)
    assert ours._kernel_groups() is None
    for _ in range(3):
        set_grads(rng, [ours.param_groups, theirs.param_groups])
        ours.step()
        theirs.step()
    for g, h in zip(ours.param_groups, theirs.param_groups):
        assert torch.equal(g["params"][0], h["params"][0])


def test_make_optimizer_makes_every_parameter_contiguous(rng):
    """A model read from a 3DGS PLY holds sh_rest as a channel-major transpose (not contiguous); the optimiser's
    parameters (which the model then holds) are contiguous, so the one-launch Adam takes them on the GPU."""
    from rigel_core.model import GaussianModel, PARAM_NAMES
    from rigel_core.train.config import TrainConfig
    from rigel_core.train.optim import make_optimizer

    n = 7
    tensors = [torch.randn(n, 3, generator=rng), torch.randn(n, 3, generator=rng), torch.randn(n, 4, generator=rng),
               torch.randn(n, generator=rng), torch.randn(n, 1, 3, generator=rng),
               torch.randn(n, 3, 15, generator=rng).transpose(1, 2)]
    model = GaussianModel(*tensors)
    assert not model.sh_rest.is_contiguous()
    opt = make_optimizer(model, TrainConfig(), 1.0)
    for g in opt.param_groups:
        assert g["params"][0].is_contiguous() and g["params"][0] is getattr(model, g["name"])
    assert torch.equal(model.sh_rest, tensors[5])
    assert [g["name"] for g in opt.param_groups] == list(PARAM_NAMES)


@gpu
def test_one_launch_adam_matches_float64_adam(rng):
    groups = make_groups(rng, SHAPES, DEV, torch.float32)
    ref = torch.optim.Adam(twin(groups, "cpu", torch.float64), foreach=False, fused=False)
    opt = Adam(groups, fused=True)
    assert opt._kernel_groups() is not None
    for _ in range(4):
        set_grads(rng, [opt.param_groups, ref.param_groups])
        opt.step()
        ref.step()
    assert_matches(opt, ref)
    # the state PyTorch's fused Adam keeps: a plain torch Adam takes it over (checkpoints, resume)
    other = torch.optim.Adam(twin(groups, DEV, torch.float32), fused=True)
    other.load_state_dict(copy.deepcopy(opt.state_dict()))


@gpu
def test_found_inf_skips_everything_then_steps(rng):
    groups = make_groups(rng, SHAPES, DEV, torch.float32)
    ref = torch.optim.Adam(twin(groups, "cpu", torch.float64), foreach=False, fused=False)
    opt = Adam(groups, fused=True)
    set_grads(rng, [opt.param_groups, ref.param_groups])
    opt.step()
    ref.step()
    before = [(g["params"][0].clone(), {k: v.clone() for k, v in opt.state[g["params"][0]].items()})
              for g in opt.param_groups]
    set_grads(rng, [opt.param_groups])
    for g in opt.param_groups:  # a poisoned gradient: the guard is what keeps it out
        g["params"][0].grad[..., 0] = float("nan")
    opt.found_inf = torch.ones((), device=DEV)
    opt.step()
    for g, (p0, s0) in zip(opt.param_groups, before):
        p = g["params"][0]
        assert torch.equal(p, p0)
        for k, v in opt.state[p].items():
            assert torch.equal(v, s0[k]), k
    opt.found_inf = torch.zeros((), device=DEV)
    set_grads(rng, [opt.param_groups, ref.param_groups])
    opt.step()
    ref.step()
    assert_matches(opt, ref)


@gpu
def test_device_learning_rates_equal_host_ones_and_replay_in_a_graph(rng):
    """lr as one-element device tensors (what the captured step reads) gives the host-lr result bit for bit, and a
    captured step replayed with new rates and gradients equals eager steps with them."""
    groups = make_groups(rng, SHAPES, DEV, torch.float32)
    host = Adam(twin(groups, DEV, torch.float32), fused=True)
    dev_groups = twin(groups, DEV, torch.float32)
    lrs = [torch.tensor(g["lr"], dtype=torch.float32, device=DEV) for g in dev_groups]
    for g, lr in zip(dev_groups, lrs):
        g["lr"] = lr
    opt = Adam(dev_groups, fused=True)
    set_grads(rng, [host.param_groups, opt.param_groups])
    host.step()
    opt.step()  # eager, also creates the state before the capture
    for g, h in zip(host.param_groups, opt.param_groups):
        assert torch.equal(g["params"][0], h["params"][0])
    for g in host.param_groups:  # host lrs as float32 values: the device tensors hold the same
        g["lr"] = float(torch.tensor(g["lr"], dtype=torch.float32))
    grads = [g["params"][0].grad for g in opt.param_groups]  # static buffers the graph reads
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.stream(side):
        graph.capture_begin()
        opt.step()
        graph.capture_end()
    torch.cuda.current_stream().wait_stream(side)
    # capturing ran nothing: the parameters are still those of the eager step
    for g, h in zip(host.param_groups, opt.param_groups):
        assert torch.equal(g["params"][0], h["params"][0])
    for _ in range(3):
        new_lrs = [float(torch.rand((), generator=rng)) * 1e-2 for _ in lrs]
        for lr, v, g in zip(lrs, new_lrs, host.param_groups):
            lr.fill_(v)
            g["lr"] = float(torch.tensor(v, dtype=torch.float32))
        set_grads(rng, [host.param_groups])
        for buf, g in zip(grads, host.param_groups):
            buf.copy_(g["params"][0].grad)
        graph.replay()
        host.step()
    torch.cuda.synchronize()
    for g, h in zip(host.param_groups, opt.param_groups):
        assert torch.equal(g["params"][0], h["params"][0]), g["name"]
        assert float(host.state[g["params"][0]]["step"]) == float(opt.state[h["params"][0]]["step"]) == 4


@gpu
def test_more_groups_than_one_launch_takes_and_missing_gradients(rng):
    groups = make_groups(rng, [(int(n),) for n in torch.randint(1, 5000, (21,), generator=rng)], DEV, torch.float32)
    ref = torch.optim.Adam(twin(groups, "cpu", torch.float64), foreach=False, fused=False)
    opt = Adam(groups, fused=True)
    untouched = opt.param_groups[7]["params"][0]
    start = untouched.detach().clone()
    for _ in range(2):
        set_grads(rng, [opt.param_groups, ref.param_groups])
        untouched.grad = None
        ref.param_groups[7]["params"][0].grad = None
        opt.step()
        ref.step()
    assert torch.equal(untouched, start) and len(opt.state[untouched]) == 0
    assert_matches(opt, ref)


@gpu
def test_what_the_kernel_does_not_do_goes_to_torch(rng):
    """Weight decay (and amsgrad, float64, CPU, a closure) take torch's Adam: still the right result."""
    groups = make_groups(rng, SHAPES[:3], DEV, torch.float32)
    for g in groups:
        g["weight_decay"] = 0.1
    ref = torch.optim.Adam(twin(groups, "cpu", torch.float64), foreach=False, fused=False)
    opt = Adam(groups, fused=True)
    set_grads(rng, [opt.param_groups, ref.param_groups])
    assert opt._kernel_groups() is None
    opt.step()
    ref.step()
    assert_matches(opt, ref)
    d = make_groups(rng, SHAPES[:2], DEV, torch.float64)
    set_grads(rng, [d])
    assert Adam(d)._kernel_groups() is None
    assert Adam(make_groups(rng, SHAPES[:2], DEV, torch.float32), amsgrad=True)._kernel_groups() is None


@gpu
def test_adam_step_refuses_bad_arguments():
    C = _ext.get()
    p = torch.zeros(10, device=DEV)
    z, s = torch.zeros_like(p), torch.zeros((), device=DEV)
    ok = dict(params=[p], grads=[z], exp_avgs=[z.clone()], exp_avg_sqs=[z.clone()], steps=[s], lrs=[1e-3],
              lr_tensors=[None], beta1s=[0.9], beta2s=[0.999], epss=[1e-15])
    C.adam_step(**ok)
    with pytest.raises(ValueError, match="one entry per group"):
        C.adam_step(**{**ok, "grads": [z, z]})
    with pytest.raises(ValueError, match=r"grads\[0\] must be"):
        C.adam_step(**{**ok, "grads": [torch.zeros(11, device=DEV)]})
    with pytest.raises(TypeError, match=r"exp_avgs\[0\] must be"):
        C.adam_step(**{**ok, "exp_avgs": [z.double()]})
    with pytest.raises(TypeError, match=r"steps\[0\] must be a one-element float32"):
        C.adam_step(**{**ok, "steps": [s.cpu()]})
    with pytest.raises(ValueError, match="beta1"):
        C.adam_step(**{**ok, "beta1s": [1.0]})
    with pytest.raises(ValueError, match="at most 16 groups"):
        C.adam_step(**{k: v * 17 for k, v in ok.items()})
    with pytest.raises(TypeError, match="found_inf must be"):
        C.adam_step(**ok, found_inf=torch.zeros(()))


def sparse_reference_steps(groups64, grads_per_step):
    """TrainConfig.sparse_adam's rule written out in float64, element by element: an element whose gradient is 0
    keeps its value and both moments; the group's step count advances. Returns the final (p, m, v) per group."""
    out = []
    for gi, g in enumerate(groups64):
        p = g["params"][0].detach().clone()
        m, v = torch.zeros_like(p), torch.zeros_like(p)
        b1, b2 = g["betas"]
        for t, grads in enumerate(grads_per_step, start=1):
            gr = grads[gi]
            live = gr != 0
            m = torch.where(live, b1 * m + (1 - b1) * gr, m)
            v = torch.where(live, b2 * v + (1 - b2) * gr * gr, v)
            upd = g["lr"] / (1 - b1 ** t) * m / (v.sqrt() / math.sqrt(1 - b2 ** t) + g["eps"])
            p = torch.where(live, p - upd, p)
        out.append((p, m, v))
    return out


def sparse_grads(rng, groups, steps):
    """Per step and group a N(0, 1) gradient (float64) with ~40 % of its rows and ~10 % of its other elements 0."""
    all_steps = []
    for _ in range(steps):
        per = []
        for g in groups:
            shape = g["params"][0].shape
            gr = torch.randn(shape, generator=rng, dtype=torch.float64)
            rows = torch.rand(shape[0], generator=rng, dtype=torch.float64) < 0.4
            gr[rows] = 0.0
            gr[torch.rand(shape, generator=rng, dtype=torch.float64) < 0.1] = 0.0
            per.append(gr)
        all_steps.append(per)
    return all_steps


def run_sparse(opt, grads_per_step):
    """Steps ``opt`` (sparse) through the gradients; checks after each step that every zero-gradient element kept
    its value and moments exactly."""
    for grads in grads_per_step:
        before = []
        for g, gr in zip(opt.param_groups, grads):
            p = g["params"][0]
            p.grad = gr.to(p.device, p.dtype).clone()
            st = opt.state[p]
            before.append((p.detach().clone(), {k: st[k].clone() for k in ("exp_avg", "exp_avg_sq") if k in st}))
        opt.step()
        for g, gr, (p0, s0) in zip(opt.param_groups, grads, before):
            p, zero = g["params"][0], (gr == 0).to(g["params"][0].device)
            assert torch.equal(p[zero], p0[zero]), g["name"]
            for k, v in s0.items():
                assert torch.equal(opt.state[p][k][zero], v[zero]), (g["name"], k)
            if bool((~zero).any()):
                assert bool((p[~zero] != p0[~zero]).any()), g["name"]  # the live elements did move


def assert_sparse_matches(opt, ref):
    for g, (p, m, v) in zip(opt.param_groups, ref):
        q = g["params"][0]
        torch.testing.assert_close(q.detach().cpu().double(), p, rtol=1e-5, atol=1e-6, msg=g["name"])
        st = opt.state[q]
        assert rel(st["exp_avg"], m) <= 1e-5 and rel(st["exp_avg_sq"], v) <= 2e-4, g["name"]


def test_sparse_adam_on_the_torch_path(rng):
    """``sparse`` on the CPU (torch's Adam, then the zero-gradient elements put back) against the rule in float64."""
    groups = make_groups(rng, SHAPES[:5], "cpu", torch.float32)
    ref_groups = twin(groups, "cpu", torch.float64)
    opt = Adam(groups, fused=True)
    opt.sparse = True
    assert opt._kernel_groups() is None
    grads = sparse_grads(rng, groups, 4)
    run_sparse(opt, grads)
    assert_sparse_matches(opt, sparse_reference_steps(ref_groups, grads))


def test_sparse_adam_is_off_by_default_and_set_from_the_config(rng):
    from rigel_core.model import GaussianModel
    from rigel_core.train.config import TrainConfig
    from rigel_core.train.optim import make_optimizer

    n = 5
    shapes = [(n, 3), (n, 3), (n, 4), (n,), (n, 1, 3), (n, 15, 3)]
    model = GaussianModel(*[torch.randn(s, generator=rng) for s in shapes])
    assert Adam.sparse is False and make_optimizer(model, TrainConfig(), 1.0).sparse is False
    model = GaussianModel(*[torch.randn(s, generator=rng) for s in shapes])
    assert make_optimizer(model, TrainConfig(sparse_adam=True), 1.0).sparse is True
    with pytest.raises((TypeError, ValueError), match="sparse_adam"):
        TrainConfig(sparse_adam="yes").validate()


@gpu
def test_sparse_adam_one_launch_matches_the_rule(rng):
    groups = make_groups(rng, SHAPES, DEV, torch.float32)
    ref_groups = twin(groups, "cpu", torch.float64)
    opt = Adam(groups, fused=True)
    opt.sparse = True
    assert opt._kernel_groups() is not None
    grads = sparse_grads(rng, groups, 4)
    run_sparse(opt, grads)
    assert_sparse_matches(opt, sparse_reference_steps(ref_groups, grads))
    # sparse off again: the zero-gradient elements take a dense step (their momentum moves them)
    p0 = [g["params"][0].detach().clone() for g in opt.param_groups]
    opt.sparse = False
    for g in opt.param_groups:
        g["params"][0].grad = torch.zeros_like(g["params"][0])
    opt.step()
    assert any(not torch.equal(g["params"][0], q) for g, q in zip(opt.param_groups, p0))
