"""Each peer adapter against the reference, on exactly the arguments peers used to get wrong.

A peer comparison is only meaningful if the peer solves the same problem: every
argument of kernels.attention is passed with its meaning (bottom-right causal with
Lq != Lk, a mask together with key_lengths, a float mask, a scale) or refused with
UnsupportedByPeer. The torch adapter's cases are in test_torch_parity.py (skipped
without torch).
"""

import numpy as np
import pytest

from attnbench import kernels
from attnbench.measure import peers
from attnbench.measure.problems import ProblemSpec, make_inputs

#: (name, spec): cases where a careless adapter computes another problem.
ADAPTER_CASES = [
    ("bottom-right Lq<Lk", ProblemSpec(B=2, H=2, Lq=5, Lk=11, D=8, causal="bottom-right")),
    ("top-left Lq<Lk", ProblemSpec(B=1, H=2, Lq=5, Lk=11, D=8, causal=True)),
    ("mask + key_lengths", ProblemSpec(B=2, H=2, Lq=9, Lk=13, D=8, mask="bool",
                                       key_lengths="random")),
    ("causal + key_lengths", ProblemSpec(B=2, H=2, Lq=9, D=8, causal=True,
                                         key_lengths="random")),
    ("float mask + causal", ProblemSpec(B=1, H=2, Lq=9, D=8, mask="float", causal=True)),
    ("GQA + scale + padding", ProblemSpec(B=2, H=4, Hkv=2, Lq=7, Lk=10, D=8, scale=0.7,
                                          mask="padding")),
]


def _visible_rows_only(q, k, v, kwargs):
    """Rows that see at least one key (a plain formula gives NaN for the others)."""
    problem = kernels.prepare(q, k, v, **kwargs)
    return problem.visible().any(axis=-1)  # (B, H, Lq)


def _adapter_cases():
    for name, spec in ADAPTER_CASES:
        for dtype in (np.float32, np.float64):
            yield pytest.param(spec, dtype, id=f"{name}-{np.dtype(dtype).name}")


@pytest.mark.parametrize("spec, dtype", list(_adapter_cases()))
def test_numpy_peer_solves_the_same_problem(spec, dtype):
    q, k, v, kwargs = make_inputs(spec, dtype, seed=3)
    expected = kernels.attention(q, k, v, backend="reference", **kwargs)
    got = peers.make_call("numpy", q, k, v, kwargs)()
    rows = _visible_rows_only(q, k, v, kwargs)
    tol = 1e-5 if dtype == np.float32 else 1e-12
    np.testing.assert_allclose(got[rows], expected[rows], atol=tol, rtol=tol)


def test_bottom_right_is_not_read_as_top_left():
    """The bug the one adapter fixed: bool(causal) turned 'bottom-right' into top-left."""
    q, k, v, kwargs = make_inputs(ProblemSpec(Lq=3, Lk=8, causal="bottom-right"), np.float64)
    top_left = kernels.attention(q, k, v, causal=True, backend="reference")
    got = peers.numpy_attention(q, k, v, **kwargs)
    assert not np.allclose(got, top_left)
    np.testing.assert_allclose(got, kernels.attention(q, k, v, backend="reference", **kwargs),
                               atol=1e-12)


def test_visibility_combines_every_mask():
    kwargs = {"causal": "bottom-right", "mask": np.array([[True, False, True, True]]),
              "key_lengths": np.array([3])}
    visible = peers.visibility(2, 4, kwargs)
    # bottom-right, Lq=2, Lk=4: row 0 sees keys <= 2, row 1 sees keys <= 3; then the mask
    # hides key 1 and the key length hides key 3.
    assert visible.reshape(2, 4).tolist() == [[True, False, True, False],
                                              [True, False, True, False]]
    assert peers.visibility(2, 4, {}) is None


@pytest.mark.parametrize("peer", ["numpy", "torch"])
def test_dropout_is_refused_not_ignored(peer):
    if not peers.peer_status(peer)[0]:
        pytest.skip(f"{peer} is not installed")
    q, k, v, kwargs = make_inputs(ProblemSpec(dropout_p=0.1), np.float32)
    with pytest.raises(peers.UnsupportedByPeer, match="dropout"):
        peers.make_call(peer, q, k, v, kwargs)
