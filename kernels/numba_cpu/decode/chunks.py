"""The decode kernel's fully visible chunks as register-blocked products.

A decode task holds ``R = G·Lq`` query rows (the query heads of one key/value head, times
the new queries) against one chunk of keys.  As plain Numba loops, a score is a vectorised
reduction over D ending in a horizontal sum per (row, key), and the value update
``acc[r] += p · v`` loads and stores the whole accumulator row for every key: with four
rows or more (GQA) the step was bound by that arithmetic, not by the cache's bytes.  Here
(:mod:`kernels.numba_cpu.products.intrinsics`, :mod:`kernels.numba_cpu.products.blocks`):

- scores: :func:`~kernels.numba_cpu.products.blocks.block_dots`, ``KB`` key rows at a time
  (address order) for ``MR`` rows, each vector of a query row or key row loaded once per
  block and the block's 16 sums folded together (a chunk's last ``nk % KB`` keys one key
  row at a time; the same sums bit for bit either way);
- values (weights in the compute dtype): :func:`~kernels.numba_cpu.products.intrinsics.tile_product`
  adds ``P[rows, keys] ·
  V[keys, cols]`` to ``MR`` x ``NV`` accumulators (16 vector registers of float32) held
  across a run of keys (the chunk's keys on one page), then the remaining columns in
  blocks of ``NR``;
- the rows taken next (the next chunk's, or the next head's when the decode task reads
  several heads) start loading ahead of use (:func:`kernels._jit.prefetch.prefetch_rows`):
  their key rows while the scores are taken, four keys at a time, and their value rows
  while the values' product runs, 2 KiB of them at a time (the bfloat16 pairs: a pair of
  keys at a time), so that the requests go out through the whole chunk's arithmetic.
  The hardware prefetchers start again at every page of a paged cache and at every
  change of stream, and fall behind where the arithmetic per byte is high (GQA).  All of
  a chunk's requests issued during the scores keep the memory busy there and idle during
  the values' product: a step then takes about the sum of its reads and its arithmetic
  (docs/guide/decode.md).

Rows are given as row indices into the flat cache (``(page · Hkv + hk) · page_size +
slot``): key row i starts at element ``i · D``, value row i at ``i · Dv``.  Half caches
(their bits) are widened in registers as each vector is loaded: never copied.  A bfloat16
cache (with D a multiple of 32) takes both products as bfloat16 pairs instead
(:mod:`kernels.numba_cpu.products.pairs`: two products per lane and step, half the
arithmetic): the queries as their bfloat16 bits, the softmax weights rounded to bfloat16
for the values' product (as FlashAttention does; the row sums keep the float32 weights).
Its values' product is one call per block of rows and columns for the whole chunk
(:func:`~kernels.numba_cpu.products.pairs.pair_rows_product`), its value rows given by
index whatever the pages, its prefetches of the next value rows sent a pair of keys at a
time inside it: faster than runs cut every 2 KiB (docs/guide/decode.md).  The same for
float32 (an intrinsic taking value rows by index, the prefetch inside it) is no faster
from memory, and slower for one query row per key/value head: float32 keeps its runs.
The operands' dtype chooses the product (:func:`pair_operands`).  Used for
float32 and half caches where D and Dv are multiples of ``NR`` (64, 128, 256: every
model's head size); other sizes and float64 caches keep the plain loops of
:mod:`kernels.numba_cpu.decode.attend`.  Measured against those loops: docs/guide/decode.md.
"""

from __future__ import annotations

import numpy as np
from numba import njit, types
from numba.extending import overload

from ..._jit.half import compute_dtype_of, is_bfloat16_bits
from ..._jit.math import FASTMATH
from ..._jit.prefetch import prefetch_rows
from ..products.blocks import block_dots
from ..products.intrinsics import tile_product
from ..products.pairs import NATIVE, pair_block_dots, pair_rows_product

#: Vector lanes of both products (16 float32: one zmm or two ymm).
NR = 16
#: Query rows per register block.
MR = 4
#: Key rows per block of the scores (MR x KB: 16 sums, folded into one vector).
KB = NR // MR
#: Value columns per register block of the values' product (MR x NV: 16 zmm of float32).
NV = 64
#: Bytes of value rows per run of the values' product at most, for weights in the compute
#: dtype (4 keys of float32 at Dv = 128): before each run, the value rows of as many keys
#: taken next are prefetched (a run of a page's consecutive keys is cut there); float32
#: steps are a few percent faster than with runs of 4096.  Not the bfloat16 pairs'
#: (:func:`chunk_values`).
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
        tile_product(weights, w0 + r * ldw, ldw, values, v0, Dv, acc, r * Dv + c0, Dv, run,
                     MR, nv, True)
    for r in range(full, R):
        tile_product(weights, w0 + r * ldw, ldw, values, v0, Dv, acc, r * Dv + c0, Dv, run,
                     1, nv, True)


#: The widths a bfloat16 values' product can have left after its blocks of NV columns.
_NR1, _NR2, _NR3 = NR, 2 * NR, 3 * NR


def _pair_columns(weights, ldw, values, rows, nk, c0, Dv, acc, R, ahead, n_ahead, ncols):
    """:func:`pair_rows_product` of columns ``c0 .. c0 + ncols`` (a literal) for every
    row: blocks of MR rows, then one row at a time; the first block prefetches."""
    raise NotImplementedError


