"""The browser checks of :mod:`tests.browser` catch what they are meant to catch.

The end-to-end test asserts that a real report has no overflow, no long float, all 31
claims shown and a verdict on every card; this file shows that each of those checks fails
on a page built to break it, and passes on the same page built right.  Needs Chromium.
"""

import pandas as pd
import pytest

from attnbench.report.html import render_html
from attnbench.report.summary import Card, summary_section
from attnbench.section import Section
from tests.browser import check_page, find_chromium

pytestmark = pytest.mark.skipif(find_chromium() is None,
                                reason="chromium is not installed (apt-get install chromium)")


def claims_table(n: int) -> pd.DataFrame:
    rows = "".join(f'<tr id="claim-C{i:02d}" data-verdict="holds"><td>C{i:02d}</td>'
                   f'<td class="verdict">holds</td><td>claim {i}</td></tr>' for i in range(n))
    table = pd.DataFrame({"id": [f"C{i:02d}" for i in range(n)]})
    table.attrs["html"] = (f'<table id="claims-table" class="claims"><thead><tr><th>id</th>'
                           f"<th>verdict</th><th>claim</th></tr></thead><tbody>{rows}"
                           "</tbody></table>")
    return table


def page(tmp_path, *, verdict="confirmed", value="1.25", extra_html=""):
    # 40 columns: wider than 1280 px, so the table must scroll inside its own box
    wide = pd.DataFrame({f"column {i}": [f"{value} s"] for i in range(40)})
    sections = [
        summary_section([Card("O(L²) time: numba", verdict, "ok", "L^2.00 ± 0.01",
                              "scaling")]),
        Section(title="Scaling", anchor="scaling", text="x" * 400,
                tables=[("wide", wide), ("errors", pd.DataFrame(
                    {"max_abs_err": ["1.234567891e-7"], "note": ["x"]}))],
                html=extra_html),
        Section(title="Claims ledger", anchor="claims", tables=[("claims", claims_table(31))]),
    ]
    path = tmp_path / "page.html"
    path.write_text(render_html(sections), encoding="utf-8")
    return check_page(path, width=1280)


def test_a_good_page_passes_every_check(tmp_path):
    seen = page(tmp_path)
    assert seen["overflow"] == [] and seen["long_floats"] == [] and seen["errors"] == []
    assert seen["cards"] == [{"question": "O(L²) time: numba", "verdict": "confirmed",
                              "tone": "ok"}]
    assert seen["claims"] == {"rows": 31, "shown": 31, "clipped": False}


def test_each_check_catches_its_fault(tmp_path):
    seen = page(tmp_path, verdict="", value="0.1234567891",
                extra_html='<div style="width:2000px">too wide</div>'
                           '<img src="data:image/png;base64,AAAA" alt="broken">')
    assert seen["cards"][0]["verdict"] == ""  # a card without a verdict
    assert any("too wide" in item for item in seen["overflow"]), seen["overflow"]
    assert seen["broken"] == ["broken"]
    assert seen["long_floats"] and all("column" in item for item in seen["long_floats"])


def test_a_clipped_or_short_claims_table_is_seen(tmp_path):
    sections = [Section(title="Claims ledger", anchor="claims",
                        tables=[("claims", claims_table(30))])]
    path = tmp_path / "page.html"
    clipping = render_html(sections).replace(
        "</style>", "div.scroll { max-height: 5em; overflow-y: auto; }</style>")
    path.write_text(clipping, encoding="utf-8")
    assert check_page(path)["claims"] == {"rows": 30, "shown": 30, "clipped": True}
    hiding = render_html(sections).replace(
        "</style>", '#claims-table tr[id="claim-C03"] { display: none; }</style>')
    path.write_text(hiding, encoding="utf-8")
    assert check_page(path)["claims"]["shown"] == 29


def test_the_verdict_filter_shows_only_that_verdicts_claims(tmp_path):
    table = claims_table(31)
    table.attrs["html"] = table.attrs["html"].replace(
        'id="claim-C03" data-verdict="holds"', 'id="claim-C03" data-verdict="does-not-hold"')
    page = render_html([Section(title="Claims ledger", anchor="claims",
                                tables=[("claims", table)])])
    assert "does-not-hold (1)" in page and "all (31)" in page
    path = tmp_path / "page.html"
    path.write_text(page, encoding="utf-8")
    assert check_page(path)["claims"]["shown"] == 31  # "all" is checked at first
    # as if the reader clicked "does-not-hold": the stylesheet hides every other row
    picked = page.replace('id="claims-filter-all" checked', 'id="claims-filter-all"').replace(
        'id="claims-filter-does-not-hold"', 'id="claims-filter-does-not-hold" checked')
    path.write_text(picked, encoding="utf-8")
    assert check_page(path)["claims"]["shown"] == 1
