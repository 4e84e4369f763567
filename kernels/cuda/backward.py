"""The ``cuda`` backward pass: two numba.cuda kernels with the CPU kernels' semantics.

- ``dkdv``: one thread per key j of one (batch, kv head); it walks the query heads that
  share the kv head and the query rows that can see key j, recomputes
  ``p = exp(scale · q_i·k_j + mask_ij − lse_i)``, ``dp = dO_i·v_j`` (dropout: the shared
  hash), ``dS = p (dp·Z·κ − Δ_i)`` and accumulates ``dk_j += dS q_i``, ``dv_j += p·Z·κ dO_i``
  in per-thread arrays: each key's gradients are finished by its own thread, no atomics.
- ``dq``: one thread per query row i of one (batch, head); it walks the keys row i can
  see and accumulates ``dq_i += dS k_j``.

Block sparsity, as the forward kernel's: a thread block walks the other axis in tiles of
as many rows (``dkdv``: query rows; ``dq``: keys) as it has threads, and every thread
classifies each (rows, keys) tile with the mask function's tile form (the same answer in
every thread): an EMPTY tile is skipped (none of its data is read), a FULL one needs no
per-element mask function, a PARTIAL one checks every pair.

Δ_i = rowsum(dO_i ∘ O_i) comes from the host (one pass over dout and out).  Every dot
product uses :func:`kernels.cuda.device.make_dot`'s partial sums.  A pair is tested for
visibility (causal, ``key_lengths``, mask, ``lse_i = -inf`` for a row that sees no key)
before any of its data is read, so NaN stored where it is hidden reaches no gradient.
Both kernels read q, k, v and dout from global memory (no shared-memory tiles yet: the
simplest form with the right semantics; it is verified in Numba's CUDA simulator and by
compiling to PTX, and has never run on a GPU).  Kernels are built per dtype so that the
float32 ones contain no float64 instruction.  A float16 or bfloat16 kernel computes in
float32: its loads of q, k, v and dout are widened, its dq, dk and dv stores rounded to the
input dtype (to nearest even: :mod:`kernels.cuda.half`); lse, Δ and the mask are float32.
"""

from __future__ import annotations

import functools
import math

import numba
import numpy as np
from numba import cuda

from .._dropout import dropout_threshold
from .._dtypes import FULL_DTYPES, compute_dtype
from .._problems.dense import AttentionProblem
from ..mods import lowering as mc
from ..mods.cells import EMPTY, FULL
from ..mods.dense import run_user_code
from ..mods.lowering import mod_arguments
from . import launch
from .device import SIMULATOR, _device, _dropout_bits, make_dot
from .half import (
    compute_type,
    conversions,
    kernel_view,
    storage_dtype,
    storage_type,
    user_view,
)
from .launch import _simulator_lock, check_supported
from .source import MAX_HEAD_DIM


@_device
def _thread_item(n):
    """``(block, outer, t0, t1, t)`` of this thread, in a grid that covers the ``n`` items
    of one axis (keys or query rows) in tiles of ``blockDim.x`` items per thread block:
    the thread block's index along the other axes (batch x heads), its tile [t0, t1) and
    this thread's item t (t >= n for the idle threads of the last tile)."""
    block = cuda.blockDim.x
    n_tiles = (n + block - 1) // block
    t0 = (cuda.blockIdx.x % n_tiles) * block
    return block, cuda.blockIdx.x // n_tiles, t0, min(t0 + block, n), t0 + cuda.threadIdx.x


