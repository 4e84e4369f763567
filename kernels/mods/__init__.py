"""Attention variants as score and mask functions: built-ins, user functions, block masks.

The functions have FlexAttention's signatures and go to :func:`kernels.attention`:

- ``mask_mod(b, h, q_idx, kv_idx) -> bool`` (True = attend) as ``mask_mod=``;
- ``score_mod(score, b, h, q_idx, kv_idx) -> float`` as ``score_mod=``; ``score`` is the
  scaled score ``q · k · scale``, before the additive ``mask``.

``h`` is the query head (under GQA too) and the indices are the raw ``q_idx``, ``kv_idx``
(no alignment offset).  Both combine with ``causal``, ``mask``, ``key_lengths``, dropout
and GQA.  A plain Python function or an ``@numba.njit`` one is accepted; the kernels
compile it into their inner loop (Numba inlines it: no Python call per element), the
reference backend evaluates it densely in float64.

>>> import numpy as np, kernels
>>> from kernels import mods
>>> q = k = v = np.ones((1, 4, 64, 16), np.float32)
>>> window = mods.sliding_window(8)                 # query i sees keys i-8 .. i
>>> out = kernels.attention(q, k, v, mask_mod=window, score_mod=mods.softcap(30.0))

Functions that need data bind it (``fn`` receives the arrays after its indices)::

    def same_document(b, h, q_idx, kv_idx, doc_ids):
        return doc_ids[b, q_idx] == doc_ids[b, kv_idx]

    kernels.attention(q, k, v, mask_mod=mods.mask_mod(same_document, doc_ids))

Calling again with other arrays of the same dtype and rank does not recompile.

Block sparsity: before a kernel walks the keys of a block of queries, it classifies each
tile of keys as empty (skipped: its keys and values are never read), full (no per-element
mask check) or partial.  Built-ins classify a tile in O(1) (``document`` in O(tile side));
a user mask function is evaluated on every pair of the tile.  :func:`block_mask`
computes the classification once, for reuse in later calls.
"""

from __future__ import annotations

from .base import BLOCK_MASK_CELL, MaskMod, ScoreMod  # noqa: F401  (BLOCK_MASK_CELL: public too)
from .block import BlockMask, block_mask
from .cells import EMPTY, FULL, PARTIAL  # noqa: F401  (the tile classes are public here too)
from .masks import and_masks, document, or_masks, prefix_lm, sliding_window
from .scores import alibi, chain, relative_bias, softcap
from .user import (  # noqa: F401  (as_*: what kernels.attention coerces with)
    as_mask_mod,
    as_score_mod,
    mask_mod,
    score_mod,
)

__all__ = [
    "sliding_window", "alibi", "softcap", "prefix_lm", "document", "relative_bias",
    "and_masks", "or_masks", "chain", "mask_mod", "score_mod", "block_mask",
    "MaskMod", "ScoreMod", "BlockMask",
]
