"""The ``numba`` backend: fused masked attention on the CPU, parallel over Numba's threads.

One task is a block of ``BLOCK_Q`` query rows of one (batch, head).  A task walks the
keys in tiles of ``BLOCK_K`` and keeps, per row, the running maximum ``m``, the running
sum ``ℓ`` of ``exp(s - m)`` and the unnormalised output ``acc`` (the online softmax).
Per tile it computes

    S = Q_blk · K_tileᵀ              (BLOCK_Q x BLOCK_K, one GEMM)
    S = S · scale + mask              (-inf where hidden), row max m_new
    P = exp(S - m_new)                (a vectorised polynomial exp, see ``_exp32``)
    acc = acc · exp(m_old - m_new) + P · V_tile     (a second GEMM)

and divides by ``ℓ`` at the end.  Working memory is O(BLOCK_Q · (BLOCK_K + Dv)) per
task: no L x L array exists unless ``return_weights`` asks for one.

The two GEMMs go to the BLAS through ``np.dot`` (SciPy's BLAS, as Numba calls it) when
SciPy is installed, single-threaded inside Numba's threads (see ``single_threaded_blas``);
without SciPy, to plain Numba loops (correct, about half as fast).

Masking, and what is never read:

- tiles past ``key_lengths[b]`` and tiles above the causal diagonal are skipped whole, and
  the last tile is cut at the last key any row of the block can see, so those keys and
  values are never read;
- inside a tile, a score hidden by ``causal`` or ``mask`` is replaced by ``-inf`` after
  the GEMM: a NaN or inf stored in a hidden key only ever reaches its own (hidden) score;
- a tile with some hidden (row, key) pair goes through ``P · V`` by BLAS only if its
  values are all finite; otherwise row by row over the visible keys only, so that
  ``0 · inf`` never turns a hidden value into a NaN output (as the reference does);
- a NaN score at a visible position makes the row NaN; a row that sees no key gets 0.

Bool masks are read as they are (one byte per entry, no additive copy): see
``AttentionProblem.mask_is_bool``.
"""

from __future__ import annotations

import importlib.util
import threading
from contextlib import contextmanager, nullcontext

import numba
import numpy as np
from llvmlite import ir
from numba import njit, prange, types
from numba.extending import intrinsic, overload

from ._dropout import build_dropout_bits, dropout_threshold
from ._validate import AttentionProblem

#: Query rows per parallel task: K and V tiles are reused across these rows.
BLOCK_Q = 512
#: Smallest query block: smaller problems get smaller blocks, down to this, until each
#: thread has two tasks (see ``block_rows``).
MIN_BLOCK_Q = 32
#: Keys per tile of the online softmax.
BLOCK_K = 256
#: Keys per tile where a tile crosses the causal diagonal (less of the triangle wasted).
BLOCK_K_DIAGONAL = 64
#: Problems with fewer multiply-adds than this (B·H·Lq·Lk·(D+Dv)) run on the calling
#: thread: starting the thread pool costs more than it saves (measured: ~7 us per launch;
#: 2 threads win from ~2**20 on when there are tasks for both).
SERIAL_WORK_LIMIT = 1 << 20

#: True when Numba's ``np.dot`` can call a BLAS (it needs SciPy's ``cython_blas``) and
#: threadpoolctl can hold that BLAS to one thread inside Numba's threads.
HAVE_BLAS = all(importlib.util.find_spec(name) is not None for name in ("scipy", "threadpoolctl"))

# fastmath without 'nnan'/'ninf': those flags let LLVM delete the -inf comparisons the
# masking relies on.  'reassoc' lets the row reductions vectorise.
_FASTMATH = {"nsz", "arcp", "contract", "afn", "reassoc"}
# The exp functions must not be reassociated: that would merge the two-part (Cody-Waite)
# range reduction back into one product and lose its precision.  LLVM keeps each
# instruction's own flags when it inlines them into the vectorised loops.
_EXACT_MATH = {"nsz", "arcp", "contract"}

_dropout_bits = build_dropout_bits(njit(cache=True))


