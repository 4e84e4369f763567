"""The timing core every measurement shares, and the peak extra memory of a call.

Measuring (after pyperf and asv):

- **Warm-up excluded.**  :func:`measure` calls a function a few times untimed first (the
  warm-up absorbs Numba compilation, first-touch page faults and cache fills).
- **Calibration.**  Calls too short for the timer are batched, as
  :meth:`timeit.Timer.autorange` does: the batch size ("inner calls", ``number``) grows
  1, 2, 5, 10, 20, 50, ... until one batch lasts ``min_time``; a sample is the batch's time
  divided by ``number``, and the :class:`Timing` reports ``number``.
- **Many samples; median with an interval.**  Batches are repeated ``repeat`` times within
  ``max_time`` seconds (at least ``min_repeat`` times).  Every sample is kept; the summary
  is the median (timing noise is one-sided and skewed: interrupts, other processes) with
  its 95% distribution-free interval (order statistics,
  :func:`~attnbench.measure.intervals.median_interval`: the percentile bootstrap of a
  median covers too little with a benchmark's sample counts, see its notes).  Ratios of
  medians get a bootstrap interval (:func:`~attnbench.measure.intervals.ratio_interval`).
- **CPU time beside wall time.**  Each sample records the wall clock and the process's
  and the calling thread's CPU time (:func:`time.process_time`, :func:`time.thread_time`).
  CPU time is the *work* (it does not grow while the process waits for a core another
  process holds); wall time is the *speed*.
- **Noise detection and re-measurement.**  Given a time ``budget``, sampling goes on in
  rounds until the interval's relative half-width is at most ``target`` or the budget is
  spent; a :class:`Probe` (a fixed small GEMM timed between rounds) exposes interference,
  and rounds the probe saw disturbed are set aside when enough quiet ones exist.  The
  :class:`Timing` says how many samples it took and whether it is still ``noisy``.
- **Interleaving.**  :func:`interleaved` times several functions in alternating rounds, so
  that a change of machine load hits them all alike (a ratio is measured side by side).

All clocks are arguments, so the statistics are testable with a synthetic clock.  The
garbage collector is off while timing (as :mod:`timeit` does), and on glibc freed memory
stays in the process (:mod:`attnbench.measure.allocation`): repeated calls reuse their
pages instead of having the kernel fault in and zero fresh ones each time.

The :class:`Timing` a measurement returns lives in :mod:`attnbench.measure.samples`,
intervals in :mod:`attnbench.measure.intervals`, the probe and the fault check in
:mod:`attnbench.measure.probe`, and :func:`peak_extra_memory` (the peak memory a call needs
on top of what was allocated before it) in :mod:`attnbench.measure.memory`; all are
re-exported here.
"""

from __future__ import annotations

import contextlib
import gc
import itertools
import math
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from attnbench.measure.allocation import steady_allocation
from attnbench.measure.intervals import (
    MIN_INTERVAL_SAMPLES,
    format_samples,
    median_interval,
    parse_samples,
    ratio_interval,
)
from attnbench.measure.memory import peak_extra_memory, rss_peak_supported
from attnbench.measure.probe import WAIT_TOLERANCE, Probe, default_probe, fault, run_queue_wait
from attnbench.measure.samples import NOISE_TARGET, Timing

__all__ = ["NOISE_TARGET", "Probe", "Timing", "default_probe", "fault", "format_samples",
           "interleaved",
           "measure", "median_interval", "parse_samples", "peak_extra_memory", "ratio_interval",
           "rss_peak_supported"]

Clock = Callable[[], float]


# --- sampling ---------------------------------------------------------------------------------


def _batch_sizes():
    """1, 2, 5, 10, 20, 50, 100, ... as :meth:`timeit.Timer.autorange` tries them."""
    for power in itertools.count():
        for base in (1, 2, 5):
            yield base * 10**power


