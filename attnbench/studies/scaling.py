"""Scaling fits: power laws of time, memory and FLOPs against L, d_k, heads and batch.

A *series* is the rows of a sweep that vary one parameter and hold the others fixed
(:data:`PARAMETERS`); :func:`scaling_table` fits every series of a sweep table, adds the
sliding windows' fits against L·W (:func:`window_fits`) and stores with each fit its
verdict (:mod:`attnbench.studies.scaling_verdicts`, against the exponent
:mod:`attnbench.studies.scaling_claims` expects), as the console prints it and the
report shows it.

Fits (:mod:`attnbench.studies.fits`).  A timing row of a sweep keeps its repeated samples
(``samples_ms``, and ``cpu_samples_ms`` for the process CPU time).  Where they exist, time
is fitted as ``t = c + a·x^p`` (c ≥ 0, the fixed overhead of a call: argument checks,
allocation, thread launch), every point used, and the 95% interval on p comes from a
bootstrap over the samples (:func:`attnbench.studies.fits.fit_scaling`).  Where the
claimed exponent is above 1 (time against L) the model also has a linear term,
``t = c + b·x + a·x^p`` (:func:`lower_term`): attention's per-row work and a causal
kernel's diagonal tiles are O(L), and a fit without that term reads them as a smaller
(or, where they rise into the range, larger) p.  p is then the leading term's exponent,
the one an O(L²) claim is about.  The complexity
class of least residual among O(x), O(x log x), O(x²), O(x³) is reported beside p, with
the share of resamples that pick it.  Two clocks, two questions: the **wall-clock time**
(quantity ``time``) is the speed a user sees; the **CPU time** (quantity ``cpu``, all the
process's threads) is the work, which does not grow while the process waits for a core
another process holds.

Tables without samples (older sweeps) fall back to least squares on log-log axes with a
Student-t interval, over the points where ``t ≥ OVERHEAD_FACTOR · c`` (c the backend's
smallest call, ``call_overhead_ms``) and ``t ≥ MIN_FIT_TIME_S`` (:func:`fit_mask`).
Memory has a fixed part too (thread buffers, small arrays), which the smallest call's
peak measures exactly (tracemalloc is deterministic): the fit uses the peak minus that
(``peak_mem_bytes − base_mem_bytes``), where it is positive, by least squares (no
repeated samples: the values do not vary).  FLOPs: every point.  Decode points have no
lower-order term (their claim is linear).

Sliding windows: :func:`window_fits` fits the time of the ``window-W`` points against
``x = L·W`` over every L and W of a series (expected p = 1).  The kernels walk keys in
cells of 64, so a block of queries also reads up to 64 keys past its window: the work is
∝ L·(W + 64) = L·W + 64·L, and the fit has a lower-order term in L,
``t = c + b·L + a·(L·W)^p`` (without it, small W bend p below 1).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from attnbench.measure.intervals import parse_samples
from attnbench.studies.fits import PowerFit, fit_power_law, fit_scaling
from attnbench.studies.scaling_claims import SKIPPING_BACKENDS, TIME_EXPONENTS, expected_exponent
from attnbench.studies.scaling_verdicts import (
    L_NAMES,
    MIN_POINTS,
    interval,
    verdict_parts,
)
from attnbench.sweep.variants import window_size

__all__ = ["WINDOW_VARIABLE", "fit_mask", "fit_row", "fit_series", "scaling_table",
           "window_fits", "with_parameters"]

#: Without samples, fit time points only where t >= OVERHEAD_FACTOR x the smallest call ...
OVERHEAD_FACTOR = 100
#: ... and where t >= this many seconds.
MIN_FIT_TIME_S = 1e-3
#: A claimed exponent above this gets a linear lower-order term in its time fits.
LINEAR = 1
#: The variable of the sliding windows' fits (:func:`window_fits`).
WINDOW_VARIABLE = "L·W"
#: The quantities fitted, what each measures and the column of its samples.
CLOCKS = {"time": ("wall-clock time (speed)", "samples_ms", "median_ms"),
          "cpu": ("CPU time (work)", "cpu_samples_ms", "cpu_median_ms")}
#: Point parameters of a sweep table; a fit varies one and holds the others fixed.
PARAMETERS = ("backend", "L", "d_k", "heads", "kv_heads", "batch", "mask", "dtype",
              "direction", "variant", "kind")
#: Values of the parameters that tables written before they existed lack.
PARAMETER_DEFAULTS = {"direction": "forward", "variant": "none", "kind": "dense"}


def has_samples(table: pd.DataFrame, quantity: str = "time") -> bool:
    """True if the table's rows keep the repeated samples of ``quantity`` (time or cpu)."""
    column = CLOCKS[quantity][1]
    return column in table and table[column].map(lambda t: parse_samples(t).size >= 2).any()


