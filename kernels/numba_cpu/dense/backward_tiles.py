"""The pieces of the ``numba`` backward kernel's tiles (:mod:`kernels.numba_cpu.dense.backward`).

A key block's working arrays, the rows of a query block, the two score GEMMs, the
gradient of one pair, the pairs of a tile (with or without mod functions), the
three products and the key block's store.  Every piece takes the tile's arrays, so that
the kernel with :mod:`kernels.mods` functions and the one without are the same kernel.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from ..._dropout import build_dropout_bits
from ..._jit.half import narrow, widen
from ..._jit.math import FASTMATH, fast_exp, float_constants
from ...mods.cells import FULL
from .tiles import _mask_score, _scores_by_loops

_dropout_bits = build_dropout_bits(njit(cache=True))


@njit(cache=True, fastmath=FASTMATH)
def _products_by_loops(ds, pd, q_blk, do_blk, k_tile, dq_t, dk_t, dv_t):
    """dq_t = ds · k_tile, dk_t = dsᵀ · q_blk, dv_t = pdᵀ · do_blk, skipping zero entries.

    The path without a BLAS: a pair with ds = 0 (pd = 0) adds nothing.
    """
    rows, nk = ds.shape
    D = q_blk.shape[1]
    Dv = do_blk.shape[1]
    dq_t[:] = 0
    dk_t[:] = 0
    dv_t[:] = 0
    for r in range(rows):
        for c in range(nk):
            a = ds[r, c]
            if a != 0:
                for d in range(D):
                    dq_t[r, d] += a * k_tile[c, d]
                for d in range(D):
                    dk_t[c, d] += a * q_blk[r, d]
            p = pd[r, c]
            if p != 0:
                for d in range(Dv):
                    dv_t[c, d] += p * do_blk[r, d]




@njit(cache=True, fastmath=FASTMATH)
def key_block_buffers(k_tile, v_tile, block_q):
    """The working arrays of a key block: ``(k_clean, dk_acc, dv_acc, s_buf, dp_buf, q_buf,
    do_buf, dq_buf, dk_t, dv_t)``.

    ``k_clean`` is K with its non-finite entries set to 0, for dQ = dS · K: a hidden pair
    has dS = 0 and 0 · NaN would be NaN; a visible pair with a non-finite key has dS = NaN
    anyway.  ``s_buf`` holds S, then dS; ``dp_buf`` dO · Vᵀ, then Pd; ``q_buf`` and
    ``do_buf`` the q and dout rows of a query block (zero for a row that sees no key).
    """
    dtype = k_tile.dtype
    nk, D = k_tile.shape
    Dv = v_tile.shape[1]
    zero = np.zeros(1, dtype=dtype)[0]
    k_clean = np.empty((nk, D), dtype=dtype)
    for c in range(nk):
        for d in range(D):
            x = k_tile[c, d]
            k_clean[c, d] = x if x * 0 == 0 else zero
    return (k_clean, np.zeros((nk, D), dtype=dtype), np.zeros((nk, Dv), dtype=dtype),
            np.empty((block_q, nk), dtype=dtype), np.empty((block_q, nk), dtype=dtype),
            np.empty((block_q, D), dtype=dtype), np.empty((block_q, Dv), dtype=dtype),
            np.empty((block_q, D), dtype=dtype), np.empty((nk, D), dtype=dtype),
            np.empty((nk, Dv), dtype=dtype))


@njit(cache=True, fastmath=FASTMATH)
def load_rows(q, dout, lse, b, h, i0, q_blk, do_blk):
    """Copy the q and dout rows i0, i0 + 1, ... of (b, h) into ``q_blk``, ``do_blk``; a row
    that sees no key (lse = -inf) gets zeros: it is never read, so NaN there stays out."""
    zero, _, neg_inf = float_constants(lse[b, h, i0])
    for r in range(q_blk.shape[0]):
        seen_any = lse[b, h, i0 + r] != neg_inf
        for d in range(q_blk.shape[1]):
            q_blk[r, d] = widen(q[b, h, i0 + r, d]) if seen_any else zero
        for d in range(do_blk.shape[1]):
            do_blk[r, d] = widen(dout[b, h, i0 + r, d]) if seen_any else zero


@njit(cache=True)
def tile_scores(q_blk, do_blk, k_tile, v_tile, s, dp, blas):
    """s = q_blk · k_tileᵀ and dp = do_blk · v_tileᵀ (the BLAS, or loops when ``blas`` is None)."""
    if blas is None:
        _scores_by_loops(q_blk, k_tile, s)
        _scores_by_loops(do_blk, v_tile, dp)
    else:
        np.dot(q_blk, k_tile.T, s)
        np.dot(do_blk, v_tile.T, dp)


@njit(cache=True, fastmath=FASTMATH, error_model="numpy")
def pair_gradient(p, dpd, delta, threshold, keep_scale, seed, b, h, i, j):
    """``(dS, Pd)`` of a visible pair (i, j) with weight ``p`` and dO · vᵀ = ``dpd``:
    Pd = P ∘ Z · κ and dS = P ∘ (dPd ∘ Z · κ − Δ), Z the dropout's keep decision."""
    pd = p
    if threshold > 0:
        if _dropout_bits(seed, b, h, i, j) < threshold:
            pd = float_constants(p)[0]
            dpd = pd
        else:
            pd = p * keep_scale
            dpd = dpd * keep_scale
    return p * (dpd - delta), pd


