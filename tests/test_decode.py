"""kernels.attention_with_kvcache against the oracle: FlashAttention's kvcache edge cases
((Lq, Lk) pairs, per-sequence lengths with 0, Lnew != Lq, page sizes with a shuffled block
table, MHA/GQA/MQA, windows and ALiBi through the mods, num_splits), the in-place append
(untouched slots byte for byte), NaN past each sequence never read, determinism, and
errors naming the argument before anything is written."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from attnbench import kernels
from attnbench.kernels import mods
from attnbench.kernels._problems.decode_checks import check_decode_args
from attnbench.measure.oracle import decode_oracle, max_abs_error, tolerance
from tests.support import COMPARISONS

D, DV = 24, 16


def make_cache(rng, B, Hkv, capacity, page_size, dtype, fill=np.nan, D=D, DV=DV):
    """``(k_cache, v_cache, block_table)``: contiguous (page_size None) or paged with the
    pages of all sequences shuffled (and two spare pages); every slot holds ``fill`` until
    :func:`fill_prefix` writes the cached tokens."""
    if page_size is None:
        shape = (B, Hkv, capacity, None)
        table = None
    else:
        per_seq = -(-capacity // page_size)
        num_pages = B * per_seq + 2
        table = rng.permutation(num_pages)[:B * per_seq].reshape(B, per_seq)
        shape = (num_pages, Hkv, page_size, None)
    k = np.full(shape[:3] + (D,), fill, dtype=dtype)
    v = np.full(shape[:3] + (DV,), fill, dtype=dtype)
    return k, v, table


def fill_prefix(rng, k_cache, v_cache, table, lengths):
    """Write random cached tokens 0 .. lengths[b] - 1 of every sequence (as a prefill)."""
    ps = k_cache.shape[2]
    for b, n in enumerate(lengths):
        for j in range(n):
            page = b if table is None else table[b, j // ps]
            k_cache[page, :, j % ps] = rng.standard_normal(k_cache.shape[1:2] + k_cache.shape[3:])
            v_cache[page, :, j % ps] = rng.standard_normal(v_cache.shape[1:2] + v_cache.shape[3:])


#: (Lq, Lk: the longest sequence's keys, Lnew, H, Hkv, page_size, num_splits, mods)
CASES = [
    pytest.param(1, 128, 1, 4, 4, None, 0, None, id="Lq1-Lk128-mha-contiguous"),
    pytest.param(1, 339, 1, 4, 1, 16, 2, None, id="Lq1-Lk339-mqa-page16-split2"),
    pytest.param(3, 799, 2, 4, 2, 4, 5, None, id="Lq3-Lk799-gqa-page4-Lnew2-split5"),
    pytest.param(16, 2000, 16, 4, 2, 256, 1, None, id="Lq16-Lk2000-gqa-page256-split1"),
    pytest.param(3, 339, 5, 4, 2, 1, 0, None, id="Lq3-Lnew5-page1"),
    pytest.param(1, 339, 0, 2, 1, None, 2, None, id="Lnew0-mqa"),
    pytest.param(2, 300, 2, 4, 2, 16, 2, "window", id="window-page16"),
    pytest.param(3, 200, 3, 4, 4, None, 5, "alibi", id="alibi-split5"),
    pytest.param(2, 150, 2, 4, 2, 4, 0, "both", id="window+alibi-page4"),
]


def _mods(which, H):
    window = mods.sliding_window(37) if which in ("window", "both") else None
    alibi = mods.alibi(np.linspace(0.05, 0.5, H)) if which in ("alibi", "both") else None
    return dict(mask_mod=window, score_mod=alibi)


def _decode_case(rng, Lq, Lk, Lnew, H, Hkv, page_size, dtype, B=3, D=D, DV=DV):
    """Inputs: cache_seqlens per sequence (one of them 0 unless Lq > Lnew needs keys)."""
    capacity = Lk + 7
    lengths = np.array([Lk - Lnew, 0, rng.integers(0, Lk - Lnew + 1)][:B])
    k_cache, v_cache, table = make_cache(rng, B, Hkv, capacity, page_size, dtype, D=D, DV=DV)
    fill_prefix(rng, k_cache, v_cache, table, lengths)
    q = rng.standard_normal((B, H, Lq, D)).astype(dtype)
    k_new = rng.standard_normal((B, Hkv, Lnew, D)).astype(dtype) if Lnew else None
    v_new = rng.standard_normal((B, Hkv, Lnew, DV)).astype(dtype) if Lnew else None
    return q, k_cache, v_cache, table, lengths, k_new, v_new


def _check_against_oracle(backend, q, k_cache, v_cache, table, lengths, k_new, v_new, **kw):
    """Run ``backend`` on copies of the cache; compare out and lse with the oracle; return
    the result and the cache after the call."""
    kc, vc = k_cache.copy(), v_cache.copy()
    out, lse = kernels.attention_with_kvcache(q, kc, vc, k_new, v_new, cache_seqlens=lengths,
                                              block_table=table, return_lse=True,
                                              backend=backend, **kw)
    Lnew = 0 if k_new is None else k_new.shape[2]
    kw_oracle = {key: val for key, val in kw.items() if key != "num_splits"}
    problem = check_decode_args(q, kc, vc, cache_seqlens=lengths + Lnew, block_table=table,
                                **kw_oracle)[0]
    (exact, exact_lse), (plain, plain_lse) = decode_oracle(problem)
    assert out.dtype == q.dtype and out.shape == exact.shape and lse.shape == exact_lse.shape
    err = max_abs_error(out, exact)
    tol = tolerance(exact, plain, q.dtype)
    assert err <= tol, f"{backend}: output error {err:.3g} > tolerance {tol:.3g}"
    err_lse = max_abs_error(lse, exact_lse)
    tol_lse = tolerance(exact_lse, plain_lse, q.dtype)
    assert err_lse <= tol_lse, f"{backend}: lse error {err_lse:.3g} > tolerance {tol_lse:.3g}"
    COMPARISONS.append((f"{backend}-decode", np.dtype(q.dtype).name, err, tol))
    return out, lse, kc, vc


def _slots(k_cache, table, b, positions):
    ps = k_cache.shape[2]
    pages = np.full(len(positions), b) if table is None else table[b, positions // ps]
    return pages, positions % ps


@pytest.mark.parametrize("Lq, Lk, Lnew, H, Hkv, page_size, num_splits, which", CASES)
@pytest.mark.parametrize("backend", ["numba", "reference"])
def test_decode_matches_the_oracle(backend, Lq, Lk, Lnew, H, Hkv, page_size, num_splits,
                                   which):
    rng = np.random.default_rng(Lk + Lq)
    q, k_cache, v_cache, table, lengths, k_new, v_new = _decode_case(
        rng, Lq, Lk, Lnew, H, Hkv, page_size, np.float32)
    kw = dict(num_splits=num_splits, **_mods(which, H))
    if which is not None:  # mods need every query at a position >= 0
        lengths = np.maximum(lengths, Lq)
        fill_prefix(rng, k_cache, v_cache, table, lengths)
    out, lse, kc, vc = _check_against_oracle(backend, q, k_cache, v_cache, table, lengths,
                                             k_new, v_new, **kw)
    # The append: the new tokens at cache_seqlens[b] .., every other slot byte for byte.
    written = np.zeros(k_cache.shape[:1] + k_cache.shape[2:3], bool)  # (pages, slots)
    for b in range(q.shape[0]):
        positions = lengths[b] + np.arange(Lnew)
        pages, slots = _slots(k_cache, table, b, positions)
        written[pages, slots] = True
        if Lnew:
            np.testing.assert_array_equal(kc[pages, :, slots], k_new[b].transpose(1, 0, 2))
            np.testing.assert_array_equal(vc[pages, :, slots], v_new[b].transpose(1, 0, 2))
    untouched = ~written
    assert kc.transpose(0, 2, 1, 3)[untouched].tobytes() == (
        k_cache.transpose(0, 2, 1, 3)[untouched].tobytes())
    assert vc.transpose(0, 2, 1, 3)[untouched].tobytes() == (
        v_cache.transpose(0, 2, 1, 3)[untouched].tobytes())
    # Every slot past cache_seqlens[b] + Lnew still holds NaN: none reached the output.
    assert not np.isnan(out).any()


def test_untouched_slots_byte_for_byte_hold_nan_patterns():
    """The byte check above compares k_cache (pages, Hkv, slots, D) slot-major: done right."""
    rng = np.random.default_rng(0)
    q, kc0, vc0, table, lengths, k_new, v_new = _decode_case(rng, 1, 64, 1, 2, 2, 4,
                                                             np.float32)
    kc, vc = kc0.copy(), vc0.copy()
    kernels.attention_with_kvcache(q, kc, vc, k_new, v_new, cache_seqlens=lengths,
                                   block_table=table, backend="numba")
    changed = (kc.view(np.uint32) != kc0.view(np.uint32)).any(axis=(1, 3))  # (pages, slots)
    assert changed.sum() == q.shape[0]  # one new token per sequence, nothing else


@pytest.mark.parametrize("num_splits", [1, 2, 5])
def test_splits_agree_and_repeat_bit_for_bit(num_splits):
    rng = np.random.default_rng(7)
    q, k_cache, v_cache, table, lengths, _, _ = _decode_case(rng, 2, 700, 0, 4, 1, 16,
                                                             np.float32)
    run = lambda n: kernels.attention_with_kvcache(  # noqa: E731
        q, k_cache, v_cache, cache_seqlens=lengths, block_table=table, num_splits=n,
        return_lse=True, backend="numba")
    first, again = run(num_splits), run(num_splits)
    assert first[0].tobytes() == again[0].tobytes() and first[1].tobytes() == again[1].tobytes()
    _check_against_oracle("numba", q, k_cache, v_cache, table, lengths, None, None,
                          num_splits=num_splits)


@pytest.mark.parametrize("dims, which, dtype", [
    ((24, 16), None, np.float32),  # the plain loops
    ((32, 32), None, np.float32),  # the register-blocked products
    ((32, 32), "both", np.float32),  # a mask function and a score function
    ((32, 32), None, "bfloat16"),
])
def test_heads_read_together_or_apart_give_the_same_bits(monkeypatch, dims, which, dtype):
    """A paged cache with short runs is read a page at a time for every key/value head
    together (decode_plan.heads_per_task); each head's arithmetic is the one it has alone."""
    from attnbench.kernels.numba_cpu.decode import plan as decode_plan
    dtype = ml_dtypes.bfloat16 if dtype == "bfloat16" else dtype
    rng = np.random.default_rng(11)
    q, k_cache, v_cache, table, lengths, _, _ = _decode_case(rng, 3, 400, 0, 8, 4, 16, dtype,
                                                             D=dims[0], DV=dims[1])
    lengths = np.maximum(lengths, 3)  # every query at a position (the mods need one)
    fill_prefix(rng, k_cache, v_cache, table, lengths)
    problem = check_decode_args(q, k_cache, v_cache, cache_seqlens=lengths,
                                block_table=table, num_splits=2)[0]
    results, choose = [], decode_plan.heads_per_task
    for run_bytes, heads in ((0, 1), (1 << 20, 4)):
        monkeypatch.setattr(decode_plan, "HEADS_TOGETHER_RUN_BYTES", run_bytes)
        assert choose(problem, 2, threads=1) == heads  # 3 sequences x 2 splits: 6 tasks
        assert choose(problem, 2, threads=2) == 1  # too few tasks for two threads
        monkeypatch.setattr(decode_plan, "heads_per_task", lambda p, n, h=heads: h)
        results.append(kernels.attention_with_kvcache(
            q, k_cache, v_cache, cache_seqlens=lengths, block_table=table, num_splits=2,
            return_lse=True, backend="numba", **_mods(which, 8)))
    (apart, apart_lse), (together, together_lse) = results
    assert apart.tobytes() == together.tobytes() and apart_lse.tobytes() == together_lse.tobytes()
    _check_against_oracle("numba", q, k_cache, v_cache, table, lengths, None, None,
                          num_splits=2, **_mods(which, 8))


