"""The reference's own definitions of the built-in score and mask functions.

The fast backends compile each built-in of :mod:`kernels.mods` from one element function
(and a tile function); the reference does not use them.  It evaluates every built-in here,
densely in NumPy, from the formula its docstring states, so that a mistake in a compiled
element function, tile function or derivative makes the kernels disagree with the
reference instead of being copied into it.  A built-in says what it is through its
``formula`` (its constructor's name and arguments, or a combination and its parts).

A user function (:func:`kernels.mods.mask_mod`, :func:`kernels.mods.score_mod`) has no
formula but its own code: the reference evaluates it on every pair
(:meth:`~kernels.mods.MaskMod.dense`), and its derivative is the one the user gave.
"""

from __future__ import annotations

import numpy as np

__all__ = ["score_grads", "scores", "visible"]


def _positions(Lq: int, Lk: int, q_positions=None):
    """Query and key indices broadcast to (1, 1, Lq, Lk); with ``q_positions`` (B, Lq), the
    queries' own positions (decoding: ``cache_seqlens[b] + Lnew - Lq + i``), (B, 1, Lq, 1)."""
    i = np.arange(Lq)[None, None, :, None] if q_positions is None else (
        np.asarray(q_positions)[:, None, :, None])
    j = np.arange(Lk)[None, None, None, :]
    return i, j


def _per_batch(values: np.ndarray, B: int) -> np.ndarray:
    """A (1,) or (B,) vector of the built-in's data as (B, 1, 1, 1)."""
    return np.broadcast_to(values, (B,))[:, None, None, None]


def visible(mod, B: int, H: int, Lq: int, Lk: int, q_positions=None) -> np.ndarray:
    """Mask function ``mod`` on every pair: bool (B, H, Lq, Lk), True = attend.

    ``q_positions`` (B, Lq), optional: the ``q_idx`` of each query row (default ``i``).
    """
    formula = mod.formula
    if formula is None:  # a user function: its own code is its definition
        if q_positions is not None:
            from ..mods.dense import dense_visible_at
            return dense_visible_at(mod, H, q_positions, Lk)
        return mod.dense(B, H, Lq, Lk)
    name, params = formula[0], formula[1:]
    i, j = _positions(Lq, Lk, q_positions)
    if name == "sliding_window":  # i - left <= j <= i + right
        left, right = params
        seen = (j >= i - left) & (j <= i + right)
    elif name == "prefix_lm":  # j < prefix[b] or j <= i
        (lengths,) = params
        seen = (j < _per_batch(lengths, B)) | (j <= i)
    elif name == "document":  # same document id
        (ids,) = params
        ids = np.broadcast_to(ids, (B, ids.shape[1]))
        ids_q = ids if q_positions is None else np.take_along_axis(ids, i[:, 0, :, 0], axis=1)
        seen = ids_q[:, None, :, None] == ids[:, None, None, :Lk]
    elif name in ("and", "or"):
        first, second = (visible(m, B, H, Lq, Lk, q_positions) for m in params)
        seen = (first & second) if name == "and" else (first | second)
    elif name == "block_mask":  # the same pairs as the mask it classified
        seen = visible(params[0], B, H, Lq, Lk, q_positions)
    else:
        raise ValueError(f"the reference has no definition of mask function {name!r}")
    return np.broadcast_to(seen, (B, H, Lq, Lk))


def _relative_distance(table: np.ndarray, Lq: int, Lk: int, q_positions=None) -> np.ndarray:
    """Column of ``table`` (H, 2R+1) for each pair: clip(j - i, -R, R) + R, (B or 1, Lq, Lk)."""
    R = (table.shape[1] - 1) // 2
    i, j = _positions(Lq, Lk, q_positions)
    return np.clip(j - i, -R, R)[:, 0] + R


def scores(mod, s: np.ndarray, compute_dtype=np.float64, q_positions=None) -> np.ndarray:
    """Score function ``mod`` applied to the scaled scores ``s`` (B, H, Lq, Lk).

    Evaluated in the scores' dtype (``compute_dtype`` is what a user function is
    evaluated in: the reference's compute dtype).  ``q_positions`` (B, Lq), optional: the
    ``q_idx`` of each query row (default ``i``).
    """
    formula = mod.formula
    if formula is None:
        if q_positions is not None:
            from ..mods.dense import dense_scores_at
            return dense_scores_at(mod, s, q_positions, compute_dtype)
        return mod.dense(s, compute_dtype)
    name, params = formula[0], formula[1:]
    ct = s.dtype.type
    _, _, Lq, Lk = s.shape
    i, j = _positions(Lq, Lk, q_positions)
    if name == "alibi":  # s + slope[h] (j - i)
        slopes = params[0].astype(ct)[None, :, None, None]
        return s + slopes * (j - i).astype(ct)
    if name == "softcap":  # cap tanh(s / cap)
        cap = ct(params[0])
        return cap * np.tanh(s / cap)
    if name == "relative_bias":  # s + table[h, clip(j - i, -R, R) + R]
        table = params[0].astype(ct)
        columns = _relative_distance(table, Lq, Lk, q_positions)  # (B or 1, Lq, Lk)
        return s + np.moveaxis(table[:, columns], 0, 1)  # (B or 1, H, Lq, Lk)
    if name == "chain":  # second(first(s))
        first, second = params
        return scores(second, scores(first, s, compute_dtype, q_positions), compute_dtype,
                      q_positions)
    raise ValueError(f"the reference has no definition of score function {name!r}")


def score_grads(mod, s: np.ndarray) -> np.ndarray:
    """d mod(s) / d s at every score of ``s`` (B, H, Lq, Lk), in the scores' dtype."""
    formula = mod.formula
    if formula is None:  # the derivative the user gave
        return mod.dense_grad(s)
    name, params = formula[0], formula[1:]
    ct = s.dtype.type
    if name in ("alibi", "relative_bias"):  # a bias: d/ds = 1
        return np.ones_like(s)
    if name == "softcap":  # d/ds cap tanh(s / cap) = 1 - tanh²(s / cap)
        t = np.tanh(s / ct(params[0]))
        return ct(1) - t * t
    if name == "chain":  # chain rule: g'(f(s)) f'(s)
        first, second = params
        return score_grads(second, scores(first, s)) * score_grads(first, s)
    raise ValueError(f"the reference has no derivative of score function {name!r}")
