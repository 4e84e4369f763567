"""The packed forward (:func:`kernels.attention_varlen`, ``numba``) on the micro-kernel path.

Where the planner chose the register-blocked micro-kernel for dense calls of the dtype
(:mod:`kernels.numba_cpu.planner`), a plain packed call (no ``mask_mod``, ``score_mod`` or
dropout) takes it too, so that a packed batch runs the micro-kernel its large dense calls
run (small dense calls, and half ones without enough heads to fuse, run the tiles). A task
is (sequence b, key head hk, a range of query rows): it packs the keys and values of (b,
hk) that its rows can see into panels (:func:`kernels.numba_cpu.dense.micro.pack_head`), then
runs the dense micro-kernel's query blocks (:func:`kernels.numba_cpu.dense.micro.attend_rows`) for
each query head of hk's group over its rows, on the sequence's C-contiguous (1, H, L_b, D)
blocks of the sequence-major copies :mod:`kernels.numba_cpu.varlen.blocks` makes. A sequence's
rows are one task unless there are fewer than four tasks per thread or one task holds more
than a thread's share of the work; then they are split (each part packs the keys it sees
again: under a causal mask, only those). Tasks are dealt to the threads by their work,
longest first (:func:`kernels.numba_cpu.varlen.blocks.deal`).

Half inputs: their bits, widened into the float32 panels as they are packed (one key
head per task, never a float32 copy of K or V), out rounded once to the input dtype.
"""

from __future__ import annotations

import numpy as np
from numba import literally, njit, prange

from ..._dtypes import compute_dtype
from ..._jit.half import compute_dtype_of
from ..._jit.launch import launch_guard
from ..._problems.varlen import VarlenProblem
from ..dense.micro import BLOCK_K, BLOCK_Q, attend_rows, launch_kernel, pack_head


@njit(parallel=True, cache=True)
def _kernel(qf, kf, vf, of, lf, cu_q, cu_k, lengths_k, bins, heads, bottom_right, causal,
            scale, block_q, block_k, mr, nr):
    """Each task ``(b, hk, i0, i1)`` of ``bins`` (threads, tasks, 4): pack (b, hk)'s
    visible keys, then every query block of rows [i0, i1) of each head of hk's group."""
    literally(mr)  # compile-time constants, as micro._kernel
    literally(nr)
    H, Hkv, D, Dv = heads[0], heads[1], heads[2], heads[3]
    group, Dv_pad = H // Hkv, -(-Dv // nr) * nr
    batch = np.int64(0)  # each sequence is batch 0 of its (1, H, L, D) blocks
    for t in prange(bins.shape[0]):
        for n in range(bins.shape[1]):
            b, hk, r0, r1 = bins[t, n, 0], bins[t, n, 1], bins[t, n, 2], bins[t, n, 3]
            if b < 0:
                break
            q0, q1, k0, k1 = cu_q[b], cu_q[b + 1], cu_k[b], cu_k[b + 1]
            Lq, Lk = q1 - q0, k1 - k0
            offset = Lk - Lq if bottom_right else 0
            key_end = min(Lk, max(r1 + offset, 0)) if causal else Lk
            kb = kf[Hkv * D * k0:Hkv * D * k1].reshape((1, Hkv, Lk, D))
            vb = vf[Hkv * Dv * k0:Hkv * Dv * k1].reshape((1, Hkv, Lk, Dv))
            kp = np.empty((-(-key_end // nr), D, nr), dtype=compute_dtype_of(qf))
            vp = np.empty((key_end, Dv_pad), dtype=compute_dtype_of(qf))
            pack_head(kb, vb, key_end, batch, hk, kp, vp)
            qb = qf[H * D * q0:H * D * q1].reshape((1, H, Lq, D))
            ob = of[H * Dv * q0:H * Dv * q1].reshape((1, H, Lq, Dv))
            lb = lf[H * q0:H * q1].reshape((1, H, Lq))
            for h in range(hk * group, (hk + 1) * group):
                for i0 in range(r0, r1, block_q):
                    attend_rows(qb, kp, vp, lengths_k[b:b + 1], causal, offset, scale, ob, lb,
                            batch, h, i0, min(i0 + block_q, r1), block_k, mr, nr)


def tasks(problem: VarlenProblem, rows: int, block_q: int = BLOCK_Q):
    """``(tasks, costs)``: ``(b, hk, i0, i1)`` for each key head of each sequence's rows in
    parts of ``rows`` (a multiple of ``block_q``), with the work of each (its group's rows
    times the keys its last row sees: the visible pairs, or a bound on them under a causal
    mask, plus the keys it packs); none for rows that see no key (the output is 0 there
    already)."""
    H, Hkv = problem.heads[:2]
    found, costs = [], []
    for b, (Lq, Lk) in enumerate(zip(problem.lengths_q, problem.lengths_k, strict=True)):
        offset = problem.offset(b)
        for i0 in range(0, int(Lq), rows):
            i1 = min(i0 + rows, int(Lq))
            keys = int(Lk) if offset is None else min(int(Lk), max(i1 + offset, 0))
            if keys == 0:
                continue
            for hk in range(Hkv):
                found.append((b, hk, i0, i1))
                costs.append((H // Hkv) * (i1 - i0) * keys + keys)  # + packing
    return found, costs


def split_tasks(problem: VarlenProblem, threads: int, block_q: int = BLOCK_Q):
    """:func:`tasks` in the longest parts that give four tasks per thread and no task more
    work than a thread's share (whole sequences where that holds), or parts of ``block_q``
    rows.  Each halving of the parts packs the keys of a sequence's head once more per part,
    so sequences are split only as far as the balance needs."""
    longest = int(problem.lengths_q.max(initial=0))
    rows = max(block_q, -(-longest // block_q) * block_q)
    found, costs = tasks(problem, rows, block_q)
    while rows > block_q and (len(found) < 4 * threads
                              or max(costs) * max(threads, 1) > sum(costs)):
        rows = max(block_q, -(-(rows // 2) // block_q) * block_q)
        found, costs = tasks(problem, rows, block_q)
    return found, costs


def run(problem: VarlenProblem, block, of, lf, sequence_major, bins) -> None:
    """Fill ``of`` (the output's bits, sequence-major, zero) and ``lf`` (lse, sequence-major,
    ``-inf``) for a plain packed call by the register block ``block = (mr, nr)``.

    ``sequence_major``: q, k and v (their bits) sequence after sequence, as
    :func:`kernels.numba_cpu.varlen.blocks._qkv_by_sequence` returns them; ``bins``: the tasks of
    :func:`split_tasks` dealt to the threads (:func:`kernels.numba_cpu.varlen.blocks.deal`).
    """
    mr, nr = block
    dtype = compute_dtype(problem.dtype).type
    args = (*sequence_major, of, lf, problem.cu_seqlens_q, problem.cu_seqlens_k,
            problem.lengths_k, bins, np.array(problem.heads, dtype=np.int64),
            problem.causal == "bottom-right", problem.causal is not False,
            dtype(problem.scale), BLOCK_Q, -(-BLOCK_K // nr) * nr)
    with launch_guard():
        launch_kernel(args, mr, nr, kernel=_kernel)
