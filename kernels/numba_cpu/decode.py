"""The numba decode kernel: few queries against a long (paged) KV cache, memory bound.

One parallel task is (sequence b, key/value head hk, key split s): it streams the keys
and values of split s of sequence b's cache once, through the block table (no gather),
for all ``G = H / Hkv`` query heads of the group and all Lq queries at once (``R = G·Lq``
rows: each K/V row is read once, from memory, and used R times from L1).  Per chunk of
``CHUNK`` keys, the online softmax: scores (a dot over D per row and key), the chunk's row
maximum, ``exp`` (the vectorisable polynomial of ``kernels._jit.math``), the rescaled
accumulator ``acc += p · v`` (a loop over Dv per row and key).  Everything accumulates in
the input dtype.

Each split writes its normalised output and log-sum-exp; a second parallel loop merges
the splits of each row by log-sum-exp, in split order, so the result is the same from call
to call for a given number of splits.  With tasks (b, hk, s), B = 1 with one KV head
(MQA) still fills every thread once the keys are split.

What is never read: keys and values at positions ``>= seqlens[b]`` (past the new tokens)
and chunks a mask function's tile test finds empty for every head of the group; a hidden
pair's value is not multiplied (0 · NaN would be NaN).
"""

from __future__ import annotations

import math

import numba
import numpy as np
from numba import njit, prange

from .._decode_problem import DecodeProblem
from .._jit.launch import launch_guard
from .._jit.math import FASTMATH, fast_exp, float_constants
from ..mods import cache as mods_cache
from ..mods.cells import EMPTY
from ..mods.dense import run_user_code
from ..mods.lowering import user_names
from .forward import mod_functions

#: Keys per chunk of the online softmax (the score buffer is R x CHUNK).
CHUNK = 64
#: num_splits=0 splits until there are this many tasks per thread ...
TASKS_PER_THREAD = 4
#: ... but keeps at least this many keys per split.
MIN_KEYS_PER_SPLIT = 512


