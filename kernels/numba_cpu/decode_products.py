"""The decode kernel's fully visible chunks as register-blocked products.

A decode task holds ``R = G·Lq`` query rows (the query heads of one key/value head, times
the new queries) against one chunk of keys.  As plain Numba loops, a score is a vectorised
reduction over D ending in a horizontal sum per (row, key), and the value update
``acc[r] += p · v`` loads and stores the whole accumulator row for every key: with four
rows or more (GQA) the step was bound by that arithmetic, not by the cache's bytes.  Here
(:mod:`kernels.numba_cpu.products`, :mod:`kernels.numba_cpu.block_products`):

- scores: :func:`~kernels.numba_cpu.block_products.block_dots`, ``KB`` key rows at a time
  (address order) for ``MR`` rows, each vector of a query row or key row loaded once per
  block and the block's 16 sums folded together (a chunk's last ``nk % KB`` keys one key
  row at a time; the same sums bit for bit either way);
- values: :func:`~kernels.numba_cpu.products.tile_product` adds ``P[rows, keys] ·
  V[keys, cols]`` to ``MR`` x ``NV`` accumulators (16 vector registers of float32) held
  across a run of keys (the chunk's keys on one page), then the remaining columns in
  blocks of ``NR``;
- the rows taken next (the next chunk's, or the next head's when the decode task reads
  several heads) start loading ahead of use (:func:`kernels._jit.prefetch.prefetch_rows`):
  their key rows while the scores are taken, four keys at a time, and their value rows
  while the values' product runs, 2 KiB of them at a time, so that the requests go
  out through the whole chunk's arithmetic.  The hardware prefetchers start again at every
  page of a paged cache and at every change of stream, and fall behind where the
  arithmetic per byte is high (GQA).  All of a chunk's requests issued during the scores
  (as before 2026-12-06 night) kept the memory busy there and idle during the values'
  product: on the 2-core Zen 4 VM a step took about the sum of its reads and its
  arithmetic (docs/guide/decode.md).

Rows are given as row indices into the flat cache (``(page · Hkv + hk) · page_size +
slot``): key row i starts at element ``i · D``, value row i at ``i · Dv``.  Half caches
(their bits) are widened in registers as each vector is loaded: never copied.  A bfloat16
cache (with D a multiple of 32) takes both products as bfloat16 pairs instead
(:mod:`kernels.numba_cpu.pair_products`: two products per lane and step, half the
arithmetic): the queries as their bfloat16 bits, the softmax weights rounded to bfloat16
for the values' product (as FlashAttention does; the row sums keep the float32 weights).
The operands' dtype chooses the product (:func:`pair_operands`).  Used for
float32 and half caches where D and Dv are multiples of ``NR`` (64, 128, 256: every
model's head size); other sizes and float64 caches keep the plain loops of
:mod:`kernels.numba_cpu.decode`.  Measured against those loops: docs/guide/decode.md.
"""

from __future__ import annotations

import numpy as np
from numba import njit
from numba.extending import overload

from .._jit.half import compute_dtype_of, is_bfloat16_bits
from .._jit.math import FASTMATH
from .._jit.prefetch import prefetch_rows
from .block_products import block_dots
from .pair_products import NATIVE, pair_block_dots, pair_tile_product
from .products import tile_product

#: Vector lanes of both products (16 float32: one zmm or two ymm).
NR = 16
#: Query rows per register block.
MR = 4
#: Key rows per block of the scores (MR x KB: 16 sums, folded into one vector).
KB = NR // MR
#: Value columns per register block of the values' product (MR x NV: 16 zmm of float32).
NV = 64
#: Bytes of value rows per run of the values' product at most (4 keys of float32 at
#: Dv = 128, 8 of bfloat16): before each run, the value rows of as many keys taken next
#: are prefetched (a run of a page's consecutive keys is cut there).  Against 4096:
#: float32 steps 0.92-0.96 of the time, bfloat16 1.04 [0.97, 1.11] (decode_ab.py, Zen 4 VM).
VALUE_RUN_BYTES = 2048


def pair_operands(cache):
    """Whether the products take ``cache``'s rows as bfloat16 pairs (a bfloat16 cache): a
    constant of the cache's type, so the pair branch compiles only where it runs."""
    raise NotImplementedError


