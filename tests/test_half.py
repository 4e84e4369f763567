"""Half precision (issue 25): float16 and bfloat16 inputs, float32 accumulation.

- differential: the numba backend (serial, parallel, without BLAS) and the reference backend
  against the float64 oracle over the half inputs, under the half tolerance rule
  (``attnbench.measure.oracle``: 2 x the error of the formula as a standard half
  implementation rounds it + 2 ulps of the half dtype); gradients likewise;
- dtypes: output, dq, dk, dv in the input dtype, lse float32; masks in the input dtype or
  float32; a float16 score above 65504 stays a finite float32 score;
- perturbation: NaN in hidden keys and values changes no output or gradient bit;
- memory: a half call at Lk = 16384 allocates no float32 copy of K and V (tracemalloc);
- bad input: mixed dtypes, int8, float8 name the argument; bfloat16 without ml_dtypes;
- torch's CPU SDPA in both half dtypes, where torch is installed.
"""

from __future__ import annotations

import subprocess
import sys
import tracemalloc

import ml_dtypes
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from attnbench import kernels
from attnbench.kernels.numba_cpu import config

from .backward_support import assert_gradients_match, make_dout
from .support import REPO, Case, assert_matches_reference, make_inputs, max_error, oracle
from .test_attention import problems

HALF = (np.dtype(np.float16), np.dtype(ml_dtypes.bfloat16))
HALF_IDS = ["float16", "bfloat16"]

# Few cases, each stressing something (tails, cross, GQA, every mask kind, dropout): every
# one compiles a half kernel per mask type, so the table stays short.
CASES = [
    Case("L7 D59", Lq=7, D=59),
    Case("L97 D64 unscaled", Lq=97, D=64, scale=1.0),
    Case("cross 33x129 GQA 4/2", H=4, Hkv=2, Lq=33, Lk=129, D=16),
    Case("causal bottom-right 13x150", B=2, H=2, Lq=13, Lk=150, D=5, causal="bottom-right"),
    Case("bool mask", B=2, H=2, Lq=37, D=8, mask="bool"),
    Case("float mask (half)", B=2, H=2, Lq=37, D=8, mask="float"),
    Case("empty rows", Lq=31, Lk=40, D=8, mask="empty-rows"),
    Case("all kinds + dropout", B=2, H=4, Hkv=2, Lq=37, D=8, causal=True, mask="float",
         key_lengths="with-zero", dropout_p=0.2),
]

PATHS = {  # (SERIAL_WORK_LIMIT, HAVE_BLAS)
    "serial": (float("inf"), config.HAVE_BLAS),
    "parallel": (0, config.HAVE_BLAS),
    "parallel-loops": (0, False),
}


def _on_path(monkeypatch, path):
    serial_limit, have_blas = PATHS[path]
    monkeypatch.setattr(config, "SERIAL_WORK_LIMIT", serial_limit)
    monkeypatch.setattr(config, "BACKWARD_SERIAL_WORK_LIMIT", serial_limit)
    monkeypatch.setattr(config, "HAVE_BLAS", have_blas)


# Every case on the serial and parallel BLAS paths; the loops path (no SciPy) on the case
# with every mask kind.
FORWARD = [pytest.param(c, p, id=f"{c.name}-{p}") for c in CASES for p in PATHS
           if p != "parallel-loops" or c is CASES[-1]]
# Gradients: every case but the two largest plain ones serially; the parallel paths on the
# case with every mask kind.
BACKWARD = [pytest.param(c, p, id=f"{c.name}-{p}") for c in CASES[2:] for p in PATHS
            if p == "serial" or c is CASES[-1]]


# --- differential ----------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", HALF, ids=HALF_IDS)
@pytest.mark.parametrize("case, path", FORWARD)
def test_numba_matches_the_oracle(case, path, dtype, monkeypatch):
    _on_path(monkeypatch, path)
    q, k, v, kwargs = make_inputs(case, dtype)
    assert_matches_reference(q, k, v, "numba", **kwargs)


@pytest.mark.parametrize("dtype", HALF, ids=HALF_IDS)
@pytest.mark.parametrize("case", CASES[::3], ids=lambda c: c.name)
def test_reference_backend_rounds_the_oracle(case, dtype):
    q, k, v, kwargs = make_inputs(case, dtype)
    assert_matches_reference(q, k, v, "reference", **kwargs)


