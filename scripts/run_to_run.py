"""How far a timing ratio moves from one run to the next: the evidence for ``RUN_TO_RUN``.

The claims ledger widens a ratio's 95% interval by :data:`attnbench.claims.rules.RUN_TO_RUN`
before a verdict, for the variation the samples of one run cannot show (another process,
another moment, other caches and frequencies).  This script measures that variation for
the ratio the allowance matters most to, C29's (single-thread CPU time of
``kernels.attention`` at L = 512 over L = 192, BERT-base heads), in ``--runs`` fresh
processes one after the other, and prints:

- each run's ratio and its 95% interval;
- the spread of the runs' ratios (max / min − 1);
- how many runs' intervals miss the median of all runs' ratios (the consensus);
- the *needed allowance*: the smallest relative widening that makes every run's interval
  contain the consensus, and the stricter one that makes every run's interval contain
  every other run's ratio.  ``RUN_TO_RUN`` is justified if it is at least the first, and
  generous if it exceeds the second.

Usage::

    .venv/bin/python scripts/run_to_run.py --runs 8

Takes about 10 s per run on 2 cores (more under load).  Nothing here is asserted: it
prints what it measured, with the load average, for the docstring of ``RUN_TO_RUN``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

import numpy as np

CHILD = ("import json; from attnbench.claims.cost import c29; "
         "v = c29().values; print(json.dumps({k: v[k] for k in "
         "('time_ratio', 'time_ratio_low', 'time_ratio_high', 'load_average')}))")


def one_run() -> dict:
    """C29's ratio and interval measured in a fresh process."""
    done = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True,
                          check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def needed_allowance(values, lows, highs) -> float:
    """The smallest ``rel`` with ``low·(1 − rel) <= v <= high·(1 + rel)`` for every run's
    interval ``[low, high]`` and every ``v`` in ``values``."""
    above = [value / high - 1 for value in values for high in highs]  # v above an interval
    below = [1 - value / low for value in values for low in lows]  # v below an interval
    return max(0.0, *above, *below)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=8, help="fresh processes (default 8)")
    args = parser.parse_args(argv)
    runs = []
    for index in range(args.runs):
        runs.append(one_run())
        r = runs[-1]
        print(f"run {index + 1}: ratio {r['time_ratio']:.3f} [{r['time_ratio_low']:.3f}, "
              f"{r['time_ratio_high']:.3f}]  load {r['load_average']:.1f}", flush=True)
    ratios = np.array([r["time_ratio"] for r in runs])
    lows = np.array([r["time_ratio_low"] for r in runs])
    highs = np.array([r["time_ratio_high"] for r in runs])
    consensus = float(np.median(ratios))
    missing = int(np.sum((lows > consensus) | (highs < consensus)))
    half = np.median((highs - lows) / 2 / ratios)
    print(f"\n{args.runs} runs on {os.cpu_count()} cores: ratios {ratios.min():.3f}–"
          f"{ratios.max():.3f} (spread {ratios.max() / ratios.min() - 1:.1%}), median "
          f"{consensus:.3f}; median interval half-width {half:.1%}; {missing} of "
          f"{args.runs} intervals miss the median; needed allowance "
          f"{needed_allowance([consensus], lows, highs):.1%} for the median, "
          f"{needed_allowance(ratios, lows, highs):.1%} for every run's ratio")
    return 0


if __name__ == "__main__":
    sys.exit(main())
