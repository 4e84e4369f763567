"""The speed targets of score and mask functions, measured side by side.

    python scripts/bench_mods.py [--rounds 5] [--quick] [--threads N]

float32, B=1, H=12, D=64, numba backend.  Each comparison times its calls in interleaved
rounds (the order rotates from round to round), after one warm-up call each (which
compiles), and reports medians with the interquartile range and the ratio of medians.
Targets:

- sliding window (left = 256, causal) at L = 16384: >= 16x faster than causal alone;
  and time against L·W over a small (L, W) grid (a power-law fit: exponent 1 = O(L·W));
- 8 equal documents at L = 8192, non-causal: >= 6x faster than the plain call;
- ALiBi or softcap, non-causal, L = 4096: <= 1.3x the plain call;
- the backward pass (out and lse passed in) with the window (left = 256, causal) at
  L = 8192 against the causal backward alone (``--backward-only`` runs just this one).

Also the cost of ``kernels.mods.block_mask`` for the window and the documents.  Prints
Markdown tables and the load average before and after.  On a busy shared machine,
``--threads 1 --clock process`` times CPU time instead of wall time (the ratios of a
single-threaded kernel are what the targets compare).
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import kernels  # noqa: E402
from attnbench.measure.timing import measure  # noqa: E402
from kernels import mods  # noqa: E402


def loadavg() -> str:
    try:
        with open("/proc/loadavg") as f:
            return " ".join(f.read().split()[:3])
    except OSError:
        return "n/a"


def inputs(L: int, H: int = 12, D: int = 64, seed: int = 0):
    rng = np.random.default_rng(seed)
    return tuple(rng.standard_normal((1, H, L, D), dtype=np.float32) for _ in range(3))


CLOCK = time.perf_counter


def interleaved(calls: dict, rounds: int) -> dict:
    """Samples (seconds) per call name: one warm-up each, then rounds in rotating order."""
    for fn in calls.values():
        fn()  # compiles
    names = list(calls)
    samples = {name: [] for name in names}
    for r in range(rounds):
        for name in names[r % len(names):] + names[:r % len(names)]:
            samples[name].append(
                measure(calls[name], warmup=0, repeat=1, number=1, clock=CLOCK).median)
            time.sleep(0.05)  # let the BLAS's and OpenMP's spinning threads settle
    return samples


def stats(xs) -> tuple[float, float]:
    """(median, interquartile range) in ms."""
    q1, med, q3 = np.percentile(np.asarray(xs) * 1e3, [25, 50, 75])
    return med, q3 - q1


def row(name: str, xs) -> str:
    med, iqr = stats(xs)
    return f"| {name} | {med:.1f} ({iqr:.1f}) | {len(xs)} |"


def compare(title, calls, rounds, ratio_of, goal, rows):
    samples = interleaved(calls, rounds)
    print(f"\n### {title}\n\n| call | median ms (IQR) | rounds |\n|---|---|---|")
    for name, xs in samples.items():
        print(row(name, xs))
    num, den = ratio_of
    ratio = np.median(samples[num]) / np.median(samples[den])
    # the spread of the ratio: over every pair of rounds (same round, side by side)
    per_round = np.asarray(samples[num]) / np.asarray(samples[den])
    rows.append((title, ratio, np.percentile(per_round, 25), np.percentile(per_round, 75),
                 goal))
    return samples


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--quick", action="store_true", help="L / 4 everywhere (a smoke run)")
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--clock", choices=["wall", "process"], default="wall",
                        help="process: CPU time of this process (all its threads), which a "
                             "busy shared machine disturbs less than wall time; use it with "
                             "--threads 1 (idle OpenMP threads spin)")
    parser.add_argument("--backward-only", action="store_true",
                        help="only the backward comparison (window + causal vs causal)")
    args = parser.parse_args(argv)
    global CLOCK
    CLOCK = time.process_time if args.clock == "process" else time.perf_counter
    if args.threads:
        import numba

        numba.set_num_threads(args.threads)
    div = 4 if args.quick else 1
    import numba

    print(f"load average before: {loadavg()}; cores: {os.cpu_count()}; numba threads: "
          f"{numba.get_num_threads()}; clock: {args.clock}")
    rows = []
    backward_window(8192 // div, args.rounds, rows)
    if args.backward_only:
        print_targets(rows)
        return

    # 1. sliding window, causal, L = 16384
    L = 16384 // div
    q, k, v = inputs(L)
    window = mods.sliding_window(256)
    compare(f"sliding window left=256 causal, L={L}", {
        "causal": lambda: kernels.attention(q, k, v, causal=True, backend="numba"),
        "causal + window": lambda: kernels.attention(q, k, v, causal=True, mask_mod=window,
                                                     backend="numba"),
    }, args.rounds, ("causal", "causal + window"), ">= 16 (speed-up)", rows)

    # time against L·W
    grid = [(Lx // div, W) for Lx in (4096, 8192, 16384) for W in (128, 256, 512)]
    fit_calls = {}
    data = {}
    for Lx, W in grid:
        qx, kx, vx = inputs(Lx)
        data[(Lx, W)] = (qx, kx, vx, mods.sliding_window(W))
        fit_calls[f"L={Lx} W={W}"] = (lambda qx=qx, kx=kx, vx=vx, w=data[(Lx, W)][3]:
                                      kernels.attention(qx, kx, vx, causal=True, mask_mod=w,
                                                        backend="numba"))
    samples = interleaved(fit_calls, max(3, args.rounds - 2))
    print("\n### window time against L·W (causal)\n\n| L | W | median ms (IQR) | ns per "
          "query·key (W+1) |\n|---|---|---|---|")
    xs, ys = [], []
    for (Lx, W), name in zip(grid, fit_calls, strict=True):
        med, iqr = stats(samples[name])
        print(f"| {Lx} | {W} | {med:.1f} ({iqr:.1f}) | {med * 1e6 / (12 * Lx * (W + 1)):.3f} |")
        xs.append(np.log(Lx * (W + 1)))
        ys.append(np.log(med))
    slope = np.polyfit(xs, ys, 1)[0]
    boot = []
    rng = np.random.default_rng(0)
    all_samples = [np.asarray(samples[n]) for n in fit_calls]
    for _ in range(1000):
        yb = [np.log(np.median(rng.choice(s, size=len(s)))) for s in all_samples]
        boot.append(np.polyfit(xs, yb, 1)[0])
    lo, hi = np.percentile(boot, [2.5, 97.5])
    print(f"\ntime ∝ (L·W)^{slope:.2f} (95% bootstrap interval {lo:.2f} .. {hi:.2f})")

    # 2. documents
    L = 8192 // div
    q, k, v = inputs(L)
    doc_ids = np.repeat(np.arange(8), L // 8)[None]
    documents = mods.document(doc_ids)
    compare(f"8 equal documents, non-causal, L={L}", {
        "plain": lambda: kernels.attention(q, k, v, backend="numba"),
        "documents": lambda: kernels.attention(q, k, v, mask_mod=documents, backend="numba"),
    }, args.rounds, ("plain", "documents"), ">= 6 (speed-up)", rows)

    # 3. score functions
    L = 4096 // div
    q, k, v = inputs(L)
    slopes = 2.0 ** (-8.0 * np.arange(1, 13) / 12)
    alibi, cap = mods.alibi(slopes), mods.softcap(30.0)
    samples = compare(f"score functions, non-causal, L={L}", {
        "plain": lambda: kernels.attention(q, k, v, backend="numba"),
        "alibi": lambda: kernels.attention(q, k, v, score_mod=alibi, backend="numba"),
        "softcap": lambda: kernels.attention(q, k, v, score_mod=cap, backend="numba"),
    }, args.rounds, ("alibi", "plain"), "<= 1.3 (time ratio)", rows)
    ratio = np.median(samples["softcap"]) / np.median(samples["plain"])
    per_round = np.asarray(samples["softcap"]) / np.asarray(samples["plain"])
    rows.append((f"softcap / plain, L={L}", ratio, *np.percentile(per_round, [25, 75]),
                 "<= 1.3 (time ratio)"))
    rows[-2] = (f"alibi / plain, L={L}",) + rows[-2][1:]

    # block masks: the classification's own cost
    print("\n### block_mask cost (computed once, reused)\n\n| mask | B, H | cells | seconds "
          "|\n|---|---|---|---|")
    for name, mod, Lx in [("window 256", window, 16384 // div), ("8 documents", documents,
                                                                 8192 // div)]:
        mods.block_mask(mod, 1, None, Lx, Lx)  # compiles
        bm = mods.block_mask(mod, 1, None, Lx, Lx)
        print(f"| {name} | 1, None | {bm.table.size} | {bm.seconds:.4f} |")

    print_targets(rows)


def backward_window(L: int, rounds: int, rows: list) -> None:
    """The backward with a window (left = 256) and causal against causal alone, out and
    lse from each call's own forward (not timed)."""
    q, k, v = inputs(L)
    dout = inputs(L, seed=1)[0]
    window = mods.sliding_window(256)
    forward = {name: kernels.attention(q, k, v, causal=True, backend="numba",
                                       return_lse=True, **kw)
               for name, kw in (("causal", {}), ("window", {"mask_mod": window}))}

    def backward(name, **kw):
        out, lse = forward[name]
        return kernels.attention_backward(q, k, v, dout, out=out, lse=lse, causal=True,
                                          backend="numba", **kw)

    compare(f"backward: sliding window left=256 causal, L={L}", {
        "causal backward": lambda: backward("causal"),
        "causal + window backward": lambda: backward("window", mask_mod=window),
    }, rounds, ("causal backward", "causal + window backward"), "speed-up", rows)


def print_targets(rows: list) -> None:
    print("\n### targets\n\n| target | measured (ratio of medians) | per-round IQR | goal |\n"
          "|---|---|---|---|")
    for title, ratio, lo, hi, goal in rows:
        print(f"| {title} | {ratio:.2f} | {lo:.2f} .. {hi:.2f} | {goal} |")
    print(f"\nload average after: {loadavg()}")


if __name__ == "__main__":
    main()
