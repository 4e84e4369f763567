"""The softmax-stability study (attnbench.studies.stability): its trends and its helpers."""

import numpy as np
import pytest

import kernels
from attnbench.studies import stability


@pytest.fixture(scope="module")
def study():
    return stability.scaling_study()


def test_covers_every_d_k_both_ways(study):
    assert sorted(set(study["d_k"])) == [4, 8, 16, 32, 64, 128, 256, 512, 1024]
    assert study.groupby("d_k")["scaled"].nunique().eq(2).all()


def test_logit_variance_is_d_k_unscaled_and_1_scaled(study):
    raw = study[~study["scaled"]]
    scaled = study[study["scaled"]]
    # unit-variance entries: var(q·k) = d_k; sampling error of a few percent
    assert np.allclose(raw["logit_var"] / raw["d_k"], 1, rtol=0.1)
    assert np.allclose(scaled["logit_var"], 1, rtol=0.1)


def test_scaled_entropy_stays_flat_unscaled_falls(study):
    raw = study[~study["scaled"]].sort_values("d_k")
    scaled = study[study["scaled"]].sort_values("d_k")
    flat = scaled["entropy_fraction"]
    assert flat.max() - flat.min() < 0.05  # roughly flat in d_k
    assert (np.diff(raw["entropy_fraction"]) < 0).all()  # strictly falling
    assert raw["entropy_fraction"].iloc[-1] < 0.1 < 0.8 < flat.min()
    assert (np.diff(raw["max_weight_mean"]) > 0).all()
    assert (scaled["one_hot_fraction"] == 0).all()
    assert raw["one_hot_fraction"].iloc[-1] > 0.5


def test_jacobian_closed_form_matches_the_matrix():
    rng = np.random.default_rng(3)
    p = kernels.softmax(3 * rng.standard_normal((6, 9)))
    matrices = np.stack([np.diag(row) - np.outer(row, row) for row in p])
    assert np.allclose(stability.jacobian_frobenius(p), np.linalg.norm(matrices, axis=(1, 2)))
    assert stability.jacobian_frobenius(np.eye(4))[0] == 0  # one-hot: no gradient
    assert stability.jacobian_frobenius(np.full(4, 0.25)) == pytest.approx(np.sqrt(3) / 4)


def test_row_entropy():
    assert stability.row_entropy(np.full(8, 1 / 8)) == pytest.approx(np.log(8))
    assert stability.row_entropy(np.array([1.0, 0.0])) == 0


def test_temperature_curves_are_monotone():
    study = stability.temperature_study()
    assert study["monotone"].all()
    for _, part in study.groupby("logits"):
        assert part["entropy"].iloc[0] < part["entropy"].iloc[-1]


def test_overflow_thresholds():
    table = stability.overflow_study(n_keys=128).set_index("threshold")
    thresholds = list(table.index)
    max_log = np.log(np.finfo(np.float32).max)
    assert thresholds[0] == pytest.approx(max_log, abs=1e-4)  # exp overflows
    assert thresholds[1] == pytest.approx(max_log - np.log(128), abs=1e-3)  # the sum does
    assert thresholds[2] == pytest.approx(150 * np.log(2), abs=1e-3)  # all exps underflow
    assert np.isnan(table["naive_at_threshold"].iloc[0])
    assert table["naive_at_threshold"].iloc[1] == 0  # silent zeros, not NaN
    assert table["stable_ok_at_100x"].all()


def test_sections_render_inputs():
    sections = stability.section()
    assert [s.anchor for s in sections] == ["stability", "temperature", "overflow"]
    assert all(s.tables or s.figures for s in sections)
