"""Attention variants in a sweep: O(L·W) of sliding windows, and what block skipping buys.

Two questions about the ``variant`` axis of a sweep (:mod:`attnbench.sweep.variants`):

- **Does a sliding window cost O(L·W)?**  :func:`window_fits` fits the time of the
  ``window-W`` points against ``x = L·W``, over every L and W of a series (the other
  parameters fixed), with the same fit and verdict as every scaling exponent
  (:func:`attnbench.studies.scaling.fit_series`: ``t = c + a·x^p`` with a bootstrap
  interval over the samples; expected p = 1, confirmed when the whole interval lies
  within 1 ± :data:`attnbench.studies.scaling.TOLERANCE`).  The kernels walk keys in
  cells of 64, so a block of queries also reads up to 64 keys past its window: the work
  is ∝ L·(W + 64) = L·W + 64·L.  The fit therefore has a lower-order term in L,
  ``t = c + b·L + a·(L·W)^p`` (without it, small W bend p below 1).
- **What does skipping empty tiles buy?**  :func:`skipping_table` pairs each variant
  point with the plain point of the same problem (``variant="none"``, same backend,
  direction, mask, sizes) and gives the *density* (the fraction of the L² pairs the
  variant leaves visible, from the FLOP counts), the *ideal* speed-up (the plain call's
  visible pairs over the variant's: what a kernel that skips exactly the hidden pairs
  gains), the measured speed-up (the ratio of median times, with its bootstrap 95 %
  interval from the samples) and the efficiency (measured / ideal).  The two points were
  timed at different moments of the sweep, not interleaved: on a busy machine read the
  efficiency, not a single ratio.  Score variants (ALiBi, softcap) have density 1: their
  speed-up is the inverse of their overhead.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from attnbench.measure.intervals import parse_samples, ratio_interval
from attnbench.studies.scaling import (
    MIN_POINTS,
    PARAMETERS,
    SKIPPING_BACKENDS,
    fit_mask,
    fit_row,
    fit_series,
    has_samples,
    with_parameters,
)
from attnbench.sweep.variants import window_size

__all__ = ["WINDOW_VARIABLE", "skipping_table", "window_fits"]

#: The variable of the window fits.
WINDOW_VARIABLE = "L·W"
#: Parameters that must match between a variant point and its plain point.
_PAIRED = [p for p in PARAMETERS if p != "variant"]


def _ok(table: pd.DataFrame) -> pd.DataFrame:
    if table is None or table.empty or "status" not in table:
        return pd.DataFrame()
    return with_parameters(table[table["status"] == "ok"])


def window_fits(table: pd.DataFrame, quantities=("time", "cpu")) -> pd.DataFrame:
    """One fit of time against L·W per series of ``window-W`` points (columns as
    :func:`attnbench.studies.scaling.scaling_table`, variable ``"L·W"``, variant
    ``"window"``).  Only backends that skip hidden tiles
    (:data:`attnbench.studies.scaling.SKIPPING_BACKENDS`): a peer given the window as a
    dense mask computes every pair.  Series with fewer than 3 distinct L·W are left out."""
    data = _ok(table)
    if data.empty:
        return pd.DataFrame()
    widths = data["variant"].map(lambda v: window_size(str(v)) if str(v) != "nan" else None)
    data = data.assign(W=widths)
    windows = data[data["W"].notna() & (data["W"] > 0)
                   & data["backend"].isin(SKIPPING_BACKENDS)]
    rows = []
    keys = [p for p in PARAMETERS if p not in ("L", "variant")]
    for quantity in quantities:
        if windows.empty or not has_samples(windows, quantity):
            continue
        usable = fit_mask(windows, quantity)
        for key, series in windows.groupby(keys, sort=False):
            x_all = series["L"] * series["W"]
            if x_all.nunique() < MIN_POINTS:
                continue
            used = series[usable.loc[series.index]]
            fit = fit_series(used, used["L"] * used["W"], quantity, windows, lower=used["L"])
            fixed = {**dict(zip(keys, key, strict=True)), "variant": "window"}
            rows.append(fit_row(quantity, WINDOW_VARIABLE, fixed, fit, used, len(series), 1))
    return pd.DataFrame(rows)


def _full_flops(row) -> float:
    """FLOPs of the same problem with every pair visible (``flops`` scales with pairs)."""
    pairs = row["batch"] * row["heads"] * row["L"] * row["L"]
    per_pair = 2 * (3 * row["d_k"] + 2 * row["d_k"]) if row["direction"] == "backward" \
        else 4 * row["d_k"]
    return float(pairs * per_pair)


def skipping_table(table: pd.DataFrame) -> pd.DataFrame:
    """Each variant point beside its plain point: density, ideal and measured speed-up.

    Returns
    -------
    pandas.DataFrame
        Columns: backend, direction, variant, mask, dtype, L, d_k, heads, batch, density
        (visible fraction of the L² pairs), ideal_speedup, speedup, speedup_low,
        speedup_high (95 % bootstrap interval of the ratio of medians; nan without
        samples), efficiency (speedup / ideal_speedup), variant_ms, plain_ms.  Empty when
        the table has no variant point with a plain partner.
    """
    data = _ok(table)
    if data.empty or not (data["variant"] != "none").any():
        return pd.DataFrame()
    plain = data[data["variant"] == "none"].drop_duplicates(_PAIRED).set_index(_PAIRED)
    rows = []
    for _, row in data[data["variant"] != "none"].iterrows():
        key = tuple(row[p] for p in _PAIRED)
        if key not in plain.index:
            continue
        base = plain.loc[key]
        ratio, low, high = row_ratio(base, row)
        ideal = base["flops"] / row["flops"] if row["flops"] > 0 else np.nan
        rows.append({
            **{p: row[p] for p in ("backend", "direction", "variant", "mask", "dtype", "L",
                                   "d_k", "heads", "batch")},
            "density": row["flops"] / _full_flops(row), "ideal_speedup": ideal,
            "speedup": ratio, "speedup_low": low, "speedup_high": high,
            "efficiency": ratio / ideal if ideal > 0 else np.nan,
            "variant_ms": row["median_ms"], "plain_ms": base["median_ms"],
        })
    return pd.DataFrame(rows)


def row_ratio(numerator_row, denominator_row) -> tuple[float, float, float]:
    """``(ratio, low, high)`` of two rows' median times; the interval from their samples."""
    a = parse_samples(numerator_row.get("samples_ms"))
    b = parse_samples(denominator_row.get("samples_ms"))
    if a.size and b.size:
        return ratio_interval(a, b)
    return float(numerator_row["median_ms"] / denominator_row["median_ms"]), np.nan, np.nan
