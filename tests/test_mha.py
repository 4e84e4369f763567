"""MultiHeadAttention: real parameters, counted from the arrays, and the two multi-head forms."""

import numpy as np
import pytest

from attnbench import kernels
from attnbench.kernels import multihead as reference

# (d_model, n_heads, n_kv_heads, bias, expected count from the formula)
CONFIGS = [
    # BERT-base attention block: 4 · 768² weights + 4 · 768 biases.
    (768, 12, None, True, 4 * 768 * 768 + 4 * 768),
    (768, 12, None, False, 4 * 768 * 768),
    # GQA: W_k and W_v shrink to d_model × (n_kv_heads · d_head).
    (64, 8, 2, True, 2 * 64 * 64 + 2 * 64 * 16 + 2 * 64 + 2 * 16),
    # MQA.
    (64, 8, 1, False, 2 * 64 * 64 + 2 * 64 * 8),
]


@pytest.mark.parametrize("d_model, n_heads, n_kv_heads, bias, expected", CONFIGS)
def test_num_parameters_counts_the_real_arrays(d_model, n_heads, n_kv_heads, bias, expected):
    layer = kernels.MultiHeadAttention(d_model, n_heads, n_kv_heads, bias=bias)
    params = layer.parameters()
    assert layer.num_parameters() == expected == sum(p.size for p in params.values())
    assert all(p.dtype == np.float32 for p in params.values())


def test_bert_base_attention_parameters():
    """The published figure: 2,362,368 per layer with bias, 2,359,296 without."""
    assert kernels.MultiHeadAttention(768, 12).num_parameters() == 2_362_368
    assert kernels.MultiHeadAttention(768, 12, bias=False).num_parameters() == 2_359_296


def test_parameters_are_the_arrays_forward_uses():
    layer = kernels.MultiHeadAttention(16, 4, seed=1)
    x = np.random.default_rng(0).standard_normal((3, 5, 16)).astype(np.float32)
    before = layer(x)
    layer.parameters()["b_o"][:] = 1.0  # mutate in place
    np.testing.assert_allclose(layer(x), before + 1.0, rtol=1e-6)


def test_seed_makes_parameters_reproducible():
    a = kernels.MultiHeadAttention(16, 4, seed=5).parameters()
    b = kernels.MultiHeadAttention(16, 4, seed=5).parameters()
    c = kernels.MultiHeadAttention(16, 4, seed=6).parameters()
    assert all(np.array_equal(a[n], b[n]) for n in a)
    assert not np.array_equal(a["W_q"], c["W_q"])


@pytest.mark.parametrize("n_kv_heads", [4, 2, 1])
@pytest.mark.parametrize("backend", ["reference", "numba"])
@pytest.mark.parametrize("kwargs", [{}, {"causal": True}, {"key_lengths": [3, 7]}],
                         ids=["none", "causal", "key_lengths"])
def test_fused_form_equals_the_per_head_loop(backend, n_kv_heads, kwargs):
    """One big projection + reshape + batched attention + reshape == per-head loop + concat."""
    layer = kernels.MultiHeadAttention(32, 4, n_kv_heads, dtype=np.float64, seed=2)
    params = layer.parameters()
    rng = np.random.default_rng(1)
    for name in ("b_q", "b_k", "b_v", "b_o"):  # non-zero biases, so they are exercised
        params[name][:] = rng.standard_normal(params[name].shape)
    x = np.random.default_rng(3).standard_normal((2, 7, 32))
    loop = reference.multihead_loop(x, params, 4, n_kv_heads, **kwargs)
    fused = layer(x, backend=backend, **kwargs)
    np.testing.assert_allclose(fused, loop, rtol=1e-12, atol=1e-12)


def test_concat_of_heads_is_a_reshape():
    """merge_heads(split_heads(x)) is x, and merge_heads returns d_model = H · d_head columns."""
    x = np.arange(2 * 5 * 12, dtype=np.float64).reshape(2, 5, 12)
    heads = reference.split_heads(x, 3)  # (2, 3, 5, 4)
    assert heads.shape == (2, 3, 5, 4)
    np.testing.assert_array_equal(reference.merge_heads(heads), x)


@pytest.mark.parametrize(
    "args, error, words",
    [
        ((30, 4), ValueError, ["d_model=30", "n_heads=4"]),
        ((32, 4, 3), ValueError, ["n_kv_heads=3"]),
        ((32, 0), ValueError, ["n_heads"]),
        ((32.0, 4), ValueError, ["d_model"]),
    ],
)
def test_bad_configuration(args, error, words):
    with pytest.raises(error) as info:
        kernels.MultiHeadAttention(*args)
    assert all(w in str(info.value) for w in words)


def test_bad_forward_input():
    layer = kernels.MultiHeadAttention(16, 4)
    with pytest.raises(TypeError, match="float64.*float32"):
        layer(np.zeros((2, 16)))
    with pytest.raises(ValueError, match="d_model=16"):
        layer(np.zeros((2, 8), np.float32))
    with pytest.raises(TypeError, match="dtype"):
        kernels.MultiHeadAttention(16, 4, dtype=np.int8)


def _window_alibi_as_float_mask(H, L, left, slopes):
    """sliding_window(left) and alibi(slopes) written as one float mask (H, L, L)."""
    i, j = np.arange(L)[:, None], np.arange(L)[None, :]
    bias = slopes[:, None, None] * (j - i)
    return np.where((j >= i - left) & (j <= i), bias, -np.inf)


@pytest.mark.parametrize("backend", ["reference", "numba"])
def test_forward_and_backward_take_score_and_mask_functions(backend):
    """mask_mod= and score_mod= reach kernels.attention: the same as their dense mask."""
    layer = kernels.MultiHeadAttention(16, 4, 2, dtype=np.float64, seed=4)
    x = np.random.default_rng(5).standard_normal((2, 9, 16))
    slopes = np.array([0.5, 0.25, 0.125, 0.0625])
    mods_kw = dict(mask_mod=kernels.mods.sliding_window(3), score_mod=kernels.mods.alibi(slopes))
    dense = layer(x, mask=_window_alibi_as_float_mask(4, 9, 3, slopes), backend="reference")
    with_mods = layer(x, backend=backend, **mods_kw)
    np.testing.assert_allclose(with_mods, dense, rtol=1e-12, atol=1e-12)
    assert not np.allclose(with_mods, layer(x, backend=backend))  # the functions changed it
    dy = np.random.default_rng(6).standard_normal(x.shape)
    dx, grads = layer.backward(x, dy, backend=backend, **mods_kw)
    dx_dense, grads_dense = layer.backward(
        x, dy, mask=_window_alibi_as_float_mask(4, 9, 3, slopes), backend="reference")
    np.testing.assert_allclose(dx, dx_dense, rtol=1e-10, atol=1e-12)
    for name in grads:
        np.testing.assert_allclose(grads[name], grads_dense[name], rtol=1e-10, atol=1e-12)
