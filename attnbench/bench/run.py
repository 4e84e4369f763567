"""``attnbench bench``: the numba backend against its peers, side by side, in one process.

This is issue 4's table.  Every comparison is made on the same inputs, in the same
process, with the same thread count, and timed in interleaved rounds: each round calls
every implementation once (a batch of calls for short ones), so a burst of load from
another process hits all of them alike.  A timing is the median of its rounds, with the
interquartile range; ratios are ratios of medians.

Implementations:

- ``numba``: :func:`kernels.attention` with ``backend="numba"`` (validation included);
- ``torch``: PyTorch's ``scaled_dot_product_attention`` on the CPU
  (:mod:`attnbench.measure.peers`), with ``torch.set_num_threads`` equal to Numba's threads;
- ``numpy``: the plain formula in NumPy, in the input dtype (:mod:`attnbench.measure.peers`),
  its BLAS held to the same thread count;
- ``gemm floor`` (non-causal shapes): the numba kernel's two tile GEMMs alone, same tiles
  and tasks, no softmax (:mod:`attnbench.bench.gemm_floor`): the time the kernel would take if
  its softmax were free, so its ratio to a peer is the lowest ratio the kernel can reach.

A peer that is not installed is reported as missing (a row with that status), not
dropped.  torch is imported before Numba's OpenMP threading layer starts: imported
after it, then given ``torch.set_num_threads``, torch's SDPA ran 5x slower here (L=1024:
110-118 ms against 20-21 ms; torch 2.13, Numba 0.68 with the omp layer), which would
flatter numba.  Sections of the table (column ``section``):

- ``speed``: B=1, H=12, D=64, every L, causal and not: time, GFLOP/s (visible pairs,
  :mod:`attnbench.measure.flops`), % of the float32 GEMM peak measured in this run
  (:func:`attnbench.measure.machine.gemm_peak_gflops`, the larger of a measurement before and
  after the timings), numba / torch and numba / numpy, and the error of each against
  the oracle (:mod:`attnbench.measure.oracle`) on the last ``error_rows`` queries of head 0
  (rows are independent, so the oracle never needs the whole L x L problem);
- ``peak``: the same, non-causal, for the other head sizes (D=128) at L >= 2048;
- ``float64``: float64 beside float32 (no target);
- ``memory``: peak memory of one numba call beyond its inputs and output at L=16384, by
  tracemalloc (what NumPy and Numba allocate, the output subtracted), and the rise of the
  resident set size during the call as a cross-check (every allocator, the BLAS's buffers
  included; it counts the output only where it needed new pages);
- ``tiny``: latency of a tiny call (L=64, H=1, D=64), numba against torch;
- ``causal``: numba causal against non-causal at L >= ``peak_min_length``, interleaved
  (the causal speed-up target);
- ``padding``: numba with half the keys padded through ``key_lengths`` against none;
- ``parallel``: numba on 1 thread against all of them;
- ``startup``: a new Python process, Numba's cache warm: ``import kernels`` and the first
  call (of the parallel kernel), timed inside the process; the whole process beside it.

:func:`targets_table` turns the rows into one verdict per target of the issue.
"""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import numpy as np
import pandas as pd

import kernels
from attnbench.bench.gemm_floor import measurable as floor_measurable
from attnbench.bench.gemm_floor import tile_gemms_call
from attnbench.measure import peers
from attnbench.measure.flops import attention_flops, gflops
from attnbench.measure.machine import (
    gemm_peak_gflops,
    machine_columns,
    machine_record,
    summary_lines,
)
from attnbench.measure.oracle import max_abs_error, oracle, tolerance
from attnbench.measure.timing import Timing, default_probe, fault, peak_extra_memory
from attnbench.measure.timing import interleaved as timing_interleaved

__all__ = ["COLUMNS", "QUICK", "TARGET_COLUMNS", "BenchConfig", "command", "run_bench",
           "targets_table"]

#: Implementations compared, in table order.
IMPLS = ("numba", "torch", "numpy")
#: The numba kernel's tile GEMMs alone (:mod:`attnbench.bench.gemm_floor`), timed beside it on
#: non-causal shapes: the floor under its time.
FLOOR = "gemm floor"
#: Seed of the inputs of every shape.
SEED = 0
#: Pause (s) after each call of an implementation in a round: the BLAS's and OpenMP's
#: worker threads spin for ~0.1 s after a call, which would slow whatever runs next.
SETTLE_SECONDS = 0.15
#: Columns of the bench table, in order (then the machine columns).
COLUMNS = (
    "section", "impl", "variant", "B", "H", "L", "D", "causal", "dtype", "threads", "status",
    "median_ms", "q25_ms", "q75_ms", "iqr_ms", "runs", "number", "gflops", "pct_of_gemm_peak",
    "vs_torch", "vs_numpy", "max_abs_err", "tolerance", "within_tolerance", "extra_mib",
    "rss_extra_mib", "load_1m",
)
#: Columns of the targets table.
TARGET_COLUMNS = ("target", "shape", "measured", "goal", "met", "note")


