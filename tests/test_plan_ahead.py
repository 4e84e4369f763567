"""The harness plans the numba backend's tile path before timing, only where a call would."""

import io

from attnbench import kernels
from attnbench.kernels.numba_cpu import planner as _microplan
from attnbench.measure.machine import plan_ahead


def test_plan_needed_follows_the_work_limit_and_the_stored_choice(monkeypatch):
    monkeypatch.setattr(_microplan, "PLAN_WORK_LIMIT", 1 << 20)
    small, large = (1, 1, 64, 64, 16, 16), (1, 4, 256, 256, 64, 64)
    assert not kernels.plan_needed(small, "float32")
    assert kernels.plan_needed(large, "float32")
    monkeypatch.setitem(_microplan._CHOICES, _microplan.np.dtype("float32"), None)  # "blas"
    assert not kernels.plan_needed(large, "float32")  # a stored choice: nothing to plan


def test_plan_ahead_plans_only_the_numba_dtypes_a_timed_call_would_plan(monkeypatch):
    planned = []
    monkeypatch.setattr(kernels, "plan", lambda dtypes: planned.append(list(dtypes)))
    monkeypatch.setattr(kernels, "plan_needed",
                        lambda shape, dtype: shape[2] >= 4096 and dtype == "float32")
    out = io.StringIO()
    record = plan_ahead([("numba", (1, 12, 4096, 4096, 64, 64), "float32"),
                         ("torch", (1, 12, 4096, 4096, 64, 64), "float32"),
                         ("numba", (1, 12, 4096, 4096, 64, 64), "float64"),
                         ("numba", (1, 12, 1024, 1024, 64, 64), "float32")], out=out)
    assert planned == [["float32"]]
    assert "Planning the numba backend's tile products for float32" in out.getvalue()
    assert set(record) == {"float32", "float64"}
    planned.clear()
    plan_ahead([("numba", (1, 1, 64, 64, 16, 16), "float32")], out=out)
    assert planned == []  # small problems never plan