@dataclass(frozen=True)
class _Clocks:
    wall: Clock = time.perf_counter
    cpu: Clock = time.process_time
    thread: Clock = time.thread_time
    wait: Clock = run_queue_wait

    def batch(self, fn: Callable[[], object], number: int) -> tuple[float, ...]:
        """``(wall, process CPU, thread CPU, run-queue wait)`` seconds of ``number`` calls
        (the whole batch; the wait is nan where it cannot be read)."""
        wait, cpu, thread = self.wait(), self.cpu(), self.thread()
        start = self.wall()
        for _ in range(number):
            fn()
        wall = self.wall() - start
        return wall, self.cpu() - cpu, self.thread() - thread, max(self.wait() - wait, 0.0)

    def calibrate(self, fn, min_time: float, max_time: float) -> tuple[int, tuple]:
        """``(number, first batch)``: the batch size whose batch lasts ``min_time``."""
        start = self.wall()
        for number in _batch_sizes():
            batch = self.batch(fn, number)
            if batch[0] >= min_time or self.wall() - start >= max_time:
                return number, batch
        raise AssertionError("unreachable")


def _no_wait() -> float:
    return math.nan


def _wait_clock(wait_clock: Clock | None, clock: Clock) -> Clock:
    """The run-queue gauge to use: the one given; by default the process's own
    (:func:`run_queue_wait`) with the real wall clock, none with a synthetic one (its
    times have nothing to do with this process's scheduling)."""
    if wait_clock is not None:
        return wait_clock
    return run_queue_wait if clock is time.perf_counter else _no_wait


class _Series:
    """The samples of one function, round by round, and what the probe read around them."""

    def __init__(self, number: int, warmup: int, target: float):
        self.number, self.warmup, self.target = number, warmup, target
        self.rounds: list[list[tuple[float, float, float]]] = []  # per round: batches
        self.probe_readings: list[float] = []  # one per round (the slower of before/after)

    def new_round(self) -> None:
        self.rounds.append([])

    def add(self, batch: tuple[float, ...]) -> None:
        self.rounds[-1].append(tuple(value / self.number for value in batch))

    def timing(self, probe: Probe | None) -> Timing:
        """Set aside the rounds the probe saw disturbed, then the samples whose threads
        waited for a core (:data:`WAIT_TOLERANCE`), each if enough samples remain."""
        quiet = list(range(len(self.rounds)))
        slowdowns = []
        if probe is not None and len(self.probe_readings) == len(self.rounds):
            slowdowns = [probe.slowdown(reading) for reading in self.probe_readings]
            calm = [i for i in quiet if slowdowns[i] <= 1 + probe.tolerance]
            if sum(len(self.rounds[i]) for i in calm) >= MIN_INTERVAL_SAMPLES:
                quiet = calm
        kept = [(*s, i) for i in quiet for s in self.rounds[i]]  # (..., its round)
        aside = [s[0] for i, r in enumerate(self.rounds) if i not in quiet for s in r]
        waited = [s[3] > WAIT_TOLERANCE * s[0] for s in kept]  # a nan wait did not
        if any(waited) and waited.count(False) >= MIN_INTERVAL_SAMPLES:
            aside += [s[0] for s, w in zip(kept, waited, strict=True) if w]
            kept = [s for s, w in zip(kept, waited, strict=True) if not w]
        slowdown = float(np.median([slowdowns[i] for i in quiet])) if slowdowns else math.nan
        wall, cpu, thread, wait, round_of = (tuple(column) for column in zip(*kept, strict=True))
        return Timing(samples=wall, number=self.number, warmup=self.warmup, cpu_samples=cpu,
                      thread_samples=thread, taken=len(kept) + len(aside),
                      rounds=len(self.rounds), target=self.target, probe_slowdown=slowdown,
                      set_aside=tuple(aside), wait_samples=wait, round_of=round_of)


