"""The oracle and the tolerance of a backward pass: gradients judged like the forward.

As for the forward (:mod:`attnbench.measure.oracle`): the gradients ``(dq, dk, dv)`` of a
backend must lie within twice the error of the same formulas evaluated in the input dtype
(:func:`kernels.reference.backward.run_backward` with ``compute_dtype`` the input dtype)
plus a few ulps, against the formulas in the wider dtype (float64 for float32 inputs,
``np.longdouble`` for float64).  Of the two plain evaluations (the BLAS's scores, and
correctly rounded ones) the one farther from the oracle counts, gradient by gradient.
The fused backends rebuild the softmax from a stored log-sum-exp, which adds
:func:`lse_rounding` to their tolerance, and form dS from two row dots that may cancel,
which adds :func:`row_dot_rounding`.

Half inputs: the plain formulas run in float32, with rowsum(dO ∘ O) taken from O rounded to
the half dtype (a half implementation keeps its output, and reads it back, in that dtype),
and their gradients are rounded to the half dtype.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from attnbench.kernels._dtypes import compute_dtype, eps, is_half
from attnbench.kernels.reference import forward as reference_forward
from attnbench.kernels.reference.backward import run_backward
from attnbench.measure.oracle import max_abs_error, oracle_dtype, tolerance

__all__ = ["GRADIENTS", "fused_terms", "gradient_errors", "gradient_oracle", "lse_rounding",
           "row_dot_rounding"]

#: Names of the three gradients, in the order :func:`kernels.attention_backward` returns them.
GRADIENTS = ("dq", "dk", "dv")


def gradient_oracle(problem, dout: np.ndarray):
    """``(exact, plain)``: the gradients from the oracle and from the formulas in the input dtype.

    Parameters
    ----------
    problem : kernels.AttentionProblem
        The validated call whose gradients are wanted.
    dout : ndarray, shape (B, H, Lq, Dv)
        The gradient of the loss with respect to the output.

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


def row_dot_rounding(problem, dout: np.ndarray) -> tuple[float, float, float]:
    """The error the fused backward's two row dots bring into dq and dk, per gradient.

    A fused backward forms dS = P ∘ (dP − δ) from dP = dO·Vᵀ (a tile product) and
    δ = rowsum(dO ∘ O) (O as stored), two dots of Dv terms summed in different orders.
    Where they nearly cancel (one visible key: P = 1, O = v, dS = 0 exactly) the result
    is their rounding, about one ulp of ``Σ_d |dO_d v_d|`` and of ``Σ_d |dO_d O_d|``,
    which the plain formula can happen to avoid (same order for both), so a tolerance
    built from its error alone has nothing for it.  Carried through dQ = dS·K·scale and
    dK = dSᵀ·Q·scale with the oracle's P, the bound is, entry by entry,
    ``scale · Σ_j P_ij · ε · (κ Σ_d |dO_id||v_jd| + Σ_d |dO_id||O_id|) · |k_j|`` (dq; dk
    alike with |q_i|, summed over a GQA group), ε the compute dtype's epsilon, κ the
    dropout's 1/(1−p).  dV = Pᵀ·dO has no such term.

    Parameters
    ----------
    problem : kernels.AttentionProblem
        The validated call whose gradient tolerance is built.
    dout : ndarray, shape (B, H, Lq, Dv)
        The output gradient the backward is given.

    Returns
    -------
    tuple of float
        The largest bound for dq, dk and dv (0).
    """
    B, H, Hkv, Lq, Lk, D, Dv = problem.shape
    group = H // Hkv
    weighted = replace(problem, return_weights=True, dropout_p=0.0)
    probs = np.asarray(reference_forward.run(weighted, compute_dtype=np.float64)[1],
                       dtype=np.float64)
    out = reference_forward.run(problem, compute_dtype=np.float64, keep_precision=True)[0]
    do = np.abs(dout.astype(np.float64))
    k = np.repeat(np.abs(problem.k.astype(np.float64)), group, axis=1)
    v = np.repeat(np.abs(problem.v.astype(np.float64)), group, axis=1)
    q = np.abs(problem.q.astype(np.float64))
    keep = 1.0 / (1.0 - problem.dropout_p)
    with np.errstate(invalid="ignore", over="ignore"):
        dots = keep * (do @ v.swapaxes(-1, -2)) + (do * np.abs(out)).sum(axis=-1)[..., None]
        per_pair = np.nan_to_num(eps(compute_dtype(problem.dtype)) * probs * dots)
        dq = problem.scale * (per_pair @ np.nan_to_num(k))
        dk = problem.scale * (per_pair.swapaxes(-1, -2) @ np.nan_to_num(q))
    dk = dk.reshape(B, Hkv, group, Lk, D).sum(axis=2)
    return (float(np.max(dq, initial=0.0)), float(np.max(dk, initial=0.0)), 0.0)


def fused_terms(problem, dout: np.ndarray, exact, lse: np.ndarray) -> tuple[float, ...]:
    """What the fused algorithm adds to each gradient's tolerance: :func:`lse_rounding`
    (P rebuilt from ``lse``) and :func:`row_dot_rounding` (dS from two row dots).

    Parameters
    ----------
    problem : kernels.AttentionProblem
    dout : ndarray, shape (B, H, Lq, Dv)
    exact : tuple of ndarray
        The oracle's ``(dq, dk, dv)``.
    lse : ndarray
        The log-sum-exp the softmax is rebuilt from: the backend's own, or (for code whose
        internals are unknown, as the conformance judge's) the oracle's rounded to the
        input dtype.
    """
    rows = row_dot_rounding(problem, dout)
    return tuple(lse_rounding(e, lse) + row for e, row in zip(exact, rows, strict=True))


def gradient_errors(grads, exact, plain, dtype, lse=None, extra=None) -> dict:
    """The worst gradient against the oracle: its name, error and tolerance.

    Parameters
    ----------
    grads, exact, plain : tuple of ndarray
        ``(dq, dk, dv)`` of the backend, the oracle and the plain formulas (any shapes
        of the same sizes: the backend's are reshaped to the oracle's); with attention
        sinks, ``dsinks`` fourth.
    dtype : numpy dtype
        The inputs' dtype.
    lse : ndarray, optional
        The stored log-sum-exp the backend rebuilt the softmax from (fused backends);
        adds :func:`lse_rounding` to each tolerance.
    extra : tuple of float, optional
        Added to each gradient's tolerance (:func:`fused_terms`).

    Returns
    -------
    dict
        ``worst`` (the gradient of largest error / tolerance), ``max_abs_err``,
        ``tolerance``, ``within_tolerance`` (every gradient within its own tolerance).
    """
    worst, within = None, True
    names = GRADIENTS + ("dsinks",) if len(exact) > len(GRADIENTS) else GRADIENTS
    extra = (0.0,) * len(exact) if extra is None else extra
    for name, g, e, p, term in zip(names, grads, exact, plain, extra, strict=True):
        error = max_abs_error(np.asarray(g).reshape(e.shape), e)
        tol = tolerance(e, p, dtype) + term + (0.0 if lse is None else lse_rounding(e, lse))
        within = within and error <= tol
        ratio = error / tol if tol > 0 else (0.0 if error == 0 else np.inf)
        if worst is None or ratio > worst[0]:
            worst = (ratio, name, error, tol)
    _, name, error, tol = worst
    return {"worst": name, "max_abs_err": error, "tolerance": tol, "within_tolerance": within}
