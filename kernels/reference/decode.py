"""The reference decode: gather each sequence's pages into dense keys and values, then the
literal formula of :mod:`kernels.reference.forward` (float64), queries at their absolute
positions.

Query i of sequence b sits at ``q_start[b] + i`` (``cache_seqlens[b] + Lnew - Lq + i``):
it sees keys ``j < seqlens[b]``, with ``causal`` only those ``j <= q_start[b] + i``, and
the score and mask functions receive that position as ``q_idx``.
"""

from __future__ import annotations

import numpy as np

from .._dtypes import compute_dtype as dtype_computed_in
from .._problems.decode import DecodeProblem
from . import formulas
from .forward import _logsumexp_visible, _rounding, _softmax_visible, _weighted_values


def run(problem: DecodeProblem, compute_dtype=np.float64, keep_precision=False,
        scores_from=None, round_to=None):
    """``(out (B, H, Lq, Dv), lse (B, H, Lq))`` of a decode step.

    out has the input dtype, lse the compute dtype (float32 for half inputs), unless
    ``keep_precision``.  With ``problem.sinks`` each row's denominator has its head's sink.

    Parameters
    ----------
    problem : DecodeProblem
    compute_dtype, keep_precision, scores_from, round_to
        As :func:`kernels.reference.forward.run` (the oracle and the two baselines).
    """
    rnd = _rounding(round_to)
    B, H, Hkv, Lq, D, Dv = problem.shape
    group = H // Hkv
    ct = np.dtype(compute_dtype).type
    k, v = problem.gather()  # (B, Hkv, Lk, D), (B, Hkv, Lk, Dv)
    Lk = k.shape[2]
    q = problem.q.astype(ct)  # (B, H, Lq, D)
    k_rep = np.repeat(k.astype(ct), group, axis=1)  # (B, H, Lk, D)
    v_rep = np.repeat(v.astype(ct), group, axis=1)  # (B, H, Lk, Dv)
    positions = problem.q_start[:, None] + np.arange(Lq)[None, :]  # (B, Lq)
    j = np.arange(Lk)
    visible = np.broadcast_to((j[None, None, :] < problem.seqlens[:, None, None])[:, None],
                              (B, H, Lq, Lk))  # (B, H, Lq, Lk)
    if problem.causal:
        visible = visible & (j[None, None, :] <= positions[:, :, None])[:, None]
    if problem.mask_mod is not None:
        visible = visible & formulas.visible(problem.mask_mod, B, H, Lq, Lk, positions)
    with np.errstate(invalid="ignore", over="ignore"):  # garbage in hidden slots
        if scores_from is None:
            scores = (q @ k_rep.swapaxes(-1, -2)) * ct(problem.scale)  # (B, H, Lq, Lk)
        else:
            wide = np.dtype(scores_from).type
            k_wide = np.repeat(k.astype(wide), group, axis=1)
            scores = ((problem.q.astype(wide) @ k_wide.swapaxes(-1, -2))
                      * wide(problem.scale)).astype(ct)
        scores = rnd(scores)
        if problem.score_mod is not None:
            scores = formulas.scores(problem.score_mod, scores, ct, positions)
    sinks = None if problem.sinks is None else problem.sinks.astype(ct)[None, :, None, None]
    weights = rnd(_softmax_visible(scores, visible, sinks))
    out = rnd(_weighted_values(weights, visible, v_rep))  # (B, H, Lq, Dv)
    lse = _logsumexp_visible(scores, visible, sinks)  # (B, H, Lq)
    if keep_precision:
        return out, lse
    return out.astype(problem.dtype), lse.astype(dtype_computed_in(problem.dtype))
