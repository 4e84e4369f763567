"""Dropout: one stateless hash, so every backend drops the same weights for one seed.

To see which weights were dropped, values are the identity matrix (Dv = Lk): then
``out[i, j] = weight[i, j] * keep[i, j] / (1 - p)``, and the zero pattern of the
output is the drop pattern.
"""

import numpy as np
import pytest

from attnbench import kernels
from attnbench.kernels import _dropout

P = 0.3


def _identity_problem(B=2, H=3, Hkv=1, L=64, D=16, seed=0):
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((B, H, L, D)).astype(np.float64)
    k = rng.standard_normal((B, Hkv, L, D)).astype(np.float64)
    v = np.broadcast_to(np.eye(L), (B, Hkv, L, L)).copy()  # (B, Hkv, Lk, Dv = Lk)
    return q, k, v


@pytest.mark.parametrize("causal", [False, True])
def test_same_seed_drops_the_same_weights_in_every_backend(causal):
    q, k, v = _identity_problem()
    outs = {
        backend: kernels.attention(q, k, v, dropout_p=P, seed=7, causal=causal, backend=backend)
        for backend in ["reference", "numba"]
    }
    np.testing.assert_array_equal(outs["numba"] == 0, outs["reference"] == 0)
    np.testing.assert_allclose(outs["numba"], outs["reference"], rtol=1e-12, atol=1e-15)


def test_drop_pattern_is_the_documented_hash():
    q, k, v = _identity_problem()
    out, weights = kernels.attention(q, k, v, dropout_p=P, seed=11, return_weights=True)
    keep = _dropout.keep_mask(11, P, weights.shape)
    np.testing.assert_allclose(out, weights * keep / (1 - P), rtol=1e-12, atol=1e-15)


def test_kept_fraction_is_within_statistical_bounds():
    q, k, v = _identity_problem(B=4, H=4, L=128)
    out = kernels.attention(q, k, v, dropout_p=P, seed=3, backend="numba")
    n = out.size  # no mask: every weight is positive, so zero <=> dropped
    kept = np.count_nonzero(out) / n
    sigma = np.sqrt(P * (1 - P) / n)
    assert abs(kept - (1 - P)) < 5 * sigma, f"kept {kept:.4f}, expected {1 - P} ± {5 * sigma:.4f}"


def test_dropout_preserves_the_expected_output():
    """Averaged over seeds, inverted dropout gives the output without dropout."""
    rng = np.random.default_rng(5)
    q, k, v = (rng.standard_normal((1, 2, 12, 8)) for _ in range(3))
    clean = kernels.attention(q, k, v, backend="numba")
    samples = np.stack([
        kernels.attention(q, k, v, dropout_p=P, seed=s, backend="numba") for s in range(400)
    ])
    mean = samples.mean(axis=0)
    stderr = samples.std(axis=0) / np.sqrt(len(samples))
    assert np.all(np.abs(mean - clean) <= 5 * stderr + 1e-12)


def test_seeds_decide_and_none_draws_a_fresh_one():
    q, k, v = _identity_problem()
    a = kernels.attention(q, k, v, dropout_p=P, seed=1)
    b = kernels.attention(q, k, v, dropout_p=P, seed=1)
    c = kernels.attention(q, k, v, dropout_p=P, seed=2)
    d = kernels.attention(q, k, v, dropout_p=P)
    e = kernels.attention(q, k, v, dropout_p=P)
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, c)
    assert not np.array_equal(d, e)


def test_zero_dropout_is_no_dropout():
    q, k, v = _identity_problem()
    np.testing.assert_array_equal(
        kernels.attention(q, k, v, dropout_p=0.0, seed=5), kernels.attention(q, k, v)
    )


def test_weights_are_returned_before_dropout():
    q, k, v = _identity_problem()
    _, w_drop = kernels.attention(q, k, v, dropout_p=P, seed=9, return_weights=True)
    _, w = kernels.attention(q, k, v, return_weights=True)
    np.testing.assert_array_equal(w_drop, w)


def test_hash_is_the_same_in_numpy_and_numba():
    from numba import njit

    bits_numba = _dropout.build_dropout_bits(njit)
    for seed, b, h, i, j in [(0, 0, 0, 0, 0), (2**32 - 1, 3, 95, 4095, 17), (12345, 1, 2, 3, 4)]:
        assert bits_numba(seed, b, h, i, j) == _dropout.dropout_bits(seed, b, h, i, j)