@pytest.mark.parametrize("dtype", HALF, ids=HALF_IDS)
@pytest.mark.parametrize("case, path", BACKWARD)
def test_numba_gradients_match_the_oracle(case, path, dtype, monkeypatch):
    _on_path(monkeypatch, path)
    q, k, v, kwargs = make_inputs(case, dtype)
    assert_gradients_match(q, k, v, "numba", **kwargs)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=problems(), dtype=st.sampled_from(HALF), seed=st.integers(0, 2**16))
def test_numba_matches_the_oracle_on_drawn_problems(case, dtype, seed):
    q, k, v, kwargs = make_inputs(case, dtype, seed)
    assert_matches_reference(q, k, v, "numba", **kwargs)


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=problems(), dtype=st.sampled_from(HALF), seed=st.integers(0, 2**16))
def test_numba_gradients_match_the_oracle_on_drawn_problems(case, dtype, seed):
    q, k, v, kwargs = make_inputs(case, dtype, seed)
    assert_gradients_match(q, k, v, "numba", **kwargs)


def test_the_half_tolerance_fails_a_kernel_that_rounds_its_scores_to_float16_twice():
    """The rule can fail: the output of the oracle rounded through float16 scores of a
    less precise kernel (each score rounded to 8 bits) is outside it."""
    q, k, v, kwargs = make_inputs(Case("x", Lq=64, D=64, scale=1.0), np.float16)
    (exact, _), (plain, _) = oracle(q, k, v, **kwargs)
    from attnbench.measure.oracle import tolerance

    scores = (q.astype(np.float32) @ k.astype(np.float32).swapaxes(-1, -2))
    coarse = np.round(scores * 4) / 4  # scores with 2 fractional bits
    weights = np.exp(coarse - coarse.max(-1, keepdims=True))
    weights /= weights.sum(-1, keepdims=True)
    out = (weights @ v.astype(np.float32)).astype(np.float16)
    assert max_error(out, exact) > tolerance(exact, plain, np.float16)


# --- dtypes ----------------------------------------------------------------------------------


@pytest.mark.parametrize("backend", ["reference", "numba"])
@pytest.mark.parametrize("dtype", HALF, ids=HALF_IDS)
def test_results_have_the_input_dtype_and_lse_is_float32(dtype, backend):
    q, k, v, kwargs = make_inputs(Case("x", B=2, H=2, Lq=9, Lk=11, D=8), dtype)
    out, weights, lse = kernels.attention(q, k, v, backend=backend, return_weights=True,
                                          return_lse=True)
    assert out.dtype == dtype and weights.dtype == dtype and lse.dtype == np.float32
    grads = kernels.attention_backward(q, k, v, make_dout(q, v), out=out, lse=lse,
                                       backend=backend)
    assert [g.dtype for g in grads] == [dtype] * 3
    with pytest.raises(TypeError, match="lse"):
        kernels.attention_backward(q, k, v, make_dout(q, v), out=out, lse=lse.astype(dtype))


@pytest.mark.parametrize("mask_dtype", ["input", np.float32])
@pytest.mark.parametrize("dtype", HALF, ids=HALF_IDS)
def test_a_float_mask_in_the_input_dtype_or_float32(dtype, mask_dtype):
    q, k, v, _ = make_inputs(Case("x", H=2, Lq=9, D=8), dtype)
    mask = np.where(np.arange(9)[None, :] <= np.arange(9)[:, None], 0.25, -np.inf)
    mask = mask.astype(dtype if mask_dtype == "input" else mask_dtype)
    out = kernels.attention(q, k, v, mask=mask, backend="numba")
    assert out.dtype == dtype
    assert_matches_reference(q, k, v, "numba", mask=mask)


