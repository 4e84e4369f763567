"""Tile-level pieces of the numba CPU kernels: mask entries, the two tile products (BLAS or
loops), and the online-softmax update of one row.

Used by the forward kernel (:mod:`kernels.numba_cpu.dense.forward`, with or without mods); the
backward kernels use the mask helpers and the loops.
"""

from __future__ import annotations

import numpy as np
from numba import njit, types
from numba.extending import overload

from ..._dropout import build_dropout_bits
from ..._jit.half import compute_dtype_of, half_scratch, narrow, widen_tile
from ..._jit.math import FASTMATH, fast_exp, float_constants, from_max_key
from ..products.intrinsics import SUM_LANES, ordered_sum

_dropout_bits = build_dropout_bits(njit(cache=True))


# --- masks ----------------------------------------------------------------------------------



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


@njit(inline="always")
def _blocked_product(a, b, out, skip_zeros):
    """out = a · b by loops, (n, m) x (m, p) -> (n, p), in partial sums of :data:`_SUM_BLOCK`
    terms; with ``skip_zeros`` (a constant at each call: its branch is folded away) the
    terms of a zero entry of ``a`` are left out, so the row of ``b`` it would scale is
    never read.  Inlined: it compiles with its caller's fastmath flags."""
    n, m = a.shape
    part = np.empty(out.shape[1], dtype=out.dtype)
    for r in range(n):
        out_row = out[r]
        out_row[:] = 0
        for t0 in range(0, m, _SUM_BLOCK):
            part[:] = 0
            for t in range(t0, min(t0 + _SUM_BLOCK, m)):
                x = a[r, t]
                if skip_zeros and x == 0:
                    continue
                b_row = b[t]
                for c in range(part.shape[0]):
                    part[c] += x * b_row[c]
            for c in range(part.shape[0]):
                out_row[c] += part[c]


@njit(cache=True, fastmath=FASTMATH)
def _scores_by_loops(q_blk, k_tile, s):
    """s = q_blk · k_tileᵀ without a BLAS: (n, D) x (m, D) -> (n, m)."""
    D = q_blk.shape[1]
    m = k_tile.shape[0]
    kt = np.empty((D, m), dtype=k_tile.dtype)  # keys along the fast axis: vectorises over keys
    for j in range(m):
        for d in range(D):
            kt[d, j] = k_tile[j, d]
    _blocked_product(q_blk, kt, s, False)


@njit(cache=True, fastmath=FASTMATH)
def _values_by_loops(p, v_tile, o):
    """o = p · v_tile without a BLAS: (n, m) x (m, Dv) -> (n, Dv).

    Keys with p = 0 (hidden, dropped or underflowed) are skipped, so a hidden value is
    never read and the sum over the others does not depend on what it holds: NaN stored
    there leaves the result bit-identical.
    """
    _blocked_product(p, v_tile, o, True)


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


@njit(cache=True, fastmath=FASTMATH)
def _all_finite(x):
    """True if every entry of the 2-D array ``x`` is finite (x · 0 is NaN for inf and NaN)."""
    total = x[0, 0] * 0
    for r in range(x.shape[0]):
        for c in range(x.shape[1]):
            total += x[r, c] * 0
    return total == 0


@njit(fastmath=FASTMATH)
def _sees(tile_mask, mask, m0, mask_j, neg_inf, full, mask_fn, mask_args, b, h, i, j0, c):
    """Whether row i sees key j0 + c of a tile (under the dense mask and the mask function;
    the caller has applied causal)."""
    zero = float_constants(neg_inf)[0]
    seen = True
    if tile_mask:
        seen = _mask_score(zero, mask[m0 + c * mask_j], neg_inf)[1]
    if mask_fn is not None and not full:
        seen = seen and mask_fn(b, h, i, j0 + c, mask_args)
    return seen


@njit(fastmath=FASTMATH)
def _values_by_blas_finite(p, v_tile, o, i0, j0, causal, causal_offset, tile_mask, mask, m_b,
                           mask_i, mask_j, neg_inf, full, mask_fn, mask_args, b, h):
    """o = p · v_tile by the BLAS for a partly hidden tile (rows i0.., keys j0..) whose
    values are not all finite.

    The product runs on a copy with each non-finite value replaced by 0, so that a row that
    does not see such a value gets the bits it would get with any finite value there: what
    a hidden value holds changes no output bit.  A row that sees one is summed over the keys
    it sees, as the reference does (``0 · inf`` is NaN there too).
    """
    m, Dv = v_tile.shape
    clean = np.empty((m, Dv), dtype=v_tile.dtype)
    bad = np.zeros(m, dtype=np.bool_)
    for j in range(m):
        for d in range(Dv):
            x = v_tile[j, d]
            finite = x * 0 == 0  # False for inf and NaN
            clean[j, d] = x if finite else 0
            bad[j] |= not finite
    _values_by_blas(p, clean, o)
    for rr in range(p.shape[0]):
        i = i0 + rr
        hi = m
        if causal:
            hi = max(min(m, i + causal_offset + 1 - j0), 0)
        m0 = m_b + i * mask_i + j0 * mask_j
        sees_bad = False
        for c in range(hi):
            sees_bad |= bad[c] and _sees(tile_mask, mask, m0, mask_j, neg_inf, full, mask_fn,
                                         mask_args, b, h, i, j0, c)
        if sees_bad:
            o[rr, :] = 0
            for c in range(hi):
                if _sees(tile_mask, mask, m0, mask_j, neg_inf, full, mask_fn, mask_args, b, h,
                         i, j0, c):
                    for d in range(Dv):
                        o[rr, d] += p[rr, c] * v_tile[c, d]


