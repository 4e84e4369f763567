"""A test that kills its pytest-xdist worker (a crash in compiled code: LLVM's abort, a
segfault) is reported as a failed test by name, and the rest of the suite still runs:
the suite's own hooks (``tests/conftest.py``) must not turn the worker's death into an
INTERNALERROR that stops the run."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

_PLANTED = '''
import os


def test_before():
    assert True


def test_aborts_the_process():
    os.abort()


def test_after():
    assert True
'''


@pytest.mark.e2e  # pytest inside pytest, on two workers
def test_a_crashed_worker_is_a_failed_test_and_the_run_goes_on(tmp_path):
    (tmp_path / "test_planted.py").write_text(_PLANTED)
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "tests.conftest", "-n", "2", "-q",
         "-p", "no:cacheprovider", "--rootdir", str(tmp_path), str(tmp_path)],
        cwd=ROOT, capture_output=True, text=True, timeout=300)
    output = done.stdout + done.stderr
    assert "INTERNALERROR" not in output, output[-3000:]
    assert done.returncode == 1, output[-3000:]
    assert "test_aborts_the_process" in output  # the summary names the test that died
    assert "1 failed, 2 passed" in output, output[-3000:]
