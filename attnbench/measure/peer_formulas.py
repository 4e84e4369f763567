"""The peers' formulas and argument conversions, apart from the peer registry.

:func:`numpy_attention` (the plain NumPy formula), :func:`torch_sdpa_arguments` (one
PyTorch SDPA adapter), :func:`visibility` (which pairs the masking arguments leave
visible), :func:`torch_status` (whether torch imports) and :class:`UnsupportedByPeer`.
They live here, below :mod:`attnbench.measure.peers` (which also resolves external peers
through :mod:`attnbench.conformance`), so that the conformance kit's adapters can use them
without an import circle.
"""

from __future__ import annotations

import functools
import importlib.util

import numpy as np

from attnbench import kernels

__all__ = ["UnsupportedByPeer", "numpy_attention", "torch_sdpa_arguments", "torch_status",
           "visibility"]


@functools.cache
def torch_status() -> tuple[bool, str]:
    """``(usable, why)`` for PyTorch, the optional peer; never raises.

    Returns
    -------
    usable : bool
    why : str
        torch's version and thread count, or why it cannot be used.
    """
    if importlib.util.find_spec("torch") is None:
        return False, "torch is not installed (pip install 'attnbench[torch]')"
    try:
        import torch
    except Exception as exc:  # a broken install is a missing peer, not a crash
        return False, f"torch cannot be imported ({type(exc).__name__}: {exc})"
    return True, f"torch {torch.__version__}, {torch.get_num_threads()} threads"


class UnsupportedByPeer(ValueError):
    """The peer cannot express an argument faithfully (e.g. torch and seeded dropout)."""


def _reject_dropout(name: str, kwargs: dict) -> None:
    if kwargs.get("dropout_p", 0.0):
        raise UnsupportedByPeer(
            f"{name} cannot express dropout_p={kwargs['dropout_p']}: kernels' dropout comes "
            "from a stateless hash of (seed, b, h, i, j) that the peer does not share")
    unknown = set(kwargs) - {"causal", "mask", "key_lengths", "scale", "dropout_p", "seed"}
    if unknown:
        raise UnsupportedByPeer(f"{name} does not take {sorted(unknown)}")


def visibility(Lq: int, Lk: int, kwargs: dict) -> np.ndarray | None:
    """Which (query, key) pairs ``causal``, a bool ``mask`` and ``key_lengths`` leave visible.

    Returns a bool array broadcastable to (B, H, Lq, Lk) (True = attend), or None when all
    pairs are visible.  A float ``mask`` is not included (it is added to the scores).
    """
    visible = None

    def both(a, b):
        return b if a is None else a & b

    offset = kernels.causal_offset(kwargs.get("causal", False), Lq, Lk)
    if offset is not None:
        visible = np.arange(Lk)[None, :] <= np.arange(Lq)[:, None] + offset  # (Lq, Lk)
    mask = kwargs.get("mask")
    if mask is not None and np.asarray(mask).dtype == np.bool_:
        visible = both(visible, np.asarray(mask))
    if kwargs.get("key_lengths") is not None:
        lengths = np.atleast_1d(np.asarray(kwargs["key_lengths"])).reshape(-1)  # (B,) or (1,)
        visible = both(visible, np.arange(Lk) < lengths[:, None, None, None])  # (B, 1, 1, Lk)
    return visible


