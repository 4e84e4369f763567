"""Decode time against cache length: is it O(Lk)?  (The issue's `attnbench run` target;
until decode points are in the sweep, this script measures it with the same pieces.)

B=1, H=8, Hkv=2, D=128, Lq=1, float32, numba backend, num_splits=0, caches of 1024 ..
65536 keys, timed in interleaved rounds (:func:`attnbench.measure.timing.interleaved`),
fitted as t = c + a·Lk^p with the bootstrap interval of
:func:`attnbench.studies.fits.fit_scaling`; the verdict rule of the sweep's scaling table
(expected exponent 1 ± 0.25, decided from the whole interval).

Usage: python scripts/decode_scaling.py [--threads N] [--rounds R]
"""

import argparse
import functools

import numba
import numpy as np

from attnbench import kernels
from attnbench.measure.timing import interleaved
from attnbench.studies.fits import fit_scaling
from attnbench.studies.scaling import exponent_text

LENGTHS = (1024, 2048, 4096, 8192, 16384, 32768, 65536)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--threads", type=int, default=numba.get_num_threads())
    parser.add_argument("--rounds", type=int, default=15)
    args = parser.parse_args()
    numba.set_num_threads(args.threads)
    rng = np.random.default_rng(0)
    q = rng.standard_normal((1, 8, 1, 128), dtype=np.float32)
    calls = {}
    for L in LENGTHS:
        k = rng.standard_normal((1, 2, L, 128), dtype=np.float32)
        v = rng.standard_normal((1, 2, L, 128), dtype=np.float32)
        calls[L] = functools.partial(kernels.attention_with_kvcache, q, k, v,
                                     cache_seqlens=[L], backend="numba")
        calls[L]()
    with open("/proc/loadavg") as f:
        load_before = f.read().split()[0]
    timings = interleaved(calls, rounds=args.rounds, min_time=0.02)
    with open("/proc/loadavg") as f:
        load_after = f.read().split()[0]
    for L, timing in timings.items():
        print(f"Lk={L:6d}: {timing.median * 1e3:8.3f} ms  (IQR {timing.iqr * 1e3:.3f})")
    fit = fit_scaling(list(timings), [t.samples for t in timings.values()])
    low, high = fit.ci_low, fit.ci_high
    verdict = ("confirmed" if 0.75 <= low and high <= 1.25 else
               "not confirmed" if high < 0.75 or low > 1.25 else "inconclusive")
    print(f"time ~ {exponent_text('Lk', fit.slope, low, high)}, best class {fit.best_class} "
          f"({fit.class_share:.0%} of resamples); O(Lk) {verdict}; "
          f"{args.threads} threads, load {load_before} before, {load_after} after")


if __name__ == "__main__":
    main()
