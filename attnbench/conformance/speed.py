"""The speed properties: time against L, GFLOP/s, the fitted exponent, the ratio to numba.

For L in :data:`LENGTHS` (float32, B = 1, H = 4, D = 64), causal and not, the
implementation and attnbench's numba backend are timed side by side in alternating
rounds (:func:`attnbench.measure.timing.interleaved`, the suite's one timer: warm-up
excluded, calibrated batches, every sample kept).  Reported: the median time and GFLOP/s
at the largest L, the exponent of ``t = c + b·L + a·L^p`` with its 95% bootstrap
interval over the samples (:func:`attnbench.studies.fits.fit_scaling`; none when the fit
runs to its grid's edge), and the time ratio to numba at each L with its interval (the
adapter's conversion of the inputs, a copy, is inside the timed call, as it is in a
user's call from NumPy).  The adapter gives the timed calls
(``adapter.timed_calls``): under ``attnbench conform`` both run in the worker, staged
once, and the clock is the judge's, around a request of a few bytes per call, so a
subject cannot patch the timer; both carry the same round trip.  Both run on the thread
count the machine can give a timed call now (:func:`attnbench.measure.cores.check_cores`,
as the sweep does: on a busy machine a call on every core waits for the pre-empted one
every time slice).  Observations, never
failures; skipped by ``--quick``.  A call slower than :data:`SLOW_CALL` seconds ends the
series (larger L would take too long).
"""

from __future__ import annotations

import functools

import numpy as np

from attnbench.conformance.outcome import Check, Outcome
from attnbench.measure.cores import check_cores
from attnbench.measure.flops import attention_flops
from attnbench.measure.timing import interleaved, ratio_interval
from attnbench.studies.fits import P_GRID, fit_scaling

__all__ = ["JUDGED_LENGTH", "LENGTHS", "SLOW_CALL", "checks", "problem_at"]

#: Sequence lengths of the speed series.
LENGTHS = (128, 256, 512, 768, 1024, 1536, 2048)
#: A call slower than this (seconds) ends the series.
SLOW_CALL = 1.0
#: The length the after-timing check judges at (new values, after the speed section).
JUDGED_LENGTH = 1024
_B, _H, _D = 1, 4, 64


def problem_at(L: int, seed: int, causal: bool = False):
    """``q, k, v, kwargs`` of the speed section's shape at length ``L``."""
    rng = np.random.default_rng(seed)
    q, k, v = (rng.standard_normal((_B, _H, L, _D)).astype(np.float32) for _ in range(3))
    return q, k, v, ({"causal": True} if causal else {})


@functools.cache
def _cores():
    """The thread count the machine gives a timed call now (the sweep's check, once)."""
    return check_cores()


def _series(causal: bool, subject) -> Outcome:
    cores = _cores()
    with subject.adapter.threads(cores.threads):
        outcome = _timed_series(causal, subject)
    outcome.detail += f"; on {cores.threads} thread(s): " + \
        cores.describe().split("; give --threads")[0]
    outcome.data.update(threads=cores.threads, cores=cores.describe())
    return outcome


def _timed_series(causal: bool, subject) -> Outcome:
    xs, samples, ratios, points = [], [], [], []
    for L in LENGTHS:
        q, k, v, kwargs = problem_at(L, 31 + L, causal)
        timings = interleaved(subject.adapter.timed_calls(q, k, v, kwargs),
                              rounds=7, min_time=0.02, warmup=1)
        impl, ours = timings["impl"], timings["numba"]
        xs.append(L)
        samples.append(impl.samples)
        flops = attention_flops(_B, _H, L, L, _D, causal=causal)
        ratio, low, high = ratio_interval(impl.samples, ours.samples)
        ratios.append(f"L={L}: {ratio:.2f}x [{low:.2f}, {high:.2f}]")
        points.append({"L": L, "median_s": impl.median, "numba_median_s": ours.median,
                       "gflops": flops / impl.median / 1e9, "ratio_to_numba": ratio,
                       "ratio_ci": [low, high]})
        if impl.median > SLOW_CALL:
            break
    last = points[-1]
    short = f"{last['gflops']:.3g} GFLOP/s at L={last['L']}"
    text = f"{last['median_s'] * 1e3:.3g} ms, {short}"
    if len(xs) >= 3:
        fit = fit_scaling(xs, samples, lower="x" if len(xs) >= 5 else None, resamples=300)
        if fit.slope >= P_GRID[-1] - 0.01 or fit.slope <= P_GRID[0] + 0.01:
            law = (f"no exponent: the fit ran to the edge of its grid (p = {fit.slope:.2f}); "
                   "the times do not follow c + b·L + a·L^p (noisy, or a cost that jumps)")
            short += "; no exponent"
        else:
            law = (f"time ∝ L^{fit.slope:.2f} [{fit.ci_low:.2f}, {fit.ci_high:.2f}] "
                   f"(L {xs[0]}-{xs[-1]})")
            short += f"; L^{fit.slope:.2f} [{fit.ci_low:.2f}, {fit.ci_high:.2f}]"
        text += "; " + law
    short += f"; {last['ratio_to_numba']:.2f}x numba's time"
    text += "; time / numba's: " + ", ".join(ratios)
    return Outcome("pass", detail=text, observed=short, data={"points": points})


def checks() -> list[Check]:
    """The two speed checks (full attention, causal)."""
    return [Check("speed", "speed", "full", functools.partial(_series, False)),
            Check("speed-causal", "speed", "causal", functools.partial(_series, True),
                  frozenset({"causal"}))]
