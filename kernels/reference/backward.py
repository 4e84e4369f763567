"""The reference backward pass: the literal gradient formulas in NumPy, float64 by default.

The oracle of :func:`kernels.attention_backward`.  For one (batch, head), with P the
softmax weights, Z the dropout keep mask and κ = 1 / (1 − p) its scaling::

    X  = scale · Q Kᵀ
    S  = f(X) + M                          (f: the score_mod, identity without; M: -inf
                                            where hidden)
    P  = softmax(S)                        (0 on a row that sees no key)
    Pd = P ∘ Z · κ                          (the weights that multiply V)
    O  = Pd V
    dV = Pdᵀ dO
    dPd = dO Vᵀ,  dP = dPd ∘ Z · κ
    dS = P ∘ (dP − rowsum(dO ∘ O)) ∘ f'(X)  (rowsum(dP ∘ P) = rowsum(dO ∘ O))
    dQ = scale · dS K,   dK = scale · dSᵀ Q

It materialises every (Lq, Lk) array.  Hidden pairs get dS = Pd = 0 by ``np.where`` (not
by a product, which would turn a NaN there into NaN), and the three products that sum over
pairs skip hidden ones when some operand is not finite (:func:`reference._weighted_values`),
so NaN stored in a hidden key, value, or in the q and dout rows of a query that sees no
key reaches no gradient.  GQA: dK and dV are summed over the query heads of a group.
"""

from __future__ import annotations

import numpy as np

from .._dropout import keep_mask
from .._problems.dense import AttentionProblem
from . import formulas
from .forward import _logsumexp_visible, _softmax_visible, _weighted_values, sink_logits


