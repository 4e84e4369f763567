"""Scaling verdicts: a fitted exponent and its 95% interval held against a claimed one.

The one place a scaling verdict is decided.  Verdicts (:func:`verdict`,
:func:`verdict_parts`) are decided from the whole 95% interval on p (:func:`interval`),
so that a run on the same machine gives the same verdict as the last one.  An exponent
within ``TOLERANCE`` of the expected one is "that power" (the expected exponents:
:mod:`attnbench.studies.scaling_claims`).  *Confirmed*: the whole interval lies within
``expected ± TOLERANCE`` (for an upper bound: below ``expected + TOLERANCE``); *not
confirmed*: the whole interval lies outside; *inconclusive*: the interval straddles a
boundary (the text says which), or the fitted overhead c (and the lower-order term) is
more than ``OVERHEAD_DOMINATES`` of the largest point's time (the range says little about
the leading term's growth), or a time fit uses a point that was *starved* (timed while the
process's threads waited for cores other processes held; such a point's time is inflated
by scheduler slices however tight its interval).

:func:`attnbench.studies.scaling.fit_row` stores each fit's outcome, its line
(``verdict``, what the console prints) and the conclusion with its reason
(``conclusion``) in the scaling table, and the report shows them as stored;
:func:`exponent_text` writes an exponent and its interval for both (:func:`row_exponent`
for a stored row), :func:`big_o` a claimed complexity.
"""

from __future__ import annotations

import numpy as np

from attnbench.studies.fits import PowerFit

__all__ = ["CLASS_NAMES", "L_NAMES", "MIN_POINTS", "OVERHEAD_DOMINATES", "TOLERANCE", "big_o",
           "exponent_text", "interval", "lower_order_dominates", "row_exponent", "verdict",
           "verdict_parts"]

#: An exponent within TOLERANCE of the expected one counts as that power: halfway to
#: L^2.5, and more than the bend caches give a quadratic kernel over 16x in L.
TOLERANCE = 0.25
#: A fit whose fixed overhead is more than this share of its largest point's time says
#: little about the growth: inconclusive, whatever the interval.
OVERHEAD_DOMINATES = 0.5
#: Fewest distinct x values a fit needs.
MIN_POINTS = 3
#: Complexity classes of fits.CLASSES, written for a variable.
CLASS_NAMES = {"n": "O({v})", "n log n": "O({v} log {v})", "n^2": "O({v}²)", "n^3": "O({v}³)"}
#: How a verdict names L for each kind of point (:data:`attnbench.sweep.grid.KINDS`): a
#: decode point's L is its cache length, Lk.
L_NAMES = {"decode": "Lk"}


_SUPERSCRIPTS = str.maketrans("0123456789-.", "⁰¹²³⁴⁵⁶⁷⁸⁹⁻·")


def big_o(variable: str, exponent: float) -> str:
    """``O(L²)``, ``O(L)``, ``O(1)``; ``O(L·W)``, ``O((L·W)²)`` for a product."""
    exponent = round(exponent, 2)
    if exponent == 0:
        return "O(1)"
    if exponent == 1:
        return f"O({variable})"
    text = f"{exponent:g}".translate(_SUPERSCRIPTS)
    base = f"({variable})" if "·" in variable else variable
    return f"O({base}{text})"


def _class_name(best_class: str, variable: str) -> str:
    """A class of :data:`CLASS_NAMES` written for ``variable`` (a product in parentheses)."""
    if "·" in variable and best_class != "n":
        return CLASS_NAMES[best_class].format(v=f"({variable})")
    return CLASS_NAMES[best_class].format(v=variable)


def interval(fit: PowerFit) -> tuple[float, float]:
    """The slope's 95% interval: ``(ci_low, ci_high)``, or ``slope ± ci95``."""
    if np.isfinite(fit.ci_low) and np.isfinite(fit.ci_high):
        return fit.ci_low, fit.ci_high
    return fit.slope - fit.ci95, fit.slope + fit.ci95


def exponent_text(variable: str, slope: float, low: float, high: float) -> str:
    """An exponent and its 95% interval as the console and the report write them:
    ``L^2.00 [1.99, 2.02]``, ``(L·W)^0.93 [0.90, 0.96]`` (a product in parentheses);
    ``L^2.00`` where the interval has no finite ends."""
    base = f"({variable})" if "·" in variable else variable
    text = f"{base}^{slope:.2f}"
    if np.isfinite(low) and np.isfinite(high):
        text += f" [{low:.2f}, {high:.2f}]"
    return text


def row_exponent(row) -> str:
    """:func:`exponent_text` of a row of :func:`scaling_table` ("no fit" without a slope)."""
    slope = row.get("slope")
    if slope is None or not np.isfinite(slope):
        return "no fit"
    low, high = row.get("ci_low", np.nan), row.get("ci_high", np.nan)
    if not (np.isfinite(low) and np.isfinite(high)) and np.isfinite(row.get("ci95", np.nan)):
        low, high = slope - row["ci95"], slope + row["ci95"]  # a table without the ends
    variable = str(row.get("variable", "x"))
    if variable == "L":  # a decode point's L is its cache length
        variable = L_NAMES.get(str(row.get("kind", "dense")), variable)
    return exponent_text(variable, slope, low, high)


