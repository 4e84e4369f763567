"""The suite's lanes (tests/conftest.py): the default run leaves out the end-to-end lane
(tests marked ``e2e``), ``-m e2e`` runs it alone, ``--quick`` keeps the first case of each
test; checked on a planted file collected by the suite's own hooks."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

_PLANTED = '''
import pytest


@pytest.mark.e2e
def test_heavy():
    pass


@pytest.mark.parametrize("n", [1, 2, 3])
def test_plain(n):
    pass
'''


def _collected(tmp_path, *args) -> list[str]:
    (tmp_path / "test_planted.py").write_text(_PLANTED)
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "tests.conftest", "--co", "-q",
         "-p", "no:cacheprovider", "-W", "ignore::pytest.PytestUnknownMarkWarning",
         "--rootdir", str(tmp_path), str(tmp_path), *args],
        cwd=ROOT, capture_output=True, text=True, timeout=120)
    return [line.split("::", 1)[1] for line in done.stdout.splitlines() if "::" in line]


@pytest.mark.parametrize("args, expected", [
    ((), ["test_plain[1]", "test_plain[2]", "test_plain[3]"]),
    (("-m", "e2e"), ["test_heavy"]),
    (("--quick",), ["test_plain[1]"]),
])
def test_the_lanes_select_what_they_say(tmp_path, args, expected):
    assert _collected(tmp_path, *args) == expected
