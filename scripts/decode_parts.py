"""What one key costs each part of the numba decode step, with the cache in L2: the arithmetic
without the memory.

    python scripts/decode_parts.py [--rows 4] [--head-dim 128] [--keys 512] [--reps 200]

Times, on one thread, the parts of a fully visible chunk (``kernels/numba_cpu/decode.py``)
looped over ``--keys`` keys of one key/value head that stay in L2: the scores
(``chunk_scores``, with its key rows' prefetches), the values' product (``chunk_values``,
with its value rows' prefetches), the online softmax and, for the bfloat16 pair
products, the rounding of the weights.  Three ways: a float32 cache, a bfloat16 cache
widened to float32 in registers (what bfloat16 caches took before the pair products),
and a bfloat16 cache as pairs (``kernels/numba_cpu/pair_products.py``).  Each figure is
the median of the timed batches of the loop (:func:`attnbench.measure.timing.measure`,
warm-up excluded) with its 95% interval, in ns per key for ``--rows`` query rows (GQA
32/8 at Lq = 1: 4).  A whole step that reads its cache from memory costs more than the
sum where the reads do not overlap the
arithmetic: compare with ``attnbench bench --only decode``.
"""

from __future__ import annotations

import argparse
import functools
import platform
import sys
from pathlib import Path

import ml_dtypes
import numba
import numpy as np
from numba import njit

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from attnbench.kernels.numba_cpu.decode import CHUNK, _softmax_update  # noqa: E402
from attnbench.kernels.numba_cpu.decode_products import (  # noqa: E402
    chunk_scores,
    chunk_values,
    round_weights,
)
from attnbench.kernels.numba_cpu.pair_products import NATIVE  # noqa: E402
from attnbench.measure.timing import measure  # noqa: E402


@njit
def _scores(qf, keys, values, n, R, D, reps, scores):
    rows = np.empty(CHUNK, np.int64)
    ahead = np.empty(CHUNK, np.int64)
    for _ in range(reps):
        for j0 in range(0, n, CHUNK):
            for jj in range(CHUNK):
                rows[jj] = j0 + jj
                ahead[jj] = (j0 + CHUNK + jj) % n
            chunk_scores(qf, keys, rows, CHUNK, R, D, np.float32(0.125), scores, CHUNK,
                         ahead, CHUNK)


@njit
def _values(weights, values, n, R, D, reps, acc):
    rows = np.empty(CHUNK, np.int64)
    ahead = np.empty(CHUNK, np.int64)
    for _ in range(reps):
        for j0 in range(0, n, CHUNK):
            for jj in range(CHUNK):
                rows[jj] = j0 + jj
                ahead[jj] = (j0 + CHUNK + jj) % n
            chunk_values(weights, CHUNK, values, rows, CHUNK, R, D, acc, ahead, CHUNK)


@njit
def _softmax(scores, n, R, D, reps, acc):
    row_max = np.full(R, -np.inf, np.float32)
    row_sum = np.zeros(R, np.float32)
    s2, a2 = scores.reshape((R, CHUNK)), acc.reshape((R, D))
    for _ in range(reps):
        for _j0 in range(0, n, CHUNK):
            _softmax_update(s2, CHUNK, row_max, row_sum, a2, np.float32(-np.inf))


@njit
def _rounding(scores, n, R, reps, weights):
    for _ in range(reps):
        for _j0 in range(0, n, CHUNK):
            round_weights(scores, CHUNK, R, CHUNK, weights)


def _ns_per_key(fn, args, n, reps):
    """``(median, low, high)``: ns per key of ``fn(*args)`` (``n`` keys, ``reps`` passes)."""
    timing = measure(functools.partial(fn, *args), repeat=9, number=1)
    per_key = 1e9 / (n * reps)
    low, high = timing.ci95
    return timing.median * per_key, low * per_key, high * per_key


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=4)
    parser.add_argument("--head-dim", type=int, default=128)
    parser.add_argument("--keys", type=int, default=512)
    parser.add_argument("--reps", type=int, default=200)
    a = parser.parse_args()
    numba.set_num_threads(1)
    R, D, n, reps = a.rows, a.head_dim, a.keys - a.keys % CHUNK, a.reps
    rng = np.random.default_rng(0)
    f32 = [rng.standard_normal(n * D).astype(np.float32) for _ in range(2)]
    bf16 = [x.astype(ml_dtypes.bfloat16).view(np.uint16) for x in f32]
    q32 = rng.standard_normal(R * D).astype(np.float32)
    q16 = q32.astype(ml_dtypes.bfloat16).view(np.uint16)
    p32 = (rng.random(R * CHUNK) * 0.1).astype(np.float32)
    p16 = p32.astype(ml_dtypes.bfloat16).view(np.uint16)
    acc = np.zeros(R * D, np.float32)
    ways = [("float32", q32, f32, p32), ("bfloat16 widened", q32, bf16, p32),
            ("bfloat16 pairs", q16, bf16, p16)]
    print(f"{platform.processor() or platform.machine()}, 1 thread, R={R} D={D}, {n} keys "
          f"in L2, {reps} passes a call, median [95% interval] of 9 calls; vdpbf16ps: "
          f"{'yes' if NATIVE else 'no (emulated)'}")
    print(f"{'cache':18s} {'scores':>20s} {'values':>20s} {'softmax':>20s} "
          f"{'rounding':>20s} {'total':>7s}  ns per key")
    for name, q, (keys, values), weights in ways:
        parts = [_ns_per_key(_scores, (q, keys, values, n, R, D, reps, p32.copy()), n, reps),
                 _ns_per_key(_values, (weights, values, n, R, D, reps, acc), n, reps),
                 _ns_per_key(_softmax, (p32.copy(), n, R, D, reps, acc), n, reps)]
        parts.append(_ns_per_key(_rounding, (p32, n, R, reps, np.empty(R * CHUNK, np.uint16)),
                                 n, reps) if name.endswith("pairs") else (0.0, 0.0, 0.0))
        cells = " ".join(f"{m:6.2f} [{lo:5.2f}, {hi:5.2f}]" for m, lo, hi in parts)
        print(f"{name:18s} {cells} {sum(m for m, _, _ in parts):7.2f}")

if __name__ == "__main__":
    main()
