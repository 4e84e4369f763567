"""Power-law fits on synthetic data of known exponent, the overhead rule and the verdicts."""

import numpy as np
import pandas as pd
import pytest

from attnbench.studies.fits import PowerFit, fit_power_law
from attnbench.studies.scaling import MIN_FIT_TIME_S, OVERHEAD_FACTOR, fit_mask, scaling_table
from attnbench.studies.scaling_verdicts import TOLERANCE, verdict


def test_exact_power_law_gives_the_exponent_and_a_zero_interval():
    x = np.array([128, 256, 512, 1024, 2048])
    fit = fit_power_law(x, 3e-9 * x**2.0)
    assert fit.slope == pytest.approx(2.0, abs=1e-12)
    assert np.exp(fit.intercept) == pytest.approx(3e-9)
    assert fit.ci95 == pytest.approx(0.0, abs=1e-9) and fit.r2 == pytest.approx(1.0)
    assert fit.predict(4096) == pytest.approx(3e-9 * 4096**2)


# (true exponent, relative noise sigma on the log scale, number of points)
SYNTHETIC = [(2.0, 0.05, 6), (1.0, 0.10, 5), (2.0, 0.20, 12), (0.5, 0.02, 4), (3.0, 0.05, 8)]


@pytest.mark.parametrize("exponent, sigma, n", SYNTHETIC)
def test_noisy_power_law_recovers_the_exponent_within_its_interval(exponent, sigma, n):
    rng = np.random.default_rng([7, n])
    x = np.geomspace(64, 8192, n)
    y = 1e-6 * x**exponent * np.exp(rng.normal(0, sigma, n))
    fit = fit_power_law(x, y)
    assert abs(fit.slope - exponent) <= fit.ci95
    assert fit.ci95 > 0 and fit.n == n


def test_the_interval_covers_the_true_exponent_95_percent_of_the_time():
    """Over 1000 synthetic sweeps the 95% interval must contain the truth ~95% of the time."""
    rng = np.random.default_rng(2024)
    x = np.geomspace(100, 3200, 6)
    hits = 0
    for _ in range(1000):
        y = x**2 * np.exp(rng.normal(0, 0.1, x.size))
        fit = fit_power_law(x, y)
        hits += abs(fit.slope - 2) <= fit.ci95
    assert 0.93 <= hits / 1000 <= 0.97  # binomial sd = 0.7%: about 3 sd either side


def test_a_wrong_interval_would_fail_the_coverage_test():
    """The coverage test can fail: z = 1.96 instead of t(4) = 2.78 covers far too little."""
    rng = np.random.default_rng(2024)
    x = np.geomspace(100, 3200, 6)
    hits = 0
    for _ in range(1000):
        fit = fit_power_law(x, x**2 * np.exp(rng.normal(0, 0.1, x.size)))
        hits += abs(fit.slope - 2) <= fit.stderr * 1.0  # a 1-sigma interval
    assert hits / 1000 < 0.8


def test_bad_input_is_rejected():
    with pytest.raises(ValueError, match="positive"):
        fit_power_law([1, 2, 3], [1, 0, 2])
    with pytest.raises(ValueError, match="two distinct"):
        fit_power_law([4, 4], [1, 2])
    two = fit_power_law([1, 2], [1, 4])
    assert two.slope == pytest.approx(2) and np.isnan(two.ci95)


def fit(slope, ci, n=5, **extra):
    return PowerFit(slope=slope, intercept=0.0, stderr=ci / 3, ci95=ci, n=n, r2=0.99,
                    x_min=1, x_max=10, **extra)


