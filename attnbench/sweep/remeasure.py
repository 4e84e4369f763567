"""A sweep's points measured again at its end: each series interleaved, then the points
still noisy, interleaved with their neighbours in L.

A *series* is the points that differ in one scaling variable (L, d_k, heads, or batch)
and agree in every other parameter, with at least :data:`SERIES_MIN_POINTS` values of it:
what a scaling fit reads.  :func:`remeasure_series` times every series again, one batch of
each of its points per round, so that a slower stretch of the machine slows every point of
a fit alike (the rows then say ``series_interleaved``).  Series that share a point (the
quick grid's numba L = 1024, d_k 64, 4 heads, batch 1 point is in its L, d_k, heads and
batch series) are timed as one group, so that each row is timed once, beside every point
it is fitted with.  :func:`complete_brief_timings` gives the full timing to a point whose
brief first timing no series pass replaced.  Then:

A point is *noisy* when its median's 95% interval is wider than the target or the probe
saw interference while it was timed (:attr:`attnbench.measure.timing.Timing.noisy`), even
after the rounds :func:`~attnbench.measure.timing.measure` adds within the point's own
budget: a burst of load lasting a whole point.  :func:`remeasure_noisy` times such a point
again, later in the run, in alternating rounds with the points next to it in L of the
same series (same backend, direction, variant, d_k, heads, kv_heads, batch, mask, dtype,
kind) via
:func:`~attnbench.measure.timing.interleaved`, so that a change of load hits the point and
its neighbours alike, until its interval is tight or its budget is spent.

Its row then holds the new samples and statistics, ``remeasured`` True, ``samples_taken``
and ``rounds`` counting the first measurement and the re-measurement together, and
``noisy`` saying whether it is still noisy.  The neighbours' rows are left as they were
(they were timed only as a yardstick), unless noisy themselves: then they get their own
re-measurement.
"""

from __future__ import annotations

import contextlib
import math
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from attnbench.measure.flops import gflops
from attnbench.measure.intervals import MIN_INTERVAL_SAMPLES
from attnbench.measure.probe import Probe, fault
from attnbench.measure.timing import Timing, interleaved

__all__ = ["Clocks", "REMEASURE_ROUNDS", "SERIES_KEYS", "SERIES_MAX_GROUP", "SERIES_MIN_POINTS",
           "SERIES_ROUNDS", "SERIES_VARIABLES", "complete_brief_timings", "in_long_series",
           "long_series", "neighbours", "noisy_rows", "read_against_bandwidth",
           "read_against_peak", "remeasure_noisy",
           "remeasure_series", "series_count", "series_groups", "series_key"]

#: Columns that identify a series of points along L.
SERIES_KEYS = ("backend", "direction", "variant", "d_k", "heads", "kv_heads", "batch", "mask",
               "dtype", "kind")
#: The variables a series varies, each with the parameters that vary with it (a series
#: over heads keeps the heads per K/V head, as its scaling fit does).
SERIES_VARIABLES = {"L": ("L",), "d_k": ("d_k",), "heads": ("heads", "kv_heads"),
                    "batch": ("batch",)}
_PARAMETERS = ("L", *SERIES_KEYS)

#: Rounds a re-measurement always takes: twice the fewest with an interval, so that a
#: point once found noisy is not called tight on a handful of fresh samples.
REMEASURE_ROUNDS = 2 * MIN_INTERVAL_SAMPLES

#: Rounds of a series' interleaved measurement (each round: one batch of every point).
SERIES_ROUNDS = MIN_INTERVAL_SAMPLES + 2
#: A series is measured interleaved when it has at least this many values.
SERIES_MIN_POINTS = 3
#: Seconds of further rounds per series while one of its points is still noisy.
SERIES_EXTRA_SECONDS = 2.0
#: Most rows a group of joined series is timed in (:func:`series_groups`).
SERIES_MAX_GROUP = 32

Clock = Callable[[], float]


@dataclass(frozen=True)
class Clocks:
    """The clocks and the sleep a re-measurement times with: the system's unless a test
    injects others (the keywords of :func:`attnbench.measure.timing.interleaved`)."""

    clock: Clock = time.perf_counter
    cpu_clock: Clock = time.process_time
    thread_clock: Clock = time.thread_time
    sleep: Callable[[float], object] = time.sleep

    def keywords(self) -> dict:
        """``clock``, ``cpu_clock``, ``thread_clock`` and ``sleep`` as keyword arguments."""
        return {"clock": self.clock, "cpu_clock": self.cpu_clock,
                "thread_clock": self.thread_clock, "sleep": self.sleep}


