"""The ``compare`` command: two result folders, ratios with intervals, a CI exit status.

:func:`add_compare` declares the arguments; :func:`compare_command` compares the folders
(:func:`attnbench.compare.compare_folders`, where the ratios, their intervals and the
rule that calls a change a regression live), prints one line per point, the regressions
first, and exits 1 when a point regressed, so that a CI job can fail on it.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pandas as pd

from attnbench.compare import compare_folders

__all__ = ["add_compare", "compare_command", "format_table"]


def add_compare(subparsers) -> None:
    parser = subparsers.add_parser(
        "compare", help="compare two result folders: ratios with intervals, CI exit status",
        description=(
            "Compare the sweeps of two result folders (two commits, two machines, before and "
            "after): for every point measured in both, the ratio of the medians B / A with a "
            "95%% bootstrap interval over the samples, and whether the change is significant "
            "(the whole interval on one side of 1). Writes OUT/compare.csv and compare.png. "
            "Exit status: 0, 1 if a point regressed (the whole interval above 1 + "
            "THRESHOLD), 2 if a folder holds no sweep or the two share no point."),
    )
    parser.add_argument("before", metavar="A", type=Path, help="the baseline results folder")
    parser.add_argument("after", metavar="B", type=Path, help="the results folder to judge")
    parser.add_argument("--threshold", type=float, default=0.10,
                        help="relative slow-down a significant change must exceed to be a "
                             "regression (default: %(default)s)")
    parser.add_argument("--quantity", choices=("time", "cpu"), default="time",
                        help="wall-clock time or process CPU time (default: %(default)s)")
    parser.add_argument("--out", type=Path,
                        help="where to write compare.csv and compare.png (default: B/compare)")
    parser.set_defaults(handler=compare_command)


def format_table(table: pd.DataFrame) -> str:
    """The comparison as fixed-width text, the regressions first."""
    order = {"regression": 0, "slower": 1, "improvement": 2, "faster": 3}
    shown = table.assign(_order=table["change"].map(order).fillna(9)).sort_values("_order")
    lines = []
    for r in shown.itertuples():
        interval = ("" if not np.isfinite(r.ratio_low)
                    else f" [{r.ratio_low:.3f}, {r.ratio_high:.3f}]")
        lines.append(f"{r.backend:<10} L={r.L:<5} d_k={r.d_k:<4} H={r.heads:<3} "
                     f"B={r.batch:<3} {r.mask:<8} {r.dtype:<8} {r.before_ms:10.4g} ms → "
                     f"{r.after_ms:10.4g} ms  ×{r.ratio:.3f}{interval}  {r.change}")
    return "\n".join(lines)


def compare_command(args) -> int:
    """``attnbench compare A B``: print the comparison, write its files, return the status."""
    out = args.out if args.out is not None else args.after / "compare"
    try:
        table, note = compare_folders(args.before, args.after, threshold=args.threshold,
                                      quantity=args.quantity, out=out)
    except (FileNotFoundError, ValueError) as exc:
        print(f"attnbench compare: {exc}", file=sys.stderr)
        return 2
    if table.empty:
        print("attnbench compare: the two folders share no point measured ok in both",
              file=sys.stderr)
        return 2
    print(format_table(table))
    counts = table["change"].value_counts()
    print(f"\n{len(table)} points: " + ", ".join(f"{int(n)} {change}"
                                              for change, n in counts.items())
          + f" (B / A, {args.quantity}; regression: the whole 95% interval above "
            f"1 + {args.threshold:g}). Wrote {out / 'compare.csv'}.")
    if note:
        print(note)
    return 1 if table["regressed"].any() else 0
