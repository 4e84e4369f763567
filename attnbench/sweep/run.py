"""A sweep: every point of a grid measured by a :class:`~attnbench.sweep.runner.PointRunner`.

:func:`run_sweep` turns a list of :class:`attnbench.sweep.grid.Point` into a pandas
DataFrame with one row per point: an *executor* maps the runner over the points, a
function ``executor(points, run_point) -> iterator of rows`` that may yield rows in any
order.  :func:`serial_executor` runs them in this process, in order; a parallel executor
(:class:`attnbench.sweep.cluster.DaskExecutor`) honours the same signature.  Ctrl-C stops
a sweep and keeps the finished rows.

Unless the caller gives the GEMM peaks, the sweep probes them (:func:`gemm_peak_gflops`)
:data:`PEAK_PROBES` times, spread through the run, and reads every row's "% of the GEMM
peak" against the maximum of them all: a peak probed while another process held a core
would otherwise make the kernels look faster than the machine (above 100%).  A sweep with
decode points probes the read bandwidth (:func:`attnbench.measure.bandwidth.read_bandwidth_gbs`)
at the same times, and reads each decode row's rate of reading K and V against the best
probe (``pct_of_read_bandwidth``): decoding is bound by memory, not FLOPs.

At the end of a sweep run here, every series (along L, d_k, heads or batch) is timed again
with its points interleaved (a slower stretch of the machine then slows every point of a
fit alike), within a share
:data:`SERIES_SHARE` of the sweep's time; then the points still noisy are measured again,
interleaved with their neighbours in L (:mod:`attnbench.sweep.remeasure`), within a share
:data:`REMEASURE_SHARE`.
"""

from __future__ import annotations

import gc
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass

import pandas as pd

from attnbench.kernels._dtypes import compute_dtype
from attnbench.measure.bandwidth import read_bandwidth_gbs
from attnbench.measure.cores import CoreCheck, check_cores
from attnbench.measure.machine import gemm_peak_gflops, machine_columns, plan_ahead
from attnbench.measure.probe import default_probe
from attnbench.measure.problems import (
    SETTLE_SECONDS,
    limit_threads,
    load_average,
    timing_threads,
)
from attnbench.sweep.grid import Point
from attnbench.sweep.remeasure import (
    complete_brief_timings,
    in_long_series,
    noisy_rows,
    read_against_bandwidth,
    read_against_peak,
    remeasure_noisy,
    remeasure_series,
    series_groups,
)
from attnbench.sweep.runner import COLUMNS, ORACLE_LIMIT, PointRunner, Row, make_inputs

__all__ = ["PEAK_PROBES", "REMEASURE_SHARE", "SERIES_SHARE", "SweepResult", "points_summary",
           "run_sweep", "runs_here", "serial_executor"]

#: GEMM peak probes per dtype in a sweep that measures its own peaks: at the start, at
#: each quarter of the points and at the end.
PEAK_PROBES = 5
#: The re-measurement of noisy points may take at most this fraction of the time the sweep
#: took before it (its points and the series pass).
REMEASURE_SHARE = 0.25
#: The interleaved pass over the series may start series for at most this
#: multiple of the sweep's time so far: its points' first timings are brief (3 batches),
#: and the pass takes 8 rounds of each, so on the quick grid it needs 0.6-0.8 of the time
#: before it.
SERIES_SHARE = 1.5

RunPoint = Callable[[Point], Row]
Executor = Callable[[Sequence[Point], RunPoint], Iterator[Row]]


def serial_executor(points: Sequence[Point], run_point: RunPoint) -> Iterator[Row]:
    """Run the points one after the other in this process, yielding each row when done."""
    for point in points:
        yield run_point(point)


def runs_here(executor: Executor) -> bool:
    """True if ``executor`` runs the points in this process, one after the other: the
    serial executor, or a wrapper of it that says so with a true ``local`` attribute
    (:func:`attnbench.sweep.journal.journaled`)."""
    return executor is serial_executor or bool(getattr(executor, "local", False))


