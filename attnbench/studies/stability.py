"""The softmax-stability study: what the 1/√d_k scale, the temperature and max-subtraction do.

Three measurements, each a pandas DataFrame (and the measured gradients of
:mod:`attnbench.studies.stability_gradients`, shown beside the first):

- :func:`scaling_study`: for d_k = 4 ... 1024, queries and keys with independent
  unit-variance entries (seeded) give logits ``q·k`` (unscaled) or ``q·k/√d_k`` (scaled);
  per d_k and variant: the variance of the logits, the largest weight per row (mean), the
  row entropy (mean, in nats, and as a fraction of log L), the fraction of nearly one-hot
  rows (largest weight > :data:`ONE_HOT_THRESHOLD`), and the Frobenius norm of the
  softmax Jacobian ``J = diag(p) − p pᵀ`` (mean over rows): the gradient of the weights
  with respect to the logits, the one the sources say vanishes without the scale.  The
  Frobenius norm bounds the spectral norm from above (``‖J‖₂ ≤ ‖J‖_F``), so a small
  Frobenius norm means a small gradient in every direction.  It also gives the fraction of
  rows where a naive float32 softmax (no max-subtraction) overflows.
- :func:`temperature_study`: entropy of ``softmax(x / T)`` against T for a few logit
  vectors, and whether each curve is monotone.
- :func:`overflow_study`: the float32 logit at which ``exp`` overflows, where a naive
  softmax first returns inf/NaN (one large logit; a row of L equal logits, whose sum
  overflows first; a row of very negative logits, whose sum underflows to 0), against
  :func:`kernels.softmax`, which subtracts the maximum first.

All of it runs in well under a second.  :func:`section` turns it into report sections.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from attnbench import kernels
from attnbench.section import Section
from attnbench.studies.stability_gradients import (
    VANISHING_FRACTION,
    gradient_figure,
    gradient_study,
    gradient_summary,
)
from attnbench.studies.stability_half import half_study

__all__ = [
    "D_K_VALUES",
    "ONE_HOT_THRESHOLD",
    "SMALL_JACOBIAN",
    "jacobian_frobenius",
    "naive_softmax",
    "overflow_study",
    "row_entropy",
    "scaling_study",
    "section",
    "temperature_study",
]

#: Head sizes studied: powers of two from 4 to 1024.
D_K_VALUES = tuple(2**p for p in range(2, 11))
#: A row counts as nearly one-hot when its largest weight exceeds this.
ONE_HOT_THRESHOLD = 0.99
#: A row's gradient counts as vanishing when ‖diag(p) − ppᵀ‖_F is below this: a tenth of
#: the norm of a well-spread row (about 0.135 for the scaled logits over 128 keys).
SMALL_JACOBIAN = 0.01
#: Seed of every random draw in the study.
SEED = 0


def row_entropy(p: np.ndarray) -> np.ndarray:
    """Entropy in nats of each row of ``p`` (last axis), with 0·log 0 = 0."""
    p = np.asarray(p, dtype=np.float64)
    logs = np.log(p, out=np.zeros_like(p), where=p > 0)
    return -(p * logs).sum(axis=-1)


def jacobian_frobenius(p: np.ndarray) -> np.ndarray:
    """Frobenius norm of the softmax Jacobian ``diag(p) − p pᵀ`` of each row of ``p``.

    ``‖J‖_F² = Σᵢ (pᵢ − pᵢ²)² + Σ_{i≠j} pᵢ² pⱼ² = Σ pᵢ² − 2 Σ pᵢ³ + (Σ pᵢ²)²``: O(L) per
    row, no L x L matrix.  0 for a one-hot row, about 1/√L for a uniform row of L entries,
    and largest for rows in between (two equal weights of 1/2: ‖J‖_F = 1/√2).
    """
    p = np.asarray(p, dtype=np.float64)
    s2 = (p**2).sum(axis=-1)
    s3 = (p**3).sum(axis=-1)
    return np.sqrt(np.maximum(s2 - 2 * s3 + s2**2, 0.0))


def naive_softmax(x, axis=-1):
    """``exp(x) / Σ exp(x)`` without subtracting the maximum, in the dtype of ``x``."""
    x = np.asarray(x)
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        e = np.exp(x)
        return e / e.sum(axis=axis, keepdims=True)


def _naive_wrong(naive: np.ndarray, reference: np.ndarray) -> np.ndarray:
    """Rows where a naive softmax is non-finite or off by more than 1e-3 from ``reference``."""
    with np.errstate(invalid="ignore"):
        off = np.abs(naive.astype(np.float64) - reference) > 1e-3
    return (~np.isfinite(naive) | off).any(axis=-1)


def scaling_study(d_k_values=D_K_VALUES, *, n_queries: int = 256, n_keys: int = 128,
                  seed: int = SEED) -> pd.DataFrame:
    """Softmax statistics of random attention logits against d_k, with and without 1/√d_k.

    Parameters
    ----------
    d_k_values : iterable of int
        Head sizes.
    n_queries : int, default 256
        Rows (queries) per d_k.
    n_keys : int, default 128
        Keys per row: L, the length of each softmax.
    seed : int
        One generator for the whole study, drawn in the order of ``d_k_values``.

    Returns
    -------
    DataFrame
        One row per (d_k, scaled): ``logit_var``, ``logit_std``, ``max_weight_mean``,
        ``entropy_mean`` (nats), ``entropy_fraction`` (of log L), ``one_hot_fraction``,
        ``jacobian_fro_mean``, ``jacobian_fro_median``, ``small_gradient_fraction`` (rows
        with a Jacobian norm below :data:`SMALL_JACOBIAN`),
        ``naive_float32_wrong_fraction`` (rows where a float32 softmax without
        max-subtraction returns inf/NaN or is off by more than 1e-3), with ``L`` and
        ``one_hot_threshold``.
    """
    rng = np.random.default_rng(seed)
    rows = []
    for d_k in d_k_values:
        q = rng.standard_normal((n_queries, d_k))  # (R, d_k), unit-variance entries
        k = rng.standard_normal((n_keys, d_k))  # (L, d_k)
        raw = q @ k.T  # (R, L): var = d_k
        for scaled in (False, True):
            logits = raw / np.sqrt(d_k) if scaled else raw
            p = kernels.softmax(logits, axis=-1)  # float64, stable
            naive32 = naive_softmax(logits.astype(np.float32))
            jacobian = jacobian_frobenius(p)  # (R,)
            rows.append({
                "d_k": d_k, "scaled": scaled, "L": n_keys,
                "logit_var": float(logits.var()),
                "logit_std": float(logits.std()),
                "max_weight_mean": float(p.max(axis=-1).mean()),
                "entropy_mean": float(row_entropy(p).mean()),
                "entropy_fraction": float(row_entropy(p).mean() / np.log(n_keys)),
                "one_hot_fraction": float((p.max(axis=-1) > ONE_HOT_THRESHOLD).mean()),
                "one_hot_threshold": ONE_HOT_THRESHOLD,
                "jacobian_fro_mean": float(jacobian.mean()),
                "jacobian_fro_median": float(np.median(jacobian)),
                "small_gradient_fraction": float((jacobian < SMALL_JACOBIAN).mean()),
                "naive_float32_wrong_fraction": float(_naive_wrong(naive32, p).mean()),
            })
    return pd.DataFrame(rows)


def temperature_study(temperatures=None, *, n: int = 16, seed: int = SEED) -> pd.DataFrame:
    """Entropy of ``kernels.softmax(x, temperature=T)`` against T for a few logit vectors.

    The vectors: the sources' example scores [0.9, 0.1, 0.3], a random vector of ``n``
    unit-variance logits, the same ×8 (the spread of unscaled logits at d_k = 64) and a
    vector with a tie at the top (as T → 0 the weight splits over the tie, entropy → log 2).

    Returns
    -------
    DataFrame
        One row per (logits, T): ``entropy``, ``entropy_fraction`` (of log n),
        ``max_weight``; and per logits ``monotone`` (entropy never decreases as T grows,
        up to 1e-12) in every row of that vector.
    """
    temperatures = np.geomspace(0.02, 50.0, 61) if temperatures is None else temperatures
    temperatures = np.asarray(temperatures, dtype=np.float64)
    rng = np.random.default_rng(seed)
    base = rng.standard_normal(n)
    vectors = {
        "[0.9, 0.1, 0.3]": np.array([0.9, 0.1, 0.3]),
        f"random, n={n}": base,
        f"random ×8, n={n}": 8 * base,
        "tie at the top [2, 2, 0, -1]": np.array([2.0, 2.0, 0.0, -1.0]),
    }
    rows = []
    for name, x in vectors.items():
        entropies = []
        for T in temperatures:
            p = kernels.softmax(x, temperature=float(T))
            entropies.append(float(row_entropy(p)))
            rows.append({"logits": name, "T": float(T), "entropy": entropies[-1],
                         "entropy_fraction": entropies[-1] / np.log(len(x)),
                         "max_weight": float(p.max())})
        monotone = bool(np.all(np.diff(entropies) >= -1e-12))
        for row in rows[-len(temperatures):]:
            row["monotone"] = monotone
    return pd.DataFrame(rows)


def _first_float32(predicate, lo: float, hi: float) -> float:
    """Smallest float32 x in (lo, hi] with ``predicate(x)`` true (predicate monotone in x)."""
    def bits(x):  # positive float32 values order like their bit patterns
        return int(np.array(x, np.float32).view(np.int32))

    def value(b):
        return np.array(b, np.int32).view(np.float32)[()]

    lo_bits, hi_bits = bits(lo), bits(hi)
    if predicate(value(lo_bits)) or not predicate(value(hi_bits)):
        raise ValueError(f"predicate must be false at lo={lo} and true at hi={hi}")
    while hi_bits - lo_bits > 1:
        mid = (lo_bits + hi_bits) // 2
        if predicate(value(mid)):
            hi_bits = mid
        else:
            lo_bits = mid
    return float(value(hi_bits))


def overflow_study(n_keys: int = 128) -> pd.DataFrame:
    """Where a float32 softmax without max-subtraction breaks, and that the stable one does not.

    A naive softmax "breaks" when it returns inf or NaN, or weights that do not sum to 1
    (within 1e-3): once the float32 sum overflows to inf, ``exp(x)/inf`` is a silent 0.

    Returns
    -------
    DataFrame
        One row per case: ``case``, ``threshold`` (the smallest float32 logit magnitude at
        which the naive softmax breaks, found to the last bit by bisection), ``formula``
        (what theory predicts), ``naive_at_threshold``, ``stable_at_threshold`` (the first
        weight of :func:`naive_softmax` and of :func:`kernels.softmax` there) and
        ``stable_ok_at_100x`` (``kernels.softmax`` finite and summing to 1 at 100x the
        threshold).
    """
    f32 = np.float32
    max_log = float(np.log(np.finfo(np.float32).max))

    def broken(x):
        with np.errstate(invalid="ignore"):
            p = naive_softmax(x)
            return not (np.isfinite(p).all() and abs(float(p.sum(dtype=np.float64)) - 1) < 1e-3)

    def ok(p):
        return bool(np.isfinite(p).all() and abs(float(p.sum(dtype=np.float64)) - 1) < 1e-5)

    cases = [
        ("one logit x, two logits 0: exp(x) overflows, inf/inf = NaN",
         lambda x: np.array([x, 0, 0], f32), f"ln(float32 max) = {max_log:.6g}"),
        (f"{n_keys} equal logits x: the sum overflows, every weight a silent 0",
         lambda x: np.full(n_keys, x, f32),
         f"ln(float32 max) − ln {n_keys} = {max_log - np.log(n_keys):.6g}"),
        (f"{n_keys} equal logits −x: every exp underflows, 0/0 = NaN",
         lambda x: np.full(n_keys, -x, f32),
         f"exp(−x) rounds to 0 below half the smallest subnormal 2^−149: "
         f"x > 150·ln 2 = {150 * np.log(2):.6g}"),
    ]
    rows = []
    for name, make, formula in cases:
        threshold = _first_float32(lambda x, make=make: broken(make(x)), 1.0, 1000.0)
        x = make(f32(threshold))
        rows.append({
            "case": name, "threshold": threshold, "formula": formula,
            "naive_at_threshold": float(naive_softmax(x)[0]),
            "stable_at_threshold": float(kernels.softmax(x)[0]),
            "stable_ok_at_100x": ok(kernels.softmax(make(f32(100 * threshold)))),
        })
    return pd.DataFrame(rows)


# --- report ---------------------------------------------------------------------------------


def scaling_figure(study: pd.DataFrame):
    """Entropy fraction, largest weight and Jacobian norm against d_k, with and without scale."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(11, 3.4), layout="constrained")
    axes = fig.subplots(1, 3)
    panels = [("entropy_fraction", "row entropy / log L"),
              ("max_weight_mean", "largest weight per row (mean)"),
              ("jacobian_fro_mean", "‖diag(p) − ppᵀ‖_F (mean)")]
    for ax, (column, label) in zip(axes, panels, strict=True):
        for scaled, style in ((True, "o-"), (False, "s--")):
            part = study[study["scaled"] == scaled]
            ax.plot(part["d_k"], part[column], style,
                    label="q·k/√d_k" if scaled else "q·k (unscaled)")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("d_k")
        ax.set_title(label, fontsize=10)
        ax.grid(alpha=0.3)
    axes[0].legend()
    L = int(study["L"].iloc[0])
    fig.suptitle(f"Softmax of random logits over L = {L} keys (q, k entries ~ N(0, 1))",
                 fontsize=11)
    return fig


