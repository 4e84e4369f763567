"""The ``numba`` backend of :func:`kernels.attention_varlen` and its backward: packed
variable-length batches, no padded row or key computed.

The packed arrays (total, H, D) are copied once, sequence after sequence, each sequence's
(H, L_b, D) contiguous (an O(total · H · D) copy).  A task is (sequence, head, block of
query rows) in the forward and (sequence, kv head, block of keys) in the backward; it runs
the dense kernels' own block functions (``forward.attend_block``, ``backward.key_block``)
on its sequence's C-contiguous (1, H, L_b, D) blocks (the BLAS reads the tiles in place),
with batch index 0 for the arrays and the sequence index b for the mods and the dropout
hash (the block functions take the two apart).  So a packed call has the types of a dense
call with the same mods and dtype, and shares its compiled block functions.  The tasks are
dealt to the threads by their work (visible pairs), longest first (LPT), one bin per
thread: the total work is Σ_b Lq_b · Lk_b (halved by causal masks), whatever the lengths.

Where the planner chose the micro-kernel path for dense calls of the dtype, a plain packed
call (no mods, no dropout) takes it too (:mod:`kernels.numba_cpu.varlen.micro`); calls
with mods or dropout, and the backward, run on the tiles.  Sinks are merged after the kernel
by the API, as for the dense call.  Half inputs reach the block functions as their bits
(:func:`kernels._dtypes.bits_view`), as in the dense kernels: K and V tiles are widened
into float32 scratch per task, lse, Δ and dq's accumulator are float32, and out, dk and
dv are written as half bits (the sequence-major copies above are of the bits).
"""

from __future__ import annotations

import heapq
from contextlib import nullcontext

import numba
import numpy as np
from numba import njit, prange

from ..._dropout import dropout_threshold
from ..._dtypes import bits_dtype, bits_view, compute_dtype, rounded_to
from ..._jit.half import compute_dtype_of
from ..._jit.launch import launch_guard, single_threaded_blas
from ..._jit.twins import uncached_twin
from ..._problems.varlen import VarlenProblem
from ...mods import cache as mods_cache
from ...mods.dense import run_user_code
from ...mods.lowering import user_names
from .. import config, planner
from ..dense import mods as cpu_mods
from ..dense.backward import key_block
from ..dense.forward import attend_block, mask_arguments, mod_functions
from ..dense.mods import mask_block_rows
from . import micro as varlen_micro


@njit(cache=True)
def _task(bins, t, n, cu_q, cu_k, bottom_right):
    """Task ``n`` of bin ``t`` (see :func:`deal`): ``(b, head, lo, hi, q0, q1, k0, k1,
    offset)``, sequence b's rows [q0, q1) and keys [k0, k1) and its causal offset; b < 0
    past the bin's last task."""
    b = bins[t, n, 0]
    if b < 0:
        return b, b, b, b, b, b, b, b, b
    q0, q1, k0, k1 = cu_q[b], cu_q[b + 1], cu_k[b], cu_k[b + 1]
    offset = (k1 - k0) - (q1 - q0) if bottom_right else 0
    return b, bins[t, n, 1], bins[t, n, 2], bins[t, n, 3], q0, q1, k0, k1, offset


def _forward(qf, kf, vf, of, lf, cu_q, cu_k, lengths_k, bins, heads, causal, bottom_right,
             scale, threshold, keep_scale, seed, block_k, narrow_k, blas, mask, mask_strides,
             has_mask, mask_fn, tile_fn, mask_args, score_fn, score_args):
    """Each task on its sequence's contiguous (1, H, L_b, D) blocks, batch index 0 for the
    arrays and b for the mods and the dropout.

    ``mask, mask_strides, has_mask``: :func:`kernels.numba_cpu.dense.forward.mask_arguments` of a
    problem without a dense mask (a read-only bool placeholder, has_mask False).  With them,
    ``has_mask`` for ``want_weights`` and a batch index 0 computed at run time (a constant
    would be typed as a literal), the call of :func:`attend_block` has the types of a dense
    call with the same mods: its compiled code is shared."""
    H, Hkv, D, Dv = heads[0], heads[1], heads[2], heads[3]
    weights = np.empty((1, 1, 1, 1), dtype=compute_dtype_of(qf))
    batch = np.int64(0)  # each sequence is batch 0 of its (1, H, L, D) blocks
    for t in prange(bins.shape[0]):
        for n in range(bins.shape[1]):
            b, h, i0, i1, q0, q1, k0, k1, offset = _task(bins, t, n, cu_q, cu_k, bottom_right)
            if b < 0:
                break
            attend_block(qf[H * D * q0:H * D * q1].reshape((1, H, q1 - q0, D)),
                          kf[Hkv * D * k0:Hkv * D * k1].reshape((1, Hkv, k1 - k0, D)),
                          vf[Hkv * Dv * k0:Hkv * Dv * k1].reshape((1, Hkv, k1 - k0, Dv)),
                          mask, mask_strides, has_mask, lengths_k[b:b + 1], causal, offset,
                          scale, threshold, keep_scale, seed,
                          of[H * Dv * q0:H * Dv * q1].reshape((1, H, q1 - q0, Dv)), weights,
                          has_mask, batch, b, h, i0, i1, block_k, narrow_k, blas,
                          lf[H * q0:H * q1].reshape((1, H, q1 - q0)),
                          mask_fn, tile_fn, mask_args, score_fn, score_args)


