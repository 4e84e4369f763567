"""What ``attnbench run`` and ``attnbench sweep`` print of a sweep, and its exit status.

Both commands end a sweep the same way: the points as a fixed-width table (with the
reason of every skipped point and the fault of every impossible figure below it), one
line per scaling verdict as :mod:`attnbench.studies.scaling_verdicts` decided it (the
report shows the same stored lines), and an exit status that says whether a point failed
or fell outside the tolerance.  Written once here so that the two commands never word a
result differently.
"""

from __future__ import annotations

import sys

import pandas as pd

__all__ = ["CONSOLE_COLUMNS", "EXIT_INTERRUPTED", "format_points", "print_verdicts",
           "status_of_sweep"]

#: Exit status of a command stopped by Ctrl-C (128 + SIGINT), as shells report it.
EXIT_INTERRUPTED = 130

#: Columns printed for each point of a sweep.
CONSOLE_COLUMNS = {
    "backend": "backend", "L": "L", "d_k": "d_k", "heads": "H", "kv_heads": "Hkv",
    "batch": "B", "mask": "mask", "dtype": "dtype", "direction": "dir", "variant": "variant",
    "kind": "kind", "status": "status",
    "median_ms": "median ms", "iqr_ms": "IQR ms", "gflops": "GFLOP/s",
    "pct_of_gemm_peak": "% GEMM", "pct_of_read_bandwidth": "% read BW",
    "peak_mem_mib": "mem MiB", "max_abs_err": "max|err|",
}


def _point_label(row) -> str:
    """``backend L=… mask dtype`` and, when not the default, direction and variant."""
    extra = [str(getattr(row, name, "")) for name in ("direction", "variant", "kind")
             if getattr(row, name, "") not in ("", "forward", "none", "dense")]
    return " ".join([f"{row.backend} L={row.L} {row.mask} {row.dtype}", *extra])


def format_points(table: pd.DataFrame) -> str:
    """The sweep table as fixed-width text (below it: reasons of skipped points, faults)."""
    shown = table.assign(peak_mem_mib=table.get("peak_mem_bytes", float("nan")) / 2**20)
    shown = shown[[c for c in CONSOLE_COLUMNS if c in shown]].rename(columns=CONSOLE_COLUMNS)
    text = shown.to_string(index=False, na_rep="-", float_format=lambda x: f"{x:.3g}")
    not_ok = table[table["status"] != "ok"]
    # a fault's "% GEMM" is left out ("-"): the line below says why
    faults = table[table["fault"].fillna("") != ""] if "fault" in table else table.iloc[:0]
    for rows, column in ((not_ok, "reason"), (faults, "fault")):
        text += "".join(f"\n  {_point_label(row)}: {getattr(row, column)}"
                        for row in rows.itertuples())
    return text


def print_verdicts(fits: pd.DataFrame, file=None) -> None:
    """One line per measured fit (FLOP counts left out: they are not measurements)."""
    file = sys.stdout if file is None else file
    measured = fits[fits["quantity"] != "flops"] if not fits.empty else fits
    if measured.empty:
        print("Scaling: no series varies a parameter over 3 or more values.", file=file)
        return
    print("Scaling (exponent [95% interval]; time: wall clock, cpu: CPU time):", file=file)
    for row in measured.itertuples():
        fixed = " ".join(str(getattr(row, name)) for name in ("backend", "mask", "dtype"))
        fixed += "".join(f" {value}" for value in (getattr(row, "variant", "none"),
                                                    getattr(row, "direction", "forward"),
                                                    getattr(row, "kind", "dense"))
                         if isinstance(value, str) and value not in ("none", "forward", "dense",
                                                                     ""))
        if "group" in measured:  # results of several hosts: say which
            fixed = f"{row.group}: {fixed}"
        print(f"  [{fixed}] {row.verdict}", file=file)


def status_of_sweep(table: pd.DataFrame) -> int:
    """1 if a point failed or is outside the tolerance, else 0 (skipped points are fine)."""
    if table.empty:
        return 0
    outside = table.get("within_tolerance", pd.Series(dtype=object)).astype("boolean")
    return int(bool((table["status"] == "failed").any() or outside.eq(False).any()))