def measure(fn: Callable[[], object], *, warmup: int = 1, repeat: int = 7,
            min_time: float = 1e-3, max_time: float = 1.0, min_repeat: int = 3,
            number: int | None = None, clock: Clock = time.perf_counter,
            cpu_clock: Clock = time.process_time, thread_clock: Clock = time.thread_time,
            target: float = NOISE_TARGET, budget: float = 0.0, probe: Probe | None = None,
            max_samples: int = 500, wait_clock: Clock | None = None) -> Timing:
    """Time ``fn()``: median, its interval and spread over batches, warm-up excluded.

    Parameters
    ----------
    fn : callable
        Called without arguments (bind them with :func:`functools.partial` or a lambda).
    warmup : int, default 1
        Untimed calls first; they absorb JIT compilation and first-touch costs.
    repeat : int, default 7
        Number of timed batches wanted in the first round.
    min_time : float, default 1e-3
        Shortest batch, in seconds, when ``number`` is chosen automatically;
        ``perf_counter`` resolves about a ten-thousandth of the default batch.
    max_time : float, default 1.0
        Wall-clock budget, in seconds, for the first round (the warm-up is not counted).
        No batch is started that is expected to end past it once ``min_repeat`` batches
        exist, so slow calls get fewer samples rather than a longer run.
    min_repeat : int, default 3
        Batches taken even past the budget (capped at ``repeat``).
    number : int, optional
        Calls per batch; by default grown 1, 2, 5, 10, ... until a batch lasts ``min_time``
        (that calibration batch is the first sample: all its calls come after the warm-up).
    clock, cpu_clock, thread_clock, wait_clock : callable
        Wall clock (:func:`time.perf_counter`), process CPU time, thread CPU time and the
        process's run-queue wait (:func:`~attnbench.measure.probe.run_queue_wait`), in
        seconds; synthetic clocks make the statistics testable (with a synthetic ``clock``
        the wait is not read unless ``wait_clock`` is given).  Samples whose threads
        waited for a core more than :data:`~attnbench.measure.probe.WAIT_TOLERANCE` of
        their wall time are set aside when enough others remain (and flag the timing
        ``starved`` when they do not).
    target : float, default NOISE_TARGET
        Relative half-width of the median's 95% interval below which it is not noisy.
    budget : float, default 0
        Seconds of further rounds (each of ``max(repeat, 5)`` batches, the probe read
        before and after) while the timing is noisy.  0: one round.
    probe : Probe, optional
        Read around every round; rounds it saw disturbed are set aside when at least
        :data:`MIN_INTERVAL_SAMPLES` quiet samples remain.
    max_samples : int, default 500
        No further round once this many samples were taken.

    Returns
    -------
    Timing
    """
    if repeat < 1 or warmup < 0 or min_repeat < 1:
        raise ValueError(f"need repeat >= 1, min_repeat >= 1 and warmup >= 0; got "
                         f"repeat={repeat}, min_repeat={min_repeat}, warmup={warmup}")
    if number is not None and number < 1:
        raise ValueError(f"number must be >= 1 or None; got {number}")
    min_repeat = min(min_repeat, repeat)
    clocks = _Clocks(wall=clock, cpu=cpu_clock, thread=thread_clock,
                     wait=_wait_clock(wait_clock, clock))
    with _quiet_process():
        for _ in range(warmup):
            fn()
        reading = probe() if probe is not None else None
        start = clock()
        first = None
        if number is None:  # autorange; the batch that reaches min_time is the first sample
            number, first = clocks.calibrate(fn, min_time, max_time)
        series = _Series(number, warmup, target)
        series.new_round()
        if first is not None:
            series.add(first)
        _fill_round(fn, clocks, series, repeat, min_repeat, start, max_time)
        if probe is not None:
            series.probe_readings.append(max(reading, probe()))
        extra_start = clock()
        while (clock() - extra_start < budget and series.timing(probe).noisy
               and sum(map(len, series.rounds)) < max_samples):
            reading = probe() if probe is not None else None
            series.new_round()
            _fill_round(fn, clocks, series, max(repeat, 5), 1, extra_start, budget)
            if probe is not None:
                series.probe_readings.append(max(reading, probe()))
    return series.timing(probe)


@contextlib.contextmanager
def _quiet_process():
    """The garbage collector off (as :mod:`timeit` does) and freed memory kept in the
    process (:func:`~attnbench.measure.allocation.steady_allocation`) while timing."""
    gc_was_enabled = gc.isenabled()
    gc.disable()
    try:
        with steady_allocation():
            yield
    finally:
        if gc_was_enabled:
            gc.enable()


