"""The ``attnbench`` command: ``run`` on the tiny grid, exit codes, and ``--help``."""

import os
import subprocess
import sys
from pathlib import Path

import ml_dtypes
import pandas as pd
import pytest

import attnbench.cli.run
import attnbench.sweep.agreement
from attnbench.cli import main
from attnbench.sweep.agreement import MASK_KINDS, select_backends

REPO = Path(__file__).resolve().parents[1]


def test_run_exits_1_when_a_backend_disagrees(tmp_path, monkeypatch, capsys):
    """A disagreeing backend makes the exit status 1, and the run goes on to the sweep, the
    studies and the report (``run_job``, whose whole run tests/test_end_to_end.py checks:
    here it only records what it was given)."""
    given = {}

    def run_job(args, *, agreement_status, **kwargs):
        given["agreement_status"] = agreement_status
        return max(agreement_status, 0)

    monkeypatch.setattr(attnbench.sweep.agreement, "tolerance", lambda *args: -1.0)
    monkeypatch.setattr(attnbench.cli.run, "run_job", run_job)
    status = main(["run", "--grid", "tiny", "--backends", "reference", "--out",
                   str(tmp_path), "--max-time", "0.001"])
    assert status == 1 and given == {"agreement_status": 1}
    assert "NO" in capsys.readouterr().out
    assert not pd.read_csv(tmp_path / "agreement.csv")["ok"].any()


def test_unavailable_backend_is_a_usage_error(monkeypatch, capsys):
    monkeypatch.setattr(attnbench.sweep.agreement, "available_backends",
                        lambda: ["reference", "numba"])
    with pytest.raises(ValueError, match="cuda"):
        select_backends(["cuda"])
    assert main(["run", "--grid", "tiny", "--backends", "cuda"]) == 2
    assert "cannot run here" in capsys.readouterr().err


def test_help(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["--help"])
    assert exit_info.value.code == 0
    assert "run" in capsys.readouterr().out
    with pytest.raises(SystemExit) as exit_info:
        main(["run", "--help"])
    assert exit_info.value.code == 0
    text = capsys.readouterr().out
    for option in ("--out", "--grid", "--backends", "--max-time", "Exit status"):
        assert option in text


def test_a_command_is_required(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main([])
    assert exit_info.value.code == 2


def test_python_dash_m_help():
    env = dict(os.environ, PYTHONPATH=str(REPO))
    result = subprocess.run([sys.executable, "-m", "attnbench", "--help"], cwd=REPO, env=env,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert "usage: attnbench" in result.stdout and "run" in result.stdout


def test_ctrl_c_in_the_agreement_check_exits_130_without_a_traceback(tmp_path, monkeypatch,
                                                                       capsys):
    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(attnbench.sweep.agreement, "agreement_table", interrupted)
    assert main(["run", "--grid", "tiny", "--out", str(tmp_path)]) == 130
    assert "attnbench run: interrupted (Ctrl-C)" in capsys.readouterr().err


@pytest.mark.slow  # the agreement grid in the CUDA simulator: left out of the quick lane
@pytest.mark.cuda
def test_the_agreement_grid_checks_cuda_in_half_precision_too(monkeypatch):
    """cuda's half rows are in the grid (no backend's dtype is left out) and agree, in
    Numba's CUDA simulator without a GPU; bfloat16 only (its float32 rows are the ones
    tests/test_cuda.py checks, and each dtype doubles the simulator's time).  A simulated
    kernel's time means nothing: each row is timed by one call, not a warm-up and three."""
    from attnbench.sweep import agreement
    from attnbench.sweep.agreement import agreement_table

    measure = agreement.measure
    monkeypatch.setattr(agreement, "measure", lambda fn, **kw: measure(
        fn, **{**kw, "warmup": 0, "repeat": 1, "min_repeat": 1, "number": 1}))

    table = agreement_table("tiny", backends=["cuda"], dtypes=(ml_dtypes.bfloat16,),
                            max_time=0.001, settle=0.0, with_machine=False)
    assert set(table["dtype"]) == {"bfloat16"}
    assert len(table) == len(MASK_KINDS)  # one tiny shape x every mask kind
    assert table["ok"].all(), table[~table["ok"]]