def _backward(qf, kf, vf, dof, lf, rf, cu_q, cu_k, bins, heads, causal, bottom_right,
              scale, threshold, keep_scale, seed, dq_parts, dkf, dvf, block_q, blas,
              mask, mask_strides, has_mask, mask_fn, tile_fn, mask_args, score_fn, score_args,
              grad_fn):
    """As :func:`_forward`, for :func:`kernels.numba_cpu.dense.backward.key_block`; each bin
    (thread) adds into its own copy of dq."""
    H, Hkv, D, Dv = heads[0], heads[1], heads[2], heads[3]
    batch = np.int64(0)  # each sequence is batch 0 of its (1, H, L, D) blocks
    for t in prange(bins.shape[0]):
        for n in range(bins.shape[1]):
            b, hk, j0, j1, q0, q1, k0, k1, offset = _task(bins, t, n, cu_q, cu_k, bottom_right)
            if b < 0:
                break
            Lq, Lk = q1 - q0, k1 - k0
            key_block(qf[H * D * q0:H * D * q1].reshape((1, H, Lq, D)),
                       kf[Hkv * D * k0:Hkv * D * k1].reshape((1, Hkv, Lk, D)),
                       vf[Hkv * Dv * k0:Hkv * Dv * k1].reshape((1, Hkv, Lk, Dv)),
                       dof[H * Dv * q0:H * Dv * q1].reshape((1, H, Lq, Dv)),
                       lf[H * q0:H * q1].reshape((1, H, Lq)), rf[H * q0:H * q1].reshape((1, H, Lq)),
                       mask, mask_strides, has_mask, causal, offset, scale, threshold,
                       keep_scale, seed, dq_parts[t, H * D * q0:H * D * q1].reshape((1, H, Lq, D)),
                       dkf[Hkv * D * k0:Hkv * D * k1].reshape((1, Hkv, Lk, D)),
                       dvf[Hkv * Dv * k0:Hkv * Dv * k1].reshape((1, Hkv, Lk, Dv)),
                       batch, b, hk, j0, j1, block_q, blas,
                       mask_fn, tile_fn, mask_args, score_fn, score_args, grad_fn)


# Without mods, or with built-ins only (kernels.mods.cache), cached on disk; with a user
# function, compiled per process (its dispatcher's type cannot be found again).
FORWARD = njit(parallel=True, cache=True)(_forward)
FORWARD_USER = uncached_twin(FORWARD, attend_block)
BACKWARD = njit(parallel=True, cache=True)(_backward)
BACKWARD_USER = uncached_twin(BACKWARD)


def deal(tasks: list, costs: list, threads: int) -> np.ndarray:
    """Tasks (4 ints each) in ``threads`` bins of about equal cost, longest first (LPT):
    int64 (threads, most tasks in a bin, 4), padded with -1."""
    bins = [[] for _ in range(max(threads, 1))]
    heap = [(0, n) for n in range(len(bins))]
    for index in np.argsort(-np.asarray(costs, dtype=np.float64), kind="stable"):
        load, n = heapq.heappop(heap)
        bins[n].append(tasks[index])
        heapq.heappush(heap, (load + costs[index], n))
    table = np.full((len(bins), max(1, max(len(b) for b in bins)), 4), -1, dtype=np.int64)
    for n, b in enumerate(bins):
        if b:
            table[n, :len(b)] = b
    return table


def _query_tasks(problem: VarlenProblem, block_q: int):
    H = problem.heads[0]
    tasks, costs = [], []
    for b, (Lq, Lk) in enumerate(zip(problem.lengths_q, problem.lengths_k, strict=True)):
        offset = problem.offset(b)
        for i0 in range(0, int(Lq), block_q):
            i1 = min(i0 + block_q, int(Lq))
            keys = Lk if offset is None else min(Lk, max(i1 + offset, 0))
            for h in range(H):
                tasks.append((b, h, i0, i1))
                costs.append((i1 - i0) * (keys + 1))
    return tasks, costs


