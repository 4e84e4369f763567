"""Packed (varlen) calls with mods, an older commit against this checkout, in alternating
processes: the median time of each, forward and backward, and the paired new/old ratios.

    python scripts/varlen_ab.py --old fdb17f0 [--pairs 6] [--reps 7]

The older commit is checked out in a temporary git worktree (removed at the end); each
process imports one checkout's ``kernels`` (with its own Numba cache folder, warmed by a
first untimed process per side), times ``--reps`` calls of each case after a warm-up and
prints their medians; the two sides alternate ``--pairs`` times, so that a slow minute of a
shared machine lands on both.  A change of the kernels' internals that an in-process A/B
cannot hold (the old and new block functions differ in signature) is timed this way.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]

#: The timed process: one checkout's kernels on packed sequences of 2048 ... 64 tokens.
CHILD = r"""
import json, sys, time
import numpy as np
from attnbench import kernels
H, D, reps = 8, 64, int(sys.argv[1])
rng = np.random.default_rng(0)
cu = np.concatenate([[0], np.cumsum([2048, 1024, 512, 256, 128, 64])]).astype(np.int64)
q = rng.standard_normal((cu[-1], H, D)).astype(np.float32)
cases = {
    "softcap causal": dict(score_mod=kernels.mods.softcap(30.0), causal=True),
    "alibi + window": dict(score_mod=kernels.mods.alibi(np.linspace(0.1, 0.4, H)),
                           mask_mod=kernels.mods.sliding_window(256)),
    "dropout": dict(dropout_p=0.1, seed=3),
}
result = {}
for name, kw in cases.items():
    out, lse = kernels.attention_varlen(q, q, q, cu, cu, return_lse=True, **kw)
    dout = np.ones_like(out)
    kernels.attention_varlen_backward(q, q, q, dout, cu, cu, out=out, lse=lse, **kw)
    fwd, bwd = [], []
    for _ in range(reps):
        t = time.perf_counter()
        kernels.attention_varlen(q, q, q, cu, cu, **kw)
        fwd.append(time.perf_counter() - t)
        t = time.perf_counter()
        kernels.attention_varlen_backward(q, q, q, dout, cu, cu, out=out, lse=lse, **kw)
        bwd.append(time.perf_counter() - t)
    result[name + " forward"] = float(np.median(fwd))
    result[name + " backward"] = float(np.median(bwd))
print(json.dumps(result))
"""


def _run(checkout: Path, cache: Path, reps: int) -> dict:
    env = dict(os.environ, PYTHONPATH=str(checkout), NUMBA_CACHE_DIR=str(cache))
    done = subprocess.run([sys.executable, "-c", CHILD, str(reps)], env=env, cwd=checkout,
                          capture_output=True, text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--old", required=True, help="the older commit (any git revision)")
    parser.add_argument("--pairs", type=int, default=6, help="alternations (default 6)")
    parser.add_argument("--reps", type=int, default=7, help="timed calls per case (default 7)")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        old = Path(tmp) / "old"
        subprocess.run(["git", "worktree", "add", "--detach", "-q", str(old), args.old],
                       cwd=REPO, check=True)
        try:
            sides = {"old": (old, Path(tmp) / "cache-old"), "new": (REPO, Path(tmp) / "cache-new")}
            for checkout, cache in sides.values():  # compile, untimed
                _run(checkout, cache, 1)
            times = {"old": [], "new": []}
            for _ in range(args.pairs):
                for side, (checkout, cache) in sides.items():
                    times[side].append(_run(checkout, cache, args.reps))
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", str(old)], cwd=REPO,
                           check=False)
    print(f"{'case':26s} {'old ms':>8s} {'new ms':>8s}  paired new/old (sorted)")
    for case in times["old"][0]:
        o = np.array([t[case] for t in times["old"]])
        n = np.array([t[case] for t in times["new"]])
        ratios = " ".join(f"{r:.2f}" for r in np.sort(n / o))
        print(f"{case:26s} {1e3 * np.median(o):8.2f} {1e3 * np.median(n):8.2f}  {ratios}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
