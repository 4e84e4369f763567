"""The numba decode kernel: few queries against a long (paged) KV cache, memory bound.

One parallel task is (sequence b, key/value head hk, key split s): it streams the keys
and values of split s of sequence b's cache once, through the block table (no gather),
for all ``G = H / Hkv`` query heads of the group and all Lq queries at once (``R = G·Lq``
rows: each K/V row is read once, from memory, and used R times from L1).  Where one head's
keys on one page are a short run (pages of 16 tokens: 8 KiB of float32 at D = 128) and
there are tasks enough, a task takes every key/value head of its split instead, chunk by
chunk and head by head, so that the heads' runs of a page, adjacent in memory, are read
together (:func:`kernels.numba_cpu.decode.plan.heads_per_task`; the arithmetic of each
head is the same either way).  How a step is divided into tasks:
:mod:`kernels.numba_cpu.decode.plan`.  Per chunk of ``CHUNK`` keys, the online softmax:
scores (a dot over D per row and key), the chunk's
row maximum, ``exp`` (the vectorisable polynomial of ``kernels._jit.math``), the rescaled
accumulator ``acc += p · v``.  In the plain loops here both passes take one key (value)
row at a time, for every row of the group while it is in L1: the cache is read in address
order, which the hardware prefetchers follow (a single-thread dot over a cache in memory
reads one row at a time as fast as a plain streaming read, and about a third as fast
taking four rows per pass; software prefetch does not help these loops).
The loops index the cache arrays directly (no row views in the hot loops).  Float32 and
half caches with D and Dv multiples of 16 take the register-blocked products of
:mod:`kernels.numba_cpu.decode.chunks` on fully visible chunks instead, which also
prefetch the rows taken next (faster: docs/guide/decode.md), as bfloat16 pairs for a
bfloat16 cache (:mod:`kernels.numba_cpu.products.pairs`: half the arithmetic); float64
caches, other sizes and the chunks with per-pair tests keep the loops here.

Half precision: float16 and bfloat16 caches arrive as their bits
(:func:`kernels._dtypes.bits_view`) and every load is widened in registers
(:func:`kernels._jit.half.widen`); queries, scores, the softmax, the accumulators and the
split results are float32, the output is rounded once to the input dtype and lse stays
float32.  The cache is never copied.

Each split writes its normalised output and log-sum-exp; a second parallel loop merges
the splits of each row by log-sum-exp, in split order (empty splits skipped), so the result
is the same from call to call for a given number of splits; with ``deterministic`` splits of
a fixed size it depends on neither the thread count nor the batch
(:meth:`kernels._problems.decode.DecodeProblem.split_keys`).  With tasks (b, hk, s), B = 1
with one KV head (MQA) still fills every thread once the keys are split.

What is never read: keys and values at positions ``>= seqlens[b]`` (past the new tokens)
and chunks a mask function's tile test finds empty for every head of the group; a hidden
pair's value is not multiplied (0 · NaN would be NaN).
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit, prange

from ..._dtypes import bits_view, compute_dtype
from ..._jit.half import compute_dtype_of, computes_in_float32, narrow, widen
from ..._jit.launch import launch_guard
from ..._jit.math import FASTMATH, fast_exp, float_constants, from_max_key, max_key
from ..._jit.twins import uncached_twin
from ..._problems.decode import DecodeProblem
from ...mods import cache as mods_cache
from ...mods.cells import EMPTY
from ...mods.dense import run_user_code
from ...mods.lowering import user_names
from ..dense.forward import mod_functions
from ..products.intrinsics import SUM_LANES, ordered_sum
from ..products.pairs import PAIR_BLOCK
from . import plan as decode_plan
from .chunks import (
    NR,
    chunk_scores,
    chunk_values,
    operand_scratch,
    pair_operands,
    round_weights,
)

#: Keys per chunk of the online softmax (the score buffer is R x CHUNK).
CHUNK = 64


@njit(cache=True, inline="always")
def _locate(block_table, b, j0, nk, ps, row_page, row_slot):
    """Page and slot of keys ``j0 .. j0 + nk - 1`` of sequence b (one division per chunk)."""
    page, slot = j0 // ps, j0 % ps
    for jj in range(nk):
        row_page[jj] = block_table[b, page]
        row_slot[jj] = slot
        slot += 1
        if slot == ps:
            page, slot = page + 1, 0


@njit(cache=True, inline="always")
def _row_indices(row_page, row_slot, n, Hkv, hk, ps, rows):
    """``rows[jj]``: the row of key jj < n (page ``row_page[jj]``, slot ``row_slot[jj]``)
    of key/value head hk in the flat cache, ``(page · Hkv + hk) · ps + slot``."""
    for jj in range(n):
        rows[jj] = (row_page[jj] * Hkv + hk) * ps + row_slot[jj]


@njit(cache=True, fastmath=FASTMATH, inline="always")
def _scores_visible(qs, k_cache, hk, row_page, row_slot, nk, scale, scores):
    """``scores[r, jj] = scale · qs[r] · k_jj`` for every row and key of a chunk where
    every pair is visible: one key row at a time, used by every row while it is in L1."""
    R, D = qs.shape
    zero = scale - scale
    for jj in range(nk):
        page, slot = row_page[jj], row_slot[jj]
        for r in range(R):
            dot = zero
            for d in range(D):
                dot += qs[r, d] * widen(k_cache[page, hk, slot, d])
            scores[r, jj] = dot * scale


@njit(cache=True, fastmath=FASTMATH, inline="always")
def _values_visible(scores, v_cache, hk, row_page, row_slot, nk, acc):
    """``acc[r] += Σ_jj scores[r, jj] · v_jj`` over a chunk where every pair is visible,
    one value row at a time."""
    R, Dv = acc.shape
    for jj in range(nk):
        page, slot = row_page[jj], row_slot[jj]
        for r in range(R):
            weight = scores[r, jj]
            for e in range(Dv):
                acc[r, e] += weight * widen(v_cache[page, hk, slot, e])


@njit(cache=True, fastmath=FASTMATH, inline="always")
def _softmax_update(scores, nk, row_max, row_sum, acc, neg_inf):
    """The online softmax over one chunk: scores become ``exp(s - m_new)``, each row's sum
    and accumulator are rescaled by ``exp(m_old - m_new)``."""
    R, Dv = acc.shape
    zero = row_sum[0] - row_sum[0] if R else neg_inf
    for r in range(R):
        m_old = row_max[r]
        key = max_key(m_old)  # the maximum in integers: a loop LLVM vectorises
        for jj in range(nk):
            key = max(key, max_key(scores[r, jj]))
        m_new = from_max_key(key)
        shift = m_new if m_new > neg_inf else zero
        correction = fast_exp(m_old - shift)
        for jj in range(nk):
            scores[r, jj] = fast_exp(scores[r, jj] - shift)
        total = ordered_sum(scores[r], 0, nk, SUM_LANES)  # one order in every kernel
        row_sum[r] = row_sum[r] * correction + total
        row_max[r] = m_new
        for e in range(Dv):
            acc[r, e] *= correction


@njit(cache=True, fastmath=FASTMATH, error_model="numpy")
def _decode_task(q, k_cache, v_cache, kf, vf, block_table, seqlens, q_start, causal, scale,
                 n_splits, split_keys, heads_per_task, part_out, part_lse, task, mask_fn,
                 tile_fn, mask_args, score_fn, score_args):
    """Task ``(b, head group, s)`` of :func:`_decode_splits`: split s of sequence b's keys
    for the query heads of ``heads_per_task`` key/value heads (``kf``, ``vf``: the caches
    flat).  With several heads, each chunk is taken for every head in turn, so that the
    heads' runs of a page, adjacent in memory, are read together; every head's arithmetic
    is the same as alone (the same chunks in the same order), so the result does not depend
    on ``heads_per_task``.  Split s is keys ``s · per ..``: ``per = split_keys`` where it is
    fixed (> 0), else ``ceil(seqlens[b] / n_splits)``."""
    _, H, Lq, D = q.shape
    Hkv, Dv = k_cache.shape[1], v_cache.shape[3]
    ps = k_cache.shape[2]
    G = H // Hkv
    R = G * Lq  # rows of a head: r = g·Lq + i is query i of head hk·G + g
    T = heads_per_task
    ct = compute_dtype_of(q)
    zero, one, neg_inf = float_constants(scale)
    # The register-blocked products for float32 and half caches (half bits widened in
    # registers); float64 caches keep the plain loops (docs/guide/decode.md, A/B).
    products = computes_in_float32(k_cache) and D % NR == 0 and Dv % NR == 0
    # ... as bfloat16 pairs for a bfloat16 cache (kernels.numba_cpu.products.pairs).
    pairs = products and pair_operands(k_cache) and D % PAIR_BLOCK == 0
    groups = Hkv // T
    b = task // (groups * n_splits)
    hk_lo = ((task // n_splits) % groups) * T
    s = task % n_splits
    n = seqlens[b]
    per = split_keys if split_keys > 0 else (n + n_splits - 1) // n_splits
    j_lo = min(s * per, n)
    j_hi = min(j_lo + per, n)
    q_all = np.empty((T, R * D), dtype=ct)  # each head's queries, rows r = g·Lq + i
    q_pairs = operand_scratch(k_cache, T * R * D if pairs else 0).reshape((-1, R * D))
    for t in range(T):
        for r in range(R):
            for d in range(D):
                x = q[b, (hk_lo + t) * G + r // Lq, r % Lq, d]
                q_all[t, r * D + d] = widen(x)
                if pairs:  # the queries' own bfloat16 bits, for the pair products
                    q_pairs[t, r * D + d] = x
    w_pairs = operand_scratch(k_cache, R * CHUNK if pairs else 0)
    acc_all = np.zeros((T, R * Dv), dtype=ct)
    max_all = np.full((T, R), neg_inf, dtype=ct)
    sum_all = np.zeros((T, R), dtype=ct)
    sf = np.empty(R * CHUNK, dtype=ct)
    scores = sf.reshape((R, CHUNK))
    seen = np.empty((R, CHUNK), dtype=np.bool_)
    row_page = np.empty(CHUNK, dtype=np.int64)  # page and slot of each key of a chunk
    row_slot = np.empty(CHUNK, dtype=np.int64)
    next_page = np.empty(CHUNK, dtype=np.int64)  # ... and of the next chunk's keys
    next_slot = np.empty(CHUNK, dtype=np.int64)
    rows = np.empty(CHUNK, dtype=np.int64)  # each key's row in kf (vf): products
    ahead = np.empty(CHUNK, dtype=np.int64)  # the rows taken next (next head or chunk)
    for j0 in range(j_lo, j_hi, CHUNK):
        j1 = min(j0 + CHUNK, j_hi)
        nk = j1 - j0
        _locate(block_table, b, j0, nk, ps, row_page, row_slot)
        n_ahead = min(CHUNK, j_hi - j1)
        _locate(block_table, b, j1, n_ahead, ps, next_page, next_slot)
        for t in range(T):
            hk = hk_lo + t
            qs = q_all[t].reshape((R, D))
            acc = acc_all[t].reshape((R, Dv))
            row_max, row_sum = max_all[t], sum_all[t]
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
            # causal limit): the loops without the per-pair tests.
            if mask_fn is None and (not causal or j1 - 1 <= q_start[b]):
                if products:
                    _row_indices(row_page, row_slot, nk, Hkv, hk, ps, rows)
                    # The rows taken next, prefetched with the products (key rows with the
                    # scores, value rows with the values'): the next head's of this chunk, or
                    # after the last head the first head's of the next chunk.
                    if t + 1 < T:
                        _row_indices(row_page, row_slot, nk, Hkv, hk + 1, ps, ahead)
                        n_next = nk
                    else:
                        _row_indices(next_page, next_slot, n_ahead, Hkv, hk_lo, ps, ahead)
                        n_next = n_ahead
                    if pairs:
                        chunk_scores(q_pairs[t], kf, rows, nk, R, D, scale, sf, CHUNK, ahead,
                                     n_next)
                    else:
                        chunk_scores(q_all[t], kf, rows, nk, R, D, scale, sf, CHUNK, ahead,
                                     n_next)
                else:
                    _scores_visible(qs, k_cache, hk, row_page, row_slot, nk, scale, scores)
                if score_fn is not None:
                    for r in range(R):
                        for jj in range(nk):
                            scores[r, jj] = score_fn(scores[r, jj], b, hk * G + r // Lq,
                                                     q_start[b] + r % Lq, j0 + jj,
                                                     score_args)
                _softmax_update(scores, nk, row_max, row_sum, acc, neg_inf)
                if pairs:
                    round_weights(sf, CHUNK, R, nk, w_pairs)
                    chunk_values(w_pairs, CHUNK, vf, rows, nk, R, Dv, acc_all[t], ahead,
                                 n_next)
                elif products:
                    chunk_values(sf, CHUNK, vf, rows, nk, R, Dv, acc_all[t], ahead, n_next)
                else:
                    _values_visible(scores, v_cache, hk, row_page, row_slot, nk, acc)
            else:
                for jj in range(nk):
                    j = j0 + jj
                    p0, s0 = row_page[jj], row_slot[jj]
                    for r in range(R):
                        pos = q_start[b] + r % Lq
                        vis = j <= pos or not causal
                        if mask_fn is not None:
                            vis = vis and mask_fn(b, hk * G + r // Lq, pos, j, mask_args)
                        seen[r, jj] = vis
                        if vis:
                            dot = zero
                            for d in range(D):
                                dot += qs[r, d] * widen(k_cache[p0, hk, s0, d])
                            score = dot * scale
                            if score_fn is not None:
                                score = score_fn(score, b, hk * G + r // Lq, pos, j,
                                                 score_args)
                            scores[r, jj] = score
                        else:
                            scores[r, jj] = neg_inf
                _softmax_update(scores, nk, row_max, row_sum, acc, neg_inf)
                for jj in range(nk):  # each value row read once for all rows; hidden
                    p0, s0 = row_page[jj], row_slot[jj]  # pairs not multiplied
                    for r in range(R):
                        if seen[r, jj]:
                            p = scores[r, jj]
                            for e in range(Dv):
                                acc[r, e] += p * widen(v_cache[p0, hk, s0, e])
    for t in range(T):
        acc = acc_all[t].reshape((R, Dv))
        row_max, row_sum = max_all[t], sum_all[t]
        for r in range(R):
            h = (hk_lo + t) * G + r // Lq
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


@njit(parallel=True, cache=True)
def _decode_splits(q, k_cache, v_cache, block_table, seqlens, q_start, causal, scale,
                   n_splits, split_keys, heads_per_task, part_out, part_lse, mask_fn, tile_fn,
                   mask_args, score_fn, score_args):
    """part_out[s, b, h, i] (normalised) and part_lse[s, b, h, i] of every split s, in the
    compute dtype (float32 for half bits): a task per (sequence b, group of
    ``heads_per_task`` key/value heads, split s).  The task is a function of its own, not
    inlined: the parallel loop's body stays one call, which keeps Numba's parallel passes
    off the kernel's loops (they made a cold compile of one specialisation take 25 s, 15 s
    so)."""
    B, Hkv = q.shape[0], k_cache.shape[1]
    kf, vf = k_cache.reshape(k_cache.size), v_cache.reshape(v_cache.size)
    for task in prange(B * (Hkv // heads_per_task) * n_splits):
        # int64: the parallel loop's index is unsigned in the function Numba outlines
        # for it, signed where it types the loop (one compile of the task, not two)
        _decode_task(q, k_cache, v_cache, kf, vf, block_table, seqlens, q_start, causal,
                     scale, n_splits, split_keys, heads_per_task, part_out, part_lse,
                     np.int64(task), mask_fn, tile_fn, mask_args, score_fn, score_args)


@njit(parallel=True, cache=True, fastmath=FASTMATH, error_model="numpy")
def _merge_splits(part_out, part_lse, out, lse):
    """out (the input dtype: half bits rounded once) and lse (the compute dtype) of every
    row from its splits (at least one row), by log-sum-exp in split order."""
    S, B, H, Lq, Dv = part_out.shape
    zero, one, neg_inf = float_constants(part_lse[0, 0, 0, 0])
    for row in prange(B * H * Lq):
        b, h, i = row // (H * Lq), (row // Lq) % H, row % Lq
        top = neg_inf
        nan = False
        for s in range(S):
            top = max(top, part_lse[s, b, h, i])
            nan = nan or part_lse[s, b, h, i] != part_lse[s, b, h, i]
        if nan:  # NaN stays NaN
            for e in range(Dv):
                out[b, h, i, e] = narrow(part_out[0, b, h, i, e], out)
            lse[b, h, i] = part_lse[0, b, h, i]
            continue
        if top == neg_inf:  # no key of any split is visible
            for e in range(Dv):
                out[b, h, i, e] = narrow(zero, out)
            lse[b, h, i] = neg_inf
            continue
        weight = np.zeros(S, dtype=part_lse.dtype)
        total = zero
        for s in range(S):
            if part_lse[s, b, h, i] > neg_inf:  # an empty split's output is not read
                weight[s] = fast_exp(part_lse[s, b, h, i] - top)
                total += weight[s]
        inv = one / total
        for e in range(Dv):
            value = zero
            for s in range(S):
                if weight[s] > zero:
                    value += weight[s] * part_out[s, b, h, i, e]
            out[b, h, i, e] = narrow(value * inv, out)
        lse[b, h, i] = top + math.log(total)


# For calls with a user's function: not cached on disk (kernels._jit.twins).
_decode_splits_user = uncached_twin(_decode_splits, _decode_task)


def run(problem: DecodeProblem):
    """``(out (B, H, Lq, Dv) in the input dtype, lse (B, H, Lq) in the compute dtype)`` of a
    decode step (float32 lse for half inputs)."""
    B, H, Hkv, Lq, D, Dv = problem.shape
    ct = compute_dtype(problem.dtype).type  # float32 for half inputs
    n_splits = decode_plan.choose_splits(problem)
    out = np.empty((B, H, Lq, Dv), dtype=problem.dtype)
    lse = np.empty((B, H, Lq), dtype=ct)
    if B * H * Lq == 0:
        return out, lse
    part_out = np.empty((n_splits, B, H, Lq, Dv), dtype=ct)
    part_lse = np.empty((n_splits, B, H, Lq), dtype=ct)
    mods = mod_functions(problem)  # the forward's: it reads only the problem's mods
    kernel = _decode_splits
    if not all(f is None or mods_cache.all_cached(f) for f in (mods[0], mods[1], mods[3])):
        kernel = _decode_splits_user  # a user function: compiled once per process
    with launch_guard():
        run_user_code(user_names(problem), kernel, bits_view(problem.q),
                      bits_view(problem.k_cache), bits_view(problem.v_cache),
                      problem.block_table, problem.seqlens, problem.q_start, problem.causal,
                      ct(problem.scale), n_splits, problem.split_keys(),
                      decode_plan.heads_per_task(problem, n_splits), part_out, part_lse, *mods)
        _merge_splits(part_out, part_lse, bits_view(out), lse)
    return out, lse
