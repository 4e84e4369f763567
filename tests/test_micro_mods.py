"""The micro-kernel path with mask and score functions (kernels/numba_cpu/dense/micro_mods.py).

Every case runs both ways of packing (a packing launch, or fused into the task loop),
which must agree bit for bit, and is judged against the float64 oracle under the
baseline-relative tolerance (tests/support.py).  Small blocks (16 query rows, cells of
one 16-key panel, tiles of two cells) make 150-key problems cross every edge: register
block row tails, panel and cell tails, runs of cells cut by EMPTY ones, FULL and PARTIAL
cells, the causal diagonal in both alignments, key lengths, GQA, Dv not a multiple of
``nr``.  Every distinct mod structure compiles the kernel once (~10 s), so the cases
share structures: each built-in appears once, combined with another.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from attnbench import kernels
from attnbench.kernels import mods
from attnbench.kernels.numba_cpu import choose, config
from attnbench.kernels.numba_cpu import planner as _microplan
from attnbench.kernels.numba_cpu.dense import micro, micro_mods
from attnbench.measure.oracle import tolerance

from .support import COMPARISONS, assert_lse_near_the_oracle, max_error, oracle
from .test_mods import _documents

F32, F64 = np.dtype(np.float32), np.dtype(np.float64)
BLOCK = {F32: micro.CONFIGS[F32][0], F64: micro.CONFIGS[F64][0]}  # (8, 16) and (4, 16)
SMALL = dict(block_q=16, block_k=32, cell_k=16)  # tiles of two cells of one panel


def _qkv(dtype=np.float32, B=2, H=4, Hkv=2, Lq=150, Lk=None, D=9, Dv=7, seed=0):
    rng = np.random.default_rng(seed)
    Lk = Lq if Lk is None else Lk
    return (rng.standard_normal((B, H, Lq, D)).astype(dtype),
            rng.standard_normal((B, Hkv, Lk, D)).astype(dtype),
            rng.standard_normal((B, Hkv, Lk, Dv)).astype(dtype))


def _run(q, k, v, blocks=SMALL, **kwargs):
    """``(out, lse)`` of the micro path, packed apart and fused: the two must be equal."""
    problem = kernels.prepare(q, k, v, **kwargs)
    block = BLOCK[problem.dtype]
    (out, lse), (fused, fused_lse) = (micro_mods.run(problem, block, fuse=fuse, **blocks)
                                      for fuse in (False, True))
    assert np.array_equal(out, fused, equal_nan=True)
    assert np.array_equal(lse, fused_lse, equal_nan=True)
    return problem.restore(out), lse


def _check(q, k, v, blocks=SMALL, **kwargs):
    """The micro path against the oracle, its output and its lse."""
    (exact, _), (plain, _) = oracle(q, k, v, **kwargs)
    out, lse = _run(q, k, v, blocks, **kwargs)
    assert out.dtype == q.dtype and out.shape == exact.shape
    err, tol = max_error(out, exact), tolerance(exact, plain, q.dtype)
    assert err <= tol, f"micro with mods: error {err:.3g} > tolerance {tol:.3g}"
    COMPARISONS.append(("numba micro mods", np.dtype(q.dtype).name, err, tol))
    assert_lse_near_the_oracle(lse, kernels.prepare(q, k, v, **kwargs))
    return out, lse


DOCS = _documents(2, 150, [[16, 32, 33, 100], [1, 2, 3, 77, 149]])  # edges on and off cells
SLOPES = 2.0 ** (-8.0 * np.arange(1, 5) / 4)
TABLE = np.random.default_rng(6).standard_normal((4, 15))
PREFIX = np.array([0, 40])


def _case(name):
    """Keywords of one case: each built-in once, mask and score functions combined."""
    return {
        "window causal + softcap": dict(mask_mod=mods.sliding_window(20), causal=True,
                                        score_mod=mods.softcap(2.0)),
        "window both sides, bottom-right + alibi": dict(
            mask_mod=mods.sliding_window(17, 3), causal="bottom-right",
            score_mod=mods.alibi(SLOPES), lq=37),
        "document + relative_bias, key_lengths": dict(
            mask_mod=mods.document(DOCS), score_mod=mods.relative_bias(TABLE),
            key_lengths=[150, 90]),
        "prefix_lm": dict(mask_mod=mods.prefix_lm(PREFIX), causal=True),
        "document and window": dict(mask_mod=mods.and_masks(mods.document(DOCS),
                                                            mods.sliding_window(40))),
        "prefix or window, Lq > Lk": dict(
            mask_mod=mods.or_masks(mods.prefix_lm(PREFIX), mods.sliding_window(10, 3)),
            lq=150, lk=70),
        "softcap alone, causal": dict(score_mod=mods.softcap(2.0), causal=True),
        "alibi alone, key_lengths": dict(score_mod=mods.alibi(SLOPES), key_lengths=[0, 101]),
    }[name]


@pytest.mark.parametrize("name", ["window causal + softcap",
                                  "window both sides, bottom-right + alibi",
                                  "document + relative_bias, key_lengths", "prefix_lm",
                                  "document and window", "prefix or window, Lq > Lk",
                                  "softcap alone, causal", "alibi alone, key_lengths"])
def test_builtins_against_the_oracle(name):
    kwargs = _case(name)
    lq, lk = kwargs.pop("lq", 150), kwargs.pop("lk", None)
    _check(*_qkv(Lq=lq, Lk=lk), **kwargs)


@pytest.mark.parametrize("name", ["window causal + softcap",
                                  "document + relative_bias, key_lengths"])
def test_float64(name):
    kwargs = _case(name)
    _check(*_qkv(np.float64), **kwargs)


@pytest.mark.parametrize("Lq, Lk", [(1, 1), (15, 17), (16, 16), (17, 33), (47, 64), (65, 31)])
@pytest.mark.parametrize("left", [15, 16, 17])
def test_block_edges(Lq, Lk, left):
    """Sizes and windows one below, on and one above the register block, panel and cell."""
    q, k, v = _qkv(B=1, H=2, Hkv=1, Lq=Lq, Lk=Lk, D=5, Dv=17)
    _check(q, k, v, mask_mod=mods.sliding_window(left), causal=True, score_mod=mods.softcap(2.0))


def same_document(b, h, q_idx, kv_idx, doc_ids):
    return doc_ids[b, q_idx] == doc_ids[b, kv_idx]


def head_bias(score, b, h, q_idx, kv_idx, bias):
    return score + bias[h, q_idx % bias.shape[1]]


@pytest.mark.slow  # user functions compile per process: left out of the quick lane
def test_user_functions_with_bound_arrays():
    q, k, v = _qkv()
    bias = np.random.default_rng(3).standard_normal((4, 5)).astype(np.float32)
    _check(q, k, v, mask_mod=mods.mask_mod(same_document, DOCS), causal=True,
           score_mod=mods.score_mod(head_bias, bias))


def test_rows_that_see_no_key_give_zero():
    """Bottom-right causal with Lq > Lk hides every key from the first rows; a key length
    of 0 hides every key of its batch."""
    q, k, v = _qkv(Lq=50, Lk=20)
    out, lse = _check(q, k, v, mask_mod=mods.sliding_window(40), causal="bottom-right",
                      key_lengths=[20, 0], score_mod=mods.softcap(2.0))
    assert np.all(out[0, :, :30] == 0) and np.all(lse[0, :, :30] == -np.inf)
    assert np.all(out[1] == 0) and np.all(lse[1] == -np.inf)
    assert np.all(np.isfinite(lse[0, :, 30:]))


@pytest.mark.parametrize("garbage", [np.nan, np.inf, 1e30])
@pytest.mark.parametrize("name", ["window causal + softcap",
                                  "document + relative_bias, key_lengths", "user"])
def test_hidden_keys_and_values_change_no_output_bit(garbage, name):
    """Garbage in keys and values a mask function hides from a row changes no bit of that
    row; the rows that see it are not finite, as in the reference."""
    if name == "user":
        kwargs = dict(mask_mod=mods.mask_mod(same_document, DOCS), causal=True,
                      score_mod=mods.score_mod(head_bias, np.ones((4, 3), np.float32)))
    else:
        kwargs = _case(name)
    q, k, v = _qkv()
    bad = np.zeros(150, bool)
    bad[70:85] = True  # within a panel and across a cell edge (80)
    visible = kernels.prepare(q, k, v, **kwargs).visible()  # (B, H, Lq, Lk)
    rows = ~visible[..., bad].any(axis=-1)
    assert 0 < rows.sum() < rows.size
    before, _ = _run(q, k, v, **kwargs)
    k2, v2 = k.copy(), v.copy()
    k2[:, :, bad] = garbage
    v2[:, :, bad] = garbage
    after, _ = _run(q, k2, v2, **kwargs)
    np.testing.assert_array_equal(after[rows], before[rows])
    if np.isfinite(garbage):
        return
    sees_bad_value = visible[..., bad].any(axis=-1)
    assert (~np.isfinite(after[sees_bad_value])).any(axis=-1).all()


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(Lq=st.integers(1, 70), Lk=st.integers(1, 70), left=st.integers(0, 40),
       causal=st.sampled_from([True, "bottom-right"]), length=st.integers(0, 70),
       cell=st.sampled_from([16, 32]), block_q=st.sampled_from([8, 16, 24]))
def test_property_window_against_the_oracle(Lq, Lk, left, causal, length, cell, block_q):
    """Any shape, window, alignment, key length and block: within the tolerance."""
    q, k, v = _qkv(B=1, H=2, Hkv=1, Lq=Lq, Lk=Lk, D=4, Dv=3, seed=Lq * 71 + Lk)
    _check(q, k, v, dict(block_q=block_q, block_k=2 * cell, cell_k=cell),
           mask_mod=mods.sliding_window(left), causal=causal, key_lengths=min(length, Lk),
           score_mod=mods.softcap(2.0))


# --- which path a call takes --------------------------------------------------------------


@pytest.fixture
def calls(monkeypatch):
    """Every size runs parallel; the micro paths' calls, by name."""
    monkeypatch.setattr(config, "SERIAL_WORK_LIMIT", 0)
    seen = []
    for module, name in ((micro, "plain"), (micro_mods, "mods")):
        real = module.run

        def spy(problem, block, _real=real, _name=name, **kw):
            seen.append(_name)
            return _real(problem, block, **kw)

        monkeypatch.setattr(module, "run", spy)
    return seen


