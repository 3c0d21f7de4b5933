"""How close each rigel kernel is to the GPU's limits (issue 39.3): Nsight Compute's achieved DRAM bandwidth and SM
throughput, as fractions of the GPU's peak, for the render forward, the render backward and one whole training step.

Scenes and cameras are bench/forward.py's (the procedural scene, SH degree 3: 300k, 1M, 3M Gaussians) at bench/
train_step.py's resolutions (800x800, 1920x1080). Per (size, resolution) the driver runs ``--warmup`` untimed and
``--iters`` timed iterations (CUDA events: the stage's GPU time outside the profiler's replays), then exactly one
*marked* iteration of each stage between ``cudaProfilerStart`` / ``cudaProfilerStop`` inside an NVTX range
``roofline.SIZE.WxH.STAGE``:

* **forward**: ``render(model, camera)`` with every parameter requiring its gradient (activations, SH, projection,
  binning, rasterization: what a training step's render runs);
* **backward**: that image's backward from a fixed random ∂L/∂image to every pre-activation parameter;
* **step**: one ``Trainer.step()`` (bench/train_step.py's configuration: densification, opacity reset and evaluation
  off) on a one-view dataset whose target is the scene's render shifted by 2 %, eager (``cuda_graph`` off: the
  captured step replays the same kernels, and ncu attributes eager launches to their NVTX range directly).

``--ncu`` re-launches the driver once per size under ``ncu --clock-control none --profile-from-start off --nvtx
--csv --metrics ...`` (so only the marked iterations are profiled; each kernel is replayed for its counters, caches
flushed between passes), parses the CSV and writes a markdown table: per kernel and stage, time, DRAM throughput
(% of peak, GB/s), SM throughput (% of peak), L2 and overall memory throughput, achieved occupancy, what bounds it
(:func:`bound_by`) and how far it is from that roofline. ``--kernels rigel`` (default) profiles only rigel's own
kernels (the ``__global__`` functions of csrc/) and the CUB kernels (binning's scan and radix sort): a few dozen
per (size, resolution) instead of a step's hundred-odd small PyTorch launches; ``--kernels all`` profiles every
launch and groups PyTorch's as "other (PyTorch)". ``--budget`` bounds the wall time: a size starts only with
:data:`MIN_LEFT_S` left, its driver starts no stage in the budget's last :data:`STAGE_RESERVE_S` (it exits, and ncu
prints what it profiled), a run past the budget is stopped; the table's notes say what was left out.

    python bench/roofline.py --ncu [--sizes 300k,1M,3M] [--res 800,1080p] [--stages forward,backward,step]
                                   [--kernels rigel|all] [--budget 150] [--ncu-path PATH]
    python bench/roofline.py --sizes 1M --res 800     # the marked driver alone (under a hand-made ncu command)
    python bench/roofline.py --parse DIR              # the table again from a run's roofline_SIZE.csv / .json

Writes ``$OUT/roofline.md``, ``$OUT/summary.txt`` (one line) and, per size, ncu's raw CSV ``roofline_SIZE.csv``,
the driver's plan and stage times ``roofline_SIZE.json`` and the log ``roofline_SIZE.log`` (``--out DIR`` instead
of OUT; neither: a fresh temporary directory; one that holds a run already is refused). Exit status 2 with one
line when CUDA, the compiled kernels or ncu are missing or the directory holds a run; 1 when no kernel was
profiled.
"""
from __future__ import annotations

import argparse
import contextlib
import csv
import datetime
import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.bench_common import commit  # noqa: E402
from bench.forward import PLYS, PROCEDURAL  # noqa: E402
from bench.train_step import RES  # noqa: E402
from rigel_core.atomic import atomic_path  # noqa: E402
from rigel_core.cli.common import Parser  # noqa: E402

#: the counters asked of ncu (one or two replay passes a kernel), by the short name the table uses
METRICS = {
    "time": "gpu__time_duration.sum",
    "dram": "dram__throughput.avg.pct_of_peak_sustained_elapsed",
    "sm": "sm__throughput.avg.pct_of_peak_sustained_elapsed",
    "mem": "gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed",  # max of DRAM, L2, L1/shared
    "l2": "lts__throughput.avg.pct_of_peak_sustained_elapsed",
    "occ": "sm__warps_active.avg.pct_of_peak_sustained_active",
    "dram_bytes": "dram__bytes.sum",
}
#: what is asked after an ncu refused the full set (an older ncu without one of the metrics)
MINIMAL_METRICS = [METRICS[k] for k in ("time", "dram", "sm", "dram_bytes")]
STAGES = ("forward", "backward", "step")
#: below this % of peak on both the memory and the SM side a kernel is called latency-bound (neither unit busy)
LATENCY_BELOW = 40.0
#: L2 (or L1/shared) names the memory bound only when its throughput exceeds DRAM's by more than this (% points)
UNIT_MARGIN = 5.0
TAG_PREFIX = "roofline"
TAG_RE = re.compile(r"roofline\.([A-Za-z0-9_]+)\.(\d+x\d+)\.(forward|backward|step)")
#: the kernel of ``torch.cuda._sleep``: launched before each marked stage, it delimits the stages when the CSV has
#: no NVTX column
MARKER = "spin_kernel"
OTHER = "other (PyTorch)"
DEFAULT_SIZES = "300k,1M,3M"
DEFAULT_RES = "800,1080p"
#: --ncu: a size starts only with this many seconds of the budget left; its driver starts no stage in the last
#: STAGE_RESERVE_S (the stage in progress still has its kernels replayed, then ncu prints the CSV)
MIN_LEFT_S = 35.0
STAGE_RESERVE_S = 25.0
#: --ncu: the stage times come from one run of the driver without a profiler, before the ncu runs, in at most this
#: fraction of the budget; its plan is this file of the results directory
TIMES_SHARE = 0.25
TIMES_PLAN = "times.json"
# ncu prints values scaled to a unit of its choice (SI prefixes): back to ns and bytes
_SCALE = {"nsecond": 1.0, "ns": 1.0, "usecond": 1e3, "us": 1e3, "msecond": 1e6, "ms": 1e6, "second": 1e9, "s": 1e9,
          "byte": 1.0, "Kbyte": 1e3, "Mbyte": 1e6, "Gbyte": 1e9, "Tbyte": 1e12, "KB": 1e3, "MB": 1e6, "GB": 1e9,
          "%": 1.0, "": 1.0}