@njit(fastmath=FASTMATH, error_model="numpy")
def tile_pair_gradients(s, dp, lse, row_dot, mask, mask_b, mask_i, mask_j, has_mask, causal,
                        causal_offset, scale, threshold, keep_scale, seed, b, seq, h, i0, j0,
                        cls, mask_fn, mask_args, score_fn, score_args, grad_fn):
    """The pairs of tile (rows i0.., keys j0..) of (b, h): ``s`` (S) becomes dS and ``dp``
    (dO · Vᵀ) becomes Pd; a hidden pair, and every pair of a row that sees no key, gets 0.
    The mods and the dropout see batch ``seq`` (``b``, or a packed sequence's own index).

    ``mask_fn, mask_args, score_fn, score_args, grad_fn``: all None, or the call's mod
    functions: then the score function and its derivative apply to every pair, and in a
    tile of class ``cls`` other than FULL every mask is checked on every pair.  Numba
    compiles only the branch for None when ``mask_fn`` is None.
    """
    zero, _, neg_inf = float_constants(scale)  # in the input dtype
    rows, nk = s.shape
    for r in range(rows):
        i = i0 + r
        row_lse = lse[b, h, i]
        delta = row_dot[b, h, i]
        s_row = s[r]
        dp_row = dp[r]
        if mask_fn is None:
            hi = nk  # keys [j0, j0 + hi) may be visible to row i
            if causal:
                hi = max(min(nk, i + causal_offset + 1 - j0), 0)
            if row_lse == neg_inf:  # the row sees no key: it takes no part
                hi = 0
            if has_mask or threshold > 0:
                m0 = mask_b + i * mask_i + j0 * mask_j
                for c in range(hi):
                    x = s_row[c] * scale
                    seen = True
                    if has_mask:
                        x, seen = _mask_score(x, mask[m0 + c * mask_j], neg_inf)
                    ds = zero
                    pd = zero
                    if seen:
                        ds, pd = pair_gradient(fast_exp(x - row_lse), dp_row[c], delta,
                                               threshold, keep_scale, seed, seq, h, i, j0 + c)
                    s_row[c] = ds
                    dp_row[c] = pd
            else:
                for c in range(hi):
                    p = fast_exp(s_row[c] * scale - row_lse)
                    s_row[c] = p * (dp_row[c] - delta)
                    dp_row[c] = p
            for c in range(hi, nk):
                s_row[c] = zero
                dp_row[c] = zero
        else:
            m0 = mask_b + i * mask_i + j0 * mask_j
            for c in range(nk):
                jj = j0 + c
                x = s_row[c] * scale
                y = score_fn(x, seq, h, i, jj, score_args)
                seen = row_lse != neg_inf  # a row that sees no key takes no part
                if cls != FULL:
                    seen = seen and (not causal or jj <= i + causal_offset) and mask_fn(
                        seq, h, i, jj, mask_args)
                    if has_mask and seen:
                        y, seen = _mask_score(y, mask[m0 + c * mask_j], neg_inf)
                ds = zero
                pd = zero
                if seen:
                    ds, pd = pair_gradient(fast_exp(y - row_lse), dp_row[c], delta,
                                           threshold, keep_scale, seed, seq, h, i, jj)
                    ds = ds * grad_fn(x, seq, h, i, jj, score_args)
                s_row[c] = ds
                dp_row[c] = pd


@njit(cache=True, fastmath=FASTMATH)
def add_tile_gradients(ds, pd, q_blk, do_blk, k_clean, dq_t, dk_t, dv_t, dk_acc, dv_acc, dq,
                       b, h, i0, blas):
    """The three products of a tile: dK += dSᵀ · Q, dV += Pdᵀ · dO (into the key block's
    accumulators) and dQ[b, h, i0:] += dS · K."""
    rows = ds.shape[0]
    dq_t = dq_t[:rows]
    if blas is None:
        _products_by_loops(ds, pd, q_blk, do_blk, k_clean, dq_t, dk_t, dv_t)
    else:
        np.dot(ds, k_clean, dq_t)  # (rows, D)
        np.dot(ds.T, q_blk, dk_t)  # (nk, D)
        np.dot(pd.T, do_blk, dv_t)  # (nk, Dv)
    for c in range(dk_t.shape[0]):
        for d in range(dk_t.shape[1]):
            dk_acc[c, d] += dk_t[c, d]
        for d in range(dv_t.shape[1]):
            dv_acc[c, d] += dv_t[c, d]
    for r in range(rows):
        for d in range(dq_t.shape[1]):
            dq[b, h, i0 + r, d] += dq_t[r, d]


@njit(cache=True, fastmath=FASTMATH)
def store_key_block(dk_acc, dv_acc, dk, dv, b, hk, j0, scale):
    """dk[b, hk, j0:] = scale · dk_acc (the scale applied once), dv[b, hk, j0:] = dv_acc
    (for half dk and dv, their bits rounded to nearest even)."""
    for c in range(dk_acc.shape[0]):
        for d in range(dk_acc.shape[1]):
            dk[b, hk, j0 + c, d] = narrow(dk_acc[c, d] * scale, dk)
        for d in range(dv_acc.shape[1]):
            dv[b, hk, j0 + c, d] = narrow(dv_acc[c, d], dv)