@njit(parallel=True, cache=True, fastmath=FASTMATH, error_model="numpy")
def _decode_splits(q, k_cache, v_cache, block_table, seqlens, q_start, causal, scale,
                   n_splits, part_out, part_lse, mask_fn, tile_fn, mask_args, score_fn,
                   score_args):
    """part_out[s, b, h, i] (normalised) and part_lse[s, b, h, i] of every split s."""
    B, H, Lq, D = q.shape
    Hkv, ps, Dv = k_cache.shape[1], k_cache.shape[2], v_cache.shape[3]
    G = H // Hkv
    R = G * Lq  # rows of a task: r = g·Lq + i is query i of head hk·G + g
    zero, one, neg_inf = float_constants(scale)
    for task in prange(B * Hkv * n_splits):
        b = task // (Hkv * n_splits)
        hk = (task // n_splits) % Hkv
        s = task % n_splits
        n = seqlens[b]
        per = (n + n_splits - 1) // n_splits
        j_lo = min(s * per, n)
        j_hi = min(j_lo + per, n)
        qs = np.empty((R, D), dtype=q.dtype)  # the group's queries, rows r = g·Lq + i
        for r in range(R):
            qs[r] = q[b, hk * G + r // Lq, r % Lq]
        acc = np.zeros((R, Dv), dtype=q.dtype)
        row_max = np.full(R, neg_inf, dtype=q.dtype)
        row_sum = np.zeros(R, dtype=q.dtype)
        scores = np.empty((R, CHUNK), dtype=q.dtype)
        seen = np.empty((R, CHUNK), dtype=np.bool_)
        row_page = np.empty(CHUNK, dtype=np.int64)  # page and slot of each key of a chunk
        row_slot = np.empty(CHUNK, dtype=np.int64)
        for j0 in range(j_lo, j_hi, CHUNK):
            j1 = min(j0 + CHUNK, j_hi)
            if tile_fn is not None:  # skip the chunk if it is empty for every head
                empty = True
                for g in range(G):
                    if tile_fn(b, hk * G + g, q_start[b], q_start[b] + Lq, j0, j1,
                               mask_args) != EMPTY:
                        empty = False
                        break
                if empty:
                    continue
            # Every pair of the chunk visible (no mask function, before the first query's
            # causal limit): the loops without the per-pair tests, four keys per pass.
            full = mask_fn is None and (not causal or j1 - 1 <= q_start[b])
            nk = j1 - j0
            page, slot = j0 // ps, j0 % ps  # then stepped: no division per key
            for jj in range(nk):  # where each key and value row of the chunk lies
                row_page[jj] = block_table[b, page]
                row_slot[jj] = slot
                slot += 1
                if slot == ps:
                    page, slot = page + 1, 0
            if full:
                jj = 0
                while jj < nk:
                    if jj + 4 <= nk:
                        k0 = k_cache[row_page[jj], hk, row_slot[jj]]  # (D,), views
                        k1 = k_cache[row_page[jj + 1], hk, row_slot[jj + 1]]
                        k2 = k_cache[row_page[jj + 2], hk, row_slot[jj + 2]]
                        k3 = k_cache[row_page[jj + 3], hk, row_slot[jj + 3]]
                        for r in range(R):
                            q_row = qs[r]
                            d0, d1, d2, d3 = zero, zero, zero, zero
                            for d in range(D):
                                x = q_row[d]
                                d0 += x * k0[d]
                                d1 += x * k1[d]
                                d2 += x * k2[d]
                                d3 += x * k3[d]
                            scores[r, jj] = d0 * scale
                            scores[r, jj + 1] = d1 * scale
                            scores[r, jj + 2] = d2 * scale
                            scores[r, jj + 3] = d3 * scale
                        jj += 4
                    else:
                        key = k_cache[row_page[jj], hk, row_slot[jj]]
                        for r in range(R):
                            q_row = qs[r]
                            dot = zero
                            for d in range(D):
                                dot += q_row[d] * key[d]
                            scores[r, jj] = dot * scale
                        jj += 1
                if score_fn is not None:
                    for r in range(R):
                        for jj in range(nk):
                            scores[r, jj] = score_fn(scores[r, jj], b, hk * G + r // Lq,
                                                     q_start[b] + r % Lq, j0 + jj, score_args)
            else:
                for jj in range(nk):
                    j = j0 + jj
                    key = k_cache[row_page[jj], hk, row_slot[jj]]  # (D,), a view
                    for r in range(R):
                        pos = q_start[b] + r % Lq
                        vis = j <= pos or not causal
                        if mask_fn is not None:
                            vis = vis and mask_fn(b, hk * G + r // Lq, pos, j, mask_args)
                        seen[r, jj] = vis
                        if vis:
                            q_row = qs[r]
                            dot = zero
                            for d in range(D):
                                dot += q_row[d] * key[d]
                            score = dot * scale
                            if score_fn is not None:
                                score = score_fn(score, b, hk * G + r // Lq, pos, j,
                                                 score_args)
                            scores[r, jj] = score
                        else:
                            scores[r, jj] = neg_inf
            for r in range(R):  # the online softmax's update of row r
                m_old = row_max[r]
                m_new = m_old
                for jj in range(nk):
                    if scores[r, jj] > m_new:
                        m_new = scores[r, jj]
                shift = m_new if m_new > neg_inf else zero
                correction = fast_exp(m_old - shift)
                total = zero
                for jj in range(nk):
                    p = fast_exp(scores[r, jj] - shift)
                    scores[r, jj] = p
                    total += p
                row_sum[r] = row_sum[r] * correction + total
                row_max[r] = m_new
                acc_row = acc[r]
                for e in range(Dv):
                    acc_row[e] *= correction
            if full:  # acc += P · V, four value rows per pass over a row's accumulator
                for r in range(R):
                    acc_row = acc[r]
                    jj = 0
                    while jj < nk:
                        if jj + 4 <= nk:
                            p0, p1 = scores[r, jj], scores[r, jj + 1]
                            p2, p3 = scores[r, jj + 2], scores[r, jj + 3]
                            v0 = v_cache[row_page[jj], hk, row_slot[jj]]  # (Dv,), views
                            v1 = v_cache[row_page[jj + 1], hk, row_slot[jj + 1]]
                            v2 = v_cache[row_page[jj + 2], hk, row_slot[jj + 2]]
                            v3 = v_cache[row_page[jj + 3], hk, row_slot[jj + 3]]
                            for e in range(Dv):
                                acc_row[e] += p0 * v0[e] + p1 * v1[e] + p2 * v2[e] + p3 * v3[e]
                            jj += 4
                        else:
                            p0 = scores[r, jj]
                            v0 = v_cache[row_page[jj], hk, row_slot[jj]]
                            for e in range(Dv):
                                acc_row[e] += p0 * v0[e]
                            jj += 1
            else:  # each value row read once for all rows; hidden pairs not multiplied
                for jj in range(nk):
                    value = v_cache[row_page[jj], hk, row_slot[jj]]  # (Dv,), a view
                    for r in range(R):
                        if seen[r, jj]:
                            p = scores[r, jj]
                            acc_row = acc[r]
                            for e in range(Dv):
                                acc_row[e] += p * value[e]
        for r in range(R):
            h = hk * G + r // Lq
            i = r % Lq
            if row_sum[r] > zero or row_sum[r] != row_sum[r]:  # NaN stays NaN
                inv = one / row_sum[r]
                for e in range(Dv):
                    part_out[s, b, h, i, e] = acc[r, e] * inv
                part_lse[s, b, h, i] = row_max[r] + math.log(row_sum[r])
            else:  # no key of the split is visible
                for e in range(Dv):
                    part_out[s, b, h, i, e] = zero
                part_lse[s, b, h, i] = neg_inf


@njit(parallel=True, cache=True, fastmath=FASTMATH, error_model="numpy")
def _merge_splits(part_out, part_lse, out, lse, like):
    """out, lse of every row from its splits, by log-sum-exp in split order (``like``: a
    scalar of the dtype)."""
    S, B, H, Lq, Dv = part_out.shape
    zero, one, neg_inf = float_constants(like)
    for row in prange(B * H * Lq):
        b, h, i = row // (H * Lq), (row // Lq) % H, row % Lq
        top = neg_inf
        for s in range(S):
            if part_lse[s, b, h, i] > top:
                top = part_lse[s, b, h, i]
        nan = False
        for s in range(S):
            nan = nan or part_lse[s, b, h, i] != part_lse[s, b, h, i]
        if nan or top == neg_inf:
            for e in range(Dv):
                out[b, h, i, e] = part_out[0, b, h, i, e] if nan else zero
            lse[b, h, i] = part_lse[0, b, h, i] if nan else neg_inf
            continue
        total = zero
        for e in range(Dv):
            out[b, h, i, e] = zero
        for s in range(S):
            w = fast_exp(part_lse[s, b, h, i] - top)
            if part_lse[s, b, h, i] > neg_inf:  # an empty split's output is not read
                total += w
                for e in range(Dv):
                    out[b, h, i, e] += w * part_out[s, b, h, i, e]
        inv = one / total
        for e in range(Dv):
            out[b, h, i, e] *= inv
        lse[b, h, i] = top + math.log(total)


_decode_splits_user = njit(parallel=True, fastmath=FASTMATH, error_model="numpy")(
    _decode_splits.py_func)


def choose_splits(problem: DecodeProblem, threads: int | None = None) -> int:
    """Splits per sequence for ``num_splits=0``: enough tasks for every thread
    (``TASKS_PER_THREAD`` each), at least ``MIN_KEYS_PER_SPLIT`` keys per split."""
    if problem.num_splits:
        return problem.num_splits
    B, _, Hkv, _, _, _ = problem.shape
    threads = numba.get_num_threads() if threads is None else threads
    longest = int(problem.seqlens.max(initial=0))
    wanted = -(-TASKS_PER_THREAD * threads // max(B * Hkv, 1))
    return max(1, min(wanted, longest // MIN_KEYS_PER_SPLIT))


def run(problem: DecodeProblem):
    """``(out (B, H, Lq, Dv), lse (B, H, Lq))`` of a decode step, in the input dtype."""
    B, H, Hkv, Lq, D, Dv = problem.shape
    dtype = problem.dtype.type
    n_splits = choose_splits(problem)
    out = np.empty((B, H, Lq, Dv), dtype=dtype)
    lse = np.empty((B, H, Lq), dtype=dtype)
    if B * H * Lq == 0:
        return out, lse
    part_out = np.empty((n_splits, B, H, Lq, Dv), dtype=dtype)
    part_lse = np.empty((n_splits, B, H, Lq), dtype=dtype)
    mods = mod_functions(problem)  # the forward's: it reads only the problem's mods
    kernel = _decode_splits
    if not all(f is None or mods_cache.all_cached(f) for f in (mods[0], mods[1], mods[3])):
        kernel = _decode_splits_user  # a user function: compiled once per process
    with launch_guard():
        run_user_code(user_names(problem), kernel, problem.q, problem.k_cache,
                      problem.v_cache, problem.block_table, problem.seqlens, problem.q_start,
                      problem.causal, dtype(problem.scale), n_splits, part_out, part_lse,
                      *mods)
        _merge_splits(part_out, part_lse, out, lse, dtype(0))
    return out, lse
