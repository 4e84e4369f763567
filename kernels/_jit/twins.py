"""Uncached twins of cached kernels, for calls with a user's score or mask function.

A kernel specialised on a user's function cannot be cached on disk: the function's
dispatcher type cannot be found again in a new process, so an entry would never be read.
The cached kernels serve calls without mods and with the built-ins (:mod:`kernels.mods.cache`);
a call with a user's function runs the kernel's *twin*: the same Python function compiled
with the same options but no disk cache, calling twins of the cached helpers that take the
user's function.  A twin computes what the cached kernel computes, bit for bit.
"""

from __future__ import annotations

import functools
from types import FunctionType

from numba import njit

__all__ = ["twin", "uncached_twin"]


def _options(dispatcher) -> dict:
    """``dispatcher``'s compile options, as ``njit`` takes them (nopython is implied)."""
    return {key: value for key, value in dispatcher.targetoptions.items() if key != "nopython"}


@functools.cache
def twin(dispatcher):
    """``dispatcher``'s Python function compiled with its options, without the disk cache
    (one per dispatcher and process, shared by every kernel that calls it)."""
    return njit(**_options(dispatcher))(dispatcher.py_func)


def uncached_twin(kernel, *callees):
    """``kernel`` compiled again with its options, without the disk cache, calling the
    :func:`twin` of each dispatcher of ``callees`` where it calls that dispatcher by its
    function's name.

    Parameters
    ----------
    kernel : numba dispatcher
        A cached kernel (``njit(cache=True)``).
    *callees : numba dispatcher
        The cached helpers it calls that take the user's function (their names are global
        names of ``kernel``'s module).
    """
    fn = kernel.py_func
    replaced = {callee.py_func.__name__: twin(callee) for callee in callees}
    return njit(**_options(kernel))(
        FunctionType(fn.__code__, dict(fn.__globals__, **replaced), fn.__name__))
