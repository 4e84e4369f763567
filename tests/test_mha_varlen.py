"""MultiHeadAttention with learned sinks and packed input (issue 24).

A packed x (total, d_model) with ``cu_seqlens`` gives each sequence's forward alone, and
its gradients are the sums of the sequences' own; the sinks are one more parameter whose
gradient is checked against finite differences (float64, reference backend).
"""

from __future__ import annotations

import numpy as np
import pytest

from attnbench import kernels

LENGTHS = [5, 0, 9, 3]


def _packed(dtype, d_model=16, seed=0):
    rng = np.random.default_rng(seed)
    cu = np.concatenate([[0], np.cumsum(LENGTHS)])
    return rng.standard_normal((cu[-1], d_model)).astype(dtype), cu


@pytest.mark.parametrize("sinks", [False, True])
@pytest.mark.parametrize("backend", ["numba", "reference"])
def test_packed_forward_and_backward_are_each_sequence_alone(backend, sinks):
    layer = kernels.MultiHeadAttention(16, 4, n_kv_heads=2, dtype=np.float64, seed=1,
                                       sinks=sinks)
    if sinks:
        layer.parameters()["sinks"][:] = [0.5, -1.0, 2.0, 0.0]
    x, cu = _packed(np.float64)
    dy = np.random.default_rng(4).standard_normal(x.shape)
    y = layer.forward(x, cu_seqlens=cu, causal=True, backend=backend)
    dx, grads = layer.backward(x, dy, cu_seqlens=cu, causal=True, backend=backend)
    want_grads = {name: np.zeros_like(p) for name, p in layer.parameters().items()}
    for b in range(len(LENGTHS)):
        rows = slice(cu[b], cu[b + 1])
        if cu[b] == cu[b + 1]:
            continue
        alone = layer.forward(x[None, rows], causal=True, backend=backend)[0]
        np.testing.assert_allclose(y[rows], alone, rtol=1e-12, atol=1e-13)
        dx_b, g_b = layer.backward(x[None, rows], dy[None, rows], causal=True, backend=backend)
        np.testing.assert_allclose(dx[rows], dx_b[0], rtol=1e-11, atol=1e-12)
        for name in want_grads:
            want_grads[name] += g_b[name]
    assert set(grads) == set(layer.parameters())
    for name, g in grads.items():
        np.testing.assert_allclose(g, want_grads[name], rtol=1e-11, atol=1e-12, err_msg=name)


def test_sinks_are_a_parameter_with_a_gradient():
    layer = kernels.MultiHeadAttention(8, 2, dtype=np.float64, seed=2, sinks=True)
    params = layer.parameters()
    assert params["sinks"].shape == (2,)
    assert layer.num_parameters() == kernels.MultiHeadAttention(8, 2).num_parameters() + 2
    x = np.random.default_rng(0).standard_normal((2, 5, 8))
    dy = np.random.default_rng(1).standard_normal((2, 5, 8))
    _, grads = layer.backward(x, dy, causal=True, backend="reference")
    eps = 1e-6
    for h in range(2):
        params["sinks"][h] += eps
        up = (layer.forward(x, causal=True, backend="reference") * dy).sum()
        params["sinks"][h] -= 2 * eps
        down = (layer.forward(x, causal=True, backend="reference") * dy).sum()
        params["sinks"][h] += eps
        np.testing.assert_allclose(grads["sinks"][h], (up - down) / (2 * eps), rtol=1e-6)


def test_packed_input_is_checked():
    layer = kernels.MultiHeadAttention(8, 2)
    x = np.zeros((2, 5, 8), np.float32)
    with pytest.raises(ValueError, match="cu_seqlens must have shape"):
        layer.forward(x, cu_seqlens=[0, 5])
    with pytest.raises(ValueError, match="mask and key_lengths"):
        layer.forward(x[0], cu_seqlens=[0, 5], key_lengths=[3])
    with pytest.raises(ValueError, match="cu_seqlens_q ends at 4"):
        layer.forward(x[0], cu_seqlens=[0, 4])
