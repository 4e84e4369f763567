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
#: (measure → sweep → studies → the parts built on them → the report → the commands'
#: helpers and the GPU job → the commands).  ``attnbench.kernels`` (kernels/) lies below
#: them all.  Every command is a module of ``attnbench.cli`` holding its arguments and its
#: handler; the helpers they share (argument types, what a sweep prints) sit one layer
#: below them, so that a helper never reaches into a command.
HARNESS_LAYERS = {
    "attnbench.section": 0, "attnbench._kernels_path": 0,
    "attnbench.measure": 1,
    "attnbench.sweep": 2,
    "attnbench.studies": 3,
    "attnbench.claims": 4, "attnbench.conformance": 4,
    "attnbench.report": 5, "attnbench.bench": 5, "attnbench.compare": 5,
    "attnbench.gpu_check": 6, "attnbench.cli.arguments": 6, "attnbench.cli.console": 6,
    "attnbench.cli": 7, "attnbench.__main__": 7, "attnbench": 7,
}


def _harness_layer(name: str) -> tuple[int, str]:
    return layer_of(name, HARNESS_LAYERS, "test_harness_layout.HARNESS_LAYERS")


def _upward(graph: dict[str, set[str]]) -> list[str]:
    """Each import of ``graph`` from a module to one of a higher layer."""
    upward = []
    for module, targets in graph.items():
        if module.startswith("attnbench.kernels"):
            continue
        layer, group = _harness_layer(module)
        for target in targets:
            if target.startswith("attnbench.kernels") or not target.startswith("attnbench"):
                continue
            their_layer, their_group = _harness_layer(target)
            if their_layer > layer:
                upward.append(f"{module} ({group}) imports {target} ({their_group})")
    return upward


def test_the_harness_imports_run_one_way():
    """measure → sweep → studies → claims, conformance → report, bench → the commands'
    helpers → the commands: nothing imports a layer above its own."""
    upward = _upward(import_graph(ROOT))
    assert not upward, upward


def test_the_layer_rule_catches_an_upward_import():
    """A study reading a command's handler, or a command helper reaching into a command,
    is flagged; a command using a helper, a study or the report is not."""
    graph = {"attnbench.studies.scaling": {"attnbench.cli.run"},
             "attnbench.cli.console": {"attnbench.cli.sweep"},
             "attnbench.sweep.agreement": {"attnbench.report.build"},
             "attnbench.cli.run": {"attnbench.cli.console", "attnbench.studies.scaling",
                                   "attnbench.report.build", "attnbench.sweep.agreement"}}
    assert _upward(graph) == [
        "attnbench.studies.scaling (attnbench.studies) imports attnbench.cli.run "
        "(attnbench.cli)",
        "attnbench.cli.console (attnbench.cli.console) imports attnbench.cli.sweep "
        "(attnbench.cli)",
        "attnbench.sweep.agreement (attnbench.sweep) imports attnbench.report.build "
        "(attnbench.report)"]
