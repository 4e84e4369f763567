"""How many threads the machine can give a timed call right now.

A parallel call waits for its slowest thread.  When another process keeps one of the cores
busy, a call on as many threads as there are cores has a thread waiting for that core every
time slice: its time rises in steps, its samples stay tight, and a series of such points
gives a scaling fit that is tight and wrong (the sweep sets such ``starved`` points aside
or calls the fit inconclusive).  On a single core still free, a call on fewer threads does
not wait at all.

:func:`check_cores` runs a fixed parallel workload (the fused kernel, a few milliseconds a
call) for a fraction of a second on the configured number of threads and reads the
process's run-queue wait (:func:`~attnbench.measure.probe.run_queue_wait`).  If the threads
waited more than :data:`~attnbench.measure.probe.WAIT_TOLERANCE` of the wall time in most
readings, it tries one thread fewer, down to one: the sweep then runs on the largest count
that does not wait, and says so.  Where the wait cannot be read (not Linux) it changes
nothing.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from attnbench.measure.probe import WAIT_TOLERANCE, run_queue_wait

__all__ = ["CoreCheck", "check_cores"]

#: Wall time of one reading of the workload, in seconds.
READING_SECONDS = 0.15
#: Readings per thread count; the count waits if most of them did.
READINGS = 3


@dataclass(frozen=True)
class CoreCheck:
    """What :func:`check_cores` found.

    Attributes
    ----------
    requested : int
        The configured thread count (Numba's).
    threads : int
        The count to run on: the largest tried whose threads did not wait for cores, or
        1 where even one thread waited.
    wait_shares : dict
        Thread count tried -> the median over its readings of the run-queue wait of the
        process's threads, in all, over the wall time.
    """

    requested: int
    threads: int
    wait_shares: dict = field(default_factory=dict)

    @property
    def reduced(self) -> bool:
        """True if the check chose fewer threads than configured."""
        return self.threads < self.requested

    @property
    def waiting(self) -> bool:
        """True if even the chosen count's threads waited for cores (every count tried
        waited, down to one thread): the machine is busier than it has cores."""
        share = self.wait_shares.get(self.threads, math.nan)
        return bool(share > WAIT_TOLERANCE)

    def describe(self) -> str:
        """One sentence for the console and the report."""
        shares = ", ".join(f"{n} thread{'s' if n > 1 else ''}: {share:.0%}"
                           for n, share in self.wait_shares.items() if not math.isnan(share))
        if not self.wait_shares or all(math.isnan(s) for s in self.wait_shares.values()):
            return (f"ran on {self.threads} thread(s); the run-queue wait could not be read, "
                    "so whether other processes held cores was not checked")
        if self.waiting:
            return (f"other processes kept the cores busy: even one thread waited for a core "
                    f"(wait over wall time, {shares}; more than {WAIT_TOLERANCE:.0%} means "
                    f"waiting), so every backend ran on {self.threads} thread(s) and timed "
                    "points may come out starved; rerun when the machine is quieter")
        if self.reduced:
            return (f"another process kept cores busy: on {self.requested} threads the timed "
                    f"threads waited for a core (wait over wall time, {shares}; more than "
                    f"{WAIT_TOLERANCE:.0%} means waiting), so every backend ran on "
                    f"{self.threads} thread(s); give --threads {self.requested} to insist")
        return (f"ran on {self.threads} thread(s): the threads did not wait for cores before "
                f"the sweep ({shares})")


def check_cores(requested: int | None = None, *,
                workload: Callable[[int], Callable[[], object]] | None = None,
                seconds: float = READING_SECONDS, readings: int = READINGS,
                clock: Callable[[], float] = time.perf_counter,
                wait: Callable[[], float] = run_queue_wait) -> CoreCheck:
    """The largest thread count, at most ``requested``, whose threads do not wait for cores.

    Parameters
    ----------
    requested : int, optional
        Thread count to start from; default Numba's (``numba.get_num_threads()``).
    workload : callable, optional
        ``workload(n)`` returns a zero-argument call that runs a parallel job on ``n``
        threads (and sets the thread count itself, cheaply: its own time counts as time
        not waited); default the fused kernel on (1, 4n, 384, 64) float32 on ``n`` of
        Numba's threads.
    seconds : float
        Wall time of one reading.
    readings : int
        Readings per thread count; a count waits if more than half of them waited more
        than :data:`~attnbench.measure.probe.WAIT_TOLERANCE` of their wall time.
    clock, wait : callable
        Wall clock and the process's run-queue wait in seconds (injected by tests).

    Returns
    -------
    CoreCheck
    """
    if requested is None:
        import numba

        requested = numba.get_num_threads()
    workload = workload or _fused_kernel_workload
    shares: dict = {}
    threads = requested
    while True:
        shares[threads] = _wait_share(workload(threads), seconds, readings, clock, wait)
        if math.isnan(shares[threads]) or shares[threads] <= WAIT_TOLERANCE or threads == 1:
            break
        threads -= 1
    return CoreCheck(requested=requested, threads=threads, wait_shares=shares)


def _wait_share(call, seconds, readings, clock, wait) -> float:
    """Median over ``readings`` of (run-queue wait) / (wall time) while ``call`` repeats."""
    call()  # warm-up: compilation, thread pools started
    values = []
    for _ in range(readings):
        wait_start, start = wait(), clock()
        while True:
            call()
            elapsed = clock() - start
            if elapsed >= seconds:
                break
        values.append((wait() - wait_start) / elapsed)
    if any(math.isnan(v) for v in values):
        return math.nan
    return statistics.median(values)


def _fused_kernel_workload(threads: int):
    import numba
    import numpy as np

    from attnbench import kernels

    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((1, 4 * threads, 384, 64), dtype=np.float32)
               for _ in range(3))

    def call():
        # Numba's thread count is a per-thread setting (no pools to rebuild); the kernel
        # keeps the BLAS single-threaded inside its parallel loop itself.
        before = numba.get_num_threads()
        numba.set_num_threads(threads)
        try:
            kernels.attention(q, k, v, backend="numba")
        finally:
            numba.set_num_threads(before)
    return call
