"""``attnbench run --grid tiny`` end to end: the files it writes, and the report in a browser.

The browser check needs Chromium (``.ci/run`` installs it with apt-get where it can);
without it that test is skipped and says so.
"""

import json
import shutil
from pathlib import Path

import pandas as pd
import pytest

from attnbench.cli import main
from attnbench.sweep.grid import GRIDS, expand
from tests.browser import check_page, find_chromium, screenshot
from tests.test_report import assert_self_contained

REPO = Path(__file__).resolve().parents[1]
#: Where the screenshot of the tiny run's report is kept (reports/ is not committed).
SCREENSHOT = REPO / "reports" / "report-tiny-screenshot.png"


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("run") / "reports"
    status = main(["run", "--grid", "tiny", "--out", str(out), "--max-time", "0.005",
                   "--sweep-max-time", "0.005"])
    return status, out


def test_run_writes_every_file_and_exits_0(tiny_run):
    status, out = tiny_run
    assert status == 0, json.loads((out / "run.json").read_text())
    for name in ("agreement.csv", "machine.json", "sweep.csv", "sweep.json", "scaling.csv",
                 "run.json", "report.html"):
        assert (out / name).is_file(), name
    table = pd.read_csv(out / "sweep.csv")
    assert len(table) == len(expand(GRIDS["tiny"]))
    assert set(table["status"]) <= {"ok", "skipped"}
    skipped = table[table["status"] == "skipped"]
    assert (skipped["backend"] == "torch").all()  # only a missing optional peer may skip
    assert all("torch is not installed" in reason for reason in skipped["reason"])
    assert table.loc[table["status"] == "ok", "within_tolerance"].all()
    run = json.loads((out / "run.json").read_text())
    assert run["exit_status"] == 0 and run["seconds"] > 0 and not run["problems"]
    saved = sorted(path.name for path in (out / "sections").iterdir())
    assert saved[0] == "00-attention-heat-maps"
    for anchor in ("stability", "params", "claims"):  # the studies' and the ledger's sections
        assert any(name.endswith(anchor) for name in saved), (anchor, saved)


def test_report_holds_every_part_and_nothing_external(tiny_run):
    _, out = tiny_run
    page = (out / "report.html").read_text()
    assert_self_contained(page)
    for anchor in ("agreement", "sweep", "scaling", "attention-heat-maps", "machine"):
        assert f'<section id="{anchor}">' in page, anchor
    assert 'id="claims-table"' in page
    before = page.split("Generated")[1].split("</p>", 1)[1]
    assert main(["report", str(out), "--html", str(out / "again.html")]) == 0
    again = (out / "again.html").read_text().split("Generated")[1].split("</p>", 1)[1]
    assert again == before  # 'attnbench report' rebuilds what 'run' wrote


@pytest.mark.skipif(find_chromium() is None,
                    reason="chromium is not installed (apt-get install chromium; .ci/run "
                           "installs it)")
def test_report_renders_in_headless_chromium(tiny_run):
    _, out = tiny_run
    seen = check_page(out / "report.html")
    assert seen["images"] >= 4 and seen["broken"] == [], seen
    assert seen["errors"] == [] and seen["chromium_console"] == [], seen
    assert seen["title"] == "attnbench report"
    assert {"agreement", "sweep", "scaling", "machine"} <= set(seen["sections"])
    assert seen["claims_table"], seen
    shot = screenshot(out / "report.html", out / "report.png")
    assert shot.read_bytes().startswith(b"\x89PNG")
    SCREENSHOT.parent.mkdir(exist_ok=True)
    shutil.copyfile(shot, SCREENSHOT)
