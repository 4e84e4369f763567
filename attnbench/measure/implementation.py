"""What an implementation spec resolves to (:class:`Implementation`), in a module of its own:
:mod:`attnbench.measure.specs` resolves specs to it and
:mod:`attnbench.measure.builtins` builds the built-in ones, neither importing the other
for it."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Implementation"]


@dataclass(frozen=True)
class Implementation:
    """An attention function, its calling convention and its optional backward."""

    function: object  # the forward, called as its convention says
    convention: str = "kernels"  # one of CONVENTIONS
    backward: object = None  # kernels convention: attention_backward's signature (or None)
    name: str = ""  # what reports call it
    spec: str = ""  # the spec it was resolved from
