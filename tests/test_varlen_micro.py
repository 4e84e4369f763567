"""Packed batches on the micro-kernel path (:mod:`kernels.numba_cpu.varlen.micro`).

Where the planner chose the micro-kernel for dense calls, a plain packed call takes it
too.  It must agree with the oracle per sequence (as ``tests/test_varlen.py`` judges the
tiles), be bit-identical to the dense micro-kernel call of each sequence alone (the same
query blocks, key tiles and register blocks: nothing may depend on the packing), split a
long sequence's rows where there are too few tasks, never let a hidden or foreign
non-finite value reach an output, and leave calls with mods or dropout on the tiles.
"""

from __future__ import annotations

import ml_dtypes
import numba
import numpy as np
import pytest

from attnbench import kernels
from attnbench.kernels._api.varlen import prepare_varlen
from attnbench.kernels.numba_cpu import planner as _microplan
from attnbench.kernels.numba_cpu.dense import micro
from attnbench.kernels.numba_cpu.varlen import blocks as varlen
from attnbench.kernels.numba_cpu.varlen import micro as varlen_micro

from .test_varlen import LENGTHS, _assert_forward, _packed

F32 = np.dtype(np.float32)


@pytest.fixture
def taken(monkeypatch):
    """The float32 (and half) choice set to the micro-kernel; the blocks it runs, recorded."""
    monkeypatch.setitem(_microplan._CHOICES, F32, micro.CONFIGS[F32][0])
    seen = []
    real = varlen_micro.run

    def spy(problem, block, *args):
        seen.append(block)
        return real(problem, block, *args)

    monkeypatch.setattr(varlen_micro, "run", spy)
    return seen


@pytest.mark.parametrize("causal", [False, True, "bottom-right"])
@pytest.mark.parametrize("name, lengths_q, lengths_k", LENGTHS, ids=[c[0] for c in LENGTHS])
def test_each_sequence_alone(taken, name, lengths_q, lengths_k, causal):
    q, k, v, cu_q, cu_k = _packed(lengths_q, lengths_k, 4, 2, 16, 16, np.float32)
    _assert_forward(q, k, v, cu_q, cu_k, "numba", causal=causal)
    assert taken == [micro.CONFIGS[F32][0]]


def _dense_alone(q, k, v, cu_q, cu_k, b, causal):
    """Sequence b as a dense micro-kernel call: (out (Lq, H, Dv), lse (H, Lq))."""
    heads = [np.ascontiguousarray(x[cu[b]:cu[b + 1]].transpose(1, 0, 2))[None]
             for x, cu in ((q, cu_q), (k, cu_k), (v, cu_k))]
    problem = kernels.prepare(*heads, causal=causal)
    out, lse = micro.run(problem, micro.CONFIGS[F32][0], fuse=True)
    return out[0].transpose(1, 0, 2), lse[0]


def _assert_bit_identical_to_dense(q, k, v, cu_q, cu_k, causal):
    out, lse = kernels.attention_varlen(q, k, v, cu_q, cu_k, causal=causal, return_lse=True)
    assert out.dtype == q.dtype
    bits = np.uint32 if q.dtype == np.float32 else np.uint16
    for b in range(len(cu_q) - 1):
        dense_out, dense_lse = _dense_alone(q, k, v, cu_q, cu_k, b, causal)
        rows = slice(cu_q[b], cu_q[b + 1])
        np.testing.assert_array_equal(out[rows].view(bits), dense_out.view(bits))
        np.testing.assert_array_equal(lse[:, rows], dense_lse)


@pytest.mark.parametrize("dtype", [np.float32, ml_dtypes.bfloat16, np.float16],
                         ids=["float32", "bfloat16", "float16"])
@pytest.mark.parametrize("causal", [False, True, "bottom-right"])
def test_bit_identical_to_each_dense_micro_call(taken, dtype, causal):
    """Rows past a block of 64, keys past a tile of 256, GQA 4/2, Lq != Lk both ways, a
    sequence whose first 150 rows see no key (bottom-right: no task for two of its blocks)
    and one with rows but no keys."""
    _assert_bit_identical_to_dense(
        *_packed([70, 5, 300, 200, 4], [90, 5, 260, 50, 0], 4, 2, 16, 12, dtype), causal)
    assert taken == [micro.CONFIGS[F32][0]]


@pytest.fixture(params=[1, 2], ids=["1 thread", "2 threads"])
def threads(request):
    if request.param > numba.config.NUMBA_NUM_THREADS:
        pytest.skip(f"Numba has {numba.config.NUMBA_NUM_THREADS} thread(s)")
    before = numba.get_num_threads()
    numba.set_num_threads(request.param)
    yield request.param
    numba.set_num_threads(before)


