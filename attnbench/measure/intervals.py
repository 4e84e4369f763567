"""Intervals on timings: a median's, a ratio of medians', and samples as text.

A median's interval is exact and distribution-free (order statistics, see
:func:`median_interval`); a ratio's comes from :func:`scipy.stats.bootstrap` (percentile
method, a fixed seed: the same samples always give the same interval, so a verdict decided
from an interval does not change between two readings of one result folder).
"""

from __future__ import annotations

import math

import numpy as np
from scipy import stats

from attnbench.kernels.stats import median_interval as _order_statistics

__all__ = ["BOOTSTRAP_RESAMPLES", "CONFIDENCE", "MIN_INTERVAL_SAMPLES", "format_samples",
           "median_interval", "paired_ratio_interval", "parse_samples", "ratio_interval"]

#: Confidence level of every interval.
CONFIDENCE = 0.95
#: Bootstrap resamples per interval (percentile method); the seed is fixed.
BOOTSTRAP_RESAMPLES = 2000
#: Fewest samples for an interval of a median (six give a 96.9% order-statistic interval).
MIN_INTERVAL_SAMPLES = 6


def median_interval(samples, confidence: float = CONFIDENCE) -> tuple[float, float]:
    """Distribution-free interval of the median of ``samples`` (order statistics).

    Parameters
    ----------
    samples : array_like
        One sample per timed batch.
    confidence : float, default 0.95

    Returns
    -------
    (low, high) : tuple of float
        ``(x_(k), x_(n+1-k))``, the k-th smallest and largest samples, with k the largest
        rank whose binomial tail ``P(Binomial(n, 1/2) < k)`` is at most ``(1 - confidence)
        / 2`` (:func:`kernels.stats.median_interval`, whose interval this is).
        ``(nan, nan)`` with fewer than :data:`MIN_INTERVAL_SAMPLES` samples (with five, no
        such interval reaches 95%).

    Notes
    -----
    Why not a bootstrap here: the percentile bootstrap of a median (``scipy.stats.bootstrap``)
    is too short with the sample counts a benchmark affords: on the synthetic clock of
    ``tests/test_timing_noise.py`` (one-sided exponential noise) it covered the true median
    85% of the time with 7 samples, 91% with 15 and 94% with 25-40; BCa did the same.  The
    order-statistic interval covers at least the stated rate for any continuous
    distribution of samples, whatever n (96-98% there).  The bootstrap is used where no exact
    interval exists: ratios of medians (:func:`ratio_interval`) and fitted exponents
    (:mod:`attnbench.studies.scaling`).  Independent samples are assumed: interleaving
    and the probe (:mod:`attnbench.measure.timing`) keep slow drifts and bursts out.
    """
    if len(samples) < MIN_INTERVAL_SAMPLES:
        return math.nan, math.nan
    _, low, high = _order_statistics(samples, confidence)  # the one definition
    return low, high


def _median_ratio(a, b, axis=-1):
    return np.median(a, axis=axis) / np.median(b, axis=axis)


def ratio_interval(numerator, denominator,
                   confidence: float = CONFIDENCE) -> tuple[float, float, float]:
    """``(ratio, low, high)``: the ratio of two medians and its bootstrap interval.

    The two sample sets are resampled independently (:func:`scipy.stats.bootstrap` with
    ``paired=False``); interleaved timings make them comparable.  ``nan`` bounds when
    either side has fewer than :data:`MIN_INTERVAL_SAMPLES` samples.
    """
    a, b = np.asarray(numerator, float), np.asarray(denominator, float)
    ratio = float(np.median(a) / np.median(b))
    if min(a.size, b.size) < MIN_INTERVAL_SAMPLES:
        return ratio, math.nan, math.nan
    if np.ptp(a) == 0 and np.ptp(b) == 0:
        return ratio, ratio, ratio
    result = stats.bootstrap((a, b), _median_ratio, confidence_level=confidence,
                             n_resamples=BOOTSTRAP_RESAMPLES, method="percentile",
                             vectorized=True, paired=False,
                             random_state=np.random.default_rng(0))
    return ratio, float(result.confidence_interval.low), float(result.confidence_interval.high)


def paired_ratio_interval(numerator, numerator_rounds, denominator, denominator_rounds,
                          confidence: float = CONFIDENCE) -> tuple[float, float, float] | None:
    """``(ratio, low, high)`` from the rounds both functions kept, or None where that
    cannot be done (a round with more than one sample, fewer than
    :data:`MIN_INTERVAL_SAMPLES` rounds in common).

    Interleaved timings (:func:`attnbench.measure.timing.interleaved`) take one batch of
    each function per round, one right after the other: the ratio within a round cancels
    what changes slowly (the clock, the load), and the median of the per-round ratios gets
    its distribution-free interval (:func:`median_interval`).  Where the machine drifts
    during the measurement this is much narrower than the ratio of two medians resampled
    independently (:func:`ratio_interval`), and no less right.
    """
    a_rounds, b_rounds = list(numerator_rounds), list(denominator_rounds)
    if len(set(a_rounds)) != len(a_rounds) or len(set(b_rounds)) != len(b_rounds):
        return None
    a = dict(zip(a_rounds, np.asarray(numerator, float), strict=True))
    b = dict(zip(b_rounds, np.asarray(denominator, float), strict=True))
    common = sorted(set(a) & set(b))
    if len(common) < MIN_INTERVAL_SAMPLES:
        return None
    ratios = np.array([a[i] / b[i] for i in common])
    low, high = median_interval(ratios, confidence)
    return float(np.median(ratios)), float(low), float(high)


def format_samples(samples_seconds) -> str:
    """Samples in seconds -> ``"1.234 1.301 ..."`` in ms (6 significant digits)."""
    return " ".join(f"{value * 1e3:.6g}" for value in samples_seconds)


def parse_samples(text) -> np.ndarray:
    """The inverse of :func:`format_samples`: ms -> seconds (empty for a missing cell)."""
    if not isinstance(text, str) or not text.strip():
        return np.array([])
    return np.array([float(value) for value in text.split()]) / 1e3
