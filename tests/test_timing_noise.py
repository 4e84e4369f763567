"""The measurement core on a synthetic machine: intervals cover the truth, re-measurement
converges, interference and drift are caught.  No real timing is asserted here."""

import math

import numpy as np
import pytest

from attnbench.measure.intervals import median_interval, ratio_interval
from attnbench.measure.timing import Probe, interleaved, measure

NOISE = 0.05  # mean of the one-sided exponential noise, as a fraction of the true time
#: The population median of a call of true time t: t · (1 + NOISE · ln 2).
MEDIAN_FACTOR = 1 + NOISE * math.log(2)


class SyntheticMachine:
    """A clock that only moves when a synthetic workload runs.

    A call of true time t takes ``t · (1 + e) · slowdown`` on the wall clock, e
    exponential with mean ``noise`` (interrupts: one-sided), ``slowdown`` the product of
    a linear drift and the factor of any interference burst in progress.  The CPU clock
    advances by ``t`` only (the work), the thread clock by the same.
    """

    def __init__(self, seed=0, noise=NOISE, bursts=(), drift=0.0):
        self.rng = np.random.default_rng(seed)
        self.noise, self.bursts, self.drift = noise, bursts, drift
        self.now = 0.0
        self.cpu = 0.0

    def __call__(self):
        return self.now

    def cpu_clock(self):
        return self.cpu

    def slowdown(self):
        factor = 1 + self.drift * self.now
        for start, end, burst in self.bursts:
            if start <= self.now < end:
                factor *= burst
        return factor

    def workload(self, true_seconds):
        def call():
            self.cpu += true_seconds
            self.now += true_seconds * (1 + self.rng.exponential(self.noise)) * self.slowdown()
        return call

    def clocks(self):
        return {"clock": self, "cpu_clock": self.cpu_clock, "thread_clock": self.cpu_clock}


def coverage_bounds(trials, level=0.95):
    """Counts of covering intervals outside which a true ``level`` rate is rejected at
    p < 0.001 (normal approximation of the binomial)."""
    sd = math.sqrt(trials * level * (1 - level))
    return trials * level - 3.3 * sd, trials * level + 3.3 * sd


@pytest.mark.parametrize("samples", [15, 40])
def test_median_interval_covers_the_true_median_at_the_stated_rate(samples):
    trials, covered = 300, 0
    for seed in range(trials):
        machine = SyntheticMachine(seed)
        timing = measure(machine.workload(1e-3), warmup=1, repeat=samples, number=1,
                         max_time=math.inf, **machine.clocks())
        low, high = timing.ci95
        covered += low <= 1e-3 * MEDIAN_FACTOR <= high
    low_count, high_count = coverage_bounds(trials)
    assert low_count <= covered <= high_count


def test_ratio_interval_covers_the_true_ratio():
    trials, covered = 200, 0
    for seed in range(trials):
        rng = np.random.default_rng(seed)
        slow = 7e-3 * (1 + rng.exponential(NOISE, 25))
        fast = 1e-3 * (1 + rng.exponential(NOISE, 25))
        ratio, low, high = ratio_interval(slow, fast)
        assert low <= ratio <= high
        covered += low <= 7 <= high
    low_count, high_count = coverage_bounds(trials)
    assert low_count <= covered <= high_count


def test_interval_needs_samples_and_is_deterministic():
    assert all(math.isnan(bound) for bound in median_interval([1.0, 2.0, 3.0]))
    assert median_interval([2.0] * 9) == (2.0, 2.0)
    assert median_interval([5, 1, 4, 2, 3, 6]) == (1, 6)  # n = 6: the extremes, 96.9%
    samples = np.random.default_rng(1).exponential(1, 30)
    assert median_interval(samples) == median_interval(samples)


def test_calibration_reports_the_inner_call_count_and_cpu_time_is_the_work():
    machine = SyntheticMachine(bursts=[(0, math.inf, 2.0)])  # everything runs 2x slower
    timing = measure(machine.workload(1e-5), repeat=20, min_time=1e-3, max_time=math.inf,
                     **machine.clocks())
    assert timing.number == 50  # 20 calls of >= 2e-5 s are under 1 ms, 50 are not
    assert timing.cpu_median == pytest.approx(1e-5)  # the work, whatever the slowdown
    assert timing.thread_cpu_median == pytest.approx(1e-5)
    assert timing.median > 2e-5  # the wall clock sees the slowdown
    assert timing.as_dict()["number"] == 50 and timing.row_columns()["number"] == 50


