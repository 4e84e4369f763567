"""The machine's read bandwidth: the yardstick of memory-bound kernels (decoding), as the
GEMM peak (:func:`attnbench.measure.machine.gemm_peak_gflops`) is for prefill.

A probe streams an array far larger than the caches (256 MiB of float32 by default; the
CPU's last-level cache is tens of MiB) once, split into one contiguous chunk per thread
over Numba's threads (the run's thread count), and sums it: a vectorised loop with
nothing to do but load.  As with the GEMM peak, the bandwidth is the best probe of the
process (interference only slows a read), and :func:`bandwidth_record` (in the machine
record) lists every probe.
"""

from __future__ import annotations

import time
from functools import partial

import numba
import numpy as np
from numba import njit, prange

__all__ = ["PROBE_MIB", "bandwidth_record", "read_bandwidth_gbs", "stream_reader",
           "stream_readers"]

#: Size of the probe's array (MiB).
PROBE_MIB = 256
_FASTMATH = {"reassoc", "nsz", "arcp", "contract"}  # no nnan/ninf: the data is finite anyway

#: GB/s read by every probe of this process, by ``"<MiB> MiB threads=<n>"``.
_READINGS: dict[str, list[float]] = {}


@njit(fastmath=_FASTMATH, cache=True, inline="always")
def _chunk_sum(x):
    total = np.float32(0)
    for i in range(x.size):
        total += x[i]
    return total


@njit(parallel=True, fastmath=_FASTMATH, cache=True)
def _stream(a, parts):
    """parts[t] = the sum of chunk t of ``a`` (one contiguous chunk per part)."""
    n, T = a.shape[0], parts.size
    per = (n + T - 1) // T
    for t in prange(T):
        lo = min(t * per, n)
        parts[t] = _chunk_sum(a[lo:min(n, lo + per)])


def stream_readers(thread_counts, mib: int = PROBE_MIB):
    """``(reads, nbytes)``: one call per entry of ``thread_counts`` that streams the same
    ``mib`` MiB array once in that many chunks (one thread each; compiled, warm), and the
    bytes each reads; for timing beside the calls they are a yardstick of."""
    data = np.ones(mib * (1 << 20) // 4, dtype=np.float32)  # written: its pages exist
    reads = []
    for threads in thread_counts:
        parts = np.zeros(threads, dtype=np.float32)
        _stream(data, parts)  # compiles (cached on disk), warms
        reads.append(partial(_stream, data, parts))
    return reads, data.nbytes


def stream_reader(mib: int = PROBE_MIB, threads: int | None = None):
    """``(read, nbytes)``: :func:`stream_readers` for one thread count (default: Numba's)."""
    (read,), nbytes = stream_readers(
        [numba.get_num_threads() if threads is None else threads], mib)
    return read, nbytes


def read_bandwidth_gbs(mib: int = PROBE_MIB, *, repeat: int = 5) -> float:
    """The best read bandwidth (GB/s, 1e9 bytes) of this process's probes, this one
    included: ``repeat`` timed reads of a ``mib`` MiB array on Numba's threads.

    Parameters
    ----------
    mib : int, default PROBE_MIB
    repeat : int, default 5

    Returns
    -------
    float
    """
    read, nbytes = stream_reader(mib)
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        read()
        best = min(best, time.perf_counter() - start)
    readings = _READINGS.setdefault(f"{mib} MiB threads={numba.get_num_threads()}", [])
    readings.append(nbytes / best / 1e9)
    return max(readings)


def bandwidth_record() -> dict:
    """The probes of this process: ``{key: {"gbs", "probes", "readings"}}`` (the best, how
    many, what each read)."""
    return {key: {"gbs": max(values), "probes": len(values),
                  "readings": [round(value, 3) for value in values]}
            for key, values in _READINGS.items()}
