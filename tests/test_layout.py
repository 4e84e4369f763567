"""The layout of ``kernels/`` (docs/layout.md): imports run one way, small modules,
no private wiring, a face of imports only, and the public names unchanged.

The import graph is read from every module's ``import`` statements (those inside functions
included) with :mod:`ast`; nothing is imported to read it.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from functools import cache
from pathlib import Path

import pytest

from attnbench import kernels
from attnbench.kernels import mods
from tests.import_graph import cycles, import_graph, imports, layer_of, modules

PACKAGE = Path(kernels.__file__).resolve().parent
#: The backends: one subpackage each; none imports another.
BACKENDS = ("kernels.reference", "kernels.numba_cpu", "kernels.cuda")
#: Layers from the bottom up: a module imports only from its own layer (its own subpackage
#: for a backend) or a lower one.  Modules not named sit where their prefix does.
LAYERS = {
    "kernels._dtypes": -1,  # Numba-free, imports no kernels module: every layer may read it
    "kernels._problems.arrays": -1,  # NumPy only: the first step of every array check
    "kernels._jit": 0, "kernels._dropout": 0, "kernels.stats": 0, "kernels.softmax": 0,
    "kernels.merge": 0,
    "kernels._problems.dense": 0, "kernels._problems.decode": 0, "kernels._problems.sinks": 0,
    "kernels.mods": 1, "kernels._problems.varlen": 1,
    "kernels._problems.checks": 2,
    "kernels._problems.decode_checks": 2.5,  # the decode checks, on the forward's (scale, dtypes)
    "kernels.reference": 3, "kernels.numba_cpu": 3, "kernels.cuda": 3,
    "kernels._api.dispatch": 4,
    "kernels._api.dense": 5, "kernels._api.decode": 5,
    "kernels._api.varlen": 5.5,  # a backend without a packed kernel runs dense calls
    "kernels.multihead": 6, "kernels.kvcache": 6, "kernels.mha": 7,
    "kernels.cuda_backend": 7,
    "kernels": 8,
}
MAX_LINES = 400

# kernels.__all__ and kernels.mods.__all__ as on main at e8957ce (issue 21): public names stay.
KERNELS_ALL = [
    "attention", "attention_backward", "attention_plan", "plan", "plan_needed", "prepare",
    "mods", "softmax", "MultiHeadAttention", "AttentionProblem", "available_backends",
    "cuda_status", "has_real_gpu", "cuda_simulator_enabled", "causal_offset",
    "BackendUnavailableError",
    # issue 23 (decoding with a KV cache)
    "attention_with_kvcache", "merge_attention_states", "KVCache",
    # issue 24 (packed batches)
    "attention_varlen", "attention_varlen_backward",
    # issue 55 (the forms compiled for the machine's instruction set)
    "compiled_forms",
]
MODS_ALL = [
    "sliding_window", "alibi", "softcap", "prefix_lm", "document", "relative_bias",
    "and_masks", "or_masks", "chain", "mask_mod", "score_mod", "block_mask",
    "MaskMod", "ScoreMod", "BlockMask",
]


@cache
def _modules() -> dict[str, Path]:
    """Every module of the package by its dotted name (a package by its ``__init__``)."""
    return modules(PACKAGE)


def _package_of(name: str) -> str:
    """The package a module belongs to (a package's own ``__init__`` belongs to itself)."""
    return name if _modules()[name].name == "__init__.py" else name.rpartition(".")[0]


def _imports(name: str):
    """``(target module, imported name or None, line)`` for each import of module ``name``,
    at any depth (function-level imports included); only targets inside the package."""
    return imports(_modules()[name], PACKAGE, _modules())


def _layer(name: str) -> tuple[int, str]:
    """(layer, group): the longest prefix of ``name`` in :data:`LAYERS`."""
    return layer_of(name, LAYERS, "test_layout.LAYERS")


def _backend(name: str) -> str | None:
    return next((b for b in BACKENDS if name == b or name.startswith(b + ".")), None)


def test_the_package_is_read():
    names = set(_modules())
    assert {"kernels", "kernels._api.dense", "kernels._api.dispatch",
            "kernels.numba_cpu.dense.forward", "kernels.mods.lowering", "kernels.cuda.launch",
            "kernels.reference.forward"} <= names
    imports = {(t, n) for t, n, _ in _imports("kernels.numba_cpu.dense.forward")}
    assert ("kernels.numba_cpu.config", None) in imports  # from . import config
    assert ("kernels._jit.math", "FASTMATH") in imports  # from .._jit.math import FASTMATH


def test_no_import_circle():
    assert cycles(import_graph(PACKAGE)) == []


def test_the_cycle_finder_finds_a_circle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_imports_run_one_way():
    """``_jit`` ← ``mods`` ← backends ← ``_dispatch`` ← ``_api`` ← the face; no backend
    imports another backend, ``_api`` or ``kernels``."""
    wrong = []
    for name in _modules():
        layer, group = _layer(name)
        for target, _, line in _imports(name):
            target_layer, target_group = _layer(target)
            backend, target_backend = _backend(name), _backend(target)
            if backend and target_backend and backend != target_backend:
                wrong.append(f"{name}:{line} imports another backend, {target}")
            elif backend and target in ("kernels", "kernels._api.dense", "kernels._api.dispatch"):
                wrong.append(f"{name}:{line} (a backend) imports {target}")
            elif target_layer > layer or (target_layer == layer and target_group != group):
                wrong.append(f"{name}:{line} imports {target}, above it")
    assert wrong == []


def test_no_private_name_crosses_a_subpackage():
    wrong = [f"{name}:{line} imports {imported} from {target}"
             for name in _modules() for target, imported, line in _imports(name)
             if imported and imported.startswith("_")
             and _package_of(target) != _package_of(name)]
    assert wrong == []


def _defined(name: str) -> set[str]:
    """Names a module defines itself (def, class, assignment at module level)."""
    found = set()
    for node in ast.parse(_modules()[name].read_bytes()).body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            found.add(node.name)
        elif isinstance(node, ast.Assign | ast.AnnAssign | ast.AugAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                for sub in ast.walk(target):
                    if isinstance(sub, ast.Name):
                        found.add(sub.id)
    return found


def test_no_module_re_exports_names_for_its_siblings():
    """A name is imported from the module that defines it (package faces aside: they are
    for the package's users, not for its modules)."""
    wrong = [f"{name}:{line} imports {imported} from {target}, which does not define it"
             for name in _modules() for target, imported, line in _imports(name)
             if imported and _modules()[target].name != "__init__.py"
             and imported not in _defined(target)]
    assert wrong == []


@pytest.mark.parametrize("name", sorted(_modules()))
def test_modules_are_small(name):
    lines = len(_modules()[name].read_text().splitlines())
    assert lines <= MAX_LINES, f"{name} has {lines} lines (at most {MAX_LINES})"


@pytest.mark.parametrize("name", [n for n, p in sorted(_modules().items())
                                  if p.name == "__init__.py"])
def test_package_faces_define_nothing(name):
    tree = ast.parse(_modules()[name].read_bytes())
    defined = [f"{node.name} (line {node.lineno})" for node in ast.walk(tree)
               if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)]
    assert defined == []


def test_import_kernels_imports_neither_numba_nor_llvmlite():
    code = ("import sys, kernels, kernels.mods, attnbench.kernels.mods\n"
            "print(sorted(m for m in ('numba', 'llvmlite') if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=True)
    assert done.stdout.strip() == "[]"


def test_public_names_stay():
    assert kernels.__all__ == KERNELS_ALL
    assert mods.__all__ == MODS_ALL
    for name in KERNELS_ALL:
        assert hasattr(kernels, name)
    for name in MODS_ALL:
        assert hasattr(mods, name)


def test_the_cuda_backend_alias_keeps_attention_device():
    """``kernels.cuda_backend.attention_device`` (the import path of earlier releases),
    checked without importing numba.cuda: the alias names it from the cuda backend."""
    tree = ast.parse(_modules()["kernels.cuda_backend"].read_bytes())
    names = {(node.module, alias.name) for node in ast.walk(tree)
             if isinstance(node, ast.ImportFrom) for alias in node.names}
    assert ("cuda.launch", "attention_device") in names
    assert "attention_device" in _defined("kernels.cuda.launch")