@dataclass(frozen=True)
class BenchConfig:
    """What ``attnbench bench`` measures (the defaults are issue 4's table)."""

    lengths: tuple[int, ...] = (512, 1024, 2048, 4096, 8192)  # L of the speed section
    head_size: int = 64  # D of the speed section
    peak_head_sizes: tuple[int, ...] = (64, 128)  # D whose GEMM-peak fraction is checked
    peak_min_length: int = 2048  # ... at every L >= this (non-causal)
    heads: int = 12  # H of every section but tiny
    batch: int = 1  # B of every section
    causal: tuple[bool, ...] = (False, True)  # mask kinds of the speed section
    float64_lengths: tuple[int, ...] = (1024,)  # L of the float64 section (no target)
    rounds: int = 5  # interleaved timing rounds per shape
    min_time: float = 0.02  # shortest batch of calls (s): short calls are batched
    threads: int | None = None  # Numba, torch and BLAS threads; None: Numba's default
    memory_length: int = 16384  # L of the memory section
    tiny_length: int = 64  # L of the tiny-call section (H = 1)
    padding_length: int = 4096  # L of the padding section
    parallel_length: int = 4096  # L of the parallel-efficiency section
    startup_runs: int = 3  # fresh processes timed (after one that warms the cache)
    error_rows: int = 256  # queries of head 0 compared with the oracle
    numpy_max_gb: float = 6.0  # skip the numpy peer when its L x L arrays need more
    peers: tuple[str, ...] = ("torch", "numpy")  # peers compared with numba
    quick: bool = False  # a quick run (smaller shapes): targets are not the issue's

    def speed_lengths(self) -> tuple[int, ...]:
        return tuple(sorted(set(self.lengths)))


#: ``--quick``: the same checks on shapes that take ~1 minute on 2 cores.
QUICK = BenchConfig(lengths=(256, 512, 1024), peak_min_length=1024, float64_lengths=(512,),
                    rounds=3, memory_length=2048, padding_length=1024, parallel_length=1024,
                    startup_runs=1, quick=True)


# --- timing ---------------------------------------------------------------------------------


#: Rounds are tripled for shapes whose batches all take less than this (s): bursts of
#: load from other processes last seconds, and more rounds keep them out of the median.
REMEASURE_SECONDS = 2.0  # further interleaved rounds while a median is noisy


def interleaved(calls: dict[str, Callable[[], object]], *, rounds: int, min_time: float,
                settle: float = SETTLE_SECONDS) -> dict[str, Timing]:
    """Time every call in interleaved rounds: :func:`attnbench.measure.timing.interleaved`.

    ``rounds`` rounds (after one warm-up call and the calibration of each call's batch to
    ``min_time``), a pause of ``settle`` seconds after each batch, the process probe read
    every round, then more rounds within :data:`REMEASURE_SECONDS` while a median's
    interval is wide or the probe saw interference.
    """
    return timing_interleaved(calls, rounds=rounds, min_time=min_time, settle=settle,
                              budget=REMEASURE_SECONDS, probe=default_probe())


def _timing_columns(timing: Timing) -> dict:
    return {"median_ms": timing.median * 1e3, "q25_ms": timing.q25 * 1e3,
            "q75_ms": timing.q75 * 1e3, "iqr_ms": timing.iqr * 1e3, "runs": timing.runs,
            "number": timing.number}


# --- inputs, calls and errors ----------------------------------------------------------------


def _inputs(B: int, H: int, L: int, D: int, dtype) -> tuple[np.ndarray, ...]:
    rng = np.random.default_rng([SEED, B, H, L, D])
    return tuple(rng.standard_normal((B, H, L, D), dtype=np.float32).astype(dtype, copy=False)
                 for _ in range(3))


def _numba_call(q, k, v, kwargs: dict) -> Callable[[], np.ndarray]:
    return functools.partial(kernels.attention, q, k, v, backend="numba", **kwargs)


def _numpy_bytes(B: int, H: int, L: int, dtype) -> float:
    """Bytes the numpy peer's L x L arrays take (scores, and the causal mask)."""
    return B * H * L * L * np.dtype(dtype).itemsize + L * L


def _peer_status(name: str, config: BenchConfig, B: int, H: int, L: int, dtype) -> str:
    """``"ok"``, or why the peer does not run here ("missing: ..." or "skipped: ...")."""
    usable, why = peers.peer_status(name)
    if not usable:
        return f"missing: {why}"
    if name == "numpy" and _numpy_bytes(B, H, L, dtype) > config.numpy_max_gb * 1e9:
        return (f"skipped: its L x L scores need {_numpy_bytes(B, H, L, dtype) / 1e9:.1f} GB "
                f"(> --numpy-max-gb {config.numpy_max_gb:g})")
    return "ok"


def _error_problem(q, k, v, kwargs: dict, rows: int):
    """The last ``rows`` queries of head 0 as a problem of their own (rows are independent)."""
    L = q.shape[2]
    rows = min(rows, L)
    sub_kwargs = dict(kwargs)
    if kwargs.get("causal"):
        sub_kwargs["causal"] = "bottom-right"  # keeps query i seeing keys <= i
    problem = kernels.prepare(q[:, :1, L - rows:], k[:, :1], v[:, :1], **sub_kwargs)
    return problem, slice(L - rows, L)


def _errors(outputs: dict[str, np.ndarray], q, k, v, kwargs: dict, rows: int) -> dict:
    """``{impl: (max_abs_err, tolerance)}`` on the oracle's rows, the BLAS on one thread."""
    from threadpoolctl import threadpool_limits

    problem, row_slice = _error_problem(q, k, v, kwargs, rows)
    with threadpool_limits(limits=1):  # no BLAS workers left spinning for the next timing
        exact, plain = oracle(problem)
    tol = tolerance(exact, plain, problem.dtype)
    return {name: (max_abs_error(np.asarray(out)[:, :1, row_slice], exact), tol)
            for name, out in outputs.items()}


def _load_average() -> float:
    """The 1-minute load average when a row is made: other processes skew the timings."""
    return os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")


def _row(section: str, impl: str, *, B, H, L, D, causal, dtype, threads, status="ok",
         variant="", **values) -> dict:
    row = dict.fromkeys(COLUMNS, np.nan)
    row.update(section=section, impl=impl, variant=variant, B=B, H=H, L=L, D=D,
               causal=bool(causal), dtype=np.dtype(dtype).name, threads=threads,
               status=status, load_1m=_load_average())
    row.update(values)
    return row


# --- sections ---------------------------------------------------------------------------------


