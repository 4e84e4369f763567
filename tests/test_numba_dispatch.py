"""The numba backend's choice between its BLAS tiles and the micro-kernel path.

``kernels.numba_cpu.run`` takes the micro-kernel path where the planner's choice for the
dtype is a register block, and its BLAS tiles where it is ``"blas"`` or where nothing is
planned (tests/conftest.py starts every test with nothing planned and planning off).
The choice is set here by hand; nothing is timed.  Both paths are checked against the
reference on odd sizes, both causal alignments, key lengths and GQA.
"""

import ml_dtypes
import numba
import numpy as np
import pytest

from attnbench import kernels
from attnbench.kernels.numba_cpu import choose, config
from attnbench.kernels.numba_cpu import planner as _microplan
from attnbench.kernels.numba_cpu.dense import micro as _microkernel
from attnbench.measure.machine import machine_record, summary_lines
from attnbench.measure.oracle import tolerance

from .support import COMPARISONS, assert_lse_near_the_oracle, max_error, oracle

F32, F64 = np.dtype(np.float32), np.dtype(np.float64)


@pytest.fixture
def calls(monkeypatch):
    """Every problem size runs parallel; records the calls of the micro-kernel path."""
    monkeypatch.setattr(config, "SERIAL_WORK_LIMIT", 0)
    seen = []
    real = _microkernel.run

    def spy(problem, config, **kwargs):
        seen.append(config)
        return real(problem, config, **kwargs)

    monkeypatch.setattr(_microkernel, "run", spy)
    return seen


def _choose(monkeypatch, dtype, stored):
    """The stored choice for ``dtype``: a block, None (BLAS won) or NOT_PLANNED."""
    monkeypatch.setitem(_microplan._CHOICES, np.dtype(dtype), stored)


def _inputs(dtype, B, H, Hkv, Lq, Lk, D, Dv, seed=0):
    rng = np.random.default_rng(seed)
    return tuple(rng.standard_normal(s).astype(dtype)
                 for s in ((B, H, Lq, D), (B, Hkv, Lk, D), (B, Hkv, Lk, Dv)))


CASES = [  # (B, H, Hkv, Lq, Lk, D, Dv), keywords
    ((1, 2, 2, 67, 53, 8, 5), {}),
    ((2, 4, 2, 45, 71, 16, 7), {"causal": True}),
    ((1, 3, 1, 29, 90, 4, 9), {"causal": "bottom-right"}),
    ((2, 2, 1, 70, 70, 8, 8), {"key_lengths": [70, 33], "causal": True}),
    ((2, 4, 4, 33, 130, 8, 3), {"key_lengths": [0, 77]}),
]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("path", ["micro", "blas"])
@pytest.mark.parametrize("shape, kwargs", CASES)
def test_the_chosen_path_runs_and_agrees_with_the_reference(monkeypatch, calls, dtype, path,
                                                            shape, kwargs):
    block = _microkernel.CONFIGS[np.dtype(dtype)][0]
    _choose(monkeypatch, dtype, block if path == "micro" else None)
    q, k, v = _inputs(dtype, *shape)
    (exact, _), (plain, _) = oracle(q, k, v, **kwargs)
    out = kernels.attention(q, k, v, backend="numba", **kwargs)
    assert calls == ([block] if path == "micro" else [])
    assert out.dtype == q.dtype and out.shape == exact.shape
    err, tol = max_error(out, exact), tolerance(exact, plain, q.dtype)
    assert err <= tol, f"numba ({path} path): error {err:.3g} > tolerance {tol:.3g}"
    COMPARISONS.append(("numba", np.dtype(dtype).name, err, tol))


def test_lse_from_the_micro_path(monkeypatch, calls):
    _choose(monkeypatch, F32, _microkernel.CONFIGS[F32][0])
    q, k, v = _inputs(np.float32, 1, 2, 1, 40, 50, 8, 8)
    out, lse = kernels.attention(q, k, v, backend="numba", causal=True, return_lse=True)
    _choose(monkeypatch, F32, None)
    ref_out, ref_lse = kernels.attention(q, k, v, backend="numba", causal=True, return_lse=True)
    assert len(calls) == 1
    np.testing.assert_allclose(lse, ref_lse, rtol=1e-5)
    np.testing.assert_allclose(out, ref_out, atol=1e-5)


@pytest.mark.parametrize("why", ["mask", "dropout", "weights", "use_blas", "loops", "serial",
                                 "micro=False", "small"])
def test_what_the_micro_path_cannot_do_or_was_not_asked_stays_on_the_tiles(
        monkeypatch, calls, why):
    _choose(monkeypatch, F32, _microkernel.CONFIGS[F32][0])
    q, k, v = _inputs(np.float32, 1, 2, 2, 20, 24, 8, 8)
    args = {"mask": {"mask": np.tril(np.ones((20, 24), bool))},
            "dropout": {"dropout_p": 0.5, "seed": 1},
            "weights": {"return_weights": True}}.get(why, {})
    problem = kernels.prepare(q, k, v, **args)
    run = {"use_blas": {"use_blas": True}, "loops": {"use_blas": False},
           "serial": {"parallel": False}, "micro=False": {"micro": False}}.get(why, {})
    if why == "small":
        monkeypatch.setattr(config, "SERIAL_WORK_LIMIT", float("inf"))
    choose.run(problem, **run)
    assert calls == []


