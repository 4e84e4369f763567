"""Floating-point operations of one attention forward or backward pass, counting only visible pairs.

Convention (as FlashAttention's benchmarks): a visible (query i, key j) pair costs
``2·D`` FLOPs for its score ``q_i · k_j`` (QKᵀ) and ``2·Dv`` for adding ``p_ij · v_j``
to the output (PV), so an unmasked problem costs

    2·B·H·Lq·Lk·D + 2·B·H·Lq·Lk·Dv      (= 4·B·H·Lq·Lk·D when Dv = D).

The softmax (max, exp, sum, divide) is not counted: it is O(Lq·Lk), not O(Lq·Lk·D).
A hidden pair costs nothing, since a fused kernel never computes it.  The count is
exact: causal with Lq = Lk gives ``L(L+1)/2`` visible pairs per head, not ``L²/2``
(the convention of halving differs by the factor ``(L+1)/L``).  Dropout does not
change the count: dropped weights are computed before they are dropped.  K/V heads
(GQA) do not change it either: every query head does its own work.

The backward (:func:`backward_flops`) does five such products per visible pair:
``2·(3·D + 2·Dv)`` FLOPs, 2.5× the forward's when ``Dv = D``.

Causal masks and key lengths are counted in closed form (no L x L array is built),
so the count is cheap for any L; a given ``mask`` is counted element by element.  A
``mask_mod`` (:mod:`kernels.mods`) is counted in O(Lq) for a sliding window and in
O(L log L) for documents; any other mask function is evaluated on every pair of the
cells its :func:`kernels.mods.block_mask` does not classify as empty.  Score functions
(ALiBi, softcap) change no count.
"""

from __future__ import annotations

import numbers

import numpy as np

from attnbench import kernels
from attnbench.kernels import mods
from attnbench.measure.mask_pairs import mask_mod_pairs

__all__ = [
    "attention_flops",
    "backward_flops",
    "causal_offset",
    "flops_of_problem",
    "gflops",
    "visible_pairs",
]


def causal_offset(causal, Lq: int, Lk: int) -> int | None:
    """The causal alignment as an offset: query ``i`` sees keys ``j <= i + offset``.

    Parameters
    ----------
    causal : bool, {"top-left", "bottom-right"}, int or None
        ``False``/``None``: not causal.  ``True``/``"top-left"``: offset 0 (PyTorch's
        ``is_causal``).  ``"bottom-right"``: offset ``Lk - Lq`` (FlashAttention).  An int
        is taken as the offset itself (as :class:`kernels.AttentionProblem` stores it).
    Lq, Lk : int
        Number of queries and keys.

    Returns
    -------
    int or None
        ``None`` when not causal.
    """
    if isinstance(causal, np.bool_):
        causal = bool(causal)
    if isinstance(causal, numbers.Integral) and not isinstance(causal, bool):
        return int(causal)
    try:
        return kernels.causal_offset(causal, Lq, Lk)  # the kernels' own reading of the flag
    except ValueError:
        raise ValueError(f"causal={causal!r}; expected False, True, 'top-left', "
                         "'bottom-right' or an int offset") from None


def _clamped_prefix_sum(t: np.ndarray, K: np.ndarray) -> np.ndarray:
    """``sum(clamp(x, 0, K) for integers x < t)``, elementwise over int64 arrays.

    ``clamp(x, 0, K)`` is 0 for x <= 0, x in between and K for x >= K, so the sum is
    ``t(t-1)/2`` while ``t <= K`` and grows by K per step after that.
    """
    t = np.maximum(t, 0)
    inside = np.minimum(t, K)
    return inside * (inside - 1) // 2 + np.maximum(t - K, 0) * K