# ---- the ncu CSV -------------------------------------------------------------------------------------------------
@dataclass
class Kernel:
    """One profiled launch: ``pid`` / ``id`` (ncu's process and launch index), ``name`` (ncu's "Kernel Name"),
    ``tag`` (size, "WxH", stage) or None, ``values``: :data:`METRICS` key → float (time in ns, bytes, %) or None."""

    pid: str
    id: int
    name: str
    tag: tuple | None = None
    values: dict = field(default_factory=dict)


def _value(text: str, unit: str, notes: list) -> float | None:
    """A metric value of ncu's CSV in base units (ns, bytes, %); None for "n/a" or an unreadable one."""
    text = text.strip().replace(",", "")  # thousands separators (ncu runs with LC_NUMERIC=C: '.' is the point)
    try:
        v = float(text)
    except ValueError:
        return None
    unit = unit.strip()
    if unit not in _SCALE:
        notes.append(f"unknown unit {unit!r} kept unscaled")
        return v
    return v * _SCALE[unit]


def parse_ncu_csv(text: str, notes: list | None = None) -> list[Kernel]:
    """The launches of ``ncu --csv --metrics ...`` output ``text`` (the details page: one row per launch and metric,
    columns "ID", "Process ID", ..., "Kernel Name", ..., "Metric Name", "Metric Unit", "Metric Value", and with
    ``--nvtx`` one column per NVTX range kind, e.g. "thread Domain:Push/Pop_Range:..."), in launch order. Lines
    that are not CSV rows (``==PROF==`` messages, the driver's output) are skipped; a launch's stage is the last
    ``roofline.SIZE.WxH.STAGE`` range found in its NVTX cells. ``notes`` collects what could not be read."""
    notes = [] if notes is None else notes
    lines = text.splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith('"ID",')), None)
    if start is None:
        return []
    rows = csv.DictReader([line for line in lines[start:] if line.startswith('"')])
    header = rows.fieldnames or []
    missing = {"ID", "Kernel Name", "Metric Name", "Metric Unit", "Metric Value"} - set(header)
    if missing:
        notes.append(f"ncu CSV without the column(s) {', '.join(sorted(missing))}")
        return []
    range_cols = [c for c in header if "Range" in c]  # Push/Pop_Range, Start/Stop_Range
    by_name = {v: k for k, v in METRICS.items()}
    kernels: dict[tuple, Kernel] = {}
    for row in rows:
        try:
            kid = int(str(row["ID"]).strip())
        except ValueError:
            continue
        key = (row.get("Process ID", ""), kid)
        k = kernels.get(key)
        if k is None:
            k = kernels[key] = Kernel(str(row.get("Process ID", "")), kid, (row["Kernel Name"] or "").strip())
            for c in range_cols:
                found = TAG_RE.findall(row.get(c) or "")
                if found:
                    k.tag = found[-1]
        short = by_name.get((row["Metric Name"] or "").strip())
        if short is not None:
            k.values[short] = _value(row["Metric Value"] or "", row["Metric Unit"] or "", notes)
    return sorted(kernels.values(), key=lambda k: (k.pid, k.id))


def assign_stages(kernels: list[Kernel], plan: list[str] | None = None) -> list[Kernel]:
    """``kernels`` (in launch order) without the marker launches, each with its stage: its NVTX tag where ncu saw
    one, else the ``plan``'s tag of the last marker before it (the n-th marker opens the n-th tag's launches). The
    second covers what NVTX misses: a push/pop range belongs to the thread that pushed it, and the autograd engine
    launches a backward's kernels from its own thread; an ncu without NVTX columns."""
    plan_tags = [TAG_RE.fullmatch(t).groups() for t in plan or [] if TAG_RE.fullmatch(t)]
    out, n = [], -1
    for k in kernels:
        if MARKER in k.name:
            n += 1
            continue
        if k.tag is None and 0 <= n < len(plan_tags):
            k.tag = plan_tags[n]
        out.append(k)
    return out


