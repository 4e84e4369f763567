"""Where ``attnbench.kernels`` comes from when attnbench runs from a checkout.

Installed, the kernels are this package's subpackage ``attnbench.kernels`` (``setup.py``
maps the repository's folder ``kernels/`` there, in a wheel and in an editable install).
A process that imports attnbench from a checkout's root instead (its folder first on
``sys.path``: a checkout that was never installed, or one beside a regular install) finds
no ``kernels`` inside this folder: :func:`install` then points the subpackage at the
folder beside it.  The finder is asked last, after every installed package.
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import sys
from pathlib import Path

__all__ = ["install"]

_HERE = Path(__file__).resolve().parent
#: The checkout's kernels: the folder beside this one.
SIBLING = _HERE.parent / "kernels"


class _CheckoutKernels(importlib.abc.MetaPathFinder):
    @classmethod
    def find_spec(cls, fullname, path=None, target=None):
        if fullname != "attnbench.kernels":
            return None
        return importlib.util.spec_from_file_location(
            fullname, SIBLING / "__init__.py", submodule_search_locations=[str(SIBLING)])


def install() -> None:
    """Add the finder where this package has no ``kernels`` inside and a checkout's
    kernels lie beside it (a folder with ``_name.py``, which another package's ``kernels``
    in the same site-packages lacks); else do nothing."""
    if (_HERE / "kernels").is_dir() or not (SIBLING / "_name.py").is_file():
        return
    if _CheckoutKernels not in sys.meta_path:
        sys.meta_path.append(_CheckoutKernels)