def run_backward(problem: AttentionProblem, dout: np.ndarray, compute_dtype=np.float64,
                 keep_precision=False, scores_from=None, round_to=None):
    """Gradients ``(dq, dk, dv)`` of ``sum(dout * attention(problem))`` by the formulas above.

    Parameters
    ----------
    problem : AttentionProblem
        The validated forward problem.
    dout : ndarray, shape (B, H, Lq, Dv)
        Gradient of the output, in the problem's dtype.
    compute_dtype : dtype, default float64
        The precision of the evaluation (the tests also use the input dtype, as the
        tolerance baseline, and ``np.longdouble``, as the oracle for float64 inputs).
    keep_precision : bool, default False
        Return the gradients in ``compute_dtype`` instead of the input dtype.
    scores_from : dtype, optional
        Compute the scaled scores ``Q Kᵀ · scale`` in this wider dtype and round them to
        ``compute_dtype`` (the second tolerance baseline, as in
        :func:`kernels.reference.forward.run`).
    round_to : dtype, optional
        Take rowsum(dO ∘ O) from the output rounded to this (half) dtype, as a half
        implementation does from its stored output (the half baseline).

    Returns
    -------
    dq : ndarray, shape (B, H, Lq, D)
    dk : ndarray, shape (B, Hkv, Lk, D)
    dv : ndarray, shape (B, Hkv, Lk, Dv)
    dsinks : ndarray, shape (H,)
        Only when the problem has sinks: ``-Σ_{b,i} p_sink · rowsum(dO ∘ O)``.

    Notes
    -----
    ``out`` and ``lse`` are not taken: the oracle recomputes them from q, k and v in
    ``compute_dtype``.
    """
    B, H, Hkv, Lq, Lk, D, Dv = problem.shape
    group = H // Hkv
    ct = np.dtype(compute_dtype).type
    zero = ct(0)
    q = problem.q.astype(ct)  # (B, H, Lq, D)
    k = np.repeat(problem.k.astype(ct), group, axis=1)  # (B, H, Lk, D)
    v = np.repeat(problem.v.astype(ct), group, axis=1)  # (B, H, Lk, Dv)
    do = dout.astype(ct)  # (B, H, Lq, Dv)
    visible = problem.visible(formulas.visible)  # (B, H, Lq, Lk)
    sees_a_key = visible.any(axis=-1)  # (B, H, Lq)

    with np.errstate(invalid="ignore", over="ignore"):
        if scores_from is None:
            scores = (q @ k.swapaxes(-1, -2)) * ct(problem.scale)  # X, (B, H, Lq, Lk)
        else:
            wide = np.dtype(scores_from).type
            k_wide = np.repeat(problem.k.astype(wide), group, axis=1)
            scores = ((problem.q.astype(wide) @ k_wide.swapaxes(-1, -2))
                      * wide(problem.scale)).astype(ct)
        score_grad = None
        if problem.score_mod is not None:  # f and f' at X, before the mask
            score_grad = _score_grad(problem.score_mod, scores)
            scores = formulas.scores(problem.score_mod, scores, ct)
        if problem.mask is not None:
            scores = scores + problem.additive_mask().astype(ct)
        sinks = sink_logits(problem, ct)  # (1, H, 1, 1) or None
        probs = _softmax_visible(scores, visible, sinks)  # P, (B, H, Lq, Lk)
        keep_scale = np.ones_like(probs)  # Z · κ
        if problem.dropout_p > 0:
            keep = keep_mask(problem.seed, problem.dropout_p, (B, H, Lq, Lk))
            keep_scale = np.where(keep, ct(1.0 / (1.0 - problem.dropout_p)), zero)
        dropped = np.where(visible, probs * keep_scale, zero)  # Pd
        out = _weighted_values(dropped, visible, v)  # O, (B, H, Lq, Dv)

        # dO · Vᵀ at every pair: garbage where hidden, removed by the np.where below.
        d_probs = (do @ v.swapaxes(-1, -2)) * keep_scale  # dP, (B, H, Lq, Lk)
        stored = out if round_to is None else out.astype(round_to).astype(ct)  # O as kept
        row_dot = np.where(sees_a_key, (do * stored).sum(axis=-1), zero)  # (B, H, Lq)
        d_scores = probs * (d_probs - row_dot[..., None])
        if score_grad is not None:
            d_scores = d_scores * score_grad
        d_scores = np.where(visible, d_scores, zero)  # dS

    vis_t = visible.swapaxes(-1, -2)  # (B, H, Lk, Lq)
    dv = _weighted_values(dropped.swapaxes(-1, -2), vis_t, do)  # (B, H, Lk, Dv)
    dk = _weighted_values(d_scores.swapaxes(-1, -2), vis_t, q) * ct(problem.scale)
    dq = _weighted_values(d_scores, visible, k) * ct(problem.scale)  # (B, H, Lq, D)
    # GQA: the query heads of a group share their key/value head: sum their gradients.
    dk = dk.reshape(B, Hkv, group, Lk, D).sum(axis=2)
    dv = dv.reshape(B, Hkv, group, Lk, Dv).sum(axis=2)

    dtype = ct if keep_precision else problem.dtype
    grads = dq.astype(dtype), dk.astype(dtype), dv.astype(dtype)
    if sinks is None:
        return grads
    # d/d sink of the loss: the sink's weight p_sink = exp(sink - lse) times -rowsum(dO ∘ O).
    lse = _logsumexp_visible(scores, visible, sinks)  # (B, H, Lq), the sink included
    d_sinks = -(np.exp(sinks[..., 0] - lse) * row_dot).sum(axis=(0, 2))  # (H,)
    return grads + (d_sinks.astype(dtype),)


def _score_grad(score_mod, scores: np.ndarray) -> np.ndarray:
    """f'(X) of a score function at every score, in the scores' dtype (evaluated in float64
    for a dtype the compiled derivatives do not take, ``np.longdouble``)."""
    work = scores.dtype if scores.dtype in (np.float32, np.float64) else np.dtype(np.float64)
    return formulas.score_grads(score_mod, scores.astype(work)).astype(scores.dtype)


def run(problem: AttentionProblem, dout: np.ndarray, out=None, lse=None):
    """The backend entry point of :func:`kernels.attention_backward` (``out``, ``lse`` unused)."""
    return run_backward(problem, dout)