def verdict(fit: PowerFit | None, quantity: str, variable: str,
            expected: float | None, *, at_most: bool = False,
            starved: int = 0, threads: int | None = None) -> tuple[str, str]:
    """``(outcome, text)``: outcome is confirmed, not confirmed, inconclusive, measured.

    The text reads like ``"time ∝ L^1.98 [1.95, 2.01] → O(L²) confirmed (best class
    O(L²), 99% of resamples)"``.  ``expected`` None (no exponent is claimed) gives outcome
    "measured" and the nearest integer power.  ``at_most=True`` checks an upper bound
    ("at most O(L)").  ``starved``: how many of the fitted points were timed while the
    process's threads waited for cores other processes held
    (:attr:`attnbench.measure.samples.Timing.starved`); any makes a claimed exponent
    inconclusive: such a point's time is inflated by a scheduler slice however tight its
    interval.  See the module docstring for the rule; :func:`verdict_parts` gives the
    text in its two parts (the fitted law, the conclusion with its reason).
    """
    outcome, _, _, text = verdict_parts(fit, quantity, variable, expected, at_most=at_most,
                                        starved=starved, threads=threads)
    return outcome, text


def verdict_parts(fit: PowerFit | None, quantity: str, variable: str,
                  expected: float | None, *, at_most: bool = False,
                  starved: int = 0, threads: int | None = None) -> tuple[str, str, str, str]:
    """``(outcome, law, conclusion, text)`` of :func:`verdict` (same arguments).

    ``law`` is the fitted law with its interval (``"time ∝ L^1.98 [1.95, 2.01] (L
    128–2048)"``; ``"time vs L"`` without a fit), ``conclusion`` the rest: the claim, its
    outcome and the reason (``"O(L²) inconclusive: 2 of 5 points were timed while ..."``),
    and ``text`` the whole line the console prints (the law, then the conclusion).  The
    one place a scaling verdict is decided: :func:`fit_row` stores all of it in the
    scaling table, and the report shows it as stored.
    """
    if fit is None or fit.n < MIN_POINTS:
        n = 0 if fit is None else fit.n
        law, conclusion = (f"{quantity} vs {variable}",
                           f"{n} usable point(s), a fit needs {MIN_POINTS}")
        return "inconclusive", law, conclusion, f"{law}: {conclusion}"
    low, high = interval(fit)
    head = (f"{quantity} ∝ {exponent_text(variable, fit.slope, low, high)} "
            f"({variable} {fit.x_min:g}–{fit.x_max:g})")
    tail = ""
    if fit.best_class:
        tail = (f" (best class {_class_name(fit.best_class, variable)}, "
                f"{fit.class_share:.0%} of resamples)")
    closest = f"closest power: {big_o(variable, round(fit.slope))}"
    if expected is None:
        conclusion = f"({closest}){tail}"
        return "measured", head, conclusion, f"{head} {conclusion}"
    outcome, conclusion = _conclusion(fit, variable, expected, low, high, closest,
                                      at_most=at_most, starved=starved, threads=threads)
    return outcome, head, conclusion + tail, f"{head} → {conclusion}{tail}"


def _conclusion(fit: PowerFit, variable: str, expected: float, low: float, high: float,
                closest: str, *, at_most: bool, starved: int,
                threads: int | None) -> tuple[str, str]:
    """``(outcome, the claim's conclusion and its reason)`` for :func:`verdict_parts`."""
    claim = big_o(variable, expected)
    lower, upper = expected - TOLERANCE, expected + TOLERANCE
    if not (np.isfinite(low) and np.isfinite(high)):
        return "inconclusive", f"{claim} inconclusive: no interval"
    if starved:
        remedy = "" if threads == 1 else " or on fewer threads (--threads)"
        return "inconclusive", (f"{claim} inconclusive: {starved} of {fit.n} "
                                "points were timed while the threads waited for cores other "
                                f"processes held (a busy machine); rerun when it is quiet"
                                f"{remedy}")
    share = fit.dominance()
    if lower_order_dominates(share):
        rest = "the fixed overhead is" if not fit.lower_term else \
            "the overhead and lower-order term are"
        return "inconclusive", (f"{claim} inconclusive: {rest} "
                                f"{1 - share:.0%} of the largest point's time; larger "
                                f"{variable} are needed")
    if at_most:
        if high <= upper:
            return "confirmed", f"at most {claim} confirmed"
        if low > upper:
            nearest = f" ({closest})" if round(fit.slope) != expected else ""
            return "not confirmed", (f"at most {claim} not confirmed: grows faster, "
                                     f"the whole interval lies above {upper:g}{nearest}")
        return "inconclusive", f"at most {claim} inconclusive: the interval straddles {upper:g}"
    if lower <= low and high <= upper:
        return "confirmed", f"{claim} confirmed"
    if high < lower or low > upper:
        side = "below" if fit.slope < expected else "above"
        nearest = f" ({closest})" if round(fit.slope) != expected else ""
        return "not confirmed", (f"{claim} not confirmed: the whole interval lies "
                                 f"{side} {expected:g} ± {TOLERANCE:g}{nearest}")
    edge = lower if low < lower else upper
    return "inconclusive", f"{claim} inconclusive: the interval straddles {edge:g}"


def lower_order_dominates(leading_share: float) -> bool:
    """True when a fit's leading term is less than ``1 - OVERHEAD_DOMINATES`` of its
    largest point's time (or unknown): the range says little about its growth."""
    return not leading_share >= 1 - OVERHEAD_DOMINATES
