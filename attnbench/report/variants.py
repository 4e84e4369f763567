"""The report's parts about the backward pass and the attention variants of a sweep.

- :func:`split_directions`: a sweep table (and its fits) cut into the plain forward
  series and the backward series, so that each plot of time or memory against L shows
  one kind of call (their fits are separate series of
  :func:`attnbench.studies.scaling.scaling_table`).
- :func:`backward_figures`: time and memory of the backward pass against L, with their
  fits, for the scaling section.
- :func:`variants_section`: the sliding windows' fit of time against L·W
  (:func:`attnbench.studies.scaling.window_fits`), and the speed-up of block skipping
  against the density of visible pairs (:func:`attnbench.studies.variants.skipping_table`),
  a table and a plot.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from attnbench.report import plots
from attnbench.section import Section
from attnbench.studies.scaling import WINDOW_VARIABLE, with_parameters
from attnbench.studies.scaling_claims import SKIPPING_BACKENDS
from attnbench.studies.variants import skipping_table
from attnbench.sweep.variants import window_size

__all__ = ["backward_figures", "select", "skipping_figure", "split_directions",
           "variants_section"]


def select(table: pd.DataFrame | None, direction: str, variant: str | None = "none",
           kind: str | None = "dense"):
    """Rows of ``table`` of one direction (and variant, and kind of point; None: any);
    tables without the columns are forward, plain, dense."""
    if table is None or table.empty:
        return table
    data = with_parameters(table)
    keep = data["direction"].astype(str) == direction
    if variant is not None:
        keep &= data["variant"].astype(str) == variant
    if kind is not None:
        keep &= data["kind"].astype(str) == kind
    return data[keep]


def split_directions(table: pd.DataFrame, fits: pd.DataFrame | None):
    """``(forward table, forward fits), (backward table, backward fits)``: plain calls only."""
    return tuple((select(table, d), select(fits, d)) for d in ("forward", "backward"))


def backward_figures(table: pd.DataFrame, fits: pd.DataFrame | None) -> list[tuple[str, Figure]]:
    """Time and memory of the backward pass against L with their fits ([] without any)."""
    rows = select(table, "backward")
    if rows is None or rows.empty or not (rows["status"] == "ok").any():
        return []
    fits = select(fits, "backward")
    figures = []
    time = plots.scaling_figure(rows, fits, quantity="time", variable="L", column="median_ms",
                                ylabel="median time per backward call (ms)",
                                title="Backward time against L")
    if time is not None:
        figures.append(("Backward pass (out and lse given; forward not timed): time against "
                        "L, log-log, with the fitted slopes", time))
    memory = plots.memory_vs_length(rows, fits)
    if memory is not None:
        figures.append(("Backward pass: peak extra memory of one call (gradients included) "
                        "minus the smallest call's, against L", memory))
    return figures


#: Series of the L·W figure: every parameter but L and the window.
WINDOW_SERIES_KEYS = ["backend", "d_k", "heads", "kv_heads", "batch", "dtype", "mask"]


def _window_rows(table: pd.DataFrame) -> pd.DataFrame:
    """Forward window points of the backends that skip tiles, with their L·W column."""
    data = select(table, "forward", None)
    width = data["variant"].map(lambda v: window_size(str(v)) if str(v).startswith("window-")
                                else None)
    data = data.assign(W=width)
    data = data[data["W"].notna() & (data["W"] > 0) & data["backend"].isin(SKIPPING_BACKENDS)]
    return data.assign(**{WINDOW_VARIABLE: data["L"] * data["W"]})


def skipping_figure(skips: pd.DataFrame) -> Figure | None:
    """Measured speed-up over the plain call against density, log-log, with the ideal."""
    if skips.empty:
        return None
    fig = Figure(figsize=(6.4, 5.6), layout="constrained")
    ax = fig.subplots()
    for (backend, direction, kind), part in skips.groupby(
            ["backend", "direction", skips["variant"].str.split("-").str[0]], sort=False):
        color = plots._color(backend)
        marker = {"window": "o", "documents": "s"}.get(kind, "D")
        err = None
        if part["speedup_low"].notna().all():
            err = [part["speedup"] - part["speedup_low"], part["speedup_high"] - part["speedup"]]
        ax.errorbar(part["density"], part["speedup"], yerr=err, fmt=marker, color=color,
                    label=f"{backend} {direction} {kind}")
        ax.plot(part["density"], part["ideal_speedup"], marker, mfc="none", color=color,
                alpha=0.6)
    ax.plot([], [], "o", mfc="none", color="gray", label="hollow: ideal (the pair ratio)")
    ax.axhline(1, color="gray", lw=1)
    ax.set(xscale="log", yscale="log", xlabel="density: visible fraction of the L² pairs",
           ylabel="speed-up over the plain call",
           title="Block skipping: speed-up against density")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize="x-small", loc="upper center", bbox_to_anchor=(0.5, -0.15), ncols=2,
              frameon=False)
    return fig


def variants_section(table: pd.DataFrame, fits: pd.DataFrame | None) -> Section | None:
    """The sliding windows' O(L·W) fits and the block-skipping table (None: no variant)."""
    if table is None or table.empty or "variant" not in table:
        return None
    if not (table["variant"].astype(str) != "none").any():
        return None
    skips = skipping_table(table)
    window_fit_rows = (fits[fits["variable"] == WINDOW_VARIABLE] if fits is not None
                       and not fits.empty else pd.DataFrame())
    text = (
        "Variants are kernels.mods functions compiled into the kernel: window-W is "
        "sliding_window(W) (query i sees keys i−W .. i), documents-N is N equal documents "
        "(document), alibi and softcap are score functions. FLOPs count only the pairs a "
        "mask function leaves visible. A sliding window of fixed W costs O(L·W): its time is "
        "fitted against L·W over every L and W of the sweep with the same fit and rule as "
        "the scaling section (expected exponent 1). The kernels walk keys in cells of 64, "
        "so a block of queries also reads the keys of a partial cell past its window: the "
        "work is ∝ L·(W + 64), which bends the exponent below 1 for small W.\n\n"
        "Block skipping: each variant point beside the plain point of the same problem "
        "(same backend, direction, mask and sizes). Density is the fraction of the L² "
        "pairs left visible; the ideal speed-up is the plain call's visible pairs over "
        "the variant's; the speed-up is the ratio of median times (95% bootstrap interval "
        "over the samples); efficiency = speed-up / ideal. The two points were timed at "
        "different moments of the sweep, not interleaved (`attnbench bench --only variants` "
        "measures them side by side).")
    tables, figures = [], []
    if not window_fit_rows.empty:
        columns = [c for c in ("backend", "quantity", "mask", "dtype", "direction", "outcome",
                               "slope", "ci_low", "ci_high", "n_used", "verdict")
                   if c in window_fit_rows]
        tables.append((f"Sliding windows: time against {WINDOW_VARIABLE}",
                       window_fit_rows[columns].reset_index(drop=True)))
        windows = _window_rows(table)
        figure = None if windows.empty else plots.scaling_figure(
            windows, select(window_fit_rows, "forward", None), quantity="time",
            variable=WINDOW_VARIABLE, column="median_ms", ylabel="median time per call (ms)",
            title=f"Sliding windows: time against {WINDOW_VARIABLE}", panel_by=None,
            keys=WINDOW_SERIES_KEYS)
        if figure is not None:
            figures.append((f"Time of the sliding windows against {WINDOW_VARIABLE}, log-log, "
                            "with the fitted law and its 95% band", figure))
    if not skips.empty:
        shown = skips.assign(density=skips["density"].map(lambda d: f"{d:.3g}"))
        tables.append(("Block skipping: each variant against the plain call", shown))
        figure = skipping_figure(skips)
        if figure is not None:
            figures.append(("Speed-up of each variant over the plain call against the "
                            "density of visible pairs (filled: measured, hollow: ideal)",
                            figure))
    elif window_fit_rows.empty:
        text += "\n\nNo variant point has a plain partner or enough L·W values to fit."
    return Section(title="Attention variants and block skipping", anchor="variants",
                   text=text, tables=tables, figures=figures)


def best_skip(skips: pd.DataFrame) -> pd.Series | None:
    """The variant point of largest ideal speed-up (ties: largest L), or None."""
    sparse = skips[np.isfinite(skips["ideal_speedup"])] if not skips.empty else skips
    if sparse.empty:
        return None
    return sparse.sort_values(["ideal_speedup", "L"]).iloc[-1]
