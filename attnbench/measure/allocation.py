"""Steady-state memory allocation while a call is timed (glibc).

A call that materialises L x L arrays (the reference, the NumPy peer) allocates and frees
tens to hundreds of MiB per call.  glibc's ``malloc`` serves blocks above its mmap threshold
(128 KiB at first, raised as blocks are freed, at most 32 MiB) with fresh ``mmap`` pages and
returns them to the kernel on ``free``: every call then faults its pages in again and the
kernel zeroes them.  That can be a third or more of the float64 reference's time at
L >= 1024, it varies from call to call with what the kernel has free, and it changes
regime where the arrays cross 32 MiB: a fit of time against L then sees a step as
curvature (L^2.2-2.5 where the work is L^2).

:func:`steady_allocation` keeps freed memory in the process while timing (``mallopt``:
no mmap for large blocks, no trimming), so repeated calls reuse their pages, as a
long-running program's do with a caching allocator (the PyTorch CPU tuning guides advise
jemalloc or TCMalloc for this reason).  The warm-up call inside it faults the pages in
once; the timed calls do not.  On exit, the free memory is returned to the kernel
(``malloc_trim``), so a peak-memory measurement that follows sees a call's own pages.

The settings are process-wide: other threads allocating meanwhile keep their memory too.
On exit the thresholds are left as glibc's own rule leaves them once a process has freed a
32 MiB block (mmap threshold 32 MiB, trim threshold 64 MiB): setting any of them by hand
turns that rule off for the rest of the process.  Where the user tuned the allocator
(``MALLOC_*_`` variables, ``GLIBC_TUNABLES``), or elsewhere than glibc (macOS, musl), the
context changes nothing, and :func:`available` says so.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import platform
import threading

__all__ = ["available", "steady_allocation"]

_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD, _M_MMAP_MAX = -1, -3, -4
#: glibc's defaults and the ceiling of its dynamic mmap threshold (64-bit).
_DEFAULT_MMAP_MAX = 65536
_DYNAMIC_MMAP_THRESHOLD_MAX = 32 * 2**20
_NEVER_TRIM = -1  # man mallopt: -1 disables trimming completely

_lock = threading.Lock()
_depth = 0
_libc: list = []  # the C library, looked up on first use ([None] where not glibc)


def _user_tuned() -> bool:
    """True if the allocator was tuned through the environment: leave it as it is."""
    return "GLIBC_TUNABLES" in os.environ or any(
        name.startswith("MALLOC_") and name.endswith("_") for name in os.environ)


def _glibc():
    if not _libc:
        lib = None
        if (platform.system() == "Linux" and platform.libc_ver()[0] == "glibc"
                and not _user_tuned()):
            try:
                candidate = ctypes.CDLL(None)
                if hasattr(candidate, "mallopt") and hasattr(candidate, "malloc_trim"):
                    lib = candidate
            except OSError:
                lib = None
        _libc.append(lib)
    return _libc[0]


def available() -> bool:
    """True if :func:`steady_allocation` keeps memory here (glibc, not tuned by the user)."""
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
        if _depth == 0 and not _keep(libc):
            _libc[:] = [None]  # refused: time as glibc is, and say so (available())
            libc = None
        else:
            _depth += 1
    if libc is None:
        yield
        return
    try:
        yield
    finally:
        with _lock:
            _depth -= 1
            if _depth == 0:
                _give_back(libc)


def _keep(libc) -> bool:
    """No mmap for large blocks, no trimming; False (and nothing changed) if refused."""
    if not libc.mallopt(_M_MMAP_MAX, 0):
        return False
    if not libc.mallopt(_M_TRIM_THRESHOLD, _NEVER_TRIM):
        libc.mallopt(_M_MMAP_MAX, _DEFAULT_MMAP_MAX)
        return False
    return True


def _give_back(libc) -> None:
    """The thresholds glibc's dynamic rule reaches, mmap allowed again, free memory returned."""
    libc.mallopt(_M_MMAP_MAX, _DEFAULT_MMAP_MAX)
    libc.mallopt(_M_MMAP_THRESHOLD, _DYNAMIC_MMAP_THRESHOLD_MAX)
    libc.mallopt(_M_TRIM_THRESHOLD, 2 * _DYNAMIC_MMAP_THRESHOLD_MAX)
    libc.malloc_trim(0)
