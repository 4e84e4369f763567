"""``attnbench compare``: ratios with intervals, significance, regressions and the exit status,
on synthetic result folders (no timing of real code)."""

import numpy as np
import pandas as pd
import pytest

from attnbench.cli import main
from attnbench.compare import classify, compare_tables
from attnbench.measure.intervals import format_samples


def sweep(seconds: dict, *, seed=0, noise=0.02, n=20, samples=True):
    """A sweep table: backend numba, one row per L, ``seconds[L]`` true time per call."""
    rng = np.random.default_rng(seed)
    rows = []
    for L, true in seconds.items():
        wall = true * (1 + rng.exponential(noise, n))
        rows.append({"backend": "numba", "L": L, "d_k": 64, "heads": 4, "kv_heads": 4,
                     "batch": 1, "mask": "none", "dtype": "float32", "status": "ok",
                     "median_ms": np.median(wall) * 1e3,
                     **({"samples_ms": format_samples(wall)} if samples else {})})
    return pd.DataFrame(rows)


BASE = {256: 1e-3, 512: 4e-3, 1024: 16e-3}


@pytest.mark.parametrize("factor, change", [
    (1.0, "same"),  # the same machine and code: no significant change
    (1.3, "regression"),  # 30% slower: beyond the 10% threshold
    (1.05, "slower"),  # significant, within the threshold: not a regression
    (0.7, "improvement"),
    (0.97, "faster"),
])
def test_change_is_called_from_the_whole_interval(factor, change):
    before = sweep(BASE, seed=1, noise=0.01, n=40)
    after = sweep({L: t * factor for L, t in BASE.items()}, seed=2, noise=0.01, n=40)
    table = compare_tables(before, after)
    assert len(table) == 3
    assert (table["change"] == change).all(), table[["L", "ratio", "ratio_low", "ratio_high"]]
    assert (table["ratio_low"] <= table["ratio"]).all()
    assert (table["ratio"] <= table["ratio_high"]).all()
    assert table["regressed"].tolist() == [change == "regression"] * 3


def test_noise_that_hides_a_small_change_gives_no_significance():
    before = sweep(BASE, seed=3, noise=0.5, n=8)
    after = sweep({L: t * 1.05 for L, t in BASE.items()}, seed=4, noise=0.5, n=8)
    assert set(compare_tables(before, after)["change"]) <= {"same", "slower", "faster"}


def test_classify_rules():
    assert classify(1.2, 1.3, 0.1) == "regression"
    assert classify(1.05, 1.3, 0.1) == "slower"  # straddles 1.1: significant, not beyond
    assert classify(0.95, 1.05, 0.1) == "same"
    assert classify(float("nan"), 1.0, 0.1) == "no interval"


def test_rows_without_samples_get_a_ratio_but_no_verdict():
    table = compare_tables(sweep(BASE, samples=False), sweep(BASE, samples=False))
    assert (table["change"] == "no interval").all() and not table["regressed"].any()
    assert table["ratio"].notna().all()


def test_cli_exit_status_plot_and_csv(tmp_path, capsys):
    folders = {}
    for name, factor in (("a", 1.0), ("same", 1.0), ("slow", 1.5)):
        folders[name] = tmp_path / name
        folders[name].mkdir()
        sweep({L: t * factor for L, t in BASE.items()}, seed=len(name)).to_csv(
            folders[name] / "sweep.csv", index=False)
    assert main(["compare", str(folders["a"]), str(folders["same"])]) == 0
    assert main(["compare", str(folders["a"]), str(folders["slow"]), "--out",
                 str(tmp_path / "cmp")]) == 1
    assert (tmp_path / "cmp" / "compare.png").stat().st_size > 0
    written = pd.read_csv(tmp_path / "cmp" / "compare.csv")
    assert written["regressed"].all() and len(written) == 3
    assert "regression" in capsys.readouterr().out
    # A folder without a sweep, and two folders without a common point: exit 2.
    (tmp_path / "empty").mkdir()
    assert main(["compare", str(folders["a"]), str(tmp_path / "empty")]) == 2
    other = tmp_path / "other"
    other.mkdir()
    sweep({2048: 1e-2}).to_csv(other / "sweep.csv", index=False)
    assert main(["compare", str(folders["a"]), str(other)]) == 2


def test_notes_say_when_machines_differ_or_were_busy():
    from attnbench.compare import _machines_note

    quiet = {"load_average_1m_start": 0.2, "load_average_1m_end": 0.3,
             "machine": {"cpu_model": "X", "usable_cores": 2}}
    busy = {**quiet, "load_average_1m_end": 5.0}
    other = {**quiet, "machine": {"cpu_model": "Y", "usable_cores": 2}}
    assert _machines_note(quiet, quiet) == ""
    assert "B was measured on a busy machine" in _machines_note(quiet, busy)
    assert "different machines (X / Y)" in _machines_note(quiet, other)


@pytest.mark.parametrize("cores, load, busy", [
    (2, 1.2, False),  # the run on one or two cores and a shell: not busy on 2 cores
    (2, 2.0, False),  # as many runnable processes as cores: none waited
    (2, 2.5, True),  # more than one runnable process per core: some waited
    (16, 9.0, False),
    (16, 17.0, True),
])
def test_busy_means_more_runnable_processes_than_cores(cores, load, busy):
    from attnbench.compare import _machines_note

    quiet = {"load_average_1m_start": 0.1, "load_average_1m_end": 0.1,
             "machine": {"cpu_model": "X", "usable_cores": cores}}
    loaded = {**quiet, "load_average_1m_start": load}
    assert ("A was measured on a busy machine" in _machines_note(loaded, quiet)) is busy
    # without the affinity count, the logical cores decide
    logical = {**loaded, "machine": {"cpu_model": "X", "logical_cores": cores}}
    assert ("A was measured on a busy machine" in _machines_note(logical, quiet)) is busy
