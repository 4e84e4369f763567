"""The judge stays outside the code it judges: fresh problems each run, the oracle, the
comparison and the clock in the parent, the outputs crossing as plain numbers.

Each cheat of :mod:`tests.conformance_impls` used here works where the battery shares the
subject's process (shown where showing it does not alter this process) and fails under
``attnbench conform``.
"""


import numpy as np
import pytest

from attnbench import kernels
from attnbench.conformance import subject, wire
from attnbench.conformance.battery import all_checks, run_checks
from attnbench.conformance.cases import CASES, DRAWN, drawn_cases, features, inputs
from attnbench.conformance.integrity import MANY, many_calls
from attnbench.conformance.runner import conform
from tests import conformance_impls as impls

IMPLS = "tests.conformance_impls"


pytestmark = pytest.mark.usefixtures("repository_on_pythonpath")  # the worker imports
# tests.conformance_impls


def _property(entry, name):
    return next(p for p in entry["properties"] if p["name"] == name)


# --- the wire ---------------------------------------------------------------------------


class _Agreeable(np.ndarray):
    """An array whose subtraction reports no difference."""

    def __sub__(self, other):
        return np.zeros(np.broadcast_shapes(self.shape, np.shape(other)))


def test_the_wire_carries_plain_numbers_and_nothing_that_runs_code():
    message = {"a": np.arange(6, dtype=np.float32).reshape(2, 3), "t": (1, "x", None),
               "mask": np.eye(2, dtype=bool), "nan": float("nan"), "n": np.int64(3)}
    back = wire.decode(wire.encode(message))
    assert back["a"].dtype == np.float32 and np.array_equal(back["a"], message["a"])
    assert back["t"] == (1, "x", None) and back["mask"].dtype == np.bool_
    assert np.isnan(back["nan"]) and back["n"] == 3
    sneaky = np.ones((2, 2)).view(_Agreeable)
    crossed = wire.decode(wire.encode({"out": sneaky}))["out"]
    assert type(crossed) is np.ndarray  # the subclass's code stayed behind
    assert np.abs(crossed - np.zeros((2, 2))).max() == 1.0
    with pytest.raises(TypeError, match="array of numbers"):
        wire.encode({"out": np.array([object()])})
    with pytest.raises(TypeError, match="cannot cross"):
        wire.encode({"f": print})


# --- fresh problems ---------------------------------------------------------------------


def test_drawn_problems_follow_the_seed_cover_the_features_and_every_row_sees_a_key():
    assert drawn_cases(5) == drawn_cases(5)
    assert drawn_cases(5) != drawn_cases(6)
    seen = set()
    for seed in range(20):
        cases = drawn_cases(seed)
        assert len(cases) == DRAWN + 1 and len({c.name for c in cases}) == DRAWN + 1
        assert max(c.spec.sizes[3] * c.spec.sizes[4] for c in cases) > 64 * 64  # a large one
        for case in cases:
            seen |= features(case.spec, "float32")
            q, k, v, kwargs = inputs(case.spec, "float32", seed)
            visible = kernels.prepare(q, k, v, **kwargs).visible()  # (B, H, Lq, Lk)
            mask = kwargs.get("mask")
            if mask is not None and mask.dtype != np.bool_:
                visible &= np.isfinite(mask)
            assert visible.any(-1).all(), case.name  # no query without a key
    assert {"cross", "gqa", "dv", "causal", "bottom-right", "bool-mask", "float-mask",
            "key-lengths"} <= seen
    assert any(c.spec.scale is not None for s in range(5) for c in drawn_cases(s))


def test_a_table_of_one_seed_s_answers_fails_on_another_seed():
    named = {c.name for c in CASES}
    found = subject(impls.memorized_the_table)

    def agreement(seed):
        checks = [c for c in all_checks(quick=True, seed=seed)
                  if c.property == "agreement-float32"]
        return {c["case"]: c["status"] for c in run_checks(found, checks)[0]["cases"]}

    same = agreement(0)  # the seed the table was made under: its cases pass...
    assert all(same[name] == "pass" for name in named if name in same)
    assert all(status == "fail" for name, status in same.items() if name not in named)
    other = agreement(1)  # ...and on a new seed they fail too
    assert sum(other[name] == "fail" for name in named if name in other) >= len(named) - 1


