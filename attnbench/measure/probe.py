"""The interference probe and the check for figures that cannot be true.

A :class:`Probe` is a fixed small workload timed between sampling rounds
(:func:`attnbench.measure.timing.measure`, :func:`~attnbench.measure.timing.interleaved`):
its best reading is the quiet machine, and a round whose readings are slower than that by
more than :data:`PROBE_TOLERANCE` was disturbed.  :func:`fault` turns a figure that cannot
be true (a fraction of a peak above 100%, a speed-up above the thread count) into a
message, so that it is flagged as a measurement fault rather than printed as a result.

The default probe is single-threaded (a 64 x 64 matrix product): it sees other processes
taking the core and the caches, not a parallel call waiting for a worker thread another
process holds; the samples' own spread (the ``noisy`` flag) shows that.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable

import numpy as np

__all__ = ["PROBE_TOLERANCE", "WAIT_TOLERANCE", "Probe", "default_probe", "fault",
           "run_queue_wait"]

#: A probe slower than its best time by more than this fraction means interference.
PROBE_TOLERANCE = 0.3
#: A sample during which the process's threads waited for a core, in all, for more than
#: this fraction of its wall time was starved: another process held the cores.
WAIT_TOLERANCE = 0.1


def run_queue_wait() -> float:
    """Seconds this process's threads have spent runnable but waiting for a core, in all.

    The sum of the second field of ``/proc/self/task/*/schedstat`` (Linux).  A parallel
    call whose worker is pre-empted by another process waits a scheduler slice for it:
    its time rises in steps while its samples stay tight and a single-threaded probe sees
    nothing; this counter sees exactly that wait.  nan where it cannot be read.
    """
    total, read = 0, 0
    try:
        tasks = os.listdir("/proc/self/task")
    except OSError:
        return math.nan
    for task in tasks:
        try:
            with open(f"/proc/self/task/{task}/schedstat") as handle:
                total += int(handle.read().split()[1])
            read += 1
        except (OSError, IndexError, ValueError):
            continue  # a thread that ended between the listing and the read
    return total * 1e-9 if read else math.nan  # none readable (some sandboxes): unknown

Clock = Callable[[], float]


class Probe:
    """A fixed small workload timed between sampling rounds: a gauge of interference.

    Parameters
    ----------
    fn : callable, optional
        The workload; by default a 64 x 64 float64 matrix product (a few µs: BLAS, caches
        and the core, as the kernels use them).
    min_time : float, default 2e-4
        Calibrated batch length of one probe reading, in seconds.
    clock : callable, default time.perf_counter
    tolerance : float, default PROBE_TOLERANCE
        A reading slower than the best one by more than this fraction is "disturbed".
    """

    def __init__(self, fn: Callable[[], object] | None = None, *, min_time: float = 2e-4,
                 clock: Clock = time.perf_counter, tolerance: float = PROBE_TOLERANCE):
        if fn is None:
            matrix = np.random.default_rng(0).standard_normal((64, 64))
            fn = lambda: matrix @ matrix  # noqa: E731
        self.fn, self.min_time, self.tolerance, self.clock = fn, min_time, tolerance, clock
        self.number: int | None = None
        self.readings: list[float] = []  # seconds per call

    def __call__(self) -> float:
        """Time the probe once; seconds per call."""
        if self.number is None:
            self.fn()  # warm-up
            self.number = 1
            while self._batch(self.number) < self.min_time and self.number < 2**20:
                self.number *= 2  # calibration: double until a batch lasts min_time
        wall = self._batch(self.number) / self.number
        self.readings.append(wall)
        return wall

    def _batch(self, number: int) -> float:
        start = self.clock()
        for _ in range(number):
            self.fn()
        return self.clock() - start

    @property
    def best(self) -> float:
        """The fastest reading so far: the quiet machine."""
        return min(self.readings) if self.readings else math.nan

    def slowdown(self, reading: float) -> float:
        """``reading / best``."""
        return reading / self.best

    def disturbed(self, reading: float) -> bool:
        """True if ``reading`` is slower than the best by more than ``tolerance``."""
        return self.slowdown(reading) > 1 + self.tolerance


def fault(value: float, limit: float, what: str) -> str:
    """A message if ``value`` exceeds what can be true, else ``""``.

    A fraction of a peak above 100% or a parallel speed-up above the thread count is not
    a result: the peak or the point was measured while disturbed.  Callers print the
    message instead of the figure.
    """
    if value > limit:
        return (f"measurement fault: {what} {value:.3g} exceeds {limit:g}, which cannot be; "
                "the machine was disturbed during this or the reference measurement")
    return ""


_PROCESS_PROBE: list = []  # the process's default probe, made on first use


def default_probe() -> Probe:
    """This process's :class:`Probe` (one per process: its best reading is the baseline)."""
    if not _PROCESS_PROBE:
        _PROCESS_PROBE.append(Probe())
    return _PROCESS_PROBE[0]