# Decided from the whole interval: inside 2 ± TOLERANCE, outside it, or straddling it.
VERDICTS = [
    (fit(1.98, 0.04), 2, "confirmed", "time ∝ L^1.98 [1.94, 2.02] (L 1–10) → O(L²) confirmed"),
    (fit(2.0 + TOLERANCE + 0.05, 0.02), 2, "not confirmed", "the whole interval lies above 2"),
    (fit(1.45, 0.05), 2, "not confirmed", "closest power: O(L)"),
    (fit(2.0, 0.5), 2, "inconclusive", "straddles 1.75"),
    (fit(2.2, 0.1), 2, "inconclusive", "straddles 2.25"),  # a point inside is not enough
    (fit(1.01, 0.02), 1, "confirmed", "→ O(L) confirmed"),
    (fit(2.0, 0.01, n=2), 2, "inconclusive", "2 usable point(s)"),
    (None, 2, "inconclusive", "0 usable point(s)"),
    (fit(0.97, 0.1), None, "measured", "closest power: O(L)"),
    (fit(2.0, np.nan, n=4), 2, "inconclusive", "no interval"),
    (fit(2.03, 0.05, ci_low=1.9, ci_high=2.1, best_class="n^2", class_share=0.97), 2,
     "confirmed", "→ O(L²) confirmed (best class O(L²), 97% of resamples)"),
    # c = 2 of a largest-point time 2 + 1·10^2: 2%; c = 200 of 300: 67%, too much.
    (fit(2.0, 0.05, overhead=2.0), 2, "confirmed", "→ O(L²) confirmed"),
    (fit(2.0, 0.05, overhead=200.0), 2, "inconclusive", "overhead is 67% of the largest"),
]

UPPER_BOUNDS = [
    (fit(0.72, 0.12), "confirmed", "→ at most O(L) confirmed"),
    (fit(1.05, 0.02), "confirmed", "→ at most O(L) confirmed"),
    (fit(1.5, 0.1), "not confirmed", "grows faster"),
    (fit(1.0, 0.6), "inconclusive", "straddles 1.25"),
]


@pytest.mark.parametrize("the_fit, outcome, words", UPPER_BOUNDS)
def test_upper_bound_verdicts(the_fit, outcome, words):
    got_outcome, text = verdict(the_fit, "memory", "L", 1, at_most=True)
    assert got_outcome == outcome and words in text


@pytest.mark.parametrize("the_fit, expected, outcome, words", VERDICTS)
def test_verdicts_are_computed_from_the_numbers(the_fit, expected, outcome, words):
    got_outcome, text = verdict(the_fit, "time", "L", expected)
    assert got_outcome == outcome
    assert words in text


def synthetic_sweep(overhead_s=1e-5, noise=0.02, seed=0):
    """A sweep table whose time is overhead + a·L² (numba and reference) and whose memory
    is linear in L for numba and quadratic for the reference."""
    rng = np.random.default_rng(seed)
    rows = []
    for backend, a, memory in (("numba", 2e-9, lambda L: 4096 * L),
                               ("reference", 8e-9, lambda L: 40 * L * L)):
        for L in (16, 32, 64, 128, 256, 512, 1024, 2048, 4096):
            t = (overhead_s + a * L**2) * np.exp(rng.normal(0, noise))
            rows.append({"backend": backend, "L": L, "d_k": 64, "heads": 4, "kv_heads": 4,
                         "batch": 1, "mask": "none", "dtype": "float32", "status": "ok",
                         "median_ms": t * 1e3, "call_overhead_ms": overhead_s * 1e3,
                         "peak_mem_bytes": memory(L), "flops": 4 * 4 * L * L * 64})
    return pd.DataFrame(rows)


def test_the_overhead_rule_drops_the_points_that_bend_the_slope():
    table = synthetic_sweep()
    used = fit_mask(table, "time")
    threshold_ms = max(OVERHEAD_FACTOR * 1e-5, MIN_FIT_TIME_S) * 1e3
    assert (table.loc[used, "median_ms"] >= threshold_ms).all()
    assert (table.loc[~used, "median_ms"] < threshold_ms).all()
    numba = table[table["backend"] == "numba"]
    bent = fit_power_law(numba["L"], numba["median_ms"])  # every point: overhead included
    kept = numba[used.loc[numba.index]]
    straight = fit_power_law(kept["L"], kept["median_ms"])
    assert abs(straight.slope - 2) <= straight.ci95 + 0.02
    assert bent.slope < 1.8  # without the rule the overhead flattens the line