# ---- kernels and bounds --------------------------------------------------------------------------------------------
def rigel_kernel_names(csrc: Path = ROOT / "csrc") -> set[str]:
    """The ``__global__`` functions of rigel's CUDA sources (``csrc/*.cu``)."""
    pat = re.compile(r"__global__\s+void\s+(?:__launch_bounds__\s*\([^)]*\)\s*)?(\w+)\s*\(")
    return {m for f in sorted(csrc.glob("*.cu*")) for m in pat.findall(f.read_text(errors="replace"))}


def kernel_filter(names: set[str]) -> str:
    """ncu's ``--kernel-name`` value that keeps ``names``, CUB's ``Device*Kernel`` and the stage marker."""
    return "regex:.*(" + "|".join(sorted(names) + ["Device", MARKER]) + ").*"


def base_name(name: str) -> str:
    """A kernel's function name without return type, namespaces, template arguments and parameters. An anonymous
    namespace is "(anonymous namespace)" in some demanglers and "<unnamed>" in ncu 2025's (whose '<' would otherwise
    be read as the start of template arguments)."""
    name = name.replace("(anonymous namespace)::", "").replace("<unnamed>::", "")
    name = re.split(r"[<(]", name, maxsplit=1)[0].strip()
    return name.split("::")[-1].split()[-1] if name.split("::")[-1].split() else name


def kernel_label(name: str, rigel: set[str]) -> str:
    """How the table names a launch: rigel's kernels by name, CUB's as "CUB name", everything else as :data:`OTHER`."""
    base = base_name(name)
    if base in rigel:
        return base
    if base.startswith("Device") and base.endswith("Kernel"):
        return f"CUB {base}"
    return OTHER


def bound_by(dram: float | None, sm: float | None, mem: float | None = None, l2: float | None = None,
             latency_below: float = LATENCY_BELOW) -> tuple[str, float | None]:
    """(what bounds a kernel, its distance to that roofline as % of peak) from its throughputs in % of peak: DRAM,
    SM, the overall memory one (``mem``: max of DRAM, L2 and L1/shared) and L2. "latency" when neither the memory
    side nor the SM side reaches ``latency_below``; else "memory (DRAM|L2|L1)" when the memory side is at least
    the SM's (L2 or L1 named only when over DRAM by more than :data:`UNIT_MARGIN` points), "compute" otherwise.
    The second value is the busier side's %: 100 would be the roofline itself. ("?", None) without a number."""
    memory_side = [v for v in (dram, mem, l2) if v is not None]
    memory = max(memory_side) if memory_side else None
    sides = [v for v in (memory, sm) if v is not None]
    if not sides:
        return "?", None
    top = max(sides)
    if top < latency_below:
        return "latency", top
    if memory is None or (sm is not None and sm > memory):
        return "compute", top
    unit, best = "DRAM", dram if dram is not None else -math.inf
    if l2 is not None and l2 > best + UNIT_MARGIN:
        unit, best = "L2", l2
    if mem is not None and mem > best + UNIT_MARGIN and (l2 is None or mem > l2 + UNIT_MARGIN):
        unit = "L1"
    return f"memory ({unit})", top


def _wavg(pairs) -> float | None:
    """Time-weighted mean of (value, weight) pairs with a value (a throughput of several launches together)."""
    pairs = [(v, w) for v, w in pairs if v is not None and w is not None and w > 0]
    total = sum(w for _, w in pairs)
    return sum(v * w for v, w in pairs) / total if total > 0 else None


@dataclass
class Row:
    """One table row: a kernel (several launches of it summed) of one stage, or the stage's total."""

    size: str
    res: str
    stage: str
    kernel: str
    launches: int
    time_ns: float
    values: dict

    @property
    def bound(self) -> tuple[str, float | None]:
        v = self.values
        return bound_by(v.get("dram"), v.get("sm"), v.get("mem"), v.get("l2"))

    @property
    def dram_gbs(self) -> float | None:
        b = self.values.get("dram_bytes")
        return b / self.time_ns if b is not None and self.time_ns > 0 else None  # bytes/ns = GB/s


def combine(size: str, res: str, stage: str, label: str, kernels: list[Kernel]) -> Row:
    """The row of ``kernels`` together: times and DRAM bytes summed, throughputs time-weighted."""
    times = [k.values.get("time") or 0.0 for k in kernels]
    vals = {m: _wavg((k.values.get(m), t) for k, t in zip(kernels, times)) for m in ("dram", "sm", "mem", "l2", "occ")}
    bytes_ = [k.values.get("dram_bytes") for k in kernels]
    vals["dram_bytes"] = sum(b for b in bytes_ if b is not None) if any(b is not None for b in bytes_) else None
    return Row(size, res, stage, label, len(kernels), sum(times), vals)


def summarize(kernels: list[Kernel], rigel: set[str]) -> dict:
    """{(size, res, stage): (total Row, [kernel Rows, heaviest first])} of the tagged launches."""
    groups: dict[tuple, dict[str, list[Kernel]]] = {}
    for k in kernels:
        if k.tag is not None:
            groups.setdefault(tuple(k.tag), {}).setdefault(kernel_label(k.name, rigel), []).append(k)
    out = {}
    for key, by_label in groups.items():
        rows = sorted((combine(*key, label, ks) for label, ks in by_label.items()), key=lambda r: -r.time_ns)
        out[key] = (combine(*key, "all profiled", [k for ks in by_label.values() for k in ks]), rows)
    return out


