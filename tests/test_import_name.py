"""The import names: ``attnbench.kernels`` everywhere, ``kernels`` where no other package owns
it (``kernels/_name.py``), and a wheel that ships no top-level ``kernels``.

Another distribution's ``kernels`` (Hugging Face's, which transformers requires) is played by
a package written to a temporary folder on ``PYTHONPATH``: Python finds it before the
editable install's finder, as it finds an installed one.  Each case runs in a fresh process.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

import attnbench
from attnbench import kernels
from attnbench.kernels._name import other_owner

ROOT = Path(__file__).resolve().parents[1]
#: The tests of the short name as attnbench's need it free (not in CI's transformers lanes).
name_is_free = pytest.mark.skipif(
    other_owner() is not None, reason=f"another package owns 'kernels' here: {other_owner()}")

_REPORT = """
import json, sys
import numpy as np
import kernels
from attnbench import kernels as ours
import attnbench.kernels.mods
q = np.ones((1, 2, 4, 8), np.float32)
report = {"short_is_ours": kernels is ours, "owner": getattr(kernels, "OWNER", None),
          "works": ours.attention(q, q, q, backend="reference").shape == (1, 2, 4, 8)}
if report["short_is_ours"]:
    import kernels.mods
    from kernels._api.dispatch import BACKENDS
    report["mods_is_ours"] = kernels.mods is attnbench.kernels.mods
    short = [m for m in sys.modules if m.split(".")[0] == "kernels"]
    report["copies"] = [m for m in short if sys.modules[m] is not sys.modules["attnbench." + m]]
else:
    try:
        kernels.attention
    except AttributeError as error:
        report["missing"] = str(error)
print(json.dumps(report))
"""


def _run(cwd, other_site=None):
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    if other_site is not None:
        env["PYTHONPATH"] = str(other_site)
    done = subprocess.run([sys.executable, "-c", _REPORT], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.splitlines()[-1])


@pytest.fixture
def other_site(tmp_path):
    """A folder holding another distribution's top-level ``kernels`` package."""
    package = tmp_path / "site" / "kernels"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text('OWNER = "someone else"\n')
    (package / "hub.py").write_text("def get_kernel(name):\n    return name\n")
    return tmp_path / "site"


@name_is_free
def test_one_module_object_under_both_names():
    """In this process (the checkout's root, or the editable install) both names are one
    module: the backend table, plans and caches exist once."""
    import kernels as short

    assert short is kernels is attnbench.kernels
    assert kernels.__name__ == "attnbench.kernels"
    assert sys.modules["kernels"] is kernels


@name_is_free
@pytest.mark.parametrize("where", ["checkout", "elsewhere"])
def test_the_short_name_is_attnbench_s_where_it_is_free(where, tmp_path):
    report = _run(ROOT if where == "checkout" else tmp_path)
    assert report["short_is_ours"] and report["mods_is_ours"] and report["works"]
    assert report["copies"] == []  # every kernels.x is attnbench.kernels.x


def test_another_package_keeps_the_short_name_outside_a_checkout(other_site, tmp_path):
    report = _run(tmp_path, other_site)
    assert report["owner"] == "someone else" and not report["short_is_ours"]
    assert report["works"]  # attnbench's kernels under their own name


def test_at_a_checkout_s_root_the_other_package_gets_the_name(other_site):
    """The checkout's folder is found first there; it loads the other package in its place
    (transformers keeps working), whose missing attributes say which import is attnbench's."""
    report = _run(ROOT, other_site)
    assert report["owner"] == "someone else" and not report["short_is_ours"]
    assert report["works"]
    assert "from attnbench import kernels" in report["missing"]
    assert str(other_site) in report["missing"]


@pytest.mark.slow
def test_the_wheel_ships_no_top_level_kernels(tmp_path):
    """A regular install must not write a top-level ``kernels/`` over another
    distribution's: the wheel holds ``attnbench`` (the kernels inside it) and its metadata."""
    source = tmp_path / "source"
    shutil.copytree(ROOT, source, ignore=shutil.ignore_patterns(
        ".git", ".venv*", "__pycache__", "build", "*.egg-info", "reports", "docs", ".*cache"))
    done = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
         "-w", str(tmp_path / "dist"), str(source)],
        capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    (wheel,) = (tmp_path / "dist").glob("attnbench-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert {name.split("/")[0] for name in names} == {"attnbench", "attnbench-0.1.0.dist-info"}
    assert "attnbench/kernels/__init__.py" in names
    assert "attnbench/kernels/numba_cpu/products/pairs.py" in names
    assert not any(name.endswith(".pth") for name in names)
