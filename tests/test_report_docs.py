"""The documents a newcomer follows: docs/, the README's links and commands, tox.ini.

A clone has only this repository: every document the code or the README points to must be
in it, and docs/claims.md must say what the ledger checks (same ids, same texts, each
source named by its title).
"""

import configparser
import re
from pathlib import Path

from attnbench.claims.ledger import CLAIMS, SOURCES

REPO = Path(__file__).resolve().parents[1]


def test_docs_claims_lists_every_claim_as_the_ledger_states_it():
    text = (REPO / "docs" / "claims.md").read_text(encoding="utf-8")
    rows = dict(re.findall(r"^\| (C\d\d) \| [^|]+ \| (.+?) \| \[`", text, re.M))
    assert list(rows) == list(CLAIMS)
    for cid, claim in CLAIMS.items():
        assert rows[cid].replace("\\|", "|") == claim.text, cid


def test_every_source_has_a_title_in_the_code_and_in_docs():
    text = (REPO / "docs" / "claims.md").read_text(encoding="utf-8")
    used = {number.strip() for claim in CLAIMS.values() for number in claim.source.split(",")}
    assert used == set(SOURCES)
    for number in used:
        assert re.search(rf"^\| {number} \| \"[^\"]+\"", text, re.M), number


def test_links_in_the_readme_and_docs_resolve_inside_the_repository():
    for document in (REPO / "README.md", REPO / "CONTRIBUTING.md",
                     *sorted((REPO / "docs").rglob("*.md"))):
        text = document.read_text(encoding="utf-8")
        assert "shared/" not in text and "../shared" not in text, document
        for target in re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", text):
            if not target.startswith(("http://", "https://")):
                assert (document.parent / target).exists(), (document.name, target)
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    assert "(docs/claims.md)" in readme and "(docs/design.md)" in readme
    ledger = (REPO / "attnbench" / "claims" / "ledger.py").read_text(encoding="utf-8")
    assert "docs/claims.md" in ledger


def test_readme_gives_the_benchmark_commands_with_the_venv_python():
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    assert ".venv/bin/python -m pytest --benchmark" in readme
    assert ".venv/bin/python -m pytest tests/benchmarks --benchmark" in readme
    assert not re.search(r"^\s*pytest --benchmark", readme, re.M)  # a bare pytest: wrong one


def test_tox_lists_every_environment_it_defines_and_is_in_the_dev_extra():
    config = configparser.ConfigParser()
    config.read(REPO / "tox.ini")
    listed = [env.strip() for env in config["tox"]["env_list"].split(",")]
    defined = {section.split(":", 1)[1] for section in config.sections()
               if section.startswith("testenv:")}
    assert defined <= set(listed) and len(listed) == len(set(listed))
    pyproject = (REPO / "pyproject.toml").read_text(encoding="utf-8")
    dev = re.search(r"^dev = \[(.*)\]", pyproject, re.M).group(1)
    assert '"tox' in dev
