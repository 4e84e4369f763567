"""The cuda backward pass and the forward's lse: in Numba's CUDA simulator, and as PTX.

Same standard as ``tests/test_cuda.py``: tiny shapes with 4-thread blocks (several blocks
and ragged tails), the baseline-relative tolerance of ``tests/backward_support.py``, and
the real kernels compiled to PTX in a subprocess (no float64 instruction in float32).
"""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("numba.cuda", reason="numba-cuda is missing: pip install attnbench[cuda]")

import numba  # noqa: E402
from numba import cuda  # noqa: E402  (a global: the simulator swaps it while a kernel runs)

from attnbench import kernels  # noqa: E402
from attnbench.kernels.cuda import device as cuda_device  # noqa: E402

from .backward_support import (  # noqa: E402
    assert_gradients_match,
    assert_lse_matches,
    make_dout,
)
from .support import (  # noqa: E402
    DTYPES,
    Case,
    make_inputs,
    ptx_of_kernels,  # noqa: E402
    small_cuda_tiles,
)
from .test_cuda import CASES  # noqa: E402

pytestmark = pytest.mark.cuda

COMPILE_ONLY = {"test_ptx_float32_backward_kernels_have_no_float64_instruction"}


@pytest.fixture(autouse=True)
def small_tiles(request, monkeypatch):
    """Skip where the backend cannot run; 4-thread blocks and 4-key tiles where it can."""
    small_cuda_tiles(request, monkeypatch, COMPILE_ONLY)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_gradients_match_reference(case, dtype):
    q, k, v, kwargs = make_inputs(case, dtype)
    assert_gradients_match(q, k, v, "cuda", **kwargs)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("case", CASES[::3], ids=lambda c: c.name)
def test_lse_matches_the_reference(case, dtype):
    q, k, v, kwargs = make_inputs(case, dtype)
    assert_lse_matches(q, k, v, "cuda", **kwargs)


def test_nan_in_hidden_keys_and_empty_query_rows_reaches_no_gradient():
    case = Case("x", B=2, H=4, Hkv=2, Lq=6, Lk=7, D=3, causal="bottom-right")
    q, k, v, kwargs = make_inputs(case, np.float32)
    mask = np.random.default_rng(1).random((2, 4, 6, 7)) < 0.7
    mask[:, :, 1] = False  # query 1 sees nothing
    mask[:, :, :, 2] = False  # key 2 is seen by no query
    kwargs = dict(kwargs, mask=mask, key_lengths=[7, 5])
    dout = make_dout(q, v)
    before = kernels.attention_backward(q, k, v, dout, backend="cuda", **kwargs)
    q2, k2, v2, dout2 = q.copy(), k.copy(), v.copy(), dout.copy()
    q2[:, :, 1] = dout2[:, :, 1] = np.nan
    k2[:, :, 2] = v2[:, :, 2] = np.nan
    k2[1, :, 5:] = v2[1, :, 5:] = np.inf  # past key_lengths
    after = kernels.attention_backward(q2, k2, v2, dout2, backend="cuda", **kwargs)
    for b, a in zip(before, after, strict=True):
        np.testing.assert_array_equal(a, b)
    assert (after[0][:, :, 1] == 0).all() and (after[1][:, :, 2] == 0).all()


def test_partial_sum_dot_product_beats_one_running_sum():
    """The kernels' dot product (``make_dot``: 8 partial sums) against one sequential float32
    sum, on large unscaled logits (|q|, |k| ~ 6, D = 64): smaller mean and max
    error over 256 pairs.  (In the simulator there is no FMA; on a GPU the sums contract
    to FMAs, which only helps.)"""
    dot = cuda_device.make_dot(numba.float32)

    @cuda.jit
    def dots(x, y, out):
        i = cuda.grid(1)
        if i < x.shape[0]:
            out[i] = dot(x[i], 0, y[i], 0, x.shape[1])

    rng = np.random.default_rng(0)
    x = (6 * rng.standard_normal((256, 64))).astype(np.float32)
    y = (6 * rng.standard_normal((256, 64))).astype(np.float32)
    out = np.zeros(256, np.float32)
    dots[4, 64](x, y, out)
    exact = np.einsum("nd,nd->n", x.astype(np.float64), y.astype(np.float64))
    running = np.zeros(256, np.float32)
    for d in range(64):  # one sequential float32 sum, as the kernel had before
        running += x[:, d] * y[:, d]
    err_new, err_old = np.abs(out - exact), np.abs(running - exact)
    assert err_new.mean() < 0.7 * err_old.mean() and err_new.max() < err_old.max()


@pytest.mark.slow  # every backward kernel compiled to PTX: left out of the quick lane
def test_ptx_float32_backward_kernels_have_no_float64_instruction():
    result = ptx_of_kernels("cuda.backward")
    assert sorted(result) == sorted(
        f"{kind}_{dtype}@sm_{cc}" for kind in ("dkdv", "dq") for dtype in ("float32", "float64")
        for cc in ("80", "90")
    )
    for name, info in result.items():
        assert info["target"] and info["entry"], name
        if "float32" in name:
            assert info["f64_lines"] == [], f"{name} has float64 instructions: {info['f64_lines']}"
        else:
            assert info["f64_lines"], f"{name} should compute in float64"
