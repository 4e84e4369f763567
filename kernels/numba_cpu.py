"""The ``numba`` backend: fused masked attention on the CPU, parallel over Numba's threads.

One task is a block of ``BLOCK_Q`` query rows of one (batch, head).  A task walks
the keys in tiles of ``BLOCK_K`` and keeps, per row, the running maximum ``m``,
the running sum ``ℓ`` of ``exp(s - m)`` and the unnormalised output ``acc``
(the online softmax); when a tile raises a row's maximum, ``ℓ`` and ``acc`` are
rescaled by ``exp(m_old - m_new)``.  Working memory is O(BLOCK_Q · Dv) per task:
no L x L array exists unless ``return_weights`` asks for one.

Keys a row cannot see are never read: tiles past ``key_lengths[b]`` or above
the causal diagonal are skipped whole, and a key hidden by the mask (an additive
``-inf``) is skipped before its dot product is computed.  The reference in
:mod:`kernels.reference` computes the same thing literally, for comparison.
"""

from __future__ import annotations

import math
import threading
from contextlib import nullcontext

import numba
import numpy as np
from numba import njit, prange

from ._dropout import build_dropout_bits, dropout_threshold
from ._validate import AttentionProblem

#: Query rows per parallel task.
BLOCK_Q = 32
#: Keys per tile of the online softmax.
BLOCK_K = 128
#: Problems with fewer multiply-adds than this (B·H·Lq·Lk·(D+Dv)) run on the calling
#: thread: starting the thread pool costs more than it saves.
SERIAL_WORK_LIMIT = 1 << 18

# fastmath without 'nnan'/'ninf': those flags let LLVM delete the -inf comparisons the
# masking relies on.  'reassoc' lets the dot products vectorise.
_FASTMATH = {"nsz", "arcp", "contract", "reassoc"}

_dropout_bits = build_dropout_bits(njit(cache=True))


@njit(cache=True, fastmath=_FASTMATH, error_model="numpy")
def _attend_block(q, k, v, mask, mask_strides, has_mask, key_lengths, causal, causal_offset,
                  scale, neg_inf, threshold, keep_scale, seed, out, weights, want_weights,
                  b, h, i0, i1, block_k):
    """Attention for query rows [i0, i1) of batch b, head h (the online softmax)."""
    group = q.shape[1] // k.shape[1]
    hk = h // group
    D = q.shape[3]
    Dv = v.shape[3]
    Lk = k.shape[2]
    n_rows = i1 - i0
    zero = scale - scale  # 0 in the input dtype (a float literal would be float64)
    acc = np.zeros((n_rows, Dv), dtype=q.dtype)  # unnormalised output rows
    row_max = np.full(n_rows, neg_inf)  # running max m
    row_sum = np.zeros(n_rows, dtype=q.dtype)  # running sum ℓ
    row_nan = np.zeros(n_rows, dtype=np.bool_)  # a visible score was NaN
    s = np.empty(block_k, dtype=q.dtype)  # one row's scores in the current key tile

    key_end = key_lengths[b]
    if causal:
        key_end = min(key_end, i1 + causal_offset)  # last row sees keys < i1 - 1 + offset + 1
    mask_bh = b * mask_strides[0] + h * mask_strides[1]

    for j0 in range(0, max(key_end, 0), block_k):
        j1 = min(j0 + block_k, key_end)
        for r in range(n_rows):
            i = i0 + r
            hi = j1
            if causal:
                hi = min(hi, i + causal_offset + 1)
            if hi <= j0:
                continue
            q_row = q[b, h, i]
            mask_row = mask_bh + i * mask_strides[2]
            tile_max = neg_inf
            for j in range(j0, hi):
                score = zero
                if has_mask:
                    score = mask[mask_row + j * mask_strides[3]]
                    if score == neg_inf:  # hidden: k[j] and v[j] are not read
                        s[j - j0] = neg_inf
                        continue
                k_row = k[b, hk, j]
                dot = zero
                for d in range(D):
                    dot += q_row[d] * k_row[d]
                score += dot * scale
                s[j - j0] = score
                if want_weights:
                    weights[b, h, i, j] = score
                if score > tile_max:
                    tile_max = score
                elif score != score:
                    row_nan[r] = True
            if tile_max == neg_inf:
                continue
            m_new = row_max[r]
            if tile_max > m_new:  # rescale what was accumulated under the old max
                correction = math.exp(m_new - tile_max)
                row_sum[r] *= correction
                for d in range(Dv):
                    acc[r, d] *= correction
                m_new = tile_max
                row_max[r] = m_new
            acc_row = acc[r]
            for j in range(j0, hi):
                score = s[j - j0]
                if score == neg_inf:
                    continue
                p = math.exp(score - m_new)
                row_sum[r] += p
                if threshold > 0:
                    if _dropout_bits(seed, b, h, i, j) < threshold:
                        continue
                    p *= keep_scale
                v_row = v[b, hk, j]
                for d in range(Dv):
                    acc_row[d] += p * v_row[d]

    for r in range(n_rows):
        i = i0 + r
        nan_row = row_nan[r]
        inv_sum = zero
        if row_sum[r] > zero:
            inv_sum = (zero + 1) / row_sum[r]
        for d in range(Dv):
            out[b, h, i, d] = acc[r, d] * inv_sum if not nan_row else zero / zero
        if want_weights:
            for j in range(Lk):
                score = weights[b, h, i, j]
                if nan_row:
                    weights[b, h, i, j] = zero / zero
                elif score == neg_inf:
                    weights[b, h, i, j] = zero
                else:
                    weights[b, h, i, j] = math.exp(score - row_max[r]) * inv_sum


