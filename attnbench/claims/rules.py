"""Verdict words, the rules for comparing stated numbers, and the timing helpers.

Shared by the claims ledger (:mod:`attnbench.claims.ledger`) and its check modules
(:mod:`attnbench.claims.softmax`, :mod:`attnbench.claims.attention`,
:mod:`attnbench.claims.cost`).  How a stated number is compared:

- A number quoted to some precision ("4.7", "28.3M", "[0.73, 0.05, 0.22]") matches a
  measured value when the measured value rounds to it: :func:`rounds_to` (within half a
  unit of the last quoted digit).
- "about X" for a ratio or a share matches within ±:data:`ABOUT_RELATIVE` (15 %):
  :func:`about`.
- Timing ratios come from calls interleaved in the same run (:func:`interleaved_medians`);
  claims about cost use single-threaded CPU time, which other processes on a shared
  machine do not distort.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

__all__ = [
    "ABOUT_RELATIVE", "CAVEAT", "ERROR", "FAILS", "HOLDS", "VERDICTS", "Result", "about",
    "interleaved_medians", "load_average", "loglog_slope", "rounds_to",
]

HOLDS = "holds"
CAVEAT = "holds-with-caveat"
FAILS = "does-not-hold"
ERROR = "error"
#: Every verdict word, in the order the summary lists them.
VERDICTS = (HOLDS, CAVEAT, FAILS, ERROR)

#: "about X" matches a measured value within this relative distance.
ABOUT_RELATIVE = 0.15


def rounds_to(measured: float, stated: float, unit: float) -> bool:
    """True if ``measured`` rounds to ``stated`` quoted to ``unit`` (e.g. 4.67 -> 4.7, unit 0.1)."""
    return abs(measured - stated) <= unit / 2 * (1 + 1e-9)


def about(measured: float, stated: float, rel: float = ABOUT_RELATIVE) -> bool:
    """True if ``measured`` is within ``rel`` (relative) of ``stated``: "about X"."""
    return abs(measured - stated) <= rel * abs(stated)


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
                        cpu: bool = False) -> dict[str, dict]:
    """Time several functions in alternation, so that load changes hit them all alike.

    Each function is warmed up (compilation excluded), then ``rounds`` times in turn timed
    with :func:`attnbench.measure.timing.measure` (at least 3 samples, ``max_time`` each).

    Parameters
    ----------
    functions : dict
        name -> callable without arguments.
    rounds, max_time
        See above.
    cpu : bool, default False
        Measure the *cost* instead of the wall-clock time: Numba runs on one thread
        (:func:`numba.set_num_threads`, restored afterwards) and the clock is the process's
        CPU time (:func:`time.process_time`).  Time the process spends descheduled while
        other processes use the cores does not count, so the ratios stay put on a busy,
        shared machine (wall-clock ratios there swing by 2-3x: a parallel launch waits for
        a thread that another process holds).

    Returns
    -------
    dict
        name -> {"median": s, "iqr": s, "samples": n}, over all samples of that function.
    """
    import time

    from attnbench.measure.timing import measure

    clock = time.process_time if cpu else time.perf_counter
    previous = None
    if cpu:
        import numba

        previous = numba.get_num_threads()
        numba.set_num_threads(1)
    try:
        for fn in functions.values():
            fn()
        samples = {name: [] for name in functions}
        for _ in range(rounds):
            for name, fn in functions.items():
                samples[name].extend(measure(fn, warmup=0, repeat=3, max_time=max_time,
                                             clock=clock).samples)
    finally:
        if previous is not None:
            import numba

            numba.set_num_threads(previous)
    out = {}
    for name, values in samples.items():
        q25, median, q75 = np.percentile(values, [25, 50, 75])
        out[name] = {"median": float(median), "iqr": float(q75 - q25), "samples": len(values)}
    return out


def load_average() -> float:
    """The 1-minute load average (nan where the OS has none), recorded beside timings."""
    import os

    return os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")


def loglog_slope(x, y) -> tuple[float, float]:
    """Least-squares slope of log y against log x and the half-width of its 95 % interval."""
    lx, ly = np.log(np.asarray(x, float)), np.log(np.asarray(y, float))
    n = len(lx)
    slope, intercept = np.polyfit(lx, ly, 1)
    if n <= 2:
        return float(slope), float("nan")
    residual = ly - (slope * lx + intercept)
    stderr = math.sqrt(residual @ residual / (n - 2) / ((lx - lx.mean()) @ (lx - lx.mean())))
    # two-sided 97.5 % quantiles of Student's t for 1..10 degrees of freedom, then normal
    t = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228)
    quantile = t[n - 3] if n - 2 <= len(t) else 1.96
    return float(slope), float(quantile * stderr)
