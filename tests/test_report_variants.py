"""The report's backward and variants parts: sections, plots and summary cards."""

import numpy as np
import pandas as pd

from attnbench.report.build import collect_sections
from attnbench.report.summary import cards
from attnbench.report.variants import backward_figures, split_directions, variants_section
from attnbench.studies.scaling import scaling_table
from attnbench.sweep.files import save_results
from attnbench.sweep.run import SweepResult

from .test_variants_study import LENGTHS, row, window_table

ALL_LENGTHS = (256, 416, 640) + LENGTHS


def sweep() -> pd.DataFrame:
    """numba forward and backward O(L²), causal windows O(L·W), one document point."""
    rows = []
    for L in ALL_LENGTHS:
        pairs = L * (L + 1) / 2 * 4
        rows.append(row("numba", L, "none", 2e-4 + 1e-8 * L**2, flops=pairs * 256))
        rows.append(row("numba", L, "none", 2e-4 + 2.5e-8 * L**2, direction="backward",
                        flops=pairs * 640))
    rows.append(row("numba", 4096, "none", 0.4, mask="none", flops=4 * 4096**2 * 256))
    rows.append(row("numba", 4096, "documents-8", 0.06, mask="none",
                    flops=4 * 4096**2 * 256 / 8))
    table = pd.concat([pd.DataFrame(rows), window_table(1.0)], ignore_index=True)
    memory = np.where(table["direction"] == "backward", 3e4 * table["L"], 1e4 * table["L"])
    return table.assign(peak_mem_bytes=memory, iqr_ms=0.01, within_tolerance=True,
                        max_abs_err=1e-7, tolerance=1e-6, oracle="float64")


def test_directions_are_plotted_and_fitted_apart():
    table = sweep()
    fits = scaling_table(table)
    (forward, forward_fits), (backward, backward_fits) = split_directions(table, fits)
    assert set(forward["direction"]) == {"forward"} and set(forward["variant"]) == {"none"}
    assert set(backward["direction"]) == {"backward"}
    time = backward_fits[(backward_fits["quantity"] == "time")
                         & (backward_fits["variable"] == "L")]
    assert time.iloc[0]["outcome"] == "confirmed"
    memory = backward_fits[backward_fits["quantity"] == "memory"].iloc[0]
    assert memory["outcome"] == "confirmed" and "at most O(L)" in memory["verdict"]
    captions = [caption for caption, _ in backward_figures(table, fits)]
    assert len(captions) == 2 and "Backward" in captions[0]


def test_summary_cards_answer_the_backward_and_window_questions():
    table = sweep()
    found = {card.question: card for card in cards(sweep=table, fits=scaling_table(table))}
    assert found["O(L²) time: numba"].verdict == "confirmed"
    assert found["Backward O(L²) time: numba"].verdict == "confirmed"
    assert found["Backward O(L) memory of the fused kernel"].verdict == "confirmed"
    window = found["Sliding window O(L·W) time: numba"]
    assert window.verdict == "confirmed" and window.link == "variants"
    assert window.number.startswith("time ∝ (L·W)^")
    skipping = found["Block skipping of sparse variants"]
    assert skipping.tone == "ok" and "faster at density" in skipping.number


def test_block_skipping_that_does_not_pay_turns_the_card_amber():
    table = sweep()
    table.loc[table["variant"] == "documents-8", ["median_ms", "samples_ms"]] = (500.0, "")
    found = {card.question: card for card in cards(sweep=table, fits=scaling_table(table))}
    assert found["Block skipping of sparse variants"].tone == "warn"


def test_the_report_has_a_variants_section_with_its_tables_and_plots(tmp_path):
    table = sweep()
    save_results(SweepResult(table=table, interrupted=False, seconds=1.0,
                             gemm_peaks={"float32": 60.0}, n_points=len(table)), tmp_path)
    sections = collect_sections(tmp_path)
    titles = [section.title for section in sections]
    assert titles == ["Summary", "Sweep", "Scaling", "Attention variants and block skipping",
                      "Machine"]
    variants = sections[3]
    assert [caption.split(":")[0] for caption, _ in variants.tables] == [
        "Sliding windows", "Block skipping"]
    assert len(variants.figures) == 2
    scaling = sections[2]
    assert any("Backward" in caption for caption, _ in scaling.figures)
    verdicts = scaling.tables[0][1]
    assert {"direction", "variant"} <= set(verdicts.columns)
    assert "Sliding window O(L·W) time" in sections[0].html


def test_no_variants_no_section():
    table = sweep()
    assert variants_section(table[table["variant"] == "none"], None) is None


def test_the_window_plot_draws_the_fit_with_its_term_in_l():
    from attnbench.report import plots

    # the kernel's real work: L·W plus one 64-key cell per query, i.e. a term in L
    table = pd.DataFrame([row("numba", L, f"window-{W}", 2e-4 + 1e-9 * L * (W + 64), noise=0.005)
                          for L in LENGTHS for W in (64, 256)])
    fits = scaling_table(table)
    window = fits[(fits["variable"] == "L·W") & (fits["quantity"] == "time")]
    assert window.iloc[0]["lower_term"] == "g" and window.iloc[0]["outcome"] == "confirmed"
    windows = table.assign(**{"L·W": table["L"] * table["variant"].str.split("-").str[1]
                              .astype(int)})
    figure = plots.scaling_figure(windows, window, quantity="time", variable="L·W",
                                  column="median_ms", ylabel="ms", title="windows",
                                  panel_by=None, keys=["backend", "mask", "dtype"])
    residuals = figure.axes[1]
    ratios = np.concatenate([line.get_ydata() for line in residuals.get_lines()])
    assert np.allclose(ratios, 1, rtol=0.03)  # the b·L part is in the fitted values
