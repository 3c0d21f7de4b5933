"""bench/roofline.py (issue 39.3: Nsight Compute roofline of the forward, backward and step) on the CPU: the parser on
ncu's ``--csv`` details-page format (with and without NVTX columns), the bound classification, the time-weighted
aggregation, the table, the ncu command line, and the ``--ncu`` orchestration end to end with a stand-in ncu (a
script that prints a CSV and writes the driver's plan), including the budget stopping a run."""
import csv
import io
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench import roofline  # noqa: E402
from bench.roofline import OTHER, Kernel, bound_by, parse_ncu_csv  # noqa: E402

NVTX_PUSH = "thread Domain:Push/Pop_Range:PL_Type:PL_Value:CLR_Type:Color:Msg_Type:Msg"
NVTX_START = "Id:Domain:Start/Stop_Range:PL_Type:PL_Value:CLR_Type:Color:Msg_Type:Msg"
BASE_COLS = ["ID", "Process ID", "Process Name", "Host Name"]
REST_COLS = ["Kernel Name", "Context", "Stream", "Block Size", "Grid Size", "Device", "CC", "Section Name",
             "Metric Name", "Metric Unit", "Metric Value"]

# stdout of `ncu --nvtx --csv --metrics ...` (details page) in the format of ncu 2023-2025: one row per launch and
# metric, ==PROF== lines and the application's own output interleaved; the NVTX cell lists the thread's push/pop stack
# (CUB's range nested inside ours in launch 2); values in ncu's scaled units, a thousands separator, an "n/a"
SAMPLE = (ROOT / "tests" / "data" / "ncu_csv_sample.txt").read_text()
RIGEL = roofline.rigel_kernel_names()


def ncu_csv(launches, nvtx=True) -> str:
    """ncu's details-page CSV of ``launches`` [(name, tag or None, {metric key: (unit, value text)})], written with
    the csv module (every field quoted, as ncu does); the NVTX columns only with ``nvtx``."""
    buf = io.StringIO()
    w = csv.writer(buf, quoting=csv.QUOTE_ALL, lineterminator="\n")
    w.writerow(BASE_COLS + ([NVTX_PUSH, NVTX_START] if nvtx else []) + REST_COLS)
    for i, (name, tag, metrics) in enumerate(launches):
        cell = f'77  "<default domain>:{tag}:none:none:none:none:none:none" ' if tag else ""
        for key, (unit, value) in metrics.items():
            w.writerow([str(i), "77", "python3", "localhost"] + ([cell, ""] if nvtx else []) +
                       [name, "1", "7", "(256, 1, 1)", "(100, 1, 1)", "0", "9.0", "Command line profiler metrics",
                        roofline.METRICS[key], unit, value])
    return "==PROF== Connected to process 77\n" + buf.getvalue() + "==PROF== Disconnected from process 77\n"


def test_parse_reads_ncus_csv_format():
    notes = []
    ks = parse_ncu_csv(SAMPLE, notes)
    assert [(k.id, k.name) for k in ks] == [(0, "spin_kernel"), (1, "rasterize_fwd_kernel"),
                                           (2, "DeviceRadixSortOnesweepKernel"), (3, "vectorized_elementwise_kernel"),
                                           (4, "spin_kernel"), (5, "rasterize_bwd_kernel")]
    assert [k.tag for k in ks] == [None, ("1M", "800x800", "forward"), ("1M", "800x800", "forward"),
                                   ("1M", "800x800", "forward"), None, ("1M", "800x800", "backward")]
    fwd = ks[1].values
    assert fwd["time"] == pytest.approx(412_350.0)  # usecond -> ns
    assert fwd["dram_bytes"] == pytest.approx(95.2e6)  # Mbyte -> bytes
    assert (fwd["dram"], fwd["sm"], fwd["mem"], fwd["l2"], fwd["occ"]) == (22.5, 61.3, 78.4, 30.1, 45.2)
    assert ks[2].values["time"] == 12_345.0  # thousands separator, nsecond
    assert ks[5].values["time"] == pytest.approx(800_000.0)  # msecond
    assert ks[5].values["occ"] is None  # "n/a"
    assert notes == []
    assert parse_ncu_csv("==PROF== Connected to process 1\nno profile results\n") == []


