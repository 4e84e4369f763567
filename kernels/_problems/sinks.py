"""Attention sinks: a logit per query head that joins each row's softmax denominator and has
no value (gpt-oss, StreamingLLM; FlashAttention 4's ``learnable_sink``).

For a row with scores s_j (scaled, after ``score_mod`` and the additive mask) and the sink
logit σ_h of its head::

    m   = max(max_j s_j, σ_h)
    out = Σ_j e^(s_j − m) v_j / (Σ_j e^(s_j − m) + e^(σ_h − m))
    lse = m + log(Σ_j e^(s_j − m) + e^(σ_h − m))

A row that sees no key gets ``out = 0`` and ``lse = σ_h``.  With dropout only the key
weights are dropped (the sink's weight is in the denominator, not dropped).

The reference computes this formula literally (:mod:`kernels.reference.forward`).  The fast
backends (numba, cuda; also the micro-kernel path) run without the sink and the result is
merged with it here, as two attention states are merged: the sink is a state whose output
is 0 and whose log-sum-exp is σ_h, so

    lse = logaddexp(lse_keys, σ_h),   out = out_keys · e^(lse_keys − lse)

(exact in exact arithmetic, an O(rows · Dv) pass after the kernel; the factor is computed
in float64 and rounded once).  The backward needs no other kernel: P rebuilt from the
sink-including ``lse`` is already the sink-including softmax, and
``Σ_j P_j dP_j = rowsum(dO ∘ O)`` still holds, so dq, dk and dv are the plain kernel's and
``dsinks_h = −Σ_rows e^(σ_h − lse) · rowsum(dO ∘ O)`` (:func:`sink_gradient`).
"""

from __future__ import annotations

import numpy as np

from .arrays import as_numpy, wrong_dtype, wrong_shape

__all__ = ["check_sinks", "keys_only_lse", "merge_sinks", "sink_gradient"]


def check_sinks(sinks, H: int, dtype: np.dtype):
    """``sinks`` as a contiguous (H,) array of ``dtype``, or None; TypeError/ValueError
    naming ``sinks`` otherwise (before any work).

    Parameters
    ----------
    sinks : array_like or None
        One logit per query head.
    H : int
        Number of query heads (1 for 2-D inputs).
    dtype : numpy dtype
        q's dtype: the sinks must have it.

    Returns
    -------
    ndarray of shape (H,) or None
    """
    if sinks is None:
        return None
    arr = as_numpy("sinks", sinks, "kernels.attention")
    if arr.dtype != dtype:
        raise wrong_dtype("sinks", arr.dtype, f"{dtype}, the dtype of q "
                          f"(convert with sinks.astype(np.{np.dtype(dtype).name}))")
    if arr.shape != (H,):
        raise wrong_shape("sinks", arr.shape, f"({H},), one logit per "
                          "query head")
    if not np.isfinite(arr).all():
        raise ValueError("sinks must be finite (a sink of -inf is no sink: pass sinks=None)")
    return np.ascontiguousarray(arr)


def merge_sinks(out, lse, sinks, head_axis: int, weights=None):
    """Merge the sinks into a keys-only result: ``(out, lse, weights)`` with the sinks.

    Parameters
    ----------
    out : ndarray, (..., Dv)
        The output without sinks; its rows are lse's entries.
    lse : ndarray
        The keys-only log-sum-exp (``-inf`` for a row that sees no key), shape
        ``out.shape[:-1]``.
    sinks : ndarray, shape (H,)
    head_axis : int
        The axis of ``lse`` that is the query head.
    weights : ndarray, optional
        The keys-only softmax weights (..., Lk), rows as ``lse``.

    Returns
    -------
    out, weights : ndarray (weights None if not given), in their own dtype
    lse : ndarray, in the dtype of the ``lse`` given (float32 for half inputs)

    Notes
    -----
    Each output is rounded once, from float64 (a half output is not multiplied in half).
    """
    shape = [1] * lse.ndim
    shape[head_axis] = -1
    sink = sinks.astype(np.float64).reshape(shape)
    keys = lse.astype(np.float64)
    with np.errstate(invalid="ignore", over="ignore"):
        total = np.logaddexp(keys, sink)  # lse with the sink: sink where keys = -inf
        factor = np.exp(keys - total)[..., None]  # the keys' share of the denominator
    out = (out.astype(np.float64) * factor).astype(out.dtype)
    if weights is not None:
        weights = (weights.astype(np.float64) * factor).astype(weights.dtype)
    return out, total.astype(lse.dtype), weights


def keys_only_lse(lse, sinks, head_axis: int):
    """The ``lse`` a plain backward kernel takes for a call with sinks.

    The kernels rebuild P = exp(s − lse) from the sink-including lse (right as it is) and
    treat a row whose lse is ``-inf`` as one that sees no key: its q and dout rows are not
    read.  With sinks such a row has ``lse = σ_h``; here it is set to ``-inf`` again
    wherever the keys' share of the denominator, ``1 − e^(σ_h − lse)``, is 0 (exactly 0
    for a row that sees no key; a row whose keys' share rounds away adds nothing
    representable either).
    """
    shape = [1] * lse.ndim
    shape[head_axis] = -1
    sink = sinks.astype(np.float64).reshape(shape)
    with np.errstate(invalid="ignore", over="ignore"):
        share = -np.expm1(sink - lse.astype(np.float64))
    return np.where(share > 0, lse, lse.dtype.type(-np.inf)).astype(lse.dtype)


def sink_gradient(dout, out, lse, sinks, head_axis: int):
    """``dsinks_h = −Σ_rows e^(σ_h − lse) · rowsum(dO ∘ O)`` over every row of head h.

    Entries where ``out`` is 0 add nothing (the term is 0 · dO there): a row that sees no
    key has out = 0, so NaN stored in its dout reaches no gradient.

    Parameters
    ----------
    dout, out : ndarray (..., Dv)
    lse : ndarray, ``out.shape[:-1]``, the sink-including log-sum-exp
    sinks : ndarray (H,)
    head_axis : int
        The axis of ``lse`` that is the query head.

    Returns
    -------
    ndarray (H,), in the sinks' dtype
    """
    shape = [1] * lse.ndim
    shape[head_axis] = -1
    sink = sinks.astype(np.float64).reshape(shape)
    out64 = out.astype(np.float64)
    with np.errstate(invalid="ignore", over="ignore"):
        row_dot = np.where(out64 != 0, dout.astype(np.float64) * out64, 0.0).sum(axis=-1)
        p_sink = np.exp(sink - lse.astype(np.float64))
    axes = tuple(a for a in range(lse.ndim) if a != head_axis)
    return (-(p_sink * row_dot).sum(axis=axes)).astype(sinks.dtype)
