"""VarlenProblem: one validated packed variable-length call (:func:`kernels.attention_varlen`).

Sequence b is query rows ``cu_seqlens_q[b]:cu_seqlens_q[b + 1]`` of the packed q
(total_q, H, D) against key rows ``cu_seqlens_k[b]:cu_seqlens_k[b + 1]`` of k and v
(total_k, Hkv, D / Dv).  Built only by :mod:`kernels._api.varlen`, which checks it.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .dense import AttentionProblem


@dataclass(frozen=True)
class VarlenProblem:
    """A packed batch of sequences, validated: what the varlen backends receive."""

    q: np.ndarray  # (total_q, H, D), C-contiguous
    k: np.ndarray  # (total_k, Hkv, D), C-contiguous
    v: np.ndarray  # (total_k, Hkv, Dv), C-contiguous
    cu_seqlens_q: np.ndarray  # (B + 1,) int64, 0 ... total_q, non-decreasing
    cu_seqlens_k: np.ndarray  # (B + 1,) int64, 0 ... total_k, non-decreasing
    causal: object  # False, True / "top-left" or "bottom-right" (within each sequence)
    scale: float
    dropout_p: float
    seed: int
    score_mod: object = None  # kernels.mods.ScoreMod or None (b = the sequence index)
    mask_mod: object = None  # kernels.mods.MaskMod or None
    sinks: np.ndarray | None = None  # (H,) in q.dtype, or None

    @property
    def dtype(self) -> np.dtype:
        return self.q.dtype

    @property
    def n_seq(self) -> int:
        return len(self.cu_seqlens_q) - 1

    @property
    def lengths_q(self) -> np.ndarray:
        """Queries of each sequence, (B,) int64."""
        return np.diff(self.cu_seqlens_q)

    @property
    def lengths_k(self) -> np.ndarray:
        """Keys of each sequence, (B,) int64."""
        return np.diff(self.cu_seqlens_k)

    @property
    def heads(self) -> tuple[int, int, int, int]:
        """``(H, Hkv, D, Dv)``."""
        return self.q.shape[1], self.k.shape[1], self.q.shape[2], self.v.shape[2]

    def offset(self, b: int) -> int | None:
        """Sequence b's causal offset (query i sees keys j <= i + offset), None if not causal."""
        if self.causal is False:
            return None
        if self.causal == "bottom-right":
            return int(self.lengths_k[b] - self.lengths_q[b])
        return 0

    @property
    def work(self) -> int:
        """Multiply-adds without masks: Σ_b H · Lq_b · Lk_b · (D + Dv)."""
        H, _, D, Dv = self.heads
        return int((self.lengths_q * self.lengths_k).sum()) * H * (D + Dv)

    def mods_problem(self, Lq: int | None = None, Lk: int | None = None) -> AttentionProblem:
        """An :class:`AttentionProblem` of B sequences and the longest lengths (or ``Lq``,
        ``Lk``), with zero-stride arrays: the shape, dtype and mods a kernel's mod
        arguments are built from; its arrays hold no data."""
        H, Hkv, D, Dv = self.heads
        Lq = int(self.lengths_q.max(initial=0)) if Lq is None else Lq
        Lk = int(self.lengths_k.max(initial=0)) if Lk is None else Lk
        zero = np.zeros((), self.dtype)
        return AttentionProblem(
            q=np.broadcast_to(zero, (self.n_seq, H, Lq, D)),
            k=np.broadcast_to(zero, (self.n_seq, Hkv, Lk, D)),
            v=np.broadcast_to(zero, (self.n_seq, Hkv, Lk, Dv)),
            batch_shape=(self.n_seq,), had_head_dim=True, mask=None, key_lengths=None,
            causal_offset=None, scale=self.scale, dropout_p=self.dropout_p, seed=self.seed,
            return_weights=False, score_mod=self.score_mod, mask_mod=self.mask_mod)
