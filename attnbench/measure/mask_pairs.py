"""Visible (query, key) pairs of a mask function (:mod:`kernels.mods`), for FLOP counts.

:func:`mask_mod_pairs` counts the pairs a ``mask_mod`` leaves visible together with a
causal offset and key lengths, without an L x L array:

- a sliding window (``kernels.mods.sliding_window``): row i sees the keys
  ``max(0, i - left) .. min(i + right, i + offset, K - 1)``, counted in O(Lq);
- documents (``kernels.mods.document``): row i sees the keys of its own document up to
  its causal and key-length limit, counted by a binary search in the keys sorted by
  (document, position), O(L log L);
- any other mask function (user functions, ``and_masks``, ``prefix_lm``, ...): its
  :func:`kernels.mods.block_mask` table, then every pair of the cells that are not empty,
  evaluated with the mask's own compiled element function (the one the kernels call).

The closed forms recognise the built-ins by their element functions; anything they do
not recognise takes the general path, which is exact for every mask (only slower).
"""

from __future__ import annotations

import numba
import numpy as np

from attnbench.kernels import mods

__all__ = ["mask_mod_pairs"]

#: Offset standing for "not causal" in the compiled counter (larger than any L).
NO_OFFSET = np.iinfo(np.int64).max // 4


def _builtin(mod, name: str) -> bool:
    """True when ``mod`` is the built-in whose element function is ``mods.<name>``."""
    source = getattr(mods, name, None)
    return source is not None and getattr(mod, "_element_source", None) is source


def _row_limits(Lq: int, Lk: int, offset: int | None, length: int) -> np.ndarray:
    """Last visible key of each query row (int64, (Lq,)) from causality and key length."""
    last = np.full(Lq, min(Lk, length) - 1, dtype=np.int64)
    if offset is not None:
        last = np.minimum(last, np.arange(Lq, dtype=np.int64) + offset)
    return last


def _window_pairs(left: int, right: int, Lq: int, Lk: int, offset, length: int) -> int:
    """Pairs of one (batch, head) under ``sliding_window(left, right)``: O(Lq)."""
    i = np.arange(Lq, dtype=np.int64)
    first = np.maximum(i - left, 0)
    last = np.minimum(_row_limits(Lq, Lk, offset, length), i + right)
    return int(np.maximum(last - first + 1, 0).sum())


def _document_pairs(ids: np.ndarray, offset, length: int) -> int:
    """Pairs of one (batch, head) under ``document(ids)``, ids of shape (L,): O(L log L)."""
    L = ids.size
    _, dense = np.unique(ids, return_inverse=True)  # ids as 0..n-1: no overflow below
    dense = dense.astype(np.int64).reshape(-1)
    keys = np.sort(dense * (L + 1) + np.arange(L))  # (L,): by document, then position
    last = _row_limits(L, L, offset, length)  # (L,)
    start = np.searchsorted(keys, dense * (L + 1), side="left")
    stop = np.searchsorted(keys, dense * (L + 1) + np.maximum(last, -1), side="right")
    return int(np.maximum(stop - start, 0).sum())


@numba.njit  # not cached: it is specialised on each mask's element function
def _count_cells(element, args, table, cell_q, cell_k, B, H, Lq, Lk, offset, lengths):
    """Visible pairs in the cells of ``table`` that are not empty (the general path)."""
    total = 0
    for b in range(B):
        tb = b if table.shape[0] > 1 else 0
        for h in range(H):
            th = h if table.shape[1] > 1 else 0
            for ci in range(table.shape[2]):
                for cj in range(table.shape[3]):
                    if table[tb, th, ci, cj] == 0:
                        continue
                    for i in range(ci * cell_q, min(Lq, (ci + 1) * cell_q)):
                        stop = min(min(Lk, lengths[b]), i + offset + 1)
                        for j in range(cj * cell_k, min(stop, (cj + 1) * cell_k)):
                            if element(b, h, i, j, args):
                                total += 1
    return total


def _general_pairs(mod, B: int, H: int, Lq: int, Lk: int, offset, lengths) -> int:
    """Any mask function: its block table, then every pair of the non-empty cells."""
    blocks = mod if isinstance(mod, mods.BlockMask) else mods.block_mask(mod, B, H, Lq, Lk)
    inner = blocks.mask_mod
    return int(_count_cells(inner.element("cpu"), inner.args(np.float64), blocks.table,
                            blocks.cell_q, blocks.cell_k, B, H, Lq, Lk,
                            NO_OFFSET if offset is None else offset, lengths))


def mask_mod_pairs(mask_mod, B: int, H: int, Lq: int, Lk: int, offset: int | None,
                   lengths: np.ndarray) -> int:
    """Number of (b, h, i, j) pairs visible under ``mask_mod``, causality and key lengths.

    Parameters
    ----------
    mask_mod : kernels.mods.MaskMod or callable
        ``mask_mod(b, h, q_idx, kv_idx) -> bool`` (True = attend).
    B, H, Lq, Lk : int
        Batch, query heads, queries and keys.
    offset : int or None
        Query i sees keys ``j <= i + offset``; None: not causal.
    lengths : ndarray of int64, shape (B,)
        Keys ``j >= lengths[b]`` are padding.

    Returns
    -------
    int
        The exact count (checked against ``kernels.prepare(...).visible()`` in the tests).
    """
    mod = mods.as_mask_mod(mask_mod)
    mod.check(B, H, Lq, Lk)
    plain = mod.mask_mod if isinstance(mod, mods.BlockMask) else mod
    lengths = np.asarray(lengths, dtype=np.int64)
    if _builtin(plain, "_window_element"):
        left, right = (int(x) for x in plain.args())
        per_batch = [_window_pairs(left, right, Lq, Lk, offset, int(n)) for n in lengths]
        return sum(per_batch) * H
    if _builtin(plain, "_document_element"):
        ids = plain.args()[0]  # (1 or B, L)
        per_batch = [_document_pairs(ids[b if ids.shape[0] > 1 else 0], offset, int(n))
                     for b, n in enumerate(lengths)]
        return sum(per_batch) * H
    return _general_pairs(mod, B, H, Lq, Lk, offset, lengths)
