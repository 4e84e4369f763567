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
- :func:`attention_heatmaps`: attention weights of a short English sentence, without a
  mask, with a causal mask and with padding.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.ticker import FixedLocator, FuncFormatter, NullLocator

from attnbench.report.sections import Section

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


def _length_axis(ax, lengths) -> None:
    """Log x axis with a labelled tick at each L of the data, no minor tick labels."""
    ax.set_xscale("log")
    ax.xaxis.set_major_locator(FixedLocator(sorted(set(lengths))))
    ax.xaxis.set_major_formatter(FuncFormatter(lambda x, _: f"{x:g}"))
    ax.xaxis.set_minor_locator(NullLocator())
    ax.set_xlabel("sequence length L")


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


def _fit_row(fits: pd.DataFrame | None, quantity: str, fixed: dict):
    """The row of ``fits`` for this L series, or None."""
    if fits is None or fits.empty:
        return None
    rows = fits[(fits["quantity"] == quantity) & (fits["variable"] == "L")]
    for name, value in fixed.items():
        rows = rows[rows[name].astype(str) == str(value)]
    return None if rows.empty else rows.iloc[0]


def time_vs_length(table: pd.DataFrame, fits: pd.DataFrame | None = None) -> Figure | None:
    """Median time against L per backend, log-log, one panel per mask kind."""
    from attnbench.studies.scaling import fit_from_row, fit_mask

    data = _ok(table)
    data = data.assign(_used=fit_mask(data, "time"))
    masks = [m for m in dict.fromkeys(data["mask"])
             if data[data["mask"] == m]["L"].nunique() >= 2]
    if not masks:
        return None
    fig = Figure(figsize=(5.2 * len(masks), 4.4), layout="constrained")
    axes = fig.subplots(1, len(masks), squeeze=False)[0]
    for ax, mask in zip(axes, masks, strict=True):
        panel = data[data["mask"] == mask]
        varying = _varying(panel, SERIES_KEYS)
        used_all = []
        for fixed, series in _length_series(panel, SERIES_KEYS):
            color = _color(fixed["backend"])
            x, y = series["L"].to_numpy(), series["median_ms"].to_numpy()
            yerr = np.vstack([y - series["q25_ms"], series["q75_ms"] - y]).clip(min=0)
            used = series["_used"].to_numpy(bool)
            ax.errorbar(x, y, yerr=yerr, fmt="none", ecolor=color, alpha=0.6)
            ax.plot(x[used], y[used], "o", color=color)
            ax.plot(x[~used], y[~used], "o", mfc="none", color=color)
            used_all.append(series[used])
            label = _series_label({**fixed, "mask": mask}, varying)
            row = _fit_row(fits, "time", {**fixed, "mask": mask})
            fit = None if row is None else fit_from_row(row)
            if fit is not None:
                xs = np.geomspace(fit.x_min, fit.x_max, 50)
                label += f": L^{fit.slope:.2f} ± {fit.ci95:.2f}"
                ax.plot(xs, fit.predict(xs), "-", color=color, label=label)
            else:
                ax.plot(x, y, ":", color=color, label=label + " (no fit)")
        _l2_guide(ax, pd.concat(used_all) if used_all else panel, "median_ms", 2, "∝ L²")
        ax.set(yscale="log", ylabel="median time (ms)", title=f"mask: {mask}")
        _length_axis(ax, panel["L"])
        ax.legend(fontsize="small", loc="upper left")
        ax.grid(True, which="both", alpha=0.3)
    return fig


def _l2_guide(ax, data: pd.DataFrame, column: str, power: float, label: str) -> None:
    """A dashed line of slope ``power`` through the geometric centre of ``data``."""
    data = data[data[column] > 0]
    if data["L"].nunique() < 2:
        return
    x0 = float(np.exp(np.log(data["L"]).mean()))
    y0 = float(np.exp(np.log(data[column]).mean()))
    xs = np.geomspace(data["L"].min(), data["L"].max(), 20)
    ax.plot(xs, y0 * (xs / x0) ** power, "--", color="gray", label=label)


