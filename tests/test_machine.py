"""The machine record: complete, JSON-serialisable, cached; and the GEMM peak."""

import json
import math

import numpy as np

from attnbench.measure import machine
from attnbench.measure.machine import (
    gemm_peak_gflops,
    gemm_peak_record,
    machine_columns,
    machine_record,
    summary_lines,
)

RECORD_KEYS = {
    "cpu_model", "logical_cores", "usable_cores", "numba_threads", "numba_threading_layer",
    "blas", "openmp", "env", "python", "numpy", "numba", "pandas", "threadpoolctl", "torch",
    "numba_cuda", "hostname", "platform", "machine",
}
BLAS_KEYS = {"internal_api", "version", "architecture", "threading_layer", "num_threads",
             "prefix", "filepath", "owner"}


def test_record_has_the_keys_and_is_json_serialisable():
    record = machine_record()
    assert set(record) >= RECORD_KEYS
    assert json.loads(json.dumps(record)) == record
    assert record["cpu_model"] and record["logical_cores"] >= 1
    assert record["numba_threads"] >= 1
    assert record["numba_threading_layer"] in ("omp", "tbb", "workqueue")
    assert record["numpy"] == np.__version__
    for entry in record["blas"]:
        assert set(entry) == BLAS_KEYS
    assert any(entry["owner"] == "numpy" for entry in record["blas"]) or not record["blas"]


def test_record_is_cached_and_returned_as_a_copy():
    first = machine_record()
    first["cpu_model"] = "changed by the caller"
    first["blas"].clear()
    second = machine_record()
    assert second["cpu_model"] != "changed by the caller"
    assert second == machine_record()


def test_env_vars_are_recorded_only_when_set():
    env = machine_record()["env"]
    assert all(isinstance(value, str) for value in env.values())
    assert set(env) <= {"OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE", "OPENBLAS_NUM_THREADS",
                        "OMP_NUM_THREADS", "MKL_NUM_THREADS", "NUMBA_NUM_THREADS",
                        "NUMBA_THREADING_LAYER", "NUMBA_ENABLE_CUDASIM"}


def test_columns_and_summary():
    columns = machine_columns()
    assert {"cpu_model", "logical_cores", "numba_threads", "threading_layer", "blas",
            "numpy", "numba"} <= set(columns)
    assert all(isinstance(value, str | int) for value in columns.values())
    lines = summary_lines()
    assert any(line.startswith("CPU") for line in lines)
    assert any(line.startswith("BLAS") for line in lines)


def test_gemm_peak_is_a_positive_throughput():
    for dtype in (np.float32, np.float64):
        peak = gemm_peak_gflops(dtype, n=128, repeat=3, max_time=0.2)
        assert math.isfinite(peak) and peak > 0


def test_gemm_peak_is_the_best_probe_and_the_record_counts_the_probes(monkeypatch):
    # Products of n=96 (2·96³ = 1.77e6 FLOPs) read 1 ms quiet, then 3 ms while disturbed,
    # then 0.9 ms: the peak never drops to the disturbed reading.
    n, flops = 96, 2 * 96**3
    fastest = iter([1e-3, 3e-3, 0.9e-3])

    class FakeTiming:
        def __init__(self, seconds):
            self.min = seconds

    monkeypatch.setattr(machine, "_PEAK_READINGS", {})
    monkeypatch.setattr(machine, "measure", lambda *a, **k: FakeTiming(next(fastest)))
    peaks = [gemm_peak_gflops(np.float32, n=n) for _ in range(3)]
    expected = [flops / 1e-3 / 1e9, flops / 1e-3 / 1e9, flops / 0.9e-3 / 1e9]
    assert np.allclose(peaks, expected)
    (key, entry), = gemm_peak_record().items()
    assert key.startswith("float32 n=96 blas_threads=")
    assert entry["probes"] == 3 and math.isclose(entry["gflops"], expected[-1])
    assert np.allclose(entry["readings"], [flops / t / 1e9 for t in (1e-3, 3e-3, 0.9e-3)],
                       rtol=1e-3)
    assert machine_record()["gemm_peak_probes"] == gemm_peak_record()  # in the record


def test_busy_means_more_runnable_processes_than_cores():
    from attnbench.measure.machine import busy_machine

    assert not busy_machine(1.2, 2)  # the run itself and a shell, on 2 cores
    assert not busy_machine(2.0, 2)
    assert busy_machine(2.5, 2)
    assert not busy_machine(9.0, 16) and busy_machine(17.0, 16)
    assert not busy_machine(50.0, None)  # unknown cores: no claim
