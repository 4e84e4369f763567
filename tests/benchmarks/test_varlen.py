"""Packed batches and sinks (issue 24) with pytest-benchmark (``pytest --benchmark``).

Per grid (``ATTNBENCH_BENCH_GRID``, tiny or small): one packed batch of 4 sequences timed
as ``attention_varlen``, as the sum of its dense calls and as the padded dense call
(``key_lengths``), grouped so the table compares them; and ``attention`` with and without
``sinks``.  A ratio with an interval, the target's verdict, is ``attnbench bench --only
varlen``'s; these record the timings in pytest-benchmark's format (correctness is
tests/test_varlen.py's, under the oracle's tolerance).
"""

import numpy as np
import pytest

from attnbench import kernels
from tests.benchmarks.common import GRID

LENGTHS = {"tiny": [96, 48, 24, 12], "small": [1024, 512, 256, 128]}[GRID]
H, D = 4, 64


def _packed():
    rng = np.random.default_rng(0)
    cu = np.concatenate([[0], np.cumsum(LENGTHS)])
    q, k, v = (rng.standard_normal((cu[-1], H, D)).astype(np.float32) for _ in range(3))
    return q, k, v, cu


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("how", ["varlen", "dense sum", "padded"])
def test_packed_batch(benchmark, how, causal):
    q, k, v, cu = _packed()
    dense = [tuple(x[cu[b]:cu[b + 1]].transpose(1, 0, 2)[None].copy() for x in (q, k, v))
             for b in range(len(LENGTHS))]
    L = max(LENGTHS)
    padded = np.zeros((3, len(LENGTHS), H, L, D), np.float32)
    for b, arrays in enumerate(dense):
        for n, x in enumerate(arrays):
            padded[n, b, :, :LENGTHS[b]] = x[0]
    calls = {
        "varlen": lambda: kernels.attention_varlen(q, k, v, cu, cu, causal=causal),
        "dense sum": lambda: [kernels.attention(*a, causal=causal) for a in dense],
        "padded": lambda: kernels.attention(*padded, causal=causal,
                                            key_lengths=np.array(LENGTHS)),
    }
    calls[how]()  # compiles
    benchmark.group = f"varlen {LENGTHS} H={H} D={D} causal={causal}"
    benchmark(calls[how])


@pytest.mark.parametrize("sinks", [False, True])
def test_sinks(benchmark, sinks):
    rng = np.random.default_rng(1)
    L = LENGTHS[0]
    q, k, v = (rng.standard_normal((1, H, L, D)).astype(np.float32) for _ in range(3))
    kwargs = {"sinks": np.linspace(-1, 1, H).astype(np.float32)} if sinks else {}
    kernels.attention(q, k, v, **kwargs)  # compiles
    benchmark.group = f"sinks L={L} H={H} D={D}"
    benchmark(lambda: kernels.attention(q, k, v, **kwargs))