def test_unknown_unit_and_missing_columns_are_noted():
    notes = []
    ks = parse_ncu_csv(ncu_csv([("sh_fwd_kernel", "roofline.1M.800x800.forward", {"time": ("fortnight", "2")})]),
                       notes)
    assert ks[0].values["time"] == 2.0 and notes == ["unknown unit 'fortnight' kept unscaled"]
    notes = []
    assert parse_ncu_csv('"ID","Kernel Name","Metric Value"\n"0","k","1"\n', notes) == []
    assert notes == ["ncu CSV without the column(s) Metric Name, Metric Unit"]


def test_stages_from_nvtx_and_from_markers():
    tags = ["roofline.3M.1920x1080.forward", "roofline.3M.1920x1080.backward", "roofline.3M.1920x1080.step"]
    t = {"time": ("nsecond", "100")}
    launches = [("spin_kernel", None, t), ("sh_fwd_kernel", tags[0], t), ("project_fwd_kernel", tags[0], t),
                ("spin_kernel", None, t), ("rasterize_bwd_kernel", tags[1], t),
                ("spin_kernel", None, t), ("adam_update_kernel", tags[2], t), ("ssim_fwd_kernel", tags[2], t)]
    want = [("sh_fwd_kernel", ("3M", "1920x1080", "forward")), ("project_fwd_kernel", ("3M", "1920x1080", "forward")),
            ("rasterize_bwd_kernel", ("3M", "1920x1080", "backward")),
            ("adam_update_kernel", ("3M", "1920x1080", "step")), ("ssim_fwd_kernel", ("3M", "1920x1080", "step"))]
    by_nvtx = roofline.assign_stages(parse_ncu_csv(ncu_csv(launches)), plan=None)
    assert [(k.name, k.tag) for k in by_nvtx] == want
    # no NVTX columns: the n-th marker opens the plan's n-th stage
    by_marker = roofline.assign_stages(parse_ncu_csv(ncu_csv(launches, nvtx=False)), plan=tags)
    assert [(k.name, k.tag) for k in by_marker] == want
    # launches outside the main thread's push/pop range (the autograd engine's thread): their marker's stage
    threads = [(n, None if n in ("rasterize_bwd_kernel", "ssim_fwd_kernel") else tag, m) for n, tag, m in launches]
    assert [(k.name, k.tag) for k in roofline.assign_stages(parse_ncu_csv(ncu_csv(threads)), plan=tags)] == want
    # an NVTX tag wins over the markers (here one marker short: the plan's order would be off by one)
    short = launches[:3] + launches[4:]
    assert [(k.name, k.tag) for k in roofline.assign_stages(parse_ncu_csv(ncu_csv(short)), plan=tags)] == want
    # neither: no stage (left out of the tables), markers still dropped
    assert [k.tag for k in roofline.assign_stages(parse_ncu_csv(ncu_csv(launches, nvtx=False)))] == [None] * 5
    assert [k.tag for k in roofline.assign_stages(parse_ncu_csv(ncu_csv(threads)))] == [
        w[1] if w[0] not in ("rasterize_bwd_kernel", "ssim_fwd_kernel") else None for w in want]


@pytest.mark.parametrize("dram, sm, mem, l2, want", [
    (80.0, 30.0, 80.0, 50.0, ("memory (DRAM)", 80.0)),
    (50.0, 50.0, None, None, ("memory (DRAM)", 50.0)),     # DRAM % >= SM %: memory
    (50.0, 50.1, None, None, ("compute", 50.1)),
    (20.0, 30.0, 70.0, 70.0, ("memory (L2)", 70.0)),
    (60.0, 30.0, 64.0, 64.0, ("memory (DRAM)", 64.0)),     # L2 within the margin of DRAM: DRAM named
    (10.0, 50.0, 75.0, 20.0, ("memory (L1)", 75.0)),       # memory side above DRAM and L2: L1/shared
    (30.0, 85.0, 40.0, 35.0, ("compute", 85.0)),
    (39.0, 39.9, 39.5, 20.0, ("latency", 39.9)),
    (40.0, 10.0, None, None, ("memory (DRAM)", 40.0)),     # the latency threshold is exclusive
    (None, 45.0, None, None, ("compute", 45.0)),
    (None, None, None, None, ("?", None)),
])
def test_bound_by(dram, sm, mem, l2, want):
    assert bound_by(dram, sm, mem, l2) == want