def fit_mask(table: pd.DataFrame, quantity: str) -> pd.Series:
    """Which rows of a sweep table a fit of ``quantity`` may use (see the module docstring)."""
    ok = table["status"] == "ok"
    if quantity in CLOCKS:
        _, samples, median = CLOCKS[quantity]
        if has_samples(table, quantity):  # the overhead is in the model: every point
            return ok & table[samples].map(lambda t: parse_samples(t).size >= 2)
        if quantity == "cpu" or median not in table:
            return ok & False
        threshold_ms = np.maximum(OVERHEAD_FACTOR * table["call_overhead_ms"],
                                  MIN_FIT_TIME_S * 1e3)
        return ok & (table[median] >= threshold_ms)
    if quantity == "memory":
        return ok & (memory_growth(table) > 0)
    if quantity == "flops":
        return ok & (table["flops"] > 0)
    raise ValueError(f"quantity {quantity!r}; expected one of time, cpu, memory, flops")


def memory_growth(table: pd.DataFrame) -> pd.Series:
    """Peak extra memory minus the backend's smallest call's: the part that grows."""
    base = table["base_mem_bytes"] if "base_mem_bytes" in table else 0
    return table["peak_mem_bytes"] - base


def fit_series(used: pd.DataFrame, x: pd.Series, quantity: str, data: pd.DataFrame,
               lower=None):
    """The fit of one series' usable rows against ``x`` (None with too few distinct x).

    Time and CPU time with samples: :func:`~attnbench.studies.fits.fit_scaling` (at least
    :data:`MIN_POINTS` distinct x), with the lower-order term ``lower`` (``"x"``, a
    Series aligned with ``x``, or None); without samples: a log-log line.  Memory: the
    growth (:func:`memory_growth`) on a log-log line.  ``data`` is the whole table
    (whether it keeps samples decides the method, the same for every series).
    """
    if x.nunique() < 2:
        return None
    if quantity in CLOCKS and has_samples(data, quantity):
        if x.nunique() < MIN_POINTS:
            return None
        samples = [parse_samples(text) for text in used[CLOCKS[quantity][1]]]
        return fit_scaling(x.to_numpy(float), [s * 1e3 for s in samples], lower=lower)
    if quantity == "memory":
        return fit_power_law(x, memory_growth(used))
    return fit_power_law(x, used["median_ms" if quantity == "time" else "flops"])


def _group_keys(variable: str) -> list[str]:
    # Heads vary with kv_heads = heads (or a fixed ratio): hold the ratio fixed instead.
    if variable == "heads":
        return [p for p in PARAMETERS if p not in ("heads", "kv_heads")] + ["heads_per_kv"]
    return [p for p in PARAMETERS if p != variable]


def lower_term(quantity: str, expected: float | None):
    """The lower-order term of a time fit: ``"x"`` (linear) where the claimed exponent is
    above 1 (an O(L²) cost has O(L) parts: per-row work, the causal diagonal tiles), None
    elsewhere (a linear claim has only the fixed overhead below it)."""
    if quantity in CLOCKS and expected is not None and expected > LINEAR:
        return "x"
    return None


def with_parameters(table: pd.DataFrame) -> pd.DataFrame:
    """``table`` with every column of :data:`PARAMETERS` (older tables lack some)."""
    missing = {name: value for name, value in PARAMETER_DEFAULTS.items() if name not in table}
    return table.assign(**missing) if missing else table


def scaling_table(table: pd.DataFrame,
                  quantities=("time", "cpu", "flops", "memory")) -> pd.DataFrame:
    """One fit per (quantity, variable, series): a series holds every parameter but one fixed.

    Series with fewer than :data:`MIN_POINTS` distinct values of the variable in all are
    left out; those with enough values but too few usable points get an "inconclusive"
    row.  Memory is fitted against L only; ``cpu`` only where the rows keep CPU samples.
    Sliding windows add their fits against L·W
    (:func:`window_fits`).

    Returns
    -------
    pandas.DataFrame
        Columns: quantity, clock (what the quantity measures), variable, the fixed
        parameters (the varied one is empty), slope, ci_low, ci_high, ci95 (half-width),
        stderr, overhead (the fitted fixed part, in the quantity's unit), best_class,
        class_share, method, n_used, n_points, noisy_points, x_min, x_max, r2, intercept,
        expected, outcome, verdict (the line the console prints, :func:`verdict`),
        conclusion (its part after the fitted law: the claim, the outcome, the reason).
    """
    data = with_parameters(table[table["status"] == "ok"]).copy()
    data["heads_per_kv"] = data["heads"] // data["kv_heads"]
    rows = []
    for quantity in quantities:
        if quantity == "cpu" and not has_samples(data, "cpu"):
            continue
        usable = fit_mask(data, quantity)
        for variable in TIME_EXPONENTS:
            if quantity == "memory" and variable != "L":
                continue
            keys = _group_keys(variable)
            for key, series in data.groupby(keys, sort=False):
                if series[variable].nunique() < MIN_POINTS:
                    continue
                used = series[usable.loc[series.index]]
                fixed = dict(zip(keys, key, strict=True))
                kind = fixed.get("kind", "dense")
                expected, at_most = expected_exponent(quantity, variable, fixed["backend"],
                                                      fixed.get("variant", "none"), kind)
                fit = fit_series(used, used[variable], quantity, data,
                                 lower=lower_term(quantity, expected))
                rows.append(fit_row(quantity, variable, fixed, fit, used, len(series),
                                    expected, at_most=at_most,
                                    label=L_NAMES.get(kind) if variable == "L" else None))
    windows = window_fits(table, [q for q in quantities if q in CLOCKS])
    return pd.concat([pd.DataFrame(rows), windows], ignore_index=True) if len(windows) \
        else pd.DataFrame(rows)


