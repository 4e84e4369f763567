"""A dense ``mask=`` on the micro-kernel path (kernels/mods/dense_mask.py, choose.run).

Without other mods, dropout or weights, a call with a dense mask takes the micro-kernel path
where a plain call would: the mask becomes a mask function (bool: the entry; additive: the
entry is not ``-inf``) and, for an additive mask, a score function (the entry added).  The
cases go through :func:`kernels.numba_cpu.choose.run` with ``micro=True`` and are judged
against the float64 oracle under the baseline-relative tolerance; the tile classification
is checked by masks with whole blocks hidden and visible (cells of 64 keys), masks
broadcast over batch, heads, queries or keys, and rows that see no key.  Each mask dtype
compiles the kernel once per scores dtype (~10 s), so the cases share them.
"""

from __future__ import annotations

import numpy as np
import pytest

from attnbench import kernels
from attnbench.kernels.mods import dense_mask
from attnbench.kernels.numba_cpu import choose
from attnbench.kernels.numba_cpu.dense import micro_mods
from attnbench.measure.oracle import tolerance

from .support import COMPARISONS, assert_lse_near_the_oracle, max_error, oracle

B, H, HKV, LQ, LK, D, DV = 2, 4, 2, 70, 150, 9, 7


def _qkv(dtype=np.float32, seed=0):
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((B, H, LQ, D)).astype(dtype),
            rng.standard_normal((B, HKV, LK, D)).astype(dtype),
            rng.standard_normal((B, HKV, LK, DV)).astype(dtype))


def _micro(q, k, v, **kwargs):
    """``(out, lse, problem)`` of the micro path, which must be the one taken."""
    problem = kernels.prepare(q, k, v, **kwargs)
    assert choose.micro_block(problem, None, None, True) is not None
    out, _, lse = choose.run(problem, micro=True, return_lse=True)
    return problem.restore(out), lse, problem


def _check(q, k, v, **kwargs):
    (exact, _), (plain, _) = oracle(q, k, v, **kwargs)
    out, lse, problem = _micro(q, k, v, **kwargs)
    assert out.dtype == q.dtype and out.shape == exact.shape
    err, tol = max_error(out, exact), tolerance(exact, plain, q.dtype)
    assert err <= tol, f"micro with a dense mask: error {err:.3g} > tolerance {tol:.3g}"
    COMPARISONS.append(("numba micro dense mask", np.dtype(q.dtype).name, err, tol))
    assert_lse_near_the_oracle(lse, problem)
    return out, lse