def _key_tasks(problem: VarlenProblem, block_k: int):
    H, Hkv = problem.heads[:2]
    tasks, costs = [], []
    for b, (Lq, Lk) in enumerate(zip(problem.lengths_q, problem.lengths_k, strict=True)):
        offset = problem.offset(b)
        end = int(Lk) if offset is None else min(int(Lk), int(Lq) + offset)
        for j0 in range(0, max(end, 0), block_k):
            rows = Lq if offset is None else Lq - max(j0 - offset, 0)
            for hk in range(Hkv):
                tasks.append((b, hk, j0, min(j0 + block_k, end)))
                costs.append(max(rows, 0) * (H // Hkv) * block_k + 1)
    return tasks, costs


def _by_sequence(x, cu):
    """Packed (total, heads, X) -> flat, sequence after sequence, each (heads, rows, X)
    (written in place: no temporary copy of a sequence)."""
    flat = np.empty(x.size, dtype=x.dtype)
    heads, width = x.shape[1], x.shape[1] * x.shape[2]
    for b in range(len(cu) - 1):
        block = flat[width * cu[b]:width * cu[b + 1]].reshape(heads, cu[b + 1] - cu[b], x.shape[2])
        block[...] = x[cu[b]:cu[b + 1]].transpose(1, 0, 2)
    return flat


def _packed_back(flat, cu, heads: int, width: int):
    """The inverse of :func:`_by_sequence`: (total, heads, width)."""
    out = np.empty((cu[-1], heads, width), dtype=flat.dtype)
    for b in range(len(cu) - 1):
        rows = cu[b + 1] - cu[b]
        block = flat[heads * width * cu[b]:heads * width * cu[b + 1]]
        out[cu[b]:cu[b + 1]] = block.reshape(heads, rows, width).transpose(1, 0, 2)
    return out


def _lse_packed_back(flat, cu, heads: int):
    """Sequence-major lse (each (heads, rows)) -> (heads, total)."""
    out = np.empty((heads, cu[-1]), dtype=flat.dtype)
    for b in range(len(cu) - 1):
        rows = cu[b + 1] - cu[b]
        out[:, cu[b]:cu[b + 1]] = flat[heads * cu[b]:heads * cu[b + 1]].reshape(heads, rows)
    return out


def _lse_by_sequence(lse, cu):
    return np.concatenate([lse[:, cu[b]:cu[b + 1]].ravel() for b in range(len(cu) - 1)]
                          + [np.empty(0, lse.dtype)])


def _qkv_by_sequence(problem: VarlenProblem):
    """q, k and v (their bits, for half inputs) sequence-major, as :func:`_by_sequence`."""
    return (_by_sequence(bits_view(problem.q), problem.cu_seqlens_q),
            _by_sequence(bits_view(problem.k), problem.cu_seqlens_k),
            _by_sequence(bits_view(problem.v), problem.cu_seqlens_k))


def _common(problem: VarlenProblem):
    dtype = compute_dtype(problem.dtype).type  # float32 for half inputs
    return (problem.causal is not False, problem.causal == "bottom-right", dtype(problem.scale),
            np.uint64(dropout_threshold(problem.dropout_p)),
            dtype(1.0 / (1.0 - problem.dropout_p)), np.uint64(problem.seed))


def micro_block(problem: VarlenProblem, micro: bool | None = None):
    """The register block of the micro-kernel path for this packed call, or None (the tiles).

    Plain calls only (no mods, no dropout, Dv > 0); where ``micro`` is None, the block the
    planner stored for the dtype (float32's for half inputs) where it chose the micro-kernel
    (:func:`kernels.numba_cpu.planner.stored_block`: a packed call never plans); where it
    is True, that block or the dtype's default; never where it is False.
    """
    if (micro is False or problem.mask_mod is not None or problem.score_mod is not None
            or problem.dropout_p or problem.heads[3] == 0):
        return None
    return planner.stored_block(compute_dtype(problem.dtype), default=bool(micro))


def run(problem: VarlenProblem, micro: bool | None = None):
    """``(out (total_q, H, Dv), lse (H, total_q))`` of a validated packed call, no sinks;
    ``micro``: as :func:`micro_block`."""
    H, _, _, Dv = problem.heads
    total_q, cu_q = problem.q.shape[0], problem.cu_seqlens_q
    of = np.zeros(H * total_q * Dv, dtype=bits_dtype(problem.dtype))  # half: its bits
    lf = np.full(H * total_q, -np.inf, dtype=compute_dtype(problem.dtype))  # sequence-major
    threads = numba.get_num_threads()
    block = micro_block(problem, micro)
    if block is None:
        _run_tiles(problem, of, lf, threads)
    else:
        tasks, costs = varlen_micro.split_tasks(problem, threads)
        if tasks:
            varlen_micro.run(problem, block, of, lf, _qkv_by_sequence(problem),
                             deal(tasks, costs, threads))
    return _packed_back(of, cu_q, H, Dv).view(problem.dtype), _lse_packed_back(lf, cu_q, H)


def _run_tiles(problem: VarlenProblem, of, lf, threads: int) -> None:
    """Fill ``of`` and ``lf`` (as :func:`kernels.numba_cpu.varlen.micro.run`) on the tiles."""
    block_q, narrow_k = config.BLOCK_Q, config.BLOCK_K_DIAGONAL
    shape_problem = problem.mods_problem()
    mods = mod_functions(shape_problem)
    if problem.mask_mod is not None:
        block_q = mask_block_rows(shape_problem, mods[1], mods[2], config.MOD_BLOCK_Q)
        narrow_k = config.CELL_K
    tasks, costs = _query_tasks(problem, block_q)
    while len(tasks) < 4 * threads and block_q > config.MIN_BLOCK_Q:
        block_q //= 2
        tasks, costs = _query_tasks(problem, block_q)
    if not tasks:
        return
    blas = True if config.HAVE_BLAS else None
    args = (*_qkv_by_sequence(problem), of, lf, problem.cu_seqlens_q, problem.cu_seqlens_k,
            problem.lengths_k, deal(tasks, costs, threads),
            np.array(problem.heads, dtype=np.int64)
            ) + _common(problem) + (config.BLOCK_K, narrow_k, blas,
                                    *mask_arguments(shape_problem)) + mods
    cached = all(f is None or mods_cache.all_cached(f) for f in (mods[0], mods[1], mods[3]))
    with launch_guard(), single_threaded_blas() if blas else nullcontext():
        run_user_code(user_names(shape_problem), FORWARD if cached else FORWARD_USER, *args)


def run_backward(problem: VarlenProblem, dout, out, lse):
    """``(dq, dk, dv)`` in the packed layouts from the forward's ``out`` and (keys-only
    marked, see :func:`kernels._problems.sinks.keys_only_lse`) ``lse`` (H, total_q)."""
    H, Hkv, D, Dv = problem.heads
    dtype, bits = compute_dtype(problem.dtype).type, bits_dtype(problem.dtype)
    threads = numba.get_num_threads()
    tasks, costs = _key_tasks(problem, config.BACKWARD_BLOCK_K)
    if not tasks or Dv == 0:
        return (np.zeros_like(problem.q), np.zeros_like(problem.k), np.zeros_like(problem.v))
    bins = deal(tasks, costs, threads)
    cu_q, cu_k = problem.cu_seqlens_q, problem.cu_seqlens_k
    blas = True if config.HAVE_BLAS else None
    shape_problem = problem.mods_problem()
    dof, of = _by_sequence(dout, cu_q), _by_sequence(out, cu_q)
    wide = (dof.astype(dtype, copy=False), of.astype(dtype, copy=False))  # half: float32
    with np.errstate(invalid="ignore", over="ignore"):  # Δ per row, sequence-major
        row_dot = np.concatenate(
            [np.einsum("hid,hid->hi", *(f[H * Dv * cu_q[b]:H * Dv * cu_q[b + 1]].reshape(
                H, cu_q[b + 1] - cu_q[b], Dv) for f in wide)).ravel()
             for b in range(problem.n_seq)] + [np.empty(0, dtype)])
    dq_parts = np.zeros((bins.shape[0], problem.q.size), dtype=dtype)
    dkf = np.zeros(problem.k.size, dtype=bits)
    dvf = np.zeros(problem.v.size, dtype=bits)
    mods, names, kernel = (None,) * 6, (), BACKWARD
    if problem.score_mod is not None or problem.mask_mod is not None:
        mods, names = cpu_mods.mod_functions(shape_problem)
        if not cpu_mods.cacheable(mods):
            kernel = BACKWARD_USER
    args = (*_qkv_by_sequence(problem), bits_view(dof),
            _lse_by_sequence(np.ascontiguousarray(lse), cu_q),
            row_dot, cu_q, cu_k, bins, np.array(problem.heads, dtype=np.int64)
            ) + _common(problem) + (dq_parts, dkf, dvf, config.BACKWARD_BLOCK_Q, blas,
                                    *mask_arguments(shape_problem)) + mods
    with launch_guard(), single_threaded_blas() if blas else nullcontext():
        run_user_code(names, kernel, *args)
    dq = dq_parts.sum(axis=0) * dtype(problem.scale)
    return (rounded_to(_packed_back(dq, cu_q, H, D), problem.dtype),
            _packed_back(dkf, cu_k, Hkv, D).view(problem.dtype),
            _packed_back(dvf, cu_k, Hkv, Dv).view(problem.dtype))
