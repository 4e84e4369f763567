"""The check of the cores before a sweep: fewer threads where the configured ones wait."""

import json
import math
import os
import subprocess
import sys

import numba
import pytest

from attnbench.measure import cores as cores_module
from attnbench.measure.cores import CoreCheck, check_cores
from attnbench.measure.probe import run_queue_wait
from attnbench.report.build import sweep_section
from attnbench.sweep import run
from attnbench.sweep.files import save_results
from attnbench.sweep.grid import Grid, expand
from attnbench.sweep.journal import Journal, journaled
from attnbench.sweep.run import run_sweep, runs_here, serial_executor


class FakeMachine:
    """A workload and clocks where a call on ``n`` threads waits ``shares[n]`` of its wall
    time (a list: one share per reading, the last repeated)."""

    def __init__(self, shares):
        self.shares = {n: list(s) if isinstance(s, list | tuple) else [s]
                       for n, s in shares.items()}
        self.now = self.waited = 0.0
        self.threads = None
        self.calls = {}

    def workload(self, threads):
        def call():
            self.threads = threads
            self.calls[threads] = self.calls.get(threads, 0) + 1
            readings = self.shares[threads]
            share = readings[0] if len(readings) == 1 else readings.pop(0)
            self.now += 0.05
            self.waited += share * 0.05
        return call

    def clock(self):
        return self.now

    def wait(self):
        return self.waited

    def check(self, requested, **kwargs):
        return check_cores(requested, workload=self.workload, seconds=0.1, clock=self.clock,
                           wait=self.wait, **kwargs)


def test_quiet_cores_keep_the_configured_threads():
    machine = FakeMachine({4: 0.01})
    found = machine.check(4)
    assert found == CoreCheck(requested=4, threads=4, wait_shares=found.wait_shares)
    assert not found.reduced and set(found.wait_shares) == {4}
    assert "did not wait" in found.describe()


def test_a_busy_core_lowers_the_threads_to_the_largest_count_that_does_not_wait():
    machine = FakeMachine({4: 0.5, 3: 0.3, 2: 0.05, 1: 0.0})
    found = machine.check(4)
    assert found.threads == 2 and found.reduced
    assert found.wait_shares[4] == pytest.approx(0.5) and 1 not in found.wait_shares
    assert "--threads 4" in found.describe() and "2 thread(s)" in found.describe()


def test_the_threads_never_go_below_one():
    assert FakeMachine({2: 0.9, 1: 0.4}).check(2).threads == 1


def test_one_disturbed_reading_of_three_does_not_lower_the_threads():
    # A warm-up call, then readings of two calls of 0.05 s each (seconds=0.1): a burst in
    # the first reading only.
    machine = FakeMachine({2: [0.0, 0.6, 0.6, 0.0, 0.0, 0.0, 0.0, 0.0]})
    assert machine.check(2).threads == 2


def test_when_even_one_thread_waits_it_says_so_instead_of_calling_the_cores_free():
    found = FakeMachine({1: 0.4}).check(1)
    assert found.threads == 1 and found.waiting and not found.reduced
    assert "even one thread waited" in found.describe()
    assert "did not wait" not in found.describe()
    assert not FakeMachine({2: 0.5, 1: 0.02}).check(2).waiting


def test_a_failing_check_leaves_the_sweep_on_its_configured_threads(monkeypatch, capsys):
    def broken():
        raise RuntimeError("no threading layer")

    monkeypatch.setattr(run, "check_cores", broken)
    points = expand([Grid(L=(8,), d_k=(4,), heads=(1,), backend=("reference",))])
    result = run_sweep(points, max_time=0.002, progress=False, gemm_peaks={"float32": 100.0})
    assert not result.cores.reduced and (result.table["status"] == "ok").all()
    assert "the check of the cores failed" in capsys.readouterr().err


def test_an_unreadable_wait_changes_nothing_and_says_so():
    machine = FakeMachine({2: 0.5})
    found = check_cores(2, workload=machine.workload, seconds=0.1, clock=machine.clock,
                        wait=lambda: math.nan)
    assert found.threads == 2 and not found.reduced
    assert "could not be read" in found.describe()


@pytest.mark.skipif(numba.get_num_threads() < 2 or math.isnan(run_queue_wait()),
                    reason="needs 2 threads and Linux's /proc/self/task/*/schedstat")
def test_real_busy_processes_on_every_core_make_the_check_lower_the_threads():
    # A spinning process per core: the configured threads must wait for them.
    spinners = [subprocess.Popen([sys.executable, "-c", "while True: pass"])
                for _ in range(os.cpu_count() or 1)]
    try:
        found = check_cores(seconds=0.1)
    finally:
        for spinner in spinners:
            spinner.kill()
            spinner.wait()
    assert found.reduced, found
    assert found.wait_shares[found.requested] > 0.1


def test_a_sweep_runs_on_the_threads_the_check_chose_and_records_why(monkeypatch, tmp_path):
    found = CoreCheck(requested=2, threads=1, wait_shares={2: 0.4, 1: 0.0})
    monkeypatch.setattr(run, "check_cores", lambda: found)
    grid = Grid(L=(8, 16), d_k=(4,), heads=(1,), backend=("numba", "reference"))
    result = run_sweep(expand([grid]), max_time=0.002, progress=False,
                       gemm_peaks={"float32": 100.0})
    assert result.cores is found
    assert (result.table["threads"] == 1).all()
    save_results(result, tmp_path)
    meta = json.loads((tmp_path / "sweep.json").read_text())
    assert meta["threads"] == 1 and meta["cores"]["requested"] == 2
    assert "give --threads 2 to insist" in sweep_section(result.table, meta).text


def test_an_explicit_thread_count_or_a_remote_executor_skips_the_check(monkeypatch):
    def must_not_run():
        raise AssertionError("check_cores ran")

    monkeypatch.setattr(run, "check_cores", must_not_run)
    points = expand([Grid(L=(8,), d_k=(4,), heads=(1,), backend=("numba",))])
    quick = {"max_time": 0.002, "progress": False, "gemm_peaks": {"float32": 100.0}}
    assert run_sweep(points, threads=1, **quick).cores is None
    remote = lambda points, run_point: (run_point(point) for point in points)  # noqa: E731
    assert run_sweep(points, executor=remote, **quick).cores is None


def test_a_journaled_serial_executor_runs_here(tmp_path):
    with Journal(tmp_path / "journal.jsonl") as journal:
        assert runs_here(journaled(serial_executor, journal))
        assert not runs_here(journaled(lambda points, run_point: iter(()), journal))


def test_the_default_workload_runs_the_fused_kernel_on_the_threads_asked_for(monkeypatch):
    from attnbench import kernels

    seen = []
    call = cores_module._fused_kernel_workload(1)
    original = numba.get_num_threads()
    real = kernels.attention
    monkeypatch.setattr(kernels, "attention",
                        lambda *a, **k: seen.append(numba.get_num_threads()) or real(*a, **k))
    call()
    assert seen == [1] and numba.get_num_threads() == original
