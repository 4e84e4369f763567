"""The numba decode kernel of an older commit against today's, interleaved in one process,
beside the read-bandwidth probe: decode's targets (docs/guide/decode.md) for both.

    python scripts/decode_ab.py --old 629b084 [--rounds 15] [--threads 2] [--quick]

The old kernel's files (``kernels/numba_cpu/decode.py``, ``decode_products.py``,
``pair_products.py``, ``kernels/_jit/half.py`` and ``kernels/_jit/prefetch.py``, where the
old commit has them) are taken from git (``git show OLD:...``), written beside today's as
``_ab_old_*.py`` with their imports of each other renamed (removed at the end), and run
through the same
:class:`kernels._decode_problem.DecodeProblem`; the rest of ``kernels`` is today's.
Every call of every case is timed in the same interleaved rounds
(``attnbench.measure.timing.interleaved``, a pause after each call); the table gives
medians, GB/s of K and V read (the read bandwidth probe's own GB/s in its row), and new/old
with the 95% bootstrap interval of the ratio of medians.
The bf16 rows time both kernels on bfloat16 caches of the same shape (half the bytes); an
old kernel that refuses half caches (before 1b303da) has no old bf16 row.
"""

from __future__ import annotations

import argparse
import importlib
import subprocess
import sys
from pathlib import Path

import numba
import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from attnbench.bench.decode import random_cache  # noqa: E402
from attnbench.kernels._decode_validate import check_decode_args  # noqa: E402
from attnbench.kernels._dtypes import as_dtype  # noqa: E402
from attnbench.kernels.numba_cpu import decode as new_decode  # noqa: E402
from attnbench.measure.bandwidth import stream_reader  # noqa: E402
from attnbench.measure.intervals import ratio_interval  # noqa: E402
from attnbench.measure.timing import interleaved  # noqa: E402

#: The old kernel's files (each where the old commit has it) and how the others import it.
OLD_FILES = {"kernels/numba_cpu/decode.py": None,
             "kernels/numba_cpu/decode_products.py": ".decode_products",
             "kernels/numba_cpu/pair_products.py": ".pair_products",
             "kernels/_jit/half.py": ".._jit.half",
             "kernels/_jit/prefetch.py": ".._jit.prefetch"}


def _old_copy(path: str) -> Path:
    """Where the old version of ``path`` is written: ``_ab_old_<name>`` beside it."""
    path = REPO / path
    return path.with_name("_ab_old_" + path.name)


def _write_old_kernel(old: str) -> None:
    """The old kernel's files, their imports of each other renamed to the old copies."""
    renames = {f"from {module} import":
               f"from {module.rsplit('.', 1)[0]}.{_old_copy(path).stem} import"
               for path, module in OLD_FILES.items() if module}
    for path in OLD_FILES:
        shown = subprocess.run(["git", "show", f"{old}:{path}"], cwd=REPO,
                               capture_output=True, text=True)
        if shown.returncode:  # the file did not exist then: today's is used
            if path.endswith("decode.py"):
                raise SystemExit(f"{old} has no {path}")
            continue
        source = shown.stdout
        for before, after in renames.items():
            source = source.replace(before, after)
        _old_copy(path).write_text(source)


def _cases(quick: bool):
    """(name, B, H, Hkv, L, page_size): the issue's decode shapes (D = 128, Lq = 1)."""
    L1, LB = (4096, 1024) if quick else (32768, 4096)
    return [("B=1 H=32 Hkv=8", 1, 32, 8, L1, None),
            ("B=8 H=32 Hkv=8", 8, 32, 8, LB, None),
            ("B=1 H=8 Hkv=8", 1, 8, 8, L1, None),
            ("B=1 H=32 Hkv=8 page 16", 1, 32, 8, L1, 16),
            ("B=1 H=32 Hkv=8 page 256", 1, 32, 8, L1, 256)]


