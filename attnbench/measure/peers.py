"""Peers: attention implementations outside :mod:`kernels`, timed beside its backends.

- ``"numpy"``: the formula as a NumPy user writes it, in the input dtype: scores
  ``q kᵀ · scale`` (B, H, L, L), masked with ``-inf``, a max-subtracted softmax, ``@ v``.
  It materialises the L x L scores, like the reference, but computes in float32 for
  float32 inputs and does nothing the reference does to stay exact (no float64
  accumulation, no guard against NaN in hidden values, no special case for rows that
  see no key: those would give NaN; the sweep's masks always leave each row a key).
- ``"torch"``: PyTorch's ``scaled_dot_product_attention`` on the CPU, on tensors that
  share the NumPy arrays' memory (``torch.from_numpy``), under ``torch.no_grad()``.
  Optional: where torch is not installed the sweep records the point as skipped.

Any other implementation is a peer too, named as ``attnbench conform`` names it:
``module:function`` (``kernels`` convention), or a name another package registered under
the ``attnbench.implementations`` entry-point group (attnbench's own names there, ``jax``
among them, are ``attnbench conform``'s only;
:func:`~attnbench.measure.implementations.is_external`); it is called through the
conformance kit's adapter of its convention.

Each peer is called through :func:`make_call`, which returns a function of no
arguments: everything that is not the attention itself (converting inputs, building
masks) happens before timing starts.  :func:`make_backward_call` does the same for the
gradients: torch's through autograd (the forward graph is built once, outside the timed
call, so only the backward is timed); the numpy peer has no backward.
"""

from __future__ import annotations

import functools

import numpy as np

from attnbench.measure.implementations import is_external, names
from attnbench.measure.peer_formulas import (  # noqa: F401  (part of this module's API)
    UnsupportedByPeer,
    _reject_dropout,
    numpy_attention,
    torch_sdpa_arguments,
    torch_status,
    visibility,
)

__all__ = ["PEERS", "UnsupportedByPeer", "is_external", "is_peer", "make_backward_call",
           "make_call", "numpy_attention", "peer_status", "peer_threads",
           "torch_sdpa_arguments", "visibility"]

#: The built-in peers a sweep and bench time on the CPU (the registry's view).
PEERS = names(kind="peer", device="cpu", swept=True)


def is_peer(name: str) -> bool:
    """A built-in peer (:data:`PEERS`) or an external one
    (:func:`~attnbench.measure.implementations.is_external`)."""
    return name in PEERS or is_external(name)


@functools.cache
def _external(name: str):
    """The conformance adapter of an external peer (imports it once)."""
    from attnbench.measure.adapters import make_adapter
    from attnbench.measure.specs import resolve

    return make_adapter(resolve(name))


@functools.cache
def peer_status(name: str) -> tuple[bool, str]:
    """``(usable, why)`` for a peer; never raises."""
    if name == "numpy":
        return True, f"numpy {np.__version__}"
    if name not in PEERS and is_external(name):
        try:
            adapter = _external(name)
        except Exception as exc:  # the code named may not import: a missing peer
            return False, f"{name} cannot be loaded ({type(exc).__name__}: {exc})"
        return True, f"{name} ({adapter.convention} convention)"
    if name == "torch":
        return torch_status()
    raise ValueError(f"peer {name!r} is unknown; expected one of {PEERS}")


def peer_threads(name: str) -> int | None:
    """Threads the peer computes with (the BLAS's for numpy, torch's own pool for torch;
    None for an external peer: unknown)."""
    if name not in PEERS:
        return None
    if name == "torch":
        import torch

        return torch.get_num_threads()
    from threadpoolctl import threadpool_info

    numpy_blas = [pool for pool in threadpool_info()
                  if pool.get("user_api") == "blas" and "numpy" in pool.get("filepath", "")]
    return numpy_blas[0]["num_threads"] if numpy_blas else None


def make_call(name: str, q, k, v, kwargs: dict):
    """A function of no arguments that runs peer ``name`` on (B, H, L, D) inputs.

    ``kwargs`` are :func:`kernels.attention`'s keyword arguments (``causal``, ``mask``,
    ``key_lengths``, ``scale``, ...), passed faithfully; the function returns a NumPy
    array.  Raises :class:`UnsupportedByPeer` for what the peer cannot express.
    """
    usable, why = peer_status(name)
    if not usable:
        raise RuntimeError(why)
    if name == "numpy":
        _reject_dropout("the numpy peer", kwargs)
        return functools.partial(numpy_attention, q, k, v, **kwargs)
    if name != "torch":  # external: its convention's adapter (inputs copied per call)
        _reject_dropout(name, kwargs)
        return functools.partial(_external(name).forward, q, k, v, kwargs)
    import torch  # optional peer: imported only when asked for

    qt, kt, vt, sdpa_kwargs = torch_sdpa_arguments(q, k, v, kwargs)

    def call():
        with torch.no_grad():
            out = torch.nn.functional.scaled_dot_product_attention(qt, kt, vt, **sdpa_kwargs)
        return out.numpy()

    return call


def make_backward_call(name: str, q, k, v, dout, kwargs: dict):
    """A function of no arguments returning peer ``name``'s gradients ``(dq, dk, dv)``.

    For torch: ``torch.autograd.grad`` of ``sum(dout * sdpa(q, k, v, ...))`` through the
    graph of one forward call made here (``retain_graph=True``: each call runs the
    backward alone, as :func:`kernels.attention_backward` with ``out`` and ``lse`` given
    does).  ``dk`` and ``dv`` have k's and v's shapes (GQA heads summed by torch).

    Raises
    ------
    UnsupportedByPeer
        The numpy peer (it has no backward), or what torch's SDPA cannot express.
    """
    usable, why = peer_status(name)
    if not usable:
        raise RuntimeError(why)
    if name == "numpy":
        raise UnsupportedByPeer("the numpy peer has no backward pass")
    if name != "torch":  # external: autograd, jax.vjp or its backward function
        adapter = _external(name)
        if adapter.convention == "kernels" and adapter.backward_function is None:
            raise UnsupportedByPeer(f"{name} has no backward function")
        return functools.partial(adapter.backward, q, k, v, np.ascontiguousarray(dout), kwargs)
    import torch  # optional peer: imported only when asked for

    qt, kt, vt, sdpa_kwargs = torch_sdpa_arguments(q, k, v, kwargs)
    inputs = tuple(t.detach().requires_grad_(True) for t in (qt, kt, vt))
    out = torch.nn.functional.scaled_dot_product_attention(*inputs, **sdpa_kwargs)
    grad_out = torch.from_numpy(np.ascontiguousarray(dout))

    def call():
        grads = torch.autograd.grad(out, inputs, grad_out, retain_graph=True)
        return tuple(g.numpy() for g in grads)

    return call