def test_scaling_table_reports_time_flops_and_memory_with_verdicts():
    fits = scaling_table(synthetic_sweep()).set_index(["quantity", "backend"])
    for backend in ("numba", "reference"):
        time_fit = fits.loc[("time", backend)]
        assert time_fit["outcome"] == "confirmed", time_fit["verdict"]
        assert time_fit["verdict"].endswith("→ O(L²) confirmed")
        assert time_fit["n_used"] < time_fit["n_points"]  # overhead points left out
        assert fits.loc[("flops", backend), "slope"] == pytest.approx(2.0)
    assert fits.loc[("memory", "numba"), "slope"] == pytest.approx(1.0)
    assert "→ at most O(L) confirmed" in fits.loc[("memory", "numba"), "verdict"]
    assert fits.loc[("memory", "reference"), "slope"] == pytest.approx(2.0)
    assert "O(L²) confirmed" in fits.loc[("memory", "reference"), "verdict"]


def test_a_memory_that_grows_quadratically_is_not_confirmed_as_linear():
    table = synthetic_sweep()
    table.loc[table["backend"] == "numba", "peak_mem_bytes"] = 40 * table["L"] ** 2
    fits = scaling_table(table, quantities=("memory",)).set_index("backend")
    assert fits.loc["numba", "outcome"] == "not confirmed"
    assert "at most O(L) not confirmed: grows faster" in fits.loc["numba", "verdict"]
    assert "closest power: O(L²)" in fits.loc["numba", "verdict"]


def test_heads_series_hold_the_kv_ratio_fixed():
    rows = [{"backend": "numba", "L": 512, "d_k": 64, "heads": h, "kv_heads": h, "batch": 1,
             "mask": "none", "dtype": "float32", "status": "ok", "median_ms": 2.0 * h,
             "call_overhead_ms": 0.001, "peak_mem_bytes": 1000 * h, "flops": h}
            for h in (1, 2, 4, 8)]
    fits = scaling_table(pd.DataFrame(rows), quantities=("time",))
    (row,) = fits.itertuples()
    assert row.variable == "heads" and row.slope == pytest.approx(1.0)
    assert row.outcome == "confirmed"


def test_memory_fits_leave_out_the_fixed_part_the_smallest_call_measures():
    table = synthetic_sweep()
    numba = table["backend"] == "numba"
    table["base_mem_bytes"] = np.where(numba, 500_000, 0)  # e.g. per-thread buffers
    table["peak_mem_bytes"] += table["base_mem_bytes"]
    fits = scaling_table(table, quantities=("memory",)).set_index("backend")
    assert fits.loc["numba", "slope"] == pytest.approx(1.0)
    raw = table[numba]
    bent = fit_power_law(raw["L"], raw["peak_mem_bytes"])  # the fixed part bends the line
    assert bent.slope < 0.9


def test_a_verdict_never_names_the_claimed_power_as_the_closest_one():
    """'O(L²) not confirmed ... (closest power: O(L²))' contradicts itself: a slope of
    2.31 [2.30, 2.34] is not confirmed as O(L²), and the text says only where it lies."""
    outcome, text = verdict(fit(2.31, 0.02), "time", "L", 2)
    assert outcome == "not confirmed"
    assert "the whole interval lies above 2 ± 0.25" in text and "closest power" not in text


def test_a_starved_point_makes_a_claimed_exponent_inconclusive():
    from attnbench.studies.fits import PowerFit

    fit = PowerFit(slope=2.0, intercept=0.0, stderr=0.01, ci95=0.02, n=7, r2=1.0,
                   x_min=256, x_max=4096, ci_low=1.98, ci_high=2.02)
    assert verdict(fit, "time", "L", 2)[0] == "confirmed"
    outcome, text = verdict(fit, "time", "L", 2, starved=2)
    assert outcome == "inconclusive" and "2 of 7 points" in text and "waited for cores" in text


def test_the_scaling_table_counts_starved_points_per_series():
    from .test_fits import sampled_sweep

    table = sampled_sweep(np.random.default_rng(5)).assign(starved=False)
    table.loc[(table["backend"] == "numba") & (table["L"] == 640), "starved"] = True
    fits = scaling_table(table, quantities=("time",))
    by = fits.set_index(["variable", "backend"])
    assert by.loc[("L", "numba"), "starved_points"] == 1
    assert by.loc[("L", "numba"), "outcome"] == "inconclusive"
    assert by.loc[("L", "reference"), "outcome"] == "confirmed"
