"""``attnbench bench``'s backward section: the numba backward against torch's autograd.

For each L of ``backward_lengths`` one group of calls is timed in interleaved rounds, so
that every ratio the targets of the backward need is taken side by side:

- ``numba`` backward: :func:`kernels.attention_backward` with ``out`` and ``lse`` from one
  forward call made beforehand (the forward is not timed), causal and not;
- ``numba`` forward (:func:`kernels.attention`), causal and not: backward / forward;
- ``torch`` backward: ``out.backward(dout, retain_graph=True)`` on a graph that
  ``scaled_dot_product_attention`` built once (the forward is not timed; the ``.grad``
  fields are reset inside the timed call, which costs three attribute writes), causal and
  not.  torch's threads are set to Numba's by the bench (:func:`run_bench`).

Every row keeps its samples (``samples_ms``) so that :mod:`attnbench.bench.interval_targets`
decides each target from a bootstrap interval of the ratio.  A last row gives the extra
memory of one numba backward call at ``backward_memory_length`` (tracemalloc, with the
resident-set rise as a cross-check), beyond its inputs and its three gradients.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np

from attnbench import kernels
from attnbench.bench.config import BenchConfig
from attnbench.bench.sections import _inputs, _row, interval_timings
from attnbench.measure import peers
from attnbench.measure.flops import attention_flops, backward_flops, gflops
from attnbench.measure.intervals import format_samples
from attnbench.measure.timing import peak_extra_memory

#: Variant names of the backward section's rows.
BACKWARD = "backward (out, lse given)"
FORWARD = "forward"
TORCH_BACKWARD = "backward (autograd; forward not timed)"
MEMORY = "memory of one backward (out, lse given)"


def _dout(q: np.ndarray) -> np.ndarray:
    """A seeded output gradient with ``q``'s shape and dtype."""
    return np.random.default_rng(99).standard_normal(q.shape).astype(q.dtype)


def numba_backward_call(q, k, v, dout, causal: bool, **mods) -> Callable[[], tuple]:
    """The numba backward with ``out`` and ``lse`` computed once, outside the call
    (``mods``: ``score_mod``/``mask_mod``, given to both passes)."""
    out, lse = kernels.attention(q, k, v, causal=causal, return_lse=True, backend="numba",
                                 **mods)

    def call():
        return kernels.attention_backward(q, k, v, dout, out=out, lse=lse, causal=causal,
                                          backend="numba", **mods)
    return call


def torch_backward_call(q, k, v, dout, causal: bool) -> Callable[[], None]:
    """torch's SDPA backward on a graph built once (``retain_graph=True``)."""
    import torch

    tq, tk, tv = (torch.from_numpy(x).requires_grad_() for x in (q, k, v))
    out = torch.nn.functional.scaled_dot_product_attention(tq, tk, tv, is_causal=causal)
    tdout = torch.from_numpy(dout)

    def call():
        for x in (tq, tk, tv):
            x.grad = None
        out.backward(tdout, retain_graph=True)
    return call


def _shape_calls(config: BenchConfig, q, k, v, dout, torch_ok: bool) -> dict:
    """Every call of one L, keyed ``(variant, impl, causal)``."""
    calls = {}
    for causal in config.causal:
        calls[BACKWARD, "numba", causal] = numba_backward_call(q, k, v, dout, causal)
        calls[FORWARD, "numba", causal] = (
            lambda causal=causal: kernels.attention(q, k, v, causal=causal, backend="numba"))
        if torch_ok:
            calls[TORCH_BACKWARD, "torch", causal] = torch_backward_call(q, k, v, dout, causal)
    return calls


def backward_rows(config: BenchConfig, L: int, threads: int) -> list[dict]:
    """Rows of one L: numba backward and forward and torch backward, causal and not."""
    B, H, D = config.batch, config.heads, config.head_size
    q, k, v = _inputs(B, H, L, D, np.float32)
    dout = _dout(q)
    torch_ok = "torch" in config.peers and peers.peer_status("torch")[0]
    calls = _shape_calls(config, q, k, v, dout, torch_ok)
    timings = interval_timings(calls, config)
    rows = []
    for (variant, impl, causal), timing in timings.items():
        count = attention_flops if variant == FORWARD else backward_flops
        rate = gflops(count(B, H, L, L, D, causal=causal), timing.median)
        rows.append(_row("backward", impl, variant=variant, B=B, H=H, L=L, D=D, causal=causal,
                         dtype=np.float32, threads=threads, **timing.ms_columns(),
                         samples_ms=format_samples(timing.samples), gflops=rate))
        torch_key = (TORCH_BACKWARD, "torch", causal)
        if variant == BACKWARD and torch_key in timings:
            rows[-1]["vs_torch"] = timing.median / timings[torch_key].median
    if not torch_ok and "torch" in config.peers:
        for causal in config.causal:
            rows.append(_row("backward", "torch", variant=TORCH_BACKWARD, B=B, H=H, L=L, D=D,
                             causal=causal, dtype=np.float32, threads=threads,
                             status=f"missing: {peers.peer_status('torch')[1]}"))
    return rows


def backward_memory_row(config: BenchConfig, threads: int) -> dict:
    """Extra memory of one numba backward call (non-causal) beyond inputs and gradients."""
    B, H, L, D = config.batch, config.heads, config.backward_memory_length, config.head_size
    q, k, v = _inputs(B, H, L, D, np.float32)
    small = _inputs(B, 1, 64, D, np.float32)
    numba_backward_call(*small, _dout(small[0]), causal=False)()  # compiles, at no size
    call = numba_backward_call(q, k, v, _dout(q), causal=False)
    grads_mib = 3 * q.nbytes / 2**20  # dq, dk, dv: alive while measured, not extra
    traced = peak_extra_memory(call, method="tracemalloc", warmup=0)
    started = time.perf_counter()
    rss = peak_extra_memory(call, method="rss", warmup=0)
    seconds = time.perf_counter() - started
    return _row("backward", "numba", variant=MEMORY, B=B, H=H, L=L, D=D, causal=False,
                dtype=np.float32, threads=threads, extra_mib=traced / 2**20 - grads_mib,
                rss_extra_mib=rss / 2**20, median_ms=seconds * 1e3, runs=1, number=1)


def backward_section(config: BenchConfig, threads: int,
                     progress: Callable[[str], None] = print) -> list[dict]:
    """The backward section: :func:`backward_rows` per L, then the memory row."""
    rows = []
    for L in sorted(set(config.backward_lengths)):
        progress(f"backward L={L}: numba backward and forward, torch backward")
        rows += backward_rows(config, L, threads)
    progress(f"backward memory L={config.backward_memory_length}")
    rows.append(backward_memory_row(config, threads))
    return rows
