"""kernels.attention_with_kvcache in half precision and with attention sinks (issues 25, 24).

- half caches (float16, bfloat16) with half queries: out in the half dtype within the half
  tolerance of the oracle (float64 over the half inputs; the baseline rounds scores,
  weights and output to the half dtype), lse float32, on numba and reference, over paged
  and contiguous caches, GQA/MQA, splits, mods, Lq > 1 with new tokens appended;
- the append writes the half bits as given; NaN past each sequence changes no output bit;
- a half decode step allocates no float32 copy of the cache (tracemalloc);
- sinks: numba against the oracle (the literal formula with the sink in every row's
  denominator), a sequence with no key gets 0 and lse = sink, a MultiHeadAttention with
  sinks decodes to the rows of its full causal forward;
- bad input: mixed dtypes name the argument, sinks of the wrong shape or dtype name it.
"""

from __future__ import annotations

import tracemalloc

import ml_dtypes
import numpy as np
import pytest

from attnbench import kernels
from attnbench.kernels import mods

from .test_decode import _check_against_oracle, _decode_case, fill_prefix

HALF = [np.dtype(np.float16), np.dtype(ml_dtypes.bfloat16)]
HALF_IDS = ["float16", "bfloat16"]

#: (Lq, Lk, Lnew, H, Hkv, page_size, num_splits, mods): few cases (each dtype compiles
#: the kernel once more), each stressing something.
HALF_CASES = [
    pytest.param(1, 339, 1, 4, 1, 16, 2, None, id="mqa-page16-split2"),
    pytest.param(3, 799, 2, 4, 2, None, 5, None, id="gqa-contiguous-Lnew2-split5"),
    pytest.param(2, 150, 2, 4, 2, 4, 0, "both", id="window+alibi-page4"),
]


def _mods(which, H):
    if which is None:
        return {}
    return dict(mask_mod=mods.sliding_window(37), score_mod=mods.alibi(np.linspace(0.05, 0.5, H)))


