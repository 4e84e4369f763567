"""The oracle and the tolerance every fast path is judged by.

Tolerance follows FlashAttention's tests: a backend's error against the oracle (the
reference formula in a wider dtype) may be at most twice the error of a plain
implementation of the same formula computed in the input dtype, plus a floor of a few
ulps of the output's magnitude (for problems where the plain implementation happens to
be exact).  The plain implementation is :func:`kernels.reference.run` with
``compute_dtype`` set to the input dtype: the very same formula, so the baseline
measures rounding alone; of its two roundings of the scores (the BLAS's, and correctly
rounded ones) the larger error counts (:func:`oracle_runs`).

The oracle is computed in a wider dtype than the input (:func:`oracle_dtype`): float64
for float32 inputs and, for float64 inputs, ``np.longdouble`` (x87 extended precision,
64-bit mantissa, on x86-64 Linux).  For float64 inputs a float64 oracle would be the
plain implementation itself: its baseline error would be 0 and the tolerance the bare
floor of 4 ulps, which a correct fused kernel exceeds (its sums are ordered differently:
~7 ulps on L = 97, D = 64).  The oracle is not rounded back to the input dtype.

Half inputs (float16, bfloat16) are computed in float32 by every backend, so their baseline
is the formula as a standard half-precision implementation rounds it: in float32 (where
NumPy accumulates), with the scaled scores, the weights and the output rounded to the input
dtype (:func:`kernels.reference.run`'s ``round_to``); the oracle is float64 over the
already rounded half inputs, and the floor is :data:`ULP_FLOOR` ulps of the half dtype.
"""

from __future__ import annotations

import numpy as np

from attnbench.kernels._dtypes import compute_dtype, eps, is_half
from attnbench.kernels.reference import forward as reference

__all__ = ["HALF_ULP_FLOOR", "ULP_FLOOR", "max_abs_error", "oracle", "oracle_dtype",
           "oracle_runs", "tolerance"]

#: ulps of the output's magnitude (at least 1) always allowed, whatever the baseline.
ULP_FLOOR = 4
#: The same for half inputs, in ulps of the half dtype (a kernel that accumulates in
#: float32 and rounds its output once is within half an ulp of the exact output).
HALF_ULP_FLOOR = 2


def oracle_dtype(dtype) -> np.dtype:
    """The dtype the oracle computes in for inputs of ``dtype``: the next wider float.

    float32 -> float64; float64 -> ``np.longdouble`` where that is wider (x86-64 Linux:
    80-bit extended), else float64 (then float64 results are judged by the floor alone).
    """
    dtype = np.dtype(dtype)
    if dtype.itemsize < 8:
        return np.dtype(np.float64)
    if np.finfo(np.longdouble).eps < np.finfo(dtype).eps:
        return np.dtype(np.longdouble)
    return dtype


def oracle(problem):
    """The oracle's output and the baseline: the same formula computed in the problem's dtype.

    Parameters
    ----------
    problem : kernels.AttentionProblem

    Returns
    -------
    exact : ndarray, shape (B, H, Lq, Dv), dtype ``oracle_dtype(problem.dtype)``
        :func:`kernels.reference.run` evaluated in the oracle dtype and not rounded
        (``keep_precision=True``).
    plain : ndarray, shape (B, H, Lq, Dv), dtype of the problem
        The baseline whose error sets the tolerance (see :func:`oracle_runs`).
    """
    (exact, _), (plain, _) = oracle_runs(problem)
    return exact, plain


def oracle_runs(problem):
    """``(exact, plain)``: the ``(out, weights)`` of the oracle and of the baseline.

    The baseline is, of two plain evaluations of the formula in the problem's dtype, the
    one whose output is farther from the oracle's.  One is ``kernels.reference.run(problem,
    compute_dtype=problem.dtype)`` (its scores are the BLAS's products); the other rounds
    correctly computed scores to the dtype (``scores_from=`` the oracle dtype) and goes on
    in the dtype.  Either rounding is one a correct implementation may make.  Where a near
    tie between a row's largest scores makes the output sensitive to the scores' last bits,
    the BLAS's products alone can land closer than correctly rounded scores (measured: 4x
    closer on one draw of unscaled logits with |q|, |k| ~ 6, L = 9, Lk = 31, D = 59), and a
    tolerance set by that one lucky draw fails implementations that make no error of their
    own.  ``weights`` is None unless the problem asks for them (``return_weights``).

    For a half problem both evaluations run in float32 and round the scores, the weights
    and the output to the half dtype (``round_to``): the half baseline.
    """
    return _exact_and_plain(reference.run, problem)