# --- a vectorisable exp -------------------------------------------------------------------
# Numba has no SVML: math.exp in a loop is a scalar libm call (~2.4 ns per float32 here).
# _exp32 is Cephes' expf (range reduction by a two-part ln 2, degree-6 polynomial) and
# _exp64 the same reduction with a degree-13 Taylor polynomial, written so that LLVM
# vectorises the loops that call them (~0.25 ns per float32).  n = round(x / ln 2) comes
# from the "magic number" 1.5 * 2**23 (2**52): adding it rounds to an integer, whose bits
# are then the low bits of the sum, so no float -> int conversion is needed.  Max error on
# [-30, 0]: 1.0 ulp in float32 and in float64 (numpy's own float32 exp: 2.4 ulp).
#
# Only for x <= 0 (or NaN), the softmax's arguments: large positive x is not handled.
# Results below the smallest normal number are flushed to 0: they are probabilities
# < 1e-38 (1e-308) next to the row maximum's 1, far below one ulp of the row sum.


@intrinsic
def _bits_as_float(typingctx, bits):
    """Reinterpret an int32 (int64) as the float32 (float64) with the same bits."""
    if bits == types.int32:
        sig, llvm_type = types.float32(bits), ir.FloatType()
    elif bits == types.int64:
        sig, llvm_type = types.float64(bits), ir.DoubleType()
    else:
        return None

    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], llvm_type)

    return sig, codegen


@intrinsic
def _float_bits(typingctx, x):
    """Reinterpret a float32 (float64) as the int32 (int64) with the same bits."""
    if x == types.float32:
        sig, llvm_type = types.int32(x), ir.IntType(32)
    elif x == types.float64:
        sig, llvm_type = types.int64(x), ir.IntType(64)
    else:
        return None

    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], llvm_type)

    return sig, codegen


_f32 = np.float32
_ROUND_32 = _f32(1.5 * 2**23)
_LOG2E_32 = _f32(1.44269504088896341)
_LN2_HI_32, _LN2_LO_32 = _f32(0.693359375), _f32(-2.12194440e-4)  # ln 2 in two parts
_P0, _P1, _P2, _P3, _P4, _P5 = (
    _f32(c) for c in (1.9875691500e-4, 1.3981999507e-3, 8.3334519073e-3, 4.1665795894e-2,
                      1.6666665459e-1, 5.0000001201e-1))
_LO_32 = _f32(-87.33654)  # exp(_LO_32) is the smallest normal float32


@njit(cache=True, fastmath=_EXACT_MATH)
def _exp32(x):
    """exp(x) for float32 x <= 0: 1 ulp, 0 below -87.34, NaN for NaN."""
    xc = _LO_32 if x < _LO_32 else x
    t = xc * _LOG2E_32 + _ROUND_32  # round(x / ln 2) + 1.5 * 2**23
    n = t - _ROUND_32
    r = xc - n * _LN2_HI_32
    r = r - n * _LN2_LO_32
    p = (((((_P0 * r + _P1) * r + _P2) * r + _P3) * r + _P4) * r + _P5) * r * r + r + _f32(1)
    two_to_n = _bits_as_float(np.int32((np.int64(_float_bits(t)) + 127) << 23))
    return _f32(0) if x < _LO_32 else p * two_to_n


_ROUND_64 = 1.5 * 2.0**52
_LOG2E_64 = 1.4426950408889634
_LN2_HI_64, _LN2_LO_64 = 6.93145751953125e-1, 1.42860682030941723212e-6
_LO_64 = -708.3964185322641
_T13, _T12, _T11, _T10, _T9, _T8, _T7, _T6, _T5, _T4, _T3, _T2 = (
    1.0 / float(np.prod(np.arange(1, n + 1, dtype=np.float64))) for n in range(13, 1, -1))


@njit(cache=True, fastmath=_EXACT_MATH)
def _exp64(x):
    """exp(x) for float64 x <= 0: 1 ulp, 0 below -708.4, NaN for NaN."""
    xc = _LO_64 if x < _LO_64 else x
    t = xc * _LOG2E_64 + _ROUND_64
    n = t - _ROUND_64
    r = xc - n * _LN2_HI_64
    r = r - n * _LN2_LO_64
    p = ((((((((((_T13 * r + _T12) * r + _T11) * r + _T10) * r + _T9) * r + _T8) * r + _T7) * r
               + _T6) * r + _T5) * r + _T4) * r + _T3) * r + _T2
    p = p * r * r + r + 1.0
    two_to_n = _bits_as_float((_float_bits(t) + 1023) << 52)
    return 0.0 if x < _LO_64 else p * two_to_n


def fast_exp(x):
    """exp of a float32 or float64 scalar inside Numba code (``_exp32`` / ``_exp64``)."""
    raise NotImplementedError("fast_exp is only callable from Numba-compiled code")


