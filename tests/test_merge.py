"""kernels.merge_attention_states: split any call's keys at any cuts, attend to each part,
merge: the whole call (within the baseline-relative tolerance); parts and rows without keys."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from attnbench import kernels
from attnbench.kernels._dtypes import HALF_DTYPES
from attnbench.measure.oracle import max_abs_error, tolerance
from tests.support import COMPARISONS, oracle

SETTINGS = settings(max_examples=30, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow])


def _parts(q, k, v, cuts, key_lengths, causal, backend="reference"):
    """Attention over each part [c0, c1) of the keys (on ``backend``), as merge inputs."""
    outs, lses = [], []
    Lq, Lk = q.shape[-2], k.shape[-2]
    for c0, c1 in zip(cuts[:-1], cuts[1:], strict=True):
        # Query i sees key j <= i + Lk - Lq (bottom-right); in part coordinates j - c0.
        mask = None
        if causal:
            i = np.arange(Lq)[:, None]
            j = np.arange(c0, c1)[None, :]
            mask = j <= i + Lk - Lq
        lengths = np.clip(key_lengths - c0, 0, c1 - c0)
        out, lse = kernels.attention(q, k[..., c0:c1, :], v[..., c0:c1, :], mask=mask,
                                     key_lengths=lengths, backend=backend, return_lse=True)
        outs.append(out)
        lses.append(lse)
    return outs, lses


@SETTINGS
@given(data=st.data())
def test_split_keys_merge_to_the_whole_call(data):
    B = data.draw(st.integers(1, 2), label="B")
    H = data.draw(st.integers(1, 3), label="H")
    Lq = data.draw(st.integers(1, 5), label="Lq")
    Lk = data.draw(st.integers(1, 40), label="Lk")
    D = data.draw(st.integers(1, 9), label="D")
    n_cuts = data.draw(st.integers(0, 4), label="cuts")
    inner = sorted(data.draw(st.lists(st.integers(0, Lk), min_size=n_cuts, max_size=n_cuts),
                             label="at"))
    cuts = [0] + inner + [Lk]  # repeated cuts give empty parts
    causal = data.draw(st.booleans(), label="causal")
    key_lengths = np.array(data.draw(st.lists(st.integers(0, Lk), min_size=B, max_size=B),
                                     label="key_lengths"))
    seed = data.draw(st.integers(0, 2**32 - 1), label="seed")
    rng = np.random.default_rng(seed)
    q, k, v = (rng.standard_normal((B, H, n, D)).astype(np.float32) for n in (Lq, Lk, Lk))
    outs, lses = _parts(q, k, v, cuts, key_lengths, causal)
    out, lse = kernels.merge_attention_states(outs, lses)
    kw = dict(key_lengths=key_lengths, causal="bottom-right" if causal else False)
    (exact, _), (plain, _) = oracle(q, k, v, **kw)
    assert out.dtype == np.float32 and out.shape == exact.shape
    err = max_abs_error(out, exact)
    assert err <= tolerance(exact, plain, np.float32), (err, cuts)
    whole_lse = kernels.attention(q, k, v, backend="reference", return_lse=True, **kw)[1]
    empty = np.isneginf(whole_lse)
    assert np.array_equal(np.isneginf(lse), empty)  # rows with no key anywhere: -inf
    assert not np.isnan(out).any() and (out[empty] == 0).all()
    np.testing.assert_allclose(lse[~empty], whole_lse[~empty], rtol=1e-5, atol=1e-5)


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
@pytest.mark.parametrize("dtype", HALF_DTYPES, ids=lambda d: d.name)
def test_split_keys_of_a_half_call_merge_to_the_whole_call(dtype, data):
    """Half parts (numba, out in the half dtype, lse float32) merge to the whole half call
    within the half tolerance of the whole call's oracle; out in the half dtype, lse float32."""
    H = data.draw(st.integers(1, 2), label="H")
    Lq = data.draw(st.integers(1, 6), label="Lq")
    Lk = data.draw(st.integers(1, 40), label="Lk")
    D = data.draw(st.sampled_from([4, 16]), label="D")
    cuts = [0] + sorted(data.draw(st.lists(st.integers(0, Lk), max_size=3), label="at")) + [Lk]
    causal = data.draw(st.booleans(), label="causal")
    key_lengths = np.array([data.draw(st.integers(0, Lk), label="key_lengths")])
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1), label="seed"))
    q, k, v = (rng.standard_normal((1, H, n, D)).astype(dtype) for n in (Lq, Lk, Lk))
    outs, lses = _parts(q, k, v, cuts, key_lengths, causal, backend="numba")
    assert all(o.dtype == dtype and x.dtype == np.float32 for o, x in zip(outs, lses,
                                                                          strict=True))
    out, lse = kernels.merge_attention_states(outs, lses)
    assert out.dtype == dtype and lse.dtype == np.float32
    kw = dict(key_lengths=key_lengths, causal="bottom-right" if causal else False)
    (exact, _), (plain, _) = oracle(q, k, v, **kw)
    err = max_abs_error(out, exact)
    tol = tolerance(exact, plain, dtype)
    assert err <= tol, (err, tol, cuts)
    COMPARISONS.append(("merge-numba", dtype.name, err, tol))
    whole = kernels.attention(q, k, v, return_lse=True, **kw)[1]
    assert np.array_equal(np.isneginf(lse), np.isneginf(whole))
    seen = ~np.isneginf(whole)
    np.testing.assert_allclose(lse[seen], whole[seen], rtol=1e-5, atol=1e-5)  # float32 lse


