"""A dense ``mask=`` on the micro-kernel path against the BLAS tiles, interleaved.

    python scripts/dense_mask_micro.py [--L 4096] [--rounds 9]

B=1, H=12, D=64, float32, the machine's threads.  Each mask is timed through
:func:`kernels.numba_cpu.choose.run` with ``micro=True`` (the mask turned into mods,
kernels/mods/dense_mask.py) and ``micro=False`` (the tiles), and the plain call beside
them, in alternating rounds with a settle pause and an untimed call after it
(:func:`attnbench.measure.timing.interleaved`).  Prints each median and the ratios of
medians with their 95% bootstrap intervals.
"""

from __future__ import annotations

import argparse
import os
import platform

import numba
import numpy as np

from attnbench import kernels
from attnbench.kernels.numba_cpu import choose
from attnbench.measure.intervals import ratio_interval
from attnbench.measure.timing import interleaved


def masks(L: int, rng) -> dict:
    causal = np.tril(np.ones((L, L), dtype=bool))
    return {
        "bool causal (L, L)": causal,
        "bool padding (1, 1, 1, L), 3/4 kept": np.arange(L)[None, None, None, :] < 3 * L // 4,
        "bool random half (L, L)": rng.random((L, L)) < 0.5,
        "additive ALiBi-like bias, causal -inf (L, L)": np.where(
            causal, -0.01 * np.abs(np.subtract.outer(np.arange(L), np.arange(L))),
            -np.inf).astype(np.float32),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--L", type=int, default=4096)
    parser.add_argument("--rounds", type=int, default=9)
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    L, H, D = args.L, 12, 64
    q, k, v = (rng.standard_normal((1, H, L, D), dtype=np.float32) for _ in range(3))
    print(f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, "
          f"numba threads {numba.get_num_threads()}, load {os.getloadavg()[0]:.2f}")
    plain = kernels.prepare(q, k, v)
    print(f"B=1 H={H} L={L} D={D} float32, {args.rounds} rounds")
    print(f"{'mask':46s} {'micro ms':>9s} {'tiles ms':>9s}  micro/tiles [95%]"
          "      micro/plain [95%]")
    for name, mask in masks(L, rng).items():
        problem = kernels.prepare(q, k, v, mask=mask)
        timings = interleaved({
            "micro": lambda p=problem: choose.run(p, micro=True),
            "tiles": lambda p=problem: choose.run(p, micro=False),
            "plain": lambda: choose.run(plain),
        }, rounds=args.rounds, settle=0.1)
        s = {n: np.asarray(t.samples) for n, t in timings.items()}
        r, lo, hi = ratio_interval(s["micro"], s["tiles"])
        rp, lop, hip = ratio_interval(s["micro"], s["plain"])
        print(f"{name:46s} {np.median(s['micro']) * 1e3:9.1f} {np.median(s['tiles']) * 1e3:9.1f}"
              f"  {r:.2f} [{lo:.2f}, {hi:.2f}]      {rp:.2f} [{lop:.2f}, {hip:.2f}]")
    print(f"load after {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
