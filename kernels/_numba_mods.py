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

from . import _mods_cache, numba_cpu
from . import _mods_compile as mc
from ._dropout import dropout_threshold
from ._mods_compile import user_names
from ._numba_launch import launch_guard, single_threaded_blas
from ._numba_math import _FASTMATH, _max_key, float_constants
from ._numba_tiles import (
    _adds_to_scores,
    _all_finite,
    _block_state,
    _finish_rows,
    _finite_part,
    _mask_score,
    _mask_tile_count,
    _rescale_add,
    _scores_by_blas,
    _scores_by_loops,
    _softmax_row,
    _values_by_blas,
    _values_by_loops,
)
from ._validate import AttentionProblem
from .numba_cpu import BLOCK_K, _task_block, block_rows, is_small

#: Query rows per task when a mask function is given, unless larger blocks compute no
#: more pairs (see ``mask_block_rows``): a block of 64 rows under a window of W keys
#: reads ~W + 64 keys per row.
MOD_BLOCK_Q = 64
#: Keys per cell: the unit of the tile classification.
CELL_K = 64

EMPTY, PARTIAL, FULL = mc.EMPTY, mc.PARTIAL, mc.FULL


@njit(fastmath=_FASTMATH)
def _classify(b, h, i0, i1, j0, j1, tile_fn, mask_args, causal, causal_offset, mask, mask_b,
              mask_i, mask_j, has_mask, neg_inf):
    """The class of queries [i0, i1) x keys [j0, j1) under every mask of the call."""
    cls = tile_fn(b, h, i0, i1, j0, j1, mask_args)
    if cls == EMPTY:
        return EMPTY
    if causal:
        if j0 > i1 - 1 + causal_offset:
            return EMPTY
        if j1 - 1 > i0 + causal_offset:
            cls = PARTIAL
    if has_mask:
        n_seen = _mask_tile_count(mask, mask_b + i0 * mask_i + j0 * mask_j, mask_i, mask_j,
                                  i1 - i0, j1 - j0, neg_inf)
        if n_seen == 0:
            return EMPTY
        if n_seen < (i1 - i0) * (j1 - j0) or _adds_to_scores(mask):
            cls = PARTIAL
    return cls


@njit
def _visible_work(tile_fn, mask_args, Lq, Lk, block_q, cell_k, causal, causal_offset):
    """Query rows x keys that blocks of ``block_q`` rows compute for batch 0, head 0."""
    work = 0
    for i0 in range(0, Lq, block_q):
        i1 = min(i0 + block_q, Lq)
        key_end = min(Lk, i1 + causal_offset) if causal else Lk
        for j0 in range(0, key_end, cell_k):
            j1 = min(j0 + cell_k, key_end)
            if tile_fn(0, 0, i0, i1, j0, j1, mask_args) != EMPTY:
                work += (i1 - i0) * (j1 - j0)
    return work


def mask_block_rows(problem: AttentionProblem, tile_fn, mask_args, largest: int) -> int:
    """Query rows per task under a mask function: the largest of 64, 128, ... ``largest``
    whose blocks compute at most 10 % more pairs than blocks of 64 (measured on batch 0,
    head 0 with the mask's own tile function; a user function's, which would evaluate
    every pair, is not consulted: 64).  Larger blocks reuse K and V tiles over more rows
    and make larger GEMMs (8 documents: blocks of 512, no extra pair); a window needs small
    ones (each block reads W + block keys per row)."""
    if not problem.mask_mod.analytic:
        return min(MOD_BLOCK_Q, largest)
    _, _, _, Lq, Lk, _, _ = problem.shape
    args = (tile_fn, mask_args, Lq, Lk)
    causal = (problem.causal_offset is not None, problem.causal_offset or 0)
    work = _visible_work_cached if _mods_cache.all_cached(tile_fn) else _visible_work
    base = work(*args, MOD_BLOCK_Q, CELL_K, *causal)
    best = min(MOD_BLOCK_Q, largest)
    block_q = 2 * MOD_BLOCK_Q
    while block_q <= largest:
        if work(*args, block_q, CELL_K, *causal) <= 1.1 * base:
            best = block_q
        block_q *= 2
    return best


