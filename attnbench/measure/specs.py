"""Which implementation a spec names: built-ins, ``module:function`` and entry points.

An *implementation* is a function plus the calling convention it follows
(:mod:`attnbench.measure.adapters`) and, optionally, a backward function.  A spec is

- a built-in name: ``reference``, ``numba``, ``cuda`` (:func:`kernels.attention` with that
  backend, :func:`kernels.attention_backward` for gradients), ``numpy`` (the plain NumPy
  peer of :mod:`attnbench.measure.peers`), ``torch`` (PyTorch's
  ``scaled_dot_product_attention``, ``sdpa`` convention) and ``jax``
  (``jax.nn.dot_product_attention``, ``jax`` convention);
- a name registered by any installed package under the entry-point group
  :data:`ENTRY_POINT_GROUP` (the built-ins are registered there the same way, in
  attnbench's ``pyproject.toml``); the entry point loads an :class:`Implementation` or a
  plain function (``kernels`` convention);
- ``module:function`` (``module:attr.attr`` too): imported in the worker process.

Resolving a spec imports the code under test, so the runner does it in the subprocess
(:mod:`attnbench.conformance.worker`); :func:`check_spec` only checks the syntax.
"""

from __future__ import annotations

import importlib
import re

from attnbench.measure.implementation import Implementation
from attnbench.measure.implementations import (
    ENTRY_POINT_GROUP,
    names,
    registered,
    registered_names,
)

__all__ = ["BUILTINS", "CONVENTIONS", "ENTRY_POINT_GROUP", "Implementation", "check_spec",
           "load_object", "registered_names", "resolve"]

#: The calling conventions (see :mod:`attnbench.measure.adapters`).
CONVENTIONS = ("kernels", "sdpa", "jax")
#: Built-in implementation names (each also registered under ENTRY_POINT_GROUP): those of
#: the registry (:mod:`attnbench.measure.implementations`) that conform takes.
BUILTINS = names(conformed=True)

_SPEC = re.compile(r"^[A-Za-z_][\w.]*(:[A-Za-z_][\w.]*)?$")


def check_spec(spec: str) -> str:
    """``spec`` if it is a built-in, a registered name or looks like ``module:function``.

    Raises
    ------
    ValueError
        Naming what was expected (a usage error: the CLI exits 2).
    """
    if not isinstance(spec, str) or not _SPEC.match(spec):
        raise ValueError(f"implementation {spec!r} is neither a name ({', '.join(BUILTINS)}) "
                         "nor 'module:function'")
    if ":" not in spec and spec not in BUILTINS and spec not in registered_names():
        raise ValueError(f"implementation {spec!r} is unknown: expected one of "
                         f"{', '.join(sorted(set(BUILTINS) | registered_names()))} or "
                         "'module:function'")
    return spec


def load_object(spec: str):
    """Import ``module:attr.attr`` (or ``module.attr``) and return the object."""
    module_name, _, attribute = spec.partition(":")
    if not attribute:
        module_name, _, attribute = spec.rpartition(".")
    obj = importlib.import_module(module_name)
    for part in attribute.split("."):
        obj = getattr(obj, part)
    return obj


def resolve(spec: str, convention: str | None = None, backward: str | None = None
            ) -> Implementation:
    """The :class:`Implementation` ``spec`` names (imports it).

    Parameters
    ----------
    spec : str
        A built-in or registered name, or ``module:function``.
    convention : {"kernels", "sdpa", "jax"}, optional
        How to call a ``module:function``; default ``"kernels"``.  A name's convention is
        its own (an explicit one overrides it).
    backward : str, optional
        ``module:function`` of the backward (``kernels`` convention:
        :func:`kernels.attention_backward`'s signature).

    Returns
    -------
    Implementation
        The function, its convention, its backward (or None), its name and ``spec``.
    """
    if convention is not None and convention not in CONVENTIONS:
        raise ValueError(f"convention {convention!r} is unknown; expected one of {CONVENTIONS}")
    if ":" in spec:
        found = load_object(spec)
    elif spec in BUILTINS:  # attnbench's own names, whatever its installed metadata says
        from attnbench.measure import builtins

        found = getattr(builtins, spec)
    elif spec in registered_names():
        found = registered(spec).load()
    else:
        raise ValueError(f"implementation {spec!r} is unknown")
    if callable(found) and not isinstance(found, Implementation):
        found = Implementation(function=found)
    if not isinstance(found, Implementation):
        raise TypeError(f"{spec!r} is a {type(found).__name__}, neither a function nor an "
                        "attnbench.conformance.Implementation")
    backward_fn = load_object(backward) if backward else found.backward
    return Implementation(function=found.function, convention=convention or found.convention,
                          backward=backward_fn, name=found.name or spec, spec=spec)