@overload(_pair_columns, inline="always", prefer_literal=True)
def _pair_columns_overload(weights, ldw, values, rows, nk, c0, Dv, acc, R, ahead, n_ahead,
                           ncols):
    if not isinstance(ncols, types.IntegerLiteral):
        return None
    width, native = ncols.literal_value, NATIVE

    def columns(weights, ldw, values, rows, nk, c0, Dv, acc, R, ahead, n_ahead, ncols):
        full = R - R % MR
        for r in range(0, full, MR):
            pair_rows_product(weights, r * ldw, ldw, values, rows, nk, c0, Dv, acc,
                              r * Dv + c0, Dv, ahead, n_ahead if r == 0 else 0, MR, width,
                              native)
        for r in range(full, R):
            pair_rows_product(weights, r * ldw, ldw, values, rows, nk, c0, Dv, acc,
                              r * Dv + c0, Dv, ahead, n_ahead if r == 0 else 0, 1, width,
                              native)
    return columns


@njit(fastmath=FASTMATH, error_model="numpy", cache=True, inline="always")
def _run_values(weights, ldw, values, rows, nk, R, Dv, acc, ahead, n_ahead):
    """:func:`chunk_values` for weights in the compute dtype: a product per run of keys in
    consecutive rows, ``VALUE_RUN_BYTES`` at most, each run's next value rows prefetched
    before it."""
    wide = Dv - Dv % NV  # columns in blocks of NV, the rest in blocks of NR
    longest = max(1, VALUE_RUN_BYTES // (Dv * values.itemsize))
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


@njit(fastmath=FASTMATH, error_model="numpy", cache=True, inline="always")
def _pair_values(weights, ldw, values, rows, nk, R, Dv, acc, ahead, n_ahead):
    """:func:`chunk_values` for bfloat16 weights: one :func:`pair_rows_product` per block
    of rows and columns over the whole chunk, whatever its pages (the accumulators loaded
    and stored once), the next value rows prefetched inside it, a pair of keys at a time."""
    wide = Dv - Dv % NV
    for c0 in range(0, wide, NV):
        _pair_columns(weights, ldw, values, rows, nk, c0, Dv, acc, R, ahead, n_ahead, NV)
    rest = Dv - wide  # a multiple of NR (literals: the product's width is compiled in)
    if rest == _NR1:
        _pair_columns(weights, ldw, values, rows, nk, wide, Dv, acc, R, ahead, n_ahead, _NR1)
    elif rest == _NR2:
        _pair_columns(weights, ldw, values, rows, nk, wide, Dv, acc, R, ahead, n_ahead, _NR2)
    elif rest == _NR3:
        _pair_columns(weights, ldw, values, rows, nk, wide, Dv, acc, R, ahead, n_ahead, _NR3)


def chunk_values(weights, ldw, values, rows, nk, R, Dv, acc, ahead, n_ahead):
    """``acc[r·Dv:(r+1)·Dv] += Σ_jj weights[r·ldw + jj] · v_jj`` (value jj is row
    ``rows[jj]`` of ``values``), prefetching value rows ``ahead[:n_ahead]`` (the rows
    taken next) on the way; the ones past ``nk`` at the end.  Weights in the compute
    dtype: a product per block of rows and columns and per run of keys in consecutive
    rows (of a page), ``VALUE_RUN_BYTES`` of value rows at most, each run's prefetches
    sent before it.  bfloat16 weights (pairs): one product per block of rows and columns
    for the whole chunk, its prefetches sent inside it, a pair of keys at a time."""
    raise NotImplementedError


# Not inline="always": inlined, its two products' loops tripped Numba's SSA check (a
# NumbaIRAssumptionWarning asking to report a bug, tests/test_decode.py's window cases);
# a call per chunk and head costs nothing beside the chunk's 64 keys.
@overload(chunk_values)
def _chunk_values_overload(weights, ldw, values, rows, nk, R, Dv, acc, ahead, n_ahead):
    product = _pair_values if is_bfloat16_bits(weights.dtype) else _run_values

    def values_of_chunk(weights, ldw, values, rows, nk, R, Dv, acc, ahead, n_ahead):
        product(weights, ldw, values, rows, nk, R, Dv, acc, ahead, n_ahead)
        for ja in range(nk, n_ahead):  # more keys taken next than this chunk has
            prefetch_rows(values, ahead[ja] * Dv, 1, Dv)
    return values_of_chunk


@njit(fastmath=FASTMATH, error_model="numpy", cache=True, inline="always")
def round_weights(scores, ldc, R, nk, weights):
    """``weights[r·ldc + jj]``: ``scores[r·ldc + jj]`` (float32, ≥ 0 or NaN) rounded to the
    nearest bfloat16, ties to even, for the pair products (a NaN stays a NaN); a vectorised
    loop on the bits."""
    bits = scores.view(np.uint32)
    one, half, sixteen = np.uint32(1), np.uint32(0x7FFF), np.uint32(16)
    for r in range(R):
        for jj in range(nk):  # from 0: a loop from r·ldc does not vectorise
            u = bits[r * ldc + jj]
            rounded = (u + half + ((u >> sixteen) & one)) >> sixteen
            quiet = (u >> sixteen) | np.uint32(0x40)
            nan = (u & np.uint32(0x7FFFFFFF)) > np.uint32(0x7F800000)
            weights[r * ldc + jj] = np.uint16(quiet) if nan else np.uint16(rounded)
