"""Scaling fits on repeated samples of known exponent: interval coverage, the fixed
overhead, model selection, and the sweep table built from samples."""

import math

import numpy as np
import pandas as pd
import pytest

from attnbench.measure.intervals import format_samples
from attnbench.studies.fits import fit_power_law, fit_scaling
from attnbench.studies.scaling import scaling_table

LENGTHS = np.array([256, 384, 640, 1024, 1600, 2560, 4096])  # 7 points over 16x


def synthetic_samples(rng, exponent, overhead_share, noise=0.05, n=12, x=LENGTHS,
                      work=lambda x, p: x**p):
    """Samples of ``c + a·f(x)``, one-sided exponential noise; c is ``overhead_share`` of
    the smallest point's time."""
    a = 1e-3 / work(x.max(), exponent)
    base = a * work(x.min(), exponent)
    c = overhead_share / (1 - overhead_share) * base
    return [(c + a * work(value, exponent)) * (1 + rng.exponential(noise, n)) for value in x]


def coverage_floor(trials, level=0.95):
    """Fewest covering intervals a true ``level`` rate gives at p > 0.001."""
    return trials * level - 3.3 * math.sqrt(trials * level * (1 - level))


@pytest.mark.parametrize("exponent, overhead_share", [(2, 0.0), (2, 0.5), (1, 0.3)])
def test_bootstrap_interval_covers_the_true_exponent(exponent, overhead_share):
    trials, covered, widths = 40, 0, []
    for seed in range(trials):
        rng = np.random.default_rng([seed, exponent])
        fit = fit_scaling(LENGTHS, synthetic_samples(rng, exponent, overhead_share))
        covered += fit.ci_low <= exponent <= fit.ci_high
        widths.append(fit.ci95)
        assert fit.ci_low <= fit.slope <= fit.ci_high
    assert covered >= coverage_floor(trials)
    assert np.median(widths) < 0.15  # the target half-width, at 5% noise


def test_the_overhead_model_recovers_the_exponent_a_plain_line_misses():
    rng = np.random.default_rng(1)
    samples = synthetic_samples(rng, 2, overhead_share=0.5)
    fit = fit_scaling(LENGTHS, samples)
    assert fit.ci_low <= 2 <= fit.ci_high
    true_c = 1e-3 / 4096**2 * 256**2  # overhead_share 0.5: c equals the smallest work
    assert fit.overhead == pytest.approx(true_c * (1 + 0.05 * math.log(2)), rel=0.3)
    plain = fit_scaling(LENGTHS, samples, overhead=False)
    assert plain.ci_high < 1.9  # the overhead bends the log-log line down
    assert plain.overhead == 0


@pytest.mark.parametrize("exponent, work, expected", [
    (1, lambda x, p: x, "n"),
    (1, lambda x, p: x * np.log(x), "n log n"),
    (2, lambda x, p: x**p, "n^2"),
    (3, lambda x, p: x**p, "n^3"),
])
def test_model_selection_picks_the_complexity_class(exponent, work, expected):
    rng = np.random.default_rng(2)
    x = np.geomspace(64, 65536, 9).round()  # classes apart need a wide range
    fit = fit_scaling(x, synthetic_samples(rng, exponent, 0.2, noise=0.02, x=x, work=work))
    assert fit.best_class == expected
    assert fit.class_share > 0.8


def test_more_samples_give_a_tighter_interval():
    widths = []
    for n in (6, 24, 96):
        rng = np.random.default_rng(3)
        widths.append(fit_scaling(LENGTHS, synthetic_samples(rng, 2, 0.2, n=n)).ci95)
    assert widths[0] > widths[1] > widths[2]


def test_the_fit_is_deterministic_and_validates_input():
    rng = np.random.default_rng(4)
    samples = synthetic_samples(rng, 2, 0.1)
    assert fit_scaling(LENGTHS, samples) == fit_scaling(LENGTHS, samples)
    with pytest.raises(ValueError, match="3 distinct"):
        fit_scaling([1, 2], [[1, 2], [3, 4]])
    with pytest.raises(ValueError, match="positive"):
        fit_scaling([1, 2, 3], [[1, 2], [3, 0], [4, 5]])


def test_exact_power_law_least_squares():
    fit = fit_power_law(LENGTHS, 3e-9 * LENGTHS**2.0)
    assert fit.slope == pytest.approx(2.0) and fit.ci_low == pytest.approx(2.0)


def sampled_sweep(rng, noise=0.05):
    """A sweep table with samples: numba and reference quadratic in L, linear in d_k;
    the CPU time twice the wall time (two threads)."""
    rows = []

    def row(backend, L, d_k, seconds):
        wall = seconds * (1 + rng.exponential(noise, 12))
        cpu = 2 * seconds * (1 + rng.exponential(noise, 12))
        return {"backend": backend, "L": L, "d_k": d_k, "heads": 4, "kv_heads": 4,
                "batch": 1, "mask": "none", "dtype": "float32", "status": "ok",
                "median_ms": np.median(wall) * 1e3, "call_overhead_ms": 0.01,
                "samples_ms": format_samples(wall), "cpu_samples_ms": format_samples(cpu),
                "cpu_median_ms": np.median(cpu) * 1e3, "noisy": False,
                "peak_mem_bytes": 4096 * L, "flops": 16 * L * L * d_k}

    for backend, a in (("numba", 2e-9), ("reference", 8e-9)):
        rows += [row(backend, L, 64, 2e-5 + a * L * L) for L in LENGTHS]
    rows += [row("numba", 1024, d, 2e-5 + 3e-8 * 1024 * d) for d in (16, 32, 64, 128, 256)]
    return pd.DataFrame(rows)


