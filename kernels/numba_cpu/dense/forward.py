"""The ``numba`` backend: fused masked attention on the CPU, parallel over Numba's threads.

One task is a block of ``BLOCK_Q`` query rows of one (batch, head).  A task walks the
keys in tiles of ``BLOCK_K`` and keeps, per row, the running maximum ``m``, the running
sum ``ℓ`` of ``exp(s - m)`` and the unnormalised output ``acc`` (the online softmax).
Per tile it computes

    S = Q_blk · K_tileᵀ              (BLOCK_Q x BLOCK_K, one GEMM)
    S = S · scale + mask              (-inf where hidden), row max m_new
    P = exp(S - m_new)                (a vectorised polynomial exp: ``kernels._jit.math``)
    acc = acc · exp(m_old - m_new) + P · V_tile     (a second GEMM)

and divides by ``ℓ`` at the end.  Working memory is O(BLOCK_Q · (BLOCK_K + Dv)) per
task: no L x L array exists unless ``return_weights`` asks for one.

The two GEMMs go to SciPy's BLAS through ``np.dot`` (as Numba calls it) when SciPy is
installed, single-threaded inside Numba's threads (``kernels._jit.launch.single_threaded_blas``);
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

This module holds the kernel and its launch (:func:`run_tiles`); the numeric primitives
are in ``kernels._jit.math``, the tile pieces (masks, products, the row update) in
``kernels.numba_cpu.dense.tiles``, the launch guards in ``kernels._jit.launch``, the block
sizes in ``kernels.numba_cpu.config``.  Which path a call takes (this kernel or the
micro-kernel path) is decided in ``kernels.numba_cpu.choose``.
"""

from __future__ import annotations

from contextlib import nullcontext

import numba
import numpy as np
from numba import njit, prange

from ..._dropout import dropout_threshold
from ..._dtypes import bits_dtype, bits_view, compute_dtype, rounded_to
from ..._jit.half import half_scratch, widen_tile
from ..._jit.launch import BLAS_SINGLE_THREADED_WORK, launch_guard, single_threaded_blas
from ..._jit.math import FASTMATH, float_constants, max_key
from ..._jit.twins import uncached_twin
from ..._problems.dense import AttentionProblem
from ...mods import cache as mods_cache
from ...mods.dense import run_user_code
from ...mods.lowering import mod_arguments, user_names
from .. import config
from .mods import cell_run, mask_block_rows
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
    _values_by_blas_finite,
    _values_by_loops,
)

# --- the kernel -----------------------------------------------------------------------------


