"""``attnbench bench``'s variants section: score and mask functions against the plain call.

Four groups, each timed in interleaved rounds (numba backend, float32, B=1, H=12, D=64):

- ``window``: ``mods.sliding_window(window_left)`` with ``causal=True`` against the same
  call without the window, at ``window_length``;
- ``documents``: ``mods.document`` with ``n_documents`` equal documents, non-causal,
  against the plain non-causal call, at ``documents_length``;
- ``scores``: ``mods.alibi``, ``mods.softcap`` and attention sinks (``sinks=``) against
  the plain non-causal call, at ``score_length``;
- ``window backward``: the backward pass (``out`` and ``lse`` given, the forward not
  timed) with ``sliding_window(window_left)`` and ``causal=True`` against the causal
  backward alone, at ``window_backward_length`` (no target: the numba backward skips the
  tiles the window hides, and this row says how much that buys).

The first call of each function compiles its kernel (untimed: the warm-up).  Rows keep
their samples (``samples_ms``) for the targets' intervals
(:mod:`attnbench.bench.interval_targets`).  Two more rows give the cost of
:func:`kernels.mods.block_mask` (the tile classification, computed once) for the window
and the documents.  GFLOP/s count the visible pairs only
(:func:`attnbench.measure.flops.attention_flops` with the call's ``mask_mod``).
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

import numpy as np

from attnbench import kernels
from attnbench.bench.backward import _dout, numba_backward_call
from attnbench.bench.config import BenchConfig
from attnbench.bench.sections import _inputs, _row, interval_timings
from attnbench.kernels import mods
from attnbench.measure.flops import attention_flops, backward_flops, gflops
from attnbench.measure.intervals import format_samples

#: ALiBi slopes of 12 heads (the geometric sequence of the ALiBi paper) and softcap's cap.
ALIBI_SLOPES = 2.0 ** (-8.0 * np.arange(1, 13) / 12)
SOFTCAP = 30.0


def _group(config: BenchConfig, group: str, L: int, threads: int, causal: bool,
           calls: dict[str, tuple[Callable[[], object], int]]) -> list[dict]:
    """Time ``calls`` (name -> (call, FLOPs)) interleaved; one row each."""
    B, H, D = config.batch, config.heads, config.head_size
    timings = interval_timings({name: call for name, (call, _) in calls.items()}, config)
    return [_row("variants", "numba", variant=f"{group}: {name}", B=B, H=H, L=L, D=D,
                 causal=causal, dtype=np.float32, threads=threads, **timing.ms_columns(),
                 samples_ms=format_samples(timing.samples),
                 gflops=gflops(calls[name][1], timing.median))
            for name, timing in timings.items()]


def _forward_group(config: BenchConfig, group: str, L: int, threads: int, causal: bool,
                   variants: dict[str, dict]) -> list[dict]:
    """The forward calls ``name -> keywords`` on the same inputs; GFLOP/s count each
    call's visible pairs (its ``mask_mod`` included)."""
    B, H, D = config.batch, config.heads, config.head_size
    q, k, v = _inputs(B, H, L, D, np.float32)
    return _group(config, group, L, threads, causal, {
        name: (partial(kernels.attention, q, k, v, backend="numba", causal=causal, **kwargs),
               attention_flops(B, H, L, L, D, causal=causal, mask_mod=kwargs.get("mask_mod")))
        for name, kwargs in variants.items()})


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
    rows = []
    L, left = config.window_length, config.window_left
    progress(f"variants window left={left} causal vs causal, L={L}")
    window = mods.sliding_window(left)
    rows += _forward_group(config, "window", L, threads, True, {
        "causal": {}, f"causal + window left={left}": {"mask_mod": window}})
    rows.append(_block_mask_row(config, "window", window, L, threads))

    L, n = config.documents_length, config.n_documents
    progress(f"variants {n} documents vs plain, non-causal, L={L}")
    documents = mods.document((np.arange(L) * n // L)[None])  # n equal documents (to a token)
    rows += _forward_group(config, "documents", L, threads, False, {
        "plain": {}, f"{n} documents": {"mask_mod": documents}})
    rows.append(_block_mask_row(config, "documents", documents, L, threads))

    L = config.score_length
    progress(f"variants alibi and softcap vs plain, non-causal, L={L}")
    slopes = np.resize(ALIBI_SLOPES, config.heads)
    rows += _forward_group(config, "scores", L, threads, False, {
        "plain": {}, "alibi": {"score_mod": mods.alibi(slopes)},
        "softcap": {"score_mod": mods.softcap(SOFTCAP)},
        "sinks": {"sinks": np.linspace(-2, 2, config.heads).astype(np.float32)}})

    L = config.window_backward_length
    progress(f"variants window left={left} causal backward vs causal backward, L={L}")
    rows += _backward_group(config, L, threads, window)
    return rows


def _backward_group(config: BenchConfig, L: int, threads: int, window) -> list[dict]:
    """The causal backward with and without ``window``; ``out`` and ``lse`` come from each
    call's own (untimed) forward."""
    B, H, D = config.batch, config.heads, config.head_size
    q, k, v = _inputs(B, H, L, D, np.float32)
    dout = _dout(q)
    return _group(config, "window backward", L, threads, True, {
        name: (numba_backward_call(q, k, v, dout, True, **kwargs),
               backward_flops(B, H, L, L, D, causal=True, **kwargs))
        for name, kwargs in (("causal", {}), (f"causal + window left={config.window_left}",
                                              {"mask_mod": window}))})
