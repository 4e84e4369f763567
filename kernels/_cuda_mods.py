"""The ``cuda`` backend for calls with a ``score_mod`` or ``mask_mod`` (:mod:`kernels.mods`).

The kernel of :mod:`kernels.cuda_backend` (one thread per query row, K and V tiles in
shared memory, the online softmax per thread), with the mod functions compiled in as CUDA
device functions from the same Python source the CPU kernel compiles with ``numba.njit``
(as the dropout hash is shared).  A kernel is built per dtype and per function structure;
the bound data travel as two flat tuples of kernel arguments.

Block sparsity: before a block loads a key tile, every thread evaluates the mask's tile
function for the block's rows and the tile's keys (the same answer in every thread, so
the block branches uniformly): an EMPTY tile is not loaded at all, a FULL one needs no
per-element check.  In a partial tile a thread skips a hidden key before its dot product.
"""

from __future__ import annotations

import math

import numba
import numpy as np
from numba import cuda

from . import _mods_compile as mc
from ._dropout import dropout_threshold
from ._validate import AttentionProblem
from .cuda_backend import (
    MAX_HEAD_DIM,
    SIMULATOR,
    _base_signature,
    _device,
    _dropout_bits,
    _keys_per_tile,
    _simulator_lock,
    check_supported,
)

EMPTY, PARTIAL, FULL = mc.EMPTY, mc.PARTIAL, mc.FULL


