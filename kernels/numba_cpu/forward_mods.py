"""The ``numba`` backend for calls with a ``score_mod`` or ``mask_mod`` (:mod:`kernels.mods`).

The kernel of :mod:`kernels.numba_cpu` (same online softmax, same tile products, same
vectorised exp and row maximum), with the mod functions compiled in: they are arguments
of the kernel, each Numba function a type of its own, so the kernel is specialised on them
and LLVM inlines them into its loops (no call per element).  Their bound data travel as
one flat tuple; other values of the same dtypes and ranks reuse the compiled kernel.

Block sparsity.  A task (a block of query rows of one (batch, head)) walks the keys in
cells of ``CELL_K`` keys.  Each cell is classified (the mask's tile function, the causal
diagonal, the dense mask's count):

- EMPTY: skipped; its keys and values are never read;
- FULL: no per-element check (the score function alone);
- PARTIAL: every pair is checked (``causal``, ``mask_mod``, ``mask``) and a hidden score
  becomes ``-inf`` before the softmax, so a NaN or inf in a hidden key reaches nothing.
  Without a dense ``mask`` the check is branch-free (the score function is evaluated on
  every pair of the tile, hidden or not, then the hidden ones are replaced), so that
  LLVM vectorises it.

Runs of non-empty cells are merged into tiles of up to ``BLOCK_K`` keys for the two GEMMs.
A partly hidden tile holding a non-finite value is multiplied by loops that skip p = 0,
so a hidden value is never read.  A row that sees nothing gets 0.
"""

from __future__ import annotations

import numba
import numpy as np
from numba import njit, prange

from .._dropout import dropout_threshold
from .._jit.launch import launch_guard, single_threaded_blas
from .._jit.math import FASTMATH, float_constants, max_key
from .._problem import AttentionProblem
from ..mods import cache as mods_cache
from ..mods.cells import EMPTY, FULL
from ..mods.dense import run_user_code
from ..mods.lowering import mod_arguments, user_names
from . import config
from .forward import _task_block, block_rows, is_small, mask_arguments
from .mods import classify, mask_block_rows
from .tiles import (
    _all_finite,
    _block_state,
    _finish_rows,
    _mask_score,
    _rescale_add,
    _scores_by_blas,
    _scores_by_loops,
    _softmax_row,
    _values_by_blas,
    _values_by_loops,
)


