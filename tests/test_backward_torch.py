"""Gradient parity with ``torch.autograd`` through ``scaled_dot_product_attention`` (CPU).

Skipped without torch.  Same cases as ``tests/test_torch_parity.py`` (the forward): masks
where every row sees a key (PyTorch gives NaN otherwise), is_causal, scale, GQA.
"""

import numpy as np
import pytest

from attnbench import kernels
from attnbench.measure.oracle import tolerance

from .backward_support import backward_oracle, make_dout
from .test_torch_parity import CASES

torch = pytest.importorskip("torch")
F = torch.nn.functional


@pytest.mark.parametrize("backend", ["numba", "reference"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=["float32", "float64"])
@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_gradients_match_torch_autograd(case, dtype, backend):
    _, B, H, Hkv, Lq, Lk, D, mask_kind, is_causal, scale = case
    rng = np.random.default_rng(0)
    q = rng.standard_normal((B, H, Lq, D)).astype(dtype)
    k = rng.standard_normal((B, Hkv, Lk, D)).astype(dtype)
    v = rng.standard_normal((B, Hkv, Lk, D)).astype(dtype)
    dout = make_dout(q, v)
    mask = None
    if mask_kind == "bool":
        mask = rng.random((B, 1, Lq, Lk)) < 0.6
        mask[..., 0] = True
    elif mask_kind == "float":
        mask = rng.standard_normal((Lq, Lk)).astype(dtype)
    kwargs = dict(mask=mask, causal=is_causal, scale=scale)
    ours = kernels.attention_backward(q, k, v, dout, backend=backend, **kwargs)

    tq, tk, tv = (torch.from_numpy(x).requires_grad_() for x in (q, k, v))
    out = F.scaled_dot_product_attention(
        tq, tk, tv, attn_mask=None if mask is None else torch.from_numpy(mask),
        is_causal=is_causal, scale=scale, enable_gqa=H != Hkv)
    out.backward(torch.from_numpy(dout))
    theirs = [x.grad.numpy() for x in (tq, tk, tv)]

    exact, plain = backward_oracle(q, k, v, dout, **kwargs)
    for name, a, b, e, p in zip(("dq", "dk", "dv"), ours, theirs, exact, plain, strict=True):
        assert np.abs(a - b).max() <= 2 * tolerance(e, p, dtype), name
