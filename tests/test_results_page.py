"""Results are data: docs/results.md and the README's headline block are what
``python -m attnbench.report.results_page`` generates from the stored runs in docs/runs/,
each stored run carries its machine record and where it came from, and the README stays a
short page without a run diary.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

from attnbench.report import results_page

REPO = Path(__file__).resolve().parents[1]
#: A run diary's marks: a date, a short commit hash (hex with a letter and a digit).
DIARY = re.compile(r"\b20\d\d-\d\d-\d\d\b|\b(?=[0-9a-f]*[a-f])(?=[0-9a-f]*\d)[0-9a-f]{7,12}\b")


def test_the_committed_page_and_readme_block_are_the_regeneration():
    stale = results_page.stale_files(REPO)
    assert not stale, (f"{[str(p.relative_to(REPO)) for p in stale]} differ from what the "
                       f"stored runs give: run {results_page.COMMAND}")


def test_every_stored_run_has_its_machine_record_and_provenance():
    runs = results_page.stored_runs(REPO)
    assert {run.command for run in runs} == {"run", "bench"}
    for run in runs:
        assert run.record["cpu_model"] and run.record["logical_cores"], run.path
        assert {"command", "commit", "written"} <= set(run.provenance), run.path
        assert run.provenance["command"].startswith(f"attnbench {run.command}"), run.path
        if run.command == "bench":
            assert (run.path / "targets.csv").exists() and run.machine["command"], run.path
        else:
            assert (run.path / "run.json").exists(), run.path


def test_the_check_fails_on_a_stale_page_and_the_command_mends_it(tmp_path):
    shutil.copytree(REPO / results_page.RUNS, tmp_path / results_page.RUNS)
    (tmp_path / results_page.README).write_text(
        (REPO / results_page.README).read_text(encoding="utf-8"), encoding="utf-8")
    page = tmp_path / results_page.PAGE
    page.write_text((REPO / results_page.PAGE).read_text(encoding="utf-8")
                    .replace("| numba |", "| numba (typed by hand) |", 1), encoding="utf-8")
    assert results_page.main(["--check", "--root", str(tmp_path)]) == 1
    assert results_page.main(["--root", str(tmp_path)]) == 0
    assert results_page.main(["--check", "--root", str(tmp_path)]) == 0
    assert page.read_text(encoding="utf-8") == (REPO / results_page.PAGE).read_text(
        encoding="utf-8")


def test_a_changed_stored_number_changes_the_page(tmp_path):
    shutil.copytree(REPO / results_page.RUNS, tmp_path / results_page.RUNS)
    run = next(r for r in results_page.stored_runs(tmp_path) if r.command == "run")
    record = json.loads((run.path / "run.json").read_text())
    before = results_page.render_page(tmp_path)
    (run.path / "run.json").write_text(json.dumps({**record, "seconds": 60.0}))
    after = results_page.render_page(tmp_path)
    assert before != after and "took 1.0 min" in after


def test_the_figures_are_drawn_from_the_stored_bench_runs(tmp_path):
    drawn = results_page.write_figures(tmp_path, REPO)
    benches = [run for run in results_page.stored_runs(REPO) if run.command == "bench"]
    assert sorted(p.name for p in drawn) == sorted(map(results_page.figure_name, benches))
    page = (REPO / results_page.PAGE).read_text(encoding="utf-8")
    for path in drawn:
        assert path.stat().st_size > 0 and f"_generated/{path.name}" in page


def test_the_readme_is_short_and_keeps_no_run_diary():
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    assert len(readme.splitlines()) <= 150
    assert not DIARY.findall(readme), DIARY.findall(readme)
    assert results_page.BEGIN in readme and "(docs/results.md)" in readme