# ---- the markdown ------------------------------------------------------------------------------------------------
def _f(v, spec=".1f") -> str:
    return "-" if v is None else format(v, spec)


def _stage_order(key) -> tuple:
    size, res, stage = key
    w, h = (int(x) for x in res.split("x"))
    return (PROCEDURAL.get(size, math.inf), size, w * h, STAGES.index(stage) if stage in STAGES else 9)


def markdown(summary: dict, meta: str, plans: dict, kernels_mode: str, notes: list[str],
             times: dict | None = None) -> str:
    """The report: a per-stage table, then every kernel row; ``plans`` {size: the driver's plan under ncu (N)};
    ``times`` the plan of the driver's run without a profiler (:data:`TIMES_PLAN`), whose stage times the table
    gives: under ncu every launch goes through its interception, which inflates a launch-bound stage several-fold."""
    stage_ms = dict((times or {}).get("stage_ms") or {})
    gaussians = {k: v for p in plans.values() for k, v in (p.get("gaussians") or {}).items()}
    scope = ("rigel's kernels (csrc/) and CUB's only; the PyTorch launches between them are not profiled, so "
             "'profiled µs' can fall short of the stage's event time" if kernels_mode == "rigel" else
             "every launch; PyTorch's are summed as 'other (PyTorch)'")
    lines = [f"# rigel roofline — Nsight Compute ({meta})", "",
             "One marked iteration per stage, each kernel replayed by `ncu --clock-control none` for its counters "
             f"(caches flushed between passes); {scope}. % = the unit's achieved throughput as a percentage of its "
             "peak over the kernel's duration (ncu's `pct_of_peak_sustained_elapsed`); memory % = the busiest "
             "memory unit (DRAM, L2, L1/shared); occupancy = achieved warps / the SM's maximum. Bound by: 'latency' "
             f"when neither the memory side nor the SM side reaches {LATENCY_BELOW:.0f} %, else the busier side "
             f"(memory named L2 or L1 when over DRAM by more than {UNIT_MARGIN:.0f} points); '% of roofline' = "
             "that side's % (100 = at the roofline). Stage totals: times summed, throughputs time-weighted. "
             "stage ms (events): the stage's median CUDA-event time over the timed iterations of the same driver "
             "run without a profiler ('-' where that run did not reach the stage; the Trainer step includes its "
             "host syncs).", "",
             "## Per stage", "",
             "| size | N | resolution | stage | stage ms (events) | kernels profiled | profiled µs | DRAM % | "
             "DRAM GB/s | SM % | memory % | bound by | % of roofline | heaviest kernel: µs, bound, % of roofline |",
             "|---|---:|---|---|---:|---:|---:|---:|---:|---:|---:|---|---:|---|"]
    for key in sorted(summary, key=_stage_order):
        total, rows = summary[key]
        size, res, stage = key
        tag = f"{TAG_PREFIX}.{size}.{res}.{stage}"
        top = rows[0]
        tb, tr = top.bound
        b, r = total.bound
        lines.append(f"| {size} | {_f(gaussians.get(size), ',')} | {res} | {stage} | {_f(stage_ms.get(tag), '.3f')} | "
                     f"{total.launches} | {total.time_ns / 1e3:.1f} | {_f(total.values['dram'])} | "
                     f"{_f(total.dram_gbs, '.0f')} | {_f(total.values['sm'])} | {_f(total.values['mem'])} | {b} | "
                     f"{_f(r)} | {top.kernel}: {top.time_ns / 1e3:.1f}, {tb}, {_f(tr)} |")
    lines += ["", "## Per kernel", "",
              "| size | resolution | stage | kernel | launches | µs | DRAM % | DRAM GB/s | SM % | L2 % | memory % | "
              "occupancy % | bound by | % of roofline |",
              "|---|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|"]
    for key in sorted(summary, key=_stage_order):
        for row in summary[key][1]:
            b, r = row.bound
            v = row.values
            lines.append(f"| {row.size} | {row.res} | {row.stage} | {row.kernel} | {row.launches} | "
                         f"{row.time_ns / 1e3:.1f} | {_f(v['dram'])} | {_f(row.dram_gbs, '.0f')} | {_f(v['sm'])} | "
                         f"{_f(v['l2'])} | {_f(v['mem'])} | {_f(v['occ'])} | {b} | {_f(r)} |")
    if notes:
        lines += ["", "Notes:", ""] + [f"- {n}" for n in notes]
    return "\n".join(lines) + "\n"


def summary_line(summary: dict, n_kernels: int, seconds: float, notes: list[str]) -> str:
    """One line for device_all.sh's table: what was profiled, and the largest step's figures."""
    if not summary:
        return f"no kernel profiled in {seconds:.0f} s" + (f"; {notes[-1]}" if notes else "")
    steps = [k for k in summary if k[2] == "step"] or list(summary)
    key = max(steps, key=_stage_order)
    total, rows = summary[key]
    b, r = total.bound
    tb, tr = rows[0].bound
    return (f"{len(summary)} stages, {n_kernels} kernels profiled in {seconds:.0f} s; {' '.join(key)}: DRAM "
            f"{_f(total.values['dram'])} % SM {_f(total.values['sm'])} % ({b}); heaviest {rows[0].kernel} "
            f"{rows[0].time_ns / 1e3:.0f} µs {tb} at {_f(tr)} % of roofline"
            + (f"; {len(notes)} note(s)" if notes else ""))


