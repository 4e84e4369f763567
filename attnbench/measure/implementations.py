"""The implementations attnbench knows by name: one registry for sweep, bench and conform.

Each :class:`Known` entry says what a name is (one of :func:`kernels.attention`'s
backends, or a peer: another library's attention), where it computes, how the
conformance battery calls it, and which commands take it.  The lists the commands use
are views of :data:`KNOWN` (:func:`names`): the sweep's and bench's backends
(:data:`attnbench.sweep.grid.BACKENDS`), the CPU peers
(:data:`attnbench.measure.peers.PEERS`), conform's built-ins
(:data:`attnbench.measure.specs.BUILTINS`), the GPU ones, those that skip hidden
tiles.  Any other installed package adds names under the entry-point group
:data:`ENTRY_POINT_GROUP` (attnbench registers its conform built-ins there too); such a
name, or a ``module:function``, is an *external* implementation (:func:`is_external`).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from importlib.metadata import entry_points

__all__ = ["ENTRY_POINT_GROUP", "KNOWN", "Known", "is_external", "names", "registered",
           "registered_names"]

#: Entry-point group under which packages register implementations.
ENTRY_POINT_GROUP = "attnbench.implementations"


@dataclass(frozen=True)
class Known:
    """One implementation attnbench knows by name."""

    name: str
    kind: str  # "backend": kernels.attention(backend=name); "peer": another library's
    device: str  # "cpu" or "gpu"
    convention: str  # how the conformance battery calls it (kernels, sdpa, jax)
    swept: bool  # a backend of attnbench sweep and bench
    conformed: bool  # a built-in of attnbench conform
    skips_hidden_tiles: bool = False  # a window or causal mask makes its work smaller


#: Every name, in the order the commands list them.
KNOWN = (
    Known("numba", "backend", "cpu", "kernels", swept=True, conformed=True,
          skips_hidden_tiles=True),
    Known("reference", "backend", "cpu", "kernels", swept=True, conformed=True),
    Known("cuda", "backend", "gpu", "kernels", swept=True, conformed=True,
          skips_hidden_tiles=True),
    Known("numpy", "peer", "cpu", "kernels", swept=True, conformed=True),
    Known("torch", "peer", "cpu", "sdpa", swept=True, conformed=True),
    Known("torch-cuda", "peer", "gpu", "sdpa", swept=True, conformed=False),
    Known("jax", "peer", "cpu", "jax", swept=False, conformed=True),
)


def names(**fields) -> tuple[str, ...]:
    """The names of :data:`KNOWN` whose fields equal ``fields``, in its order.

    Examples
    --------
    >>> names(kind="peer", device="cpu", swept=True)
    ('numpy', 'torch')
    """
    unknown = set(fields) - set(Known.__dataclass_fields__)
    if unknown:
        raise TypeError(f"Known has no field(s) {sorted(unknown)}")
    return tuple(k.name for k in KNOWN
                 if all(getattr(k, field) == value for field, value in fields.items()))


@functools.cache
def _registered() -> dict:
    """Entry points of :data:`ENTRY_POINT_GROUP`: name -> EntryPoint."""
    return {ep.name: ep for ep in entry_points(group=ENTRY_POINT_GROUP)}


def registered_names() -> frozenset:
    """Names registered under :data:`ENTRY_POINT_GROUP` by any installed package."""
    return frozenset(_registered())


def registered(name: str):
    """The entry point registered as ``name`` (``KeyError`` if none)."""
    return _registered()[name]


def is_external(name: str) -> bool:
    """Whether ``name`` is an implementation outside :data:`KNOWN`: a
    ``module:function``, or a name another package registered under
    :data:`ENTRY_POINT_GROUP` (attnbench's own registered names are its built-ins)."""
    if name in names():
        return False
    return ":" in name or name in registered_names()
