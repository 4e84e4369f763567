"""Half-precision prefill (and backward) against float32 on the numba backend, interleaved.

Issue 25's targets, provisional until ``attnbench bench --only precision`` exists: bf16 and
f16 prefill / f32 at B=1, H=12, D=64 (<= 1.10x), bf16 backward / f32 (<= 1.15x).  Each
ratio is of medians of interleaved rounds, warm-up excluded, with its 95% bootstrap
interval (attnbench.measure.timing.interleaved, attnbench.measure.intervals).

    python scripts/half_vs_float32.py [L ...] [--backward]
"""

from __future__ import annotations

import os
import sys

import ml_dtypes
import numpy as np

from attnbench import kernels
from attnbench.measure.intervals import ratio_interval
from attnbench.measure.timing import interleaved

DTYPES = {"float32": np.float32, "bfloat16": ml_dtypes.bfloat16, "float16": np.float16}


def main(argv):
    backward = "--backward" in argv
    lengths = [int(a) for a in argv if a.isdigit()] or [2048]
    rng = np.random.default_rng(0)
    print(f"load (1 min) {os.getloadavg()[0]:.2f}")
    for L in lengths:
        base = [rng.standard_normal((1, 12, L, 64)).astype(np.float32) for _ in range(3)]
        for causal in (False, True):
            calls = {}
            for name, dtype in DTYPES.items():
                q, k, v = (x.astype(dtype) for x in base)
                if backward:
                    if name == "float16":
                        continue
                    out, lse = kernels.attention(q, k, v, causal=causal, return_lse=True)
                    dout = np.ones_like(out)
                    calls[name] = (lambda q=q, k=k, v=v, o=out, s=lse, d=dout, c=causal:
                                   kernels.attention_backward(q, k, v, d, out=o, lse=s,
                                                              causal=c))
                else:
                    calls[name] = lambda q=q, k=k, v=v, c=causal: kernels.attention(
                        q, k, v, causal=c)
            timings = interleaved(calls, rounds=7, settle=0.1)
            f32 = timings["float32"].samples
            for name in calls:
                if name == "float32":
                    continue
                ratio, lo, hi = ratio_interval(timings[name].samples, f32)
                what = "backward" if backward else "prefill"
                print(f"{what} L={L} causal={causal} {name}/float32: {ratio:.3f} "
                      f"[{lo:.3f}, {hi:.3f}]  (f32 median {np.median(f32) * 1e3:.1f} ms)")


if __name__ == "__main__":
    main(sys.argv[1:])