def test_kernel_labels():
    assert {"rasterize_fwd_kernel", "rasterize_bwd_kernel", "project_fwd_kernel", "sh_bwd_kernel",
            "adam_update_kernel", "ssim_fwd_kernel", "emit_entries_kernel", "tile_ranges_kernel"} <= RIGEL
    for name in RIGEL:  # each one is a __global__ function of csrc/
        assert any(re.search(rf"__global__[^;{{]*\b{name}\s*\(", f.read_text()) for f in (ROOT / "csrc").glob("*.cu"))
    label = roofline.kernel_label
    assert label("rasterize_fwd_kernel", RIGEL) == "rasterize_fwd_kernel"
    assert label("void rasterize_fwd_kernel<true>(RasterArgs)", RIGEL) == "rasterize_fwd_kernel"
    assert label("void cub::CUB_300000_SM_900::detail::radix_sort::DeviceRadixSortOnesweepKernel<Policy, false>"
                 "(unsigned long *)", RIGEL) == "CUB DeviceRadixSortOnesweepKernel"
    assert label("void at::native::(anonymous namespace)::vectorized_elementwise_kernel<4, Fn>(int, Fn)",
                 RIGEL) == OTHER
    assert label("reduce_kernel", RIGEL) == OTHER
    # ncu 2025.3's names (read from an H100 run's CSV): the anonymous namespace as "<unnamed>", whose '<' is not the
    # start of template arguments
    assert label("rigel::<unnamed>::project_fwd_kernel(long, const float *, const float *)", RIGEL) == \
        "project_fwd_kernel"
    assert label("void rigel::<unnamed>::sh_fwd_kernel<3, 48, 1, 1>(long, int, const float *)", RIGEL) == \
        "sh_fwd_kernel"
    assert label("rigel::<unnamed>::ssim_fwd_kernel(int, int, int, long, rigel::SsimWindow, const float *)",
                 RIGEL) == "ssim_fwd_kernel"
    assert label("at::<unnamed>::spin_kernel(long)", RIGEL) == OTHER


def test_kernel_filter_keeps_rigel_cub_and_markers_only():
    value = roofline.kernel_filter(RIGEL)
    assert value.startswith("regex:")
    pat = re.compile(value[len("regex:"):])
    for name in [*RIGEL, "DeviceRadixSortOnesweepKernel", "DeviceScanKernel", "spin_kernel"]:
        assert pat.fullmatch(name) and pat.search(name), name
    for name in ("vectorized_elementwise_kernel", "reduce_kernel", "elementwise_kernel", "unrolled_elementwise_kernel",
                 "index_elementwise_kernel", "distribution_elementwise_grid_stride_kernel", "multi_tensor_apply_kernel",
                 "CatArrayBatchedCopy", "indexSelectLargeIndex"):
        assert not pat.search(name), name


def test_combine_weights_by_time(rng):
    n = 7
    t = (torch.rand(n, generator=rng, dtype=torch.float64) * 1e5 + 1.0).tolist()
    dram = (torch.rand(n, generator=rng, dtype=torch.float64) * 100).tolist()
    sm = (torch.rand(n, generator=rng, dtype=torch.float64) * 100).tolist()
    b = (torch.rand(n, generator=rng, dtype=torch.float64) * 1e8).tolist()
    ks = [Kernel("1", i, "k", ("1M", "800x800", "step"), {"time": t[i], "dram": dram[i], "sm": sm[i],
                                                         "dram_bytes": b[i], "mem": None}) for i in range(n)]
    ks[0].values["sm"] = None  # a launch without the number counts for the others' weights only
    row = roofline.combine("1M", "800x800", "step", "k", ks)
    assert row.launches == n and row.time_ns == pytest.approx(sum(t))
    assert row.values["dram"] == pytest.approx(sum(d * w for d, w in zip(dram, t)) / sum(t))
    assert row.values["sm"] == pytest.approx(sum(s * w for s, w in zip(sm[1:], t[1:])) / sum(t[1:]))
    assert row.values["mem"] is None and row.values["l2"] is None
    assert row.dram_gbs == pytest.approx(sum(b) / sum(t))  # bytes per ns = GB/s


