"""The oracle and the tolerance of a backward pass: gradients judged like the forward.

As for the forward (:mod:`attnbench.measure.oracle`): the gradients ``(dq, dk, dv)`` of a
backend must lie within twice the error of the same formulas evaluated in the input dtype
(:func:`kernels.reference.backward.run_backward` with ``compute_dtype`` the input dtype)
plus a few ulps, against the formulas in the wider dtype (float64 for float32 inputs,
``np.longdouble`` for float64).  Of the two plain evaluations (the BLAS's scores, and
correctly rounded ones) the one farther from the oracle counts, gradient by gradient.  The fused backends rebuild the softmax from a stored
log-sum-exp, which adds :func:`lse_rounding` to their tolerance.

Half inputs: the plain formulas run in float32, with rowsum(dO ∘ O) taken from O rounded to
the half dtype (a half implementation keeps its output, and reads it back, in that dtype),
and their gradients are rounded to the half dtype.
"""

from __future__ import annotations

import numpy as np

from attnbench.measure.oracle import max_abs_error, oracle_dtype, tolerance
from kernels._dtypes import compute_dtype, is_half
from kernels.reference.backward import run_backward

__all__ = ["GRADIENTS", "gradient_errors", "gradient_oracle", "lse_rounding"]

#: Names of the three gradients, in the order :func:`kernels.attention_backward` returns them.
GRADIENTS = ("dq", "dk", "dv")


def gradient_oracle(problem, dout: np.ndarray):
    """``(exact, plain)``: the gradients from the oracle and from the formulas in the input dtype.

    Parameters
    ----------
    problem : kernels.AttentionProblem
    dout : ndarray, shape (B, H, Lq, Dv)

    Returns
    -------
    exact, plain : tuple of ndarray
        ``(dq, dk, dv)`` each, in the problem's (B, H|Hkv, L, D) layout; each of ``plain``
        is, of the two plain evaluations (scores from the BLAS in the input dtype, and
        correctly rounded scores), the one farther from ``exact`` (see
        :func:`attnbench.measure.oracle.oracle_runs` for why).
    """
    wide = oracle_dtype(problem.dtype)
    exact = run_backward(problem, dout, compute_dtype=wide, keep_precision=True)
    plain_dtype = compute_dtype(problem.dtype)  # float32 for half inputs
    # a half implementation keeps O in the half dtype (rowsum(dO * O) reads it back)
    round_to = problem.dtype if is_half(problem.dtype) else None
    blas = run_backward(problem, dout, compute_dtype=plain_dtype, round_to=round_to)
    rounded = run_backward(problem, dout, compute_dtype=plain_dtype, scores_from=wide,
                           round_to=round_to)
    plain = tuple(max(pair, key=lambda g, e=e: tolerance(e, g, problem.dtype))
                  for pair, e in zip(zip(blas, rounded, strict=True), exact, strict=True))
    return exact, plain


def lse_rounding(exact: np.ndarray, lse: np.ndarray) -> float:
    """The error a stored log-sum-exp brings into gradients recomputed from it.

    The fused backends rebuild P = exp(s − lse) from ``lse`` in the input dtype (as
    FlashAttention does), which is off from the true value by up to half an ulp of
    ``|lse|``: every P of that row is then scaled by up to ``1 ± ½ ulp(|lse|)``.  dV is
    linear in P; dS = P ∘ (dP − δ) carries it through P and through δ = rowsum(dO ∘ O),
    so the gradients move by at most ``2 · max|exact| · ½ ulp(max|lse|)``.  The plain
    formula (softmax computed from the scores) has no such term, so a tolerance built
    from its error alone misses it for large logits (scale = 1, |lse| ~ 10 and more).
    """
    finite = np.abs(lse[np.isfinite(lse)])
    if not finite.size:
        return 0.0
    half_ulp = 0.5 * float(np.spacing(finite.max().astype(lse.dtype)))
    return 2.0 * float(np.max(np.abs(exact), initial=0.0)) * half_ulp


def gradient_errors(grads, exact, plain, dtype, lse=None) -> dict:
    """The worst gradient against the oracle: its name, error and tolerance.

    Parameters
    ----------
    grads, exact, plain : tuple of ndarray
        ``(dq, dk, dv)`` of the backend, the oracle and the plain formulas (any shapes
        of the same sizes: the backend's are reshaped to the oracle's).
    dtype : numpy dtype
        The inputs' dtype.
    lse : ndarray, optional
        The stored log-sum-exp the backend rebuilt the softmax from (fused backends);
        adds :func:`lse_rounding` to each tolerance.

    Returns
    -------
    dict
        ``worst`` (the gradient of largest error / tolerance), ``max_abs_err``,
        ``tolerance``, ``within_tolerance`` (every gradient within its own tolerance).
    """
    worst, within = None, True
    for name, g, e, p in zip(GRADIENTS, grads, exact, plain, strict=True):
        error = max_abs_error(np.asarray(g).reshape(e.shape), e)
        tol = tolerance(e, p, dtype) + (0.0 if lse is None else lse_rounding(e, lse))
        within = within and error <= tol
        ratio = error / tol if tol > 0 else (0.0 if error == 0 else np.inf)
        if worst is None or ratio > worst[0]:
            worst = (ratio, name, error, tol)
    _, name, error, tol = worst
    return {"worst": name, "max_abs_err": error, "tolerance": tol, "within_tolerance": within}
