"""Test configuration shared by the whole suite.

Numba's CUDA simulator must be switched on before numba is imported, so it is
decided here, before any test module loads: without an NVIDIA device node the
cuda backend is tested in the simulator; with one, on the GPU.  Set
NUMBA_ENABLE_CUDASIM yourself to override.
"""

import collections
import os
from pathlib import Path

import pytest

if "NUMBA_ENABLE_CUDASIM" not in os.environ and not os.path.exists("/dev/nvidiactl"):
    os.environ["NUMBA_ENABLE_CUDASIM"] = "1"

# The property tests draw the same examples on every run and machine (as Hypothesis's own
# "ci" profile does), so that a red run can be rerun and a green one means the same thing
# everywhere; HYPOTHESIS_PROFILE=explore draws new examples each run (and keeps failures in
# .hypothesis/ to replay them).
from hypothesis import settings  # noqa: E402

settings.register_profile("attnbench", derandomize=True, database=None, print_blob=True)
settings.register_profile("explore", derandomize=False)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "attnbench"))


@pytest.fixture
def repository_on_pythonpath(monkeypatch):
    """The repository on ``PYTHONPATH``, for subprocesses that import ``tests.…``."""
    root = str(Path(__file__).resolve().parents[1])
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(
        [root, *filter(None, [os.environ.get("PYTHONPATH")])]))


@pytest.fixture(autouse=True)
def _numba_backend_on_its_blas_tiles(monkeypatch):
    """Every test sees the numba backend's BLAS tile path and never plans, whatever this
    machine stored: the tests of the micro-kernel dispatch set the choice themselves."""
    from attnbench.kernels.numba_cpu import planner as _microplan

    not_planned = {d: _microplan.NOT_PLANNED for d in _microplan._DTYPES}
    monkeypatch.setattr(_microplan, "_CHOICES", not_planned)
    monkeypatch.setattr(_microplan, "PLAN_WORK_LIMIT", float("inf"))


def pytest_sessionfinish(session):
    """Under pytest-xdist, a worker hands its comparisons to the controller, which prints
    the summary below (``workeroutput`` exists on workers only)."""
    workeroutput = getattr(session.config, "workeroutput", None)
    if workeroutput is not None:
        from tests.support import COMPARISONS

        workeroutput["attnbench_comparisons"] = [
            (str(b), str(d), float(e), float(t)) for b, d, e, t in COMPARISONS]


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error):
    """pytest-xdist's controller: gather a finished worker's comparisons.  A worker that
    died (a crash in compiled code) has no ``workeroutput``: pytest-xdist reports the test
    it was running as failed and starts another worker; its comparisons are lost."""
    from tests.support import COMPARISONS

    output = getattr(node, "workeroutput", None) or {}
    COMPARISONS.extend(tuple(c) for c in output.get("attnbench_comparisons", ()))


def pytest_terminal_summary(terminalreporter):
    """Print the largest error against the reference seen per backend and dtype."""
    from tests.support import COMPARISONS

    if not COMPARISONS:
        return
    rows = {}
    for backend, dtype, err, tol in COMPARISONS:
        n, worst, worst_ratio = rows.get((backend, dtype), (0, 0.0, 0.0))
        ratio = err / tol if tol else 0.0
        rows[(backend, dtype)] = (n + 1, max(worst, err), max(worst_ratio, ratio))
    write = terminalreporter.write_line
    terminalreporter.section("agreement with the reference (differential tests)")
    write(f"{'backend':<10} {'dtype':<8} {'comparisons':>11} {'max error':>10} {'max err/tol':>11}")
    for (backend, dtype), (n, worst, ratio) in sorted(rows.items()):
        write(f"{backend:<10} {dtype:<8} {n:>11} {worst:>10.2e} {ratio:>11.2f}")


# --- pytest --benchmark ----------------------------------------------------------------------
# pytest-benchmark brings the `benchmark` fixture, the `benchmark` marker and the
# --benchmark-* options, but no plain --benchmark: that one is ours.  Without it the tests
# under tests/benchmarks/ are deselected (plain `pytest` stays quick); with it (or with
# pytest-benchmark's --benchmark-only) they run with pytest-benchmark's fixture, so
# --benchmark-json, --benchmark-autosave and --benchmark-compare work as documented.

BENCHMARKS_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "benchmarks")


def pytest_addoption(parser):
    parser.addoption(
        "--benchmark", action="store_true", default=False,
        help="run the benchmarks in tests/benchmarks/ (deselected otherwise); grid from "
             "ATTNBENCH_BENCH_GRID=tiny|small (default tiny)",
    )
    parser.addoption(
        "--quick", action="store_true", default=False,
        help="the quick lane: the first case of every test (each parametrized test runs "
             "once), tests marked slow left out; every backend and entry point still runs",
    )


def _benchmarks_wanted(config) -> bool:
    return bool(config.getoption("--benchmark")
                or config.getoption("benchmark_only", default=False))


def _quick_lane(items) -> tuple[list, list]:
    """``(selected, deselected)``: the first case of each test function, none marked slow."""
    seen, selected, deselected = set(), [], []
    for item in items:
        function = (str(item.path), getattr(item, "originalname", item.name))
        if function in seen or item.get_closest_marker("slow"):
            deselected.append(item)
        else:
            seen.add(function)
            selected.append(item)
    return selected, deselected


def _e2e_wanted(config) -> bool:
    """Whether the end-to-end lane was asked for (a ``-m`` expression that names it)."""
    return "e2e" in (config.getoption("markexpr", default="") or "")


def pytest_collection_modifyitems(config, items):
    selected, deselected = list(items), []
    if not _e2e_wanted(config):
        deselected = [item for item in selected if item.get_closest_marker("e2e")]
        selected = [item for item in selected if not item.get_closest_marker("e2e")]
    if not _benchmarks_wanted(config):
        kept = selected
        selected = []
        for item in kept:
            inside = os.path.commonpath([str(item.path), BENCHMARKS_DIR]) == BENCHMARKS_DIR
            (deselected if inside else selected).append(item)
    if config.getoption("--quick"):
        selected, left_out = _quick_lane(selected)
        deselected += left_out
    if deselected:
        config.hook.pytest_deselected(items=deselected)
        items[:] = selected
    items.sort(key=_file_rank(items))


# --- the order of the files ------------------------------------------------------------------
# Under ``--dist loadfile`` each worker takes a whole file at a time.  The files are queued
# by their number of tests, most first, so that the many-case files start early; the few
# long end-to-end runs, which would start last and keep one worker busy alone, are a lane
# of their own (``-m e2e``).


def pytest_configure(config):
    if hasattr(config.option, "loadscopereorder"):  # pytest-xdist: keep the order below
        config.option.loadscopereorder = False


def _file_rank(items):
    """Sort key of an item: its file's number of tests (most first), then its path; a file's
    tests stay together and in their order."""
    counts = collections.Counter(str(item.path) for item in items)

    def rank(item):
        return -counts[str(item.path)], str(item.path)
    return rank
