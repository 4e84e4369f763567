"""One point of a sweep: its time, FLOP/s, peak memory and error, as a row.

:func:`attnbench.sweep.run.run_sweep` turns a list of :class:`attnbench.sweep.grid.Point`
into a pandas DataFrame with one row per point.  The work is split in two:

- :class:`PointRunner` (here) measures one point and returns its row (a dict).  It never
  raises for a point that fails: the row says ``status="failed"`` and why.  Points
  that cannot run here are ``status="skipped"`` with the reason: a backend that is
  not installed (torch) or has no GPU (cuda), a reference that would need more memory
  than the budget.
- An *executor* maps the runner over the points: a function
  ``executor(points, run_point) -> iterator of rows`` that may yield rows in any
  order.  :func:`attnbench.sweep.run.serial_executor` runs them in this process, in
  order; a parallel
  executor (e.g. Dask) only has to honour the same signature.

For each point the runner builds the inputs (seeded by the problem, so every backend,
direction and variant of a problem sees the same arrays), calls the backend once (this
compiles, and its output is the one checked), times it with
:func:`attnbench.measure.timing.measure`, measures the peak extra memory of one more call
(:func:`attnbench.measure.timing.peak_extra_memory`), and compares the checked output
with the oracle of :mod:`attnbench.measure.oracle`.  The oracle is computed once per
problem (cached) with the BLAS on one thread, so that no BLAS worker threads are left
spinning while the next point is timed; above ``oracle_limit`` score entries it is
skipped and the row says so.

A ``backward`` point times :func:`kernels.attention_backward` given ``out`` and ``lse``
from one forward call of the same backend made before timing (the forward is not timed;
torch's backward runs through autograd on a graph built once,
:func:`attnbench.measure.peers.make_backward_call`), counts
:func:`attnbench.measure.flops.backward_flops`, and checks the gradient of largest error
against its tolerance (:mod:`attnbench.measure.grad_oracle`).  A point with a ``variant``
adds its score or mask function or its sinks (:mod:`attnbench.sweep.variants`); its
FLOPs count only the pairs the mask function leaves visible.  Decode and varlen points
(``kind``) call their own entry points and oracles (:mod:`attnbench.sweep.kinds`); a
decode row also says the bytes of K and V its step read (``bytes_read``) and the rate
(``read_gbs``), which the sweep reads against its read-bandwidth probe.  What a backend
cannot express (the numpy peer's backward, softcap or sinks in a peer, a mask function in
a backward that takes none, a kind's unsupported masks) is ``skipped`` with the reason.

Rows carry the point's parameters, the FLOP count (:mod:`attnbench.measure.flops`, visible
pairs only), the timing (median, quartiles, IQR, min, runs and calls), GFLOP/s and the
percentage of the GEMM peak measured in the same run, the backend's threads and the
time of its smallest call (the overhead :mod:`attnbench.studies.scaling` needs), the peak
memory, the error and tolerance, status and reason, and the machine columns.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field

import numba
import numpy as np
import pandas as pd
from threadpoolctl import threadpool_limits

from attnbench import kernels
from attnbench.measure import gpu_device, gpu_timing, peers
from attnbench.measure.flops import gflops
from attnbench.measure.grad_oracle import gradient_errors, gradient_oracle
from attnbench.measure.implementations import names
from attnbench.measure.oracle import max_abs_error, oracle, oracle_dtype, tolerance
from attnbench.measure.problems import SETTLE_SECONDS, timing_threads
from attnbench.measure.timing import default_probe, fault, measure, peak_extra_memory
from attnbench.sweep import kinds
from attnbench.sweep.calls import make_call, make_dout, make_inputs
from attnbench.sweep.grid import Point
from attnbench.sweep.remeasure import read_against_bandwidth
from attnbench.sweep.variants import peer_kwargs, variant_kwargs

__all__ = ["COLUMNS", "ORACLE_LIMIT", "PointRunner", "make_dout", "make_inputs"]

#: Bytes the reference (and the oracle) needs per score entry B·H·Lq·Lk, in float64:
#: scores, the visibility mask, the masked scores, exp and the weights (measured with
#: tracemalloc: 34 B at L = 2048, 46 B at L = 128 where the linear terms still count).
REFERENCE_BYTES_PER_SCORE = 40
#: The reference backward holds about twice as many L x L arrays (P, dP, dS and their
#: float64 temporaries).
REFERENCE_BACKWARD_FACTOR = 2
#: The same for the plain NumPy peer, per byte of the dtype (scores, where, the bool mask).
NUMPY_BYTES_PER_SCORE_PER_ITEM = 3
#: Default largest problem (score entries B·H·Lq·Lk) whose oracle is computed.  float64
#: inputs get an oracle in np.longdouble, which NumPy computes without BLAS (~50x slower):
#: their limit is 4x smaller.
ORACLE_LIMIT = 2**22

Row = dict
#: Backends that run on a GPU: timed with CUDA events on device-resident inputs
#: (:mod:`attnbench.measure.gpu_timing`), host<->device copies timed apart.
GPU_BACKENDS = names(device="gpu")
#: Where the GEMM peak of CPU rows comes from (GPU rows say their own).
CPU_PEAK_SOURCE = "measured: numpy matmul n=1024 on this host"
#: Columns of a sweep table, in order (then the machine columns).
COLUMNS = (
    "backend", "L", "d_k", "heads", "kv_heads", "batch", "mask", "dtype", "direction",
    "variant", "kind", "status", "reason",
    "flops", "median_ms", "q25_ms", "q75_ms", "iqr_ms", "min_ms", "runs", "calls", "gflops",
    "gemm_peak_gflops", "pct_of_gemm_peak", "peak_source", "threads", "call_overhead_ms",
    "peak_mem_bytes", "base_mem_bytes", "memory_method", "max_abs_err", "tolerance",
    "within_tolerance", "oracle", "point_seconds", "device", "bytes_read", "read_gbs",
    "read_bandwidth_gbs", "pct_of_read_bandwidth",
)


def _size(n_bytes: float) -> str:
    """``"1.3 MB"``, ``"2.10 GB"``."""
    if n_bytes < 2**30:
        return f"{n_bytes / 2**20:.1f} MB"
    return f"{n_bytes / 2**30:.2f} GB"


def available_memory_bytes() -> int | None:
    """``MemAvailable`` from /proc/meminfo (Linux), else None."""
    try:
        with open("/proc/meminfo") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


@dataclass
class PointRunner:
    """Measures one point per call; holds the settings and the per-run caches.

    Parameters are the settings of :func:`run_sweep`.
    """

    max_time: float = 0.2  # timing budget per point, s (at least 3 timed batches)
    oracle_limit: int = ORACLE_LIMIT  # largest B·H·L² whose oracle is computed
    memory_budget: float | None = None  # bytes a point may need; None: half of MemAvailable
    gemm_peaks: dict = field(default_factory=dict)  # dtype name -> GFLOP/s
    settle: float = SETTLE_SECONDS
    allow_simulator: bool = False  # run cuda points in Numba's CUDA simulator (tiny grids only)
    # Points timed again at the end of the sweep (their series, interleaved): a
    # brief first timing (3 batches at least, no extra rounds) where this says so.
    retimed: Callable[[Point], bool] | None = None
    _oracles: OrderedDict = field(default_factory=OrderedDict, repr=False)
    _overheads: dict = field(default_factory=dict, repr=False)
    _last_backend: str | None = field(default=None, repr=False)
    _inputs: tuple | None = field(default=None, repr=False)  # (point, q, k, v, kwargs)

    def __post_init__(self):
        if self.memory_budget is None:
            available = available_memory_bytes()
            self.memory_budget = available / 2 if available else 8 * 2**30

    # --- what cannot run ------------------------------------------------------------------

    def skip_reason(self, point: Point) -> str:
        """Why ``point`` cannot run here, or ``""``."""
        if point.heads % point.kv_heads:
            return (f"skipped: heads={point.heads} is not a multiple of "
                    f"kv_heads={point.kv_heads}")
        kind = kinds.skip_reason(point)
        if kind:
            return kind
        if point.direction == "backward":
            if point.backend in GPU_BACKENDS:
                return "skipped: the sweep times backward passes on the CPU only"
        if point.backend in GPU_BACKENDS:
            usable, why = gpu_device.backend_status(point.backend,
                                                     allow_simulator=self.allow_simulator)
            if not usable:
                return f"skipped: {why}"
        if peers.is_peer(point.backend):
            usable, why = peers.peer_status(point.backend)
            if not usable:
                return f"skipped: {why}"
        need = self.estimated_bytes(point)
        if need > self.memory_budget:
            return (f"skipped: {point.backend} would need ~{_size(need)} "
                    f"(memory budget {_size(self.memory_budget)})")
        return ""

    @staticmethod
    def estimated_bytes(point: Point) -> float:
        """Memory a call needs beyond its inputs, for the backends that build L x L scores."""
        scores = kinds.score_entries(point)
        if point.backend == "reference":
            factor = REFERENCE_BACKWARD_FACTOR if point.direction == "backward" else 1
            return scores * REFERENCE_BYTES_PER_SCORE * factor
        if point.backend == "numpy":
            return scores * NUMPY_BYTES_PER_SCORE_PER_ITEM * np.dtype(point.dtype).itemsize
        return 0.0

    def oracle_skip_reason(self, point: Point) -> str:
        scores = kinds.score_entries(point)
        limit = self.oracle_limit if point.dtype == "float32" else self.oracle_limit // 4
        if scores > limit:
            return (f"oracle skipped: B·H·L² = {scores:,} score entries > limit {limit:,} "
                    f"for {point.dtype}")
        need = scores * REFERENCE_BYTES_PER_SCORE * (2 if point.dtype == "float64" else 1)
        if need > self.memory_budget:
            return f"oracle skipped: it would need ~{_size(need)}"
        return ""

    # --- measuring ------------------------------------------------------------------------

    def make_call(self, point: Point, q, k, v, kwargs):
        """The function the point times (:func:`attnbench.sweep.calls.make_call`)."""
        return make_call(point, q, k, v, kwargs)

    def threads(self, backend: str) -> int | None:
        if peers.is_peer(backend):
            return peers.peer_threads(backend)
        if backend == "numba":
            return numba.get_num_threads()
        if backend == "reference":  # one thread while timed (measure.problems.timing_threads)
            return peers.peer_threads("numpy")
        return None

    def smallest_call(self, point: Point) -> tuple[float, int]:
        """``(median seconds, peak extra bytes)`` of the backend's smallest call, cached.

        The smallest call (B = H = L = d_k = 1, no mask) costs only what does not grow with
        the problem: argument checks, dispatch, thread launch, fixed buffers.
        :mod:`attnbench.studies.scaling` uses both to leave that fixed part out of its fits.
        """
        key = (point.backend, point.dtype, point.direction, point.kind)
        if key not in self._overheads:
            one = Point(backend=point.backend, L=1, d_k=1, heads=1, kv_heads=1, batch=1,
                        mask="none", dtype=point.dtype, direction=point.direction,
                        kind=point.kind)
            q, k, v, kwargs = make_inputs(one)
            call = self.make_call(one, q, k, v, kwargs)
            seconds = measure(call, warmup=2, repeat=5, max_time=0.05).median
            method = "rss" if point.backend == "torch" else "tracemalloc"
            self._overheads[key] = (seconds, peak_extra_memory(call, method=method, warmup=0))
        return self._overheads[key]

    def _oracle(self, point: Point, q, k, v, kwargs):
        """The oracle of the point's problem, cached per problem.

        Forward: ``(exact, tolerance)``.  Backward: ``(exact, plain)``, each ``(dq, dk, dv)``
        (:func:`attnbench.measure.grad_oracle.gradient_oracle`; the tolerance is set per
        gradient by :func:`~attnbench.measure.grad_oracle.gradient_errors`).
        """
        key = point.problem_key()
        if key not in self._oracles and point.kind != "dense":
            dout = make_dout(point, q) if point.direction == "backward" else None
            with threadpool_limits(limits=1, user_api="blas"):
                self._oracles[key] = kinds.oracle_of(point, q, k, v, kwargs, dout)
        if key not in self._oracles:
            problem = kernels.prepare(q, k, v, **kwargs,
                                      **variant_kwargs(point.variant, point.heads, point.L,
                                                       q.dtype))
            with threadpool_limits(limits=1, user_api="blas"):
                if point.direction == "backward":  # (dq, dk, dv[, dsinks]) each
                    exact, plain = gradient_oracle(problem, make_dout(point, q))
                    self._oracles[key] = (exact, plain)
                else:
                    exact, plain = oracle(problem)  # (B, H, L, D) each
                    self._oracles[key] = (exact, tolerance(exact, plain, problem.dtype))
            while len(self._oracles) > 8:  # points of one problem are usually close together
                self._oracles.popitem(last=False)
        return self._oracles[key]

    def __call__(self, point: Point) -> Row:
        """The point's row: :meth:`time_point`, then :meth:`check_point`."""
        row, out = self.time_point(point)
        return self.check_point(point, row, out)

    # The two phases of a point.  The serial executor runs them back to back; the Dask
    # executor (attnbench.sweep.cluster) runs the first under the host's timing slot and the
    # second anywhere, so that checks may overlap timings but timings never overlap.

    def time_point(self, point: Point) -> tuple[Row, object]:
        """Phase 1: run and time the point; ``(row without the error, checked output)``.

        Never raises for the point's own failures: the row says ``failed`` (output None) or
        ``skipped`` with the reason.
        """
        started = time.perf_counter()
        row = {**point.as_dict(), "flops": np.nan, "status": "ok", "reason": ""}
        skip = self.skip_reason(point)
        if skip:
            return {**row, "status": "skipped", "reason": skip}, None
        out = None
        try:
            result, out = self._time(point)
            row.update(result)
        except peers.UnsupportedByPeer as exc:
            row.update(status="skipped", reason=f"skipped: {exc}")
        except Exception as exc:  # MemoryError included: the row records it, the sweep goes on
            row.update(status="failed", reason=f"{type(exc).__name__}: {exc}")
        row["point_seconds"] = time.perf_counter() - started
        return row, out

    def check_point(self, point: Point, row: Row, out) -> Row:
        """Phase 2: the error of ``out`` against the oracle, added to ``row`` (if it is ok)."""
        if row["status"] != "ok":
            return row
        started = time.perf_counter()
        try:
            row.update(self._check(point, out))
        except Exception as exc:
            row.update(status="failed", reason=f"{type(exc).__name__}: {exc}")
        row["point_seconds"] = row.get("point_seconds", 0.0) + time.perf_counter() - started
        return row

    def _time(self, point: Point) -> tuple[dict, object]:
        if point.backend != self._last_backend:
            time.sleep(self.settle)  # the previous backend's worker threads go idle
            self._last_backend = point.backend
        q, k, v, kwargs = make_inputs(point)
        self._inputs = (point, q, k, v, kwargs)  # for _check, right after, in this process
        flops = kinds.point_flops(point, kwargs)
        if point.backend in GPU_BACKENDS:
            return self._time_on_gpu(point, flops, q, k, v, kwargs)
        with timing_threads(point.backend):  # the reference: the BLAS on one thread
            return self._time_on_cpu(point, flops, q, k, v, kwargs)

    def _time_on_cpu(self, point: Point, flops, q, k, v, kwargs) -> tuple[dict, object]:
        call = self.make_call(point, q, k, v, kwargs)
        out = call()  # compiles on first use; this output is the one checked
        if point.direction == "backward":
            out = (out, getattr(call, "lse", None))  # the gradients, and the lse they used
        # Batches of several scheduler time slices (on a shared machine a batch of less
        # than one is either undisturbed or a whole slice late, and its median flips
        # between the two), up to 15 in max_time and at least 6 (the fewest with a 95%
        # interval of the median), then rounds within as much again while the interval is
        # wide or the probe sees interference (measure.timing).  A point the sweep times
        # again at its end (``retimed``) gets a brief first timing: 3 batches at least, no
        # extra rounds; its row says ``brief_timing``.
        brief = self.retimed is not None and self.retimed(point)
        timing = self.full_timing(call) if not brief else measure(
            call, warmup=1, repeat=15, min_repeat=3, min_time=0.01, max_time=self.max_time,
            probe=default_probe())
        memory_method = "rss" if point.backend == "torch" else "tracemalloc"
        peak = peak_extra_memory(call, method=memory_method, warmup=0)
        result = {
            "flops": flops,
            **timing.ms_columns(), "gflops": gflops(flops, timing.median),
            **timing.row_columns(),
        }
        peak_gemm = self.gemm_peaks.get(point.dtype, np.nan)
        pct = 100 * result["gflops"] / peak_gemm
        result["fault"] = fault(pct, 100, "% of the GEMM peak")  # never a result if > 100
        if result["fault"]:
            pct = np.nan
        result.update(gemm_peak_gflops=peak_gemm, peak_source=CPU_PEAK_SOURCE,
                      pct_of_gemm_peak=pct,
                      threads=self.threads(point.backend),
                      call_overhead_ms=self.smallest_call(point)[0] * 1e3,
                      peak_mem_bytes=peak, base_mem_bytes=self.smallest_call(point)[1],
                      memory_method=memory_method, device="cpu", brief_timing=brief)
        if point.kind == "decode":  # a decode step reads each key and value once
            result["bytes_read"] = kinds.bytes_read(point)
            read_against_bandwidth(result)  # the probe's reading: at the end of the sweep
        return result, out

    def full_timing(self, call):
        """The timing of a point's call as the sweep takes it (see :meth:`_time`)."""
        return measure(call, warmup=1, repeat=15, min_repeat=6, min_time=0.01,
                       max_time=self.max_time, budget=self.max_time, probe=default_probe())

    def _time_on_gpu(self, point: Point, flops, q, k, v, kwargs) -> tuple[dict, object]:
        """cuda and torch-cuda: device-resident inputs, CUDA events (measure.gpu_timing)."""
        if point.backend == "cuda":
            kwargs = {**kwargs, **variant_kwargs(point.variant, point.heads, point.L, q.dtype)}
        else:
            kwargs = peer_kwargs(point.variant, kwargs, point.heads, point.L, q.dtype)
        timed = gpu_timing.time_attention(point.backend, q, k, v, kwargs,
                                           max_time=self.max_time)
        peak = gpu_device.device_peak_gflops(point.dtype)
        result = {
            "flops": flops,
            **timed.kernel.ms_columns(), "gflops": gflops(flops, timed.kernel.median),
            "gemm_peak_gflops": peak.gflops, "peak_source": peak.source,
            "threads": None, "call_overhead_ms": np.nan,
            "peak_mem_bytes": timed.device_bytes, "base_mem_bytes": np.nan,
            "memory_method": "device arrays allocated (inputs, output, mask)",
            **timed.columns(),
        }
        result["pct_of_gemm_peak"] = 100 * result["gflops"] / peak.gflops
        return result, timed.out

    def _check(self, point: Point, out) -> dict:
        """Error of ``out`` against the oracle (or why the oracle was skipped)."""
        oracle_skip = self.oracle_skip_reason(point)
        if oracle_skip:
            return dict(max_abs_err=np.nan, tolerance=np.nan, within_tolerance=pd.NA,
                        oracle=oracle_skip)
        if self._inputs is not None and self._inputs[0] == point:
            _, q, k, v, kwargs = self._inputs
        else:  # checked in another process than it was timed (the Dask executor)
            q, k, v, kwargs = make_inputs(point)
        self._inputs = None
        if point.direction == "backward":
            grads, lse = out
            exact, plain = self._oracle(point, q, k, v, kwargs)
            errors = gradient_errors(grads, exact, plain, q.dtype, lse)
            return dict(max_abs_err=errors["max_abs_err"], tolerance=errors["tolerance"],
                        within_tolerance=errors["within_tolerance"],
                        oracle=f"{oracle_dtype(point.dtype).name} ({errors['worst']} worst)")
        exact, tol = self._oracle(point, q, k, v, kwargs)
        error = max_abs_error(np.asarray(out).reshape(exact.shape), exact)
        return dict(max_abs_err=error, tolerance=tol, within_tolerance=error <= tol,
                    oracle=oracle_dtype(point.dtype).name)