@overload(fast_exp)
def _fast_exp_overload(x):
    if x == types.float32:
        return lambda x: _exp32(x)
    if x == types.float64:
        return lambda x: _exp64(x)
    return None


# --- the row maximum -----------------------------------------------------------------------
# Taken in integers: LLVM vectorises a float max reduction only under 'nnan', which the
# -inf masking cannot have, but it vectorises an integer one (~5x faster here).
# key(x) = bits(x) ^ ((bits(x) >> 31) >>> 1) (arithmetic, then logical shift) orders the
# floats as their values (-0 < +0 aside); a NaN's key lies above +inf or below -inf by its
# sign bit, and NaNs are caught by the row sum anyway.  The map is its own inverse.


def _flip_negatives(builder, bits):
    sign = builder.ashr(bits, ir.Constant(bits.type, bits.type.width - 1))
    return builder.xor(bits, builder.lshr(sign, ir.Constant(bits.type, 1)))


@intrinsic
def _max_key(typingctx, x):
    """An int32 (int64) that orders as the float32 (float64) ``x`` does (see above)."""
    if x == types.float32:
        sig, int_type = types.int32(x), ir.IntType(32)
    elif x == types.float64:
        sig, int_type = types.int64(x), ir.IntType(64)
    else:
        return None

    def codegen(context, builder, signature, args):
        return _flip_negatives(builder, builder.bitcast(args[0], int_type))

    return sig, codegen


@intrinsic
def _from_max_key(typingctx, key):
    """The float32 (float64) whose :func:`_max_key` is the int32 (int64) ``key``."""
    if key == types.int32:
        sig, float_type = types.float32(key), ir.FloatType()
    elif key == types.int64:
        sig, float_type = types.float64(key), ir.DoubleType()
    else:
        return None

    def codegen(context, builder, signature, args):
        return builder.bitcast(_flip_negatives(builder, args[0]), float_type)

    return sig, codegen


# --- masks ----------------------------------------------------------------------------------


def float_constants(x):
    """``(0, 1, -inf)`` in the float type of ``x`` inside Numba code (compile-time constants).

    A literal (0.0, 1, np.inf) is typed float64 or int64, which promotes float32 to float64;
    and ``-1 / 0`` computed at run time is not safe under the kernels' fastmath flags: with
    'nsz' the sign of a computed zero is unspecified, and LLVM may fold it to +inf.
    """
    raise NotImplementedError("float_constants is only callable from Numba-compiled code")


@overload(float_constants)
def _float_constants_overload(x):
    if x == types.float32:
        return lambda x: (np.float32(0), np.float32(1), np.float32(-np.inf))
    if x == types.float64:
        return lambda x: (0.0, 1.0, -np.inf)
    return None


def _mask_score(score, entry, neg_inf):
    """``(masked score, visible)`` for one mask entry: bool (True = attend) or additive."""
    raise NotImplementedError


@overload(_mask_score)
def _mask_score_overload(score, entry, neg_inf):
    if isinstance(entry, types.Boolean):
        return lambda score, entry, neg_inf: (score if entry else neg_inf, entry)
    return lambda score, entry, neg_inf: (
        (score + entry, True) if entry != neg_inf else (neg_inf, False))


def _adds_to_scores(mask):
    """True for an additive (float) mask, False for a bool one: a compile-time constant."""
    raise NotImplementedError


@overload(_adds_to_scores)
def _adds_to_scores_overload(mask):
    adds = not isinstance(mask.dtype, types.Boolean)
    return lambda mask: adds


@njit(cache=True)
def _mask_tile_count(mask, start, stride_i, stride_j, rows, cols, neg_inf):
    """How many of the ``rows`` x ``cols`` mask entries from ``start`` let a key be seen."""
    count = 0
    for r in range(rows):
        row = start + r * stride_i
        for c in range(cols):
            count += _mask_score(neg_inf, mask[row + c * stride_j], neg_inf)[1]
    return count


# --- the two tile products ------------------------------------------------------------------


#: Terms per partial sum of the dot products in the loops below: blocked summation keeps
#: their rounding error near the BLAS's (a plain running sum over D = 64 terms has twice it).
_SUM_BLOCK = 8