@SETTINGS
@given(S=st.integers(1, 4), empty=st.lists(st.booleans(), min_size=4, max_size=4))
def test_empty_parts_are_not_read(S, empty):
    """A part with lse -inf has weight 0 and its output (NaN here) is never read."""
    rng = np.random.default_rng(S)
    outs = rng.standard_normal((S, 2, 3, 5))
    lses = rng.standard_normal((S, 2, 3))
    dead = np.array(empty[:S])
    outs[dead] = np.nan
    lses[dead] = -np.inf
    out, lse = kernels.merge_attention_states(outs, lses)
    live = ~dead
    if not live.any():
        assert (out == 0).all() and np.isneginf(lse).all()
        return
    expect, expect_lse = kernels.merge_attention_states(outs[live], lses[live])
    np.testing.assert_array_equal(out, expect)
    np.testing.assert_array_equal(lse, expect_lse)
    assert np.isfinite(out).all()


def test_one_part_is_itself_and_sequences_stack():
    rng = np.random.default_rng(1)
    outs = rng.standard_normal((1, 2, 4, 3)).astype(np.float32)
    lses = rng.standard_normal((1, 2, 4)).astype(np.float32)
    out, lse = kernels.merge_attention_states(outs, lses)
    np.testing.assert_array_equal(out, outs[0])
    np.testing.assert_array_equal(lse, lses[0])
    out2, lse2 = kernels.merge_attention_states(list(outs), list(lses))
    np.testing.assert_array_equal(out2, out)


@pytest.mark.parametrize("outs, lses, error, word", [
    (np.zeros((2, 3, 4), np.float32), np.zeros((2, 4), np.float32), ValueError, "lses"),
    (np.zeros((2, 3, 4), np.float32), np.zeros((2, 3), np.float64), TypeError, "dtype"),
    (np.zeros((2, 3, 4), np.int32), np.zeros((2, 3), np.int32), TypeError, "outs"),
    (np.zeros((2, 3, 4), np.float16), np.zeros((2, 3), np.float16), TypeError, "lses"),
    (np.zeros((2, 3, 4), np.float16), np.zeros((2, 3), np.float64), TypeError, "lses"),
    (np.zeros((2, 3, 4), np.float32), np.zeros((2, 3), np.float16), TypeError, "lses"),
    (np.zeros((2, 3, 4), np.int8), np.zeros((2, 3), np.float32), TypeError, "outs"),
    ([], [], ValueError, "empty"),
    ([np.zeros((3, 4)), np.zeros((2, 4))], [np.zeros(3), np.zeros(2)], ValueError, "outs"),
])
def test_bad_input_names_the_argument(outs, lses, error, word):
    with pytest.raises(error, match=word):
        kernels.merge_attention_states(outs, lses)
