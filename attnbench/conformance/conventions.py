"""The convention properties: what an implementation does where conventions differ.

Observed and reported, never failures (status ``pass`` with ``observed`` saying what was
seen, or ``unsupported``):

- ``fully-masked-row``: the output of a query that sees no key (0 here; NaN or 0 in
  torch depending on backend and version; the mean of V in JAX).
- ``causal-alignment``: which alignment the convention's own causal flag takes when
  Lq ≠ Lk, and whether bottom-right causal is native or expressed as a mask.
- ``dropout``: whether dropout is accepted, and whether it drops what attnbench's
  counter-based hash drops for the same seed.
- ``lse``: the base of the returned log-sum-exp and its value on an empty row.
- ``float64-compute``: whether float64 inputs are computed in float64.
"""

from __future__ import annotations

import functools

import numpy as np

from attnbench import kernels
from attnbench.conformance.capabilities import REFUSALS, describe_exception
from attnbench.conformance.judge import expected, reference_output
from attnbench.conformance.outcome import Check, Outcome
from attnbench.measure.oracle import max_abs_error

__all__ = ["checks"]


def _tiny(rng, B=2, H=2, Lq=6, Lk=6, D=8, dtype=np.float32):
    return (rng.standard_normal((B, H, Lq, D)).astype(dtype),
            rng.standard_normal((B, H, Lk, D)).astype(dtype),
            rng.standard_normal((B, H, Lk, D)).astype(dtype))


def _describe_row(row, v) -> str:
    row = np.asarray(row, dtype=np.float64)  # (Dv,) per head: (H, Dv)
    if np.isnan(row).all():
        return "NaN"
    if np.isnan(row).any():
        return "partly NaN"
    if (row == 0).all():
        return "0"
    mean = v.astype(np.float64).mean(axis=-2)  # (H, Dv)
    if np.allclose(row, mean, atol=1e-5):
        return "the mean of V"
    return f"other values (max |x| {np.abs(row).max():.3g})"


def _fully_masked(how: str, subject) -> Outcome:
    q, k, v = _tiny(np.random.default_rng(21))
    if how == "bool-mask":
        mask = np.ones((2, 1, 6, 6), bool)
        mask[:, :, 2, :] = False  # query 2 sees nothing
        out = subject.adapter.forward(q, k, v, {"mask": mask})
        row, values = out[0, :, 2], v[0]
    else:
        out = subject.adapter.forward(q, k, v, {"key_lengths": np.array([0, 6])})
        row, values = out[0, :, 0], v[0]  # batch 0 sees no key
    return Outcome("pass", observed=_describe_row(row, values))


def _causal_alignment(subject) -> Outcome:
    q, k, v = _tiny(np.random.default_rng(22), Lq=3, Lk=7)
    out = np.asarray(subject.adapter.native_causal(q, k, v))
    seen = []
    for alignment in ("top-left", "bottom-right"):
        reference = reference_output(q, k, v, {"causal": alignment})
        if reference.shape == out.shape and max_abs_error(out, reference) < 1e-4:
            seen.append(alignment)
    flag = {"kernels": "causal=True", "sdpa": "is_causal=True",
            "jax": "is_causal=True"}[subject.adapter.convention]
    text = f"{flag} with Lq < Lk aligns {seen[0] if seen else 'neither way'}"
    state = subject.capabilities.get("bottom-right", ("supported", ""))[0]
    if subject.adapter.convention == "kernels":
        text += "; causal='bottom-right' " + ("supported" if state == "supported" else
                                              f"not supported ({state})")
    else:
        text += "; bottom-right is expressed as a bool mask (no native flag)"
    return Outcome("pass", observed=text)


