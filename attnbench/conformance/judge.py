"""Judging an output against the oracle, and naming the bug behind a disagreement.

The oracle and the tolerance are the harness's (:mod:`attnbench.measure.oracle`): the
reference formula in a wider dtype; an error may be at most twice that of the same
formula evaluated in the input dtype, plus a few ulps.  When an output disagrees,
:func:`diagnose` tries the usual mistakes (scale forgotten, a mask ignored or read
inverted, the wrong causal alignment, GQA heads interleaved) and says which one the
output matches.
"""

from __future__ import annotations

import numpy as np

from attnbench import kernels
from attnbench.conformance.outcome import Outcome
from attnbench.measure.oracle import max_abs_error, oracle, tolerance

__all__ = ["diagnose", "expected", "judge", "reference_output"]


def expected(q, k, v, kwargs):
    """``(exact, tol)``: the oracle's output of the problem and its tolerance."""
    problem = kernels.prepare(q, k, v, **kwargs)
    exact, plain = oracle(problem)
    return exact, tolerance(exact, plain, problem.dtype)


def reference_output(q, k, v, kwargs) -> np.ndarray:
    """The reference formula in float64 (for comparisons that need no tolerance model)."""
    return kernels.attention(*(x.astype(np.float64) for x in (q, k, v)), backend="reference",
                             **kwargs)


def judge(out, q, k, v, kwargs, *, diagnose_failure: bool = True) -> Outcome:
    """``pass`` if ``out`` has the oracle's shape and lies within tolerance of it."""
    exact, tol = expected(q, k, v, kwargs)
    out = np.asarray(out)
    if out.shape != exact.shape:
        return Outcome("fail", f"output shape {out.shape}, expected {exact.shape}")
    if not np.issubdtype(out.dtype, np.floating):
        return Outcome("fail", f"output dtype {out.dtype}, expected a float array")
    error = max_abs_error(out, exact)
    if error <= tol:
        return Outcome("pass", max_error=error, tolerance=tol)
    detail = f"max error {error:.3g} > tolerance {tol:.3g}"
    bad = ~np.isfinite(out)
    if bad.any():
        detail = f"{int(bad.sum())} of {out.size} outputs are NaN or inf; " + detail
    if diagnose_failure:
        hint = diagnose(out, q, k, v, kwargs, tol)
        if hint:
            detail += f": {hint}"
    return Outcome("fail", detail, max_error=error, tolerance=tol)


def _interleaved_heads(q, k, v, kwargs):
    """The problem with kv head ``h % Hkv`` read by query head h (instead of h // group)."""
    H, Hkv = q.shape[1], k.shape[1]
    heads = np.arange(H) % Hkv
    return q, k[:, heads], v[:, heads], kwargs


def _alternatives(q, k, v, kwargs):
    """(what, q, k, v, kwargs) of the usual mistakes that apply to this problem."""
    D = q.shape[-1]
    Lq, Lk = q.shape[2], k.shape[2]
    if kwargs.get("scale") is None:
        yield "the output matches attention with scale = 1: the 1/sqrt(D) scaling is " \
              "missing", q, k, v, {**kwargs, "scale": 1.0}
        yield "the output matches attention with scale = 1/D instead of 1/sqrt(D)", \
            q, k, v, {**kwargs, "scale": 1.0 / D}
    if kwargs.get("scale") is not None:
        yield "the output matches attention with the default scale 1/sqrt(D): the scale " \
              "argument is ignored", q, k, v, {key: value for key, value in kwargs.items()
                                               if key != "scale"}
    without = {key: value for key, value in kwargs.items()}
    if kwargs.get("key_lengths") is not None:
        drop = {key: value for key, value in without.items() if key != "key_lengths"}
        yield "the output matches attention without key_lengths: key_lengths are ignored " \
              "(padding keys are attended)", q, k, v, drop
    mask = kwargs.get("mask")
    if mask is not None:
        drop = {key: value for key, value in without.items() if key != "mask"}
        yield "the output matches attention without the mask: the mask is ignored", \
            q, k, v, drop
        if np.asarray(mask).dtype == np.bool_:
            yield "the output matches attention with the bool mask inverted: True is taken " \
                  "as hidden (it means attend)", q, k, v, {**kwargs, "mask": ~np.asarray(mask)}
    causal = kwargs.get("causal", False)
    if causal is not False:
        drop = {key: value for key, value in without.items() if key != "causal"}
        yield "the output matches attention without causal: the causal mask is ignored " \
              "(queries see future keys)", q, k, v, drop
        if Lq != Lk:
            other = "top-left" if causal == "bottom-right" else "bottom-right"
            yield f"the output matches causal aligned {other}: the causal alignment is " \
                  "wrong", q, k, v, {**kwargs, "causal": other}
    else:
        yield "the output matches causal attention: it applies a causal mask nobody asked " \
              "for", q, k, v, {**kwargs, "causal": True}
    if 1 < k.shape[1] < q.shape[1]:
        yield "the output matches GQA with kv head h % Hkv: query heads are mapped to kv " \
              "heads interleaved instead of h // (H / Hkv)", *_interleaved_heads(q, k, v,
                                                                                   kwargs)


def diagnose(out, q, k, v, kwargs, tol: float) -> str:
    """The usual mistake ``out`` matches (within 10x the tolerance), or ``""``."""
    for what, qa, ka, va, kw in _alternatives(q, k, v, kwargs):
        try:
            alternative = reference_output(qa, ka, va, kw)
        except (TypeError, ValueError):
            continue
        if alternative.shape == out.shape and max_abs_error(out, alternative) <= 10 * tol:
            return what
    return ""
