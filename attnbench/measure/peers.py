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

Each peer is called through :func:`make_call`, which returns a function of no
arguments: everything that is not the attention itself (converting inputs, building
masks) happens before timing starts.
"""

from __future__ import annotations

import functools
import importlib.util

import numpy as np

__all__ = ["PEERS", "make_call", "numpy_attention", "peer_status", "peer_threads"]

PEERS = ("numpy", "torch")


@functools.cache
def peer_status(name: str) -> tuple[bool, str]:
    """``(usable, why)`` for a peer; never raises."""
    if name == "numpy":
        return True, f"numpy {np.__version__}"
    if name == "torch":
        if importlib.util.find_spec("torch") is None:
            return False, "torch is not installed (pip install 'attnbench[torch]')"
        try:
            import torch
        except Exception as exc:  # a broken install is a missing peer, not a crash
            return False, f"torch cannot be imported ({type(exc).__name__}: {exc})"
        return True, f"torch {torch.__version__}, {torch.get_num_threads()} threads"
    raise ValueError(f"peer {name!r} is unknown; expected one of {PEERS}")


def peer_threads(name: str) -> int | None:
    """Threads the peer computes with (the BLAS's for numpy, torch's own pool for torch)."""
    if name == "torch":
        import torch

        return torch.get_num_threads()
    from threadpoolctl import threadpool_info

    numpy_blas = [pool for pool in threadpool_info()
                  if pool.get("user_api") == "blas" and "numpy" in pool.get("filepath", "")]
    return numpy_blas[0]["num_threads"] if numpy_blas else None


def numpy_attention(q, k, v, *, causal=False, mask=None, key_lengths=None, scale=None):
    """Plain masked attention in q's dtype, for (B, H, L, D) inputs.

    Parameters
    ----------
    q : ndarray, shape (B, H, Lq, D)
    k, v : ndarray, shape (B, Hkv, Lk, D)
        H must be a multiple of Hkv.
    causal : bool
        Top-left causal mask (query i sees keys j <= i).
    mask : ndarray of bool, broadcastable to (B, H, Lq, Lk), optional
        True = attend.
    key_lengths : ndarray of int, shape (B,), optional
        Keys j >= key_lengths[b] are padding.
    scale : float, optional
        Default ``1 / sqrt(D)``.
    """
    B, H, Lq, D = q.shape
    Hkv, Lk = k.shape[1], k.shape[2]
    if H != Hkv:
        k = np.repeat(k, H // Hkv, axis=1)  # (B, H, Lk, D)
        v = np.repeat(v, H // Hkv, axis=1)  # (B, H, Lk, D)
    scale = q.dtype.type(1 / np.sqrt(D) if scale is None else scale)
    scores = (q @ k.swapaxes(-1, -2)) * scale  # (B, H, Lq, Lk)
    if causal:
        scores[..., np.triu(np.ones((Lq, Lk), dtype=bool), k=1)] = -np.inf
    if mask is not None:
        scores = np.where(mask, scores, q.dtype.type(-np.inf))
    if key_lengths is not None:
        padding = np.arange(Lk) >= np.asarray(key_lengths)[:, None, None, None]  # (B, 1, 1, Lk)
        scores = np.where(padding, q.dtype.type(-np.inf), scores)
    scores -= scores.max(axis=-1, keepdims=True)
    np.exp(scores, out=scores)
    scores /= scores.sum(axis=-1, keepdims=True)
    return scores @ v  # (B, H, Lq, D)


def make_call(name: str, q, k, v, kwargs: dict):
    """A function of no arguments that runs peer ``name`` on (B, H, L, D) inputs.

    ``kwargs`` are the masking arguments a sweep passes to :func:`kernels.attention`
    (``causal``, ``mask``, ``key_lengths``); the function returns a NumPy array.
    """
    usable, why = peer_status(name)
    if not usable:
        raise RuntimeError(why)
    if name == "numpy":
        return functools.partial(numpy_attention, q, k, v, **kwargs)
    return _torch_call(q, k, v, **kwargs)


def _torch_call(q, k, v, *, causal=False, mask=None, key_lengths=None):
    import torch
    from torch.nn.functional import scaled_dot_product_attention

    qt, kt, vt = (torch.from_numpy(np.ascontiguousarray(x)) for x in (q, k, v))
    attn_mask = None
    if mask is not None:
        attn_mask = torch.from_numpy(np.ascontiguousarray(mask))  # bool, True = attend
    if key_lengths is not None:
        visible = np.arange(k.shape[2]) < np.asarray(key_lengths)[:, None, None, None]
        attn_mask = torch.from_numpy(visible)  # (B, 1, 1, Lk)
    gqa = q.shape[1] != k.shape[1]

    def call():
        with torch.no_grad():
            out = scaled_dot_product_attention(qt, kt, vt, attn_mask=attn_mask,
                                               is_causal=bool(causal), enable_gqa=gqa)
        return out.numpy()

    return call
