"""What every benchmark shares: the grid choice, the inputs, and what goes in extra_info.

One file per topic declares its parameters as data (asv_bench style); the inputs come
from :func:`attnbench.sweep.runner.make_inputs`, so benchmarks, sweeps and reports draw the
same arrays for the same problem (seeding in one place).

The grid is chosen with the environment variable ``ATTNBENCH_BENCH_GRID``: ``tiny``
(default: seconds, for CI) or ``small`` (L up to 1024).
"""

from __future__ import annotations

import os

import numpy as np

from attnbench import kernels
from attnbench.measure.flops import attention_flops
from attnbench.measure.oracle import max_abs_error, oracle, tolerance
from attnbench.sweep.grid import Point
from attnbench.sweep.runner import make_inputs

GRID = os.environ.get("ATTNBENCH_BENCH_GRID", "tiny")
if GRID not in ("tiny", "small"):
    raise ValueError(f"ATTNBENCH_BENCH_GRID={GRID!r}; expected 'tiny' or 'small'")


def shape_id(shape: dict) -> str:
    """``L128-dk64-H4-B1``: the id of a shape in test names."""
    return f"L{shape['L']}-dk{shape['d_k']}-H{shape['heads']}-B{shape['batch']}"


def problem(backend: str, shape: dict, mask: str, dtype: str = "float32"):
    """The point and its inputs ``(point, q, k, v, kwargs)``."""
    point = Point(backend=backend, L=shape["L"], d_k=shape["d_k"], heads=shape["heads"],
                  kv_heads=shape.get("kv_heads", shape["heads"]), batch=shape["batch"],
                  mask=mask, dtype=dtype)
    return (point, *make_inputs(point))


def run_benchmark(benchmark, fn, point, q, k, v, kwargs):
    """Benchmark ``fn`` (grouped by problem) and record GFLOP/s and the error in extra_info.

    ``fn`` is called once first (compilation is not timed); its output is checked against
    the oracle and must be within the tolerance.
    """
    out = np.asarray(fn())
    exact, plain = oracle(kernels.prepare(q, k, v, **kwargs))
    error = max_abs_error(out.reshape(exact.shape), exact)
    flops = attention_flops(point.batch, point.heads, point.L, point.L, point.d_k,
                            causal=kwargs.get("causal", False),
                            key_lengths=kwargs.get("key_lengths"), mask=kwargs.get("mask"))
    timed(benchmark, fn, point, flops, error, tolerance(exact, plain, q.dtype))


def timed(benchmark, fn, point, flops: int, error: float, tol: float, group: str = "",
          **info):
    """Time ``fn`` with the fixture, grouped by problem, and fill ``extra_info``.

    ``flops`` per call give ``gflops``; ``error`` and ``tol`` (computed by the caller from
    a call made before, so compilation is not timed) are recorded and ``error <= tol`` is
    asserted.  ``group`` is appended to the problem's group name; ``info`` goes into
    ``extra_info`` as is.
    """
    benchmark.group = (f"L={point.L} d_k={point.d_k} H={point.heads}/{point.kv_heads} "
                       f"B={point.batch} {point.mask} {point.dtype}{group}")
    benchmark(fn)
    median = benchmark.stats.stats.median if benchmark.stats is not None else float("nan")
    benchmark.extra_info.update({
        "backend": point.backend, "L": point.L, "d_k": point.d_k, "heads": point.heads,
        "kv_heads": point.kv_heads, "batch": point.batch, "mask": point.mask,
        "dtype": point.dtype, "flops": flops,
        "gflops": flops / median / 1e9 if median > 0 else float("nan"),
        "max_abs_err": error, "tolerance": tol, **info,
    })
    assert error <= tol, f"{point.label()}: error {error:.3g} > tolerance {tol:.3g}"
