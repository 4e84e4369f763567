"""The reference backend: the literal attention formula in NumPy, accumulated in float64.

This is the oracle every fast path is compared with.  It is written to be read,
not to be fast: it materialises the full (B, H, Lq, Lk) score matrix

    out = softmax(Q Kᵀ · scale + M) V

with M the additive mask (-inf where a key is hidden by ``causal``, ``mask`` or
``key_lengths``).  The two multi-head forms the source articles describe are in
:mod:`kernels.multihead`.
"""

from __future__ import annotations

import numpy as np

from .._dropout import keep_mask
from .._dtypes import compute_dtype as dtype_computed_in
from .._problems.dense import AttentionProblem
from . import formulas


def _softmax_visible(scores: np.ndarray, visible: np.ndarray, sinks=None) -> np.ndarray:
    """Row softmax over the visible entries; rows with no visible entry are all 0.

    ``sinks`` (broadcastable to the rows, e.g. (1, H, 1, 1)): a logit per row that joins
    the denominator and has no weight of its own (:mod:`kernels._problems.sinks`).
    """
    scores = np.where(visible, scores, -np.inf)
    any_visible = visible.any(axis=-1, keepdims=True)
    zero = scores.dtype.type(0)
    row_max = np.where(any_visible, scores.max(axis=-1, keepdims=True, initial=-np.inf), zero)
    if sinks is not None:  # m = max(max_j s_j, sink)
        row_max = np.where(any_visible, np.maximum(row_max, sinks), sinks)
    exp = np.where(visible, np.exp(scores - row_max), zero)
    denom = exp.sum(axis=-1, keepdims=True)
    if sinks is not None:
        denom = denom + np.exp(sinks - row_max)
    return np.divide(exp, denom, out=np.zeros_like(exp), where=denom != 0)  # NaN stays NaN


def _weighted_values(probs: np.ndarray, visible: np.ndarray, v: np.ndarray) -> np.ndarray:
    """``probs @ v`` that never reads a value at a hidden position.

    A plain matmul would turn a NaN/inf stored in a hidden value into NaN
    (0 · NaN = NaN); if any value is non-finite, rows are summed over their
    visible keys only.
    """
    if np.isfinite(v).all():
        return probs @ v
    out = np.zeros(probs.shape[:-1] + v.shape[-1:], dtype=probs.dtype)
    for idx in np.ndindex(*probs.shape[:-1]):  # (b, h, i)
        keys = visible[idx]
        out[idx] = probs[idx][keys] @ v[idx[:-1]][keys]
    return out


def _logsumexp_visible(scores: np.ndarray, visible: np.ndarray, sinks=None) -> np.ndarray:
    """``log Σ_j exp(scores)`` over the visible entries of each row; ``-inf`` if none.

    With ``sinks`` (broadcastable to the rows, e.g. (1, H, 1, 1)) each row's sum also has
    ``exp(sink)``: a row that sees no key gets its sink.
    """
    scores = np.where(visible, scores, -np.inf)
    row_max = scores.max(axis=-1, keepdims=True, initial=-np.inf)
    if sinks is not None:
        row_max = np.maximum(row_max, sinks)
    shift = np.where(np.isfinite(row_max), row_max, scores.dtype.type(0))
    with np.errstate(divide="ignore"):
        exp_sum = np.where(visible, np.exp(scores - shift), 0).sum(axis=-1, keepdims=True)
        if sinks is not None:
            exp_sum = exp_sum + np.exp(sinks - shift)
        total = np.log(exp_sum[..., 0])
    return total + shift[..., 0]


def sink_logits(problem: AttentionProblem, ct):
    """The problem's sinks as (1, H, 1, 1) in ``ct``, or None."""
    if problem.sinks is None:
        return None
    return problem.sinks.astype(ct)[None, :, None, None]