def _compare(section: str, config: BenchConfig, *, B: int, H: int, L: int, D: int,
             causal: bool, dtype, threads: int, peaks: dict, impls=IMPLS) -> list[dict]:
    """Time numba and its peers on one shape, interleaved; rows with ratios and errors."""
    q, k, v = _inputs(B, H, L, D, dtype)
    kwargs = {"causal": causal} if causal else {}
    shape = dict(B=B, H=H, L=L, D=D, causal=causal, dtype=dtype, threads=threads)
    calls, rows = {}, {}
    for name in impls:
        status = "ok" if name == "numba" else _peer_status(name, config, B, H, L, dtype)
        if name != "numba" and name not in config.peers:
            continue
        if status != "ok":
            rows[name] = _row(section, name, status=status, **shape)
            continue
        calls[name] = (_numba_call(q, k, v, kwargs) if name == "numba"
                       else peers.make_call(name, q, k, v, kwargs))
    outputs = {name: call() for name, call in calls.items()}
    errors = _errors(outputs, q, k, v, kwargs, config.error_rows)
    del outputs
    if "numba" in calls and not causal and floor_measurable(q, k, v):
        calls[FLOOR] = tile_gemms_call(q, k, v)  # no attention output: no error
    timings = interleaved(calls, rounds=config.rounds, min_time=config.min_time)
    flops = attention_flops(B, H, L, L, D, causal=causal)
    peak = peaks[np.dtype(dtype).name]
    for name, timing in timings.items():
        rate = gflops(flops, timing.median)
        err, tol = errors.get(name, (np.nan, np.nan))
        rows[name] = _row(section, name, **shape, **_timing_columns(timing), gflops=rate,
                          pct_of_gemm_peak=100 * rate / peak, max_abs_err=err, tolerance=tol,
                          within_tolerance=bool(err <= tol) if name in errors else np.nan)
    for name in ("numba", FLOOR):
        for peer in ("torch", "numpy"):
            if name in timings and peer in timings:
                rows[name]["vs_" + peer] = timings[name].median / timings[peer].median
    if FLOOR in rows:
        rows[FLOOR]["variant"] = "numba's tile GEMMs alone"
    return [rows[name] for name in (*impls, FLOOR) if name in rows]


def _memory(config: BenchConfig, threads: int) -> list[dict]:
    """Peak extra memory of one call at ``memory_length`` (numba; torch by RSS only)."""
    B, H, L, D = config.batch, config.heads, config.memory_length, config.head_size
    q, k, v = _inputs(B, H, L, D, np.float32)
    out_mib = B * H * L * D * 4 / 2**20  # the result, which both methods count while alive
    shape = dict(B=B, H=H, L=L, D=D, causal=False, dtype=np.float32, threads=threads)
    call = _numba_call(q, k, v, {})
    traced = peak_extra_memory(call, method="tracemalloc", warmup=1)
    started = time.perf_counter()
    rss = peak_extra_memory(call, method="rss", warmup=0)
    seconds = time.perf_counter() - started
    rows = [_row("memory", "numba", **shape, extra_mib=traced / 2**20 - out_mib,
                 rss_extra_mib=rss / 2**20, median_ms=seconds * 1e3, runs=1, number=1,
                 variant=f"beyond inputs and output ({out_mib:.0f} MiB)")]
    if "torch" in config.peers and not config.quick:
        status = _peer_status("torch", config, B, H, L, np.float32)
        if status == "ok":
            torch_call = peers.make_call("torch", q, k, v, {})
            rss = peak_extra_memory(torch_call, method="rss", warmup=1)
            rows.append(_row("memory", "torch", **shape, rss_extra_mib=rss / 2**20,
                             variant="RSS rise only: torch's allocator is not traced"))
        else:
            rows.append(_row("memory", "torch", status=status, **shape))
    return rows


def _tiny(config: BenchConfig, threads: int) -> list[dict]:
    """Latency of a tiny call (H=1): numba through kernels.attention against torch."""
    B, H, L, D = config.batch, 1, config.tiny_length, config.head_size
    q, k, v = _inputs(B, H, L, D, np.float32)
    shape = dict(B=B, H=H, L=L, D=D, causal=False, dtype=np.float32, threads=threads)
    calls = {"numba": _numba_call(q, k, v, {})}
    rows = {}
    if "torch" in config.peers:
        status = _peer_status("torch", config, B, H, L, np.float32)
        if status == "ok":
            calls["torch"] = peers.make_call("torch", q, k, v, {})
        else:
            rows["torch"] = _row("tiny", "torch", status=status, **shape)
    timings = interleaved(calls, rounds=max(config.rounds, 7), min_time=config.min_time)
    for name, timing in timings.items():
        rows[name] = _row("tiny", name, **shape, **_timing_columns(timing))
    if "torch" in timings:
        rows["numba"]["vs_torch"] = timings["numba"].median / timings["torch"].median
    return [rows[name] for name in ("numba", "torch") if name in rows]