@njit(cache=True, fastmath=_FASTMATH)
def _scores_by_loops(q_blk, k_tile, s):
    """s = q_blk · k_tileᵀ without a BLAS: (n, D) x (m, D) -> (n, m)."""
    n, D = q_blk.shape
    m = k_tile.shape[0]
    kt = np.empty((D, m), dtype=k_tile.dtype)  # keys along the fast axis: vectorises over keys
    for j in range(m):
        for d in range(D):
            kt[d, j] = k_tile[j, d]
    part = np.empty(m, dtype=s.dtype)
    for r in range(n):
        s_row = s[r]
        s_row[:] = 0
        for d0 in range(0, D, _SUM_BLOCK):
            part[:] = 0
            for d in range(d0, min(d0 + _SUM_BLOCK, D)):
                a = q_blk[r, d]
                kt_row = kt[d]
                for j in range(m):
                    part[j] += a * kt_row[j]
            for j in range(m):
                s_row[j] += part[j]


@njit(cache=True, fastmath=_FASTMATH)
def _values_by_loops(p, v_tile, o):
    """o = p · v_tile without a BLAS: (n, m) x (m, Dv) -> (n, Dv).

    Keys with p = 0 (hidden, dropped or underflowed) are skipped, so a hidden value is
    never read and the sum over the others does not depend on what it holds: NaN stored
    there leaves the result bit-identical.
    """
    n, m = p.shape
    part = np.empty(o.shape[1], dtype=o.dtype)
    for r in range(n):
        o_row = o[r]
        o_row[:] = 0
        for j0 in range(0, m, _SUM_BLOCK):
            part[:] = 0
            for j in range(j0, min(j0 + _SUM_BLOCK, m)):
                a = p[r, j]
                if a == 0:
                    continue
                v_row = v_tile[j]
                for d in range(part.shape[0]):
                    part[d] += a * v_row[d]
            for d in range(part.shape[0]):
                o_row[d] += part[d]


@njit(cache=True)
def _scores_by_blas(q_blk, k_tile, s):
    """s = q_blk · k_tileᵀ by the BLAS (SciPy's, through Numba's np.dot)."""
    np.dot(q_blk, k_tile.T, s)


@njit(cache=True)
def _values_by_blas(p, v_tile, o):
    """o = p · v_tile by the BLAS."""
    np.dot(p, v_tile, o)


# The kernels take an argument ``blas``: True for the BLAS, None for the loops.  Numba
# prunes a branch on ``blas is None`` before typing when ``blas`` is None, so the
# loops-only kernel compiles (and runs) without SciPy; and the two are compiled and cached
# under different signatures, so a cache written with SciPy never serves a process
# without it.


@njit(cache=True, fastmath=_FASTMATH)
def _all_finite(x):
    """True if every entry of the 2-D array ``x`` is finite (x · 0 is NaN for inf and NaN)."""
    total = x[0, 0] * 0
    for r in range(x.shape[0]):
        for c in range(x.shape[1]):
            total += x[r, c] * 0
    return total == 0


# --- the online softmax of one row, shared with the kernel with mods (_numba_mods) ----------


# The two per-tile helpers are inlined into the kernels' Numba IR: as separate functions
# (17 arguments, arrays passed field by field) the plain forward was ~5% slower at L=4096,
# inlined ~2% (quiet machine, side by side with the previous kernel).
@njit(cache=True, fastmath=_FASTMATH, error_model="numpy", inline="always")
def _softmax_row(s_row, hi, n_visible, key_max, r, rr, row_max, row_sum, row_nan, correction,
                 threshold, keep_scale, seed, b, h, i, j0):
    """The online-softmax update of block row ``r`` (tile row ``rr``) by one key tile.

    ``s_row`` holds the tile's masked scores (``-inf`` where hidden), ``key_max`` their
    :func:`_max_key` maximum and ``n_visible`` how many are visible; only keys ``[0, hi)``
    may be visible.  Replaces ``s_row`` by P = exp(s - m_new) (after dropout: 0 or
    P / (1 - p)), sets ``correction[rr] = exp(m_old - m_new)`` and updates the running
    maximum, sum and NaN flag of the row.  A row that sees no key of the tile gets P = 0.
    """
    zero, one, neg_inf = float_constants(keep_scale)
    correction[rr] = one
    if n_visible == 0:  # the row sees no key of this tile
        s_row[:] = zero
        return
    tile_max = _from_max_key(key_max)  # ignores some NaNs: caught by the sum
    m_old = row_max[r]
    m_new = max(m_old, tile_max)
    if m_new > m_old:
        correction[rr] = fast_exp(m_old - m_new)
        row_max[r] = m_new
    total = zero
    for c in range(s_row.shape[0]):
        p = fast_exp(s_row[c] - m_new)
        s_row[c] = p
        total += p
    # A visible NaN score makes the sum NaN; a visible +inf score is NaN in the reference
    # (exp(inf - inf)): either way the row is NaN.
    if total != total or tile_max == -neg_inf:
        row_nan[r] = True
    row_sum[r] = row_sum[r] * correction[rr] + total
    if threshold > 0:  # dropout: after the sum, which counts every weight
        for c in range(hi):
            if _dropout_bits(seed, b, h, i, j0 + c) < threshold:
                s_row[c] = zero
            else:
                s_row[c] *= keep_scale


