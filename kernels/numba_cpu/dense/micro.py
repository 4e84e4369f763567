"""The numba backend's forward path without BLAS: register-blocked Numba micro-kernels.

The question it answers ("the GEMM floor"): can the fused kernel beat its own
BLAS floor by replacing OpenBLAS's tile GEMMs (repacked on every call) with products on
panels packed once per (batch, head)?  This module is the alternative, measured by
``attnbench bench --only speed`` (docs/gemm-floor.md).  The numba backend
(:func:`kernels.numba_cpu.choose.run`) takes this path where
:mod:`kernels.numba_cpu.planner` found it faster on the machine.

Layout.  For each (batch, key/value head) the keys are packed once into panels of ``nr``
keys, ``kp[panel, d, j] = K[panel · nr + j, d]`` (zero past the last key or past
``key_lengths[b]``), and the values into rows padded to a multiple of ``nr``:
``vp[j, :Dv] = V[j]``: either all heads in one parallel launch before the query blocks,
or (``fuse``, where there are heads enough per thread) by the task that then runs every
query block of that key head.  A query block is ``block_q`` rows of one (batch, head);
it is copied into a zero-padded block and walks the keys in tiles of ``block_k``:

    S = Q_blk · K_tileᵀ      by ``mr`` x ``nr`` register blocks (one panel per block column)
    online softmax on S      (as kernels.numba_cpu: integer-key row max, polynomial exp,
                              no fastmath on the -inf paths)
    acc = acc · c + P · V    by ``mr`` x ``nr`` register blocks, accumulating into acc

Both products are one micro-kernel (:func:`kernels.numba_cpu.products.intrinsics.tile_product`):
``mr`` accumulators of ``nr`` lanes held in vector registers across the whole depth, one
vector load of the packed operand and ``mr`` broadcasts per step, one fused multiply-add
per accumulator, written in LLVM IR (see that module).

The register block is a compile-time constant (a Numba literal), so every kernel is an
ordinary module-level function cached on disk (``cache=True``): one specialisation per
block and dtype, compiled once per machine.  :mod:`kernels.numba_cpu.planner` chooses the block.

Supported: float32 and float64, and float16 and bfloat16 inputs (their bits widened to
float32 panels as they are packed, the queries as their block is copied; the output
rounded once to the input dtype, lse float32), GQA, ``causal`` (both alignments, as
``causal_offset``), ``key_lengths`` and ``scale``; no ``mask``, dropout, weights or mods
(the benchmark's cases).  Semantics as the numba backend: a row that sees no key gives 0,
a visible NaN score gives a NaN row, keys past ``key_lengths`` are never read, and a
hidden non-finite value never reaches an output.
"""

from __future__ import annotations

import numba
import numpy as np
from numba import literally, njit, prange, types

from ..._dtypes import bits_dtype, bits_view, compute_dtype, is_half
from ..._jit import isa
from ..._jit.half import compute_dtype_of, narrow, widen
from ..._jit.launch import launch_guard
from ..._jit.math import FASTMATH, fast_exp, float_constants, from_max_key, max_key
from ..._problems.checks import check_attention_args
from ..products.intrinsics import SUM_LANES, ordered_sum, tile_product

__all__ = ["CONFIGS", "REGISTER_BLOCKS", "attention", "register_blocks", "run"]

#: Register blocks per vector register file and dtype, as ``(rows, vectors)``: ``rows``
#: accumulator rows of ``vectors`` full registers each (``nr = vectors · lanes``).  With 32
#: registers (AVX-512, 16 float32 lanes): 8 accumulators, the shapes measured in
#: docs/gemm-floor.md.  With 16 (AVX2, 8 lanes): 12 accumulators, which leave a broadcast
#: and the B loads their registers, as BLIS's and OpenBLAS's Haswell kernels (6 x 16, and
#: 4 x 24); 8 x 16 there would need all 16 for accumulators.  The first is the default:
#: 6 x 16 keeps 8 x 16's tiles (``BLOCK_K`` and the value padding unrounded), so its
#: results are the same bits.
REGISTER_BLOCKS = {
    32: {np.dtype(np.float32): ((8, 1), (4, 2)), np.dtype(np.float64): ((4, 2), (8, 1))},
    16: {np.dtype(np.float32): ((6, 2), (4, 3)), np.dtype(np.float64): ((6, 2), (4, 3))},
}


