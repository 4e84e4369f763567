"""The built-in implementations, each registered under the ``attnbench.implementations``
entry-point group (``pyproject.toml``) as ``attnbench.measure.builtins:<name>``.

Attributes are built on first access (module ``__getattr__``), so naming ``numba`` does
not import torch or jax.
"""

from __future__ import annotations

import functools

from attnbench.measure.implementation import Implementation
from attnbench.measure.implementations import names

__all__: list[str] = []  # the names are module attributes built on access (_MAKERS)


def _kernels(backend: str) -> Implementation:
    from attnbench import kernels

    return Implementation(function=functools.partial(kernels.attention, backend=backend),
                          backward=functools.partial(kernels.attention_backward,
                                                     backend=backend),
                          name=backend)


def _numpy() -> Implementation:
    from attnbench.measure.peer_formulas import numpy_attention

    return Implementation(function=numpy_attention, name="numpy")


def _torch() -> Implementation:
    import torch

    return Implementation(function=torch.nn.functional.scaled_dot_product_attention,
                          convention="sdpa", name="torch")


def _jax() -> Implementation:
    import jax

    return Implementation(function=jax.nn.dot_product_attention, convention="jax", name="jax")


#: How each built-in is made: kernels' backends alike, each peer its own way.
_MAKERS = {**{name: functools.partial(_kernels, name)
              for name in names(kind="backend", conformed=True)},
           "numpy": _numpy, "torch": _torch, "jax": _jax}


def __getattr__(name: str) -> Implementation:
    if name in _MAKERS:
        return _MAKERS[name]()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
