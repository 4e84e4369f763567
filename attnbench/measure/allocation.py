"""Steady-state memory allocation while a call is timed (glibc).

A call that materialises L x L arrays (the reference, the NumPy peer) allocates and frees
tens to hundreds of MiB per call.  glibc's ``malloc`` serves blocks above its mmap threshold
(128 KiB at first, raised as blocks are freed, at most 32 MiB) with fresh ``mmap`` pages and
returns them to the kernel on ``free``: every call then faults its pages in again and the
kernel zeroes them.  On the machine this was measured on (an AMD EPYC, 2 cores), that was
30-50% of the float64 reference's time at L >= 1024 (4 heads, one thread: 18 ns per score
entry, against 12 ns with the pages kept), it varied from call to call with what the kernel
had free, and it changed regime where the arrays cross 32 MiB: a fit of time against L
then saw a step as curvature (L^2.2-2.5 where the work is L^2).

:func:`steady_allocation` keeps freed memory in the process while timing (``mallopt``:
no mmap for large blocks, no trimming), so repeated calls reuse their pages, as a
long-running program's do with a caching allocator (the PyTorch CPU tuning guides advise
jemalloc or TCMalloc for this reason).  The warm-up call inside it faults the pages in
once; the timed calls do not.  On exit, the free memory is returned to the kernel
(``malloc_trim``), so a peak-memory measurement that follows sees a call's own pages.

The thresholds are then left as glibc's own rule leaves them once a process has freed a
32 MiB block (mmap threshold 32 MiB, trim threshold 64 MiB): setting them by hand turns
that rule off for the rest of the process.  Elsewhere than glibc (macOS, musl) the context
changes nothing, and :func:`available` says so.
"""

from __future__ import annotations

import contextlib
import ctypes
import platform
import threading

__all__ = ["available", "steady_allocation"]

_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD, _M_MMAP_MAX = -1, -3, -4
#: glibc's defaults and the ceiling of its dynamic mmap threshold (64-bit).
_DEFAULT_MMAP_MAX = 65536
_DYNAMIC_MMAP_THRESHOLD_MAX = 32 * 2**20
_KEEP_EVERYTHING = 2**31 - 1  # mallopt takes an int

_lock = threading.Lock()
_depth = 0
_libc: list = []  # the C library, looked up on first use ([None] where not glibc)


def _glibc():
    if not _libc:
        lib = None
        if platform.system() == "Linux" and platform.libc_ver()[0] == "glibc":
            try:
                candidate = ctypes.CDLL(None)
                if hasattr(candidate, "mallopt") and hasattr(candidate, "malloc_trim"):
                    lib = candidate
            except OSError:
                lib = None
        _libc.append(lib)
    return _libc[0]


def available() -> bool:
    """True if :func:`steady_allocation` can keep memory here (glibc)."""
    return _glibc() is not None


@contextlib.contextmanager
def steady_allocation():
    """Keep freed memory in the process for the duration (re-entrant; no-op off glibc).

    Examples
    --------
    >>> import numpy as np
    >>> with steady_allocation():
    ...     for _ in range(3):
    ...         _ = np.ones((2048, 2048)).sum()  # the pages of the 32 MiB array are reused
    """
    global _depth
    libc = _glibc()
    if libc is None:
        yield
        return
    with _lock:
        _depth += 1
        if _depth == 1:
            libc.mallopt(_M_MMAP_MAX, 0)
            libc.mallopt(_M_TRIM_THRESHOLD, _KEEP_EVERYTHING)
    try:
        yield
    finally:
        with _lock:
            _depth -= 1
            if _depth == 0:
                libc.mallopt(_M_MMAP_MAX, _DEFAULT_MMAP_MAX)
                libc.mallopt(_M_MMAP_THRESHOLD, _DYNAMIC_MMAP_THRESHOLD_MAX)
                libc.mallopt(_M_TRIM_THRESHOLD, 2 * _DYNAMIC_MMAP_THRESHOLD_MAX)
                libc.malloc_trim(0)
