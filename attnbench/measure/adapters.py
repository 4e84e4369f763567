"""The three calling conventions: one NumPy problem in, the implementation's output out.

Every check of the battery states its problem once, in :func:`kernels.attention`'s terms
(NumPy ``q (B, H, Lq, D)``, ``k (B, Hkv, Lk, D)``, ``v (B, Hkv, Lk, Dv)`` and its keywords
``causal``, ``mask``, ``key_lengths``, ``scale``, ``dropout_p``/``seed``).  An adapter
turns it into the implementation's call and its output back into NumPy ``(B, H, Lq, Dv)``
(the output's dtype is kept: checking it is part of the battery).

- ``kernels``: NumPy arrays and :func:`kernels.attention`'s keywords; only the keywords a
  problem sets are passed (so an implementation without ``key_lengths`` refuses only the
  problems that need it).  Gradients from ``Implementation.backward``
  (:func:`kernels.attention_backward`'s signature); the log-sum-exp from
  ``return_lse=True``.
- ``sdpa``: torch tensors and ``scaled_dot_product_attention``'s signature, translated by
  the harness's one SDPA adapter (:func:`attnbench.measure.peers.torch_sdpa_arguments`:
  ``key_lengths`` and bottom-right causal become ``attn_mask``); keywords left at their
  defaults are not passed.  Gradients by autograd.
- ``jax``: ``jax.nn.dot_product_attention``'s signature and ``(B, T, N, H)`` layout:
  bool ``mask``, additive ``bias``, ``is_causal`` (top-left with Lq = Lk only; any other
  causal alignment becomes ``mask``), ``key_value_seq_lengths``.  float64 stays float64
  (``jax_enable_x64`` is switched on).  Gradients by ``jax.vjp``; the log-sum-exp from
  ``return_residual=True``.

Inputs are copied before every call, a mask and key lengths included: the code under test
cannot alter the battery's arrays.  ``forward_watched`` also says which of the arrays the
call received it changed and which of them its output shares memory with
(:mod:`attnbench.conformance.integrity`).  What a convention cannot express raises
:class:`Unsupported`.
"""

from __future__ import annotations

import functools

import numpy as np

from attnbench import kernels
from attnbench.measure.peer_formulas import torch_sdpa_arguments, visibility
from attnbench.measure.problems import limit_threads

__all__ = ["ADAPTERS", "Unsupported", "Watched", "make_adapter", "to_numpy", "watch"]

_KNOWN = {"causal", "mask", "key_lengths", "scale", "dropout_p", "seed"}


class Unsupported(ValueError):
    """The convention or the implementation cannot express a feature."""


def to_numpy(result) -> np.ndarray:
    """A NumPy array of an implementation's output (NumPy, torch or jax)."""
    if hasattr(result, "detach"):  # torch
        result = result.detach().cpu().numpy()
    return np.asarray(result)


def _copies(*arrays):
    return tuple(np.array(a, copy=True) for a in arrays)


def _copied_keywords(kwargs):
    return {key: np.array(value, copy=True) if isinstance(value, np.ndarray) else value
            for key, value in kwargs.items()}


class Watched:
    """One call's output and what the call did to the arrays it was given and to the
    outputs of the calls watched before it."""

    def __init__(self, output, changed=(), aliased=(), reused=False, earlier_changed=False):
        self.output = output
        #: the names of the arrays whose bytes (or shape) the call changed
        self.changed = list(changed)
        #: the names of the arrays the output shares memory with
        self.aliased = list(aliased)
        #: whether the output shares memory with an earlier watched call's output
        self.reused = reused
        #: whether the call changed an earlier watched call's output
        self.earlier_changed = earlier_changed


def watch(given: dict, call) -> Watched:
    """Run ``call()`` on the arrays ``given`` (name -> NumPy view of what the call
    receives), noting their bytes before."""
    before = {name: np.array(a, copy=True) for name, a in given.items()}
    output = to_numpy(call())
    return Watched(output,
                   [name for name, a in given.items()
                    if a.shape != before[name].shape or a.tobytes() != before[name].tobytes()],
                   [name for name, a in given.items() if np.shares_memory(output, a)])


class _InProcess:
    """What every adapter of a function in this process shares: watched calls, the thread
    limit of its calls and its timed calls (:mod:`attnbench.conformance.remote` offers the
    same across the process boundary)."""

    #: Outputs of earlier watched calls kept alive (and their bytes), so that a call that
    #: hands back or writes into a buffer it kept is seen, in whatever process it runs.
    KEPT = 4

    def forward_watched(self, q, k, v, kwargs) -> Watched:
        """One call on copies of the inputs: its output, the inputs it changed or its
        output aliases, and whether it reused or changed an earlier watched output."""
        watched = self._forward_watched(q, k, v, kwargs)
        kept = self.__dict__.setdefault("_kept", [])
        watched.reused = any(np.shares_memory(watched.output, earlier) for earlier, _ in kept)
        watched.earlier_changed = any(earlier.tobytes() != before for earlier, before in kept)
        kept.append((watched.output, watched.output.tobytes()))
        del kept[:-self.KEPT]
        return watched

    def threads(self, n: int):
        """A context in which the calls run on ``n`` threads."""
        return limit_threads(n, torch=True)

    def timed_calls(self, q, k, v, kwargs) -> dict:
        """``{"impl": f, "numba": g}``: the implementation's call and the numba backend's
        on the problem, as zero-argument callables for the timer."""
        return {"impl": functools.partial(self.forward, q, k, v, kwargs),
                "numba": functools.partial(kernels.attention, q, k, v, backend="numba",
                                           **kwargs)}