def run(problem: AttentionProblem, compute_dtype=np.float64, keep_precision=False,
        return_lse=False, scores_from=None, round_to=None):
    """Attention for a validated problem; returns ``(out, weights or None)``.

    With ``return_lse``, ``(out, weights or None, lse)``: lse (B, H, Lq) is the log-sum-exp
    of each row's visible scores (``-inf`` for a row that sees no key).

    Parameters
    ----------
    problem : AttentionProblem
    compute_dtype : dtype, default float64
        The precision the formula is evaluated in. The tests also evaluate it in the
        input dtype (a plain implementation's own error is the tolerance baseline) and
        in ``np.longdouble`` (the oracle for float64 inputs).
    keep_precision : bool, default False
        Return results in ``compute_dtype`` instead of rounding them to the input dtype.
    scores_from : dtype, optional
        Compute the scaled scores ``Q Kᵀ · scale`` in this wider dtype and round them to
        ``compute_dtype``: the formula as an implementation whose dot products are
        correctly rounded evaluates it (the second tolerance baseline,
        :func:`attnbench.measure.oracle.oracle`).
    round_to : dtype, optional
        Round the scaled scores (where finite in it), the weights and the output to this
        (half) dtype, computing in ``compute_dtype`` between: the formula as a standard
        half-precision implementation rounds it (the half baseline).
    """
    rnd = _rounding(round_to)
    B, H, Hkv, Lq, Lk, D, Dv = problem.shape
    group = H // Hkv
    ct = np.dtype(compute_dtype).type
    q = problem.q.astype(ct)  # (B, H, Lq, D)
    k = np.repeat(problem.k.astype(ct), group, axis=1)  # (B, H, Lk, D)
    v = np.repeat(problem.v.astype(ct), group, axis=1)  # (B, H, Lk, Dv)

    # Hidden keys may hold garbage (inf, NaN): their scores are computed by the matmul but
    # replaced by -inf before the softmax, so the warnings they raise are noise.
    with np.errstate(invalid="ignore", over="ignore"):
        if scores_from is None:
            scores = (q @ k.swapaxes(-1, -2)) * ct(problem.scale)  # (B, H, Lq, Lk)
        else:
            wide = np.dtype(scores_from).type
            k_wide = np.repeat(problem.k.astype(wide), group, axis=1)
            scores = ((problem.q.astype(wide) @ k_wide.swapaxes(-1, -2))
                      * wide(problem.scale)).astype(ct)
        scores = rnd(scores)
        if problem.score_mod is not None:  # on the scaled scores, before the mask
            scores = formulas.scores(problem.score_mod, scores, ct)
        if problem.mask is not None:
            scores = scores + problem.additive_mask().astype(ct)
    visible = problem.visible(formulas.visible)  # (B, H, Lq, Lk)
    sinks = sink_logits(problem, ct)  # (1, H, 1, 1) or None
    weights = rnd(_softmax_visible(scores, visible, sinks))  # (B, H, Lq, Lk)

    probs = weights
    if problem.dropout_p > 0:
        keep = keep_mask(problem.seed, problem.dropout_p, (B, H, Lq, Lk))
        probs = weights * keep / ct(1.0 - problem.dropout_p)
    out = rnd(_weighted_values(probs, visible, v))  # (B, H, Lq, Dv)

    dtype = ct if keep_precision else problem.dtype
    result = out.astype(dtype), (weights.astype(dtype) if problem.return_weights else None)
    if return_lse:  # float32 for half inputs
        lse_dtype = ct if keep_precision else dtype_computed_in(problem.dtype)
        return result + (_logsumexp_visible(scores, visible, sinks).astype(lse_dtype),)
    return result


def _rounding(dtype):
    """``x -> x`` rounded to ``dtype`` and back where it stays finite there (a float16 score
    above 65504 stays as it was: a standard implementation keeps its scores in float32);
    the identity for None."""
    if dtype is None:
        return lambda x: x

    def rnd(x):
        with np.errstate(over="ignore", invalid="ignore"):
            y = x.astype(dtype).astype(x.dtype)
        return np.where(np.isfinite(y) | ~np.isfinite(x), y, x)

    return rnd