@pytest.mark.slow  # three runs of the battery in a worker: left out of the quick lane
def test_two_runs_draw_new_problems_and_the_seed_replays_a_run():
    first, second = (conform(["reference"], quick=True) for _ in range(2))
    assert first["seed"] != second["seed"]

    def drawn(report):
        cases = _property(report["implementations"][0], "agreement-float64")["cases"]
        return [c["case"] for c in cases if c["case"].startswith("drawn")]

    assert drawn(first) != drawn(second) and len(drawn(first)) == DRAWN + 1
    replay = conform(["reference"], quick=True, seed=first["seed"])

    def results(report):
        return [(p["name"], p["status"], p["detail"],
                 [(c["case"], c["status"], c.get("max_error"), c.get("tolerance"))
                  for c in p.get("cases", [])])
                for p in report["implementations"][0]["properties"]]

    assert results(replay) == results(first)
    assert first["implementations"][0]["verdict"] == "conforms"


# --- the oracle and the clock outside ---------------------------------------------------


def test_a_cheat_that_reads_its_callers_frames_finds_the_answer_only_in_process():
    hidden = [c for c in all_checks(quick=True) if c.property == "hidden-values"]
    in_process = run_checks(subject(impls.fishes_for_the_answer), hidden)[0]
    assert in_process["status"] == "pass"  # the expected output lived in a caller's frame
    report = conform([f"{IMPLS}:fishes_for_the_answer"], quick=True)
    entry = report["implementations"][0]
    assert entry["verdict"] == "fails"
    assert _property(entry, "hidden-values")["status"] == "fail"
    assert _property(entry, "agreement-float32")["status"] == "fail"


@pytest.mark.slow  # a worker per cheat: left out of the quick lane
def test_a_cheat_that_patches_the_judge_in_its_process_fails():
    report = conform([f"{IMPLS}:patches_the_judge"], quick=True)
    entry = report["implementations"][0]
    assert entry["verdict"] == "fails"
    for name in ("agreement-float32", "inputs-untouched", "no-cache"):
        assert _property(entry, name)["status"] == "fail", name


@pytest.mark.slow  # the speed section and a worker: left out of the quick lane
def test_the_speed_section_is_timed_by_the_judge_s_clock(monkeypatch):
    from attnbench.conformance import speed

    monkeypatch.setattr(speed, "LENGTHS", (128, 256, 384))
    report = conform([f"{IMPLS}:slows_the_clock"])
    entry = report["implementations"][0]
    points = _property(entry, "speed")["cases"][0]["data"]["points"]
    # numba against numba, with the subject's clock 100 times slow: a timer in its
    # process would give ~0.01; the judge's clock gives about 1
    assert [p["L"] for p in points] == [128, 256, 384]
    assert all(p["ratio_to_numba"] > 0.3 for p in points), points
    assert _property(entry, "after-timing")["status"] == "pass"
    assert entry["verdict"] == "conforms"


# --- what the process boundary must not hide, and what a fixed battery would miss -------


def test_a_kept_output_buffer_is_seen_across_the_process_boundary():
    report = conform([f"{IMPLS}:reuses_its_buffer"], quick=True)
    fresh = _property(report["implementations"][0], "fresh-output")
    assert fresh["status"] == "fail" and "output buffer is reused" in fresh["detail"]


def test_a_cache_keyed_on_identity_fails_on_values_written_in_place():
    checks = [c for c in all_checks(quick=True, seed=3) if c.property == "no-cache"]
    result = run_checks(subject(impls.caches_by_identity), checks)[0]
    assert result["status"] == "fail" and "in place" in result["detail"], result


def test_an_implementation_correct_only_on_small_problems_fails_the_large_drawn_one():
    checks = [c for c in all_checks(quick=True, seed=4) if c.property == "agreement-float32"]
    cases = run_checks(subject(impls.correct_when_small), checks)[0]["cases"]
    failed = [c["case"] for c in cases if c["status"] == "fail"]
    assert failed and all(name.startswith(f"drawn-{DRAWN + 1}") for name in failed), failed


def test_the_count_of_calls_before_the_drift_check_is_drawn_each_run():
    counts = {many_calls(seed) for seed in range(50)}
    assert min(counts) >= MANY[0] and max(counts) < MANY[1] and len(counts) > 20