def _padding(config: BenchConfig, threads: int, peaks: dict) -> list[dict]:
    """numba with half the keys padded (key_lengths = L / 2) against no padding."""
    B, H, L, D = config.batch, config.heads, config.padding_length, config.head_size
    q, k, v = _inputs(B, H, L, D, np.float32)
    lengths = np.full(B, L // 2)
    calls = {"no padding": _numba_call(q, k, v, {}),
             "key_lengths=L/2": _numba_call(q, k, v, {"key_lengths": lengths})}
    timings = interleaved(calls, rounds=config.rounds, min_time=config.min_time)
    shape = dict(B=B, H=H, L=L, D=D, causal=False, dtype=np.float32, threads=threads)
    rows = []
    for variant, timing in timings.items():
        key_lengths = lengths if variant != "no padding" else None
        rate = gflops(attention_flops(B, H, L, L, D, key_lengths=key_lengths), timing.median)
        rows.append(_row("padding", "numba", variant=variant, **shape, **_timing_columns(timing),
                         gflops=rate, pct_of_gemm_peak=100 * rate / peaks["float32"]))
    return rows


def _causal(config: BenchConfig, threads: int, peaks: dict) -> list[dict]:
    """numba causal against non-causal at each L >= ``peak_min_length``, interleaved.

    The speed section times the two in separate groups, minutes apart; the speed-up
    target is a ratio of numba to itself, so it gets rounds of its own, as padding does.
    """
    B, H, D = config.batch, config.heads, config.head_size
    rows = []
    for L in config.speed_lengths():
        if L < config.peak_min_length:
            continue
        q, k, v = _inputs(B, H, L, D, np.float32)
        calls = {False: _numba_call(q, k, v, {}), True: _numba_call(q, k, v, {"causal": True})}
        timings = interleaved(calls, rounds=config.rounds, min_time=config.min_time)
        for causal, timing in timings.items():
            rate = gflops(attention_flops(B, H, L, L, D, causal=causal), timing.median)
            rows.append(_row("causal", "numba", B=B, H=H, L=L, D=D, causal=causal,
                             dtype=np.float32, threads=threads, **_timing_columns(timing),
                             gflops=rate, pct_of_gemm_peak=100 * rate / peaks["float32"]))
    return rows


def _parallel(config: BenchConfig, threads: int, peaks: dict) -> list[dict]:
    """numba on 1 thread against ``threads`` threads (numba.set_num_threads), interleaved."""
    import numba

    B, H, L, D = config.batch, config.heads, config.parallel_length, config.head_size
    shape = dict(B=B, H=H, L=L, D=D, causal=False, dtype=np.float32)
    if threads < 2:
        return [_row("parallel", "numba", status="skipped: only 1 thread", threads=threads,
                     **shape)]
    q, k, v = _inputs(B, H, L, D, np.float32)

    def on(n):
        def call():
            numba.set_num_threads(n)
            try:
                return kernels.attention(q, k, v, backend="numba")
            finally:
                numba.set_num_threads(threads)
        return call

    timings = interleaved({1: on(1), threads: on(threads)}, rounds=config.rounds,
                          min_time=config.min_time)
    flops = attention_flops(B, H, L, L, D)
    rows = []
    for n, timing in timings.items():
        rate = gflops(flops, timing.median)
        rows.append(_row("parallel", "numba", variant=f"{n} thread{'s' * (n > 1)}", threads=n,
                         **shape, **_timing_columns(timing), gflops=rate,
                         pct_of_gemm_peak=100 * rate / peaks["float32"]))
    return rows


#: The start-up probe: import, then the first call of the parallel kernel (L=512, H=4).
_STARTUP_SCRIPT = """
import json, time
start = time.perf_counter()
import numpy as np
import kernels
imported = time.perf_counter()
q = np.random.default_rng(0).standard_normal((1, 4, 512, 64)).astype(np.float32)
kernels.attention(q, q, q, backend="numba")
done = time.perf_counter()
print(json.dumps({"import_s": imported - start, "first_call_s": done - imported,
                  "startup_s": done - start}))
"""


def _startup(config: BenchConfig, threads: int) -> list[dict]:
    """Start-up of a new process with Numba's cache warm: import kernels + the first call."""
    repo = Path(__file__).resolve().parents[1]
    env = dict(os.environ, NUMBA_NUM_THREADS=str(threads))
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(repo), env.get("PYTHONPATH")]))
    shape = dict(B=1, H=4, L=512, D=64, causal=False, dtype=np.float32, threads=threads)
    if config.startup_runs < 1:
        return [_row("startup", "numba", status="skipped: --startup-runs 0", **shape)]
    results, walls = [], []
    for run in range(config.startup_runs + 1):  # the first run warms the cache
        started = time.perf_counter()
        done = subprocess.run([sys.executable, "-c", _STARTUP_SCRIPT], env=env, cwd=repo,
                              capture_output=True, text=True, timeout=600)
        wall = time.perf_counter() - started
        if done.returncode != 0:
            return [_row("startup", "numba", status=f"error: {done.stderr.strip()[-300:]}",
                         **shape)]
        if run:
            results.append(json.loads(done.stdout.strip().splitlines()[-1]))
            walls.append(wall)
    startup = [r["startup_s"] for r in results]
    return [_row("startup", "numba", variant="import + first call (in the process)", **shape,
                 median_ms=float(np.median(startup)) * 1e3, q25_ms=min(startup) * 1e3,
                 q75_ms=max(startup) * 1e3, runs=len(startup), number=1),
            _row("startup", "numba", variant="whole process (interpreter included)", **shape,
                 median_ms=float(np.median(walls)) * 1e3, q25_ms=min(walls) * 1e3,
                 q75_ms=max(walls) * 1e3, runs=len(walls), number=1)]


# --- the run ----------------------------------------------------------------------------------


def _gemm_peaks() -> dict[str, float]:
    return {np.dtype(t).name: gemm_peak_gflops(t) for t in (np.float32, np.float64)}


