"""The ``numba`` backward pass: fused, FlashAttention-2 style, parallel over Numba's threads.

A task owns the key blocks of one (batch, key/value head) -- all of them, or every C-th
one when there are fewer (batch, kv head) pairs than twice the threads (C "chunks").  For
each key block [j0, j1) it walks the query heads that share the kv head (GQA) and the
query blocks that can see the keys, and per (query block, key block) tile recomputes

    S   = Q_blk · K_tileᵀ                     (GEMM)    dPd = dO_blk · V_tileᵀ   (GEMM)
    P   = exp(S · scale + mask − lse)          (0 where hidden; the forward's softmax)
    Pd  = P ∘ Z · κ,  dS = P ∘ (dPd ∘ Z · κ − Δ)   with Δ = rowsum(dO ∘ O), Z the dropout
    dV_tile += Pdᵀ · dO_blk,  dK_tile += dSᵀ · Q_blk,  dQ_blk += dS · K_tile   (3 GEMMs)

so that dK and dV of a key block are finished by the task that owns it (no write race),
and dQ is added in place by that same task (one chunk) or into a per-chunk copy summed at
the end (C chunks).  Five GEMMs per tile, the FLOP count of the formula (2.5 x the
forward); working memory is O(block_q · block_k) per task, no L x L array.  Scale is
applied once at the end (dQ, dK).

What is never read, as in the forward kernel (:mod:`kernels.numba_cpu`): key blocks past
``key_lengths[b]`` or past the last causally visible key, query blocks above the causal
diagonal and tiles the mask hides whole are skipped; hidden pairs get P = dS = 0 (set, not
multiplied: S and dO · Vᵀ of a hidden pair may hold garbage, which is never used); the q
and dout rows of a query that sees no key (lse = -inf) are replaced by 0 in the tile's
copy; and dQ = dS · K uses a copy of K with its non-finite entries set to 0 (a hidden pair
has dS = 0, a visible pair with a non-finite key has dS = NaN already).  So NaN stored
where it is hidden reaches no gradient, and the BLAS path stays the same (and so does every
bit of the result) whatever the hidden entries hold.
"""

from __future__ import annotations

from contextlib import nullcontext

import numba
import numpy as np
from numba import njit, prange

from . import numba_cpu
from ._dropout import build_dropout_bits, dropout_threshold
from ._mods_compile import run_user_code
from ._validate import AttentionProblem
from .numba_cpu import (
    _FASTMATH,
    _mask_arguments,
    _mask_score,
    _mask_tile_count,
    _scores_by_loops,
    fast_exp,
    float_constants,
    launch_guard,
    single_threaded_blas,
)

#: Query rows per tile.
BLOCK_Q = 128
#: Keys per block: the unit of work that owns its dK and dV.  Measured at L = 2048, D = 64,
#: one thread, CPU time (the machine was shared): (BLOCK_Q, BLOCK_K) = (128, 64) 386 ms,
#: (64, 128) 397, (64, 64) 413, (128, 128) 480, (256, 128) 442; causal alike.
BLOCK_K = 64
#: Problems with fewer multiply-adds than this (B·H·Lq·Lk·(D+Dv)) run on the calling thread.
SERIAL_WORK_LIMIT = 1 << 20

_dropout_bits = build_dropout_bits(njit(cache=True))


@njit(cache=True, fastmath=_FASTMATH)
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


# --- the pieces of a key block, shared with the kernel with mods (_numba_mods_backward) --------


@njit(cache=True, fastmath=_FASTMATH)
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


@njit(cache=True, fastmath=_FASTMATH)
def load_rows(q, dout, lse, b, h, i0, q_blk, do_blk):
    """Copy the q and dout rows i0, i0 + 1, ... of (b, h) into ``q_blk``, ``do_blk``; a row
    that sees no key (lse = -inf) gets zeros: it is never read, so NaN there stays out."""
    zero, _, neg_inf = float_constants(lse[b, h, i0])
    for r in range(q_blk.shape[0]):
        seen_any = lse[b, h, i0 + r] != neg_inf
        for d in range(q_blk.shape[1]):
            q_blk[r, d] = q[b, h, i0 + r, d] if seen_any else zero
        for d in range(do_blk.shape[1]):
            do_blk[r, d] = dout[b, h, i0 + r, d] if seen_any else zero


@njit(cache=True)
def tile_scores(q_blk, do_blk, k_tile, v_tile, s, dp, blas):
    """s = q_blk · k_tileᵀ and dp = do_blk · v_tileᵀ (the BLAS, or loops when ``blas`` is None)."""
    if blas is None:
        _scores_by_loops(q_blk, k_tile, s)
        _scores_by_loops(do_blk, v_tile, dp)
    else:
        np.dot(q_blk, k_tile.T, s)
        np.dot(do_blk, v_tile.T, dp)


