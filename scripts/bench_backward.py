"""Time the numba backward pass against PyTorch's SDPA backward (the backward's speed targets).

Usage::

    python scripts/bench_backward.py [--L 1024 2048 4096] [--rounds 5] [--memory-L 16384]

B = 1, H = 12, D = 64, float32 (the targets' shape).  For each L and causal in {no, yes}:

- numba backward: ``kernels.attention_backward(q, k, v, dout, out=out, lse=lse)`` with
  ``out`` and ``lse`` from one forward call made beforehand (the forward is not timed);
- torch backward: ``out.backward(dout, retain_graph=True)`` on a graph built once by
  ``scaled_dot_product_attention`` (the forward is not timed; the .grad fields are reset
  to None between calls, outside the timer);
- numba forward, for the backward / forward ratio.

Both libraries use the same thread count (Numba's), torch is imported before Numba's
threads start (imported after them, torch's SDPA ran 5x slower on this machine: see
attnbench/bench.py), and the three calls are interleaved round by round.  Times are
medians over rounds with the interquartile range.  The extra memory of one backward call
(out and lse passed in) is traced with tracemalloc (the three gradients excluded).
Prints Markdown tables and the load average before and after.
"""

from __future__ import annotations

import argparse
import gc
import os
import time
import tracemalloc

import numpy as np

try:  # before numba's threads start
    import torch
except ImportError:  # pragma: no cover - the peer is optional
    torch = None

import numba

import kernels
from attnbench.measure.timing import measure


def loadavg() -> str:
    with open("/proc/loadavg") as f:
        return " ".join(f.read().split()[:3])


def inputs(L, D=64, H=12, seed=0):
    rng = np.random.default_rng(seed)
    q, k, v, dout = (rng.standard_normal((1, H, L, D), dtype=np.float32) for _ in range(4))
    return q, k, v, dout


def time_one(fn, rounds):
    """Median and IQR (ms) of ``rounds`` single calls (one warm-up)."""
    t = measure(fn, warmup=1, repeat=rounds, min_repeat=rounds, number=1, max_time=1e9)
    return t.median * 1e3, t.iqr * 1e3


def bench_shape(L, causal, rounds):
    q, k, v, dout = inputs(L)
    out, lse = kernels.attention(q, k, v, causal=causal, return_lse=True, backend="numba")

    def numba_backward():
        return kernels.attention_backward(q, k, v, dout, out=out, lse=lse, causal=causal,
                                          backend="numba")

    def numba_forward():
        return kernels.attention(q, k, v, causal=causal, backend="numba")

    calls = {"numba bwd": numba_backward, "numba fwd": numba_forward}
    if torch is not None:
        tq, tk, tv = (torch.from_numpy(x).requires_grad_() for x in (q, k, v))
        t_out = torch.nn.functional.scaled_dot_product_attention(tq, tk, tv, is_causal=causal)
        t_dout = torch.from_numpy(dout)

        def torch_backward():
            for x in (tq, tk, tv):
                x.grad = None
            t_out.backward(t_dout, retain_graph=True)

        calls["torch bwd"] = torch_backward
    samples = {name: [] for name in calls}
    for fn in calls.values():  # warm-up (compilation)
        fn()
    names = list(calls)
    for r in range(rounds):  # interleaved, order rotated each round
        for name in names[r % len(names):] + names[:r % len(names)]:
            gc.collect()
            time.sleep(0.05)  # let the BLAS/OpenMP spinning threads settle
            t0 = time.perf_counter()
            calls[name]()
            samples[name].append(time.perf_counter() - t0)
    return {name: (np.median(s) * 1e3, (np.percentile(s, 75) - np.percentile(s, 25)) * 1e3)
            for name, s in samples.items()}


def extra_memory(L, causal=False):
    """Peak bytes one backward call allocates beyond its three gradients (tracemalloc)."""
    q, k, v, dout = inputs(L)
    out, lse = kernels.attention(q, k, v, causal=causal, return_lse=True, backend="numba")
    small = inputs(256)
    kernels.attention_backward(*small, out=np.zeros_like(small[0]),
                               lse=np.zeros(small[0].shape[:-1], np.float32))  # compile
    gc.collect()
    tracemalloc.start()
    grads = kernels.attention_backward(q, k, v, dout, out=out, lse=lse, causal=causal,
                                       backend="numba")
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return peak - sum(g.nbytes for g in grads)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--L", type=int, nargs="+", default=[1024, 2048, 4096])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--memory-L", type=int, default=16384)
    args = parser.parse_args(argv)
    threads = numba.get_num_threads()
    if torch is not None:
        torch.set_num_threads(threads)
    print(f"load average before: {loadavg()}; {os.cpu_count()} cores, {threads} threads "
          f"(numba {numba.__version__}, layer set on first launch; torch "
          f"{torch.__version__ if torch else 'missing'})")
    print("B=1, H=12, D=64, float32; medians of interleaved rounds, IQR in brackets\n")
    print("| L | causal | numba bwd ms | torch bwd ms | numba fwd ms | numba/torch (bwd) "
          "| bwd/fwd (numba) |")
    print("|---|---|---|---|---|---|---|")
    results = {}
    for L in args.L:
        for causal in (False, True):
            r = bench_shape(L, causal, args.rounds)
            results[L, causal] = r
            nb, nb_iqr = r["numba bwd"]
            nf, nf_iqr = r["numba fwd"]
            tb, tb_iqr = r.get("torch bwd", (float("nan"), float("nan")))
            print(f"| {L} | {'yes' if causal else ''} | {nb:.1f} ({nb_iqr:.1f}) | "
                  f"{tb:.1f} ({tb_iqr:.1f}) | {nf:.1f} ({nf_iqr:.1f}) | {nb / tb:.2f} | "
                  f"{nb / nf:.2f} |", flush=True)
    print()
    for L in args.L:
        if (L, False) in results and (L, True) in results:
            speedup = results[L, False]["numba bwd"][0] / results[L, True]["numba bwd"][0]
            print(f"causal speed-up of the numba backward at L={L}: {speedup:.2f}x")
    if args.memory_L:
        mib = extra_memory(args.memory_L) / 2**20
        print(f"extra memory of one numba backward at L={args.memory_L} (out and lse passed "
              f"in, gradients excluded, tracemalloc): {mib:.1f} MiB")
    print(f"load average after: {loadavg()}")


if __name__ == "__main__":
    main()
