"""The scaling section as the report shows it: the verdicts as decided, and more plots.

:func:`scaling_section` explains the fits of :mod:`attnbench.studies.scaling` and plots
them against L; :func:`scaling_sections` turns its verdict lines into a table
(:func:`verdicts_table`) and adds the plots of time against d_k, heads and batch to those
against L.  Nothing here decides a verdict: each fit's outcome, its conclusion and the
reason are those :func:`attnbench.studies.scaling_verdicts.verdict_parts` decided (the console
prints the same), shown as the scaling table stores them, and exponents are written by the
same :func:`attnbench.studies.scaling_verdicts.exponent_text` (``L^2.00 [1.99, 2.02]``).
"""

from __future__ import annotations

import pandas as pd

from attnbench.measure.machine import busy_machine
from attnbench.report import hosts, kinds, plots, variants
from attnbench.section import Section
from attnbench.studies import scaling, scaling_verdicts
from attnbench.studies.scaling import with_parameters

__all__ = ["scaling_section", "scaling_sections", "verdicts_table"]


#: Columns of the verdicts table, in order (those a fits table has).
VERDICT_TABLE = ("backend", "quantity", "variable", "mask", "dtype", "direction", "variant",
                 "kind", "outcome", "exponent", "expected", "n_used", "verdict")


def verdicts_table(fits: pd.DataFrame) -> pd.DataFrame:
    """One line per measured fit, the outcome early: what the scaling section concludes.

    ``exponent`` is the slope and its 95% interval as the console writes it
    (:func:`attnbench.studies.scaling_verdicts.row_exponent`); ``verdict`` is the fit's stored
    conclusion (claim, outcome, reason), or its whole stored line for a table without
    that column: never decided again here.
    """
    measured = with_parameters(fits[fits["quantity"] != "flops"])
    stored = measured["conclusion"] if "conclusion" in measured else measured["verdict"]
    shown = measured.assign(exponent=[scaling_verdicts.row_exponent(row)
                                      for _, row in measured.iterrows()],
                            verdict=stored.fillna("").astype(str))
    columns = ([hosts.GROUP_COLUMN] if hosts.GROUP_COLUMN in shown else []) + [
        c for c in VERDICT_TABLE if c in shown]
    return shown[columns].reset_index(drop=True)


def scaling_sections(table: pd.DataFrame, meta: dict) -> list[Section]:
    """:func:`scaling_section`, its verdicts as a table, and more plots.

    The verdict lines of the section's text become a table (outcome coloured); the plots
    of time against d_k, heads and batch join those against L.
    """
    fits = scaling.scaling_table(table)
    sections = scaling_section(table, fits=fits, meta=meta)
    if fits.empty:
        return sections
    main = sections[0]
    main.anchor = main.anchor or "scaling"
    if "\n\nVerdicts:\n" in main.text:
        main.text = main.text.split("\n\nVerdicts:\n")[0]
    # the fits' verdicts move to the Verdicts table, as studies.scaling decided them
    main.tables = [(caption, table.drop(columns=["verdict", "conclusion"], errors="ignore")
                    if caption == "Fits" else table) for caption, table in main.tables]
    main.tables.insert(0, ("Verdicts: one line per fit (time and memory; FLOP counts are in "
                           "the Fits table)", verdicts_table(fits)))
    (forward, forward_fits), _ = variants.split_directions(table, fits)
    for variable, words in (("d_k", "head size d_k"), ("heads", "heads"),
                            ("batch", "batch")):
        figure = plots.time_vs_variable(forward, forward_fits, variable)
        if figure is not None:
            main.figures.append((f"Time against {words}, log-log, with the fitted law, its "
                                 "95% band and an O(" + variable + ") guide", figure))
    main.figures += variants.backward_figures(table, fits)
    extra = [variants.variants_section(table, fits), kinds.kinds_section(table, fits, meta)]
    return sections + [section for section in extra if section is not None]


