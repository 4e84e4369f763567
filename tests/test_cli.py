"""The ``attnbench`` command: ``run`` on the tiny grid, exit codes, and ``--help``."""

import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

import attnbench.sweep.agreement
from attnbench.cli import main
from attnbench.sweep.agreement import DTYPES as AGREEMENT_DTYPES
from attnbench.sweep.agreement import MASK_KINDS, select_backends
from kernels import has_real_gpu

REPO = Path(__file__).resolve().parents[1]


def test_run_tiny_grid_writes_the_csv_and_exits_0(tmp_path, capsys):
    out = tmp_path / "new" / "reports"  # created by the command
    assert main(["run", "--grid", "tiny", "--out", str(out), "--max-time", "0.005"]) == 0
    table = pd.read_csv(out / "agreement.csv")
    backends = select_backends()
    assert "cuda" not in backends or has_real_gpu()  # the simulator only when asked for
    assert len(table) == len(MASK_KINDS) * len(AGREEMENT_DTYPES) * len(backends)
    assert set(table["backend"]) == set(backends)
    assert set(table["mask"]) == set(MASK_KINDS)
    assert set(table["dtype"]) == {"float32", "float64", "float16", "bfloat16"}
    assert table["ok"].all()
    assert (table["max_abs_err"] <= table["tolerance"]).all()
    assert (table["median_ms"] > 0).all() and (table["gflops"] > 0).all()
    for column in ("cpu_model", "numba_threads", "blas", "numpy", "gemm_peak_gflops"):
        assert column in table  # every row carries the machine
    assert (out / "machine.json").exists()
    printed = capsys.readouterr().out
    assert "agree" in printed and "GEMM peak" in printed and "CPU" in printed
    assert f"{len(table)}/{len(table)} rows agree" in printed


@pytest.mark.slow  # an end-to-end run: left out of the quick lane
def test_run_exits_1_when_a_backend_disagrees(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(attnbench.sweep.agreement, "tolerance", lambda *args: -1.0)
    status = main(["run", "--grid", "tiny", "--backends", "reference", "--out",
                   str(tmp_path), "--max-time", "0.001"])
    assert status == 1
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


@pytest.mark.slow  # an end-to-end run: left out of the quick lane
def test_run_leaves_the_cuda_backend_alone_without_a_gpu(tmp_path):
    """Without a real GPU, ``run`` never imports kernels.cuda.launch (even with the simulator)."""
    script = (
        "import sys; from attnbench.cli import main; from kernels import has_real_gpu\n"
        "status = main(['run', '--grid', 'tiny', '--max-time', '0.001', '--out', sys.argv[1]])\n"
        "assert has_real_gpu() or 'kernels.cuda.launch' not in sys.modules\n"
        "sys.exit(status)\n"
    )
    env = dict(os.environ, PYTHONPATH=str(REPO))
    result = subprocess.run([sys.executable, "-c", script, str(tmp_path)], cwd=REPO, env=env,
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr


def test_ctrl_c_in_the_agreement_check_exits_130_without_a_traceback(tmp_path, monkeypatch,
                                                                       capsys):
    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(attnbench.sweep.agreement, "agreement_table", interrupted)
    assert main(["run", "--grid", "tiny", "--out", str(tmp_path)]) == 130
    assert "attnbench run: interrupted (Ctrl-C)" in capsys.readouterr().err


@pytest.mark.cuda
def test_the_agreement_grid_leaves_out_the_dtypes_a_backend_does_not_take():
    """cuda takes no half dtypes yet: its half rows are left out, not failed; its float32
    and float64 rows are there and agree (in Numba's CUDA simulator without a GPU)."""
    from attnbench.sweep.agreement import agreement_table, takes_dtype

    assert not takes_dtype("cuda", "bfloat16") and takes_dtype("numba", "float16")
    table = agreement_table("tiny", backends=["cuda"], max_time=0.001, settle=0.0,
                            with_machine=False)
    assert set(table["dtype"]) == {"float32", "float64"}
    assert len(table) == 2 * len(MASK_KINDS)  # one tiny shape x every mask kind x 2 dtypes
    assert table["ok"].all(), table[~table["ok"]]
