"""The cuda decode kernel in Numba's CUDA simulator (tiny shapes) against the oracle, and
compiled to PTX (no float64 instruction in the float32 kernels)."""

from __future__ import annotations

import numpy as np
import pytest

from attnbench import kernels
from tests.support import ptx_of_kernels
from tests.test_decode import _check_against_oracle, _decode_case

pytestmark = pytest.mark.cuda

COMPILE_ONLY = {"test_ptx_float32_decode_kernels_have_no_float64_instruction"}


@pytest.fixture(autouse=True)
def _needs_cuda(request):
    if request.node.originalname in COMPILE_ONLY:
        return
    if "cuda" not in kernels.available_backends():
        pytest.skip(kernels.cuda_status()[1])


#: (Lq, Lk, Lnew, H, Hkv, page_size, num_splits, dtype): tiny (one Python thread per CUDA
#: thread in the simulator), chunks of 32 keys crossed, ragged tails.
CASES = [
    pytest.param(1, 40, 1, 2, 1, None, 1, np.float32, id="mqa-contiguous"),
    pytest.param(2, 37, 2, 4, 2, 4, 3, np.float32, id="gqa-page4-split3"),
    pytest.param(3, 21, 0, 2, 2, 1, 0, np.float64, id="mha-page1-f64"),
]


@pytest.mark.parametrize("Lq, Lk, Lnew, H, Hkv, page_size, num_splits, dtype", CASES)
def test_cuda_decode_matches_the_oracle(Lq, Lk, Lnew, H, Hkv, page_size, num_splits, dtype):
    rng = np.random.default_rng(Lk)
    q, k_cache, v_cache, table, lengths, k_new, v_new = _decode_case(
        rng, Lq, Lk, Lnew, H, Hkv, page_size, dtype, B=2)
    out, lse, _, _ = _check_against_oracle("cuda", q, k_cache, v_cache, table, lengths, k_new,
                                           v_new, num_splits=num_splits)
    assert not np.isnan(out).any()  # NaN fills every slot past the sequences


def test_cuda_decode_refuses_mods_before_writing():
    rng = np.random.default_rng(0)
    q, k_cache, v_cache, table, lengths, k_new, v_new = _decode_case(rng, 1, 20, 1, 2, 1, None,
                                                                     np.float32, B=2)
    before = k_cache.copy()
    with pytest.raises(ValueError, match="mask_mod"):
        kernels.attention_with_kvcache(q, k_cache, v_cache, k_new, v_new,
                                       cache_seqlens=lengths, backend="cuda",
                                       mask_mod=kernels.mods.sliding_window(4))
    assert k_cache.tobytes() == before.tobytes()


def test_ptx_float32_decode_kernels_have_no_float64_instruction():
    result = ptx_of_kernels("cuda.decode")
    assert sorted(result) == sorted(f"decode_{kind}_{dtype}@sm_{cc}" for kind in ("splits", "merge")
                                    for dtype in ("float32", "float64") for cc in ("80", "90"))
    for name, info in result.items():
        assert info["target"] and info["entry"], name
        if "float32" in name:
            assert info["f64_lines"] == [], f"{name} has float64 instructions: {info['f64_lines']}"
        else:
            assert info["f64_lines"], f"{name} should compute in float64"
