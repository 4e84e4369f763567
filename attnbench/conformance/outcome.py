"""What a check is and what it returns: :class:`Check`, :class:`Outcome`, and a property's
summary over its cases (:func:`summarize`)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, field

__all__ = ["KINDS", "STATUSES", "Check", "Outcome", "summarize"]

#: Kinds of property.  correctness (and determinism under --deterministic) decide a verdict;
#: convention and speed are observations, never failures.
KINDS = ("correctness", "determinism", "convention", "speed")
#: Statuses of a check and of a property.
STATUSES = ("pass", "fail", "unsupported", "error")


@dataclass
class Outcome:
    """The result of one (property, case) check."""

    status: str  # one of STATUSES
    detail: str = ""  # what was seen, in words (for a failure: the bug it points at)
    max_error: float | None = None  # largest error against the oracle, where one applies
    tolerance: float | None = None  # the tolerance it was held to
    observed: str | None = None  # convention properties: what the implementation does
    case: str = ""  # set by the battery
    seconds: float = 0.0  # time the check took
    data: dict | None = None  # numbers behind the detail (speed: the timed points)

    def as_dict(self) -> dict:
        return {key: value for key, value in asdict(self).items() if value is not None}


@dataclass(frozen=True)
class Check:
    """One (property, case): ``run(subject)`` returns an :class:`Outcome`.

    ``needs`` are the features (:data:`attnbench.conformance.cases.FEATURES`) the case
    asks for; one the implementation refused makes the check ``unsupported`` unrun.
    """

    property: str
    kind: str
    case: str
    run: Callable = field(repr=False)
    needs: frozenset = frozenset()

    @property
    def id(self) -> str:
        return f"{self.property}[{self.case}]"


def _number(x) -> str:
    return "nan" if x is None else f"{x:.3g}"


def _case_line(outcome: Outcome) -> str:
    text = f"{outcome.case}: {outcome.detail}" if outcome.detail else outcome.case
    if outcome.max_error is not None and outcome.tolerance is not None \
            and "tolerance" not in outcome.detail:
        text += f" (max error {_number(outcome.max_error)}, tolerance " \
                f"{_number(outcome.tolerance)})"
    return text


def summarize(name: str, kind: str, outcomes: list[Outcome]) -> dict:
    """One property's entry of the JSON: status, detail, and its cases.

    Status: ``fail`` if a case failed, else ``error`` if one raised, else ``unsupported``
    if none ran, else ``pass``.  The detail names the failing (or erroring) cases with
    their error and tolerance; for a convention, what was observed.
    """
    statuses = [o.status for o in outcomes]
    ran = [o for o in outcomes if o.status != "unsupported"]
    if "fail" in statuses:
        status = "fail"
    elif "error" in statuses:
        status = "error"
    elif not ran:
        status = "unsupported"
    else:
        status = "pass"
    bad = [o for o in outcomes if o.status == status] if status in ("fail", "error") else []
    unsupported = [o for o in outcomes if o.status == "unsupported"]
    if bad:
        word = "fails" if status == "fail" else "raised"
        reasons = {o.detail.split(", which it raised on ")[-1].strip("()") for o in bad}
        if status == "error" and len(reasons) == 1:  # one cause (plain attention raises)
            detail = f"error on {len(bad)} of {len(outcomes)} cases: {reasons.pop()}"
        else:
            detail = f"{word} on {len(bad)} of {len(outcomes)} cases: " + "; ".join(
                _case_line(o) for o in bad[:4]) + ("; ..." if len(bad) > 4 else "")
    elif status == "unsupported":
        detail = outcomes[0].detail if outcomes else "no case"
    elif kind == "convention":
        detail = "; ".join(f"{o.case}: {o.observed or o.detail}" for o in ran)
    elif kind == "speed":
        detail = "; ".join(f"{o.case}: {o.detail}" for o in ran)
    else:
        detail = f"{len(ran)} cases pass"
        worst = max((o for o in ran if o.max_error is not None and o.tolerance),
                    key=lambda o: o.max_error / o.tolerance, default=None)
        if worst is not None:
            detail += (f" (largest error/tolerance {worst.max_error / worst.tolerance:.2f} "
                       f"on {worst.case})")
    if unsupported and status != "unsupported":
        detail += f"; {len(unsupported)} unsupported ({unsupported[0].detail})"
    summary = {"name": name, "kind": kind, "status": status, "detail": detail,
               "cases": [o.as_dict() for o in outcomes]}
    if kind == "speed" and status == "pass":  # the matrix shows the short form
        summary["summary"] = "; ".join(o.observed for o in ran if o.observed)
    return summary
