"""What a pause costs the next parallel call: a Numba parallel loop timed back to back and
after pauses of 10 ms to 0.3 s, with 2 threads (or ``--threads``).

    python scripts/idle_wake.py [--threads 2]

Two loops of ``prange`` over 8 tasks: ``compute`` (arithmetic on an array in L1) and
``read`` (a sum over 128 MiB, bound by memory); then ``read`` after a 0.2 s pause and an
empty parallel loop.  Medians of 9 calls.  On the 2-core AMD EPYC VM, 2026-12-05: after
pauses up to 30 ms both ran at their back-to-back time (1.9 ms, 9.3 ms); after 0.1 s or
more they took 6-8 ms and 20 ms, as if the second core came back only after several
milliseconds; an empty parallel loop first (0.2 ms) restored the back-to-back time.  One
thread is not affected.  So the harness's timer (:func:`attnbench.measure.timing.
interleaved`) makes one untimed call after each pause before it times a batch.
"""

from __future__ import annotations

import argparse
import time

import numba
import numpy as np
from numba import njit, prange


@njit(parallel=True)
def compute(x, n):
    out = np.zeros(8)
    for t in prange(8):
        s = 0.0
        for _ in range(n):
            for i in range(x.size):
                s += x[i] * 1.0000001
        out[t] = s
    return out


@njit(parallel=True)
def read(a):
    out = np.zeros(8)
    m = a.size // 8
    for t in prange(8):
        s = 0.0
        for i in range(t * m, (t + 1) * m):
            s += a[i]
        out[t] = s
    return out


@njit(parallel=True)
def empty():
    out = np.zeros(numba.get_num_threads())
    for t in prange(out.size):
        out[t] = t
    return out


def median_ms(call, pause, before=None, calls=9):
    times = []
    for _ in range(calls):
        time.sleep(pause)
        if before is not None:
            before()
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    return 1e3 * float(np.median(times))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args(argv)
    numba.set_num_threads(args.threads)
    x, big = np.ones(1 << 16), np.ones(1 << 25, dtype=np.float32)
    calls = {"compute": lambda: compute(x, 15), "read": lambda: read(big)}
    for call in calls.values():
        call()  # compiles
    empty()
    with open("/proc/loadavg") as f:
        print(f"threads {numba.get_num_threads()} ({numba.threading_layer()}), "
              f"load {f.read().split()[0]}")
    for pause in (0.0, 0.01, 0.03, 0.1, 0.3):
        print(f"pause {pause:5.3f} s: " + "  ".join(
            f"{name} {median_ms(call, pause):6.2f} ms" for name, call in calls.items()))
    print(f"pause 0.200 s, then an empty parallel loop: read "
          f"{median_ms(calls['read'], 0.2, before=empty):6.2f} ms")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
