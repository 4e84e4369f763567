"""How fast the decode kernel's two products read a cache in memory, one thread: the
scores (``row_dots``, blocks of 4, 2 or 1 query rows per key row) and the values (the 4 x 64
register-blocked ``tile_product`` over runs of 64 keys, as ``kernels.numba_cpu.
decode_products`` runs it; 2 x 128; and the plain loop ``acc[r] += p · v_j`` the float
caches took before), four query rows, D = Dv = 128, float32, 131072 keys (64 MiB, far
larger than the caches), beside a plain streaming sum of the same array.  Prints GB/s of
the array read and ns per key (median of 7 calls after a warm-up).

    python scripts/decode_products_read.py
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import numba
import numpy as np
from numba import njit

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from attnbench.kernels._jit.math import FASTMATH  # noqa: E402
from attnbench.kernels.numba_cpu.products import row_dots, tile_product  # noqa: E402

D, N, R = 128, 131072, 4


@njit(fastmath=FASTMATH, error_model="numpy")
def stream_sum(keys):
    total = np.float32(0)
    for i in range(keys.size):
        total += keys[i]
    return total


@njit(fastmath=FASTMATH, error_model="numpy")
def scores(q, keys, out, rows_per_block):
    for j in range(N):
        if rows_per_block == 4:
            row_dots(q, 0, D, keys, j * D, out, j, N, D, 4, 16)
        elif rows_per_block == 2:
            row_dots(q, 0, D, keys, j * D, out, j, N, D, 2, 16)
            row_dots(q, 2 * D, D, keys, j * D, out, 2 * N + j, N, D, 2, 16)
        else:
            for r in range(R):
                row_dots(q, r * D, D, keys, j * D, out, r * N + j, N, D, 1, 16)


@njit(fastmath=FASTMATH, error_model="numpy")
def values(weights, keys, acc, variant):
    for j0 in range(0, N, 64):
        if variant == 0:  # 4 rows x 64 columns, half a row per pass
            for c0 in range(0, D, 64):
                tile_product(weights, j0, N, keys, j0 * D + c0, D, acc, c0, D, 64, 4, 64,
                             True)
        elif variant == 1:  # 2 rows x 128 columns, whole rows, two passes
            for r in range(0, R, 2):
                tile_product(weights, r * N + j0, N, keys, j0 * D, D, acc, r * D, D, 64, 2,
                             128, True)
        else:  # the plain loop
            for j in range(j0, j0 + 64):
                for r in range(R):
                    p = weights[r * N + j]
                    for e in range(D):
                        acc[r * D + e] += p * keys[j * D + e]


def main() -> int:
    numba.set_num_threads(1)
    keys = np.ones(N * D, np.float32)
    q = np.full(R * D, np.float32(0.01))
    out = np.zeros(R * N, np.float32)
    weights = np.full(R * N, np.float32(0.5))
    acc = np.zeros(R * D, np.float32)
    calls = {"streaming sum": lambda: stream_sum(keys)}
    for rows in (4, 2, 1):
        calls[f"scores, {rows} rows per key row"] = lambda m=rows: scores(q, keys, out, m)
    for variant, name in enumerate(("4 x 64 product", "2 x 128 product", "plain loop")):
        calls[f"values, {name}"] = lambda v=variant: values(weights, keys, acc, v)
    with open("/proc/loadavg") as f:
        print("load", f.read().split()[0])
    for name, call in calls.items():
        call()  # compiles
        times = []
        for _ in range(7):
            start = time.perf_counter()
            call()
            times.append(time.perf_counter() - start)
        median = float(np.median(times))
        print(f"{name:34s} {keys.nbytes / median / 1e9:6.1f} GB/s {median / N * 1e9:6.1f} ns/key")
    return 0


if __name__ == "__main__":
    sys.exit(main())
