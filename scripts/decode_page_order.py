"""What a paged cache costs the memory system alone: a dot over a cache far larger than the
caches, read contiguously or page by page through a block table, on one thread or more.

    python scripts/decode_page_order.py [--threads 1] [--repeat 5]

The key cache of the decode target (Hkv = 8 heads of 32768 keys of D = 128 float32,
128 MiB), in the layouts of :func:`kernels.attention_with_kvcache`: contiguous
``(Hkv, L, D)``, or paged ``(num_pages, Hkv, page_size, D)``, where one head's keys of one
page are a run of ``page_size · 512`` bytes (8 KiB for pages of 16 tokens) and the runs of
a head lie ``Hkv`` runs apart, in the block table's order (identity or shuffled).  Each
variant takes, for every head (a parallel task) and every key in the sequence's order, the
dot of one query with the key's row (the decode kernel's read order), optionally with a
software prefetch of a page ``ahead`` pages on, issued when a page starts (0: none).  Best
of ``--repeat`` calls; GB/s of the whole cache.  If the shuffled pages of 16 read slower
than the contiguous cache here, with nothing but the dot, the decode kernel's paged
slowdown is the memory system's, not the kernel's bookkeeping.  ``heads together``: one
task per split of the pages reads every head of a page in turn (the page's runs of all heads
are adjacent); ``chunks, heads``: the same by chunks of 64 keys, the decode kernel's order
since the heads of a page are read together.  Measured on AMD EPYC (2 cores), 2026-12-05:
shuffled pages of 16 one head at a time 1.4-1.9x the contiguous time, heads together
1.1-1.2x; the machine's memory is shared, so compare rows of one run only.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numba
import numpy as np
from numba import njit, prange

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from decode_read_order import one_row  # noqa: E402  (this folder: the contiguous read)

from attnbench.kernels._jit.math import FASTMATH  # noqa: E402
from attnbench.kernels._jit.prefetch import prefetch_rows  # noqa: E402

HKV, L, D = 8, 32768, 128


@njit(fastmath=FASTMATH, inline="always")
def _run_dots(q, k, page, h, ps):
    """Σ over the ``ps`` keys of head h on ``page`` of the dot of q[h] with each key row."""
    D = k.shape[3]
    total = np.float32(0)
    for slot in range(ps):
        dot = np.float32(0)
        for d in range(D):
            dot += q[h, d] * k[page, h, slot, d]
        total += dot
    return total


@njit(parallel=True, fastmath=FASTMATH)
def paged(q, k, table, out, ahead):
    n_pages, Hkv, ps, D = k.shape
    kf = k.reshape(k.size)
    for h in prange(Hkv):
        total = np.float32(0)
        for p in range(table.size):
            if ahead > 0 and p + ahead < table.size:  # the whole run of a later page
                prefetch_rows(kf, ((table[p + ahead] * Hkv + h) * ps) * D, ps, D)
            total += _run_dots(q, k, table[p], h, ps)
        out[h] = total


@njit(parallel=True, fastmath=FASTMATH)
def paged_heads_together(q, k, table, out, splits):
    """One task per split of the pages, reading every head of a page together: the page's
    ``Hkv`` runs are adjacent, one run of ``Hkv · page_size · 512`` bytes."""
    n_pages, Hkv, ps, D = k.shape
    per = (table.size + splits - 1) // splits
    totals = np.zeros((splits, Hkv), np.float32)
    for s in prange(splits):
        for p in range(s * per, min(s * per + per, table.size)):
            for h in range(Hkv):
                totals[s, h] += _run_dots(q, k, table[p], h, ps)
    for h in range(Hkv):
        out[h] = totals[:, h].sum()


@njit(parallel=True, fastmath=FASTMATH)
def chunks_heads_together(q, k, table, out, splits):
    """As :func:`paged_heads_together`, by chunks of 64 keys (the decode kernel's): for each
    chunk, every head in turn reads its runs of the chunk's pages."""
    n_pages, Hkv, ps, D = k.shape
    per_chunk = max(64 // ps, 1)
    per = (table.size + splits - 1) // splits
    totals = np.zeros((splits, Hkv), np.float32)
    for s in prange(splits):
        end = min(s * per + per, table.size)
        for p0 in range(s * per, end, per_chunk):
            for h in range(Hkv):
                for p in range(p0, min(p0 + per_chunk, end)):
                    totals[s, h] += _run_dots(q, k, table[p], h, ps)
    for h in range(Hkv):
        out[h] = totals[:, h].sum()


def _best(call, repeat):
    call()  # compiles, warms
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        call()
        best = min(best, time.perf_counter() - start)
    return best


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--ahead", type=int, nargs="+", default=[0, 1, 2, 4])
    args = parser.parse_args()
    numba.set_num_threads(args.threads)
    rng = np.random.default_rng(0)
    q = rng.standard_normal((HKV, D), dtype=np.float32)
    out = np.empty(HKV, np.float32)
    k = rng.standard_normal((HKV, L, D), dtype=np.float32)
    nbytes = k.nbytes
    print(f"{args.threads} thread(s); cache {nbytes / 2**20:.0f} MiB")
    seconds = _best(lambda: one_row(q, k, out, 0), args.repeat)
    print(f"{'contiguous':34s} {seconds * 1e3:7.2f} ms {nbytes / seconds / 1e9:5.1f} GB/s")
    for ps in (16, 256):
        n_pages = L // ps
        kp = rng.standard_normal((n_pages, HKV, ps, D), dtype=np.float32)
        orders = {"identity": np.arange(n_pages), "shuffled": rng.permutation(n_pages)}
        for name, table in orders.items():
            for ahead in args.ahead if name == "shuffled" else [0]:
                seconds = _best(lambda t=table, a=ahead, c=kp: paged(q, c, t, out, a),
                                args.repeat)
                label = f"page {ps:3d}, {name}, prefetch +{ahead}"
                print(f"{label:34s} {seconds * 1e3:7.2f} ms "
                      f"{nbytes / seconds / 1e9:5.1f} GB/s")
        seconds = _best(lambda t=orders["shuffled"], c=kp: paged_heads_together(
            q, c, t, out, 2 * args.threads), args.repeat)
        label = f"page {ps:3d}, shuffled, heads together"
        print(f"{label:34s} {seconds * 1e3:7.2f} ms {nbytes / seconds / 1e9:5.1f} GB/s")
        seconds = _best(lambda t=orders["shuffled"], c=kp: chunks_heads_together(
            q, c, t, out, 2 * args.threads), args.repeat)
        label = f"page {ps:3d}, shuffled, chunks, heads"
        print(f"{label:34s} {seconds * 1e3:7.2f} ms {nbytes / seconds / 1e9:5.1f} GB/s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
