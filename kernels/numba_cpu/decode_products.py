"""The decode kernel's fully visible chunks as register-blocked products.

A decode task holds ``R = G·Lq`` query rows (the query heads of one key/value head, times
the new queries) against one chunk of keys.  As plain Numba loops, a score is a vectorised
reduction over D ending in a horizontal sum per (row, key), and the value update
``acc[r] += p · v`` loads and stores the whole accumulator row for every key: the step was
bound by that arithmetic, not by the cache's bytes.  Here
(:mod:`kernels.numba_cpu.products`):

- scores: :func:`~kernels.numba_cpu.products.row_dots`, one key row at a time (address
  order), each of its vectors loaded once for ``MR`` rows;
- values: :func:`~kernels.numba_cpu.products.tile_product` adds ``P[rows, keys] ·
  V[keys, cols]`` to ``MR`` x ``NR`` accumulators held in registers across a run of keys
  (the chunk's keys on one page, at stride Dv).

Half caches (their bits) are widened in registers as each vector is loaded: never copied.
Used for half caches where D and Dv are multiples of ``NR`` (64, 128, 256: every model's
head size); other sizes, and float caches (whose plain loops read a row in address order,
faster than these products walk it: docs/guide/decode.md), keep the plain loops of
:mod:`kernels.numba_cpu.decode`.  The products take float operands too (their tests).
"""

from __future__ import annotations

from numba import njit

from .._jit.math import FASTMATH
from .products import row_dots, tile_product

#: Vector lanes of both products (16 float32: one zmm or two ymm).
NR = 16
#: Query rows per register block.
MR = 4


@njit(fastmath=FASTMATH, error_model="numpy", cache=True, inline="always")
def chunk_scores(qf, keys, rows, nk, R, D, scale, scores, ldc):
    """``scores[r·ldc + jj] = scale · q_r · k_jj`` for every row and key of a chunk: ``qf``
    the R x D queries (compute dtype), key jj at flat element ``rows[jj]`` of ``keys``."""
    full = R - R % MR
    for jj in range(nk):
        for r in range(0, full, MR):
            row_dots(qf, r * D, D, keys, rows[jj], scores, r * ldc + jj, ldc, D, MR, NR)
        for r in range(full, R):
            row_dots(qf, r * D, D, keys, rows[jj], scores, r * ldc + jj, ldc, D, 1, NR)
    for r in range(R):
        for jj in range(nk):
            scores[r * ldc + jj] *= scale


@njit(fastmath=FASTMATH, error_model="numpy", cache=True, inline="always")
def chunk_values(weights, ldw, values, rows, nk, R, Dv, acc):
    """``acc[r·Dv:(r+1)·Dv] += Σ_jj weights[r·ldw + jj] · v_jj`` (value row jj at flat
    element ``rows[jj]`` of ``values``), one micro-kernel call per block of rows and
    columns and per run of keys stored at stride Dv (a page's keys).  The products walk a
    run column block by column block, not in address order: the caller prefetches the
    chunk's value rows first (:func:`kernels._jit.prefetch.prefetch_rows`)."""
    full = R - R % MR
    jj = 0
    while jj < nk:
        run = 1
        while jj + run < nk and rows[jj + run] == rows[jj] + run * Dv:
            run += 1
        for c0 in range(0, Dv, NR):
            for r in range(0, full, MR):
                tile_product(weights, r * ldw + jj, ldw, values, rows[jj] + c0, Dv,
                             acc, r * Dv + c0, Dv, run, MR, NR, True)
            for r in range(full, R):
                tile_product(weights, r * ldw + jj, ldw, values, rows[jj] + c0, Dv,
                             acc, r * Dv + c0, Dv, run, 1, NR, True)
        jj += run
