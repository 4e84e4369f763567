"""``attnbench conform``: subprocesses that hang or die, the JSON, the page, exit codes,
and the pytest example of docs/conformance.md."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from attnbench.cli import main
from tests.browser import check_page, find_chromium

REPO = Path(__file__).resolve().parents[1]
IMPLS = "tests.conformance_impls"


pytestmark = pytest.mark.usefixtures("repository_on_pythonpath")  # the worker imports
# tests.conformance_impls


@pytest.fixture(scope="module")
def mixed_run(tmp_path_factory):
    """One run: correct, broken, dying, hanging, unloadable, then correct again."""
    folder = tmp_path_factory.mktemp("conform")
    os.environ["PYTHONPATH"] = str(REPO)  # module scope: set before the monkeypatch runs
    specs = ["reference", f"{IMPLS}:no_scaling", f"{IMPLS}:dies_on_long_rows",
             f"{IMPLS}:hangs", "no_such_module:attention", f"{IMPLS}:correct"]
    # The hanging one costs the whole timeout.  Each other one (the reference backend
    # underneath: nothing to compile) takes a few seconds: 15 s leaves room for a loaded
    # machine without taking a correct implementation for a hang.
    status = main(["conform", *specs, "--quick", "--timeout", "15", "--json",
                   str(folder / "out.json"), "--out", str(folder / "page")])
    return status, json.loads((folder / "out.json").read_text()), folder


def _entry(report, spec):
    return next(i for i in report["implementations"] if i["spec"] == spec)


def _property(entry, name):
    return next(p for p in entry["properties"] if p["name"] == name)


@pytest.mark.slow  # reads the end-to-end conform run: left out of the quick lane
def test_json_has_the_issue_s_field_names(mixed_run):
    status, report, _ = mixed_run
    assert status == 1
    assert len(report["implementations"]) == 6
    for entry in report["implementations"]:
        assert {"name", "spec", "convention", "verdict", "properties"} <= set(entry)
        assert entry["verdict"] in ("conforms", "fails", "error")
        for prop in entry["properties"]:
            assert {"name", "kind", "status", "detail"} <= set(prop)
            assert prop["kind"] in ("correctness", "determinism", "convention", "speed")
            assert prop["status"] in ("pass", "fail", "unsupported", "error")
    assert [i["verdict"] for i in report["implementations"]] == [
        "conforms", "fails", "error", "error", "error", "conforms"]


@pytest.mark.slow  # reads the end-to-end conform run: left out of the quick lane
def test_a_crash_keeps_the_finished_properties_and_names_the_one_under_way(mixed_run):
    dies = _entry(mixed_run[1], f"{IMPLS}:dies_on_long_rows")
    assert _property(dies, "agreement-float32")["status"] == "pass"
    repeatable = _property(dies, "repeatable")
    assert repeatable["status"] == "error"
    assert "interpreter died (exited with status 3) during this property" in \
        repeatable["detail"]
    assert "not run" in _property(dies, "fully-masked-row")["detail"]


@pytest.mark.slow  # reads the end-to-end conform run: left out of the quick lane
def test_a_hang_is_killed_and_reported_and_the_next_ones_still_run(mixed_run):
    _, report, _ = mixed_run
    hangs = _entry(report, f"{IMPLS}:hangs")
    assert "timed out after 15 s" in hangs["problem"]
    assert 15 <= hangs["seconds"] < 55
    assert "timed out" in _property(hangs, "agreement-float32")["detail"]
    missing = _entry(report, "no_such_module:attention")
    assert "ModuleNotFoundError" in _property(missing, "agreement-float32")["detail"]
    assert _entry(report, f"{IMPLS}:correct")["verdict"] == "conforms"


@pytest.mark.slow  # reads the end-to-end conform run: left out of the quick lane
def test_the_page_shows_the_matrix_then_failures_with_case_error_and_tolerance(mixed_run):
    page = (mixed_run[2] / "page" / "conformance.html").read_text()
    assert page.index("Property × implementation") < page.index("Failures")
    failures = page[page.index("<h2>Failures"):]
    assert "no_scaling: agreement-float32" in failures
    assert "scaling is missing" in failures and ">tolerance</th>" in failures
    assert re.search(r"<td class=mono>odd</td>", failures)
    assert (mixed_run[2] / "page" / "conformance.json").exists()


@pytest.mark.slow  # reads the end-to-end conform run: left out of the quick lane
@pytest.mark.skipif(find_chromium() is None, reason="chromium is not installed")
def test_the_page_renders_at_1280_px(mixed_run):
    seen = check_page(mixed_run[2] / "page" / "conformance.html", width=1280)
    assert seen["errors"] == [] and seen["overflow"] == [], seen
    assert seen["title"] == "attnbench conform"


def test_exit_0_when_all_conform_and_deterministic_decides_determinism(capsys):
    assert main(["conform", "reference", f"{IMPLS}:noisy", "--quick"]) == 0
    printed = capsys.readouterr().out
    assert "property" in printed and "verdict" in printed and "conforms" in printed
    assert main(["conform", f"{IMPLS}:noisy", "--quick", "--deterministic"]) == 1


def test_usage_errors_exit_2(capsys):
    for argv in (["conform", "not-a-name"], ["conform", "numba", "--convention", "nope"],
                 ["conform", "numba", "--timeout", "0"], ["conform"]):
        with pytest.raises(SystemExit) as exit_info:
            main(argv)
        assert exit_info.value.code == 2
    assert main(["conform", "numba", "--backward", "numba"]) == 2


def test_the_pytest_example_of_the_docs_runs(tmp_path):
    pytest.importorskip("torch")
    text = (REPO / "docs" / "conformance.md").read_text()
    example = text.split("<!-- conformance-example", 1)[1].split("```python\n", 1)[1]
    example = example.split("```", 1)[0]
    assert len(example.strip().splitlines()) <= 12
    example = example.replace("from mypackage import my_attention",
                              "from tests.conformance_impls import sdpa as my_attention")
    (tmp_path / "test_example.py").write_text(example)
    result = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                             str(tmp_path / "test_example.py")], capture_output=True,
                            text=True, cwd=tmp_path, timeout=300)
    assert result.returncode == 0, result.stdout[-3000:]
    passed = int(re.search(r"(\d+) passed", result.stdout).group(1))
    assert passed >= 50  # one test per (property, case)
    assert "agreement-float32[odd]" in subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
         str(tmp_path / "test_example.py")], capture_output=True, text=True,
        cwd=tmp_path).stdout


def test_the_pytest_example_reports_a_broken_function(tmp_path):
    example = ("import pytest\nfrom attnbench.conformance import check, pytest_cases\n"
               "from tests.conformance_impls import no_scaling\n\n"
               "@pytest.mark.parametrize('case', pytest_cases(no_scaling))\n"
               "def test_it(case):\n    check(case)\n")
    (tmp_path / "test_broken.py").write_text(example)
    result = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                             "-k", "agreement-float32 and odd", str(tmp_path / "test_broken.py")],
                            capture_output=True, text=True, cwd=tmp_path, timeout=300)
    assert result.returncode == 1
    assert "scaling is missing" in result.stdout and "tolerance" in result.stdout