def _kernel_source(dtype, mask_fn, tile_fn, score_fn):
    """The attention kernel for ``dtype`` with the given device functions (not compiled)."""
    F = numba.from_dtype(np.dtype(dtype))
    ZERO = F(0)
    ONE = F(1)
    NEG_INF = F(-np.inf)
    NAN = F(np.nan)
    NO_DROPOUT = np.uint64(0)

    @_device
    def load_tile(tiles, offset, src, b, hk, j0, n_keys, t, block_q):
        width = src.shape[3]
        if width == 0:
            return
        kk = t // width
        d = t % width
        step_keys = block_q // width
        step_d = block_q % width
        for idx in range(t, n_keys * width, block_q):
            tiles[offset + idx] = src[b, hk, j0 + kk, d]
            kk += step_keys
            d += step_d
            if d >= width:
                d -= width
                kk += 1

    @_device
    def score_tile(q_row, tiles, s_off, t, block_q, D, n_keys, j0, mask, mask_row, mask_sj,
                   has_mask, scale, weights, want_weights, b, h, i, row_nan, check_each,
                   mask_args, score_args):
        """Scores of row i against the tile (hidden keys skipped); returns the tile max."""
        tile_max = NEG_INF
        for kk in range(n_keys):
            j = j0 + kk
            if check_each and not mask_fn(b, h, i, j, mask_args):
                tiles[s_off + kk * block_q + t] = NEG_INF  # hidden: k[j], v[j] not used
                continue
            extra = ZERO
            if has_mask:
                extra = mask[mask_row + j * mask_sj]
                if extra == NEG_INF:
                    tiles[s_off + kk * block_q + t] = NEG_INF
                    continue
            dot = ZERO
            k_base = kk * D
            for d in range(D):
                dot += q_row[d] * tiles[k_base + d]
            score = F(score_fn(dot * scale, b, h, i, j, score_args)) + extra
            tiles[s_off + kk * block_q + t] = score
            if want_weights:
                weights[b, h, i, j] = score
            if score > tile_max:
                tile_max = score
            elif score != score:
                row_nan = True
        return tile_max, row_nan

    @_device
    def accumulate_tile(acc, tiles, v_off, s_off, t, block_q, Dv, n_keys, j0, tile_max,
                        row_max, row_sum, threshold, keep_scale, seed, b, h, i):
        if tile_max > row_max:
            correction = F(math.exp(row_max - tile_max))
            row_sum *= correction
            for d in range(Dv):
                acc[d] *= correction
            row_max = tile_max
        for kk in range(n_keys):
            score = tiles[s_off + kk * block_q + t]
            if score == NEG_INF:
                continue
            p = F(math.exp(score - row_max))
            row_sum += p
            if threshold > NO_DROPOUT:
                if _dropout_bits(seed, b, h, i, j0 + kk) < threshold:
                    continue
                p *= keep_scale
            v_base = v_off + kk * Dv
            for d in range(Dv):
                acc[d] += p * tiles[v_base + d]
        return row_max, row_sum

    @_device
    def finish_row(acc, out, weights, want_weights, b, h, i, row_max, row_sum, row_nan):
        inv_sum = ZERO
        if row_sum > ZERO:
            inv_sum = ONE / row_sum
        for d in range(out.shape[3]):
            out[b, h, i, d] = NAN if row_nan else acc[d] * inv_sum
        if want_weights:
            for j in range(weights.shape[3]):
                score = weights[b, h, i, j]
                if row_nan:
                    weights[b, h, i, j] = NAN
                elif score == NEG_INF:
                    weights[b, h, i, j] = ZERO
                else:
                    weights[b, h, i, j] = F(math.exp(score - row_max)) * inv_sum

    def attention_kernel(q, k, v, mask, mask_sb, mask_sh, mask_si, mask_sj, has_mask,
                         key_lengths, causal, causal_offset, scale, threshold, keep_scale, seed,
                         out, weights, want_weights, block_k, mask_args, score_args):
        H, Lq, D = q.shape[1], q.shape[2], q.shape[3]
        Dv = v.shape[3]
        t = cuda.threadIdx.x
        block_q = cuda.blockDim.x
        n_tiles = (Lq + block_q - 1) // block_q
        bh = cuda.blockIdx.x // n_tiles
        b = bh // H
        h = bh % H
        hk = h // (H // k.shape[1])
        i0 = (cuda.blockIdx.x % n_tiles) * block_q
        i_end = min(i0 + block_q, Lq)  # the block's rows are [i0, i_end)
        i = i0 + t
        active = i < Lq

        tiles = cuda.shared.array(0, F)
        v_off = block_k * D
        s_off = block_k * (D + Dv)
        q_row = cuda.local.array(MAX_HEAD_DIM, F)
        acc = cuda.local.array(MAX_HEAD_DIM, F)
        row_max = NEG_INF
        row_sum = ZERO
        row_nan = False
        if active:
            for d in range(D):
                q_row[d] = q[b, h, i, d]
            for d in range(Dv):
                acc[d] = ZERO
            if want_weights:
                for j in range(weights.shape[3]):
                    weights[b, h, i, j] = NEG_INF

        key_end = key_lengths[b]
        row_end = key_end
        if causal:
            key_end = min(key_end, i_end + causal_offset)
            row_end = min(row_end, i + causal_offset + 1)
        mask_row = b * mask_sb + h * mask_sh + i * mask_si

        for j0 in range(0, key_end, block_k):
            n_keys = min(block_k, key_end - j0)
            # The same answer in every thread of the block: it branches as one.
            cls = tile_fn(b, h, i0, i_end, j0, j0 + n_keys, mask_args)
            if cls == EMPTY:
                continue  # never loaded
            cuda.syncthreads()
            load_tile(tiles, 0, k, b, hk, j0, n_keys, t, block_q)
            load_tile(tiles, v_off, v, b, hk, j0, n_keys, t, block_q)
            cuda.syncthreads()
            row_keys = min(row_end - j0, n_keys)
            if active and row_keys > 0:
                tile_max, row_nan = score_tile(
                    q_row, tiles, s_off, t, block_q, D, row_keys, j0, mask, mask_row, mask_sj,
                    has_mask, scale, weights, want_weights, b, h, i, row_nan, cls != FULL,
                    mask_args, score_args)
                if tile_max != NEG_INF:
                    row_max, row_sum = accumulate_tile(
                        acc, tiles, v_off, s_off, t, block_q, Dv, row_keys, j0, tile_max,
                        row_max, row_sum, threshold, keep_scale, seed, b, h, i)

        if active:
            finish_row(acc, out, weights, want_weights, b, h, i, row_max, row_sum, row_nan)

    return attention_kernel


def device_functions(problem: AttentionProblem):
    """``(mask_fn, tile_fn, mask_args, score_fn, score_args)`` as CUDA device functions."""
    from ._numba_mods import mod_arguments

    return mod_arguments(problem, "cuda")