@njit(cache=True, fastmath=FASTMATH, error_model="numpy")
def attend_block(q, k, v, mask, mask_strides, has_mask, key_lengths, causal, causal_offset,
                  scale, threshold, keep_scale, seed, out, weights, want_weights,
                  b, seq, h, i0, i1, block_k, narrow_k, blas, lse,
                  mask_fn, tile_fn, mask_args, score_fn, score_args):
    """Attention for query rows [i0, i1) of batch b, head h (the online softmax); the
    mods and the dropout see batch ``seq`` (``b``, or a packed sequence's own index).

    Also writes ``lse[b, h, i] = m + log ℓ`` (-inf for a row that sees no key).

    ``mask_fn, tile_fn, mask_args``: None, or a ``mask_mod``'s compiled element and tile
    functions and bound data; ``score_fn, score_args``: None, or a ``score_mod``'s.  Numba
    prunes the branches of ``... is None`` before typing, so the kernel for a call without
    mods has none of their code.  Without a mask function the keys go in tiles of
    ``block_k`` (``narrow_k`` where a tile crosses the causal diagonal); with one, in runs
    of non-empty cells of ``narrow_k`` keys (``mods.classify``), at most ``block_k``.
    """
    Dv = v.shape[3]
    n_rows = i1 - i0
    _, _, neg_inf = float_constants(scale)  # in the input dtype
    (hk, q_blk, key_end, mask_b, mask_i, mask_j, correction, s_buf, o_buf, acc, row_max,
     row_sum, row_nan) = _block_state(q, k, key_lengths, mask_strides, causal, causal_offset,
                                      scale, b, h, i0, i1, max(block_k, narrow_k), Dv)
    k_scratch = half_scratch(k, max(block_k, narrow_k) * k.shape[3])  # half: float32 tiles
    v_scratch = half_scratch(v, max(block_k, narrow_k) * Dv)  # of K and V (no copy of K, V)

    j = 0
    while j < key_end:  # key tiles [j0, j1)
        j0 = j
        r_lo = 0  # rows [0, r_lo) see no key of the tile: left out of both products
        tile_mask = has_mask  # some entry of the tile is hidden by the dense mask
        full = False  # with a mask function: no pair of the tile is hidden
        if tile_fn is None:
            nk = block_k
            if causal and j0 + block_k - 1 > i0 + causal_offset:
                # The tile crosses the diagonal: narrower tiles waste less of the triangle.
                nk = narrow_k
                r_lo = max(j0 - causal_offset - i0, 0)
            j1 = min(j0 + nk, key_end)
            j = j1
            nk = j1 - j0
            rows = n_rows - r_lo
            if has_mask:
                n_seen = _mask_tile_count(mask, mask_b + (i0 + r_lo) * mask_i + j0 * mask_j,
                                          mask_i, mask_j, rows, nk, neg_inf)
                if n_seen == 0:  # the mask hides the whole tile: skip it
                    continue
                tile_mask = n_seen < rows * nk or _adds_to_scores(mask)
            # Some (row, key) pair of the tile is hidden: causal cuts it, or the mask does.
            partial = causal and j1 - 1 > i0 + r_lo + causal_offset
        else:
            # The next tile: a run of non-empty cells, at most block_k keys.
            j0, j1, full = cell_run(j, key_end, block_k, narrow_k, seq, h, i0, i1, tile_fn,
                                    mask_args, causal, causal_offset, mask, mask_b, mask_i,
                                    mask_j, has_mask, neg_inf)
            j = j1
            nk = j1 - j0
            if nk <= 0:
                continue
            if causal:
                r_lo = min(max(j0 - causal_offset - i0, 0), n_rows)
            rows = n_rows - r_lo
            if rows == 0:
                continue
            partial = not full
            tile_mask = has_mask and not full
        s = s_buf[:rows * nk].reshape((rows, nk))
        k_tile = widen_tile(k[b, hk, j0:j1], k_scratch)  # (nk, D)
        if blas is None:
            _scores_by_loops(q_blk[r_lo:], k_tile, s)  # (rows, nk)
        else:
            _scores_by_blas(q_blk[r_lo:], k_tile, s)
        for rr in range(rows):
            r = r_lo + rr
            i = i0 + r
            s_row = s[rr]
            hi = nk  # keys [j0, j0 + hi) may be visible to this row
            if causal:
                hi = max(min(nk, i + causal_offset + 1 - j0), 0)
            key_max = max_key(neg_inf)
            m0 = mask_b + i * mask_i + j0 * mask_j
            if (mask_fn is None or full) and not tile_mask:  # no pair of the row hidden
                n_visible = hi
                for c in range(hi):
                    x = s_row[c] * scale
                    if score_fn is not None:
                        x = score_fn(x, seq, h, i, j0 + c, score_args)
                    s_row[c] = x
                    key_max = max(key_max, max_key(x))
            elif mask_fn is not None and not has_mask:  # branch-free: LLVM vectorises them
                last = i + causal_offset if causal else j1  # keys <= last pass causal
                for c in range(nk):
                    x = s_row[c] * scale
                    if score_fn is not None:
                        x = score_fn(x, seq, h, i, j0 + c, score_args)
                    s_row[c] = x
                n_visible = 0
                for c in range(nk):
                    seen = mask_fn(seq, h, i, j0 + c, mask_args) & (j0 + c <= last)
                    s_row[c] = s_row[c] if seen else neg_inf
                    n_visible += seen
                    key_max = max(key_max, max_key(s_row[c]))
            else:  # the dense mask, and the mask function where the tile is not FULL
                n_visible = 0
                for c in range(hi):
                    seen = True
                    if mask_fn is not None and not full:
                        seen = mask_fn(seq, h, i, j0 + c, mask_args)
                    x = neg_inf
                    if seen:
                        x = s_row[c] * scale
                        if score_fn is not None:
                            x = score_fn(x, seq, h, i, j0 + c, score_args)
                        x, seen = _mask_score(x, mask[m0 + c * mask_j], neg_inf)
                    s_row[c] = x
                    n_visible += seen
                    key_max = max(key_max, max_key(x))
                partial = partial or n_visible < hi
            for c in range(hi, nk):
                s_row[c] = neg_inf
            if want_weights:
                for c in range(nk):
                    weights[b, h, i, j0 + c] = s_row[c]
            _softmax_row(s_row, hi, n_visible, key_max, r, rr, row_max, row_sum, row_nan,
                         correction, threshold, keep_scale, seed, seq, h, i, j0)
        v_tile = widen_tile(v[b, hk, j0:j1], v_scratch)  # (nk, Dv)
        o = o_buf[:rows]  # (rows, Dv); hidden pairs have p = 0
        # The loops skip p = 0 and never read a hidden value.  A BLAS product would turn a
        # hidden inf or NaN into 0 · inf: a partly hidden tile holding one goes through
        # _values_by_blas_finite, which gives the rows that do not see it the same bits.
        if blas is None:
            _values_by_loops(s, v_tile, o)
        elif not partial or _all_finite(v_tile):
            _values_by_blas(s, v_tile, o)
        else:
            _values_by_blas_finite(s, v_tile, o, i0 + r_lo, j0, causal, causal_offset, tile_mask,
                                   mask, mask_b, mask_i, mask_j, neg_inf, full, mask_fn,
                                   mask_args, seq, h)
        _rescale_add(acc, o, correction, r_lo)

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
                        block_q, block_k, narrow_k, blas, lse,
                        mask_fn, tile_fn, mask_args, score_fn, score_args):
    B, H, Lq = q.shape[0], q.shape[1], q.shape[2]
    n_blocks = (Lq + block_q - 1) // block_q
    for task in prange(B * H * n_blocks):  # (batch, head, query block)
        bh, block = _task_block(task, n_blocks)
        i0, b = block * block_q, bh // H
        attend_block(q, k, v, mask, mask_strides, has_mask, key_lengths, causal, causal_offset,
                      scale, threshold, keep_scale, seed, out, weights, want_weights,
                      b, b, bh % H, i0, min(i0 + block_q, Lq), block_k, narrow_k, blas, lse,
                      mask_fn, tile_fn, mask_args, score_fn, score_args)


