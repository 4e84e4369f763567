"""The softmax-stability study (attnbench.studies.stability): its trends and its helpers."""

import numpy as np
import pytest

from attnbench import kernels
from attnbench.studies import stability, stability_gradients


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
    assert [s.anchor for s in sections] == ["stability", "temperature", "overflow", "float16"]
    assert all(s.tables or s.figures for s in sections)


# --- measured gradients (attnbench.studies.stability_gradients) ------------------------------


@pytest.fixture(scope="module")
def gradients():
    return stability_gradients.gradient_study((4, 64, 1024), n_queries=64, n_keys=32)


def test_gradients_are_the_backward_kernels(gradients):
    """The numba backward's row norms equal the reference backward's on the same draw."""
    reference = stability_gradients.gradient_study((4, 64, 1024), n_queries=64, n_keys=32,
                                                   backend="reference")
    columns = ["dq_norm_median", "dk_norm_median", "dq_norm_mean", "dk_norm_mean"]
    np.testing.assert_allclose(gradients[columns], reference[columns], rtol=1e-9)
    assert gradients["dq_vanishing_fraction"].equals(reference["dq_vanishing_fraction"])


def test_unscaled_gradients_vanish_row_by_row(gradients):
    raw = gradients[~gradients["scaled"]].set_index("d_k")
    scaled = gradients[gradients["scaled"]].set_index("d_k")
    # the scale keeps a typical row's gradient at the same size for every d_k
    assert scaled["dq_norm_median"].max() < 2 * scaled["dq_norm_median"].min()
    assert (scaled["dq_vanishing_fraction"] == 0).all()
    # without it: larger at small d_k (no 1/sqrt(d_k)), far smaller once rows saturate
    assert raw.loc[4, "dq_norm_median"] > scaled.loc[4, "dq_norm_median"]
    assert raw.loc[1024, "dq_norm_median"] < 0.2 * scaled.loc[1024, "dq_norm_median"]
    assert raw.loc[1024, "dq_vanishing_fraction"] > raw.loc[4, "dq_vanishing_fraction"]


def test_one_hot_row_has_no_query_gradient():
    """A row that puts all its weight on one key gets dq = 0 (dS = P(dP - rowsum) = 0)."""
    q = np.array([[50.0, 0.0]])
    k = np.array([[1.0, 0.0], [0.0, 1.0], [-1.0, 0.0]])
    v = np.eye(3)[:, :2]
    dq, _, _ = kernels.attention_backward(q, k, v, np.ones((1, 2)), scale=1.0,
                                          backend="numba")
    assert np.abs(dq).max() < 1e-15


def test_stability_section_shows_the_gradients(gradients):
    sections = stability.section(gradients=gradients)
    first = sections[0]
    captions = [caption for caption, _ in first.tables]
    assert captions[0].startswith("Statistics per d_k")  # the summary card reads this one
    assert any("attention_backward" in caption for caption in captions)
    assert len(first.figures) == 2
    assert "Measured through the backward kernel" in first.text


def test_the_float16_points():
    from attnbench.studies.stability_half import half_study

    table = half_study(d_k=64, n_queries=8, n_keys=16).set_index("point")
    assert table.loc["float16(-1e9)", "value"] == -np.inf  # C25
    assert not table.loc["softmax in float16 of logits 80000, 80400, 0", "finite"]
    kernel = table.loc["kernels.attention, float16 inputs, the same logits"]
    assert kernel["finite"] and kernel["value"] == 2.0
    errors = table[table.index.str.contains("max error")]
    assert len(errors) == 2 and errors["finite"].all()
