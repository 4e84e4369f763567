"""The backend table and the one dispatch point of every entry point of the API.

Each backend is a subpackage with a module per *entry* (:data:`BACKENDS`), each taking a
validated problem:

- ``forward``: ``run(problem, return_lse=False) -> (out, weights or None[, lse])`` of a
  :class:`kernels._problems.dense.AttentionProblem`;
- ``backward``: ``run(problem, dout, out, lse) -> (dq, dk, dv)``;
- ``decode``: ``run(problem) -> (out, lse)`` of a :class:`kernels._problems.decode.DecodeProblem`;
- ``varlen``: ``run(problem) -> (out, lse)`` and ``run_backward(problem, dout, out, lse)``
  of a :class:`kernels._problems.varlen.VarlenProblem`; a backend without one (None) runs
  each sequence as a dense call (:mod:`kernels._api.varlen`).

Every entry point checks its arguments, then :func:`resolve` turns ``backend`` into the
backend that runs (one ``auto`` policy for all: :func:`wants_gpu`), then runs
:func:`entry_module`'s ``run``, then restores the caller's shapes.  The modules are
imported on first use, so that ``import kernels`` stays cheap (no Numba import, no
compilation, no CUDA driver probe).
"""

from __future__ import annotations

import functools
import importlib
import os

from .._problems.decode import DecodeProblem
from .._problems.varlen import VarlenProblem

#: backend name -> entry -> its module, relative to the kernels package (None: no such
#: module).
BACKENDS = {
    "reference": {"forward": "reference.forward", "backward": "reference.backward",
                  "decode": "reference.decode", "varlen": None},
    "numba": {"forward": "numba_cpu.choose", "backward": "numba_cpu.dense.backward",
              "decode": "numba_cpu.decode.attend", "varlen": "numba_cpu.varlen.blocks"},
    "cuda": {"forward": "cuda.launch", "backward": "cuda.backward",
             "decode": "cuda.decode", "varlen": None},
}

#: ``auto`` sends problems with at least this many multiply-adds to a real GPU.
CUDA_AUTO_MIN_WORK = 1 << 28
#: ``auto`` sends decode steps that read at least this many bytes of K and V to a real GPU.
CUDA_AUTO_MIN_BYTES = 1 << 26


class BackendUnavailableError(ValueError, RuntimeError):
    """A backend was asked for by name but cannot run on this machine."""


def cuda_simulator_enabled() -> bool:
    """True if Numba's CUDA simulator is switched on (``NUMBA_ENABLE_CUDASIM=1``).

    Returns
    -------
    bool
    """
    return os.environ.get("NUMBA_ENABLE_CUDASIM", "0") not in ("", "0")


@functools.cache
def cuda_status() -> tuple[bool, str]:
    """Whether the cuda backend can run here: on a GPU, or in the simulator; never raises.

    Returns
    -------
    usable : bool
    why : str
        The GPU's name, the simulator, or what is missing.
    """
    try:
        from numba import cuda
    except Exception as exc:  # numba-cuda missing or broken
        return False, f"numba.cuda cannot be imported ({exc}); install attnbench[cuda]"
    if cuda_simulator_enabled():
        return True, "Numba's CUDA simulator (NUMBA_ENABLE_CUDASIM=1)"
    try:
        if cuda.is_available():
            return True, f"GPU: {cuda.get_current_device().name}"
    except Exception as exc:
        return False, f"no usable CUDA GPU ({exc})"
    return False, (
        "no CUDA GPU or driver was found; set NUMBA_ENABLE_CUDASIM=1 before numba is imported "
        "to run the cuda backend in Numba's simulator"
    )


def has_real_gpu() -> bool:
    """True if the cuda backend runs on a real GPU (not the simulator).

    Returns
    -------
    bool
    """
    return cuda_status()[0] and not cuda_simulator_enabled()


def available_backends() -> list[str]:
    """Names of the backends that can run here.

    Returns
    -------
    list of str
        E.g. ``["reference", "numba", "cuda"]`` (``"cuda"`` where :func:`cuda_status`
        says it can run).
    """
    names = ["reference", "numba"]
    if cuda_status()[0]:
        names.append("cuda")
    return names


def require_cuda() -> None:
    """Raise :class:`BackendUnavailableError`, saying why, unless the cuda backend can run
    here (:func:`cuda_status`)."""
    usable, why = cuda_status()
    if not usable:
        raise BackendUnavailableError(f"backend='cuda' cannot run here: {why}")


def wants_gpu(problem) -> bool:
    """Whether ``auto`` gives ``problem`` to a real GPU: enough work to pay for the copies
    (multiply-adds of a dense problem, bytes of K and V of a decode step without mods);
    never a packed batch, which the cuda backend runs one dense call per sequence."""
    if isinstance(problem, VarlenProblem):
        return False
    if isinstance(problem, DecodeProblem):
        plain = problem.score_mod is None and problem.mask_mod is None
        return plain and problem.key_bytes() >= CUDA_AUTO_MIN_BYTES
    return problem.work >= CUDA_AUTO_MIN_WORK


def resolve(backend: str, problem, entry: str = "forward") -> str:
    """The backend that runs ``problem`` through ``entry`` for ``backend`` (a name
    :func:`kernels._problems.checks.check_backend` accepted): ``auto`` is cuda where
    :func:`wants_gpu` and a real GPU agree, else numba; ``cuda`` must be usable here and
    (where its entry module checks) support the problem, before any work is done."""
    if backend == "auto":
        return "cuda" if wants_gpu(problem) and has_real_gpu() else "numba"
    if backend == "cuda":
        require_cuda()
        check = getattr(entry_module("cuda", entry), "check_supported", None)
        if check is not None:
            check(problem)
    return backend


def entry_module(name: str, entry: str):
    """The module of backend ``name`` for ``entry`` (:data:`BACKENDS`), or None."""
    path = BACKENDS[name][entry]
    return None if path is None else importlib.import_module(".." + path, __package__)
