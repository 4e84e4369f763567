"""Stretches in which two-thread BLAS products run slower, and one-thread ones do not.

Why the reference is timed with its BLAS on one thread (``docs/design.md``, "Measuring").
For ``--seconds``, row after row, this times blocks of ~0.1 s of:

- ``ref128 2T`` / ``ref128 1T``: the sweep's reference call at L = 128 (4 heads, d_k 64,
  float32 inputs computed in float64), the BLAS on 2 threads, then on 1;
- ``np256 2T``: the NumPy peer at L = 256 on 2 threads (a speed contender: it keeps them);
- ``gemm cpu0`` / ``gemm cpu1``: a one-thread 96 x 96 float64 product with this thread
  pinned to each CPU in turn (each vCPU's own speed).

Each block is the mean µs per call, under the sweep's steady-state allocation.  At the end
it prints, per column, the median and the share of rows more than 1.3x that median.  On
the 2-vCPU AMD EPYC (a Firecracker VM) these numbers come from, in two watches of 60 and
90 s, ``ref128 2T`` went from ~0.72 ms to ~1.45 ms for stretches of 4-15 s, two or three
a minute, while ``ref128 1T`` (~0.80 ms) and both pinned products stayed level; in a
third, both reference columns were disturbed for the first 35 s (0.9-1.4 ms) and the
pinned products were not.  The host's state varies: watch for a minute or more.

Usage::

    .venv/bin/python scripts/blas_thread_stretches.py --seconds 90
"""

from __future__ import annotations

import argparse
import os
import time

import numpy as np
from threadpoolctl import threadpool_limits

from attnbench.measure.allocation import steady_allocation
from attnbench.sweep.calls import make_call, make_inputs
from attnbench.sweep.grid import Point

SLOW = 1.3


def sweep_call(backend: str, L: int):
    point = Point(backend=backend, L=L, d_k=64, heads=4, kv_heads=4, batch=1, mask="none",
                  dtype="float32", direction="forward")
    call = make_call(point, *make_inputs(point))
    call()
    return call


def block_us(fn, seconds: float = 0.1) -> float:
    fn()
    calls, started = 0, time.perf_counter()
    while time.perf_counter() - started < seconds:
        fn()
        calls += 1
    return (time.perf_counter() - started) / calls * 1e6


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=60.0, help="how long to watch")
    args = parser.parse_args(argv)
    if len(os.sched_getaffinity(0)) < 2:
        raise SystemExit("needs 2 CPUs or more")
    reference, numpy_peer = sweep_call("reference", 128), sweep_call("numpy", 256)
    matrix = np.random.default_rng(0).standard_normal((96, 96))
    cpus = sorted(os.sched_getaffinity(0))
    columns = ["ref128 2T", "ref128 1T", "np256 2T", "gemm cpu0", "gemm cpu1"]
    rows = []
    print("   s  " + "  ".join(f"{name:>9}" for name in columns))
    started = time.time()
    with steady_allocation():
        while time.time() - started < args.seconds:
            with threadpool_limits(limits=2, user_api="blas"):
                row = [block_us(reference)]
            with threadpool_limits(limits=1, user_api="blas"):
                time.sleep(0.15)  # the 2-thread workers stop spinning
                row.append(block_us(reference))
            with threadpool_limits(limits=2, user_api="blas"):
                row.append(block_us(numpy_peer))
            with threadpool_limits(limits=1, user_api="blas"):
                time.sleep(0.15)
                for cpu in cpus[:2]:
                    os.sched_setaffinity(0, {cpu})
                    row.append(block_us(lambda: matrix @ matrix))
                os.sched_setaffinity(0, set(cpus))
            rows.append(row)
            print(f"{time.time() - started:5.1f} " + "  ".join(f"{v:9.1f}" for v in row),
                  flush=True)
    table = np.array(rows)
    median = np.median(table, axis=0)
    print("median " + "  ".join(f"{v:9.1f}" for v in median))
    print(f">{SLOW}x  " + "  ".join(f"{share:8.0%} " for share in
                                   (table > SLOW * median).mean(axis=0)))


if __name__ == "__main__":
    main()
