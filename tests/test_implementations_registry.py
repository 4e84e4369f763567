"""One registry of the implementations attnbench knows by name
(:mod:`attnbench.measure.implementations`): every command's list is a view of it, and no
module keeps a list of its own."""

import ast
from pathlib import Path

import pytest

from attnbench.measure import builtins
from attnbench.measure.implementations import KNOWN, is_external, names
from attnbench.measure.peers import PEERS
from attnbench.measure.specs import BUILTINS, resolve
from attnbench.sweep.grid import BACKENDS

PACKAGE = Path(__file__).resolve().parents[1] / "attnbench"
REGISTRY = PACKAGE / "measure" / "implementations.py"


def test_the_commands_lists_are_views_of_the_registry():
    assert BACKENDS == ("numba", "reference", "cuda", "numpy", "torch", "torch-cuda")
    assert PEERS == ("numpy", "torch")
    assert BUILTINS == ("numba", "reference", "cuda", "numpy", "torch", "jax")
    assert set(builtins._MAKERS) == set(BUILTINS)
    assert names(device="gpu") == ("cuda", "torch-cuda")
    assert len({k.name for k in KNOWN}) == len(KNOWN)
    with pytest.raises(TypeError, match="no field"):
        names(colour="red")


@pytest.mark.parametrize("name", ["numba", "reference", "numpy"])
def test_conform_calls_each_built_in_in_the_registry_s_convention(name):
    known = next(k for k in KNOWN if k.name == name)
    assert resolve(name).convention == known.convention


def test_external_names_are_those_outside_the_registry():
    assert not any(is_external(k.name) for k in KNOWN)
    assert is_external("mypkg.attn:flash")
    assert not is_external("no-such-name")


def _name_lists(tree):
    """(line, names) of each module-level constant that is a literal tuple, list or set
    (or frozenset/set/tuple of one) holding two or more of the registry's names."""
    known = set(names())
    for node in tree.body:
        if not isinstance(node, (ast.Assign, ast.AnnAssign)) or node.value is None:
            continue
        targets = node.targets if isinstance(node, ast.Assign) else [node.target]
        if any(isinstance(t, ast.Name) and t.id.endswith("COLUMNS") for t in targets):
            continue  # table columns ("numpy", "numba": package versions), not names
        value = node.value
        if isinstance(value, ast.Call) and value.args:
            value = value.args[0]
        if isinstance(value, (ast.Tuple, ast.List, ast.Set)):
            found = {e.value for e in value.elts if isinstance(e, ast.Constant)} & known
            if len(found) >= 2:
                yield node.lineno, sorted(found)


def test_no_module_keeps_a_list_of_implementation_names_of_its_own():
    found = [f"{path.relative_to(PACKAGE.parent)}:{line} {listed}"
             for path in sorted(PACKAGE.rglob("*.py")) if path != REGISTRY
             for line, listed in _name_lists(ast.parse(path.read_text()))]
    assert not found, "lists of implementation names outside the registry " \
                      f"(attnbench/measure/implementations.py): {found}"