def test_long_rows_are_split_when_tasks_are_few(taken, threads):
    """One MQA sequence: one task per key head would run on one thread; its rows are split
    (each part packing only the keys it sees under the causal mask), into parts of 64 rows
    on 1 and on 2 threads (fewer than 4 tasks per thread before), and the results stay
    bit-identical to the dense call."""
    q, k, v, cu_q, cu_k = _packed([300], [300], 2, 1, 16, 16, np.float32)
    problem = prepare_varlen(q, k, v, cu_q, cu_k, causal=True)
    tasks, _ = varlen_micro.split_tasks(problem, threads)
    assert sorted((t[2], t[3]) for t in tasks) == [(0, 64), (64, 128), (128, 192),
                                                   (192, 256), (256, 300)]
    _assert_bit_identical_to_dense(q, k, v, cu_q, cu_k, True)
    assert taken == [micro.CONFIGS[F32][0]]


def test_one_long_sequence_among_many_short_is_split_by_its_work():
    """Enough tasks (65), but one holding most of the work: its rows are split until no task
    holds more than a thread's share; the short sequences stay whole."""
    q, k, v, cu_q, cu_k = _packed([1024] + [16] * 64, [1024] + [16] * 64, 2, 1, 8, 8,
                                  np.float32)
    problem = prepare_varlen(q, k, v, cu_q, cu_k)
    tasks, costs = varlen_micro.split_tasks(problem, threads=2)
    assert 2 * max(costs) <= sum(costs)
    assert len([t for t in tasks if t[0] == 0]) > 1
    assert all((t[2], t[3]) == (0, 16) for t in tasks if t[0] > 0)


def test_whole_sequences_where_tasks_are_enough():
    q, k, v, cu_q, cu_k = _packed([100] * 8, [50] * 8, 2, 1, 8, 8, np.float32)
    problem = prepare_varlen(q, k, v, cu_q, cu_k)
    tasks, costs = varlen_micro.split_tasks(problem, threads=2)
    assert tasks == [(b, 0, 0, 100) for b in range(8)] and costs == [2 * 100 * 50 + 50] * 8


def test_rows_that_see_no_key_get_no_task_and_give_zero(taken):
    q, k, v, cu_q, cu_k = _packed([100, 3, 4], [30, 0, 4], 2, 2, 8, 8, np.float32)
    problem = prepare_varlen(q, k, v, cu_q, cu_k, causal="bottom-right")
    tasks, _ = varlen_micro.split_tasks(problem, threads=2)
    # rows < 70 of sequence 0 see no key: its first part (0, 64) has no task
    assert sorted(tasks) == [(0, 0, 64, 100), (0, 1, 64, 100), (2, 0, 0, 4), (2, 1, 0, 4)]
    out, lse = kernels.attention_varlen(q, k, v, cu_q, cu_k, causal="bottom-right",
                                        return_lse=True)
    assert taken == [micro.CONFIGS[F32][0]]
    assert (out[:70] == 0).all() and (out[100:103] == 0).all()
    assert np.isneginf(lse[:, :70]).all() and np.isneginf(lse[:, 100:103]).all()


def test_hidden_and_foreign_non_finite_values_change_no_bit(taken):
    """NaN/inf in another sequence's keys and values, and in a sequence's future keys and
    values (hidden by the causal mask), leave every other output bit as it was."""
    q, k, v, cu_q, cu_k = _packed([40, 90], [40, 90], 2, 1, 8, 8, np.float32)
    before = kernels.attention_varlen(q, k, v, cu_q, cu_k, causal=True)
    k2, v2 = k.copy(), v.copy()
    k2[:40], v2[:40] = np.nan, np.inf  # sequence 0's keys and values
    k2[cu_k[1] + 60:], v2[cu_k[1] + 60:] = np.inf, np.nan  # sequence 1's keys 60..89
    after = kernels.attention_varlen(q, k2, v2, cu_q, cu_k, causal=True)
    np.testing.assert_array_equal(after[40:100], before[40:100])  # rows 0..59 of sequence 1
    assert taken == [micro.CONFIGS[F32][0]] * 2


def test_values_of_width_zero_stay_on_the_tiles(taken):
    q, k, v, cu_q, cu_k = _packed([6, 9], [6, 9], 2, 2, 8, 0, np.float32)
    out, lse = kernels.attention_varlen(q, k, v, cu_q, cu_k, return_lse=True)
    assert taken == [] and out.shape == (15, 2, 0) and np.isfinite(lse).all()


@pytest.mark.parametrize("kwargs", [dict(dropout_p=0.2, seed=1),
                                    dict(score_mod=kernels.mods.softcap(2.0))],
                         ids=["dropout", "score_mod"])
def test_dropout_and_mods_stay_on_the_tiles(taken, kwargs):
    q, k, v, cu_q, cu_k = _packed([6, 9], [6, 9], 2, 2, 8, 8, np.float32)
    kernels.attention_varlen(q, k, v, cu_q, cu_k, **kwargs)
    assert taken == []
    problem = prepare_varlen(q, k, v, cu_q, cu_k, **kwargs)
    assert varlen.micro_block(problem, micro=True) is None


def test_not_planned_or_blas_chosen_stays_on_the_tiles(taken, monkeypatch):
    q, k, v, cu_q, cu_k = _packed([6, 9], [6, 9], 2, 2, 8, 8, np.float32)
    for stored in (_microplan.NOT_PLANNED, None):
        monkeypatch.setitem(_microplan._CHOICES, F32, stored)
        kernels.attention_varlen(q, k, v, cu_q, cu_k)
    assert taken == []
