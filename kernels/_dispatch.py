"""The backend registry, forward and backward, and the one dispatch point of the API.

Each backend is a subpackage with a forward module, ``run(problem, return_lse=False) ->
(out, weights or None[, lse])``, and a backward module, ``run(problem, dout, out, lse) ->
(dq, dk, dv)``, both taking the validated :class:`kernels._problem.AttentionProblem`.
They are imported on first use, so that ``import kernels`` stays cheap (no Numba import,
no compilation, no CUDA driver probe).
"""

from __future__ import annotations

import functools
import importlib
import os

from ._problem import AttentionProblem

#: backend name -> (forward module, backward module, decode module: ``run(problem) -> (out,
#: lse)`` of a :class:`kernels._decode_problem.DecodeProblem`), relative to this package.
BACKENDS = {
    "reference": (".reference.forward", ".reference.backward", ".reference.decode"),
    "numba": (".numba_cpu.choose", ".numba_cpu.backward", ".numba_cpu.decode"),
    "cuda": (".cuda.launch", ".cuda.backward", ".cuda.decode"),
}

#: ``auto`` sends problems with at least this many multiply-adds to a real GPU.
CUDA_AUTO_MIN_WORK = 1 << 28


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


def resolve(backend: str, problem: AttentionProblem) -> str:
    """Turn ``backend`` (already checked to be a known name) into the backend that runs."""
    if backend == "auto":
        if problem.work >= CUDA_AUTO_MIN_WORK and has_real_gpu():
            return "cuda"
        return "numba"
    if backend == "cuda":
        require_cuda()
        from .cuda.launch import check_supported

        check_supported(problem)
    return backend


def module(name: str):
    """The module implementing the forward pass of backend ``name``."""
    return importlib.import_module(BACKENDS[name][0], __package__)


def backward_module(name: str):
    """The module implementing the backward pass of backend ``name``."""
    return importlib.import_module(BACKENDS[name][1], __package__)


def decode_module(name: str):
    """The module implementing the KV-cache decode of backend ``name``."""
    return importlib.import_module(BACKENDS[name][2], __package__)
