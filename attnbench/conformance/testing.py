"""The battery in a user's own test suite: one pytest test per (property, case).

A test file in the user's repository::

    import pytest
    from attnbench.conformance import check, pytest_cases
    from mypackage import my_attention

    @pytest.mark.parametrize("case", pytest_cases(my_attention, convention="sdpa"))
    def test_attention_conforms(case):
        check(case)

Each failure names the case, the error and the tolerance (and the usual mistake the
output matches, when one does); a case needing a feature the implementation refuses is
skipped.  Checks run in the test process (no subprocess: pytest isolates nothing, but a
user's suite is where a crash should show).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from attnbench.conformance.battery import all_checks, run_check
from attnbench.conformance.capabilities import Subject
from attnbench.conformance.outcome import Check
from attnbench.measure.adapters import make_adapter
from attnbench.measure.specs import Implementation, resolve

__all__ = ["ConformanceCase", "check", "pytest_cases", "subject"]


def subject(implementation, *, convention: str | None = None, backward=None) -> Subject:
    """A probed :class:`~attnbench.conformance.capabilities.Subject`.

    Parameters
    ----------
    implementation : callable, Implementation or str
        The attention function itself, an :class:`Implementation`, or a spec
        (``"numba"``, ``"module:function"``).
    convention : {"kernels", "sdpa", "jax"}, optional
        Default: the implementation's own, else ``"kernels"``.
    backward : callable or str, optional
        The backward of a ``kernels``-convention function
        (:func:`kernels.attention_backward`'s signature).
    """
    if isinstance(implementation, str):
        found = resolve(implementation, convention,
                        backward if isinstance(backward, str) else None)
        if callable(backward):
            found = Implementation(found.function, found.convention, backward, found.name,
                                   found.spec)
    elif isinstance(implementation, Implementation):
        found = Implementation(implementation.function,
                               convention or implementation.convention,
                               backward or implementation.backward,
                               implementation.name or _name(implementation.function))
    else:
        found = Implementation(implementation, convention or "kernels", backward,
                               _name(implementation))
    return Subject(found, make_adapter(found))


def _name(function) -> str:
    return getattr(function, "__qualname__", None) or repr(function)


@dataclass(frozen=True)
class ConformanceCase:
    """One (property, case) of the battery bound to a lazily probed subject."""

    check: Check
    subject: object  # a function of no arguments returning the Subject (cached)

    def __str__(self) -> str:
        return self.check.id


def pytest_cases(implementation, *, convention: str | None = None, backward=None,
                 kinds=("correctness",), seed: int = 0) -> list:
    """One ``pytest.param`` per (property, case) of the battery, id ``property[case]``.

    Parameters
    ----------
    implementation, convention, backward
        As :func:`subject`.  The implementation is probed once, when the first test runs.
    kinds : tuple of str, default ("correctness",)
        The kinds of property to test; add ``"determinism"`` to require bit-identical
        results.  (Conventions are observations and speed needs no test.)
    seed : int, default 0
        The seed of the drawn problems and the values: fixed, so a test suite sees the
        same cases every run (``attnbench conform`` draws a new one each run).

    Returns
    -------
    list of pytest.param
        Pass each to :func:`check`.
    """
    import pytest

    bound = functools.cache(functools.partial(subject, implementation,
                                              convention=convention, backward=backward))
    return [pytest.param(ConformanceCase(c, bound), id=c.id)
            for c in all_checks(quick=True, seed=seed) if c.kind in kinds]


def check(case: ConformanceCase) -> None:
    """Run one case: return if it passes, skip if unsupported, else fail with the reason.

    Parameters
    ----------
    case : ConformanceCase
        One of :func:`pytest_cases`'s parameters.

    Returns
    -------
    None
        Returns normally when the case passes; ``pytest.skip`` when it needs a feature the
        implementation refuses; ``pytest.fail`` naming the case, the error and the
        tolerance otherwise.
    """
    import pytest

    outcome = run_check(case.check, case.subject())
    if outcome.status == "pass":
        return
    if outcome.status == "unsupported":
        pytest.skip(f"{case.check.id}: {outcome.detail}")
    message = f"{case.check.id}: {outcome.detail}"
    if outcome.max_error is not None and outcome.tolerance is not None \
            and "tolerance" not in outcome.detail:
        message += f" (max error {outcome.max_error:.3g}, tolerance {outcome.tolerance:.3g})"
    pytest.fail(message if outcome.status == "fail" else f"{message} [error]", pytrace=False)
