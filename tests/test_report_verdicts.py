"""The report's Verdicts table shows the scaling verdicts as studies.scaling decided them.

The console (:func:`attnbench.cli.console.print_verdicts`) and the report read the same stored
outcome, conclusion and reason, and write exponents with the same function; the report
never rewords a verdict from the numbers.
"""

import io
import re

import numpy as np
import pandas as pd

from attnbench.cli.console import print_verdicts
from attnbench.report import build, summary, verdicts
from attnbench.studies.scaling import scaling_table
from attnbench.studies.scaling_verdicts import exponent_text, row_exponent
from tests.test_fits import sampled_sweep


def starved_sweep() -> pd.DataFrame:
    """A sampled sweep whose numba series against L has one point timed starved: its time
    fit has a tight interval and is inconclusive for that reason alone."""
    table = sampled_sweep(np.random.default_rng(5)).assign(starved=False, threads=2)
    table["gflops"] = table["flops"] / table["median_ms"] / 1e6
    table["max_abs_err"], table["tolerance"], table["within_tolerance"] = 1e-7, 1e-5, True
    table.loc[(table["backend"] == "numba") & (table["L"] == 640), "starved"] = True
    return table


def numba_time_row(fits: pd.DataFrame) -> pd.Series:
    return fits[(fits["quantity"] == "time") & (fits["variable"] == "L")
                & (fits["backend"] == "numba")].iloc[0]


def verdicts_of(sections) -> pd.DataFrame:
    scaling = next(s for s in sections if s.title.startswith("Scaling"))
    caption, table = scaling.tables[0]
    assert caption.startswith("Verdicts")
    return table


def test_exponents_are_written_one_way():
    assert exponent_text("L", 2.0, 1.99, 2.02) == "L^2.00 [1.99, 2.02]"
    assert exponent_text("L·W", 0.934, 0.9, 0.961) == "(L·W)^0.93 [0.90, 0.96]"
    assert exponent_text("d_k", 1.0, np.nan, np.nan) == "d_k^1.00"
    row = {"variable": "L", "slope": 1.98, "ci_low": 1.95, "ci_high": 2.01, "ci95": 0.03}
    assert row_exponent(row) == "L^1.98 [1.95, 2.01]"
    assert row_exponent({**row, "slope": np.nan}) == "no fit"


def test_a_starved_fit_reads_the_same_in_the_console_and_the_report(tmp_path):
    table = starved_sweep()
    fits = scaling_table(table)
    row = numba_time_row(fits)
    assert row["outcome"] == "inconclusive" and row["ci_high"] - row["ci_low"] < 0.3
    console = io.StringIO()
    print_verdicts(fits, file=console)
    line = next(text for text in console.getvalue().splitlines()
                if "[numba none float32]" in text and "time ∝ L^" in text)

    # the report of a results folder that holds only the sweep's rows
    table.to_csv(tmp_path / "sweep.csv", index=False)
    shown = verdicts_of(build.collect_sections(tmp_path))
    mine = shown[(shown["backend"] == "numba") & (shown["quantity"] == "time")
                 & (shown["variable"] == "L")].iloc[0]
    reason = ("1 of 8 points were timed while the threads waited for cores other processes "
              "held (a busy machine); rerun when it is quiet or on fewer threads (--threads)")
    assert mine["outcome"] == "inconclusive"
    assert mine["verdict"].startswith("O(L²) inconclusive: " + reason), mine["verdict"]
    assert mine["verdict"] == row["conclusion"] and line.endswith(mine["verdict"])
    assert "wider than" not in " ".join(shown["verdict"])  # the old rule's reason
    # the interval as the console prints it, asymmetric, not slope ± half-width
    assert mine["exponent"] == f"L^{row['slope']:.2f} [{row['ci_low']:.2f}, {row['ci_high']:.2f}]"
    assert f"time ∝ {mine['exponent']} " in line and "±" not in mine["exponent"]

    html = build.build_report(tmp_path).read_text()
    assert reason in html and "wider than ±" not in html


def test_every_report_verdict_is_the_stored_one():
    table = starved_sweep()
    fits = scaling_table(table)
    shown = verdicts.verdicts_table(fits)
    measured = fits[fits["quantity"] != "flops"].reset_index(drop=True)
    assert list(shown["verdict"]) == list(measured["conclusion"])
    assert list(shown["outcome"]) == list(measured["outcome"])
    for conclusion, text in zip(measured["conclusion"], measured["verdict"], strict=True):
        assert text.endswith(conclusion)  # the console's line is the law, then this
    # whatever the numbers say, the report shows what was decided (it decides nothing)
    planted = fits.assign(conclusion="decided in studies.scaling", outcome="confirmed")
    assert set(verdicts.verdicts_table(planted)["verdict"]) == {"decided in studies.scaling"}
    # a fits table from before the conclusion column: its whole stored line
    older = verdicts.verdicts_table(fits.drop(columns=["conclusion"]))
    assert list(older["verdict"]) == list(measured["verdict"])


def test_summary_cards_take_the_stored_outcome_and_the_console_interval():
    table = starved_sweep()
    fits = scaling_table(table)
    row = numba_time_row(fits)
    card = next(c for c in summary.cards(sweep=table, fits=fits)
                if c.question == "O(L²) time: numba")
    assert card.verdict == "inconclusive" and card.tone == "warn"
    assert card.number == f"time ∝ {row_exponent(row)}"
    assert any(re.search(r"time ∝ L\^\S+ \[\S+, \S+\] \(inconclusive\)", line)
               for line in card.lines), card.lines
