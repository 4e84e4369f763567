"""Scaling analysis: power-law fits of time, memory and FLOPs against L, d_k, heads, batch.

A quantity y that grows as ``c · x^p`` is a straight line of slope p on log-log axes,
so p is estimated by least squares on ``(log x, log y)`` (:func:`fit_power_law`), with
a 95% confidence interval from Student's t distribution with n − 2 degrees of freedom
(a small table, :func:`t_quantile_975`: no SciPy needed).

Which points are fitted (:func:`fit_mask`).  A call of fixed overhead c (argument
checks, allocation, thread launch) on top of work a·x^p takes ``t = c + a·x^p``, whose
local log-log slope is ``p·(1 − c/t)``: the overhead bends the line down by the
fraction c/t.  So time points are fitted only where ``t ≥ OVERHEAD_FACTOR · c``
(bias at most 1/OVERHEAD_FACTOR = 1% of the exponent) and ``t ≥ MIN_FIT_TIME_S``
(above timer and scheduler noise).  c is the backend's measured time for its smallest
call (B = H = L = d_k = 1), taken in the same run (the sweep's ``call_overhead_ms``).
Memory has a fixed part too (thread buffers, small arrays), which the smallest call's
peak measures exactly (tracemalloc is deterministic): the fit uses the peak minus that
(``peak_mem_bytes − base_mem_bytes``), where it is positive.  FLOPs: every point.

Verdicts (:func:`verdict`) are computed from the numbers: the expected exponent p
(L² for time and FLOPs against L, linear against d_k, heads and batch; for memory
against L: linear for the fused numba kernel, quadratic for the backends that build
the L x L scores; for the fused kernel an upper bound, "at most O(L)") is *confirmed*
when it lies within the 95% interval widened by
``MARGIN`` (caches and memory bandwidth bend real timings a little, and an interval
of ±0.01 would reject a slope of 1.98 that everyone would call quadratic); *not
confirmed* otherwise; *inconclusive* when the interval is wider than ``MAX_CI``.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np
import pandas as pd

from attnbench.report.sections import Section

__all__ = ["PowerFit", "fit_mask", "fit_power_law", "scaling_table", "section",
           "t_quantile_975", "verdict"]

#: Fit time points only where t >= OVERHEAD_FACTOR x the backend's smallest-call time.
OVERHEAD_FACTOR = 100
#: ... and where t >= this many seconds.
MIN_FIT_TIME_S = 1e-3
#: The expected exponent is confirmed if it lies within the 95% CI widened by MARGIN.
MARGIN = 0.1
#: A 95% CI half-width above this is inconclusive.
MAX_CI = 0.3
#: Fewest distinct x values a fit needs (two points give a slope but no interval).
MIN_POINTS = 3

# Two-sided 95% quantiles t_{0.975, dof} of Student's t for dof = 1..30, then 40, 60, 120.
_T_TABLE = {
    1: 12.7062, 2: 4.3027, 3: 3.1824, 4: 2.7764, 5: 2.5706, 6: 2.4469, 7: 2.3646, 8: 2.3060,
    9: 2.2622, 10: 2.2281, 11: 2.2010, 12: 2.1788, 13: 2.1604, 14: 2.1448, 15: 2.1314,
    16: 2.1199, 17: 2.1098, 18: 2.1009, 19: 2.0930, 20: 2.0860, 21: 2.0796, 22: 2.0739,
    23: 2.0687, 24: 2.0639, 25: 2.0595, 26: 2.0555, 27: 2.0518, 28: 2.0484, 29: 2.0452,
    30: 2.0423, 40: 2.0211, 60: 2.0003, 120: 1.9799,
}
_Z_975 = 1.959964


def t_quantile_975(dof: int) -> float:
    """The 0.975 quantile of Student's t with ``dof`` degrees of freedom.

    Exact (4 decimals) for dof <= 30 and at 40, 60, 120; in between, interpolated
    linearly in 1/dof (the standard way to read a t table, error < 1e-3); beyond 120,
    interpolated between t_120 and the normal quantile 1.96 at 1/dof = 0.
    """
    if dof < 1:
        raise ValueError(f"dof must be >= 1; got {dof}")
    if dof in _T_TABLE:
        return _T_TABLE[dof]
    known = sorted(_T_TABLE) + [np.inf]
    upper = next(d for d in known if d > dof)
    lower = max(d for d in known if d < dof)
    t_lower, t_upper = _T_TABLE[lower], _T_TABLE.get(upper, _Z_975)
    weight = (1 / lower - 1 / dof) / (1 / lower - (0 if upper == np.inf else 1 / upper))
    return t_lower + weight * (t_upper - t_lower)


@dataclass(frozen=True)
class PowerFit:
    """Least-squares fit of ``log y = log c + slope · log x``."""

    slope: float  # the exponent p
    intercept: float  # log c (natural log)
    stderr: float  # standard error of the slope (nan with 2 points)
    ci95: float  # half-width of the slope's 95% confidence interval
    n: int  # points fitted
    r2: float  # coefficient of determination on the log scale
    x_min: float  # the fitted range of x
    x_max: float

    def predict(self, x):
        """``c · x^slope``."""
        return np.exp(self.intercept) * np.asarray(x, dtype=float) ** self.slope


def fit_power_law(x, y) -> PowerFit:
    """Fit ``y = c · x^p`` by least squares on log-log axes.

    Parameters
    ----------
    x, y : array_like of positive numbers
        At least two distinct x.

    Returns
    -------
    PowerFit
        With the slope's standard error and 95% interval (t distribution, n − 2 degrees
        of freedom; nan for two points, 0 for an exact fit).
    """
    x = np.asarray(x, dtype=float)
    y = np.asarray(y, dtype=float)
    if x.shape != y.shape or x.ndim != 1:
        raise ValueError(f"x and y must be 1-D of one length; got {x.shape} and {y.shape}")
    if (x <= 0).any() or (y <= 0).any():
        raise ValueError("a power-law fit needs positive x and y")
    if len(np.unique(x)) < 2:
        raise ValueError(f"need at least two distinct x values; got {np.unique(x).tolist()}")
    lx, ly = np.log(x), np.log(y)
    n = len(x)
    sxx = float(np.sum((lx - lx.mean()) ** 2))
    slope = float(np.sum((lx - lx.mean()) * (ly - ly.mean())) / sxx)
    intercept = float(ly.mean() - slope * lx.mean())
    residuals = ly - (intercept + slope * lx)
    sst = float(np.sum((ly - ly.mean()) ** 2))
    r2 = 1 - float(np.sum(residuals**2)) / sst if sst > 0 else 1.0
    if n > 2:
        stderr = float(np.sqrt(np.sum(residuals**2) / (n - 2) / sxx))
        ci95 = t_quantile_975(n - 2) * stderr
    else:
        stderr = ci95 = float("nan")
    return PowerFit(slope=slope, intercept=intercept, stderr=stderr, ci95=ci95, n=n, r2=r2,
                    x_min=float(x.min()), x_max=float(x.max()))


_SUPERSCRIPTS = str.maketrans("0123456789-.", "⁰¹²³⁴⁵⁶⁷⁸⁹⁻·")


def big_o(variable: str, exponent: float) -> str:
    """``O(L²)``, ``O(L)``, ``O(1)``."""
    exponent = round(exponent, 2)
    if exponent == 0:
        return "O(1)"
    if exponent == 1:
        return f"O({variable})"
    text = f"{exponent:g}".translate(_SUPERSCRIPTS)
    return f"O({variable}{text})"


def verdict(fit: PowerFit | None, quantity: str, variable: str,
            expected: float | None, *, at_most: bool = False) -> tuple[str, str]:
    """``(outcome, text)``: outcome is confirmed, not confirmed, inconclusive, measured.

    The text reads like ``"time ∝ L^1.98 ± 0.04 → O(L²) confirmed"``.  ``expected``
    None (no exponent is claimed) gives outcome "measured" and the nearest integer power.
    ``at_most=True`` checks an upper bound ("at most O(L)"): confirmed when the interval
    reaches down to ``expected + MARGIN`` or below, whatever the slope's lower end.
    """
    if fit is None or fit.n < MIN_POINTS:
        n = 0 if fit is None else fit.n
        return "inconclusive", (f"{quantity} vs {variable}: {n} usable point(s), a fit needs "
                                f"{MIN_POINTS}")
    ci = 0.0 if fit.ci95 == 0 else fit.ci95
    head = f"{quantity} ∝ {variable}^{fit.slope:.2f} ± {ci:.2f}"
    if expected is None:
        return "measured", f"{head} (closest power: {big_o(variable, round(fit.slope))})"
    claim = big_o(variable, expected)
    if ci > MAX_CI:
        return "inconclusive", f"{head} → {claim} inconclusive (95% CI wider than ±{MAX_CI})"
    if at_most:
        if fit.slope - ci <= expected + MARGIN:
            return "confirmed", f"{head} → at most {claim} confirmed"
        return "not confirmed", (f"{head} → at most {claim} not confirmed: grows faster "
                                 f"(closest power: {big_o(variable, round(fit.slope))})")
    if abs(fit.slope - expected) <= ci + MARGIN:
        return "confirmed", f"{head} → {claim} confirmed"
    side = "below" if fit.slope < expected else "above"
    return "not confirmed", (f"{head} → {claim} not confirmed: the slope is {side} {expected:g} "
                             f"(closest power: {big_o(variable, round(fit.slope))})")


#: Point parameters of a sweep table; a fit varies one and holds the others fixed.
PARAMETERS = ("backend", "L", "d_k", "heads", "kv_heads", "batch", "mask", "dtype")
#: Variables fitted against, with the expected exponent of the time.
TIME_EXPONENTS = {"L": 2, "d_k": 1, "heads": 1, "batch": 1}
#: Expected exponent of the peak memory against L, per backend (None: no claim), and
#: whether it is an upper bound.  The fused kernel promises O(L·D) working memory (no
#: L x L array): at most linear; its fixed per-thread buffers make the slope lower at
#: small L.  The reference and the plain NumPy peer build the L x L scores: quadratic.
MEMORY_EXPONENTS = {"numba": (1, True), "reference": (2, False), "numpy": (2, False)}


def fit_mask(table: pd.DataFrame, quantity: str) -> pd.Series:
    """Which rows of a sweep table a fit of ``quantity`` may use (see the module docstring)."""
    ok = table["status"] == "ok"
    if quantity == "time":
        threshold_ms = np.maximum(OVERHEAD_FACTOR * table["call_overhead_ms"],
                                  MIN_FIT_TIME_S * 1e3)
        return ok & (table["median_ms"] >= threshold_ms)
    if quantity == "memory":
        return ok & (memory_growth(table) > 0)
    if quantity == "flops":
        return ok & (table["flops"] > 0)
    raise ValueError(f"quantity {quantity!r}; expected 'time', 'memory' or 'flops'")


def memory_growth(table: pd.DataFrame) -> pd.Series:
    """Peak extra memory minus the backend's smallest call's: the part that grows."""
    base = table["base_mem_bytes"] if "base_mem_bytes" in table else 0
    return table["peak_mem_bytes"] - base


def _values(series: pd.DataFrame, quantity: str) -> pd.Series:
    if quantity == "memory":
        return memory_growth(series)
    return series["median_ms" if quantity == "time" else "flops"]


def _group_keys(variable: str) -> list[str]:
    # Heads vary with kv_heads = heads (or a fixed ratio): hold the ratio fixed instead.
    if variable == "heads":
        return [p for p in PARAMETERS if p not in ("heads", "kv_heads")] + ["heads_per_kv"]
    return [p for p in PARAMETERS if p != variable]


def _expected(quantity: str, variable: str, backend: str) -> tuple[float | None, bool]:
    """``(expected exponent or None, whether it is an upper bound)``."""
    if quantity == "memory":
        return MEMORY_EXPONENTS.get(backend, (None, False)) if variable == "L" else (None, False)
    return TIME_EXPONENTS[variable], False


def scaling_table(table: pd.DataFrame, quantities=("time", "flops", "memory")) -> pd.DataFrame:
    """One fit per (quantity, variable, series): a series holds every parameter but one fixed.

    Series with fewer than :data:`MIN_POINTS` distinct values of the variable in all are
    left out; those with enough values but too few usable points get an "inconclusive"
    row.  Memory is fitted against L only.

    Returns
    -------
    pandas.DataFrame
        Columns: quantity, variable, the fixed parameters (the varied one is empty),
        slope, ci95, stderr, n_used, n_points, x_min, x_max, r2, expected, outcome, verdict.
    """
    data = table[table["status"] == "ok"].copy()
    data["heads_per_kv"] = data["heads"] // data["kv_heads"]
    rows = []
    for quantity in quantities:
        usable = fit_mask(data, quantity)
        for variable in TIME_EXPONENTS:
            if quantity == "memory" and variable != "L":
                continue
            keys = _group_keys(variable)
            for key, series in data.groupby(keys, sort=False):
                if series[variable].nunique() < MIN_POINTS:
                    continue
                used = series[usable.loc[series.index]]
                fit = None
                if used[variable].nunique() >= 2:
                    fit = fit_power_law(used[variable], _values(used, quantity))
                fixed = dict(zip(keys, key, strict=True))
                expected, at_most = _expected(quantity, variable, fixed["backend"])
                outcome, text = verdict(fit, quantity, variable, expected, at_most=at_most)
                fit_values = asdict(fit) if fit is not None else {}
                rows.append({
                    "quantity": quantity, "variable": variable,
                    **{p: fixed.get(p, "") for p in PARAMETERS},
                    "slope": fit_values.get("slope", np.nan),
                    "ci95": fit_values.get("ci95", np.nan),
                    "stderr": fit_values.get("stderr", np.nan),
                    "n_used": len(used), "n_points": len(series),
                    "x_min": fit_values.get("x_min", np.nan),
                    "x_max": fit_values.get("x_max", np.nan),
                    "r2": fit_values.get("r2", np.nan),
                    "intercept": fit_values.get("intercept", np.nan),
                    "expected": np.nan if expected is None else expected,
                    "outcome": outcome, "verdict": text,
                })
    return pd.DataFrame(rows)


def fit_from_row(row) -> PowerFit | None:
    """The :class:`PowerFit` of a row of :func:`scaling_table` (None if it has no fit)."""
    if not np.isfinite(row["slope"]):
        return None
    return PowerFit(slope=row["slope"], intercept=row["intercept"], stderr=row["stderr"],
                    ci95=row["ci95"], n=int(row["n_used"]), r2=row["r2"],
                    x_min=row["x_min"], x_max=row["x_max"])


def section(table: pd.DataFrame, fits: pd.DataFrame | None = None,
            meta: dict | None = None) -> list[Section]:
    """The report's scaling section: the rule, the verdicts and the plots.

    Parameters
    ----------
    table : pandas.DataFrame
        A sweep table (:func:`attnbench.sweep.runner.run_sweep`).
    fits : pandas.DataFrame, optional
        :func:`scaling_table` of it (computed if not given).
    meta : dict, optional
        The sweep's ``sweep.json``: its load averages are quoted, with a warning when
        the machine was busy.
    """
    from attnbench.report import plots

    fits = scaling_table(table) if fits is None else fits
    text = (
        "Exponents are least-squares slopes on log-log axes, with 95% confidence intervals "
        "from Student's t distribution (n − 2 degrees of freedom). Time points count only "
        f"where the median time is at least {OVERHEAD_FACTOR}× the backend's smallest-call "
        f"time measured in the same run (a fixed overhead c bends the slope by the fraction "
        f"c/t, so at most {100 / OVERHEAD_FACTOR:g}% here) and at least "
        f"{MIN_FIT_TIME_S * 1e3:g} ms. Memory: the peak extra memory of one call minus the "
        "smallest call's (B = H = L = d_k = 1: thread buffers and other fixed costs), "
        "where that is positive. "
        f"An expected exponent is confirmed when it lies within the interval widened by "
        f"±{MARGIN}, and the fit is inconclusive when the interval is wider than ±{MAX_CI}. "
        "The fused numba kernel promises at most linear memory (O(L·d) working memory, no "
        "L × L array): its memory verdict checks that upper bound (interval reaching "
        f"≤ 1 + {MARGIN}); its fixed per-thread buffers make the measured slope smaller "
        "than 1 at these sizes. The reference and the plain NumPy peer build the L × L "
        "scores: their memory is checked against L². "
        "FLOPs are counted, not measured (visible pairs × 2·(d_k + d_v)): their fit checks "
        "the count (causal masks see L(L+1)/2 pairs, so their slope is a little under 2)."
    )
    text += _load_text(meta or {})
    if fits.empty:
        text += ("\n\nNo series of this sweep varies a parameter over "
                 f"{MIN_POINTS} or more values, so nothing was fitted.")
        return [Section(title="Scaling", text=text)]
    lines = [f"{row.verdict}  [{_series_label(row)}]" for row in fits.itertuples()
             if row.quantity != "flops"]
    text += "\n\nVerdicts:\n" + "\n".join(lines)
    shown = fits.drop(columns=["intercept", "stderr"]).copy()
    figures = [("Time against L, log-log, with the fitted slopes and an L² guide",
                plots.time_vs_length(table, fits))]
    memory = plots.memory_vs_length(table, fits)
    if memory is not None:
        figures.append(("Memory that grows with L: the peak extra memory of one call minus "
                        "the backend's smallest call's, log-log, with the fitted slopes", memory))
    return [Section(title="Scaling", text=text, tables=[("Fits", shown)], figures=figures)]


def _load_text(meta: dict) -> str:
    """The machine's load during the sweep, and a warning if it was busy."""
    start, end = meta.get("load_average_1m_start"), meta.get("load_average_1m_end")
    cores = (meta.get("machine") or {}).get("usable_cores")
    if start is None or not cores:
        return ""
    text = (f"\n\nLoad average (1 min) at the start of the sweep: {start:.2f}, at the end: "
            f"{end:.2f}, on {cores} usable cores.")
    if max(start, end) > 0.5 * cores:
        text += (" The machine was busy: other processes pre-empt the timed threads, which "
                 "inflates times and makes them jump in steps of the scheduler's time slice "
                 "(see the IQR columns); fits can then come out inconclusive or off.")
        if not meta.get("threads"):
            text += (" On a shared machine, --threads 1 (attnbench run or sweep) gives "
                     "steadier fits: a one-thread call never waits for a pre-empted worker.")
    return text


def _series_label(row) -> str:
    fixed = []
    for name in ("backend", "mask", "dtype", "L", "d_k", "heads", "kv_heads", "batch"):
        value = getattr(row, name)
        if name != row.variable and value != "" and not (name == "kv_heads"
                                                         and row.variable == "heads"):
            fixed.append(f"{name}={value}" if name not in ("backend", "mask", "dtype")
                         else str(value))
    return ", ".join(fixed)
