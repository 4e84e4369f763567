"""Half precision on the cuda backend (issue 25): float16 and bfloat16 q, k, v.

In Numba's CUDA simulator where no GPU exists, with tiny shapes and 4-thread blocks (so that
L = 5 or 7 spans several query and key tiles with ragged tails), as ``tests/test_cuda.py``:

- differential: forward and backward against the float64 oracle over the half inputs, under
  the half tolerance rule of ``tests/test_half.py`` (``attnbench.measure.oracle``);
- dtypes: out, weights, dq, dk, dv in the input dtype, lse float32; a float mask in the
  input dtype or float32; a float16 score above 65504 stays a finite float32 score;
- the device-array entry point with half device arrays (the weights rounded on the device);
- PTX: the float16 and bfloat16 kernels compile (simulator off, in a subprocess) with no
  ``.f64`` instruction and with their conversions;
- the cuda decode step with half caches against the oracle (lse float32, the new tokens'
  bits as given) and beside numba's with sinks.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

pytest.importorskip("numba.cuda", reason="numba-cuda is missing: pip install attnbench[cuda]")

from attnbench import kernels  # noqa: E402
from attnbench.kernels.cuda import launch as cuda_backend  # noqa: E402

from .backward_support import assert_gradients_match, make_dout  # noqa: E402
from .support import (  # noqa: E402
    Case,
    assert_matches_reference,
    make_inputs,
    run_ptx_script,
    small_cuda_tiles,
)
from .test_decode import _check_against_oracle, _decode_case  # noqa: E402

pytestmark = pytest.mark.cuda

HALF = (np.dtype(np.float16), np.dtype(ml_dtypes.bfloat16))
HALF_IDS = ["float16", "bfloat16"]

#: Tests that compile the kernels without running them: no GPU or simulator needed.
COMPILE_ONLY = {"test_ptx_half_kernels_have_no_float64_instruction"}


@pytest.fixture(autouse=True)
def small_tiles(request, monkeypatch):
    """Skip where the backend cannot run; 4-thread blocks and 4-key tiles where it can."""
    small_cuda_tiles(request, monkeypatch, COMPILE_ONLY)


BASE = dict(B=1, H=2, Lq=5, Lk=7, D=4)
CASES = [
    Case("plain", **BASE),
    Case("causal", **BASE, causal=True),
    Case("bottom-right", **BASE, causal="bottom-right"),
    Case("key-lengths", **dict(BASE, B=2), key_lengths="with-zero"),
    Case("bool-mask", **BASE, mask="bool"),
    Case("float-mask", **BASE, mask="float"),  # in the input dtype
    Case("empty-rows", **BASE, mask="empty-rows"),
    Case("gqa-4-2", **dict(BASE, H=4), Hkv=2),
    Case("unscaled-dv-differs", **BASE, Dv=3, scale=1.0),
    Case("dropout", **BASE, dropout_p=0.3),
    Case("everything", **dict(BASE, B=2, H=4), Hkv=2, causal="bottom-right", mask="float",
         key_lengths="random", dropout_p=0.25),
]


@pytest.mark.parametrize("dtype", HALF, ids=HALF_IDS)
@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_forward_matches_the_oracle(case, dtype):
    q, k, v, kwargs = make_inputs(case, dtype)
    assert_matches_reference(q, k, v, "cuda", **kwargs)


@pytest.mark.parametrize("dtype", HALF, ids=HALF_IDS)
@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_gradients_match_the_oracle(case, dtype):
    q, k, v, kwargs = make_inputs(case, dtype)
    assert_gradients_match(q, k, v, "cuda", **kwargs)


@pytest.mark.parametrize("dtype", HALF, ids=HALF_IDS)
def test_a_float_mask_in_float32_for_half_inputs(dtype):
    q, k, v, _ = make_inputs(Case("x", **BASE), dtype)
    rng = np.random.default_rng(3)
    mask = np.where(rng.random((5, 7)) < 0.7, rng.standard_normal((5, 7)), -np.inf)
    mask = mask.astype(np.float32)
    mask[:, 0] = 0.125  # every row sees a key
    assert_matches_reference(q, k, v, "cuda", mask=mask)
    assert_gradients_match(q, k, v, "cuda", mask=mask)


@pytest.mark.parametrize("dtype", HALF, ids=HALF_IDS)
def test_results_have_the_input_dtype_and_lse_is_float32(dtype):
    q, k, v, kwargs = make_inputs(Case("x", **BASE, causal=True), dtype)
    out, weights, lse = kernels.attention(q, k, v, backend="cuda", return_weights=True,
                                          return_lse=True, **kwargs)
    assert out.dtype == dtype and weights.dtype == dtype and lse.dtype == np.float32
    grads = kernels.attention_backward(q, k, v, make_dout(q, v), out=out, lse=lse,
                                       backend="cuda", **kwargs)
    assert [g.dtype for g in grads] == [dtype] * 3


@pytest.mark.parametrize("dtype", HALF, ids=HALF_IDS)
def test_stores_round_to_nearest_even(dtype):
    """One key: the output is v itself (weight 1), every bit of it.  Two keys of equal
    weight: the output (a + b) / 2 is exact in float32; for a = 1 + u and b = 1 + 2u (u the
    half ulp at 1) it is the tie 1 + 1.5u, rounded to the even 1 + 2u (truncation gives
    1 + u), and for b = 1 + 4u the tie 1 + 2.5u, also rounded to 1 + 2u (rounding half up
    gives 1 + 3u)."""
    rng = np.random.default_rng(5)
    q = rng.standard_normal((1, 1, 3, 4)).astype(dtype)
    k = rng.standard_normal((1, 1, 1, 4)).astype(dtype)
    v = (rng.standard_normal((1, 1, 1, 8)) * 1e3).astype(dtype)
    out = kernels.attention(q, k, v, backend="cuda")
    np.testing.assert_array_equal(out.view(np.uint16),
                                  np.broadcast_to(v, out.shape).view(np.uint16))
    u = float(ml_dtypes.finfo(dtype).eps)
    v = np.array([[1 + u, 1 + u], [1 + 2 * u, 1 + 4 * u]], np.float64).astype(dtype)
    out = kernels.attention(np.zeros((1, 1, 1, 2), dtype), np.zeros((1, 1, 2, 2), dtype),
                            v.reshape(1, 1, 2, 2), backend="cuda")
    np.testing.assert_array_equal(out.reshape(2).astype(np.float64), [1 + 2 * u, 1 + 2 * u])


def test_a_float16_score_above_65504_stays_a_finite_float32_score():
    q = np.full((1, 1, 3, 2), 200, np.float16)
    k = np.full((1, 1, 5, 2), 200, np.float16)
    k[0, 0, 2] = 201  # scores 80000 and 80400: beyond float16, not beyond float32
    v = np.arange(10, dtype=np.float16).reshape(1, 1, 5, 2)
    out, lse = kernels.attention(q, k, v, scale=1.0, backend="cuda", return_lse=True)
    assert np.isfinite(out).all() and np.isfinite(lse).all()
    np.testing.assert_array_equal(out, np.broadcast_to(v[0, 0, 2], out.shape))  # key 2 wins
    assert lse[0, 0, 0] == np.float32(200 * 201 * 2)


@pytest.mark.parametrize("dtype", HALF, ids=HALF_IDS)
def test_nan_in_hidden_keys_and_values_changes_no_bit(dtype):
    q, k, v, _ = make_inputs(Case("x", B=2, H=2, Lq=5, Lk=7, D=4), dtype)
    dout = make_dout(q, v)
    kwargs = dict(key_lengths=np.array([4, 7]), causal="bottom-right")

    def run(k, v):
        out, lse = kernels.attention(q, k, v, backend="cuda", return_lse=True, **kwargs)
        return (out, lse) + kernels.attention_backward(q, k, v, dout, out=out, lse=lse,
                                                        backend="cuda", **kwargs)

    before = run(k, v)
    k2, v2 = k.copy(), v.copy()
    k2[0, :, 4:] = np.nan
    v2[0, :, 4:] = np.inf
    for b, a in zip(before, run(k2, v2), strict=True):
        np.testing.assert_array_equal(b.view(np.uint16) if b.itemsize == 2 else b,
                                      a.view(np.uint16) if a.itemsize == 2 else a)


@pytest.mark.parametrize("dtype", HALF, ids=HALF_IDS)
def test_score_and_mask_functions_in_half_precision(dtype):
    """The mods kernels share the half loads and stores, forward and backward."""
    q, k, v, _ = make_inputs(Case("x", H=2, Lq=6, Lk=7, D=4), dtype)
    for kwargs in (dict(mask_mod=kernels.mods.sliding_window(3), causal=True),
                   dict(score_mod=kernels.mods.alibi(np.array([0.5, 0.25])))):
        assert_matches_reference(q, k, v, "cuda", **kwargs)
        assert_gradients_match(q, k, v, "cuda", **kwargs)


@pytest.mark.parametrize("dtype", HALF, ids=HALF_IDS)
def test_attention_device_takes_half_device_arrays(dtype):
    from numba import cuda

    case = Case("device", B=2, H=4, Hkv=2, Lq=5, Lk=6, D=3, Dv=4, causal=True, mask="bool",
                key_lengths="random")
    q, k, v, kwargs = make_inputs(case, dtype)
    expected_out, expected_w = cuda_backend.run(
        kernels.prepare(q, k, v, return_weights=True, **kwargs))
    assert expected_out.dtype == dtype and expected_w.dtype == dtype
    q_dev, k_dev, v_dev = (cuda.to_device(x) for x in (q, k, v))
    out, weights = cuda_backend.attention_device(q_dev, k_dev, v_dev, return_weights=True,
                                                 **kwargs)
    assert out.dtype == dtype and weights.dtype == dtype  # weights rounded on the device
    for got, expected in ((out, expected_out), (weights, expected_w)):
        np.testing.assert_array_equal(got.copy_to_host().view(np.uint16),
                                      expected.view(np.uint16))
    launch, out_given = cuda_backend.prepare_launch(q_dev, k_dev, v_dev, **kwargs)
    launch()
    np.testing.assert_array_equal(out_given.copy_to_host().view(np.uint16),
                                  expected_out.view(np.uint16))


#: (Lq, Lk, Lnew, H, Hkv, page_size, num_splits): tiny decode steps (a Python thread per
#: CUDA thread in the simulator) crossing the 32-key chunks, paged and contiguous, GQA.
DECODE_CASES = [
    pytest.param(1, 40, 1, 4, 2, 4, 3, id="gqa-page4-split3"),
    pytest.param(2, 37, 2, 2, 2, None, 1, id="mha-contiguous-Lnew2"),
]


@pytest.mark.parametrize("Lq, Lk, Lnew, H, Hkv, page_size, num_splits", DECODE_CASES)
@pytest.mark.parametrize("dtype", HALF, ids=HALF_IDS)
def test_cuda_decode_half_matches_the_oracle(dtype, Lq, Lk, Lnew, H, Hkv, page_size,
                                             num_splits):
    """attention_with_kvcache on cuda with half caches: out in the half dtype within the half
    tolerance of the float64 oracle, lse float32, the new tokens' bits written as given."""
    rng = np.random.default_rng(Lk)
    q, k_cache, v_cache, table, lengths, k_new, v_new = _decode_case(
        rng, Lq, Lk, Lnew, H, Hkv, page_size, dtype, B=2)
    out, lse, kc, _ = _check_against_oracle("cuda", q, k_cache, v_cache, table, lengths,
                                            k_new, v_new, num_splits=num_splits)
    assert out.dtype == dtype and lse.dtype == np.float32
    assert not np.isnan(out.astype(np.float32)).any()
    ps = k_cache.shape[2]
    for b in range(q.shape[0]):
        positions = lengths[b] + np.arange(Lnew)
        pages = np.full(Lnew, b) if table is None else table[b, positions // ps]
        assert kc[pages, :, positions % ps].tobytes() == k_new[b].transpose(1, 0, 2).tobytes()


@pytest.mark.parametrize("dtype", HALF, ids=HALF_IDS)
def test_cuda_half_decode_agrees_with_numba_and_takes_sinks(dtype):
    """The same half step with sinks on cuda and numba: both within the oracle's half
    tolerance (the sinks merged after the kernel), and within a few half ulps of each other."""
    rng = np.random.default_rng(7)
    q, k_cache, v_cache, table, lengths, _, _ = _decode_case(rng, 1, 45, 0, 4, 1, 8, dtype, B=2)
    sinks = (rng.standard_normal(4) * 2).astype(dtype)
    cuda_out = _check_against_oracle("cuda", q, k_cache, v_cache, table, lengths, None, None,
                                     num_splits=2, sinks=sinks)[0]
    numba_out = _check_against_oracle("numba", q, k_cache, v_cache, table, lengths, None, None,
                                      num_splits=2, sinks=sinks)[0]
    gap = np.abs(cuda_out.astype(np.float64) - numba_out.astype(np.float64))
    ulp = np.spacing(np.abs(numba_out.astype(np.float32)).astype(dtype)).astype(np.float64)
    assert (gap <= 2 * ulp).all(), f"cuda and numba differ by up to {(gap / ulp).max()} ulps"


# --- PTX: the real compiler, without a GPU ------------------------------------------------

def test_ptx_half_kernels_have_no_float64_instruction():
    result = run_ptx_script("""
from attnbench.kernels._dtypes import HALF_DTYPES
from attnbench.kernels.cuda import backward, decode, source
result = {}
for module in (source, backward, decode):
    for name, ptx in module.compile_ptx_all((8, 0), HALF_DTYPES).items():
        lines = [line.strip() for line in ptx.splitlines()]
        result[name] = {
            "entry": ".entry" in ptx,
            "f64_lines": [line for line in lines if ".f64" in line],
            "f16_loads": any(line.startswith("cvt.f32.f16") for line in lines),
            "f16_stores": any(line.startswith("cvt.rn.f16.f32") for line in lines),
            "u16_loads": any(line.startswith("ld.global.u16") for line in lines),
            "u16_stores": any(line.startswith("st.global.u16") for line in lines),
            "bf16_shifts": any(line.startswith("shl.b32") and line.endswith(", 16;")
                               for line in lines),
        }
print(json.dumps(result))
""")
    kinds = ("attention", "dkdv", "dq", "decode_splits", "decode_merge")
    assert sorted(result) == sorted(f"{kind}_{dtype}" for kind in kinds for dtype in HALF_IDS)
    for name, info in result.items():
        assert info["entry"], name
        assert info["f64_lines"] == [], f"{name} has float64 instructions: {info['f64_lines']}"
        # decode's split kernel only reads half arrays, its merge kernel only writes them
        loads, stores = "decode_merge" not in name, "decode_splits" not in name
        assert info["u16_loads"] == loads and info["u16_stores"] == stores, (name, info)
        is_f16 = name.endswith("_float16")
        assert info["f16_loads"] == (is_f16 and loads), (name, info)
        assert info["f16_stores"] == (is_f16 and stores), (name, info)
        if not is_f16 and loads:
            assert info["bf16_shifts"], f"{name} does not widen bfloat16 by a 16-bit shift"
