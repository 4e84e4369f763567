"""What a Dask cluster's workers run for a sweep (:mod:`attnbench.sweep.cluster`).

- :func:`host_timing_lock`: one timing at a time per host, whatever the workers' setup;
- :func:`time_task` and :func:`check_task`: the two phases of a point, on a worker;
- :func:`worker_info` and :func:`allowed_failures_of`: what the executor asks the
  workers and the scheduler before a sweep.

Dask pickles these functions by reference: they must live in an importable module.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import socket
import tempfile
import time
from pathlib import Path

import attnbench
from attnbench.measure.machine import gemm_peak_gflops, machine_columns, machine_record
from attnbench.measure.problems import limit_threads
from attnbench.sweep.grid import Point
from attnbench.sweep.journal import MACHINE_FIELD

__all__ = ["LOCK_PATH", "allowed_failures_of", "check_task", "host_timing_lock", "time_task",
           "worker_info"]

#: Where the per-host timing lock lives (a local file system, one per host).
LOCK_PATH = Path(tempfile.gettempdir()) / "attnbench-timing.lock"


# --- the per-host timing lock ----------------------------------------------------------------


@contextlib.contextmanager
def host_timing_lock(path=LOCK_PATH):
    """Hold an exclusive ``flock`` on ``path`` (per host); yields the seconds waited for it.

    Without ``fcntl`` (Windows) nothing is locked and the wait is 0: the Dask resource
    alone keeps timings apart there.
    """
    try:
        import fcntl
    except ImportError:  # pragma: no cover - not on Linux
        yield 0.0
        return
    started = time.perf_counter()
    with open(path, "a+b") as file:
        fcntl.flock(file.fileno(), fcntl.LOCK_EX)
        waited = time.perf_counter() - started
        try:
            yield waited
        finally:
            fcntl.flock(file.fileno(), fcntl.LOCK_UN)


# --- what runs on the workers ----------------------------------------------------------------

#: This worker process's runner of the current sweep: (token, PointRunner).  Keeping it
#: across tasks keeps its caches (oracles, smallest calls, GEMM peaks) as in-process.
_RUNNER: list = [None, None]


def _worker_runner(runner, token: str, memory_budget):
    if _RUNNER[0] != token:
        _RUNNER[0], _RUNNER[1] = token, dataclasses.replace(runner, memory_budget=memory_budget)
    return _RUNNER[1]


def _worker_address() -> str:
    try:
        from distributed import get_worker

        return get_worker().address
    except Exception:  # not in a worker (tests calling the task directly)
        return f"pid {os.getpid()}"


def time_task(runner, token: str, point: Point, *, threads, memory_budget,
              measure_peaks: bool, lock_path=LOCK_PATH):
    """Phase 1 of a point, on a worker holding its host's timing slot: ``(row, output)``."""
    worker_runner = _worker_runner(runner, token, memory_budget)
    with host_timing_lock(lock_path) as waited, limit_threads(threads):
        if measure_peaks and point.dtype not in worker_runner.gemm_peaks:
            worker_runner.gemm_peaks[point.dtype] = gemm_peak_gflops(point.dtype)
        timed_from = time.time()
        row, out = worker_runner.time_point(point)
        timed_to = time.time()
    row.update(timed_from=timed_from, timed_to=timed_to, timing_lock_wait_s=waited,
               worker=_worker_address(), **machine_columns())
    row[MACHINE_FIELD] = machine_record()
    return row, out


def check_task(runner, token: str, point: Point, timed, *, threads, memory_budget):
    """Phase 2 of a point, on any worker: the finished row."""
    row, out = timed
    worker_runner = _worker_runner(runner, token, memory_budget)
    with limit_threads(threads):
        row = worker_runner.check_point(point, dict(row), out)
    row["checked_by"] = _worker_address()
    return row


def allowed_failures_of(dask_scheduler) -> int:
    """The scheduler's ``allowed_failures`` (run on the scheduler)."""
    return dask_scheduler.allowed_failures


def worker_info() -> dict:
    """What the executor checks on every worker before a sweep."""
    return {"hostname": socket.gethostname(), "pid": os.getpid(),
            "attnbench": attnbench.__version__}
