"""Sweeps on tiny grids: the rows, failures and skips, saving and loading, Ctrl-C."""

import numpy as np
import pandas as pd
import pytest

from attnbench.measure import peers
from attnbench.measure.flops import attention_flops
from attnbench.measure.oracle import oracle_dtype
from attnbench.sweep import files as sweep_files
from attnbench.sweep.files import load_results, save_results
from attnbench.sweep.grid import Grid, Point, expand
from attnbench.sweep.remeasure import in_long_series
from attnbench.sweep.run import run_sweep, serial_executor
from attnbench.sweep.runner import PointRunner, make_inputs

#: Quick settings: short timing budget, no pause between backends, GEMM peak not measured,
#: no check of the cores before the sweep (tests/test_cores.py has those).
QUICK = {"max_time": 0.002, "gemm_peaks": {"float32": 100.0, "float64": 50.0},
         "progress": False, "check_threads": False}


def quick_runner(**kwargs):
    settings = {"max_time": 0.002, "gemm_peaks": QUICK["gemm_peaks"], "settle": 0.0}
    return PointRunner(**{**settings, **kwargs})


@pytest.fixture(scope="module")
def tiny_sweep():
    grid = Grid(L=(8, 16), d_k=(4,), heads=(2,), kv_heads=(1,), batch=(2,),
                mask=("none", "causal", "padding", "bool"), backend=("numba", "reference",
                                                                      "numpy"))
    points = expand([grid])
    return points, run_sweep(points, runner=quick_runner(), **QUICK)


def test_one_ok_row_per_point_with_measurements(tiny_sweep):
    points, result = tiny_sweep
    table = result.table
    assert not result.interrupted and len(table) == len(points) == 24
    assert (table["status"] == "ok").all(), table[["backend", "reason"]]
    assert (table["median_ms"] > 0).all() and (table["min_ms"] <= table["median_ms"]).all()
    assert (table["iqr_ms"] >= 0).all() and (table["runs"] >= 3).all()
    assert (table["gflops"] > 0).all()
    assert np.allclose(table["pct_of_gemm_peak"],
                       100 * table["gflops"] / table["dtype"].map(QUICK["gemm_peaks"]))
    assert (table["max_abs_err"] <= table["tolerance"]).all()
    assert table["within_tolerance"].all()
    assert (table["peak_mem_bytes"] > 0).all()
    assert (table["call_overhead_ms"] > 0).all()
    for column in ("cpu_model", "numba_threads", "blas", "numpy"):
        assert column in table  # the machine on every row


def test_flops_count_visible_pairs_of_each_mask(tiny_sweep):
    _, result = tiny_sweep
    row = result.table.set_index(["backend", "L", "mask"]).sort_index().loc[("numba", 16)]
    full = attention_flops(2, 2, 16, 16, 4)
    assert row.loc["none", "flops"] == full
    assert row.loc["causal", "flops"] == attention_flops(2, 2, 16, 16, 4, causal=True)
    assert row.loc["padding", "flops"] == full * 12 // 16  # key_lengths = L - L // 4
    q, k, v, kwargs = make_inputs(Point("numba", 16, 4, 2, 1, 2, "bool", "float32"))
    assert row.loc["bool", "flops"] == attention_flops(2, 2, 16, 16, 4, mask=kwargs["mask"])


def test_inputs_are_the_same_for_every_backend_of_a_problem():
    a = make_inputs(Point("numba", 16, 4, 2, 2, 1, "bool", "float64"))
    b = make_inputs(Point("numpy", 16, 4, 2, 2, 1, "bool", "float64"))
    for x, y in zip(a[:3], b[:3], strict=True):
        assert np.array_equal(x, y)
    assert np.array_equal(a[3]["mask"], b[3]["mask"])


def test_peers_agree_with_kernels_on_every_mask_kind():
    for mask in ("none", "causal", "padding", "bool"):
        point = Point("numpy", 24, 8, 4, 2, 2, mask, "float64")
        q, k, v, kwargs = make_inputs(point)
        from attnbench import kernels

        expected = kernels.attention(q, k, v, backend="reference", **kwargs)
        assert np.allclose(peers.numpy_attention(q, k, v, **kwargs), expected, atol=1e-12)
        if peers.peer_status("torch")[0]:
            got = peers.make_call("torch", q, k, v, kwargs)()
            assert np.allclose(got, expected, atol=1e-10), mask