def test_float64_and_non_causal():
    rng = np.random.default_rng(3)
    q, k_cache, v_cache, table, lengths, k_new, v_new = _decode_case(rng, 3, 120, 2, 4, 2,
                                                                     None, np.float64)
    for causal in (True, False):
        _check_against_oracle("numba", q, k_cache, v_cache, table, lengths, k_new, v_new,
                              causal=causal, num_splits=2)


def test_a_step_equals_dense_bottom_right_attention():
    """One sequence, no mods: the decode step is attention(causal='bottom-right') over the
    sequence's keys (a check of the positions that does not go through the oracle)."""
    rng = np.random.default_rng(5)
    q, k_cache, v_cache, _, lengths, k_new, v_new = _decode_case(rng, 3, 90, 3, 4, 2, None,
                                                                 np.float64)
    out = kernels.attention_with_kvcache(q, k_cache, v_cache, k_new, v_new,
                                         cache_seqlens=lengths, backend="numba")
    for b, n in enumerate(lengths + 3):
        dense = kernels.attention(q[b], k_cache[b, :, :n], v_cache[b, :, :n],
                                  causal="bottom-right", backend="reference")
        np.testing.assert_allclose(out[b], dense, rtol=1e-12, atol=1e-12)


def test_nan_past_the_sequence_changes_no_bit():
    """Slots past cache_seqlens[b] + Lnew hold NaN or finite garbage: the same bits out."""
    rng = np.random.default_rng(11)
    q, k_cache, v_cache, table, lengths, k_new, v_new = _decode_case(rng, 2, 300, 1, 4, 2,
                                                                     16, np.float32)
    lengths = np.maximum(lengths, 2)  # the window needs positions >= 0
    fill_prefix(rng, k_cache, v_cache, table, lengths)
    garbage_k = np.where(np.isnan(k_cache), np.float32(1e3), k_cache)
    garbage_v = np.where(np.isnan(v_cache), np.float32(-7.0), v_cache)
    for backend in ("numba", "reference"):
        outs = []
        for kc, vc in ((k_cache.copy(), v_cache.copy()), (garbage_k.copy(), garbage_v.copy())):
            out = kernels.attention_with_kvcache(
                q, kc, vc, k_new, v_new, cache_seqlens=lengths, block_table=table,
                num_splits=3, backend=backend, mask_mod=mods.sliding_window(50))
            outs.append(out)
        assert outs[0].tobytes() == outs[1].tobytes(), backend


