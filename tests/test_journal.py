"""The sweep journal: rows on disk as points finish, point keys, and ``--resume``."""

import json

import numpy as np
import pandas as pd
import pytest

from attnbench.cli import main
from attnbench.sweep.grid import Grid, Point, expand
from attnbench.sweep.journal import (
    MACHINE_FIELD,
    Journal,
    journaled,
    load_journal,
    point_key,
    point_of_row,
)

FAST = ["--max-time", "0.002", "--no-progress"]


def test_point_key_is_stable_readable_and_round_trips():
    point = Point("numba", 128, 64, 8, 2, 3, "causal", "float32")
    assert point_key(point) == "numba|L=128|d_k=64|H=8|Hkv=2|B=3|causal|float32"
    row = {**point.as_dict(), "status": "ok", "L": np.int64(128)}  # as a table gives it back
    assert point_of_row(row) == point
    keys = {point_key(p) for p in expand([Grid(L=(8, 16), mask=("none", "bool"),
                                               backend=("numba", "numpy"))])}
    assert len(keys) == 8  # one key per point


def fake_row(point, status="ok", **extra):
    return {**point.as_dict(), "status": status, "reason": "", "median_ms": np.float64(1.5),
            "runs": np.int64(3), "within_tolerance": pd.NA, "hostname": "host-a", **extra}


def test_each_row_is_on_disk_when_append_returns(tmp_path):
    points = expand([Grid(L=(8, 16, 32), d_k=(4,), heads=(1,), backend=("numpy",))])
    journal = Journal(tmp_path / "sweep.jsonl", settings={"max_time": 0.1})
    try:
        for index, point in enumerate(points):
            journal.append(fake_row(point, **{MACHINE_FIELD: {"cpu_model": "X"}}))
            # Another reader sees every row so far: nothing waits in a buffer.
            assert len(load_journal(tmp_path / "sweep.jsonl").rows) == index + 1
    finally:
        journal.close()
    found = load_journal(tmp_path / "sweep.jsonl")
    assert found.header["settings"] == {"max_time": 0.1}
    assert found.machines == {"host-a": {"cpu_model": "X"}}  # written once per host
    lines = (tmp_path / "sweep.jsonl").read_text().splitlines()
    assert sum('"type": "machine"' in line for line in lines) == 1
    row = found.rows[point_key(points[0])]
    assert row["median_ms"] == 1.5 and row["runs"] == 3 and row["within_tolerance"] is None
    assert MACHINE_FIELD not in row and row["run_id"] == journal.run_id


def test_a_line_cut_short_by_a_crash_is_skipped_and_appending_goes_on(tmp_path):
    path = tmp_path / "sweep.jsonl"
    point, other = Point("numpy", 8, 4, 1, 1, 1, "none", "float32"), Point(
        "numpy", 16, 4, 1, 1, 1, "none", "float32")
    with Journal(path) as journal:
        journal.append(fake_row(point))
    with open(path, "a") as file:
        file.write('{"type": "row", "key": "numpy|L=16')  # the crash
    found = load_journal(path)
    assert list(found.rows) == [point_key(point)] and found.unreadable_lines == 1
    with Journal(path, resume=True) as journal:
        journal.append(fake_row(other))
    found = load_journal(path)
    assert set(found.rows) == {point_key(point), point_key(other)}
    assert found.unreadable_lines == 1


def test_journaled_executor_skips_done_points_and_reruns_failed_ones(tmp_path):
    points = expand([Grid(L=(8, 16, 32, 64), d_k=(4,), heads=(1,), backend=("numpy",))])
    previous = {point_key(points[0]): fake_row(points[0], "ok"),
                point_key(points[1]): fake_row(points[1], "skipped"),
                point_key(points[2]): fake_row(points[2], "failed")}
    path = tmp_path / "sweep.jsonl"
    with Journal(path) as journal:
        for row in previous.values():
            journal.append(row)
    found = load_journal(path)
    assert set(found.done()) == {point_key(points[0]), point_key(points[1])}
    ran = []

    def executor(todo, run_point):
        for point in todo:
            ran.append(point)
            yield run_point(point)

    with Journal(path, resume=True) as journal:
        rows = list(journaled(executor, journal, found.done())(
            points, lambda point: fake_row(point, median_ms=2.0)))
    assert ran == points[2:]  # the failed point and the one never run
    assert [row["resumed"] for row in rows] == [True, True, False, False]
    assert [row["median_ms"] for row in rows] == [1.5, 1.5, 2.0, 2.0]
    after = load_journal(path)
    assert after.rows[point_key(points[2])]["status"] == "ok"  # the last row of a key wins


