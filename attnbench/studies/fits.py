"""The one power-law fit: exponents with intervals from the repeated samples, and model classes.

Two fits, for two kinds of data:

- :func:`fit_power_law`: least squares of ``log y = log a + p · log x`` with Student's t
  interval on the slope.  For exact or deterministic values (FLOP counts, tracemalloc
  peaks), where there are no repeated samples to resample.
- :func:`fit_scaling`: for timings, one set of repeated samples per x.  The model keeps the
  fixed overhead of a call, ``t = c + a · x^p`` (c ≥ 0): its local log-log slope is
  ``p · (1 − c/t)``, so a plain log-log line through points where c matters bends p down.
  The fit minimises the squared *relative* residuals of the per-x medians (every point
  weighs the same whatever its size): for each p of a grid (step :data:`P_STEP`) c and a
  are a linear weighted least-squares problem, the best p is refined by a parabola through
  its neighbours.  The interval on p is a percentile bootstrap over the samples
  (:func:`scipy.stats.bootstrap`, each x's samples resampled independently, the medians
  and the fit recomputed per resample; a fixed seed), not over a handful of residuals.
  Beside the free exponent, the complexity classes O(x), O(x log x), O(x²), O(x³) are
  each fitted as ``c + a · f(x)`` and the one of least relative residual is reported with
  the share of resamples that pick it (the way the ``big_O`` package and Goldsmith et al.,
  "Measuring Empirical Computational Complexity", FSE 2007, do it).
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import numpy as np
from scipy import stats

__all__ = ["CLASSES", "PowerFit", "fit_power_law", "fit_scaling"]

#: The model of a fit, by its lower-order term ("": none; "plain": no overhead either).
_MODELS = {"": "c + a·x^p", "x": "c + b·x + a·x^p", "g": "c + b·g + a·x^p",
           "plain": "a·x^p"}

#: Coarse grid of exponents tried by :func:`fit_scaling` (a > 0, p > 0: a growing cost) ...
P_GRID = np.arange(0.05, 4.5 + 1e-9, 0.05)
#: ... then a fine grid of this step around the best coarse one, then a parabola.
P_STEP = 0.005
#: Bootstrap resamples of a scaling fit.
RESAMPLES = 1000
#: Complexity classes of the model selection: name -> f(x) (x scaled to at most 1).
CLASSES = {
    "n": lambda x: x,
    "n log n": lambda x: x * np.log(x * 2**20),  # log of the unscaled x, up to a constant
    "n^2": lambda x: x**2,
    "n^3": lambda x: x**3,
}


@dataclass(frozen=True)
class PowerFit:
    """A fit ``y = overhead + exp(intercept) · x^slope`` with a 95% interval on the slope."""

    slope: float  # the exponent p
    intercept: float  # log a (natural log, y in its own units)
    stderr: float  # standard error of the slope (nan for a bootstrap fit or 2 points)
    ci95: float  # half-width of the slope's 95% interval
    n: int  # points fitted
    r2: float  # coefficient of determination on the log scale
    x_min: float  # the fitted range of x
    x_max: float
    overhead: float = 0.0  # the fixed part c (0 for a pure power law)
    ci_low: float = np.nan  # the slope's 95% interval (slope ± ci95 for a t interval)
    ci_high: float = np.nan
    best_class: str = ""  # complexity class of least relative residual ("" if not selected)
    class_share: float = np.nan  # share of the bootstrap resamples that pick best_class
    method: str = "least squares, t interval"
    lower: float = 0.0  # coefficient b of the lower-order term (0 without one)
    lower_term: str = ""  # the lower-order term: "x" (linear in x), "g" (given values), ""
    leading_share: float = np.nan  # a·x^p over the fitted time at the largest x

    def predict(self, x, lower_values=None):
        """``overhead + lower · g + exp(intercept) · x^slope``.

        ``g`` is ``lower_values`` where given, else x itself for a linear term in x
        (``lower_term == "x"``), else 0.
        """
        x = np.asarray(x, dtype=float)
        if lower_values is None:
            lower_values = x if self.lower_term == "x" else 0.0
        return (self.overhead + self.lower * np.asarray(lower_values, dtype=float)
                + np.exp(self.intercept) * x**self.slope)

    def dominance(self) -> float:
        """The leading term's share of the fitted value at the largest x (1: no overhead
        and no lower-order term; recomputed from the coefficients where ``leading_share``
        was not kept)."""
        if np.isfinite(self.leading_share):
            return float(self.leading_share)
        total = float(self.predict(self.x_max))
        leading = float(np.exp(self.intercept) * self.x_max**self.slope)
        return leading / total if total > 0 else np.nan


def fit_power_law(x, y) -> PowerFit:
    """Fit ``y = a · x^p`` by least squares on log-log axes.

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
        ci95 = float(stats.t.ppf(0.975, n - 2)) * stderr
    else:
        stderr = ci95 = float("nan")
    return PowerFit(slope=slope, intercept=intercept, stderr=stderr, ci95=ci95, n=n, r2=r2,
                    x_min=float(x.min()), x_max=float(x.max()),
                    ci_low=slope - ci95, ci_high=slope + ci95)