def test_a_sequence_without_keys_gives_zero_and_minus_inf():
    rng = np.random.default_rng(2)
    q, k_cache, v_cache, table, _, _, _ = _decode_case(rng, 2, 40, 0, 2, 1, 4, np.float32)
    out, lse = kernels.attention_with_kvcache(q, k_cache, v_cache, cache_seqlens=[0, 0, 3],
                                              block_table=table, return_lse=True)
    assert (out[:2] == 0).all() and np.isneginf(lse[:2]).all()
    assert np.isfinite(lse[2]).all() and not np.isnan(out).any()


def test_user_mods_see_absolute_positions():
    """A user mask function gets q_idx = cache_seqlens[b] + Lnew - Lq + i."""
    rng = np.random.default_rng(4)
    q, k_cache, v_cache, table, lengths, k_new, v_new = _decode_case(rng, 2, 80, 2, 2, 1,
                                                                     None, np.float32)
    lengths = np.maximum(lengths, 2)
    fill_prefix(rng, k_cache, v_cache, table, lengths)

    def even_distance(b, h, q_idx, kv_idx):
        return (q_idx - kv_idx) % 2 == 0

    for backend in ("numba", "reference"):
        _check_against_oracle(backend, q, k_cache, v_cache, table, lengths, k_new, v_new,
                              mask_mod=even_distance, num_splits=2)


