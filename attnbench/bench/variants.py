"""``attnbench bench``'s variants section: score and mask functions against the plain call.

Three groups, each timed in interleaved rounds (numba backend, float32, B=1, H=12, D=64):

- ``window``: ``mods.sliding_window(window_left)`` with ``causal=True`` against the same
  call without the window, at ``window_length``;
- ``documents``: ``mods.document`` with ``n_documents`` equal documents, non-causal,
  against the plain non-causal call, at ``documents_length``;
- ``scores``: ``mods.alibi`` and ``mods.softcap`` against the plain non-causal call, at
  ``score_length``.

The first call of each function compiles its kernel (untimed: the warm-up).  Rows keep
their samples (``samples_ms``) for the targets' intervals
(:mod:`attnbench.bench.interval_targets`).  Two more rows give the cost of
:func:`kernels.mods.block_mask` (the tile classification, computed once) for the window
and the documents.  GFLOP/s count the visible pairs only (:func:`visible_pairs`).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

import kernels
from attnbench.bench.config import BenchConfig
from attnbench.bench.sections import _inputs, _row, interleaved
from attnbench.measure.flops import gflops
from attnbench.measure.intervals import format_samples
from kernels import mods

#: ALiBi slopes of 12 heads (the geometric sequence of the ALiBi paper) and softcap's cap.
ALIBI_SLOPES = 2.0 ** (-8.0 * np.arange(1, 13) / 12)
SOFTCAP = 30.0


def window_pairs(L: int, left: int) -> int:
    """Visible pairs of one head under ``causal`` and ``sliding_window(left)``: query i
    sees ``min(i, left) + 1`` keys (closed form)."""
    inside = min(L, left)  # queries i < left see i + 1 keys
    return inside * (inside + 1) // 2 + (L - inside) * (left + 1)


def document_pairs(doc_ids: np.ndarray) -> int:
    """Visible pairs of one head, non-causal, under ``document(doc_ids)``: Σ n_d²."""
    _, counts = np.unique(doc_ids, return_counts=True)
    return int((counts.astype(np.int64) ** 2).sum())


def _flops(pairs: int, B: int, H: int, D: int) -> int:
    """Forward FLOPs of ``pairs`` visible pairs per head, ``2·(D + Dv)`` each (Dv = D, as
    :func:`attnbench.measure.flops.attention_flops` counts them)."""
    return 4 * pairs * B * H * D


def _group(config: BenchConfig, group: str, L: int, threads: int,
           calls: dict[str, tuple[Callable[[], object], int]]) -> list[dict]:
    """Time ``calls`` (name -> (call, visible pairs per head)) interleaved; one row each."""
    B, H, D = config.batch, config.heads, config.head_size
    timings = interleaved({name: call for name, (call, _) in calls.items()},
                          rounds=max(config.rounds, config.interval_rounds),
                          min_time=config.min_time)
    causal = group == "window"
    return [_row("variants", "numba", variant=f"{group}: {name}", B=B, H=H, L=L, D=D,
                 causal=causal, dtype=np.float32, threads=threads, **timing.ms_columns(),
                 samples_ms=format_samples(timing.samples),
                 gflops=gflops(_flops(calls[name][1], B, H, D), timing.median))
            for name, timing in timings.items()]


def _block_mask_row(config: BenchConfig, name: str, mask_mod, L: int, threads: int) -> dict:
    """The cost of classifying the tiles of ``mask_mod`` once (after a compiling call)."""
    mods.block_mask(mask_mod, config.batch, None, L, L)  # compiles
    seconds = mods.block_mask(mask_mod, config.batch, None, L, L).seconds
    return _row("variants", "numba", variant=f"block_mask: {name}", B=config.batch,
                H=config.heads, L=L, D=config.head_size, causal=name == "window",
                dtype=np.float32, threads=threads, median_ms=seconds * 1e3, runs=1, number=1)


def variants_section(config: BenchConfig, threads: int,
                     progress: Callable[[str], None] = print) -> list[dict]:
    """The variants section's rows (see the module's docstring)."""
    B, H, D = config.batch, config.heads, config.head_size

    def call(q, k, v, **kwargs):
        return lambda: kernels.attention(q, k, v, backend="numba", **kwargs)

    rows = []
    L, left = config.window_length, config.window_left
    progress(f"variants window left={left} causal vs causal, L={L}")
    q, k, v = _inputs(B, H, L, D, np.float32)
    window = mods.sliding_window(left)
    rows += _group(config, "window", L, threads, {
        "causal": (call(q, k, v, causal=True), L * (L + 1) // 2),
        f"causal + window left={left}": (call(q, k, v, causal=True, mask_mod=window),
                                         window_pairs(L, left))})
    rows.append(_block_mask_row(config, "window", window, L, threads))

    L, n = config.documents_length, config.n_documents
    progress(f"variants {n} documents vs plain, non-causal, L={L}")
    q, k, v = _inputs(B, H, L, D, np.float32)
    doc_ids = (np.arange(L) * n // L)[None]  # n equal documents (to a token)
    documents = mods.document(doc_ids)
    rows += _group(config, "documents", L, threads, {
        "plain": (call(q, k, v), L * L),
        f"{n} documents": (call(q, k, v, mask_mod=documents), document_pairs(doc_ids))})
    rows.append(_block_mask_row(config, "documents", documents, L, threads))

    L = config.score_length
    progress(f"variants alibi and softcap vs plain, non-causal, L={L}")
    q, k, v = _inputs(B, H, L, D, np.float32)
    slopes = np.resize(ALIBI_SLOPES, H)
    rows += _group(config, "scores", L, threads, {
        "plain": (call(q, k, v), L * L),
        "alibi": (call(q, k, v, score_mod=mods.alibi(slopes)), L * L),
        "softcap": (call(q, k, v, score_mod=mods.softcap(SOFTCAP)), L * L)})
    return rows