def _weighted_fits(basis: np.ndarray, medians: np.ndarray, lower: np.ndarray | None = None):
    """Fit ``m ≈ c + b · lower + a · basis`` minimising squared relative residuals.

    Non-negative least squares over at most three columns, by enumerating the active
    sets (c and b free or held at 0; a free), vectorised over the candidates and the
    resamples; the fit of least residual among those with c ≥ 0, b ≥ 0 and a > 0 is kept.

    Parameters
    ----------
    basis : ndarray, shape (P, n) or (B, P, n)
        One candidate f(x) per row (per resample).
    medians : ndarray, shape (B, n)
        One set of per-x medians per resample.
    lower : ndarray, shape (n,), optional
        A lower-order term g (scaled like ``basis``); None fits ``c + a · basis``.

    Returns
    -------
    c, b, a, rss : ndarray, shape (B, P) each
        ``rss`` is inf where no admissible fit has a > 0 (a cost that does not grow).
    """
    weight = 1.0 / medians[:, None, :]  # (B, 1, n): relative residuals
    leading = (basis if basis.ndim == 3 else basis[None]) * weight  # (B, P, n)
    shape = np.broadcast_shapes(leading.shape, weight.shape)[:-1]
    columns = {"c": weight, "a": leading}
    if lower is not None:
        columns["b"] = weight * lower
    # The normal equations' sums, once: every active set takes its entries from them.
    sums = {name: np.broadcast_to(np.sum(col, -1), shape) for name, col in columns.items()}
    products = {}
    for i, first in enumerate(columns):
        for second in list(columns)[i:]:
            products[first, second] = products[second, first] = np.broadcast_to(
                np.sum(columns[first] * columns[second], -1), shape)
    active_sets = [("a",), ("c", "a")] + ([("b", "a"), ("c", "b", "a")] if lower is not None
                                          else [])
    n = medians.shape[-1]
    best = {name: np.zeros(shape) for name in ("c", "b", "a")}
    best_rss = np.full(shape, np.inf)
    for names in active_sets:
        gram = np.stack([np.stack([products[r, c] for c in names], -1) for r in names], -2)
        rhs = np.stack([sums[name] for name in names], -1)  # the target is 1 at every point
        scale = np.trace(gram, axis1=-2, axis2=-1)[..., None, None]
        with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
            coef = np.linalg.solve(gram + 1e-12 * scale * np.eye(len(names)), rhs[..., None])
        coef = coef[..., 0]
        with np.errstate(invalid="ignore", over="ignore"):
            rss = n - np.sum(coef * rhs, axis=-1)
        admissible = np.all(coef[..., :-1] >= 0, axis=-1) & (coef[..., -1] > 0)
        rss = np.where(admissible & np.isfinite(rss), np.maximum(rss, 0.0), np.inf)
        better = rss < best_rss
        best_rss = np.where(better, rss, best_rss)
        for i, name in enumerate(names):
            best[name] = np.where(better, coef[..., i], best[name])
        for name in {"c", "b"} - set(names):
            best[name] = np.where(better, 0.0, best[name])
    return best["c"], best["b"], best["a"], best_rss