def test_scaling_table_fits_wall_and_cpu_time_from_the_samples():
    table = sampled_sweep(np.random.default_rng(5))
    fits = scaling_table(table)
    time_fits = fits[fits["quantity"].isin(["time", "cpu"])]
    assert set(time_fits["quantity"]) == {"time", "cpu"}
    assert (time_fits["method"].str.contains("bootstrap")).all()
    assert (time_fits["outcome"] == "confirmed").all(), time_fits["verdict"].tolist()
    assert (time_fits["n_used"] == time_fits["n_points"]).all()  # overhead in the model
    by_variable = time_fits.set_index(["quantity", "variable", "backend"])
    assert by_variable.loc[("time", "L", "numba"), "best_class"] == "n^2"
    assert by_variable.loc[("cpu", "d_k", "numba"), "best_class"] == "n"
    assert set(fits["clock"][fits["quantity"] == "cpu"]) == {"CPU time (work)"}
    again = scaling_table(table)
    assert again["verdict"].tolist() == fits["verdict"].tolist()  # same samples, same words


def test_a_cost_that_falls_with_x_gets_the_smallest_exponent_without_warnings(recwarn):
    rng = np.random.default_rng(6)
    samples = [1e-3 / value * (1 + rng.exponential(0.05, 8)) for value in LENGTHS]
    fit = fit_scaling(LENGTHS, samples)
    assert fit.slope < 0.1 and fit.ci_high < 0.2  # no growing cost fits: the grid's floor
    assert not [w for w in recwarn if issubclass(w.category, RuntimeWarning)]


def causal_like(value, p):
    """The work of a causal kernel walking 128-key tiles: L²/2 plus the diagonal tiles'
    128·L/2 plus a per-row 64·L: quadratic with a linear part that weighs most at small L."""
    return value**p / 2 + (64 + 64) * value


def test_the_lower_order_term_recovers_the_leading_exponent_a_plain_fit_bends():
    trials, covered, plain_covered = 40, 0, 0
    for seed in range(trials):
        rng = np.random.default_rng([seed, 7])
        samples = synthetic_samples(rng, 2, 0.05, work=causal_like)
        fit = fit_scaling(LENGTHS, samples, lower="x")
        covered += fit.ci_low <= 2 <= fit.ci_high
        plain_covered += (plain := fit_scaling(LENGTHS, samples)).ci_low <= 2 <= plain.ci_high
        assert fit.lower_term == "x" and fit.lower > 0 and 0.5 < fit.leading_share < 1
    assert covered >= coverage_floor(trials)
    assert plain_covered < trials / 2  # c + a·L^p reads the linear part as a smaller p


@pytest.mark.parametrize("work, exponent", [(lambda x, p: x, 1), (lambda x, p: x**p, 1.5)])
def test_the_lower_order_term_never_confirms_a_cost_that_grows_slower(work, exponent):
    from attnbench.studies.scaling_verdicts import verdict

    for seed in range(10):
        rng = np.random.default_rng([seed, 8])
        fit = fit_scaling(LENGTHS, synthetic_samples(rng, exponent, 0.1, work=work), lower="x")
        outcome, text = verdict(fit, "time", "L", 2)
        assert outcome != "confirmed", text


def test_a_window_fit_with_its_term_in_L_finds_linear_growth_in_L_W():
    L = np.array([1024, 1024, 2048, 2048, 4096, 4096], float)
    W = np.array([64, 256, 64, 256, 64, 256], float)
    rng = np.random.default_rng(9)
    samples = [(2e-4 + 1e-9 * (n * w + 64 * n)) * (1 + rng.exponential(0.03, 12))
               for n, w in zip(L, W, strict=True)]
    fit = fit_scaling(L * W, samples, lower=L)
    assert fit.ci_low <= 1 <= fit.ci_high and fit.ci95 < 0.1
    assert fit.lower_term == "g" and fit.lower == pytest.approx(64e-9, rel=0.3)
    plain = fit_scaling(L * W, samples)
    assert plain.ci_high < 0.95  # the 64·L part bends a fit without it below 1


def test_lower_order_term_arguments_are_checked_and_predicted():
    rng = np.random.default_rng(10)
    samples = synthetic_samples(rng, 2, 0.1, work=causal_like)
    with pytest.raises(ValueError, match="overhead"):
        fit_scaling(LENGTHS, samples, lower="x", overhead=False)
    with pytest.raises(ValueError, match="one positive value per x"):
        fit_scaling(LENGTHS, samples, lower=LENGTHS[:3])
    fit = fit_scaling(LENGTHS, samples, lower="x")
    medians = np.array([np.median(s) for s in samples])
    assert np.allclose(fit.predict(LENGTHS), medians, rtol=0.1)
    leading = np.exp(fit.intercept) * LENGTHS.max() ** fit.slope
    assert fit.dominance() == pytest.approx(leading / fit.predict(LENGTHS.max()))
