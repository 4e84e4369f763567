"""The timing core on a fake clock (no assertion on real speed), and peak memory."""

import gc
import inspect
import time
import tracemalloc

import numpy as np
import pytest
from numba import njit, prange

from attnbench.measure.timing import Timing, measure, peak_extra_memory, rss_peak_supported

MIB = 2**20


class FakeClock:
    """A clock that only moves when a fake workload says it took some time."""

    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def fake_workload(clock, durations):
    """A function whose k-th call 'takes' durations[k] seconds (the last one repeats)."""
    calls = []

    def fn():
        clock.now += durations[min(len(calls), len(durations) - 1)]
        calls.append(1)

    fn.calls = calls
    return fn


def test_warmup_is_excluded_and_statistics_are_right():
    clock = FakeClock()
    # The first call 'compiles' for 100 s; then calls take 1..7 s.
    fn = fake_workload(clock, [100.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0])
    timing = measure(fn, warmup=1, repeat=7, min_time=0.0, max_time=1e9, clock=clock)
    assert timing.samples == (1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0)
    assert (timing.runs, timing.number, timing.calls, timing.warmup) == (7, 1, 7, 1)
    assert timing.median == 4.0
    assert (timing.q25, timing.q75, timing.iqr) == (2.5, 5.5, 3.0)  # numpy's linear quartiles
    assert timing.min == 1.0
    assert len(fn.calls) == 8


def test_without_warmup_the_first_call_is_a_sample():
    clock = FakeClock()
    fn = fake_workload(clock, [100.0, 1.0])
    timing = measure(fn, warmup=0, repeat=3, min_time=0.0, max_time=1e9, clock=clock)
    assert timing.samples == (100.0, 1.0, 1.0)


def test_short_calls_are_batched_until_a_batch_lasts_min_time():
    clock = FakeClock()
    fn = fake_workload(clock, [2.0**-10])
    timing = measure(fn, warmup=1, repeat=5, min_time=2.0**-7, max_time=1e9, clock=clock)
    assert timing.number == 10  # 1, 2, 5 calls are under 8 * 2**-10 s; 10 calls are not
    assert timing.samples == (2.0**-10,) * 5  # per call, not per batch
    assert len(fn.calls) == 1 + (1 + 2 + 5) + 5 * 10


def test_explicit_number():
    clock = FakeClock()
    fn = fake_workload(clock, [0.5])
    timing = measure(fn, warmup=2, repeat=4, number=3, max_time=1e9, clock=clock)
    assert timing.number == 3 and timing.runs == 4 and timing.median == 0.5
    assert len(fn.calls) == 2 + 4 * 3


def test_budget_caps_the_number_of_runs():
    clock = FakeClock()
    fn = fake_workload(clock, [1.0])
    timing = measure(fn, warmup=1, repeat=100, min_time=0.0, max_time=3.5, clock=clock)
    assert timing.runs == 3  # a 4th run would end at 4 s > 3.5 s


def test_min_repeat_wins_over_the_budget():
    clock = FakeClock()
    fn = fake_workload(clock, [10.0])
    timing = measure(fn, repeat=7, min_time=0.0, max_time=1.0, min_repeat=3, clock=clock)
    assert timing.runs == 3
    assert measure(fn, repeat=2, min_time=0.0, max_time=1.0, clock=clock).runs == 2


def test_gc_is_off_while_timing_and_restored():
    states = []
    timing = measure(lambda: states.append(gc.isenabled()), repeat=3, number=1)
    assert timing.runs == 3 and not any(states)
    assert gc.isenabled()


@pytest.mark.parametrize("bad", [{"repeat": 0}, {"warmup": -1}, {"number": 0},
                                 {"min_repeat": 0}])
def test_bad_arguments(bad):
    with pytest.raises(ValueError):
        measure(lambda: None, **bad)


def test_real_clock_smoke():
    timing = measure(lambda: sum(range(100)), max_time=0.02)
    assert isinstance(timing, Timing) and timing.runs >= 3
    assert all(sample > 0 for sample in timing.samples)
    assert timing.q25 <= timing.median <= timing.q75
    assert set(timing.as_dict()) >= {"median_s", "q25_s", "q75_s", "iqr_s", "min_s", "runs"}
    assert "ms" in str(timing)


def test_real_clock_is_perf_counter():
    assert inspect.signature(measure).parameters["clock"].default is time.perf_counter


# --- peak memory ----------------------------------------------------------------------------

ALLOCATION = 64 * MIB
METHODS = ["tracemalloc", pytest.param("rss", marks=pytest.mark.skipif(
    not rss_peak_supported(), reason="needs Linux /proc/self/clear_refs"))]


@njit(cache=False)
def _njit_allocates(n):
    scratch = np.ones(n)  # freed before returning: only the peak can see it
    return scratch.sum()


@njit(parallel=True, cache=False)
def _parallel_allocates(n, tasks):
    total = 0.0
    for _ in prange(tasks):  # each task allocates in its worker thread
        scratch = np.ones(n)
        total += scratch.sum()
    return total


def _numpy_allocates():
    return np.ones(ALLOCATION // 8).sum()


@pytest.mark.parametrize("method", METHODS)
def test_peak_sees_a_numpy_allocation(method):
    peak = peak_extra_memory(_numpy_allocates, method=method)
    assert ALLOCATION * 0.95 <= peak <= ALLOCATION + 8 * MIB


@pytest.mark.parametrize("method", METHODS)
def test_peak_sees_an_allocation_inside_njit(method):
    peak = peak_extra_memory(lambda: _njit_allocates(ALLOCATION // 8), method=method)
    assert ALLOCATION * 0.95 <= peak <= ALLOCATION + 8 * MIB


def test_tracemalloc_sees_allocations_in_numba_worker_threads():
    peak = peak_extra_memory(lambda: _parallel_allocates(ALLOCATION // 8, 2))
    assert peak >= ALLOCATION * 0.95  # at least one task's array at a time


def test_peak_excludes_memory_allocated_before():
    held = np.ones(ALLOCATION // 8)
    assert peak_extra_memory(lambda: held.sum()) < MIB


def test_peak_counts_the_returned_value_and_restores_tracing():
    assert not tracemalloc.is_tracing()
    assert peak_extra_memory(lambda: np.ones(ALLOCATION // 8)) >= ALLOCATION * 0.95
    assert not tracemalloc.is_tracing()
    tracemalloc.start()
    try:
        peak_extra_memory(lambda: None)
        assert tracemalloc.is_tracing()
    finally:
        tracemalloc.stop()


def test_unknown_memory_method():
    with pytest.raises(ValueError, match="method"):
        peak_extra_memory(lambda: None, method="valgrind")


def test_ms_columns_are_the_summary_in_milliseconds():
    timing = measure(lambda: sum(range(100)), warmup=1, repeat=5, min_repeat=5, min_time=1e-4)
    columns = timing.ms_columns()
    assert columns["median_ms"] == pytest.approx(timing.median * 1e3)
    assert columns["iqr_ms"] == pytest.approx(timing.iqr * 1e3)
    assert columns["q25_ms"] <= columns["median_ms"] <= columns["q75_ms"]
    assert columns["runs"] == timing.runs and columns["calls"] == timing.calls