def _exponent(scaled_x: np.ndarray, medians: np.ndarray, overhead: bool,
              lower: np.ndarray | None = None) -> np.ndarray:
    """The best p for each row of ``medians`` (B, n): grid search, parabolic refinement.

    A row whose best fit nowhere has a > 0 (a cost that falls with x) gets the grid's
    smallest p; inf residuals of such fits are expected, hence the silenced warnings.
    """
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        return _exponent_unchecked(scaled_x, medians, overhead, lower)


def _exponent_unchecked(scaled_x: np.ndarray, medians: np.ndarray,
                        overhead: bool, lower: np.ndarray | None) -> np.ndarray:
    if not overhead:  # plain log-log least squares, vectorised over the rows
        lx = np.log(scaled_x) - np.log(scaled_x).mean()
        ly = np.log(medians)
        return (ly - ly.mean(-1, keepdims=True)) @ lx / (lx @ lx)
    coarse = _weighted_fits(scaled_x[None, :] ** P_GRID[:, None], medians, lower)[3]
    offsets = np.arange(-10, 11) * P_STEP  # +- one coarse step
    fine_p = np.maximum(P_GRID[np.argmin(coarse, axis=-1)][:, None] + offsets, P_GRID[0])
    rss = _weighted_fits(scaled_x[None, None, :] ** fine_p[:, :, None], medians, lower)[3]
    best = np.clip(np.argmin(rss, axis=-1), 1, len(offsets) - 2)
    rows = np.arange(len(best))
    left, mid, right = rss[rows, best - 1], rss[rows, best], rss[rows, best + 1]
    curvature = left - 2 * mid + right
    shift = np.where(curvature > 0, 0.5 * (left - right) / curvature, 0.0)
    return fine_p[rows, best] + np.clip(np.nan_to_num(shift), -1, 1) * P_STEP


def _best_class(scaled_x: np.ndarray, medians: np.ndarray) -> np.ndarray:
    """Index into :data:`CLASSES` of least relative residual, per row of ``medians``."""
    basis = np.stack([f(scaled_x) for f in CLASSES.values()])
    return np.argmin(_weighted_fits(basis, medians)[3], axis=-1)


