"""The conformance battery: broken implementations are caught, with the bug named.

Each implementation of :mod:`tests.conformance_impls` is broken in one way; the battery
(run in-process here, through :func:`attnbench.conformance.subject`) must fail it on a
correctness or determinism property whose detail points at the bug.  A correct
implementation written here in the ``sdpa`` convention passes every correctness property.
The subprocess runner, the CLI, its JSON and its exit codes are in
``test_conformance_cli.py``.
"""

import numpy as np
import pytest

from attnbench.conformance import Implementation, all_checks, subject
from attnbench.conformance.battery import PROPERTIES, run_checks
from attnbench.conformance.cases import CASES, FEATURES, features, probe_problem
from attnbench.measure.specs import BUILTINS, check_spec, resolve
from tests import conformance_impls as impls


def battery(function, convention=None, kinds=("correctness", "determinism"), cases=None):
    """property name -> summary, for the quick battery's properties of ``kinds`` (and
    only the cases named in ``cases``, if given)."""
    found = subject(function, convention=convention)
    checks = [c for c in all_checks(quick=True) if c.kind in kinds
              and (cases is None or c.case in cases)]
    return {p["name"]: p for p in run_checks(found, checks)}


# (broken implementation, property that must fail, words its detail must contain)
BROKEN = [
    pytest.param(impls.no_scaling, "agreement-float32", "scaling is missing", id="no-scaling"),
    pytest.param(impls.nan_leak, "hidden-values", "hidden values are read", id="nan-leak"),
    pytest.param(impls.ignores_key_lengths, "agreement-float32", "key_lengths are ignored",
                 id="ignores-key-lengths"),
    pytest.param(impls.sees_future, "future-tokens", "sees future tokens", id="sees-future"),
    pytest.param(impls.sees_future, "agreement-float32", "causal mask is ignored",
                 id="sees-future-agreement"),
    pytest.param(impls.wrong_alignment, "agreement-float32", "causal alignment is wrong",
                 id="wrong-alignment"),
    pytest.param(impls.interleaved_gqa, "agreement-float32", "interleaved",
                 id="interleaved-gqa"),
    pytest.param(impls.noisy, "repeatable", "differs from call 1", id="noisy"),
    pytest.param(impls.float32_only, "shape-dtype", "float64 inputs gave a float32 output",
                 id="float32-only"),
    pytest.param(impls.batch_dependent, "batch-invariance", "depends on its batch mates",
                 id="batch-dependent"),
    # cheats (attnbench.conformance.integrity)
    pytest.param(impls.ignores_scale, "agreement-float32", "scale argument is ignored",
                 id="ignores-scale"),
    pytest.param(impls.zeroes_its_inputs, "inputs-untouched", "wrote into its input(s) q, k, v",
                 id="zeroes-its-inputs"),
    pytest.param(impls.writes_into_q, "fresh-output", "shares memory with the input(s) q",
                 id="writes-into-q"),
    pytest.param(impls.reuses_its_buffer, "fresh-output", "first call's output buffer",
                 id="reuses-its-buffer"),
    pytest.param(impls.caches_by_shape, "no-cache", "new values in new arrays",
                 id="caches-by-shape"),
    pytest.param(impls.caches_by_fingerprint, "no-cache", "same shapes, sums, first and last",
                 id="caches-by-fingerprint"),
]


@pytest.mark.parametrize("function, failing, words", BROKEN)
def test_a_broken_implementation_fails_with_its_bug_named(function, failing, words):
    results = battery(function)
    assert results[failing]["status"] == "fail", results[failing]
    assert words in results[failing]["detail"], results[failing]["detail"]
    case = results[failing]["cases"]
    assert any(c["status"] == "fail" and c.get("case") for c in case)  # the case is named


def test_the_noisy_one_passes_correctness_and_fails_only_determinism():
    results = battery(impls.noisy)
    for name, kind in PROPERTIES:
        if kind == "correctness" and name not in ("gradients", "after-timing"):  # quick
            assert results[name]["status"] == "pass", results[name]
    assert results["thread-count"]["status"] == "fail"


def test_an_implementation_that_raises_is_an_error_not_unsupported():
    results = battery(impls.raises, kinds=("correctness",))
    assert {p["status"] for p in results.values()} == {"error"}
    assert "RuntimeError: boom" in results["agreement-float32"]["detail"]


def test_refused_features_are_unsupported_not_failed():
    def plain_only(q, k, v, *, scale=None):  # takes no mask, no causal, no key_lengths
        return impls.correct(q, k, v, scale=scale)

    results = battery(plain_only, kinds=("correctness",))
    agreement = results["agreement-float32"]
    assert agreement["status"] == "pass", agreement
    unsupported = [c for c in agreement["cases"] if c["status"] == "unsupported"]
    assert {c["case"] for c in unsupported} >= {"causal", "key-lengths", "bool-mask"}
    assert "TypeError" in unsupported[0]["detail"]
    assert results["hidden-values"]["status"] == "unsupported"


