"""A function's timing samples and their summary: :class:`Timing`.

What :func:`attnbench.measure.timing.measure` and
:func:`~attnbench.measure.timing.interleaved` return: every kept sample (wall, process
CPU and thread CPU seconds per call), the calibrated number of inner calls, the counts of
samples and rounds, the probe's reading, and the statistics a table row needs (median and
its 95% interval, quartiles, whether it is noisy).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import cached_property

import numpy as np

from attnbench.measure.intervals import format_samples, median_interval
from attnbench.measure.probe import PROBE_TOLERANCE, WAIT_TOLERANCE

__all__ = ["NOISE_TARGET", "Timing"]

#: A median is "noisy" while its 95% interval's half-width exceeds this fraction of it.
NOISE_TARGET = 0.03


@dataclass(frozen=True)
class Timing:
    """Timing samples of one function, in seconds per call; warm-up calls excluded."""

    samples: tuple[float, ...]  # wall seconds per call, one per timed batch (kept ones)
    number: int  # calls per batch (calibrated): a sample is the batch's time / number
    warmup: int  # untimed calls made before the first batch
    cpu_samples: tuple[float, ...] = ()  # process CPU seconds per call, batch by batch
    thread_samples: tuple[float, ...] = ()  # calling thread's CPU seconds per call
    taken: int = 0  # samples taken in all, set-aside ones included (0: = runs)
    rounds: int = 1  # sampling rounds (more than 1: re-measured)
    target: float = NOISE_TARGET  # relative interval half-width aimed at
    probe_slowdown: float = math.nan  # median probe time / its best (nan: no probe)
    set_aside: tuple[float, ...] = field(default=(), repr=False)  # disturbed samples
    wait_samples: tuple[float, ...] = ()  # run-queue wait of the process's threads per call
    round_of: tuple[int, ...] = ()  # the sampling round of each kept sample

    @property
    def runs(self) -> int:
        """Number of timed batches (samples) the statistics use."""
        return len(self.samples)

    @property
    def calls(self) -> int:
        """Number of timed calls, ``runs * number``."""
        return self.runs * self.number

    @property
    def median(self) -> float:
        return float(np.median(self.samples))

    @property
    def q25(self) -> float:
        """First quartile (linear interpolation, as :func:`numpy.percentile`)."""
        return float(np.percentile(self.samples, 25))

    @property
    def q75(self) -> float:
        """Third quartile."""
        return float(np.percentile(self.samples, 75))

    @property
    def iqr(self) -> float:
        """Interquartile range ``q75 - q25``: the spread that ignores the outliers."""
        return self.q75 - self.q25

    @property
    def min(self) -> float:
        return float(min(self.samples))

    @cached_property
    def ci95(self) -> tuple[float, float]:
        """95% interval of the median (:func:`median_interval`; nan under 6 samples)."""
        return median_interval(self.samples)

    @property
    def rel_halfwidth(self) -> float:
        """Half the interval's width over the median (nan without an interval)."""
        low, high = self.ci95
        return (high - low) / 2 / self.median if self.median > 0 else math.nan

    @property
    def cpu_median(self) -> float:
        """Median process CPU seconds per call (nan if not recorded)."""
        return float(np.median(self.cpu_samples)) if self.cpu_samples else math.nan

    @property
    def thread_cpu_median(self) -> float:
        """Median CPU seconds per call of the calling thread (nan if not recorded)."""
        return float(np.median(self.thread_samples)) if self.thread_samples else math.nan

    @property
    def wait_share(self) -> float:
        """Median over the kept samples of the run-queue wait over the wall time: how long
        the process's threads, in all, waited for a core another process held (nan: not
        measured)."""
        pairs = [(w, s) for w, s in zip(self.wait_samples, self.samples, strict=False)
                 if np.isfinite(w) and s > 0]
        return float(np.median([w / s for w, s in pairs])) if pairs else math.nan

    @property
    def starved(self) -> bool:
        """Most kept samples were taken while the threads waited for cores
        (:data:`~attnbench.measure.probe.WAIT_TOLERANCE`): the times are inflated by
        other processes however tight their interval."""
        return bool(self.wait_share > WAIT_TOLERANCE)

    @property
    def noisy(self) -> bool:
        """Interval wider than ``target`` (or none), a probe that saw interference, or
        samples taken while the threads waited for cores (:attr:`starved`)."""
        width = self.rel_halfwidth
        disturbed = self.probe_slowdown > 1 + PROBE_TOLERANCE
        return bool(not width <= self.target or disturbed or self.starved)

    def as_dict(self) -> dict:
        """The summary statistics (seconds) and counts, flat, for a table row."""
        low, high = self.ci95
        return {
            "median_s": self.median, "q25_s": self.q25, "q75_s": self.q75,
            "iqr_s": self.iqr, "min_s": self.min, "runs": self.runs, "number": self.number,
            "ci_low_s": low, "ci_high_s": high, "cpu_median_s": self.cpu_median,
            "thread_cpu_median_s": self.thread_cpu_median,
            "samples_taken": self.taken or self.runs, "rounds": self.rounds,
            "probe_slowdown": self.probe_slowdown, "noisy": self.noisy,
            "wait_share": self.wait_share, "starved": self.starved,
        }

    def ms_columns(self) -> dict:
        """The summary as every table writes it, in milliseconds: median, quartiles, IQR,
        minimum, and the counts (runs, calls per run, calls)."""
        return {
            "median_ms": self.median * 1e3, "q25_ms": self.q25 * 1e3,
            "q75_ms": self.q75 * 1e3, "iqr_ms": self.iqr * 1e3, "min_ms": self.min * 1e3,
            "runs": self.runs, "number": self.number, "calls": self.calls,
        }

    def row_columns(self) -> dict:
        """Columns a sweep row adds beside ``median_ms``: interval, CPU time, samples, noise.

        ``samples_ms`` holds every kept sample in ms, space-separated (a CSV cell), so
        that fits and comparisons can resample them.
        """
        low, high = self.ci95
        return {
            "ci_low_ms": low * 1e3, "ci_high_ms": high * 1e3,
            "cpu_median_ms": self.cpu_median * 1e3,
            "thread_cpu_median_ms": self.thread_cpu_median * 1e3,
            "number": self.number, "samples_taken": self.taken or self.runs,
            "rounds": self.rounds, "probe_slowdown": self.probe_slowdown,
            "wait_share": self.wait_share, "starved": self.starved,
            "noisy": self.noisy, "samples_ms": format_samples(self.samples),
            "cpu_samples_ms": format_samples(self.cpu_samples),
        }

    def __str__(self) -> str:
        low, high = self.ci95
        noisy = ", noisy" if self.noisy else ""
        return (f"{self.median * 1e3:.4g} ms [{low * 1e3:.4g}, {high * 1e3:.4g}] "
                f"(IQR {self.iqr * 1e3:.2g} ms, {self.runs} runs x {self.number} calls{noisy})")