def _key_lengths_array(key_lengths, B: int, Lk: int) -> np.ndarray:
    """Key lengths as int64 of shape (B,), ``Lk`` for all if ``None``; checked to be in [0, Lk]."""
    if key_lengths is None:
        return np.full(B, Lk, dtype=np.int64)
    lengths = np.asarray(key_lengths)
    if lengths.dtype == np.bool_ or not np.issubdtype(lengths.dtype, np.integer):
        raise TypeError(f"key_lengths has dtype {lengths.dtype}; expected integers")
    lengths = np.broadcast_to(lengths, (B,)).astype(np.int64)
    if lengths.size and (lengths.min() < 0 or lengths.max() > Lk):
        raise ValueError(f"key_lengths must lie in [0, Lk={Lk}]; got {lengths.tolist()}")
    return lengths


def _visible_mask_pairs(mask, B, H, Lq, Lk, offset, lengths) -> int:
    """Count visible pairs element by element when an explicit mask is given."""
    mask = np.asarray(mask)
    if mask.dtype != np.bool_:
        mask = mask != -np.inf  # additive float mask: -inf hides a key
    try:
        fits = np.broadcast_shapes(mask.shape, (B, H, Lq, Lk)) == (B, H, Lq, Lk)
    except ValueError:
        fits = False
    if not fits:
        raise ValueError(
            f"mask of shape {mask.shape} cannot be broadcast to (B, H, Lq, Lk) = {(B, H, Lq, Lk)}"
        )
    mask = mask.reshape((1,) * (4 - mask.ndim) + mask.shape)  # (Bm, Hm, Lqm, Lkm)
    i = np.arange(Lq)[:, None]
    j = np.arange(Lk)[None, :]
    allowed = np.ones((Lq, Lk), dtype=bool)  # (Lq, Lk): causal only
    if offset is not None:
        allowed &= j <= i + offset
    heads_per_mask_head = H // mask.shape[1]
    same_for_all_batches = mask.shape[0] == 1 and bool(np.all(lengths == lengths[0]))
    total = 0
    for b in range(1 if same_for_all_batches else B):
        vis = mask[b if mask.shape[0] > 1 else 0] & allowed  # (Hm, Lq, Lk)
        vis &= j < lengths[b]
        total += int(np.count_nonzero(vis)) * heads_per_mask_head
    return total * (B if same_for_all_batches else 1)


def visible_pairs(B: int, H: int, Lq: int, Lk: int, *, causal=False, key_lengths=None,
                  mask=None, mask_mod=None) -> int:
    """Number of visible (b, h, i, j) score entries of an attention problem.

    Parameters
    ----------
    B, H, Lq, Lk : int
        Batch, query heads, queries and keys.
    causal : bool, {"top-left", "bottom-right"}, int or None, default False
        See :func:`causal_offset`.
    key_lengths : int or array_like of int, shape (B,), optional
        Keys ``j >= key_lengths[b]`` are padding.
    mask : array_like, optional
        Broadcastable to (B, H, Lq, Lk): bool (True = visible) or additive float
        (``-inf`` = hidden).  Combined with ``causal`` and ``key_lengths``.
    mask_mod : kernels.mods.MaskMod or callable, optional
        A mask function (True = attend), combined with the others; see
        :mod:`attnbench.measure.mask_pairs`.

    Returns
    -------
    int
        Exact count.  Closed form (O(B) work) without ``mask`` or ``mask_mod``; O(B·Lq)
        for a sliding window; with a ``mask``, O(B·H·Lq·Lk).
    """
    offset = causal_offset(causal, Lq, Lk)
    lengths = _key_lengths_array(key_lengths, B, Lk)  # (B,)
    if mask_mod is not None and mask is not None:  # both: one dense visibility
        dense = mods.as_mask_mod(mask_mod).dense(B, H, Lq, Lk)  # (B, H, Lq, Lk)
        mask = dense & (np.asarray(mask) if np.asarray(mask).dtype == np.bool_
                        else np.asarray(mask) != -np.inf)
    elif mask_mod is not None:
        return mask_mod_pairs(mask_mod, B, H, Lq, Lk, offset, lengths)
    if mask is not None:
        return _visible_mask_pairs(mask, B, H, Lq, Lk, offset, lengths)
    if offset is None:
        return int(lengths.sum()) * Lq * H
    # Row i sees clamp(i + offset + 1, 0, K) keys with K = key_lengths[b]; sum over i < Lq.
    start = np.int64(offset + 1)
    per_batch = (_clamped_prefix_sum(start + Lq, lengths)
                 - _clamped_prefix_sum(np.full_like(lengths, start), lengths))  # (B,)
    return int(per_batch.sum()) * H