def test_remeasurement_converges_to_a_tight_interval_that_covers_the_truth():
    machine = SyntheticMachine(seed=3, noise=0.5)  # very noisy: 7 samples are not enough
    first = measure(machine.workload(1e-3), repeat=7, number=1, max_time=math.inf,
                    **machine.clocks())
    assert first.noisy and first.rounds == 1
    trials, covered = 60, 0
    for seed in range(trials):
        machine = SyntheticMachine(seed=seed, noise=0.5)
        timing = measure(machine.workload(1e-3), repeat=7, number=1, max_time=math.inf,
                         budget=10.0, target=0.05, **machine.clocks())
        assert not timing.noisy and timing.rel_halfwidth <= 0.05
        assert timing.rounds > 1 and timing.taken == timing.runs > 7
        low, high = timing.ci95
        covered += low <= 1e-3 * (1 + 0.5 * math.log(2)) <= high
    # Stopping once the interval is tight must not spoil its coverage.
    assert covered >= coverage_bounds(trials)[0]


def test_a_spent_budget_leaves_the_point_flagged_noisy():
    machine = SyntheticMachine(seed=4, noise=2.0)
    timing = measure(machine.workload(1e-3), repeat=7, number=1, max_time=math.inf,
                     budget=0.02, target=0.01, **machine.clocks())
    assert timing.noisy and timing.rounds >= 2
    assert timing.taken < 60  # stopped by the budget: 0.02 s of ~3 ms calls
    assert timing.as_dict()["noisy"] and timing.row_columns()["samples_taken"] == timing.taken


def test_probe_sets_aside_a_burst_of_interference():
    # A burst triples every duration between t = 0.02 s and 0.05 s of a 0.1+ s measurement.
    machine = SyntheticMachine(seed=5, bursts=[(0.02, 0.05, 3.0)])
    probe = Probe(machine.workload(1e-5), clock=machine)
    timing = measure(machine.workload(1e-3), repeat=10, number=1, max_time=math.inf,
                     budget=0.2, probe=probe, **machine.clocks())
    # The rounds the probe saw in (or next to) the burst are set aside: all burst samples.
    assert sum(sample > 2e-3 for sample in timing.set_aside) >= 5
    assert max(timing.samples) < 2e-3
    assert not timing.noisy and timing.probe_slowdown < 1.3
    low, high = timing.ci95
    assert low <= 1e-3 * MEDIAN_FACTOR <= high


def test_interference_over_the_whole_measurement_is_flagged():
    machine = SyntheticMachine(seed=6, bursts=[(0.001, math.inf, 3.0)])
    probe = Probe(machine.workload(1e-5), clock=machine)
    probe()  # the quiet machine, read before the burst
    timing = measure(machine.workload(1e-3), repeat=20, number=1, max_time=math.inf,
                     probe=probe, **machine.clocks())
    assert timing.rel_halfwidth < 0.03  # a tight interval ...
    assert timing.probe_slowdown > 2.5 and timing.noisy  # ... of a disturbed machine


def test_interleaving_keeps_a_ratio_right_on_a_drifting_machine():
    # The machine slows down by 100% per simulated second; the true ratio is 2.
    machine = SyntheticMachine(seed=7, drift=1.0)
    slow, fast = machine.workload(2e-3), machine.workload(1e-3)
    timings = interleaved({"slow": slow, "fast": fast}, rounds=40, min_time=0.0,
                          sleep=lambda s: None, **machine.clocks())
    ratio, low, high = ratio_interval(timings["slow"].samples, timings["fast"].samples)
    assert low <= 2 <= high
    # One after the other, the drift biases the same ratio beyond its interval.
    machine = SyntheticMachine(seed=7, drift=1.0)
    first = measure(machine.workload(2e-3), repeat=40, number=1, max_time=math.inf,
                    **machine.clocks())
    second = measure(machine.workload(1e-3), repeat=40, number=1, max_time=math.inf,
                     **machine.clocks())
    ratio, low, high = ratio_interval(first.samples, second.samples)
    assert high < 2


def test_interleaved_rotates_the_order_and_remeasures_noisy_functions():
    machine = SyntheticMachine(seed=8, noise=0.5)
    order = []

    def traced(name, fn):
        def call():
            order.append(name)
            fn()
        return call

    functions = {name: traced(name, machine.workload(1e-3)) for name in "abc"}
    timings = interleaved(functions, rounds=4, min_time=0.0, warmup=0, budget=5.0,
                          target=0.1, sleep=lambda s: None, **machine.clocks())
    assert order[:6] == ["a", "b", "c", "b", "c", "a"]  # calibration, then round 1 from b
    assert all(not t.noisy and t.rounds > 4 for t in timings.values())
    assert len({t.runs for t in timings.values()}) == 1  # every round times every function


