"""``attnbench run --grid tiny`` end to end, under load: the files it writes, that it reports
no impossible figure, and the report in a browser.

The run shares its machine with a busy loop (a process spinning on one core), as on a
shared server: every check below holds under that load, and none of the figures printed
or written may be impossible (a % of the GEMM peak above 100 is a measurement fault, said
as such; a speed-up above the thread count likewise); every timed row carries its noise
flags.

The browser check needs Chromium (``.ci/run`` installs it with apt-get where it can);
without it that test is skipped and says so.  Everything is written under pytest's
temporary folders; set ``ATTNBENCH_SCREENSHOT=/some/file.png`` to keep a screenshot of
the page.
"""

import contextlib
import json
import math
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from attnbench.cli import main
from attnbench.kernels import has_real_gpu
from attnbench.sweep.agreement import DTYPES as AGREEMENT_DTYPES
from attnbench.sweep.agreement import MASK_KINDS, select_backends
from attnbench.sweep.grid import GRIDS, expand
from tests.browser import check_page, find_chromium, screenshot
from tests.test_report import assert_self_contained

# Every test here reads the module's end-to-end runs: the quick lane leaves them out.
pytestmark = [pytest.mark.slow, pytest.mark.e2e]

REPO = Path(__file__).resolve().parents[1]

#: Tones a summary card may have.
TONES = {"ok", "warn", "bad", "none"}


@contextlib.contextmanager
def busy_loop():
    """A process spinning on one core for the duration of the block."""
    spinner = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        yield spinner
    finally:
        spinner.kill()
        spinner.wait()


#: ``attnbench run`` as a newcomer's shell runs it, plus one line saying whether the run
#: imported the cuda backend's launch module (it must not without a real GPU, even with
#: Numba's CUDA simulator switched on, as tests/conftest.py does for this process's children).
RUN_SCRIPT = """
import sys
from attnbench.cli import main
status = main(sys.argv[1:])
print("kernels.cuda.launch imported:", "attnbench.kernels.cuda.launch" in sys.modules,
      flush=True)
sys.exit(status)
"""


@pytest.fixture(scope="module")
def loaded_run(tmp_path_factory):
    """``attnbench run --grid tiny``, in its own process, beside a busy loop: (status,
    folder, printed text)."""
    out = tmp_path_factory.mktemp("run") / "reports"
    env = dict(os.environ, PYTHONPATH=str(REPO))
    command = [sys.executable, "-c", RUN_SCRIPT, "run", "--grid", "tiny", "--out", str(out),
               "--max-time", "0.005", "--sweep-max-time", "0.005"]
    with busy_loop() as spinner:
        result = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True,
                                timeout=900)
        assert spinner.poll() is None  # the load lasted the whole run
    assert "Traceback" not in result.stderr, result.stderr
    return result.returncode, out, result.stdout


@pytest.fixture(scope="module")
def tiny_run(loaded_run):
    return loaded_run[:2]


def printed_column(text: str, header: str) -> list[float]:
    """Numbers printed in the column ``header`` of every fixed-width table in ``text``."""
    values, end = [], None
    for line in text.splitlines():
        if header in line:
            end = line.index(header) + len(header)  # the columns are right-aligned
        elif not line.strip():
            end = None
        elif end is not None and len(line) >= end and line[:end].split():
            with contextlib.suppress(ValueError):
                values.append(float(line[:end].split()[-1]))
    return values


def test_no_impossible_figure_is_reported_under_load(loaded_run):
    status, out, printed = loaded_run
    assert status == 0
    # Printed: every "% GEMM" of the agreement and the sweep tables is a possible one.
    shown = printed_column(printed, "% GEMM")
    assert len(shown) >= 20 and max(shown) <= 100, shown
    # Written: no percentage above 100; one that was is empty, with the fault said.
    for name in ("agreement.csv", "sweep.csv"):
        table = pd.read_csv(out / name, dtype={"fault": "string"})
        ok = table[table["pct_of_gemm_peak"].notna()]
        assert (ok["pct_of_gemm_peak"] <= 100).all(), name
        faulted = table[table["fault"].fillna("") != ""]
        assert faulted["pct_of_gemm_peak"].isna().all(), name
        assert faulted["fault"].str.startswith("measurement fault").all(), name
        for row in faulted.itertuples():  # ... and printed
            assert row.fault in printed
    # No speed-up above the thread count ("N threads vs 1: X×"), printed or in the report.
    page = (out / "report.html").read_text()
    for threads, speedup in re.findall(r"(\d+) threads vs 1\D{0,40}?([\d.]+)×", printed + page):
        assert float(speedup) <= int(threads), (threads, speedup)
    # Every timed sweep row carries its noise flags and how many samples it took.
    sweep = pd.read_csv(out / "sweep.csv")
    timed = sweep[sweep["status"] == "ok"]
    assert timed["noisy"].isin([True, False]).all()
    assert timed["remeasured"].isin([True, False]).all()
    assert (timed["samples_taken"] >= 6).all() and timed["probe_slowdown"].notna().all()
    # The GEMM peak is the best of several probes through the run, and says so.
    meta = json.loads((out / "sweep.json").read_text())
    probes = meta["machine"]["gemm_peak_probes"]
    threads = int(timed["threads"].iloc[0])  # the sweep's probes ran on its threads
    float32 = [entry for key, entry in probes.items()
               if key == f"float32 n=1024 blas_threads={threads}"]
    assert float32 and max(entry["probes"] for entry in float32) >= 5
    assert meta["gemm_peak_gflops"]["float32"] == max(entry["gflops"] for entry in float32)
    # The cores were checked before the sweep, and what was found is printed and kept.
    cores = meta["cores"]
    assert f"Threads: {cores['text']}." in printed
    if (cores["requested"] == 2 == os.cpu_count()
            and not math.isnan(cores["wait_shares"]["2"])):
        # The busy loop holds one of the two cores: two threads wait, one does not.
        assert cores["threads"] == 1 and meta["threads"] == 1, cores
        assert (sweep.loc[sweep["status"] == "ok", "threads"] == 1).all()  # skipped: no count


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


def test_run_checks_every_backend_mask_and_dtype_and_prints_the_machine(loaded_run):
    status, out, printed = loaded_run
    assert status == 0
    table = pd.read_csv(out / "agreement.csv")
    backends = select_backends()
    assert "cuda" not in backends or has_real_gpu()  # the simulator only when asked for
    pairs = [(b, np.dtype(d).name) for b in backends for d in AGREEMENT_DTYPES]
    assert len(table) == len(MASK_KINDS) * len(pairs)
    assert set(zip(table["backend"], table["dtype"], strict=True)) == set(pairs)
    assert set(table["mask"]) == set(MASK_KINDS)
    assert set(table["dtype"]) == {"float32", "float64", "float16", "bfloat16"}
    assert table["ok"].all()
    assert (table["max_abs_err"] <= table["tolerance"]).all()
    assert (table["median_ms"] > 0).all() and (table["gflops"] > 0).all()
    for column in ("cpu_model", "numba_threads", "blas", "numpy", "gemm_peak_gflops"):
        assert column in table  # every row carries the machine
    assert (out / "machine.json").exists()
    assert "agree" in printed and "GEMM peak" in printed and "CPU" in printed
    assert f"{len(table)}/{len(table)} rows agree" in printed


def test_run_leaves_the_cuda_backend_alone_without_a_gpu(loaded_run):
    """Without a real GPU, ``run`` never imports kernels.cuda.launch (even with the simulator)."""
    printed = loaded_run[2]
    assert f"kernels.cuda.launch imported: {has_real_gpu()}" in printed, printed[-2000:]


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