@njit(fastmath=FASTMATH, error_model="numpy")
def _attend_block_mods(q, k, v, mask, mask_strides, has_mask, key_lengths, causal, causal_offset,
                       scale, threshold, keep_scale, seed, out, weights, want_weights,
                       b, h, i0, i1, block_k, cell_k, blas, lse,
                       mask_fn, tile_fn, mask_args, score_fn, score_args):
    """Attention for query rows [i0, i1) of batch b, head h, with the mod functions; also
    writes ``lse[b, h, i]`` as :func:`kernels.numba_cpu.forward._attend_block` does."""
    Dv = v.shape[3]
    n_rows = i1 - i0
    zero, _, neg_inf = float_constants(scale)  # in the input dtype
    (hk, q_blk, key_end, mask_b, mask_i, mask_j, correction, s_buf, o_buf, acc, row_max,
     row_sum, row_nan) = _block_state(q, k, key_lengths, mask_strides, causal, causal_offset,
                                      scale, b, h, i0, i1, block_k, Dv)

    j = 0
    while j < key_end:
        # The next tile [j0, j1): a run of non-empty cells, at most block_k keys.
        j0 = j
        full = True
        while j < key_end and j - j0 < block_k:
            c1 = min(j + cell_k, key_end)
            cls = classify(b, h, i0, i1, j, c1, tile_fn, mask_args, causal, causal_offset,
                            mask, mask_b, mask_i, mask_j, has_mask, neg_inf)
            if cls == EMPTY:
                if j == j0:  # skip it: the tile starts after it
                    j0 = c1
                    j = c1
                    continue
                break
            if cls != FULL:
                full = False
            j = c1
        j1 = j
        nk = j1 - j0
        if nk <= 0:
            continue
        r_lo = 0  # rows [0, r_lo) see no key of the tile: left out of both products
        if causal:
            r_lo = min(max(j0 - causal_offset - i0, 0), n_rows)
        rows = n_rows - r_lo
        if rows == 0:
            continue
        s = s_buf[:rows * nk].reshape((rows, nk))
        if blas is None:
            _scores_by_loops(q_blk[r_lo:], k[b, hk, j0:j1], s)  # (rows, nk)
        else:
            _scores_by_blas(q_blk[r_lo:], k[b, hk, j0:j1], s)
        for rr in range(rows):
            r = r_lo + rr
            i = i0 + r
            s_row = s[rr]
            key_max = max_key(neg_inf)
            if full:
                n_visible = nk
                for c in range(nk):
                    s_row[c] = score_fn(s_row[c] * scale, b, h, i, j0 + c, score_args)
                    key_max = max(key_max, max_key(s_row[c]))
            elif not has_mask:  # branch-free loops: LLVM vectorises them
                last = i + causal_offset if causal else j1  # keys <= last pass causal
                for c in range(nk):
                    s_row[c] = score_fn(s_row[c] * scale, b, h, i, j0 + c, score_args)
                n_visible = 0
                for c in range(nk):
                    jj = j0 + c
                    seen = mask_fn(b, h, i, jj, mask_args) & (jj <= last)
                    s_row[c] = s_row[c] if seen else neg_inf
                    n_visible += seen
                    key_max = max(key_max, max_key(s_row[c]))
            else:
                n_visible = 0
                m0 = mask_b + i * mask_i + j0 * mask_j
                for c in range(nk):
                    jj = j0 + c
                    seen = (not causal or jj <= i + causal_offset) and mask_fn(
                        b, h, i, jj, mask_args)
                    if seen:
                        s_row[c] = score_fn(s_row[c] * scale, b, h, i, jj, score_args)
                        if has_mask:
                            s_row[c], seen = _mask_score(s_row[c], mask[m0 + c * mask_j],
                                                         neg_inf)
                    else:
                        s_row[c] = neg_inf
                    n_visible += seen
                    key_max = max(key_max, max_key(s_row[c]))
            if want_weights:
                for c in range(nk):
                    weights[b, h, i, j0 + c] = s_row[c]
            _softmax_row(s_row, nk, n_visible, key_max, r, rr, row_max, row_sum, row_nan,
                         correction, threshold, keep_scale, seed, b, h, i, j0)
        v_tile = v[b, hk, j0:j1]  # (nk, Dv)
        o = o_buf[:rows]
        # A BLAS product would turn a hidden NaN value into 0 · NaN: a partly hidden tile
        # holding a non-finite value goes through the loops, which skip p = 0.
        if blas is None or (not full and not _all_finite(v_tile)):
            _values_by_loops(s, v_tile, o)
        else:
            _values_by_blas(s, v_tile, o)
        _rescale_add(acc, o, correction, r_lo)

    _finish_rows(acc, row_max, row_sum, row_nan, out, weights, want_weights, lse, b, h, i0)


@njit(parallel=True)
def _attention_mods_parallel(q, k, v, mask, mask_strides, has_mask, key_lengths, causal,
                             causal_offset, scale, threshold, keep_scale, seed, out, weights,
                             want_weights, block_q, block_k, cell_k, blas, lse,
                             mask_fn, tile_fn, mask_args, score_fn, score_args):
    B, H, Lq = q.shape[0], q.shape[1], q.shape[2]
    n_blocks = (Lq + block_q - 1) // block_q
    for task in prange(B * H * n_blocks):  # (batch, head, query block)
        bh, block = _task_block(task, n_blocks)
        i0 = block * block_q
        _attend_block_mods(q, k, v, mask, mask_strides, has_mask, key_lengths, causal,
                           causal_offset, scale, threshold, keep_scale, seed, out, weights,
                           want_weights, bh // H, bh % H, i0, min(i0 + block_q, Lq), block_k,
                           cell_k, blas, lse, mask_fn, tile_fn, mask_args, score_fn, score_args)


