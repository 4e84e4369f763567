"""Verdict words, the rules for comparing stated numbers, and the timing helpers.

Shared by the claims ledger (:mod:`attnbench.claims.ledger`) and its check modules
(:mod:`attnbench.claims.softmax`, :mod:`attnbench.claims.attention`,
:mod:`attnbench.claims.cost`).  How a stated number is compared:

- A number quoted to some precision ("4.7", "28.3M", "[0.73, 0.05, 0.22]") matches a
  measured value when the measured value rounds to it: :func:`rounds_to` (within half a
  unit of the last quoted digit).
- "about X" for a ratio or a share matches within ±:data:`ABOUT_RELATIVE` (15 %):
  :func:`about`.
- Timing ratios come from calls interleaved in the same run (:func:`interleaved_medians`,
  a thin call into :func:`attnbench.measure.timing.interleaved`), with a 95% bootstrap
  interval (:func:`ratio`), widened by the run-to-run variation :data:`RUN_TO_RUN` before a
  verdict (:func:`widen`); claims about cost use single-threaded CPU time, which other
  processes on a shared machine do not distort.
- A measured number is judged by its whole interval (:func:`side`): a verdict holds or
  does not hold only when the whole interval is on one side of the boundary; an interval
  that straddles it gives :data:`INCONCLUSIVE`, and says so.  So the same machine gives the
  same verdict run after run, instead of one that flips with the noise.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass, field

import numba
import numpy as np
from threadpoolctl import threadpool_limits

from attnbench.measure.intervals import paired_ratio_interval
from attnbench.measure.problems import SETTLE_SECONDS
from attnbench.measure.timing import default_probe, interleaved, ratio_interval
from attnbench.studies.fits import fit_power_law

__all__ = [
    "ABOUT_RELATIVE", "CAVEAT", "ERROR", "FAILS", "HOLDS", "INCONCLUSIVE", "VERDICTS",
    "RUN_TO_RUN", "Result", "about", "interleaved_medians", "loglog_slope",
    "ratio", "rounds_to", "side", "widen",
]

HOLDS = "holds"
CAVEAT = "holds-with-caveat"
FAILS = "does-not-hold"
#: The measured interval straddles the claim's boundary: this run cannot decide.
INCONCLUSIVE = "inconclusive"
ERROR = "error"
#: Every verdict word, in the order the summary lists them.
VERDICTS = (HOLDS, CAVEAT, FAILS, INCONCLUSIVE, ERROR)

#: "about X" matches a measured value within this relative distance.
ABOUT_RELATIVE = 0.15


def rounds_to(measured: float, stated: float, unit: float) -> bool:
    """True if ``measured`` rounds to ``stated`` quoted to ``unit`` (e.g. 4.67 -> 4.7, unit 0.1)."""
    return abs(measured - stated) <= unit / 2 * (1 + 1e-9)


def about(measured: float, stated: float, rel: float = ABOUT_RELATIVE) -> bool:
    """True if ``measured`` is within ``rel`` (relative) of ``stated``: "about X"."""
    return abs(measured - stated) <= rel * abs(stated)


#: Relative run-to-run variation of a timing ratio on one machine, which the samples of
#: one run cannot show (asv too leaves it to a factor): a ratio's interval is widened by
#: it before a verdict, so that a verdict does not flip between runs because one run's
#: interval sat a little off another's (other load, clock frequency, cache and page
#: placement from one process to the next).  Three `attnbench verify` runs on a loaded
#: 2-core machine gave C29's ratio 6.05 [5.90, 6.30], 6.07 [5.90, 6.38] and 6.30 [6.04,
#: 6.52]: intervals of about ±3% that moved by 4% from run to run.  Measured again with
#: ``scripts/run_to_run.py --runs 10`` (C29 in 10 fresh processes, load average 10-14 on
#: 2 cores): ratios 5.92-6.22 (spread 5.0%), median half-width ±3.0%, every interval held
#: the median of the ten; widening each interval by 2.4% makes it hold every other run's
#: ratio.  5% is about twice that: a margin, not a fit to one run.
RUN_TO_RUN = 0.05


def widen(low: float, high: float, rel: float = RUN_TO_RUN) -> tuple[float, float]:
    """``(low · (1 − rel), high · (1 + rel))``: a ratio's interval with the run-to-run allowance."""
    return low * (1 - rel), high * (1 + rel)


