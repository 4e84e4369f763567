"""The harness's own small CUDA kernels (imported by :mod:`attnbench.measure.gpu_timing` on use).

They live in a module of their own that imports ``numba.cuda`` at the top, as kernels
must for Numba's CUDA simulator (it swaps the module's ``cuda`` global while a kernel
runs), so that importing :mod:`attnbench.measure.gpu_timing` does not import numba.cuda.
"""

from __future__ import annotations

import functools

import numba
import numpy as np
from numba import cuda

#: Independent FMA chains per thread of the FMA kernel (enough to hide the FMA latency).
FMA_CHAINS = 8


def fma_source(dtype):
    """The FMA kernel for ``dtype`` as a plain Python function (see :func:`fma_kernel`).

    Every constant is made in ``dtype``, so the float32 kernel has no float64 instruction
    (tests/test_gpu_timing.py checks its PTX).
    """
    F = numba.from_dtype(np.dtype(dtype))
    STEP = F(1.0 / 1024)

    def fma_loop(out, iterations, a, b):
        i = cuda.grid(1)
        x0 = F(i % 64) * STEP
        x1 = x0 + STEP
        x2 = x1 + STEP
        x3 = x2 + STEP
        x4 = x3 + STEP
        x5 = x4 + STEP
        x6 = x5 + STEP
        x7 = x6 + STEP
        for _ in range(iterations):
            x0 = cuda.fma(x0, a, b)
            x1 = cuda.fma(x1, a, b)
            x2 = cuda.fma(x2, a, b)
            x3 = cuda.fma(x3, a, b)
            x4 = cuda.fma(x4, a, b)
            x5 = cuda.fma(x5, a, b)
            x6 = cuda.fma(x6, a, b)
            x7 = cuda.fma(x7, a, b)
        if i < out.shape[0]:
            out[i] = ((x0 + x1) + (x2 + x3)) + ((x4 + x5) + (x6 + x7))

    return fma_loop


def fma_signature(dtype):
    """The FMA kernel's argument types: ``(out[::1], iterations, a, b)``."""
    F = numba.from_dtype(np.dtype(dtype))
    return (numba.types.Array(F, 1, "C"), numba.types.int64, F, F)


@functools.cache
def fma_kernel(dtype):
    """A kernel of FMA_CHAINS independent FMA chains per thread, in ``dtype`` only.

    Thread i starts its chains at (i mod 64) / 1024 + c / 1024 (c = 0..7), applies
    ``x <- fma(x, a, b)`` ``iterations`` times to each, and writes the sum of its chains
    (summed pairwise) to ``out[i]``: 2 · FMA_CHAINS · iterations FLOPs per thread.
    """
    return cuda.jit(fma_source(dtype))


def blocker_source(microseconds):
    """Keep the GPU busy about ``microseconds`` µs (one thread, nanosleep; sm_70 and later)."""
    for _ in range(microseconds):
        cuda.nanosleep(1000)


BLOCKER_SIGNATURE = (numba.types.uint32,)


@functools.cache
def blocker():
    """The compiled :func:`blocker_source` (device only: the simulator has no nanosleep)."""
    return cuda.jit(BLOCKER_SIGNATURE)(blocker_source)
