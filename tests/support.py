"""Helpers shared by the differential tests: inputs, the oracle, and the tolerance.

Tolerance follows FlashAttention's tests (see :mod:`attnbench.measure.oracle`, shared with
``attnbench run``): a backend's error against the oracle must be at most twice the
error of a plain implementation of the same formula computed in the input dtype, plus
a small floor of a few ulps of the output's magnitude.  No fixed atol is picked to
make tests pass.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from attnbench import kernels
from attnbench.kernels.reference import forward as reference
from attnbench.measure.oracle import max_abs_error, oracle_dtype, oracle_runs, tolerance
from attnbench.measure.problems import ProblemSpec, make_inputs  # noqa: F401 (re-exported)

DTYPES = (np.float32, np.float64)

#: Every differential comparison made in this session: (backend, dtype, error, tolerance).
#: conftest.py prints the largest error per backend and dtype at the end of the run.
COMPARISONS: list[tuple[str, str, float, float]] = []


#: A differential test's problem: sizes and masking options (the package's own spec, so the
#: tests, the agreement table, the sweeps and the bench draw inputs from one generator).
Case = ProblemSpec


def oracle(q, k, v, **kwargs):
    """``(out, weights)`` of the oracle and of the same formula in q's dtype.

    The oracle dtype is float64 for float32 inputs and ``np.longdouble`` for float64
    inputs (:func:`attnbench.measure.oracle.oracle_dtype`), so the float64 baseline has an
    error of its own.
    """
    kwargs = dict(kwargs, return_weights=True)
    problem = kernels.prepare(q, k, v, **kwargs)
    exact, plain = oracle_runs(problem)
    exact = tuple(problem.restore(x) for x in exact)
    plain = tuple(problem.restore(x) for x in plain)
    return exact, plain


def assert_lse_near_the_oracle(lse: np.ndarray, problem) -> None:
    """``lse`` (in ``problem``'s layout, (B, H, Lq)) against the float64 reference's lse under
    the baseline-relative rule (the baseline: the reference's lse in the problem's dtype);
    rows that see no key are ``-inf`` in both."""
    exact = reference.run(problem, compute_dtype=oracle_dtype(problem.dtype),
                          keep_precision=True, return_lse=True)[-1]
    plain = reference.run(problem, compute_dtype=problem.dtype, return_lse=True)[-1]
    np.testing.assert_array_equal(np.isneginf(lse), np.isneginf(exact))
    assert max_error(lse, exact) <= tolerance(exact, plain, problem.dtype)


def max_error(result: np.ndarray, exact: np.ndarray) -> float:
    """Max |result - exact|; fails the test if the NaN/inf entries differ from the oracle's."""
    err = max_abs_error(result, exact)
    assert np.isfinite(err), "NaN or inf where the oracle has a number, or the reverse"
    return err


def assert_matches_reference(q, k, v, backend: str, **kwargs) -> float:
    """Run ``backend`` and check its output (and weights) against the oracle; return the error."""
    (exact_out, exact_w), (plain_out, plain_w) = oracle(q, k, v, **kwargs)
    out, weights = kernels.attention(q, k, v, backend=backend, return_weights=True, **kwargs)
    assert out.dtype == q.dtype and out.shape == exact_out.shape
    assert weights.shape == exact_w.shape
    err = max_error(out, exact_out)
    tol = tolerance(exact_out, plain_out, q.dtype)
    assert err <= tol, f"{backend}: output error {err:.3g} > tolerance {tol:.3g}"
    w_err = max_error(weights, exact_w)
    w_tol = tolerance(exact_w, plain_w, q.dtype)
    assert w_err <= w_tol, f"{backend}: weights error {w_err:.3g} > tolerance {w_tol:.3g}"
    # Without return_weights the fast path skips the L x L array: check that path too.
    out_only = kernels.attention(q, k, v, backend=backend, **kwargs)
    err_only = max_error(out_only, exact_out)
    assert err_only <= tol, f"{backend} (no weights): error {err_only:.3g} > tolerance {tol:.3g}"
    COMPARISONS.append((backend, np.dtype(q.dtype).name, max(err, err_only), tol))
    return max(err, err_only)


REPO = Path(__file__).resolve().parents[1]

#: Prepended to every script of :func:`run_ptx_script`: no libNVVM, nothing to compile with.
_NVVM_CHECK = """
import json, sys
try:
    from numba.cuda.cudadrv import nvvm
    nvvm.NVVM()
except Exception as exc:
    print(json.dumps({"skip": f"{type(exc).__name__}: {exc}"}))
    sys.exit(0)
"""


def run_ptx_script(body: str) -> dict:
    """Run ``body`` in a new Python process with the CUDA simulator off; its JSON result.

    The compiler (libNVVM) needs no GPU, but the simulator switched on by
    ``tests/conftest.py`` replaces it, so PTX is compiled in a process of its own.
    ``body`` prints one JSON object as its last line.  Skips the test where libNVVM is
    missing.
    """
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_ENABLE_CUDASIM"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    script = _NVVM_CHECK + textwrap.dedent(body)
    proc = subprocess.run([sys.executable, "-c", script], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    if "skip" in result:
        pytest.skip(f"the CUDA toolchain (NVVM) is missing: {result['skip']}")
    return result


def ptx_of_kernels(module: str) -> dict:
    """Compile every kernel of ``kernels.<module>`` (its ``compile_ptx_all(cc)``) for sm_80
    and sm_90 in a process of its own; per ``"name@sm_XY"``: whether the PTX targets that
    architecture, has an entry point, and its lines with a ``.f64`` instruction."""
    return run_ptx_script(f"""
import importlib
module = importlib.import_module("attnbench.kernels.{module}")
result = {{}}
for cc in [(8, 0), (9, 0)]:
    for name, ptx in module.compile_ptx_all(cc).items():
        result[f"{{name}}@sm_{{cc[0]}}{{cc[1]}}"] = {{
            "target": f".target sm_{{cc[0]}}{{cc[1]}}" in ptx,
            "entry": ".entry" in ptx,
            "f64_lines": [line.strip() for line in ptx.splitlines() if ".f64" in line],
        }}
print(json.dumps(result))
""")


def small_cuda_tiles(request, monkeypatch, compile_only=()) -> None:
    """What the cuda test files' autouse fixtures do: skip a test where the cuda backend
    cannot run (unless its name is in ``compile_only``: it only compiles to PTX), and give
    the kernels 4-thread blocks and 4-key tiles (the simulator runs a thread per thread)."""
    from attnbench.kernels._api import dispatch as _dispatch
    from attnbench.kernels.cuda import launch

    usable, why = _dispatch.cuda_status()
    if not usable and request.node.originalname not in compile_only:
        pytest.skip(why)
    monkeypatch.setattr(launch, "BLOCK_Q", 4)
    monkeypatch.setattr(launch, "BLOCK_K", 4)


def bench_without_pauses(patch: pytest.MonkeyPatch) -> None:
    """``attnbench bench``'s sections without the pause after each timed batch (``settle``:
    it lets a real measurement's threads go idle) and without extra rounds for a noisy median
    (``REMEASURE_SECONDS``): the tests of the bench check what it reports, and nothing they
    time is a measurement (together 32 of the tiny smoke run's 46 s, and 21 s of the decode
    section's test, were such pauses and rounds)."""
    from attnbench.bench import sections

    real = sections.timing_interleaved

    def without_pauses(*args, **kwargs):
        return real(*args, **dict(kwargs, settle=0.0))

    patch.setattr(sections, "timing_interleaved", without_pauses)
    patch.setattr(sections, "REMEASURE_SECONDS", 0.0)
