"""Shared fixtures: real data paths (skip with a reason when ../shared/data is absent), GPU gating."""
import os
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
SHARED_DATA = Path(os.environ.get("RIGEL_SHARED_DATA", ROOT.parent / "shared" / "data"))


def _gpu_ready():
    if not torch.cuda.is_available():
        return "no CUDA device (GPU tests run on the H200: bench/device_run.sh)"
    from rigel_core import _ext

    if not _ext.available():
        return f"rigel_core._C is not built: {_ext._error}"
    return None


GPU_SKIP_REASON = _gpu_ready()


def pytest_collection_modifyitems(config, items):
    if GPU_SKIP_REASON:
        skip = pytest.mark.skip(reason=GPU_SKIP_REASON)
        for item in items:
            if "gpu" in item.keywords:
                item.add_marker(skip)


@pytest.fixture
def shared_data():
    if not SHARED_DATA.is_dir():
        pytest.skip(f"real data not present at {SHARED_DATA}")
    return SHARED_DATA


@pytest.fixture
def one_thread():
    """One PyTorch thread for the test (much faster than two on a busy 2-core machine); restored after."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


#: the seeds of the tests that failed this session, (nodeid, seed), said again last of all (pytest_terminal_summary):
#: a failure's captured stdout can be cut off where only the end of the output is kept (the GPU machine's tail)
_FAILED_SEEDS: list[tuple[str, int]] = []
_SEED_KEY = pytest.StashKey[int]()


@pytest.fixture
def rng(request):
    """A fresh, logged seed per test: inputs differ every run, failures are reproducible (the seed is printed, and
    said again at the end of the run for a test that failed)."""
    seed = int.from_bytes(os.urandom(4), "little") if "RIGEL_SEED" not in os.environ else int(os.environ["RIGEL_SEED"])
    print(f"RIGEL_SEED={seed}")
    request.node.stash[_SEED_KEY] = seed
    return torch.Generator().manual_seed(seed)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    report = yield
    if report.failed and _SEED_KEY in item.stash:
        _FAILED_SEEDS.append((item.nodeid, item.stash[_SEED_KEY]))
    return report


def pytest_terminal_summary(terminalreporter):
    if _FAILED_SEEDS:
        terminalreporter.section("seeds of the failed tests (rerun one with RIGEL_SEED=N)")
        for nodeid, seed in _FAILED_SEEDS:
            terminalreporter.write_line(f"RIGEL_SEED={seed} {nodeid}")


@pytest.fixture(params=["default", "transposed", "per-entry"])
def raster_bwd_sums(request, monkeypatch):
    """Each way the CUDA rasterizer backward sums an entry's per-pixel gradients (csrc/rasterize_bwd.cu's
    flush_chunk), chosen per launch by RIGEL_RASTER_BWD_DENSE_MIN: the default mix (chunks of 3 or more entries
    transposed, shorter ones by warp reductions), every chunk transposed (0), or every entry by a warp reduction
    (9, above the chunk size of 8)."""
    value = {"default": None, "transposed": "0", "per-entry": "9"}[request.param]
    if value is None:
        monkeypatch.delenv("RIGEL_RASTER_BWD_DENSE_MIN", raising=False)
    else:
        monkeypatch.setenv("RIGEL_RASTER_BWD_DENSE_MIN", value)
    return request.param