def run_bench(config: BenchConfig = BenchConfig(), *, progress: Callable[[str], None] = print
              ) -> tuple[pd.DataFrame, dict]:
    """Run every section of the bench; returns ``(table, meta)``.

    Parameters
    ----------
    config : BenchConfig
    progress : callable
        Called with a line of text as each part starts (``print`` by default).

    Returns
    -------
    table : DataFrame
        One row per (section, implementation, shape, variant): :data:`COLUMNS`, then the
        machine columns (:func:`attnbench.measure.machine.machine_columns`) and the GEMM peaks.
    meta : dict
        ``config``, ``gemm_peak_gflops`` (before and after the timings, and the one used),
        ``machine`` (:func:`attnbench.measure.machine.machine_record`), ``seconds``,
        ``load_average``.
    """
    import numba

    from attnbench.sweep.runner import limit_threads  # Numba, torch, every BLAS and OpenMP pool

    if "torch" in config.peers:
        peers.peer_status("torch")  # import torch before Numba's threads start: see below
    threads = config.threads or numba.get_num_threads()
    started = time.perf_counter()
    load_before = _load_average()
    rows: list[dict] = []
    with limit_threads(threads, torch="torch" in config.peers):
        progress(f"GEMM peak (numpy matmul, {threads} threads) ...")
        before = _gemm_peaks()
        peaks = dict(before)
        D, B, H = config.head_size, config.batch, config.heads
        for L in config.speed_lengths():
            for causal in config.causal:
                progress(f"speed   L={L} D={D} {'causal' if causal else 'non-causal'}")
                rows += _compare("speed", config, B=B, H=H, L=L, D=D, causal=causal,
                                 dtype=np.float32, threads=threads, peaks=peaks)
        for D_peak in config.peak_head_sizes:
            if D_peak == config.head_size and False in config.causal:
                continue  # measured by the speed section
            for L in config.speed_lengths():
                if L >= config.peak_min_length:
                    progress(f"peak    L={L} D={D_peak} non-causal")
                    rows += _compare("peak", config, B=B, H=H, L=L, D=D_peak, causal=False,
                                     dtype=np.float32, threads=threads, peaks=peaks,
                                     impls=("numba", "torch"))
        for L in config.float64_lengths:
            for causal in config.causal:
                progress(f"float64 L={L} {'causal' if causal else 'non-causal'}")
                rows += _compare("float64", config, B=B, H=H, L=L, D=D, causal=causal,
                                 dtype=np.float64, threads=threads, peaks=peaks)
        progress(f"memory  L={config.memory_length}")
        rows += _memory(config, threads)
        progress(f"tiny    L={config.tiny_length} H=1")
        rows += _tiny(config, threads)
        if True in config.causal and False in config.causal:
            progress(f"causal  numba causal vs non-causal, L >= {config.peak_min_length}")
            rows += _causal(config, threads, peaks)
        progress(f"padding L={config.padding_length}")
        rows += _padding(config, threads, peaks)
        progress(f"parallel L={config.parallel_length}: 1 vs {threads} threads")
        rows += _parallel(config, threads, peaks)
        after = _gemm_peaks()
    progress("startup (fresh processes) ...")
    rows += _startup(config, threads)

    used = {name: max(before[name], after[name]) for name in before}
    table = pd.DataFrame(rows, columns=list(COLUMNS))
    for name, peak in used.items():  # % of the peak against the larger measurement
        dtype_rows = table["dtype"] == name
        table.loc[dtype_rows, "pct_of_gemm_peak"] = 100 * table.loc[dtype_rows, "gflops"] / peak
    impossible = table["pct_of_gemm_peak"] > 100  # never a result: a measurement fault
    table["fault"] = [fault(pct, 100, "% of the GEMM peak") if bad else ""
                      for pct, bad in zip(table["pct_of_gemm_peak"], impossible, strict=True)]
    table.loc[impossible, "pct_of_gemm_peak"] = np.nan
    record = machine_record()
    record["numba_threads"] = threads
    for column, value in machine_columns(record).items():
        table[column] = value
    table["gemm_peak_gflops"] = table["dtype"].map(used)
    meta = {"config": asdict(config), "threads": threads,
            "gemm_peak_gflops": {"before": before, "after": after, "used": used},
            "machine": record, "seconds": time.perf_counter() - started,
            "load_average": [load_before, _load_average()]}
    return table, meta


# --- the targets ------------------------------------------------------------------------------


def _fmt_ratio(values: pd.Series) -> str:
    return ", ".join(f"L={int(L)}: {ratio:.2f}" for L, ratio in values.items())


