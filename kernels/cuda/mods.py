"""The ``cuda`` backend for calls with a ``score_mod`` or ``mask_mod`` (:mod:`kernels.mods`).

The kernel of :mod:`kernels.cuda.launch` (one thread per query row, K and V tiles in
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

import numba
import numpy as np
from numba import cuda

from .._problems.dense import AttentionProblem
from ..mods import lowering as mc
from .device import SIMULATOR
from .source import _signature, kernel_source


def device_functions(problem: AttentionProblem):
    """``(mask_fn, tile_fn, mask_args, score_fn, score_args)`` as CUDA device functions."""
    return mc.mod_arguments(problem, "cuda")


def _kernel(dtype, mask_fn, tile_fn, score_fn):
    def build():
        source = kernel_source(dtype, mask_fn, tile_fn, score_fn)
        return cuda.jit(source) if SIMULATOR else cuda.jit(cache=False)(source)

    return mc.memo(("cuda_kernel", np.dtype(dtype).name, mask_fn, tile_fn, score_fn), build)


def signature(problem: AttentionProblem) -> tuple:
    """The kernel's argument types for ``problem`` (for :func:`compile_ptx`)."""
    mask_fn, tile_fn, mask_args, score_fn, score_args = device_functions(problem)
    return _signature(problem.dtype)[:-2] + (numba.typeof(mask_args),
                                             numba.typeof(score_args))


def compile_ptx(problem: AttentionProblem, cc=(9, 0)) -> str:
    """PTX of the kernel a problem with mods runs; needs NVVM, not a GPU (simulator off)."""
    if SIMULATOR:
        raise RuntimeError("compile_ptx needs numba-cuda with NUMBA_ENABLE_CUDASIM unset")
    mask_fn, tile_fn, _, score_fn, _ = device_functions(problem)
    source = kernel_source(problem.dtype, mask_fn, tile_fn, score_fn)
    ptx, _ = cuda.compile_ptx(source, signature(problem), cc=tuple(cc))
    return ptx


def kernel_and_arguments(problem: AttentionProblem, stream=0):
    """The compiled kernel for the problem's mods and its two last arguments
    ``(mask_args, score_args)``, arrays copied to the device (for
    :func:`kernels.cuda.launch._launcher`)."""
    mask_fn, tile_fn, mask_args, score_fn, score_args = device_functions(problem)
    kernel = _kernel(problem.dtype, mask_fn, tile_fn, score_fn)
    on_device = tuple(
        tuple(cuda.to_device(a, stream=stream) if isinstance(a, np.ndarray) else a
              for a in group)
        for group in (mask_args, score_args))
    return kernel, on_device