@dataclass
class SweepResult:
    """What :func:`run_sweep` returns."""

    table: pd.DataFrame  # one row per finished point
    interrupted: bool  # True if Ctrl-C stopped the sweep: the table has the finished rows
    seconds: float  # wall-clock time of the sweep
    gemm_peaks: dict  # dtype name -> GFLOP/s: the maximum over the probes (or as given)
    n_points: int  # points asked for
    load_average: tuple = (float("nan"), float("nan"))  # 1-min load at the start and end
    cores: CoreCheck | None = None  # the check that chose the thread count, if one ran
    read_bandwidth_gbs: float | None = None  # the best read-bandwidth probe (decode points)


def run_sweep(points: Sequence[Point], *, max_time: float = 0.2,
              oracle_limit: int = ORACLE_LIMIT, memory_budget: float | None = None,
              gemm_peaks: dict | None = None, executor: Executor = serial_executor,
              progress: bool = True, with_machine: bool = True,
              runner: PointRunner | None = None, threads: int | None = None,
              remeasure_budget: float | None = None, check_threads: bool = True) -> SweepResult:
    """Measure every point; Ctrl-C stops the sweep and keeps the finished rows.

    Parameters
    ----------
    points : sequence of Point
        Usually :func:`attnbench.sweep.grid.expand` of some grids.
    max_time : float, default 0.2
        Timing budget per point in seconds (:func:`attnbench.measure.timing.measure`).
    oracle_limit : int, default ORACLE_LIMIT
        Largest problem, in score entries B·H·L², whose error against the oracle is
        computed (a quarter of it for float64); above it the row's ``oracle`` says skipped.
    memory_budget : float, optional
        Bytes a point may need beyond its inputs (the reference's L x L arrays); points
        above are skipped with the estimate.  Default: half of the available memory.
    gemm_peaks : dict, optional
        dtype name -> GEMM GFLOP/s, used as given.  If not given, probed for the dtypes of
        the points :data:`PEAK_PROBES` times through the sweep; every row is read against
        the maximum (:func:`attnbench.measure.machine.gemm_peak_record`, in the machine
        record, lists the probes).
    executor : callable, default serial_executor
        ``executor(points, run_point)`` yielding one row per point.
    progress : bool, default True
        Show a tqdm progress bar with an ETA on stderr.
    with_machine : bool, default True
        Add the :func:`attnbench.measure.machine.machine_columns` to every row.
    runner : PointRunner, optional
        Use this runner (its settings win over the arguments above).
    threads : int, optional
        Run with at most this many threads (Numba, the BLAS and OpenMP pools, torch),
        GEMM peak included; default: as configured.  One thread makes timings on a
        shared machine far steadier: a parallel call waits for its slowest thread, so
        one pre-empted worker costs the whole call a scheduler time slice.
    remeasure_budget : float, optional
        Seconds of extra rounds per point still noisy at the end of a serial sweep, spent
        re-measuring it interleaved with its neighbours in L (all such points together
        within :data:`REMEASURE_SHARE` of the sweep's time), after the interleaved pass
        over the series (:func:`~attnbench.sweep.remeasure.remeasure_series`,
        within :data:`SERIES_SHARE`); default ``5 * max_time``, 0: neither pass.  Rows
        re-measured say ``remeasured``, those of the series pass ``series_interleaved``.
    check_threads : bool, default True
        Where ``threads`` is not given and the points run here (the serial executor),
        first check that the configured threads do not wait for cores other processes
        hold (:func:`attnbench.measure.cores.check_cores`), and run on fewer if they do;
        the result's ``cores`` says what was found.

    Returns
    -------
    SweepResult
    """
    started = time.perf_counter()
    plan_ahead((p.backend, (p.batch, p.heads, p.L, p.L, p.d_k, p.d_k), p.dtype) for p in points
               if p.direction == "forward" and p.variant == "none")  # no timed call plans
    load_start = load_average()
    cores = None
    if threads is None and check_threads and runs_here(executor):
        cores = _checked_cores()
        threads = cores.threads if cores.reduced else None
        if progress:
            print(f"Threads: {cores.describe()}.", flush=True)
    rows, interrupted = [], False
    with limit_threads(threads, torch=any(point.backend == "torch" for point in points)):
        peaks = _PeakProbes(points, here=runs_here(executor)) if gemm_peaks is None else None
        gemm_peaks = peaks.peaks if peaks is not None else gemm_peaks
        if runner is None:
            retime = runs_here(executor) and (remeasure_budget is None or remeasure_budget > 0)
            runner = PointRunner(max_time=max_time, oracle_limit=oracle_limit,
                                 memory_budget=memory_budget, gemm_peaks=gemm_peaks,
                                 retimed=in_long_series(points) if retime else None)
        bar = _progress_bar(len(points), enabled=progress)
        # peak_extra_memory calls gc.collect() before each measurement; with torch, pandas
        # and matplotlib loaded that walks ~10^6 objects (0.1 s a point).  Frozen objects
        # are not walked, and nothing made before the sweep is garbage it must reclaim.
        gc.freeze()
        try:
            for row in executor(points, runner):
                rows.append(row)
                bar.set_postfix_str(_postfix(row), refresh=False)
                bar.update(1)
                if peaks is not None:
                    peaks.after_point(len(rows))
        except KeyboardInterrupt:
            interrupted = True
        finally:
            gc.unfreeze()
            bar.close()
        if runs_here(executor) and not interrupted:
            try:  # a row is updated only once its re-measurement is complete
                _remeasure(rows, runner, started, 5 * max_time if remeasure_budget is None
                           else remeasure_budget)
            except KeyboardInterrupt:
                interrupted = True
            try:
                _journal_again(rows, getattr(executor, "journal", None))
            except KeyboardInterrupt:
                interrupted = True
        if peaks is not None and not interrupted:
            peaks.probe()  # the last probe, at the end of the run
    if peaks is not None:
        peaks.apply(rows)
    table = pd.DataFrame(rows)
    if not table.empty:
        for flag in ("remeasured", "series_interleaved", "brief_timing"):
            table[flag] = table.get(flag, pd.Series(False, index=table.index))
            table[flag] = table[flag].fillna(False).astype(bool)
        table = table[[c for c in COLUMNS if c in table] + [c for c in table if c not in COLUMNS]]
    if with_machine and not table.empty:
        # Rows measured elsewhere (a Dask worker) bring their host's columns; keep them.
        for column, value in machine_columns().items():
            table[column] = table[column].fillna(value) if column in table else value
    return SweepResult(table=table, interrupted=interrupted,
                       seconds=time.perf_counter() - started, gemm_peaks=gemm_peaks,
                       n_points=len(points), load_average=(load_start, load_average()),
                       cores=cores,
                       read_bandwidth_gbs=None if peaks is None else peaks.bandwidth)


