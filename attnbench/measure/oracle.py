"""The oracle and the tolerance every fast path is judged by.

Tolerance follows FlashAttention's tests: a backend's error against the oracle (the
reference formula in a wider dtype) may be at most twice the error of a plain
implementation of the same formula computed in the input dtype, plus a floor of a few
ulps of the output's magnitude (for problems where the plain implementation happens to
be exact).  The plain implementation is :func:`kernels.reference.run` with
``compute_dtype`` set to the input dtype: the very same formula, so the baseline
measures rounding alone.

The oracle is computed in a wider dtype than the input (:func:`oracle_dtype`): float64
for float32 inputs and, for float64 inputs, ``np.longdouble`` (x87 extended precision,
64-bit mantissa, on x86-64 Linux).  For float64 inputs a float64 oracle would be the
plain implementation itself: its baseline error would be 0 and the tolerance the bare
floor of 4 ulps, which a correct fused kernel exceeds (its sums are ordered differently:
~7 ulps on L = 97, D = 64).  The oracle is not rounded back to the input dtype.
"""

from __future__ import annotations

import numpy as np

from kernels.reference import forward as reference

__all__ = ["ULP_FLOOR", "max_abs_error", "oracle", "oracle_dtype", "tolerance"]

#: ulps of the output's magnitude (at least 1) always allowed, whatever the baseline.
ULP_FLOOR = 4


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
    """The oracle's output and the same formula computed in the problem's dtype.

    Parameters
    ----------
    problem : kernels.AttentionProblem

    Returns
    -------
    exact : ndarray, shape (B, H, Lq, Dv), dtype ``oracle_dtype(problem.dtype)``
        :func:`kernels.reference.run` evaluated in the oracle dtype and not rounded
        (``keep_precision=True``).
    plain : ndarray, shape (B, H, Lq, Dv), dtype of the problem
        ``kernels.reference.run(problem, compute_dtype=problem.dtype)``: the baseline
        whose error sets the tolerance.
    """
    wide = oracle_dtype(problem.dtype)
    exact, _ = reference.run(problem, compute_dtype=wide, keep_precision=True)
    plain, _ = reference.run(problem, compute_dtype=problem.dtype)
    return exact, plain


def tolerance(exact: np.ndarray, plain: np.ndarray, dtype) -> float:
    """``2 x`` the plain implementation's max error + :data:`ULP_FLOOR` ulps of the scale.

    Parameters
    ----------
    exact : ndarray
        The oracle (see :func:`oracle`).
    plain : ndarray
        The same formula computed in ``dtype``.
    dtype : dtype
        The input dtype (its machine epsilon sets the floor).

    Returns
    -------
    float
    """
    if exact.size == 0:
        return 0.0
    with np.errstate(invalid="ignore"):
        finite = np.isfinite(exact)
        baseline = float(np.max(np.abs(plain.astype(exact.dtype) - exact), where=finite,
                                initial=0.0))
        scale = float(np.max(np.abs(exact), where=finite, initial=1.0))
    return 2 * baseline + ULP_FLOOR * float(np.finfo(dtype).eps) * max(scale, 1.0)


def max_abs_error(result: np.ndarray, exact: np.ndarray) -> float:
    """Max ``|result - exact|`` over the entries where ``exact`` is finite.

    Returns ``inf`` if the NaN or inf entries of ``result`` differ from those of
    ``exact`` (a NaN where the oracle has a number is an error, not a small one).
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
    return float(np.max(np.abs(result - exact), where=finite, initial=0.0))
