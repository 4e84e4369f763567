"""Packed variable-length batches (issue 24): ``attention_varlen`` == ``kernels.attention`` on
each sequence alone (batch index b), forward and backward, against the oracle.

The oracle of a packed call is the per-sequence dense oracle: sequence b as a dense batch
of B entries, all but b empty (``key_lengths`` 0), so the mods and the dropout hash see
batch index b; the tolerance is the project's (2 x the float32/float64 baseline's error
+ 4 ulps; :mod:`attnbench.measure.oracle`), per sequence.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from attnbench import kernels
from attnbench.kernels.reference import forward as reference_forward
from attnbench.measure.grad_oracle import gradient_oracle, lse_rounding, row_dot_rounding
from attnbench.measure.oracle import oracle_dtype, oracle_runs, tolerance

from .support import COMPARISONS, max_error


def _packed(lengths_q, lengths_k, H, Hkv, D, Dv, dtype, seed=0):
    rng = np.random.default_rng(seed)
    cu_q = np.concatenate([[0], np.cumsum(lengths_q)]).astype(np.int32)
    cu_k = np.concatenate([[0], np.cumsum(lengths_k)]).astype(np.int32)
    q = rng.standard_normal((cu_q[-1], H, D)).astype(dtype)
    k = rng.standard_normal((cu_k[-1], Hkv, D)).astype(dtype)
    v = rng.standard_normal((cu_k[-1], Hkv, Dv)).astype(dtype)
    return q, k, v, cu_q, cu_k


def _dense(x, cu, b, B):
    rows = x[cu[b]:cu[b + 1]].transpose(1, 0, 2)
    full = np.zeros((B,) + rows.shape, x.dtype)
    full[b] = rows
    return full


def _sequence_keywords(kwargs, cu_k, b, B):
    lengths = np.zeros(B, np.int64)
    lengths[b] = cu_k[b + 1] - cu_k[b]
    return dict(kwargs, key_lengths=lengths)


def _assert_forward(q, k, v, cu_q, cu_k, backend, **kwargs):
    out, lse = kernels.attention_varlen(q, k, v, cu_q, cu_k, return_lse=True, backend=backend,
                                        **kwargs)
    assert out.shape == q.shape[:2] + v.shape[2:] and out.dtype == q.dtype
    assert lse.shape == (q.shape[1], q.shape[0])
    B = len(cu_q) - 1
    for b in range(B):
        if cu_q[b + 1] == cu_q[b]:
            continue
        rows = slice(cu_q[b], cu_q[b + 1])
        if cu_k[b + 1] == cu_k[b]:  # sees no key: 0, lse -inf (or the sink)
            assert (out[rows] == 0).all()
            continue
        dq, dk, dv = (_dense(x, cu, b, B) for x, cu in ((q, cu_q), (k, cu_k), (v, cu_k)))
        problem = kernels.prepare(dq, dk, dv, **_sequence_keywords(kwargs, cu_k, b, B))
        (exact, _), (plain, _) = oracle_runs(problem)
        exact, plain = exact[b].transpose(1, 0, 2), plain[b].transpose(1, 0, 2)
        err = max_error(out[rows], exact)
        tol = tolerance(exact, plain, q.dtype)
        assert err <= tol, f"{backend} sequence {b}: error {err:.3g} > tolerance {tol:.3g}"
        COMPARISONS.append((f"{backend}-varlen", np.dtype(q.dtype).name, err, tol))
        # lse: as tests/backward_support.assert_lse_matches, twice the forward's tolerance
        # from the lse in the input dtype; -inf where a row sees no key, in both.
        lse_exact = reference_forward.run(problem, compute_dtype=oracle_dtype(q.dtype),
                                                  keep_precision=True, return_lse=True)[2][b]
        lse_plain = reference_forward.run(problem, compute_dtype=q.dtype,
                                                  return_lse=True)[2][b]
        np.testing.assert_array_equal(np.isfinite(lse[:, rows]), np.isfinite(lse_exact))
        seen = np.isfinite(lse_exact)
        if seen.any():
            lse_err = max_error(lse[:, rows][seen], lse_exact[seen])
            assert lse_err <= 2 * tolerance(lse_exact[seen], lse_plain[seen], q.dtype)


def _assert_backward(q, k, v, cu_q, cu_k, backend, **kwargs):
    dout = np.random.default_rng(9).standard_normal(q.shape[:2] + v.shape[2:]).astype(q.dtype)
    out, lse = kernels.attention_varlen(q, k, v, cu_q, cu_k, return_lse=True, backend=backend,
                                        **kwargs)
    grads = kernels.attention_varlen_backward(q, k, v, dout, cu_q, cu_k, out=out, lse=lse,
                                              backend=backend, **kwargs)
    sinks = kwargs.get("sinks")
    assert len(grads) == (3 if sinks is None else 4)
    B = len(cu_q) - 1
    d_sinks_exact = 0.0
    d_sinks_plain = 0.0
    for b in range(B):
        if cu_q[b + 1] == cu_q[b] or cu_k[b + 1] == cu_k[b]:
            continue
        dense = [_dense(x, cu, b, B) for x, cu in ((q, cu_q), (k, cu_k), (v, cu_k), (dout, cu_q))]
        problem = kernels.prepare(*dense[:3], **_sequence_keywords(kwargs, cu_k, b, B))
        exact, plain = gradient_oracle(problem, dense[3])
        fused = row_dot_rounding(problem, dense[3]) if backend != "reference" else (0, 0, 0)
        for name, g, cu, e, p, term in zip(("dq", "dk", "dv"), grads, (cu_q, cu_k, cu_k),
                                           exact, plain, fused, strict=False):
            e, p = e[b].transpose(1, 0, 2), p[b].transpose(1, 0, 2)
            err = max_error(g[cu[b]:cu[b + 1]], e)
            tol = tolerance(e, p, q.dtype) + lse_rounding(e, lse) + term
            assert err <= tol, f"{backend} sequence {b} {name}: {err:.3g} > {tol:.3g}"
            COMPARISONS.append((f"{backend}-varlen-bwd", np.dtype(q.dtype).name, err, tol))
        if sinks is not None:
            d_sinks_exact = d_sinks_exact + exact[3]
            d_sinks_plain = d_sinks_plain + plain[3]
    if sinks is not None and np.ndim(d_sinks_exact):
        err = max_error(grads[3], d_sinks_exact)
        tol = tolerance(d_sinks_exact, d_sinks_plain, q.dtype) + lse_rounding(
            d_sinks_exact, lse)
        assert err <= tol, f"dsinks: {err:.3g} > {tol:.3g}"
    return grads


# (name, lengths_q, lengths_k): FlashAttention's varlen edge cases, small heads and D.
LENGTHS = [
    ("self", [7, 13, 1, 20], [7, 13, 1, 20]),
    ("empty-every-fifth-and-last", [3, 9, 4, 6, 0, 5, 0], [3, 9, 4, 6, 0, 5, 0]),
    ("cross-113-203", [113, 1], [203, 147]),
    ("empty-keys", [5, 4], [0, 6]),
]


@pytest.mark.parametrize("causal", [False, True, "bottom-right"])
@pytest.mark.parametrize("name, lengths_q, lengths_k", LENGTHS, ids=[c[0] for c in LENGTHS])
def test_numba_forward_is_each_sequence_alone(name, lengths_q, lengths_k, causal):
    q, k, v, cu_q, cu_k = _packed(lengths_q, lengths_k, 4, 2, 16, 16, np.float32)
    _assert_forward(q, k, v, cu_q, cu_k, "numba", causal=causal)


@pytest.mark.parametrize("dtype", [np.float32, pytest.param(np.float64, marks=pytest.mark.slow)])
@pytest.mark.parametrize("D, Dv", [(1, 1), (59, 59), (64, 64), (111, 7), (128, 128),
                                   (256, 256)])
def test_head_sizes(D, Dv, dtype):
    q, k, v, cu_q, cu_k = _packed([9, 0, 17], [12, 3, 17], 2, 1, D, Dv, dtype)
    _assert_forward(q, k, v, cu_q, cu_k, "numba", causal="bottom-right")


@pytest.mark.slow
@pytest.mark.parametrize("lengths", [([1023, 5], [1024, 7]), ([1024, 3], [1023, 3])])
def test_long_sequences(lengths):
    q, k, v, cu_q, cu_k = _packed(*lengths, 2, 1, 32, 32, np.float32)
    _assert_forward(q, k, v, cu_q, cu_k, "numba", causal=True)
    _assert_backward(q, k, v, cu_q, cu_k, "numba", causal=True)


@pytest.mark.parametrize("kwargs", [
    dict(dropout_p=0.3, seed=11, causal=True),
    dict(score_mod="alibi", mask_mod="window"),
    dict(score_mod="softcap", causal="bottom-right"),
    dict(sinks=True),
    dict(scale=1.0),
], ids=["dropout", "alibi-window", "softcap", "sinks", "unscaled"])
@pytest.mark.parametrize("dtype", [np.float32, pytest.param(np.float64, marks=pytest.mark.slow)])
def test_forward_and_backward_options(kwargs, dtype):
    q, k, v, cu_q, cu_k = _packed([6, 0, 19, 11], [9, 4, 19, 2], 4, 2, 8, 8, dtype)
    kwargs = _options(kwargs, 4, dtype)
    _assert_forward(q, k, v, cu_q, cu_k, "numba", **kwargs)
    _assert_backward(q, k, v, cu_q, cu_k, "numba", **kwargs)


def _options(kwargs, H, dtype):
    kwargs = dict(kwargs)
    if kwargs.get("score_mod") == "alibi":
        kwargs["score_mod"] = kernels.mods.alibi(np.linspace(0.1, 0.4, H))
    if kwargs.get("score_mod") == "softcap":
        kwargs["score_mod"] = kernels.mods.softcap(2.0)
    if kwargs.get("mask_mod") == "window":
        kwargs["mask_mod"] = kernels.mods.sliding_window(3)
    if kwargs.get("sinks"):
        kwargs["sinks"] = np.linspace(-1, 2, H).astype(dtype)
    return kwargs


def test_mods_receive_the_sequence_index():
    """A prefix per sequence (b-dependent data): sequence b's mask is prefix_lm's for b."""
    q, k, v, cu_q, cu_k = _packed([8, 10, 6], [8, 10, 6], 2, 2, 8, 8, np.float32)
    _assert_forward(q, k, v, cu_q, cu_k, "numba",
                    mask_mod=kernels.mods.prefix_lm(np.array([2, 7, 0])))


@pytest.mark.parametrize("backend", ["cuda", "reference"])
def test_other_backends(backend):
    q, k, v, cu_q, cu_k = _packed([3, 0, 5], [4, 2, 5], 2, 1, 4, 4, np.float32)
    for kwargs in (dict(causal="bottom-right"), dict(sinks=np.array([0.5, -1], np.float32))):
        _assert_forward(q, k, v, cu_q, cu_k, backend, **kwargs)
        _assert_backward(q, k, v, cu_q, cu_k, backend, **kwargs)


@settings(max_examples=12, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 24), st.integers(0, 24)), min_size=1, max_size=6),
       st.sampled_from([False, True, "bottom-right"]), st.sampled_from([(2, 1), (2, 2)]))
def test_hypothesis_lengths_equal_per_sequence_attention(pairs, causal, heads):
    lengths_q, lengths_k = [p[0] for p in pairs], [p[1] for p in pairs]
    q, k, v, cu_q, cu_k = _packed(lengths_q, lengths_k, *heads, 8, 8, np.float32, seed=len(pairs))
    _assert_forward(q, k, v, cu_q, cu_k, "numba", causal=causal)
    grads = _assert_backward(q, k, v, cu_q, cu_k, "numba", causal=causal)
    for b in range(len(pairs)):  # rows that see no key get no gradient
        if lengths_k[b] == 0:
            assert (grads[0][cu_q[b]:cu_q[b + 1]] == 0).all()


def test_nan_in_other_sequences_changes_no_bit():
    """A sequence reads only its own rows: NaN planted in every other sequence's keys and
    values (and in the queries of a sequence with no keys) leaves its outputs bit-equal."""
    q, k, v, cu_q, cu_k = _packed([6, 9, 4], [7, 8, 0], 2, 1, 8, 8, np.float32)
    dout = np.ones(q.shape[:2] + v.shape[2:], np.float32)
    before = kernels.attention_varlen(q, k, v, cu_q, cu_k, causal=True)
    g_before = kernels.attention_varlen_backward(q, k, v, dout, cu_q, cu_k, causal=True)
    k2, v2, q2 = k.copy(), v.copy(), q.copy()
    k2[cu_k[0]:cu_k[1]] = np.nan
    v2[cu_k[0]:cu_k[1]] = np.nan
    q2[cu_q[2]:] = np.nan  # sequence 2 sees no key
    after = kernels.attention_varlen(q2, k2, v2, cu_q, cu_k, causal=True)
    g_after = kernels.attention_varlen_backward(q2, k2, v2, dout, cu_q, cu_k, causal=True)
    np.testing.assert_array_equal(after[cu_q[1]:], before[cu_q[1]:])
    np.testing.assert_array_equal(g_after[0][cu_q[1]:], g_before[0][cu_q[1]:])
    np.testing.assert_array_equal(g_after[1][cu_k[1]:], g_before[1][cu_k[1]:])


@pytest.mark.parametrize("cu_q, cu_k, error, words", [
    ([1, 5, 9], [0, 4, 9], ValueError, "cu_seqlens_q must start at 0"),
    ([0, 6, 5, 9], [0, 3, 6, 9], ValueError, "cu_seqlens_q must be non-decreasing"),
    ([0, 4, 8], [0, 4, 9], ValueError, "cu_seqlens_q ends at 8"),
    ([0, 4, 9], [0, 9], ValueError, "cu_seqlens_k has shape"),
    ([0.0, 4.0, 9.0], [0, 4, 9], TypeError, "cu_seqlens_q has dtype"),
    ([0, 4, 9], [0, 4, 10], ValueError, "cu_seqlens_k ends at 10"),
    ([[0, 4, 9]], [0, 4, 9], ValueError, "cu_seqlens_q has shape"),
])
def test_bad_cu_seqlens_raise_naming_them(cu_q, cu_k, error, words):
    q = np.zeros((9, 2, 4), np.float32)
    with pytest.raises(error, match=words):
        kernels.attention_varlen(q, q, q, np.array(cu_q), np.array(cu_k))
    with pytest.raises(error, match=words):
        kernels.attention_varlen_backward(q, q, q, q, np.array(cu_q), np.array(cu_k))


def test_bad_arrays_raise_naming_them():
    q = np.zeros((9, 2, 4), np.float32)
    cu = np.array([0, 9])
    with pytest.raises(ValueError, match="q has shape"):
        kernels.attention_varlen(q[None], q, q, cu, cu)
    with pytest.raises(TypeError, match="dtype"):
        kernels.attention_varlen(q, q.astype(np.float64), q, cu, cu)
    with pytest.raises(ValueError, match="sinks has shape"):
        kernels.attention_varlen(q, q, q, cu, cu, sinks=np.zeros(3, np.float32))
    with pytest.raises(ValueError, match="max_seqlen_q=4 is less"):
        kernels.attention_varlen(q, q, q, cu, cu, max_seqlen_q=4)
    with pytest.raises(ValueError, match="dout has shape"):
        kernels.attention_varlen_backward(q, q, q, q[:3], cu, cu)