def test_markdown_tables():
    ks = roofline.assign_stages(parse_ncu_csv(SAMPLE))
    summary = roofline.summarize(ks, RIGEL)
    assert set(summary) == {("1M", "800x800", "forward"), ("1M", "800x800", "backward")}
    total, rows = summary[("1M", "800x800", "forward")]
    assert [r.kernel for r in rows] == ["rasterize_fwd_kernel", "CUB DeviceRadixSortOnesweepKernel", OTHER]
    t = [412_350.0, 12_345.0, 5_200.0]
    assert total.launches == 3 and total.time_ns == pytest.approx(sum(t))
    assert total.values["dram"] == pytest.approx((22.5 * t[0] + 85.0 * t[1] + 12.0 * t[2]) / sum(t))
    # the stage times are the plain run's, not those measured under ncu (inflated by its interception)
    plans = {"1M": {"gaussians": {"1M": 1_000_000}, "stage_ms": {"roofline.1M.800x800.forward": 9.999}}}
    times = {"stage_ms": {"roofline.1M.800x800.forward": 1.234}}
    md = roofline.markdown(summary, "H100 test", plans, "rigel", ["a note"], times)
    lines = md.splitlines()
    fwd = next(line for line in lines if line.startswith("| 1M | 1,000,000 | 800x800 | forward |"))
    cells = [c.strip() for c in fwd.strip("|").split("|")]
    assert cells[4:8] == ["1.234", "3", f"{sum(t) / 1e3:.1f}", f"{total.values['dram']:.1f}"]
    bwd = next(line for line in lines if line.startswith("| 1M | 1,000,000 | 800x800 | backward |"))
    assert [c.strip() for c in bwd.strip("|").split("|")][4] == "-"  # the plain run did not time it
    assert "9.999" not in md and "9.999" not in roofline.markdown(summary, "H100 test", plans, "rigel", [])
    assert cells[-1] == "rasterize_fwd_kernel: 412.4, memory (L1), 78.4"
    kernel_rows = {tuple(c.strip() for c in line.strip("|").split("|"))[3]: line for line in lines
                   if line.startswith("| 1M | 800x800 |")}
    assert kernel_rows["rasterize_fwd_kernel"].endswith("| 231 | 61.3 | 30.1 | 78.4 | 45.2 | memory (L1) | 78.4 |")
    assert kernel_rows["CUB DeviceRadixSortOnesweepKernel"].endswith("| memory (DRAM) | 85.0 |")
    assert kernel_rows[OTHER].endswith("| latency | 12.0 |")
    assert kernel_rows["rasterize_bwd_kernel"].endswith(
        "| 800.0 | 30.0 | - | 72.0 | 40.0 | 55.0 | - | compute | 72.0 |")
    assert "- a note" in lines and "rigel's kernels (csrc/) and CUB's only" in md
    line = roofline.summary_line(summary, len(ks), 12.0, [])
    assert line.startswith("2 stages, 4 kernels profiled in 12 s; 1M 800x800 backward: DRAM 30.0 % SM 72.0 % "
                           "(compute); heaviest rasterize_bwd_kernel 800 µs compute at 72.0 % of roofline")


def test_ncu_command_profiles_only_the_marked_iterations(tmp_path):
    args = roofline.parse_args(["--ncu", "--sizes", "1M", "--res", "800", "--stages", "forward,step"])
    cmd = roofline.ncu_command("/opt/ncu", args, "1M", tmp_path / "p.json", 1234.5)
    s = " ".join(cmd)
    for flag in ("--clock-control none", "--profile-from-start off", "--nvtx", "--csv", "--launch-count 1000"):
        assert flag in s
    assert cmd[cmd.index("--metrics") + 1].split(",") == list(roofline.METRICS.values())
    assert cmd[cmd.index("--kernel-name") + 1] == roofline.kernel_filter(RIGEL)
    script = cmd.index(str(ROOT / "bench" / "roofline.py"))
    child = roofline.parse_args(cmd[script + 1:])  # the driver's own arguments parse back
    assert (child.ncu, child.sizes, child.res, child.stages, child.plan, child.deadline) == (
        False, "1M", "800", ["forward", "step"], str(tmp_path / "p.json"), 1234.5)
    args = roofline.parse_args(["--ncu", "--kernels", "all", "--max-kernels", "50"])
    cmd = roofline.ncu_command("/opt/ncu", args, "3M", tmp_path / "p.json", 0.0)
    assert "--kernel-name" not in cmd and cmd[cmd.index("--launch-count") + 1] == "50"