def load_run(directory: Path, sizes: list[str] | None = None) -> tuple[list[Kernel], dict, list[str]]:
    """(launches with their stages, {size: plan}, notes) of a run directory's ``roofline_SIZE.csv`` / ``.json``."""
    kernels, plans, notes = [], {}, []
    paths = [directory / f"roofline_{s}.csv" for s in sizes] if sizes else sorted(directory.glob("roofline_*.csv"))
    for path in paths:
        if not path.exists():
            continue
        size = path.stem[len("roofline_"):]
        plan_path = path.with_suffix(".json")
        plan = json.loads(plan_path.read_text()) if plan_path.exists() else {}
        plans[size] = plan
        notes += [f"{what}: not profiled (the budget ran out)" for what in plan.get("skipped", [])]
        found = parse_ncu_csv(path.read_text(errors="replace"), notes)
        kernels += assign_stages(found, plan.get("tags"))
    return kernels, plans, sorted(set(notes))


def load_times(directory: Path) -> dict:
    """The plan of the timing run without a profiler (:data:`TIMES_PLAN`) in ``directory``; {} when absent or
    unreadable (a run cut short)."""
    try:
        return json.loads((directory / TIMES_PLAN).read_text())
    except (OSError, ValueError):
        return {}


# ---- the marked driver (runs under ncu) ----------------------------------------------------------------------------
def _say(*a) -> None:
    print(*a, file=sys.stderr, flush=True)  # stdout is ncu's CSV


def _nvtx(call: str, *a):
    """``torch.cuda.nvtx.<call>(*a)``, None where this torch has no NVTX (the markers alone delimit the stages)."""
    import torch

    try:
        return getattr(torch.cuda.nvtx, call)(*a)
    except (RuntimeError, AttributeError):
        return None


@contextlib.contextmanager
def marked(tag: str, plan: dict):
    """Profile what the block launches: the marker kernel, then the block inside the NVTX ranges ``tag`` (a
    push/pop range of this thread and a start/end range, which covers the autograd engine's thread too), between
    cudaProfilerStart and cudaProfilerStop (no-ops without a profiler attached)."""
    import torch

    torch.cuda.synchronize()
    torch.cuda.empty_cache()  # less device memory for ncu to save and restore around each replay
    plan["tags"].append(tag)
    torch.cuda.profiler.start()
    try:
        if hasattr(torch.cuda, "_sleep"):
            torch.cuda._sleep(1)
        range_id = _nvtx("range_start", tag)
        pushed = _nvtx("range_push", tag) is not None
        try:
            yield
        finally:
            if pushed:
                _nvtx("range_pop")
            if range_id is not None:
                _nvtx("range_end", range_id)
            torch.cuda.synchronize()
    finally:
        torch.cuda.profiler.stop()


def _write_json(path: Path | None, obj) -> None:
    if path is not None:
        with atomic_path(path) as tmp:
            Path(tmp).write_text(json.dumps(obj, indent=1))


def render_stages(base, cam, tags, stages, plan, args, plan_path) -> None:
    """Forward and backward of ``render`` on a copy of ``base`` whose parameters require gradients."""
    import torch

    import rigel_core as rc
    from bench.forward import median_ms
    from bench.train_step import clone_model
    from rigel_core.model import PARAM_NAMES

    model = clone_model(base)
    params = [getattr(model, p).requires_grad_(True) for p in PARAM_NAMES]
    with torch.no_grad():
        grad = torch.rand_like(rc.render(model, cam).image)  # a fixed ∂L/∂image

    def iteration(ev):
        ev[0].record()
        image = rc.render(model, cam).image
        ev[1].record()
        image.backward(grad)
        ev[2].record()
        for p in params:
            p.grad = None

    fwd_ms, bwd_ms, _ = median_ms(iteration, args.iters, warmup=args.warmup, n_events=3)
    plan["stage_ms"].update({tags["forward"]: fwd_ms, tags["backward"]: bwd_ms})
    image = None
    if args.time_only:
        stages = ()
    if "forward" in stages:
        with marked(tags["forward"], plan):
            image = rc.render(model, cam).image
    if "backward" in stages:
        if image is None:
            image = rc.render(model, cam).image
        with marked(tags["backward"], plan):
            image.backward(grad)
    _write_json(plan_path, plan)


def step_stage(base, cam, tag, plan, args, plan_path, device) -> None:
    """One eager ``Trainer.step()`` (bench/train_step.py's configuration) on a one-view dataset."""
    from bench.forward import median_ms
    from bench.train_step import bench_config, clone_model, one_view_dataset, shifted_target
    from rigel_core.train.trainer import Trainer

    _, target = shifted_target(base, cam)
    cfg = bench_config()
    cfg.cuda_graph = False
    trainer = Trainer(one_view_dataset(cam, target, base.extent()), cfg, model=clone_model(base), device=device)

    def step(ev):
        ev[0].record()
        trainer.step()
        ev[1].record()

    plan["stage_ms"][tag] = median_ms(step, args.iters, warmup=args.warmup)[0]
    if not args.time_only:
        with marked(tag, plan):
            trainer.step()
    _write_json(plan_path, plan)


