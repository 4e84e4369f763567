"""Score and mask functions (``kernels.mods``) in ``return_lse`` and ``attention_backward``.

- the forward's log-sum-exp with mods, numba against the reference;
- the float64 reference backward against central finite differences of the reference
  forward, with every built-in;
- the numba backward against the oracle with the tolerance of ``tests/backward_support.py``
  (serial and parallel kernels, the BLAS and the loops);
- perturbation: NaN in keys and values hidden by a mask function changes no gradient bit;
- a user score function without a derivative is refused before any work, by name.

Each new function *structure* compiles the kernels once (~10-20 s): the cases share a few.
"""

from __future__ import annotations

import numpy as np
import pytest

from attnbench import kernels
from attnbench.kernels import mods
from attnbench.kernels.numba_cpu import config

from .backward_support import (
    assert_gradients_match,
    assert_lse_matches,
    assert_matches_finite_differences,
    make_dout,
)
from .support import DTYPES, assert_matches_reference

SLOPES = np.array([0.5, 0.25, 0.125, 0.0625])
TABLE = np.random.default_rng(7).standard_normal((4, 7))
DOCS = np.array([[0, 0, 0, 1, 1, 2, 2, 2, 2, 2, 3, 3, 3], [0, 1, 1, 1, 1, 1, 1, 4, 4, 4, 4, 4, 5]])


def _qkv(B=2, H=4, Hkv=2, Lq=13, Lk=None, D=3, Dv=None, dtype=np.float64, seed=0):
    rng = np.random.default_rng(seed)
    Lk = Lq if Lk is None else Lk
    Dv = D if Dv is None else Dv
    return (rng.standard_normal((B, H, Lq, D)).astype(dtype),
            rng.standard_normal((B, Hkv, Lk, D)).astype(dtype),
            rng.standard_normal((B, Hkv, Lk, Dv)).astype(dtype))


def _softcap_user(score, b, h, q_idx, kv_idx, cap):
    return cap[0] * np.tanh(score / cap[0])


def _softcap_user_grad(score, b, h, q_idx, kv_idx, cap):
    t = np.tanh(score / cap[0])
    return 1 - t * t


# --- the forward's log-sum-exp -------------------------------------------------------------


LSE_CASES = [
    ("window causal", dict(mask_mod=mods.sliding_window(3), causal=True)),
    ("document softcap", dict(mask_mod=mods.document(DOCS), score_mod=mods.softcap(0.9))),
    ("alibi key_lengths", dict(score_mod=mods.alibi(SLOPES), key_lengths=[13, 0])),
]


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("name, kwargs", LSE_CASES, ids=[c[0] for c in LSE_CASES])
def test_numba_lse_with_mods_matches_the_reference(name, kwargs, dtype):
    q, k, v = _qkv(dtype=dtype)
    assert_lse_matches(q, k, v, "numba", **kwargs)
    assert_matches_reference(q, k, v, "numba", **kwargs)


# --- finite differences of the reference ---------------------------------------------------


FD_MODS = [
    ("alibi", dict(score_mod=mods.alibi(SLOPES))),
    ("softcap", dict(score_mod=mods.softcap(0.7))),
    ("relative_bias", dict(score_mod=mods.relative_bias(TABLE))),
    ("chain", dict(score_mod=mods.chain(mods.alibi(SLOPES), mods.softcap(1.1)))),
    ("user score with grad", dict(score_mod=mods.score_mod(
        _softcap_user, np.array([0.8]), grad=_softcap_user_grad))),
    ("sliding_window + softcap", dict(mask_mod=mods.sliding_window(2, 1),
                                      score_mod=mods.softcap(0.9))),
    ("prefix_lm causal", dict(mask_mod=mods.prefix_lm([4, 0]), causal=True)),
    ("document + relative_bias, dropout", dict(mask_mod=mods.document(DOCS[:, :6]),
                                               score_mod=mods.relative_bias(TABLE),
                                               dropout_p=0.3, seed=4)),
]


@pytest.mark.parametrize("name, kwargs", FD_MODS, ids=[c[0] for c in FD_MODS])
def test_reference_gradient_with_mods_matches_finite_differences(name, kwargs):
    """Relative error of the float64 reference against central differences <= 1e-6."""
    q, k, v = _qkv(B=2, H=4, Hkv=2, Lq=6, D=2, Dv=2, seed=3)
    assert_matches_finite_differences(q, k, v, make_dout(q, v, seed=3), **kwargs)


# --- the numba backward against the oracle -------------------------------------------------


NUMBA_CASES = [
    # (name, dtypes, shape, keywords): few structures, each compiles the kernels once
    ("window causal + alibi/softcap", DTYPES, dict(Lq=150, D=8),
     dict(mask_mod=mods.sliding_window(70), causal=True,
          score_mod=mods.chain(mods.alibi(SLOPES), mods.softcap(2.0)))),
    ("document + softcap, GQA, dropout, key_lengths", (np.float32,), dict(Lq=13, D=3, Dv=5),
     dict(mask_mod=mods.document(DOCS), score_mod=mods.softcap(0.9), dropout_p=0.25, seed=9,
          key_lengths=[13, 8])),
    ("prefix_lm + relative_bias, bool mask, bottom-right", (np.float32,),
     dict(Lq=9, Lk=15, D=4),
     dict(mask_mod=mods.prefix_lm([3, 0]), score_mod=mods.relative_bias(TABLE),
          mask=np.random.default_rng(2).random((9, 15)) > 0.3, causal="bottom-right")),
    ("user score with grad, float mask", (np.float32,), dict(Lq=11, D=4),
     dict(score_mod=mods.score_mod(_softcap_user, np.array([0.8]), grad=_softcap_user_grad),
          mask=np.where(np.random.default_rng(5).random((11, 11)) > 0.3, 0.5, -np.inf))),
]


