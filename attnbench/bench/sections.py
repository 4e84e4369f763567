"""``attnbench bench``'s sections: each times one question side by side (see
:mod:`attnbench.bench.run` for what each section measures)."""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numba
import numpy as np
from threadpoolctl import threadpool_limits

from attnbench import kernels
from attnbench.bench.config import (
    COLUMNS,
    FLOOR,
    IMPLS,
    BenchConfig,
)
from attnbench.bench.gemm_floor import measurable as floor_measurable
from attnbench.bench.gemm_floor import tile_gemms_call
from attnbench.measure import peers
from attnbench.measure.flops import attention_flops, gflops
from attnbench.measure.oracle import max_abs_error, oracle, tolerance
from attnbench.measure.problems import (
    SETTLE_SECONDS,
    ProblemSpec,
    load_average,
    make_inputs,
)
from attnbench.measure.timing import Timing, default_probe, peak_extra_memory
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


def interval_timings(calls: dict[str, Callable[[], object]], config) -> dict[str, Timing]:
    """:func:`interleaved` with enough rounds for the 95% interval a target is decided from
    (``config.interval_rounds`` at least)."""
    return interleaved(calls, rounds=max(config.rounds, config.interval_rounds),
                       min_time=config.min_time)


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


def compare_section(section: str, config: BenchConfig, *, B: int, H: int, L: int, D: int,
                    causal: bool, dtype, threads: int, peaks: dict, impls=None) -> list[dict]:
    """Time numba and its peers on one shape, interleaved; rows with ratios and errors.

    ``impls`` defaults to :data:`IMPLS` and the external peers of ``config.peers``
    (implementation specs, :func:`attnbench.measure.peers.is_external`).
    """
    if impls is None:
        impls = (*IMPLS, *(p for p in config.peers if p not in IMPLS))
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


def memory_section(config: BenchConfig, threads: int) -> list[dict]:
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


def tiny_section(config: BenchConfig, threads: int) -> list[dict]:
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


def padding_section(config: BenchConfig, threads: int, peaks: dict) -> list[dict]:
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


def causal_section(config: BenchConfig, threads: int, peaks: dict) -> list[dict]:
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


def parallel_section(config: BenchConfig, threads: int, peaks: dict) -> list[dict]:
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
from attnbench import kernels
imported = time.perf_counter()
q = np.random.default_rng(0).standard_normal((1, 4, 512, 64)).astype(np.float32)
kernels.attention(q, q, q, backend="numba")
done = time.perf_counter()
print(json.dumps({"import_s": imported - start, "first_call_s": done - imported,
                  "startup_s": done - start}))
"""


def startup_section(config: BenchConfig, threads: int) -> list[dict]:
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