def _journal_again(rows: list[Row], journal) -> None:
    """Rows timed again at the end of the sweep appended to its journal, if it has one
    (the last row of a key wins when the journal is read)."""
    if journal is None:
        return
    for row in rows:
        if (row.get("remeasured") or row.get("series_interleaved")) and not row.get("resumed"):
            again = {k: v for k, v in row.items() if k not in ("resumed", "finished_at")}
            journal.append(again)


def _checked_cores() -> CoreCheck:
    """:func:`check_cores`, or, where its workload cannot run here, the configured threads
    with the wait unread (the sweep goes on as configured)."""
    try:
        return check_cores()
    except Exception as exc:  # noqa: BLE001 - any failure of the probe kernel
        import numba

        requested = numba.get_num_threads()
        print(f"warning: the check of the cores failed ({type(exc).__name__}: {exc}); "
              f"running on {requested} thread(s) unchecked", file=sys.stderr)
        return CoreCheck(requested=requested, threads=requested,
                         wait_shares={requested: float("nan")})


class _PeakProbes:
    """The GEMM peak of a sweep: probed at the start, at each quarter and at the end.

    ``peaks`` (dtype name -> GFLOP/s) is updated in place, so the runner reads the best
    peak so far; :meth:`apply` reads the finished rows against the final maximum.
    """

    def __init__(self, points: Sequence[Point], *, here: bool = True):
        self.dtypes = list(dict.fromkeys(point.dtype for point in points))
        # The bandwidth is this host's: probed only where the points run here.
        self.decodes = here and any(point.kind == "decode" for point in points)
        self.bandwidth: float | None = None  # GB/s: the best read-bandwidth probe so far
        self.peaks: dict = {}
        self.used: dict = {name: set() for name in self.dtypes}  # every value handed out
        n_points = len(points)
        step = n_points / (PEAK_PROBES - 1)
        self.due = {round(step * i) for i in range(1, PEAK_PROBES - 1)} - {0, n_points}
        self.probe(repeat=7)

    def probe(self, repeat: int = 3) -> None:
        """One probe per dtype; the peak is the maximum of all (machine.gemm_peak_gflops)."""
        for name in self.dtypes:
            # Half precision is computed in float32: its peak is float32's.
            self.peaks[name] = gemm_peak_gflops(compute_dtype(name), repeat=repeat,
                                                max_time=1.0)
            self.used[name].add(self.peaks[name])
        if self.decodes:
            self.bandwidth = read_bandwidth_gbs(repeat=repeat)  # the best of the process's
        time.sleep(SETTLE_SECONDS)  # the BLAS workers go idle before the next timing

    def after_point(self, done: int) -> None:
        if done in self.due:
            self.probe()

    def apply(self, rows: list[Row]) -> None:
        """Read the rows that used a probed peak against the final one (% and fault)."""
        for row in rows:
            if row.get("status") == "ok" and not row.get("resumed"):
                read_against_bandwidth(row, self.bandwidth)
            used = self.used.get(row.get("dtype"), ())
            if row.get("status") == "ok" and row.get("gemm_peak_gflops") in used:
                read_against_peak(row, self.peaks[row["dtype"]])
            # else: skipped, failed, or measured against another host's peak


