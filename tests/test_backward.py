"""The backward pass: gradient checks, differential tests, what is never read.

- the float64 reference against central finite differences of the reference forward;
- ``attention(..., return_lse=True)`` against the oracle's log-sum-exp;
- every CPU backend's gradients against the oracle over the forward's case table
  (``tests/test_attention.py``) and hypothesis-drawn problems, with the tolerance of
  ``tests/backward_support.py`` (2 x the plain formula's own error + 4 ulps);
- perturbation: NaN/inf in hidden keys and values, and in the q and dout rows of queries
  that see no key, change no gradient bit (numba) or nothing beyond rounding (reference);
- dropout: the same weights dropped as the forward; thread-pool concurrency; bad input.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from attnbench import kernels
from attnbench.kernels._dropout import keep_mask
from attnbench.kernels.numba_cpu import config
from attnbench.kernels.numba_cpu.dense import backward as numba_backward

from .backward_support import (
    assert_gradients_match,
    assert_matches_finite_differences,
    make_dout,
)
from .support import DTYPES, Case, assert_lse_near_the_oracle, make_inputs
from .test_attention import ALL_CASES, problems

# --- finite differences -------------------------------------------------------------------

FD_CASES = [
    Case("plain", B=1, H=2, Lq=4, Lk=5, D=3, Dv=2),
    Case("causal top-left", H=1, Lq=5, D=3, causal=True),
    Case("causal bottom-right Lq<Lk", H=1, Lq=3, Lk=6, D=2, causal="bottom-right"),
    Case("bool mask", Lq=4, Lk=5, D=3, mask="bool"),
    Case("float mask", Lq=4, Lk=5, D=3, mask="float"),
    Case("key_lengths with 0", B=2, H=1, Lq=3, Lk=5, D=2, key_lengths="with-zero"),
    Case("fully masked rows", H=1, Lq=6, Lk=4, D=2, mask="empty-rows"),
    Case("GQA 4/2", H=4, Hkv=2, Lq=3, Lk=4, D=2),
    Case("dropout", Lq=4, Lk=5, D=3, dropout_p=0.3),
    Case("unscaled", H=1, Lq=4, D=3, scale=1.0),
    Case("everything", B=2, H=4, Hkv=2, Lq=4, Lk=6, D=2, Dv=3, causal="bottom-right",
         mask="float", key_lengths="random", dropout_p=0.25),
]


@pytest.mark.parametrize("case", FD_CASES, ids=lambda c: c.name)
def test_reference_gradient_matches_finite_differences(case):
    """Relative error of the float64 reference against central differences <= 1e-6."""
    q, k, v, kwargs = make_inputs(case, np.float64, seed=3)
    assert_matches_finite_differences(q, k, v, make_dout(q, v, seed=3), **kwargs)


# --- the log-sum-exp of the forward ---------------------------------------------------------

@pytest.mark.parametrize("backend", ["reference", "numba"])
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("case", ALL_CASES[:6] + ALL_CASES[15::3])
def test_lse_matches_the_oracle(case, dtype, backend):
    q, k, v, kwargs = make_inputs(case, dtype)
    problem = kernels.prepare(q, k, v, **kwargs)
    out, lse = kernels.attention(q, k, v, backend=backend, return_lse=True, **kwargs)
    assert lse.shape == q.shape[:-1] and lse.dtype == q.dtype
    assert_lse_near_the_oracle(lse.reshape(problem.q.shape[:-1]), problem)  # (B, H, Lq)
    np.testing.assert_array_equal(out, kernels.attention(q, k, v, backend=backend, **kwargs))


@pytest.mark.parametrize("backend", ["reference", "numba"])
def test_lse_comes_last_with_weights(backend):
    q = k = v = np.ones((2, 3, 4), np.float32)  # (H, L, D)
    out, weights, lse = kernels.attention(q, k, v, backend=backend, return_weights=True,
                                          return_lse=True)
    assert out.shape == (2, 3, 4) and weights.shape == (2, 3, 3) and lse.shape == (2, 3)
    np.testing.assert_allclose(lse, 0.5 * 4 + np.log(3), rtol=1e-6)  # scores all 4/√4 = 2


def test_return_lse_must_be_a_bool():
    q = np.ones((3, 4), np.float32)
    with pytest.raises(TypeError, match="return_lse"):
        kernels.attention(q, q, q, return_lse="yes")


# --- differential tests against the oracle ----------------------------------------------

# path name: (serial work limit, tile products by the BLAS where SciPy is installed)
NUMBA_PATHS = {
    "serial": (float("inf"), config.HAVE_BLAS),
    "parallel": (0, config.HAVE_BLAS),
    # No BLAS: the tile products of a machine without SciPy, in the serial kernel (which
    # shares them with the parallel one; test_half and test_mods_backward run the parallel
    # kernel without BLAS).
    "serial-loops": (float("inf"), False),
}


@pytest.fixture(params=list(NUMBA_PATHS), ids=lambda p: f"numba-{p}")
def numba_path(request, monkeypatch):
    """The numba forward and backward through their serial or parallel kernels, with or
    without BLAS."""
    serial_limit, have_blas = NUMBA_PATHS[request.param]
    monkeypatch.setattr(config, "SERIAL_WORK_LIMIT", serial_limit)
    monkeypatch.setattr(config, "BACKWARD_SERIAL_WORK_LIMIT", serial_limit)
    monkeypatch.setattr(config, "HAVE_BLAS", have_blas)
    return "numba"


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("case", ALL_CASES)
def test_numba_gradients_match_reference(case, dtype, numba_path):
    q, k, v, kwargs = make_inputs(case, dtype)
    assert_gradients_match(q, k, v, numba_path, **kwargs)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("case", ALL_CASES[:6] + ALL_CASES[15::4])
def test_reference_backend_rounds_the_oracle(case, dtype):
    q, k, v, kwargs = make_inputs(case, dtype)
    assert_gradients_match(q, k, v, "reference", **kwargs)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
def test_numba_recomputes_out_and_lse_when_missing(dtype):
    q, k, v, kwargs = make_inputs(Case("x", B=2, H=4, Hkv=2, Lq=37, Lk=41, D=8,
                                       causal=True, mask="bool", dropout_p=0.2), dtype)
    assert_gradients_match(q, k, v, "numba", pass_forward=False, **kwargs)
    dout = make_dout(q, v)
    out, lse = kernels.attention(q, k, v, return_lse=True, backend="numba", **kwargs)
    given_ = kernels.attention_backward(q, k, v, dout, out=out, lse=lse, **kwargs)
    recomputed = kernels.attention_backward(q, k, v, dout, **kwargs)
    for a, b in zip(given_, recomputed, strict=True):
        np.testing.assert_array_equal(a, b)


def test_key_chunks_split_the_keys_of_few_heads(monkeypatch):
    """With fewer (batch, kv head) pairs than threads, the key blocks are split in chunks
    whose dQ parts are summed: same gradients within the tolerance."""
    monkeypatch.setattr(config, "BACKWARD_SERIAL_WORK_LIMIT", 0)
    monkeypatch.setattr(config, "BACKWARD_BLOCK_K", 16)
    monkeypatch.setattr(config, "BACKWARD_BLOCK_Q", 8)
    monkeypatch.setattr(numba_backward, "key_chunks", lambda problem, threads: 3)
    q, k, v, kwargs = make_inputs(Case("x", B=1, H=4, Hkv=1, Lq=50, Lk=70, D=8,
                                       causal="bottom-right", key_lengths="random"),
                                  np.float32)
    assert_gradients_match(q, k, v, "numba", **kwargs)


@pytest.mark.parametrize("backend", ["reference", "numba"])
@pytest.mark.parametrize(
    "q_shape, kv_shape",
    [((5, 8), (6, 8)), ((4, 5, 8), (2, 6, 8)), ((2, 3, 4, 5, 8), (2, 3, 2, 6, 8))],
    ids=["2-D", "3-D", "5-D"],
)
def test_gradients_of_any_rank(backend, q_shape, kv_shape):
    rng = np.random.default_rng(1)
    q, k, v = (rng.standard_normal(s) for s in (q_shape, kv_shape, kv_shape))
    lead = q_shape[:-3] if len(q_shape) > 3 else ()
    key_lengths = rng.integers(0, 7, size=lead) if lead else 4
    assert_gradients_match(q, k, v, backend, causal="bottom-right", key_lengths=key_lengths)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=problems(), dtype=st.sampled_from(DTYPES), seed=st.integers(0, 2**16))
def test_numba_gradients_on_drawn_problems(case, dtype, seed):
    q, k, v, kwargs = make_inputs(case, dtype, seed)
    assert_gradients_match(q, k, v, "numba", dout_seed=seed, **kwargs)


def test_empty_problems():
    q = np.ones((2, 3, 0, 4), np.float32)
    k = v = np.ones((2, 3, 5, 4), np.float32)
    for backend in ("reference", "numba"):
        dq, dk, dv = kernels.attention_backward(q, k, v, np.ones((2, 3, 0, 4), np.float32),
                                                backend=backend)
        assert dq.shape == q.shape and dk.shape == k.shape
        np.testing.assert_array_equal(dk, 0)
        dq, dk, dv = kernels.attention_backward(k, q, q, np.ones_like(k), backend=backend)
        np.testing.assert_array_equal(dq, 0)
        assert dk.shape == q.shape


# --- what is never read -----------------------------------------------------------------

GARBAGE = {"huge": 1e30, "nan": np.nan, "inf": np.inf, "-inf": -np.inf}
BACKENDS = ["numba", "numba-loops", "reference"]


@pytest.fixture
def run_backward(request, monkeypatch):
    """``run_backward(backend, q, k, v, dout, **kw)``; 'numba-loops' is numba without BLAS."""

    def run(backend, q, k, v, dout, **kwargs):
        with monkeypatch.context() as m:
            if backend == "numba-loops":
                m.setattr(config, "HAVE_BLAS", False)
            name = backend.removesuffix("-loops")
            out, lse = kernels.attention(q, k, v, backend=name, return_lse=True, **kwargs)
            return kernels.attention_backward(q, k, v, dout, out=out, lse=lse, backend=name,
                                              **kwargs)

    return run


def _unchanged(before, after, backend, garbage):
    if backend == "reference" and not np.isfinite(GARBAGE[garbage]):
        # The reference sums visible terms with another routine once a value is not finite.
        assert np.isfinite(after).all()
        np.testing.assert_allclose(after, before, rtol=1e-5, atol=1e-6)
    else:
        np.testing.assert_array_equal(after, before)


def _qkv(shape=(2, 4, 40, 16), kv_heads=2, seed=0):
    rng = np.random.default_rng(seed)
    B, H, L, D = shape
    q = rng.standard_normal((B, H, L, D)).astype(np.float32)
    k = rng.standard_normal((B, kv_heads, L, D)).astype(np.float32)
    v = rng.standard_normal((B, kv_heads, L, D)).astype(np.float32)
    return q, k, v, make_dout(q, v)


@pytest.mark.parametrize("garbage", list(GARBAGE))
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("mask_kind", ["key_lengths", "bool", "float -inf"])
def test_hidden_keys_and_values_are_never_read(backend, garbage, mask_kind, run_backward):
    """Keys no query sees: their dk = dv = 0 exactly; every other gradient keeps its bits."""
    q, k, v, dout = _qkv()
    hidden = np.zeros((2, 40), bool)  # (B, Lk)
    if mask_kind == "key_lengths":
        kwargs = dict(key_lengths=np.array([17, 40]))
        hidden[0, 17:] = True
    else:
        hidden[0, 30:] = True
        hidden[1, ::3] = True
        cols = hidden[:, None, None, :]
        mask = ~cols if mask_kind == "bool" else np.where(cols, -np.inf, 0.5).astype(np.float32)
        kwargs = dict(mask=mask)
    before = run_backward(backend, q, k, v, dout, **kwargs)
    k2, v2 = k.copy(), v.copy()
    cols = np.broadcast_to(hidden[:, None, :], (2, 2, 40))  # (B, Hkv, Lk)
    k2[cols] = GARBAGE[garbage]
    v2[cols] = GARBAGE[garbage]
    after = run_backward(backend, q, k2, v2, dout, **kwargs)
    for b, a in zip(before, after, strict=True):
        _unchanged(b, a, backend, garbage)
    for grad in after[1:]:  # dk, dv
        assert (grad[cols] == 0).all()


@pytest.mark.parametrize("garbage", list(GARBAGE))
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("causal", [True, "bottom-right"])
def test_future_keys_cannot_change_the_gradient_of_the_past(backend, garbage, causal,
                                                            run_backward):
    q, k, v, dout = _qkv()
    before = run_backward(backend, q, k, v, dout, causal=causal)
    t = 23
    k2, v2, q2, dout2 = k.copy(), v.copy(), q.copy(), dout.copy()
    for x in (k2, v2, q2, dout2):
        x[:, :, t:] = GARBAGE[garbage]
    after = run_backward(backend, q2, k2, v2, dout2, causal=causal)
    _unchanged(before[0][:, :, :t], after[0][:, :, :t], backend, garbage)  # dq of the past


@pytest.mark.parametrize("garbage", list(GARBAGE))
@pytest.mark.parametrize("backend", BACKENDS)
def test_queries_that_see_no_key_are_never_read(backend, garbage, run_backward):
    """NaN in the q and dout rows of a query that sees nothing: dq = 0 there, no bit moves."""
    q, k, v, dout = _qkv()
    mask = np.random.default_rng(5).random((2, 4, 40, 40)) < 0.6
    empty = np.zeros((2, 4, 40), bool)
    empty[:, :, ::4] = True
    empty[1, 2, 30:] = True
    mask[empty] = False
    before = run_backward(backend, q, k, v, dout, mask=mask, causal=True)
    q2, dout2 = q.copy(), dout.copy()
    q2[empty] = GARBAGE[garbage]
    dout2[empty] = GARBAGE[garbage]
    after = run_backward(backend, q2, k, v, dout2, mask=mask, causal=True)
    for b, a in zip(before, after, strict=True):
        _unchanged(b, a, backend, garbage)
    assert (after[0][empty] == 0).all()


@pytest.mark.parametrize("backend", ["reference", "numba"])
def test_nan_at_a_visible_position_reaches_the_gradients(backend):
    rng = np.random.default_rng(3)
    q, k, v = (rng.standard_normal((1, 1, 6, 4)) for _ in range(3))
    k[0, 0, 2] = np.nan
    dq, dk, dv = kernels.attention_backward(q, k, v, np.ones((1, 1, 6, 4)), causal=True,
                                            backend=backend)
    assert np.isfinite(dq[0, 0, :2]).all() and np.isnan(dq[0, 0, 2:]).all()


# --- dropout, threads, bad input ----------------------------------------------------------

@pytest.mark.parametrize("backend", ["reference", "numba"])
def test_dropout_drops_the_weights_the_forward_dropped(backend):
    """dv = (P ∘ Z / (1 - p))ᵀ dout with the forward's weights P and the shared keep mask Z."""
    rng = np.random.default_rng(7)
    q, k, v = (rng.standard_normal((2, 3, 9, 5)) for _ in range(3))
    dout = rng.standard_normal((2, 3, 9, 5))
    p, seed = 0.4, 77
    _, weights = kernels.attention(q, k, v, return_weights=True, backend="reference")
    keep = keep_mask(seed, p, (2, 3, 9, 9))
    expected_dv = np.swapaxes(weights * keep / (1 - p), -1, -2) @ dout
    _, _, dv = kernels.attention_backward(q, k, v, dout, dropout_p=p, seed=seed,
                                          backend=backend)
    np.testing.assert_allclose(dv, expected_dv, rtol=1e-10, atol=1e-12)
    _, _, dv_other = kernels.attention_backward(q, k, v, dout, dropout_p=p, seed=seed + 1,
                                                backend=backend)
    assert not np.allclose(dv_other, dv)


