"""Sweeps on a Dask cluster: ``attnbench sweep --cluster local:N`` or ``--cluster tcp://HOST:PORT``.

:class:`DaskExecutor` is an executor of :func:`attnbench.sweep.run.run_sweep` (a function
``executor(points, run_point)`` yielding rows) that hands the points to Dask
distributed.  ``dask[distributed]`` is an optional dependency (``pip install
'attnbench[cluster]'``), imported only when a cluster is asked for.

**One timing at a time per host.**  Each point is two tasks (the two phases of
:class:`attnbench.sweep.runner.PointRunner`):

1. *time*: build the inputs, run the backend once (compiles; the output that is
   checked), time it, measure its memory.  It needs the resource ``timing`` (one unit);
   exactly one worker per host offers it (its *timing slot*), so the scheduler runs one
   timing per host at a time, and hosts in parallel.  As a guarantee that does not
   depend on how workers were started, the task also holds an exclusive ``flock`` on a
   per-host lock file (:func:`attnbench.sweep.cluster_tasks.host_timing_lock`; the OS
   releases it if the process dies) while it times; a row's ``timing_lock_wait_s`` says
   how long it waited for it (0 when the resource did its job).
2. *check*: the error against the float64 oracle.  No resource: it runs on any worker,
   overlapping other points' timings (it uses one BLAS thread, and the timings of a
   host with idle cores stay clean; on a small machine, give the sweep ``--threads``
   below the core count to leave room for the checks).

``local:N`` starts N worker processes (``Nanny``, one thread each) on 127.0.0.1, with no
dashboard (every socket on the loopback interface), the first of which holds the timing
slot; the others run checks.  Worker processes are started with the ``spawn`` method
(dask config ``distributed.worker.multiprocessing-method``): Numba's OpenMP threading
layer is not fork-safe, and a forked worker can hang in its first parallel region.  On an existing
cluster (``tcp://``), start on each host one worker that holds the slot and any number
without it::

    dask scheduler --host 0.0.0.0 --port 8786
    dask worker tcp://SCHEDULER:8786 --nworkers 1 --nthreads 1 --resources "timing=1"
    dask worker tcp://SCHEDULER:8786 --nworkers 2 --nthreads 1      # checks (optional)

(``dask worker`` spawns its processes by default; keep it so.  Its nannies also set
``OMP_NUM_THREADS``, ``MKL_NUM_THREADS`` and ``OPENBLAS_NUM_THREADS`` to 1 by default, so
the BLAS and torch time on one thread there: the rows' ``blas`` column shows it; give
the sweep ``--threads`` to time every host alike.)  The executor refuses
to start if a host has two timing slots (its timings would overlap) or if no worker
offers one.  attnbench and its dependencies must be installed on every worker.

**Rows and hosts.**  Every row carries the machine columns of the host that timed it
(:func:`attnbench.measure.machine.machine_columns`: ``hostname``, CPU model, threads, BLAS,
versions), the worker's address (``worker``), the wall-clock interval of the timing
(``timed_from``, ``timed_to``, seconds since the epoch) and, on its way to the journal,
the host's full machine record.  Unless the sweep was given GEMM peaks, each worker
measures its own host's GEMM peak before its first timing (inside the timing slot).

**Failures.**  A worker that dies while it holds a task (killed, out of memory, a
segfault) loses nothing that finished: rows are written to the journal by the client
as each point's check completes.  Its unfinished tasks are rescheduled on other workers
(after a restart, the timing slot of a ``local:N`` cluster is held by the worker the
nanny starts in place of the dead one); a task involved in more than
``allowed_failures`` worker deaths is recorded as ``failed`` with the reason
(``KilledWorker``), and the sweep goes on.  Timing tasks are submitted as timing slots
free up (as many in flight as there are slots), so that a worker's death counts against
the point it was timing and not against points merely waiting in its queue (Dask marks
every task assigned to a dead worker as suspect).
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
import uuid
from collections import deque
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import attnbench
from attnbench.sweep.cluster_tasks import (
    LOCK_PATH,
    allowed_failures_of,
    check_task,
    time_task,
    worker_info,
)
from attnbench.sweep.grid import Point

__all__ = ["TIMING_RESOURCE", "ClusterSpec", "DaskExecutor", "parse_cluster"]

#: The Dask resource of a host's timing slot.
TIMING_RESOURCE = "timing"
#: Default number of worker deaths a task may be involved in before it is failed.
ALLOWED_FAILURES = 2

_SETUP_HELP = (
    "start on each host one worker with the timing slot: dask worker tcp://SCHEDULER:PORT "
    f'--nworkers 1 --nthreads 1 --resources "{TIMING_RESOURCE}=1" (others without it)')


@dataclass(frozen=True)
class ClusterSpec:
    """Where a sweep runs: ``local`` with ``n_workers``, or an existing scheduler."""

    kind: str  # "local" or "address"
    n_workers: int = 0  # local: worker processes
    address: str = ""  # address: tcp://HOST:PORT

    def __str__(self) -> str:
        return f"local:{self.n_workers}" if self.kind == "local" else self.address


def parse_cluster(text: str) -> ClusterSpec:
    """``"local:N"`` (N >= 1) or ``"tcp://HOST:PORT"``; ValueError otherwise."""
    if text.startswith("local:"):
        count = text.removeprefix("local:")
        if count.isdigit() and int(count) >= 1:
            return ClusterSpec("local", n_workers=int(count))
        raise ValueError(f"--cluster {text!r}: expected local:N with N a positive integer")
    for scheme in ("tcp://", "tls://"):
        if text.startswith(scheme):
            host, _, port = text.removeprefix(scheme).rpartition(":")
            if host and port.isdigit():
                return ClusterSpec("address", address=text)
    raise ValueError(f"--cluster {text!r}: expected local:N (N worker processes here) or "
                     "tcp://HOST:PORT (the address of a running Dask scheduler)")


# --- the executor ----------------------------------------------------------------------------


class DaskExecutor:
    """Runs a sweep's points on a Dask cluster; use as a context manager.

    Parameters
    ----------
    spec : ClusterSpec or str
        ``local:N`` or ``tcp://HOST:PORT`` (:func:`parse_cluster`).
    threads : int, optional
        Threads of each timing and check (Numba, BLAS, OpenMP, torch), as ``--threads``.
    memory_budget : float, optional
        Bytes a point may need; default: half of the available memory of the host that
        runs it.
    measure_peaks : bool, default True
        Each worker measures its host's GEMM peak (for the dtypes it times) before its
        first timing, unless the runner was given peaks for the dtype.
    allowed_failures : int, default ALLOWED_FAILURES
        Worker deaths a task may be involved in before it is recorded as failed
        (``local:N`` only: an existing scheduler keeps its own setting).
    timeout : float, default 60
        Seconds to wait for a worker with a timing slot (at the start, and while points
        remain) before the remaining points are recorded as failed.
    lock_path : path-like, default LOCK_PATH
        The per-host timing lock file.
    """

    def __init__(self, spec, *, threads: int | None = None, memory_budget: float | None = None,
                 measure_peaks: bool = True, allowed_failures: int = ALLOWED_FAILURES,
                 timeout: float = 60.0, lock_path=LOCK_PATH):
        self.spec = parse_cluster(spec) if isinstance(spec, str) else spec
        self.threads = threads
        self.memory_budget = memory_budget
        self.measure_peaks = measure_peaks
        self.allowed_failures = allowed_failures
        self.timeout = timeout
        self.lock_path = lock_path
        self.client = None
        self.cluster = None
        self._config = None

    # --- starting and stopping ----------------------------------------------------------------

    def __enter__(self):
        try:
            import dask
            from distributed import Client
        except ImportError as exc:
            raise RuntimeError(
                f"--cluster needs dask.distributed ({exc}); install it with "
                "pip install 'attnbench[cluster]'") from None
        # Kept for the cluster's lifetime: a nanny reads it again when it restarts a worker.
        # Nannies also pin OMP/MKL/OpenBLAS to one thread by default: not here, so that
        # local workers time with the threads an in-process sweep has (--threads limits).
        self._config = dask.config.set({
            "distributed.worker.multiprocessing-method": "spawn",
            **{f"distributed.nanny.pre-spawn-environ.{name}": None
               for name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")}})
        try:
            if self.spec.kind == "local":
                self.cluster = self._local_cluster()
                self.client = Client(self.cluster)
            else:
                self.client = Client(self.spec.address, timeout=self.timeout)
                self.allowed_failures = self.client.run_on_scheduler(allowed_failures_of)
            self.check_workers()
        except BaseException:
            self.close()
            raise
        return self

    def _local_cluster(self):
        from distributed import Nanny, Scheduler, SpecCluster

        worker = {"host": "127.0.0.1", "nthreads": 1, "dashboard": False,
                  "memory_limit": 0,  # the sweep's memory budget decides, as in-process
                  "silence_logs": logging.ERROR}
        workers = {
            f"attnbench-{index}": {"cls": Nanny, "options": {
                **worker, **({"resources": {TIMING_RESOURCE: 1}} if index == 0 else {})}}
            for index in range(self.spec.n_workers)}
        scheduler = {"cls": Scheduler, "options": {
            # No dashboard; the scheduler's small HTTP server (health, metrics) on a free
            # loopback port (":0" would listen on every interface).
            "host": "127.0.0.1", "dashboard": False, "dashboard_address": "127.0.0.1:0",
            "allowed_failures": self.allowed_failures}}
        return SpecCluster(workers=workers, scheduler=scheduler, silence_logs=logging.ERROR,
                           name=f"attnbench local:{self.spec.n_workers}")

    def close(self) -> None:
        """Close the client and, for ``local:N``, the cluster."""
        for thing in (self.client, self.cluster):
            if thing is not None:
                with contextlib.suppress(Exception):
                    thing.close()
        self.client = self.cluster = None
        if self._config is not None:
            self._config.__exit__(None, None, None)
            self._config = None

    def __exit__(self, *exc):
        self.close()

    # --- the workers --------------------------------------------------------------------------

    def workers(self) -> dict[str, dict]:
        """Worker address -> the scheduler's information on it (host, resources, ...)."""
        try:
            return self.client.scheduler_info(n_workers=-1)["workers"]
        except TypeError:  # dask before n_workers (which then always gave every worker)
            return self.client.scheduler_info()["workers"]

    def timing_slots(self) -> dict[str, list[str]]:
        """Host (as the scheduler sees it) -> addresses of its workers with a timing slot."""
        slots: dict[str, list[str]] = {}
        for address, info in self.workers().items():
            if info.get("resources", {}).get(TIMING_RESOURCE, 0) >= 1:
                slots.setdefault(info["host"], []).append(address)
        return slots

    def worker_pids(self) -> dict[str, int]:
        """Worker address -> process id (from the workers themselves)."""
        return self.client.run(os.getpid)

    def check_workers(self) -> dict[str, list[str]]:
        """Wait for a timing slot; refuse a host with two; check attnbench on every worker.

        Returns :meth:`timing_slots`.
        """
        deadline = time.monotonic() + self.timeout
        while not (slots := self.timing_slots()):
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"no worker of {self.spec} offers the '{TIMING_RESOURCE}' resource after "
                    f"{self.timeout:g} s: {_SETUP_HELP}")
            time.sleep(0.2)
        crowded = {host: addresses for host, addresses in slots.items() if len(addresses) > 1}
        if crowded:
            raise RuntimeError(
                "timings would overlap: "
                + "; ".join(f"host {host} has {len(a)} workers with a timing slot ({', '.join(a)})"
                            for host, a in crowded.items())
                + f". Give the '{TIMING_RESOURCE}' resource to one worker per host.")
        try:
            infos = self.client.run(worker_info)
        except Exception as exc:
            raise RuntimeError(f"attnbench cannot run on a worker of {self.spec}: "
                               f"{type(exc).__name__}: {exc}; install attnbench on every "
                               "worker") from None
        stale = {address: info["attnbench"] for address, info in infos.items()
                 if info["attnbench"] != attnbench.__version__}
        if stale:
            raise RuntimeError(f"workers run another attnbench than this client "
                               f"({attnbench.__version__}): {stale}")
        return slots

    def describe(self) -> str:
        """One line: the cluster, its workers and timing slots."""
        workers = self.workers()
        slots = self.timing_slots()
        return (f"Dask cluster {self.spec} (scheduler {self.client.scheduler.address}): "
                f"{len(workers)} workers on {len({w['host'] for w in workers.values()})} "
                f"host(s), timing slots: " + ", ".join(f"{host} ({a[0]})"
                                                       for host, a in slots.items()))

    # --- running points -----------------------------------------------------------------------

    def __call__(self, points: Sequence[Point], run_point) -> Iterator[dict]:
        """Yield each point's row as its check completes (any order)."""
        from distributed import wait

        if self.client is None:
            raise RuntimeError("DaskExecutor must be entered (with DaskExecutor(...) as ex:)")
        token = uuid.uuid4().hex[:12]
        measure_peaks = self.measure_peaks
        pending = deque(points)
        timing, checks = {}, {}  # future -> point
        options = {"threads": self.threads, "memory_budget": self.memory_budget}
        # At least one: a slot that is restarting now comes back, and its tasks wait for it.
        window = max(1, sum(len(a) for a in self.timing_slots().values()))
        no_slot_since = None
        try:
            while pending or checks:
                while pending and len(timing) < window:
                    point = pending.popleft()
                    name = f"{point.label().replace(' ', '-')}-{token}"
                    timed = self.client.submit(
                        time_task, run_point, token, point, measure_peaks=measure_peaks,
                        lock_path=self.lock_path, resources={TIMING_RESOURCE: 1},
                        key=f"time-{name}", pure=False, **options)
                    checked = self.client.submit(check_task, run_point, token, point, timed,
                                                 key=f"check-{name}", pure=False, **options)
                    timing[timed], checks[checked] = point, point
                try:
                    done, _ = wait(list(timing) + list(checks), timeout=1.0,
                                   return_when="FIRST_COMPLETED")
                except TimeoutError:
                    done = set()
                for future in done:
                    if future in timing:  # its slot is free: the next point may go
                        del timing[future]
                    elif future in checks:
                        point = checks.pop(future)
                        yield self._row(future, point)
                if done:
                    no_slot_since = None
                elif not self.timing_slots():
                    no_slot_since = no_slot_since or time.monotonic()
                    if time.monotonic() - no_slot_since > self.timeout:
                        reason = (f"failed: no worker with a timing slot for "
                                  f"{self.timeout:g} s ({_SETUP_HELP})")
                        for point in list(checks.values()) + list(pending):
                            yield {**point.as_dict(), "status": "failed", "reason": reason}
                        pending.clear()
                        checks.clear()
        finally:
            for future in list(timing) + list(checks):
                future.cancel()

    def _row(self, future, point: Point) -> dict:
        """The finished row, or a failed row saying why the task did not finish."""
        try:
            return future.result()
        except Exception as exc:
            name = type(exc).__name__
            if name == "KilledWorker":
                reason = (f"KilledWorker: a worker died while running this point, more than "
                          f"allowed_failures={self.allowed_failures} times ({exc})")
            else:
                reason = f"{name}: {exc}"
            return {**point.as_dict(), "status": "failed", "reason": reason}
