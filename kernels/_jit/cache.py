"""Numba's on-disk cache, made to notice edits of the helpers a cached kernel calls.

Numba stamps a cached function with its own source file only: a kernel in
``numba_cpu/dense/forward.py`` that inlines ``exp32`` from ``_jit/math.py`` would keep its
stale machine code after ``_jit/math.py`` changed. Importing this module puts
:class:`PackageCacheLocator` first in Numba's list of cache locators: for a function
defined in this package it finds the cache directory as Numba would (``NUMBA_CACHE_DIR``,
``__pycache__``, the user's cache), and stamps the entry with the contents of its own file
*and* of every module of the package that file imports, transitively, in any subpackage
(read from its module-level ``import`` statements: relative ones of any level and absolute
``kernels.…`` ones). A change to any of them makes the entry stale and the kernel is
compiled again. Functions outside the package are left to Numba's own locators.

This relies on ``numba.core.caching.CacheImpl._locator_classes`` (``_CacheImpl`` in older
Numba versions; the list that the
``NUMBA_CACHE_LOCATOR_CLASSES`` setting replaces); where it is missing, the package
falls back to Numba's behaviour (then clear the cache after editing a helper module).
"""

from __future__ import annotations

import ast
import functools
import hashlib
from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parent.parent


def _module_file(parts) -> Path | None:
    """The file of the package module named by ``parts`` (relative to ``PACKAGE_DIR``):
    ``a/b.py`` or, for a subpackage, ``a/b/__init__.py``; None if neither exists."""
    base = PACKAGE_DIR.joinpath(*parts)
    for candidate in (base.with_name(base.name + ".py") if parts else None,
                      base / "__init__.py"):
        if candidate is not None and candidate.is_file():
            return candidate
    return None


def _top_level_imports(tree):
    """The import statements a module runs when it is imported (not those in functions)."""
    todo = list(tree.body)
    while todo:
        node = todo.pop(0)
        if isinstance(node, ast.Import | ast.ImportFrom):
            yield node
        elif isinstance(node, ast.If | ast.Try | ast.With):  # still module level
            for field in ("body", "orelse", "finalbody", "handlers"):
                todo += getattr(node, field, [])
        elif isinstance(node, ast.ExceptHandler):
            todo += node.body


@functools.cache
def _package_imports(path: Path, mtime_ns: int, root: Path) -> tuple[Path, ...]:
    """The package's own module files that the file ``path`` imports (directly).

    Follows relative imports of any level (``from .x import f``, ``from ..jit.math import
    f``, ``from . import tiles``) and absolute ones of the package (``import kernels.x``):
    the module named, and each imported name that is itself a module of the package."""
    here = list(path.relative_to(root).parent.parts)  # the package ``path`` belongs to
    found = []
    for node in _top_level_imports(ast.parse(path.read_bytes())):
        if isinstance(node, ast.Import):
            targets = [a.name.split(".") for a in node.names]
            targets = [t[1:] for t in targets if t[0] == root.name]
            for t in targets:  # ``import kernels.a.b`` runs kernels.a and kernels.a.b
                found += [_module_file(t[:n]) for n in range(1, len(t) + 1)]
            continue
        if node.level == 0:
            parts = (node.module or "").split(".")
            if parts[0] != root.name:
                continue
            base = parts[1:]
        else:
            if node.level - 1 > len(here):
                continue  # above the package
            base = here[:len(here) - (node.level - 1)]
            base = base + (node.module.split(".") if node.module else [])
        module = _module_file(base)
        names = [a.name for a in node.names]
        submodules = [_module_file(base + [name]) for name in names if name != "*"]
        found += [m for m in submodules if m is not None]
        if module is not None and (node.module or len(submodules) < len(names)):
            # ``from .x import f`` reads x; ``from . import name`` reads the package's
            # __init__ only for a name that is not a submodule
            found.append(module)
    return tuple(sorted({p.resolve() for p in found if p is not None}))


def dependencies(path) -> list[Path]:
    """``path`` and every package module it imports, transitively, sorted."""
    root = PACKAGE_DIR
    seen, todo = set(), [Path(path).resolve()]
    while todo:
        p = todo.pop()
        if p not in seen:
            seen.add(p)
            todo += _package_imports(p, p.stat().st_mtime_ns, root)
    return sorted(seen)


def source_stamp(*paths) -> str:
    """SHA-256 over the contents of the :func:`dependencies` of ``paths`` (each file's path
    in the package and its bytes)."""
    digest = hashlib.sha256()
    for p in sorted({d for path in paths for d in dependencies(path)}):
        digest.update(p.relative_to(PACKAGE_DIR).as_posix().encode() + b"\0" + p.read_bytes())
    return digest.hexdigest()


def in_package(py_file) -> bool:
    """True for a file inside the package (its folder or a subfolder)."""
    try:
        return Path(py_file).resolve().is_relative_to(PACKAGE_DIR)
    except OSError:
        return False


def _install() -> bool:
    from numba.core import caching

    impl = getattr(caching, "CacheImpl", None) or getattr(caching, "_CacheImpl", None)
    base = getattr(caching, "_CacheLocator", None)
    if impl is None or base is None or not isinstance(getattr(impl, "_locator_classes", None),
                                                      list):
        return False  # another Numba layout: Numba's own stamps
    if any(getattr(c, "package_locator", False) for c in impl._locator_classes):
        return True
    numba_locators = list(impl._locator_classes)

    class PackageCacheLocator(base):
        """Numba's own locator for the function, with :func:`source_stamp` as the stamp."""

        package_locator = True

        def __init__(self, inner, py_file):
            self._inner, self._py_file = inner, py_file

        def ensure_cache_path(self):
            self._inner.ensure_cache_path()

        def get_cache_path(self):
            return self._inner.get_cache_path()

        def get_source_stamp(self):
            # The package's import name too: an entry names the module its globals come
            # from, so one written under another import name of the package is compiled
            # again, not loaded.
            return (self._inner.get_source_stamp(), source_stamp(self._py_file), __name__)

        def get_disambiguator(self):
            return self._inner.get_disambiguator()

        @classmethod
        def from_function(cls, py_func, py_file):
            if not in_package(py_file):
                return None
            for locator_class in numba_locators:
                inner = locator_class.from_function(py_func, py_file)
                if inner is not None:
                    return cls(inner, py_file)
            return None

    impl._locator_classes.insert(0, PackageCacheLocator)
    return True


#: True when the package's cached kernels are stamped with their dependencies.
INSTALLED = _install()
