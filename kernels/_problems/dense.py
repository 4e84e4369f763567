"""AttentionProblem: one validated attention call, in the layout every backend expects.

Built only by :mod:`kernels._problems.checks` (through :func:`kernels.prepare`): contiguous 4-D
arrays of one floating dtype, the mask kept as given (bool, or additive float whose
``-inf`` entries hide; :meth:`AttentionProblem.additive_mask` and
:meth:`AttentionProblem.visibility_mask` give the two forms), key lengths as ``int64`` and
the causal alignment as one integer offset.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


def multiply_adds(B: int, H: int, Lq: int, Lk: int, D: int, Dv: int) -> int:
    """Multiply-adds of one attention forward without masks, ``B·H·Lq·Lk·(D + Dv)`` (Q·Kᵀ
    and P·V): the work by which backends choose a path (thread pool, GPU, planning)."""
    return B * H * Lq * Lk * (D + Dv)


@dataclass(frozen=True)
class AttentionProblem:
    """One validated attention call, in the layout every backend expects.

    Built by :func:`kernels.prepare` (which :func:`kernels.attention` calls first).
    Shapes use B = product of the caller's leading batch dims (1 if none),
    H query heads, Hkv key/value heads, Lq queries, Lk keys, D head size and
    Dv value size.  The mask is kept in the form it was given (bool or additive float,
    so a bool L x L mask is never converted unless a backend asks for the other form):
    :meth:`additive_mask` and :meth:`visibility_mask` give the two forms explicitly.
    """

    q: np.ndarray  # (B, H, Lq, D), C-contiguous
    k: np.ndarray  # (B, Hkv, Lk, D), C-contiguous
    v: np.ndarray  # (B, Hkv, Lk, Dv), C-contiguous
    batch_shape: tuple  # the caller's leading dims, restored on output
    had_head_dim: bool  # False for 2-D (L, D) inputs
    mask: np.ndarray | None  # (Bm, Hm, Lqm, Lkm), dims 1 or full: bool (True = attend)
    # or additive in q.dtype (-inf hides), as the caller gave it; None = no mask
    key_lengths: np.ndarray | None  # (B,) int64 in [0, Lk]
    causal_offset: int | None  # query i sees keys j <= i + offset; None = not causal
    scale: float  # multiplies q . k
    dropout_p: float  # probability of dropping an attention weight, in [0, 1)
    seed: int  # dropout seed in [0, 2**32)
    return_weights: bool
    score_mod: object = None  # kernels.mods.ScoreMod applied to the scaled scores, or None
    mask_mod: object = None  # kernels.mods.MaskMod (True = attend), or None
    sinks: np.ndarray | None = None  # (H,) sink logits in q.dtype (_problems.sinks), or None
    deterministic: bool = False  # backward: its work split by the problem, not the threads

    @property
    def work(self) -> int:
        """Multiply-adds of the call: :func:`multiply_adds` of its shape."""
        B, H, _, Lq, Lk, D, Dv = self.shape
        return multiply_adds(B, H, Lq, Lk, D, Dv)

    @property
    def mask_is_bool(self) -> bool:
        """True when the mask was given as bool (True = attend)."""
        return self.mask is not None and self.mask.dtype == np.bool_

    def additive_mask(self) -> np.ndarray | None:
        """The mask as additive scores in the problem's dtype (``-inf`` hides), or None.

        A bool mask is converted on each call (an array of the mask's size).
        """
        if self.mask_is_bool:
            return _additive(self.mask, self.q.dtype)
        return self.mask

    def visibility_mask(self) -> np.ndarray | None:
        """The mask as bool visibility (True = attend; an additive ``-inf`` hides), or None."""
        if self.mask is None or self.mask_is_bool:
            return self.mask
        return self.mask != -np.inf

    @property
    def dtype(self) -> np.dtype:
        return self.q.dtype

    @property
    def shape(self) -> tuple[int, int, int, int, int, int, int]:
        """``(B, H, Hkv, Lq, Lk, D, Dv)``."""
        B, H, Lq, D = self.q.shape
        return B, H, self.k.shape[1], Lq, self.k.shape[2], D, self.v.shape[3]

    def key_lengths_or_full(self) -> np.ndarray:
        """Key lengths as ``int64`` of shape (B,), ``Lk`` for every batch if none were given."""
        if self.key_lengths is not None:
            return self.key_lengths
        return np.full(self.q.shape[0], self.k.shape[2], dtype=np.int64)

    def mask_strides(self) -> tuple[int, int, int, int]:
        """Element strides of the flattened mask, 0 along broadcast dims (all 0 if no mask)."""
        if self.mask is None:
            return (0, 0, 0, 0)
        strides = [s // self.mask.itemsize for s in self.mask.strides]
        return tuple(0 if n == 1 else s for n, s in zip(self.mask.shape, strides, strict=True))

    def visible(self, mask_mod_visible=None) -> np.ndarray:
        """Boolean visibility of every (b, h, i, j) pair, shape (B, H, Lq, Lk).

        Materialises an L x L array: meant for the reference, tests and FLOP counting
        of small problems, never for the fast backends.  ``mask_mod_visible(mod, B, H,
        Lq, Lk)`` evaluates the mask function (default: its compiled element function,
        :meth:`~kernels.mods.MaskMod.dense`); the reference passes its own definitions.
        """
        B, H, _, Lq, Lk, _, _ = self.shape
        i = np.arange(Lq)[:, None]
        j = np.arange(Lk)[None, :]
        vis = np.ones((B, H, Lq, Lk), dtype=bool)
        if self.causal_offset is not None:
            vis &= j <= i + self.causal_offset
        if self.key_lengths is not None:
            vis &= j[None, None] < self.key_lengths[:, None, None, None]
        if self.mask is not None:
            vis &= self.visibility_mask()
        if self.mask_mod is not None:
            dense = mask_mod_visible or type(self.mask_mod).dense
            vis &= dense(self.mask_mod, B, H, Lq, Lk)
        return vis

    def restore(self, x: np.ndarray) -> np.ndarray:
        """Reshape a (B, H, Lq, X) result back to the caller's leading dims."""
        if not self.had_head_dim:
            return x.reshape(x.shape[2:])
        return x.reshape(self.batch_shape + x.shape[1:])


def _additive(bool_mask: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """The additive form of a bool mask: 0 where True (attend), -inf where False."""
    return np.where(bool_mask, dtype.type(0), dtype.type(-np.inf))

