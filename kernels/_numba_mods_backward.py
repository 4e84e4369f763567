"""The ``numba`` backward pass for calls with a ``score_mod`` or ``mask_mod`` (:mod:`kernels.mods`).

The kernel of :mod:`kernels.numba_backward` (a task owns key blocks; per (query block, key
block) tile it recomputes S and dO · Vᵀ, then dS and Pd, then the three products), with
the mod functions compiled in as the forward kernel with mods does
(:mod:`kernels._numba_mods`).  With X = scale · q · k the score the softmax sees is
f(X) (+ the additive mask), so

    P  = exp(f(X) + mask − lse),   dS = P ∘ (dPd ∘ Z · κ − Δ) ∘ f'(X)

where f' is the score function's derivative (its ``grad``).  The tile pieces (buffers,
row loads, the two GEMMs, a pair's gradient, the three products, the store) are the plain
kernel's own functions.

Block sparsity: each (query block, key block) tile is classified by the mask's tile
function, the causal diagonal and the dense mask (:func:`kernels._numba_mods._classify`):
an EMPTY tile is skipped (its queries, keys, values and output gradients are not read), a
FULL one needs no per-element check, a PARTIAL one checks every pair and gives a hidden
pair dS = Pd = 0 (set, not multiplied: what a hidden key holds reaches nothing).
"""

from __future__ import annotations

from numba import njit, prange

from . import _mods_compile as mc
from ._numba_mods import _classify, mod_arguments, user_names
from ._validate import AttentionProblem
from .numba_backward import (
    add_tile_gradients,
    key_block_buffers,
    load_rows,
    pair_gradient,
    store_key_block,
    tile_scores,
)
from .numba_cpu import _FASTMATH, _mask_score, fast_exp, float_constants

EMPTY, FULL = mc.EMPTY, mc.FULL


@njit(fastmath=_FASTMATH, error_model="numpy")
def _key_block_mods(q, k, v, dout, lse, row_dot, mask, mask_strides, has_mask, causal,
                    causal_offset, scale, threshold, keep_scale, seed, dq, dk, dv,
                    b, hk, j0, j1, block_q, blas,
                    mask_fn, tile_fn, mask_args, score_fn, score_args, grad_fn):
    """dK, dV of keys [j0, j1) of (b, hk) and their part of dQ, with the mod functions."""
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
            cls = _classify(b, h, i0, i1, j0, j1, tile_fn, mask_args, causal, causal_offset,
                            mask, mask_b, mask_i, mask_j, has_mask, neg_inf)
            if cls == EMPTY:
                continue  # nothing of the tile is visible: nothing of it is read
            rows = i1 - i0
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
                m0 = mask_b + i * mask_i + j0 * mask_j
                for c in range(nk):
                    jj = j0 + c
                    x = s_row[c] * scale
                    y = score_fn(x, b, h, i, jj, score_args)
                    seen = row_lse != neg_inf  # a row that sees no key takes no part
                    if cls != FULL:
                        seen = seen and (not causal or jj <= i + causal_offset) and mask_fn(
                            b, h, i, jj, mask_args)
                        if has_mask and seen:
                            y, seen = _mask_score(y, mask[m0 + c * mask_j], neg_inf)
                    ds = zero
                    pd = zero
                    if seen:
                        ds, pd = pair_gradient(fast_exp(y - row_lse), dp_row[c], delta,
                                               threshold, keep_scale, seed, b, h, i, jj)
                        ds = ds * grad_fn(x, b, h, i, jj, score_args)
                    s_row[c] = ds
                    dp_row[c] = pd
            add_tile_gradients(s, dp, q_blk, do_blk, k_clean, dq_buf, dk_t, dv_t, dk_acc,
                               dv_acc, dq, b, h, i0, blas)
    store_key_block(dk_acc, dv_acc, dk, dv, b, hk, j0, scale)


@njit
def _key_blocks_mods(q, k, v, dout, lse, row_dot, mask, mask_strides, has_mask, key_lengths,
                     causal, causal_offset, scale, threshold, keep_scale, seed, dq, dk, dv,
                     b, hk, first, step, block_q, block_k, blas,
                     mask_fn, tile_fn, mask_args, score_fn, score_args, grad_fn):
    """Key blocks first, first + step, ... of (b, hk), up to the last key any row sees."""
    key_end = key_lengths[b]
    if causal:
        key_end = min(key_end, q.shape[2] + causal_offset)  # the last row sees keys < this
    n_blocks = (max(key_end, 0) + block_k - 1) // block_k
    for kb in range(first, n_blocks, step):
        j0 = kb * block_k
        _key_block_mods(q, k, v, dout, lse, row_dot, mask, mask_strides, has_mask, causal,
                        causal_offset, scale, threshold, keep_scale, seed, dq, dk, dv,
                        b, hk, j0, min(j0 + block_k, key_end), block_q, blas,
                        mask_fn, tile_fn, mask_args, score_fn, score_args, grad_fn)


@njit(parallel=True)
def _backward_mods_parallel(q, k, v, dout, lse, row_dot, mask, mask_strides, has_mask,
                            key_lengths, causal, causal_offset, scale, threshold, keep_scale,
                            seed, dq_parts, dk, dv, block_q, block_k, blas,
                            mask_fn, tile_fn, mask_args, score_fn, score_args, grad_fn):
    B, Hkv = k.shape[0], k.shape[1]
    chunks = dq_parts.shape[0]
    for task in prange(B * Hkv * chunks):  # (batch, kv head, chunk of key blocks)
        bhk = task // chunks
        chunk = task % chunks
        _key_blocks_mods(q, k, v, dout, lse, row_dot, mask, mask_strides, has_mask,
                         key_lengths, causal, causal_offset, scale, threshold, keep_scale, seed,
                         dq_parts[chunk], dk, dv, bhk // Hkv, bhk % Hkv, chunk, chunks, block_q,
                         block_k, blas, mask_fn, tile_fn, mask_args, score_fn, score_args, grad_fn)


@njit
def _backward_mods_serial(q, k, v, dout, lse, row_dot, mask, mask_strides, has_mask,
                          key_lengths, causal, causal_offset, scale, threshold, keep_scale,
                          seed, dq_parts, dk, dv, block_q, block_k, blas,
                            mask_fn, tile_fn, mask_args, score_fn, score_args, grad_fn):
    B, Hkv = k.shape[0], k.shape[1]
    for b in range(B):
        for hk in range(Hkv):
            _key_blocks_mods(q, k, v, dout, lse, row_dot, mask, mask_strides, has_mask,
                             key_lengths, causal, causal_offset, scale, threshold, keep_scale,
                             seed, dq_parts[0], dk, dv, b, hk, 0, 1, block_q, block_k, blas,
                             mask_fn, tile_fn, mask_args, score_fn, score_args, grad_fn)


def launch(problem: AttentionProblem):
    """``((parallel kernel, serial kernel), mod arguments, user names)`` for
    :func:`kernels.numba_backward.run`: the kernels take the plain kernel's arguments
    followed by the mod arguments ``(mask_fn, tile_fn, mask_args, score_fn, score_args,
    grad_fn)``."""
    mods = mod_arguments(problem, "cpu")
    if problem.score_mod is None:
        grad_fn = mc.identity_score_grad("cpu", problem.dtype)
    else:
        grad_fn = problem.score_mod.grad("cpu", problem.dtype)
    return (_backward_mods_parallel, _backward_mods_serial), mods + (grad_fn,), \
        user_names(problem)