def targets_table(table: pd.DataFrame, config: BenchConfig) -> pd.DataFrame:
    """One row per target of issue 4: what was measured, the goal and whether it is met.

    A target whose rows are missing (a peer not installed, a section skipped) has
    ``met = None`` and says why in ``note``.
    """
    ok = table["status"] == "ok"
    speed = table[(table["section"] == "speed") & ok]
    numba_speed = speed[speed["impl"] == "numba"]
    quick = " (quick run: not the issue's shapes)" if config.quick else ""
    targets = []

    def add(target, shape, values, goal, met, note=""):
        targets.append({"target": target, "shape": shape, "measured": values, "goal": goal,
                        "met": met, "note": note + quick})

    floor = speed[speed["impl"] == FLOOR].set_index("L")

    def floor_note(peer, lengths):
        """The floor's ratio to ``peer``: the lowest ratio a kernel on these GEMMs can reach."""
        ratios = floor["vs_" + peer].dropna() if len(floor) else pd.Series(dtype=float)
        ratios = ratios[ratios.index.isin(lengths)]
        if not len(ratios):
            return ""
        return (f"numba's tile GEMMs alone (softmax left out) / {peer}, non-causal: "
                f"{_fmt_ratio(ratios)}")

    long = numba_speed[numba_speed["L"] >= 1024]
    for causal in config.causal:
        rows = long[long["causal"] == causal].set_index("L")["vs_torch"].dropna()
        kind = "causal" if causal else "non-causal"
        note = ("no torch rows (torch missing, or no L >= 1024)" if not len(rows)
                else "" if causal else floor_note("torch", rows.index))
        add(f"numba / torch, {kind}", "B=1 H=12 D=64, every L >= 1024", _fmt_ratio(rows),
            "<= 0.8", bool((rows <= 0.8).all()) if len(rows) else None, note)
    rows = numba_speed.set_index(["L", "causal"])["vs_numpy"].dropna()
    add("numba / numpy", "B=1 H=12 D=64, every L, causal and not",
        ", ".join(f"L={L}{' causal' if c else ''}: {r:.2f}" for (L, c), r in rows.items()),
        "<= 0.33", bool((rows <= 0.33).all()) if len(rows) else None,
        floor_note("numpy", numba_speed["L"]))
    peak_rows = table[table["section"].isin(["speed", "peak"]) & ok
                      & (table["impl"] == "numba") & ~table["causal"].astype(bool)
                      & (table["L"] >= config.peak_min_length)
                      & table["D"].isin(config.peak_head_sizes)]
    pct = peak_rows.set_index(["D", "L"])["pct_of_gemm_peak"]
    add("fraction of the float32 GEMM peak",
        f"non-causal, L >= {config.peak_min_length}, D in {list(config.peak_head_sizes)}",
        ", ".join(f"D={D} L={L}: {p:.0f}%" if p <= 100 else f"D={D} L={L}: fault (> 100%)"
                  for (D, L), p in pct.fillna(np.inf).items()), ">= 50%",
        bool((pct >= 50).all()) if len(pct) and pct.notna().all() else None)
    if True in config.causal and False in config.causal:
        causal_rows = table[(table["section"] == "causal") & ok]
        timed = causal_rows.pivot_table(index="L", columns="causal", values="median_ms")
        speedup = ((timed[False] / timed[True]).dropna() if True in timed and False in timed
                   else pd.Series(dtype=float))
        add("causal speed-up over non-causal", f"numba, L >= {config.peak_min_length}, "
            "timed in rounds of their own", _fmt_ratio(speedup), ">= 1.8",
            bool((speedup >= 1.8).all()) if len(speedup) else None,
            "" if len(speedup) else f"no causal rows (no L >= {config.peak_min_length})")
    memory = table[(table["section"] == "memory") & (table["impl"] == "numba") & ok]
    if len(memory):
        row = memory.iloc[0]
        add("extra memory of one call", f"B=1 H=12 D=64 L={int(row['L'])}",
            f"{row['extra_mib']:.1f} MiB (tracemalloc, output excluded); RSS rose "
            f"{row['rss_extra_mib']:.1f} MiB", "<= 64 MiB", bool(row["extra_mib"] <= 64))
    tiny = table[(table["section"] == "tiny") & (table["impl"] == "numba") & ok]
    if len(tiny):
        ratio = tiny.iloc[0]["vs_torch"]
        add("tiny-call latency, numba / torch", f"L={int(tiny.iloc[0]['L'])} H=1 D=64",
            f"{ratio:.2f} ({tiny.iloc[0]['median_ms'] * 1e3:.0f} us)", "<= 2",
            bool(ratio <= 2) if ratio == ratio else None)
    padding = table[(table["section"] == "padding") & ok].set_index("variant")["median_ms"]
    if len(padding) == 2:
        speedup = padding["no padding"] / padding["key_lengths=L/2"]
        add("key_lengths, half the keys padded", f"L={config.padding_length}",
            f"{speedup:.2f}x faster", ">= 1.7x", bool(speedup >= 1.7))
    parallel = table[(table["section"] == "parallel") & ok]
    if len(parallel) == 2:
        times = parallel.set_index("threads")["median_ms"]
        speedup = times[1] / times[times.index.max()]
        impossible = fault(speedup, times.index.max(), "speed-up over 1 thread")
        add(f"parallel efficiency, {int(times.index.max())} threads vs 1",
            f"L={config.parallel_length}", impossible or f"{speedup:.2f}x", ">= 1.8x",
            None if impossible else bool(speedup >= 1.8))
    startup = table[(table["section"] == "startup") & ok
                    & table["variant"].str.startswith("import")]
    if len(startup):
        seconds = startup.iloc[0]["median_ms"] / 1e3
        add("start-up (warm cache): import + first call", "new process",
            f"{seconds:.2f} s", "<= 1.5 s", bool(seconds <= 1.5))
    numba_rows = table[(table["impl"] == "numba") & ok & table["within_tolerance"].notna()]
    bad = numba_rows[~numba_rows["within_tolerance"].astype(bool)]
    add("numba's error within the tolerance", "every timed shape",
        f"{len(numba_rows) - len(bad)}/{len(numba_rows)} within; worst err/tol "
        f"{(numba_rows['max_abs_err'] / numba_rows['tolerance']).max():.2f}",
        "all", bool(bad.empty) if len(numba_rows) else None)
    return pd.DataFrame(targets, columns=list(TARGET_COLUMNS))


# --- output -----------------------------------------------------------------------------------

#: Columns printed for the timing sections, with their headers.
_SHOWN = {"section": "section", "impl": "impl", "variant": "variant", "L": "L", "D": "D",
          "causal": "causal", "dtype": "dtype", "status": "status", "median_ms": "median ms",
          "iqr_ms": "IQR ms", "gflops": "GFLOP/s", "pct_of_gemm_peak": "% peak",
          "vs_torch": "/torch", "vs_numpy": "/numpy", "max_abs_err": "max|err|",
          "tolerance": "tol", "extra_mib": "extra MiB", "rss_extra_mib": "RSS MiB",
          "load_1m": "load"}


def format_table(table: pd.DataFrame) -> str:
    """The bench table as fixed-width text (statuses other than ok shortened)."""
    shown = table[list(_SHOWN)].copy()
    shown["causal"] = shown["causal"].map({True: "yes", False: ""})
    shown["status"] = shown["status"].str.slice(0, 40)
    formats = {"median_ms": "{:.3f}", "iqr_ms": "{:.3f}", "gflops": "{:.1f}",
               "pct_of_gemm_peak": "{:.0f}", "vs_torch": "{:.2f}", "vs_numpy": "{:.3f}",
               "max_abs_err": "{:.1e}", "tolerance": "{:.1e}", "extra_mib": "{:.1f}",
               "rss_extra_mib": "{:.1f}", "load_1m": "{:.1f}"}
    for column, fmt in formats.items():
        shown[column] = shown[column].map(lambda x, f=fmt: "" if x != x else f.format(x))
    return shown.rename(columns=_SHOWN).to_string(index=False)


