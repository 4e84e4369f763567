"""Attention sinks (issue 24): a logit per query head in every row's denominator.

- the reference against the literal formula: the sink as one more column of scores, the
  softmax taken, the column dropped;
- every fast backend against the oracle under the baseline-relative tolerance (the oracle
  machinery evaluates the reference with the problem's sinks), over mask kinds, GQA/MQA,
  dropout, mods;
- the empty row (out 0, lse = sink), dsinks against finite differences of the reference,
  dq, dk, dv, dsinks of the fast backends against the oracle's;
- NaN stored where a row cannot see changes no bit; bad ``sinks`` raise naming it.
"""

from __future__ import annotations

import numpy as np
import pytest

from attnbench import kernels
from attnbench.kernels._dtypes import as_dtype
from attnbench.kernels.reference.backward import run_backward
from attnbench.measure.grad_oracle import lse_rounding
from attnbench.measure.oracle import oracle_dtype, tolerance

from .support import COMPARISONS, Case, assert_matches_reference, make_inputs, max_error

BACKENDS = ["numba", "cuda"]


def _sinks(H, dtype, seed=0, spread=2.0):
    return (np.random.default_rng(seed + 7).standard_normal(H) * spread).astype(dtype)


def _literal(q, k, v, sinks, causal=False, scale=None):
    """The sink as an extra column of scores (float64): ``(out, lse)``."""
    q, k, v = (x.astype(np.float64) for x in (q, k, v))
    H, Hkv = q.shape[-3], k.shape[-3]
    k = np.repeat(k, H // Hkv, axis=-3)
    v = np.repeat(v, H // Hkv, axis=-3)
    scale = 1 / np.sqrt(q.shape[-1]) if scale is None else scale
    s = q @ k.swapaxes(-1, -2) * scale  # (..., H, Lq, Lk)
    Lq, Lk = s.shape[-2:]
    if causal:
        offset = 0 if causal is True else Lk - Lq
        s = np.where(np.arange(Lk)[None] <= np.arange(Lq)[:, None] + offset, s, -np.inf)
    column = np.broadcast_to(sinks.astype(np.float64)[:, None, None], s.shape[:-1] + (1,))
    ext = np.concatenate([s, column], axis=-1)
    m = ext.max(axis=-1, keepdims=True)
    p = np.exp(ext - m)
    lse = np.log(p.sum(axis=-1)) + m[..., 0]
    p /= p.sum(axis=-1, keepdims=True)
    return p[..., :-1] @ v, lse


@pytest.mark.parametrize("causal", [False, True, "bottom-right"])
@pytest.mark.parametrize("sizes", [(2, 4, 2, 9, 13, 8), (1, 3, 1, 13, 5, 5)],
                         ids=["gqa", "mqa-lq>lk"])
def test_reference_is_the_extra_column_formula(sizes, causal):
    B, H, Hkv, Lq, Lk, D = sizes
    rng = np.random.default_rng(1)
    q = rng.standard_normal((B, H, Lq, D))
    k = rng.standard_normal((B, Hkv, Lk, D))
    v = rng.standard_normal((B, Hkv, Lk, D))
    sinks = _sinks(H, np.float64)
    out, lse = kernels.attention(q, k, v, causal=causal, sinks=sinks, return_lse=True,
                                 backend="reference")
    want_out, want_lse = _literal(q, k, v, sinks, causal)
    np.testing.assert_allclose(out, want_out, rtol=1e-12, atol=1e-13)
    np.testing.assert_allclose(lse, want_lse, rtol=1e-12, atol=1e-13)


CASES = [
    Case("plain", B=2, H=4, Lq=17, D=16),
    Case("gqa-causal-cross", B=1, H=4, Hkv=2, Lq=19, Lk=33, D=8, causal="bottom-right"),
    Case("mqa-top-left", B=2, H=3, Hkv=1, Lq=21, Lk=11, D=59, causal=True),
    Case("bool-mask", B=2, H=2, Lq=13, Lk=29, D=8, mask="bool"),
    Case("empty-rows", B=1, H=2, Lq=12, Lk=20, D=8, mask="empty-rows"),
    Case("key-lengths-zero", B=2, H=2, Lq=9, D=8, key_lengths="with-zero"),
    Case("dropout", B=1, H=2, Lq=23, D=16, dropout_p=0.25, causal=True),
    Case("unscaled", B=1, H=2, Lq=15, Lk=31, D=32, scale=1.0),
]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
@pytest.mark.parametrize("backend", BACKENDS)
def test_forward_matches_the_oracle(backend, case, dtype):
    if backend == "cuda" and (case.Lq > 16 or dtype == np.float64 and case.name != "plain"):
        pytest.skip("the CUDA simulator: a few small cases")
    q, k, v, kwargs = make_inputs(case, dtype)
    sinks = _sinks(case.H, dtype, spread=4.0 if case.scale == 1.0 else 2.0)
    assert_matches_reference(q, k, v, backend, sinks=sinks, **kwargs)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("backend", ["reference", "numba"])
def test_half_inputs_keep_a_float32_lse(backend, dtype):
    """Half q, k, v and sinks: out in the half dtype within the half tolerance, lse float32
    (the sink merge once gave the numba backend a half lse)."""
    dtype = as_dtype(dtype)
    case = Case("gqa-causal-cross", B=1, H=4, Hkv=2, Lq=19, Lk=33, D=8, causal="bottom-right")
    q, k, v, kwargs = make_inputs(case, dtype)
    sinks = _sinks(case.H, dtype)
    assert_matches_reference(q, k, v, backend, sinks=sinks, **kwargs)
    out, lse = kernels.attention(q, k, v, sinks=sinks, return_lse=True, backend=backend,
                                 **kwargs)
    want = _literal(q, k, v, sinks, causal="bottom-right")[1]
    assert out.dtype == dtype and lse.dtype == np.float32
    np.testing.assert_allclose(lse, want, rtol=4 * np.finfo(np.float32).eps, atol=1e-6)


@pytest.mark.parametrize("backend", ["reference"] + BACKENDS)
def test_a_row_that_sees_no_key_gets_zero_and_its_sink(backend):
    q, k, v, kwargs = make_inputs(Case(B=2, H=2, Lq=6, D=8, key_lengths="with-zero"),
                                  np.float32)
    sinks = np.array([0.5, -3.0], np.float32)
    out, lse = kernels.attention(q, k, v, sinks=sinks, return_lse=True, backend=backend,
                                 **kwargs)
    assert (out[0] == 0).all()  # batch 0 sees no key
    np.testing.assert_array_equal(lse[0], np.broadcast_to(sinks[:, None], (2, 6)))


def test_mods_and_sinks_on_numba():
    q, k, v, _ = make_inputs(Case(B=1, H=4, Lq=37, D=16), np.float32)
    sinks = _sinks(4, np.float32)
    slopes = np.linspace(0.1, 0.5, 4)
    assert_matches_reference(q, k, v, "numba", sinks=sinks,
                             score_mod=kernels.mods.alibi(slopes),
                             mask_mod=kernels.mods.sliding_window(5))


# --- the backward ------------------------------------------------------------------------


def _grad_oracle(q, k, v, dout, **kwargs):
    problem = kernels.prepare(q, k, v, **kwargs)
    B, H, _, Lq, _, _, Dv = problem.shape
    dout4 = dout.reshape(B, H, Lq, Dv)
    exact = run_backward(problem, dout4, compute_dtype=oracle_dtype(q.dtype),
                         keep_precision=True)
    plain = run_backward(problem, dout4, compute_dtype=q.dtype)
    return exact, plain


def _assert_gradients(backend, q, k, v, sinks, pass_forward=True, **kwargs):
    dout = np.random.default_rng(5).standard_normal(q.shape[:-1] + v.shape[-1:]).astype(q.dtype)
    exact, plain = _grad_oracle(q, k, v, dout, sinks=sinks, **kwargs)
    out, lse = kernels.attention(q, k, v, sinks=sinks, return_lse=True, backend=backend,
                                 **kwargs)
    extra = dict(out=out, lse=lse) if pass_forward else {}
    grads = kernels.attention_backward(q, k, v, dout, sinks=sinks, backend=backend, **extra,
                                       **kwargs)
    assert len(grads) == 4
    for name, g, e, p in zip(("dq", "dk", "dv", "dsinks"), grads, exact, plain, strict=True):
        assert g.dtype == q.dtype and g.shape == e.shape, name
        err = max_error(g, e)
        tol = tolerance(e, p, q.dtype) + lse_rounding(e, lse)
        assert err <= tol, f"{backend} {name}: error {err:.3g} > tolerance {tol:.3g}"
        COMPARISONS.append((f"{backend}-bwd", np.dtype(q.dtype).name, err, tol))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("case", [CASES[1], CASES[2], CASES[4], CASES[6]],
                         ids=lambda c: c.name)
def test_numba_gradients_match_the_oracle(case, dtype):
    q, k, v, kwargs = make_inputs(case, dtype)
    _assert_gradients("numba", q, k, v, _sinks(case.H, dtype), **kwargs)


def test_numba_gradients_recompute_the_forward():
    q, k, v, kwargs = make_inputs(CASES[0], np.float32)
    _assert_gradients("numba", q, k, v, _sinks(4, np.float32), pass_forward=False, **kwargs)


def test_cuda_gradients_match_the_oracle():
    q, k, v, kwargs = make_inputs(Case(B=1, H=2, Hkv=1, Lq=7, Lk=9, D=8,
                                       causal="bottom-right"), np.float32)
    _assert_gradients("cuda", q, k, v, _sinks(2, np.float32), **kwargs)


@pytest.mark.parametrize("causal", [True, "bottom-right"])
def test_dsinks_is_the_finite_difference_of_the_reference(causal):
    q, k, v, kwargs = make_inputs(Case(B=2, H=3, Lq=6, Lk=4, D=5, causal=causal), np.float64)
    sinks = _sinks(3, np.float64)
    dout = np.random.default_rng(3).standard_normal((2, 3, 6, 5))
    *_, dsinks = kernels.attention_backward(q, k, v, dout, sinks=sinks, backend="reference",
                                            **kwargs)

    def loss(s):
        return float((kernels.attention(q, k, v, sinks=s, backend="reference", **kwargs)
                      * dout).sum())

    eps = 1e-6
    fd = [(loss(sinks + eps * e) - loss(sinks - eps * e)) / (2 * eps) for e in np.eye(3)]
    np.testing.assert_allclose(dsinks, fd, rtol=1e-6, atol=1e-8)
    # and through q: the sinks change dq as the extra column's softmax says
    dq = kernels.attention_backward(q, k, v, dout, sinks=sinks, backend="reference",
                                    **kwargs)[0]
    probe = np.zeros_like(q)
    probe[1, 2, 3, 1] = 1.0
    fd_q = (float((kernels.attention(q + eps * probe, k, v, sinks=sinks, backend="reference",
                                     **kwargs) * dout).sum())
            - float((kernels.attention(q - eps * probe, k, v, sinks=sinks,
                                       backend="reference", **kwargs) * dout).sum())) / (2 * eps)
    np.testing.assert_allclose(dq[1, 2, 3, 1], fd_q, rtol=1e-6, atol=1e-8)


@pytest.mark.parametrize("backend", ["numba", "reference"])
def test_nan_where_nothing_reads_it_changes_no_bit(backend):
    """NaN in hidden keys and values, and in the q and dout rows of a query that sees no
    key (batch 0, key_lengths 0), changes no bit of out, lse, dq, dk, dv or dsinks."""
    q, k, v, _ = make_inputs(Case(B=2, H=2, Lq=20, D=8), np.float32)
    kwargs = dict(key_lengths=np.array([0, 13]), sinks=_sinks(2, np.float32))
    dout = np.random.default_rng(2).standard_normal(q.shape).astype(np.float32)

    def run(q, k, v, dout):
        out, lse = kernels.attention(q, k, v, return_lse=True, backend=backend, **kwargs)
        return (out, lse) + kernels.attention_backward(q, k, v, dout, out=out, lse=lse,
                                                       backend=backend, **kwargs)

    before = run(q, k, v, dout)
    q2, k2, v2, d2 = q.copy(), k.copy(), v.copy(), dout.copy()
    k2[:, :, 13:] = np.nan
    v2[:, :, 13:] = np.nan
    k2[0], v2[0] = np.nan, np.nan
    q2[0], d2[0] = np.nan, np.nan
    after = run(q2, k2, v2, d2)
    for name, a, b in zip(("out", "lse", "dq", "dk", "dv", "dsinks"), before, after,
                          strict=True):
        if name in ("dk", "dv"):  # hidden keys get gradient 0 either way
            a, b = a[:, :, :13], b[:, :, :13]
        if backend == "reference":
            np.testing.assert_allclose(b, a, rtol=1e-6, atol=1e-6, err_msg=name)
        else:
            np.testing.assert_array_equal(b, a, err_msg=name)


def test_plain_call_is_unchanged_by_the_feature():
    q, k, v, kwargs = make_inputs(CASES[1], np.float32)
    plain = kernels.attention(q, k, v, backend="numba", **kwargs)
    np.testing.assert_array_equal(plain, kernels.attention(q, k, v, backend="numba",
                                                           sinks=None, **kwargs))


@pytest.mark.parametrize("sinks, error, words", [
    (np.zeros(3, np.float32), ValueError, "sinks has shape"),
    (np.zeros((1, 2), np.float32), ValueError, "sinks has shape"),
    (np.zeros(2, np.float64), TypeError, "sinks has dtype"),
    (np.array([0.0, np.nan], np.float32), ValueError, "sinks must be finite"),
    (np.array([0.0, np.inf], np.float32), ValueError, "sinks must be finite"),
])
def test_bad_sinks_raise_naming_them(sinks, error, words):
    q = np.zeros((1, 2, 4, 8), np.float32)
    with pytest.raises(error, match=words):
        kernels.attention(q, q, q, sinks=sinks)
    with pytest.raises(error, match=words):
        kernels.attention_backward(q, q, q, q, sinks=sinks)


def test_torch_parity():
    torch = pytest.importorskip("torch")
    q, k, v, _ = make_inputs(Case(B=2, H=4, Lq=11, Lk=14, D=8), np.float64)
    sinks = _sinks(4, np.float64)
    tq, tk, tv = (torch.from_numpy(x) for x in (q, k, v))
    s = tq @ tk.transpose(-1, -2) / np.sqrt(8)
    column = torch.from_numpy(sinks)[None, :, None, None].expand(2, 4, 11, 1)
    p = torch.softmax(torch.cat([s, column], dim=-1), dim=-1)[..., :-1]
    want = (p @ tv).numpy()
    out = kernels.attention(q, k, v, sinks=sinks, backend="numba")
    np.testing.assert_allclose(out, want, rtol=1e-10, atol=1e-12)
