"""The scaling section as the report shows it: verdicts in plain words, and more plots.

:func:`attnbench.studies.scaling.section` fits and explains; :func:`scaling_sections`
turns its verdict lines into a table whose ``verdict`` column is written here from each
fit's numbers (:func:`reading`: where the expected exponent lies against the interval,
which side the slope falls on, the nearest whole power only when it differs), and adds
the plots of time against d_k, heads and batch to those against L.
"""

from __future__ import annotations

import pandas as pd

from attnbench.report import hosts, plots
from attnbench.report.sections import Section
from attnbench.studies import scaling

__all__ = ["reading", "scaling_sections", "verdicts_table"]


#: Columns of the verdicts table, in order (those a fits table has).
VERDICT_TABLE = ("backend", "quantity", "variable", "mask", "dtype", "outcome", "exponent",
                 "expected", "n_used", "verdict")


def _power(variable: str, exponent: float) -> str:
    exponent = round(float(exponent), 2)
    if exponent == 0:
        return "O(1)"
    if exponent == 1:
        return f"O({variable})"
    power = {2: "²", 3: "³"}.get(exponent, f"^{exponent:g}")
    return f"O({variable}{power})"


def reading(row) -> str:
    """A fit's verdict in plain words, from its numbers (its own text where the outcome is
    not one of confirmed / not confirmed / inconclusive)."""
    outcome, variable = str(row.get("outcome", "")), str(row.get("variable", "x"))
    slope, ci, expected = row.get("slope"), row.get("ci95"), row.get("expected")
    if pd.isna(slope):
        n = row.get("n_used")
        return (f"no fit: {0 if pd.isna(n) else int(n)} usable point(s), "
                f"{getattr(scaling, 'MIN_POINTS', 3)} needed")
    if outcome not in ("confirmed", "not confirmed", "inconclusive") or pd.isna(expected):
        return str(row.get("verdict", ""))
    ci = 0.0 if pd.isna(ci) else float(ci)
    margin, max_ci = getattr(scaling, "MARGIN", 0.1), getattr(scaling, "MAX_CI", 0.3)
    low, high = slope - ci, slope + ci
    upper_bound = (row.get("quantity") == "memory"
                   and getattr(scaling, "MEMORY_EXPONENTS", {}).get(row.get("backend"),
                                                                    (None, False))[1])
    claim = ("at most " if upper_bound else "") + _power(variable, expected)
    if outcome == "inconclusive":
        return (f"inconclusive: the 95% interval (±{ci:.2f}) is wider than ±{max_ci:g}, too "
                "wide to tell exponents apart; measure again on a quieter machine "
                "(--threads 1)")
    if outcome == "confirmed":
        if upper_bound:
            return (f"{claim} confirmed: the slope's interval starts at {low:.2f}, at or "
                    f"below {expected:g} + {margin:g}")
        return (f"{claim} confirmed: {expected:g} lies within the slope's interval "
                f"[{low:.2f}, {high:.2f}] widened by ±{margin:g}")
    side = "below" if slope < expected else "above"
    text = f"{claim} not confirmed: the slope {slope:.2f} ± {ci:.2f} is {side} {expected:g}"
    nearest = round(float(slope))
    if nearest != round(float(expected)):
        text += f"; the nearest whole power is {_power(variable, nearest)}"
    return text


def verdicts_table(fits: pd.DataFrame) -> pd.DataFrame:
    """One line per measured fit, the outcome early: what the scaling section concludes."""
    measured = fits[fits["quantity"] != "flops"]
    exponent = [("" if pd.isna(row.get("slope")) else f"{row['slope']:.2f}"
                 + ("" if pd.isna(row.get("ci95")) else f" ± {row['ci95']:.2f}"))
                for _, row in measured.iterrows()]
    shown = measured.assign(exponent=exponent,
                            verdict=[reading(row) for _, row in measured.iterrows()])
    columns = ([hosts.GROUP_COLUMN] if hosts.GROUP_COLUMN in shown else []) + [
        c for c in VERDICT_TABLE if c in shown]
    return shown[columns].reset_index(drop=True)


def scaling_sections(table: pd.DataFrame, meta: dict) -> list[Section]:
    """:func:`attnbench.studies.scaling.section`, its verdicts as a table, and more plots.

    The verdict lines of the section's text become a table (outcome coloured); the plots
    of time against d_k, heads and batch join those against L.
    """
    fits = scaling.scaling_table(table)
    sections = scaling.section(table, fits=fits, meta=meta)
    if fits.empty:
        return sections
    main = sections[0]
    main.anchor = main.anchor or "scaling"
    if "\n\nVerdicts:\n" in main.text:
        main.text = main.text.split("\n\nVerdicts:\n")[0]
    # the fits' own verdict text moves to the Verdicts table, reworded from the numbers
    main.tables = [(caption, table.drop(columns=["verdict"]) if caption == "Fits"
                    and "verdict" in table else table) for caption, table in main.tables]
    main.tables.insert(0, ("Verdicts: one line per fit (time and memory; FLOP counts are in "
                           "the Fits table)", verdicts_table(fits)))
    for variable, words in (("d_k", "head size d_k"), ("heads", "heads"),
                            ("batch", "batch")):
        figure = plots.time_vs_variable(table, fits, variable)
        if figure is not None:
            main.figures.append((f"Time against {words}, log-log, with the fitted law, its "
                                 "95% band and an O(" + variable + ") guide", figure))
    return sections