@njit(cache=True)
def _attention_serial(q, k, v, mask, mask_strides, has_mask, key_lengths, causal, causal_offset,
                      scale, threshold, keep_scale, seed, out, weights, want_weights,
                      block_q, block_k, narrow_k, blas, lse,
                      mask_fn, tile_fn, mask_args, score_fn, score_args):
    B, H, Lq = q.shape[0], q.shape[1], q.shape[2]
    for b in range(B):
        for h in range(H):
            for i0 in range(0, Lq, block_q):
                attend_block(q, k, v, mask, mask_strides, has_mask, key_lengths, causal,
                              causal_offset, scale, threshold, keep_scale, seed, out,
                              weights, want_weights, b, b, h, i0, min(i0 + block_q, Lq),
                              block_k, narrow_k, blas, lse, mask_fn, tile_fn, mask_args,
                              score_fn, score_args)


# For calls with a user's function: the same kernels, not cached on disk (kernels._jit.twins).
_attention_parallel_user = uncached_twin(_attention_parallel, attend_block)
_attention_serial_user = uncached_twin(_attention_serial, attend_block)


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


def mask_arguments(problem: AttentionProblem):
    """The flattened mask (bool or additive), its element strides (0 = broadcast) and a flag.

    The mask is passed read-only, always: Numba types a read-only array (a caller's, or the
    ``broadcast_to`` view of a mask varying along the batch) apart from a writable one, and
    would compile each kernel once per kind.  Without a mask the placeholder is a bool
    array, so such a call runs the kernel of a bool mask (the flag is read at run time).
    """
    mask = problem.mask  # bool (read as bytes) or additive, as the caller gave it
    if mask is None:
        mask, strides, has_mask = np.zeros(1, dtype=np.bool_), [0] * 4, False
    else:
        strides = [0 if n == 1 else s // mask.itemsize
                   for n, s in zip(mask.shape, mask.strides, strict=True)]
        mask, has_mask = mask.reshape(-1).view(), True
    mask.flags.writeable = False  # a view (or our placeholder): the caller's array is as it was
    return mask, np.array(strides, dtype=np.int64), has_mask


def mod_functions(problem: AttentionProblem) -> tuple:
    """``(mask_fn, tile_fn, mask_args, score_fn, score_args)`` for the kernel: None for the
    mods the call does not have; built-ins as :class:`kernels.mods.cache.CachedFn`."""
    if problem.mask_mod is None and problem.score_mod is None:
        return (None,) * 5
    mask_fn, tile_fn, mask_args, score_fn, score_args = mods_cache.cacheable(
        problem, mod_arguments(problem, "cpu"))
    if problem.mask_mod is None:
        mask_fn = tile_fn = mask_args = None
    if problem.score_mod is None:
        score_fn = score_args = None
    return mask_fn, tile_fn, mask_args, score_fn, score_args


