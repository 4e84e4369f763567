"""Sweeps on a Dask ``local:N`` cluster: same rows as in-process, one timing per host,
a worker killed mid-sweep, failed-with-reason, and ``--resume`` over ``tcp://``.

Every cluster here listens on 127.0.0.1 only, without a dashboard.  Worker processes are
spawned (not forked); they import this module to unpickle the runners defined below.
"""

import os
import signal
import socket
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

pytest.importorskip("distributed", reason="dask.distributed is missing: pip install "
                                          "attnbench[cluster]")

from attnbench.cli import main  # noqa: E402
from attnbench.sweep.cluster import DaskExecutor, parse_cluster  # noqa: E402
from attnbench.sweep.cluster_tasks import host_timing_lock  # noqa: E402
from attnbench.sweep.grid import Grid, Point, expand  # noqa: E402
from attnbench.sweep.journal import Journal, journaled, load_journal, point_key  # noqa: E402
from attnbench.sweep.run import run_sweep, serial_executor  # noqa: E402
from attnbench.sweep.runner import PointRunner  # noqa: E402

PEAKS = {"float32": 100.0, "float64": 50.0}
FAST = ["--max-time", "0.002", "--no-progress"]


def quick_runner(cls=PointRunner, **kwargs):
    return cls(**{"max_time": 0.002, "gemm_peaks": dict(PEAKS), "settle": 0.0, **kwargs})


def sweep(points, executor, runner=None, **kwargs):
    return run_sweep(points, executor=executor, runner=runner or quick_runner(),
                     gemm_peaks=dict(PEAKS), progress=False, check_threads=False,
                     **kwargs).table


def assert_timings_never_overlap(table):
    """On each host, the wall-clock intervals of the timings are disjoint."""
    for host, rows in table.groupby("hostname"):
        rows = rows.sort_values("timed_from")
        starts, ends = rows["timed_from"].to_numpy(), rows["timed_to"].to_numpy()
        assert (starts[1:] >= ends[:-1]).all(), f"timings overlap on {host}"


@pytest.fixture(scope="module")
def local2(tmp_path_factory):
    # A lock file of its own: another sweep on this host (another test run) must not make
    # these timings wait, as it would with the shared default.
    lock = tmp_path_factory.mktemp("lock") / "timing.lock"
    with DaskExecutor("local:2", timeout=60, lock_path=lock) as executor:
        yield executor