@pytest.mark.slow  # an end-to-end sweep: left out of the quick lane
def test_serial_sweep_writes_the_journal_and_resume_reruns_nothing_done(tmp_path, capsys):
    args = ["sweep", "--L", "8", "16", "32", "--dk", "4", "--heads", "1", "--backend",
            "numpy", "numba", "reference", "--out", str(tmp_path), *FAST]
    assert main(args) == 0
    first = pd.read_csv(tmp_path / "sweep.csv")
    found = load_journal(tmp_path / "sweep.jsonl")
    assert set(found.rows) == set(first["point_key"]) and len(first) == 9
    assert found.machines and not first["resumed"].any()
    # Drop two points' rows from the journal, as if the sweep had died before them.
    lines = (tmp_path / "sweep.jsonl").read_text().splitlines()
    dropped = set(first["point_key"][:2])
    kept = [line for line in lines
            if not (line.startswith('{"type": "row"') and json.loads(line)["key"] in dropped)]
    (tmp_path / "sweep.jsonl").write_text("\n".join(kept) + "\n")
    assert "Threads: " in capsys.readouterr().out  # the first run checked its cores
    assert main([*args, "--resume"]) == 0
    printed = capsys.readouterr().out
    assert "Resume: 7 of 9 points are done" in printed
    # ... the resumed one takes the done rows' threads (the reference's rows, timed on one
    # BLAS thread whatever the count, do not count).
    assert "Threads: " not in printed
    second = pd.read_csv(tmp_path / "sweep.csv")
    others = second[second["backend"] != "reference"]
    assert others["threads"].nunique() == 1
    assert others["threads"].iloc[0] == first.loc[first["backend"] == "numba", "threads"].iloc[0]
    assert (second.loc[second["backend"] == "reference", "threads"] == 1).all()
    assert list(second["point_key"]) == list(first["point_key"])  # the points' order
    rerun = second[~second["resumed"]]
    assert set(rerun["point_key"]) == dropped
    assert (rerun["run_id"] != first["run_id"][0]).all()
    same = second[second["resumed"]].set_index("point_key")
    before = first.set_index("point_key").loc[same.index]
    assert (same["run_id"] == before["run_id"]).all()
    np.testing.assert_array_equal(same["median_ms"], before["median_ms"])
    # Everything done now: nothing runs.
    assert main([*args, "--resume"]) == 0
    assert pd.read_csv(tmp_path / "sweep.csv")["resumed"].all()


@pytest.mark.parametrize("spec", ["local", "local:0", "local:x", "tcp://host", "http://h:1", "x"])
def test_bad_cluster_specs_are_usage_errors(spec, capsys):
    with pytest.raises(SystemExit) as info:
        main(["sweep", "--cluster", spec])
    assert info.value.code == 2
    assert "expected local:N" in capsys.readouterr().err


def test_a_brief_timing_no_end_of_sweep_pass_replaced_is_not_done(tmp_path):
    """A sweep interrupted before its series pass journaled brief first timings: on resume
    those points run again (a resumed row is never re-measured)."""
    points = expand([Grid(L=(8, 16, 32, 64), d_k=(4,), heads=(1,), backend=("numpy",))])
    path = tmp_path / "sweep.jsonl"
    with Journal(path) as journal:
        journal.append({**fake_row(points[0]), "brief_timing": True})
        journal.append({**fake_row(points[1]), "brief_timing": True,
                        "series_interleaved": True})
        journal.append({**fake_row(points[2]), "brief_timing": True, "remeasured": True})
        journal.append({**fake_row(points[3]), "brief_timing": False})
    assert set(load_journal(path).done()) == {point_key(p) for p in points[1:]}
