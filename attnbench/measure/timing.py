"""The timing core every backend shares, and the peak extra memory of a call.

:func:`measure` calls a function a few times untimed first (the warm-up absorbs Numba
compilation, first-touch page faults and cache fills), then times batches of calls
with :func:`time.perf_counter`.  Calls too short for the timer are batched, as
:meth:`timeit.Timer.autorange` does: the batch size grows 1, 2, 5, 10, 20, 50, ... until
one batch lasts ``min_time``.  Batches are repeated up to ``repeat`` times within a
wall-clock budget of ``max_time`` seconds (but at least ``min_repeat`` times).  The
result keeps every sample, and reports the median and the interquartile range rather
than the mean: timing noise is one-sided (interrupts, other processes) and skewed.

The garbage collector is off while timing (as :mod:`timeit` does).

:func:`peak_extra_memory` reports the peak memory a call needs on top of what was
allocated before it; see its notes for what each method can and cannot see.
"""

from __future__ import annotations

import gc
import itertools
import time
import tracemalloc
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

__all__ = ["Timing", "measure", "peak_extra_memory"]


@dataclass(frozen=True)
class Timing:
    """Timing samples of one function, in seconds per call; warm-up calls excluded."""

    samples: tuple[float, ...]  # seconds per call, one per timed batch
    number: int  # calls per batch: a sample is the batch's time / number
    warmup: int  # untimed calls made before the first batch

    @property
    def runs(self) -> int:
        """Number of timed batches (samples)."""
        return len(self.samples)

    @property
    def calls(self) -> int:
        """Number of timed calls, ``runs * number``."""
        return self.runs * self.number

    @property
    def median(self) -> float:
        return float(np.median(self.samples))

    @property
    def q25(self) -> float:
        """First quartile (linear interpolation, as :func:`numpy.percentile`)."""
        return float(np.percentile(self.samples, 25))

    @property
    def q75(self) -> float:
        """Third quartile."""
        return float(np.percentile(self.samples, 75))

    @property
    def iqr(self) -> float:
        """Interquartile range ``q75 - q25``: the spread that ignores the outliers."""
        return self.q75 - self.q25

    @property
    def min(self) -> float:
        return float(min(self.samples))

    def as_dict(self) -> dict:
        """The summary statistics (seconds) and counts, flat, for a table row."""
        return {
            "median_s": self.median, "q25_s": self.q25, "q75_s": self.q75,
            "iqr_s": self.iqr, "min_s": self.min, "runs": self.runs, "number": self.number,
        }

    def __str__(self) -> str:
        return (f"{self.median * 1e3:.4g} ms (IQR {self.iqr * 1e3:.2g} ms, "
                f"{self.runs} runs x {self.number} calls)")


def _batch_sizes():
    """1, 2, 5, 10, 20, 50, 100, ... as :meth:`timeit.Timer.autorange` tries them."""
    for power in itertools.count():
        for base in (1, 2, 5):
            yield base * 10**power


def _time_batch(fn: Callable[[], object], number: int, clock: Callable[[], float]) -> float:
    start = clock()
    for _ in range(number):
        fn()
    return clock() - start


def measure(fn: Callable[[], object], *, warmup: int = 1, repeat: int = 7,
            min_time: float = 1e-3, max_time: float = 1.0, min_repeat: int = 3,
            number: int | None = None,
            clock: Callable[[], float] = time.perf_counter) -> Timing:
    """Time ``fn()``: median and spread over repeated batches, warm-up excluded.

    Parameters
    ----------
    fn : callable
        Called without arguments (bind them with :func:`functools.partial` or a lambda).
    warmup : int, default 1
        Untimed calls first; they absorb JIT compilation and first-touch costs.
    repeat : int, default 7
        Number of timed batches wanted.
    min_time : float, default 1e-3
        Shortest batch, in seconds, when ``number`` is chosen automatically; ``perf_counter``
        resolves ~100 ns, so a 1 ms batch is timed to ~1e-4 relative precision.
    max_time : float, default 1.0
        Wall-clock budget, in seconds, for the timed batches (the warm-up is not counted).
        No batch is started that is expected to end past it once ``min_repeat`` batches
        exist, so slow calls get fewer samples rather than a longer run.
    min_repeat : int, default 3
        Batches taken even past the budget (capped at ``repeat``).
    number : int, optional
        Calls per batch; by default grown 1, 2, 5, 10, ... until a batch lasts ``min_time``
        (that calibration batch is the first sample: all its calls come after the warm-up).
    clock : callable, default time.perf_counter
        Returns seconds; a fake clock makes the statistics testable.

    Returns
    -------
    Timing
    """
    if repeat < 1 or warmup < 0 or min_repeat < 1:
        raise ValueError(f"need repeat >= 1, min_repeat >= 1 and warmup >= 0; got "
                         f"repeat={repeat}, min_repeat={min_repeat}, warmup={warmup}")
    if number is not None and number < 1:
        raise ValueError(f"number must be >= 1 or None; got {number}")
    min_repeat = min(min_repeat, repeat)
    gc_was_enabled = gc.isenabled()
    gc.disable()
    try:
        for _ in range(warmup):
            fn()
        start = clock()
        samples = []
        if number is None:  # autorange; the batch that reaches min_time is the first sample
            for number in _batch_sizes():
                elapsed = _time_batch(fn, number, clock)
                if elapsed >= min_time or clock() - start >= max_time:
                    break
            samples.append(elapsed / number)
        while len(samples) < repeat:
            expected_end = clock() - start + number * float(np.mean(samples) if samples else 0)
            if len(samples) >= min_repeat and expected_end > max_time:
                break
            samples.append(_time_batch(fn, number, clock) / number)
    finally:
        if gc_was_enabled:
            gc.enable()
    return Timing(samples=tuple(samples), number=number, warmup=warmup)