def test_a_failing_point_is_recorded_and_the_sweep_goes_on(monkeypatch):
    original = PointRunner.make_call

    def make_call(self, point, q, k, v, kwargs):
        if point.L == 16:
            def boom():
                raise MemoryError("Unable to allocate 64 GiB")
            return boom
        return original(self, point, q, k, v, kwargs)

    monkeypatch.setattr(PointRunner, "make_call", make_call)
    points = expand([Grid(L=(8, 16, 32), d_k=(4,), heads=(1,), backend=("numpy",))])
    table = run_sweep(points, runner=quick_runner(), **QUICK).table
    assert list(table["status"]) == ["ok", "failed", "ok"]
    failed = table.iloc[1]
    assert failed["reason"] == "MemoryError: Unable to allocate 64 GiB"
    assert np.isnan(failed["median_ms"])


def test_the_reference_is_skipped_when_it_would_exceed_the_memory_budget():
    runner = quick_runner(memory_budget=1e6)  # 1 MB
    points = expand([Grid(L=(16, 128), d_k=(4,), heads=(2,), backend=("reference", "numba"))])
    table = run_sweep(points, runner=runner, **QUICK).table.set_index(["backend", "L"])
    assert table.loc[("reference", 16), "status"] == "ok"
    skipped = table.loc[("reference", 128)]
    # 2 heads x 128^2 scores x 40 B = 1.31 MB > 1 MB
    assert skipped["status"] == "skipped"
    assert "would need ~1.2 MB" in skipped["reason"] and "memory budget" in skipped["reason"]
    assert table.loc[("numba", 128), "status"] == "ok"  # the fused kernel builds no L x L


def test_missing_peer_and_cuda_without_gpu_are_recorded_not_dropped(monkeypatch):
    monkeypatch.setattr(peers, "peer_status",
                        lambda name: (False, "torch is not installed (pip install x)")
                        if name == "torch" else (True, ""))
    monkeypatch.setattr("kernels.has_real_gpu", lambda: False)
    points = expand([Grid(L=(8,), d_k=(4,), heads=(1,), backend=("torch", "cuda", "numba"))])
    table = run_sweep(points, runner=quick_runner(), **QUICK).table.set_index("backend")
    assert table.loc["torch", "status"] == "skipped"
    assert table.loc["torch", "reason"] == "skipped: torch is not installed (pip install x)"
    assert table.loc["cuda", "status"] == "skipped"
    assert "real GPU" in table.loc["cuda", "reason"]
    assert table.loc["numba", "status"] == "ok"


def test_a_bad_gqa_combination_is_skipped_with_the_reason():
    points = expand([Grid(L=(8,), d_k=(4,), heads=(3,), kv_heads=(2,), backend=("numba",))])
    row = run_sweep(points, runner=quick_runner(), **QUICK).table.iloc[0]
    assert row["status"] == "skipped" and "not a multiple" in row["reason"]


def test_the_oracle_is_skipped_above_its_limit_and_the_row_says_so():
    points = expand([Grid(L=(8, 32), d_k=(4,), heads=(1,), dtype=("float32", "float64"),
                          backend=("numba",))])
    table = run_sweep(points, runner=quick_runner(oracle_limit=512), **QUICK).table
    table = table.set_index(["L", "dtype"])
    assert table.loc[(8, "float32"), "oracle"] == "float64"
    assert table.loc[(8, "float64"), "oracle"] == oracle_dtype(np.float64).name  # 64 <= 512/4
    skipped = table.loc[(32, "float32")]
    assert skipped["oracle"].startswith("oracle skipped: B·H·L² = 1,024 score entries > limit")
    assert np.isnan(skipped["max_abs_err"]) and skipped["status"] == "ok"


def test_ctrl_c_keeps_the_finished_rows():
    points = expand([Grid(L=(8, 16, 32, 64), d_k=(4,), heads=(1,), backend=("numpy",))])

    def interrupted_executor(points, run_point):
        for index, point in enumerate(points):
            if index == 2:
                raise KeyboardInterrupt
            yield run_point(point)

    result = run_sweep(points, executor=interrupted_executor, runner=quick_runner(), **QUICK)
    assert result.interrupted and result.n_points == 4
    assert list(result.table["L"]) == [8, 16]


def test_the_executor_interface_is_a_function_of_points_and_a_runner():
    points = expand([Grid(L=(8, 16), d_k=(4,), heads=(1,), backend=("numpy",))])
    seen = []

    def reversed_executor(points, run_point):  # any order is fine
        for point in reversed(points):
            seen.append(point)
            yield run_point(point)

    table = run_sweep(points, executor=reversed_executor, runner=quick_runner(),
                      **QUICK).table
    assert seen == points[::-1] and list(table["L"]) == [16, 8]
    assert list(serial_executor(points, lambda p: p.L)) == [8, 16]


