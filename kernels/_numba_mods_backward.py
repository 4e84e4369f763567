"""What the ``numba`` backward pass takes for a ``score_mod`` or ``mask_mod`` (:mod:`kernels.mods`).

The kernel is :mod:`kernels.numba_backward`'s own (a task owns key blocks; per (query
block, key block) tile it recomputes S and dO · Vᵀ, then dS and Pd, then the three
products), given the mod functions as the forward kernel with mods is
(:mod:`kernels._numba_mods`).  With X = scale · q · k the score the softmax sees is
f(X) (+ the additive mask), so

    P  = exp(f(X) + mask − lse),   dS = P ∘ (dPd ∘ Z · κ − Δ) ∘ f'(X)

where f' is the score function's derivative (its ``grad``).

Block sparsity: each (query block, key block) tile is classified by the mask's tile
function, the causal diagonal and the dense mask (:func:`kernels._numba_mods._classify`):
an EMPTY tile is skipped (its queries, keys, values and output gradients are not read), a
FULL one needs no per-element check, a PARTIAL one checks every pair and gives a hidden
pair dS = Pd = 0 (set, not multiplied: what a hidden key holds reaches nothing;
:func:`kernels._numba_backward_tiles.tile_pair_gradients`).

Disk cache: built-ins (and the identities) are given as :class:`kernels._mods_cache.CachedFn`,
the score function's derivative too (its ``"grad"`` key), so that the kernel specialised on
them is found again in Numba's cache by the next process; a user function stays a
dispatcher and its kernel is compiled once per process (:func:`cacheable`).
"""

from __future__ import annotations

from . import _mods_cache
from . import _mods_compile as mc
from ._numba_mods import mod_arguments, user_names
from ._validate import AttentionProblem


def mod_functions(problem: AttentionProblem) -> tuple[tuple, tuple]:
    """``(mods, user names)`` for :func:`kernels.numba_backward.run`.

    ``mods`` is ``(mask_fn, tile_fn, mask_args, score_fn, score_args, grad_fn)``: the
    compiled mask and score functions with their bound data (the identities for the one not
    given) and the score function's derivative, each function with a structure key as a
    :class:`kernels._mods_cache.CachedFn`; the user names are those
    :func:`kernels._mods_compile.run_user_code` names in an error.
    """
    mods = _mods_cache.cacheable(problem, mod_arguments(problem, "cpu"))
    dtype = problem.dtype
    if problem.score_mod is None:
        grad_fn = mc.identity_score_grad("cpu", dtype)
        grad_key = f"no_score_grad[{dtype.name}]"
    else:
        grad_fn = problem.score_mod.grad("cpu", dtype)
        grad_key = problem.score_mod.cache_key("grad", dtype)
    return mods + (_mods_cache.wrap(grad_key, grad_fn),), user_names(problem)


def cacheable(mods: tuple) -> bool:
    """True when every function of :func:`mod_functions`'s ``mods`` has a structure key:
    then a kernel cached on disk may take them."""
    mask_fn, tile_fn, _, score_fn, _, grad_fn = mods
    return _mods_cache.all_cached(mask_fn, tile_fn, score_fn, grad_fn)
