"""A sweep: every point of a grid measured by a :class:`~attnbench.sweep.runner.PointRunner`.

:func:`run_sweep` turns a list of :class:`attnbench.sweep.grid.Point` into a pandas
DataFrame with one row per point: an *executor* maps the runner over the points, a
function ``executor(points, run_point) -> iterator of rows`` that may yield rows in any
order.  :func:`serial_executor` runs them in this process, in order; a parallel executor
(:class:`attnbench.sweep.cluster.DaskExecutor`) honours the same signature.  Ctrl-C stops
a sweep and keeps the finished rows.
"""

from __future__ import annotations

import gc
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

from attnbench.measure.machine import gemm_peak_gflops, machine_columns
from attnbench.measure.problems import limit_threads, load_average
from attnbench.sweep.grid import Point
from attnbench.sweep.runner import COLUMNS, ORACLE_LIMIT, PointRunner, Row

__all__ = ["SweepResult", "points_summary", "run_sweep", "serial_executor"]

RunPoint = Callable[[Point], Row]
Executor = Callable[[Sequence[Point], RunPoint], Iterator[Row]]


def serial_executor(points: Sequence[Point], run_point: RunPoint) -> Iterator[Row]:
    """Run the points one after the other in this process, yielding each row when done."""
    for point in points:
        yield run_point(point)


@dataclass
class SweepResult:
    """What :func:`run_sweep` returns."""

    table: pd.DataFrame  # one row per finished point
    interrupted: bool  # True if Ctrl-C stopped the sweep: the table has the finished rows
    seconds: float  # wall-clock time of the sweep
    gemm_peaks: dict  # dtype name -> GFLOP/s, measured at the start
    n_points: int  # points asked for
    load_average: tuple = (float("nan"), float("nan"))  # 1-min load at the start and end


def run_sweep(points: Sequence[Point], *, max_time: float = 0.2,
              oracle_limit: int = ORACLE_LIMIT, memory_budget: float | None = None,
              gemm_peaks: dict | None = None, executor: Executor = serial_executor,
              progress: bool = True, with_machine: bool = True,
              runner: PointRunner | None = None, threads: int | None = None) -> SweepResult:
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
        dtype name -> GEMM GFLOP/s; measured now for the dtypes of the points if not given.
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

    Returns
    -------
    SweepResult
    """
    started = time.perf_counter()
    load_start = load_average()
    rows, interrupted = [], False
    with limit_threads(threads, torch=any(point.backend == "torch" for point in points)):
        if gemm_peaks is None:
            gemm_peaks = {name: gemm_peak_gflops(np.dtype(name))
                          for name in dict.fromkeys(point.dtype for point in points)}
        if runner is None:
            runner = PointRunner(max_time=max_time, oracle_limit=oracle_limit,
                                 memory_budget=memory_budget, gemm_peaks=gemm_peaks)
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
        except KeyboardInterrupt:
            interrupted = True
        finally:
            gc.unfreeze()
            bar.close()
    table = pd.DataFrame(rows)
    if not table.empty:
        table = table[[c for c in COLUMNS if c in table] + [c for c in table if c not in COLUMNS]]
    if with_machine and not table.empty:
        # Rows measured elsewhere (a Dask worker) bring their host's columns; keep them.
        for column, value in machine_columns().items():
            table[column] = table[column].fillna(value) if column in table else value
    return SweepResult(table=table, interrupted=interrupted,
                       seconds=time.perf_counter() - started, gemm_peaks=gemm_peaks,
                       n_points=len(points), load_average=(load_start, load_average()))


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

