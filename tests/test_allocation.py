"""Steady-state allocation while timing: large arrays reuse their pages, and give them back."""

import resource

import numpy as np
import pytest

from attnbench.measure import allocation
from attnbench.measure.allocation import steady_allocation
from attnbench.measure.timing import measure

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


def test_measure_times_with_the_pages_kept(monkeypatch):
    states = []
    original = allocation.steady_allocation

    def spy():
        states.append("entered")
        return original()

    monkeypatch.setattr("attnbench.measure.timing.steady_allocation", spy)
    measure(lambda: None, max_time=0.01, repeat=3)
    assert states == ["entered"]
