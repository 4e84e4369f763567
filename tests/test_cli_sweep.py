"""``attnbench sweep`` and ``attnbench report`` from the command line."""

import json

import pandas as pd
import pytest

from attnbench.cli import main
from attnbench.sweep.runner import PointRunner

FAST = ["--max-time", "0.002", "--no-progress"]


@pytest.mark.slow  # an end-to-end sweep: left out of the quick lane
def test_sweep_from_flags_writes_the_results_and_the_fits(tmp_path, capsys):
    status = main(["sweep", "--L", "8", "16", "32", "--dk", "4", "--heads", "2",
                   "--kv-heads", "1", "--mask", "none", "padding", "--backend", "numba",
                   "numpy", "--out", str(tmp_path), *FAST])
    assert status == 0
    table = pd.read_csv(tmp_path / "sweep.csv")
    assert len(table) == 3 * 2 * 2 and (table["status"] == "ok").all()
    assert set(table["kv_heads"]) == {1} and set(table["mask"]) == {"none", "padding"}
    assert (tmp_path / "sweep.json").exists() and (tmp_path / "scaling.csv").exists()
    fits = pd.read_csv(tmp_path / "scaling.csv")
    assert set(fits["quantity"]) == {"time", "cpu", "flops", "memory"}  # cpu: the work
    printed = capsys.readouterr().out
    assert "Sweep: 12 points: numba 6, numpy 6" in printed and "Scaling" in printed
    assert main(["report", str(tmp_path)]) == 0
    assert (tmp_path / "report.html").exists()


def test_sweep_flags_take_directions_and_variants(tmp_path, capsys):
    status = main(["sweep", "--L", "8", "16", "--dk", "4", "--heads", "2", "--mask", "causal",
                   "--backend", "numpy", "--direction", "forward", "backward", "--variant",
                   "none", "alibi", "--out", str(tmp_path), *FAST])
    assert status == 0
    table = pd.read_csv(tmp_path / "sweep.csv")
    assert len(table) == 2 * 2 * 2
    forward = table[table["direction"] == "forward"]
    assert (forward["status"] == "ok").all() and set(forward["variant"]) == {"none", "alibi"}
    backward = table[table["direction"] == "backward"]
    assert (backward["status"] == "skipped").all()  # the numpy peer has no backward
    printed = capsys.readouterr().out
    assert "numpy L=8 causal float32 backward alibi: skipped: the numpy peer has no" in printed


def test_sweep_from_a_toml_file(tmp_path):
    config = tmp_path / "grid.toml"
    config.write_text("[[grid]]\nL = [8, 16]\nd_k = 4\nheads = 1\nbackend = 'numpy'\n")
    assert main(["sweep", "--config", str(config), "--out", str(tmp_path / "out"), *FAST]) == 0
    assert list(pd.read_csv(tmp_path / "out" / "sweep.csv")["L"]) == [8, 16]


# (arguments, words the error on stderr must contain)
USAGE_ERRORS = [
    (["--L", "0"], "expected a positive integer, got '0'"),
    (["--L", "many"], "expected a positive integer, got 'many'"),
    (["--mask", "diagonal"], "invalid choice: 'diagonal'"),
    (["--backend", "jax"], "invalid choice: 'jax'"),
    (["--dtype", "int8"], "invalid choice: 'int8'"),
    (["--direction", "sideways"], "invalid choice: 'sideways'"),
    (["--variant", "window"], "variant 'window' is unknown; expected one of none, window-W"),
]


@pytest.mark.parametrize("args, words", USAGE_ERRORS)
def test_bad_flags_say_what_was_expected(args, words, capsys):
    with pytest.raises(SystemExit) as info:
        main(["sweep", *args])
    assert info.value.code == 2
    assert words in capsys.readouterr().err


def test_two_grid_sources_or_a_bad_file_are_usage_errors(tmp_path, capsys):
    config = tmp_path / "grid.toml"
    config.write_text("L = [8]\nheads = [0]\n")
    assert main(["sweep", "--config", str(config), "--L", "8"]) == 2
    assert "give the grid one way; got --config and grid flags" in capsys.readouterr().err
    assert main(["sweep", "--config", str(config)]) == 2
    assert "heads must hold positive integers; got 0" in capsys.readouterr().err
    assert main(["sweep", "--config", str(tmp_path / "missing.toml")]) == 2
    assert "missing.toml" in capsys.readouterr().err


def test_ctrl_c_writes_the_finished_rows_and_exits_130(tmp_path, monkeypatch, capsys):
    original = PointRunner.__call__
    calls = []

    def interrupt_third(self, point):
        calls.append(point)
        if len(calls) == 3:
            raise KeyboardInterrupt
        return original(self, point)

    monkeypatch.setattr(PointRunner, "__call__", interrupt_third)
    status = main(["sweep", "--L", "8", "16", "32", "64", "--dk", "4", "--heads", "1",
                   "--backend", "numpy", "--out", str(tmp_path), *FAST])
    assert status == 130
    assert list(pd.read_csv(tmp_path / "sweep.csv")["L"]) == [8, 16]
    meta = json.loads((tmp_path / "sweep.json").read_text())
    assert meta["interrupted"] and meta["n_points"] == 4 and meta["n_rows"] == 2
    assert "Interrupted: kept 2 of 4 points" in capsys.readouterr().out


def test_help_of_sweep_and_report(capsys):
    for command, words in (("sweep", ["--L", "--dk", "--heads", "--kv-heads", "--batch",
                                      "--mask", "--dtype", "--backend", "--config", "--grid",
                                      "--out", "--max-time", "Exit status", "torch"]),
                           ("report", ["FOLDER", "--html", "Nothing is measured again",
                                       "Exit status"])):
        with pytest.raises(SystemExit) as info:
            main([command, "--help"])
        assert info.value.code == 0
        text = " ".join(capsys.readouterr().out.split())  # argparse wraps lines anywhere
        for word in words:
            assert word in text, (command, word)
