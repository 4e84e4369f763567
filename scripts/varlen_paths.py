"""A plain packed call on its two numba paths, against the dense calls of its sequences, in
one process, interleaved rounds: the micro-kernel path (:mod:`kernels.numba_cpu.varlen_micro`),
the BLAS tiles (the path every packed call took before it), and the 8 dense calls.

    python scripts/varlen_paths.py [--rounds 15] [--lengths 4096 2048 ... 32]

The dense calls take whichever path the planner stored for float32 on this machine (the
script prints it); the packed call is forced onto each path (``varlen.run(problem,
micro=True/False)``).  Prints each median with its interquartile range and the ratios of
medians with their bootstrap 95% intervals (attnbench.measure.intervals.ratio_interval).
float32, H=12, D=64, self-attention, causal and not, Numba's threads.
"""

from __future__ import annotations

import argparse
import platform

import numba
import numpy as np

from attnbench import kernels
from attnbench.kernels._varlen_api import prepare_varlen
from attnbench.kernels.numba_cpu import planner, varlen
from attnbench.measure.intervals import ratio_interval
from attnbench.measure.timing import interleaved


def _calls(lengths, causal, H=12, D=64):
    rng = np.random.default_rng(0)
    cu = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    q, k, v = (rng.standard_normal((cu[-1], H, D)).astype(np.float32) for _ in range(3))
    problem = prepare_varlen(q, k, v, cu, cu, causal=causal)
    dense = [tuple(np.ascontiguousarray(x[cu[b]:cu[b + 1]].transpose(1, 0, 2))[None]
                   for x in (q, k, v)) for b in range(len(lengths))]
    return {
        "varlen micro": lambda: varlen.run(problem, micro=True),
        "varlen tiles": lambda: varlen.run(problem, micro=False),
        "dense sum": lambda: [kernels.attention(*a, causal=causal, backend="numba")
                              for a in dense],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--lengths", type=int, nargs="+",
                        default=[4096, 2048, 1024, 512, 256, 128, 64, 32])
    args = parser.parse_args()
    print(f"{platform.processor() or platform.machine()}, {numba.get_num_threads()} threads, "
          f"float32 plan: {planner.record([np.float32])}, lengths {args.lengths}")
    for causal in (False, True):
        calls = _calls(args.lengths, causal)
        for call in calls.values():
            call()  # compiles
        timings = interleaved(calls, rounds=args.rounds, settle=0.05)
        print(f"\n{'causal' if causal else 'non-causal'}")
        for name, t in timings.items():
            print(f"  {name:<13} median {t.median * 1e3:8.2f} ms  IQR [{t.q25 * 1e3:.2f}, "
                  f"{t.q75 * 1e3:.2f}]"
                  f"  n={len(t.samples)}")
        for num, den in (("varlen micro", "dense sum"), ("varlen tiles", "dense sum"),
                         ("varlen micro", "varlen tiles")):
            r, lo, hi = ratio_interval(timings[num].samples, timings[den].samples)
            print(f"  {num} / {den}: {r:.3f} [{lo:.3f}, {hi:.3f}]")


if __name__ == "__main__":
    main()
