"""Code explains itself; results are data: no run diary in the package's code.

Comments, docstrings and ``--help`` strings of ``kernels/`` and ``attnbench/`` say what the
code does and why.  A date, a commit hash, a time or bandwidth figure (``ms``, ``ns``,
``µs``, ``GB/s``) or a machine name there is a measurement that goes stale: it belongs in
the results the benchmarks write, which the docs render.  A reason may still cite a
measured effect in words ("about a third faster").
"""

import ast
import io
import re
import tokenize
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("kernels", "attnbench")

#: What a run diary leaves: dates, short commit hashes (hex with a letter and a digit),
#: figures in time or bandwidth units, machine names.
DIARY = re.compile(
    r"\b20\d\d-\d\d-\d\d\b"
    r"|\b(?=[0-9a-f]*[a-f])(?=[0-9a-f]*\d)[0-9a-f]{7,12}\b"
    r"|\d[\d.,]*\s?(?:-\s?\d[\d.,]*\s?)?(?:ms|ns|µs|us|GB/s|GiB/s|MB/s)\b"
    r"|\bZen ?\d\b|\bEPYC\b|\bXeon\b|\bVM\b|\bSapphire Rapids\b|\bGenoa\b|\bMilan\b")


def prose(source: str):
    """(line, text) of every comment, docstring (and string statement) and ``help=``,
    ``description=`` or ``epilog=`` string of a module's source."""
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.COMMENT:
            yield token.start[0], token.string
    for node in ast.walk(ast.parse(source)):
        strings = []
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant):
            strings = [node.value]
        elif isinstance(node, ast.keyword) and node.arg in ("help", "description", "epilog"):
            strings = [n for n in ast.walk(node.value) if isinstance(n, ast.Constant)]
        for constant in strings:
            if isinstance(constant.value, str):
                for offset, line in enumerate(constant.value.splitlines()):
                    yield constant.lineno + offset, line


def diary_lines(source: str) -> list[tuple[int, str]]:
    return [(line, match.group()) for line, text in prose(source)
            for match in DIARY.finditer(text)]


def test_the_rule_catches_a_diary_and_leaves_explanations_alone():
    diary = ('"""Took 14.5 ms on the 2-core Zen 4 VM (2026-12-06, a938e57)."""\n'
             "x = 1  # 29-31 GB/s one row at a time\n"
             "p.add_argument('--x', help='190 s quiet; 25-26 ns per key')\n")
    found = {match for _, match in diary_lines(diary)}
    assert {"14.5 ms", "Zen 4", "VM", "2026-12-06", "a938e57", "29-31 GB/s",
            "25-26 ns"} <= found
    clean = ('"""About a third faster: the loop vectorises (docs/guide/decode.md)."""\n'
             "COLOR = '#1f77b4'  # a plot colour, code not prose\n"
             "UNITS = 'ms'\n")
    assert diary_lines(clean) == []


@pytest.mark.parametrize("package", PACKAGES)
def test_no_run_diary_in_comments_docstrings_or_help(package):
    found = [f"{path.relative_to(ROOT)}:{line}: {match!r}"
             for path in sorted((ROOT / package).rglob("*.py"))
             for line, match in diary_lines(path.read_text())]
    assert not found, ("measurements in prose (put them in the results the benchmarks "
                       "write; say the effect in words): " + "; ".join(found))


def test_the_layout_page_names_every_module_and_no_missing_one():
    """docs/layout.md is the one description of the layout: every module of ``kernels/``
    and ``attnbench/`` is named there, and every ``*.py`` it names exists."""
    text = (ROOT / "docs" / "layout.md").read_text()
    unnamed = [str(path.relative_to(ROOT)) for package in PACKAGES
               for path in sorted((ROOT / package).rglob("*.py"))
               if path.name != "__init__.py"
               and not re.search(rf"\b{re.escape(path.stem)}\b", text)]
    present = {path.name for folder in (*PACKAGES, "tests", "scripts", ".ci")
               for path in (ROOT / folder).rglob("*.py")}
    absent = sorted({name for name in re.findall(r"\b(\w+\.py)\b", text)} - present
                    - {"setup.py", "conftest.py"})
    assert not unnamed, f"modules docs/layout.md does not name: {unnamed}"
    assert not absent, f"docs/layout.md names files that do not exist: {absent}"
