"""What softcap costs per score on the CPU: the score loop with and without its tanh.

    python scripts/softcap_cost.py [--reps 200]

Times, on one thread, the score loop the numba kernels run over each row of a tile (scale,
then the running maximum), plain and with softcap's ``cap * tanh(score / cap)`` by
``tanh32`` (:func:`kernels.mods.lowering.tanh_for`: a rational function, no exp, one
division, so that the loop vectorises), and the largest error of ``tanh32`` against
float64 ``np.tanh``, in float32 ulps, over [-12, 12] and tiny magnitudes.  Prints ns per
score (median of 7).  A cheaper tanh must be weighed against that error.  Compare
with the attention's whole cost per score (``attnbench bench --only variants``: the plain
call's CPU time / (H · L²)).
"""

from __future__ import annotations

import argparse
import time

import numpy as np
from numba import njit

from attnbench.kernels._jit.math import FASTMATH, max_key
from attnbench.kernels.mods.lowering import tanh_for

F = np.float32
TANH32 = tanh_for("cpu", np.float32)


def _score_loop(kind: int):
    @njit(fastmath=FASTMATH, error_model="numpy")
    def run(rows, scale, cap, reps):
        total = 0
        for _ in range(reps):
            for r in range(rows.shape[0]):
                row = rows[r]
                key = max_key(F(-np.inf))
                for c in range(row.shape[0]):
                    x = row[c] * scale
                    if kind == 1:
                        x = cap * TANH32(x / cap)
                    row[c] = x
                    key = max(key, max_key(x))
                total += key
        return total
    return run


@njit
def _tanh32_of(x):
    out = np.empty_like(x)
    for i in range(x.size):
        out[i] = TANH32(x[i])
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reps", type=int, default=200)
    args = parser.parse_args()
    rows0 = (np.random.default_rng(0).standard_normal((64, 256)) * 3).astype(F)
    tiny = np.logspace(-12, 1, 200001)
    x = np.concatenate([np.linspace(-12, 12, 2_000_001), tiny, -tiny]).astype(F)
    exact = np.tanh(x.astype(np.float64))
    ulp = np.spacing(np.abs(exact).astype(F)).astype(np.float64)
    for kind, name in ((0, "plain"), (1, "softcap, tanh32")):
        loop = _score_loop(kind)
        loop(rows0.copy(), F(0.125), F(30.0), 1)  # compiles
        times = []
        for _ in range(7):
            rows = rows0.copy()
            start = time.perf_counter()
            loop(rows, F(0.125), F(30.0), args.reps)
            times.append(time.perf_counter() - start)
        ns = np.median(times) / (args.reps * rows0.size) * 1e9
        error = "" if kind == 0 else (
            f", tanh32 max error {np.max(np.abs(_tanh32_of(x) - exact) / ulp):.1f} ulp")
        print(f"{name:<16} {ns:.3f} ns per score{error}")


if __name__ == "__main__":
    main()