def test_a_float16_score_above_65504_stays_a_finite_float32_score():
    q = np.full((1, 1, 3, 2), 200, np.float16)
    k = np.full((1, 1, 5, 2), 200, np.float16)
    k[0, 0, 2] = 201  # scores 80000 and 80400: beyond float16, not beyond float32
    v = np.arange(10, dtype=np.float16).reshape(1, 1, 5, 2)
    out, lse = kernels.attention(q, k, v, scale=1.0, backend="numba", return_lse=True)
    assert np.isfinite(out).all() and np.isfinite(lse).all()
    np.testing.assert_array_equal(out, np.broadcast_to(v[0, 0, 2], out.shape))  # key 2 wins
    assert lse[0, 0, 0] == np.float32(200 * 201 * 2)


def test_float16_of_minus_1e9_is_minus_inf_and_hides_the_key():
    """C25: float16(-1e9) = -inf, so a "-1e9" padding mask in float16 hides keys exactly."""
    with np.errstate(over="ignore"):
        assert np.float16(-1e9) == -np.inf
    q, k, v, _ = make_inputs(Case("x", Lq=4, Lk=6, D=8), np.float16)
    mask = np.zeros((4, 6), np.float16)
    with np.errstate(over="ignore"):
        mask[:, 4:] = np.float16(-1e9)
    out = kernels.attention(q, k, v, mask=mask, backend="numba")
    np.testing.assert_array_equal(out, kernels.attention(q, k[..., :4, :], v[..., :4, :],
                                                         backend="numba"))


# --- perturbation ----------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", HALF, ids=HALF_IDS)
def test_nan_in_hidden_keys_and_values_changes_no_bit(dtype):
    q, k, v, _ = make_inputs(Case("x", B=2, H=4, Hkv=2, Lq=40, D=16), dtype)
    dout = make_dout(q, v)
    kwargs = dict(key_lengths=np.array([17, 40]), causal=True)

    def run(k, v):
        out, lse = kernels.attention(q, k, v, backend="numba", return_lse=True, **kwargs)
        return (out, lse) + kernels.attention_backward(q, k, v, dout, out=out, lse=lse,
                                                        backend="numba", **kwargs)

    before = run(k, v)
    k2, v2 = k.copy(), v.copy()
    k2[0, :, 17:] = np.nan
    v2[0, :, 17:] = np.inf
    after = run(k2, v2)
    for b, a in zip(before, after, strict=True):
        np.testing.assert_array_equal(b.view(np.uint16) if b.itemsize == 2 else b,
                                      a.view(np.uint16) if a.itemsize == 2 else a)


# --- memory ----------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", HALF, ids=HALF_IDS)
def test_a_half_call_allocates_no_float32_copy_of_k_and_v(dtype):
    """Lk = 16384: the call's peak is below its results plus one float32 copy of K alone
    (what widening K, or V, up front would take); the tiles it widens are far smaller."""
    rng = np.random.default_rng(0)
    q = rng.standard_normal((1, 4, 64, 64)).astype(dtype)  # (B, H, Lq, D)
    k = rng.standard_normal((1, 4, 16384, 64)).astype(dtype)  # (B, H, Lk, D)
    v = rng.standard_normal((1, 4, 16384, 64)).astype(dtype)
    dout = make_dout(q, v)
    out, lse = kernels.attention(q, k, v, backend="numba", return_lse=True)  # compiles
    kernels.attention_backward(q, k, v, dout, out=out, lse=lse, backend="numba")
    float32_k = 2 * k.nbytes
    tracemalloc.start()
    try:
        kernels.attention(q, k, v, backend="numba", return_lse=True)
        forward_peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.reset_peak()
        base = tracemalloc.get_traced_memory()[0]
        kernels.attention_backward(q, k, v, dout, out=out, lse=lse, backend="numba")
        backward_peak = tracemalloc.get_traced_memory()[1] - base
    finally:
        tracemalloc.stop()
    assert forward_peak < out.nbytes + lse.nbytes + float32_k, (forward_peak, float32_k)
    # dq, dk, dv in the half dtype (dk and dv each K's size) and dq's float32 accumulator.
    results = q.nbytes + k.nbytes + v.nbytes + 2 * q.nbytes
    assert backward_peak < results + float32_k, (backward_peak, float32_k)


# --- bad input -------------------------------------------------------------------------------