@njit(cache=True, fastmath=_FASTMATH, inline="always")
def _rescale_add(acc, o, correction, r_lo):
    """acc[r_lo + rr] = acc[r_lo + rr] · correction[rr] + o[rr] for every tile row rr."""
    for rr in range(o.shape[0]):
        c_r = correction[rr]
        acc_row = acc[r_lo + rr]
        for d in range(o.shape[1]):
            acc_row[d] = acc_row[d] * c_r + o[rr, d]


@njit(cache=True, fastmath=_FASTMATH, error_model="numpy")
def _finish_rows(acc, row_max, row_sum, row_nan, out, weights, want_weights, lse, b, h, i0):
    """Write the block's rows i0, i0 + 1, ...: out = acc / ℓ, lse = m + log ℓ (-inf for a
    row that sees no key, NaN for a NaN row) and, if wanted, the weights from the raw
    scores stored in ``weights``."""
    zero, one, neg_inf = float_constants(row_sum[0])
    for r in range(acc.shape[0]):
        i = i0 + r
        nan_row = row_nan[r]
        inv_sum = zero
        if row_sum[r] > zero:
            inv_sum = one / row_sum[r]
        for d in range(acc.shape[1]):
            out[b, h, i, d] = acc[r, d] * inv_sum if not nan_row else zero / zero
        lse[b, h, i] = row_max[r] + np.log(row_sum[r]) if row_sum[r] > zero else neg_inf
        if nan_row:
            lse[b, h, i] = zero / zero
        if want_weights:
            m = row_max[r]
            for j in range(weights.shape[3]):
                score = weights[b, h, i, j]
                if nan_row:
                    weights[b, h, i, j] = zero / zero
                elif score == neg_inf:
                    weights[b, h, i, j] = zero
                else:
                    weights[b, h, i, j] = fast_exp(score - m) * inv_sum


# --- the kernel -----------------------------------------------------------------------------