def register_blocks(vector_bits: int, vector_registers: int) -> dict:
    """``{dtype: ((mr, nr), ...)}``: the blocks the planner tries for a target whose
    ``vector_registers`` registers hold ``vector_bits`` bits (the first: the default).
    Fewer than 32 registers take the 16-register shapes."""
    table = REGISTER_BLOCKS[32 if vector_registers >= 32 else 16]
    return {dtype: tuple((rows, vectors * vector_bits // (8 * dtype.itemsize))
                         for rows, vectors in blocks) for dtype, blocks in table.items()}


_TARGET = isa.target()
#: Register-block shapes ``(mr, nr)`` tried per dtype on the target Numba compiles for
#: (:func:`kernels._jit.isa.target`; rows x lanes of accumulators); the first is the
#: default.  Two per dtype: each candidate costs the planner a compilation (~8 s).
CONFIGS = register_blocks(_TARGET.vector_bits, _TARGET.vector_registers)
#: Query rows per task and keys per tile (rounded up to a multiple of ``nr``).
BLOCK_Q = 64
BLOCK_K = 256
#: Key heads per Numba thread from which :func:`run` fuses packing into the task loop.
FUSE_TASKS_PER_THREAD = 4


@njit(fastmath=FASTMATH, error_model="numpy", cache=True)
def pack_head(k, v, key_end, b, hk, kp_bh, vp_bh):
    """kp_bh = keys of (b, hk) in panels of nr (zero past key_end), vp_bh = padded values
    (half bits widened to the panels' float32 as they are packed)."""
    D, Dv, nr = k.shape[3], v.shape[3], kp_bh.shape[2]
    kp_bh[:] = 0
    vp_bh[:] = 0
    for p in range(kp_bh.shape[0]):
        for j in range(min(nr, key_end - p * nr)):
            for d in range(D):
                kp_bh[p, d, j] = widen(k[b, hk, p * nr + j, d])
    for j in range(key_end):
        for d in range(Dv):
            vp_bh[j, d] = widen(v[b, hk, j, d])


@njit(parallel=True, cache=True)
def _pack(k, v, key_lengths, kp, vp):
    """Every (batch, key head) packed by :func:`pack_head`, in parallel."""
    Hkv = k.shape[1]
    for bh in prange(k.shape[0] * Hkv):
        b, hk = bh // Hkv, bh % Hkv
        pack_head(k, v, key_lengths[b], b, hk, kp[b, hk], vp[b, hk])


@njit(fastmath=FASTMATH, error_model="numpy", cache=True, inline="always")
def block_state(q, scale, b, h, i0, i1, block_k, Dv_pad, mr):
    """``(qb, s, s_rows, acc, row_max, row_sum, row_nan)`` of rows [i0, i1) of (b, h): the
    queries in a block zero-padded to a multiple of ``mr`` rows, the scores (then P) of a
    tile (``block_k`` per row), the output rows (``Dv_pad`` lanes), each row's running
    max, sum and NaN flag.  Shared with :mod:`kernels.numba_cpu.dense.micro_mods`."""
    D = q.shape[3]
    n = i1 - i0
    n_pad = -(-n // mr) * mr
    ct = compute_dtype_of(q)  # float32 for half bits
    qb = np.zeros(n_pad * D, dtype=ct)
    for r in range(n):
        for d in range(D):
            qb[r * D + d] = widen(q[b, h, i0 + r, d])
    s = np.empty(n_pad * block_k, dtype=ct)  # scores, then P, rows of block_k
    acc = np.zeros(n_pad * Dv_pad, dtype=ct)
    neg_inf = float_constants(scale)[2]
    return (qb, s, s.reshape((n_pad, block_k)), acc, np.full(n, neg_inf, dtype=ct),
            np.zeros(n, dtype=ct), np.zeros(n, dtype=np.bool_))


@njit(fastmath=FASTMATH, error_model="numpy", cache=True, inline="always")
def tile_scores(qb, kp_f, s, D, j0, nk, r_al, block_k, mr, nr):
    """``s = qb[r_al:] · K_tileᵀ`` for keys [j0, j0 + nk) by register blocks, a panel per
    block column (keys past ``nk`` in the last panel are computed and left unread)."""
    n_pad = qb.shape[0] // D
    for p in range(-(-nk // nr)):
        panel = (j0 // nr + p) * D * nr
        for r in range(r_al, n_pad, mr):
            tile_product(qb, r * D, D, kp_f, panel, nr, s, r * block_k + p * nr, block_k, D,
                         mr, nr, False)


@njit(fastmath=FASTMATH, error_model="numpy", inline="always", cache=True)
def row_softmax(row, hi, n_visible, nk, key_max, r, row_max, row_sum, row_nan, acc, Dv_pad):
    """Row ``r``'s online-softmax update by a tile whose keys [0, hi) may be visible (``-inf``
    where hidden; ``n_visible`` are), of :func:`max_key` maximum ``key_max``: ``row`` becomes
    P (0 past ``hi``, or all 0); the running max, sum, NaN flag and ``acc`` follow."""
    zero, one, neg_inf = float_constants(row[0])
    if n_visible == 0:
        row[:nk] = zero
        return
    tile_max = from_max_key(key_max)
    m_new = max(row_max[r], tile_max)
    correction = fast_exp(row_max[r] - m_new) if m_new > row_max[r] else one
    row_max[r] = m_new
    for c in range(hi):
        row[c] = fast_exp(row[c] - m_new)
    total = ordered_sum(row, 0, hi, SUM_LANES)  # in one order, whatever kernel inlines this
    row[hi:nk] = zero
    if total != total or tile_max == -neg_inf:
        row_nan[r] = True
    row_sum[r] = row_sum[r] * correction + total
    if correction != one:
        acc_row = acc[r * Dv_pad:(r + 1) * Dv_pad]
        for d in range(Dv_pad):
            acc_row[d] *= correction


@njit(fastmath=FASTMATH, error_model="numpy", cache=True, inline="always")
def tile_values(s, vp_f, v0, acc, nk, r_al, block_k, Dv_pad, mr, nr):
    """``acc[r_al:] += P · V_tile`` by register blocks (``nk`` value rows from ``v0``)."""
    n_pad = acc.shape[0] // Dv_pad
    for c0 in range(0, Dv_pad, nr):
        for r in range(r_al, n_pad, mr):
            tile_product(s, r * block_k, block_k, vp_f, v0 * Dv_pad + c0, Dv_pad,
                         acc, r * Dv_pad + c0, Dv_pad, nk, mr, nr, True)


@njit(fastmath=FASTMATH, error_model="numpy", cache=True, inline="always")
def finish_rows(acc, row_max, row_sum, row_nan, out, lse, b, h, i0, Dv_pad):
    """out = acc / ℓ, lse = m + log ℓ of the rows (0, -inf: no key seen; NaN: a NaN row);
    half bits of out rounded once from float32."""
    zero, one, neg_inf = float_constants(acc[0])
    for r in range(row_max.shape[0]):
        inv = one / row_sum[r] if row_sum[r] > zero else zero
        for d in range(out.shape[3]):
            out[b, h, i0 + r, d] = narrow(zero / zero if row_nan[r] else
                                          acc[r * Dv_pad + d] * inv, out)
        lse[b, h, i0 + r] = (zero / zero if row_nan[r] else
                             row_max[r] + np.log(row_sum[r]) if row_sum[r] > zero else neg_inf)


@njit(fastmath=FASTMATH, error_model="numpy", cache=True)
def attend_rows(q, kp, vp, key_lengths, causal, causal_offset, scale, out, lse, b, h, i0, i1,
            block_k, mr, nr):
    """Rows [i0, i1) of (b, h) against its packed keys ``kp`` and values ``vp``."""
    D, Dv, Dv_pad = q.shape[3], out.shape[3], vp.shape[1]
    n = i1 - i0
    qb, s, s_rows, acc, row_max, row_sum, row_nan = block_state(q, scale, b, h, i0, i1,
                                                                block_k, Dv_pad, mr)
    n_pad = s_rows.shape[0]
    kp_f, vp_f = kp.reshape(-1), vp.reshape(-1)
    zero, _, neg_inf = float_constants(scale)  # in q's dtype (a literal would be float64)
    key_end = key_lengths[b]
    if causal:  # the block's last row sees keys < i1 + causal_offset
        key_end = min(key_end, max(i1 + causal_offset, 0))
    for j0 in range(0, key_end, block_k):
        j1 = min(j0 + block_k, key_end)
        nk = j1 - j0
        r_lo = max(j0 - causal_offset - i0, 0) if causal else 0  # first row seeing j0
        r_al = r_lo - r_lo % mr
        tile_scores(qb, kp_f, s, D, j0, nk, r_al, block_k, mr, nr)
        partial = causal and j1 - 1 > i0 + r_al + causal_offset
        for r in range(r_al, n_pad):
            row = s_rows[r]  # a whole row: a C-contiguous view, whose loops vectorise
            hi = 0  # keys [j0, j0 + hi) are visible to this row
            if r >= r_lo and r < n:
                hi = nk
                if causal:
                    hi = max(min(nk, i0 + r + causal_offset + 1 - j0), 0)
            key_max = max_key(neg_inf)
            for c in range(hi):
                x = row[c] * scale
                row[c] = x
                key_max = max(key_max, max_key(x))
            if hi == 0:  # here, not in row_softmax: float64 kept its bits (LLVM's code)
                row[:nk] = zero
                continue
            row_softmax(row, hi, hi, nk, key_max, r, row_max, row_sum, row_nan, acc, Dv_pad)
        if partial and not np.all(np.isfinite(vp[j0:j1])):
            for r in range(r_lo, n):  # a hidden non-finite value: visible keys only
                hi = max(min(nk, i0 + r + causal_offset + 1 - j0), 0)
                for c in range(hi):
                    for d in range(Dv):
                        acc[r * Dv_pad + d] += s[r * block_k + c] * vp_f[(j0 + c) * Dv_pad + d]
        else:
            tile_values(s, vp_f, j0, acc, nk, r_al, block_k, Dv_pad, mr, nr)
    finish_rows(acc, row_max, row_sum, row_nan, out, lse, b, h, i0, Dv_pad)


@njit(parallel=True, cache=True)
def _kernel(q, k, v, key_lengths, causal, causal_offset, scale, out, lse, block_q, block_k,
            fuse, mr, nr):
    """The forward pass by ``mr`` x ``nr`` register blocks (see :func:`run`)."""
    literally(mr)  # compile-time constants: one cached specialisation per block
    literally(nr)
    B, H, Lq = q.shape[0], q.shape[1], q.shape[2]
    Hkv, Lk, D, Dv = k.shape[1], k.shape[2], k.shape[3], v.shape[3]
    n_panels, Dv_pad = -(-Lk // nr), -(-Dv // nr) * nr
    n_blocks, group = -(-Lq // block_q), H // Hkv
    per_head = group * n_blocks  # query blocks of a key head's group
    packed = 0 if fuse else B  # fused: nothing packed before the loop
    kps = np.empty((packed, Hkv, n_panels, D, nr), dtype=compute_dtype_of(q))
    vps = np.empty((packed, Hkv, Lk, Dv_pad), dtype=compute_dtype_of(q))
    n_tasks = B * Hkv
    if not fuse:  # one packing launch, then a task per query block
        _pack(k, v, key_lengths, kps, vps)
        n_tasks = B * Hkv * per_head
    # One parallel loop, one call of attend_rows: Numba compiles each parallel loop on its own
    # with all it calls (a cold float32 compile of this kernel took 10.3 s with a loop per
    # way, 9.1 s so).  n_tasks is set by a branch: Numba silently runs a prange over
    # ``x if c else y`` on one thread.
    for task in prange(n_tasks):
        task = np.int64(task)  # unsigned in the function Numba outlines for the loop
        if fuse:  # task bh = (b, hk): pack it, then run all its query blocks
            bh, first, stop = task, 0, per_head
            kp = np.empty((n_panels, D, nr), dtype=compute_dtype_of(q))
            vp = np.empty((Lk, Dv_pad), dtype=compute_dtype_of(q))
            pack_head(k, v, key_lengths[bh // Hkv], bh // Hkv, bh % Hkv, kp, vp)
        else:  # one query block (b, h, block) of a packed head
            bh, first = task // per_head, task % per_head
            stop = first + 1
            kp, vp = kps[bh // Hkv, bh % Hkv], vps[bh // Hkv, bh % Hkv]
        b, hk = bh // Hkv, bh % Hkv
        for t in range(first, stop):
            h, i0 = hk * group + t // n_blocks, (t % n_blocks) * block_q
            attend_rows(q, kp, vp, key_lengths, causal, causal_offset, scale, out, lse, b, h,
                    i0, min(i0 + block_q, Lq), block_k, mr, nr)

def run(problem, config, *, block_q: int = BLOCK_Q, block_k: int = BLOCK_K, fuse=None):
    """``(out, lse)`` of a validated problem (no mask, dropout, weights or mods).

    The numba backend's entry point here (from :func:`kernels.numba_cpu.choose.run`), returning
    what ``kernels.numba_cpu.choose.run(problem, return_lse=True)`` returns as ``out`` and
    ``lse``: out (B, H, Lq, Dv), lse (B, H, Lq).
    ``fuse``: one parallel launch whose tasks each pack one (batch, key head) and run all
    its query blocks (no second launch, no packed copy of the whole K and V), rather than
    a packing launch and then one task per query block; default: fused where there are at
    least :data:`FUSE_TASKS_PER_THREAD` key heads per Numba thread (enough to balance).
    Half inputs are always fused (``fuse=False`` is a ``ValueError``).
    """
    if (problem.mask is not None or problem.dropout_p or problem.return_weights
            or problem.score_mod is not None or problem.mask_mod is not None):
        raise ValueError("the micro-kernel path takes causal, key_lengths and scale only")
    mr, nr = config
    fuse, out, lse = outputs(problem, fuse)
    dtype = compute_dtype(problem.dtype).type
    if out.size:
        with launch_guard():
            launch_kernel((bits_view(problem.q), bits_view(problem.k), bits_view(problem.v),
                     problem.key_lengths_or_full(), problem.causal_offset is not None,
                     problem.causal_offset or 0, dtype(problem.scale), bits_view(out), lse,
                     block_q, -(-block_k // nr) * nr, bool(fuse)), mr, nr)
    return out, lse


def fuses(problem) -> bool:
    """Whether :func:`run` fuses packing into the task loop by default: at least
    :data:`FUSE_TASKS_PER_THREAD` key heads per Numba thread."""
    B, _, Hkv = problem.shape[:3]
    return B * Hkv >= FUSE_TASKS_PER_THREAD * numba.get_num_threads()


def outputs(problem, fuse):
    """``(fuse, out, lse)``: ``fuse`` as :func:`run` decides it, empty out (the input
    dtype) and lse (the compute dtype: float32 for half inputs).  Half inputs are always
    fused: each running task then holds the float32 panels of one key head, never a
    float32 copy of the whole K and V."""
    B, H, Hkv, Lq, _, _, Dv = problem.shape
    if fuse is None:
        fuse = True if is_half(problem.dtype) else fuses(problem)
    if is_half(problem.dtype) and not fuse:
        raise ValueError("half inputs take the micro-kernel path fused only (fuse=True)")
    out = np.empty((B, H, Lq, Dv), bits_dtype(problem.dtype)).view(problem.dtype)
    return bool(fuse), out, np.empty((B, H, Lq), compute_dtype(problem.dtype))


def launch_kernel(args: tuple, mr: int, nr: int, kernel=None) -> None:
    """``kernel(*args, mr, nr)`` (default :func:`_kernel`), calling its compiled
    specialisation directly once it exists.

    A call through the dispatcher with plain ints for ``mr`` and ``nr`` types the kernel
    again on every call until ``literally`` asks for literals (far longer than the call);
    the    specialisation for literal ``mr`` and ``nr`` is looked up by the argument types instead.
    """
    sig = tuple(numba.typeof(a) for a in args) + (types.literal(mr), types.literal(nr))
    kernel = _kernel if kernel is None else kernel
    compiled = kernel.overloads.get(sig)
    if compiled is None:
        kernel(*args, mr, nr)  # compiles, or loads from the disk cache
    else:
        compiled.entry_point(*args, mr, nr)


def attention(q, k, v, *, causal=False, key_lengths=None, scale=None, config=None,
              block_q: int = BLOCK_Q, block_k: int = BLOCK_K, fuse=None) -> np.ndarray:
    """Masked attention by the micro-kernel path, as ``kernels.attention`` computes it.

    Parameters
    ----------
    q, k, v, causal, key_lengths, scale
        As :func:`kernels.attention` (validated by :func:`kernels.prepare`); no other mask.
    config : (int, int), optional
        The register block ``(mr, nr)``; default: the first of :data:`CONFIGS` for the dtype.
    block_q, block_k : int
        Query rows per task and keys per tile (``block_k`` is rounded up to a multiple of
        ``nr``).
    fuse : bool, optional
        As :func:`run`.

    Returns
    -------
    ndarray, shape (B, H, Lq, Dv)
    """
    problem = check_attention_args(q, k, v, causal=causal, key_lengths=key_lengths,
                                   scale=scale)
    config = config or CONFIGS[problem.dtype][0]
    return problem.restore(run(problem, config, block_q=block_q, block_k=block_k,
                               fuse=fuse)[0])
