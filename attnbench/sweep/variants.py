"""The variant axis of a sweep: names like ``window-256`` as :mod:`kernels.mods` arguments.

A point's ``variant`` (:data:`attnbench.sweep.grid.VARIANT_FORMS`) adds a score or mask
function to the point's call, on the same inputs as the plain call (``variant="none"``),
so that their times compare:

- ``window-W``: ``mask_mod=sliding_window(W)``, query i sees keys i−W .. i (a causal
  window, Mistral's; combined with the point's mask kind, usually ``causal``);
- ``documents-N``: ``mask_mod=document(ids)``, N equal documents packed along L
  (``ids = arange(L)·N // L``);
- ``alibi``: ``score_mod=alibi(slopes)`` with the ALiBi paper's slopes ``2^(−8(h+1)/H)``;
- ``softcap``: ``score_mod=softcap(30.0)`` (Gemma 2's attention cap is 50; any cap
  costs the same);
- ``sinks``: ``sinks=`` one logit per query head (:func:`sink_logits`, gpt-oss's
  attention sinks: a term of each row's softmax denominator that has no value).

The peers take no mask functions: :func:`peer_kwargs` writes a variant as a dense mask
where that means the same (windows and documents as a bool mask, ALiBi as an additive
float bias) and raises :class:`attnbench.measure.peers.UnsupportedByPeer` for softcap
and sinks.
"""

from __future__ import annotations

import numpy as np

from attnbench.kernels import mods
from attnbench.measure.peers import UnsupportedByPeer
from attnbench.sweep.grid import parse_variant

__all__ = ["SOFTCAP", "alibi_slopes", "document_ids", "peer_kwargs", "sink_logits",
           "variant_kwargs", "window_size"]

#: The cap of the ``softcap`` variant.
SOFTCAP = 30.0


def alibi_slopes(heads: int) -> np.ndarray:
    """ALiBi's head slopes ``2^(−8(h+1)/H)``, float64 of shape (H,)."""
    return 2.0 ** (-8.0 * np.arange(1, heads + 1) / heads)


def document_ids(L: int, n_documents: int) -> np.ndarray:
    """Ids of ``n_documents`` (nearly) equal contiguous documents over L positions, (L,)."""
    return np.arange(L, dtype=np.int64) * n_documents // L


def sink_logits(heads: int, dtype=np.float32) -> np.ndarray:
    """The ``sinks`` variant's logits: evenly spaced from −1 to 3 over the heads, (H,).

    In the units of the scaled scores (about N(0, 1) for the sweep's inputs): from a sink
    that takes little of a row's weight to one that takes most of it.
    """
    return np.linspace(-1.0, 3.0, heads).astype(dtype)


def window_size(variant: str) -> int | None:
    """W of a ``window-W`` variant, else None."""
    kind, size = parse_variant(variant)
    return size if kind == "window" else None


def variant_kwargs(variant: str, heads: int, L: int, dtype=np.float32) -> dict:
    """The ``score_mod``/``mask_mod`` (or ``sinks``, in ``dtype``: q's) keyword arguments
    of ``variant`` for an L x L problem."""
    kind, size = parse_variant(variant)
    if kind == "sinks":
        return {"sinks": sink_logits(heads, dtype)}
    if kind == "window":
        return {"mask_mod": mods.sliding_window(size)}
    if kind == "documents":
        return {"mask_mod": mods.document(document_ids(L, size))}
    if kind == "alibi":
        return {"score_mod": mods.alibi(alibi_slopes(heads))}
    if kind == "softcap":
        return {"score_mod": mods.softcap(SOFTCAP)}
    return {}


def peer_kwargs(variant: str, kwargs: dict, heads: int, L: int, dtype) -> dict:
    """``kwargs`` with ``variant`` written as a dense ``mask``, for the peers.

    Parameters
    ----------
    variant : str
    kwargs : dict
        The point's :func:`kernels.attention` keywords (``causal``, ``mask``, ...).
    heads, L : int
        Query heads and sequence length (Lq = Lk = L).
    dtype : numpy dtype
        The inputs' dtype (an additive mask takes it).

    Raises
    ------
    UnsupportedByPeer
        ``softcap``: a bounded score is not a mask; ``sinks``: a term of the softmax's
        denominator is not one either.
    """
    extra = variant_kwargs(variant, heads, L, dtype)
    if not extra:
        return kwargs
    if "sinks" in extra:
        raise UnsupportedByPeer("a peer cannot express attention sinks (a term of the "
                                "softmax's denominator, not a mask)")
    if "score_mod" in extra and parse_variant(variant)[0] != "alibi":
        raise UnsupportedByPeer(f"a peer cannot express variant {variant!r} (a score "
                                "function that is not an additive bias)")
    result = dict(kwargs)
    mask = kwargs.get("mask")
    visible = None if mask is None else np.asarray(mask)
    if visible is not None and visible.dtype != np.bool_:
        raise UnsupportedByPeer(f"variant {variant!r} with a float mask")
    if "mask_mod" in extra:  # the same for every batch entry and head
        dense = extra["mask_mod"].dense(1, 1, L, L)  # (1, 1, L, L)
        result["mask"] = dense if visible is None else visible & dense
        return result
    position = np.arange(L)
    bias = alibi_slopes(heads)[:, None, None] * (position[None, :] - position[:, None])
    bias = bias[None].astype(dtype)  # (1, H, L, L)
    if visible is not None:
        bias = np.where(visible, bias, np.dtype(dtype).type(-np.inf))
    result["mask"] = bias
    return result
