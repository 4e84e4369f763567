"""Packed variable-length batches in half precision (issues 24, 25): float16 and bfloat16.

``attention_varlen`` and its backward on half q, k, v equal ``kernels.attention`` on each
sequence alone, judged as ``tests/test_varlen.py`` judges float32 (the per-sequence oracle,
:func:`attnbench.measure.oracle.oracle_runs` and ``tolerance``), under the half tolerance
rule: 2 x the error of the formula as a standard half implementation rounds it + 2 ulps
of the half dtype.  out, dq, dk, dv (and dsinks) come back in the input dtype, lse is
float32.  Also: no float32 copy of the whole K or V on the numba backend (tracemalloc), the
reference and cuda (simulator) backends, bad dtypes named.

Few dtype x feature combinations, since each compiles its own kernels: the plain path
(no mods, no dropout: causal both ways, GQA, empty sequences, sinks) in both half dtypes,
a mask_mod (the strided path) in bfloat16 (float16 with ``slow``).
"""

from __future__ import annotations

import tracemalloc

import ml_dtypes
import numba
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from attnbench import kernels

from .support import small_cuda_tiles
from .test_varlen import _assert_backward, _assert_forward, _options, _packed

HALF = (np.dtype(np.float16), np.dtype(ml_dtypes.bfloat16))
HALF_IDS = ["float16", "bfloat16"]

# An empty sequence (no rows, no keys), one with rows but no keys, cross lengths, GQA 4/2.
LENGTHS_Q = [6, 0, 19, 4, 11]
LENGTHS_K = [9, 0, 19, 0, 23]


def _half_packed(dtype, lengths_q=LENGTHS_Q, lengths_k=LENGTHS_K, H=4, Hkv=2, D=16, seed=0):
    return _packed(lengths_q, lengths_k, H, Hkv, D, D, dtype, seed=seed)


def _assert_dtypes(q, k, v, cu_q, cu_k, backend, **kwargs):
    out, lse = kernels.attention_varlen(q, k, v, cu_q, cu_k, return_lse=True, backend=backend,
                                        **kwargs)
    assert out.dtype == q.dtype and lse.dtype == np.float32
    grads = kernels.attention_varlen_backward(q, k, v, np.ones_like(out), cu_q, cu_k, out=out,
                                              lse=lse, backend=backend, **kwargs)
    assert [g.dtype for g in grads] == [q.dtype] * len(grads)
    assert len(grads) == (3 if kwargs.get("sinks") is None else 4)


@pytest.mark.parametrize("causal", [False, True, "bottom-right"])
@pytest.mark.parametrize("dtype", HALF, ids=HALF_IDS)
def test_numba_forward_and_backward_are_each_sequence_alone(dtype, causal):
    q, k, v, cu_q, cu_k = _half_packed(dtype)
    _assert_forward(q, k, v, cu_q, cu_k, "numba", causal=causal)
    grads = _assert_backward(q, k, v, cu_q, cu_k, "numba", causal=causal)
    assert (grads[0][cu_q[3]:cu_q[4]] == 0).all()  # rows that see no key: no gradient
    if causal is False:
        _assert_dtypes(q, k, v, cu_q, cu_k, "numba", causal=causal)


@pytest.mark.parametrize("dtype", HALF, ids=HALF_IDS)
def test_numba_sinks_in_the_input_dtype(dtype):
    q, k, v, cu_q, cu_k = _half_packed(dtype)
    kwargs = _options(dict(sinks=True), 4, dtype)  # sinks in q's dtype, as the dense call
    _assert_forward(q, k, v, cu_q, cu_k, "numba", causal="bottom-right", **kwargs)
    _assert_backward(q, k, v, cu_q, cu_k, "numba", causal="bottom-right", **kwargs)
    _assert_dtypes(q, k, v, cu_q, cu_k, "numba", **kwargs)
    out, lse = kernels.attention_varlen(q, k, v, cu_q, cu_k, return_lse=True, **kwargs)
    rows = slice(cu_q[3], cu_q[4])  # see no key: out 0, lse the sink
    assert (out[rows] == 0).all()
    np.testing.assert_array_equal(lse[:, rows], np.broadcast_to(
        kwargs["sinks"].astype(np.float32)[:, None], lse[:, rows].shape))


@pytest.mark.parametrize("dtype", [
    pytest.param(HALF[0], id="float16", marks=pytest.mark.slow),
    pytest.param(HALF[1], id="bfloat16"),
])
def test_numba_mask_mod_and_score_mod(dtype):
    """The strided path (mods see b = the sequence index), compiled for float32."""
    q, k, v, cu_q, cu_k = _half_packed(dtype)
    kwargs = _options(dict(score_mod="alibi", mask_mod="window"), 4, dtype)
    _assert_forward(q, k, v, cu_q, cu_k, "numba", causal=True, **kwargs)
    _assert_backward(q, k, v, cu_q, cu_k, "numba", causal=True, **kwargs)


@settings(max_examples=8, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 20), st.integers(0, 20)), min_size=1, max_size=5),
       st.sampled_from([False, True, "bottom-right"]), st.sampled_from(HALF))
def test_hypothesis_lengths_in_half(pairs, causal, dtype):
    lengths_q, lengths_k = [p[0] for p in pairs], [p[1] for p in pairs]
    q, k, v, cu_q, cu_k = _half_packed(dtype, lengths_q, lengths_k, H=2, Hkv=1, D=8,
                                       seed=len(pairs))
    _assert_forward(q, k, v, cu_q, cu_k, "numba", causal=causal)
    _assert_backward(q, k, v, cu_q, cu_k, "numba", causal=causal)