# --- bad input: an error naming the argument, and the cache unchanged ----------------------


def _good():
    rng = np.random.default_rng(0)
    q, kc, vc, table, lengths, kn, vn = _decode_case(rng, 1, 32, 1, 4, 2, 4, np.float32)
    return dict(q=q, k_cache=kc, v_cache=vc, k=kn, v=vn, cache_seqlens=lengths,
                block_table=table)


BAD = [
    ("overflow", dict(cache_seqlens=[40, 0, 0]), ValueError, "cache_seqlens"),
    ("negative", dict(cache_seqlens=[-1, 0, 0]), ValueError, "cache_seqlens"),
    ("lengths shape", dict(cache_seqlens=[1, 2]), ValueError, "cache_seqlens"),
    ("lengths dtype", dict(cache_seqlens=[1.0, 2.0, 0.0]), TypeError, "cache_seqlens"),
    ("table range", dict(block_table="out"), ValueError, "block_table"),
    ("table shape", dict(block_table=np.zeros((2, 3), np.int64)), ValueError, "block_table"),
    ("cache dtype", dict(k_cache="f64"), TypeError, "k_cache"),
    ("cache shape", dict(v_cache="short"), ValueError, "v_cache"),
    ("k without v", dict(v=None), ValueError, "k and v"),
    ("num_splits", dict(num_splits=-1), ValueError, "num_splits"),
    ("causal", dict(causal="bottom-right"), TypeError, "causal"),
    ("mods at negative positions", dict(cache_seqlens=[0, 0, 0], q="long",
                                        mask_mod=mods.sliding_window(3)), ValueError,
     "cache_seqlens"),
]


