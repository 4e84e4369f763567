"""The reference's own definitions of the built-in mods against the kernels' compiled ones.

The reference evaluates every built-in score and mask function from its formula
(:mod:`kernels.reference.formulas`), not with the element, tile and derivative functions the
numba and cuda kernels compile.  Here each compiled function is held against that
definition, and the oracle is shown not to call the compiled ones: a mistake planted in a
compiled derivative is caught by the ordinary differential test of the backward.
"""

from __future__ import annotations

import numpy as np
import pytest

from attnbench import kernels
from attnbench.kernels import mods
from attnbench.kernels.reference import formulas as reference_mods

from .support import tolerance

B, H, Lq, Lk = 2, 3, 45, 70


def _ids(L, cuts):
    return np.searchsorted(np.asarray(cuts), np.arange(L), side="right")


# name, mask function, (Lq, Lk) it is evaluated on
MASKS = [
    ("window causal", mods.sliding_window(7), (Lq, Lk)),
    ("window both sides", mods.sliding_window(3, 11), (Lq, Lk)),
    ("window wider than L", mods.sliding_window(500, 2), (Lq, Lk)),
    ("prefix scalar", mods.prefix_lm(9), (Lq, Lk)),
    ("prefix per batch", mods.prefix_lm([0, 31]), (Lq, Lk)),
    ("documents shared", mods.document(_ids(50, [13, 14, 40])), (50, 50)),
    ("documents per batch", mods.document(np.stack([_ids(50, [25]), _ids(50, [3, 9])])),
     (50, 50)),
    ("and", mods.and_masks(mods.sliding_window(20), mods.prefix_lm(5)), (Lq, Lk)),
    ("or", mods.or_masks(mods.sliding_window(2), mods.prefix_lm([4, 17])), (Lq, Lk)),
    ("block mask of a window", mods.block_mask(mods.sliding_window(9, 4), B, H, Lq, Lk,
                                               cell_q=8, cell_k=16), (Lq, Lk)),
]


def _literal_visible(name, Lq_, Lk_):
    """The same masks written out once more, pair by pair, as their docstrings state them."""
    ids1 = _ids(50, [13, 14, 40])
    ids2 = np.stack([_ids(50, [25]), _ids(50, [3, 9])])
    rule = {
        "window causal": lambda b, i, j: i - 7 <= j <= i,
        "window both sides": lambda b, i, j: i - 3 <= j <= i + 11,
        "window wider than L": lambda b, i, j: j <= i + 2,
        "prefix scalar": lambda b, i, j: j < 9 or j <= i,
        "prefix per batch": lambda b, i, j: j < [0, 31][b] or j <= i,
        "documents shared": lambda b, i, j: ids1[i] == ids1[j],
        "documents per batch": lambda b, i, j: ids2[b, i] == ids2[b, j],
        "and": lambda b, i, j: (i - 20 <= j <= i) and (j < 5 or j <= i),
        "or": lambda b, i, j: (i - 2 <= j <= i) or (j < [4, 17][b] or j <= i),
        "block mask of a window": lambda b, i, j: i - 9 <= j <= i + 4,
    }[name]
    out = np.zeros((B, H, Lq_, Lk_), dtype=bool)
    for b in range(B):
        for i in range(Lq_):
            for j in range(Lk_):
                out[b, :, i, j] = rule(b, i, j)
    return out


@pytest.mark.parametrize("name, mod, shape", MASKS, ids=[m[0] for m in MASKS])
def test_reference_masks_are_their_formulas(name, mod, shape):
    np.testing.assert_array_equal(reference_mods.visible(mod, B, H, *shape),
                                  _literal_visible(name, *shape))


@pytest.mark.parametrize("name, mod, shape", MASKS, ids=[m[0] for m in MASKS])
def test_compiled_mask_elements_equal_the_reference(name, mod, shape):
    np.testing.assert_array_equal(mod.dense(B, H, *shape),
                                  reference_mods.visible(mod, B, H, *shape))


ANALYTIC = [m for m in MASKS if not isinstance(m[1], mods.BlockMask)]  # a block mask's
# cells are fixed when it is built


@pytest.mark.parametrize("cell", [(1, 1), (8, 8), (7, 13), (64, 64)], ids=str)
@pytest.mark.parametrize("name, mod, shape", ANALYTIC, ids=[m[0] for m in ANALYTIC])
def test_compiled_tile_classes_agree_with_the_reference(name, mod, shape, cell):
    """A cell the compiled tile function calls EMPTY has no visible pair in the reference,
    one it calls FULL has no hidden pair; single pairs (1 x 1 cells) are classified exactly."""
    visible = reference_mods.visible(mod, B, H, *shape)
    table = mods.block_mask(mod, B, H, *shape, cell_q=cell[0], cell_k=cell[1]).table
    for (b, h, ci, cj), cls in np.ndenumerate(table):
        pairs = visible[b if table.shape[0] > 1 else 0, h if table.shape[1] > 1 else 0,
                        ci * cell[0]:(ci + 1) * cell[0], cj * cell[1]:(cj + 1) * cell[1]]
        where = f"{name}: cell {(b, h, ci, cj)}"
        if cls == mods.EMPTY:
            assert not pairs.any(), f"{where} is EMPTY but has visible pairs"
        elif cls == mods.FULL:
            assert pairs.all(), f"{where} is FULL but has hidden pairs"
        elif cell == (1, 1):
            pytest.fail(f"{where}: a single pair classified PARTIAL")


