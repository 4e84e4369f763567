"""The determinism properties: the same inputs give the same bits.

- ``repeatable``: three calls on the same inputs are bit-identical.
- ``thread-count``: one thread and every thread (Numba, the BLAS, OpenMP and torch pools;
  :func:`~attnbench.measure.problems.limit_threads`) give the same bits.  jax's thread
  pool is fixed when it starts, so for jax this compares two calls.
- ``batch-invariance``: each batch element computed alone gives the bits it gets among its
  batch mates.

Failing one is a failure only under ``attnbench conform --deterministic``.
"""

from __future__ import annotations

import functools

import numba
import numpy as np

from attnbench.conformance.cases import features, inputs
from attnbench.conformance.outcome import Check, Outcome
from attnbench.measure.problems import ProblemSpec

__all__ = ["checks"]

_CASES = (("plain", ProblemSpec(B=2, H=4, Lq=64, D=32)),
          ("causal+key-lengths", ProblemSpec(B=3, H=2, Lq=48, D=16, causal=True,
                                             key_lengths="random")))
_BATCH_CASES = (("key-lengths", ProblemSpec(B=4, H=2, Lq=24, D=16, key_lengths="random")),
                ("bool-mask", ProblemSpec(B=4, H=2, Lq=24, D=16, mask="bool")),
                ("plain", ProblemSpec(B=4, H=2, Lq=40, D=16)))


def _differ(a, b) -> str:
    a, b = np.asarray(a), np.asarray(b)
    if a.shape != b.shape:
        return f"shapes {a.shape} and {b.shape}"
    if np.array_equal(a, b, equal_nan=True):
        return ""
    with np.errstate(invalid="ignore"):
        gap = float(np.nanmax(np.abs(a.astype(np.float64) - b)))
    count = int((~((a == b) | (np.isnan(a) & np.isnan(b)))).sum())
    return f"{count} of {a.size} outputs differ, by up to {gap:.3g}"


def _repeatable(spec, subject) -> Outcome:
    q, k, v, kwargs = inputs(spec, "float32")
    first = subject.adapter.forward(q, k, v, kwargs)
    for call in (2, 3):
        gap = _differ(first, subject.adapter.forward(q, k, v, kwargs))
        if gap:
            return Outcome("fail", f"call {call} on the same inputs differs from call 1: "
                                   f"{gap} (nondeterministic: random numbers, races or "
                                   "order-dependent sums)")
    return Outcome("pass", observed="3 calls bit-identical")


def _thread_count(spec, subject) -> Outcome:
    most = numba.config.NUMBA_NUM_THREADS
    if most < 2:
        return Outcome("unsupported", "one thread only on this machine (NUMBA_NUM_THREADS=1)")
    q, k, v, kwargs = inputs(spec, "float32")
    with subject.adapter.threads(1):
        one = subject.adapter.forward(q, k, v, kwargs)
    with subject.adapter.threads(most):
        many = subject.adapter.forward(q, k, v, kwargs)
    gap = _differ(one, many)
    fixed = " (jax's thread pool is fixed when it starts: two calls compared)" \
        if subject.adapter.convention == "jax" else ""
    if gap:
        return Outcome("fail", f"1 thread and {most} threads differ: {gap}{fixed}")
    return Outcome("pass", observed=f"1 and {most} threads bit-identical{fixed}")


def _slice_kwargs(kwargs, b):
    sliced = dict(kwargs)
    if kwargs.get("key_lengths") is not None:
        lengths = np.asarray(kwargs["key_lengths"])
        sliced["key_lengths"] = lengths[b:b + 1] if lengths.ndim else lengths
    mask = kwargs.get("mask")
    if mask is not None and np.ndim(mask) == 4 and np.shape(mask)[0] > 1:
        sliced["mask"] = np.ascontiguousarray(mask[b:b + 1])
    return sliced


def _batch_invariance(spec, subject) -> Outcome:
    q, k, v, kwargs = inputs(spec, "float32")
    together = np.asarray(subject.adapter.forward(q, k, v, kwargs))
    for b in range(q.shape[0]):
        alone = subject.adapter.forward(q[b:b + 1], k[b:b + 1], v[b:b + 1],
                                        _slice_kwargs(kwargs, b))
        gap = _differ(together[b:b + 1], alone)
        if gap:
            return Outcome("fail", f"batch element {b} computed alone differs from the same "
                                   f"element among {q.shape[0]}: {gap} (the result depends "
                                   "on its batch mates)")
    return Outcome("pass", observed=f"each of {q.shape[0]} alone bit-identical")


def checks() -> list[Check]:
    """Every determinism check, in report order."""
    found = []
    for name, spec in _CASES:
        found.append(Check("repeatable", "determinism", name,
                           functools.partial(_repeatable, spec), features(spec, "float32")))
    for name, spec in _CASES:
        found.append(Check("thread-count", "determinism", name,
                           functools.partial(_thread_count, spec), features(spec, "float32")))
    for name, spec in _BATCH_CASES:
        found.append(Check("batch-invariance", "determinism", name,
                           functools.partial(_batch_invariance, spec),
                           features(spec, "float32")))
    return found
