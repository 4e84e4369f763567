"""scripts/gpu-check.sh as far as it runs without a GPU: its arguments, its refusal to
pretend, its plan, and its whole path in Numba's CUDA simulator (results the report loads).

On a machine with a GPU, the device run itself is ``scripts/gpu-check.sh`` (not run here:
it installs into a venv and takes minutes)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from attnbench import gpu_check
from attnbench.cli import main as attnbench_main

pytest.importorskip("numba.cuda", reason="numba-cuda is missing: pip install attnbench[cuda]")

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "scripts" / "gpu-check.sh"
HAS_GPU = os.path.exists("/dev/nvidiactl") or shutil.which("nvidia-smi") is not None

pytestmark = pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")


def run_script(*args, timeout=240):
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_ENABLE_CUDASIM"}
    return subprocess.run(["bash", str(SCRIPT), *args], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=timeout)


def test_help_lists_the_options():
    proc = run_script("--help")
    assert proc.returncode == 0
    for word in ("--simulator", "--dry-run", "--out", "--python", "--venv", "--budget",
                 "exit status"):
        assert word in proc.stdout, word


@pytest.mark.parametrize("args, message", [
    (["--bogus"], "unknown argument: --bogus"),
    (["--budget", "soon"], "--budget must be whole seconds"),
    (["--out"], "--out needs a folder"),
])
def test_bad_arguments_exit_2(args, message):
    proc = run_script(*args)
    assert proc.returncode == 2 and message in proc.stderr


@pytest.mark.skipif(HAS_GPU, reason="tests the refusal without a GPU, and this machine has one")
def test_without_a_gpu_device_mode_runs_nothing_and_says_so(tmp_path):
    proc = run_script("--venv", str(tmp_path / "venv"))
    assert proc.returncode == 2
    assert "no NVIDIA GPU here" in proc.stderr and "nothing ran on a device" in proc.stderr
    assert not (tmp_path / "venv").exists()  # and installed nothing


def test_dry_run_prints_the_plan_and_installs_nothing(tmp_path):
    proc = run_script("--dry-run", "--venv", str(tmp_path / "venv"))
    assert proc.returncode == 0, proc.stderr
    assert 'pip install -e ".[test,cuda]"' in proc.stdout
    assert "NUMBA_ENABLE_CUDASIM=0" in proc.stdout and "--mode device" in proc.stdout
    assert "dry run: nothing was installed or run." in proc.stdout
    assert not (tmp_path / "venv").exists()
    proc = run_script("--dry-run", "--simulator", "--python", sys.executable)
    assert proc.returncode == 0, proc.stderr
    for line in gpu_check.plan("simulator", Path("reports/gpu-check")):
        assert line in proc.stdout


def test_the_mode_must_match_the_machine(monkeypatch, capsys):
    monkeypatch.setattr(gpu_check, "_where", lambda mode: (False, "a device was asked for "
                                                           "but NUMBA_ENABLE_CUDASIM is set"))
    assert gpu_check.main(["--mode", "device", "--out", "unused"]) == 2
    assert "NUMBA_ENABLE_CUDASIM is set" in capsys.readouterr().err
    matches, where = gpu_check._where("device")  # the real answer, in this test process
    assert not matches or where.startswith("DEVICE")


@pytest.mark.slow  # an end-to-end run of the script in the simulator: left out of the quick lane
def test_simulator_run_writes_results_the_report_loads(tmp_path):
    out = tmp_path / "gpu"
    proc = run_script("--simulator", "--python", sys.executable, "--out", str(out))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    last = [line for line in proc.stdout.splitlines() if line.startswith("RESULT:")]
    assert last and "ran ONLY IN THE SIMULATOR" in last[0] and "tests passed" in last[0]
    assert "CUDA runs in: SIMULATOR" in proc.stdout
    summary = json.loads((out / "gpu-check.json").read_text())
    assert summary["ran_on"] == "simulator" and summary["exit_status"] == 0
    assert summary["device"]["simulator"] is True
    assert summary["tests"]["counts"]["passed"] >= 3 and summary["tests"]["status"] == "passed"
    table = pd.read_csv(out / "sweep.csv")
    assert set(table["backend"]) == {"cuda"} and (table["status"] == "ok").all()
    assert (table["device"] == "CUDA simulator").all()
    assert table["timing_method"].str.contains("NOT GPU time").all()
    assert (table["max_abs_err"] <= table["tolerance"]).all()
    assert {"h2d_ms", "d2h_ms", "host_call_ms"} <= set(table.columns)
    assert (out / "sweep.jsonl").exists() and (out / "report.html").exists()
    assert attnbench_main(["report", str(out)]) == 0
    page = (out / "report.html").read_text()
    assert "CUDA simulator" in page and "NOT GPU time" in page
