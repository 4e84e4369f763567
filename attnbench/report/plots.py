"""The report's figures, drawn with matplotlib from sweep tables and fits.

Every function returns a :class:`matplotlib.figure.Figure` made without pyplot (no
global figure registry, no GUI backend: figures render with Agg when saved), or None
when the table holds nothing to draw.

- :func:`time_vs_length`: median time against L, log-log, one panel per mask kind;
  IQR error bars; filled markers are the points the fit used, hollow ones were left
  out (overhead-dominated, see :mod:`attnbench.studies.scaling`); each fitted line is labelled
  with its slope and 95% interval, and a dashed L² guide is drawn through the data.
- :func:`gflops_by_backend`: GFLOP/s against L per backend, with the GEMM peak of the
  same run as a horizontal line.
- :func:`error_by_backend`: max abs error against the oracle per backend, with the
  tolerance of each problem.
- :func:`memory_vs_length`: peak extra memory of one call against L, with fitted slopes.
- the attention heat maps live in :mod:`attnbench.report.heatmaps` (re-exported here).
"""

from __future__ import annotations

import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.ticker import FixedLocator, FuncFormatter, NullLocator

from attnbench.report.heatmaps import (  # noqa: F401  (re-exported)
    SENTENCE,
    attention_heatmaps,
    heatmap_section,
    heatmap_weights,
)
from attnbench.studies.scaling import fit_from_row, fit_mask, memory_growth
from attnbench.studies.scaling_verdicts import exponent_text, interval

__all__ = ["attention_heatmaps", "error_by_backend", "gflops_by_backend", "heatmap_section",
           "heatmap_weights", "memory_vs_length", "time_vs_length"]

#: One colour per backend, the same in every figure.
COLORS = {"numba": "tab:blue", "reference": "tab:red", "numpy": "tab:green",
          "torch": "tab:orange", "cuda": "tab:purple", "torch-cuda": "tab:brown"}
MARKERS = {"none": "o", "causal": "^", "padding": "s", "bool": "D"}
#: Parameters that, besides L, tell one series of a sweep from another.
SERIES_KEYS = ["backend", "d_k", "heads", "kv_heads", "batch", "dtype"]


def _color(backend: str) -> str:
    return COLORS.get(backend, "tab:gray")


def _ok(table: pd.DataFrame) -> pd.DataFrame:
    return table[table["status"] == "ok"]


def _length_series(table: pd.DataFrame, keys):
    """Groups of ``table`` by ``keys`` with at least two values of L, sorted by L."""
    for key, series in table.groupby(keys, sort=False):
        if series["L"].nunique() >= 2:
            yield dict(zip(keys, key, strict=True)), series.sort_values("L")


#: Axis labels of the swept variables.
AXIS_LABELS = {"L": "sequence length L (tokens)", "d_k": "head size d_k",
               "heads": "heads H", "batch": "batch size B"}


def _length_axis(ax, lengths, variable: str = "L", *, label: bool = True) -> None:
    """Log x axis with a labelled tick at each value of the data, no minor tick labels."""
    ax.set_xscale("log")
    ax.xaxis.set_major_locator(FixedLocator(sorted(set(float(x) for x in lengths))))
    ax.xaxis.set_major_formatter(FuncFormatter(lambda x, _: f"{x:g}"))
    ax.xaxis.set_minor_locator(NullLocator())
    if label:
        ax.set_xlabel(AXIS_LABELS.get(variable, variable))


def _varying(panel: pd.DataFrame, keys) -> dict:
    """Values of each key over the series of ``panel`` that are drawn (two or more L)."""
    drawn = [series for _, series in _length_series(panel, keys)]
    if not drawn:
        return {}
    drawn = pd.concat(drawn)
    return {name: drawn[name].unique() for name in keys}


def _series_label(fixed: dict, varying: dict) -> str:
    """The backend, plus whichever other parameters differ between series of a panel."""
    label = fixed["backend"]
    extras = [f"{name}={fixed[name]}" for name in ("d_k", "heads", "kv_heads", "batch", "dtype")
              if len(varying.get(name, ())) > 1]
    return " ".join([label, *extras])


def _same(a, b) -> bool:
    """Equal as numbers where both are numbers (fits hold 1024.0 where the sweep has 1024)."""
    try:
        return float(a) == float(b)
    except (TypeError, ValueError):
        return str(a) == str(b)


def _fit_row(fits: pd.DataFrame | None, quantity: str, fixed: dict, variable: str = "L"):
    """The row of ``fits`` for this series (``quantity`` against ``variable``), or None."""
    if fits is None or fits.empty:
        return None
    rows = fits[(fits["quantity"] == quantity) & (fits["variable"] == variable)]
    for name, value in fixed.items():
        if name in rows and name != variable:
            rows = rows[[_same(cell, value) for cell in rows[name]]]
    return None if rows.empty else rows.iloc[0]


