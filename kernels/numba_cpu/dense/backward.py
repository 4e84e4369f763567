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
the end (C chunks).  C sets the order of dQ's sums, so dQ's bits follow it: with
``deterministic`` C comes from the problem alone (:func:`key_chunks`), not from the
threads.  dK and dV never depend on C.  Five GEMMs per tile, the FLOP count of the formula
(2.5 x the forward); working memory is O(block_q · block_k) per task, no L x L array.  Scale is
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

A call with :mod:`kernels.mods` functions runs the same kernel with the functions passed in
(the tile pieces are in :mod:`kernels.numba_cpu.dense.backward_tiles`, the mod arguments come from
:mod:`kernels.numba_cpu.dense.mods`); without them those arguments are None and Numba
compiles only the branches for None, so the plain kernel has no check of a mod function.
The kernel is cached on disk without mods and with built-ins (given as structure-keyed
:class:`kernels.mods.cache.CachedFn`, found again by the next process); with a user
function it is compiled once per process.
"""

from __future__ import annotations

from contextlib import nullcontext

import numba
import numpy as np
from numba import njit, prange

from ..._dropout import dropout_threshold
from ..._dtypes import bits_dtype, bits_view, compute_dtype, rounded_to
from ..._jit.half import half_scratch, widen_tile
from ..._jit.launch import launch_guard, single_threaded_blas
from ..._jit.math import FASTMATH, float_constants
from ..._problems.dense import AttentionProblem
from ...mods.cells import EMPTY, FULL
from ...mods.dense import run_user_code
from .. import config
from . import mods as cpu_mods
from .backward_tiles import (
    add_tile_gradients,
    key_block_buffers,
    load_rows,
    store_key_block,
    tile_pair_gradients,
    tile_scores,
)
from .forward import mask_arguments
from .mods import classify
from .tiles import _mask_tile_count

# --- the kernel ----------------------------------------------------------------------------


@njit(fastmath=FASTMATH, error_model="numpy")
def key_block(q, k, v, dout, lse, row_dot, mask, mask_strides, has_mask, causal,
               causal_offset, scale, threshold, keep_scale, seed, dq, dk, dv,
               b, seq, hk, j0, j1, block_q, blas,
               mask_fn, tile_fn, mask_args, score_fn, score_args, grad_fn):
    """dK, dV of keys [j0, j1) of (b, hk), and their part of dQ (added into ``dq``); the
    mods and the dropout see batch ``seq`` (``b``, or a packed sequence's own index).

    ``mask_fn, tile_fn, mask_args, score_fn, score_args, grad_fn``: all None, or the call's
    mod functions (:func:`kernels.numba_cpu.dense.mods.mod_functions`); with them a tile is
    classified by every mask (an EMPTY one is not read, a FULL one needs no check per pair)
    and its pairs go through the functions.  Numba prunes the branches of ``mask_fn is
    None`` when ``mask_fn`` is None, so the kernel without mods has none of their code.
    """
    H, Lq = q.shape[1], q.shape[2]
    group = H // k.shape[1]
    nk = j1 - j0
    _, _, neg_inf = float_constants(scale)  # in the input dtype
    k_tile = widen_tile(k[b, hk, j0:j1], half_scratch(k, nk * k.shape[3]))  # (nk, D); half:
    v_tile = widen_tile(v[b, hk, j0:j1], half_scratch(v, nk * v.shape[3]))  # float32 tiles
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
            cls = FULL  # without mods, a tile needs no class
            if mask_fn is None:
                if has_mask and _mask_tile_count(mask, mask_b + i0 * mask_i + j0 * mask_j,
                                                 mask_i, mask_j, rows, nk, neg_inf) == 0:
                    continue  # the mask hides the whole tile
            else:
                cls = classify(seq, h, i0, i1, j0, j1, tile_fn, mask_args, causal, causal_offset,
                                mask, mask_b, mask_i, mask_j, has_mask, neg_inf)
                if cls == EMPTY:
                    continue  # nothing of the tile is visible: nothing of it is read
            q_blk = q_buf[:rows]  # (rows, D)
            do_blk = do_buf[:rows]  # (rows, Dv)
            load_rows(q, dout, lse, b, h, i0, q_blk, do_blk)
            s = s_buf[:rows]  # (rows, nk)
            dp = dp_buf[:rows]
            tile_scores(q_blk, do_blk, k_tile, v_tile, s, dp, blas)
            tile_pair_gradients(s, dp, lse, row_dot, mask, mask_b, mask_i, mask_j, has_mask,
                                causal, causal_offset, scale, threshold, keep_scale, seed,
                                b, seq, h, i0, j0, cls, mask_fn, mask_args, score_fn, score_args,
                                grad_fn)
            add_tile_gradients(s, dp, q_blk, do_blk, k_clean, dq_buf, dk_t, dv_t, dk_acc,
                               dv_acc, dq, b, h, i0, blas)
    store_key_block(dk_acc, dv_acc, dk, dv, b, hk, j0, scale)


@njit
def _key_blocks(q, k, v, dout, lse, row_dot, mask, mask_strides, has_mask, key_lengths, causal,
                causal_offset, scale, threshold, keep_scale, seed, dq, dk, dv,
                b, hk, first, step, block_q, block_k, blas,
                mask_fn, tile_fn, mask_args, score_fn, score_args, grad_fn):
    """Key blocks first, first + step, ... of (b, hk), up to the last key any row sees."""
    key_end = key_lengths[b]
    if causal:
        key_end = min(key_end, q.shape[2] + causal_offset)  # the last row sees keys < this
    n_blocks = (max(key_end, 0) + block_k - 1) // block_k
    for kb in range(first, n_blocks, step):
        j0 = kb * block_k
        key_block(q, k, v, dout, lse, row_dot, mask, mask_strides, has_mask, causal,
                   causal_offset, scale, threshold, keep_scale, seed, dq, dk, dv,
                   b, b, hk, j0, min(j0 + block_k, key_end), block_q, blas,
                   mask_fn, tile_fn, mask_args, score_fn, score_args, grad_fn)


def _backward_parallel(q, k, v, dout, lse, row_dot, mask, mask_strides, has_mask, key_lengths,
                       causal, causal_offset, scale, threshold, keep_scale, seed, dq_parts,
                       dk, dv, block_q, block_k, blas,
                       mask_fn, tile_fn, mask_args, score_fn, score_args, grad_fn):
    B, Hkv = k.shape[0], k.shape[1]
    chunks = dq_parts.shape[0]
    for task in prange(B * Hkv * chunks):  # (batch, kv head, chunk of key blocks)
        bhk = task // chunks
        chunk = task % chunks
        _key_blocks(q, k, v, dout, lse, row_dot, mask, mask_strides, has_mask, key_lengths,
                    causal, causal_offset, scale, threshold, keep_scale, seed, dq_parts[chunk],
                    dk, dv, bhk // Hkv, bhk % Hkv, chunk, chunks, block_q, block_k, blas,
                    mask_fn, tile_fn, mask_args, score_fn, score_args, grad_fn)


def _backward_serial(q, k, v, dout, lse, row_dot, mask, mask_strides, has_mask, key_lengths,
                     causal, causal_offset, scale, threshold, keep_scale, seed, dq_parts,
                     dk, dv, block_q, block_k, blas,
                     mask_fn, tile_fn, mask_args, score_fn, score_args, grad_fn):
    B, Hkv = k.shape[0], k.shape[1]
    for b in range(B):
        for hk in range(Hkv):
            _key_blocks(q, k, v, dout, lse, row_dot, mask, mask_strides, has_mask, key_lengths,
                        causal, causal_offset, scale, threshold, keep_scale, seed, dq_parts[0],
                        dk, dv, b, hk, 0, 1, block_q, block_k, blas,
                        mask_fn, tile_fn, mask_args, score_fn, score_args, grad_fn)


# The entry points, (parallel, serial).  Without mods, or with mod functions that are all
# CachedFn (built-ins: a type named by structure, equal in every process), they are cached
# on disk.  A user function's dispatcher is a type Numba's cache cannot find again in a new
# process (the cache would only grow): with one, the same code is compiled per process.
KERNELS = (njit(parallel=True, cache=True)(_backward_parallel),
           njit(cache=True)(_backward_serial))
KERNELS_WITH_USER_MODS = (njit(parallel=True)(_backward_parallel), njit(_backward_serial))


def key_chunks(problem: AttentionProblem, threads: int) -> int:
    """How many chunks the key blocks of each (batch, kv head) are split into: 1 when there
    are at least two such pairs per thread, else enough for two tasks per thread.

    With ``problem.deterministic`` the aim is ``config.BACKWARD_DETERMINISTIC_TASKS`` tasks
    whatever ``threads`` is: the count, and so the order in which dQ's parts are summed,
    depends only on the problem, and the bits do not change with the thread count."""
    B, _, Hkv, _, Lk, _, _ = problem.shape
    pairs = B * Hkv
    tasks = config.BACKWARD_DETERMINISTIC_TASKS if problem.deterministic else 2 * threads
    if pairs >= tasks:
        return 1
    n_blocks = max(-(-Lk // config.BACKWARD_BLOCK_K), 1)
    return max(1, min(-(-tasks // pairs), n_blocks))


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
        ``config.BACKWARD_SERIAL_WORK_LIMIT``.
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
    dtype = compute_dtype(problem.dtype).type  # float32 for half inputs (given as their bits)
    use_blas = config.HAVE_BLAS if use_blas is None else bool(use_blas)
    use_blas = use_blas and Dv > 0
    dk = np.zeros((B, Hkv, Lk, D), dtype=bits_dtype(problem.dtype))
    dv = np.zeros((B, Hkv, Lk, Dv), dtype=bits_dtype(problem.dtype))
    if B * H * Lq * Lk == 0:
        return (np.zeros((B, H, Lq, D), dtype=problem.dtype), dk.view(problem.dtype),
                dv.view(problem.dtype))
    if parallel is None:
        parallel = problem.work >= config.BACKWARD_SERIAL_WORK_LIMIT
    chunks = key_chunks(problem, numba.get_num_threads()) if parallel else 1
    dq_parts = np.zeros((chunks, B, H, Lq, D), dtype=dtype)
    # Δ = rowsum(dO ∘ O) per row; rows that see no key are never read (their lse is -inf).
    with np.errstate(invalid="ignore", over="ignore"):
        row_dot = np.einsum("bhid,bhid->bhi", dout.astype(dtype, copy=False),
                            out.astype(dtype, copy=False))  # (B, H, Lq)
    mask, mask_strides, has_mask = mask_arguments(problem)
    args = (
        bits_view(problem.q), bits_view(problem.k), bits_view(problem.v), bits_view(dout),
        lse.astype(dtype, copy=False), row_dot, mask, mask_strides, has_mask,
        problem.key_lengths_or_full(), problem.causal_offset is not None,
        problem.causal_offset or 0, dtype(problem.scale),
        np.uint64(dropout_threshold(problem.dropout_p)),
        dtype(1.0 / (1.0 - problem.dropout_p)), np.uint64(problem.seed),
        dq_parts, dk, dv, config.BACKWARD_BLOCK_Q, config.BACKWARD_BLOCK_K,
        True if use_blas else None,
    )
    kernels, mods, user_names = KERNELS, (None,) * 6, ()
    if problem.score_mod is not None or problem.mask_mod is not None:
        mods, user_names = cpu_mods.mod_functions(problem)
        if not cpu_mods.cacheable(mods):
            kernels = KERNELS_WITH_USER_MODS
    blas_guard = single_threaded_blas() if use_blas else nullcontext()
    with launch_guard() if parallel else nullcontext(), blas_guard:
        run_user_code(user_names, kernels[0] if parallel else kernels[1], *args, *mods)
    dq = dq_parts[0] if chunks == 1 else dq_parts.sum(axis=0)
    dq *= dtype(problem.scale)
    return rounded_to(dq, problem.dtype), dk.view(problem.dtype), dv.view(problem.dtype)