def _fill_round(fn, clocks: _Clocks, series: _Series, repeat: int, min_repeat: int,
                start: float, max_time: float) -> None:
    """Add batches to the last round until it has ``repeat`` or the next would end late."""
    current = series.rounds[-1]
    while len(current) < repeat:
        mean = float(np.mean([s[0] for s in current])) if current else 0.0
        if len(current) >= min_repeat and clocks.wall() - start + series.number * mean > max_time:
            break
        series.add(clocks.batch(fn, series.number))


def interleaved(functions: dict, *, rounds: int = 7, min_time: float = 1e-3,
                warmup: int = 1, settle: float = 0.0, rewarm: bool | None = None,
                target: float = NOISE_TARGET,
                budget: float = 0.0, probe: Probe | None = None, max_rounds: int = 200,
                watch=None, clock: Clock = time.perf_counter, cpu_clock: Clock = time.process_time,
                thread_clock: Clock = time.thread_time, wait_clock: Clock | None = None,
                sleep: Callable[[float], object] = time.sleep) -> dict:
    """Time several functions in alternating rounds, so that load changes hit them all alike.

    Each function is warmed up and calibrated (its ``number`` of inner calls, as in
    :func:`measure`; that batch is its first sample).  Then every round takes one batch of
    each function in turn, starting one function further on each round (no function
    always follows the same one), the probe read before and after.  After ``rounds``
    rounds, more rounds follow while any function is noisy and ``budget`` seconds are
    left.

    Parameters
    ----------
    functions : dict
        name -> callable without arguments.
    rounds : int, default 7
        Rounds always taken.
    min_time, warmup, target, probe, clock, cpu_clock, thread_clock, wait_clock
        As for :func:`measure`.
    settle : float, default 0
        Pause after each batch (seconds), so that the threads it woke go idle.
    rewarm : bool, optional
        One untimed call before each batch of a round, after the pause (default: when
        ``settle`` > 0).  On small virtual machines the first parallel call after a
        tenth of a second idle can run as if on one core for a while (an idle vCPU comes
        back slowly); a timed batch that began with it measures that, not the function.
    budget : float, default 0
        Seconds for further rounds while some function's median is noisy.
    max_rounds : int, default 200
        No round past this many.
    watch : collection of names, optional
        Only these functions' noise keeps further rounds going (the others are timed
        alongside, as a yardstick); default: every function's.
    sleep : callable, default time.sleep

    Returns
    -------
    dict
        name -> :class:`Timing`.
    """
    if rounds < 1:
        raise ValueError(f"rounds must be >= 1; got {rounds}")
    clocks = _Clocks(wall=clock, cpu=cpu_clock, thread=thread_clock,
                     wait=_wait_clock(wait_clock, clock))
    rewarm = settle > 0 if rewarm is None else rewarm
    series: dict = {}
    with _quiet_process():
        for name, fn in functions.items():
            for _ in range(warmup):
                fn()
            number, first = clocks.calibrate(fn, min_time, math.inf)
            series[name] = _Series(number, warmup, target)
            series[name].new_round()
            series[name].add(first)
            sleep(settle)
        if probe is not None:
            reading = probe()
            for one in series.values():
                one.probe_readings.append(reading)
        names = list(functions)
        watched = names if watch is None else [name for name in names if name in watch]
        extra_start = None
        for index in range(1, max_rounds):
            if index >= rounds:
                extra_start = clock() if extra_start is None else extra_start
                if clock() - extra_start >= budget or not any(
                        series[name].timing(probe).noisy for name in watched):
                    break
            before = probe() if probe is not None else None
            for name in names[index % len(names):] + names[:index % len(names)]:
                series[name].new_round()
                if rewarm:
                    functions[name]()  # untimed: wakes what the pause let sleep
                series[name].add(clocks.batch(functions[name], series[name].number))
                sleep(settle)
            if probe is not None:
                reading = max(before, probe())
                for one in series.values():
                    one.probe_readings.append(reading)
    return {name: one.timing(probe) for name, one in series.items()}
