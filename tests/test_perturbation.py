"""Perturbation tests: what a query cannot see cannot change its output, bit for bit.

Hidden keys and values are overwritten with garbage (large finite numbers, NaN,
inf); the outputs of the rows that cannot see them must stay bit-identical.  The
fused backend never reads hidden positions, so even NaN leaves it unchanged.  The
reference sums visible values with a different routine once a value is
non-finite, so for it NaN is checked by closeness and finiteness, and bit-identity
with finite garbage.
"""

import numpy as np
import pytest

from attnbench import kernels
from attnbench.kernels.numba_cpu import config

GARBAGE = {"huge": 1e30, "nan": np.nan, "inf": np.inf, "-inf": -np.inf}
BACKENDS = ["numba", "numba-loops", "reference"]


@pytest.fixture(autouse=True)
def _tile_products(request, monkeypatch):
    """'numba-loops' is the numba backend with its tile products in loops (no BLAS), the
    path a machine without SciPy takes; 'numba' uses the BLAS where SciPy is installed;
    'numba-micro' takes the micro-kernel path (as where the planner chose it)."""
    backend = request.node.callspec.params.get("backend")
    if backend == "numba-loops":
        monkeypatch.setattr(config, "HAVE_BLAS", False)
    if backend == "numba-micro":
        from attnbench.kernels.numba_cpu import planner
        from attnbench.kernels.numba_cpu.dense import micro

        f32 = np.dtype(np.float32)
        monkeypatch.setitem(planner._CHOICES, f32, micro.CONFIGS[f32][0])


def _attention(*args, backend, **kwargs):
    return kernels.attention(*args, backend=backend.split("-")[0], **kwargs)


def _assert_unchanged(before, after, backend, garbage):
    if backend == "reference" and not np.isfinite(GARBAGE[garbage]):
        assert np.isfinite(after).all()
        np.testing.assert_allclose(after, before, rtol=1e-6, atol=1e-6)
    else:
        np.testing.assert_array_equal(after, before)


def _qkv(shape=(2, 4, 40, 16), kv_heads=2, seed=0):
    rng = np.random.default_rng(seed)
    B, H, L, D = shape
    return (
        rng.standard_normal((B, H, L, D)).astype(np.float32),
        rng.standard_normal((B, kv_heads, L, D)).astype(np.float32),
        rng.standard_normal((B, kv_heads, L, D)).astype(np.float32),
    )


@pytest.mark.parametrize("garbage", list(GARBAGE))
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("causal", [True, "bottom-right"])
def test_future_tokens_cannot_change_the_past(backend, garbage, causal):
    q, k, v = _qkv()
    L = q.shape[2]
    before = _attention(q, k, v, causal=causal, backend=backend)
    t = 23  # every key from t on is in the future of queries < t (Lq = Lk: both alignments agree)
    k2, v2, q2 = k.copy(), v.copy(), q.copy()
    k2[:, :, t:] = GARBAGE[garbage]
    v2[:, :, t:] = GARBAGE[garbage]
    q2[:, :, t:] = GARBAGE[garbage]
    after = _attention(q2, k2, v2, causal=causal, backend=backend)
    _assert_unchanged(before[:, :, :t], after[:, :, :t], backend, garbage)
    assert L > t


@pytest.mark.parametrize("garbage", list(GARBAGE))
@pytest.mark.parametrize("backend", BACKENDS)
def test_padding_by_key_lengths_is_never_read(backend, garbage):
    q, k, v = _qkv()
    lengths = np.array([17, 40])
    before = _attention(q, k, v, key_lengths=lengths, backend=backend)
    k2, v2 = k.copy(), v.copy()
    k2[0, :, 17:] = GARBAGE[garbage]
    v2[0, :, 17:] = GARBAGE[garbage]
    after = _attention(q, k2, v2, key_lengths=lengths, backend=backend)
    _assert_unchanged(before, after, backend, garbage)


@pytest.mark.parametrize("mask_kind", ["bool", "float -inf"])
@pytest.mark.parametrize("garbage", list(GARBAGE))
@pytest.mark.parametrize("backend", BACKENDS)
def test_masked_keys_are_never_read(backend, garbage, mask_kind):
    """A padding mask (B, 1, 1, Lk) hides whole key columns: their content is irrelevant."""
    q, k, v = _qkv()
    hidden = np.zeros((2, 1, 1, 40), bool)
    hidden[0, ..., 30:] = True
    hidden[1, ..., ::3] = True
    mask = ~hidden if mask_kind == "bool" else np.where(hidden, -np.inf, 0.5).astype(np.float32)
    before = _attention(q, k, v, mask=mask, backend=backend)
    k2, v2 = k.copy(), v.copy()
    cols = np.broadcast_to(hidden[:, :, 0, :], (2, 2, 40))  # (B, Hkv, Lk)
    k2[cols] = GARBAGE[garbage]
    v2[cols] = GARBAGE[garbage]
    after = _attention(q, k2, v2, mask=mask, backend=backend)
    _assert_unchanged(before, after, backend, garbage)