def drive(args, device=None) -> int:
    """The marked iterations of every (size, resolution, stage) asked, on ``device`` (default CUDA; the tests drive
    it on the CPU); the plan (tags in order, stage ms, N, what the deadline skipped) goes to ``--plan`` after each
    stage."""
    import torch

    import rigel_core as rc
    from bench.forward import load

    dev = torch.device(device or "cuda")
    if dev.type == "cuda" and not rc.cuda_available():
        print("bench/roofline.py needs a CUDA GPU and the compiled kernels (rigel_core._C): torch.cuda.is_available() "
              f"= {torch.cuda.is_available()}", file=sys.stderr)
        return 2
    plan_path = Path(args.plan) if args.plan else None
    plan = {"tags": [], "stage_ms": {}, "gaussians": {}, "skipped": [], "device": torch.cuda.get_device_name(),
            "torch": torch.__version__, "kernels": args.kernels}

    def in_time(what: str) -> bool:  # past --deadline no stage starts: the run ends and ncu prints what it has
        if args.deadline is None or time.time() < args.deadline:
            return True
        plan["skipped"].append(what)
        _say(f"{what}: skipped (past the deadline)")
        return False

    for size in args.sizes.split(","):
        t0 = time.time()
        base, camera = load(size, dev)
        base = base.to(device=dev, dtype=torch.float32)
        if base.sh_degree != 3:
            base = base.with_sh_degree(3)
        plan["gaussians"][size] = base.num_gaussians
        _say(f"[{size}] {base.num_gaussians:,} Gaussians in {time.time() - t0:.1f} s")
        for res in args.res.split(","):
            w, h = RES[res]
            cam = camera(w, h)
            tags = {s: f"{TAG_PREFIX}.{size}.{w}x{h}.{s}" for s in STAGES}
            t1 = time.time()
            render = [s for s in ("forward", "backward") if s in args.stages]
            if render and in_time(f"{size} {w}x{h} {'+'.join(render)}"):
                render_stages(base, cam, tags, render, plan, args, plan_path)
            if "step" in args.stages and in_time(f"{size} {w}x{h} step"):
                step_stage(base, cam, tags["step"], plan, args, plan_path, dev)
            torch.cuda.empty_cache()
            _say(f"[{size} {w}x{h}] " + ", ".join(f"{s} {plan['stage_ms'].get(tags[s], math.nan):.3f} ms"
                                                  for s in args.stages) + f" ({time.time() - t1:.1f} s)")
        del base
        torch.cuda.empty_cache()
    _write_json(plan_path, plan)
    return 0


# ---- ncu orchestration ---------------------------------------------------------------------------------------------
def find_ncu(given: str | None = None) -> str | None:
    """``given``, ``$NCU``, ``ncu`` on PATH, under ``$CUDA_HOME/bin``, /usr/local/cuda*/bin or /opt/nvidia; None."""
    for c in (given, os.environ.get("NCU")):
        if c:
            return c if shutil.which(c) else None
    found = shutil.which("ncu")
    if found:
        return found
    roots = [Path(os.environ[v]) / "bin" for v in ("CUDA_HOME", "CUDA_PATH") if os.environ.get(v)]
    roots += sorted(Path("/usr/local").glob("cuda*/bin")) + sorted(Path("/opt/nvidia").glob("nsight-compute/*"))
    for r in roots:
        if (r / "ncu").is_file() and os.access(r / "ncu", os.X_OK):
            return str(r / "ncu")
    return None


def ncu_command(ncu: str, args, size: str, plan_path: Path, deadline: float, metrics=None) -> list[str]:
    """The ncu command line profiling the driver's marked iterations for one size, none started after
    ``deadline`` (epoch seconds), asking ``metrics`` (default: all of :data:`METRICS`)."""
    cmd = [ncu, "--clock-control", "none", "--profile-from-start", "off", "--nvtx", "--csv",
           "--metrics", ",".join(metrics or METRICS.values()), "--launch-count", str(args.max_kernels)]
    if args.kernels == "rigel":
        cmd += ["--kernel-name", kernel_filter(rigel_kernel_names())]
    return cmd + [sys.executable, str(Path(__file__).resolve()), "--sizes", size, "--res", args.res,
                  "--stages", ",".join(args.stages), "--kernels", args.kernels, "--warmup", str(args.warmup),
                  "--iters", str(args.iters), "--plan", str(plan_path), "--deadline", f"{deadline:.1f}"]


def time_stages(args, out: Path, seconds: float) -> str | None:
    """The driver once without a profiler, for the stage times (its plan: ``out`` / :data:`TIMES_PLAN`), in at most
    ``seconds``; a note when it failed or was stopped, else None."""
    cmd = [sys.executable, str(Path(__file__).resolve()), "--sizes", args.sizes, "--res", args.res,
           "--stages", ",".join(args.stages), "--warmup", str(args.warmup), "--iters", str(args.iters),
           "--plan", str(out / TIMES_PLAN), "--deadline", f"{time.time() + seconds - 5:.1f}", "--time-only"]
    rc, secs, stopped = run_bounded(cmd, out / "times.out", out / "times.log", seconds)
    _say(f"stage times without a profiler: exit {rc} after {secs:.0f} s")
    if rc == 0 and not stopped:
        return None
    why = " (stopped at its share of the budget)" if stopped else ""
    return f"the timing run without a profiler: exit {rc}{why}; log: {_log_reason(out / 'times.log')}"


