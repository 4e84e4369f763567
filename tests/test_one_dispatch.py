"""One path from a call to a kernel: every entry point of ``kernels`` reaches a backend
through the one table of :mod:`kernels._api.dispatch` (``resolve`` → ``entry_module``), with
one ``auto`` policy; none imports a backend's modules itself."""

import ast
import re
from pathlib import Path

import numpy as np
import pytest

from attnbench.kernels._api import dispatch as _dispatch

KERNELS = Path(__file__).resolve().parents[1] / "kernels"
#: The modules of the API layer and the layers above it: the entry points and their callers.
ENTRY_MODULES = sorted(KERNELS.glob("*.py")) + sorted((KERNELS / "_api").glob("*.py"))
BACKEND_PACKAGES = ("numba_cpu", "reference", "cuda")
#: The numba backend's planning functions: about the backend itself, not a call.
PLANNING = {"plan", "plan_needed", "attention_plan", "compiled_forms"}


def _backend_imports(path: Path):
    """(function, line) of each import of a backend subpackage in the module at ``path``."""
    depth = len(path.relative_to(KERNELS).parts)  # the dots of an import from kernels/
    tree = ast.parse(path.read_text())
    scopes = [("<module>", [s for s in tree.body
                            if not isinstance(s, (ast.FunctionDef, ast.ClassDef))])]
    scopes += [(n.name, n.body) for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)]
    for name, body in scopes:
        for node in (n for statement in body for n in ast.walk(statement)):
            if isinstance(node, ast.ImportFrom) and node.level == depth and (
                    (node.module or "").split(".")[0] in BACKEND_PACKAGES):
                yield name, node.lineno


def test_no_entry_point_imports_a_backend_itself():
    found = []
    for path in ENTRY_MODULES:
        if path.name in ("dispatch.py", "cuda_backend.py"):
            continue
        for function, line in _backend_imports(path):
            if function not in PLANNING:
                found.append(f"{path.name}:{line} in {function}")
    assert not found, f"entry points past the dispatch table: {found}"


def test_every_backend_lists_every_entry():
    entries = {"forward", "backward", "decode", "varlen"}
    assert all(set(table) == entries for table in _dispatch.BACKENDS.values())
    assert _dispatch.entry_module("reference", "varlen") is None  # dense per sequence
    assert _dispatch.entry_module("numba", "varlen").__name__.endswith("numba_cpu.varlen.blocks")


def test_one_auto_policy_for_every_problem(monkeypatch):
    from attnbench import kernels
    from attnbench.kernels._api.varlen import prepare_varlen
    from attnbench.kernels._problems.decode_checks import check_decode_args

    q = np.ones((1, 2, 4, 8), np.float32)
    dense = kernels.prepare(q, q, q)
    cache = np.zeros((1, 2, 16, 8), np.float32)
    decode = check_decode_args(q[:, :, :1], cache, cache, None, None, cache_seqlens=[4],
                               block_table=None, causal=True, scale=None, score_mod=None,
                               mask_mod=None, num_splits=0, sinks=None)[0]
    packed = prepare_varlen(q[0].transpose(1, 0, 2), q[0].transpose(1, 0, 2),
                            q[0].transpose(1, 0, 2), [0, 4], [0, 4])
    monkeypatch.setattr(_dispatch, "has_real_gpu", lambda: True)
    monkeypatch.setattr(_dispatch, "CUDA_AUTO_MIN_WORK", 0)
    monkeypatch.setattr(_dispatch, "CUDA_AUTO_MIN_BYTES", 0)
    assert _dispatch.resolve("auto", dense) == "cuda"
    assert _dispatch.resolve("auto", decode, "decode") == "cuda"
    assert _dispatch.resolve("auto", packed, "varlen") == "numba"  # cuda: dense per sequence
    monkeypatch.setattr(_dispatch, "has_real_gpu", lambda: False)
    assert {_dispatch.resolve("auto", p, e) for p, e in
            ((dense, "forward"), (decode, "decode"), (packed, "varlen"))} == {"numba"}


@pytest.mark.parametrize("entry", ["forward", "backward", "decode", "varlen"])
def test_cuda_asked_by_name_where_it_cannot_run_is_refused_by_every_entry(entry, monkeypatch):
    monkeypatch.setattr(_dispatch, "cuda_status", lambda: (False, "no GPU here"))
    with pytest.raises(_dispatch.BackendUnavailableError, match="no GPU here"):
        _dispatch.resolve("cuda", None, entry)


def test_the_numpy_array_step_of_every_array_check_is_written_once():
    """Only kernels/_problems/arrays.py tells a device array from a NumPy one; the rest
    call it (the cuda backend, which takes device arrays, aside)."""
    arrays = KERNELS / "_problems" / "arrays.py"
    found = [str(path.relative_to(KERNELS)) for path in sorted(KERNELS.rglob("*.py"))
             if "__cuda_array_interface__" in path.read_text() and path != arrays
             and "cuda" not in path.relative_to(KERNELS).parts]
    assert not found, found


class _OnTheGpu:
    __cuda_array_interface__ = {"shape": (1,), "typestr": "<f4", "data": (0, False),
                                "version": 3}


@pytest.mark.parametrize("call, words", [
    (lambda k, x: k.attention(x, x, x), "q is a device array; kernels.attention takes"),
    (lambda k, x: k.merge_attention_states(x, x), "outs is a device array; "
                                                  "merge_attention_states takes"),
])
def test_a_device_array_is_refused_by_name(call, words):
    from attnbench import kernels

    with pytest.raises(TypeError, match=words):
        call(kernels, _OnTheGpu())


def test_every_dtype_and_shape_message_is_written_once():
    """The argument checks raise "<name> has dtype ...; expected ..." and "<name> has shape
    ...; expected ..." through kernels/_problems/arrays.py alone (wrong_dtype, wrong_shape
    and the require_* steps built on them), in every entry point and backend."""
    message = re.compile(r"has (dtype|shape) \{[^}]*\}; expected")
    arrays = KERNELS / "_problems" / "arrays.py"
    found = [f"{path.relative_to(KERNELS)}:{number}"
             for path in sorted(KERNELS.rglob("*.py")) if path != arrays
             for number, line in enumerate(path.read_text().splitlines(), 1)
             if message.search(line)]
    assert not found, found
    assert message.search(arrays.read_text())  # the pattern still finds the one definition
