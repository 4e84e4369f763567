"""A sweep's noisy points re-measured with their neighbours in L, on the synthetic machine of
``tests/test_timing_noise.py``: the re-measurement alternates with the neighbours, converges
to a tight interval that covers the truth, and a spent budget leaves the row noisy."""

import math

import numpy as np
import pytest

from attnbench.measure.intervals import format_samples, parse_samples
from attnbench.measure.timing import measure
from attnbench.sweep.remeasure import (
    REMEASURE_ROUNDS,
    SERIES_ROUNDS,
    Clocks,
    complete_brief_timings,
    in_long_series,
    neighbours,
    noisy_rows,
    remeasure_noisy,
    remeasure_series,
    series_groups,
)
from tests.test_timing_noise import SyntheticMachine, coverage_bounds

LENGTHS = (64, 128, 256, 512, 1024)


def true_seconds(L):
    return 1e-3 * (L / 256) ** 2


def sweep_rows(noisy_L=(256,), **series):
    """One row per L of a numba series, as the runner writes them; ``noisy_L`` flagged."""
    rows = []
    for L in LENGTHS:
        samples = true_seconds(L) * (1 + np.linspace(0, 0.6 if L in noisy_L else 0.01, 6))
        rows.append({"backend": "numba", "L": L, "d_k": 64, "heads": 4, "kv_heads": 4,
                     "batch": 1, "mask": "none", "dtype": "float32", "status": "ok",
                     "device": "cpu", "flops": 4.0 * L * L * 64 * 4,
                     "median_ms": np.median(samples) * 1e3,
                     "samples_ms": format_samples(samples), "samples_taken": 6, "rounds": 1,
                     "noisy": L in noisy_L, "gemm_peak_gflops": 1e6, **series})
    return rows


def traced_calls(machine, log):
    """``make_call`` for the rows: the synthetic workload of the row's L, logged."""
    def make_call(row):
        work = machine.workload(true_seconds(row["L"]))

        def call():
            log.append(row["L"])
            work()
        return call
    return make_call


def test_neighbours_are_the_next_L_of_the_same_series_only():
    rows = sweep_rows() + sweep_rows(noisy_L=(), mask="causal")
    rows[1]["status"] = "skipped"  # L = 128 is not a neighbour: nothing was timed
    assert [rows[i]["L"] for i in neighbours(rows, 2)] == [64, 512]
    assert [rows[i]["L"] for i in neighbours(rows, 0)] == [256]
    assert [rows[i]["L"] for i in neighbours(rows, 9)] == [512]  # causal series
    assert noisy_rows(rows) == [2]
    rows[3]["device"] = "cuda"  # GPU rows have their own timer: never re-measured here
    rows[3]["noisy"] = True
    assert noisy_rows(rows) == [2]


def quiet_clocks(machine):
    """The synthetic machine's clocks, and a sleep that does not wait."""
    return Clocks(sleep=lambda s: None, **machine.clocks())


def remeasure(machine, rows, log=None, **budgets):
    budgets = {"budget": 30.0, "total_budget": 60.0, **budgets}
    return remeasure_noisy(rows, traced_calls(machine, [] if log is None else log),
                           min_time=0.0, **budgets, clocks=quiet_clocks(machine))


def test_a_noisy_point_is_remeasured_alternating_with_its_neighbours_until_tight():
    machine = SyntheticMachine(seed=11, noise=0.15)  # 12 samples are not enough for 3%
    rows, log = sweep_rows(), []
    before = {i: dict(row) for i, row in enumerate(rows)}
    assert remeasure(machine, rows, log) == 1
    row = rows[2]
    assert row["remeasured"] and not row["noisy"]
    samples = parse_samples(row["samples_ms"])
    assert row["samples_taken"] == 6 + samples.size and row["rounds"] > 1 + REMEASURE_ROUNDS
    low, high = row["ci_low_ms"], row["ci_high_ms"]
    assert (high - low) / 2 <= 0.03 * row["median_ms"]  # converged to the target
    assert row["gflops"] == pytest.approx(row["flops"] / (row["median_ms"] / 1e3) / 1e9)
    assert row["pct_of_gemm_peak"] == pytest.approx(100 * row["gflops"] / 1e6)
    # Timed only with L = 128 and 512, in alternating rounds (the order rotates).
    assert set(log) == {128, 256, 512}
    rounds = [log[i:i + 3] for i in range(6, len(log) - 2, 3)]  # after warm-up, calibration
    assert all(sorted(chunk) == [128, 256, 512] for chunk in rounds)
    # The neighbours' rows, quiet, are unchanged.
    assert all(rows[i] == before[i] for i in (0, 1, 3, 4))


def test_remeasured_intervals_cover_the_truth():
    # Stopping once the interval is tight must not spoil its coverage much.
    trials, covered = 80, 0
    for seed in range(trials):
        rows = sweep_rows()
        remeasure(SyntheticMachine(seed=100 + seed, noise=0.15), rows)
        truth_ms = true_seconds(256) * (1 + 0.15 * math.log(2)) * 1e3
        covered += rows[2]["ci_low_ms"] <= truth_ms <= rows[2]["ci_high_ms"]
    assert covered >= coverage_bounds(trials)[0]