def test_values_of_width_zero_take_the_tiles_and_get_their_lse(monkeypatch, calls):
    """Dv = 0: the micro path would launch nothing and leave lse unset (it did)."""
    _choose(monkeypatch, F32, _microkernel.CONFIGS[F32][0])
    q, k, v = _inputs(np.float32, 1, 2, 2, 70, 70, 8, 0)
    out, lse = kernels.attention(q, k, v, backend="numba", return_lse=True)
    assert calls == [] and out.shape == (1, 2, 70, 0)
    assert_lse_near_the_oracle(lse, kernels.prepare(q, k, v))


def test_micro_true_forces_the_path_without_planning(monkeypatch, calls):
    q, k, v = _inputs(np.float64, 1, 1, 1, 9, 9, 4, 4)
    monkeypatch.setattr(_microplan, "choice", lambda *a, **k: pytest.fail("planned"))
    choose.run(kernels.prepare(q, k, v), micro=True)
    assert calls == [_microkernel.CONFIGS[F64][0]]  # nothing planned: the default block


def test_not_planned_plans_only_for_large_problems_and_says_so(monkeypatch, calls):
    q, k, v = _inputs(np.float32, 1, 2, 1, 30, 30, 8, 8)
    planned = []

    def choice(dtype, **kwargs):
        planned.append(np.dtype(dtype))
        _microplan._CHOICES[np.dtype(dtype)] = (4, 32)
        return (4, 32)

    monkeypatch.setattr(_microplan, "choice", choice)
    kernels.attention(q, k, v, backend="numba")  # PLAN_WORK_LIMIT is inf here
    assert planned == [] and calls == []
    monkeypatch.setattr(_microplan, "PLAN_WORK_LIMIT", 30 * 30 * 2 * 16)
    with pytest.warns(_microplan.PlanningWarning, match="kernels.plan()"):
        kernels.attention(q, k, v, backend="numba")
    kernels.attention(q, k, v, backend="numba")  # planned: no second plan, no warning
    assert planned == [F32] and calls == [(4, 32), (4, 32)]


def test_the_machine_record_says_what_is_planned_without_planning(monkeypatch):
    monkeypatch.setattr(_microplan, "choice", lambda *a, **k: pytest.fail("planned"))
    _choose(monkeypatch, F32, (8, 16))
    _choose(monkeypatch, F64, None)
    record = machine_record()
    assert record["attention_plan"] == {"float32": "8x16", "float64": "blas"}
    assert kernels.attention_plan() == record["attention_plan"]
    assert any("float32 8x16, float64 blas" in line for line in summary_lines(record))
    _choose(monkeypatch, F64, _microplan.NOT_PLANNED)
    assert machine_record()["attention_plan"]["float64"] == "not planned"


def test_a_stored_choice_is_read_once_and_a_miss_remembered(monkeypatch, tmp_path):
    from numba.core import config as numba_config

    monkeypatch.setattr(numba_config, "CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "user"))
    monkeypatch.setattr(_microplan, "_CHOICES", {})
    monkeypatch.setattr(_microplan, "_PLANS", {})
    block = _microkernel.CONFIGS[F32][1]  # a block of this target's, not the default
    assert _microplan.stored_choice(F32) is None
    _microplan.store(_microplan.machine_key("float32"), {"plan": list(block),
                                                         "choice": list(block)})
    assert _microplan.stored_choice(F32) is None  # the miss is remembered in this process
    _microplan._CHOICES.clear()  # a new process reads the file
    assert _microplan.stored_choice(F32) == block
    assert _microplan.record([F32]) == {"float32": "{}x{}".format(*block)}


def test_plan_chooses_each_dtype_and_reports_it(monkeypatch):
    chosen = {F32: (8, 16), F64: None}

    def choice(dtype, **kwargs):
        _microplan._CHOICES[np.dtype(dtype)] = chosen[np.dtype(dtype)]
        return chosen[np.dtype(dtype)]

    monkeypatch.setattr(_microplan, "choice", choice)
    assert kernels.plan() == {"float32": "8x16", "float64": "blas"}
    assert kernels.attention_plan() == {"float32": "8x16", "float64": "blas"}


@pytest.mark.parametrize("dtype", [np.float16, ml_dtypes.bfloat16], ids=["float16", "bfloat16"])
def test_half_inputs_take_the_micro_path_where_it_packs_fused(monkeypatch, calls, dtype):
    """float32's stored block serves half inputs where one key head per task is packed
    (B·Hkv >= FUSE_TASKS_PER_THREAD per thread), never with mods; else the tiles."""
    _choose(monkeypatch, F32, (4, 32))
    monkeypatch.setattr(_microkernel, "FUSE_TASKS_PER_THREAD", 1)
    monkeypatch.setattr(numba, "get_num_threads", lambda: 2)
    few = _inputs(dtype, 1, 2, 1, 20, 30, 8, 8)  # one key head for two threads: tiles
    many = _inputs(dtype, 1, 4, 2, 20, 30, 8, 8)
    kernels.attention(*few, backend="numba")
    assert calls == []
    kernels.attention(*many, backend="numba", score_mod=kernels.mods.softcap(20.0))
    assert calls == []
    got = kernels.attention(*many, backend="numba")
    assert calls == [(4, 32)] and got.dtype == np.dtype(dtype)
    (exact, _), (plain, _) = oracle(*many)
    assert max_error(got, exact) <= tolerance(exact, plain, np.dtype(dtype))


def test_half_inputs_are_never_packed_whole():
    q, k, v = _inputs(ml_dtypes.bfloat16, 1, 1, 1, 9, 9, 4, 4)
    with pytest.raises(ValueError, match="fused only"):
        _microkernel.run(kernels.prepare(q, k, v), (8, 16), fuse=False)