def run_bounded(cmd: list[str], stdout: Path, log: Path, timeout: float) -> tuple[int, float, bool]:
    """Run ``cmd`` in its own process group, stdout to ``stdout``, stderr to ``log``; past ``timeout`` s (or on
    Ctrl-C) the group gets SIGINT, then SIGKILL 10 s later. Returns (exit status, seconds, stopped early)."""
    env = dict(os.environ, LC_NUMERIC="C", PYTHONUNBUFFERED="1")
    t0 = time.monotonic()
    with open(stdout, "w") as out, open(log, "w") as err:
        p = subprocess.Popen(cmd, stdout=out, stderr=err, env=env, start_new_session=True)
        stopped, interrupted = False, False
        try:
            rc = p.wait(timeout=max(1.0, timeout))
        except (subprocess.TimeoutExpired, KeyboardInterrupt) as e:
            stopped, interrupted = True, isinstance(e, KeyboardInterrupt)
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGINT)
            try:
                rc = p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(p.pid, signal.SIGKILL)
                rc = p.wait()
        if interrupted:
            raise KeyboardInterrupt
    return rc, time.monotonic() - t0, stopped


def _log_reason(path: Path) -> str:
    """ncu's last error line in a run's log, else the log's last line."""
    lines = [line.strip() for line in path.read_text(errors="replace").splitlines() if line.strip()]
    errors = [line for line in lines if "==ERROR==" in line]
    return (errors or lines or ["(empty log)"])[-1][:200]


def profile(args) -> int:
    """``--ncu``: one ncu run per size within ``--budget`` seconds, then the tables."""
    import torch

    import rigel_core as rc

    if not rc.cuda_available():
        print("bench/roofline.py --ncu needs a CUDA GPU and the compiled kernels (rigel_core._C): "
              f"torch.cuda.is_available() = {torch.cuda.is_available()}", file=sys.stderr)
        return 2
    ncu = find_ncu(args.ncu_path)
    if ncu is None:
        print("bench/roofline.py --ncu: Nsight Compute's ncu not found (--ncu-path, $NCU, PATH, $CUDA_HOME/bin, "
              "/usr/local/cuda*/bin, /opt/nvidia/nsight-compute/*)", file=sys.stderr)
        return 2
    out = Path(args.out or os.environ.get("OUT") or tempfile.mkdtemp(prefix="roofline_"))
    earlier = sorted(out.glob("roofline*.*"))
    if earlier:
        print(f"bench/roofline.py --ncu: {out} already holds a run ({earlier[0].name}); give another --out (or OUT)",
              file=sys.stderr)
        return 2
    out.mkdir(parents=True, exist_ok=True)
    try:
        version = subprocess.run([ncu, "--version"], capture_output=True, text=True, timeout=30).stdout.strip()
        version = version.splitlines()[-1] if version else "?"
    except (OSError, subprocess.SubprocessError):
        version = "?"
    t0, notes, done, metrics = time.monotonic(), [], [], list(METRICS.values())
    _say(f"ncu: {ncu} ({version}); results in {out}")
    try:
        note = time_stages(args, out, args.budget * TIMES_SHARE)
        if note:
            notes.append(note)
        for size in args.sizes.split(","):
            while True:  # a second try when ncu refused the metric set
                left = args.budget - (time.monotonic() - t0)
                if left < MIN_LEFT_S:
                    notes.append(f"{size}: not run, {max(left, 0):.0f} s of the {args.budget:.0f} s budget left")
                    _say(notes[-1])
                    break
                csv_path, log, plan_path = (out / f"roofline_{size}.{ext}" for ext in ("csv", "log", "json"))
                if size not in done:
                    done.append(size)
                cmd = ncu_command(ncu, args, size, plan_path, time.time() + left - STAGE_RESERVE_S, metrics)
                rc_, secs, stopped = run_bounded(cmd, csv_path, log, left)
                got = parse_ncu_csv(csv_path.read_text(errors="replace"))
                _say(f"[{size}] ncu exit {rc_} after {secs:.0f} s{' (stopped at the budget)' if stopped else ''}: "
                     f"{len(got)} launches profiled")
                if got and rc_ == 0:
                    break
                reason = _log_reason(log)
                notes.append(f"{size}: ncu exit {rc_}{' (stopped at the budget)' if stopped else ''}, {len(got)} "
                             f"launches; log: {reason}")
                if got or stopped:
                    break
                if metrics != MINIMAL_METRICS and "metric" in reason.lower():
                    metrics = MINIMAL_METRICS  # an ncu without one of the metrics: again, the later sizes too
                    notes.append(f"{size} and later: only {', '.join(metrics)} asked")
                elif args.kernels == "rigel" and rc_ == 0:
                    args.kernels = "all"  # the kernel-name filter kept nothing: every launch, this size and later
                    notes.append(f"{size} and later: every launch profiled (the kernel-name filter kept none)")
                else:
                    break
    except KeyboardInterrupt:
        notes.append(f"interrupted during {done[-1] if done else 'the start'}: its results and the later sizes' "
                     "are missing or partial")
    kernels, plans, parse_notes = load_run(out, done)
    summary = summarize(kernels, rigel_kernel_names())
    device = next((p.get("device") for p in plans.values() if p.get("device")), "?")
    meta = (f"{device}, {datetime.date.today()}, commit {commit() or 'unknown'}, torch {torch.__version__}, "
            f"{version}, kernels: {args.kernels}")
    notes += parse_notes
    table = markdown(summary, meta, plans, args.kernels, notes, load_times(out))
    seconds = time.monotonic() - t0
    with atomic_path(out / "roofline.md") as tmp:
        Path(tmp).write_text(table)
    with atomic_path(out / "summary.txt") as tmp:
        Path(tmp).write_text(summary_line(summary, len(kernels), seconds, notes) + "\n")
    print(table)
    print(summary_line(summary, len(kernels), seconds, notes))
    return 0 if kernels else 1