def _unchanged(row: dict) -> contextlib.AbstractContextManager:
    return contextlib.nullcontext()


def _timed_here(row: dict) -> bool:
    """An ok row timed on the CPU of this process (GPU rows have their own timer; rows
    resumed from a journal were timed by an earlier run, perhaps on another host)."""
    return (row.get("status") == "ok" and row.get("device", "cpu") == "cpu"
            and not row.get("resumed", False))


def noisy_rows(rows: list[dict]) -> list[int]:
    """Indices of the ok CPU rows flagged noisy, in order."""
    return [i for i, row in enumerate(rows) if _timed_here(row) and bool(row.get("noisy"))]


def _getter(item):
    return item.get if isinstance(item, dict) else lambda name: getattr(item, name)


def series_key(item, variable: str = "L") -> tuple:
    """What a row (dict) or a point (attributes) shares with the rest of its series along
    ``variable``: every other parameter (for heads, the heads per K/V head), and the
    variable's name.  Along L: the :data:`SERIES_KEYS`."""
    get = _getter(item)
    varied = SERIES_VARIABLES[variable]
    key = tuple(get(name) for name in _PARAMETERS if name not in varied)
    if variable == "heads":
        key += (get("heads") // max(get("kv_heads") or 1, 1),)
    return (variable, *key)


def _value(item, variable: str):
    return _getter(item)(variable)


def long_series(keyed_values) -> set:
    """The keys, among ``(series_key, value)`` pairs, with at least
    :data:`SERIES_MIN_POINTS` distinct values: the series the end of a sweep times again."""
    values: dict = {}
    for key, value in keyed_values:
        values.setdefault(key, set()).add(value)
    return {key for key, found in values.items() if len(found) >= SERIES_MIN_POINTS}


def _series_keys(item) -> tuple:
    """The item's :func:`series_key` along each of the :data:`SERIES_VARIABLES`."""
    return tuple(series_key(item, variable) for variable in SERIES_VARIABLES)


def _kept_series(items) -> set:
    """The keys of the series among ``items`` (rows or points) with enough values."""
    return long_series((series_key(item, variable), _value(item, variable))
                       for item in items for variable in SERIES_VARIABLES)


def in_long_series(items) -> Callable[[object], bool]:
    """For rows or points: ``f(item)``, whether ``item`` belongs to a series along any of
    the :data:`SERIES_VARIABLES` with at least :data:`SERIES_MIN_POINTS` values."""
    keep = _kept_series(list(items))
    return lambda item: any(key in keep for key in _series_keys(item))


def series_count(rows: list[dict], group: list[int]) -> int:
    """How many series (:func:`series_groups`) the rows of ``group`` make up."""
    members = [rows[i] for i in group]
    return len({key for item in members for key in _series_keys(item)} & _kept_series(members))


def series_groups(rows: list[dict]) -> list[list[int]]:
    """Indices of the ok CPU rows of every series (:data:`SERIES_VARIABLES`, at least
    :data:`SERIES_MIN_POINTS` values), series that share a row joined into one group;
    each group in sweep order, groups in the order of their first row.

    A joined group of more than :data:`SERIES_MAX_GROUP` rows (a large grid crossing
    several variables: its calls' inputs would all be held at once) is split into its
    series again, each row in the first series of :data:`SERIES_VARIABLES` order that holds
    it, so that every row is still timed once.
    """
    timed = [i for i, row in enumerate(rows) if _timed_here(row)]
    keep = _kept_series(rows[i] for i in timed)
    kept = {i: [key for key in _series_keys(rows[i]) if key in keep] for i in timed}
    parent = {i: i for i in timed}

    def root(i):
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    first_of: dict = {}
    for i in timed:
        for key in kept[i]:
            parent[root(i)] = root(first_of.setdefault(key, i))
    members: dict = {}
    for i in timed:
        if kept[i]:
            members.setdefault(root(i), []).append(i)
    groups = []
    for group in members.values():
        if len(group) <= SERIES_MAX_GROUP:
            groups.append(group)
            continue
        apart: dict = {}
        for i in group:
            apart.setdefault(kept[i][0], []).append(i)  # its first series
        groups.extend(apart.values())
    return sorted(groups, key=lambda group: group[0])


def neighbours(rows: list[dict], index: int) -> list[int]:
    """Indices of the ok CPU rows of the same series with the next smaller and larger L."""
    series = series_key(rows[index])
    L = rows[index]["L"]
    same = [i for i, row in enumerate(rows) if i != index and _timed_here(row)
            and series_key(row) == series]
    below = [i for i in same if rows[i]["L"] < L]
    above = [i for i in same if rows[i]["L"] > L]
    return ([max(below, key=lambda i: rows[i]["L"])] if below else []) + (
        [min(above, key=lambda i: rows[i]["L"])] if above else [])


def read_against_peak(row: dict, peak: float) -> None:
    """Set the row's ``gemm_peak_gflops``, ``pct_of_gemm_peak`` and ``fault`` from ``peak``.

    A percentage above 100 cannot be: it is a fault, and the percentage is left empty.
    """
    pct = 100 * row["gflops"] / peak
    row["gemm_peak_gflops"] = peak
    row["fault"] = fault(pct, 100, "% of the GEMM peak")
    row["pct_of_gemm_peak"] = math.nan if row["fault"] else pct


def read_against_bandwidth(row: dict, gbs: float | None = None) -> None:
    """A decode row's ``read_gbs`` (its ``bytes_read`` over its median time) and, given the
    read-bandwidth probe ``gbs``, ``read_bandwidth_gbs`` and ``pct_of_read_bandwidth``.

    Rows without ``bytes_read`` are left alone.  A percentage above 100 cannot be: it is a
    fault (added to the row's ``fault``), and the percentage is left empty.
    """
    nbytes = row.get("bytes_read", math.nan)
    if nbytes is None or not np.isfinite(nbytes) or not row.get("median_ms"):
        return
    row["read_gbs"] = nbytes / (row["median_ms"] * 1e-3) / 1e9
    if gbs is None or not np.isfinite(gbs):
        return
    pct = 100 * row["read_gbs"] / gbs
    problem = fault(pct, 100, "% of the read bandwidth")
    row["read_bandwidth_gbs"] = gbs
    row["pct_of_read_bandwidth"] = math.nan if problem else pct
    if problem:
        row["fault"] = "; ".join(text for text in (row.get("fault"), problem) if text)


def _update(row: dict, timing: Timing, flag: str = "remeasured") -> None:
    """The row's timing columns from ``timing``; the counts add to the first measurement's;
    ``flag`` set True."""
    taken, rounds = int(row.get("samples_taken") or 0), int(row.get("rounds") or 0)
    row.update(timing.ms_columns(), **timing.row_columns())
    row.update({flag: True}, gflops=gflops(row["flops"], timing.median),
               samples_taken=taken + timing.taken, rounds=rounds + timing.rounds)
    if np.isfinite(row.get("gemm_peak_gflops", math.nan)):
        read_against_peak(row, row["gemm_peak_gflops"])
    read_against_bandwidth(row, row.get("read_bandwidth_gbs"))


def remeasure_series(rows: list[dict], make_call: Callable[[dict], Callable[[], object]], *,
                     total_budget: float, rounds: int = SERIES_ROUNDS, min_time: float = 0.01,
                     extra: float = SERIES_EXTRA_SECONDS,
                     probe: Probe | None = None, clocks: Clocks = Clocks(),
                     threads_for: Callable[[dict], contextlib.AbstractContextManager]
                     = _unchanged) -> int:
    """Time every series again, all its points interleaved; rows updated in place.

    Series whose rows have a brief first timing (``brief_timing``: the sweep counted on
    this pass) are always timed; the others only while ``total_budget`` lasts.  A series
    whose calls fail keeps its first timings, and the error is printed.

    Each point of a series was timed on its own, one after the other: a stretch of a few
    tens of seconds in which the machine runs slower (another virtual machine on the host,
    a clock change; the process's threads do not wait, so the starved gauge sees nothing)
    then slows some points and not others, and bends the fit.  Here every round times one
    batch of each point of a group (:func:`series_groups`: a series, or series sharing a
    point) in turn (:func:`~attnbench.measure.timing.interleaved`), so such a stretch slows
    all its points alike and the fitted exponent keeps.  The rows get these samples
    instead of the first ones (``series_interleaved`` True); a series not timed keeps its
    first timings (False).

    Parameters
    ----------
    rows, make_call, min_time, probe, clocks, threads_for
        As for :func:`remeasure_noisy`.
    total_budget : float
        Seconds for the whole pass: no series is started once it is spent.
    rounds : int, default SERIES_ROUNDS
        Rounds per series.
    extra : float, default SERIES_EXTRA_SECONDS
        Seconds of further rounds per series (a group: this times its series) while one
        of its points is noisy.

    Returns
    -------
    int
        How many rows were re-measured.
    """
    started = clocks.clock()
    done = 0
    for row in rows:
        if _timed_here(row):
            row.setdefault("series_interleaved", False)
    for group in series_groups(rows):
        counted_on = any(rows[i].get("brief_timing") for i in group)
        if clocks.clock() - started >= total_budget and not counted_on:
            continue
        try:
            with threads_for(rows[group[0]]):
                timings = interleaved({i: make_call(rows[i]) for i in group}, rounds=rounds,
                                      min_time=min_time,
                                      budget=extra * max(1, series_count(rows, group)),
                                      probe=probe, **clocks.keywords())
        except Exception as exc:  # noqa: BLE001 - keep the sweep's rows whatever happens
            print(f"warning: timing the series of {_series_name(rows[group[0]])} again "
                  f"failed ({type(exc).__name__}: {exc}); its rows keep their first "
                  "timings", file=sys.stderr)
            continue
        for i in group:
            _update(rows[i], timings[i], flag="series_interleaved")
        done += len(group)
    return done


def _series_name(row: dict) -> str:
    return " ".join(str(row.get(key)) for key in SERIES_KEYS)


def complete_brief_timings(rows: list[dict], full_timing: Callable[[dict], Timing]) -> int:
    """Rows whose brief first timing no series pass replaced (too few values left ok, a
    failed series) get the sweep's full timing (``full_timing(row)``) instead."""
    done = 0
    for row in rows:
        if _timed_here(row) and row.get("brief_timing") and not row.get("series_interleaved"):
            try:
                _update(row, full_timing(row))
            except Exception as exc:  # noqa: BLE001 - the row keeps its brief timing
                print(f"warning: timing {_series_name(row)} L={row.get('L')} again failed "
                      f"({type(exc).__name__}: {exc}); its row keeps its brief timing",
                      file=sys.stderr)
                continue
            done += 1
    return done


def remeasure_noisy(rows: list[dict], make_call: Callable[[dict], Callable[[], object]], *,
                    budget: float, total_budget: float, min_time: float = 0.01,
                    probe: Probe | None = None, clocks: Clocks = Clocks(),
                    threads_for: Callable[[dict], contextlib.AbstractContextManager]
                    = _unchanged) -> int:
    """Measure the noisy rows again, each interleaved with its neighbours; rows updated in place.

    Parameters
    ----------
    rows : list of dict
        Sweep rows (:class:`attnbench.sweep.runner.PointRunner`): ``status``, ``noisy``,
        the :data:`SERIES_KEYS`, ``L``, ``flops``, ``samples_taken`` and ``rounds``.
    make_call : callable
        ``make_call(row)`` -> the function the row's point times.
    budget : float
        Seconds of rounds past the first :data:`REMEASURE_ROUNDS` per noisy point,
        while it is still noisy.
    total_budget : float
        Seconds for the whole pass: no point is started once it is spent.
    min_time : float, default 0.01
        Shortest batch (s), as the sweep times its points.
    probe : Probe, optional
        Read around every round (rounds it saw disturbed are set aside).
    clocks : Clocks, optional
        The clocks and the sleep the timing uses (:class:`Clocks`; the system's by default,
        injected by the tests).
    threads_for : callable, optional
        ``threads_for(row)`` -> the context (a thread limit) a series or a group of
        neighbours, all of one backend, is timed in
        (:func:`attnbench.measure.problems.timing_threads`); by default none.

    Returns
    -------
    int
        How many noisy rows were timed again.
    """
    started = clocks.clock()
    done = 0
    for index in noisy_rows(rows):
        left = total_budget - (clocks.clock() - started)
        if left <= 0:
            break
        group = [index, *neighbours(rows, index)]
        with threads_for(rows[index]):
            timings = interleaved({i: make_call(rows[i]) for i in group},
                                  rounds=REMEASURE_ROUNDS, min_time=min_time,
                                  budget=min(budget, left), probe=probe, watch=(index,),
                                  **clocks.keywords())
        _update(rows[index], timings[index])
        done += 1
    return done
