"""The speed properties: time against L, GFLOP/s, the fitted exponent, the ratio to numba.

For L in :data:`LENGTHS` (float32, B = 1, H = 4, D = 64), causal and not, the
implementation and attnbench's numba backend are timed side by side in alternating
rounds (:func:`attnbench.measure.timing.interleaved`, the suite's one timer: warm-up
excluded, calibrated batches, every sample kept).  Reported: the median time and GFLOP/s
at the largest L, the exponent of ``t = c + a·L^p`` with its 95% bootstrap interval over
the samples (:func:`attnbench.studies.fits.fit_scaling`), and the time ratio to numba at
each L with its interval.  Observations, never failures; skipped by ``--quick``.  A call
slower than :data:`SLOW_CALL` seconds ends the series (larger L would take too long).
"""

from __future__ import annotations

import functools

import numpy as np

import kernels
from attnbench.conformance.outcome import Check, Outcome
from attnbench.measure.flops import attention_flops
from attnbench.measure.timing import interleaved, ratio_interval
from attnbench.studies.fits import fit_scaling

__all__ = ["LENGTHS", "SLOW_CALL", "checks"]

#: Sequence lengths of the speed series.
LENGTHS = (128, 256, 512, 1024)
#: A call slower than this (seconds) ends the series.
SLOW_CALL = 1.0
_B, _H, _D = 1, 4, 64


def _series(causal: bool, subject) -> Outcome:
    rng = np.random.default_rng(31)
    numba_call = functools.partial(kernels.attention, backend="numba")
    kwargs = {"causal": True} if causal else {}
    xs, samples, ratios, points = [], [], [], []
    for L in LENGTHS:
        q, k, v = (rng.standard_normal((_B, _H, L, _D)).astype(np.float32) for _ in range(3))
        timings = interleaved({
            "impl": lambda q=q, k=k, v=v: subject.adapter.forward(q, k, v, kwargs),
            "numba": lambda q=q, k=k, v=v: numba_call(q, k, v, **kwargs)},
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
    text = (f"{points[-1]['median_s'] * 1e3:.3g} ms, {points[-1]['gflops']:.3g} GFLOP/s at "
            f"L={points[-1]['L']}")
    if len(xs) >= 3:
        fit = fit_scaling(xs, samples, lower="x", resamples=300)
        text += (f"; time ∝ L^{fit.slope:.2f} [{fit.ci_low:.2f}, {fit.ci_high:.2f}] "
                 f"(L {xs[0]}-{xs[-1]})")
    text += "; time / numba's: " + ", ".join(ratios)
    return Outcome("pass", observed=text, data={"points": points})


def checks() -> list[Check]:
    """The two speed checks (full attention, causal)."""
    return [Check("speed", "speed", "full", functools.partial(_series, False)),
            Check("speed-causal", "speed", "causal", functools.partial(_series, True),
                  frozenset({"causal"}))]
