"""``attnbench bench``: the numba backend against its peers, side by side, in one process.

Every comparison is made on the same inputs, in the same
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

:func:`attnbench.bench.targets.targets_table` turns the rows into one verdict per target;
:mod:`attnbench.bench.output` prints and writes them; :mod:`attnbench.bench.config` holds
what is measured.
"""


from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path

import numba
import numpy as np
import pandas as pd
from threadpoolctl import threadpool_limits

import kernels
from attnbench.bench.config import (
    COLUMNS,
    FLOOR,
    IMPLS,
    BenchConfig,
    command_line,
    config_from_args,
)
from attnbench.bench.gemm_floor import measurable as floor_measurable
from attnbench.bench.gemm_floor import tile_gemms_call
from attnbench.bench.output import format_table, format_targets, write_results
from attnbench.bench.targets import targets_table
from attnbench.measure import peers
from attnbench.measure.flops import attention_flops, gflops
from attnbench.measure.machine import (
    gemm_peak_gflops,
    machine_columns,
    machine_record,
    summary_lines,
)
from attnbench.measure.oracle import max_abs_error, oracle, tolerance
from attnbench.measure.problems import (
    SETTLE_SECONDS,
    ProblemSpec,
    limit_threads,
    load_average,
    make_inputs,
)
from attnbench.measure.timing import Timing, default_probe, fault, peak_extra_memory
from attnbench.measure.timing import interleaved as timing_interleaved

# --- timing ---------------------------------------------------------------------------------


#: Further interleaved rounds (s) while a median is noisy.
REMEASURE_SECONDS = 2.0


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


# --- inputs, calls and errors ----------------------------------------------------------------


def _inputs(B: int, H: int, L: int, D: int, dtype) -> tuple[np.ndarray, ...]:
    """``q, k, v`` of shape (B, H, L, D), from the one input generator."""
    q, k, v, _ = make_inputs(ProblemSpec(B=B, H=H, Lq=L, D=D), dtype)
    return q, k, v


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
    problem, row_slice = _error_problem(q, k, v, kwargs, rows)
    with threadpool_limits(limits=1):  # no BLAS workers left spinning for the next timing
        exact, plain = oracle(problem)
    tol = tolerance(exact, plain, problem.dtype)
    return {name: (max_abs_error(np.asarray(out)[:, :1, row_slice], exact), tol)
            for name, out in outputs.items()}


def _row(section: str, impl: str, *, B, H, L, D, causal, dtype, threads, status="ok",
         variant="", **values) -> dict:
    row = dict.fromkeys(COLUMNS, np.nan)
    row.update(section=section, impl=impl, variant=variant, B=B, H=H, L=L, D=D,
               causal=bool(causal), dtype=np.dtype(dtype).name, threads=threads,
               status=status, load_1m=load_average())
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
        rows[name] = _row(section, name, **shape, **timing.ms_columns(), gflops=rate,
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
        rows[name] = _row("tiny", name, **shape, **timing.ms_columns())
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
        rows.append(_row("padding", "numba", variant=variant, **shape, **timing.ms_columns(),
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
                             dtype=np.float32, threads=threads, **timing.ms_columns(),
                             gflops=rate, pct_of_gemm_peak=100 * rate / peaks["float32"]))
    return rows


def _parallel(config: BenchConfig, threads: int, peaks: dict) -> list[dict]:
    """numba on 1 thread against ``threads`` threads (numba.set_num_threads), interleaved."""
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
                         **shape, **timing.ms_columns(), gflops=rate,
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


def run_bench(config: BenchConfig | None = None, *,
              progress: Callable[[str], None] = print) -> tuple[pd.DataFrame, dict]:
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
    config = BenchConfig() if config is None else config

    if "torch" in config.peers:
        peers.peer_status("torch")  # import torch before Numba's threads start: see below
    threads = config.threads or numba.get_num_threads()
    started = time.perf_counter()
    load_before = load_average()
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
            "load_average": [load_before, load_average()]}
    return table, meta



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
