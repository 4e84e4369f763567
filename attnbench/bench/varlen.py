"""``attnbench bench``'s varlen section: packed variable-length batches and attention sinks
(issue 24), each ratio timed side by side in interleaved rounds (numba, float32, H=12,
D=64, ``config.threads``).

- ``varlen forward``: one :func:`kernels.attention_varlen` call on 8 packed sequences
  (``config.varlen_lengths``, self-attention) against the sum of the 8 dense
  :func:`kernels.attention` calls of the same sequences (one timed function calling all
  8), and against the padded dense call (B=8, L = the longest, ``key_lengths``), causal
  and not;
- ``varlen backward``: :func:`kernels.attention_varlen_backward` (``out`` and ``lse``
  given) against the sum of the 8 dense backward calls (``out`` and ``lse`` given);
- ``sinks``: :func:`kernels.attention` with ``sinks=`` against the plain call, forward and
  backward, at ``config.sinks_length`` (B=1, non-causal).

Targets (:func:`varlen_targets`, from the 95% interval of each ratio): varlen / dense sum
<= 1.15 (forward and backward), padded / varlen >= 1.3, sinks / plain <= 1.05.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pandas as pd

from attnbench import kernels
from attnbench.bench.interval_targets import _find, _ratio_target
from attnbench.bench.sections import _row, interval_timings
from attnbench.measure.flops import gflops
from attnbench.measure.intervals import format_samples

#: What a row of the section is: (group, name).
FORWARD, BACKWARD, SINKS = "varlen forward", "varlen backward", "sinks"


def _packed(lengths, H: int, D: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    cu = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    q, k, v = (rng.standard_normal((cu[-1], H, D)).astype(np.float32) for _ in range(3))
    return q, k, v, cu


def _heads(x, cu, b):
    """Sequence b of a packed array as a dense (1, H, L, D) array."""
    return np.ascontiguousarray(x[cu[b]:cu[b + 1]].transpose(1, 0, 2))[None]


def _pairs(lengths, causal: bool) -> int:
    return int(sum(L * (L + 1) // 2 if causal else L * L for L in lengths))


def _rows(config, group: str, timings: dict, flops: dict, threads: int, causal: bool,
          L: int, B: int) -> list[dict]:
    return [_row("varlen", "numba", variant=f"{group}: {name}{' causal' if causal else ''}",
                 B=B, H=config.heads, L=L, D=config.head_size, causal=causal,
                 dtype=np.float32, threads=threads, **timing.ms_columns(),
                 samples_ms=format_samples(timing.samples),
                 gflops=gflops(flops[name], timing.median))
            for name, timing in timings.items()]


def _forward_calls(q, k, v, cu, lengths, causal):
    dense = [tuple(_heads(x, cu, b) for x in (q, k, v)) for b in range(len(lengths))]
    L = max(lengths)
    padded = np.zeros((3, len(lengths), q.shape[1], L, q.shape[2]), np.float32)
    for b, arrays in enumerate(dense):
        for n, x in enumerate(arrays):
            padded[n, b, :, :lengths[b]] = x[0]
    key_lengths = np.asarray(lengths)

    def varlen():
        return kernels.attention_varlen(q, k, v, cu, cu, causal=causal, backend="numba")

    def dense_sum():
        return [kernels.attention(*arrays, causal=causal, backend="numba") for arrays in dense]

    def padded_call():
        return kernels.attention(*padded, causal=causal, key_lengths=key_lengths,
                                 backend="numba")

    return {"varlen": varlen, "dense sum": dense_sum, "padded": padded_call}, dense


def _backward_calls(q, k, v, cu, dense, causal):
    dout = np.random.default_rng(99).standard_normal(q.shape).astype(np.float32)
    out, lse = kernels.attention_varlen(q, k, v, cu, cu, causal=causal, return_lse=True)
    per_sequence = []
    for b, arrays in enumerate(dense):
        o, l = kernels.attention(*arrays, causal=causal, return_lse=True, backend="numba")
        per_sequence.append((arrays, _heads(dout, cu, b), o, l))

    def varlen():
        return kernels.attention_varlen_backward(q, k, v, dout, cu, cu, out=out, lse=lse,
                                                 causal=causal, backend="numba")

    def dense_sum():
        return [kernels.attention_backward(*arrays, d, out=o, lse=l, causal=causal,
                                           backend="numba")
                for arrays, d, o, l in per_sequence]

    return {"varlen": varlen, "dense sum": dense_sum}


def _sinks_calls(config):
    B, H, D, L = config.batch, config.heads, config.head_size, config.sinks_length
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((B, H, L, D)).astype(np.float32) for _ in range(3))
    sinks = rng.standard_normal(H).astype(np.float32)
    dout = rng.standard_normal(q.shape).astype(np.float32)
    calls = {}
    for name, kwargs in (("plain", {}), ("sinks", {"sinks": sinks})):
        out, lse = kernels.attention(q, k, v, return_lse=True, backend="numba", **kwargs)
        calls[f"{name} forward"] = (lambda kw=kwargs: kernels.attention(
            q, k, v, backend="numba", **kw))
        calls[f"{name} backward"] = (lambda kw=kwargs, o=out, l=lse: kernels.attention_backward(
            q, k, v, dout, out=o, lse=l, backend="numba", **kw))
    return calls


def varlen_section(config, threads: int, progress: Callable[[str], None] = print) -> list[dict]:
    """The varlen section's rows (see the module's docstring)."""
    lengths = list(config.varlen_lengths)
    H, D = config.heads, config.head_size
    q, k, v, cu = _packed(lengths, H, D)
    rows = []
    L = max(lengths)
    for causal in config.causal:
        kind = "causal" if causal else "non-causal"
        progress(f"varlen  {len(lengths)} sequences {lengths}, {kind}: varlen, dense sum, "
                 "padded")
        calls, dense = _forward_calls(q, k, v, cu, lengths, causal)
        for call in calls.values():
            call()  # compiles
        pairs = _pairs(lengths, causal)
        flops = {"varlen": 4 * H * D * pairs, "dense sum": 4 * H * D * pairs,
                 "padded": 4 * H * D * pairs}
        rows += _rows(config, FORWARD, interval_timings(calls, config), flops, threads,
                      causal, L, len(lengths))
        progress(f"varlen  backward, {kind}: varlen, dense sum")
        calls = _backward_calls(q, k, v, cu, dense, causal)
        for call in calls.values():
            call()
        flops = dict.fromkeys(calls, 10 * H * D * pairs)
        rows += _rows(config, BACKWARD, interval_timings(calls, config), flops, threads,
                      causal, L, len(lengths))
    progress(f"varlen  sinks vs plain, L={config.sinks_length}, forward and backward")
    calls = _sinks_calls(config)
    for call in calls.values():
        call()
    n = config.batch * H * D * config.sinks_length ** 2
    flops = {name: (10 if "backward" in name else 4) * n for name in calls}
    rows += _rows(config, SINKS, interval_timings(calls, config), flops, threads, False,
                  config.sinks_length, config.batch)
    return rows


def varlen_targets(table: pd.DataFrame, config) -> list[dict]:
    """The section's targets, each from the 95% interval of its ratio."""
    rows = table[(table["section"] == "varlen") & (table["status"] == "ok")]
    lengths = "+".join(map(str, config.varlen_lengths))

    def pairs(group, num, den):
        found = []
        for causal in config.causal:
            tail = " causal" if causal else ""
            a = _find(rows, variant=f"{group}: {num}{tail}")
            b = _find(rows, variant=f"{group}: {den}{tail}")
            if a is not None and b is not None:
                found.append(("causal" if causal else "non-causal", a, b))
        return found

    def sinks_pair(direction):
        a = _find(rows, variant=f"{SINKS}: sinks {direction}")
        b = _find(rows, variant=f"{SINKS}: plain {direction}")
        return [] if a is None or b is None else [(direction, a, b)]

    shape = f"H={config.heads} D={config.head_size}, sequences {lengths}"
    return [
        _ratio_target("varlen / sum of the dense calls", shape,
                      pairs(FORWARD, "varlen", "dense sum"), 1.15, at_most=True),
        _ratio_target("padded dense call / varlen", shape + ", padded B=8 with key_lengths",
                      pairs(FORWARD, "padded", "varlen"), 1.3, at_most=False),
        _ratio_target("varlen backward / sum of the dense backwards", shape + ", out, lse given",
                      pairs(BACKWARD, "varlen", "dense sum"), 1.15, at_most=True),
        _ratio_target("sinks / plain", f"B={config.batch} H={config.heads} "
                      f"L={config.sinks_length}, non-causal",
                      sinks_pair("forward") + sinks_pair("backward"), 1.05, at_most=True),
    ]
