"""kernels.attention per backend, shape and mask kind (``pytest --benchmark``)."""

import functools

import pytest

from attnbench import kernels
from tests.benchmarks.common import GRID, problem, run_benchmark, shape_id

#: Shapes per grid (ATTNBENCH_BENCH_GRID).
SHAPES = {
    "tiny": [
        {"L": 64, "d_k": 32, "heads": 2, "batch": 1},
        {"L": 128, "d_k": 32, "heads": 2, "batch": 1},
    ],
    "small": [
        {"L": 256, "d_k": 64, "heads": 4, "batch": 1},
        {"L": 512, "d_k": 64, "heads": 4, "batch": 1},
        {"L": 1024, "d_k": 64, "heads": 4, "batch": 1},
        {"L": 512, "d_k": 64, "heads": 8, "kv_heads": 2, "batch": 2},  # GQA
    ],
}
MASKS = ["none", "causal"]
BACKENDS = ["numba", "reference"]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("mask", MASKS)
@pytest.mark.parametrize("shape", SHAPES[GRID], ids=shape_id)
def test_attention(benchmark, shape, mask, backend):
    point, q, k, v, kwargs = problem(backend, shape, mask)
    fn = functools.partial(kernels.attention, q, k, v, backend=backend, **kwargs)
    run_benchmark(benchmark, fn, point, q, k, v, kwargs)