def _kernel(dtype, mask_fn, tile_fn, score_fn):
    def build():
        source = _kernel_source(dtype, mask_fn, tile_fn, score_fn)
        return cuda.jit(source) if SIMULATOR else cuda.jit(cache=False)(source)

    return mc.memo(("cuda_kernel", np.dtype(dtype).name, mask_fn, tile_fn, score_fn), build)


def signature(problem: AttentionProblem) -> tuple:
    """The kernel's argument types for ``problem`` (for :func:`compile_ptx`)."""
    mask_fn, tile_fn, mask_args, score_fn, score_args = device_functions(problem)
    return _base_signature(problem.dtype) + (numba.typeof(mask_args), numba.typeof(score_args))


def compile_ptx(problem: AttentionProblem, cc=(9, 0)) -> str:
    """PTX of the kernel a problem with mods runs; needs NVVM, not a GPU (simulator off)."""
    if SIMULATOR:
        raise RuntimeError("compile_ptx needs numba-cuda with NUMBA_ENABLE_CUDASIM unset")
    mask_fn, tile_fn, _, score_fn, _ = device_functions(problem)
    source = _kernel_source(problem.dtype, mask_fn, tile_fn, score_fn)
    ptx, _ = cuda.compile_ptx(source, signature(problem), cc=tuple(cc))
    return ptx


def run(problem: AttentionProblem, *, block_q: int | None = None, block_k: int | None = None):
    """Attention with the problem's mod functions on the GPU; ``(out, weights or None)``."""
    from . import cuda_backend

    check_supported(problem)
    B, H, _, Lq, Lk, D, Dv = problem.shape
    dtype = problem.dtype
    if B * H * Lq == 0:
        out = np.empty((B, H, Lq, Dv), dtype=dtype)
        weights = np.empty((B, H, Lq, Lk), dtype=dtype)
        return out, (weights if problem.return_weights else None)
    mask_fn, tile_fn, mask_args, score_fn, score_args = device_functions(problem)
    kernel = _kernel(dtype, mask_fn, tile_fn, score_fn)
    block_q = min(block_q or cuda_backend.BLOCK_Q, Lq)
    block_k = _keys_per_tile(block_k or cuda_backend.BLOCK_K, block_q, D, Dv, dtype.itemsize)
    shared_bytes = block_k * (D + Dv + block_q) * dtype.itemsize
    n_blocks = B * H * ((Lq + block_q - 1) // block_q)
    has_mask = problem.mask is not None
    mask = problem.additive_mask().reshape(-1) if has_mask else np.zeros(1, dtype=dtype)
    mask_sb, mask_sh, mask_si, mask_sj = problem.mask_strides()
    ftype = dtype.type
    with _simulator_lock:
        q, k, v = (cuda.to_device(x) for x in (problem.q, problem.k, problem.v))
        out = cuda.device_array((B, H, Lq, Dv), dtype=dtype)
        weights_shape = (B, H, Lq, Lk) if problem.return_weights else (1, 1, 1, 1)
        weights = cuda.device_array(weights_shape, dtype=dtype)
        args = (
            q, k, v, cuda.to_device(mask), mask_sb, mask_sh, mask_si, mask_sj, has_mask,
            cuda.to_device(problem.key_lengths_or_full()),
            problem.causal_offset is not None, problem.causal_offset or 0,
            ftype(problem.scale), np.uint64(dropout_threshold(problem.dropout_p)),
            ftype(1.0 / (1.0 - problem.dropout_p)), np.uint64(problem.seed),
            out, weights, problem.return_weights, block_k,
            tuple(cuda.to_device(a) if isinstance(a, np.ndarray) else a for a in mask_args),
            tuple(cuda.to_device(a) if isinstance(a, np.ndarray) else a for a in score_args),
        )
        from ._numba_mods import user_names

        mc.run_user_code(user_names(problem),
                         lambda: kernel[n_blocks, block_q, 0, shared_bytes](*args))
        return out.copy_to_host(), (weights.copy_to_host() if problem.return_weights else None)
