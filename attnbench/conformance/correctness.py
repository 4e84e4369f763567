"""The correctness properties: each a list of :class:`~attnbench.conformance.outcome.Check`.

- ``agreement-float32``, ``agreement-float64``: the named case table and the problems
  drawn from the run's seed against the oracle.
- ``hidden-values``: NaN or inf stored in k and v behind key_lengths, a bool mask, an
  additive ``-inf`` mask or the causal diagonal leave every output that cannot see them
  within tolerance of the clean problem's oracle.
- ``future-tokens``: changing the keys, values and queries after position t changes no
  output of a query that may not see them (both causal alignments).
- ``large-logits``: logits in the hundreds give finite outputs within tolerance (the
  project's rule: its baseline counts correctly rounded logits too, so a lucky BLAS order
  does not set it).
- ``shape-dtype``: the output is ``(B, H, Lq, Dv)`` in the input dtype.
- ``gradients``: ``(dq, dk, dv)`` against the oracle's (:mod:`attnbench.measure.grad_oracle`).
"""

from __future__ import annotations

import functools

import numpy as np

from attnbench import kernels
from attnbench.conformance.cases import (
    CASES,
    GRADIENT_CASES,
    case_seed,
    drawn_cases,
    features,
    inputs,
)
from attnbench.conformance.judge import expected, judge
from attnbench.conformance.outcome import Check, Outcome
from attnbench.measure.grad_oracle import fused_terms, gradient_errors, gradient_oracle
from attnbench.measure.oracle import max_abs_error
from attnbench.measure.problems import ProblemSpec

__all__ = ["checks"]


def _agreement(spec, dtype, seed, subject) -> Outcome:
    q, k, v, kwargs = inputs(spec, dtype, seed)
    return judge(subject.adapter.forward(q, k, v, kwargs), q, k, v, kwargs)


# --- hidden values ----------------------------------------------------------------------


def _hidden_problem(where: str, rng):
    """``q, k, v, kwargs, poisoned``: poisoned (B, Hkv, Lk) bool, keys hidden from some rows."""
    B, H, Lq, Lk, D = 2, 2, 8, 10, 8
    q = rng.standard_normal((B, H, Lq, D)).astype(np.float32)
    k = rng.standard_normal((B, H, Lk, D)).astype(np.float32)
    v = rng.standard_normal((B, H, Lk, D)).astype(np.float32)
    poisoned = np.zeros((B, H, Lk), bool)
    if where == "key-lengths":
        lengths = np.array([7, 4])
        poisoned[:] = np.arange(Lk)[None, None, :] >= lengths[:, None, None]
        kwargs = {"key_lengths": lengths}
    elif where == "bool-mask":
        mask = rng.random((B, 1, Lq, Lk)) < 0.7
        mask[..., 0] = True  # every row sees a key
        mask[..., 7:] = False  # keys 7.. hidden from every row
        poisoned[..., 7:] = True
        kwargs = {"mask": mask}
    elif where == "float-mask":
        additive = rng.standard_normal((1, H, Lq, Lk)).astype(np.float32)
        additive[..., 6:] = -np.inf
        poisoned[..., 6:] = True
        kwargs = {"mask": additive}
    elif where == "causal":
        poisoned[..., 5:] = True  # keys 5.. hidden from queries 0-4
        kwargs = {"causal": True}
        k, v = k[:, :, :Lq], v[:, :, :Lq]  # (B, H, Lq, D): Lk = Lq
        poisoned = poisoned[..., :Lq]
    else:
        raise ValueError(where)
    return q, k, v, kwargs, poisoned


