"""The decode kernel's fully visible chunks as register-blocked products.

A decode task holds ``R = G·Lq`` query rows (the query heads of one key/value head, times
the new queries) against one chunk of keys.  As plain Numba loops, a score is a vectorised
reduction over D ending in a horizontal sum per (row, key), and the value update
``acc[r] += p · v`` loads and stores the whole accumulator row for every key: with four
rows or more (GQA) the step was bound by that arithmetic, not by the cache's bytes.  Here
(:mod:`kernels.numba_cpu.products`):

- scores: :func:`~kernels.numba_cpu.products.row_dots`, one key row at a time (address
  order), each of its vectors loaded once for ``MR`` rows;
- values: :func:`~kernels.numba_cpu.products.tile_product` adds ``P[rows, keys] ·
  V[keys, cols]`` to ``MR`` x ``NV`` accumulators (16 vector registers of float32) held
  across a run of keys (the chunk's keys on one page), then the remaining columns in
  blocks of ``NR``;
- while it takes the scores of one chunk, the key and value rows taken next (the next
  chunk's, or the next head's when the decode task reads several heads) start
  loading (:func:`kernels._jit.prefetch.prefetch_rows`, one key at a time): the hardware
  prefetchers start again at every page of a paged cache, and at every change of stream.

Rows are given as row indices into the flat cache (``(page · Hkv + hk) · page_size +
slot``): key row i starts at element ``i · D``, value row i at ``i · Dv``.  Half caches
(their bits) are widened in registers as each vector is loaded: never copied.  Used for
float32 and half caches where D and Dv are multiples of ``NR`` (64, 128, 256: every
model's head size); other sizes and float64 caches keep the plain loops of
:mod:`kernels.numba_cpu.decode`.  Measured against those loops: docs/guide/decode.md.
"""

from __future__ import annotations

from numba import njit

from .._jit.math import FASTMATH
from .._jit.prefetch import prefetch_rows
from .products import row_dots, tile_product

#: Vector lanes of both products (16 float32: one zmm or two ymm).
NR = 16
#: Query rows per register block.
MR = 4
#: Value columns per register block of the values' product (MR x NV: 16 zmm of float32).
NV = 64


@njit(fastmath=FASTMATH, error_model="numpy", cache=True, inline="always")
def chunk_scores(qf, keys, rows, nk, R, D, scale, scores, ldc, values, Dv, ahead, n_ahead):
    """``scores[r·ldc + jj] = scale · q_r · k_jj`` for every row and key of a chunk: ``qf``
    the R x D queries (compute dtype), key jj is row ``rows[jj]`` of ``keys``.  With key
    jj it prefetches key and value row ``ahead[jj]`` (``jj < n_ahead``: the rows taken next)."""
    full = R - R % MR
    for jj in range(nk):
        if jj < n_ahead:
            prefetch_rows(keys, ahead[jj] * D, 1, D)
            prefetch_rows(values, ahead[jj] * Dv, 1, Dv)
        k0 = rows[jj] * D
        for r in range(0, full, MR):
            row_dots(qf, r * D, D, keys, k0, scores, r * ldc + jj, ldc, D, MR, NR)
        for r in range(full, R):
            row_dots(qf, r * D, D, keys, k0, scores, r * ldc + jj, ldc, D, 1, NR)
    for jj in range(nk, n_ahead):  # a short chunk before a full one
        prefetch_rows(keys, ahead[jj] * D, 1, D)
        prefetch_rows(values, ahead[jj] * Dv, 1, Dv)
    for r in range(R):
        for jj in range(nk):
            scores[r * ldc + jj] *= scale


@njit(fastmath=FASTMATH, error_model="numpy", cache=True, inline="always")
def _run_product(weights, w0, ldw, values, v0, Dv, acc, c0, run, R, nv):
    """``acc[r·Dv + c0 : +nv] += Σ_t weights[w0 + r·ldw + t] · values[v0 + t·Dv : +nv]``
    for every row r < R and t < run: blocks of MR rows, then one row at a time."""
    full = R - R % MR
    for r in range(0, full, MR):
        tile_product(weights, w0 + r * ldw, ldw, values, v0, Dv, acc, r * Dv + c0, Dv, run,
                     MR, nv, True)
    for r in range(full, R):
        tile_product(weights, w0 + r * ldw, ldw, values, v0, Dv, acc, r * Dv + c0, Dv, run,
                     1, nv, True)


@njit(fastmath=FASTMATH, error_model="numpy", cache=True, inline="always")
def chunk_values(weights, ldw, values, rows, nk, R, Dv, acc):
    """``acc[r·Dv:(r+1)·Dv] += Σ_jj weights[r·ldw + jj] · v_jj`` (value jj is row
    ``rows[jj]`` of ``values``), one product per block of rows and columns and per run of
    keys in consecutive rows (a page's keys)."""
    wide = Dv - Dv % NV  # columns in blocks of NV, the rest in blocks of NR
    jj = 0
    while jj < nk:
        run = 1
        while jj + run < nk and rows[jj + run] == rows[jj] + run:
            run += 1
        v0 = rows[jj] * Dv
        for c0 in range(0, wide, NV):
            _run_product(weights, jj, ldw, values, v0 + c0, Dv, acc, c0, run, R, NV)
        for c0 in range(wide, Dv, NR):
            _run_product(weights, jj, ldw, values, v0 + c0, Dv, acc, c0, run, R, NR)
        jj += run