def run_script(*argv, env=None):
    return subprocess.run([sys.executable, str(ROOT / "bench" / "roofline.py"), *argv], capture_output=True,
                          text=True, timeout=300, env={**os.environ, **(env or {})})


def test_command_line_refusals():
    assert run_script("--help").returncode == 0
    for argv, expect in ((["--ncu"], "--ncu needs a CUDA GPU"), ([], "needs a CUDA GPU")):
        r = run_script(*argv, env={"CUDA_VISIBLE_DEVICES": ""})
        assert r.returncode == 2 and r.stderr.count("\n") == 1 and expect in r.stderr, r.stderr
    for argv, expect in ((["--sizes", "2M"], "unknown scene '2M'"), (["--res", "640p"], "unknown resolution"),
                         (["--stages", "forward,fwd"], "unknown stage 'fwd'"), (["--budget", "0"], "--budget"),
                         (["--iters", "0"], "at least 1"), (["--parse", "/nonexistent"], "not a directory")):
        r = run_script(*argv)
        assert r.returncode == 2 and r.stderr.count("\n") == 1 and expect in r.stderr, (argv, r.stderr)


def test_find_ncu(tmp_path, monkeypatch):
    fake = tmp_path / "ncu"
    fake.write_text("#!/bin/sh\n")
    fake.chmod(0o755)
    assert roofline.find_ncu(str(fake)) == str(fake)
    assert roofline.find_ncu(str(tmp_path / "missing")) is None
    monkeypatch.setenv("NCU", str(fake))
    assert roofline.find_ncu() == str(fake)