@pytest.fixture
def serial(monkeypatch):
    """Small problems run the serial kernel anyway; make that explicit."""
    monkeypatch.setattr(config, "BACKWARD_SERIAL_WORK_LIMIT", float("inf"))


@pytest.mark.parametrize("name, dtypes, shape, kwargs", NUMBA_CASES,
                         ids=[c[0] for c in NUMBA_CASES])
def test_numba_backward_with_mods_matches_the_oracle(serial, name, dtypes, shape, kwargs):
    for dtype in dtypes:
        q, k, v = _qkv(dtype=dtype, **shape)
        assert_gradients_match(q, k, v, "numba", **kwargs)


def test_numba_backward_with_mods_without_blas(serial, monkeypatch):
    """The loops that replace the BLAS where SciPy is missing."""
    monkeypatch.setattr(config, "HAVE_BLAS", False)
    name, _, shape, kwargs = NUMBA_CASES[0]
    assert_gradients_match(*_qkv(dtype=np.float32, **shape), "numba", **kwargs)


def test_numba_backward_with_mods_parallel_kernel(monkeypatch):
    """The parallel kernel (several chunks of key blocks per (batch, kv head))."""
    monkeypatch.setattr(config, "BACKWARD_SERIAL_WORK_LIMIT", 0)
    q, k, v = _qkv(B=1, Lq=150, D=8, dtype=np.float32)
    name, _, _, kwargs = NUMBA_CASES[0]
    assert_gradients_match(q, k, v, "numba", pass_forward=False, **kwargs)


def test_window_backward_skips_the_tiles_it_hides(serial):
    """Keys far left of the window hold NaN: the gradients of the queries and keys that
    never meet them change no bit."""
    q, k, v = _qkv(B=1, Lq=200, D=8, dtype=np.float32)
    dout = make_dout(q, v)
    kw = dict(NUMBA_CASES[0][3], mask_mod=mods.sliding_window(10))
    out, lse = kernels.attention(q, k, v, backend="numba", return_lse=True, **kw)
    before = kernels.attention_backward(q, k, v, dout, out=out, lse=lse, backend="numba", **kw)
    # keys 0..63 are seen only by queries 0..73; queries 128.. see only keys >= 118
    k2, v2 = k.copy(), v.copy()
    k2[:, :, :64] = np.nan
    v2[:, :, :64] = np.nan
    after = kernels.attention_backward(q, k2, v2, dout, out=out, lse=lse, backend="numba", **kw)
    np.testing.assert_array_equal(after[0][:, :, 128:], before[0][:, :, 128:])  # dq
    for name, a, b in zip(("dk", "dv"), after[1:], before[1:], strict=True):
        np.testing.assert_array_equal(a[:, :, 128:], b[:, :, 128:], err_msg=name)


@pytest.mark.parametrize("garbage", [np.nan, np.inf], ids=["nan", "inf"])
def test_keys_hidden_by_a_mask_function_reach_no_gradient(serial, garbage):
    """Keys of other documents hold garbage: no gradient of the rows that cannot see them
    changes, and the garbage keys get dk = dv = 0 from those rows."""
    q, k, v = _qkv(B=2, H=2, Hkv=1, Lq=13, D=4, dtype=np.float32)
    dout = make_dout(q, v)
    kw = dict(mask_mod=mods.document(DOCS), score_mod=mods.softcap(1.5))
    out, lse = kernels.attention(q, k, v, backend="numba", return_lse=True, **kw)
    before = kernels.attention_backward(q, k, v, dout, out=out, lse=lse, backend="numba", **kw)
    k2, v2 = k.copy(), v.copy()
    k2[0, :, DOCS[0] != 2] = garbage
    v2[0, :, DOCS[0] != 2] = garbage
    after = kernels.attention_backward(q, k2, v2, dout, out=out, lse=lse, backend="numba", **kw)
    rows = DOCS[0] == 2
    np.testing.assert_array_equal(after[0][0, :, rows], before[0][0, :, rows])  # dq
    for a, b in zip(after[1:], before[1:], strict=True):
        np.testing.assert_array_equal(a[0, :, rows], b[0, :, rows])  # dk, dv of document 2
        np.testing.assert_array_equal(a[1], b[1])  # batch 1 untouched


def test_user_score_without_grad_is_refused_by_name_before_any_work():
    q, k, v = _qkv(Lq=5, D=2, dtype=np.float32)
    no_grad = mods.score_mod(_softcap_user, np.array([0.8]))
    for backend in ("reference", "numba"):
        with pytest.raises(ValueError, match=r"score_mod '_softcap_user' has no derivative"):
            kernels.attention_backward(q, k, v, make_dout(q, v), backend=backend,
                                       score_mod=no_grad)