def _exact_and_plain(run, problem):
    """``(exact, plain)`` of ``run``, a reference evaluation (``kernels.reference.run`` or
    its decode twin) that takes ``compute_dtype``, ``keep_precision``, ``scores_from`` and
    ``round_to``: ``run`` in the oracle dtype, not rounded, and the farther from it of its
    two evaluations in the problem's dtype (see :func:`oracle_runs`)."""
    wide = oracle_dtype(problem.dtype)
    exact = run(problem, compute_dtype=wide, keep_precision=True)
    plain_dtype = compute_dtype(problem.dtype)  # float32 for half inputs
    round_to = problem.dtype if is_half(problem.dtype) else None
    blas = run(problem, compute_dtype=plain_dtype, round_to=round_to)
    rounded = run(problem, compute_dtype=plain_dtype, scores_from=wide, round_to=round_to)
    return exact, max((blas, rounded), key=lambda runs: _baseline_error(exact[0], runs[0]))


def tolerance(exact: np.ndarray, plain: np.ndarray, dtype) -> float:
    """``2 x`` the plain implementation's max error + :data:`ULP_FLOOR` ulps of the scale
    (:data:`HALF_ULP_FLOOR` ulps of the half dtype for float16 and bfloat16 inputs).

    Parameters
    ----------
    exact : ndarray
        The oracle (see :func:`oracle`).
    plain : ndarray
        The same formula computed in ``dtype``.
    dtype : dtype
        The input dtype (its machine epsilon sets the floor; bfloat16's is 2**-7,
        float16's 2**-10).

    Returns
    -------
    float
    """
    if exact.size == 0:
        return 0.0
    with np.errstate(invalid="ignore"):
        scale = float(np.max(np.abs(exact), where=np.isfinite(exact), initial=1.0))
    floor = HALF_ULP_FLOOR if is_half(dtype) else ULP_FLOOR
    return 2 * _baseline_error(exact, plain) + floor * eps(dtype) * max(scale, 1.0)


def _baseline_error(exact: np.ndarray, plain: np.ndarray) -> float:
    """Max ``|plain - exact|`` over the entries where ``exact`` is finite."""
    if exact.size == 0:
        return 0.0
    with np.errstate(invalid="ignore"):
        return float(np.max(np.abs(plain.astype(exact.dtype) - exact),
                            where=np.isfinite(exact), initial=0.0))


def max_abs_error(result: np.ndarray, exact: np.ndarray) -> float:
    """Max ``|result - exact|`` over the entries where ``exact`` is finite.

    Parameters
    ----------
    result : ndarray
        What an implementation computed.
    exact : ndarray, same shape
        The oracle (see :func:`oracle`).

    Returns
    -------
    float
        ``inf`` if the NaN or inf entries of ``result`` differ from those of ``exact`` (a
        NaN where the oracle has a number is an error, not a small one).
    """
    if result.shape != exact.shape:
        raise ValueError(f"result has shape {result.shape}, the oracle {exact.shape}")
    if result.size == 0:
        return 0.0
    result = result.astype(np.result_type(exact.dtype, np.float64))
    finite = np.isfinite(exact)
    same_nan = np.array_equal(np.isnan(result), np.isnan(exact))
    same_inf = np.array_equal(result[np.isinf(exact)], exact[np.isinf(exact)])
    if not (same_nan and same_inf and np.isfinite(result[finite]).all()):
        return float("inf")
    with np.errstate(invalid="ignore"):  # inf - inf where both are -inf: left out below
        difference = np.abs(result - exact)
    return float(np.max(difference, where=finite, initial=0.0))


def decode_oracle(problem):
    """The oracle and baseline of a decode step (:class:`kernels._problems.decode.DecodeProblem`,
    new tokens already in the cache): ``(exact, plain)``, each ``(out, lse)``.

    As :func:`oracle_runs`: the reference decode (:mod:`kernels.reference.decode`, pages
    gathered, then the literal formula) in the oracle dtype, not rounded; the baseline is
    the farther of its two evaluations in the problem's dtype (the BLAS's scores, and
    correctly rounded ones); for half inputs, in float32 with the scores, weights and
    output rounded to the half dtype, as for the dense call.
    """
    from attnbench.kernels.reference import decode

    return _exact_and_plain(decode.run, problem)