@njit(parallel=True, cache=True)
def _attention_parallel(q, k, v, mask, mask_strides, has_mask, key_lengths, causal, causal_offset,
                        scale, neg_inf, threshold, keep_scale, seed, out, weights, want_weights,
                        block_q, block_k):
    B, H, Lq = q.shape[0], q.shape[1], q.shape[2]
    n_blocks = (Lq + block_q - 1) // block_q
    for task in prange(B * H * n_blocks):  # (batch, head, query block)
        b = task // (H * n_blocks)
        h = (task // n_blocks) % H
        i0 = (task % n_blocks) * block_q
        _attend_block(q, k, v, mask, mask_strides, has_mask, key_lengths, causal, causal_offset,
                      scale, neg_inf, threshold, keep_scale, seed, out, weights, want_weights,
                      b, h, i0, min(i0 + block_q, Lq), block_k)


@njit(cache=True)
def _attention_serial(q, k, v, mask, mask_strides, has_mask, key_lengths, causal, causal_offset,
                      scale, neg_inf, threshold, keep_scale, seed, out, weights, want_weights,
                      block_q, block_k):
    B, H, Lq = q.shape[0], q.shape[1], q.shape[2]
    for b in range(B):
        for h in range(H):
            for i0 in range(0, Lq, block_q):
                _attend_block(q, k, v, mask, mask_strides, has_mask, key_lengths, causal,
                              causal_offset, scale, neg_inf, threshold, keep_scale, seed, out,
                              weights, want_weights, b, h, i0, min(i0 + block_q, Lq), block_k)


# Numba's 'workqueue' threading layer aborts the process if two Python threads launch
# parallel kernels at once; 'omp' and 'tbb' are thread-safe.  Numba picks tbb > omp >
# workqueue.  Launches are serialised only when the layer in use is workqueue (or not yet
# chosen: the first launch picks it).
_launch_lock = threading.Lock()


def _launch_guard():
    try:
        layer = numba.threading_layer()
    except ValueError:  # no parallel kernel has run yet
        layer = None
    return nullcontext() if layer in ("omp", "tbb") else _launch_lock


def is_small(problem: AttentionProblem) -> bool:
    """True when the problem is too small to be worth Numba's thread pool."""
    B, H, _, Lq, Lk, D, Dv = problem.shape
    return B * H * Lq * Lk * (D + Dv) < SERIAL_WORK_LIMIT


def run(problem: AttentionProblem, *, parallel: bool | None = None):
    """Fused attention for a validated problem; returns ``(out, weights or None)``.

    Parameters
    ----------
    problem : AttentionProblem
    parallel : bool, optional
        Force the parallel (True) or serial (False) kernel; default: serial for small
        problems (see ``SERIAL_WORK_LIMIT``), parallel otherwise.
    """
    B, H, _, Lq, Lk, _, Dv = problem.shape
    dtype = problem.dtype.type
    out = np.empty((B, H, Lq, Dv), dtype=dtype)
    if problem.return_weights:
        weights = np.full((B, H, Lq, Lk), -np.inf, dtype=dtype)
    else:
        weights = np.empty((1, 1, 1, 1), dtype=dtype)  # unused; keeps one signature
    if B * H * Lq == 0:
        return out, (weights if problem.return_weights else None)

    has_mask = problem.mask is not None
    mask = problem.mask.reshape(-1) if has_mask else np.zeros(1, dtype=dtype)
    args = (
        problem.q, problem.k, problem.v,
        mask, np.array(problem.mask_strides(), dtype=np.int64), has_mask,
        problem.key_lengths_or_full(),
        problem.causal_offset is not None, problem.causal_offset or 0,
        dtype(problem.scale), dtype(-np.inf),
        np.uint64(dropout_threshold(problem.dropout_p)),
        dtype(1.0 / (1.0 - problem.dropout_p)), np.uint64(problem.seed),
        out, weights, problem.return_weights,
        BLOCK_Q, BLOCK_K,
    )
    if parallel is None:
        parallel = not is_small(problem)
    if parallel:
        with _launch_guard():
            _attention_parallel(*args)
    else:
        _attention_serial(*args)
    return out, (weights if problem.return_weights else None)
