"""kernels.attention and its backward on numba in float32, float16 and bfloat16
(``pytest --benchmark``): the half dtypes are computed in float32 from half loads, so
their time beside float32's is the cost (or the saving) of the 16-bit loads and stores.
Each problem is checked against the float64 oracle within its dtype's tolerance."""

import functools

import pytest

from attnbench import kernels
from attnbench.measure.flops import backward_flops
from attnbench.measure.grad_oracle import lse_rounding
from attnbench.measure.oracle import tolerance
from tests.backward_support import backward_oracle, make_dout
from tests.benchmarks.common import GRID, problem, run_benchmark, shape_id, timed
from tests.benchmarks.test_attention import MASKS, SHAPES
from tests.support import max_error

DTYPES = ["float32", "float16", "bfloat16"]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("mask", MASKS)
@pytest.mark.parametrize("shape", SHAPES[GRID], ids=shape_id)
def test_prefill(benchmark, shape, mask, dtype):
    point, q, k, v, kwargs = problem("numba", shape, mask, dtype)
    fn = functools.partial(kernels.attention, q, k, v, backend="numba", **kwargs)
    run_benchmark(benchmark, fn, point, q, k, v, kwargs)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("shape", SHAPES[GRID], ids=shape_id)
def test_backward(benchmark, shape, dtype):
    point, q, k, v, kwargs = problem("numba", shape, "causal", dtype)
    dout = make_dout(q, v)
    out, lse = kernels.attention(q, k, v, backend="numba", return_lse=True, **kwargs)
    fn = functools.partial(kernels.attention_backward, q, k, v, dout, out=out, lse=lse,
                           backend="numba", **kwargs)
    grads = fn()
    exact, plain = backward_oracle(q, k, v, dout, **kwargs)
    ratios = [(max_error(g, e), tolerance(e, p, q.dtype) + lse_rounding(e, lse))
              for g, e, p in zip(grads, exact, plain, strict=True)]
    error, tol = max(ratios, key=lambda et: et[0] / et[1])
    flops = backward_flops(point.batch, point.heads, point.L, point.L, point.d_k, causal=True)
    timed(benchmark, fn, point, flops, error, tol, group=" backward")
