"""The ``cuda`` backend's forward kernel: fused masked attention with numba.cuda.

One CUDA thread owns one query row; a block holds ``launch.BLOCK_Q`` consecutive rows
of one (batch, head) and the 1-D grid covers every (batch, head, query tile),
query tiles of the same head side by side so that they share K and V in L2.
The block walks the keys in tiles of ``BLOCK_K``: its threads copy the K and V
rows of a tile into shared memory together, then each thread scores its row
against the tile and updates its online softmax (running max ``m``, running sum
``ℓ``, rescale by ``exp(m_old - m_new)``), with the unnormalised output row in
a per-thread ``cuda.local.array``.  The semantics are those of the CPU kernel
in :mod:`kernels.numba_cpu`, line for line:

- a key hidden by ``causal``, ``key_lengths`` or the mask is never used: tiles
  past ``key_lengths[b]`` or above the causal diagonal of the whole block are
  not even loaded, and a masked key is skipped before its dot product;
- a NaN score at a visible position makes the whole output row NaN, a row that
  sees no key gets 0;
- dropout uses the stateless hash of :mod:`kernels._dropout` (same keep/drop
  decision as every other backend) with inverted scaling, and the row sum is
  taken before dropout;
- ``return_weights`` writes the raw scores into the weights row and normalises
  them at the end.

Shared memory (dynamic, one buffer of the input dtype, ``BLOCK_K`` keys)::

    [0, BLOCK_K*D)                   K tile, key-major: key kk at kk*D
    [BLOCK_K*D, BLOCK_K*(D+Dv))      V tile, key-major: key kk at BLOCK_K*D + kk*Dv
    [BLOCK_K*(D+Dv), +BLOCK_K*BQ)    scores, row r's score for key kk at kk*BQ + r

Every thread reads the same K/V element at the same time (a broadcast) and its
own column of the score tile (consecutive threads, consecutive words: no bank
conflict).  No warp shuffles are used, so the same kernel runs in Numba's CUDA
simulator (``NUMBA_ENABLE_CUDASIM=1``), where the tests run it with tiny tiles.

Kernels are built per dtype by :func:`kernel_source` so that every constant
has the compute dtype: the float32 kernel contains no float64 instruction
(:func:`compile_ptx_all` and the tests check its PTX).  A float16 or bfloat16 kernel is
the float32 one with its loads of q, k and v widened to float32 and its output stores
rounded to the input dtype (:mod:`kernels.cuda.half`): the shared tiles, scores, weights,
lse and mask are float32.  The same source serves calls with
:mod:`kernels.mods` functions (:mod:`kernels.cuda.mods` compiles it with them; here with
the identities): a tile the mask function hides from every row of the block is not
loaded, and in a partial tile a hidden key is skipped before its dot product.
"""

from __future__ import annotations

import functools

import numba
import numpy as np
from numba import cuda

from .._dtypes import FULL_DTYPES
from ..mods import lowering as mc
from ..mods.cells import EMPTY, FULL
from .device import SIMULATOR, _device, make_compensated_dot, tile_functions
from .half import compute_type, conversions, storage_type

#: Largest head size (D and Dv) the kernel supports: the size of its per-thread arrays.
MAX_HEAD_DIM = 256