@njit(fastmath=_FASTMATH, error_model="numpy")
def _attend_block_mods(q, k, v, mask, mask_strides, has_mask, key_lengths, causal, causal_offset,
                       scale, threshold, keep_scale, seed, out, weights, want_weights,
                       b, h, i0, i1, block_k, cell_k, blas, lse,
                       mask_fn, tile_fn, mask_args, score_fn, score_args):
    """Attention for query rows [i0, i1) of batch b, head h, with the mod functions; also
    writes ``lse[b, h, i]`` as :func:`kernels.numba_cpu._attend_block` does."""
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
            cls = _classify(b, h, i0, i1, j, c1, tile_fn, mask_args, causal, causal_offset,
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
            key_max = _max_key(neg_inf)
            if full:
                n_visible = nk
                for c in range(nk):
                    s_row[c] = score_fn(s_row[c] * scale, b, h, i, j0 + c, score_args)
                    key_max = max(key_max, _max_key(s_row[c]))
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
                    key_max = max(key_max, _max_key(s_row[c]))
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
                    key_max = max(key_max, _max_key(s_row[c]))
            if want_weights:
                for c in range(nk):
                    weights[b, h, i, j0 + c] = s_row[c]
            _softmax_row(s_row, nk, n_visible, key_max, r, rr, row_max, row_sum, row_nan,
                         correction, threshold, keep_scale, seed, b, h, i, j0)
        v_tile = v[b, hk, j0:j1]  # (nk, Dv)
        o = o_buf[:rows]
        # A BLAS product would turn a hidden NaN value into 0 · NaN: a partly hidden tile
        # holding a non-finite value is multiplied with those entries read as 0 (the same
        # product, so the same bits for the rows that see none of them), then the
        # non-finite values are added where p ≠ 0, as the loops (which skip p = 0) add them.
        nonfinite = blas is not None and not full and not _all_finite(v_tile)
        if blas is None:
            _values_by_loops(s, v_tile, o)
        else:
            _values_by_blas(s, _finite_part(v_tile) if nonfinite else v_tile, o)
        if nonfinite:
            for rr in range(rows):
                for c in range(nk):
                    p = s[rr, c]
                    if p != 0:
                        for d in range(o.shape[1]):
                            if not np.isfinite(v_tile[c, d]):
                                o[rr, d] += p * v_tile[c, d]
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
# see kernels._mods_cache); a user function's dispatcher type cannot be found again in a
# new process, so its kernels are the uncached ones above.
_visible_work_cached = njit(cache=True)(_visible_work.py_func)
_attention_mods_parallel_cached = njit(parallel=True, cache=True)(
    _attention_mods_parallel.py_func)
_attention_mods_serial_cached = njit(cache=True)(_attention_mods_serial.py_func)


def mod_arguments(problem: AttentionProblem, target: str = "cpu"):
    """``(mask_fn, tile_fn, mask_args, score_fn, score_args)`` of a problem for ``target``.

    Identities where the call has no mask or score function.
    """
    dtype = problem.dtype
    if problem.mask_mod is None:
        mask_fn, tile_fn = mc.identity_mask(target)
        mask_args = ()
    else:
        mask_fn = problem.mask_mod.element(target)
        tile_fn = problem.mask_mod.tile(target)
        mask_args = problem.mask_mod.args(dtype)
    if problem.score_mod is None:
        score_fn, score_args = mc.identity_score(target), ()
    else:
        score_fn = problem.score_mod.element(target, dtype)
        score_args = problem.score_mod.args(dtype)
    return mask_fn, tile_fn, mask_args, score_fn, score_args


def run(problem: AttentionProblem, *, parallel: bool | None = None,
        use_blas: bool | None = None, return_lse: bool = False):
    """Fused attention with the problem's mod functions; returns ``(out, weights or None)``
    and, with ``return_lse``, the log-sum-exp ``lse`` (B, H, Lq) last.

    Parameters as :func:`kernels.numba_cpu.run`.
    """
    use_blas = numba_cpu.HAVE_BLAS if use_blas is None else bool(use_blas)
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
    from .numba_cpu import _mask_arguments

    mask, mask_strides, has_mask = _mask_arguments(problem, dtype)
    if parallel is None:
        parallel = not is_small(problem)
    block_q = block_rows(problem, numba.get_num_threads()) if parallel else 512
    skipping = problem.mask_mod is not None or problem.causal_offset is not None or has_mask
    mods_args = _mods_cache.cacheable(problem, mod_arguments(problem, "cpu"))
    if problem.mask_mod is not None:
        block_q = mask_block_rows(problem, mods_args[1], mods_args[2], block_q)
    cell_k = CELL_K if skipping else BLOCK_K
    args = (
        problem.q, problem.k, problem.v, mask, mask_strides, has_mask,
        problem.key_lengths_or_full(),
        problem.causal_offset is not None, problem.causal_offset or 0,
        dtype(problem.scale), np.uint64(dropout_threshold(problem.dropout_p)),
        dtype(1.0 / (1.0 - problem.dropout_p)), np.uint64(problem.seed),
        out, weights, problem.return_weights,
        block_q, BLOCK_K, cell_k, True if use_blas else None, lse,
    ) + mods_args
    if _mods_cache.all_cached(mods_args[0], mods_args[1], mods_args[3]):
        kernel = _attention_mods_parallel_cached if parallel else _attention_mods_serial_cached
    else:
        kernel = _attention_mods_parallel if parallel else _attention_mods_serial
    guarded = use_blas and parallel
    with (launch_guard() if parallel else _null()), (single_threaded_blas() if guarded
                                                     else _null()):
        mc.run_user_code(user_names(problem), kernel, *args)
    return result + (lse,) if return_lse else result


def _null():
    from contextlib import nullcontext

    return nullcontext()
