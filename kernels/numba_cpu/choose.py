"""The ``numba`` backend's forward entry: which path a call takes.

- without dropout or weights, a parallel call takes the register-blocked micro-kernel
  path (:mod:`kernels.numba_cpu.dense.micro`; with a ``score_mod`` or ``mask_mod``, or a dense
  ``mask`` turned into mods by :func:`kernels.mods.dense_mask.as_mods`,
  :mod:`kernels.numba_cpu.dense.micro_mods`) where the planner
  (:mod:`kernels.numba_cpu.planner`) chose it for the machine and dtype;
- else the tile kernel (:func:`kernels.numba_cpu.dense.forward.run_tiles`; a ``score_mod`` or
  ``mask_mod`` compiled in), serial for small problems
  (:func:`kernels.numba_cpu.dense.forward.is_small`), parallel otherwise.
"""

from __future__ import annotations

import dataclasses

from .._dtypes import compute_dtype, is_half
from .._problems.dense import AttentionProblem
from ..mods import dense_mask
from . import planner
from .dense import forward, micro_mods
from .dense import micro as micro_kernel


def micro_block(problem: AttentionProblem, parallel, use_blas, micro):
    """The register block of the micro-kernel path for this call, or None for the tiles.

    The path computes no dropout or weights (mods it does, and a dense mask as mods when
    the call has no other mods: the same choice as the call without them), no values of
    width Dv = 0 (it launches nothing then, and lse would be left unset) and runs
    parallel; it is taken where
    ``micro`` is True (the planned block, else the dtype's default), or where
    ``micro`` and ``use_blas`` are None, the problem is not small and the planner
    chose it for this machine (:func:`kernels.numba_cpu.planner.block_for`).  Half inputs
    take it as float32 does (the float32 plan and choice serve them) where it packs fused
    (:func:`kernels.numba_cpu.dense.micro.fuses`: each task widens one key head into float32
    panels, never the whole K and V), and without mods or a mask; else the tiles.
    """
    has_mods = problem.mask_mod is not None or problem.score_mod is not None
    half_tiles = is_half(problem.dtype) and (has_mods or problem.mask is not None
                                             or not micro_kernel.fuses(problem))
    mask_tiles = problem.mask is not None and has_mods
    if (micro is False or half_tiles or mask_tiles or problem.dropout_p
            or problem.return_weights or parallel is False or problem.shape[-1] == 0):
        return None
    if micro:
        return planner.stored_block(compute_dtype(problem.dtype), default=True)
    if use_blas is not None or (parallel is None and forward.is_small(problem)):
        return None
    return planner.block_for(problem)


def run(problem: AttentionProblem, *, parallel: bool | None = None,
        use_blas: bool | None = None, return_lse: bool = False, micro: bool | None = None):
    """Fused attention for a validated problem; returns ``(out, weights or None)``.

    With ``return_lse``, ``(out, weights or None, lse)``: lse (B, H, Lq), the log-sum-exp of
    each row's visible scores (``-inf`` for a row that sees no key).

    Parameters
    ----------
    problem : AttentionProblem
    parallel : bool, optional
        Force the parallel (True) or serial (False) kernel; default: serial for small
        problems (see ``config.SERIAL_WORK_LIMIT``), parallel otherwise.
    use_blas : bool, optional
        Compute the tile products with the BLAS (True) or with Numba loops (False);
        default: the BLAS where SciPy is installed (``config.HAVE_BLAS``), unless the
        micro-kernel path is taken.
    micro : bool, optional
        Take the register-blocked micro-kernel path (no dropout or weights; parallel; mods,
        or a dense mask without mods, too) if True, never if False; default: where the
        planner chose it for this machine and dtype (see :func:`micro_block`).
    """
    block = micro_block(problem, parallel, use_blas, micro)
    if block is not None:
        if problem.mask is not None:  # no mods beside it (micro_block)
            mask_mod, score_mod = dense_mask.as_mods(problem.mask)
            problem = dataclasses.replace(problem, mask=None, mask_mod=mask_mod,
                                          score_mod=score_mod)
        if problem.mask_mod is None and problem.score_mod is None:
            out, lse = micro_kernel.run(problem, block)
        else:
            out, lse = micro_mods.run(problem, block)
        return (out, None, lse) if return_lse else (out, None)
    return forward.run_tiles(problem, parallel=parallel, use_blas=use_blas,
                             return_lse=return_lse)