class WaitingMachine(SyntheticMachine):
    """A synthetic machine whose interference bursts make the process's threads wait for
    a core: the extra wall time of a call in a burst is run-queue wait."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.waited = 0.0

    def wait_clock(self):
        return self.waited

    def workload(self, true_seconds):
        def call():
            self.cpu += true_seconds
            quiet = true_seconds * (1 + self.rng.exponential(self.noise))
            self.waited += quiet * (self.slowdown() - 1)
            self.now += quiet * self.slowdown()
        return call

    def clocks(self):
        return {**super().clocks(), "wait_clock": self.wait_clock}


def test_samples_whose_threads_waited_for_a_core_are_set_aside():
    # a 2x burst over part of the run: tight inside, but every call there waited
    machine = WaitingMachine(seed=3, noise=0.01, bursts=[(0.004, 0.012, 2.0)])
    timing = measure(machine.workload(1e-3), repeat=20, number=1, max_time=math.inf,
                     **machine.clocks())
    assert timing.set_aside and max(timing.samples) < 1.2e-3  # the burst's samples left out
    assert not timing.starved and timing.wait_share == 0


def test_a_timing_taken_entirely_while_starved_says_so():
    machine = WaitingMachine(seed=4, noise=0.01, bursts=[(0.0, math.inf, 3.0)])
    timing = measure(machine.workload(1e-3), repeat=12, number=1, max_time=math.inf,
                     **machine.clocks())
    assert timing.rel_halfwidth < 0.03  # tight, and wrong by 3x: only the wait shows it
    assert timing.starved and timing.noisy and timing.wait_share == pytest.approx(2 / 3)
    assert timing.row_columns()["starved"] is True


def test_the_run_queue_gauge_reads_this_process():
    from attnbench.measure.probe import run_queue_wait

    first = run_queue_wait()
    assert math.isnan(first) or (first >= 0 and run_queue_wait() >= first)


def test_paired_ratio_covers_the_true_ratio_and_is_narrower_on_a_drifting_machine():
    from attnbench.claims.rules import ratio
    from attnbench.measure.intervals import paired_ratio_interval

    trials, covered, narrower = 200, 0, 0
    for seed in range(trials):
        # The machine slows by 30% over the measurement: both functions alike, round by round.
        machine = SyntheticMachine(seed, drift=3.0)
        timings = interleaved({"big": machine.workload(6.6e-3), "small": machine.workload(1e-3)},
                              rounds=15, min_time=0, **machine.clocks())
        times = {name: {"timing": timing} for name, timing in timings.items()}
        value, low, high = ratio(times, "big", "small")
        covered += low <= 6.6 <= high
        _, unpaired_low, unpaired_high = ratio_interval(timings["big"].samples,
                                                        timings["small"].samples)
        narrower += (high - low) < (unpaired_high - unpaired_low)
        assert value == paired_ratio_interval(
            timings["big"].samples, timings["big"].round_of,
            timings["small"].samples, timings["small"].round_of)[0]
    low_count, _ = coverage_bounds(trials)
    assert covered >= low_count  # at least the stated rate (order statistics: conservative)
    assert narrower >= 0.9 * trials


def test_paired_ratio_needs_one_sample_per_round_and_enough_common_rounds():
    from attnbench.measure.intervals import paired_ratio_interval

    samples = [1.0] * 8
    assert paired_ratio_interval(samples, range(8), samples, [0] * 8) is None  # measure()
    assert paired_ratio_interval(samples, range(8), samples, range(4, 12)) is None  # 4 common
    assert paired_ratio_interval(samples, range(8), samples, range(8)) == (1.0, 1.0, 1.0)


def test_after_each_pause_an_untimed_call_wakes_the_function():
    """A function whose first call after a pause is slow (as the first parallel call after
    ~0.1 s of idle is on a 2-core VM) is timed at its steady speed: with ``settle`` one
    untimed call follows each pause; without the rewarm, every batch measured the cold call."""
    now, cold = [0.0], [True]

    def clock():
        return now[0]

    def sleep(seconds):
        now[0] += seconds
        cold[0] = True

    def step():
        now[0] += 5e-3 if cold[0] else 1e-3
        cold[0] = False

    clocks = dict(clock=clock, cpu_clock=clock, thread_clock=clock, sleep=sleep)
    warm = interleaved({"step": step}, rounds=6, min_time=0.0, settle=0.2, **clocks)
    assert np.median(warm["step"].samples) == pytest.approx(1e-3)
    cold_timed = interleaved({"step": step}, rounds=6, min_time=0.0, settle=0.2,
                             rewarm=False, **clocks)
    assert np.median(cold_timed["step"].samples) == pytest.approx(5e-3)