def kernel_source(dtype, mask_fn, tile_fn, score_fn):
    """The attention kernel for ``dtype`` with the given :mod:`kernels.mods` device functions
    (element mask, tile classification, score function), as a plain Python function.

    Without mods (:func:`_kernel_source`) they are the identities: every tile FULL (no
    per-element check), the score unchanged.  All constants are created in the compute
    dtype (``dtype``; float32 for half inputs) here, so no literal promotes float32 to
    float64.
    """
    F = compute_type(dtype)
    ZERO = F(0)
    NEG_INF = F(-np.inf)
    widen, narrow = conversions(dtype)
    dot_product = make_compensated_dot(F)  # the scores: see its docstring
    load_tile, accumulate_tile, finish_row = tile_functions(F, widen, narrow)

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
            dot = dot_product(q_row, 0, tiles, kk * D, D)
            score = F(score_fn(dot * scale, b, h, i, j, score_args)) + extra
            tiles[s_off + kk * block_q + t] = score
            if want_weights:
                weights[b, h, i, j] = score
            if score > tile_max:
                tile_max = score
            elif score != score:
                row_nan = True
        return tile_max, row_nan

    def attention_kernel(q, k, v, mask, mask_sb, mask_sh, mask_si, mask_sj, has_mask,
                         key_lengths, causal, causal_offset, scale, threshold, keep_scale, seed,
                         out, weights, want_weights, block_k, lse, mask_args, score_args):
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
                q_row[d] = widen(q[b, h, i, d])
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
            finish_row(acc, out, weights, want_weights, b, h, i, row_max, row_sum, row_nan, lse)

    return attention_kernel


def _kernel_source(dtype):
    """The kernel for ``dtype`` without mods (the identities compiled in)."""
    mask_fn, tile_fn = mc.identity_mask("cuda")
    return kernel_source(dtype, mask_fn, tile_fn, mc.identity_score("cuda"))


def _signature(dtype):
    """The kernel's argument types for ``dtype`` (arrays C-contiguous)."""
    F = compute_type(dtype)
    no_args = numba.types.Tuple(())  # mask_args, score_args: none without mods
    return _base_signature(dtype) + (numba.types.Array(F, 3, "C"), no_args, no_args)


def _base_signature(dtype):
    """The argument types every attention kernel takes, up to ``block_k`` (then come lse,
    mask_args and score_args).  q, k, v and out have the storage type (bfloat16 as its bits:
    :func:`kernels.cuda.half.storage_type`), the other arrays and scalars the compute type."""
    F = compute_type(dtype)
    data4 = numba.types.Array(storage_type(dtype), 4, "C")
    i64, boolean, u64 = numba.types.int64, numba.types.boolean, numba.types.uint64
    return (
        data4, data4, data4,  # q, k, v
        numba.types.Array(F, 1, "C"), i64, i64, i64, i64, boolean,  # mask, strides, has_mask
        numba.types.Array(i64, 1, "C"), boolean, i64,  # key_lengths, causal, causal_offset
        F, u64, F, u64,  # scale, threshold, keep_scale, seed
        data4, numba.types.Array(F, 4, "C"), boolean,  # out, weights, want_weights
        i64,  # block_k
    )


@functools.cache
def _kernel(dtype):
    """The compiled (or, in the simulator, simulated) kernel for ``dtype``."""
    dtype = np.dtype(dtype)
    source = _kernel_source(dtype)
    if SIMULATOR:
        return cuda.jit(source)
    return cuda.jit(_signature(dtype), cache=True)(source)


def compile_ptx_all(cc=(9, 0), dtypes=FULL_DTYPES) -> dict[str, str]:
    """Compile every kernel to PTX for compute capability ``cc``; needs NVVM, not a GPU.

    Parameters
    ----------
    cc : tuple of int, default (9, 0)
    dtypes : sequence of dtype, default float32 and float64
        The input dtypes to compile for (``kernels._dtypes.HALF_DTYPES``: the half ones).

    Returns
    -------
    dict of str to str
        ``{"attention_float32": ptx, "attention_float64": ptx}`` (one per dtype).

    Raises
    ------
    RuntimeError
        In the CUDA simulator, which cannot compile.
    """
    if SIMULATOR:
        raise RuntimeError("compile_ptx_all needs numba-cuda with NUMBA_ENABLE_CUDASIM unset")
    ptx = {}
    for dtype in dtypes:
        name = f"attention_{np.dtype(dtype).name}"
        ptx[name], _ = cuda.compile_ptx(_kernel_source(dtype), _signature(dtype), cc=tuple(cc))
    return ptx

