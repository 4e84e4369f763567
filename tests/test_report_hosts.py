"""The report of results from several hosts (and a GPU): grouped, never mixed.

Synthetic rows: the same sweep timed on two fake hosts, host-b twice as fast with twice
the GEMM peak, and host-b's GPU running the cuda backend.
"""

import re

import numpy as np
import pandas as pd
import pytest

from attnbench.report import build as report
from attnbench.report import hosts
from attnbench.studies.scaling import scaling_table
from attnbench.sweep.files import save_results
from attnbench.sweep.run import SweepResult
from tests.test_report import assert_self_contained, sweep_table

GPU = "NVIDIA H200 (cc 9.0)"


def two_hosts() -> pd.DataFrame:
    a = sweep_table().assign(hostname="host-a", cpu_model="CPU A", device="cpu",
                             gemm_peak_gflops=60.0, reason="")
    b = a.assign(hostname="host-b", cpu_model="CPU B", gemm_peak_gflops=120.0)
    for column in ("median_ms", "q25_ms", "q75_ms"):
        b[column] = a[column] / 2
    b["gflops"] = a["gflops"] * 2
    gpu = b[b["backend"] == "numba"].assign(backend="cuda", device=GPU,
                                            gemm_peak_gflops=66_908.0)
    gpu["median_ms"] = b.loc[gpu.index, "median_ms"] / 50
    return pd.concat([a, b, gpu], ignore_index=True)


def test_rows_are_grouped_by_host_and_device():
    table = two_hosts()
    labels = [label for label, _ in hosts.groups(table)]
    assert labels == ["host-a", "host-b", f"host-b / {GPU}"]
    for _, rows in hosts.groups(table):
        assert rows["hostname"].nunique() == 1 and hosts.device_of(rows).nunique() == 1
    assert sum(len(rows) for _, rows in hosts.groups(table)) == len(table)
    assert hosts.host_peaks(table) == {"host-a": {"float32": 60.0},
                                       "host-b": {"float32": 120.0},
                                       f"host-b / {GPU}": {"float32": 66_908.0}}


def test_old_rows_without_host_or_device_form_one_group():
    table = sweep_table()
    assert [label for label, _ in hosts.groups(table)] == ["this host"]
    assert (hosts.device_of(table) == "cpu").all()


def test_fits_are_made_per_group_not_across_hosts():
    table = two_hosts()
    fits = hosts.scaling_by_group(table, scaling_table)
    assert list(fits.columns[:1]) == ["group"]
    time_fits = fits[fits["quantity"] == "time"].set_index(["group", "backend"])
    # Each host's own series: exponent 2 on both, the intercepts log(2) apart.
    for group in ("host-a", "host-b"):
        assert time_fits.loc[(group, "numba"), "outcome"] == "confirmed"
    gap = (time_fits.loc[("host-a", "numba"), "intercept"]
           - time_fits.loc[("host-b", "numba"), "intercept"])
    assert gap == pytest.approx(np.log(2), abs=0.05)
    mixed = scaling_table(table)  # what not grouping would do: one series of both hosts
    assert len(mixed[mixed["quantity"] == "time"]) < len(time_fits)


def test_report_sections_per_host_with_their_own_peak():
    table = two_hosts()
    sections = report.sweep_sections(table, {"gemm_peak_gflops": {"float32": 1.0},
                                             "n_points": len(table)})
    titles = [section.title for section in sections]
    assert titles == ["Hosts and devices",
                      "Sweep: host-a", "Scaling: host-a",
                      "Sweep: host-b", "Scaling: host-b",
                      f"Sweep: host-b / {GPU}", f"Scaling: host-b / {GPU}"]
    assert len({section.slug() for section in sections}) == len(sections)
    by_title = {section.title: section for section in sections}
    for label, peak in (("host-a", 60), ("host-b", 120), (f"host-b / {GPU}", 66908)):
        section = by_title[f"Sweep: {label}"]
        shown = section.tables[-1][1]
        expected = table[hosts.group_labels(table) == label]
        assert len(shown) == len(expected)  # this group's rows, no other
        gflops_figure = section.figures[0][1]
        lines = [line.get_label() for line in gflops_figure.axes[0].get_lines()]
        kind = "device peak" if "H200" in label else "GEMM peak"
        assert f"float32 {kind} {peak} GFLOP/s" in lines, lines
    overview = by_title["Hosts and devices"]
    groups_table = overview.tables[0][1].set_index("group")
    assert groups_table.loc["host-a", "cpu_model"] == "CPU A"
    assert groups_table.loc["host-b", "peak float32 GFLOP/s"] == 120.0
    comparison = overview.tables[1][1]
    numba = comparison[comparison["backend"] == "numba"]
    assert np.allclose(numba["host-b / host-a"], 0.5)  # same points side by side


def test_one_host_keeps_the_plain_sections():
    table = two_hosts()
    one = table[table["hostname"] == "host-a"]
    titles = [s.title for s in report.sweep_sections(one, {})]
    assert titles == ["Sweep", "Scaling"]


def test_the_html_report_of_two_hosts(tmp_path):
    table = two_hosts()
    save_results(SweepResult(table=table, interrupted=False, seconds=1.0, gemm_peaks={},
                             n_points=len(table)), tmp_path)
    page = report.build_report(tmp_path).read_text()
    assert_self_contained(page)
    ids = re.findall(r'<section id="([^"]+)"', page)
    assert ids[:2] == ["summary", "hosts"] and "machine" in ids
    assert sum(i.startswith("sweep") for i in ids) == 3
    assert "host-b / NVIDIA H200 (cc 9.0)" in page


def test_one_gpu_group_draws_the_peak_its_rows_carry():
    table = two_hosts()
    gpu = table[table["backend"] == "cuda"]
    (sweep, _scaling) = report.sweep_sections(gpu, {})  # no run-wide peak in the meta
    lines = [line.get_label() for line in sweep.figures[0][1].axes[0].get_lines()]
    assert "float32 device peak 66908 GFLOP/s" in lines, lines
    assert "Peak of the device (see below): float32 66908.0 GFLOP/s" in sweep.text
    assert "numpy matmul" not in sweep.text


def test_ratio_table_puts_medians_side_by_side_with_ratios_to_the_first():
    ok = pd.DataFrame({"L": [8, 8, 8, 16, 16], "backend": ["a", "b", "b", "a", "b"],
                       "median_ms": [2.0, 3.0, 5.0, 4.0, 2.0]})
    wide = hosts.ratio_table(ok, ["L"], "backend", order=["a", "b"])
    assert list(wide.columns) == ["a", "b", "b / a"]
    assert wide.loc[8, "b"] == 4.0 and wide.loc[8, "b / a"] == 2.0  # median of 3 and 5
    assert wide.loc[16, "b / a"] == 0.5
    only_b = hosts.ratio_table(ok[ok["backend"] == "b"], ["L"], "backend", order=["a", "b"],
                               min_columns=2)
    assert only_b.empty
