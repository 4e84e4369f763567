"""Fit and check the rational tanh that softcap's float32 CPU kernels use.

    python scripts/fit_tanh.py            # fit, print the coefficients, check every float32
    python scripts/fit_tanh.py --iterations 5 --stride 65536   # a quick look (the smoke test)

``tanh(x) ≈ x · P(x²) / Q(x²)`` with P and Q of degree 4 in x² (P(0) = Q(0) = 1) on
[0, 9.02]: beyond 13·ln 2 ≈ 9.011 tanh rounds to ±1 in float32, so the input is clamped
there.  The fit minimises the relative error (linearised least squares, reweighted towards
the largest errors, Lawson's iteration) in float64, then rounds the coefficients to float32.
The check runs the compiled :func:`kernels.mods.lowering.tanh_for` ("cpu", float32) over
every non-negative float32 up to 20 against float64 ``math.tanh`` and prints the largest
error in ulps of the exact result (float32 arithmetic adds ~5 ulps to the fit's ~0.6 near
±1, where P and Q are large), and whether any result left [−1, 1].  The whole check takes
minutes; ``--stride N`` checks every N-th float32 only.
"""

from __future__ import annotations

import argparse
import math
import time

import numpy as np
from numba import njit, prange

CLAMP = 9.02


def fit(iterations: int = 200) -> np.ndarray:
    """a1..a4, b1..b4 (float64) of x(1 + a1 t + ... + a4 t⁴) / (1 + b1 t + ... + b4 t⁴), t = x²."""
    x = np.concatenate([np.geomspace(1e-6, 1e-4, 200), np.linspace(1e-4, CLAMP, 40001)])
    t, g = x * x, np.tanh(x) / x
    Q, weight = np.ones_like(t), np.ones_like(t)
    for _ in range(iterations):
        w = weight / (g * Q)
        design = np.column_stack([t ** i for i in range(1, 5)] + [-g * t ** j for j in range(1, 5)])
        sol, *_ = np.linalg.lstsq(design * w[:, None], (g - 1) * w, rcond=None)
        P = 1 + sum(sol[i] * t ** (i + 1) for i in range(4))
        Q = 1 + sum(sol[4 + j] * t ** (j + 1) for j in range(4))
        err = np.abs(x * P / Q - np.tanh(x)) / np.tanh(x)
        weight = weight * np.sqrt(err) + 1e-300
        weight /= weight.sum()
    print(f"fit: largest relative error {err.max():.2e} (float64 arithmetic)")
    return sol


def check(tanh32, upto: float = 20.0, stride: int = 1) -> tuple[float, bool]:
    """Largest error in ulps over every ``stride``-th float32 in [0, upto]; whether |result| > 1
    anywhere."""
    block = 1 << 20

    @njit(parallel=True)
    def run(hi, last):
        n_blocks = hi // block + 1
        worst, outside = np.zeros(n_blocks), np.zeros(n_blocks, dtype=np.bool_)
        bits = np.zeros(1, dtype=np.int32)
        for blk in prange(n_blocks):
            one = bits.copy()
            for j in range(blk * block, min(hi, (blk + 1) * block)):
                i = min(j * stride, last)
                one[0] = i
                x = one.view(np.float32)[0]
                y = tanh32(x)
                exact = math.tanh(np.float64(x))
                ulp = np.float64(np.spacing(np.float32(abs(exact))))
                worst[blk] = max(worst[blk], abs(np.float64(y) - exact) / ulp)
                outside[blk] |= abs(y) > 1
        return worst.max(), outside.any()

    last = int(np.array([upto], np.float32).view(np.int32)[0])
    return run(last // stride + 1, last)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iterations", type=int, default=200, help="Lawson iterations (200)")
    parser.add_argument("--stride", type=int, default=1,
                        help="check every N-th float32 only (default 1: all of them)")
    args = parser.parse_args(argv)
    coefficients = fit(args.iterations)
    a, b = coefficients[:4].astype(np.float32), coefficients[4:].astype(np.float32)
    print("numerator   a1..a4:", ", ".join(repr(float(c)) for c in a))
    print("denominator b1..b4:", ", ".join(repr(float(c)) for c in b))
    from attnbench.kernels.mods.lowering import tanh_for

    start = time.perf_counter()
    worst, outside = check(tanh_for("cpu", np.float32), stride=args.stride)
    which = "every float32" if args.stride == 1 else f"every {args.stride}th float32"
    print(f"kernels' tanh32 over {which} in [0, 20]: largest error {worst:.2f} ulp, "
          f"|tanh| > 1: {outside} ({time.perf_counter() - start:.0f} s)")


if __name__ == "__main__":
    main()
