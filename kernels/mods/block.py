"""Block masks (:func:`kernels.mods.block_mask`): a mask function's tiles classified once,
for reuse across calls."""

from __future__ import annotations

import time

import numpy as np

from .base import BLOCK_MASK_CELL, MaskMod, _compile, _dense, _int
from .cells import EMPTY, FULL, PARTIAL
from .user import as_mask_mod

# --- block masks ---------------------------------------------------------------------------------


def _table_tile(b, h, i0, i1, j0, j1, args):
    table, cell_q, cell_k = args[0], args[1], args[2]
    bb = b if table.shape[0] > 1 else 0
    hh = h if table.shape[1] > 1 else 0
    seen = False
    full = True
    for ci in range((i0 // cell_q), (i1 - 1) // cell_q + 1):
        for cj in range((j0 // cell_k), (j1 - 1) // cell_k + 1):
            c = table[bb, hh, ci, cj]
            if c != EMPTY:
                seen = True
            if c != FULL:
                full = False
    if not seen:
        return EMPTY
    return FULL if full else PARTIAL


class BlockMask(MaskMod):
    """A mask function with its tiles classified once (see :func:`block_mask`).

    Attributes
    ----------
    mask_mod : MaskMod
        The mask it classifies (evaluated per element in partial tiles).
    table : ndarray of int8, shape (B or 1, H or 1, ceil(Lq / cell_q), ceil(Lk / cell_k))
        EMPTY (0), PARTIAL (1) or FULL (2) per cell.
    seconds : float
        How long the classification took.
    """

    def __init__(self, inner: MaskMod, table: np.ndarray, cell_q: int, cell_k: int,
                 Lq: int, Lk: int, seconds: float):
        super().__init__(f"block_mask({inner!r}, table {table.shape})")
        self.mask_mod = inner
        self.formula = ("block_mask", inner)
        self.table = table
        self.cell_q, self.cell_k, self.Lq, self.Lk = cell_q, cell_k, Lq, Lk
        self.seconds = seconds
        self.user_names = inner.user_names

    def args(self, dtype=np.float64):
        cells = (self.table, np.int64(self.cell_q), np.int64(self.cell_k))
        return cells + self.mask_mod.args(dtype)

    def element(self, target="cpu", dtype=np.float64):
        mc = _compile()
        inner = self.mask_mod.element(target)

        def build():
            def element(b, h, q_idx, kv_idx, args):
                return inner(b, h, q_idx, kv_idx, args[3:])
            return mc.jit_for(target)(element)

        return mc.memo(("block_mask", target, inner), build)

    def tile(self, target="cpu"):
        mc = _compile()
        return mc.memo(("builtin", target, _table_tile), lambda: mc.jit_for(target)(_table_tile))

    def cache_key(self, part, dtype=np.float64):
        if part == "tile":
            return f"{__name__}._table_tile"
        inner = self.mask_mod.cache_key(part, dtype)
        return None if inner is None else f"block_mask({inner})"

    def density(self) -> float:
        """The fraction of cells that are not empty."""
        return float((self.table != EMPTY).mean()) if self.table.size else 0.0

    def check(self, B, H, Lq, Lk):
        Bt, Ht = self.table.shape[:2]
        if (Lq, Lk) != (self.Lq, self.Lk) or Bt not in (1, B) or Ht not in (1, H):
            raise ValueError(
                f"{self!r} was computed for B={Bt}, H={Ht}, Lq={self.Lq}, Lk={self.Lk}; the "
                f"call has B={B}, H={H}, Lq={Lq}, Lk={Lk}"
            )
        self.mask_mod.check(B, H, Lq, Lk)


def block_mask(mask_mod, B, H, Lq: int, Lk: int, *, cell_q: int = BLOCK_MASK_CELL,
               cell_k: int = BLOCK_MASK_CELL) -> BlockMask:
    """Classify the tiles of ``mask_mod`` once, for reuse in later calls (``mask_mod=``).

    Each cell of ``cell_q`` queries x ``cell_k`` keys is EMPTY (no visible pair: a
    kernel skips it and never reads its keys), FULL (every pair visible: no per-element
    check) or PARTIAL.  A user function is evaluated on every pair here, once; built-ins
    classify cells without that.  Kernels use any tiling: a tile is classified from the
    cells it overlaps.

    Parameters
    ----------
    mask_mod : MaskMod or callable
    B, H : int or None
        Batch and query heads; ``None`` (as in FlexAttention) classifies for b = 0 (h = 0)
        and serves every batch entry (head): only for masks that do not depend on it.
    Lq, Lk : int
    cell_q, cell_k : int, default 64

    Returns
    -------
    BlockMask
    """
    mod = as_mask_mod(mask_mod)
    if isinstance(mod, BlockMask):
        mod = mod.mask_mod
    Bn = 1 if B is None else _int("B", B, 1)
    Hn = 1 if H is None else _int("H", H, 1)
    Lq, Lk = _int("Lq", Lq), _int("Lk", Lk)
    cell_q, cell_k = _int("cell_q", cell_q, 1), _int("cell_k", cell_k, 1)
    mod.check(Bn, Hn, Lq, Lk)
    start = time.perf_counter()
    table = _dense().classify_cells(mod, Bn, Hn, Lq, Lk, cell_q, cell_k)
    return BlockMask(mod, table, cell_q, cell_k, Lq, Lk, time.perf_counter() - start)