@pytest.mark.parametrize("name, arrays, words", [
    ("mixed", dict(k=np.float32), ["q, k and v must share one dtype", "bfloat16", "float32"]),
    ("float16 + bfloat16", dict(v=np.float16), ["share one dtype", "float16"]),
    ("int8", dict(q=np.int8), ["q has dtype int8", "float16", "bfloat16"]),
    ("float8", dict(k=ml_dtypes.float8_e4m3fn), ["k has dtype float8_e4m3fn", "float16"]),
])
def test_bad_dtypes_name_the_argument(name, arrays, words):
    base = np.ones((2, 4, 8), ml_dtypes.bfloat16)
    qkv = {n: base.astype(arrays.get(n, ml_dtypes.bfloat16)) for n in "qkv"}
    for fn in (kernels.attention, lambda q, k, v: kernels.attention_backward(q, k, v, q)):
        with pytest.raises(TypeError) as info:
            fn(qkv["q"], qkv["k"], qkv["v"])
        for word in words:
            assert word in str(info.value), (word, str(info.value))


def test_without_ml_dtypes_bfloat16_is_unavailable_and_float16_works():
    code = (
        "import sys; sys.modules['ml_dtypes'] = None\n"
        "import numpy as np\n"
        "from attnbench import kernels\n"
        "from attnbench.kernels import _dtypes\n"
        "q = np.ones((2, 3, 4), np.float16)\n"
        "assert kernels.attention(q, q, q, backend='numba').dtype == np.float16\n"
        "try:\n"
        "    kernels.attention(q.astype(np.int8), q, q)\n"
        "except TypeError as e:\n"
        "    assert 'bfloat16 (unavailable here: install ml_dtypes)' in str(e), e\n"
        "try:\n"
        "    _dtypes.as_dtype('bfloat16')\n"
        "except ValueError as e:\n"
        "    assert 'ml_dtypes' in str(e)\n"
        "else:\n"
        "    raise AssertionError('no error')\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=REPO)


# --- the multi-head layer and torch ------------------------------------------------------------


@pytest.mark.parametrize("dtype", HALF, ids=HALF_IDS)
def test_multi_head_attention_in_half_precision(dtype):
    layer = kernels.MultiHeadAttention(32, 4, n_kv_heads=2, dtype=dtype, seed=0)
    assert all(p.dtype == dtype for p in layer.parameters().values())
    x = np.random.default_rng(0).standard_normal((2, 9, 32)).astype(dtype)
    y = layer(x, causal=True)
    assert y.dtype == dtype and y.shape == (2, 9, 32) and np.isfinite(y.astype(np.float32)).all()
    wide = kernels.MultiHeadAttention(32, 4, n_kv_heads=2, dtype=np.float32, seed=0)
    for name, p in wide.parameters().items():
        p[...] = layer.parameters()[name].astype(np.float32)
    ref = wide(x.astype(np.float32), causal=True)
    eps = float(ml_dtypes.finfo(dtype).eps)
    # The layer rounds its projections to the half dtype: a few ulps of the output's scale.
    assert np.max(np.abs(y.astype(np.float32) - ref)) <= 16 * eps * max(np.abs(ref).max(), 1)


@pytest.mark.parametrize("dtype", HALF, ids=HALF_IDS)
def test_multi_head_attention_backward_in_half_precision(dtype):
    """The layer's backward in half precision (bfloat16 once failed: ``dy @ W_o.T`` of
    ml_dtypes arrays is float32): every gradient in the half dtype, near the float32
    layer's with the same parameters (products in float32, each rounded once to half)."""
    layer = kernels.MultiHeadAttention(32, 4, n_kv_heads=2, dtype=dtype, seed=0, bias=True)
    rng = np.random.default_rng(1)
    x = rng.standard_normal((2, 9, 32)).astype(dtype)
    dy = rng.standard_normal((2, 9, 32)).astype(dtype)
    dx, grads = layer.backward(x, dy, causal=True)
    wide = kernels.MultiHeadAttention(32, 4, n_kv_heads=2, dtype=np.float32, seed=0, bias=True)
    for name, p in wide.parameters().items():
        p[...] = layer.parameters()[name].astype(np.float32)
    want_dx, want = wide.backward(x.astype(np.float32), dy.astype(np.float32), causal=True)
    eps = float(ml_dtypes.finfo(dtype).eps)
    for name, got, ref in [("dx", dx, want_dx)] + [(n, grads[n], want[n]) for n in want]:
        assert got.dtype == dtype, name
        err = np.max(np.abs(got.astype(np.float32) - ref))
        assert err <= 16 * eps * max(np.abs(ref).max(), 1), (name, err)


@pytest.mark.parametrize("dtype", HALF, ids=HALF_IDS)
def test_parity_with_torch_sdpa_on_the_cpu(dtype):
    torch = pytest.importorskip("torch")
    q, k, v, _ = make_inputs(Case("x", B=2, H=4, Lq=33, Lk=47, D=16), dtype)
    (exact, _), (plain, _) = oracle(q, k, v, causal="bottom-right")
    tdt = torch.float16 if dtype == np.float16 else torch.bfloat16
    t = [torch.from_numpy(x.astype(np.float32)).to(tdt) for x in (q, k, v)]
    mask = torch.ones(33, 47, dtype=torch.bool).tril(47 - 33)
    ref = torch.nn.functional.scaled_dot_product_attention(*t, attn_mask=mask)
    ref = ref.float().numpy()
    out = kernels.attention(q, k, v, causal="bottom-right", backend="numba")
    from attnbench.measure.oracle import tolerance

    tol = tolerance(exact, plain, dtype)
    assert max_error(out, exact) <= tol
    assert max_error(ref.astype(dtype), exact) <= tol  # torch is within the same rule


# The cuda backend in half precision (forward, backward, PTX): tests/test_cuda_half.py.


# Each mod in one half dtype (pairwise): a kernel per (mod, dtype) costs ~15 s to compile,
# and the mod's code is the same float32 code in both (only the loads and stores differ,
# which every other test here covers in both dtypes).
@pytest.mark.parametrize("mods_kwargs, dtype", [
    pytest.param(lambda m: dict(mask_mod=m.sliding_window(8), causal=True), HALF[0],
                 id=f"window-{HALF_IDS[0]}"),
    pytest.param(lambda m: dict(score_mod=m.alibi(np.array([0.5, 0.25]))), HALF[1],
                 id=f"alibi-{HALF_IDS[1]}"),
])
def test_score_and_mask_functions_in_half_precision(mods_kwargs, dtype):
    """Mods are compiled for the compute dtype (float32), forward and backward."""
    q, k, v, _ = make_inputs(Case("x", H=2, Lq=40, D=16), dtype)
    kwargs = mods_kwargs(kernels.mods)
    assert_matches_reference(q, k, v, "numba", **kwargs)
    assert_gradients_match(q, k, v, "numba", **kwargs)


@pytest.mark.parametrize("bits", [np.int16, np.uint16], ids=["float16", "bfloat16"])
def test_rounding_to_half_bits_compiles_without_numba_warnings(bits):
    """A kernel that stores a half element compiles with no warning from Numba's internal
    checks (``NumbaIRAssumptionWarning``, "please report": bfloat16's rounding inlined into
    ``narrow`` tripped it on every first compile of a bfloat16 backward, in
    ``store_key_block``); the rounding is to nearest even, as ml_dtypes rounds."""
    import warnings

    from numba import njit
    from numba.core.errors import NumbaWarning

    from attnbench.kernels._jit.math import FASTMATH
    from attnbench.kernels.numba_cpu.dense.backward_tiles import store_key_block

    # the backward's dk and dv stores, compiled here whatever Numba's cache holds
    store = njit(fastmath=FASTMATH)(store_key_block.py_func)

    x = np.array([[1.0, -2.5e-3, 3.14159, 3e4], [1e-40, np.inf, np.nan, -7.0]], np.float32)
    dk, dv = np.empty((1, 1) + x.shape, bits), np.empty((1, 1) + x.shape, bits)
    with warnings.catch_warnings():
        warnings.simplefilter("error", NumbaWarning)
        store(x, 2 * x, dk, dv, 0, 0, 0, np.float32(1))
    half = np.float16 if bits is np.int16 else ml_dtypes.bfloat16
    np.testing.assert_array_equal(dk[0, 0].view(half), x.astype(half))
    np.testing.assert_array_equal(dv[0, 0].view(half), (2 * x).astype(half))
