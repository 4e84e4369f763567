"""Parity with PyTorch's scaled_dot_product_attention on the CPU (skipped without torch).

Install the pinned CPU build with ``pip install -e ".[torch]"``.  Rows with no visible
key are left out of masks here: PyTorch returns NaN for them, attnbench returns 0
(a documented difference).
"""

import numpy as np
import pytest

from attnbench import kernels

from .support import oracle, tolerance

torch = pytest.importorskip("torch")
F = torch.nn.functional

CASES = [
    # (name, B, H, Hkv, Lq, Lk, D, mask kind, is_causal, scale)
    ("plain", 2, 4, 4, 33, 33, 16, None, False, None),
    ("bool mask", 2, 4, 4, 17, 29, 8, "bool", False, None),
    ("float mask", 1, 2, 2, 17, 29, 8, "float", False, None),
    ("is_causal", 2, 4, 4, 40, 40, 16, None, True, None),
    ("is_causal Lq<Lk", 1, 2, 2, 9, 20, 8, None, True, None),
    ("scale=1", 1, 2, 2, 20, 20, 64, None, False, 1.0),
    ("GQA 8/2", 2, 8, 2, 19, 23, 16, "bool", False, None),
    ("MQA 4/1 causal", 1, 4, 1, 30, 30, 8, None, True, 0.3),
]


@pytest.mark.parametrize("backend", ["numba", "reference"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=["float32", "float64"])
@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_matches_torch_sdpa(case, dtype, backend):
    _, B, H, Hkv, Lq, Lk, D, mask_kind, is_causal, scale = case
    rng = np.random.default_rng(0)
    q = rng.standard_normal((B, H, Lq, D)).astype(dtype)
    k = rng.standard_normal((B, Hkv, Lk, D)).astype(dtype)
    v = rng.standard_normal((B, Hkv, Lk, D)).astype(dtype)
    mask = None
    if mask_kind == "bool":
        mask = rng.random((B, 1, Lq, Lk)) < 0.6
        mask[..., 0] = True  # every row sees a key (torch gives NaN otherwise)
    elif mask_kind == "float":
        mask = rng.standard_normal((Lq, Lk)).astype(dtype)
    ours = kernels.attention(q, k, v, mask=mask, causal=is_causal, scale=scale, backend=backend)
    theirs = F.scaled_dot_product_attention(
        *(torch.from_numpy(x) for x in (q, k, v)),
        attn_mask=None if mask is None else torch.from_numpy(mask),
        is_causal=is_causal, scale=scale, enable_gqa=H != Hkv,
    ).numpy()
    (exact, _), (plain, _) = oracle(q, k, v, mask=mask, causal=is_causal, scale=scale)
    tol = tolerance(exact, plain, dtype)
    assert np.abs(ours - theirs).max() <= 2 * tol


# --- the torch peer adapter (attnbench.measure.peers) ----------------------------------------

from attnbench.measure import peers  # noqa: E402
from attnbench.measure.problems import ProblemSpec, make_inputs  # noqa: E402

from .test_peers import ADAPTER_CASES, _visible_rows_only  # noqa: E402


@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=["float32", "float64"])
@pytest.mark.parametrize("spec", [spec for _, spec in ADAPTER_CASES],
                         ids=[name for name, _ in ADAPTER_CASES])
def test_torch_peer_solves_the_same_problem(spec, dtype):
    q, k, v, kwargs = make_inputs(spec, dtype, seed=3)
    expected = kernels.attention(q, k, v, backend="reference", **kwargs)
    got = peers.make_call("torch", q, k, v, kwargs)()
    rows = _visible_rows_only(q, k, v, kwargs)
    tol = 1e-5 if dtype == np.float32 else 1e-12
    np.testing.assert_allclose(got[rows], expected[rows], atol=tol, rtol=tol)


def test_torch_adapter_keeps_sdpas_fast_path_for_top_left_causal():
    q, k, v, _ = make_inputs(ProblemSpec(Lq=6, D=4), np.float32)
    _, _, _, sdpa = peers.torch_sdpa_arguments(q, k, v, {"causal": True})
    assert sdpa["is_causal"] and sdpa["attn_mask"] is None
    _, _, _, sdpa = peers.torch_sdpa_arguments(q, k, v, {"causal": "bottom-right"})
    assert sdpa["is_causal"]  # Lq = Lk: bottom-right is top-left