@pytest.mark.parametrize("name, change, error, word", BAD, ids=[b[0] for b in BAD])
def test_bad_input_names_the_argument_and_writes_nothing(name, change, error, word):
    args = _good()
    change = dict(change)
    if isinstance(change.get("block_table"), str) and change["block_table"] == "out":
        table = args["block_table"].copy()
        table[0, 0] = args["k_cache"].shape[0]
        change["block_table"] = table
    if isinstance(change.get("k_cache"), str) and change["k_cache"] == "f64":
        change["k_cache"] = args["k_cache"].astype(np.float64)
    if isinstance(change.get("v_cache"), str) and change["v_cache"] == "short":
        change["v_cache"] = args["v_cache"][:-1].copy()
    if isinstance(change.get("q"), str) and change["q"] == "long":
        change["q"] = np.ones((3, 4, 4, D), np.float32)
    args.update(change)
    before = args["k_cache"].copy(), args["v_cache"].copy()
    with pytest.raises(error, match=word):
        kernels.attention_with_kvcache(**args)
    assert args["k_cache"].tobytes() == before[0].tobytes()
    assert args["v_cache"].tobytes() == before[1].tobytes()


# --- property: any shape, lengths, pages and splits agree with the oracle -------------------


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_any_decode_step_matches_the_oracle(data):
    B = data.draw(st.integers(1, 3), label="B")
    Hkv = data.draw(st.sampled_from([1, 2]), label="Hkv")
    H = Hkv * data.draw(st.integers(1, 3), label="group")
    Lq = data.draw(st.integers(1, 4), label="Lq")
    Lnew = data.draw(st.integers(0, 4), label="Lnew")
    page_size = data.draw(st.sampled_from([None, 1, 3, 8]), label="page_size")
    capacity = data.draw(st.integers(max(Lnew, 1), 90), label="capacity")
    lengths = np.array(data.draw(st.lists(st.integers(0, capacity - Lnew), min_size=B,
                                          max_size=B), label="cache_seqlens"))
    num_splits = data.draw(st.sampled_from([0, 1, 2, 5]), label="num_splits")
    causal = data.draw(st.booleans(), label="causal")
    rng = np.random.default_rng(data.draw(st.integers(0, 2**31), label="seed"))
    k_cache, v_cache, table = make_cache(rng, B, Hkv, capacity, page_size, np.float32)
    fill_prefix(rng, k_cache, v_cache, table, lengths)
    q = rng.standard_normal((B, H, Lq, D)).astype(np.float32)
    k_new = rng.standard_normal((B, Hkv, Lnew, D)).astype(np.float32) if Lnew else None
    v_new = rng.standard_normal((B, Hkv, Lnew, DV)).astype(np.float32) if Lnew else None
    out, lse, _, _ = _check_against_oracle("numba", q, k_cache, v_cache, table, lengths, k_new,
                                           v_new, causal=causal, num_splits=num_splits)
    assert not np.isnan(out).any()
    assert ((out == 0).all(axis=-1) == np.isneginf(lse)).all()  # no key: 0 and -inf only