def _problem(rng, B, H, Hkv, L, page_size, dtype):
    """A validated decode step on a random cache (``dtype``), and the bytes of K and V it
    reads."""
    k, v, table = random_cache(rng, B, Hkv, L, page_size)
    k, v = k.astype(dtype), v.astype(dtype)
    q = rng.standard_normal((B, H, 1, k.shape[3]), dtype=np.float32).astype(dtype)
    problem = check_decode_args(q, k, v, cache_seqlens=np.full(B, L), block_table=table)[0]
    return problem, problem.key_bytes()


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--old", required=True, help="git revision of the old kernel")
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--settle", type=float, default=0.1)
    parser.add_argument("--quick", action="store_true", help="small caches (a smoke test)")
    args = parser.parse_args(argv)
    if args.threads:
        numba.set_num_threads(args.threads)
    try:
        _write_old_kernel(args.old)
        old_decode = importlib.import_module("attnbench.kernels.numba_cpu._ab_old_decode")
        rng = np.random.default_rng(0)
        read, probe_bytes = stream_reader()
        calls, nbytes = {"probe": read}, {"probe": probe_bytes}
        for name, B, H, Hkv, L, page_size in _cases(args.quick):
            problem, kv_bytes = _problem(rng, B, H, Hkv, L, page_size, np.float32)
            for label, module in (("old", old_decode), ("new", new_decode)):
                calls[f"{name} {label}"] = (lambda m=module, p=problem: m.run(p))
                nbytes[f"{name} {label}"] = kv_bytes
            if page_size is None and B == 1 and H == 32:
                half, half_bytes = _problem(rng, B, H, Hkv, L, None, as_dtype("bfloat16"))
                for label, module in (("old", old_decode), ("new", new_decode)):
                    if label == "old":
                        try:
                            module.run(half)
                        except (TypeError, ValueError, NotImplementedError):
                            continue  # an old kernel without half caches
                    calls[f"{name} bf16 {label}"] = (lambda m=module, p=half: m.run(p))
                    nbytes[f"{name} bf16 {label}"] = half_bytes
        for call in calls.values():
            call()  # compiles
        timings = interleaved(calls, rounds=args.rounds, settle=args.settle)
    finally:
        for path in OLD_FILES:
            _old_copy(path).unlink(missing_ok=True)
    with open("/proc/loadavg") as f:
        load = f.read().split()[0]
    print(f"threads {numba.get_num_threads()}, rounds {args.rounds}, load after {load}, "
          f"old = {args.old}")
    probe_gbs = nbytes["probe"] / np.median(timings["probe"].samples) / 1e9
    print(f"{'call':38s} {'median ms':>10s} {'GB/s':>7s} {'of probe':>8s}")
    for name, timing in timings.items():
        median = float(np.median(timing.samples))
        gbs = nbytes[name] / median / 1e9
        print(f"{name:38s} {median * 1e3:10.2f} {gbs:7.1f} {gbs / probe_gbs:8.2f}")
    print("\nnew / old (95% interval):")
    for name, _, _, _, _, _ in _cases(args.quick):
        ratio, low, high = ratio_interval(timings[f"{name} new"].samples,
                                          timings[f"{name} old"].samples)
        print(f"  {name:34s} {ratio:.2f} [{low:.2f}, {high:.2f}]")
    first = _cases(args.quick)[0][0]
    for label in ("old", "new"):
        ratio, low, high = ratio_interval(timings[f"{first} {label}"].samples,
                                          timings[f"B=1 H=8 Hkv=8 {label}"].samples)
        print(f"  GQA 32/8 over 8/8, {label}: {ratio:.2f} [{low:.2f}, {high:.2f}]")
        for page in (16, 256):
            ratio, low, high = ratio_interval(timings[f"{first} page {page} {label}"].samples,
                                              timings[f"{first} {label}"].samples)
            print(f"  page {page} over contiguous, {label}: {ratio:.2f} [{low:.2f}, {high:.2f}]")
    for label in ("old", "new"):
        if f"{first} bf16 {label}" in timings:
            ratio, low, high = ratio_interval(timings[f"{first} {label}"].samples,
                                              timings[f"{first} bf16 {label}"].samples)
            print(f"  float32 over bfloat16, {label}: {ratio:.2f} [{low:.2f}, {high:.2f}]")
    if f"{first} bf16 old" in timings:
        ratio, low, high = ratio_interval(timings[f"{first} bf16 new"].samples,
                                          timings[f"{first} bf16 old"].samples)
        print(f"  bfloat16 new / old: {ratio:.2f} [{low:.2f}, {high:.2f}]")
    return 0


if __name__ == "__main__":
    sys.exit(main())
