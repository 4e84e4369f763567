"""The properties a kernel that cheats fails: what evaluation harnesses have been fooled by.

Each is a correctness property whose failure names what happened:

- ``inputs-untouched``: every array the call receives (q, k, v, a mask, key lengths) is
  bit-identical afterwards.  A kernel that zeroes its inputs can make a harness that
  computes its reference afterwards, on the same buffers, expect the zeros it returns
  (KernelBench's adversarial kernels).
- ``fresh-output``: the output is a new buffer: it shares no memory with an input, and a
  second call neither returns the first call's buffer nor writes into it (outputs picked
  up from a buffer the harness freed, or one kept between calls; the adapter keeps the
  earlier outputs alive where the call runs, so that reuse can be seen there).
- ``no-cache``: new values give their own correct output: in new arrays of the same
  shapes, and in arrays that differ from the last call's only where a light fingerprint
  does not look (one element of k and of v changed, each with another that keeps its sum:
  the same shapes, sums, first and last elements).  A result cached by identity, shape or
  fingerprint fails (an agent-written kernel in FlashInfer-Bench's contest sped up by an
  output cache keyed on a light fingerprint of its input).
- ``no-cache`` also writes new values in place into the arrays of the call before and
  calls again with the same objects (a cache keyed on the arrays' identity or address).
- ``after-many-calls``: correct on new values after a number of calls drawn in
  :data:`MANY` (a kernel that is correct for its first calls, then drifts: gpu-mode's
  exploits; llm.c PR 852).  The full battery checks this again after its speed section
  (``after-timing``), and at the sizes it timed.

The values are the battery's (:func:`~attnbench.conformance.cases.inputs`), new each run:
a non-zero mean and rows whose answer lies far from the mean of V, so that a constant, a
mean or a no-op cannot pass.
"""

from __future__ import annotations

import functools

import numpy as np

from attnbench.conformance.cases import case_seed, features, inputs
from attnbench.conformance.judge import judge
from attnbench.conformance.outcome import Check, Outcome
from attnbench.measure.problems import ProblemSpec

__all__ = ["MANY", "after_timing_checks", "checks"]

#: The fewest and the most calls before the ``after-many-calls`` check; each run draws
#: its count between them (log-uniform, from the run's seed), so no count is safe to wait.
MANY = (256, 2048)

#: The problems: plain, and each way of hiding keys (the arrays a call receives differ).
_PROBLEMS = (("plain", ProblemSpec(B=2, H=2, Lq=9, Lk=11, D=8)),
             ("causal", ProblemSpec(B=2, H=2, Lq=9, D=8, causal=True)),
             ("bool-mask", ProblemSpec(B=2, H=2, Lq=9, Lk=11, D=8, mask="bool-shared")),
             ("float-mask", ProblemSpec(H=2, Lq=9, Lk=11, D=8, mask="float")),
             ("key-lengths", ProblemSpec(B=3, H=2, Lq=9, Lk=12, D=8, key_lengths="random")))


def _values(spec, seed, *labels):
    """``q, k, v, kwargs`` of ``spec`` in float32, from the run's seed and ``labels``."""
    return inputs(spec, "float32", case_seed(seed, "integrity", *labels))


def _named(names) -> str:
    return ", ".join(names)


def _inputs_untouched(spec, seed, subject) -> Outcome:
    q, k, v, kwargs = _values(spec, seed, "untouched")
    watched = subject.adapter.forward_watched(q, k, v, kwargs)
    if watched.changed:
        return Outcome("fail", f"the call wrote into its input(s) {_named(watched.changed)}: "
                               "an implementation must not change its arguments")
    return judge(watched.output, q, k, v, kwargs)


def _fresh_output(spec, seed, subject) -> Outcome:
    q, k, v, kwargs = _values(spec, seed, "fresh")
    first = subject.adapter.forward_watched(q, k, v, kwargs)
    if first.aliased:
        return Outcome("fail", f"the output shares memory with the input(s) "
                               f"{_named(first.aliased)}: it must be a new array")
    second = subject.adapter.forward_watched(q, k, v, kwargs)
    if second.reused:
        return Outcome("fail", "the second call returned the first call's output buffer: "
                               "an output buffer is reused across calls")
    if second.earlier_changed:
        return Outcome("fail", "the second call wrote into the first call's output")
    return judge(second.output, q, k, v, kwargs)


def _sums(array) -> tuple:
    return float(array.sum()), float(array.sum(dtype=np.float64))


def _fingerprint_twin(k, v, rng, tries: int = 200):
    """``k, v`` changed in one element each, another element of each moved by as much the
    other way: shapes, first and last elements as before, and sums as NumPy adds them in
    the dtype and in float64 (pairs are drawn until the rounded sums agree too)."""
    k, v = k.copy(), v.copy()
    for array in (k, v):
        flat = array.reshape(-1)
        before = _sums(flat)
        for _ in range(tries):
            i, j = rng.choice(np.arange(1, flat.size - 1), size=2, replace=False)
            old_i, old_j = flat[i], flat[j]
            delta = flat.dtype.type(2.0 + abs(old_i))
            flat[i] += delta
            flat[j] -= delta
            if _sums(flat) == before:
                break
            flat[i], flat[j] = old_i, old_j
        else:
            flat[i] += delta  # no pair keeps the rounded sums: change one element anyway
            flat[j] -= delta
    return k, v


