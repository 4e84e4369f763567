"""Figures, the self-contained HTML page, sections on disk and ``attnbench report``."""

import base64
import re

import numpy as np
import pandas as pd
import pytest
from matplotlib.figure import Figure

from attnbench.cli import main
from attnbench.report.build import build_report, collect_sections, plots
from attnbench.report.html import figure_png, load_sections, render_html, save_sections
from attnbench.section import Section
from attnbench.studies.scaling import scaling_table
from tests.test_scaling import synthetic_sweep

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def sweep_table():
    """The synthetic sweep with the columns the plots read."""
    table = synthetic_sweep()
    table["q25_ms"] = table["median_ms"] * 0.95
    table["q75_ms"] = table["median_ms"] * 1.05
    table["gflops"] = table["flops"] / table["median_ms"] / 1e6
    table["max_abs_err"] = np.where(table["backend"] == "numba", 3e-7, 3e-8)
    table["tolerance"] = 1e-6
    table["memory_method"] = "tracemalloc"
    return table


def test_sweep_figures_draw_every_series_and_the_fits():
    table = sweep_table()
    fits = scaling_table(table)
    time_figure = plots.time_vs_length(table, fits)
    ax, residuals = time_figure.axes  # the law on top, measured / fit below
    labels = [line.get_label() for line in ax.get_lines()]
    for backend in ("numba", "reference"):
        row = fits[(fits["quantity"] == "time") & (fits["backend"] == backend)
                   & (fits["variable"] == "L")].iloc[0]
        law = f"{backend}: L^{row.slope:.2f} [{row.ci_low:.2f}, {row.ci_high:.2f}]"
        assert any(label.startswith(law) for label in labels), labels
    assert {"guide ∝ L¹", "guide ∝ L²"} <= set(labels)  # the guide slopes
    assert ax.collections  # the 95% bands
    ratios = np.concatenate([line.get_ydata() for line in residuals.get_lines()
                             if len(line.get_ydata()) > 2])
    assert np.allclose(ratios, 1, rtol=0.05)  # the synthetic times follow their law
    gflops = plots.gflops_by_backend(table, {"float32": 60.0})
    assert any("GEMM peak 60" in line.get_label() for line in gflops.axes[0].get_lines())
    error = plots.error_by_backend(table)
    assert any("tolerance" in line.get_label() for line in error.axes[0].get_lines())
    memory = plots.memory_vs_length(table, fits)
    assert any("L^1.00" in line.get_label() for line in memory.axes[0].get_lines())
    for figure in (time_figure, gflops, error, memory):
        assert figure_png(figure).startswith(PNG_SIGNATURE)


def test_figures_of_an_empty_sweep_are_none():
    table = sweep_table().assign(status="failed")
    assert plots.time_vs_length(table) is None
    assert plots.gflops_by_backend(table, {}) is None
    assert plots.error_by_backend(table) is None
    assert plots.memory_vs_length(table) is None


def test_heat_map_weights_follow_the_masks():
    (_, words, full), (_, _, causal), (_, padded, padding) = plots.heatmap_weights()
    n = len(words)
    assert words == plots.SENTENCE.lower().split() and padded[n:] == ["<pad>"] * 3
    assert np.allclose(full.sum(axis=-1), 1) and np.allclose(causal.sum(axis=-1), 1)
    assert np.all(causal[np.triu_indices(n, k=1)] == 0) and np.all(causal[np.tril_indices(n)] > 0)
    assert np.all(padding[:, n:] == 0) and np.allclose(padding.sum(axis=-1), 1)
    (section,) = plots.heatmap_section()
    assert "above the diagonal is 0;" in section.text and "<pad> key is 0 " in section.text
    assert isinstance(section.figures[0][1], Figure)


def example_sections():
    figure = Figure(figsize=(2, 2))
    figure.subplots().plot([1, 2, 3])
    ready = pd.DataFrame({"id": ["C01"], "verdict": ["holds"]})
    ready.attrs["html"] = '<table id="claims-table"><tr><td>C01</td></tr></table>'
    return [
        Section(title="Scaling", text="time ∝ L^2\n\nsecond <paragraph>",
                tables=[("fits", pd.DataFrame({"x": [1.5, np.nan], "name": ["a", None]}))],
                figures=[("a figure", figure), ("as bytes", figure_png(figure))]),
        Section(title="Scaling", text="same title twice"),
        Section(title="Claims ledger", anchor="claims", tables=[("claims", ready)]),
    ]


def assert_self_contained(page: str):
    """No external resource: every src/href is a data: URI or an in-page anchor."""
    for _attribute, value in re.findall(r'\b(src|href)="([^"]*)"', page):
        assert value.startswith("data:image/png;base64,") or value.startswith("#"), value
    assert not re.search(r"url\(\s*['\"]?(?!data:)", page)
    assert "<script" not in page and "<link" not in page
    for data in re.findall(r'src="data:image/png;base64,([^"]+)"', page):
        assert base64.b64decode(data).startswith(PNG_SIGNATURE)


def test_render_html_is_self_contained_with_a_table_of_contents():
    page = render_html(example_sections(), title="t", subtitle="machine X.")
    assert_self_contained(page)
    assert page.count("<img ") == 2
    ids = re.findall(r'<section id="([^"]+)"', page)
    assert ids == ["scaling", "scaling-2", "claims"]
    assert re.findall(r'<li><a href="#([^"]+)"', page) == ids
    assert "second &lt;paragraph&gt;" in page  # text is escaped
    assert '<table id="claims-table">' in page  # ready-made HTML is embedded as is
    assert "machine X." in page


def test_sections_survive_a_round_trip_to_disk(tmp_path):
    sections = example_sections()
    save_sections(sections, tmp_path / "sections")
    loaded = load_sections(tmp_path / "sections")
    assert [s.title for s in loaded] == [s.title for s in sections]
    assert loaded[2].anchor == "claims"
    assert loaded[2].tables[0][1].attrs["html"] == sections[2].tables[0][1].attrs["html"]
    assert loaded[0].figures[1][1] == sections[0].figures[1][1]  # PNG bytes unchanged
    strip = re.compile(r"Generated [^<]*")
    assert (strip.sub("", render_html(loaded)) == strip.sub("", render_html(sections)))
    save_sections(loaded[:1], tmp_path / "sections")  # replaces the old folders
    assert len(load_sections(tmp_path / "sections")) == 1


def test_report_is_rebuilt_from_a_sweep_folder(tmp_path):
    from attnbench.sweep.files import save_results
    from attnbench.sweep.run import SweepResult

    table = sweep_table()
    table["reason"] = ""
    save_results(SweepResult(table=table, interrupted=False, seconds=1.0,
                             gemm_peaks={"float32": 60.0}, n_points=len(table)), tmp_path)
    titles = [section.title for section in collect_sections(tmp_path)]
    assert titles == ["Summary", "Sweep", "Scaling", "Machine"]
    assert main(["report", str(tmp_path)]) == 0
    page = (tmp_path / "report.html").read_text()
    assert_self_contained(page)
    assert "time ∝ L^2.0" in page and "O(L²) confirmed" in page
    assert build_report(tmp_path, tmp_path / "other.html").exists()


def test_report_of_an_empty_folder_is_an_error(tmp_path, capsys):
    assert main(["report", str(tmp_path)]) == 2
    assert "holds no results" in capsys.readouterr().err
    with pytest.raises(FileNotFoundError):
        collect_sections(tmp_path / "missing")