SLOPES = np.array([0.5, -0.25, 2.0])
TABLE = np.random.default_rng(1).standard_normal((H, 9))
# name, score function, its formula f(s, i, j) with h along axis 1, its derivative
SCORES = [
    ("alibi", mods.alibi(SLOPES), lambda s, i, j: s + SLOPES[None, :, None, None] * (j - i),
     lambda s, i, j: np.ones_like(s)),
    ("softcap", mods.softcap(2.5), lambda s, i, j: 2.5 * np.tanh(s / 2.5),
     lambda s, i, j: 1 - np.tanh(s / 2.5) ** 2),
    ("relative_bias", mods.relative_bias(TABLE),
     lambda s, i, j: s + TABLE[:, np.clip(j - i, -4, 4)[0, 0] + 4][None],
     lambda s, i, j: np.ones_like(s)),
    ("chain softcap, alibi", mods.chain(mods.softcap(3.0), mods.alibi(SLOPES)),
     lambda s, i, j: 3.0 * np.tanh(s / 3.0) + SLOPES[None, :, None, None] * (j - i),
     lambda s, i, j: 1 - np.tanh(s / 3.0) ** 2),
    ("chain alibi, softcap", mods.chain(mods.alibi(SLOPES), mods.softcap(1.5)),
     lambda s, i, j: 1.5 * np.tanh((s + SLOPES[None, :, None, None] * (j - i)) / 1.5),
     lambda s, i, j: 1 - np.tanh((s + SLOPES[None, :, None, None] * (j - i)) / 1.5) ** 2),
]


def _scores(dtype):
    s = 4 * np.random.default_rng(0).standard_normal((B, H, Lq, Lk))
    return s.astype(dtype)


def _ij():
    return np.arange(Lq)[None, None, :, None], np.arange(Lk)[None, None, None, :]


@pytest.mark.parametrize("name, mod, f, df", SCORES, ids=[s[0] for s in SCORES])
def test_reference_scores_are_their_formulas(name, mod, f, df):
    s = _scores(np.float64)
    np.testing.assert_allclose(reference_mods.scores(mod, s), f(s, *_ij()), rtol=1e-14,
                               atol=1e-14)
    np.testing.assert_allclose(reference_mods.score_grads(mod, s), df(s, *_ij()),
                               rtol=1e-13, atol=1e-14)


@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("name, mod, f, df", SCORES, ids=[s[0] for s in SCORES])
def test_compiled_scores_and_derivatives_equal_the_reference(name, mod, f, df, dtype):
    """Within a few ulps of the scores' dtype (the compiled tanh may round differently)."""
    s = _scores(dtype)
    eps = np.finfo(dtype).eps
    for what, compiled, ours in (("score", mod.dense(s, dtype), reference_mods.scores(mod, s)),
                                 ("derivative", mod.dense_grad(s),
                                  reference_mods.score_grads(mod, s))):
        assert compiled.dtype == s.dtype
        scale = max(1.0, float(np.abs(ours).max()))
        np.testing.assert_allclose(compiled, ours, rtol=0, atol=8 * eps * scale, err_msg=what)


def _problem(dtype=np.float64):
    rng = np.random.default_rng(3)
    q = rng.standard_normal((B, H, Lq, 8)).astype(dtype)
    k = rng.standard_normal((B, 1, Lk, 8)).astype(dtype)
    v = rng.standard_normal((B, 1, Lk, 8)).astype(dtype)
    return q, k, v, rng.standard_normal((B, H, Lq, 8)).astype(dtype)


def test_the_reference_never_calls_the_compiled_functions(monkeypatch):
    """Forward and backward of the reference with built-in mods, with the compiled dense
    evaluations of every mod (scores, derivatives, masks) replaced by a failure.  (Argument
    checking still compiles them once, to refuse a function that does not compile.)"""
    def compiled(*args, **kwargs):
        raise AssertionError("the reference called a compiled mod function")

    for cls in {type(m) for _, m, _ in MASKS} | {type(m) for _, m, _, _ in SCORES}:
        for method in ("dense", "dense_grad"):
            if hasattr(cls, method):
                monkeypatch.setattr(cls, method, compiled)
    q, k, v, dout = _problem()
    for _, mask, _shape in MASKS[:5] + MASKS[7:9]:
        for _, score, _, _ in SCORES:
            kw = dict(mask_mod=mask, score_mod=score, causal="bottom-right")
            kernels.attention(q, k, v, backend="reference", **kw)
            kernels.attention_backward(q, k, v, dout, backend="reference", **kw)


@pytest.mark.slow  # compiles a planted wrong kernel: left out of the quick lane
def test_a_wrong_compiled_derivative_is_caught_by_the_reference(monkeypatch):
    """softcap's compiled derivative replaced by ALiBi's (1): the numba backward follows it,
    the reference does not, and dq differs far beyond the tolerance."""
    q, k, v, dout = _problem(np.float32)
    planted = mods.softcap(0.5)
    monkeypatch.setattr(planted, "grad", mods.alibi(np.zeros(H)).grad)
    monkeypatch.setattr(planted, "cache_key", lambda part, dtype=np.float64: None)
    kw = dict(score_mod=planted, causal=True)
    exact = kernels.attention_backward(*(x.astype(np.float64) for x in (q, k, v, dout)),
                                       backend="reference", **kw)[0]
    plain = kernels.attention_backward(q, k, v, dout, backend="reference", **kw)[0]
    wrong = kernels.attention_backward(q, k, v, dout, backend="numba", **kw)[0]
    assert np.abs(wrong - exact).max() > 10 * tolerance(exact, plain, np.float32)