def gflops_by_backend(table: pd.DataFrame, gemm_peaks: dict, *,
                      peak_label: str = "GEMM peak") -> Figure | None:
    """GFLOP/s against L per backend and mask kind, with the GEMM peak of the same run
    (or another reference line per dtype, named by ``peak_label``)."""
    data = _ok(table)
    masks = [m for m in dict.fromkeys(data["mask"])
             if data[data["mask"] == m]["L"].nunique() >= 2]
    if not masks:
        return None
    fig = Figure(figsize=(5.2 * len(masks), 4.2), layout="constrained")
    axes = fig.subplots(1, len(masks), squeeze=False, sharey=True)[0]
    for ax, mask in zip(axes, masks, strict=True):
        panel = data[data["mask"] == mask]
        varying = _varying(panel, SERIES_KEYS)
        for fixed, series in _length_series(panel, SERIES_KEYS):
            ax.plot(series["L"], series["gflops"], "o-", color=_color(fixed["backend"]),
                    label=_series_label(fixed, varying))
        for style, dtype in zip(("-.", ":"), sorted(panel["dtype"].unique()), strict=False):
            peak = gemm_peaks.get(dtype)
            if peak:
                ax.axhline(peak, color="black", linestyle=style,
                           label=f"{dtype} {peak_label} {peak:.0f} GFLOP/s")
        ax.set(yscale="log", ylabel="GFLOP/s", title=f"mask: {mask}")
        _length_axis(ax, panel["L"])
        ax.legend(fontsize="small", loc="best")
        ax.grid(True, which="both", alpha=0.3)
    return fig


def error_by_backend(table: pd.DataFrame) -> Figure | None:
    """Max abs error against the oracle per backend (markers: mask kind), and the tolerance."""
    data = _ok(table)
    data = data[np.isfinite(data["max_abs_err"].astype(float))]
    if data.empty:
        return None
    dtypes = sorted(data["dtype"].unique())
    fig = Figure(figsize=(5.5 * len(dtypes), 4.2), layout="constrained")
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
        ax.set(yscale="log", ylabel="max |error| against the oracle", title=dtype)
        _length_axis(ax, panel["L"])
        ax.legend(fontsize="x-small", ncol=2)
        ax.grid(True, which="both", alpha=0.3)
    return fig


def memory_vs_length(table: pd.DataFrame, fits: pd.DataFrame | None = None) -> Figure | None:
    """Memory that grows with the problem against L, per backend and mask, log-log, with fits.

    The y axis is the peak extra memory of one call minus that of the backend's smallest
    call (:func:`attnbench.studies.scaling.memory_growth`), the quantity the fits are made on.
    """
    from attnbench.studies.scaling import fit_from_row, memory_growth

    data = _ok(table)
    data = data.assign(_growth=memory_growth(data))
    data = data[data["_growth"] > 0]
    keys = SERIES_KEYS + ["mask"]
    series_list = list(_length_series(data, keys))
    if not series_list:
        return None
    fig = Figure(figsize=(7.5, 4.8), layout="constrained")
    ax = fig.subplots()
    for fixed, series in series_list:
        color = _color(fixed["backend"])
        method = series["memory_method"].iloc[0]
        label = f"{fixed['backend']}, {fixed['mask']}" + (" (RSS)" if method == "rss" else "")
        row = _fit_row(fits, "memory", fixed)
        fit = None if row is None else fit_from_row(row)
        linestyle = "-" if fixed["mask"] == "none" else ":"
        if fit is not None:
            label += f": L^{fit.slope:.2f} ± {fit.ci95:.2f}"
            xs = np.geomspace(fit.x_min, fit.x_max, 20)
            ax.plot(xs, fit.predict(xs) / 2**20, linestyle, color=color, alpha=0.5)
        ax.plot(series["L"], series["_growth"] / 2**20, MARKERS.get(fixed["mask"], "o"),
                color=color, linestyle="none", label=label)
    ax.set(yscale="log", ylabel="peak extra memory − smallest call's (MiB)")
    _length_axis(ax, data["L"])
    ax.legend(fontsize="x-small", loc="upper left")
    ax.grid(True, which="both", alpha=0.3)
    return fig