def test_no_ncu_is_one_line_and_status_2(monkeypatch, capsys):
    import rigel_core

    monkeypatch.setattr(rigel_core, "cuda_available", lambda: True)
    monkeypatch.setattr(roofline, "find_ncu", lambda given=None: None)
    assert roofline.main(["--ncu"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "ncu not found" in err


# the stand-in ncu: prints its version, or the CSV prepared for the size it is asked to profile and writes the
# driver's plan (3M sleeps past the budget; 160k refuses a metric of the full set, as an older ncu would; 10M's
# kernel-name filter keeps nothing)
FAKE_NCU = """\
import shutil, sys, time
argv = sys.argv[1:]
if argv == ["--version"]:
    print("NVIDIA (R) Nsight Compute Command Line Profiler\\nVersion 2099.1.0.0 (build 1)")
    sys.exit(0)
size = argv[argv.index("--sizes") + 1]
if size == "3M":
    time.sleep(60)
if size == "10M" and "--kernel-name" in argv:
    print("==WARNING== No kernels were profiled.", file=sys.stderr)
    sys.exit(0)
if size == "160k" and "lts__" in argv[argv.index("--metrics") + 1]:
    print("==ERROR== Failed to find metric lts__throughput.avg.pct_of_peak_sustained_elapsed", file=sys.stderr)
    sys.exit(1)
shutil.copy(sys.argv[0] + "." + size + ".json", argv[argv.index("--plan") + 1])
sys.stdout.write(open(sys.argv[0] + "." + size + ".csv").read())
"""


def fake_run(size: str, res: list[str]):
    """(the ncu CSV, the driver's plan) of a run of ``size`` at ``res``: per stage a marker, one rigel kernel
    (100 µs, DRAM 70 %, SM 20 %) and one PyTorch launch (10 µs, 5 % and 5 %)."""
    tags, launches = [], []
    for r in res:
        for stage, kernel in (("forward", "rasterize_fwd_kernel"), ("backward", "rasterize_bwd_kernel"),
                              ("step", "adam_update_kernel")):
            tag = f"roofline.{size}.{r}.{stage}"
            tags.append(tag)
            launches += [("spin_kernel", None, {"time": ("usecond", "1")}),
                         (kernel, tag, {"time": ("usecond", "100"), "dram": ("%", "70"), "sm": ("%", "20")}),
                         ("vectorized_elementwise_kernel", tag, {"time": ("usecond", "10"), "dram": ("%", "5"),
                                                                 "sm": ("%", "5")})]
    plan = {"tags": tags, "stage_ms": {t: 0.5 for t in tags}, "gaussians": {size: 1000}, "skipped": [],
            "device": "Fake GPU", "kernels": "all"}
    return ncu_csv(launches), plan


@pytest.fixture
def fake_ncu(tmp_path, monkeypatch):
    """The stand-in ncu's path, its runs prepared; CUDA said present; the budget's margins 1 s and 0 s."""
    import rigel_core

    fake = tmp_path / "ncu"
    fake.write_text(f"#!{sys.executable}\n" + FAKE_NCU)
    fake.chmod(0o755)
    for size in ("160k", "300k", "1M", "3M", "10M"):
        text, plan = fake_run(size, ["800x800", "1920x1080"])
        Path(f"{fake}.{size}.csv").write_text(text)
        Path(f"{fake}.{size}.json").write_text(json.dumps(plan))
    monkeypatch.setattr(rigel_core, "cuda_available", lambda: True)
    monkeypatch.setattr(roofline, "MIN_LEFT_S", 1.0)
    monkeypatch.setattr(roofline, "STAGE_RESERVE_S", 0.0)

    def time_stages(args, out, seconds):  # the plain timing run: 0.25 ms a stage, where the ncu plans say 0.5
        tags = [f"roofline.{s}.{r}.{st}" for s in args.sizes.split(",") for r in ("800x800", "1920x1080")
                for st in ("forward", "backward", "step")]
        (out / roofline.TIMES_PLAN).write_text(json.dumps({"stage_ms": {t: 0.25 for t in tags}}))
        return "timing note" if "160k" in args.sizes else None

    monkeypatch.setattr(roofline, "time_stages", time_stages)
    return fake


def test_ncu_run_end_to_end_with_a_stand_in_ncu(fake_ncu, tmp_path, capsys):
    fake = fake_ncu
    out = tmp_path / "out"
    rc = roofline.main(["--ncu", "--ncu-path", str(fake), "--out", str(out), "--sizes", "300k,3M,1M",
                        "--res", "800,1080p", "--kernels", "all", "--budget", "6"])
    assert rc == 0
    md = (out / "roofline.md").read_text()
    assert "Fake GPU" in md and "Version 2099.1.0.0" in md
    for res in ("800x800", "1920x1080"):
        for stage in ("forward", "backward", "step"):
            assert f"| 300k | 1,000 | {res} | {stage} | 0.250 | 2 | 110.0 |" in md
    assert "| 300k | 800x800 | forward | rasterize_fwd_kernel | 1 | 100.0 | 70.0 |" in md
    assert f"| 300k | 800x800 | step | {OTHER} | 1 | 10.0 |" in md
    # 3M overran the budget: stopped (no launch), said in the notes; 1M had no time left to start
    assert "- 3M: ncu exit" in md and "(stopped at the budget), 0 launches" in md
    assert "- 1M: not run," in md and "| 1M |" not in md and "| 3M |" not in md
    summary = (out / "summary.txt").read_text()
    assert summary.startswith("6 stages, 12 kernels profiled in") and summary.count("\n") == 1
    assert "300k 1920x1080 step: DRAM" in summary
    assert (out / "roofline_300k.csv").read_text().count("rasterize_fwd_kernel") == 6  # the raw CSV is kept
    capsys.readouterr()
    assert roofline.main(["--parse", str(out)]) == 0  # the tables again from the saved files
    again = capsys.readouterr().out
    assert "| 300k | 800x800 | forward | rasterize_fwd_kernel | 1 | 100.0 | 70.0 |" in again
    assert "| 300k | 1,000 | 800x800 | forward | 0.250 |" in again  # the plain run's times, read back too
    assert "every launch; PyTorch's are summed" in again
    before = {f.name: f.read_bytes() for f in out.iterdir()}
    assert roofline.main(["--ncu", "--ncu-path", str(fake), "--out", str(out), "--sizes", "300k"]) == 2
    assert "already holds a run (roofline.md)" in capsys.readouterr().err  # no run overwritten
    assert {f.name: f.read_bytes() for f in out.iterdir()} == before


class FakeEvent:
    """torch.cuda.Event on the CPU: records perf_counter."""

    def __init__(self, enable_timing=False):
        self.t = None

    def record(self):
        import time

        self.t = time.perf_counter()

    def elapsed_time(self, other):
        return 1e3 * (other.t - self.t)


@pytest.fixture
def cpu_driver(monkeypatch):
    """The driver's CUDA calls recorded on the CPU, a tiny scene ("tiny": 400 Gaussians) and resolution (48x32)."""
    from bench import forward, train_step

    calls = []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: None)
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: None)
    monkeypatch.setattr(torch.cuda, "Event", FakeEvent)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "CPU stand-in")
    monkeypatch.setattr(torch.cuda, "_sleep", lambda cycles: calls.append("marker"), raising=False)
    monkeypatch.setattr(torch.cuda.profiler, "start", lambda: calls.append("start"))
    monkeypatch.setattr(torch.cuda.profiler, "stop", lambda: calls.append("stop"))
    monkeypatch.setattr(torch.cuda.nvtx, "range_push", lambda tag: calls.append(f"push {tag}") or 0)
    monkeypatch.setattr(torch.cuda.nvtx, "range_pop", lambda: calls.append("pop"))
    monkeypatch.setattr(torch.cuda.nvtx, "range_start", lambda tag: calls.append(f"range {tag}") or 7)
    monkeypatch.setattr(torch.cuda.nvtx, "range_end", lambda rid: calls.append(f"end {rid}"))
    monkeypatch.setitem(forward.PROCEDURAL, "tiny", 400)
    monkeypatch.setitem(train_step.RES, "tiny", (48, 32))
    return calls


