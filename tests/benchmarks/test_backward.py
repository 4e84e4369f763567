"""The backward pass per backend that has one, shape and mask kind (``pytest --benchmark``).

Two timings per problem: ``backward`` (``kernels.attention_backward`` with ``out`` and
``lse`` from a forward made beforehand, as the bench times it) and ``forward+backward``
(one training step's attention: the forward with ``return_lse`` and then the backward).
GFLOP/s count the backward's five products per visible pair
(:func:`attnbench.measure.flops.backward_flops`), plus the forward's two for the step; the
error is the largest over dq, dk, dv against the float64 oracle, within the backward
tests' tolerance (:mod:`tests.backward_support`).
"""

import pytest

from attnbench import kernels
from attnbench.kernels._api.dispatch import has_real_gpu
from attnbench.measure.flops import attention_flops, backward_flops
from attnbench.measure.grad_oracle import lse_rounding
from attnbench.measure.oracle import tolerance
from tests.backward_support import backward_oracle, make_dout
from tests.benchmarks.common import GRID, problem, shape_id, timed
from tests.benchmarks.test_attention import MASKS, SHAPES
from tests.support import max_error

#: Backends with a backward pass; cuda only on a real GPU (the simulator, which the tests
#: switch on without one, runs a Python thread per CUDA thread: nothing to time).
BACKENDS = ["reference", "numba"] + (["cuda"] if has_real_gpu() else [])
PASSES = ["backward", "forward+backward"]


@pytest.mark.parametrize("step", PASSES)
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("mask", MASKS)
@pytest.mark.parametrize("shape", SHAPES[GRID], ids=shape_id)
def test_backward(benchmark, shape, mask, backend, step):
    point, q, k, v, kwargs = problem(backend, shape, mask)
    dout = make_dout(q, v)
    out, lse = kernels.attention(q, k, v, backend=backend, return_lse=True, **kwargs)

    def backward():
        return kernels.attention_backward(q, k, v, dout, out=out, lse=lse, backend=backend,
                                          **kwargs)

    def forward_backward():
        o, m = kernels.attention(q, k, v, backend=backend, return_lse=True, **kwargs)
        return kernels.attention_backward(q, k, v, dout, out=o, lse=m, backend=backend,
                                          **kwargs)

    fn = backward if step == "backward" else forward_backward
    grads = fn()
    exact, plain = backward_oracle(q, k, v, dout, **kwargs)
    error, tol = 0.0, 0.0  # the worst gradient's error, and the tolerance of that one
    for g, e, p in zip(grads, exact, plain, strict=True):
        t = tolerance(e, p, q.dtype) + (lse_rounding(e, lse) if backend != "reference" else 0)
        if tol == 0 or max_error(g, e) / t > error / tol:
            error, tol = max_error(g, e), t
    counts = dict(causal=kwargs.get("causal", False), key_lengths=kwargs.get("key_lengths"),
                  mask=kwargs.get("mask"))
    dims = (point.batch, point.heads, point.L, point.L, point.d_k)
    flops = backward_flops(*dims, **counts)
    if step != "backward":
        flops += attention_flops(*dims, **counts)
    timed(benchmark, fn, point, flops, error, tol, group=f" {step}", step=step)