def test_a_spent_budget_leaves_the_row_noisy_and_says_how_many_samples_it_took():
    machine = SyntheticMachine(seed=12, noise=3.0)  # far too noisy for 3%
    rows = sweep_rows(noisy_L=(256, 1024))
    remeasure(machine, rows, budget=0.05, total_budget=10.0)
    for index in (2, 4):
        assert rows[index]["remeasured"] and rows[index]["noisy"]
        assert rows[index]["samples_taken"] > 6 + REMEASURE_ROUNDS  # the first 6, and more
        # 0.05 s buys a few rounds of ~20-80 ms past the first 12, not the 200 allowed
        assert rows[index]["rounds"] <= 1 + 1 + REMEASURE_ROUNDS + 8


def test_the_total_budget_stops_the_pass():
    machine = SyntheticMachine(seed=13, noise=3.0)
    rows = sweep_rows(noisy_L=LENGTHS)
    # the first point uses up the pass's budget
    assert remeasure(machine, rows, budget=1.0, total_budget=1e-3) == 1
    assert [bool(row.get("remeasured")) for row in rows] == [True, False, False, False, False]


def series_rows(slow_L=(64, 128, 256), factor=1.7):
    """A series along L whose first timings saw a slower machine at ``slow_L`` (tight
    samples: not noisy, so the noisy pass would never look at them)."""
    rows = sweep_rows(noisy_L=())
    for row in rows:
        if row["L"] in slow_L:
            samples = parse_samples(row["samples_ms"]) * factor
            row.update(median_ms=float(np.median(samples)), samples_ms=format_samples(samples))
    return rows


def fitted_exponent(rows):
    L = np.array([row["L"] for row in rows], dtype=float)
    median = np.array([row["median_ms"] for row in rows])
    return np.polyfit(np.log(L), np.log(median), 1)[0]


def test_a_series_timed_through_a_slower_stretch_is_timed_again_interleaved():
    rows = series_rows()
    assert abs(fitted_exponent(rows) - 2) > 0.15  # the stretch bent the first fit
    # The pass itself crosses a stretch 1.7x slower, a third of its length: interleaved,
    # it slows every length alike.
    machine = SyntheticMachine(seed=3, noise=0.02, bursts=[(0.05, 0.15, 1.7)])
    log = []
    assert remeasure_series(rows, traced_calls(machine, log), total_budget=60.0,
                            min_time=0.0, clocks=quiet_clocks(machine)) == 5
    assert all(row["series_interleaved"] and not row.get("remeasured") for row in rows)
    assert abs(fitted_exponent(rows) - 2) < 0.03, fitted_exponent(rows)
    # Every round timed each length once (after each one's warm-up and calibration).
    timed = log[2 * len(LENGTHS):]
    rounds = [timed[i:i + len(LENGTHS)] for i in range(0, len(timed), len(LENGTHS))]
    assert len(rounds) >= SERIES_ROUNDS - 1 and all(sorted(r) == list(LENGTHS) for r in rounds)


def test_the_series_pass_stops_at_its_budget_and_says_which_rows_kept_their_timings():
    rows = sweep_rows() + sweep_rows(noisy_L=(), mask="causal")
    machine = SyntheticMachine(seed=4)
    assert len(series_groups(rows)) == 2
    assert remeasure_series(rows, traced_calls(machine, []), total_budget=1e-9,
                            min_time=0.0, clocks=quiet_clocks(machine)) == 5
    assert [row["series_interleaved"] for row in rows] == [True] * 5 + [False] * 5
    short = sweep_rows()[:2]  # 2 lengths: no series to fit, nothing to interleave
    assert series_groups(short) == []


def test_a_series_with_brief_first_timings_is_timed_whatever_the_budget_and_any_left_get_full():
    rows = sweep_rows(noisy_L=()) + sweep_rows(noisy_L=(), mask="causal")
    for row in rows[5:]:
        row["brief_timing"] = True  # the sweep counted on the pass for these
    machine = SyntheticMachine(seed=5)
    assert remeasure_series(rows, traced_calls(machine, []), total_budget=1e-9,
                            min_time=0.0, clocks=quiet_clocks(machine)) == 10
    assert all(row["series_interleaved"] for row in rows)
    # A brief row whose series could not be timed again (a neighbour failed) gets the full
    # timing; a series whose calls raise keeps its first timings, and the sweep goes on.
    rows = sweep_rows(noisy_L=())
    for row in rows:
        row["brief_timing"] = True
    rows[1]["status"] = rows[2]["status"] = rows[3]["status"] = "failed"
    timed = []
    assert remeasure_series(rows, traced_calls(machine, []), total_budget=60.0,
                            min_time=0.0, clocks=quiet_clocks(machine)) == 0

    def full(row):
        timed.append(row["L"])
        return measure(machine.workload(true_seconds(row["L"])), repeat=6, number=1,
                       max_time=math.inf, **machine.clocks())

    assert complete_brief_timings(rows, full) == 2 and timed == [64, 1024]
    assert rows[0]["remeasured"] and rows[0]["samples_taken"] == 6 + 6