@pytest.mark.parametrize("engine", ["parquet", "csv only"])
def test_save_and_load_round_trip(tiny_sweep, tmp_path, monkeypatch, engine):
    _, result = tiny_sweep
    if engine == "csv only":
        monkeypatch.setattr(sweep_files, "parquet_engine", lambda: None)
    elif sweep_files.parquet_engine() is None:
        pytest.skip("no parquet engine installed")
    written = save_results(result, tmp_path)
    names = {path.name for path in written}
    assert names == ({"sweep.csv", "sweep.json"} | ({"sweep.parquet"}
                                                   if engine == "parquet" else set()))
    table, meta = load_results(tmp_path)
    assert meta["n_rows"] == len(result.table) and meta["gemm_peak_gflops"] == QUICK["gemm_peaks"]
    assert meta["machine"]["cpu_model"]
    pd.testing.assert_frame_equal(table, result.table, check_dtype=False)


def test_loading_a_folder_without_results_says_what_it_looked_for(tmp_path):
    with pytest.raises(FileNotFoundError, match="sweep.parquet or sweep.csv"):
        load_results(tmp_path)


def test_threads_are_limited_during_the_sweep_and_restored_after():
    import numba

    before = numba.get_num_threads()
    points = expand([Grid(L=(16,), d_k=(4,), heads=(2,), backend=("numba", "numpy"))])
    table = run_sweep(points, runner=quick_runner(), threads=1, **QUICK).table
    assert (table["threads"] == 1).all() and (table["status"] == "ok").all()
    assert numba.get_num_threads() == before
    with pytest.raises(ValueError, match="threads must lie in"):
        run_sweep(points, runner=quick_runner(), threads=10**6, **QUICK)


def test_series_along_L_get_a_brief_first_timing_then_an_interleaved_one_journaled(tmp_path):
    from attnbench.sweep.journal import Journal, journaled, load_journal

    grid = Grid(L=(8, 16, 24), d_k=(4,), heads=(1,), backend=("numba",), mask=("none",))
    single = Grid(L=(8,), d_k=(8,), heads=(1,), backend=("numba",))  # no series: full timing
    points = expand([grid, single])
    with Journal(tmp_path / "sweep.jsonl") as journal:
        table = run_sweep(points, max_time=0.002, progress=False, check_threads=False,
                          gemm_peaks={"float32": 100.0},
                          executor=journaled(serial_executor, journal)).table
    series = table[table["d_k"] == 4]
    assert series["brief_timing"].all() and series["series_interleaved"].all()
    assert (series["samples_taken"] >= 3 + 7).all()  # brief first, then the 8 rounds
    alone = table[table["d_k"] == 8].iloc[0]
    assert not alone["brief_timing"] and not alone["series_interleaved"]
    journaled_rows = load_journal(tmp_path / "sweep.jsonl").rows  # the last row per key
    assert all(journaled_rows[key]["series_interleaved"] for key in series["point_key"])


def blas_threads() -> int | None:
    return peers.peer_threads("numpy")


@pytest.mark.skipif(blas_threads() in (None, 1), reason="needs a BLAS with 2+ threads")
def test_the_reference_is_timed_with_the_blas_on_one_thread_first_and_in_the_series_pass():
    """Its small products ran 1.4-2x slower for stretches on two threads (measure.problems
    .timing_threads); the numpy peer, a speed contender, keeps the sweep's threads."""
    seen = {}

    class Recording(PointRunner):
        def make_call(self, point, q, k, v, kwargs):
            call = super().make_call(point, q, k, v, kwargs)

            def recorded():
                seen.setdefault(point.backend, set()).add(blas_threads())
                return call()
            return recorded

    before = blas_threads()
    points = expand([Grid(L=(8, 16, 24), d_k=(4,), heads=(1,), backend=("reference", "numpy"))])
    runner = Recording(max_time=0.002, gemm_peaks=QUICK["gemm_peaks"], settle=0.0,
                       retimed=in_long_series(points))  # as run_sweep's own: series always
    table = run_sweep(points, runner=runner, threads=2, **QUICK).table
    assert (table["status"] == "ok").all() and table["series_interleaved"].all()
    assert seen == {"reference": {1}, "numpy": {2}}
    assert set(table.loc[table["backend"] == "reference", "threads"]) == {1}
    assert set(table.loc[table["backend"] == "numpy", "threads"]) == {2}
    assert blas_threads() == before
