"""Imports read from the source with :mod:`ast`, for the layout tests of ``kernels`` and
``attnbench`` (tests/test_layout.py, tests/test_harness_layout.py).

Imports inside functions count: a function-level import is still a dependency, it only
hides a circle from the interpreter until the function runs.
"""

from __future__ import annotations

import ast
from pathlib import Path


def module_name(path: Path, root: Path) -> str:
    """``attnbench.studies.scaling`` for ``<root>/studies/scaling.py`` (``root``: the
    package's folder; a package is named by its ``__init__``)."""
    parts = path.relative_to(root.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules(root: Path, folder: Path | None = None) -> dict[str, Path]:
    """Every module under ``folder`` (default: the whole package at ``root``) by name."""
    return {module_name(p, root): p for p in sorted((folder or root).rglob("*.py"))}


def imports(path: Path, root: Path, known):
    """``(target, imported name or None, line)`` for each import in the file at ``path``,
    at any depth, whose target is a module of ``known``: ``from . import tiles`` gives
    ``(pkg.tiles, None, line)``, ``from .tiles import f`` gives ``(pkg.tiles, "f", line)``."""
    name = module_name(path, root)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_bytes(), filename=str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name in known:
                    yield alias.name, None, node.lineno
        elif isinstance(node, ast.ImportFrom):
            source = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[:len(anchor) - (node.level - 1)]
                source = ".".join(anchor + ([source] if source else []))
            for alias in node.names:
                if f"{source}.{alias.name}" in known:
                    yield f"{source}.{alias.name}", None, node.lineno
                elif source in known:
                    yield source, alias.name, node.lineno


def import_graph(root: Path, folder: Path | None = None) -> dict[str, set[str]]:
    """Module -> the modules under ``folder`` (default: all of ``root``) it imports.

    Importing ``a.b.c`` runs the ``__init__`` of ``a`` and ``a.b`` first, so those count
    too, except a package the importing module is inside: its ``__init__`` has run before
    any of its modules, so it is no dependency of theirs.
    """
    found = modules(root, folder)

    def with_packages(target: str) -> set[str]:
        parts = target.split(".")
        return {p for p in (".".join(parts[:n]) for n in range(1, len(parts) + 1)) if p in found}

    graph = {}
    for name, path in found.items():
        targets = set().union(*(with_packages(t) for t, _, _ in imports(path, root, found)))
        graph[name] = {t for t in targets if t != name and not name.startswith(t + ".")}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One circle per strongly connected component of more than one module (Tarjan)."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(node):
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for other in sorted(graph.get(node, ())):
            if other not in index:
                visit(other)
                low[node] = min(low[node], low[other])
            elif other in on_stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1 or node in graph.get(node, ()):
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def layer_of(name: str, layers: dict, where: str) -> tuple[int, str]:
    """(layer, group): the longest dotted prefix of ``name`` in ``layers``; an
    AssertionError naming ``where`` (the table to add it to) if none."""
    parts = name.split(".")
    for n in range(len(parts), 0, -1):
        prefix = ".".join(parts[:n])
        if prefix in layers:
            return layers[prefix], prefix
    raise AssertionError(f"{name} is in no layer of {where}: add it")