@pytest.mark.usefixtures("one_thread")
def test_driver_marks_each_stage_once(cpu_driver, tmp_path):
    plan_path = tmp_path / "plan.json"
    args = roofline.parse_args(["--sizes", "tiny", "--res", "tiny", "--warmup", "1", "--iters", "2",
                                "--plan", str(plan_path)])
    assert roofline.drive(args, device="cpu") == 0
    tags = [f"roofline.tiny.48x32.{s}" for s in ("forward", "backward", "step")]
    assert cpu_driver == [c for t in tags for c in ("start", "marker", f"range {t}", f"push {t}", "pop", "end 7",
                                                    "stop")]
    plan = json.loads(plan_path.read_text())
    assert plan["tags"] == tags and plan["gaussians"] == {"tiny": 400} and plan["skipped"] == []
    assert set(plan["stage_ms"]) == set(tags) and all(v > 0 for v in plan["stage_ms"].values())
    assert plan["device"] == "CPU stand-in" and plan["kernels"] == "rigel"


@pytest.mark.usefixtures("one_thread")
def test_timing_run_marks_nothing(cpu_driver, tmp_path):
    plan_path = tmp_path / "times.json"
    args = roofline.parse_args(["--sizes", "tiny", "--res", "tiny", "--warmup", "1", "--iters", "2",
                                "--plan", str(plan_path), "--time-only"])
    assert roofline.drive(args, device="cpu") == 0
    plan = json.loads(plan_path.read_text())
    assert cpu_driver == [] and plan["tags"] == []  # no profiler range: only the event times
    assert set(plan["stage_ms"]) == {f"roofline.tiny.48x32.{s}" for s in ("forward", "backward", "step")}
    assert roofline.load_times(tmp_path) == plan and roofline.load_times(tmp_path / "absent") == {}


def test_a_failed_timing_run_is_a_note(tmp_path, monkeypatch):
    monkeypatch.setattr(roofline, "run_bounded", lambda cmd, out, log, s: (log.write_text("==ERROR== no GPU\n"),
                                                                           (2, 0.1, False))[1])
    args = roofline.parse_args(["--sizes", "1M"])
    note = roofline.time_stages(args, tmp_path, 10.0)
    assert note == "the timing run without a profiler: exit 2; log: ==ERROR== no GPU"
    monkeypatch.setattr(roofline, "run_bounded", lambda cmd, out, log, s: (0, 0.1, False))
    assert roofline.time_stages(args, tmp_path, 10.0) is None


@pytest.mark.usefixtures("one_thread")
def test_driver_stages_and_deadline(cpu_driver, tmp_path):
    plan_path = tmp_path / "plan.json"
    args = roofline.parse_args(["--sizes", "tiny", "--res", "tiny", "--stages", "backward", "--warmup", "1",
                                "--iters", "1", "--plan", str(plan_path)])
    assert roofline.drive(args, device="cpu") == 0
    tag = "roofline.tiny.48x32.backward"
    assert cpu_driver == ["start", "marker", f"range {tag}", f"push {tag}", "pop", "end 7", "stop"]
    cpu_driver.clear()
    args = roofline.parse_args(["--sizes", "tiny", "--res", "tiny", "--plan", str(plan_path), "--deadline", "1"])
    assert roofline.drive(args, device="cpu") == 0  # past its deadline: no stage runs, the plan says so
    plan = json.loads(plan_path.read_text())
    assert cpu_driver == [] and plan["tags"] == []
    assert plan["skipped"] == ["tiny 48x32 forward+backward", "tiny 48x32 step"]