@overload(pair_operands, inline="always")
def _pair_operands_overload(cache):
    return (lambda cache: True) if is_bfloat16_bits(cache.dtype) else (lambda cache: False)


def operand_scratch(cache, size):
    """A scratch of ``size`` product operands for ``cache``: bfloat16 bits for a bfloat16
    cache (the queries and the rounded weights of the pair products), else the compute
    dtype (the pair branch that would read it never runs)."""
    raise NotImplementedError


@overload(operand_scratch, inline="always")
def _operand_scratch_overload(cache, size):
    if is_bfloat16_bits(cache.dtype):
        return lambda cache, size: np.empty(size, dtype=np.uint16)
    return lambda cache, size: np.empty(size, dtype=compute_dtype_of(cache))


def _block(a, a0, lda, b, rows, j0, ldb, c, c0, ldc, depth, mr, nk):
    """:func:`block_dots` (``nr = NR``), or :func:`pair_block_dots` for bfloat16 ``a``."""
    raise NotImplementedError


@overload(_block, inline="always", prefer_literal=True)
def _block_overload(a, a0, lda, b, rows, j0, ldb, c, c0, ldc, depth, mr, nk):
    if is_bfloat16_bits(a.dtype):
        native = NATIVE
        return lambda a, a0, lda, b, rows, j0, ldb, c, c0, ldc, depth, mr, nk: pair_block_dots(
            a, a0, lda, b, rows, j0, ldb, c, c0, ldc, depth, mr, nk, native)
    return lambda a, a0, lda, b, rows, j0, ldb, c, c0, ldc, depth, mr, nk: block_dots(
        a, a0, lda, b, rows, j0, ldb, c, c0, ldc, depth, mr, nk, NR)


def _weighted(w, w0, ldw, b, b0, ldb, c, c0, ldc, run, mr, ncols):
    """:func:`tile_product` (accumulating), or :func:`pair_tile_product` for bfloat16
    weights ``w``."""
    raise NotImplementedError


@overload(_weighted, inline="always", prefer_literal=True)
def _weighted_overload(w, w0, ldw, b, b0, ldb, c, c0, ldc, run, mr, ncols):
    if is_bfloat16_bits(w.dtype):
        native = NATIVE
        return lambda w, w0, ldw, b, b0, ldb, c, c0, ldc, run, mr, ncols: pair_tile_product(
            w, w0, ldw, b, b0, ldb, c, c0, ldc, run, mr, ncols, native)
    return lambda w, w0, ldw, b, b0, ldb, c, c0, ldc, run, mr, ncols: tile_product(
        w, w0, ldw, b, b0, ldb, c, c0, ldc, run, mr, ncols, True)


@njit(fastmath=FASTMATH, error_model="numpy", cache=True, inline="always")
def chunk_scores(qf, keys, rows, nk, R, D, scale, scores, ldc, ahead, n_ahead):
    """``scores[r·ldc + jj] = scale · q_r · k_jj`` for every row and key of a chunk: ``qf``
    the R x D queries (compute dtype, or bfloat16 bits: pairs), key jj is row ``rows[jj]``
    of ``keys``.  With key jj it prefetches key row ``ahead[jj]`` (``jj < n_ahead``: the
    rows taken next; :func:`chunk_values` prefetches their value rows)."""
    full = R - R % MR
    for j0 in range(0, max(nk, n_ahead), KB):
        for jj in range(j0, min(j0 + KB, n_ahead)):
            prefetch_rows(keys, ahead[jj] * D, 1, D)
        if j0 + KB <= nk:  # KB keys for every row: blocks of MR rows, then 2, then 1
            for r in range(0, full, MR):
                _block(qf, r * D, D, keys, rows, j0, D, scores, r * ldc + j0, ldc, D, MR, KB)
            r = full
            if R - r >= 2:
                _block(qf, r * D, D, keys, rows, j0, D, scores, r * ldc + j0, ldc, D, 2, KB)
                r += 2
            if r < R:
                _block(qf, r * D, D, keys, rows, j0, D, scores, r * ldc + j0, ldc, D, 1, KB)
            continue
        for jj in range(j0, nk):  # the chunk's last keys, one at a time
            for r in range(0, full, MR):
                _block(qf, r * D, D, keys, rows, jj, D, scores, r * ldc + jj, ldc, D, MR, 1)
            for r in range(full, R):
                _block(qf, r * D, D, keys, rows, jj, D, scores, r * ldc + jj, ldc, D, 1, 1)
    for r in range(R):
        for jj in range(nk):
            scores[r * ldc + jj] *= scale


