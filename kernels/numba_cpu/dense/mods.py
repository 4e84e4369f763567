"""What the ``numba`` kernels take for a ``score_mod`` or ``mask_mod`` (:mod:`kernels.mods`).

Block sparsity: a (query block, key cell) tile is classified by the mask's tile function,
the causal diagonal and the dense mask (:func:`classify`): an EMPTY tile is skipped (its
keys and values, in the backward also its queries and output gradients, are not read), a
FULL one needs no per-element check, a PARTIAL one checks every pair.  Under a mask
function the forward picks its query block by the pairs blocks compute
(:func:`mask_block_rows`).

The backward.  With X = scale · q · k the score the softmax sees is f(X) (+ the additive
mask), so

    P  = exp(f(X) + mask − lse),   dS = P ∘ (dPd ∘ Z · κ − Δ) ∘ f'(X)

where f' is the score function's derivative (its ``grad``): :func:`mod_functions` adds it
to the forward's mod arguments.

Disk cache: built-ins (and the identities) are given as :class:`kernels.mods.cache.CachedFn`,
the score function's derivative too (its ``"grad"`` key), so that a kernel specialised on
them is found again in Numba's cache by the next process; a user function stays a
dispatcher and its kernel is compiled once per process (:func:`cacheable`).
"""

from __future__ import annotations

from numba import njit

from ..._dtypes import compute_dtype
from ..._jit.math import FASTMATH
from ..._problems.dense import AttentionProblem
from ...mods import cache as mods_cache
from ...mods.cells import EMPTY, FULL, PARTIAL
from ...mods.lowering import identity_score_grad, mod_arguments, user_names
from .. import config
from .tiles import _adds_to_scores, _mask_tile_count


@njit(fastmath=FASTMATH)
def classify(b, h, i0, i1, j0, j1, tile_fn, mask_args, causal, causal_offset, mask, mask_b,
              mask_i, mask_j, has_mask, neg_inf):
    """The class of queries [i0, i1) x keys [j0, j1) under every mask of the call."""
    cls = tile_fn(b, h, i0, i1, j0, j1, mask_args)
    if cls == EMPTY:
        return EMPTY
    if causal:
        if j0 > i1 - 1 + causal_offset:
            return EMPTY
        if j1 - 1 > i0 + causal_offset:
            cls = PARTIAL
    if has_mask:
        n_seen = _mask_tile_count(mask, mask_b + i0 * mask_i + j0 * mask_j, mask_i, mask_j,
                                  i1 - i0, j1 - j0, neg_inf)
        if n_seen == 0:
            return EMPTY
        if n_seen < (i1 - i0) * (j1 - j0) or _adds_to_scores(mask):
            cls = PARTIAL
    return cls


@njit(fastmath=FASTMATH, inline="always")
def cell_run(j, key_end, block_k, cell_k, b, h, i0, i1, tile_fn, mask_args, causal,
             causal_offset, mask, mask_b, mask_i, mask_j, has_mask, neg_inf):
    """``(j0, j1, full)``: the next key tile of queries [i0, i1) from key ``j`` under a mask
    function, a run of non-empty cells of ``cell_k`` keys (the EMPTY ones before it
    skipped) of at most ``block_k`` keys (``j1 <= j0``: none left); ``full`` when every
    cell of the run is FULL (:func:`classify`)."""
    j0 = j
    full = True
    while j < key_end and j - j0 < block_k:
        c1 = min(j + cell_k, key_end)
        cls = classify(b, h, i0, i1, j, c1, tile_fn, mask_args, causal, causal_offset, mask,
                       mask_b, mask_i, mask_j, has_mask, neg_inf)
        if cls == EMPTY:
            if j == j0:  # skip it: the tile starts after it
                j0 = c1
                j = c1
                continue
            break
        full = full and cls == FULL
        j = c1
    return j0, j, full


@njit
def _visible_work(tile_fn, mask_args, Lq, Lk, block_q, cell_k, causal, causal_offset):
    """Query rows x keys that blocks of ``block_q`` rows compute for batch 0, head 0."""
    work = 0
    for i0 in range(0, Lq, block_q):
        i1 = min(i0 + block_q, Lq)
        key_end = min(Lk, i1 + causal_offset) if causal else Lk
        for j0 in range(0, key_end, cell_k):
            j1 = min(j0 + cell_k, key_end)
            if tile_fn(0, 0, i0, i1, j0, j1, mask_args) != EMPTY:
                work += (i1 - i0) * (j1 - j0)
    return work


def mask_block_rows(problem: AttentionProblem, tile_fn, mask_args, largest: int) -> int:
    """Query rows per task under a mask function: the largest of 64, 128, ... ``largest``
    whose blocks compute at most 10 % more pairs than blocks of 64 (measured on batch 0,
    head 0 with the mask's own tile function; a user function's, which would evaluate
    every pair, is not consulted: 64).  Larger blocks reuse K and V tiles over more rows
    and make larger GEMMs (8 documents: blocks of 512, no extra pair); a window needs small
    ones (each block reads W + block keys per row)."""
    if not problem.mask_mod.analytic:
        return min(config.MOD_BLOCK_Q, largest)
    _, _, _, Lq, Lk, _, _ = problem.shape
    args = (tile_fn, mask_args, Lq, Lk)
    causal = (problem.causal_offset is not None, problem.causal_offset or 0)
    work = _visible_work_cached if mods_cache.all_cached(tile_fn) else _visible_work
    base = work(*args, config.MOD_BLOCK_Q, config.CELL_K, *causal)
    best = min(config.MOD_BLOCK_Q, largest)
    block_q = 2 * config.MOD_BLOCK_Q
    while block_q <= largest:
        if work(*args, block_q, config.CELL_K, *causal) <= 1.1 * base:
            best = block_q
        block_q *= 2
    return best


_visible_work_cached = njit(cache=True)(_visible_work.py_func)


def mod_functions(problem: AttentionProblem) -> tuple[tuple, tuple]:
    """``(mods, user names)`` for :func:`kernels.numba_cpu.dense.backward.run`.

    ``mods`` is ``(mask_fn, tile_fn, mask_args, score_fn, score_args, grad_fn)``: the
    compiled mask and score functions with their bound data (the identities for the one not
    given) and the score function's derivative, each function with a structure key as a
    :class:`kernels.mods_cache.CachedFn`; the user names are those
    :func:`kernels.mods.lowering.run_user_code` names in an error.
    """
    mods = mods_cache.cacheable(problem, mod_arguments(problem, "cpu"))
    dtype = compute_dtype(problem.dtype)  # float32 for half inputs
    if problem.score_mod is None:
        grad_fn = identity_score_grad("cpu", dtype)
        grad_key = f"no_score_grad[{dtype.name}]"
    else:
        grad_fn = problem.score_mod.grad("cpu", dtype)
        grad_key = problem.score_mod.cache_key("grad", dtype)
    return mods + (mods_cache.wrap(grad_key, grad_fn),), user_names(problem)


def cacheable(mods: tuple) -> bool:
    """True when every function of :func:`mod_functions`'s ``mods`` has a structure key:
    then a kernel cached on disk may take them."""
    mask_fn, tile_fn, _, score_fn, _, grad_fn = mods
    return mods_cache.all_cached(mask_fn, tile_fn, score_fn, grad_fn)