def attention_flops(B: int, H: int, Lq: int, Lk: int, D: int, Dv: int | None = None,
                    causal=False, *, key_lengths=None, mask=None, mask_mod=None) -> int:
    """FLOPs of one attention forward: ``2·(D + Dv)`` per visible (query, key) pair.

    Parameters
    ----------
    B, H, Lq, Lk : int
        Batch, query heads, queries and keys.
    D : int
        Head size of q and k.
    Dv : int, optional
        Head size of v; default ``D``.
    causal, key_lengths, mask, mask_mod
        As in :func:`visible_pairs`.

    Returns
    -------
    int
        ``2·B·H·Lq·Lk·D`` (QKᵀ) + ``2·B·H·Lq·Lk·Dv`` (PV) without masking; with masking,
        ``B·H·Lq·Lk`` is replaced by the number of visible pairs.

    Examples
    --------
    >>> attention_flops(1, 1, 4, 4, 8) == 4 * 16 * 8
    True
    >>> attention_flops(1, 1, 4, 4, 8, causal=True) == 4 * (1 + 2 + 3 + 4) * 8
    True
    """
    Dv = D if Dv is None else Dv
    pairs = visible_pairs(B, H, Lq, Lk, causal=causal, key_lengths=key_lengths, mask=mask,
                          mask_mod=mask_mod)
    return 2 * pairs * (D + Dv)


def backward_flops(B: int, H: int, Lq: int, Lk: int, D: int, Dv: int | None = None,
                   causal=False, *, key_lengths=None, mask=None, mask_mod=None) -> int:
    """FLOPs of one attention backward: ``2·(3·D + 2·Dv)`` per visible (query, key) pair.

    The five matrix products of a fused (FlashAttention-2 style) backward: S = QKᵀ
    recomputed (``D``), dV = PᵀdO (``Dv``), dP = dO·Vᵀ (``Dv``), dQ = dS·K (``D``) and
    dK = dSᵀQ (``D``).  With ``D == Dv`` that is 2.5× :func:`attention_flops`.  The
    element-wise softmax gradient is not counted (as the forward does not count exp).

    Parameters
    ----------
    B, H, Lq, Lk, D, Dv, causal, key_lengths, mask, mask_mod
        As in :func:`attention_flops`.

    Returns
    -------
    int

    Examples
    --------
    >>> backward_flops(1, 1, 4, 4, 8) * 2 == attention_flops(1, 1, 4, 4, 8) * 5
    True
    """
    Dv = D if Dv is None else Dv
    pairs = visible_pairs(B, H, Lq, Lk, causal=causal, key_lengths=key_lengths, mask=mask,
                          mask_mod=mask_mod)
    return 2 * pairs * (3 * D + 2 * Dv)


def flops_of_problem(problem, direction: str = "forward") -> int:
    """FLOPs of a validated :class:`kernels.AttentionProblem` (its masks and mask function).

    Parameters
    ----------
    problem : kernels.AttentionProblem
    direction : {"forward", "backward"}, default "forward"
        :func:`attention_flops` or :func:`backward_flops`.

    Returns
    -------
    int
    """
    count = {"forward": attention_flops, "backward": backward_flops}.get(direction)
    if count is None:
        raise ValueError(f"direction must be 'forward' or 'backward', got {direction!r}")
    B, H, _, Lq, Lk, D, Dv = problem.shape
    mask = problem.visibility_mask()  # (Bm, Hm, Lqm, Lkm) or None
    return count(B, H, Lq, Lk, D, Dv, causal=problem.causal_offset,
                 key_lengths=problem.key_lengths, mask=mask, mask_mod=problem.mask_mod)


def gflops(flops: float, seconds: float) -> float:
    """Throughput in GFLOP/s (``nan`` if ``seconds`` is not positive)."""
    return flops / seconds / 1e9 if seconds > 0 else float("nan")