@njit(fastmath=FASTMATH, error_model="numpy", cache=True, inline="always")
def _run_product(weights, w0, ldw, values, v0, Dv, acc, c0, run, R, nv):
    """``acc[r·Dv + c0 : +nv] += Σ_t weights[w0 + r·ldw + t] · values[v0 + t·Dv : +nv]``
    for every row r < R and t < run: blocks of MR rows, then one row at a time."""
    full = R - R % MR
    for r in range(0, full, MR):
        _weighted(weights, w0 + r * ldw, ldw, values, v0, Dv, acc, r * Dv + c0, Dv, run, MR,
                  nv)
    for r in range(full, R):
        _weighted(weights, w0 + r * ldw, ldw, values, v0, Dv, acc, r * Dv + c0, Dv, run, 1,
                  nv)


@njit(fastmath=FASTMATH, error_model="numpy", cache=True, inline="always")
def chunk_values(weights, ldw, values, rows, nk, R, Dv, acc, ahead, n_ahead):
    """``acc[r·Dv:(r+1)·Dv] += Σ_jj weights[r·ldw + jj] · v_jj`` (value jj is row
    ``rows[jj]`` of ``values``; weights in the compute dtype, or bfloat16 bits: pairs), one
    product per block of rows and columns and per run of keys in consecutive rows (of a
    page), ``VALUE_RUN_BYTES`` of value rows at most.  Before the run of keys ``jj ..``, it
    prefetches value rows ``ahead[jj ..]`` (those ``< n_ahead``: the rows taken next) for
    as many keys; the ones past ``nk`` at the end."""
    wide = Dv - Dv % NV  # columns in blocks of NV, the rest in blocks of NR
    # an even number of keys: the bfloat16 pair products take a run's keys two by two
    # from its start, so cuts at even offsets keep the pairs (and the bits) of the uncut run
    longest = max(2, VALUE_RUN_BYTES // (Dv * values.itemsize) // 2 * 2)
    jj = 0
    while jj < nk:
        run = 1
        while run < longest and jj + run < nk and rows[jj + run] == rows[jj] + run:
            run += 1
        for ja in range(jj, min(jj + run, n_ahead)):
            prefetch_rows(values, ahead[ja] * Dv, 1, Dv)
        v0 = rows[jj] * Dv
        for c0 in range(0, wide, NV):
            _run_product(weights, jj, ldw, values, v0 + c0, Dv, acc, c0, run, R, NV)
        for c0 in range(wide, Dv, NR):
            _run_product(weights, jj, ldw, values, v0 + c0, Dv, acc, c0, run, R, NR)
        jj += run
    for ja in range(nk, n_ahead):  # more keys taken next than this chunk has
        prefetch_rows(values, ahead[ja] * Dv, 1, Dv)


@njit(fastmath=FASTMATH, error_model="numpy", cache=True, inline="always")
def round_weights(scores, ldc, R, nk, weights):
    """``weights[r·ldc + jj]``: ``scores[r·ldc + jj]`` (float32, ≥ 0 or NaN) rounded to the
    nearest bfloat16, ties to even, for the pair products (a NaN stays a NaN); a vectorised
    loop on the bits."""
    bits = scores.view(np.uint32)
    one, half, sixteen = np.uint32(1), np.uint32(0x7FFF), np.uint32(16)
    for r in range(R):
        for jj in range(nk):  # from 0: a loop from r·ldc did not vectorise (5 vs 0.8 ns/key)
            u = bits[r * ldc + jj]
            rounded = (u + half + ((u >> sixteen) & one)) >> sixteen
            quiet = (u >> sixteen) | np.uint32(0x40)
            nan = (u & np.uint32(0x7FFFFFFF)) > np.uint32(0x7F800000)
            weights[r * ldc + jj] = np.uint16(quiet) if nan else np.uint16(rounded)