@pytest.mark.parametrize("backend", BACKENDS)
def test_causal_self_attention_layer_ignores_future_tokens(backend):
    """Through a whole MultiHeadAttention layer: changing token t changes no output before t."""
    layer = kernels.MultiHeadAttention(32, 4, n_kv_heads=2, seed=3)
    rng = np.random.default_rng(4)
    x = rng.standard_normal((2, 25, 32)).astype(np.float32)
    before = layer(x, causal=True, backend=backend.removesuffix("-loops"))
    x2 = x.copy()
    x2[:, 11:] = rng.standard_normal(x2[:, 11:].shape)
    after = layer(x2, causal=True, backend=backend.removesuffix("-loops"))
    np.testing.assert_array_equal(after[:, :11], before[:, :11])
    assert not np.array_equal(after[:, 11:], before[:, 11:])


def _mod_case(name, L, rng):
    """Keywords of a call whose keys 100..179 are hidden from many rows by its mask_mod."""
    docs = np.sort(rng.integers(0, 5, size=(2, L)), axis=1)
    slopes = np.array([0.5, 0.25, 0.125, 0.0625])
    return {
        "window alibi": dict(mask_mod=kernels.mods.sliding_window(16),
                             score_mod=kernels.mods.alibi(slopes)),
        "window causal alibi": dict(mask_mod=kernels.mods.sliding_window(40), causal=True,
                                    score_mod=kernels.mods.alibi(slopes)),
        "document and window": dict(mask_mod=kernels.mods.and_masks(
            kernels.mods.document(docs), kernels.mods.sliding_window(120))),
        "prefix": dict(mask_mod=kernels.mods.prefix_lm(np.array([30, 90])), causal=True),
        "window bool mask": dict(mask_mod=kernels.mods.sliding_window(30),
                                 mask=rng.random((L, L)) > 0.2),
        "user function": dict(mask_mod=kernels.mods.mask_mod(_far_apart_hidden)),
    }[name]


def _far_apart_hidden(b, h, q_idx, kv_idx):
    return abs(q_idx - kv_idx) < 50


MOD_CASES = ["window alibi", "window causal alibi", "document and window", "prefix",
             "window bool mask", "user function"]
# Each (mod structure, path) is a kernel of its own, 7-20 s to compile.  The loop products
# (numba-loops) differ from the BLAS tiles only in the two products, which every case
# reaches the same way: they run the cases with causal and with a dense mask.  The
# micro-kernel takes no dense mask (that case would run the tiles, as "numba" does) and
# classifies cells by a built-in's tile function (window; document and window) or by
# evaluating a user function: prefix_lm's is one more built-in of the same kind.
LOOPS_CASES = ["window causal alibi", "window bool mask"]
MICRO_CASES = ["window alibi", "window causal alibi", "document and window", "user function"]
PATH_CASES = {"numba": MOD_CASES, "numba-loops": LOOPS_CASES, "numba-micro": MICRO_CASES}


@pytest.mark.parametrize("garbage", list(GARBAGE))
@pytest.mark.parametrize("backend, case", [
    (backend, case) for backend, cases in PATH_CASES.items() for case in cases])
def test_keys_hidden_by_a_mask_mod_change_no_output_bit(backend, garbage, case, monkeypatch):
    """Garbage in keys and values that only a ``mask_mod`` hides from a row changes no bit
    of that row's output, as for the plain masks (issue 21: the tile read the hidden values,
    found one not finite and summed the whole tile another way).

    The tile kernel runs serially in blocks of 64 query rows: the hidden keys are read (or
    not) in a block's code, which the parallel launcher runs per task the same way.
    """
    rng = np.random.default_rng(5)
    L = 300
    q, k, v = _qkv((2, 4, L, 16))
    kwargs = _mod_case(case, L, rng)
    micro = backend == "numba-micro"
    if micro:
        from attnbench.kernels.numba_cpu import choose

        assert choose.micro_block(kernels.prepare(q, k, v, **kwargs), None, None, None)
    else:  # the tile kernel (the micro-kernel has a parallel launcher only): serial, in
        monkeypatch.setattr(config, "SERIAL_WORK_LIMIT", float("inf"))  # blocks of 64 rows
        monkeypatch.setattr(config, "BLOCK_Q", 64)
    bad = np.zeros(L, bool)
    bad[100:180] = True
    rows = ~kernels.prepare(q, k, v, **kwargs).visible()[..., bad].any(axis=-1)  # (B, H, Lq)
    assert 0 < rows.sum() < rows.size
    before = _attention(q, k, v, backend=backend, **kwargs)
    k2, v2 = k.copy(), v.copy()
    k2[:, :, bad] = GARBAGE[garbage]
    v2[:, :, bad] = GARBAGE[garbage]
    after = _attention(q, k2, v2, backend=backend, **kwargs)
    np.testing.assert_array_equal(after[rows], before[rows])
