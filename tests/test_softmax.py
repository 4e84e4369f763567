"""kernels.softmax: stable, any axis, temperature; properties checked with hypothesis."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from attnbench import kernels

finite_rows = hnp.arrays(
    np.float64, hnp.array_shapes(min_dims=1, max_dims=3, min_side=1, max_side=6),
    elements=st.floats(-1e4, 1e4),
)


@settings(max_examples=100, deadline=None)
@given(x=finite_rows, temperature=st.floats(0.05, 50))
def test_probabilities_sum_to_one(x, temperature):
    p = kernels.softmax(x, axis=-1, temperature=temperature)
    assert p.shape == x.shape
    assert np.all((p >= 0) & (p <= 1))
    np.testing.assert_allclose(p.sum(axis=-1), 1.0, rtol=1e-12)


@settings(max_examples=50, deadline=None)
@given(x=finite_rows, shift=st.floats(-1e3, 1e3))
def test_invariant_to_adding_a_constant(x, shift):
    np.testing.assert_allclose(kernels.softmax(x + shift), kernels.softmax(x), atol=1e-12)


def test_matches_the_textbook_formula():
    x = np.array([0.9, 0.1, 0.3])
    np.testing.assert_allclose(kernels.softmax(x), np.exp(x) / np.exp(x).sum(), rtol=1e-15)


def test_large_logits_do_not_overflow():
    p = kernels.softmax(np.array([1000.0, 1001.0], np.float32))
    assert p.dtype == np.float32
    np.testing.assert_allclose(p, [1 / (1 + np.e), np.e / (1 + np.e)], rtol=1e-6)


@pytest.mark.parametrize("axis", [0, 1, -1])
def test_any_axis(axis):
    x = np.random.default_rng(0).standard_normal((3, 4, 5))
    p = kernels.softmax(x, axis=axis)
    np.testing.assert_allclose(p.sum(axis=axis), 1.0)
    np.testing.assert_allclose(p, np.moveaxis(kernels.softmax(np.moveaxis(x, axis, -1)), -1, axis))


def test_temperature_flattens_and_sharpens():
    x = np.array([2.0, 1.0, 0.1])
    hot, cold = kernels.softmax(x, temperature=10.0), kernels.softmax(x, temperature=0.1)
    assert hot.max() < kernels.softmax(x).max() < cold.max()


def test_all_minus_inf_gives_zeros_and_minus_inf_gives_exact_zero():
    p = kernels.softmax(np.array([[-np.inf, -np.inf], [0.0, -np.inf]], np.float32))
    np.testing.assert_array_equal(p, [[0, 0], [1, 0]])


def test_dtypes():
    assert kernels.softmax(np.array([1, 2, 3])).dtype == np.float64
    assert kernels.softmax(np.array([1, 2], np.float16)).dtype == np.float16
    with pytest.raises(TypeError, match="real"):
        kernels.softmax(np.array([1j]))


@pytest.mark.parametrize("temperature", [0, -1, np.inf, np.nan])
def test_bad_temperature(temperature):
    with pytest.raises(ValueError, match="temperature"):
        kernels.softmax([1.0, 2.0], temperature=temperature)
