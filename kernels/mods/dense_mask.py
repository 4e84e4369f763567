"""A dense ``mask=`` as mods, for a path that takes mods but no dense mask (the numba
micro-kernel path, :mod:`kernels.numba_cpu.dense.micro_mods`).

The mask is the validated 4-D one (:attr:`kernels._problems.dense.AttentionProblem.mask`: dims
of size 1 or full, bool or additive in the scores' compute dtype); it is bound as it is,
never expanded, and each index is clamped to its dim (``min(b, Bm - 1)``: 0 for a
broadcast dim).

- bool (True = attend): a mask function, the entry;
- additive: a mask function (an entry of ``-inf`` hides its pair, so that what a hidden key
  or value holds cannot reach the output, as on the tiles: the entry of the bool array
  ``mask != -inf``) and a score function (the entry added to the scaled score; a NaN entry
  makes its row NaN, as on the tiles).

Blocks of pairs are classified from a table of 16 x 16 cells made once per call with NumPy
(:func:`_cells`, read by :func:`kernels.mods.block._table_tile`), not by each task reading
its entries again (a per-task scan cost more than the attention itself with an additive
mask).  These mods serve the kernels only: the reference applies ``mask=`` itself.
"""

from __future__ import annotations

import numpy as np

from .block import _table_tile
from .cells import EMPTY, FULL, PARTIAL
from .masks import _BuiltinMask
from .scores import _BuiltinScore, _unit_grad_source

#: Queries x keys per cell of the classification table.
CELL = 16

# Element functions come in two forms: a mask with a key dim of its own reads entry
# ``kv_idx`` as an unsigned index (so that the loops over a row's keys vectorise: a clamped
# index would not, nor a signed one, whose negative-index wraparound is a select per entry
# that made the additive mask's row loop over half again as slow), one broadcast over the
# keys reads entry 0.  An additive mask's visibility is the bool
# array ``mask != -inf`` (made for the cell table anyway): one byte read per pair, not four.


def _visible_element(b, h, q_idx, kv_idx, args):
    m = args[3]
    return m[min(b, m.shape[0] - 1), min(h, m.shape[1] - 1), min(q_idx, m.shape[2] - 1),
             np.uint64(kv_idx)]


def _visible_element_row(b, h, q_idx, kv_idx, args):
    m = args[3]
    return m[min(b, m.shape[0] - 1), min(h, m.shape[1] - 1), min(q_idx, m.shape[2] - 1), 0]


def _add_source(F, tanh):
    def add_mask(score, b, h, q_idx, kv_idx, args):
        m = args[0]
        return score + m[min(b, m.shape[0] - 1), min(h, m.shape[1] - 1),
                         min(q_idx, m.shape[2] - 1), np.uint64(kv_idx)]
    return add_mask


def _add_row_source(F, tanh):
    def add_mask_row(score, b, h, q_idx, kv_idx, args):
        m = args[0]
        return score + m[min(b, m.shape[0] - 1), min(h, m.shape[1] - 1),
                         min(q_idx, m.shape[2] - 1), 0]
    return add_mask_row


def _cells(visible: np.ndarray) -> tuple:
    """``(table, cell_q, cell_k)`` of a visibility mask (Bm, Hm, Lqm, Lkm): EMPTY, PARTIAL or
    FULL per cell of ``CELL`` x ``CELL`` pairs, as :func:`kernels.mods.block._table_tile`
    reads it; a broadcast dim is one cell (of a size no index reaches).  Computed once per
    call with NumPy, not per head and task: a mask shared by the heads is read once."""
    Lqm, Lkm = visible.shape[2:]
    cq, ck = (CELL if Lqm > 1 else 1), (CELL if Lkm > 1 else 1)
    padded = np.pad(visible, ((0, 0), (0, 0), (0, -Lqm % cq), (0, -Lkm % ck)))  # hidden
    Bm, Hm, nq, nk = padded.shape[0], padded.shape[1], padded.shape[2] // cq, padded.shape[3] // ck
    counts = padded.reshape(Bm, Hm, nq, cq, nk, ck).sum(axis=(3, 5), dtype=np.int32)
    pairs = np.multiply.outer(np.minimum(Lqm - cq * np.arange(nq), cq),
                              np.minimum(Lkm - ck * np.arange(nk), ck))
    table = np.full(counts.shape, PARTIAL, dtype=np.int8)
    table[counts == 0] = EMPTY
    table[counts == pairs] = FULL  # the pairs of the cell inside the mask, all visible
    unreachable = np.int64(1 << 40)  # a broadcast dim's one cell
    return (table, np.int64(CELL) if Lqm > 1 else unreachable,
            np.int64(CELL) if Lkm > 1 else unreachable)


def as_mods(mask: np.ndarray):
    """``(mask_mod, score_mod or None)`` standing for the validated 4-D dense ``mask``."""
    shape = f"dense mask {mask.shape} {mask.dtype}"
    element = _visible_element_row if mask.shape[3] == 1 else _visible_element
    visible = mask if mask.dtype == np.bool_ else mask != -np.inf
    mask_mod = _BuiltinMask(shape, element, _table_tile, _cells(visible) + (visible,))
    if mask.dtype == np.bool_:
        return mask_mod, None
    add = _add_row_source if mask.shape[3] == 1 else _add_source
    return mask_mod, _BuiltinScore(shape, add, _unit_grad_source, (mask,))