class KernelsAdapter(_InProcess):
    """``kernels`` convention: NumPy in, NumPy out, :func:`kernels.attention`'s keywords."""

    convention = "kernels"

    def __init__(self, implementation):
        self.function = implementation.function
        self.backward_function = implementation.backward

    def forward(self, q, k, v, kwargs):
        return to_numpy(self.function(*_copies(q, k, v), **_copied_keywords(kwargs)))

    def _forward_watched(self, q, k, v, kwargs) -> Watched:
        arrays, keywords = _copies(q, k, v), _copied_keywords(kwargs)
        given = {**dict(zip("qkv", arrays, strict=True)),
                 **{key: value for key, value in keywords.items()
                    if isinstance(value, np.ndarray)}}
        return watch(given, lambda: self.function(*arrays, **keywords))

    def forward_in_place(self, q, k, v, kwargs, q2, k2, v2):
        """Two calls on the same array objects: on copies of q, k, v, then with q2, k2, v2
        written into those arrays in place."""
        arrays, keywords = _copies(q, k, v), _copied_keywords(kwargs)
        first = to_numpy(self.function(*arrays, **keywords))
        for array, new in zip(arrays, (q2, k2, v2), strict=True):
            array[...] = new
        return first, to_numpy(self.function(*arrays, **keywords))

    def forward_lse(self, q, k, v, kwargs):
        result = self.function(*_copies(q, k, v), return_lse=True, **kwargs)
        if not isinstance(result, tuple) or len(result) != 2:
            raise Unsupported("return_lse=True did not return (out, lse)")
        return to_numpy(result[0]), to_numpy(result[1])

    def backward(self, q, k, v, dout, kwargs):
        if self.backward_function is None:
            raise Unsupported("no backward function (--backward module:function)")
        grads = self.backward_function(*_copies(q, k, v, dout), **kwargs)
        return tuple(to_numpy(g) for g in tuple(grads)[:3])

    def native_causal(self, q, k, v):
        return self.forward(q, k, v, {"causal": True})

    def dropout(self, q, k, v, p, seed):
        return self.forward(q, k, v, {"dropout_p": p, "seed": seed})


class SdpaAdapter(_InProcess):
    """``sdpa`` convention: ``scaled_dot_product_attention(query, key, value, attn_mask,
    dropout_p, is_causal, scale, enable_gqa)`` on torch tensors."""

    convention = "sdpa"

    def __init__(self, implementation):
        import torch  # the convention needs it

        self.torch = torch
        self.function = implementation.function

    def _arguments(self, q, k, v, kwargs):
        qt, kt, vt, sdpa = torch_sdpa_arguments(*_copies(q, k, v), _copied_keywords(kwargs))
        sdpa = {key: value for key, value in sdpa.items()
                if value is not None and value is not False}
        return (qt, kt, vt), sdpa

    def forward(self, q, k, v, kwargs):
        tensors, sdpa = self._arguments(q, k, v, kwargs)
        with self.torch.no_grad():
            return to_numpy(self.function(*tensors, **sdpa))

    def _forward_watched(self, q, k, v, kwargs) -> Watched:
        tensors, sdpa = self._arguments(q, k, v, kwargs)
        given = {name: t.numpy() for name, t in zip(("query", "key", "value"), tensors,
                                                     strict=True)}
        if sdpa.get("attn_mask") is not None:
            given["attn_mask"] = sdpa["attn_mask"].numpy()

        def call():
            with self.torch.no_grad():
                return self.function(*tensors, **sdpa)
        return watch(given, call)

    def forward_in_place(self, q, k, v, kwargs, q2, k2, v2):
        """Two calls on the same tensors: q, k, v, then q2, k2, v2 written into them."""
        tensors, sdpa = self._arguments(q, k, v, kwargs)
        with self.torch.no_grad():
            first = to_numpy(self.function(*tensors, **sdpa))
            for tensor, new in zip(tensors, (q2, k2, v2), strict=True):
                tensor.copy_(self.torch.from_numpy(np.ascontiguousarray(new)))
            return first, to_numpy(self.function(*tensors, **sdpa))

    def forward_lse(self, q, k, v, kwargs):
        raise Unsupported("SDPA's signature returns no log-sum-exp")

    def backward(self, q, k, v, dout, kwargs):
        tensors, sdpa = self._arguments(q, k, v, kwargs)
        inputs = tuple(t.detach().clone().requires_grad_(True) for t in tensors)
        out = self.function(*inputs, **sdpa)
        if not getattr(out, "requires_grad", False):
            raise Unsupported("the output carries no autograd graph")
        grads = self.torch.autograd.grad(out, inputs, self.torch.from_numpy(dout.copy()))
        return tuple(to_numpy(g) for g in grads)

    def native_causal(self, q, k, v):
        tensors, _ = self._arguments(q, k, v, {})
        with self.torch.no_grad():
            return to_numpy(self.function(*tensors, is_causal=True))

    def dropout(self, q, k, v, p, seed):
        self.torch.manual_seed(seed)
        tensors, _ = self._arguments(q, k, v, {})
        with self.torch.no_grad():
            return to_numpy(self.function(*tensors, dropout_p=p))