def _blocky(rng, shape):
    """Blocks of 24 queries x 50 keys wholly visible or hidden: EMPTY, FULL and PARTIAL cells."""
    blocks = rng.random(shape[:-2] + (-(-shape[-2] // 24), -(-shape[-1] // 50))) < 0.5
    return np.repeat(np.repeat(blocks, 24, axis=-2), 50, axis=-1)[..., :shape[-2], :shape[-1]]


def _bool_masks():
    rng = np.random.default_rng(1)
    lengths = np.array([150, 37])[:, None, None, None]
    return {
        "every entry (B, H, Lq, Lk)": rng.random((B, H, LQ, LK)) < 0.7,
        "blocks, shared (Lq, Lk)": _blocky(rng, (LQ, LK)),
        "padding (B, 1, 1, Lk)": np.arange(LK)[None, None, None, :] < lengths,
        "per query (B, 1, Lq, 1)": rng.random((B, 1, LQ, 1)) < 0.8,
    }


@pytest.mark.parametrize("name", list(_bool_masks()))
@pytest.mark.parametrize("causal", [False, True, "bottom-right"], ids=str)
def test_bool_masks_against_the_oracle(name, causal):
    _check(*_qkv(), mask=_bool_masks()[name], causal=causal)


def _additive(rng, shape, hidden=0.4):
    values = rng.standard_normal(shape).astype(np.float32)
    return np.where(rng.random(shape) < hidden, -np.inf, values).astype(np.float32)


@pytest.mark.parametrize("causal", [False, True], ids=str)
def test_additive_masks_against_the_oracle(causal):
    rng = np.random.default_rng(2)
    block_hidden = np.where(_blocky(rng, (B, 1, LQ, LK)), 0.5, -np.inf).astype(np.float32)
    _check(*_qkv(), mask=_additive(rng, (B, 1, LQ, LK)), causal=causal)
    _check(*_qkv(), mask=block_hidden, causal=causal, key_lengths=[120, 150])


def test_float64():
    rng = np.random.default_rng(3)
    _check(*_qkv(np.float64), mask=_blocky(rng, (B, H, LQ, LK)), causal=True)


def test_rows_that_see_no_key_give_zero():
    m = np.ones((LQ, LK), dtype=bool)
    m[:10] = False  # the first 10 rows see nothing
    out, lse = _check(*_qkv(), mask=m)
    assert not out[:, :, :10].any() and np.isneginf(lse[:, :, :10]).all()
    additive = np.where(m, np.float32(0.25), -np.inf).astype(np.float32)
    out, lse = _check(*_qkv(), mask=additive)
    assert not out[:, :, :10].any() and np.isneginf(lse[:, :, :10]).all()


@pytest.mark.parametrize("kind", ["bool", "additive"])
def test_what_hidden_keys_and_values_hold_changes_no_bit(kind):
    """NaN and inf planted in the keys and values the mask hides from every query (keys
    60-99, a whole cell and parts of two, and 121-129), the other pairs in blocks."""
    rng = np.random.default_rng(4)
    visible = _blocky(rng, (LQ, LK))
    visible[:, 140:] = True
    visible[:, 60:100] = visible[:, 121:130] = False
    hidden_keys = ~visible.any(axis=0)
    mask = visible if kind == "bool" else np.where(visible, 0.0, -np.inf).astype(np.float32)
    q, k, v = _qkv()
    out, _, _ = _micro(q, k, v, mask=mask)
    k2, v2 = k.copy(), v.copy()
    k2[:, :, hidden_keys] = np.nan
    v2[:, :, hidden_keys] = np.inf
    out2, _, _ = _micro(q, k2, v2, mask=mask)
    assert hidden_keys.sum() >= 49
    assert np.array_equal(out, out2)


def test_a_nan_entry_makes_its_row_nan_as_on_the_tiles():
    mask = np.zeros((LQ, LK), dtype=np.float32)
    mask[5, 7] = np.nan
    q, k, v = _qkv()
    out, _, problem = _micro(q, k, v, mask=mask)
    tiles = problem.restore(choose.run(problem, micro=False)[0])
    assert np.isnan(out[:, :, 5]).all() and np.isnan(tiles[:, :, 5]).all()
    assert not np.isnan(np.delete(out, 5, axis=2)).any()


def test_which_calls_take_it(monkeypatch):
    """A dense mask alone takes the micro path; beside a mask_mod or score_mod, or with half
    inputs, dropout or weights, it stays on the tiles."""
    taken = []
    real = micro_mods.run
    monkeypatch.setattr(micro_mods, "run", lambda *a, **kw: taken.append(1) or real(*a, **kw))
    q, k, v = _qkv()
    mask = _bool_masks()["padding (B, 1, 1, Lk)"]
    assert choose.micro_block(kernels.prepare(q, k, v, mask=mask), None, None, True)
    choose.run(kernels.prepare(q, k, v, mask=mask), micro=True)
    assert taken == [1]
    for kwargs in (dict(mask_mod=kernels.mods.sliding_window(8)),
                   dict(score_mod=kernels.mods.softcap(2.0)), dict(dropout_p=0.1, seed=1),
                   dict(return_weights=True)):
        problem = kernels.prepare(q, k, v, mask=mask, **kwargs)
        assert choose.micro_block(problem, None, None, True) is None, kwargs
    half = kernels.prepare(*(x.astype(np.float16) for x in (q, k, v)), mask=mask)
    assert choose.micro_block(half, None, None, True) is None


def test_mods_stand_for_the_mask():
    """The mods of a mask, evaluated densely, are the mask (bool) or its visibility and the
    entries added (additive), broadcast dims included."""
    rng = np.random.default_rng(5)
    scores = rng.standard_normal((B, H, LQ, LK)).astype(np.float32)
    for mask in (_bool_masks()["per query (B, 1, Lq, 1)"],
                 _additive(rng, (1, H, LQ, LK)), _additive(rng, (B, 1, 1, LK))):
        problem = kernels.prepare(*_qkv(), mask=mask)
        mask_mod, score_mod = dense_mask.as_mods(problem.mask)
        full = np.broadcast_to(problem.mask, (B, H, LQ, LK))
        visible = full if full.dtype == bool else ~np.isneginf(full)
        np.testing.assert_array_equal(mask_mod.dense(B, H, LQ, LK), visible)
        if score_mod is not None:
            np.testing.assert_array_equal(score_mod.dense(scores, np.float32), scores + full)


def test_the_cell_table_never_says_empty_or_full_wrongly():
    """The tile classification (a table of 16 x 16 cells) on random blocks: EMPTY only if no
    pair is visible, FULL only if all are; exact on blocks of whole cells."""
    from attnbench.kernels.mods.cells import EMPTY, FULL, PARTIAL

    rng = np.random.default_rng(6)
    for mask in (_blocky(rng, (B, H, LQ, LK)), _bool_masks()["padding (B, 1, 1, Lk)"],
                 _bool_masks()["per query (B, 1, Lq, 1)"],
                 np.where(_blocky(rng, (LQ, LK)), 1.0, -np.inf).astype(np.float32)):
        problem = kernels.prepare(*_qkv(), mask=mask)
        mask_mod, _ = dense_mask.as_mods(problem.mask)
        tile, args = mask_mod.tile("cpu"), mask_mod.args(np.float32)
        full = np.broadcast_to(problem.mask, (B, H, LQ, LK))
        visible = full if full.dtype == bool else ~np.isneginf(full)
        kinds = set()
        for _ in range(300):
            b, h = rng.integers(B), rng.integers(H)
            i0, j0 = rng.integers(LQ), rng.integers(LK)
            aligned = rng.random() < 0.5
            if aligned:
                i0, j0 = i0 - i0 % 16, j0 - j0 % 16
                i1 = min(i0 + 16 * rng.integers(1, 4), LQ)
                j1 = min(j0 + 16 * rng.integers(1, 4), LK)
            else:
                i1, j1 = rng.integers(i0 + 1, LQ + 1), rng.integers(j0 + 1, LK + 1)
            block = visible[b, h, i0:i1, j0:j1]
            truth = EMPTY if not block.any() else (FULL if block.all() else PARTIAL)
            got = tile(b, h, i0, i1, j0, j1, args)
            kinds.add(truth)
            assert got == truth or (got == PARTIAL and not aligned), (i0, i1, j0, j1)
        assert {FULL, PARTIAL} <= kinds  # and EMPTY, for the blocks and the padding
