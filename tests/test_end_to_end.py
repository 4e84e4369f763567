"""``attnbench run --grid tiny`` end to end: the files it writes, and the report in a browser.

The browser check needs Chromium (``.ci/run`` installs it with apt-get where it can);
without it that test is skipped and says so.  Everything is written under pytest's
temporary folders; set ``ATTNBENCH_SCREENSHOT=/some/file.png`` to keep a screenshot of
the page.
"""

import json
import os
import shutil

import pandas as pd
import pytest

from attnbench.cli import main
from attnbench.sweep.grid import GRIDS, expand
from tests.browser import check_page, find_chromium, screenshot
from tests.test_report import assert_self_contained

#: Tones a summary card may have.
TONES = {"ok", "warn", "bad", "none"}


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
    seen = check_page(out / "report.html", width=1280)
    assert seen["images"] >= 4 and seen["broken"] == [], seen
    assert seen["errors"] == [] and seen["chromium_console"] == [], seen
    assert seen["title"] == "attnbench report"
    assert seen["sections"][0] == "summary"
    assert {"agreement", "sweep", "scaling", "machine"} <= set(seen["sections"])
    # the summary: a card per question, each with a verdict and a tone
    questions = " | ".join(card["question"] for card in seen["cards"])
    for question in ("agree", "O(L²) time: numba", "memory", "√d_k", "Parameter", "claims",
                     "Machine"):
        assert question in questions, questions
    for card in seen["cards"]:
        assert card["verdict"] and card["tone"] in TONES, card
    # nothing sticks out of the page at 1280 px; wide tables scroll in their own box
    assert seen["overflow"] == [], seen["overflow"]
    assert seen["long_floats"] == [], seen["long_floats"]
    assert seen["claims_table"], seen
    assert seen["claims"] == {"rows": 31, "shown": 31, "clipped": False}, seen["claims"]
    shot = screenshot(out / "report.html", out / "report.png")
    assert shot.read_bytes().startswith(b"\x89PNG")
    if os.environ.get("ATTNBENCH_SCREENSHOT"):
        shutil.copyfile(shot, os.environ["ATTNBENCH_SCREENSHOT"])


def test_a_sweep_keeps_off_runs_results_and_report_says_who_wrote_what(tiny_run, tmp_path,
                                                                        capsys):
    _, out = tiny_run
    folder = tmp_path / "reports"
    shutil.copytree(out, folder)
    page = (folder / "report.html").read_text()
    assert "attnbench run (grid &#x27;tiny&#x27;) measured everything here" in page
    before = (folder / "sweep.csv").read_bytes()
    sweep = ["sweep", "--grid", "tiny", "--out", str(folder), "--no-progress",
             "--max-time", "0.005"]
    assert main(sweep) == 2  # refuses: run's sweep would be replaced under run's report
    assert "holds the results of 'attnbench run'" in capsys.readouterr().err
    assert (folder / "sweep.csv").read_bytes() == before
    assert main([*sweep, "--force"]) == 0
    capsys.readouterr()
    assert main(["report", str(folder)]) == 0
    said = capsys.readouterr().out
    assert "the sweep (sweep.*): attnbench sweep --grid tiny" in said
    assert "the agreement check: attnbench run --grid tiny" in said
    page = (folder / "report.html").read_text()
    assert "measured everything here" not in page
    assert "attnbench sweep --grid tiny" in page
