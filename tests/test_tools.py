"""The tools in scripts/, each run once on tiny inputs (docs/guide/harness.md, "Tools").

Every file under scripts/ is run here or by a test named in :data:`RUN_BY`, so that a tool
that breaks against the code it measures fails the suite instead of its next user.
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SCRIPTS = REPO / "scripts"
#: Each file under scripts/ and the test that runs it.
RUN_BY = {
    "ab.py": "tests/test_tools.py::test_ab_old_head_against_the_tree",
    "compile_log.py": "tests/test_tools.py::test_compile_log_records_and_sums_up",
    "fit_tanh.py": "tests/test_tools.py::test_fit_tanh_fits_and_checks",
    "run_to_run.py": "tests/test_tools.py::test_run_to_run_one_run",
    "gpu-check.sh": "tests/test_gpu_check.py",
}


def _script(name: str, *args: str, timeout: float = 300, **env) -> subprocess.CompletedProcess:
    done = subprocess.run([sys.executable, str(SCRIPTS / name), *args], cwd=REPO,
                          capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, **env})
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    return done


def _module(name: str):
    spec = importlib.util.spec_from_file_location(name.removesuffix(".py"), SCRIPTS / name)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_script_is_run_by_a_test():
    present = {path.name for path in SCRIPTS.iterdir()
               if path.is_file() and path.name != "__pycache__"}
    assert present == set(RUN_BY), "a file under scripts/ without a test (add it to RUN_BY)"
    for test in RUN_BY.values():
        assert (REPO / test.split("::")[0]).is_file()


def test_ab_rounds_alternate_and_ratios_are_per_round():
    ab = _module("ab.py")
    assert [ab.order(i) for i in range(3)] == [("old", "new"), ("new", "old"), ("old", "new")]
    values = {"call": {"old": [1.0, 2.0, 4.0, 1.0, 1.0, 2.0, 1.0],
                       "new": [2.0, 2.0, 2.0, 2.0, 2.0, 2.0, 2.0]}}
    (row,) = ab.summarise(values)
    # per-round ratios 2, 1, 0.5, 2, 2, 1, 2: their median, not the ratio of the medians (1)
    assert row["ratio"] == 2.0 and row["rounds"] == 7
    assert (row["low"], row["high"]) == (0.5, 2.0)  # ranks 1 and 7 of 7 at 95%
    assert row["old_ms"] == 1e3 and row["new_ms"] == 2e3
    assert math.isnan(ab.summarise({"c": {"old": [1.0, 1.0], "new": [1.0, 2.0]}})[0]["low"])


@pytest.mark.slow
@pytest.mark.e2e  # two revisions compiled and timed
def test_ab_old_head_against_the_tree(tmp_path):
    """HEAD's kernels (extracted, in their own process) against the working tree's: one
    small causal forward, two rounds.  40-95 s on 2 shared cores, most of it Numba
    compiling the extracted tree's kernel (a new folder: a cold cache)."""
    out = tmp_path / "ab.json"
    done = _script("ab.py", "--old", "HEAD", "forward", "--L", "64", "--match", "causal",
                   "--rounds", "2", "--reps", "1", "--settle", "0", "--json", str(out))
    assert "forward L=64 causal" in done.stdout
    assert "n/a (fewer than 6 rounds)" in done.stdout
    assert done.stdout.startswith("CPU ")  # the machine record comes first
    result = json.loads(out.read_text())
    (row,) = result["rows"]
    assert row["rounds"] == 2 and row["ratio"] > 0 and row["old_ms"] > 0
    assert len(result["rounds"]["forward L=64 causal"]["old"]) == 2
    assert set(result["machines"]) == {"old", "new"}


def test_ab_refuses_an_unknown_workload():
    done = subprocess.run([sys.executable, str(SCRIPTS / "ab.py"), "--old", "HEAD",
                           "prefill"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "unknown workload prefill" in done.stderr


def test_compile_log_records_and_sums_up(tmp_path):
    """The plugin's hooks record one real compile; the script sums the file up."""
    prefix = tmp_path / "compiles"
    record = (
        "import sys; sys.path.insert(0, sys.argv[1]); import compile_log, numba\n"
        "compile_log.pytest_configure(None)\n"
        "class Item: nodeid = 'tests/test_x.py::test_y'\n"
        "compile_log.pytest_runtest_setup(Item())\n"
        "numba.njit(lambda x: x + 1)(1)\n"
        "compile_log.pytest_unconfigure(None)\n")
    subprocess.run([sys.executable, "-c", record, str(SCRIPTS)], check=True, timeout=120,
                   env={**os.environ, "COMPILE_LOG": str(prefix), "NUMBA_CACHE_DIR":
                        str(tmp_path / "cache")})
    (written,) = tmp_path.glob("compiles.*.json")
    (entry,) = json.loads(written.read_text())
    assert entry["test"] == "tests/test_x.py::test_y" and entry["seconds"] > 0
    done = _script("compile_log.py", str(prefix), "--axis", "0")
    assert "1 compiles" in done.stdout and "tests/test_x.py" in done.stdout


def test_fit_tanh_fits_and_checks():
    """A short fit and every 65536th float32 in [0, 20] through the kernels' tanh32."""
    done = _script("fit_tanh.py", "--iterations", "5", "--stride", "65536")
    assert "numerator   a1..a4:" in done.stdout
    line = done.stdout.strip().splitlines()[-1]
    assert "|tanh| > 1: False" in line
    worst = float(line.split("largest error ")[1].split(" ulp")[0])
    assert worst < 8  # the kernels' coefficients: 5.13 ulps over every float32


@pytest.mark.slow
@pytest.mark.e2e
def test_run_to_run_one_run():
    """C29's ratio measured in one fresh process; the allowance arithmetic on it."""
    done = _script("run_to_run.py", "--runs", "1")
    assert "run 1: ratio" in done.stdout and "needed allowance" in done.stdout
    rtr = _module("run_to_run.py")
    assert rtr.needed_allowance([1.0], [0.9], [1.1]) == 0.0
    assert rtr.needed_allowance([1.2], [0.9], [1.1]) == pytest.approx(1.2 / 1.1 - 1)
