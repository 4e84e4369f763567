"""The documentation stays true: every Python example of the README and docs/ runs as
written, and every public name has a numpydoc docstring with its Parameters and Returns.

The site itself is built by ``sphinx-build -W`` (a warning is an error) in ``.ci/run``;
``test_site_builds_without_warnings`` builds it here too where Sphinx is installed
(``pip install -e ".[docs]"``).
"""

from __future__ import annotations

import inspect
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from attnbench import kernels
from attnbench.kernels import mods

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "docs" / "_ext"))
DOCUMENTS = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]
#: A Python block whose preceding line is a comment with this is not run here (the comment
#: says why, and where it runs instead).
NOT_RUN = "not run:"
_BLOCK = re.compile(r"(?P<before>^[^\n]*\n)?^```python\n(?P<code>.*?)^```", re.M | re.S)


def _examples(document: Path) -> list[tuple[int, str, bool]]:
    """``(line, code, runs)`` for each fenced Python block of ``document``."""
    text = document.read_text(encoding="utf-8")
    return [(text[:m.start("code")].count("\n"), m.group("code"),
             NOT_RUN not in m.group("before")) for m in _BLOCK.finditer(text)]


WITH_EXAMPLES = [d for d in DOCUMENTS if _examples(d)]


@pytest.mark.parametrize("document", WITH_EXAMPLES, ids=lambda d: str(d.relative_to(REPO)))
def test_every_python_example_runs(document, tmp_path, monkeypatch):
    """The blocks of one document run in order in one namespace, as a reader types them."""
    monkeypatch.chdir(tmp_path)
    namespace: dict = {"__name__": "__docs__"}
    for line, code, runs in _examples(document):
        if runs:
            exec(compile(code, f"{document.name}:{line + 1}", "exec"), namespace)


def test_skipped_examples_say_why():
    for document in DOCUMENTS:
        text = document.read_text(encoding="utf-8")
        for reason in re.findall(r"not run:(.*?)-->", text):
            assert len(reason.strip()) > 10, (document.name, reason)


def _public_callables():
    """Every public name of ``kernels`` and ``kernels.mods``, and each name docs/api.md
    documents with an ``auto*`` directive."""
    names = {f"kernels.{n}" for n in kernels.__all__ if n != "mods"}
    names |= {f"kernels.mods.{n}" for n in mods.__all__ if not n.isupper()}
    api = (REPO / "docs" / "api.md").read_text(encoding="utf-8")
    documented = set(re.findall(r"^\.\. auto(?:function|class|exception):: (\S+)", api, re.M))
    return names, documented


def _resolve(dotted: str):
    module, _, name = dotted.rpartition(".")
    try:
        return getattr(__import__(module, fromlist=[name]), name)
    except (ImportError, AttributeError):  # a class of a module: kernels.mods.MaskMod
        return _resolve(module).__dict__[name]


def test_the_api_reference_lists_every_public_name():
    names, documented = _public_callables()
    assert names <= documented, sorted(names - documented)


@pytest.mark.parametrize("dotted", sorted(set.union(*_public_callables())))
def test_public_names_have_numpydoc_docstrings(dotted):
    from numpydoc.docscrape import ClassDoc, FunctionDoc

    obj = _resolve(dotted)
    doc = (ClassDoc if inspect.isclass(obj) else FunctionDoc)(obj)
    assert doc["Summary"], f"{dotted} has no summary line"
    if inspect.isclass(obj):
        if not issubclass(obj, BaseException):
            init = inspect.signature(obj).parameters
            assert doc["Parameters"] or doc["Attributes"] or not init, \
                f"{dotted}: no Parameters or Attributes section"
        return
    if inspect.signature(obj).parameters:
        assert doc["Parameters"], f"{dotted}: no Parameters section"
    assert doc["Returns"] or doc["Yields"], f"{dotted}: no Returns section"


@pytest.mark.skipif(shutil.which("sphinx-build") is None and
                    not (Path(sys.executable).parent / "sphinx-build").exists(),
                    reason="Sphinx is not installed (pip install -e '.[docs]')")
@pytest.mark.slow  # the whole Sphinx build: left out of the quick lane
@pytest.mark.e2e
def test_site_builds_without_warnings(tmp_path):
    sphinx = shutil.which("sphinx-build") or str(Path(sys.executable).parent / "sphinx-build")
    done = subprocess.run([sphinx, "-W", "--keep-going", "-q", "-b", "html", str(REPO / "docs"),
                           str(tmp_path / "html")], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-4000:]
    assert (tmp_path / "html" / "api.html").exists()
    # The figures are made by the build (docs/_ext) and shown on the pages that include them.
    from attnbench_figures import FIGURES

    images = {p.name for p in (tmp_path / "html" / "_images").glob("*.png")}
    assert {f.__name__.removesuffix("_png") + ".png" for f in FIGURES} <= images, images
    for page, figure in [("guide/harness.html", "scaling.png"),
                         ("guide/harness.html", "stability.png"),
                         ("guide/mods.html", "skipping.png"),
                         ("guide/kernels.html", "heatmap.png")]:
        assert f'src="../_images/{figure}"' in (tmp_path / "html" / page).read_text(), page