@pytest.mark.parametrize("stored, asked, path", [
    (BLOCK[F32], {}, "mods"),  # the planner chose the micro path: mods take it too
    (None, {}, None),  # the planner chose the BLAS
    (BLOCK[F32], {"micro": False}, None),
    (BLOCK[F32], {"use_blas": True}, None),
    (_microplan.NOT_PLANNED, {"micro": True}, "mods"),
])
def test_mods_take_the_micro_path_where_the_plain_call_does(monkeypatch, calls, stored, asked,
                                                            path):
    monkeypatch.setitem(_microplan._CHOICES, F32, stored)
    q, k, v = _qkv(B=1, Lq=40)
    kwargs = dict(mask_mod=mods.sliding_window(20), causal=True, score_mod=mods.softcap(2.0))
    problem = kernels.prepare(q, k, v, **kwargs)
    out = choose.run(problem, **asked)[0]
    choose.run(kernels.prepare(q, k, v, causal=True), **asked)  # the plain call
    assert calls == ([path, "plain"] if path else [])
    (exact, _), (plain, _) = oracle(q, k, v, **kwargs)
    assert max_error(problem.restore(out), exact) <= tolerance(exact, plain, q.dtype)


def test_a_dense_mask_or_dropout_stays_on_the_tiles(monkeypatch, calls):
    monkeypatch.setitem(_microplan._CHOICES, F32, BLOCK[F32])
    q, k, v = _qkv(B=1, Lq=40)
    for extra in ({"mask": np.tril(np.ones((40, 40), bool))}, {"dropout_p": 0.5, "seed": 1}):
        problem = kernels.prepare(q, k, v, mask_mod=mods.sliding_window(20), **extra)
        choose.run(problem)
        assert calls == []
        with pytest.raises(ValueError, match="no mask, dropout or weights"):
            micro_mods.run(problem, BLOCK[F32])
        calls.clear()
