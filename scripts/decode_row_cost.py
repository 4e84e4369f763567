"""The numba decode kernel's arithmetic cost per (query row, key), cache in L3: one thread,
one key/value head of 2048 keys (1 MiB of K and V), D = Dv = 128, float32, num_splits=1,
H = 1, 2, 4, 8 query rows sharing it (GQA).  Prints the fastest of 200 calls per H and
that time per row and key; with H = 1 the fixed cost of a call (validation, launch,
merge) dominates.  Usage: python scripts/decode_row_cost.py
"""

import time

import numba
import numpy as np

from attnbench import kernels

numba.set_num_threads(1)
rng = np.random.default_rng(0)
L, D = 2048, 128
k_cache = rng.standard_normal((1, 1, L, D), dtype=np.float32)
v_cache = rng.standard_normal((1, 1, L, D), dtype=np.float32)
with open("/proc/loadavg") as f:
    print("load", f.read().split()[0])
for H in (1, 2, 4, 8):
    q = rng.standard_normal((1, H, 1, D), dtype=np.float32)

    def step(q=q):
        return kernels.attention_with_kvcache(q, k_cache, v_cache, cache_seqlens=[L],
                                              num_splits=1, backend="numba")

    step()
    best = float("inf")
    for _ in range(200):
        start = time.perf_counter()
        step()
        best = min(best, time.perf_counter() - start)
    print(f"H={H}: {best * 1e6:.0f} us, {best / L / H * 1e9:.1f} ns per row and key")
