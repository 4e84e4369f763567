"""Why the decode kernel reads one key row at a time: the read order of a dot over a cache
far larger than the caches, on one thread, against the plain streaming read.

    python scripts/decode_read_order.py [--threads 1] [--repeat 5]

Hkv = 8 heads of 32768 keys of D = 128 float32 (128 MiB).  ``one row``: for each key, the
dot of one query with its row (the order of ``kernels.numba_cpu.decode``); ``four rows``:
four keys per pass (four row streams at once, the order the kernel had before); each with
a software prefetch of the rows ``distance`` keys ahead (0: none).  ``stream``: the sum of
the array in address order (the read-bandwidth probe's loop).  Best of ``--repeat`` calls.
Measured on AMD EPYC (2 cores, Zen 4), one thread, two runs: stream 28.1 GB/s, one row
29.0-30.7 GB/s, four rows 9.9-11.4 GB/s; a prefetch 16 or 64 rows ahead made one row slower
(18-23 GB/s) and left four rows far behind (9.1-13.6 GB/s).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numba
import numpy as np
from numba import njit, prange

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from attnbench.kernels._jit.math import FASTMATH  # noqa: E402
from attnbench.kernels._jit.prefetch import prefetch_rows  # noqa: E402


@njit(parallel=True, fastmath=FASTMATH)
def four_rows(q, k, out, distance):
    Hkv, L, D = k.shape
    for h in prange(Hkv):
        total = np.float32(0)
        for j in range(0, L, 4):
            if distance > 0:
                prefetch_rows(k, (h * L + j + distance) * D, 4, D)
            d0 = d1 = d2 = d3 = np.float32(0)
            for d in range(D):
                x = q[h, d]
                d0 += x * k[h, j, d]
                d1 += x * k[h, j + 1, d]
                d2 += x * k[h, j + 2, d]
                d3 += x * k[h, j + 3, d]
            total += d0 + d1 + d2 + d3
        out[h] = total


@njit(parallel=True, fastmath=FASTMATH)
def one_row(q, k, out, distance):
    Hkv, L, D = k.shape
    for h in prange(Hkv):
        total = np.float32(0)
        for j in range(L):
            if distance > 0:
                prefetch_rows(k, (h * L + j + distance) * D, 1, D)
            dot = np.float32(0)
            for d in range(D):
                dot += q[h, d] * k[h, j, d]
            total += dot
        out[h] = total


@njit(parallel=True, fastmath=FASTMATH)
def stream(q, k, out, distance):
    Hkv, L, D = k.shape
    for h in prange(Hkv):
        total = np.float32(0)
        for j in range(L):
            for d in range(D):
                total += k[h, j, d]
        out[h] = total


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    numba.set_num_threads(args.threads)
    rng = np.random.default_rng(0)
    k = rng.standard_normal((8, 32768, 128), dtype=np.float32)
    q = rng.standard_normal((8, 128), dtype=np.float32)
    out = np.empty(8, np.float32)
    runs = [(stream, 0)] + [(f, d) for f in (one_row, four_rows) for d in (0, 16, 64)]
    for function, distance in runs:
        function(q, k, out, distance)  # compiles
        best = float("inf")
        for _ in range(args.repeat):
            start = time.perf_counter()
            function(q, k, out, distance)
            best = min(best, time.perf_counter() - start)
        print(f"{function.__name__:10s} prefetch {distance:3d}: {best * 1e3:7.2f} ms "
              f"{k.nbytes / best / 1e9:5.1f} GB/s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