def _kernel_sources(dtype, mask_fn=None, tile_fn=None, score_fn=None, grad_fn=None):
    """``(dkdv_kernel, dq_kernel)`` for ``dtype`` as plain Python functions.

    ``mask_fn``, ``tile_fn``, ``score_fn`` and ``grad_fn``: the device functions of a
    call's :mod:`kernels.mods` (:func:`kernels.mods.lowering.mod_arguments` for "cuda", and
    the score function's derivative); the identities when None.  The kernels take their bound
    data as the two last arguments (``mask_args``, ``score_args``; empty tuples without).
    """
    F = compute_type(dtype)
    if mask_fn is None:
        mask_fn, tile_fn = mc.identity_mask("cuda")
    if score_fn is None:
        score_fn = mc.identity_score("cuda")
        grad_fn = mc.identity_score_grad("cuda", compute_dtype(dtype))
    ZERO = F(0)
    NEG_INF = F(-np.inf)
    NO_DROPOUT = np.uint64(0)
    widen, narrow = conversions(dtype)
    dot = make_dot(F, widen)

    @_device
    def visible(i, j, b, h, key_len, causal, causal_offset, mask, mask_sb, mask_sh,
                mask_si, mask_sj, has_mask, check_each, mask_args):
        """``(seen, additive mask value)`` of pair (i, j): causal, key_lengths, the mask
        function (unless its tile is FULL: ``check_each`` False), then mask."""
        if j >= key_len or (causal and j > i + causal_offset):
            return False, ZERO
        if check_each and not mask_fn(b, h, i, j, mask_args):
            return False, ZERO
        if has_mask:
            m = mask[b * mask_sb + h * mask_sh + i * mask_si + j * mask_sj]
            if m == NEG_INF:
                return False, ZERO
            return True, m
        return True, ZERO

    @_device
    def pair_grads(q, k, v, dout, lse, row_dot, b, h, hk, i, j, extra, scale, threshold,
                   keep_scale, seed, D, Dv, score_args):
        """``(dS, p · Z · κ)`` of a visible pair (i, j); dS includes the score function's
        derivative f'(x) at the scaled score x."""
        x = dot(q[b, h, i], 0, k[b, hk, j], 0, D) * scale
        score = F(score_fn(x, b, h, i, j, score_args)) + extra
        p = F(math.exp(score - lse[b, h, i]))
        dp = dot(dout[b, h, i], 0, v[b, hk, j], 0, Dv)
        pd = p
        if threshold > NO_DROPOUT:
            if _dropout_bits(seed, b, h, i, j) < threshold:
                pd = ZERO
                dp = ZERO
            else:
                pd = p * keep_scale
                dp = dp * keep_scale
        return p * (dp - row_dot[b, h, i]) * F(grad_fn(x, b, h, i, j, score_args)), pd

    def dkdv_kernel(q, k, v, dout, lse, row_dot, mask, mask_sb, mask_sh, mask_si, mask_sj,
                    has_mask, key_lengths, causal, causal_offset, scale, threshold,
                    keep_scale, seed, dk, dv, mask_args, score_args):
        # q (B, H, Lq, D), k (B, Hkv, Lk, D), v (B, Hkv, Lk, Dv), dout (B, H, Lq, Dv),
        # lse and row_dot (B, H, Lq), dk (B, Hkv, Lk, D), dv (B, Hkv, Lk, Dv).
        H, Lq, D = q.shape[1], q.shape[2], q.shape[3]
        Hkv, Lk, Dv = k.shape[1], k.shape[2], v.shape[3]
        group = H // Hkv
        block, bhk, j0, j1, j = _thread_item(Lk)  # the block's keys are [j0, j1)
        b = bhk // Hkv
        hk = bhk % Hkv
        if j >= Lk:
            return
        dk_acc = cuda.local.array(MAX_HEAD_DIM, F)
        dv_acc = cuda.local.array(MAX_HEAD_DIM, F)
        for d in range(D):
            dk_acc[d] = ZERO
        for d in range(Dv):
            dv_acc[d] = ZERO
        key_len = key_lengths[b]
        i_start = 0
        if causal:
            i_start = max(j - causal_offset, 0)  # rows above it cannot see key j
        if j < key_len:
            for h in range(hk * group, (hk + 1) * group):
                # query tiles of `block` rows, from the first that holds row i_start
                for i0 in range((i_start // block) * block, Lq, block):
                    i1 = min(i0 + block, Lq)
                    cls = tile_fn(b, h, i0, i1, j0, j1, mask_args)
                    if cls == EMPTY:
                        continue  # no pair of the tile is visible: nothing of it is read
                    for i in range(max(i0, i_start), i1):
                        seen, extra = visible(i, j, b, h, key_len, causal, causal_offset,
                                              mask, mask_sb, mask_sh, mask_si, mask_sj,
                                              has_mask, cls != FULL, mask_args)
                        if not seen or lse[b, h, i] == NEG_INF:
                            continue
                        ds, pd = pair_grads(q, k, v, dout, lse, row_dot, b, h, hk, i, j,
                                            extra, scale, threshold, keep_scale, seed, D, Dv,
                                            score_args)
                        for d in range(D):
                            dk_acc[d] += ds * widen(q[b, h, i, d])
                        if pd != ZERO:
                            for d in range(Dv):
                                dv_acc[d] += pd * widen(dout[b, h, i, d])
        for d in range(D):
            dk[b, hk, j, d] = narrow(dk_acc[d] * scale)
        for d in range(Dv):
            dv[b, hk, j, d] = narrow(dv_acc[d])

    def dq_kernel(q, k, v, dout, lse, row_dot, mask, mask_sb, mask_sh, mask_si, mask_sj,
                  has_mask, key_lengths, causal, causal_offset, scale, threshold,
                  keep_scale, seed, dq, mask_args, score_args):
        # dq (B, H, Lq, D); the other arguments as dkdv_kernel's.
        H, Lq, D = q.shape[1], q.shape[2], q.shape[3]
        Hkv, Dv = k.shape[1], v.shape[3]
        block, bh, i0, i1, i = _thread_item(Lq)  # the block's rows are [i0, i1)
        b = bh // H
        h = bh % H
        hk = h // (H // Hkv)
        if i >= Lq:
            return
        dq_acc = cuda.local.array(MAX_HEAD_DIM, F)
        for d in range(D):
            dq_acc[d] = ZERO
        key_len = key_lengths[b]
        key_end = key_len
        if causal:
            key_end = min(key_end, i + causal_offset + 1)
        if lse[b, h, i] != NEG_INF:  # a row that sees no key is never read
            for j0 in range(0, key_end, block):  # key tiles of `block` keys
                j1 = min(j0 + block, key_end)
                cls = tile_fn(b, h, i0, i1, j0, j1, mask_args)
                if cls == EMPTY:
                    continue  # no pair of the tile is visible: nothing of it is read
                for j in range(j0, j1):
                    seen, extra = visible(i, j, b, h, key_len, causal, causal_offset, mask,
                                          mask_sb, mask_sh, mask_si, mask_sj, has_mask,
                                          cls != FULL, mask_args)
                    if not seen:
                        continue
                    ds, pd = pair_grads(q, k, v, dout, lse, row_dot, b, h, hk, i, j, extra,
                                        scale, threshold, keep_scale, seed, D, Dv,
                                        score_args)
                    for d in range(D):
                        dq_acc[d] += ds * widen(k[b, hk, j, d])
        for d in range(D):
            dq[b, h, i, d] = narrow(dq_acc[d] * scale)

    return dkdv_kernel, dq_kernel


def _signatures(dtype):
    """Argument types of ``(dkdv_kernel, dq_kernel)`` for ``dtype``: q, k, v, dout, dq, dk
    and dv of the storage type (:func:`kernels.cuda.half.storage_type`), the rest of the
    compute type."""
    F = compute_type(dtype)
    a4, a3 = numba.types.Array(storage_type(dtype), 4, "C"), numba.types.Array(F, 3, "C")
    i64, boolean, u64 = numba.types.int64, numba.types.boolean, numba.types.uint64
    common = (
        a4, a4, a4, a4, a3, a3,  # q, k, v, dout, lse, row_dot
        numba.types.Array(F, 1, "C"), i64, i64, i64, i64, boolean,  # mask, strides, has_mask
        numba.types.Array(i64, 1, "C"), boolean, i64,  # key_lengths, causal, causal_offset
        F, u64, F, u64,  # scale, threshold, keep_scale, seed
    )
    no_args = numba.types.Tuple(())  # mask_args, score_args of a call without mods
    return common + (a4, a4, no_args, no_args), common + (a4, no_args, no_args)


@functools.cache
def _kernels(dtype):
    dtype = np.dtype(dtype)
    sources = _kernel_sources(dtype)
    if SIMULATOR:
        return tuple(cuda.jit(source) for source in sources)
    return tuple(cuda.jit(sig, cache=True)(source)
                 for sig, source in zip(_signatures(dtype), sources, strict=True))


def _mods_kernels(dtype, mask_fn, tile_fn, score_fn, grad_fn):
    """The kernels with a call's mod functions compiled in (built once per structure)."""
    def build():
        sources = _kernel_sources(dtype, mask_fn, tile_fn, score_fn, grad_fn)
        return tuple(cuda.jit(source) if SIMULATOR else cuda.jit(cache=False)(source)
                     for source in sources)

    return mc.memo(("cuda_backward", np.dtype(dtype).name, mask_fn, tile_fn, score_fn,
                    grad_fn), build)


def compile_mods_ptx(problem: AttentionProblem, cc=(9, 0)) -> dict[str, str]:
    """PTX of the backward kernels a problem with mods runs (simulator off; no GPU needed):
    ``{"dkdv": ptx, "dq": ptx}``."""
    if SIMULATOR:
        raise RuntimeError("compile_mods_ptx needs numba-cuda with NUMBA_ENABLE_CUDASIM unset")
    mask_fn, tile_fn, mask_args, score_fn, score_args = mod_arguments(problem, "cuda")
    wide = compute_dtype(problem.dtype)
    grad_fn = (mc.identity_score_grad("cuda", wide) if problem.score_mod is None
               else problem.score_mod.grad("cuda", wide))
    extra = (numba.typeof(mask_args), numba.typeof(score_args))
    ptx = {}
    sources = _kernel_sources(problem.dtype, mask_fn, tile_fn, score_fn, grad_fn)
    for kind, source, sig in zip(("dkdv", "dq"), sources,
                                 _signatures(problem.dtype), strict=True):
        ptx[kind], _ = cuda.compile_ptx(source, sig[:-2] + extra, cc=tuple(cc))
    return ptx


def compile_ptx_all(cc=(9, 0), dtypes=FULL_DTYPES) -> dict[str, str]:
    """PTX of both backward kernels for ``dtypes`` (default float32 and float64;
    ``kernels._dtypes.HALF_DTYPES`` for the half ones); needs NVVM, not a GPU.

    Returns ``{"dkdv_float32": ptx, "dq_float32": ptx, ...}``.
    """
    if SIMULATOR:
        raise RuntimeError("compile_ptx_all needs numba-cuda with NUMBA_ENABLE_CUDASIM unset")
    ptx = {}
    for dtype in dtypes:
        name = np.dtype(dtype).name
        for kind, source, sig in zip(("dkdv", "dq"), _kernel_sources(dtype),
                                     _signatures(dtype), strict=True):
            ptx[f"{kind}_{name}"], _ = cuda.compile_ptx(source, sig, cc=tuple(cc))
    return ptx


def run(problem: AttentionProblem, dout: np.ndarray, out: np.ndarray, lse: np.ndarray, *,
        block: int | None = None):
    """Gradients ``(dq, dk, dv)`` on the GPU from NumPy arrays (copied there and back).

    Parameters
    ----------
    problem, dout, out, lse
        As :func:`kernels.numba_cpu.dense.backward.run`'s: the validated problem, the
        output's gradient and the forward's output and lse.
    block : int, optional
        Threads per block; default ``launch.BLOCK_Q``.

    Returns
    -------
    dq, dk, dv : ndarray
        In the input dtype (for half inputs rounded to nearest even from float32).
    """
    check_supported(problem)
    B, H, Hkv, Lq, Lk, D, Dv = problem.shape
    dtype = compute_dtype(problem.dtype)  # of lse, Δ, the mask and the scalars
    stored = storage_dtype(problem.dtype)  # of q, k, v, dout and the gradients, as sent
    dq = np.zeros((B, H, Lq, D), dtype=stored)
    dk = np.zeros((B, Hkv, Lk, D), dtype=stored)
    dv = np.zeros((B, Hkv, Lk, Dv), dtype=stored)
    if B * H * Lq * Lk == 0:
        return tuple(user_view(g, problem.dtype) for g in (dq, dk, dv))
    block = block or launch.BLOCK_Q
    with np.errstate(invalid="ignore", over="ignore"):
        row_dot = np.einsum("bhid,bhid->bhi", dout.astype(dtype, copy=False),
                            out.astype(dtype, copy=False))  # Δ, (B, H, Lq)
    has_mask = problem.mask is not None
    mask = (problem.additive_mask().reshape(-1).astype(dtype, copy=False) if has_mask
            else np.zeros(1, dtype=dtype))
    ftype = dtype.type
    mod_args, user_names = ((), ()), ()
    has_mods = problem.score_mod is not None or problem.mask_mod is not None
    if has_mods:
        mask_fn, tile_fn, mask_args, score_fn, score_args = mod_arguments(problem, "cuda")
        grad_fn = (mc.identity_score_grad("cuda", dtype) if problem.score_mod is None
                   else problem.score_mod.grad("cuda", dtype))  # in the compute dtype
        mod_args, user_names = (mask_args, score_args), mc.user_names(problem)
    with _simulator_lock:
        if has_mods:
            dkdv_kernel, dq_kernel = _mods_kernels(problem.dtype, mask_fn, tile_fn, score_fn,
                                                   grad_fn)
            mod_args = tuple(tuple(cuda.to_device(a) if isinstance(a, np.ndarray) else a
                                   for a in group) for group in mod_args)
        else:
            dkdv_kernel, dq_kernel = _kernels(problem.dtype)
        arrays = [cuda.to_device(np.ascontiguousarray(kernel_view(x))) for x in (
            problem.q, problem.k, problem.v, dout)]
        arrays += [cuda.to_device(np.ascontiguousarray(x, dtype=dtype)) for x in (
            lse, row_dot, mask)]
        options = (
            *problem.mask_strides(), has_mask,
            cuda.to_device(problem.key_lengths_or_full()),
            problem.causal_offset is not None, problem.causal_offset or 0,
            ftype(problem.scale), np.uint64(dropout_threshold(problem.dropout_p)),
            ftype(1.0 / (1.0 - problem.dropout_p)), np.uint64(problem.seed),
        )
        dq_dev, dk_dev, dv_dev = (cuda.to_device(x) for x in (dq, dk, dv))
        run_user_code(user_names, lambda: (
            dkdv_kernel[B * Hkv * math.ceil(Lk / block), block](*arrays, *options, dk_dev,
                                                                dv_dev, *mod_args),
            dq_kernel[B * H * math.ceil(Lq / block), block](*arrays, *options, dq_dev,
                                                            *mod_args)))
        return tuple(user_view(g.copy_to_host(), problem.dtype)
                     for g in (dq_dev, dk_dev, dv_dev))