def test_reference_backend():
    for dtype in HALF:
        q, k, v, cu_q, cu_k = _half_packed(dtype, [3, 0, 5], [4, 2, 5], H=2, Hkv=1, D=4)
        for kwargs in (dict(causal="bottom-right"), dict(sinks=np.array([0.5, -1], dtype))):
            _assert_forward(q, k, v, cu_q, cu_k, "reference", **kwargs)
            _assert_backward(q, k, v, cu_q, cu_k, "reference", **kwargs)
            _assert_dtypes(q, k, v, cu_q, cu_k, "reference", **kwargs)


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", HALF, ids=HALF_IDS)
def test_cuda_backend_in_the_simulator(dtype, request, monkeypatch):
    """Each sequence as a dense half call of the cuda backend (tiny: the simulator)."""
    small_cuda_tiles(request, monkeypatch)
    q, k, v, cu_q, cu_k = _half_packed(dtype, [3, 0, 5], [4, 2, 5], H=2, Hkv=1, D=4)
    for kwargs in (dict(causal="bottom-right"), dict(sinks=np.array([0.5, -1], dtype))):
        _assert_forward(q, k, v, cu_q, cu_k, "cuda", **kwargs)
        _assert_backward(q, k, v, cu_q, cu_k, "cuda", **kwargs)
        _assert_dtypes(q, k, v, cu_q, cu_k, "cuda", **kwargs)


@pytest.mark.parametrize("dtype", HALF, ids=HALF_IDS)
def test_no_float32_copy_of_k_and_v(dtype):
    """8192 keys in two sequences: the call's peak stays below what it must hold (its
    sequence-major copies of q, k and v in the input dtype, its results, and in the backward
    Q-sized float32 arrays) plus half a float32 copy of K, so that a float32 copy of K
    alone (what widening K, or V, up front would take) exceeds it."""
    q, k, v, cu_q, cu_k = _half_packed(dtype, [40, 24], [6000, 2192], H=4, Hkv=2, D=64)
    dout = np.ones(q.shape[:2] + v.shape[2:], dtype)
    out, lse = kernels.attention_varlen(q, k, v, cu_q, cu_k, return_lse=True)  # compiles
    kernels.attention_varlen_backward(q, k, v, dout, cu_q, cu_k, out=out, lse=lse)
    float32_k = 2 * k.nbytes
    copies = q.nbytes + k.nbytes + v.nbytes  # sequence after sequence, in the input dtype
    tracemalloc.start()
    try:
        kernels.attention_varlen(q, k, v, cu_q, cu_k, return_lse=True)
        forward_peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.reset_peak()
        base = tracemalloc.get_traced_memory()[0]
        kernels.attention_varlen_backward(q, k, v, dout, cu_q, cu_k, out=out, lse=lse)
        backward_peak = tracemalloc.get_traced_memory()[1] - base
    finally:
        tracemalloc.stop()
    results = 2 * (out.nbytes + lse.nbytes)  # sequence-major, then packed back
    assert forward_peak < copies + results + float32_k / 2, (forward_peak, float32_k)
    # dk and dv sequence-major, then packed back; Q-sized: dq's float32 part per thread,
    # its sum, packed and rounded, dout and out sequence-major and in float32 (for Δ).
    grads = 2 * (k.nbytes + v.nbytes)
    rows = 2 * numba.get_num_threads() * q.nbytes + 8 * (q.nbytes + dout.nbytes)
    assert backward_peak < copies + grads + rows + float32_k / 2, (backward_peak, float32_k)


@pytest.mark.parametrize("fn", ["forward", "backward"])
@pytest.mark.parametrize("arrays, words", [
    (dict(k=np.float32), ["q, k and v must share one dtype", "float16", "float32"]),
    (dict(v=ml_dtypes.bfloat16), ["share one dtype", "bfloat16"]),
    (dict(q=np.int8), ["q has dtype int8", "float16", "bfloat16"]),
], ids=["half+float32", "float16+bfloat16", "int8"])
def test_bad_dtypes_name_the_argument(arrays, words, fn):
    cu = np.array([0, 3, 9])
    q, k, v = (np.ones((9, 2, 4), arrays.get(n, np.float16)) for n in "qkv")
    with pytest.raises(TypeError) as info:
        if fn == "forward":
            kernels.attention_varlen(q, k, v, cu, cu)
        else:
            kernels.attention_varlen_backward(q, k, v, q, cu, cu)
    for word in words:
        assert word in str(info.value), (word, str(info.value))


def test_bad_half_companions_name_the_argument():
    """lse is float32 for half inputs; dout, out and sinks have q's dtype."""
    q, k, v, cu_q, cu_k = _half_packed(np.float16, [3, 5], [4, 5], H=2, Hkv=1, D=4)
    out, lse = kernels.attention_varlen(q, k, v, cu_q, cu_k, return_lse=True, backend="reference")
    with pytest.raises(TypeError, match="lse has dtype float16; expected float32"):
        kernels.attention_varlen_backward(q, k, v, out, cu_q, cu_k, out=out,
                                          lse=lse.astype(np.float16))
    with pytest.raises(TypeError, match="dout has dtype float32; expected float16"):
        kernels.attention_varlen_backward(q, k, v, out.astype(np.float32), cu_q, cu_k)
    with pytest.raises(TypeError, match="sinks has dtype float32; expected float16"):
        kernels.attention_varlen(q, k, v, cu_q, cu_k, sinks=np.zeros(2, np.float32))