def test_concurrent_calls_from_a_thread_pool(monkeypatch):
    monkeypatch.setattr(config, "BACKWARD_SERIAL_WORK_LIMIT", 0)
    problems_ = []
    for seed in range(6):
        q, k, v, kwargs = make_inputs(Case("x", B=2, H=4, Hkv=2, Lq=70, Lk=90, D=16,
                                           causal=True, mask="bool"), np.float32, seed)
        problems_.append((q, k, v, make_dout(q, v, seed), kwargs))

    def grads(item):
        q, k, v, dout, kwargs = item
        return kernels.attention_backward(q, k, v, dout, backend="numba", **kwargs)

    alone = [grads(item) for item in problems_]
    with ThreadPoolExecutor(4) as pool:
        together = list(pool.map(grads, problems_ * 2))
    for a, b in zip(alone * 2, together, strict=True):
        for x, y in zip(a, b, strict=True):
            np.testing.assert_array_equal(x, y)


def _bad_input_cases():
    q = np.ones((2, 3, 5, 4), np.float32)
    kv = np.ones((2, 3, 6, 4), np.float32)
    good = dict(q=q, k=kv, v=kv, dout=np.ones((2, 3, 5, 4), np.float32))
    return [
        ("dout float64", dict(good, dout=good["dout"].astype(np.float64)), TypeError, "dout"),
        ("dout shape", dict(good, dout=np.ones((2, 3, 6, 4), np.float32)), ValueError, "dout"),
        ("dout missing head", dict(good, dout=np.ones((2, 5, 4), np.float32)), ValueError,
         "dout"),
        ("out shape", dict(good, out=np.ones((2, 3, 5, 3), np.float32)), ValueError, "out"),
        ("out dtype", dict(good, out=np.ones((2, 3, 5, 4))), TypeError, "out"),
        ("lse shape", dict(good, lse=np.ones((2, 3, 5, 1), np.float32)), ValueError, "lse"),
        ("lse of keys", dict(good, lse=np.ones((2, 3, 6), np.float32)), ValueError, "lse"),
        ("lse dtype", dict(good, lse=np.ones((2, 3, 5), np.float64)), TypeError, "lse"),
        ("q int", dict(good, q=np.ones((2, 3, 5, 4), int)), TypeError, "q"),
        ("mask shape", dict(good, mask=np.ones((4, 4), bool)), ValueError, "mask"),
        ("backend", dict(good, backend="tpu"), ValueError, "backend"),
    ]


@pytest.mark.parametrize("args, error, name", [c[1:] for c in _bad_input_cases()],
                         ids=[c[0] for c in _bad_input_cases()])
def test_bad_input_names_the_argument(args, error, name):
    args = dict(args)
    q, k, v, dout = (args.pop(n) for n in ("q", "k", "v", "dout"))
    with pytest.raises(error, match=name):
        kernels.attention_backward(q, k, v, dout, **args)