def _hidden_values(where: str, value: float, seed, subject) -> Outcome:
    rng = np.random.default_rng(seed)
    q, k, v, kwargs, poisoned = _hidden_problem(where, rng)
    exact, tol = expected(q, k, v, kwargs)
    visible = kernels.prepare(q, k, v, **kwargs).visible()  # (B, H, Lq, Lk)
    if np.asarray(kwargs.get("mask", True)).dtype != np.bool_:
        visible &= np.isfinite(kwargs["mask"])
    sees_poison = (visible & poisoned[:, :, None, :]).any(-1)  # (B, H, Lq)
    rows = visible.any(-1) & ~sees_poison  # rows that see keys, none of them poisoned
    k_bad, v_bad = k.copy(), v.copy()
    k_bad[poisoned] = value
    v_bad[poisoned] = value
    out = np.asarray(subject.adapter.forward(q, k_bad, v_bad, kwargs))
    if out.shape != exact.shape:
        return Outcome("fail", f"output shape {out.shape}, expected {exact.shape}")
    error = max_abs_error(out[rows], exact[rows])
    if error <= tol:
        return Outcome("pass", max_error=error, tolerance=tol)
    leaked = int((~np.isfinite(out[rows])).any(-1).sum())
    name = "NaN" if np.isnan(value) else "inf"
    detail = (f"{name} stored in k and v behind the {where.replace('-', ' ')} reached "
              f"{leaked} of {int(rows.sum())} output rows that cannot see it: hidden values "
              "are read (e.g. weights 0 times a NaN value, or a mask added after the "
              "product)") if leaked else \
        f"visible outputs changed when hidden keys and values were set to {name}"
    return Outcome("fail", detail, max_error=error, tolerance=tol)


# --- future tokens ----------------------------------------------------------------------


def _future_tokens(causal, seed, subject) -> Outcome:
    rng = np.random.default_rng(seed)
    B, H, D = 1, 2, 8
    Lq, Lk = (12, 12) if causal is True else (6, 12)
    offset = kernels.causal_offset(causal, Lq, Lk)
    q = rng.standard_normal((B, H, Lq, D)).astype(np.float32)
    k = rng.standard_normal((B, H, Lk, D)).astype(np.float32)
    v = rng.standard_normal((B, H, Lk, D)).astype(np.float32)
    t = Lk - 3  # keys t.. change; queries i with i + offset < t cannot see them
    rows = np.arange(Lq) + offset < t
    q2, k2, v2 = q.copy(), k.copy(), v.copy()
    k2[:, :, t:] = rng.standard_normal(k2[:, :, t:].shape) * 3
    v2[:, :, t:] = rng.standard_normal(v2[:, :, t:].shape) * 3
    q2[:, :, ~rows] = rng.standard_normal(q2[:, :, ~rows].shape)
    kwargs = {"causal": causal}
    exact, tol = expected(q, k, v, kwargs)
    before = np.asarray(subject.adapter.forward(q, k, v, kwargs))
    after = np.asarray(subject.adapter.forward(q2, k2, v2, kwargs))
    if before.shape != exact.shape or after.shape != exact.shape:
        return Outcome("fail", f"output shape {after.shape}, expected {exact.shape}")
    change = max_abs_error(after[:, :, rows], before[:, :, rows].astype(np.float64))
    if change <= tol:
        return Outcome("pass", max_error=change, tolerance=tol)
    return Outcome("fail", f"outputs of queries 0-{int(rows.sum()) - 1} changed by "
                           f"{change:.3g} when keys and values from position {t} on (future "
                           f"to them, causal={causal!r}) changed: it sees future tokens",
                   max_error=change, tolerance=tol)


# --- large logits, shape and dtype, gradients -------------------------------------------


def _large_logits(spec, dtype, seed, subject) -> Outcome:
    q, k, v, kwargs = inputs(spec, dtype, seed)
    q, k = q * 12, k * 12  # logits ~ 144 * N(0, D) / sqrt(D): hundreds
    outcome = judge(subject.adapter.forward(q, k, v, kwargs), q, k, v, kwargs,
                    diagnose_failure=False)
    if outcome.status == "fail" and "NaN or inf" in outcome.detail:
        outcome.detail += " (logits in the hundreds overflow exp: is the row max subtracted?)"
    return outcome


def _shape_dtype(spec, dtype, seed, subject) -> Outcome:
    q, k, v, kwargs = inputs(spec, dtype, seed)
    out = np.asarray(subject.adapter.forward(q, k, v, kwargs))
    B, H, _, Lq, _, _, Dv = spec.sizes
    problems = []
    if out.shape != (B, H, Lq, Dv):
        problems.append(f"output shape {out.shape}, expected (B, H, Lq, Dv) = "
                        f"{(B, H, Lq, Dv)}")
    if out.dtype != np.dtype(dtype):
        problems.append(f"{dtype} inputs gave a {out.dtype} output")
    return Outcome("fail", "; ".join(problems)) if problems else \
        Outcome("pass", observed=f"{out.shape} {out.dtype}")


