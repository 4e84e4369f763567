"""``attnbench compare A B``: two result folders → ratios with intervals and a CI exit status.

In the manner of ``asv compare`` and ``pyperf compare_to``: every point measured in both
folders (same backend, L, d_k, heads, kv_heads, batch, mask and dtype, status ok in both)
gets the ratio of its medians, B over A (above 1: B is slower), with a 95% bootstrap
interval over the two sets of samples (:func:`attnbench.measure.intervals.ratio_interval`).
A change is *significant* when the whole interval is on one side of 1; it is a
*regression* when the whole interval lies above ``1 + threshold`` (an *improvement* when
wholly below ``1 / (1 + threshold)``).  The threshold absorbs what the samples of one run
cannot show: the run-to-run variation of a machine (another boot, another neighbour),
which asv too leaves to a factor.  The exit status is 1 when any point regressed, so a CI
job can fail on it; 0 otherwise; 2 when a folder holds no sweep or the two share no point.

Rows without samples (sweeps older than the samples columns) get the ratio of the medians
and no interval, and are never called significant.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from attnbench.measure.intervals import parse_samples, ratio_interval
from attnbench.measure.machine import busy_machine
from attnbench.studies.scaling import with_parameters
from attnbench.sweep.files import load_results

__all__ = ["THRESHOLD", "compare_folders", "compare_tables", "plot_ratios"]

#: Point parameters a comparison joins on.
KEYS = ["backend", "L", "d_k", "heads", "kv_heads", "batch", "mask", "dtype", "direction",
        "variant", "kind"]
#: Default relative slow-down a significant change must exceed to count as a regression.
THRESHOLD = 0.10
#: Quantity -> (samples column, median column) of a sweep table.
QUANTITIES = {"time": ("samples_ms", "median_ms"), "cpu": ("cpu_samples_ms", "cpu_median_ms")}


def compare_tables(before: pd.DataFrame, after: pd.DataFrame, *, threshold: float = THRESHOLD,
                   quantity: str = "time") -> pd.DataFrame:
    """One row per point measured in both tables: the ratio after / before and its verdict.

    Parameters
    ----------
    before, after : pandas.DataFrame
        Sweep tables (:func:`attnbench.sweep.files.load_results`).
    threshold : float, default THRESHOLD
        Relative change a significant difference must exceed to be a regression or an
        improvement.
    quantity : {"time", "cpu"}, default "time"
        Wall-clock time or the process's CPU time.

    Returns
    -------
    pandas.DataFrame
        The point keys, ``before_ms``, ``after_ms``, ``ratio``, ``ratio_low``,
        ``ratio_high``, ``change`` (one of regression, improvement, slower, faster, same,
        no interval) and ``regressed`` (bool).
    """
    if quantity not in QUANTITIES:
        raise ValueError(f"quantity {quantity!r}; expected one of {', '.join(QUANTITIES)}")
    samples, median = QUANTITIES[quantity]
    columns = [c for c in (samples, median) if c in before and c in after]
    if median not in columns:
        raise ValueError(f"both tables need a {median} column to compare {quantity}")
    ok_before = with_parameters(before[before["status"] == "ok"])[KEYS + columns]
    ok_after = with_parameters(after[after["status"] == "ok"])[KEYS + columns]
    joined = ok_before.merge(ok_after, on=KEYS, suffixes=("_before", "_after"))
    rows = []
    for row in joined.to_dict(orient="records"):
        a = parse_samples(row.get(f"{samples}_before"))
        b = parse_samples(row.get(f"{samples}_after"))
        if a.size and b.size:
            ratio, low, high = ratio_interval(b, a)
        else:
            ratio, low, high = row[f"{median}_after"] / row[f"{median}_before"], math.nan, math.nan
        rows.append({**{key: row[key] for key in KEYS},
                     "before_ms": row[f"{median}_before"], "after_ms": row[f"{median}_after"],
                     "ratio": ratio, "ratio_low": low, "ratio_high": high,
                     "change": classify(low, high, threshold)})
    table = pd.DataFrame(rows, columns=KEYS + ["before_ms", "after_ms", "ratio", "ratio_low",
                                               "ratio_high", "change"])
    table["regressed"] = table["change"] == "regression"
    return table


def classify(low: float, high: float, threshold: float) -> str:
    """The change an interval of the ratio after / before shows (see the module docstring)."""
    if not (np.isfinite(low) and np.isfinite(high)):
        return "no interval"
    if low > 1 + threshold:
        return "regression"
    if high < 1 / (1 + threshold):
        return "improvement"
    if low > 1:
        return "slower"  # significant, within the threshold
    if high < 1:
        return "faster"
    return "same"


def plot_ratios(table: pd.DataFrame, threshold: float = THRESHOLD) -> Figure:
    """The ratios with their intervals, one point per row, log scale, threshold lines."""
    fig = Figure(figsize=(max(6.0, 0.28 * len(table) + 2), 4.2), layout="constrained")
    ax = fig.subplots()
    x = np.arange(len(table))
    ratio = table["ratio"].to_numpy(float)
    low = np.nan_to_num(ratio - table["ratio_low"].to_numpy(float))
    high = np.nan_to_num(table["ratio_high"].to_numpy(float) - ratio)
    colours = table["change"].map({"regression": "tab:red", "improvement": "tab:green"})
    ax.errorbar(x, ratio, yerr=np.vstack([low, high]), fmt="none", ecolor="grey")
    ax.scatter(x, ratio, c=colours.fillna("tab:blue").tolist(), zorder=3)
    for level, style in ((1, "-"), (1 + threshold, "--"), (1 / (1 + threshold), "--")):
        ax.axhline(level, color="black", linestyle=style, linewidth=0.8)
    labels = [f"{r.backend} L={r.L} d={r.d_k} H={r.heads} B={r.batch} {r.mask}"
              for r in table.itertuples()]
    ax.set_xticks(x, labels, rotation=90, fontsize="x-small")
    ax.set(yscale="log", ylabel="time B / time A (95% interval)",
           title="B against A: above 1 is slower; red: regression beyond the threshold")
    return fig


def compare_folders(before: Path, after: Path, *, threshold: float = THRESHOLD,
                    quantity: str = "time", out: Path | None = None) -> tuple[pd.DataFrame, str]:
    """Load two result folders, compare them, write ``compare.csv`` and ``compare.png``.

    Parameters
    ----------
    before, after : Path
        Result folders of ``attnbench sweep`` or ``attnbench run`` (A and B).
    threshold : float, default THRESHOLD
        As :func:`compare_tables`: a regression when the whole 95% interval of a ratio
        lies above ``1 + threshold``, an improvement when wholly below
        ``1 / (1 + threshold)``.
    quantity : {"time", "cpu"}
        Wall-clock or CPU time.
    out : Path, optional
        Where ``compare.csv`` and ``compare.png`` go (nothing is written without it).

    Returns
    -------
    (table, note) : the comparison and a line on the machines (empty if they match).
    """
    table_before, meta_before = load_results(before)
    table_after, meta_after = load_results(after)
    table = compare_tables(table_before, table_after, threshold=threshold, quantity=quantity)
    note = _machines_note(meta_before, meta_after)
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        table.to_csv(out / "compare.csv", index=False)
        if len(table):
            plot_ratios(table, threshold).savefig(out / "compare.png", dpi=110)
    return table, note


def _machines_note(meta_before: dict, meta_after: dict) -> str:
    """Lines on what else than the code differs: the machine, or a busy machine."""
    notes = []
    cpu = [(meta.get("machine") or {}).get("cpu_model") for meta in (meta_before, meta_after)]
    if cpu[0] and cpu[1] and cpu[0] != cpu[1]:
        notes.append(f"Note: different machines ({cpu[0]} / {cpu[1]}): the ratios compare "
                     "the machines as much as the code.")
    for name, meta in (("A", meta_before), ("B", meta_after)):
        loads = [meta.get(f"load_average_1m_{when}") for when in ("start", "end")]
        machine = meta.get("machine") or {}
        cores = machine.get("usable_cores") or machine.get("logical_cores")
        loads = [load for load in loads if load is not None]
        if loads and busy_machine(max(loads), cores):  # measure.machine.BUSY_LOAD_PER_CORE
            notes.append(f"Note: {name} was measured on a busy machine (1-min load up to "
                         f"{max(loads):.1f} on {cores} cores): its times include waiting "
                         "for cores other processes held.")
    return "\n".join(notes)