def _remeasure(rows: list[Row], runner: PointRunner, started: float, budget: float) -> None:
    """Every series timed again with its points interleaved, then the points still
    noisy with their neighbours (sweep.remeasure), each pass in a share of the sweep's time
    so far."""
    if budget <= 0 or not (noisy_rows(rows) or series_groups(rows)
                           or any(row.get("brief_timing") for row in rows)):
        return
    time.sleep(SETTLE_SECONDS)  # the last point's worker threads go idle

    def make_call(row: Row):
        point = Point(**{name: row[name] for name in Point.__dataclass_fields__})
        return runner.make_call(point, *make_inputs(point))

    def threads_for(row: Row):
        return timing_threads(row["backend"])

    def full_timing(row: Row):
        with threads_for(row):
            return runner.full_timing(make_call(row))

    remeasure_series(rows, make_call, probe=default_probe(), threads_for=threads_for,
                     total_budget=SERIES_SHARE * (time.perf_counter() - started))
    complete_brief_timings(rows, full_timing)
    remeasure_noisy(rows, make_call, budget=budget, probe=default_probe(),
                    threads_for=threads_for,
                    total_budget=REMEASURE_SHARE * (time.perf_counter() - started))


def _postfix(row: Row) -> str:
    label = f"{row['backend']} L={row['L']} {row['mask']}"
    if row["status"] != "ok":
        return f"{label}: {row['status']}"
    return f"{label}: {row['median_ms']:.3g} ms"


def _progress_bar(total: int, *, enabled: bool):
    from tqdm import tqdm

    return tqdm(total=total, desc="sweep", unit="point", file=sys.stderr, disable=not enabled,
                dynamic_ncols=True)


def points_summary(points: Iterable[Point]) -> str:
    """``"52 points: numba 24, reference 10, ..."``."""
    points = list(points)
    counts = pd.Series([point.backend for point in points]).value_counts(sort=False)
    return f"{len(points)} points: " + ", ".join(f"{name} {n}" for name, n in counts.items())

