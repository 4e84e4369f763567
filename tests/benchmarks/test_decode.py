"""One decode step of kernels.attention_with_kvcache per backend, cache length and layout
(``pytest --benchmark``): Lq = 1, H=8/Hkv=2, D=64, float32; GB/s of K and V read in
extra_info, the output checked against the float64 oracle first (compilation untimed)."""

import functools

import numpy as np
import pytest

from attnbench import kernels
from attnbench.kernels._problems.decode_checks import check_decode_args
from attnbench.measure.oracle import decode_oracle, max_abs_error, tolerance
from tests.benchmarks.common import GRID

LENGTHS = {"tiny": [256, 1024], "small": [1024, 4096, 16384]}
LAYOUTS = [None, 16]  # contiguous, pages of 16 in shuffled order
B, H, HKV, D = 2, 8, 2, 64


@pytest.mark.parametrize("page_size", LAYOUTS, ids=lambda p: "contiguous" if p is None
                         else f"page{p}")
@pytest.mark.parametrize("L", LENGTHS[GRID])
@pytest.mark.parametrize("backend", ["numba", "reference"])
def test_decode_step(benchmark, backend, L, page_size):
    rng = np.random.default_rng(0)
    if page_size is None:
        shape, table = (B, HKV, L, D), None
    else:
        shape = (B * L // page_size, HKV, page_size, D)
        table = rng.permutation(shape[0]).reshape(B, -1)
    k_cache = rng.standard_normal(shape, dtype=np.float32)
    v_cache = rng.standard_normal(shape, dtype=np.float32)
    q = rng.standard_normal((B, H, 1, D), dtype=np.float32)
    lengths = np.full(B, L)
    fn = functools.partial(kernels.attention_with_kvcache, q, k_cache, v_cache,
                           cache_seqlens=lengths, block_table=table, backend=backend)
    out = fn()
    problem = check_decode_args(q, k_cache, v_cache, cache_seqlens=lengths,
                                block_table=table)[0]
    (exact, _), (plain, _) = decode_oracle(problem)
    error, tol = max_abs_error(out, exact), tolerance(exact, plain, np.float32)
    benchmark.group = f"decode L={L} B={B} H={H}/{HKV} D={D}"
    benchmark(fn)
    median = benchmark.stats.stats.median if benchmark.stats is not None else float("nan")
    nbytes = problem.key_bytes()
    benchmark.extra_info.update({"backend": backend, "L": L, "page_size": page_size,
                                 "bytes": nbytes, "gbs": nbytes / median / 1e9,
                                 "max_abs_err": error, "tolerance": tol})
    assert error <= tol, f"error {error:.3g} > tolerance {tol:.3g}"