def _lower_values(fit, rows: pd.DataFrame):
    """The values of a fit's lower-order term at ``rows``: L for a window fit against L·W
    (``lower_term == "g"``, :func:`attnbench.studies.scaling.window_fits`); None where the
    term is a function of x (or absent) and :meth:`PowerFit.predict` knows it."""
    return rows["L"].to_numpy(float) if fit.lower_term == "g" else None


def _band(ax, fit, color, scale: float = 1.0, points: pd.DataFrame | None = None,
          variable: str = "") -> None:
    """The fitted law and its 95% band: slopes from the interval's ends pivoting on the
    fit's centre.

    ``scale`` divides the fit's values (e.g. 2**20 for a fit in bytes drawn in MiB).  A fit
    whose lower-order term is not a function of x (a window fit's b·L against L·W) is drawn
    through its fitted values at ``points`` (column ``variable``), without a band.
    """
    if fit.lower_term == "g" and points is not None:
        rows = points.sort_values(variable)
        xs = rows[variable].to_numpy(float)
        ax.plot(xs, fit.predict(xs, _lower_values(fit, rows)) / scale, "-", color=color, lw=1.5)
        return
    xs = np.geomspace(fit.x_min, fit.x_max, 40)
    x0 = float(np.sqrt(fit.x_min * fit.x_max))
    y0 = float(fit.predict(x0)) / scale
    ax.plot(xs, fit.predict(xs) / scale, "-", color=color, lw=1.5)
    low_slope, high_slope = interval(fit)
    if np.isfinite(low_slope) and np.isfinite(high_slope) and high_slope > low_slope:
        low, high = y0 * (xs / x0) ** low_slope, y0 * (xs / x0) ** high_slope
        ax.fill_between(xs, np.minimum(low, high), np.maximum(low, high), color=color,
                        alpha=0.15, lw=0)


def _guides(ax, x, y, variable: str, powers=(1, 2)) -> None:
    """Dotted guide lines of slope 1 and 2 through the geometric centre of the points."""
    keep = (np.asarray(y) > 0) & (np.asarray(x) > 0)
    x, y = np.asarray(x, float)[keep], np.asarray(y, float)[keep]
    if len(np.unique(x)) < 2:
        return
    x0, y0 = float(np.exp(np.log(x).mean())), float(np.exp(np.log(y).mean()))
    xs = np.geomspace(x.min(), x.max(), 20)
    for power, style in zip(powers, (":", "--"), strict=False):
        ax.plot(xs, y0 * (xs / x0) ** power, style, color="gray", lw=1,
                label=f"guide ∝ {variable}{'²' if power == 2 else '¹'}")


def _stops(table: pd.DataFrame, fixed: dict, variable: str, last, panel_last) -> str:
    """Why a series ends before the others of its panel: the reason of a point not run, or
    the grid."""
    if last >= panel_last:
        return ""
    rows = table
    for name, value in fixed.items():
        if name in rows and name != variable:
            rows = rows[[_same(cell, value) for cell in rows[name]]]
    later = rows[(rows[variable] > last) & (rows["status"] != "ok")]
    if not later.empty and str(later["reason"].iloc[0]).strip():
        reason = str(later["reason"].iloc[0]).strip()
        return f" (stops at {variable}={last:g}: {reason[:50]}{'…' if len(reason) > 50 else ''})"
    return f" (stops at {variable}={last:g}: not in the grid beyond)"


