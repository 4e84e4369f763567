"""Peak extra memory of one call (tracemalloc or the kernel's RSS high-water mark).

Split out of :mod:`attnbench.measure.timing`, which re-exports :func:`peak_extra_memory`
and :func:`rss_peak_supported`.
"""

from __future__ import annotations

import gc
import tracemalloc
from collections.abc import Callable

__all__ = ["peak_extra_memory", "rss_peak_supported"]


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
