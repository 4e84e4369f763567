"""``pytest --benchmark`` on the tiny grid, in a subprocess: the JSON, autosave and compare.

Plain ``pytest`` deselects tests/benchmarks/; ``--benchmark`` runs them with
pytest-benchmark's fixture (see tests/conftest.py).
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.benchmarks import test_backward, test_decode, test_mods, test_precision
from tests.benchmarks.test_attention import BACKENDS, MASKS, SHAPES
from tests.benchmarks.test_peers import PEERS

#: Benchmarks on the tiny grid: forward per backend and peer, backward per backend that
#: has one (two timings each), every kernels.mods built-in per backend; the precision
#: benchmarks (prefill per dtype and mask, backward in float32 and bfloat16); decode steps
#: (per backend, cache length and layout); packed batches (3 ways, causal and not) and sinks
#: (with and without).
N_TINY = len(SHAPES["tiny"]) * (
    len(MASKS) * (len(BACKENDS) + len(PEERS))
    + len(MASKS) * len(test_backward.BACKENDS) * len(test_backward.PASSES)
    + len(test_mods.MODS) * len(test_mods.BACKENDS)
    + len(MASKS) * len(test_precision.DTYPES) + 2) \
    + 2 * len(test_decode.LENGTHS["tiny"]) * len(test_decode.LAYOUTS) \
    + 3 * 2 + 2

REPO = Path(__file__).resolve().parents[1]
#: The benchmarks of the JSON test: the forward, backward and peers, and of the mods the
#: plain call and one score function (the decode, packed-batch and precision benchmarks
#: have extra_info of their own and are counted above).
MODS_SUBSET = ("(not test_mod or plain or alibi) and not test_decode and not test_varlen "
               "and not test_precision")
#: Short runs: the numbers are not the point here, the plumbing is.
QUICK = ("--benchmark-max-time=0.005", "--benchmark-min-rounds=3")


def run_pytest(*args, timeout=300):
    # not a pytest-xdist worker's variables: the inner pytest is a session of its own (with
    # PYTEST_XDIST_WORKER set, pytest-benchmark leaves writing the JSON to a controller)
    env = {name: value for name, value in os.environ.items()
           if not name.startswith("PYTEST_XDIST")}
    env.update(ATTNBENCH_BENCH_GRID="tiny", PYTHONPATH=str(REPO))
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q",
         str(REPO / "tests" / "benchmarks"), *args],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout)


def test_plain_pytest_deselects_the_benchmarks():
    result = run_pytest()
    assert result.returncode == 5, result.stdout + result.stderr  # 5: no test ran
    assert f"{N_TINY} deselected" in result.stdout


@pytest.mark.slow  # pytest --benchmark run in a subprocess: left out of the quick lane
@pytest.mark.e2e
def test_benchmark_json_autosave_and_compare(tmp_path):
    report = tmp_path / "bench.json"
    storage = f"file://{tmp_path / 'storage'}"
    # every benchmark but most mods built-ins: each compiles a kernel (~10 s on 2 cores)
    first = run_pytest("--benchmark", f"--benchmark-json={report}", "--benchmark-autosave",
                       f"--benchmark-storage={storage}", "-k", MODS_SUBSET, *QUICK,
                       timeout=600)
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    data = json.loads(report.read_text())
    benchmarks = data["benchmarks"]
    n_kernels = len(SHAPES["tiny"]) * len(MASKS) * len(BACKENDS)
    assert len(benchmarks) >= n_kernels  # + the peers that are installed (numpy at least)
    names = {bench["name"] for bench in benchmarks}
    assert any(name.startswith("test_peer[") and name.endswith("numpy]") for name in names)
    steps = {bench["extra_info"].get("step") for bench in benchmarks}
    assert {"backward", "forward+backward"} <= steps  # the backward, both ways
    assert {bench["extra_info"].get("mod") for bench in benchmarks} == {None, "plain", "alibi"}
    for bench in benchmarks:
        info = bench["extra_info"]
        shape = f"L={info['L']} d_k={info['d_k']} H={info['heads']}/{info['kv_heads']}"
        assert bench["group"].startswith(shape) and info["mask"] in bench["group"]
        assert bench["stats"]["median"] > 0 and bench["stats"]["rounds"] >= 3
        assert info["gflops"] > 0
        assert info["gflops"] == info["flops"] / bench["stats"]["median"] / 1e9
        assert 0 <= info["max_abs_err"] <= info["tolerance"]
    assert data["machine_info"]["cpu"]
    saved = list((tmp_path / "storage").rglob("*.json"))
    assert len(saved) == 1, saved

    # the comparison's plumbing needs no more than the forward benchmarks (time: CI)
    second = run_pytest("--benchmark", "--benchmark-compare", "-k", "test_attention",
                        f"--benchmark-storage={storage}", *QUICK)
    assert second.returncode == 0, second.stdout[-3000:] + second.stderr[-3000:]
    assert "Comparing against benchmarks from" in second.stdout + second.stderr
    assert saved[0].stem.split("_")[0] in second.stdout + second.stderr  # e.g. 0001