def test_the_reference_passes_everything_including_gradients():
    results = battery(Implementation(impls.correct, backward=_reference_backward))
    assert all(p["status"] == "pass" for p in results.values()), \
        {n: p["detail"] for n, p in results.items() if p["status"] != "pass"}


def _reference_backward(q, k, v, dout, **kwargs):
    from attnbench import kernels

    return kernels.attention_backward(q, k, v, dout, backend="reference", **kwargs)


def test_a_correct_sdpa_implementation_written_here_passes():
    pytest.importorskip("torch")
    results = battery(impls.sdpa, convention="sdpa")
    assert all(p["status"] == "pass" for p in results.values()), \
        {n: p["detail"] for n, p in results.items() if p["status"] != "pass"}
    # autograd through the adapter: gradients were checked, not skipped
    assert all(c["status"] == "pass" for c in results["gradients"]["cases"])


def test_conventions_are_observed_never_failed():
    found = subject(impls.nan_leak)
    checks = [c for c in all_checks(quick=True) if c.kind == "convention"]
    results = {p["name"]: p for p in run_checks(found, checks)}
    assert results["fully-masked-row"]["status"] == "pass"
    assert "NaN" in results["fully-masked-row"]["detail"]  # the plain formula's 0/0
    assert results["lse"]["status"] == "unsupported"  # it takes no return_lse


def test_every_case_and_feature_has_a_valid_probe_and_sizes():
    for feature in ("plain", *FEATURES):
        q, k, v, kwargs = probe_problem(feature)
        assert impls.correct(q, k, v, **kwargs).shape[:3] == q.shape[:3]
    names = [c.name for c in CASES]
    assert len(set(names)) == len(names)
    assert features(CASES[0].spec, np.float64) == {"float64"}


def test_specs():
    assert set(BUILTINS) == {"reference", "numba", "cuda", "numpy", "torch", "jax"}
    assert check_spec("tests.conformance_impls:sdpa")
    for bad in ("", "nonsense-name", "a:b:c", "mod:"):
        with pytest.raises(ValueError):
            check_spec(bad)
    found = resolve("tests.conformance_impls:sdpa", convention="sdpa")
    assert found.function is impls.sdpa and found.convention == "sdpa"
    assert resolve("numpy").convention == "kernels"


def test_builtins_are_registered_as_entry_points():
    from importlib.metadata import entry_points

    registered = {ep.name: ep.value for ep in entry_points(group="attnbench.implementations")}
    assert set(BUILTINS) <= set(registered), registered
    assert registered["torch"] == "attnbench.measure.builtins:torch"


def test_jax_convention():
    pytest.importorskip("jax")
    # a few cases: jax compiles every new shape (about a second each on 2 cores)
    results = battery("jax", kinds=("correctness",), cases={"odd", "causal", "key-lengths"})
    assert results["agreement-float32"]["status"] == "pass", results["agreement-float32"]
    # what jax does, recorded (docs/conformance.md): float64 computed at float32 precision
    assert results["agreement-float64"]["status"] == "fail"


def test_speed_section_times_beside_numba_and_fits_an_exponent(monkeypatch):
    from attnbench.conformance import speed

    monkeypatch.setattr(speed, "LENGTHS", (64, 128, 192, 256))
    found = subject("numpy")
    results = {p["name"]: p for p in run_checks(found, speed.checks())}
    full = results["speed"]
    assert full["status"] == "pass" and full["kind"] == "speed"
    points = full["cases"][0]["data"]["points"]
    assert [p["L"] for p in points] == [64, 128, 192, 256]
    assert all(p["gflops"] > 0 and p["ratio_to_numba"] > 0 for p in points)
    assert "GFLOP/s" in full["summary"] and "numba" in full["detail"]
    assert "thread" in full["detail"]  # the thread count the machine gave, said


def test_an_implementation_that_drifts_after_many_calls_fails():
    """Correct for its first 40 calls (the capability probes and the first checks), wrong
    after: the check after many calls catches it, and so does the one after the speed
    section (whose timed calls pass the 40 on their own)."""
    from attnbench.conformance.integrity import many_calls

    impls._CALLS[0] = 0
    many = many_calls(0)  # the battery's seed
    results = battery(impls.drifts_after_calls, cases=[f"{many}-calls"])
    assert results["after-many-calls"]["status"] == "fail"
    assert f"wrong on new values after {many} calls" in results["after-many-calls"]["detail"]


def test_an_implementation_that_drifts_once_timed_fails_after_the_speed_section(monkeypatch):
    from attnbench.conformance import integrity, speed

    monkeypatch.setattr(speed, "LENGTHS", (32, 48, 64))
    impls._CALLS[0] = 0
    found = subject(impls.drifts_after_calls)
    results = {p["name"]: p for p in run_checks(found, [speed.checks()[0],
                                                        *integrity.after_timing_checks()])}
    assert results["speed"]["status"] == "pass"
    assert results["after-timing"]["status"] == "fail"
    assert "after the speed section" in results["after-timing"]["detail"]
