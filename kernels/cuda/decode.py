"""The ``cuda`` backend's decode kernel: few queries against a (paged) KV cache.

One block is (sequence b, key/value head hk, key split s), as the numba decode's tasks;
its threads are the ``R = H / Hkv · Lq`` query rows of the group (rounded up to a warp).
Per chunk of keys the block copies K and V through the block table into shared memory
together (each K/V row read from global memory once for all the group's query heads),
then each thread runs its row's online softmax over the chunk.  A second kernel merges
the splits of each row by log-sum-exp in split order (the same bits from call to call;
``deterministic=True`` fixes the split size as the numba backend does, so a sequence's bits
do not depend on the other sequences of the batch).

Scope: no score or mask functions (the API raises before anything is written); the
caches are copied to the device on each call (the host cache, written in place by the
API, stays the one source), so on a GPU this measures copies more than the kernel.
No warp shuffles: the same kernels run in Numba's CUDA simulator.  Constants are created
in the compute dtype (no float64 instruction in the float32 and half kernels:
:func:`compile_ptx_all`).

Half caches (float16, bfloat16) are read in their own precision, as the forward kernel
reads them (:mod:`kernels.cuda.half`): each q, K and V element is widened to float32 as it
is loaded (K and V once, into the shared chunk), the softmax, the split outputs and lse are
float32, and the merged output is rounded once to the half dtype; lse stays float32.
"""

from __future__ import annotations

import functools
import math

import numba
import numpy as np
from numba import cuda

from .._dtypes import FULL_DTYPES, compute_dtype
from .._problems.decode import DecodeProblem
from .device import SIMULATOR
from .half import compute_type, conversions, kernel_view, storage_type, user_view
from .launch import _simulator_lock

#: Largest Dv (the per-thread accumulator) and most rows R per block.
MAX_HEAD_DIM = 256
MAX_ROWS = 1024
#: Shared memory per block for a chunk of K and V rows (bytes).
SHARED_BYTES = 48 * 1024
#: num_splits=0 aims at this many blocks, at least MIN_KEYS_PER_SPLIT keys per split
#: (constants, not the device's: the same splits, so the same bits, on every GPU).
TARGET_BLOCKS = 256
MIN_KEYS_PER_SPLIT = 256