def numpy_attention(q, k, v, *, causal=False, mask=None, key_lengths=None, scale=None,
                    dropout_p=0.0, seed=None):
    """Plain masked attention in q's dtype, for (B, H, L, D) inputs.

    Takes :func:`kernels.attention`'s masking arguments with their meaning (all combine)
    and raises :class:`UnsupportedByPeer` for dropout.  A row that sees no key gives NaN
    (the plain formula's 0/0), where :func:`kernels.attention` gives 0.

    Parameters
    ----------
    q : ndarray, shape (B, H, Lq, D)
    k, v : ndarray, shape (B, Hkv, Lk, D)
        H must be a multiple of Hkv.
    causal : bool or {"top-left", "bottom-right"}
    mask : ndarray, broadcastable to (B, H, Lq, Lk), optional
        bool (True = attend) or float (added to the scores).
    key_lengths : ndarray of int, shape (B,), optional
        Keys j >= key_lengths[b] are padding.
    scale : float, optional
        Default ``1 / sqrt(D)``.
    """
    kwargs = dict(causal=causal, mask=mask, key_lengths=key_lengths, dropout_p=dropout_p)
    _reject_dropout("the numpy peer", kwargs)
    B, H, Lq, D = q.shape
    Hkv, Lk = k.shape[1], k.shape[2]
    if H != Hkv:
        k = np.repeat(k, H // Hkv, axis=1)  # (B, H, Lk, D)
        v = np.repeat(v, H // Hkv, axis=1)  # (B, H, Lk, D)
    scale = q.dtype.type(1 / np.sqrt(D) if scale is None else scale)
    scores = (q @ k.swapaxes(-1, -2)) * scale  # (B, H, Lq, Lk)
    if mask is not None and np.asarray(mask).dtype != np.bool_:
        scores += np.asarray(mask, dtype=q.dtype)
    visible = visibility(Lq, Lk, kwargs)
    if visible is not None:
        np.copyto(scores, q.dtype.type(-np.inf), where=~visible)  # in place: no L x L copy
    scores -= scores.max(axis=-1, keepdims=True)
    np.exp(scores, out=scores)
    scores /= scores.sum(axis=-1, keepdims=True)
    return scores @ v  # (B, H, Lq, Dv)


def torch_sdpa_arguments(q, k, v, kwargs: dict, device: str = "cpu"):
    """The one PyTorch SDPA adapter: tensors and keywords for ``scaled_dot_product_attention``.

    Every argument of :func:`kernels.attention` is passed with its meaning: top-left
    ``causal`` alone becomes ``is_causal=True`` (SDPA's fast path); any other combination
    of ``causal`` (bottom-right included), ``mask`` and ``key_lengths`` becomes one
    ``attn_mask`` (bool, or additive where ``mask`` is float) that applies them all.
    Dropout raises :class:`UnsupportedByPeer` (SDPA draws its own random numbers).

    Parameters
    ----------
    q, k, v : ndarray, (B, H, Lq, D), (B, Hkv, Lk, D), (B, Hkv, Lk, Dv)
    kwargs : dict
        :func:`kernels.attention`'s keyword arguments.
    device : str, default "cpu"
        Where the tensors go ("cuda" for the GPU peer).  On the CPU they share the NumPy
        arrays' memory.

    Returns
    -------
    qt, kt, vt : torch.Tensor
    sdpa_kwargs : dict
        ``attn_mask``, ``is_causal``, ``scale``, ``enable_gqa``.
    """
    import torch  # optional peer: imported only when asked for

    _reject_dropout("torch's SDPA", kwargs)
    Lq, Lk = q.shape[2], k.shape[2]
    qt, kt, vt = (torch.from_numpy(np.ascontiguousarray(x)).to(device) for x in (q, k, v))
    mask = kwargs.get("mask")
    float_mask = mask is not None and np.asarray(mask).dtype != np.bool_
    offset = kernels.causal_offset(kwargs.get("causal", False), Lq, Lk)
    only_top_left = (offset == 0 and mask is None and kwargs.get("key_lengths") is None)
    attn_mask = None
    if not only_top_left:
        visible = visibility(Lq, Lk, kwargs)
        if float_mask:
            additive = np.asarray(mask, dtype=q.dtype)
            if visible is not None:
                additive = np.where(visible, additive, q.dtype.type(-np.inf))
            attn_mask = torch.from_numpy(np.ascontiguousarray(additive)).to(device)
        elif visible is not None:
            attn_mask = torch.from_numpy(np.ascontiguousarray(visible)).to(device)
    return qt, kt, vt, {
        "attn_mask": attn_mask, "is_causal": only_top_left and offset == 0,
        "scale": kwargs.get("scale"), "enable_gqa": q.shape[1] != k.shape[1],
    }