def test_a_refused_metric_set_is_asked_again_with_less(fake_ncu, tmp_path, capsys):
    out = tmp_path / "out"
    assert roofline.main(["--ncu", "--ncu-path", str(fake_ncu), "--out", str(out), "--sizes", "160k,300k",
                          "--res", "800", "--stages", "step", "--budget", "60"]) == 0
    md = (out / "roofline.md").read_text()
    assert "- 160k: ncu exit 1, 0 launches; log: ==ERROR== Failed to find metric lts__throughput" in md
    assert "- 160k and later: only gpu__time_duration.sum, dram__throughput" in md
    assert "| 160k | 1,000 | 800x800 | step |" in md and "| 300k | 1,000 | 800x800 | step |" in md
    assert "- timing note" in md  # what the timing run said is kept among the notes
    assert md.count("ncu exit") == 1  # 300k ran once, with the smaller set


@pytest.mark.usefixtures("one_thread")
def test_driver_without_nvtx_keeps_the_markers(cpu_driver, tmp_path, monkeypatch):
    def no_nvtx(*a):
        raise RuntimeError("NVTX functions not installed. Are you sure you have a CUDA build?")

    for name in ("range_push", "range_pop", "range_start", "range_end"):
        monkeypatch.setattr(torch.cuda.nvtx, name, no_nvtx)
    args = roofline.parse_args(["--sizes", "tiny", "--res", "tiny", "--stages", "forward", "--warmup", "1",
                                "--iters", "1", "--plan", str(tmp_path / "plan.json")])
    assert roofline.drive(args, device="cpu") == 0
    assert cpu_driver == ["start", "marker", "stop"]
    assert json.loads((tmp_path / "plan.json").read_text())["tags"] == ["roofline.tiny.48x32.forward"]


def test_a_filter_that_keeps_nothing_is_dropped(fake_ncu, tmp_path):
    out = tmp_path / "out"
    assert roofline.main(["--ncu", "--ncu-path", str(fake_ncu), "--out", str(out), "--sizes", "10M", "--res", "800",
                          "--budget", "60"]) == 0
    md = (out / "roofline.md").read_text()
    assert "- 10M: ncu exit 0, 0 launches; log: ==WARNING== No kernels were profiled." in md
    assert "- 10M and later: every launch profiled (the kernel-name filter kept none)" in md
    assert "| 10M | 1,000 | 800x800 | forward |" in md and "every launch; PyTorch's are summed" in md


@pytest.mark.parametrize("strategy", ["default", "mcmc"])
def test_bench_trainer_runs_the_step_it_names(strategy):
    """bench/train_step.py's (and this driver's) Trainer on its one-view dataset runs the strategy it asks for: the
    dataset has no SfM points and is a photo, which "auto" makes MCMC since issue 35 — the bench's Trainer column
    silently became an MCMC step (measured on the H100 against 63e10e6) until the config pinned it."""
    from bench import train_step
    from rigel_core import Camera
    from rigel_core.model import GaussianModel
    from rigel_core.train.strategy import strategy_for
    from rigel_core.train.trainer import Trainer

    g = torch.Generator().manual_seed(0)
    n = 64
    model = GaussianModel(torch.randn(n, 3, generator=g) * 0.3, torch.full((n, 3), -2.5),
                          torch.nn.functional.normalize(torch.randn(n, 4, generator=g), dim=1),
                          torch.zeros(n), torch.rand(n, 1, 3, generator=g), torch.rand(n, 15, 3, generator=g) * 0.1)
    cam = Camera.look_at((0.0, -3.0, 0.5), (0.0, 0.0, 0.0), (0.0, 0.0, 1.0), width=32, height=24, fov_x_deg=50.0)
    target = torch.rand(24, 32, 3, generator=g)
    trainer = Trainer(train_step.one_view_dataset(cam, target, 2.0), train_step.bench_config(strategy), model=model,
                      device="cpu")
    assert trainer.config.strategy == strategy and strategy_for(strategy).name == strategy
    assert trainer.model.num_gaussians == n
    trainer.step()
    assert trainer.model.num_gaussians == n   # densification, relocation and the cap never act inside the bench