def listening_addresses(pid):
    """Local addresses of the TCP sockets ``pid`` listens on (from /proc/net/tcp)."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    addresses = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        if not os.path.exists(table):
            continue
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] == "0A" and fields[9] in inodes:  # 0A: LISTEN
                addresses.append(fields[1])
    return addresses


# --- the cluster itself ------------------------------------------------------------------------


def test_parse_cluster():
    assert parse_cluster("local:3").n_workers == 3
    assert parse_cluster("tcp://10.0.0.5:8786").address == "tcp://10.0.0.5:8786"
    for bad in ("local:0", "local:", "tcp://nohost", "10.0.0.5:8786"):
        with pytest.raises(ValueError, match="expected local:N"):
            parse_cluster(bad)


def test_local_cluster_has_one_timing_slot_spawned_workers_and_only_loopback(local2):
    slots = local2.timing_slots()
    assert list(slots) == ["127.0.0.1"] and len(slots["127.0.0.1"]) == 1
    info = local2.workers()
    assert len(info) == 2 and all(w["host"] == "127.0.0.1" for w in info.values())
    methods = local2.client.run(lambda: __import__("multiprocessing").get_start_method())
    assert set(methods.values()) == {"spawn"}
    # Every socket the scheduler and nannies (this process) and the workers listen on is
    # on 127.0.0.1 (0100007F in /proc/net/tcp), the scheduler's HTTP server included.
    pids = [os.getpid(), *local2.worker_pids().values()]
    listening = {pid: listening_addresses(pid) for pid in pids}
    assert all(listening.values())  # the check below sees the sockets
    for pid, addresses in listening.items():
        for address in addresses:
            assert address.startswith("0100007F:"), (pid, address)


def test_a_host_with_two_timing_slots_is_refused():
    executor = DaskExecutor("local:2")
    executor.timing_slots = lambda: {"10.0.0.1": ["tcp://10.0.0.1:1", "tcp://10.0.0.1:2"]}
    executor.client = object()  # never reached: the check fails first
    with pytest.raises(RuntimeError, match="timings would overlap: host 10.0.0.1 has 2"):
        executor.check_workers()


def test_the_host_lock_makes_a_second_timer_wait(tmp_path):
    lock = tmp_path / "timing.lock"
    inside, waited = threading.Event(), []

    def first():
        with host_timing_lock(lock):
            inside.set()
            time.sleep(0.3)

    thread = threading.Thread(target=first)
    thread.start()
    inside.wait(5)
    with host_timing_lock(lock) as seconds:
        waited.append(seconds)
    thread.join()
    assert waited[0] > 0.2  # flock: a second open file waits for the first to let go


# --- the same rows as in-process ---------------------------------------------------------------

GRID = Grid(L=(8, 16, 32), d_k=(4,), heads=(2,), kv_heads=(1,),
            mask=("none", "causal", "padding", "bool"), backend=("numba", "numpy", "reference"))


@pytest.mark.slow  # a sweep across worker processes: left out of the quick lane
@pytest.mark.e2e
def test_local2_gives_the_rows_of_the_in_process_executor(local2):
    points = expand([GRID])
    here = sweep(points, executor=serial_executor)
    there = sweep(points, executor=local2)
    assert len(there) == len(here) == len(points) == 36
    key = ["backend", "L", "d_k", "heads", "kv_heads", "batch", "mask", "dtype"]
    here, there = here.set_index(key).sort_index(), there.set_index(key).sort_index()
    assert here.index.equals(there.index)  # the same points, each once
    assert (here["status"] == "ok").all() and (there["status"] == "ok").all()
    np.testing.assert_array_equal(there["flops"], here["flops"])
    # The tolerance depends only on the problem (oracle and plain error): identical.
    np.testing.assert_allclose(there["tolerance"], here["tolerance"], rtol=1e-12)
    assert (there["max_abs_err"] <= there["tolerance"]).all()
    assert (here["max_abs_err"] <= here["tolerance"]).all()
    assert there["within_tolerance"].all() and (there["median_ms"] > 0).all()
    # Each row says where it was timed, on the one worker holding the timing slot.
    (slot,) = local2.timing_slots()["127.0.0.1"]
    assert set(there["worker"]) == {slot}
    assert there["hostname"].eq(socket.gethostname()).all()
    assert there["cpu_model"].notna().all()
    assert_timings_never_overlap(there.reset_index())  # the resource kept them apart
    assert there["timing_lock_wait_s"].notna().all()  # each row says how long it waited


def test_cli_over_tcp_and_resume_reruns_nothing_done(local2, tmp_path, capsys):
    address = local2.client.scheduler.address
    assert address.startswith("tcp://127.0.0.1:")
    args = ["sweep", "--L", "8", "16", "32", "--dk", "4", "--heads", "1", "--backend",
            "numba", "numpy", "--out", str(tmp_path), "--cluster", address, *FAST]
    assert main(args) == 0
    printed = capsys.readouterr().out
    assert "Dask cluster tcp://127.0.0.1:" in printed and "timing slots: 127.0.0.1" in printed
    first = pd.read_csv(tmp_path / "sweep.csv")
    assert len(first) == 6 and (first["status"] == "ok").all()
    assert first["worker"].notna().all() and not first["resumed"].any()
    journal = load_journal(tmp_path / "sweep.jsonl")
    assert set(journal.rows) == set(first["point_key"]) and list(journal.machines)
    # The same sweep again with --resume: every point is done, nothing is submitted.
    assert main([*args, "--resume"]) == 0
    assert "Resume: 6 of 6 points are done" in capsys.readouterr().out
    second = pd.read_csv(tmp_path / "sweep.csv")
    assert second["resumed"].all() and (second["run_id"] == first["run_id"]).all()
    np.testing.assert_array_equal(second["median_ms"], first["median_ms"])
    rows_in_journal = (tmp_path / "sweep.jsonl").read_text().count('"type": "row"')
    assert rows_in_journal == 6  # nothing was measured again


# --- workers that die -------------------------------------------------------------------------


@dataclass
class SlowOnceRunner(PointRunner):
    """Sleeps in the timing of ``slow`` until killed, the first time only (a marker file)."""

    slow: Point | None = None
    marker: str = ""

    def _time(self, point):
        if point == self.slow and not os.path.exists(self.marker):
            Path(self.marker).write_text(str(os.getpid()))
            time.sleep(120)
        return super()._time(point)


@dataclass
class ExitingRunner(PointRunner):
    """Ends its worker process whenever it times ``deadly`` (a crash in a kernel, say)."""

    deadly: Point | None = None

    def _time(self, point):
        if point == self.deadly:
            os._exit(3)
        return super()._time(point)


@pytest.mark.slow  # a sweep across worker processes: left out of the quick lane
@pytest.mark.e2e
def test_a_worker_killed_mid_sweep_loses_no_finished_point(tmp_path):
    points = expand([Grid(L=(8, 16, 32, 64), d_k=(4,), heads=(1,), backend=("numpy", "numba"))])
    slow = points[4]
    marker = tmp_path / "slow-point-started"
    runner = quick_runner(SlowOnceRunner, slow=slow, marker=str(marker))
    path = tmp_path / "sweep.jsonl"
    seen = {}
    with DaskExecutor("local:2", allowed_failures=2, lock_path=tmp_path / "lock") as executor, \
            Journal(path) as journal:
        pids = executor.worker_pids()  # from the client: worker address -> pid
        (slot,) = executor.timing_slots()["127.0.0.1"]

        def kill_the_timing_worker():
            deadline = time.monotonic() + 60
            while not marker.exists() and time.monotonic() < deadline:
                time.sleep(0.05)
            while not load_journal(path).rows and time.monotonic() < deadline:
                time.sleep(0.05)  # the checks of the points timed before it finish
            seen["before"] = load_journal(path).rows  # finished before the kill
            seen["pid"] = int(marker.read_text())
            os.kill(pids[slot], signal.SIGKILL)

        killer = threading.Thread(target=kill_the_timing_worker)
        killer.start()
        table = sweep(points, executor=journaled(executor, journal), runner=runner)
        killer.join()
        pids_after = executor.worker_pids()
    assert seen["pid"] == pids[slot]  # the slow point was running in the killed worker
    assert pids[slot] not in pids_after.values()  # which really died (its nanny made anew)
    # Every point exactly once, each ok or failed with a reason.
    assert sorted(table["point_key"]) == sorted(point_key(p) for p in points)
    assert set(table["status"]) <= {"ok", "failed"}
    assert (table.loc[table["status"] == "failed", "reason"].str.len() > 0).all()
    rows = table.set_index("point_key")
    # The killed point was run again, by the worker that took over the timing slot.
    assert rows.loc[point_key(slow), "status"] == "ok"
    assert rows.loc[point_key(slow), "worker"] != slot
    # Nothing finished before the kill was lost or measured again.
    before = seen["before"]
    assert 1 <= len(before) < len(points)
    for key, row in before.items():
        assert rows.loc[key, "timed_from"] == row["timed_from"]
        assert rows.loc[key, "median_ms"] == row["median_ms"]
    after = load_journal(path)
    assert set(after.rows) == set(rows.index)
    assert path.read_text().count('"type": "row"') == len(points)  # one row per point
    assert_timings_never_overlap(table)


@pytest.mark.slow  # a sweep across worker processes: left out of the quick lane
@pytest.mark.e2e
def test_a_point_that_kills_its_worker_is_failed_with_the_reason(tmp_path):
    points = expand([Grid(L=(8, 16), d_k=(4,), heads=(1,), backend=("numpy",))])
    runner = quick_runner(ExitingRunner, deadly=points[0])
    with DaskExecutor("local:1", allowed_failures=0, lock_path=tmp_path / "lock") as executor:
        table = sweep(points, executor=executor, runner=runner).set_index("L")
        assert executor.timing_slots()  # the nanny brought the slot back
    assert table.loc[8, "status"] == "failed"
    assert table.loc[8, "reason"].startswith("KilledWorker: a worker died while running "
                                             "this point, more than allowed_failures=0")
    assert table.loc[16, "status"] == "ok"  # the sweep went on, on the new worker
