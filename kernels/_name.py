"""The top-level name ``kernels``: attnbench's where it is free, another package's where not.

attnbench's kernels are the package ``attnbench.kernels`` (the repository's folder
``kernels/``, mapped there by ``setup.py``): Hugging Face's ``kernels`` distribution, which
transformers requires, installs a top-level package of that name, and two distributions
must never write the same files.  ``from attnbench import kernels`` works wherever attnbench
is installed or checked out.

The short form ``import kernels`` imports this folder by its top-level name in a checkout
(its root first on ``sys.path``) and in an editable install (``setup.py`` maps the name there
through setuptools' finder, which Python asks after every installed package).  The folder's
``__init__`` then calls :func:`hand_over`, and the name goes to one of two packages:

- where no other ``kernels`` is on ``sys.path``, to ``attnbench.kernels`` itself, submodules
  included (``kernels.mods`` is ``attnbench.kernels.mods``): one module object, never a
  second copy of the backend table, the plans or the caches under another name;
- where another distribution's ``kernels`` is on ``sys.path`` (found after the checkout's
  root), to that package, loaded in the folder's place: a checkout's root is where a
  process runs attnbench's tests and scripts, and transformers, imported there, must get
  the package it requires.  Its missing attributes then say where attnbench's kernels are.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
from pathlib import Path

__all__ = ["REAL_NAME", "hand_over", "other_owner"]

#: The name attnbench's kernels have in every process.
REAL_NAME = "attnbench.kernels"
_FOLDER = Path(__file__).resolve().parent


class _Alias(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """``kernels`` and ``kernels.x`` as ``attnbench.kernels`` and ``attnbench.kernels.x``:
    the loader returns the module imported under the real name and runs nothing again."""

    @classmethod
    def find_spec(cls, fullname, path=None, target=None):
        if fullname.startswith("kernels.") and sys.modules.get("kernels") is _real():
            return importlib.machinery.ModuleSpec(fullname, cls())
        return None

    def create_module(self, spec):
        return importlib.import_module("attnbench." + spec.name)

    def exec_module(self, module):
        pass  # imported under its real name already


def _real():
    return sys.modules.get(REAL_NAME)


def _other_kernels():
    """The spec of a top-level ``kernels`` that is not this folder, found on ``sys.path``
    without the folder's parent; None where there is none."""
    parent = _FOLDER.parent
    entries = [entry for entry in sys.path
               if not _same_directory(entry or ".", parent)]
    spec = importlib.machinery.PathFinder.find_spec("kernels", entries)
    if spec is None or spec.origin is None or _FOLDER in Path(spec.origin).resolve().parents:
        return None
    return spec


def other_owner() -> str | None:
    """Where another package's top-level ``kernels`` lies, if one is on ``sys.path`` (then
    ``import kernels`` is that package); None where the name is attnbench's."""
    spec = _other_kernels()
    return None if spec is None else spec.origin


def _same_directory(entry: str, directory: Path) -> bool:
    try:
        return Path(entry).resolve() == directory
    except (OSError, RuntimeError):
        return False


def _load_other(spec):
    """Load another distribution's ``kernels`` under the top-level name."""
    module = importlib.util.module_from_spec(spec)
    sys.modules["kernels"] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        sys.modules.pop("kernels", None)
        raise
    if "__getattr__" not in module.__dict__:
        module.__getattr__ = _missing_in_other(spec.origin)


def _missing_in_other(origin):
    def __getattr__(name):
        message = f"module 'kernels' has no attribute {name!r}"
        if not name.startswith("__"):
            message += (f": 'kernels' here is the installed package at {origin}, which owns "
                        f"the name; attnbench's kernels (in {_FOLDER}) are imported as "
                        f"'from attnbench import kernels'")
        raise AttributeError(message)
    return __getattr__


def hand_over() -> None:
    """Give the top-level name ``kernels`` to the package that owns it (module docstring);
    called by the folder's ``__init__`` when it is imported as ``kernels``."""
    sys.modules.pop("kernels._name", None)  # this module, imported under the short name
    other = _other_kernels()
    if other is not None:
        _load_other(other)
        return
    real = importlib.import_module(REAL_NAME)
    if _Alias not in sys.meta_path:
        sys.meta_path.insert(0, _Alias)
    sys.modules["kernels"] = real