def format_targets(targets: pd.DataFrame) -> str:
    shown = targets.copy()
    shown["met"] = shown["met"].map({True: "met", False: "MISSED", None: "n/a"})
    return shown.to_string(index=False)


def _markdown(frame: pd.DataFrame) -> str:
    """A DataFrame as a GitHub-flavoured Markdown table (cells as they are)."""
    lines = ["| " + " | ".join(map(str, frame.columns)) + " |",
             "|" + "---|" * len(frame.columns)]
    lines += ["| " + " | ".join(map(str, row)) + " |" for row in frame.itertuples(index=False)]
    return "\n".join(lines)


def format_markdown(table: pd.DataFrame, targets: pd.DataFrame, meta: dict,
                    command_line: str = "") -> str:
    """The speed section and the targets as Markdown, with the machine and the command.

    This is what the README's performance section shows (pasted from ``bench.md``).
    """
    speed = table[(table["section"] == "speed") & (table["status"] == "ok")]
    by_impl = speed.set_index(["L", "causal", "impl"])
    numba = speed[speed["impl"] == "numba"].set_index(["L", "causal"])
    rows = []
    for (L, causal), ratio in numba.iterrows():
        def ms(impl, L=L, causal=causal):
            if (L, causal, impl) not in by_impl.index:
                return ""
            row = by_impl.loc[(L, causal, impl)]
            return f"{row['median_ms']:.1f} ({row['iqr_ms']:.1f})"
        rows.append({"L": int(L), "causal": "yes" if causal else "",
                     "numba ms (IQR)": ms("numba"), "torch ms (IQR)": ms("torch"),
                     "numpy ms (IQR)": ms("numpy"), "GEMMs alone ms (IQR)": ms(FLOOR),
                     "numba / torch": "" if ratio["vs_torch"] != ratio["vs_torch"]
                     else f"{ratio['vs_torch']:.2f}",
                     "numba / numpy": "" if ratio["vs_numpy"] != ratio["vs_numpy"]
                     else f"{ratio['vs_numpy']:.2f}",
                     "numba % of GEMM peak": f"{ratio['pct_of_gemm_peak']:.0f}"})
    machine, config = meta["machine"], meta["config"]
    peaks = meta["gemm_peak_gflops"]["used"]
    blas = machine_columns(machine)["blas"]
    seconds = meta["seconds"]
    took = f"{seconds / 60:.0f} min" if seconds >= 90 else f"{seconds:.0f} s"
    torch = f"torch {machine['torch']}" if machine.get("torch") else "torch not installed"
    header = (
        f"`{command_line or 'attnbench bench'}` ({took}), on {machine['cpu_model']} "
        f"({machine['usable_cores']} cores), {meta['threads']} threads for numba and each "
        f"peer; Numba {machine['numba']} ({machine['numba_threading_layer']} layer), "
        f"{torch}, NumPy {machine['numpy']}; BLAS {blas}. Float32 GEMM peak measured in the "
        f"run: {peaks['float32']:.0f} GFLOP/s. Load average {meta['load_average'][0]:.2f} "
        f"before, {meta['load_average'][1]:.2f} after. B={config['batch']}, "
        f"H={config['heads']}, D={config['head_size']}, float32; medians of interleaved "
        f"rounds (interquartile range in brackets); \"GEMMs alone\" is numba's two tile "
        f"GEMMs without the softmax (the floor under its time).")
    shown_targets = targets.assign(met=targets["met"].map({True: "met", False: "**missed**",
                                                           None: "n/a"}))
    shown_targets = shown_targets.fillna("")
    return "\n\n".join([header, _markdown(pd.DataFrame(rows)),
                         _markdown(shown_targets[["target", "measured", "goal", "met", "note"]])]
                        ) + "\n"