def scaling_figure(table: pd.DataFrame, fits: pd.DataFrame | None, *, quantity: str,
                   variable: str, column: str, ylabel: str, title: str,
                   panel_by: str | None = "mask", keys=None,
                   scale: float = 1.0) -> Figure | None:
    """Measured points, the fitted law with its 95% band, guides, and residuals below.

    One column of panels per value of ``panel_by``: on top ``column`` against ``variable``
    log-log per series (filled: points the fit used, hollow: left out; values divided by
    ``scale``, the unit of the fits over that of the axis), each fitted law as
    a line with its band (the slopes at the ends of the 95% interval) and guide lines of
    slope 1 and 2; below,
    each used point over its fitted value (1 = on the law).  The legend sits under the
    panels, off the data; a series that ends early says why.
    """
    keys = keys or [k for k in SERIES_KEYS + ["L", "mask"] if k != variable
                    and not (variable == "heads" and k == "kv_heads")]
    if variable == "heads" and "heads_per_kv" not in keys:  # GQA: the ratio stays fixed
        keys = [*keys, "heads_per_kv"]
    values = column(table) if callable(column) else table[column]
    data = table.assign(_used=fit_mask(table, quantity).to_numpy(bool), _value=values / scale,
                        heads_per_kv=table["heads"] // table["kv_heads"])
    data = data[(data["status"] == "ok") & (data["_value"] > 0)]
    series_of = [(f, s) for f, s in _series(data, keys, variable)]
    panels = list(dict.fromkeys(f.get(panel_by) for f, _ in series_of)) if panel_by else [None]
    if not series_of:
        return None
    fig = Figure(figsize=(max(6.0, 5.4 * len(panels)), 6.6), layout="constrained")
    grid = fig.subplots(2, len(panels), squeeze=False, sharex="col",
                        gridspec_kw={"height_ratios": [3, 1]})
    for index, panel in enumerate(panels):
        ax, res = grid[0][index], grid[1][index]
        mine = [(f, s) for f, s in series_of if panel_by is None or f.get(panel_by) == panel]
        panel_last = max(s[variable].max() for _, s in mine)
        varying = _varying(pd.concat([s for _, s in mine]), SERIES_KEYS)
        used_points = []
        for fixed, series in mine:
            color = _color(fixed["backend"])
            x, y = series[variable].to_numpy(float), series["_value"].to_numpy(float)
            used = series["_used"].to_numpy(bool)
            ax.plot(x[used], y[used], "o", color=color)
            ax.plot(x[~used], y[~used], "o", mfc="none", color=color)
            used_points.append(series[used])
            label = _series_label(fixed, varying)
            row = _fit_row(fits, quantity, {**fixed, **({panel_by: panel} if panel_by else {})},
                           variable)
            fit = None if row is None else fit_from_row(row)
            if fit is not None:
                _band(ax, fit, color, scale, series[series["_used"]], variable)
                label += ": " + exponent_text(variable, fit.slope, *interval(fit))
                fitted = fit.predict(x[used], _lower_values(fit, series[used]))
                res.plot(x[used], y[used] * scale / fitted, "o-", color=color, ms=4)
            else:
                label += " (no fit: too few usable points)"
            label += _stops(table, {**fixed, **({panel_by: panel} if panel_by else {})},
                            variable, x.max(), panel_last)
            ax.plot([], [], "o-", color=color, label=label)
        used_all = pd.concat(used_points)
        guide = used_all if used_all[variable].nunique() >= 2 else pd.concat(
            [s for _, s in mine])
        _guides(ax, guide[variable], guide["_value"], variable)
        ax.plot([], [], "o", mfc="none", color="gray", label="left out of the fit (overhead)")
        ax.fill_between([], [], color="gray", alpha=0.15, label="95% band of the slope")
        ax.set(yscale="log", ylabel=ylabel,
               title=title + (f", {panel_by}: {panel}" if panel_by else ""))
        ax.grid(True, which="both", alpha=0.3)
        res.axhline(1, color="gray", lw=1)
        res.set(ylabel="measured / fit")
        res.grid(True, which="both", alpha=0.3)
        _length_axis(res, pd.concat([s for _, s in mine])[variable], variable)
        _length_axis(ax, pd.concat([s for _, s in mine])[variable], variable, label=False)
        res.legend(*ax.get_legend_handles_labels(), fontsize="x-small", loc="upper center",
                   bbox_to_anchor=(0.5, -0.45), ncols=1, frameon=False)
    return fig


def _series(table: pd.DataFrame, keys, variable: str):
    """Groups of ``table`` by ``keys`` with at least two values of ``variable``, sorted."""
    for key, series in table.groupby(keys, sort=False, dropna=False):
        if series[variable].nunique() >= 2:
            yield dict(zip(keys, key, strict=True)), series.sort_values(variable)


def time_vs_length(table: pd.DataFrame, fits: pd.DataFrame | None = None) -> Figure | None:
    """Median time against L per backend, one column per mask kind (:func:`scaling_figure`)."""
    return scaling_figure(table, fits, quantity="time", variable="L", column="median_ms",
                          ylabel="median time per call (ms)", title="Time against L")


def time_vs_variable(table: pd.DataFrame, fits: pd.DataFrame | None,
                     variable: str) -> Figure | None:
    """Median time against d_k, heads or batch (the series that vary it), with their fits."""
    if variable not in table or table[variable].nunique() < 2:
        return None
    return scaling_figure(table, fits, quantity="time", variable=variable, column="median_ms",
                          ylabel="median time per call (ms)", title=f"Time against {variable}",
                          panel_by=None)


def gflops_by_backend(table: pd.DataFrame, gemm_peaks: dict, *,
                      peak_label: str = "GEMM peak") -> Figure | None:
    """GFLOP/s against L per backend and mask kind, with the GEMM peak of the same run
    (or another reference line per dtype, named by ``peak_label``)."""
    data = _ok(table)
    masks = [m for m in dict.fromkeys(data["mask"])
             if data[data["mask"] == m]["L"].nunique() >= 2]
    if not masks:
        return None
    fig = Figure(figsize=(5.2 * len(masks), 4.8), layout="constrained")
    axes = fig.subplots(1, len(masks), squeeze=False, sharey=True)[0]
    for ax, mask in zip(axes, masks, strict=True):
        panel = data[data["mask"] == mask]
        varying = _varying(panel, SERIES_KEYS)
        for fixed, series in _length_series(panel, SERIES_KEYS):
            ax.plot(series["L"], series["gflops"], "o-", color=_color(fixed["backend"]),
                    label=_series_label(fixed, varying)
                    + _stops(table, {**fixed, "mask": mask}, "L", series["L"].max(),
                             panel["L"].max()))
        for style, dtype in zip(("-.", ":"), sorted(panel["dtype"].unique()), strict=False):
            peak = gemm_peaks.get(dtype)
            if peak:
                ax.axhline(peak, color="black", linestyle=style,
                           label=f"{dtype} {peak_label} {peak:.0f} GFLOP/s")
        ax.set(yscale="log", ylabel="GFLOP/s (visible pairs only)",
               title=f"Throughput against L, mask: {mask}")
        _length_axis(ax, panel["L"])
        ax.legend(fontsize="x-small", loc="upper center", bbox_to_anchor=(0.5, -0.16),
                  ncols=2, frameon=False)
        ax.grid(True, which="both", alpha=0.3)
    return fig


def _oracle_note(table: pd.DataFrame) -> str:
    """Where the error stops being computed (the oracle's limit), from the rows' ``oracle``."""
    import re

    if "oracle" not in table:
        return ""
    skipped = table[(table["status"] == "ok")
                    & table["oracle"].astype(str).str.startswith("oracle skipped")]
    if skipped.empty:
        return ""
    limit = re.search(r"limit ([\d,]+)", str(skipped["oracle"].iloc[0]))
    return ("\nerrors only up to the oracle's limit"
            + (f", B·H·L² ≤ {limit.group(1)}" if limit else "")
            + f";\n{len(skipped)} larger point(s) not checked against it")


def error_by_backend(table: pd.DataFrame) -> Figure | None:
    """Max abs error against the oracle per backend (markers: mask kind), and the tolerance.

    The legend sits under the axes; the title says where errors stop being computed.
    """
    data = _ok(table)
    data = data[np.isfinite(data["max_abs_err"].astype(float))]
    if data.empty:
        return None
    dtypes = sorted(data["dtype"].unique())
    fig = Figure(figsize=(max(6.5, 5.5 * len(dtypes)), 5.6), layout="constrained")
    axes = fig.subplots(1, len(dtypes), squeeze=False)[0]
    for ax, dtype in zip(axes, dtypes, strict=True):
        panel = data[data["dtype"] == dtype]
        backends = list(dict.fromkeys(panel["backend"]))
        for index, backend in enumerate(backends):
            rows = panel[panel["backend"] == backend]
            jitter = 1 + 0.04 * (index - (len(backends) - 1) / 2)  # keep markers apart
            for mask, group in rows.groupby("mask", sort=False):
                positive = group[group["max_abs_err"] > 0]
                ax.plot(positive["L"] * jitter, positive["max_abs_err"],
                        MARKERS.get(mask, "o"), color=_color(backend), linestyle="none",
                        label=f"{backend}, {mask}")
        tolerance = panel.groupby("L")["tolerance"].max()
        ax.plot(tolerance.index, tolerance.to_numpy(), "k_", markersize=18, mew=2,
                label="tolerance (largest per L)")
        ax.set(yscale="log", ylabel="max |output − oracle|",
               title=f"Error against the oracle, {dtype}"
               + _oracle_note(table[table["dtype"] == dtype]))
        ax.title.set_fontsize(10)
        _length_axis(ax, panel["L"])
        ax.legend(fontsize="x-small", ncols=3, loc="upper center",
                  bbox_to_anchor=(0.5, -0.16), frameon=False)
        ax.grid(True, which="both", alpha=0.3)
    return fig


def memory_vs_length(table: pd.DataFrame, fits: pd.DataFrame | None = None) -> Figure | None:
    """Memory that grows with the problem against L, per backend and mask, with the fits.

    The y axis is the peak extra memory of one call minus that of the backend's smallest
    call (:func:`attnbench.studies.scaling.memory_growth`), the quantity the fits are made on.
    """
    if "peak_mem_bytes" not in table:
        return None
    return scaling_figure(table, fits, quantity="memory", variable="L",
                          column=memory_growth, scale=2**20,
                          ylabel="peak extra memory − smallest call's (MiB)",
                          title="Memory against L")