# --- memory ---------------------------------------------------------------------------------


def _proc_status_bytes(field: str) -> int:
    """A ``kB`` field of /proc/self/status (``VmRSS``, ``VmHWM``), in bytes."""
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise OSError(f"/proc/self/status has no {field} field")


def _reset_rss_high_water_mark() -> None:
    """Reset the kernel's peak-RSS counter (VmHWM) to the current RSS (Linux >= 4.0)."""
    with open("/proc/self/clear_refs", "w") as clear_refs:
        clear_refs.write("5")


def rss_peak_supported() -> bool:
    """True if the ``"rss"`` method of :func:`peak_extra_memory` works here (Linux, /proc)."""
    try:
        _reset_rss_high_water_mark()
        _proc_status_bytes("VmHWM")
    except OSError:
        return False
    return True


def peak_extra_memory(fn: Callable[[], object], *, method: str = "tracemalloc",
                      warmup: int = 1) -> int:
    """Peak memory, in bytes, that ``fn()`` holds on top of what existed before the call.

    Parameters
    ----------
    fn : callable
        Called without arguments, ``warmup`` times untimed and then once measured.
    method : {"tracemalloc", "rss"}, default "tracemalloc"
        ``"tracemalloc"``: peak of the bytes allocated through Python's allocators
        during the call.  ``"rss"``: rise of the process's resident set size, from the
        kernel's high-water mark (Linux only).
    warmup : int, default 1
        Calls before the measured one, so that JIT compilation (whose memory neither
        method should charge to the kernel) happens first.

    Returns
    -------
    int
        Bytes; includes the returned value (e.g. the output array) while it is alive.

    Notes
    -----
    ``"tracemalloc"`` sees NumPy arrays (NumPy reports its data buffers to tracemalloc)
    and the arrays Numba-compiled code allocates: Numba's runtime (NRT) allocates through
    ``PyMem_RawMalloc`` (set in ``numba/core/runtime/_nrt_pythonmod.c``; checked with 0.68),
    and tracemalloc hooks that allocator, in Numba's worker threads too (checked with the
    omp and workqueue threading layers; ``tests/test_timing.py`` checks a 64 MiB array
    made inside an ``njit`` function).  It does not see memory taken by plain
    ``malloc``: BLAS work buffers, LLVM, CUDA device memory; nor stack memory.  It counts
    requested bytes, not pages, and slows allocation-heavy code while it runs.

    ``"rss"`` resets the kernel's peak-RSS counter by writing 5 to /proc/self/clear_refs,
    calls ``fn`` and reads ``VmHWM`` from /proc/self/status: no sampling, so no peak is
    missed even while compiled code holds the GIL, and every allocator is seen.  But it
    counts pages actually touched (``np.empty`` never written costs nothing), misses
    memory the process reuses from pages it already holds (glibc's free lists, pools), and
    sees whatever other threads of the process do meanwhile.  Both numbers are lower
    bounds on what the call needs on an idle process; use ``"tracemalloc"`` to compare
    algorithms and ``"rss"`` as a cross-check that nothing big escapes it.
    """
    for _ in range(warmup):
        fn()
    gc.collect()
    if method == "tracemalloc":
        was_tracing = tracemalloc.is_tracing()
        if not was_tracing:
            tracemalloc.start()
        try:
            before = tracemalloc.get_traced_memory()[0]
            tracemalloc.reset_peak()
            result = fn()
            peak = tracemalloc.get_traced_memory()[1]
            del result
        finally:
            if not was_tracing:
                tracemalloc.stop()
        return max(peak - before, 0)
    if method == "rss":
        before = _proc_status_bytes("VmRSS")
        _reset_rss_high_water_mark()
        result = fn()
        peak = _proc_status_bytes("VmHWM")
        del result
        return max(peak - before, 0)
    raise ValueError(f"method={method!r}; expected 'tracemalloc' or 'rss'")
