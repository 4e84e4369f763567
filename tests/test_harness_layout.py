"""The harness's layout: no import circle among the modules of ``attnbench.studies``.

Imports are read from the source with :mod:`ast`, those inside functions included (a
function-level import is still a dependency: it only hides the circle from the
interpreter until the function runs).
"""

from __future__ import annotations

import ast
from pathlib import Path

import attnbench

ROOT = Path(attnbench.__file__).parent


def module_name(path: Path, root: Path = ROOT) -> str:
    """``attnbench.studies.scaling`` for ``<root>/studies/scaling.py``."""
    parts = path.relative_to(root.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported_modules(path: Path, known: set[str], root: Path = ROOT) -> set[str]:
    """The modules of ``known`` that the file at ``path`` imports, anywhere in it."""
    name = module_name(path, root)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[:len(anchor) - (node.level - 1)]
                base = ".".join(anchor + ([base] if base else []))
            # ``from attnbench.studies import scaling`` imports the submodule scaling
            targets = [base] + [f"{base}.{alias.name}" for alias in node.names]
        else:
            continue
        found |= {target for target in targets if target in known and target != name}
    # a package's __init__ runs before any of its modules: not a dependency of theirs
    return {target for target in found if not name.startswith(target + ".")}


def import_graph(folder: Path, root: Path = ROOT) -> dict[str, set[str]]:
    """Module -> the modules under ``folder`` it imports (``root``: the package's folder)."""
    files = sorted(folder.rglob("*.py"))
    known = {module_name(path, root) for path in files}
    return {module_name(path, root): imported_modules(path, known, root) for path in files}


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


def test_the_cycle_finder_sees_a_function_level_import(tmp_path):
    package = tmp_path / "attnbench" / "studies"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "a.py").write_text("from attnbench.studies.b import x\n")
    (package / "b.py").write_text("def f():\n    from . import a\n    return a\n")
    graph = import_graph(package, root=tmp_path / "attnbench")
    assert graph["attnbench.studies.b"] == {"attnbench.studies.a"}
    assert cycles(graph) == [["attnbench.studies.a", "attnbench.studies.b"]]


def test_studies_have_no_import_circle():
    graph = import_graph(ROOT / "studies")
    assert "attnbench.studies.scaling" in graph and graph["attnbench.studies.variants"]
    assert cycles(graph) == []


def test_variants_build_on_scaling_not_the_other_way():
    graph = import_graph(ROOT / "studies")
    assert "attnbench.studies.scaling" in graph["attnbench.studies.variants"]
    assert "attnbench.studies.variants" not in graph["attnbench.studies.scaling"]


def test_the_harness_has_no_import_circle():
    """Across the whole package too (studies ↔ report would be one)."""
    assert cycles(import_graph(ROOT)) == []
