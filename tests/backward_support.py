"""Helpers of the backward-pass tests: the gradient oracle and the tolerance check.

As for the forward (``tests/support.py``): a backend's gradients must lie within twice the
error of the same formulas evaluated in the input dtype (the reference backward with
``compute_dtype`` = the input dtype; of its two roundings of the scores, the worse)
plus a few ulps, against the oracle in float64 (for float32 inputs) or ``np.longdouble``
(for float64 inputs): :func:`attnbench.measure.grad_oracle.gradient_oracle`.
"""

from __future__ import annotations

import numpy as np

from attnbench import kernels
from attnbench.kernels.reference import forward as reference
from attnbench.measure.grad_oracle import fused_terms, gradient_oracle
from attnbench.measure.oracle import tolerance

from .support import COMPARISONS, max_error


def make_dout(q, v, seed=0):
    """A random output gradient for attention(q, k, v): q's shape with v's last dim."""
    rng = np.random.default_rng(seed + 99)
    return rng.standard_normal(q.shape[:-1] + v.shape[-1:]).astype(q.dtype)


def backward_oracle(q, k, v, dout, **kwargs):
    """``(exact, plain)``: the gradients (dq, dk, dv) from the oracle and from the formulas
    in q's dtype, in the caller's shapes."""
    problem = kernels.prepare(q, k, v, **kwargs)
    B, H, _, Lq, _, _, Dv = problem.shape
    dout4 = np.ascontiguousarray(dout).reshape(B, H, Lq, Dv)
    exact, plain = gradient_oracle(problem, dout4)  # half inputs: a float32 baseline, rounded
    shapes = (np.shape(q), np.shape(k), np.shape(v))

    def restore(grads):
        return tuple(g.reshape(s) for g, s in zip(grads, shapes, strict=True))

    return restore(exact), restore(plain)


def assert_gradients_match(q, k, v, backend, *, dout_seed=0, pass_forward=True, **kwargs):
    """Run ``attention_backward`` on ``backend`` and check dq, dk, dv against the oracle.

    ``pass_forward``: give the backend ``out`` and ``lse`` from its own forward (as a
    training step does); otherwise it recomputes them.  The tolerance is the forward's
    (twice the plain formula's error plus a few ulps) plus, for the fused backends, the
    terms for P rebuilt from a stored log-sum-exp and dS formed from two row dots
    (:func:`attnbench.measure.grad_oracle.fused_terms`).  Returns the largest error
    ratio.
    """
    dout = make_dout(q, v, dout_seed)
    exact, plain = backward_oracle(q, k, v, dout, **kwargs)
    out, lse = kernels.attention(q, k, v, backend=backend, return_lse=True, **kwargs)
    extra = dict(out=out, lse=lse) if pass_forward else {}
    grads = kernels.attention_backward(q, k, v, dout, backend=backend, **extra, **kwargs)
    fused = (0.0, 0.0, 0.0)
    if backend != "reference":
        problem = kernels.prepare(q, k, v, **kwargs)
        B, H, _, Lq, _, _, Dv = problem.shape
        fused = fused_terms(problem, np.ascontiguousarray(dout).reshape(B, H, Lq, Dv),
                            exact, lse)
    worst = 0.0
    for name, g, e, p, term in zip(("dq", "dk", "dv"), grads, exact, plain, fused,
                                   strict=True):
        assert g.dtype == q.dtype and g.shape == e.shape, (name, g.dtype, g.shape, e.shape)
        err = max_error(g, e)
        tol = tolerance(e, p, q.dtype) + term
        assert err <= tol, f"{backend} backward: {name} error {err:.3g} > tolerance {tol:.3g}"
        COMPARISONS.append((f"{backend}-bwd", np.dtype(q.dtype).name, err, tol))
        worst = max(worst, err / tol if tol else 0.0)
    return worst


def assert_lse_matches(q, k, v, backend, **kwargs):
    """``attention(..., return_lse=True)`` on ``backend`` against the reference's lse.

    The reference's lse (float64, rounded to the input dtype) is compared within twice the
    forward's tolerance (from the lse computed in the input dtype); rows that see no key
    are ``-inf`` in both; the output is the one the call without ``return_lse`` gives.
    """
    out, lse = kernels.attention(q, k, v, backend=backend, return_lse=True, **kwargs)
    _, exact = kernels.attention(q, k, v, backend="reference", return_lse=True, **kwargs)
    problem = kernels.prepare(q, k, v, **kwargs)
    *_, plain = reference.run(problem, compute_dtype=q.dtype, return_lse=True)
    plain = problem.restore(plain[..., None])[..., 0]
    np.testing.assert_array_equal(np.isneginf(lse), np.isneginf(exact))
    assert max_error(lse, exact) <= 2 * tolerance(exact, plain, q.dtype)
    np.testing.assert_array_equal(out, kernels.attention(q, k, v, backend=backend, **kwargs))


def assert_matches_finite_differences(q, k, v, dout, **kwargs):
    """The float64 reference's gradients against central differences (step 1e-6) of the
    reference forward's ``sum(dout * attention(q, k, v, **kwargs))``: relative error (to
    the largest numeric gradient) <= 1e-6, and some gradient is not tiny (not vacuous)."""
    def loss(q, k, v):
        return float((dout * kernels.attention(q, k, v, backend="reference", **kwargs)).sum())

    grads = kernels.attention_backward(q, k, v, dout, backend="reference", **kwargs)
    eps = 1e-6
    largest = 0.0
    for index, (x, grad) in enumerate(zip((q, k, v), grads, strict=True)):
        numeric = np.zeros_like(x)
        for idx in np.ndindex(x.shape):
            args = [q, k, v]
            for sign in (1, -1):
                bumped = x.copy()
                bumped[idx] += sign * eps
                args[index] = bumped
                numeric[idx] += sign * loss(*args) / (2 * eps)
        scale = max(np.abs(numeric).max(), 1e-3)
        assert np.abs(grad - numeric).max() / scale <= 1e-6, "qkv"[index]
        largest = max(largest, np.abs(numeric).max())
    assert largest > 0.01  # the check is not vacuous