@pytest.mark.parametrize("Lq, Lk, Lnew, H, Hkv, page_size, num_splits, which", HALF_CASES)
@pytest.mark.parametrize("backend", ["numba", "reference"])
@pytest.mark.parametrize("dtype", HALF, ids=HALF_IDS)
def test_half_decode_matches_the_oracle(dtype, backend, Lq, Lk, Lnew, H, Hkv, page_size,
                                        num_splits, which):
    rng = np.random.default_rng(Lk + Lq)
    q, k_cache, v_cache, table, lengths, k_new, v_new = _decode_case(
        rng, Lq, Lk, Lnew, H, Hkv, page_size, dtype)
    if which is not None:  # mods need every query at a position >= 0
        lengths = np.maximum(lengths, Lq)
        fill_prefix(rng, k_cache, v_cache, table, lengths)
    out, lse, kc, _ = _check_against_oracle(backend, q, k_cache, v_cache, table, lengths,
                                            k_new, v_new, num_splits=num_splits,
                                            **_mods(which, H))
    assert out.dtype == dtype and lse.dtype == np.float32
    assert not np.isnan(out.astype(np.float32)).any()
    ps = k_cache.shape[2]  # the new tokens' bits, as given
    for b in range(q.shape[0]):
        positions = lengths[b] + np.arange(Lnew)
        pages = np.full(Lnew, b) if table is None else table[b, positions // ps]
        assert kc[pages, :, positions % ps].tobytes() == k_new[b].transpose(1, 0, 2).tobytes()


@pytest.mark.parametrize("D, DV", [(None, None), (32, 48)], ids=["plain-loops", "products"])
@pytest.mark.parametrize("dtype", HALF, ids=HALF_IDS)
def test_half_nan_past_the_sequence_changes_no_bit(dtype, D, DV):
    """Both numba paths: the plain loops (D = 24) and the register-blocked products (D and
    Dv multiples of 16, kernels/numba_cpu/decode/chunks.py)."""
    rng = np.random.default_rng(11)
    sizes = {} if D is None else {"D": D, "DV": DV}
    q, k_cache, v_cache, table, lengths, _, _ = _decode_case(rng, 2, 300, 0, 4, 2, 16, dtype,
                                                             **sizes)
    garbage_k = np.where(np.isnan(k_cache.astype(np.float32)), dtype.type(1e3), k_cache)
    garbage_v = np.where(np.isnan(v_cache.astype(np.float32)), dtype.type(-7.0), v_cache)
    outs = [kernels.attention_with_kvcache(q, kc, vc, cache_seqlens=lengths, block_table=table,
                                           num_splits=3, backend="numba", return_lse=True)
            for kc, vc in ((k_cache, v_cache), (garbage_k, garbage_v))]
    assert outs[0][0].tobytes() == outs[1][0].tobytes()
    assert outs[0][1].tobytes() == outs[1][1].tobytes()


def test_a_half_step_allocates_no_float32_copy_of_the_cache():
    """bfloat16 caches of 2 x 4 MiB: a float32 copy of K or V alone would be 8 MiB."""
    rng = np.random.default_rng(0)
    B, H, Hkv, L, D = 1, 8, 2, 8192, 128
    dtype = np.dtype(ml_dtypes.bfloat16)
    k_cache = rng.standard_normal((B, Hkv, L, D), dtype=np.float32).astype(dtype)
    v_cache = rng.standard_normal((B, Hkv, L, D), dtype=np.float32).astype(dtype)
    q = rng.standard_normal((B, H, 1, D), dtype=np.float32).astype(dtype)
    step = lambda: kernels.attention_with_kvcache(  # noqa: E731
        q, k_cache, v_cache, cache_seqlens=[L], backend="numba")
    step()  # compiles
    tracemalloc.start()
    try:
        step()
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    float32_copy = 2 * k_cache.nbytes
    assert peak < float32_copy / 8, f"peak {peak} bytes, a float32 copy of K is {float32_copy}"


# --- sinks ------------------------------------------------------------------------------------


def _sinks(H, dtype, seed=0):
    return (np.random.default_rng(seed + 5).standard_normal(H) * 2).astype(dtype)


@pytest.mark.parametrize("dtype", [np.dtype(np.float32), HALF[1]], ids=["float32", "bfloat16"])
@pytest.mark.parametrize("backend", ["numba", "reference"])
def test_sinks_decode_matches_the_oracle(backend, dtype):
    rng = np.random.default_rng(3)
    q, k_cache, v_cache, table, lengths, k_new, v_new = _decode_case(
        rng, 3, 400, 2, 4, 2, 16, dtype)
    sinks = _sinks(q.shape[1], dtype)
    for num_splits in (1, 3):
        _check_against_oracle(backend, q, k_cache, v_cache, table, lengths, k_new, v_new,
                              num_splits=num_splits, sinks=sinks)


def test_sinks_are_the_extra_column_of_scores():
    """The reference decode with sinks is the literal formula: the sink one more score of
    every row, the softmax taken, the column dropped (float64)."""
    rng = np.random.default_rng(9)
    B, H, Hkv, L, D = 1, 4, 2, 37, 8
    k_cache = rng.standard_normal((B, Hkv, L, D))
    v_cache = rng.standard_normal((B, Hkv, L, D))
    q = rng.standard_normal((B, H, 1, D))
    sinks = _sinks(H, np.float64)
    out, lse = kernels.attention_with_kvcache(q, k_cache, v_cache, cache_seqlens=[L],
                                              sinks=sinks, return_lse=True,
                                              backend="reference")
    k, v = np.repeat(k_cache, H // Hkv, axis=1), np.repeat(v_cache, H // Hkv, axis=1)
    s = q @ k.swapaxes(-1, -2) / np.sqrt(D)  # (B, H, 1, L)
    ext = np.concatenate([s, np.broadcast_to(sinks[None, :, None, None], (B, H, 1, 1))], -1)
    p = np.exp(ext - ext.max(-1, keepdims=True))
    want_lse = np.log(p.sum(-1)) + ext.max(-1)
    want = (p / p.sum(-1, keepdims=True))[..., :-1] @ v
    np.testing.assert_allclose(out, want, rtol=1e-12, atol=1e-13)
    np.testing.assert_allclose(lse, want_lse, rtol=1e-12, atol=1e-13)


@pytest.mark.parametrize("backend", ["numba", "reference"])
def test_a_sequence_without_keys_gets_zero_and_its_sink(backend):
    rng = np.random.default_rng(2)
    q, k_cache, v_cache, table, _, _, _ = _decode_case(rng, 2, 40, 0, 2, 1, 4, np.float32)
    sinks = np.array([0.5, -3.0], np.float32)
    out, lse = kernels.attention_with_kvcache(q, k_cache, v_cache, cache_seqlens=[0, 0, 3],
                                              block_table=table, return_lse=True,
                                              sinks=sinks, backend=backend)
    assert (out[:2] == 0).all()
    np.testing.assert_array_equal(lse[:2], np.broadcast_to(sinks[:, None], (2, 2, 2)))
    assert np.isfinite(lse[2]).all() and not np.isnan(out).any()


@pytest.mark.parametrize("dtype", [np.float64, "bfloat16"])
def test_a_layer_with_sinks_decodes_to_its_full_forward(dtype):
    rng = np.random.default_rng(0)
    B, L, d_model, H, Hkv = 2, 9, 32, 4, 2
    layer = kernels.MultiHeadAttention(d_model, H, n_kv_heads=Hkv, dtype=dtype, seed=1,
                                       sinks=True)
    layer.parameters()["sinks"][:] = np.array([0.5, -1.0, 2.0, 0.0]).astype(layer.dtype)
    x = rng.standard_normal((B, L, d_model)).astype(layer.dtype)
    full = layer(x, causal=True, backend="numba")
    cache = kernels.KVCache(B, Hkv, 12, d_model // H, dtype=dtype, page_size=4)
    steps = [layer(x[:, :4], cache=cache, backend="numba")]
    steps += [layer(x[:, t:t + 1], cache=cache, backend="numba") for t in range(4, L)]
    decoded = np.concatenate(steps, axis=1)
    assert decoded.dtype == full.dtype
    if layer.dtype == np.float64:
        np.testing.assert_allclose(decoded, full, rtol=1e-12, atol=1e-12)
        return
    # bfloat16: the decode loop as accurate as the full forward (the same layer in float64
    # is the oracle): within 2 x the full forward's error + 2 ulps of bfloat16.
    wide = kernels.MultiHeadAttention(d_model, H, n_kv_heads=Hkv, dtype=np.float64, sinks=True)
    for name, param in wide.parameters().items():
        param[:] = layer.parameters()[name].astype(np.float64)
    exact = wide(x.astype(np.float64), causal=True, backend="reference")
    err_full = np.abs(full.astype(np.float64) - exact).max()
    err_decoded = np.abs(decoded.astype(np.float64) - exact).max()
    floor = 2 * 2.0 ** -7 * max(1.0, np.abs(exact).max())
    assert err_decoded <= 2 * err_full + floor, (err_decoded, err_full)


# --- bad input ------------------------------------------------------------------------------


def test_mixed_dtypes_and_bad_sinks_name_the_argument():
    rng = np.random.default_rng(0)
    q, k_cache, v_cache, table, lengths, _, _ = _decode_case(rng, 1, 32, 0, 4, 2, 4,
                                                             HALF[1])
    call = lambda **kw: kernels.attention_with_kvcache(  # noqa: E731
        **{**dict(q=q, k_cache=k_cache, v_cache=v_cache, cache_seqlens=lengths,
                  block_table=table), **kw})
    with pytest.raises(TypeError, match="k_cache has dtype float16"):
        call(k_cache=k_cache.astype(np.float16))
    with pytest.raises(TypeError, match="q has dtype int8"):
        call(q=q.astype(np.int8))
    with pytest.raises(TypeError, match="sinks has dtype float32"):
        call(sinks=np.zeros(4, np.float32))
    with pytest.raises(ValueError, match="sinks has shape"):
        call(sinks=np.zeros(2, HALF[1]))