@njit(cache=True, fastmath=_FASTMATH, error_model="numpy")
def _attend_block(q, k, v, mask, mask_strides, has_mask, key_lengths, causal, causal_offset,
                  scale, threshold, keep_scale, seed, out, weights, want_weights,
                  b, h, i0, i1, block_k, diag_k, blas, lse):
    """Attention for query rows [i0, i1) of batch b, head h (the online softmax).

    Also writes ``lse[b, h, i] = m + log ℓ`` (-inf for a row that sees no key)."""
    dtype = q.dtype
    hk = h // (q.shape[1] // k.shape[1])
    Dv = v.shape[3]
    n_rows = i1 - i0
    zero, one, neg_inf = float_constants(scale)  # in the input dtype
    correction = np.ones(n_rows, dtype=dtype)  # exp(m_old - m_new) of the current tile
    s_buf = np.empty(n_rows * max(block_k, diag_k), dtype=dtype)  # scores, then P, of a tile
    o_buf = np.empty((n_rows, Dv), dtype=dtype)  # P · V of a tile
    acc = np.zeros((n_rows, Dv), dtype=dtype)  # unnormalised output rows
    row_max = np.full(n_rows, neg_inf, dtype=dtype)  # running max m
    row_sum = np.zeros(n_rows, dtype=dtype)  # running sum ℓ
    row_nan = np.zeros(n_rows, dtype=np.bool_)  # a visible score was NaN (or +inf)
    q_blk = q[b, h, i0:i1]  # (n_rows, D)

    key_end = key_lengths[b]
    if causal:
        key_end = min(key_end, i1 + causal_offset)  # the last row sees keys < i1 + offset
    mask_b = b * mask_strides[0] + h * mask_strides[1]
    mask_i, mask_j = mask_strides[2], mask_strides[3]

    j0 = 0
    while j0 < key_end:  # key tiles [j0, j1)
        nk = block_k
        r_lo = 0  # rows [0, r_lo) see no key of the tile: left out of both products
        if causal and j0 + block_k - 1 > i0 + causal_offset:
            # The tile crosses the diagonal: narrower tiles waste less of the triangle.
            nk = diag_k
            r_lo = max(j0 - causal_offset - i0, 0)
        j1 = min(j0 + nk, key_end)
        nk = j1 - j0
        rows = n_rows - r_lo
        tile_mask = has_mask  # some entry of the tile is hidden by the mask
        if has_mask:
            n_seen = _mask_tile_count(mask, mask_b + (i0 + r_lo) * mask_i + j0 * mask_j,
                                      mask_i, mask_j, rows, nk, neg_inf)
            if n_seen == 0:  # the mask hides the whole tile: skip it
                j0 = j1
                continue
            tile_mask = n_seen < rows * nk or _adds_to_scores(mask)
        s = s_buf[:rows * nk].reshape((rows, nk))
        if blas is None:
            _scores_by_loops(q_blk[r_lo:], k[b, hk, j0:j1], s)  # (rows, nk)
        else:
            _scores_by_blas(q_blk[r_lo:], k[b, hk, j0:j1], s)
        # Some (row, key) pair of the tile is hidden: causal cuts it, or the mask does.
        partial = causal and j1 - 1 > i0 + r_lo + causal_offset
        for rr in range(rows):
            r = r_lo + rr
            i = i0 + r
            s_row = s[rr]
            hi = nk  # keys [j0, j0 + hi) may be visible to this row
            if causal:
                hi = max(min(nk, i + causal_offset + 1 - j0), 0)
            key_max = _max_key(neg_inf)
            if tile_mask:
                m0 = mask_b + i * mask_i + j0 * mask_j
                n_visible = 0
                for c in range(hi):
                    x, seen = _mask_score(s_row[c] * scale, mask[m0 + c * mask_j], neg_inf)
                    s_row[c] = x
                    n_visible += seen
                    key_max = max(key_max, _max_key(x))
                if n_visible < hi:
                    partial = True
            else:
                n_visible = hi
                for c in range(hi):
                    x = s_row[c] * scale
                    s_row[c] = x
                    key_max = max(key_max, _max_key(x))
            for c in range(hi, nk):
                s_row[c] = neg_inf
            if want_weights:
                for c in range(nk):
                    weights[b, h, i, j0 + c] = s_row[c]
            _softmax_row(s_row, hi, n_visible, key_max, r, rr, row_max, row_sum, row_nan,
                         correction, threshold, keep_scale, seed, b, h, i, j0)
        v_tile = v[b, hk, j0:j1]  # (nk, Dv)
        # The loops skip p = 0 and never read a hidden value; a BLAS product would turn a
        # hidden NaN into 0 · NaN, so with the BLAS a partly hidden tile holding a
        # non-finite value is summed over visible keys only.
        if blas is None or not partial or _all_finite(v_tile):
            o = o_buf[:rows]
            if blas is None:  # (rows, Dv); hidden pairs have p = 0 and finite values
                _values_by_loops(s, v_tile, o)
            else:
                _values_by_blas(s, v_tile, o)
            _rescale_add(acc, o, correction, r_lo)
        else:  # a non-finite value in a partly hidden tile: sum over visible keys only
            for rr in range(rows):
                r = r_lo + rr
                i = i0 + r
                c_r = correction[rr]
                for d in range(Dv):
                    acc[r, d] *= c_r
                hi = nk
                if causal:
                    hi = max(min(nk, i + causal_offset + 1 - j0), 0)
                m0 = mask_b + i * mask_i + j0 * mask_j
                for c in range(hi):
                    if tile_mask and not _mask_score(zero, mask[m0 + c * mask_j], neg_inf)[1]:
                        continue
                    p = s[rr, c]
                    for d in range(Dv):
                        acc[r, d] += p * v_tile[c, d]
        j0 = j1

    _finish_rows(acc, row_max, row_sum, row_nan, out, weights, want_weights, lse, b, h, i0)


@njit(cache=True)
def _task_block(task, n_blocks):
    """(b·H + h, query block) of a task, so that any run of tasks has balanced causal work.

    Numba splits a prange into one contiguous run of tasks per thread.  Under a causal
    mask query block n costs ~n + 1 tiles, so each head's blocks go 0, last, 1, last - 1,
    ...: each pair costs the same, heads are whole runs of tasks, and a thread's run of
    tasks gets its share of long and short blocks whatever the number of heads.
    """
    rank = task % n_blocks
    half = rank // 2
    return task // n_blocks, (n_blocks - 1 - half if rank % 2 else half)