def temperature_figure(study: pd.DataFrame):
    """Entropy (fraction of log n) and largest weight against the temperature T."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(10, 3.4), layout="constrained")
    axes = fig.subplots(1, 2)
    for name, part in study.groupby("logits", sort=False):
        axes[0].plot(part["T"], part["entropy_fraction"], label=name)
        axes[1].plot(part["T"], part["max_weight"], label=name)
    for ax, label in zip(axes, ("entropy / log n", "largest weight"), strict=True):
        ax.set_xscale("log")
        ax.set_xlabel("temperature T")
        ax.set_title(label, fontsize=10)
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.suptitle("softmax(x / T): higher T flattens, lower T sharpens", fontsize=11)
    return fig


def summary(study: pd.DataFrame) -> str:
    """Two sentences on the scaling study, with its numbers."""
    scaled = study[study["scaled"]].set_index("d_k")
    raw = study[~study["scaled"]].set_index("d_k")
    lo, hi = scaled.index.min(), scaled.index.max()
    return (
        f"With the 1/√d_k scale the logit variance stays near 1 "
        f"({scaled['logit_var'].min():.2f}–{scaled['logit_var'].max():.2f}) and the row "
        f"entropy near {scaled['entropy_fraction'].mean():.0%} of log L for every d_k from "
        f"{lo} to {hi}. Without it the variance grows as d_k ({raw['logit_var'][lo]:.1f} → "
        f"{raw['logit_var'][hi]:.0f}): the largest weight rises from "
        f"{raw['max_weight_mean'][lo]:.2f} to {raw['max_weight_mean'][hi]:.2f}, "
        f"{raw['one_hot_fraction'][hi]:.0%} of rows are nearly one-hot (max > "
        f"{ONE_HOT_THRESHOLD}) at d_k = {hi}, and the Jacobian norm "
        + _jacobian_path(raw["jacobian_fro_mean"])
        + f" (scaled: {scaled['jacobian_fro_mean'][hi]:.3f})."
    )


def _jacobian_path(norms: pd.Series) -> str:
    """How the unscaled Jacobian norm moves with d_k, its peak included (it may rise first)."""
    lo, hi, peak = norms.index.min(), norms.index.max(), norms.idxmax()
    if peak in (lo, hi):
        verb = "falls" if norms[hi] < norms[lo] else "rises"
        return f"{verb} from {norms[lo]:.3f} at d_k = {lo} to {norms[hi]:.3f} at d_k = {hi}"
    return (f"goes from {norms[lo]:.3f} at d_k = {lo} up to {norms[peak]:.3f} at d_k = {peak}, "
            f"then down to {norms[hi]:.3f} at d_k = {hi}")


def section(scaling: pd.DataFrame | None = None, temperature: pd.DataFrame | None = None,
            overflow: pd.DataFrame | None = None,
            gradients: pd.DataFrame | None = None) -> list[Section]:
    """The report's softmax-stability sections (scaling, temperature, overflow).

    ``gradients`` (default: :func:`~attnbench.studies.stability_gradients.gradient_study`
    over :data:`D_K_VALUES`) is shown in the scaling section, after the statistics table.
    """
    scaling = scaling_study() if scaling is None else scaling
    gradients = gradient_study(D_K_VALUES) if gradients is None else gradients
    temperature = temperature_study() if temperature is None else temperature
    overflow = overflow_study() if overflow is None else overflow
    columns = ["d_k", "scaled", "logit_var", "max_weight_mean", "entropy_fraction",
               "one_hot_fraction", "jacobian_fro_mean", "jacobian_fro_median",
               "small_gradient_fraction", "naive_float32_wrong_fraction"]
    monotone = temperature.groupby("logits", sort=False)["monotone"].first()
    return [
        Section(
            title="Softmax stability: the 1/√d_k scale", anchor="stability",
            text=(summary(scaling) + " " + gradient_summary(gradients)
                  + "\n\nJacobian norm: Frobenius norm of diag(p) − ppᵀ, the derivative of "
                  "the weights with respect to the logits (an upper bound on its spectral "
                  "norm). Nearly one-hot: largest weight > "
                  f"{ONE_HOT_THRESHOLD}; vanishing gradient: Jacobian norm below "
                  f"{SMALL_JACOBIAN}. The last column is the fraction of rows where a float32 "
                  "softmax without max-subtraction returns inf/NaN or wrong weights. The "
                  "gradients: one backward call per d_k and variant (256 queries, 128 keys, "
                  "q, k, v and dout ~ N(0, 1)); a row of dQ vanishes below "
                  f"{VANISHING_FRACTION:g} of the scaled median at its d_k."),
            tables=[("Statistics per d_k, scaled and unscaled", scaling[columns]),
                    ("Gradients through kernels.attention_backward: row norms of dQ and dK",
                     gradients)],
            figures=[("Entropy, largest weight and Jacobian norm against d_k",
                      scaling_figure(scaling)),
                     ("Measured gradients against d_k, beside the Jacobian norm",
                      gradient_figure(gradients, scaling))]),
        Section(
            title="Softmax temperature", anchor="temperature",
            text=("Entropy of softmax(x / T) over T from "
                  f"{temperature['T'].min():g} to {temperature['T'].max():g}. Monotone "
                  "(never decreasing as T grows): "
                  + ", ".join(f"{name}: {'yes' if ok else 'NO'}"
                              for name, ok in monotone.items()) + "."),
            figures=[("Entropy and largest weight against T", temperature_figure(temperature))]),
        Section(
            title="Float32 overflow without max-subtraction", anchor="overflow",
            text=("The logit magnitude at which exp(x)/Σexp(x) computed in float32 first "
                  "returns inf or NaN, found to the last bit, and kernels.softmax (which "
                  "subtracts the row maximum first) at the same inputs and at 100× them."),
            tables=[("Where a naive float32 softmax breaks", overflow)]),
        Section(
            title="Float16: masks and large logits", anchor="float16",
            text=("What half precision does (attnbench.studies.stability_half): float16(−1e9) "
                  "is −inf (C25), a float16 softmax overflows beyond 65504 while "
                  "kernels.attention keeps float16 scores in float32, and the kernel's "
                  "error on float16 inputs, scaled and unscaled."),
            tables=[("Float16 points", half_study())]),
    ]
