"""Interleaved A/B of the numba forward tile kernel: this tree's (one kernel, mod arguments
possibly None) against the two kernels of an earlier commit (default e8957ce: the plain
``numba_cpu._attend_block`` and ``_numba_mods._attend_block_mods``).

The old package is extracted with ``git archive`` into a temporary folder and imported
under another name (``kernels_old``), so both run in one process on the same inputs.  Each
round times old and new once each (order alternating), with a settle pause before every
call; the result per configuration is the median of the per-round ratios new / old and
its distribution-free 95% interval (:func:`kernels.stats.median_interval`).  The tile
path is timed (``micro=False``), or with ``--micro`` the micro-kernel path (``micro=True``:
the planned register block, else the dtype's default).

    python scripts/ab_forward.py                      # L = 1024, 2048, 4096, causal and not
    python scripts/ab_forward.py --rounds 21 --mods   # and the mods variants at L = 2048
    python scripts/ab_forward.py --commit f2c4ac7 --micro   # the micro-kernel path
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numba
import numpy as np

from attnbench import kernels
from attnbench.kernels.numba_cpu import choose
from attnbench.kernels.stats import median_interval

REPO = Path(__file__).resolve().parent.parent


def import_old(commit: str, where: Path):
    """The ``kernels`` package of ``commit``, imported as ``kernels_old``."""
    archive = subprocess.run(["git", "-C", str(REPO), "archive", commit, "kernels"],
                             check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(where)], input=archive, check=True)
    root = where / "kernels"
    spec = importlib.util.spec_from_file_location(
        "kernels_old", root / "__init__.py", submodule_search_locations=[str(root)])
    module = importlib.util.module_from_spec(spec)
    sys.modules["kernels_old"] = module
    spec.loader.exec_module(module)
    return module


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def configurations(args):
    """(label, keywords) of each timed call."""
    for L in args.lengths:
        for causal in (False, True):
            yield f"L={L} {'causal' if causal else 'full'}", L, dict(causal=causal)
    if args.mods:
        L = 2048
        yield f"L={L} window(256)+causal", L, dict(causal=True,
                                                  mask_mod=("sliding_window", 256))
        yield f"L={L} softcap(30)", L, dict(score_mod=("softcap", 30.0))
        yield f"L={L} alibi", L, dict(score_mod=("alibi", None))


def resolve_mods(package, keywords, H):
    out = dict(keywords)
    for name in ("mask_mod", "score_mod"):
        if name in out:
            fn, arg = out[name]
            arg = [2.0 ** -(h + 1) for h in range(H)] if fn == "alibi" else arg
            out[name] = getattr(package.mods, fn)(arg)
    return out


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--commit", default="e8957ce")
    parser.add_argument("--lengths", type=int, nargs="+", default=[1024, 2048, 4096])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--pause", type=float, default=0.2, help="settle pause (s)")
    parser.add_argument("--mods", action="store_true", help="also the mods variants")
    parser.add_argument("--micro", action="store_true",
                        help="time the micro-kernel path instead of the tiles")
    args = parser.parse_args(argv)
    numba.set_num_threads(args.threads)
    B, H, D = 1, 12, 64
    with tempfile.TemporaryDirectory() as tmp:
        old = import_old(args.commit, Path(tmp))
        from kernels_old import numba_cpu as old_numba  # noqa: E402 (imported just above)

        if not hasattr(old_numba, "run"):  # commits since the kernels/ redesign
            from kernels_old.numba_cpu import choose as old_numba

        print(f"machine: {cpu_model()}, {os.cpu_count()} CPUs, numba threads {args.threads}")
        print(f"load average before: {os.getloadavg()}")
        path = "micro-kernel" if args.micro else "tile"
        print(f"shape B={B} H={H} D={D} float32, {path} path, {args.rounds} rounds, "
              f"pause {args.pause} s")
        print(f"{'call':28s} {'old ms':>8s} {'new ms':>8s} {'new/old':>8s}  95% interval")
        rng = np.random.default_rng(0)
        for label, L, keywords in configurations(args):
            q, k, v = (rng.standard_normal((B, H, L, D)).astype(np.float32)
                       for _ in range(3))
            new_problem = kernels.prepare(q, k, v, **resolve_mods(kernels, keywords, H))
            old_problem = old.prepare(q, k, v, **resolve_mods(old, keywords, H))
            calls = {
                "old": lambda p=old_problem: old_numba.run(p, micro=args.micro),
                "new": lambda p=new_problem: choose.run(p, micro=args.micro),
            }
            for call in calls.values():  # compile and warm up
                call()
                call()
            times = {"old": [], "new": []}
            for r in range(args.rounds):
                order = ("old", "new") if r % 2 == 0 else ("new", "old")
                for name in order:
                    time.sleep(args.pause)
                    start = time.perf_counter()
                    calls[name]()
                    times[name].append(time.perf_counter() - start)
            ratios = [n / o for n, o in zip(times["new"], times["old"], strict=True)]
            ratio, low, high = median_interval(ratios)
            print(f"{label:28s} {1e3 * np.median(times['old']):8.1f} "
                  f"{1e3 * np.median(times['new']):8.1f} {ratio:8.3f}  [{low:.3f}, {high:.3f}]",
                  flush=True)
        print(f"load average after: {os.getloadavg()}")


if __name__ == "__main__":
    main()