def _sources(dtype):
    """``(splits, merge)``: the two kernels for ``dtype``, as plain Python functions."""
    F = compute_type(dtype)
    widen, narrow = conversions(dtype)
    ZERO, NEG_INF = F(0), F(-np.inf)

    def splits(q, k_cache, v_cache, block_table, seqlens, q_start, causal, scale, n_splits,
               split_keys, chunk, part_out, part_lse):
        H, Lq, D = q.shape[1], q.shape[2], q.shape[3]
        Hkv, ps, Dv = k_cache.shape[1], k_cache.shape[2], v_cache.shape[3]
        G = H // Hkv
        task = cuda.blockIdx.x
        b = task // (Hkv * n_splits)
        hk = (task // n_splits) % Hkv
        s = task % n_splits
        r = cuda.threadIdx.x
        threads = cuda.blockDim.x
        active = r < G * Lq
        h = hk * G + r // Lq
        i = r % Lq
        pos = q_start[b] + i
        n = seqlens[b]
        per = split_keys if split_keys > 0 else (n + n_splits - 1) // n_splits
        j_lo = min(s * per, n)
        j_hi = min(j_lo + per, n)
        tiles = cuda.shared.array(0, F)  # [chunk·D keys][chunk·Dv values]
        acc = cuda.local.array(MAX_HEAD_DIM, F)
        for e in range(Dv):
            acc[e] = ZERO
        row_max = NEG_INF
        row_sum = ZERO
        j0 = j_lo
        while j0 < j_hi:  # the same trip count in every thread of the block
            nk = min(chunk, j_hi - j0)
            for idx in range(r, nk * D, threads):
                j = j0 + idx // D
                tiles[idx] = widen(k_cache[block_table[b, j // ps], hk, j % ps, idx % D])
            for idx in range(r, nk * Dv, threads):
                j = j0 + idx // Dv
                tiles[chunk * D + idx] = widen(
                    v_cache[block_table[b, j // ps], hk, j % ps, idx % Dv])
            cuda.syncthreads()
            if active:
                for kk in range(nk):
                    if causal and j0 + kk > pos:
                        break  # hidden (and every later key): k, v not used
                    dot = ZERO
                    for d in range(D):
                        dot += widen(q[b, h, i, d]) * tiles[kk * D + d]
                    score = dot * scale
                    if score > row_max:
                        correction = F(math.exp(row_max - score))
                        row_sum *= correction
                        for e in range(Dv):
                            acc[e] *= correction
                        row_max = score
                    p = F(math.exp(score - row_max))  # NaN score: NaN row
                    row_sum += p
                    for e in range(Dv):
                        acc[e] += p * tiles[chunk * D + kk * Dv + e]
            cuda.syncthreads()
            j0 += nk
        if active:
            if row_sum > ZERO or row_sum != row_sum:
                for e in range(Dv):
                    part_out[s, b, h, i, e] = acc[e] / row_sum
                part_lse[s, b, h, i] = row_max + F(math.log(row_sum))
            else:  # no key of the split is visible
                for e in range(Dv):
                    part_out[s, b, h, i, e] = ZERO
                part_lse[s, b, h, i] = NEG_INF

    def merge(part_out, part_lse, out, lse):
        S, B, H, Lq, Dv = part_out.shape
        row = cuda.grid(1)
        if row >= B * H * Lq:
            return
        b, h, i = row // (H * Lq), (row // Lq) % H, row % Lq
        top = NEG_INF
        nan = False
        for s in range(S):
            x = part_lse[s, b, h, i]
            nan = nan or x != x
            if x > top:
                top = x
        if nan or top == NEG_INF:
            for e in range(Dv):
                out[b, h, i, e] = narrow(part_out[0, b, h, i, e] if nan else ZERO)
            lse[b, h, i] = part_lse[0, b, h, i] if nan else NEG_INF
            return
        acc = cuda.local.array(MAX_HEAD_DIM, F)  # the output in the compute dtype
        total = ZERO
        for e in range(Dv):
            acc[e] = ZERO
        for s in range(S):
            x = part_lse[s, b, h, i]
            if x > NEG_INF:  # an empty split's output is not read
                w = F(math.exp(x - top))
                total += w
                for e in range(Dv):
                    acc[e] += w * part_out[s, b, h, i, e]
        for e in range(Dv):
            out[b, h, i, e] = narrow(acc[e] / total)  # rounded once
        lse[b, h, i] = top + F(math.log(total))

    return splits, merge


def _signatures(dtype):
    """q, the caches and the output in the storage type (bfloat16 as its bits), the split
    outputs, lse and the scale in the compute type."""
    F, S = compute_type(dtype), storage_type(dtype)
    s4, f4, f5, f3 = S[:, :, :, ::1], F[:, :, :, ::1], F[:, :, :, :, ::1], F[:, :, ::1]
    i64 = numba.int64
    splits = (s4, s4, s4, i64[:, ::1], i64[::1], i64[::1], numba.boolean, F, i64, i64, i64, f5,
              f4)
    merge = (f5, f4, s4, f3)
    return splits, merge


@functools.cache
def _kernels(dtype: np.dtype):
    splits, merge = _sources(dtype)
    return cuda.jit(splits), cuda.jit(merge)


def compile_ptx_all(cc=(9, 0), dtypes=FULL_DTYPES) -> dict[str, str]:
    """PTX of both decode kernels for each of ``dtypes`` (needs NVVM, not a GPU).

    Parameters
    ----------
    cc : tuple of int, default (9, 0)
    dtypes : sequence of dtype, default float32 and float64
        ``kernels._dtypes.HALF_DTYPES`` for the half kernels.

    Returns
    -------
    dict of str to str
        ``{"decode_splits_float32": ptx, "decode_merge_float32": ptx, ...}``.
    """
    if SIMULATOR:
        raise RuntimeError("compile_ptx_all needs numba-cuda with NUMBA_ENABLE_CUDASIM unset")
    ptx = {}
    for dtype in dtypes:
        name = np.dtype(dtype).name
        for kind, source, sig in zip(("splits", "merge"), _sources(dtype), _signatures(dtype),
                                     strict=True):
            ptx[f"decode_{kind}_{name}"], _ = cuda.compile_ptx(source, sig, cc=tuple(cc))
    return ptx


def check_supported(problem: DecodeProblem) -> None:
    """ValueError for what this kernel does not do (before the API writes anything)."""
    B, H, Hkv, Lq, D, Dv = problem.shape
    if problem.score_mod is not None or problem.mask_mod is not None:
        raise ValueError("backend='cuda' decodes without score_mod and mask_mod; use "
                         "backend='numba' or 'reference' for them")
    if H // Hkv * Lq > MAX_ROWS or Dv > MAX_HEAD_DIM:
        raise ValueError(f"backend='cuda' decodes at most {MAX_ROWS} rows (H / Hkv · Lq) per "
                         f"key/value head and Dv <= {MAX_HEAD_DIM}; got {H // Hkv * Lq}, {Dv}")


def choose_splits(problem: DecodeProblem) -> int:
    """Splits per sequence: ``num_splits``; else with ``deterministic`` splits of the
    fixed size every backend takes (:meth:`DecodeProblem.split_keys`: a sequence's splits
    depend on its length alone); else enough blocks for ``TARGET_BLOCKS``, which depends on
    the batch (never on the device)."""
    if problem.num_splits:
        return problem.num_splits
    if problem.deterministic:
        return problem.fixed_splits()
    B, _, Hkv, _, _, _ = problem.shape
    longest = int(problem.seqlens.max(initial=0))
    return max(1, min(-(-TARGET_BLOCKS // max(B * Hkv, 1)), longest // MIN_KEYS_PER_SPLIT))


def run(problem: DecodeProblem):
    """``(out (B, H, Lq, Dv), lse (B, H, Lq))`` on the GPU (or the simulator)."""
    check_supported(problem)
    B, H, Hkv, Lq, D, Dv = problem.shape
    dtype = problem.dtype
    work = compute_dtype(dtype)  # float32 for the half dtypes
    out = np.empty((B, H, Lq, Dv), dtype=dtype)
    lse = np.empty((B, H, Lq), dtype=work)
    if B * H * Lq == 0:
        return out, lse
    n_splits = choose_splits(problem)
    chunk = max(1, min(32, SHARED_BYTES // (work.itemsize * (D + Dv))))
    rows = H // Hkv * Lq
    threads = min(MAX_ROWS, -(-rows // 32) * 32)
    splits, merge = _kernels(dtype)
    with _simulator_lock:
        args = [cuda.to_device(kernel_view(x)) for x in (problem.q, problem.k_cache,
                                                         problem.v_cache)]
        args += [cuda.to_device(x) for x in (problem.block_table, problem.seqlens,
                                             problem.q_start)]
        part_out = cuda.device_array((n_splits, B, H, Lq, Dv), dtype=work)
        part_lse = cuda.device_array((n_splits, B, H, Lq), dtype=work)
        shared = chunk * (D + Dv) * work.itemsize
        splits[B * Hkv * n_splits, threads, 0, shared](
            *args, problem.causal, work.type(problem.scale), n_splits, problem.split_keys(),
            chunk, part_out, part_lse)
        out_d = cuda.device_array((B, H, Lq, Dv), dtype=kernel_view(out).dtype)
        lse_d = cuda.device_array((B, H, Lq), dtype=work)
        n_rows = B * H * Lq
        merge[-(-n_rows // 128), 128](part_out, part_lse, out_d, lse_d)
        return user_view(out_d.copy_to_host(), dtype), lse_d.copy_to_host()