def plot(table: pd.DataFrame):
    """Time against L per implementation (causal dashed), and numba's ratios to the peers."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.figure import Figure

    speed = table[(table["section"] == "speed") & (table["status"] == "ok")]
    figure = Figure(figsize=(11, 4.2), layout="constrained")
    left, right = figure.subplots(1, 2)
    colors = {"numba": "tab:blue", "torch": "tab:orange", "numpy": "tab:green",
              FLOOR: "tab:grey"}
    for (impl, causal), rows in speed.groupby(["impl", "causal"]):
        rows = rows.sort_values("L")
        left.errorbar(rows["L"], rows["median_ms"],
                      yerr=[rows["median_ms"] - rows["q25_ms"], rows["q75_ms"] - rows["median_ms"]],
                      color=colors.get(impl), linestyle="--" if causal else "-", marker="o",
                      label=f"{impl}{' (numba tile GEMMs alone)' if impl == FLOOR else ''}"
                            f"{' causal' if causal else ''}")
    left.set(xscale="log", yscale="log", xlabel="L", ylabel="median time (ms)",
             title="B=1 H=12 D=64 float32")
    left.legend(fontsize=8)
    numba_rows = speed[speed["impl"] == "numba"]
    for peer, goal in (("torch", 0.8), ("numpy", 0.33)):
        for causal, rows in numba_rows.groupby("causal"):
            rows = rows.sort_values("L").dropna(subset=["vs_" + peer])
            if len(rows):
                right.plot(rows["L"], rows["vs_" + peer], color=colors[peer], marker="o",
                           linestyle="--" if causal else "-",
                           label=f"numba / {peer}{' causal' if causal else ''}")
        right.axhline(goal, color=colors[peer], linewidth=0.8, linestyle=":")
    right.axhline(1, color="grey", linewidth=0.8)
    right.set(xscale="log", yscale="log", xlabel="L", ylabel="time ratio (< 1: numba faster)",
              title="numba against its peers (dotted: targets)")
    right.legend(fontsize=8)
    lengths = sorted(speed["L"].unique())
    for ax in (left, right):  # ticks at the measured lengths, plainly labelled
        ax.set_xticks(lengths, [str(L) for L in lengths])
        ax.minorticks_off()
    return figure


def write_results(table: pd.DataFrame, targets: pd.DataFrame, meta: dict, out_dir,
                  *, command_line: str = "") -> list[Path]:
    """Write bench.csv, targets.csv, machine.json, bench.png, bench.html and bench.md."""
    from attnbench.report.html import write_html
    from attnbench.report.sections import Section

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = [out_dir / name for name in ("bench.csv", "targets.csv", "machine.json",
                                         "bench.png", "bench.html", "bench.md")]
    table.to_csv(paths[0], index=False)
    targets.to_csv(paths[1], index=False)
    paths[2].write_text(json.dumps({**meta, "command": command_line}, indent=2, default=str)
                        + "\n")
    figure = plot(table)
    figure.savefig(paths[3], dpi=100)
    machine = "\n".join(summary_lines(meta["machine"]))
    peaks = meta["gemm_peak_gflops"]
    text = (f"Command: {command_line or 'attnbench bench'}\n\n{machine}\n\n"
            f"GEMM peak (numpy matmul n=1024, {meta['threads']} threads): float32 "
            f"{peaks['used']['float32']:.1f} GFLOP/s (before {peaks['before']['float32']:.1f}, "
            f"after {peaks['after']['float32']:.1f}); float64 {peaks['used']['float64']:.1f}. "
            f"Run took {meta['seconds']:.0f} s; load average {meta['load_average'][0]:.2f} "
            f"before, {meta['load_average'][1]:.2f} after.")
    shown = table[list(COLUMNS)]
    sections = [
        Section("Targets", text, tables=[("One verdict per target of issue 4", targets)]),
        Section("Measurements", "Medians of interleaved rounds; ratios are numba's time "
                "over the peer's on the same inputs in the same round sequence.",
                tables=[("Every row", shown)], figures=[("Time and ratios against L", figure)]),
    ]
    write_html(paths[4], sections, title="attnbench bench",
               subtitle=f"{meta['machine']['cpu_model']}, {meta['threads']} threads.")
    paths[5].write_text(format_markdown(table, targets, meta, command_line))
    return paths


def config_from_args(args) -> BenchConfig:
    """The :class:`BenchConfig` of ``attnbench bench``'s arguments."""
    config = QUICK if args.quick else BenchConfig()
    changes = {}
    if args.L:
        changes["lengths"] = tuple(args.L)
    if args.D:
        changes["head_size"] = args.D[0]
        changes["peak_head_sizes"] = tuple(dict.fromkeys(args.D))
    if args.causal != "both":
        changes["causal"] = (args.causal == "yes",)
    for name in ("rounds", "threads", "memory_length", "padding_length", "parallel_length",
                 "tiny_length", "startup_runs", "peak_min_length", "numpy_max_gb"):
        value = getattr(args, name, None)
        if value is not None:
            changes[name] = value
    if args.float64_L is not None:
        changes["float64_lengths"] = tuple(args.float64_L)
    if args.peers is not None:
        changes["peers"] = tuple(args.peers)
    return replace(config, **changes)


def command_line(config: BenchConfig) -> str:
    """The ``attnbench bench`` command that reruns ``config`` (every option spelled out)."""
    words = ["attnbench bench", "--L", *map(str, config.lengths),
             "--D", *map(str, dict.fromkeys((config.head_size, *config.peak_head_sizes))),
             "--causal", {(False, True): "both", (True,): "yes", (False,): "no"}.get(
                 tuple(config.causal), "both"),
             "--rounds", str(config.rounds), "--peak-min-L", str(config.peak_min_length),
             "--float64-L", *map(str, config.float64_lengths),
             "--memory-L", str(config.memory_length), "--tiny-L", str(config.tiny_length),
             "--padding-L", str(config.padding_length),
             "--parallel-L", str(config.parallel_length),
             "--startup-runs", str(config.startup_runs), "--peers", *config.peers]
    if config.threads:
        words += ["--threads", str(config.threads)]
    if config.quick:
        words.append("--quick")
    return " ".join(words)


def command(args) -> int:
    """``attnbench bench``: run, print the tables, write the files; the exit status.

    0 when every numba row ran and is within the tolerance (targets met or not: they are
    measurements, reported in the table), 1 otherwise.
    """
    config = config_from_args(args)
    if "torch" in config.peers:
        peers.peer_status("torch")  # before summary_lines starts Numba's threads
    print("\n".join(summary_lines()), flush=True)
    table, meta = run_bench(config, progress=lambda line: print(line, file=sys.stderr,
                                                                flush=True))
    targets = targets_table(table, config)
    peaks = meta["gemm_peak_gflops"]["used"]
    print(f"GEMM peak  float32 {peaks['float32']:.1f} GFLOP/s, float64 {peaks['float64']:.1f} "
          f"GFLOP/s (numpy matmul n=1024, {meta['threads']} threads, larger of before/after)")
    print(f"Load       {meta['load_average'][0]:.2f} before, {meta['load_average'][1]:.2f} after"
          f" (1-min average; {os.cpu_count()} logical cores)\n")
    print(format_table(table))
    print("\n" + format_targets(targets))
    paths = write_results(table, targets, meta, args.out, command_line=command_line(config))
    print(f"\nWrote {', '.join(str(path) for path in paths)} in {meta['seconds']:.0f} s.")
    numba_rows = table[table["impl"] == "numba"]
    failed = (~numba_rows["status"].isin(["ok"])
              & ~numba_rows["status"].str.startswith("skipped")).any()
    inaccurate = (numba_rows["within_tolerance"].dropna() == False).any()  # noqa: E712
    return 1 if failed or inaccurate else 0

