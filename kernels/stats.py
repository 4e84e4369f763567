"""The median of timing samples and its distribution-free interval (plain Python, no Numba).

Shared by the numba backend's planner (:mod:`kernels.numba_cpu.planner`) and the harness
(:mod:`attnbench.measure.intervals`): one definition of the order-statistic interval.
"""

from __future__ import annotations

import math

__all__ = ["interval_rank", "median_interval"]


def interval_rank(n: int, confidence: float = 0.95) -> int:
    """The largest rank ``k`` (1-based) with ``P(Binomial(n, 1/2) < k) <= (1 - confidence) / 2``.

    Order statistics ``k`` and ``n + 1 - k`` of ``n`` samples then bound the median with at
    least ``confidence`` for any continuous distribution.  0 where no such rank exists
    (``n`` too small for that confidence).
    """
    tail, k, cdf = (1 - confidence) / 2, 0, 0.0
    for j in range(n // 2):  # cdf = P(X <= j): order statistic j + 1 is a valid lower end
        cdf += math.comb(n, j) / 2 ** n
        if cdf > tail:
            break
        k = j + 1
    return k


def median_interval(samples, confidence: float = 0.95) -> tuple[float, float, float]:
    """``(median, low, high)``: the sample median and its distribution-free interval.

    The interval is between order statistics ``k`` and ``n + 1 - k`` (1-based),
    ``k = interval_rank(n, confidence)``; ``low`` and ``high`` are NaN where ``n`` is too
    small for that confidence (fewer than 6 samples at 95%).
    """
    xs = sorted(float(x) for x in samples)
    n = len(xs)
    if not n:
        raise ValueError("no samples")
    mid = n // 2
    median = xs[mid] if n % 2 else (xs[mid - 1] + xs[mid]) / 2
    k = interval_rank(n, confidence)
    if k < 1:
        return median, math.nan, math.nan
    return median, xs[k - 1], xs[n - k]
