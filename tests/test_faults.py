"""Figures that cannot be true are flagged as measurement faults, never printed as results."""

import math

import numpy as np
import pandas as pd

from attnbench.measure.timing import fault
from attnbench.sweep import run
from attnbench.sweep.grid import Grid, expand
from attnbench.sweep.run import PEAK_PROBES, run_sweep
from attnbench.sweep.runner import PointRunner


def test_fault_fires_only_above_the_limit():
    assert fault(99.9, 100, "% of the GEMM peak") == ""
    assert fault(100.0, 100, "% of the GEMM peak") == ""
    message = fault(197.0, 100, "% of the GEMM peak")
    assert message.startswith("measurement fault") and "197" in message
    assert fault(3.0, 2, "speed-up over 1 thread")  # 3x on 2 threads cannot be


def test_a_sweep_against_a_disturbed_peak_flags_every_row_instead_of_reporting_it():
    # A GEMM peak measured under heavy interference: every point beats it.
    peaks = {"float32": 1e-6, "float64": 1e-6}
    grid = Grid(L=(8, 16), d_k=(4,), heads=(1,), backend=("numba", "reference"))
    runner = PointRunner(max_time=0.002, gemm_peaks=peaks, settle=0.0)
    table = run_sweep(expand([grid]), runner=runner, max_time=0.002, gemm_peaks=peaks,
                      progress=False, with_machine=False, check_threads=False).table
    assert (table["status"] == "ok").all()
    assert table["pct_of_gemm_peak"].isna().all()
    assert table["fault"].str.startswith("measurement fault").all()


def test_a_sweep_against_a_plausible_peak_reports_percentages():
    peaks = {"float32": 1e9, "float64": 1e9}
    grid = Grid(L=(8,), d_k=(4,), heads=(1,), backend=("numba",))
    runner = PointRunner(max_time=0.002, gemm_peaks=peaks, settle=0.0)
    table = run_sweep(expand([grid]), runner=runner, max_time=0.002, gemm_peaks=peaks,
                      progress=False, with_machine=False, check_threads=False).table
    assert (table["fault"] == "").all()
    pct = table["pct_of_gemm_peak"].to_numpy(float)
    assert np.isfinite(pct).all() and (pct < 100).all() and not math.isnan(pct.sum())
    # Every row keeps its samples and says how many it took and whether it is noisy.
    assert (table["samples_taken"] >= 6).all() and table["samples_ms"].str.len().gt(0).all()
    assert table["noisy"].isin([True, False]).all()


def test_the_peak_is_the_best_of_probes_through_the_sweep_and_rows_are_read_against_it(
        monkeypatch):
    # The first two probes run while the machine is disturbed (absurdly low peaks: every
    # point would beat them); a later probe reads the true peak.  No row may keep a fault
    # or a percentage computed against a disturbed probe.
    readings = iter([1e-6, 1e-6, 1e6, 5e5, 1e-6])
    probed = []

    def fake_peak(dtype, **kwargs):
        probed.append(next(readings))
        return max(probed)  # machine.gemm_peak_gflops returns the best probe so far

    monkeypatch.setattr(run, "gemm_peak_gflops", fake_peak)
    monkeypatch.setattr(run, "SETTLE_SECONDS", 0.0)
    grid = Grid(L=(8, 16, 24, 32), d_k=(4,), heads=(1,), backend=("numba",))
    result = run_sweep(expand([grid]), max_time=0.002, progress=False, with_machine=False,
                       check_threads=False)
    assert len(probed) == PEAK_PROBES  # start, each quarter, end
    table = result.table
    assert result.gemm_peaks == {"float32": 1e6}
    assert (table["gemm_peak_gflops"] == 1e6).all()
    assert (table["fault"] == "").all()
    assert np.allclose(table["pct_of_gemm_peak"], 100 * table["gflops"] / 1e6)


def test_the_console_table_says_why_a_percentage_is_missing():
    from attnbench.cli.console import format_points

    row = {"backend": "numba", "L": 64, "d_k": 8, "heads": 2, "kv_heads": 2, "batch": 1,
           "mask": "none", "dtype": "float32", "status": "ok", "median_ms": 0.1,
           "gflops": 30.0, "pct_of_gemm_peak": np.nan,
           "fault": fault(197.0, 100, "% of the GEMM peak")}
    text = format_points(pd.DataFrame([row, {**row, "L": 32, "pct_of_gemm_peak": 50.0,
                                             "fault": ""}]))
    assert "numba L=64 none float32: measurement fault: % of the GEMM peak 197" in text
    assert "L=32 none float32: measurement" not in text