@njit(cache=True, fastmath=_FASTMATH, error_model="numpy")
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


@njit(cache=True, fastmath=_FASTMATH)
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


@njit(cache=True, fastmath=_FASTMATH)
def store_key_block(dk_acc, dv_acc, dk, dv, b, hk, j0, scale):
    """dk[b, hk, j0:] = scale · dk_acc (the scale applied once), dv[b, hk, j0:] = dv_acc."""
    for c in range(dk_acc.shape[0]):
        for d in range(dk_acc.shape[1]):
            dk[b, hk, j0 + c, d] = dk_acc[c, d] * scale
        for d in range(dv_acc.shape[1]):
            dv[b, hk, j0 + c, d] = dv_acc[c, d]


# --- the kernel ----------------------------------------------------------------------------


@njit(cache=True, fastmath=_FASTMATH, error_model="numpy")
def _key_block(q, k, v, dout, lse, row_dot, mask, mask_strides, has_mask, causal,
               causal_offset, scale, threshold, keep_scale, seed, dq, dk, dv,
               b, hk, j0, j1, block_q, blas):
    """dK, dV of keys [j0, j1) of (b, hk), and their part of dQ (added into ``dq``)."""
    H, Lq = q.shape[1], q.shape[2]
    group = H // k.shape[1]
    nk = j1 - j0
    zero, _, neg_inf = float_constants(scale)  # in the input dtype
    k_tile = k[b, hk, j0:j1]  # (nk, D)
    v_tile = v[b, hk, j0:j1]  # (nk, Dv)
    (k_clean, dk_acc, dv_acc, s_buf, dp_buf, q_buf, do_buf, dq_buf, dk_t,
     dv_t) = key_block_buffers(k_tile, v_tile, block_q)
    mask_i, mask_j = mask_strides[2], mask_strides[3]
    i_start = 0
    if causal:
        i_start = max(j0 - causal_offset, 0)  # rows above it see no key of the block

    for h in range(hk * group, (hk + 1) * group):
        mask_b = b * mask_strides[0] + h * mask_strides[1]
        for i0 in range(i_start, Lq, block_q):
            i1 = min(i0 + block_q, Lq)
            rows = i1 - i0
            if has_mask and _mask_tile_count(mask, mask_b + i0 * mask_i + j0 * mask_j,
                                             mask_i, mask_j, rows, nk, neg_inf) == 0:
                continue  # the mask hides the whole tile
            q_blk = q_buf[:rows]  # (rows, D)
            do_blk = do_buf[:rows]  # (rows, Dv)
            load_rows(q, dout, lse, b, h, i0, q_blk, do_blk)
            s = s_buf[:rows]  # (rows, nk)
            dp = dp_buf[:rows]
            tile_scores(q_blk, do_blk, k_tile, v_tile, s, dp, blas)
            for r in range(rows):
                i = i0 + r
                row_lse = lse[b, h, i]
                delta = row_dot[b, h, i]
                s_row = s[r]
                dp_row = dp[r]
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
                                                   threshold, keep_scale, seed, b, h, i, j0 + c)
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
            add_tile_gradients(s, dp, q_blk, do_blk, k_clean, dq_buf, dk_t, dv_t, dk_acc,
                               dv_acc, dq, b, h, i0, blas)
    store_key_block(dk_acc, dv_acc, dk, dv, b, hk, j0, scale)


@njit(cache=True)
def _key_blocks(q, k, v, dout, lse, row_dot, mask, mask_strides, has_mask, key_lengths, causal,
                causal_offset, scale, threshold, keep_scale, seed, dq, dk, dv,
                b, hk, first, step, block_q, block_k, blas):
    """Key blocks first, first + step, ... of (b, hk), up to the last key any row sees."""
    key_end = key_lengths[b]
    if causal:
        key_end = min(key_end, q.shape[2] + causal_offset)  # the last row sees keys < this
    n_blocks = (max(key_end, 0) + block_k - 1) // block_k
    for kb in range(first, n_blocks, step):
        j0 = kb * block_k
        _key_block(q, k, v, dout, lse, row_dot, mask, mask_strides, has_mask, causal,
                   causal_offset, scale, threshold, keep_scale, seed, dq, dk, dv,
                   b, hk, j0, min(j0 + block_k, key_end), block_q, blas)


