"""The harness's layout: no import circle among the modules of ``attnbench.studies``.

Imports are read from the source with :mod:`ast`, those inside functions included (a
function-level import is still a dependency: it only hides the circle from the
interpreter until the function runs).
"""

from __future__ import annotations

from pathlib import Path

import attnbench
from tests.import_graph import cycles, import_graph, layer_of

ROOT = Path(attnbench.__file__).parent


def test_the_cycle_finder_sees_a_function_level_import(tmp_path):
    package = tmp_path / "attnbench" / "studies"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "a.py").write_text("from attnbench.studies.b import x\n")
    (package / "b.py").write_text("def f():\n    from . import a\n    return a\n")
    graph = import_graph(tmp_path / "attnbench", package)
    assert graph["attnbench.studies.b"] == {"attnbench.studies.a"}
    assert cycles(graph) == [["attnbench.studies.a", "attnbench.studies.b"]]


def test_studies_have_no_import_circle():
    graph = import_graph(ROOT, ROOT / "studies")
    assert "attnbench.studies.scaling" in graph and graph["attnbench.studies.variants"]
    assert cycles(graph) == []


def test_variants_build_on_scaling_not_the_other_way():
    graph = import_graph(ROOT, ROOT / "studies")
    assert "attnbench.studies.scaling" in graph["attnbench.studies.variants"]
    assert "attnbench.studies.variants" not in graph["attnbench.studies.scaling"]


def test_the_harness_has_no_import_circle():
    """Across the whole package too (studies ↔ report would be one)."""
    assert cycles(import_graph(ROOT)) == []


#: The harness's layers, bottom up: a module imports only from its own layer and below
#: (measure → sweep → studies → the parts built on them → the report → the jobs → the
#: commands).  ``attnbench.kernels`` (kernels/) lies below them all.
HARNESS_LAYERS = {
    "attnbench.section": 0, "attnbench._kernels_path": 0,
    "attnbench.measure": 1,
    "attnbench.sweep": 2,
    "attnbench.studies": 3,
    "attnbench.claims": 4, "attnbench.conformance": 4,
    "attnbench.report": 5, "attnbench.bench": 5, "attnbench.compare": 5,
    "attnbench.job": 6, "attnbench.gpu_check": 6,
    "attnbench.cli": 7, "attnbench.__main__": 7, "attnbench": 7,
}


def _harness_layer(name: str) -> tuple[int, str]:
    return layer_of(name, HARNESS_LAYERS, "test_harness_layout.HARNESS_LAYERS")


def test_the_harness_imports_run_one_way():
    """measure → sweep → studies → claims, conformance → report, bench → jobs → commands:
    nothing imports a layer above its own."""
    upward = []
    for module, targets in import_graph(ROOT).items():
        if module.startswith("attnbench.kernels"):
            continue
        layer, group = _harness_layer(module)
        for target in targets:
            if target.startswith("attnbench.kernels") or not target.startswith("attnbench"):
                continue
            their_layer, their_group = _harness_layer(target)
            if their_layer > layer:
                upward.append(f"{module} ({group}) imports {target} ({their_group})")
    assert not upward, upward
