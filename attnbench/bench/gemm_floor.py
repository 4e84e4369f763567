"""The numba kernel's two tile GEMMs alone: a floor under its time.

The ``numba`` backend (:mod:`kernels.numba_cpu`) spends most of its time in two BLAS
products per tile, ``S = Q_blk · K_tileᵀ`` and ``P · V_tile``; the softmax between them
(scale, row max, exp, sums, rescaling) is the rest.  :func:`tile_gemms` runs the same
products on the same tiles, split into the same parallel tasks, with the BLAS held to one
thread in the same way, and nothing else: validation as in a kernel call, then no softmax
and no masking.  Its time is what the kernel would take if the softmax were free, so
``tile GEMMs / torch`` is the lowest ``numba / torch`` ratio that any kernel built on these
BLAS calls can reach on the machine.  ``attnbench bench`` times it beside the kernel on
non-causal shapes that run the parallel kernel (:func:`measurable`): the causal kernel's
diagonal tiles have no single counterpart, and small problems run the serial kernel.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import numba
import numpy as np
from numba import njit, prange

from attnbench import kernels
from attnbench.kernels._jit import launch as jit_launch
from attnbench.kernels.numba_cpu import config
from attnbench.kernels.numba_cpu.dense import forward

__all__ = ["available", "measurable", "tile_gemms", "tile_gemms_call"]


def available() -> bool:
    """True where the kernel uses the BLAS (SciPy and threadpoolctl installed)."""
    return config.HAVE_BLAS


def measurable(q: np.ndarray, k: np.ndarray, v: np.ndarray) -> bool:
    """True where the kernel would run these inputs in parallel with the BLAS: the floor's case."""
    return available() and not forward.is_small(kernels.prepare(q, k, v))


@njit(parallel=True, cache=True)
def _tile_gemms(q, k, v, out, block_q, block_k):
    B, H, Lq = q.shape[0], q.shape[1], q.shape[2]
    Hkv, Lk, Dv = k.shape[1], k.shape[2], v.shape[3]
    n_blocks = (Lq + block_q - 1) // block_q
    # (batch, head, query block): the kernel's tasks, in plain order (its zigzag order only
    # balances causal blocks)
    for task in prange(B * H * n_blocks):
        bh, block = task // n_blocks, task % n_blocks
        b, h = bh // H, bh % H
        hk = h // (H // Hkv)
        i0 = block * block_q
        i1 = min(i0 + block_q, Lq)
        s_buf = np.empty((i1 - i0) * block_k, dtype=q.dtype)
        o = np.empty((i1 - i0, Dv), dtype=q.dtype)
        for j0 in range(0, Lk, block_k):
            j1 = min(j0 + block_k, Lk)
            s = s_buf[:(i1 - i0) * (j1 - j0)].reshape((i1 - i0, j1 - j0))
            np.dot(q[b, h, i0:i1], k[b, hk, j0:j1].T, s)
            np.dot(s, v[b, hk, j0:j1], o)
        out[b, h, i0:i1] = o  # keeps the products from being optimised away


def tile_gemms(q: np.ndarray, k: np.ndarray, v: np.ndarray) -> np.ndarray:
    """Run the numba kernel's tile GEMMs (non-causal, no mask) on ``q``, ``k``, ``v``.

    Parameters
    ----------
    q : ndarray, shape (B, H, Lq, D)
    k, v : ndarray, shape (B, Hkv, Lk, D) and (B, Hkv, Lk, Dv)
        float32 or float64, as :func:`kernels.attention` takes them.

    Returns
    -------
    ndarray, shape (B, H, Lq, Dv)
        The last tile's ``P · V`` product of each query block (meaningless: it is only
        there so that the work is done).

    Raises
    ------
    kernels.BackendUnavailableError
        Without SciPy the kernel uses no BLAS, and there is no floor to measure.
    ValueError
        For a problem the kernel runs serially (:func:`kernels.numba_cpu.is_small`): the
        floor models the parallel kernel.
    """
    if not available():
        from attnbench.kernels import BackendUnavailableError

        raise BackendUnavailableError("the tile GEMMs need SciPy's BLAS (and threadpoolctl)")
    problem = kernels.prepare(q, k, v)
    if forward.is_small(problem):
        raise ValueError(f"shape {problem.shape} runs the serial kernel: no parallel floor")
    block_q = forward.block_rows(problem, numba.get_num_threads())
    B, H, _, Lq, _, _, Dv = problem.shape
    out = np.empty((B, H, Lq, Dv), dtype=problem.dtype)
    with jit_launch.launch_guard(), jit_launch.single_threaded_blas():
        _tile_gemms(problem.q, problem.k, problem.v, out, block_q, config.BLOCK_K)
    return out


def tile_gemms_call(q: np.ndarray, k: np.ndarray, v: np.ndarray) -> Callable[[], np.ndarray]:
    """A no-argument call of :func:`tile_gemms` on these inputs (for the timers)."""
    return functools.partial(tile_gemms, q, k, v)