def test_a_series_whose_calls_fail_keeps_its_first_timings(capsys):
    rows = sweep_rows(noisy_L=())
    before = [dict(row) for row in rows]

    def broken(row):
        raise MemoryError("no room for the series")

    assert remeasure_series(rows, broken, total_budget=60.0) == 0
    assert [r["median_ms"] for r in rows] == [r["median_ms"] for r in before]
    assert not any(row["series_interleaved"] for row in rows)
    assert "keep their first timings" in capsys.readouterr().err


def test_each_series_and_each_noisy_group_is_timed_inside_its_backends_thread_limit():
    import contextlib

    rows = sweep_rows(noisy_L=(256,)) + sweep_rows(noisy_L=(), backend="reference")
    entered, log = [], []

    @contextlib.contextmanager
    def threads_for(row):
        entered.append(row["backend"])
        log.append("enter")
        yield
        log.append("exit")

    machine = SyntheticMachine(seed=7, noise=0.01)
    make_call = traced_calls(machine, log)
    remeasure_series(rows, make_call, total_budget=60.0, min_time=0.0,
                     threads_for=threads_for, clocks=quiet_clocks(machine))
    assert entered == ["numba", "reference"]
    rows[2]["noisy"] = True  # still noisy after the pass: the noisy pass takes it
    remeasure_noisy(rows, make_call, budget=0.0, total_budget=60.0, min_time=0.0,
                    threads_for=threads_for, clocks=quiet_clocks(machine))
    assert entered == ["numba", "reference", "numba"]
    # Every call ran inside a limit: between an enter and its exit.
    depth = 0
    for item in log:
        depth += {"enter": 1, "exit": -1}.get(item, 0)
        assert depth in (0, 1) and (depth == 1 or item == "exit")


def test_series_along_every_variable_are_found_and_those_sharing_a_point_timed_as_one():
    def row(L=1024, d_k=64, heads=4, kv_heads=None, batch=1, backend="numba", **extra):
        return {"backend": backend, "direction": "forward", "variant": "none", "L": L,
                "d_k": d_k, "heads": heads, "kv_heads": heads if kv_heads is None else kv_heads,
                "batch": batch, "mask": "none", "dtype": "float32", "status": "ok",
                "device": "cpu", **extra}

    rows = ([row(L=L) for L in (256, 512, 1024, 2048)]          # 0-3: L, shares 1024
            + [row(d_k=d) for d in (16, 32, 128)]               # 4-6: d_k (+ row 2)
            + [row(heads=h) for h in (1, 2, 8)]                 # 7-9: heads, kv = heads
            + [row(heads=8, kv_heads=2)]                        # 10: GQA, another ratio
            + [row(batch=b) for b in (2, 4)]                    # 11-12: batch (+ row 2)
            + [row(L=L, backend="reference") for L in (128, 256, 512)]  # 13-15: apart
            + [row(L=L, backend="numpy") for L in (256, 512)]   # 16-17: 2 lengths, none
            + [row(d_k=8, status="failed")])                    # 18: not timed
    groups = series_groups(rows)
    assert groups == [[0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 11, 12], [13, 14, 15]]
    # Before the sweep (points, no status yet): what series each point is in.
    in_series = in_long_series(rows)
    assert [in_series(r) for r in rows] == [True] * 10 + [False] + [True] * 5 + [False] * 2 + [
        True]


def test_a_joined_group_too_large_is_split_into_its_series_each_row_timed_once():
    from attnbench.sweep.remeasure import SERIES_MAX_GROUP, series_count

    rows = [{"backend": "numba", "direction": "forward", "variant": "none", "L": L, "d_k": d,
             "heads": 4, "kv_heads": 4, "batch": b, "mask": "none", "dtype": "float32",
             "status": "ok", "device": "cpu"}
            for L in (256, 512, 1024, 2048) for d in (16, 32, 64) for b in (1, 2, 4)]
    assert len(rows) > SERIES_MAX_GROUP  # 36 rows, every one in an L, d_k and batch series
    groups = series_groups(rows)
    flat = sorted(i for group in groups for i in group)
    assert flat == list(range(len(rows)))  # every row once
    assert all(len(group) <= SERIES_MAX_GROUP for group in groups)
    # Split along L first: 9 series of 4 lengths, each holding all its rows.
    assert sorted(len(group) for group in groups) == [4] * 9
    assert series_count(rows, groups[0]) == 1
    small = [row for row in rows if row["batch"] == 1]  # 12 rows: L and d_k series joined
    assert len(series_groups(small)) == 1 and series_count(small, list(range(12))) == 7
