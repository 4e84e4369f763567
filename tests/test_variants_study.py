"""The variants study on synthetic sweeps: the O(L·W) fit of windows and block skipping."""

import numpy as np
import pandas as pd
import pytest

from attnbench.measure.intervals import format_samples
from attnbench.studies.fits import fit_scaling
from attnbench.studies.scaling import WINDOW_VARIABLE, scaling_table, window_fits
from attnbench.studies.variants import skipping_table

LENGTHS = (1024, 1600, 2560, 4096)
WIDTHS = (64, 256)


def row(backend, L, variant, seconds, *, mask="causal", direction="forward", flops=1.0,
        rng=None, noise=0.02):
    rng = rng or np.random.default_rng([L, len(variant)])
    samples = seconds * np.exp(rng.normal(0, noise, 9))
    return {"backend": backend, "L": L, "d_k": 64, "heads": 4, "kv_heads": 4, "batch": 1,
            "mask": mask, "dtype": "float32", "direction": direction, "variant": variant,
            "status": "ok", "reason": "", "median_ms": float(np.median(samples)) * 1e3,
            "samples_ms": format_samples(samples), "flops": flops,
            "gflops": flops / float(np.median(samples)) / 1e9, "peak_mem_bytes": 1e6,
            "base_mem_bytes": 0.0, "call_overhead_ms": 0.01}


def window_table(exponent, backend="numba", overhead=2e-4):
    rng = np.random.default_rng(3)
    return pd.DataFrame([row(backend, L, f"window-{W}", overhead + 1e-9 * (L * W) ** exponent,
                             rng=rng) for L in LENGTHS for W in WIDTHS])


def test_linear_work_in_l_times_w_is_confirmed_with_its_interval():
    fits = window_fits(window_table(1.0))
    time = fits[fits["quantity"] == "time"].iloc[0]
    assert time["variable"] == WINDOW_VARIABLE and time["variant"] == "window"
    assert time["outcome"] == "confirmed", time["verdict"]
    assert time["ci_low"] <= 1.0 <= time["ci_high"] and time["ci_high"] - time["ci_low"] < 0.2
    assert "O(L·W) confirmed" in time["verdict"] and "(L·W)^" in time["verdict"]


def test_quadratic_work_in_l_times_w_is_not_confirmed():
    time = window_fits(window_table(1.6)).iloc[0]
    assert time["outcome"] == "not confirmed"
    assert time["ci_low"] > 1.25


def test_the_window_fit_is_the_one_scaling_fit():
    table = window_table(0.9)
    x = (table["L"] * table["variant"].str.split("-").str[1].astype(int)).to_numpy(float)
    samples = [np.array(s.split(), float) for s in table["samples_ms"]]
    expected = fit_scaling(x, samples, lower=table["L"].to_numpy(float))
    got = window_fits(table).iloc[0]
    assert got["lower_term"] == "g" and "b·g" in got["method"]
    assert got["slope"] == pytest.approx(expected.slope)
    assert (got["ci_low"], got["ci_high"]) == pytest.approx((expected.ci_low, expected.ci_high))


def test_window_fits_join_the_scaling_table_and_skip_peers_and_short_series():
    table = pd.concat([window_table(1.0), window_table(2.0, backend="numpy")],
                      ignore_index=True)
    fits = scaling_table(table)
    windows = fits[fits["variable"] == WINDOW_VARIABLE]
    assert set(windows["backend"]) == {"numba"}  # a dense peer skips nothing
    by_length = fits[(fits["variable"] == "L") & (fits["quantity"] == "time")]
    expected = dict(zip(by_length["backend"], by_length["expected"], strict=False))
    assert expected == {"numba": 1, "numpy": 2}  # fixed W: linear where tiles are skipped
    assert window_fits(window_table(1.0)[lambda t: t["L"] == 1024]).empty  # 3 L·W needed


def test_block_skipping_pairs_each_variant_with_its_plain_call():
    L = 4096
    full = 4 * 4 * L * L * 64  # 4 FLOPs per pair and dimension: B=1, H=4, d_k=64
    causal_flops = full * (L + 1) / (2 * L)
    window_flops = 4 * 4 * 64 * (L * 257 - 256 * 257 // 2)
    table = pd.DataFrame([
        row("numba", L, "none", 0.160, flops=causal_flops),
        row("numba", L, "window-256", 0.020, flops=window_flops),
        row("numba", L, "none", 0.300, mask="none", flops=full),
        row("numba", L, "documents-8", 0.050, mask="none", flops=full / 8),
        row("numba", L, "alibi", 0.315, mask="none", flops=full),
        row("numba", L, "window-64", 0.02, direction="backward", flops=1.0),  # no partner
    ])
    skips = skipping_table(table).set_index("variant")
    assert list(skips.index) == ["window-256", "documents-8", "alibi"]
    window = skips.loc["window-256"]
    assert window["density"] == pytest.approx(window_flops / full)
    assert window["ideal_speedup"] == pytest.approx(causal_flops / window_flops)
    assert window["speedup"] == pytest.approx(8.0, rel=0.05)
    assert window["speedup_low"] < window["speedup"] < window["speedup_high"]
    assert window["efficiency"] == pytest.approx(window["speedup"] / window["ideal_speedup"])
    assert skips.loc["documents-8", "ideal_speedup"] == pytest.approx(8.0)
    assert skips.loc["alibi", "density"] == 1.0
    assert skips.loc["alibi", "speedup"] == pytest.approx(0.3 / 0.315, rel=0.05)


def test_tables_without_variants_have_no_study():
    plain = pd.DataFrame([row("numba", L, "none", 1e-3) for L in LENGTHS]).drop(
        columns=["direction", "variant"])  # a sweep written before the axes existed
    assert skipping_table(plain).empty and window_fits(plain).empty
    assert set(scaling_table(plain)["variant"]) == {"none"}