#: The example sentence of the heat maps.
SENTENCE = "The cat sat on the mat because it was tired"


def heatmap_weights(sentence: str = SENTENCE, *, d_model: int = 16, n_pad: int = 3,
                    seed: int = 0) -> list[tuple[str, list[str], np.ndarray]]:
    """Attention weights of one head over a short sentence: no mask, causal, padding.

    The sentence is split into words; each distinct word gets a random embedding
    (d_model entries, seeded), queries and keys are the embeddings times random
    projections W_Q, W_K, and the weights come from
    ``kernels.attention(..., return_weights=True)``.  The padding panel appends
    ``n_pad`` "<pad>" tokens and passes ``key_lengths`` = the number of words: no
    query may attend to a pad.

    Returns
    -------
    list of (title, tokens, weights (L, L))
    """
    import kernels

    words = sentence.lower().split()
    padded = words + ["<pad>"] * n_pad
    rng = np.random.default_rng(seed)
    vocabulary = {word: index for index, word in enumerate(dict.fromkeys(padded))}
    embeddings = rng.standard_normal((len(vocabulary), d_model))  # (V, d_model)
    w_q = rng.standard_normal((d_model, d_model)) / np.sqrt(d_model)
    w_k = rng.standard_normal((d_model, d_model)) / np.sqrt(d_model)

    def weights(tokens, **kwargs):
        x = embeddings[[vocabulary[t] for t in tokens]]  # (L, d_model)
        _, w = kernels.attention(x @ w_q, x @ w_k, x, return_weights=True, **kwargs)
        return w  # (L, L)

    return [
        ("no mask", words, weights(words)),
        ("causal (query i sees keys j ≤ i)", words, weights(words, causal=True)),
        (f"padding ({n_pad} <pad> keys, key_lengths={len(words)})", padded,
         weights(padded, key_lengths=len(words))),
    ]


def attention_heatmaps(panels=None) -> Figure:
    """Heat maps of :func:`heatmap_weights` (computed if not given), side by side."""
    panels = heatmap_weights() if panels is None else panels
    fig = Figure(figsize=(5.4 * len(panels), 5.6), layout="constrained")
    axes = fig.subplots(1, len(panels), squeeze=False)[0]
    for ax, (title, tokens, w) in zip(axes, panels, strict=True):
        image = ax.imshow(w, cmap="viridis", vmin=0, vmax=1)
        ax.set_xticks(range(len(tokens)), tokens, rotation=60, ha="right", fontsize=8)
        ax.set_yticks(range(len(tokens)), tokens, fontsize=8)
        ax.set(xlabel="key", ylabel="query", title=title)
    fig.colorbar(image, ax=axes, shrink=0.8, label="attention weight")
    return fig


def heatmap_section() -> list[Section]:
    """The report's section with :func:`attention_heatmaps` and what the weights show."""
    panels = heatmap_weights()
    (_, words, full), (_, _, causal), (_, padded, padding) = panels
    n = len(words)
    above_diagonal = float(np.max(causal[np.triu_indices(n, k=1)]))
    on_pads = float(np.max(padding[:, n:]))
    row_sums = np.concatenate([w.sum(axis=-1) for _, _, w in panels])
    text = (f'Attention weights of one head on "{SENTENCE}": random word embeddings '
            "(16 entries, seed 0) and random query/key projections, computed with "
            "kernels.attention(..., return_weights=True) on the default backend. Each row "
            "is a query, each column a key.\n\n"
            f"Measured on these weights: the largest causal weight above the diagonal is "
            f"{above_diagonal:g}; the largest weight on a <pad> key is {on_pads:g} (the pad "
            "rows still attend to the words: a padding mask hides keys, not queries); "
            f"row sums lie in [{row_sums.min():.17g}, {row_sums.max():.17g}]; the largest "
            f"weight without a mask is {full.max():.3f}.")
    return [Section(title="Attention heat maps", text=text,
                    figures=[("Attention weights on an example sentence",
                              attention_heatmaps(panels))])]
