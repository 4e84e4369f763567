"""``attention_backward``: the gradients of attention, and the dispatch to a backend.

Each backend is a module with ``run(problem, dout, out, lse) -> (dq, dk, dv)`` taking the
validated (B, H, Lq, ·) arrays, imported on first use as the forward backends are.
"""

from __future__ import annotations

import importlib

import numpy as np

from . import _backends
from ._validate import check_attention_args, check_backend, check_backward_args, check_mods

_BACKWARD_MODULES = {
    "reference": "kernels.reference_backward",
    "numba": "kernels.numba_backward",
    "cuda": "kernels.cuda_backward",
}


def backward_module(name: str):
    """The module implementing the backward pass of backend ``name``."""
    return importlib.import_module(_BACKWARD_MODULES[name])


def attention_backward(q, k, v, dout, *, out=None, lse=None, causal=False, mask=None,
                       key_lengths=None, scale=None, dropout_p=0.0, seed=None, backend="auto",
                       score_mod=None, mask_mod=None):
    """Gradients of ``sum(dout * attention(q, k, v, ...))`` with respect to q, k and v.

    Parameters
    ----------
    q, k, v : ndarray
        As in :func:`kernels.attention`: (..., H, Lq, D), (..., Hkv, Lk, D),
        (..., Hkv, Lk, Dv), also 3-D and 2-D; float32 or float64, one dtype.
    dout : ndarray, shape (..., H, Lq, Dv)
        Gradient of the loss with respect to attention's output, in q's dtype.
    out : ndarray, shape (..., H, Lq, Dv), optional
        The forward output for the same arguments (with the same dropout seed).
        Recomputed when missing.
    lse : ndarray, shape (..., H, Lq), optional
        The forward's log-sum-exp (``attention(..., return_lse=True)``). Recomputed when
        missing (with ``out``, by one forward call).
    causal, mask, key_lengths, scale, dropout_p, seed, backend
        As in :func:`kernels.attention`. Masks are constants: no gradient flows to them.
        With ``dropout_p > 0`` pass the forward's ``seed``: the same weights are dropped.
    score_mod, mask_mod : optional
        As in :func:`kernels.attention` (the same functions as the forward's).  The
        gradient flows through ``score_mod`` by its derivative with respect to the score:
        built-ins carry theirs; a user function needs one
        (``kernels.mods.score_mod(fn, *arrays, grad=dfn)``).

    Returns
    -------
    dq : ndarray, shape of q
    dk : ndarray, shape of k
        Summed over the query heads that share each key/value head (GQA/MQA).
    dv : ndarray, shape of v

    Notes
    -----
    A query that sees no key gets ``dq = 0`` and adds nothing to ``dk`` and ``dv``; keys
    no query sees get ``dk = dv = 0``.  NaN or inf stored in a hidden key or value, or in
    the q and dout rows of a query that sees no key, reaches no gradient.  ``out`` and
    ``lse`` are trusted to be the forward's (the numba and cuda backends recompute the
    softmax from ``lse`` and take ``rowsum(dout * out)`` from ``out``); the reference
    backend recomputes both in float64 and ignores them.

    Raises
    ------
    TypeError, ValueError
        As :func:`kernels.attention`; also a ``dout``, ``out`` or ``lse`` of the wrong
        shape or dtype (the message names the argument), and a user ``score_mod`` without
        a derivative (ValueError naming the function).

    Examples
    --------
    >>> import numpy as np, kernels
    >>> q = k = v = np.ones((1, 2, 4, 8), np.float32)
    >>> out, lse = kernels.attention(q, k, v, causal=True, return_lse=True)
    >>> dq, dk, dv = kernels.attention_backward(q, k, v, np.ones_like(out), out=out,
    ...                                         lse=lse, causal=True)
    >>> dq.shape, dk.shape, dv.shape
    ((1, 2, 4, 8), (1, 2, 4, 8), (1, 2, 4, 8))
    """
    backend = check_backend(backend)
    problem = check_attention_args(
        q, k, v, causal=causal, mask=mask, key_lengths=key_lengths, scale=scale,
        dropout_p=dropout_p, seed=seed,
    )
    problem = check_mods(problem, score_mod=score_mod, mask_mod=mask_mod)
    if problem.score_mod is not None:
        problem.score_mod.grad("cpu", problem.dtype)  # ValueError naming it if it has none
    q_shape = np.shape(q)
    dout, out, lse = check_backward_args(problem, q_shape, dout, out, lse)
    name = _backends.resolve(backend, problem)
    if name != "reference" and (out is None or lse is None):
        out, _, lse = _backends.module(name).run(problem, return_lse=True)
    dq, dk, dv = backward_module(name).run(problem, dout, out, lse)
    k_lead = np.shape(k)[:-1]  # dk and dv take k's and v's shapes (any rank)
    return (problem.restore(dq), dk.reshape(k_lead + dk.shape[-1:]),
            dv.reshape(k_lead + dv.shape[-1:]))