def side(low: float, high: float, lower: float, upper: float) -> str:
    """Where the interval ``[low, high]`` lies against the range ``[lower, upper]``.

    Returns
    -------
    str
        ``"inside"`` (wholly within), ``"outside"`` (wholly beyond one end) or
        ``"straddles"`` (across an end, or no interval: nan bounds).
    """
    if not (np.isfinite(low) and np.isfinite(high)):
        return "straddles"
    if lower <= low and high <= upper:
        return "inside"
    if high < lower or low > upper:
        return "outside"
    return "straddles"


@dataclass
class Result:
    """What one check found."""

    verdict: str  # one of VERDICTS (ERROR only from verify_claims)
    measured: str  # the measured value(s), short, with numbers
    condition: str = ""  # for holds-with-caveat: when the claim holds (with numbers)
    details: str = ""  # how it was measured; anything else worth knowing
    values: dict = field(default_factory=dict)  # the numbers, for tests and JSON

    def __post_init__(self):
        if self.verdict not in VERDICTS:
            raise ValueError(f"verdict {self.verdict!r}; expected one of {VERDICTS}")
        if self.verdict == CAVEAT and not self.condition:
            raise ValueError("a holds-with-caveat verdict needs its condition")


def interleaved_medians(functions: dict, *, rounds: int = 5, max_time: float = 0.05,
                        cpu: bool = False, budget: float = 1.0) -> dict[str, dict]:
    """Time several functions in alternation, so that load changes hit them all alike.

    A thin call into :func:`attnbench.measure.timing.interleaved`: each function is
    warmed up (compilation excluded) and calibrated to batches of ``max_time / 3``; then
    ``3 · rounds`` alternating rounds, and more within ``budget`` seconds while a median's
    interval is wider than the timing core's target, the process probe read every round.

    Parameters
    ----------
    functions : dict
        name -> callable without arguments.
    rounds, max_time, budget
        See above.
    cpu : bool, default False
        Measure the *cost* instead of the wall-clock time: Numba and the BLAS run on one
        thread (:func:`numba.set_num_threads`, threadpoolctl; restored afterwards) and the
        clock is the process's CPU time (:func:`time.process_time`).  Time the process
        spends descheduled while other processes use the cores does not count, so the
        ratios stay put on a busy, shared machine (wall-clock ratios there swing by 2-3x: a
        parallel launch waits for a thread that another process holds).  The timing starts
        :data:`~attnbench.measure.problems.SETTLE_SECONDS` after the limit: the process's
        CPU time counts every thread, and a BLAS worker left spinning by an earlier
        multi-threaded product (for tens of milliseconds) would otherwise count as the
        call's work.

    Returns
    -------
    dict
        name -> {"median": s, "iqr": s, "samples": n, "ci_low": s, "ci_high": s,
        "noisy": bool, "timing": :class:`~attnbench.measure.timing.Timing`}.
    """
    clock = time.process_time if cpu else time.perf_counter
    previous = numba.get_num_threads()
    with contextlib.ExitStack() as limits:
        if cpu:
            numba.set_num_threads(1)
            limits.callback(numba.set_num_threads, previous)
            limits.enter_context(threadpool_limits(limits=1, user_api="blas"))
            time.sleep(SETTLE_SECONDS)  # spinning workers of earlier calls go idle
        timings = interleaved(functions, rounds=3 * rounds, min_time=max_time / 3,
                              budget=budget, probe=default_probe(), clock=clock)
    return {name: {"median": t.median, "iqr": t.iqr, "samples": t.runs, "ci_low": t.ci95[0],
                   "ci_high": t.ci95[1], "noisy": t.noisy, "timing": t}
            for name, t in timings.items()}


def ratio(times: dict, numerator, denominator) -> tuple[float, float, float]:
    """``(ratio, low, high)`` of two functions of :func:`interleaved_medians`: the median of
    their per-round ratios with its 95% interval
    (:func:`~attnbench.measure.intervals.paired_ratio_interval`), or, where too few rounds
    are common to both, the ratio of their medians (bootstrap 95%)."""
    a, b = times[numerator]["timing"], times[denominator]["timing"]
    paired = paired_ratio_interval(a.samples, a.round_of, b.samples, b.round_of)
    return paired if paired is not None else ratio_interval(a.samples, b.samples)


def loglog_slope(x, y) -> tuple[float, float]:
    """Least-squares slope of log y against log x and the half-width of its 95 % interval
    (:func:`attnbench.studies.fits.fit_power_law`, for exact or deterministic values)."""
    fit = fit_power_law(x, y)
    return fit.slope, fit.ci95