# --- the online softmax of one row ---------------------------------------------------------


# The two per-tile helpers are inlined into the kernels' Numba IR: as separate functions
# (17 arguments, arrays passed field by field) the plain forward was ~5% slower at L=4096,
# inlined ~2% (quiet machine, side by side with the previous kernel).
@njit(cache=True, fastmath=FASTMATH, error_model="numpy", inline="always")
def _softmax_row(s_row, hi, n_visible, key_max, r, rr, row_max, row_sum, row_nan, correction,
                 threshold, keep_scale, seed, b, h, i, j0):
    """The online-softmax update of block row ``r`` (tile row ``rr``) by one key tile.

    ``s_row`` holds the tile's masked scores (``-inf`` where hidden), ``key_max`` their
    :func:`max_key` maximum and ``n_visible`` how many are visible; only keys ``[0, hi)``
    may be visible.  Replaces ``s_row`` by P = exp(s - m_new) (after dropout: 0 or
    P / (1 - p)), sets ``correction[rr] = exp(m_old - m_new)`` and updates the running
    maximum, sum and NaN flag of the row.  A row that sees no key of the tile gets P = 0.
    """
    zero, one, neg_inf = float_constants(keep_scale)
    correction[rr] = one
    if n_visible == 0:  # the row sees no key of this tile
        s_row[:] = zero
        return
    tile_max = from_max_key(key_max)  # ignores some NaNs: caught by the sum
    m_old = row_max[r]
    m_new = max(m_old, tile_max)
    if m_new > m_old:
        correction[rr] = fast_exp(m_old - m_new)
        row_max[r] = m_new
    for c in range(s_row.shape[0]):
        s_row[c] = fast_exp(s_row[c] - m_new)
    total = ordered_sum(s_row, 0, s_row.shape[0], SUM_LANES)  # one order in every kernel
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


@njit(cache=True, fastmath=FASTMATH, inline="always")
def _rescale_add(acc, o, correction, r_lo):
    """acc[r_lo + rr] = acc[r_lo + rr] · correction[rr] + o[rr] for every tile row rr."""
    for rr in range(o.shape[0]):
        c_r = correction[rr]
        acc_row = acc[r_lo + rr]
        for d in range(o.shape[1]):
            acc_row[d] = acc_row[d] * c_r + o[rr, d]


@njit(cache=True, fastmath=FASTMATH, error_model="numpy")
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
            out[b, h, i, d] = narrow(acc[r, d] * inv_sum if not nan_row else zero / zero, out)
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


@njit(cache=True, inline="always")
def _block_state(q, k, key_lengths, mask_strides, causal, causal_offset, scale, b, h, i0, i1,
                 tile_k, dv):
    """The working state of one query block [i0, i1) of (b, h), shared by the kernels.

    Returns ``(hk, q_blk, key_end, mask_b, mask_i, mask_j, correction, s_buf, o_buf, acc,
    row_max, row_sum, row_nan)``: the key head, the block's queries, the end of the keys any
    of its rows can see, its mask offsets, the per-row correction of the current tile, the
    score buffer (``tile_k`` keys per row), the P · V buffer and the accumulated output
    (``dv`` columns), and the running max, sum and NaN flag of each row.  Inlined into the
    kernels' Numba IR, so the tuple costs nothing.  Half inputs (their bits) are computed
    in float32: the block's queries are widened into a float32 tile.
    """
    dtype = compute_dtype_of(q)
    n_rows = i1 - i0
    neg_inf = float_constants(scale)[2]  # in the input dtype (that of scale)
    key_end = key_lengths[b]
    if causal:
        key_end = min(key_end, i1 + causal_offset)  # the last row sees keys < i1 + offset
    q_blk = widen_tile(q[b, h, i0:i1], half_scratch(q, n_rows * q.shape[3]))
    return (h // (q.shape[1] // k.shape[1]), q_blk, key_end,
            b * mask_strides[0] + h * mask_strides[1], mask_strides[2], mask_strides[3],
            np.ones(n_rows, dtype=dtype),  # exp(m_old - m_new) of the current tile
            np.empty(n_rows * tile_k, dtype=dtype),  # scores, then P, of a tile
            np.empty((n_rows, dv), dtype=dtype),  # P · V of a tile
            np.zeros((n_rows, dv), dtype=dtype),  # unnormalised output rows
            np.full(n_rows, neg_inf, dtype=dtype),  # running max m
            np.zeros(n_rows, dtype=dtype),  # running sum ℓ
            np.zeros(n_rows, dtype=np.bool_))  # a visible score was NaN (or +inf)
