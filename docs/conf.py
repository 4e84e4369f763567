"""Sphinx configuration of attnbench's documentation site.

Build it with ``pip install -e ".[docs]"`` and then
``sphinx-build -W -b html docs docs/_build/html`` (``-W``: a warning fails the build).
The pages are Markdown (MyST); the API reference is generated from the numpydoc
docstrings (autodoc + numpydoc).  The figures are made by the build
(``docs/_ext/attnbench_figures.py``) from small runs on the machine that builds it.
``results.md`` and its figures are generated here, before the pages are read, from the
stored runs in ``docs/runs/`` (``python -m attnbench.report.results_page``).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

os.environ.setdefault("MPLBACKEND", "Agg")
sys.path.insert(0, str(Path(__file__).resolve().parent / "_ext"))

# results.md (and the README's headline block) from the stored runs, its figures beside
# the build's others; the same command a contributor runs after storing a run.
from attnbench.report import results_page  # noqa: E402

if results_page.main(["--root", str(Path(__file__).resolve().parents[1]), "--figures",
                      str(Path(__file__).resolve().parent / "_generated")]) != 0:
    raise RuntimeError("python -m attnbench.report.results_page failed")

project = "attnbench"
author = "the attnbench developers"
copyright = "2026, the attnbench developers"

extensions = [
    "myst_parser",
    "numpydoc",
    "sphinx.ext.autodoc",
    "sphinx.ext.mathjax",
    "attnbench_figures",  # docs/_ext: the figures, made from small runs at each build
]

source_suffix = {".md": "markdown", ".rst": "restructuredtext"}
root_doc = "index"
exclude_patterns = ["_build", "_ext", "_generated/*.json", "README.md"]

myst_enable_extensions = ["dollarmath"]
myst_heading_anchors = 3

# numpydoc: the parameters tables; no autosummary tables of class members.
numpydoc_show_class_members = False
numpydoc_xref_param_type = False
autodoc_member_order = "bysource"
autodoc_typehints = "none"

html_theme = "alabaster"
html_title = "attnbench"
html_static_path: list[str] = []
html_theme_options = {"page_width": "1180px", "sidebar_width": "240px"}