def _judged(output, q, k, v, kwargs, failure) -> Outcome:
    """``output`` judged as the problem's; a failure's detail is ``failure`` with the
    judge's detail in place of ``{}``."""
    outcome = judge(output, q, k, v, kwargs, diagnose_failure=False)
    if outcome.status == "fail":
        outcome.detail = failure.format(outcome.detail)
    return outcome


def _no_cache(spec, seed, subject) -> Outcome:
    q, k, v, kwargs = _values(spec, seed, "cache", 1)
    subject.adapter.forward(q, k, v, kwargs)
    q2, k2, v2, _ = _values(spec, seed, "cache", 2)
    outcome = _judged(subject.adapter.forward(q2, k2, v2, kwargs), q2, k2, v2, kwargs,
                      "new values in new arrays of the same shapes gave a wrong output "
                      "({}): a result cached between calls?")
    if outcome.status != "pass":
        return outcome
    k3, v3 = _fingerprint_twin(k2, v2, np.random.default_rng(case_seed(seed, "twin")))
    outcome = _judged(subject.adapter.forward(q2, k3, v3, kwargs), q2, k3, v3, kwargs,
                      "values that differ from the last call's only in a few elements of k "
                      "and v (the same shapes, sums, first and last elements) gave a wrong "
                      "output ({}): a result cached between calls?")
    if outcome.status != "pass":
        return outcome
    q4, k4, v4, _ = _values(spec, seed, "cache", 4)
    _, again = subject.adapter.forward_in_place(q2, k2, v2, kwargs, q4, k4, v4)
    return _judged(again, q4, k4, v4, kwargs, "new values written in place into the arrays "
                   "of the call before gave a wrong output ({}): a result cached by the "
                   "arrays' identity or address?")


def _after_calls(spec, calls, what, seed, subject) -> Outcome:
    q, k, v, kwargs = _values(spec, seed, what, 1)
    for _ in range(calls):
        subject.adapter.forward(q, k, v, kwargs)
    q2, k2, v2, _ = _values(spec, seed, what, 2)
    return _judged(subject.adapter.forward(q2, k2, v2, kwargs), q2, k2, v2, kwargs,
                   f"wrong on new values {what} ({{}})")


def many_calls(seed: int) -> int:
    """The run's count of calls before ``after-many-calls`` (in :data:`MANY`)."""
    rng = np.random.default_rng(case_seed(seed, "many"))
    return int(np.exp(rng.uniform(np.log(MANY[0]), np.log(MANY[1]))))


def _at_speed_size(seed, subject) -> Outcome:
    """New values at the speed section's sizes, after it: what was timed is judged too."""
    from attnbench.conformance.speed import JUDGED_LENGTH, problem_at

    q, k, v, kwargs = problem_at(JUDGED_LENGTH, case_seed(seed, "speed-size"))
    return _judged(subject.adapter.forward(q, k, v, kwargs), q, k, v, kwargs,
                   f"wrong at the speed section's sizes (L = {JUDGED_LENGTH}) after it ({{}})")


def checks(seed: int = 0) -> list[Check]:
    """Every integrity check, in report order (before the speed section), its values from
    the run's ``seed``."""
    found = []
    for name, spec in _PROBLEMS:
        needs = features(spec, "float32")
        found.append(Check("inputs-untouched", "correctness", name,
                           functools.partial(_inputs_untouched, spec, seed), needs))
    for name, spec in _PROBLEMS[:3]:
        found.append(Check("fresh-output", "correctness", name,
                           functools.partial(_fresh_output, spec, seed),
                           features(spec, "float32")))
        found.append(Check("no-cache", "correctness", name,
                           functools.partial(_no_cache, spec, seed),
                           features(spec, "float32")))
    plain, many = _PROBLEMS[0][1], many_calls(seed)
    found.append(Check("after-many-calls", "correctness", f"{many}-calls",
                       functools.partial(_after_calls, plain, many,
                                         f"after {many} calls on the same problem", seed),
                       features(plain, "float32")))
    return found


def after_timing_checks(seed: int = 0) -> list[Check]:
    """The checks that follow the speed section: correct on new values after being timed,
    on a small problem and at the sizes it was timed at."""
    plain = _PROBLEMS[0][1]
    return [Check("after-timing", "correctness", "after-speed",
                  functools.partial(_after_calls, plain, 1, "after the speed section", seed),
                  features(plain, "float32")),
            Check("after-timing", "correctness", "speed-size",
                  functools.partial(_at_speed_size, seed), features(plain, "float32"))]