@njit(parallel=True, cache=True)
def _backward_parallel(q, k, v, dout, lse, row_dot, mask, mask_strides, has_mask, key_lengths,
                       causal, causal_offset, scale, threshold, keep_scale, seed, dq_parts,
                       dk, dv, block_q, block_k, blas):
    B, Hkv = k.shape[0], k.shape[1]
    chunks = dq_parts.shape[0]
    for task in prange(B * Hkv * chunks):  # (batch, kv head, chunk of key blocks)
        bhk = task // chunks
        chunk = task % chunks
        _key_blocks(q, k, v, dout, lse, row_dot, mask, mask_strides, has_mask, key_lengths,
                    causal, causal_offset, scale, threshold, keep_scale, seed, dq_parts[chunk],
                    dk, dv, bhk // Hkv, bhk % Hkv, chunk, chunks, block_q, block_k, blas)


@njit(cache=True)
def _backward_serial(q, k, v, dout, lse, row_dot, mask, mask_strides, has_mask, key_lengths,
                     causal, causal_offset, scale, threshold, keep_scale, seed, dq_parts,
                     dk, dv, block_q, block_k, blas):
    B, Hkv = k.shape[0], k.shape[1]
    for b in range(B):
        for hk in range(Hkv):
            _key_blocks(q, k, v, dout, lse, row_dot, mask, mask_strides, has_mask, key_lengths,
                        causal, causal_offset, scale, threshold, keep_scale, seed, dq_parts[0],
                        dk, dv, b, hk, 0, 1, block_q, block_k, blas)


def key_chunks(problem: AttentionProblem, threads: int) -> int:
    """How many chunks the key blocks of each (batch, kv head) are split into: 1 when there
    are at least two such pairs per thread, else enough for two tasks per thread."""
    B, _, Hkv, _, Lk, _, _ = problem.shape
    pairs = B * Hkv
    if pairs >= 2 * threads:
        return 1
    n_blocks = max(-(-Lk // BLOCK_K), 1)
    return max(1, min(-(-2 * threads // pairs), n_blocks))


def run(problem: AttentionProblem, dout: np.ndarray, out: np.ndarray, lse: np.ndarray, *,
        parallel: bool | None = None, use_blas: bool | None = None):
    """Gradients ``(dq, dk, dv)`` for a validated problem, from the forward's ``out``, ``lse``.

    Parameters
    ----------
    problem : AttentionProblem
    dout, out : ndarray, shape (B, H, Lq, Dv)
    lse : ndarray, shape (B, H, Lq)
    parallel : bool, optional
        Force the parallel or the serial kernel; default: serial below
        ``SERIAL_WORK_LIMIT``.
    use_blas : bool, optional
        Tile products by the BLAS (default where SciPy is installed, as the forward) or by
        loops.

    Returns
    -------
    dq : ndarray, shape (B, H, Lq, D)
    dk : ndarray, shape (B, Hkv, Lk, D)
    dv : ndarray, shape (B, Hkv, Lk, Dv)
    """
    B, H, Hkv, Lq, Lk, D, Dv = problem.shape
    dtype = problem.dtype.type
    use_blas = numba_cpu.HAVE_BLAS if use_blas is None else bool(use_blas)
    use_blas = use_blas and Dv > 0
    dk = np.zeros((B, Hkv, Lk, D), dtype=dtype)
    dv = np.zeros((B, Hkv, Lk, Dv), dtype=dtype)
    if B * H * Lq * Lk == 0:
        return np.zeros((B, H, Lq, D), dtype=dtype), dk, dv
    if parallel is None:
        parallel = B * H * Lq * Lk * (D + Dv) >= SERIAL_WORK_LIMIT
    chunks = key_chunks(problem, numba.get_num_threads()) if parallel else 1
    dq_parts = np.zeros((chunks, B, H, Lq, D), dtype=dtype)
    # Δ = rowsum(dO ∘ O) per row; rows that see no key are never read (their lse is -inf).
    with np.errstate(invalid="ignore", over="ignore"):
        row_dot = np.einsum("bhid,bhid->bhi", dout, out)  # (B, H, Lq)
    mask, mask_strides, has_mask = _mask_arguments(problem, dtype)
    args = (
        problem.q, problem.k, problem.v, dout, lse, row_dot, mask, mask_strides, has_mask,
        problem.key_lengths_or_full(), problem.causal_offset is not None,
        problem.causal_offset or 0, dtype(problem.scale),
        np.uint64(dropout_threshold(problem.dropout_p)),
        dtype(1.0 / (1.0 - problem.dropout_p)), np.uint64(problem.seed),
        dq_parts, dk, dv, BLOCK_Q, BLOCK_K, True if use_blas else None,
    )
    kernels, user_names = (_backward_parallel, _backward_serial), ()
    if problem.score_mod is not None or problem.mask_mod is not None:
        from . import _numba_mods_backward  # the kernel with the mods compiled in

        kernels, mod_args, user_names = _numba_mods_backward.launch(problem)
        args += mod_args
    blas_guard = single_threaded_blas() if use_blas else nullcontext()
    with launch_guard() if parallel else nullcontext(), blas_guard:
        run_user_code(user_names, kernels[0] if parallel else kernels[1], *args)
    dq = dq_parts[0] if chunks == 1 else dq_parts.sum(axis=0)
    dq *= dtype(problem.scale)
    return dq, dk, dv
