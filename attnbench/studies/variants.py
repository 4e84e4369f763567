"""Attention variants in a sweep: what block skipping buys.

The other question about the ``variant`` axis of a sweep (:mod:`attnbench.sweep.variants`),
whether a sliding window costs O(L·W), is a scaling fit like any other: time against
``L·W`` (:func:`attnbench.studies.scaling.window_fits`, with the same fit and verdict as
every scaling exponent).  This module builds on :mod:`attnbench.studies.scaling`, never
the other way round.

**What does skipping empty tiles buy?**  :func:`skipping_table` pairs each variant
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
from attnbench.studies.scaling import PARAMETERS, with_parameters

__all__ = ["row_ratio", "skipping_table"]

#: Parameters that must match between a variant point and its plain point.
_PAIRED = [p for p in PARAMETERS if p != "variant"]


def _ok(table: pd.DataFrame) -> pd.DataFrame:
    if table is None or table.empty or "status" not in table:
        return pd.DataFrame()
    return with_parameters(table[table["status"] == "ok"])


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
