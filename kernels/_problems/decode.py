"""DecodeProblem: one validated :func:`kernels.attention_with_kvcache` call, new keys
already written into the cache: what every backend's decode module receives.

The cache is paged in every problem: a contiguous cache (B, Hkv, Lmax, D) is the paged
cache of B pages of ``Lmax`` tokens, sequence b on page b (``block_table`` ``[[0], [1],
...]``), which is the same memory read the same way, so each backend has one read path.

``deterministic=True`` with ``num_splits=0`` splits every sequence's keys into runs of
:data:`DETERMINISTIC_SPLIT_KEYS` (:meth:`DecodeProblem.split_keys`): the split boundaries
then depend only on the sequence's own length, never on the thread count or on the other
sequences of the batch, as SGLang's deterministic mode fixes FlashInfer's split size.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

#: Keys per split of ``deterministic=True`` with ``num_splits=0``, the same in every
#: backend.  2048, as SGLang's deterministic decode: a cache of 4096 keys still gets two
#: splits (both threads of two busy for one sequence and key/value head, MQA at B=1), one of
#: 32768 keys 16 (four tasks for each of four threads), while each split's merge costs
#: little beside its 2048 keys.  A power of two: a multiple of the numba kernel's chunk (64
#: keys) and of every power-of-two page size up to 2048, so splits begin on chunk and page
#: boundaries.
DETERMINISTIC_SPLIT_KEYS = 2048


@dataclass(frozen=True)
class DecodeProblem:
    """One decode step over a (paged) KV cache, validated.

    Shapes: B sequences, H query heads, Hkv key/value heads, Lq queries per sequence, D
    head size, Dv value size; the cache holds ``num_pages`` pages of ``page_size`` tokens
    and sequence b's token ``j`` lies on page ``block_table[b, j // page_size]`` at slot
    ``j % page_size``.
    """

    q: np.ndarray  # (B, H, Lq, D), C-contiguous
    k_cache: np.ndarray  # (num_pages, Hkv, page_size, D), C-contiguous (the caller's memory)
    v_cache: np.ndarray  # (num_pages, Hkv, page_size, Dv), C-contiguous
    block_table: np.ndarray  # (B, pages_per_seq) int64; entries a sequence uses are in range
    seqlens: np.ndarray  # (B,) int64: keys of each sequence, cache_seqlens + Lnew
    causal: bool  # query i of sequence b sees keys j <= q_start[b] + i
    scale: float
    num_splits: int  # 0: the backend chooses; n >= 1: keys of a sequence in n chunks
    score_mod: object = None  # kernels.mods.ScoreMod (q_idx absolute), or None
    mask_mod: object = None  # kernels.mods.MaskMod (q_idx absolute), or None
    paged: bool = False  # the caller's cache was paged (for reports; reads are the same)
    sinks: np.ndarray | None = None  # (H,) one logit per query head (_problems.sinks), or None
    deterministic: bool = False  # num_splits=0: splits of DETERMINISTIC_SPLIT_KEYS keys

    @property
    def dtype(self) -> np.dtype:
        return self.q.dtype

    @property
    def page_size(self) -> int:
        return self.k_cache.shape[2]

    @property
    def shape(self) -> tuple[int, int, int, int, int, int]:
        """``(B, H, Hkv, Lq, D, Dv)``."""
        B, H, Lq, D = self.q.shape
        return B, H, self.k_cache.shape[1], Lq, D, self.v_cache.shape[3]

    @property
    def q_start(self) -> np.ndarray:
        """(B,) int64: the absolute position of query 0 of each sequence, ``seqlens - Lq``
        (query i is at ``q_start[b] + i``)."""
        return self.seqlens - self.q.shape[2]

    def split_keys(self) -> int:
        """Keys per split where they are fixed (``deterministic`` with ``num_splits=0``:
        :data:`DETERMINISTIC_SPLIT_KEYS`), else 0: the backend divides each sequence's
        keys into its number of splits, ``ceil(seqlens[b] / n_splits)`` keys each."""
        return DETERMINISTIC_SPLIT_KEYS if self.deterministic and not self.num_splits else 0

    def fixed_splits(self) -> int:
        """Splits of the longest sequence at :data:`DETERMINISTIC_SPLIT_KEYS` keys each (at
        least 1); a shorter sequence leaves its last splits empty, and the merge skips
        them."""
        longest = int(self.seqlens.max(initial=0))
        return max(1, -(-longest // DETERMINISTIC_SPLIT_KEYS))

    def key_bytes(self) -> int:
        """Bytes of K and V a decode step reads once: every visible-range key and value."""
        _, _, Hkv, _, D, Dv = self.shape
        return int(self.seqlens.sum()) * Hkv * (D + Dv) * self.q.dtype.itemsize

    def gather(self, dtype=None) -> tuple[np.ndarray, np.ndarray]:
        """Keys and values of every sequence as dense (B, Hkv, max(seqlens), D) and (..., Dv)
        arrays (the reference reads them so); slots past a sequence's length come from
        page 0 (or its own pages) and are garbage the caller must mask."""
        B = self.q.shape[0]
        Lk = int(self.seqlens.max(initial=0))
        ps = self.page_size
        j = np.arange(Lk)
        slot = j % ps
        pages = self.block_table[:, j // ps] if Lk else np.zeros((B, 0), np.int64)  # (B, Lk)
        pages = np.where(j[None, :] < self.seqlens[:, None], pages, 0)
        pages = np.clip(pages, 0, self.k_cache.shape[0] - 1)
        k = self.k_cache[pages, :, slot[None, :]]  # (B, Lk, Hkv, D)
        v = self.v_cache[pages, :, slot[None, :]]  # (B, Lk, Hkv, Dv)
        k, v = k.transpose(0, 2, 1, 3), v.transpose(0, 2, 1, 3)
        if dtype is not None:
            k, v = k.astype(dtype), v.astype(dtype)
        return np.ascontiguousarray(k), np.ascontiguousarray(v)