@njit(parallel=True, cache=True)
def _attention_parallel(q, k, v, mask, mask_strides, has_mask, key_lengths, causal, causal_offset,
                        scale, threshold, keep_scale, seed, out, weights, want_weights,
                        block_q, block_k, diag_k, blas, lse):
    B, H, Lq = q.shape[0], q.shape[1], q.shape[2]
    n_blocks = (Lq + block_q - 1) // block_q
    for task in prange(B * H * n_blocks):  # (batch, head, query block)
        bh, block = _task_block(task, n_blocks)
        i0 = block * block_q
        _attend_block(q, k, v, mask, mask_strides, has_mask, key_lengths, causal, causal_offset,
                      scale, threshold, keep_scale, seed, out, weights, want_weights,
                      bh // H, bh % H, i0, min(i0 + block_q, Lq), block_k, diag_k, blas, lse)


@njit(cache=True)
def _attention_serial(q, k, v, mask, mask_strides, has_mask, key_lengths, causal, causal_offset,
                      scale, threshold, keep_scale, seed, out, weights, want_weights,
                      block_q, block_k, diag_k, blas, lse):
    B, H, Lq = q.shape[0], q.shape[1], q.shape[2]
    for b in range(B):
        for h in range(H):
            for i0 in range(0, Lq, block_q):
                _attend_block(q, k, v, mask, mask_strides, has_mask, key_lengths, causal,
                              causal_offset, scale, threshold, keep_scale, seed, out,
                              weights, want_weights, b, h, i0, min(i0 + block_q, Lq), block_k,
                              diag_k, blas, lse)


# --- launching ------------------------------------------------------------------------------

# Numba's 'workqueue' threading layer aborts the process if two Python threads launch
# parallel kernels at once; 'omp' and 'tbb' are thread-safe.  Numba picks tbb > omp >
# workqueue.  Launches are serialised only when the layer in use is workqueue (or not yet
# chosen: the first launch picks it).
_launch_lock = threading.Lock()


def launch_guard():
    try:
        layer = numba.threading_layer()
    except ValueError:  # no parallel kernel has run yet
        layer = None
    return nullcontext() if layer in ("omp", "tbb") else _launch_lock


# The BLAS must run single-threaded inside Numba's threads: a multi-threaded OpenBLAS
# (pthreads build, as SciPy's wheels ship) called from Numba's OpenMP threads
# oversubscribes the cores and prints "OpenBLAS Warning : Detect OpenMP Loop and this
# application may hang".  OpenBLAS runs a GEMM on the calling thread when its thread
# count is 1, so every parallel launch sets SciPy's BLAS (the one Numba's np.dot calls)
# to 1 thread and restores it when the last concurrent launch ends.
_blas_lock = threading.Lock()
#: Largest M·N·K that OpenBLAS runs on one thread whatever its setting (interface/gemm.c:
#: SMP_THRESHOLD_MIN 65536 x GEMM_MULTITHREAD_THRESHOLD 4).
_BLAS_SINGLE_THREADED_WORK = 65536 * 4
_blas_state = {"users": 0, "saved": [], "controllers": None}


def _numba_blas_controllers():
    """threadpoolctl controllers of the BLAS libraries that SciPy (so Numba's np.dot) uses."""
    if _blas_state["controllers"] is None:
        import scipy.linalg.cython_blas  # noqa: F401  (loads SciPy's BLAS)
        from threadpoolctl import ThreadpoolController

        blas = [lib for lib in ThreadpoolController().lib_controllers
                if lib.user_api == "blas"]
        scipy_own = [lib for lib in blas if "scipy" in lib.filepath.replace("scipy_openblas", "")]
        _blas_state["controllers"] = scipy_own or blas
    return _blas_state["controllers"]


@contextmanager
def single_threaded_blas():
    """Hold SciPy's BLAS at one thread while at least one launch runs."""
    with _blas_lock:
        if _blas_state["users"] == 0:
            controllers = _numba_blas_controllers()
            _blas_state["saved"] = [(lib, lib.num_threads) for lib in controllers]
            for lib in controllers:
                if lib.num_threads != 1:
                    lib.set_num_threads(1)
        _blas_state["users"] += 1
    try:
        yield
    finally:
        with _blas_lock:
            _blas_state["users"] -= 1
            if _blas_state["users"] == 0:
                for lib, n in _blas_state["saved"]:
                    if n != 1:
                        lib.set_num_threads(n)


def block_rows(problem: AttentionProblem, threads: int) -> int:
    """Query rows per task: ``BLOCK_Q``, halved (not below ``MIN_BLOCK_Q``) until each of
    ``threads`` threads has two tasks."""
    B, H, _, Lq, _, _, _ = problem.shape
    block_q = BLOCK_Q
    while block_q > MIN_BLOCK_Q and B * H * -(-Lq // block_q) < 2 * threads:
        block_q //= 2
    return block_q


def is_small(problem: AttentionProblem) -> bool:
    """True when the problem is too small to be worth Numba's thread pool."""
    B, H, _, Lq, Lk, D, Dv = problem.shape
    return B * H * Lq * Lk * (D + Dv) < SERIAL_WORK_LIMIT


def _mask_arguments(problem: AttentionProblem, dtype):
    """The flattened mask (bool or additive), its element strides (0 = broadcast) and a flag."""
    mask = problem.mask  # bool (read as bytes) or additive, as the caller gave it
    if mask is None:
        return np.zeros(1, dtype=dtype), np.zeros(4, dtype=np.int64), False
    strides = [0 if n == 1 else s // mask.itemsize for n, s in zip(mask.shape, mask.strides,
                                                                   strict=True)]
    return mask.reshape(-1), np.array(strides, dtype=np.int64), True


def run(problem: AttentionProblem, *, parallel: bool | None = None,
        use_blas: bool | None = None, return_lse: bool = False):
    """Fused attention for a validated problem; returns ``(out, weights or None)``.

    With ``return_lse``, ``(out, weights or None, lse)``: lse (B, H, Lq), the log-sum-exp of
    each row's visible scores (``-inf`` for a row that sees no key).

    Parameters
    ----------
    problem : AttentionProblem
    parallel : bool, optional
        Force the parallel (True) or serial (False) kernel; default: serial for small
        problems (see ``SERIAL_WORK_LIMIT``), parallel otherwise.
    use_blas : bool, optional
        Compute the tile products with the BLAS (True) or with Numba loops (False);
        default: the BLAS where SciPy is installed (``HAVE_BLAS``).
    """
    if problem.score_mod is not None or problem.mask_mod is not None:
        from ._numba_mods import run as run_mods  # the kernel with the mods compiled in

        return run_mods(problem, parallel=parallel, use_blas=use_blas, return_lse=return_lse)
    use_blas = HAVE_BLAS if use_blas is None else bool(use_blas)
    B, H, _, Lq, Lk, _, Dv = problem.shape
    dtype = problem.dtype.type
    if problem.return_weights:
        weights = np.full((B, H, Lq, Lk), -np.inf, dtype=dtype)
    else:
        weights = np.empty((1, 1, 1, 1), dtype=dtype)  # unused; keeps one signature
    out = np.empty((B, H, Lq, Dv), dtype=dtype)
    lse = np.empty((B, H, Lq), dtype=dtype)  # written by every row: an O(Lq) extra
    result = (out, weights if problem.return_weights else None)
    if B * H * Lq == 0:
        return result + (lse,) if return_lse else result
    mask, mask_strides, has_mask = _mask_arguments(problem, dtype)
    if parallel is None:
        parallel = not is_small(problem)
    block_q = block_rows(problem, numba.get_num_threads()) if parallel else BLOCK_Q
    args = (
        problem.q, problem.k, problem.v, mask, mask_strides, has_mask,
        problem.key_lengths_or_full(),
        problem.causal_offset is not None, problem.causal_offset or 0,
        dtype(problem.scale), np.uint64(dropout_threshold(problem.dropout_p)),
        dtype(1.0 / (1.0 - problem.dropout_p)), np.uint64(problem.seed),
        out, weights, problem.return_weights,
        block_q, BLOCK_K, BLOCK_K_DIAGONAL, True if use_blas else None, lse,
    )
    # The serial kernel runs on the calling thread, outside any OpenMP region: there the
    # BLAS may thread as it likes, and below OpenBLAS's own threshold it runs single-
    # threaded anyway (M·N·K <= 262144), so tiny calls skip the guard's cost (~5 us).
    tile = min(block_q, Lq) * min(BLOCK_K, Lk) * max(problem.shape[5], Dv)
    guarded = use_blas and (parallel or tile > _BLAS_SINGLE_THREADED_WORK)
    blas_guard = single_threaded_blas() if guarded else nullcontext()
    if parallel:
        with launch_guard(), blas_guard:
            _attention_parallel(*args)
    else:
        with blas_guard:
            _attention_serial(*args)
    return result + (lse,) if return_lse else result