def _dropout(subject) -> Outcome:
    q, k, v = _tiny(np.random.default_rng(23), B=1, Lq=16, Lk=16)
    try:
        first = np.asarray(subject.adapter.dropout(q, k, v, 0.5, 5))
    except REFUSALS as exc:
        return Outcome("unsupported", f"dropout refused ({describe_exception(exc)})")
    plain = reference_output(q, k, v, {})
    if first.shape != plain.shape:
        return Outcome("pass", observed=f"accepted; output shape {first.shape}")
    if np.allclose(first, plain, atol=1e-5):
        return Outcome("pass", observed="accepted but nothing dropped (dropout_p ignored)")
    ours = reference_output(q, k, v, {"dropout_p": 0.5, "seed": 5})
    if np.allclose(first, ours, atol=1e-4):
        return Outcome("pass", observed="drops what attnbench's counter-based hash drops for "
                                        "the same seed")
    again = np.asarray(subject.adapter.dropout(q, k, v, 0.5, 5))
    seeded = "the same seed gives the same drops" if np.array_equal(first, again) else \
        "the same seed gives different drops"
    return Outcome("pass", observed=f"accepted, its own random numbers ({seeded})")


def _lse(subject) -> Outcome:
    q, k, v = _tiny(np.random.default_rng(24))
    kwargs = {"key_lengths": np.array([0, 6])}
    if subject.capabilities.get("key-lengths", ("",))[0] != "supported":
        kwargs = {}
    try:
        out, lse = subject.adapter.forward_lse(q, k, v, kwargs)
    except REFUSALS as exc:
        return Outcome("unsupported", f"no log-sum-exp ({describe_exception(exc)})")
    _, natural = kernels.attention(*(x.astype(np.float64) for x in (q, k, v)),
                                      backend="reference", return_lse=True, **kwargs)
    lse = np.asarray(lse, dtype=np.float64)
    if lse.shape != natural.shape:
        return Outcome("pass", observed=f"lse of shape {lse.shape}, (B, H, Lq) is "
                                        f"{natural.shape}")
    rows = np.isfinite(natural)
    if np.allclose(lse[rows], natural[rows], rtol=1e-4, atol=1e-4):
        base = "natural log"
    elif np.allclose(lse[rows], natural[rows] / np.log(2), rtol=1e-4, atol=1e-4):
        base = "base 2"
    else:
        base = "neither natural nor base 2"
    text = f"lse in {base}"
    if (~rows).any():
        empty = lse[~rows]
        text += f"; an empty row's lse is {empty.flat[0]:g}" if np.all(
            (empty == empty.flat[0]) | (np.isnan(empty) & np.isnan(empty.flat[0]))) else \
            f"; empty rows' lse vary ({empty.min():g} to {empty.max():g})"
    return Outcome("pass", observed=text)


def _float64_compute(subject) -> Outcome:
    rng = np.random.default_rng(25)
    q, k, v = _tiny(rng, B=1, Lq=13, Lk=13, D=11, dtype=np.float64)
    exact, tol64 = expected(q, k, v, {})
    _, tol32 = expected(*(x.astype(np.float32) for x in (q, k, v)), {})
    out = np.asarray(subject.adapter.forward(q, k, v, {}))
    error = max_abs_error(out.astype(np.float64), exact.astype(np.float64)) \
        if out.shape == exact.shape else np.inf
    if error <= tol64:
        text = f"float64 inputs computed in float64 (max error {error:.2g})"
    elif error <= tol32:
        text = (f"float64 inputs computed at float32 precision (max error {error:.2g}; "
                f"float64 tolerance {tol64:.2g}, float32's {tol32:.2g})")
    else:
        text = f"float64 max error {error:.2g} (tolerance {tol64:.2g})"
    return Outcome("pass", observed=text + f", output dtype {out.dtype}",
                   max_error=error, tolerance=tol64)


def checks() -> list[Check]:
    """Every convention check, in report order."""
    return [
        Check("fully-masked-row", "convention", "bool-mask",
              functools.partial(_fully_masked, "bool-mask"), frozenset({"bool-mask"})),
        Check("fully-masked-row", "convention", "key-lengths-0",
              functools.partial(_fully_masked, "key-lengths"), frozenset({"key-lengths"})),
        Check("causal-alignment", "convention", "Lq<Lk", _causal_alignment,
              frozenset({"cross"})),
        Check("dropout", "convention", "p=0.5", _dropout),
        Check("lse", "convention", "return-lse", _lse),
        Check("float64-compute", "convention", "odd-float64", _float64_compute,
              frozenset({"float64"})),
    ]
