"""kernels.KVCache and MultiHeadAttention.forward(x_new, cache=cache): a decode loop gives
the rows of the full causal forward (contiguous and paged, GQA, prefill then tokens)."""

from __future__ import annotations

import numpy as np
import pytest

from attnbench import kernels


@pytest.mark.parametrize("page_size", [None, 4])
@pytest.mark.parametrize("backend", ["numba", "reference"])
def test_decode_loop_equals_the_full_causal_forward(page_size, backend):
    rng = np.random.default_rng(0)
    B, L, d_model, H, Hkv = 2, 13, 32, 4, 2
    layer = kernels.MultiHeadAttention(d_model, H, n_kv_heads=Hkv, dtype=np.float64, seed=1)
    x = rng.standard_normal((B, L, d_model))
    full = layer(x, causal=True, backend="reference")  # (B, L, d_model)
    cache = kernels.KVCache(B, Hkv, 16, d_model // H, dtype=np.float64, page_size=page_size)
    steps = [layer.forward(x[:, :5], cache=cache, backend=backend)]  # a prefill of 5
    for t in range(5, L):  # then one token at a time
        steps.append(layer.forward(x[:, t:t + 1], cache=cache, backend=backend))
    decoded = np.concatenate(steps, axis=1)
    np.testing.assert_allclose(decoded, full, rtol=1e-12, atol=1e-12)
    assert cache.seqlens.tolist() == [L, L]


def test_append_advances_and_writes_in_order():
    cache = kernels.KVCache(2, 1, 10, 3, value_dim=2, page_size=4)
    k = np.arange(2 * 1 * 3 * 3, dtype=np.float32).reshape(2, 1, 3, 3)
    v = np.ones((2, 1, 3, 2), np.float32)
    cache.append(k, v)
    cache.append(k[:, :, :1] + 100, v[:, :, :1])
    assert cache.seqlens.tolist() == [4, 4]
    table = cache.block_table
    np.testing.assert_array_equal(cache.k[table[1, 0], 0, :3], k[1, 0])
    np.testing.assert_array_equal(cache.k[table[1, 0], 0, 3], k[1, 0, 0] + 100)
    assert (cache.k[table[:, 1]] == 0).all()  # the second pages: untouched
    with pytest.raises(ValueError, match="max_len"):
        cache.append(np.zeros((2, 1, 7, 3), np.float32), np.zeros((2, 1, 7, 2), np.float32))
    assert cache.seqlens.tolist() == [4, 4]
    with pytest.raises(TypeError, match="dtype"):
        cache.append(k.astype(np.float64), v.astype(np.float64))
    with pytest.raises(ValueError, match="shape"):
        cache.append(k[:1], v[:1])


def test_a_cache_of_the_wrong_layout_is_refused():
    layer = kernels.MultiHeadAttention(16, 4, n_kv_heads=2)
    with pytest.raises(ValueError, match="cache"):
        layer.forward(np.zeros((1, 1, 16), np.float32), cache=kernels.KVCache(1, 4, 8, 4))
    with pytest.raises(ValueError, match="key_lengths"):
        layer.forward(np.zeros((1, 1, 16), np.float32), cache=kernels.KVCache(1, 2, 8, 4),
                      key_lengths=[1])