# ---- command line ----------------------------------------------------------------------------------------------
def parse_args(argv=None):
    ap = Parser(prog="bench/roofline.py", description=__doc__.split("\n\n")[0])
    ap.add_argument("--ncu", action="store_true", help="profile the driver under Nsight Compute and write the tables")
    ap.add_argument("--parse", metavar="DIR", help="print the tables of a run directory's roofline_*.csv / .json")
    ap.add_argument("--sizes", default=DEFAULT_SIZES,
                    help=f"comma-separated scenes of bench/forward.py ({', '.join([*PROCEDURAL, *PLYS])}; default: "
                         "%(default)s)")
    ap.add_argument("--res", default=DEFAULT_RES, help=f"comma-separated of {', '.join(RES)} (default: %(default)s)")
    ap.add_argument("--stages", default=",".join(STAGES), help="comma-separated of forward, backward, step (default: "
                    "%(default)s)")
    ap.add_argument("--kernels", choices=("rigel", "all"), default="rigel",
                    help="rigel: profile rigel's and CUB's kernels only (default); all: every launch")
    ap.add_argument("--budget", type=float, default=150.0,
                    help="--ncu: wall seconds for all sizes; a size that no longer fits is skipped (default: "
                         "%(default)s)")
    ap.add_argument("--max-kernels", type=int, default=1000, help="--ncu: at most this many launches profiled per "
                    "size (ncu --launch-count; default: %(default)s)")
    ap.add_argument("--warmup", type=int, default=3, help="untimed iterations per stage first (default: %(default)s)")
    ap.add_argument("--iters", type=int, default=5, help="timed iterations per stage (default: %(default)s)")
    ap.add_argument("--ncu-path", help="the ncu executable (default: $NCU, PATH, then the CUDA install)")
    ap.add_argument("--out", help="--ncu: results directory (default: $OUT, else a new temporary directory)")
    # the driver under ncu: where its plan goes, and the time (epoch s) after which it starts no further stage
    ap.add_argument("--plan", help=argparse.SUPPRESS)
    ap.add_argument("--deadline", type=float, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--time-only", action="store_true", help=argparse.SUPPRESS)  # the driver's timing pass
    args = ap.parse_args(argv)
    for name in args.sizes.split(","):
        if name not in PROCEDURAL and name not in PLYS:
            ap.error(f"--sizes: unknown scene {name!r}; choose from {', '.join([*PROCEDURAL, *PLYS])}")
    for r in args.res.split(","):
        if r not in RES:
            ap.error(f"--res: unknown resolution {r!r}; choose from {', '.join(RES)}")
    args.stages = [s for s in args.stages.split(",")]
    bad = [s for s in args.stages if s not in STAGES]
    if bad or not args.stages:
        ap.error(f"--stages: unknown stage {bad[0] if bad else ''!r}; choose from {', '.join(STAGES)}")
    if args.warmup < 1 or args.iters < 1 or args.max_kernels < 1:
        ap.error("--warmup, --iters and --max-kernels must be at least 1")
    if not (args.budget > 0 and math.isfinite(args.budget)):
        ap.error(f"--budget: expected a positive number of seconds, got {args.budget}")
    if args.ncu and args.parse:
        ap.error("--ncu and --parse exclude each other")
    if args.parse and not Path(args.parse).is_dir():
        ap.error(f"--parse: {args.parse}: not a directory")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.parse:
        kernels, plans, notes = load_run(Path(args.parse))
        if not kernels:
            print(f"bench/roofline.py --parse: {args.parse}: no profiled launch in its roofline_*.csv",
                  file=sys.stderr)
            return 1
        device = next((p.get("device") for p in plans.values() if p.get("device")), "?")
        mode = next((p.get("kernels") for p in plans.values() if p.get("kernels")), args.kernels)
        print(markdown(summarize(kernels, rigel_kernel_names()), f"{device}, parsed from {args.parse}", plans, mode,
                       notes, load_times(Path(args.parse))))
        return 0
    return profile(args) if args.ncu else drive(args)


if __name__ == "__main__":
    sys.exit(main())