def run_tiles(problem: AttentionProblem, *, parallel: bool | None = None,
              use_blas: bool | None = None, return_lse: bool = False):
    """Fused attention on the tile kernel; returns ``(out, weights or None)``.

    With ``return_lse``, ``(out, weights or None, lse)``: lse (B, H, Lq), the log-sum-exp of
    each row's visible scores (``-inf`` for a row that sees no key).

    Parameters
    ----------
    problem : AttentionProblem
        With or without a ``score_mod`` and ``mask_mod`` (compiled into the kernel).
    parallel : bool, optional
        Force the parallel (True) or serial (False) kernel; default: serial for small
        problems (see ``config.SERIAL_WORK_LIMIT``), parallel otherwise.
    use_blas : bool, optional
        Compute the tile products with the BLAS (True) or with Numba loops (False);
        default: the BLAS where SciPy is installed (``config.HAVE_BLAS``).
    """
    use_blas = config.HAVE_BLAS if use_blas is None else bool(use_blas)
    B, H, _, Lq, Lk, _, Dv = problem.shape
    dtype = compute_dtype(problem.dtype).type  # float32 for half inputs
    if problem.return_weights:
        weights = np.full((B, H, Lq, Lk), -np.inf, dtype=dtype)
    else:
        weights = np.empty((1, 1, 1, 1), dtype=dtype)  # unused; keeps one signature
    out_bits = np.empty((B, H, Lq, Dv), dtype=bits_dtype(problem.dtype))  # half: its bits
    out = out_bits.view(problem.dtype)
    lse = np.empty((B, H, Lq), dtype=dtype)  # written by every row: an O(Lq) extra
    result = (out, rounded_to(weights, problem.dtype) if problem.return_weights else None)
    if B * H * Lq == 0:
        return result + (lse,) if return_lse else result
    mask, mask_strides, has_mask = mask_arguments(problem)
    if parallel is None:
        parallel = not is_small(problem)
    block_q = block_rows(problem, numba.get_num_threads()) if parallel else config.BLOCK_Q
    mods = mod_functions(problem)
    narrow_k = config.BLOCK_K_DIAGONAL
    if problem.mask_mod is not None:  # cells of CELL_K keys, blocks by the pairs they compute
        block_q = mask_block_rows(problem, mods[1], mods[2], block_q)
        narrow_k = config.CELL_K
    args = (
        bits_view(problem.q), bits_view(problem.k), bits_view(problem.v), mask, mask_strides,
        has_mask, problem.key_lengths_or_full(),
        problem.causal_offset is not None, problem.causal_offset or 0,
        dtype(problem.scale), np.uint64(dropout_threshold(problem.dropout_p)),
        dtype(1.0 / (1.0 - problem.dropout_p)), np.uint64(problem.seed),
        out_bits, weights, problem.return_weights,
        block_q, config.BLOCK_K, narrow_k, True if use_blas else None, lse,
    ) + mods
    if all(f is None or mods_cache.all_cached(f) for f in (mods[0], mods[1], mods[3])):
        kernel = _attention_parallel if parallel else _attention_serial
    else:  # a user function
        kernel = _attention_parallel_user if parallel else _attention_serial_user
    # The serial kernel runs on the calling thread, outside any OpenMP region: there the
    # BLAS may thread as it likes, and below OpenBLAS's own threshold it runs single-
    # threaded anyway (M·N·K <= 262144), so tiny calls skip the thread guard's cost.
    # A serial call with mods leaves the BLAS as it is: the BLAS on more threads rounds a
    # product otherwise, and a kernel's results must not depend on its launch.
    tile = min(block_q, Lq) * min(config.BLOCK_K, Lk) * max(problem.shape[5], Dv)
    big = tile > BLAS_SINGLE_THREADED_WORK and mods[0] is None and mods[3] is None
    guarded = use_blas and (parallel or big)
    with launch_guard() if parallel else nullcontext(), (
            single_threaded_blas() if guarded else nullcontext()):
        run_user_code(user_names(problem), kernel, *args)
    if problem.return_weights:  # half weights: rounded from float32
        result = (out, rounded_to(weights, problem.dtype))
    return result + (lse,) if return_lse else result