def scaling_section(table: pd.DataFrame, fits: pd.DataFrame | None = None,
                    meta: dict | None = None) -> list[Section]:
    """The report's scaling section: the rule, the verdicts and the plots.

    Parameters
    ----------
    table : pandas.DataFrame
        A sweep table (:func:`attnbench.sweep.run.run_sweep`).
    fits : pandas.DataFrame, optional
        :func:`scaling_table` of it (computed if not given).
    meta : dict, optional
        The sweep's ``sweep.json``: its load averages are quoted, with a warning when
        the machine was busy.
    """
    fits = scaling.scaling_table(table) if fits is None else fits
    text = (
        "Time is fitted as t = c + a·x^p (c ≥ 0: the fixed overhead of a call, which bends "
        "a plain log-log line by the fraction c/t), on the medians of every point, "
        "minimising relative residuals; where the claim is quadratic (time against L) the "
        "model has a linear term too, t = c + b·L + a·L^p (b ≥ 0: the per-row work, and a "
        "causal kernel's diagonal tiles, which weigh most at small L and would otherwise "
        "read as a smaller p), and p is the exponent of the leading term. A fit whose "
        f"leading term is less than {1 - scaling_verdicts.OVERHEAD_DOMINATES:.0%} of its largest "
        "point's time is inconclusive (larger sizes are needed). Sliding windows are "
        "fitted against L·W with a term in L (t = c + b·L + a·(L·W)^p): the kernel reads "
        "up to one 64-key cell past each window. The 95% interval on p is a percentile bootstrap "
        "over the repeated samples of every point (each point's samples resampled, the "
        "medians and the fit recomputed), and the complexity class of least residual among "
        "O(x), O(x log x), O(x²), O(x³) is given beside p with the share of resamples that "
        "pick it. Quantity 'time' is the wall-clock time (the speed a user sees); 'cpu' is "
        "the process's CPU time over all its threads (the work, which does not grow while "
        "the process waits for a core). Sweeps without samples are fitted by least squares "
        "on log-log axes (Student-t interval) over the points at least "
        f"{scaling.OVERHEAD_FACTOR}× the backend's smallest call and "
        f"{scaling.MIN_FIT_TIME_S * 1e3:g} ms. "
        "Memory: the peak extra memory of one call minus the smallest call's (B = H = L = "
        "d_k = 1: thread buffers and other fixed costs), where that is positive, by least "
        "squares (tracemalloc is deterministic: no samples to resample). "
        "A fit that uses a starved point (timed while the process's threads waited for "
        "cores other processes held: see the rows' wait_share) is inconclusive. "
        f"An exponent within ±{scaling_verdicts.TOLERANCE} of the expected one counts as "
        "that power; a "
        "verdict is decided from the whole interval: confirmed when it lies inside, not "
        "confirmed when it lies outside, inconclusive when it straddles the boundary. "
        "The fused numba kernel promises at most linear memory (O(L·d) working memory, no "
        "L × L array): its memory verdict checks that upper bound (interval below "
        f"1 + {scaling_verdicts.TOLERANCE}); its fixed per-thread buffers make the measured "
        "slope smaller "
        "than 1 at these sizes. The reference and the plain NumPy peer build the L × L "
        "scores: their memory is checked against L². "
        "FLOPs are counted, not measured (visible pairs × 2·(d_k + d_v)): their fit checks "
        "the count (causal masks see L(L+1)/2 pairs, so their slope is a little under 2). "
        "Backward points (direction 'backward': attention_backward given the forward's out "
        "and lse, the forward not timed; 2.5× the forward's FLOPs) are series of their own, "
        "with the same expectations: O(L²) time, at most O(L) extra memory for the fused "
        "kernel (its gradients included). A sliding window of fixed W is expected O(L)."
    )
    text += _load_text(meta or {})
    if fits.empty:
        text += ("\n\nNo series of this sweep varies a parameter over "
                 f"{scaling_verdicts.MIN_POINTS} or more values, so nothing was fitted.")
        return [Section(title="Scaling", text=text)]
    lines = [f"{row.verdict}  [{_series_label(row)}]" for row in fits.itertuples()
             if row.quantity != "flops"]
    text += "\n\nVerdicts:\n" + "\n".join(lines)
    shown = fits.drop(columns=["intercept", "stderr"], errors="ignore").copy()
    (forward, forward_fits), _ = variants.split_directions(table, fits)
    figures = [("Time against L, log-log, with the fitted slopes and an L² guide "
                "(forward calls without a variant; the backward's and the variants' below)",
                plots.time_vs_length(forward, forward_fits))]
    memory = plots.memory_vs_length(forward, forward_fits)
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
    if busy_machine(max(start, end), cores):
        text += (" The machine was busy: other processes pre-empt the timed threads, which "
                 "inflates times and makes them jump in steps of the scheduler's time slice "
                 "(see the IQR columns); fits can then come out inconclusive or off.")
        if not meta.get("threads"):
            text += (" The check of the cores before the sweep found its threads not "
                     "waiting, so the load came later or in bursts." if meta.get("cores")
                     else "")
            text += (" On a shared machine, fewer threads (--threads) give steadier fits: "
                     "a call on no more threads than free cores never waits for a "
                     "pre-empted worker.")
    return text


def _series_label(row) -> str:
    fixed = []
    for name in ("backend", "mask", "dtype", "direction", "variant", "kind", "L", "d_k",
                 "heads", "kv_heads", "batch"):
        value = getattr(row, name, "")
        if name in ("direction", "variant", "kind") and value in ("forward", "none", "dense"):
            continue
        if name != row.variable and value != "" and not (name == "kv_heads"
                                                         and row.variable == "heads"):
            fixed.append(f"{name}={value}" if name not in ("backend", "mask", "dtype",
                                                            "direction", "variant", "kind")
                         else str(value))
    return ", ".join(fixed)
