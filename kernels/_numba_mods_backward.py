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
"""

from __future__ import annotations

from . import _mods_compile as mc
from ._numba_mods import mod_arguments, user_names
from ._validate import AttentionProblem


def mod_functions(problem: AttentionProblem) -> tuple[tuple, tuple]:
    """``(mods, user names)`` for :func:`kernels.numba_backward.run`.

    ``mods`` is ``(mask_fn, tile_fn, mask_args, score_fn, score_args, grad_fn)``: the
    compiled mask and score functions with their bound data (the identities for the one not
    given) and the score function's derivative; the user names are those
    :func:`kernels._mods_compile.run_user_code` names in an error.
    """
    mods = mod_arguments(problem, "cpu")
    if problem.score_mod is None:
        grad_fn = mc.identity_score_grad("cpu", problem.dtype)
    else:
        grad_fn = problem.score_mod.grad("cpu", problem.dtype)
    return mods + (grad_fn,), user_names(problem)