def window_fits(table: pd.DataFrame, quantities=("time", "cpu")) -> pd.DataFrame:
    """One fit of time against L·W per series of ``window-W`` points (columns as
    :func:`scaling_table`, variable :data:`WINDOW_VARIABLE`, variant ``"window"``).  Only
    backends that skip hidden tiles (:data:`SKIPPING_BACKENDS`): a peer given the window
    as a dense mask computes every pair.  Series with fewer than :data:`MIN_POINTS`
    distinct L·W are left out."""
    if table is None or table.empty or "status" not in table:
        return pd.DataFrame()
    data = with_parameters(table[table["status"] == "ok"])
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


def fit_row(quantity: str, variable: str, fixed: dict, fit: PowerFit | None,
            used: pd.DataFrame, n_points: int, expected: float | None, *,
            at_most: bool = False, label: str | None = None) -> dict:
    """One row of :func:`scaling_table`: the fit, its interval and its :func:`verdict`.

    Parameters
    ----------
    quantity, variable : str
        What was fitted against what (``"time"``, ``"L"``).
    fixed : dict
        The parameters held fixed (those of :data:`PARAMETERS` not in it are empty).
    fit : PowerFit or None
    used : DataFrame
        The sweep rows the fit used (their ``noisy`` flags are counted).
    n_points : int
        Rows of the series, used or not.
    expected : float or None
        The claimed exponent (None: only measured).
    at_most : bool
        The claim is an upper bound.
    label : str, optional
        How the verdict names the variable (default ``variable``; ``"Lk"`` for the cache
        length of decode points, whose column is ``L``).
    """
    noisy = int(used["noisy"].astype(bool).sum()) if "noisy" in used else 0
    starved = (int(used["starved"].fillna(False).astype(bool).sum())
               if quantity in CLOCKS and "starved" in used else 0)
    threads = (int(used["threads"].max()) if "threads" in used
               and used["threads"].notna().any() else None)
    outcome, _, conclusion, text = verdict_parts(fit, quantity, label or variable, expected,
                                                 at_most=at_most, starved=starved,
                                                 threads=threads)
    low, high = interval(fit) if fit is not None else (np.nan, np.nan)

    def value(name):
        return np.nan if fit is None else getattr(fit, name)

    return {
        "quantity": quantity,
        "clock": CLOCKS[quantity][0] if quantity in CLOCKS else "",
        "variable": variable, **{p: fixed.get(p, "") for p in PARAMETERS},
        "slope": value("slope"), "ci_low": low, "ci_high": high, "ci95": value("ci95"),
        "stderr": value("stderr"), "overhead": value("overhead"),
        "lower": value("lower"), "lower_term": "" if fit is None else fit.lower_term,
        "leading_share": np.nan if fit is None else fit.dominance(),
        "best_class": "" if fit is None else fit.best_class,
        "class_share": value("class_share"),
        "method": "" if fit is None else fit.method,
        "n_used": len(used), "n_points": n_points, "noisy_points": noisy,
        "starved_points": starved,
        "x_min": value("x_min"), "x_max": value("x_max"), "r2": value("r2"),
        "intercept": value("intercept"),
        "expected": np.nan if expected is None else expected,
        "outcome": outcome, "verdict": text, "conclusion": conclusion,
    }


def fit_from_row(row) -> PowerFit | None:
    """The :class:`PowerFit` of a row of :func:`scaling_table` (None if it has no fit)."""
    if not np.isfinite(row["slope"]):
        return None
    extra = {name: row[name] for name in ("overhead", "ci_low", "ci_high", "lower",
                                          "leading_share") if name in row
             and np.isfinite(row[name])}
    if isinstance(row.get("lower_term"), str):
        extra["lower_term"] = row["lower_term"]
    return PowerFit(slope=row["slope"], intercept=row["intercept"], stderr=row["stderr"],
                    ci95=row["ci95"], n=int(row["n_used"]), r2=row["r2"],
                    x_min=row["x_min"], x_max=row["x_max"], **extra)
