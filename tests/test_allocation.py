"""Steady-state allocation while timing: large arrays reuse their pages, and give them back."""

import resource

import numpy as np
import pytest

from attnbench.measure import allocation
from attnbench.measure.allocation import steady_allocation
from attnbench.measure.timing import interleaved, measure

pytestmark = pytest.mark.skipif(not allocation.available(), reason="needs glibc's mallopt")

#: 64 MiB: above glibc's largest dynamic mmap threshold, so mmap-ed (and faulted) per call.
SHAPE = (4096, 2048)


def _faults_of_calls(calls: int) -> int:
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(calls):
        np.ones(SHAPE).sum()
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before


def _rss_bytes() -> int:
    with open("/proc/self/status") as status:
        line = next(line for line in status if line.startswith("VmRSS:"))
    return int(line.split()[1]) * 1024


def test_a_large_array_faults_its_pages_every_call_outside_and_once_inside():
    np.ones(SHAPE).sum()
    outside = _faults_of_calls(4)
    with steady_allocation():
        np.ones(SHAPE).sum()  # the warm-up call faults the pages in once
        inside = _faults_of_calls(4)
    assert outside > 0
    assert inside <= outside / 4, (inside, outside)


def test_the_kept_memory_is_given_back_on_exit_and_nesting_keeps_it_until_the_outer_exit():
    with steady_allocation():
        with steady_allocation():
            np.ones(SHAPE).sum()
        held = _rss_bytes()
        assert _faults_of_calls(2) <= 64  # still reused after the inner exit
    released = _rss_bytes()
    assert held - released > 0.75 * np.ones(SHAPE).nbytes, (held, released)


def test_after_the_outer_exit_large_arrays_are_mmap_ed_again():
    with steady_allocation():
        np.ones(SHAPE).sum()
    np.ones(SHAPE).sum()
    assert _faults_of_calls(2) > 64  # fresh pages again: the settings were restored


def test_measure_and_interleaved_time_with_the_pages_kept(monkeypatch):
    # Inside the timed calls a large array reuses its pages: (almost) no minor faults.
    faults = []

    def call():
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        np.ones(SHAPE).sum()
        faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)

    measure(call, max_time=0.05, repeat=4, min_time=0)
    assert faults[0] > 64 and max(faults[1:]) <= 64, faults  # the warm-up faulted, no other
    faults.clear()
    interleaved({"a": call, "b": call}, rounds=3, min_time=0)
    assert max(faults[2:]) <= 64, faults  # after each function's warm-up
