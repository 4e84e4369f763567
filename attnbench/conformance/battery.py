"""The battery: every check in report order, run on one subject, summed up per property."""

from __future__ import annotations

import time

from attnbench.conformance import conventions, correctness, determinism, integrity, speed
from attnbench.conformance.capabilities import Subject, describe_exception
from attnbench.conformance.outcome import Check, Outcome, summarize

__all__ = ["PROPERTIES", "all_checks", "property_order", "run_check", "run_checks"]


def all_checks(*, quick: bool = False, seed: int = 0) -> list[Check]:
    """Every check: correctness (integrity included), determinism, convention and (unless
    ``quick``) speed, then correctness again after the timing.  The correctness checks'
    problems and values come from ``seed``
    (:func:`~attnbench.conformance.cases.drawn_cases`, :func:`~attnbench.conformance.cases.
    case_seed`); the properties and their order do not depend on it."""
    found = (correctness.checks(seed) + integrity.checks(seed) + determinism.checks()
             + conventions.checks())
    if not quick:
        found += speed.checks() + integrity.after_timing_checks(seed)
    return found


def property_order(checks) -> list[tuple[str, str]]:
    """``(name, kind)`` of each property, in the order its first check comes."""
    order = {}
    for check in checks:
        order.setdefault(check.property, check.kind)
    return list(order.items())


#: ``(name, kind)`` of every property of the full battery.
PROPERTIES = tuple(property_order(all_checks()))


def run_check(check: Check, subject: Subject) -> Outcome:
    """Run one check: ``unsupported`` if it needs a refused feature, ``error`` if it raises."""
    start = time.perf_counter()
    refused = subject.refused(check.needs)
    if refused is not None:
        outcome = Outcome(refused[0], refused[1])
    else:
        try:
            outcome = check.run(subject)
        except Exception as exc:  # the code under test may raise anything (a worker that
            # is gone raises a BaseException, which ends the battery)
            outcome = Outcome("error", f"raised {describe_exception(exc)}")
    outcome.case = check.case
    outcome.seconds = round(time.perf_counter() - start, 4)
    return outcome


def run_checks(subject: Subject, checks, on_property=None) -> list[dict]:
    """Run ``checks`` on ``subject``; one summary per property (see :func:`summarize`).

    ``on_property(summary)`` is called as each property completes (the worker writes the
    results so far, so a hang or crash later keeps them).
    """
    by_property: dict[str, list] = {}
    kinds = dict(property_order(checks))
    for check in checks:
        by_property.setdefault(check.property, []).append(check)
    summaries = []
    for name, group in by_property.items():
        if on_property is not None:
            on_property({"name": name, "kind": kinds[name], "status": "error",
                         "detail": "running", "running": True})
        summary = summarize(name, kinds[name], [run_check(c, subject) for c in group])
        summaries.append(summary)
        if on_property is not None:
            on_property(summary)
    return summaries