class JaxAdapter(_InProcess):
    """``jax`` convention: ``jax.nn.dot_product_attention(query, key, value, bias, mask, *,
    scale, is_causal, key_value_seq_lengths)``, ``(B, T, N, H)`` layout."""

    convention = "jax"

    def __init__(self, implementation):
        import jax

        jax.config.update("jax_enable_x64", True)  # float64 stays float64
        self.jax = jax
        self.function = implementation.function

    def _arguments(self, q, k, v, kwargs):
        import jax.numpy as jnp

        if kwargs.get("dropout_p"):
            raise Unsupported("jax.nn.dot_product_attention's signature has no dropout")
        unknown = set(kwargs) - _KNOWN
        if unknown:
            raise Unsupported(f"the jax convention has no {sorted(unknown)}")
        B, Lq, Lk = q.shape[0], q.shape[2], k.shape[2]
        arguments = {}
        mask = kwargs.get("mask")
        offset = kernels.causal_offset(kwargs.get("causal", False), Lq, Lk)
        visible = None
        if mask is not None and np.asarray(mask).dtype == np.bool_:
            visible = np.asarray(mask)
        elif mask is not None:
            arguments["bias"] = jnp.asarray(np.asarray(mask, dtype=q.dtype))
        if offset is not None:
            if offset == 0 and Lq == Lk and visible is None:
                arguments["is_causal"] = True
            else:
                visible = visibility(Lq, Lk, {"causal": kwargs["causal"], "mask": visible})
        if visible is not None:
            arguments["mask"] = jnp.asarray(visible)
        if kwargs.get("key_lengths") is not None:
            lengths = np.broadcast_to(np.asarray(kwargs["key_lengths"]), (B,))
            arguments["key_value_seq_lengths"] = jnp.asarray(lengths.astype(np.int32))
        if kwargs.get("scale") is not None:
            arguments["scale"] = kwargs["scale"]
        tensors = tuple(jnp.asarray(np.swapaxes(x, 1, 2)) for x in _copies(q, k, v))
        return tensors, arguments  # (B, L, H, D) each

    def forward(self, q, k, v, kwargs):
        tensors, arguments = self._arguments(q, k, v, kwargs)
        return np.swapaxes(to_numpy(self.function(*tensors, **arguments)), 1, 2)

    def _forward_watched(self, q, k, v, kwargs) -> Watched:
        """jax arrays are immutable and never share the battery's memory: the output
        alone is watched."""
        return watch({}, lambda: self.forward(q, k, v, kwargs))

    def forward_in_place(self, q, k, v, kwargs, q2, k2, v2):
        """jax arrays are immutable: two calls on new arrays."""
        return self.forward(q, k, v, kwargs), self.forward(q2, k2, v2, kwargs)

    def forward_lse(self, q, k, v, kwargs):
        tensors, arguments = self._arguments(q, k, v, kwargs)
        result = self.function(*tensors, return_residual=True, **arguments)
        if not isinstance(result, tuple) or len(result) != 2:
            raise Unsupported("return_residual=True did not return (out, lse)")
        out, lse = result
        return np.swapaxes(to_numpy(out), 1, 2), np.swapaxes(to_numpy(lse), 1, 2)

    def backward(self, q, k, v, dout, kwargs):
        import jax.numpy as jnp

        tensors, arguments = self._arguments(q, k, v, kwargs)
        _, vjp = self.jax.vjp(lambda a, b, c: self.function(a, b, c, **arguments), *tensors)
        grads = vjp(jnp.asarray(np.swapaxes(dout, 1, 2)))
        return tuple(np.swapaxes(to_numpy(g), 1, 2) for g in grads)

    def native_causal(self, q, k, v):
        tensors, _ = self._arguments(q, k, v, {})
        return np.swapaxes(to_numpy(self.function(*tensors, is_causal=True)), 1, 2)

    def dropout(self, q, k, v, p, seed):
        raise Unsupported("jax.nn.dot_product_attention's signature has no dropout")


#: convention -> adapter class.
ADAPTERS = {"kernels": KernelsAdapter, "sdpa": SdpaAdapter, "jax": JaxAdapter}


def make_adapter(implementation):
    """The adapter of ``implementation.convention`` bound to ``implementation``."""
    return ADAPTERS[implementation.convention](implementation)