@njit
def _attention_mods_serial(q, k, v, mask, mask_strides, has_mask, key_lengths, causal,
                           causal_offset, scale, threshold, keep_scale, seed, out, weights,
                           want_weights, block_q, block_k, cell_k, blas, lse,
                           mask_fn, tile_fn, mask_args, score_fn, score_args):
    B, H, Lq = q.shape[0], q.shape[1], q.shape[2]
    for b in range(B):
        for h in range(H):
            for i0 in range(0, Lq, block_q):
                _attend_block_mods(q, k, v, mask, mask_strides, has_mask, key_lengths, causal,
                                   causal_offset, scale, threshold, keep_scale, seed, out,
                                   weights, want_weights, b, h, i0, min(i0 + block_q, Lq),
                                   block_k, cell_k, blas, lse, mask_fn, tile_fn, mask_args,
                                   score_fn, score_args)


# The same functions cached on disk, for mod functions that are all CachedFn (built-ins,
# see kernels.mods.cache); a user function's dispatcher type cannot be found again in a
# new process, so its kernels are the uncached ones above.
_attention_mods_parallel_cached = njit(parallel=True, cache=True)(
    _attention_mods_parallel.py_func)
_attention_mods_serial_cached = njit(cache=True)(_attention_mods_serial.py_func)


def run(problem: AttentionProblem, *, parallel: bool | None = None,
        use_blas: bool | None = None, return_lse: bool = False):
    """Fused attention with the problem's mod functions; returns ``(out, weights or None)``
    and, with ``return_lse``, the log-sum-exp ``lse`` (B, H, Lq) last.

    Parameters as :func:`kernels.numba_cpu.choose.run`.
    """
    use_blas = config.HAVE_BLAS if use_blas is None else bool(use_blas)
    B, H, _, Lq, Lk, _, Dv = problem.shape
    dtype = problem.dtype.type
    if problem.return_weights:
        weights = np.full((B, H, Lq, Lk), -np.inf, dtype=dtype)
    else:
        weights = np.empty((1, 1, 1, 1), dtype=dtype)  # unused; keeps one signature
    out = np.empty((B, H, Lq, Dv), dtype=dtype)
    lse = np.empty((B, H, Lq), dtype=dtype)
    result = (out, weights if problem.return_weights else None)
    if B * H * Lq == 0:
        return result + (lse,) if return_lse else result
    mask, mask_strides, has_mask = mask_arguments(problem, dtype)
    if parallel is None:
        parallel = not is_small(problem)
    block_q = block_rows(problem, numba.get_num_threads()) if parallel else 512
    skipping = problem.mask_mod is not None or problem.causal_offset is not None or has_mask
    mods_args = mods_cache.cacheable(problem, mod_arguments(problem, "cpu"))
    if problem.mask_mod is not None:
        block_q = mask_block_rows(problem, mods_args[1], mods_args[2], block_q)
    cell_k = config.CELL_K if skipping else config.BLOCK_K
    args = (
        problem.q, problem.k, problem.v, mask, mask_strides, has_mask,
        problem.key_lengths_or_full(),
        problem.causal_offset is not None, problem.causal_offset or 0,
        dtype(problem.scale), np.uint64(dropout_threshold(problem.dropout_p)),
        dtype(1.0 / (1.0 - problem.dropout_p)), np.uint64(problem.seed),
        out, weights, problem.return_weights,
        block_q, config.BLOCK_K, cell_k, True if use_blas else None, lse,
    ) + mods_args
    if mods_cache.all_cached(mods_args[0], mods_args[1], mods_args[3]):
        kernel = _attention_mods_parallel_cached if parallel else _attention_mods_serial_cached
    else:
        kernel = _attention_mods_parallel if parallel else _attention_mods_serial
    guarded = use_blas and parallel
    with (launch_guard() if parallel else _null()), (single_threaded_blas() if guarded
                                                     else _null()):
        run_user_code(user_names(problem), kernel, *args)
    return result + (lse,) if return_lse else result


def _null():
    from contextlib import nullcontext

    return nullcontext()
