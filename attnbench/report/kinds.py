"""The report's section on decode steps and packed batches (the sweep's ``kind`` axis).

- Decoding (:func:`decode_figure`, :func:`decode_table`): the time of one decode step
  against the cache length Lk, log-log, with its fit (O(Lk) expected,
  :mod:`attnbench.studies.scaling`) and the **bandwidth line**: the time the step's K and
  V bytes take at the read bandwidth the same sweep probed
  (:mod:`attnbench.measure.bandwidth`), the floor of a memory-bound kernel.  The table
  gives each point's rate of reading K and V and its share of the probe.
- Packed batches (:func:`varlen_figure`): the time of a packed batch of sequences L, L/2,
  ... against L, with its fit (O(L²): the longest sequence dominates the work).

The verdicts are those of :func:`attnbench.studies.scaling.scaling_table`, shown as stored.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from attnbench.report import plots
from attnbench.report.variants import select
from attnbench.section import Section

__all__ = ["decode_figure", "decode_table", "kinds_section", "varlen_figure"]

#: Columns of the decode table, and their headings.
DECODE_COLUMNS = {"backend": "backend", "L": "Lk", "batch": "B", "heads": "H",
                  "kv_heads": "Hkv", "d_k": "D", "dtype": "dtype", "median_ms": "median ms",
                  "kv_mib": "K+V MiB", "read_gbs": "K+V GB/s",
                  "pct_of_read_bandwidth": "% of probe"}


def _ok(table: pd.DataFrame | None, kind: str) -> pd.DataFrame:
    rows = select(table, "forward", None, kind) if table is not None else None
    if rows is None or rows.empty:
        return pd.DataFrame()
    return rows[rows["status"] == "ok"]


def decode_figure(table: pd.DataFrame, fits: pd.DataFrame | None,
                  bandwidth_gbs: float | None) -> Figure | None:
    """Decode time against Lk per backend, with fits and the bandwidth line (None without
    decode points)."""
    rows = _ok(table, "decode")
    if rows.empty or rows["L"].nunique() < 2:
        return None
    figure = plots.scaling_figure(rows, select(fits, "forward", None, "decode"),
                                  quantity="time", variable="L", column="median_ms",
                                  ylabel="median time per decode step (ms)",
                                  title="Decode step against the cache length Lk",
                                  panel_by=None)
    if figure is None or not bandwidth_gbs or "bytes_read" not in rows:
        return figure
    ax = figure.axes[0]
    for (batch, kv_heads, d_k), series in rows.groupby(["batch", "kv_heads", "d_k"]):
        series = series.drop_duplicates("L").sort_values("L")
        floor_ms = series["bytes_read"].to_numpy(float) / (bandwidth_gbs * 1e9) * 1e3
        ax.plot(series["L"], floor_ms, "--", color="black", lw=1.2,
                label=f"K and V at the probe's {bandwidth_gbs:.1f} GB/s "
                      f"(B={batch} Hkv={kv_heads} D={d_k})")
    residuals = figure.axes[1]  # the legend sits under the residuals: drawn again with the line
    residuals.legend(*ax.get_legend_handles_labels(), fontsize="x-small", loc="upper center",
                     bbox_to_anchor=(0.5, -0.45), ncols=1, frameon=False)
    return figure


def decode_table(table: pd.DataFrame) -> pd.DataFrame:
    """One line per decode point that ran: its time, K/V bytes, rate and share of the probe."""
    rows = _ok(table, "decode")
    if rows.empty:
        return rows
    rows = rows.assign(kv_mib=rows.get("bytes_read", np.nan) / 2**20)
    return rows[[c for c in DECODE_COLUMNS if c in rows]].rename(columns=DECODE_COLUMNS)


def varlen_figure(table: pd.DataFrame, fits: pd.DataFrame | None) -> Figure | None:
    """Packed-batch time against the longest sequence L, one panel per mask kind."""
    rows = _ok(table, "varlen")
    if rows.empty or rows["L"].nunique() < 2:
        return None
    return plots.scaling_figure(rows, select(fits, "forward", None, "varlen"),
                                quantity="time", variable="L", column="median_ms",
                                ylabel="median time per packed batch (ms)",
                                title="Packed batch of L, L/2, ... against L")


def kinds_section(table: pd.DataFrame, fits: pd.DataFrame | None,
                  meta: dict | None = None) -> Section | None:
    """The decoding and packed-batch section (None when the sweep has neither kind)."""
    if table is None or table.empty or "kind" not in table:
        return None
    kinds = set(table["kind"].astype(str))
    if not kinds & {"decode", "varlen"}:
        return None
    bandwidth = (meta or {}).get("read_bandwidth_gbs")
    text = (
        "Decode points time one step of kernels.attention_with_kvcache: one new query per "
        "sequence (Lq = 1) against a full cache of Lk keys and values, nothing appended. "
        "Each step reads every key and value once, so it is bound by memory bandwidth, "
        "not FLOPs: its yardstick is the read-bandwidth probe taken in the same sweep "
        "(the best of a few streaming reads of 256 MiB on the run's threads), as the GEMM "
        "peak is for prefill. The peers (numpy, torch) run the same step as a dense call "
        "with one query row. Time against Lk is expected O(Lk). "
        "Varlen points time kernels.attention_varlen on a packed batch of B sequences of "
        "lengths L, L/2, L/4, ... (self-attention within each; no padded row or key is "
        "computed), checked against each sequence's own dense oracle; time against L is "
        "expected O(L²)."
    )
    text += (f" Read-bandwidth probe of this sweep: {bandwidth:.1f} GB/s." if bandwidth
             else " This sweep recorded no read-bandwidth probe.")
    figures, tables = [], []
    decode = decode_figure(table, fits, bandwidth)
    if decode is not None:
        figures.append(("Decode step time against the cache length Lk, log-log, with the "
                        "fitted law and, dashed, the time its K and V take at the probed "
                        "read bandwidth", decode))
    shown = decode_table(table)
    if not shown.empty:
        tables.append(("Decode points: K and V read per second, against the probe", shown))
    varlen = varlen_figure(table, fits)
    if varlen is not None:
        figures.append(("Packed batches: time against the longest sequence L, log-log, with "
                        "the fitted law", varlen))
    return Section(title="Decoding and packed batches", anchor="kinds", text=text,
                   tables=tables, figures=figures)