def _gradients(spec, dtype, seed, subject) -> Outcome:
    q, k, v, kwargs = inputs(spec, dtype, seed)
    dout = np.random.default_rng(case_seed(seed, "dout")).standard_normal(
        (*q.shape[:-1], v.shape[-1])).astype(dtype)  # (B, H, Lq, Dv)
    grads = subject.adapter.backward(q, k, v, dout, kwargs)
    problem = kernels.prepare(q, k, v, **kwargs)
    exact, plain = gradient_oracle(problem, dout)
    for name, g, e in zip(("dq", "dk", "dv"), grads, exact, strict=True):
        if np.asarray(g).shape != e.shape:
            return Outcome("fail", f"{name} has shape {np.asarray(g).shape}, expected {e.shape}")
    # the fused algorithm (P rebuilt from a stored log-sum-exp) is as correct as the plain
    # one: its rounding terms, with the oracle's log-sum-exp in the input dtype
    _, lse = kernels.attention(*(x.astype(np.float64) for x in (q, k, v)),
                               backend="reference", return_lse=True, **kwargs)
    result = gradient_errors(grads, exact, plain, problem.dtype,
                             extra=fused_terms(problem, dout, exact, lse.astype(q.dtype)))
    outcome = Outcome("pass" if result["within_tolerance"] else "fail",
                      max_error=result["max_abs_err"], tolerance=result["tolerance"])
    if outcome.status == "fail":
        outcome.detail = (f"{result['worst']} max error {result['max_abs_err']:.3g} > "
                          f"tolerance {result['tolerance']:.3g}")
    return outcome


_LARGE = (("none", ProblemSpec(H=2, Lq=9, D=16), "float32"),
          ("causal", ProblemSpec(H=2, Lq=9, D=16, causal=True), "float32"),
          ("key-lengths", ProblemSpec(B=2, H=2, Lq=9, D=16, key_lengths="random"), "float32"),
          ("none-float64", ProblemSpec(H=2, Lq=9, D=16), "float64"))
_SHAPES = (("plain-float32", ProblemSpec(B=2, H=3, Lq=5, D=8), "float32"),
           ("plain-float64", ProblemSpec(B=2, H=3, Lq=5, D=8), "float64"),
           ("gqa-cross-dv", ProblemSpec(B=2, H=4, Hkv=2, Lq=5, Lk=7, D=8, Dv=6), "float32"))
_HIDDEN = {"key-lengths": {"key-lengths"}, "bool-mask": {"bool-mask"},
           "float-mask": {"float-mask"}, "causal": {"causal"}}


def checks(seed: int = 0) -> list[Check]:
    """Every correctness check, in report order, its values from the run's ``seed``."""
    found = []
    for dtype in ("float32", "float64"):
        for case in CASES + drawn_cases(seed):
            found.append(Check(f"agreement-{dtype}", "correctness", case.name,
                               functools.partial(_agreement, case.spec, dtype,
                                                 case_seed(seed, "agreement", case.name,
                                                           dtype)),
                               features(case.spec, dtype)))
    for where, needs in _HIDDEN.items():
        for value in (np.nan, np.inf):
            name = "nan" if np.isnan(value) else "inf"
            found.append(Check("hidden-values", "correctness", f"{where}-{name}",
                               functools.partial(_hidden_values, where, value,
                                                 case_seed(seed, "hidden", where, name)),
                               frozenset(needs)))
    for causal, needs in ((True, {"causal"}), ("bottom-right", {"bottom-right", "cross"})):
        name = "causal" if causal is True else causal
        found.append(Check("future-tokens", "correctness", name,
                           functools.partial(_future_tokens, causal,
                                             case_seed(seed, "future", name)),
                           frozenset(needs)))
    for property_name, run, table in (("large-logits", _large_logits, _LARGE),
                                      ("shape-dtype", _shape_dtype, _SHAPES)):
        for name, spec, dtype in table:
            found.append(Check(property_name, "correctness", name,
                               functools.partial(run, spec, dtype,
                                                 case_seed(seed, property_name, name)),
                               features(spec, dtype)))
    for case, dtype in [(c, "float32") for c in GRADIENT_CASES] + [(GRADIENT_CASES[0],
                                                                    "float64")]:
        found.append(Check("gradients", "correctness", f"{case.name}-{dtype}",
                           functools.partial(_gradients, case.spec, dtype,
                                             case_seed(seed, "gradients", case.name, dtype)),
                           features(case.spec, dtype) | {"backward"}))
    return found