def fit_scaling(x, samples, *, overhead: bool = True, lower=None,
                resamples: int = RESAMPLES) -> PowerFit:
    """Fit ``t = c + a · x^p`` to repeated samples; bootstrap interval and class selection.

    With ``lower`` the model has a lower-order term too: ``t = c + b · g + a · x^p``
    (c, b ≥ 0).  Attention's time is ``a·L²·D`` (the score and value products) plus
    ``b·L·D`` (per-row work: the softmax's bookkeeping, the causal diagonal tiles, the
    output) plus c; a fit of ``c + a·L^p`` alone reads that linear part as curvature and
    bends p (down for a causal kernel whose diagonal tiles weigh most at small L, up where
    the linear part rises into the range).  p is then the exponent of the *leading* term,
    the one the asymptotic claim is about; :attr:`PowerFit.leading_share` says how much of
    the largest point's time that term is.

    Parameters
    ----------
    x : array_like of positive numbers
        The varied parameter, at least 3 distinct values.
    samples : sequence of array_like
        ``samples[i]``: the repeated measurements at ``x[i]`` (at least 2 each).
    overhead : bool, default True
        Fit the fixed overhead c; False fits ``a · x^p`` (log-log least squares).
    lower : {None, "x"} or array_like, optional
        The lower-order term g: ``"x"`` for a term linear in x, or its value at each point
        (e.g. L for a fit against L·W).  Needs ``overhead=True``.
    resamples : int, default RESAMPLES

    Returns
    -------
    PowerFit
        ``slope`` from the medians, ``ci_low``/``ci_high`` the 95% percentile-bootstrap
        interval (``ci95`` its half-width), ``overhead`` c and ``intercept`` log a in the
        samples' units, ``best_class`` and ``class_share``; ``r2`` of the fit of the
        medians on the log scale; ``lower`` b (per unit of g), ``lower_term`` and
        ``leading_share``.  The complexity classes are fitted as ``c + a · f(x)``
        whatever ``lower`` is (a class plus a free linear term would always beat O(x)).
    """
    x = np.asarray(x, dtype=float)
    samples = [np.asarray(s, dtype=float) for s in samples]
    if len(samples) != x.size or len(np.unique(x)) < 3:
        raise ValueError(f"need one sample set per x and at least 3 distinct x; got "
                         f"{x.size} x and {len(samples)} sample sets")
    if any(s.size < 2 or (s <= 0).any() for s in samples) or (x <= 0).any():
        raise ValueError("every x needs at least 2 positive samples; x must be positive")
    if lower is not None and not overhead:
        raise ValueError("a lower-order term needs the overhead model (overhead=True)")
    lower_term = "" if lower is None else "x" if isinstance(lower, str) and lower == "x" \
        else "g"
    g = None if lower is None else x if lower_term == "x" else np.asarray(lower, dtype=float)
    if g is not None and (g.shape != x.shape or (g <= 0).any()):
        raise ValueError(f"lower must be 'x' or one positive value per x; got {lower!r}")
    scale = x.max()
    scaled = x / scale
    g_scale = 1.0 if g is None else g.max()
    scaled_g = None if g is None else g / g_scale
    medians = np.array([[np.median(s) for s in samples]])

    def statistic(*resampled, axis=-1):
        rows = np.stack([np.median(s, axis=axis) for s in resampled], axis=-1)
        return _exponent(scaled, rows.reshape(-1, x.size), overhead,
                         scaled_g).reshape(rows.shape[:-1])

    slope = float(_exponent(scaled, medians, overhead, scaled_g)[0])
    with warnings.catch_warnings():  # identical resampled exponents: a zero-width interval
        warnings.simplefilter("ignore", RuntimeWarning)
        boot = stats.bootstrap(samples, statistic, n_resamples=resamples, method="percentile",
                               vectorized=True, paired=False,
                               random_state=np.random.default_rng(0))
    low, high = float(boot.confidence_interval.low), float(boot.confidence_interval.high)
    if not np.isfinite(low):  # every resample gave the same exponent
        low = high = slope
    basis = (scaled ** slope)[None, :]
    b = 0.0
    if overhead:
        c, b, a, _ = _weighted_fits(basis, medians, scaled_g)
        c, b, a = float(c[0, 0]), float(b[0, 0]), float(a[0, 0])
    else:
        c, a = 0.0, float(np.exp(np.mean(np.log(medians[0]) - slope * np.log(scaled))))
    lower_part = 0.0 if g is None else b * scaled_g
    fitted = c + lower_part + a * scaled**slope
    top = int(np.argmax(x))
    leading_share = float(a * scaled[top] ** slope / fitted[top]) if fitted[top] > 0 else np.nan
    log_m = np.log(medians[0])
    sst = float(np.sum((log_m - log_m.mean()) ** 2))
    with np.errstate(invalid="ignore", divide="ignore"):  # a fit that is 0 somewhere: nan
        r2 = 1 - float(np.sum((log_m - np.log(fitted)) ** 2)) / sst if sst > 0 else 1.0
    picks = _best_class(scaled, _resampled_medians(samples, resamples))
    best = int(_best_class(scaled, medians)[0])
    intercept = float(np.log(a) - slope * np.log(scale)) if a > 0 else -np.inf
    return PowerFit(slope=slope, intercept=intercept,
                    stderr=np.nan, ci95=(high - low) / 2, n=x.size, r2=r2,
                    x_min=float(x.min()), x_max=float(x.max()), overhead=c,
                    ci_low=low, ci_high=high, best_class=list(CLASSES)[best],
                    class_share=float(np.mean(picks == best)),
                    method=_MODELS[lower_term if overhead else "plain"]
                    + ", bootstrap over samples",
                    lower=b / g_scale, lower_term=lower_term, leading_share=leading_share)


def _resampled_medians(samples, resamples: int) -> np.ndarray:
    """(resamples, n) medians of the samples resampled with replacement (fixed seed)."""
    rng = np.random.default_rng(1)
    columns = [np.median(s[rng.integers(0, s.size, (resamples, s.size))], axis=-1)
               for s in samples]
    return np.stack(columns, axis=-1)
