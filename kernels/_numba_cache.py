"""Numba's on-disk cache, made to notice edits of the helpers a cached kernel calls.

Numba stamps a cached function with its own source file only: a kernel in ``numba_cpu.py``
that inlines ``fast_exp`` from ``_numba_math.py`` would keep its stale machine code after
``_numba_math.py`` changed.  Importing this module puts :class:`PackageCacheLocator` first
in Numba's list of cache locators: for a function defined in this package it finds the
cache directory as Numba would (``NUMBA_CACHE_DIR``, ``__pycache__``, the user's cache),
and stamps the entry with the contents of its own file *and* of every module of the
package that file imports, transitively (read from its ``import`` statements).  A change
to any of them makes the entry stale and the kernel is compiled again.  Functions outside
the package are left to Numba's own locators.

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

PACKAGE_DIR = Path(__file__).resolve().parent


@functools.cache
def _package_imports(path: Path, mtime_ns: int) -> tuple[Path, ...]:
    """The package's own modules that the file ``path`` imports (directly)."""
    tree = ast.parse(path.read_bytes())
    found = []
    for node in tree.body:  # module-level imports: a lazy one is not the kernel's code
        if isinstance(node, ast.ImportFrom) and node.level == 1:
            names = [node.module] if node.module else [a.name for a in node.names]
            found += [PACKAGE_DIR / f"{name.split('.')[0]}.py" for name in names]
    return tuple(p for p in found if p.is_file())


def dependencies(path) -> list[Path]:
    """``path`` and every package module it imports, transitively, sorted."""
    seen, todo = set(), [Path(path).resolve()]
    while todo:
        p = todo.pop()
        if p not in seen:
            seen.add(p)
            todo += _package_imports(p, p.stat().st_mtime_ns)
    return sorted(seen)


def source_stamp(path) -> str:
    """SHA-256 over the contents of :func:`dependencies` of ``path`` (names and bytes)."""
    digest = hashlib.sha256()
    for p in dependencies(path):
        digest.update(p.name.encode() + b"\0" + p.read_bytes())
    return digest.hexdigest()


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
            return (self._inner.get_source_stamp(), source_stamp(self._py_file))

        def get_disambiguator(self):
            return self._inner.get_disambiguator()

        @classmethod
        def from_function(cls, py_func, py_file):
            try:
                if Path(py_file).resolve().parent != PACKAGE_DIR:
                    return None
            except OSError:
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
