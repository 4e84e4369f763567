"""The ``numba`` backend: fused masked attention on the CPU, parallel over Numba's threads.

One task is a block of ``BLOCK_Q`` query rows of one (batch, head).  A task walks the
keys in tiles of ``BLOCK_K`` and keeps, per row, the running maximum ``m``, the running
sum ``ℓ`` of ``exp(s - m)`` and the unnormalised output ``acc`` (the online softmax).
Per tile it computes

    S = Q_blk · K_tileᵀ              (BLOCK_Q x BLOCK_K, one GEMM)
    S = S · scale + mask              (-inf where hidden), row max m_new
    P = exp(S - m_new)                (a vectorised polynomial exp: ``_numba_math``)
    acc = acc · exp(m_old - m_new) + P · V_tile     (a second GEMM)

and divides by ``ℓ`` at the end.  Working memory is O(BLOCK_Q · (BLOCK_K + Dv)) per
task: no L x L array exists unless ``return_weights`` asks for one.

The two GEMMs go to the BLAS through ``np.dot`` (SciPy's BLAS, as Numba calls it) when
SciPy is installed, single-threaded inside Numba's threads
(``kernels._jit.launch.single_threaded_blas``); without SciPy, to plain Numba loops (correct,
about half as fast).

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

This module holds the kernel and its launch (:func:`run_tiles`); the numeric primitives
are in ``kernels._jit.math``, the tile pieces (masks, products, the row update) in
``kernels.numba_cpu.tiles``, the launch guards in ``kernels._jit.launch``, the block
sizes in ``kernels.numba_cpu.config``.  Which path a call takes (this kernel or the
micro-kernel path) is decided in ``kernels.numba_cpu.choose``.
"""

from __future__ import annotations

from contextlib import nullcontext

import numba
import numpy as np
from numba import njit, prange

from .._dropout import dropout_threshold
from .._jit.launch import BLAS_SINGLE_THREADED_WORK, launch_guard, single_threaded_blas
from .._jit.math import FASTMATH, float_constants, max_key
from .._problem import AttentionProblem
from . import config
from .tiles import (
    _adds_to_scores,
    _all_finite,
    _block_state,
    _finish_rows,
    _mask_score,
    _mask_tile_count,
    _rescale_add,
    _scores_by_blas,
    _scores_by_loops,
    _softmax_row,
    _values_by_blas,
    _values_by_loops,
)

# --- the kernel -----------------------------------------------------------------------------


@njit(cache=True, fastmath=FASTMATH, error_model="numpy")
def _attend_block(q, k, v, mask, mask_strides, has_mask, key_lengths, causal, causal_offset,
                  scale, threshold, keep_scale, seed, out, weights, want_weights,
                  b, h, i0, i1, block_k, diag_k, blas, lse):
    """Attention for query rows [i0, i1) of batch b, head h (the online softmax).

    Also writes ``lse[b, h, i] = m + log ℓ`` (-inf for a row that sees no key)."""
    Dv = v.shape[3]
    n_rows = i1 - i0
    zero, one, neg_inf = float_constants(scale)  # in the input dtype
    (hk, q_blk, key_end, mask_b, mask_i, mask_j, correction, s_buf, o_buf, acc, row_max,
     row_sum, row_nan) = _block_state(q, k, key_lengths, mask_strides, causal, causal_offset,
                                      scale, b, h, i0, i1, max(block_k, diag_k), Dv)

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
            key_max = max_key(neg_inf)
            if tile_mask:
                m0 = mask_b + i * mask_i + j0 * mask_j
                n_visible = 0
                for c in range(hi):
                    x, seen = _mask_score(s_row[c] * scale, mask[m0 + c * mask_j], neg_inf)
                    s_row[c] = x
                    n_visible += seen
                    key_max = max(key_max, max_key(x))
                if n_visible < hi:
                    partial = True
            else:
                n_visible = hi
                for c in range(hi):
                    x = s_row[c] * scale
                    s_row[c] = x
                    key_max = max(key_max, max_key(x))
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


def block_rows(problem: AttentionProblem, threads: int) -> int:
    """Query rows per task: ``config.BLOCK_Q``, halved (not below ``config.MIN_BLOCK_Q``)
    until each of ``threads`` threads has two tasks."""
    B, H, _, Lq, _, _, _ = problem.shape
    block_q = config.BLOCK_Q
    while block_q > config.MIN_BLOCK_Q and B * H * -(-Lq // block_q) < 2 * threads:
        block_q //= 2
    return block_q


def is_small(problem: AttentionProblem) -> bool:
    """True when the problem is too small to be worth Numba's thread pool."""
    return problem.work < config.SERIAL_WORK_LIMIT


def mask_arguments(problem: AttentionProblem, dtype):
    """The flattened mask (bool or additive), its element strides (0 = broadcast) and a flag."""
    mask = problem.mask  # bool (read as bytes) or additive, as the caller gave it
    if mask is None:
        return np.zeros(1, dtype=dtype), np.zeros(4, dtype=np.int64), False
    strides = [0 if n == 1 else s // mask.itemsize for n, s in zip(mask.shape, mask.strides,
                                                                   strict=True)]
    return mask.reshape(-1), np.array(strides, dtype=np.int64), True


def run_tiles(problem: AttentionProblem, *, parallel: bool | None = None,
              use_blas: bool | None = None, return_lse: bool = False):
    """Fused attention on the tile kernel; returns ``(out, weights or None)``.

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
        default: the BLAS where SciPy is installed (``HAVE_BLAS``), unless the micro-kernel
        path is taken.
    """
    use_blas = config.HAVE_BLAS if use_blas is None else bool(use_blas)
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
    mask, mask_strides, has_mask = mask_arguments(problem, dtype)
    if parallel is None:
        parallel = not is_small(problem)
    block_q = block_rows(problem, numba.get_num_threads()) if parallel else config.BLOCK_Q
    args = (
        problem.q, problem.k, problem.v, mask, mask_strides, has_mask,
        problem.key_lengths_or_full(),
        problem.causal_offset is not None, problem.causal_offset or 0,
        dtype(problem.scale), np.uint64(dropout_threshold(problem.dropout_p)),
        dtype(1.0 / (1.0 - problem.dropout_p)), np.uint64(problem.seed),
        out, weights, problem.return_weights,
        block_q, config.BLOCK_K, config.BLOCK_K_DIAGONAL, True if use_blas else None, lse,
    )
    # The serial kernel runs on the calling thread, outside any OpenMP region: there the
    # BLAS may thread as it likes, and below OpenBLAS's own threshold it runs single-
    # threaded anyway (M·N·K <= 262144), so tiny calls skip the guard's cost (~5 us).
    tile = min(block_q, Lq) * min(config.BLOCK_K, Lk) * max(problem.shape[5], Dv)
    guarded = use_blas and (parallel or tile > BLAS_SINGLE_THREADED_WORK)
    blas_guard = single_threaded_blas() if guarded else nullcontext()
    if parallel:
        with launch_guard(), blas_guard:
            _attention_parallel(*args)
    else:
        with blas_guard:
            _attention_serial(*args)
    return result + (lse,) if return_lse else result
