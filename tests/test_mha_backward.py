"""``MultiHeadAttention.backward`` and the backward guide's training example."""

import re
from pathlib import Path

import numpy as np
import pytest

from attnbench import kernels


def _layer_and_input(dtype=np.float64, n_kv_heads=2, bias=True):
    layer = kernels.MultiHeadAttention(8, 4, n_kv_heads=n_kv_heads, bias=bias, dtype=dtype,
                                       seed=1)
    rng = np.random.default_rng(2)
    for p in layer.parameters().values():  # non-zero biases, so their gradients matter
        p += rng.standard_normal(p.shape).astype(dtype) * 0.1
    x = rng.standard_normal((2, 5, 8)).astype(dtype)
    dy = rng.standard_normal((2, 5, 8)).astype(dtype)
    return layer, x, dy


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("kwargs", [dict(), dict(causal=True), dict(key_lengths=[5, 3])],
                         ids=["plain", "causal", "key_lengths"])
def test_gradients_match_finite_differences(kwargs, bias):
    layer, x, dy = _layer_and_input(bias=bias)
    dx, grads = layer.backward(x, dy, backend="reference", **kwargs)
    assert set(grads) == set(layer.parameters())

    def loss():
        return float((dy * layer(x, backend="reference", **kwargs)).sum())

    eps = 1e-6
    for name, array in [("x", x)] + list(layer.parameters().items()):
        grad = dx if name == "x" else grads[name]
        assert grad.shape == array.shape
        numeric = np.zeros_like(array)
        for idx in np.ndindex(array.shape):
            saved = array[idx]
            array[idx] = saved + eps
            up = loss()
            array[idx] = saved - eps
            down = loss()
            array[idx] = saved
            numeric[idx] = (up - down) / (2 * eps)
        assert np.abs(grad - numeric).max() <= 1e-6 * max(np.abs(numeric).max(), 1), name


def test_numba_and_reference_agree():
    layer, x, dy = _layer_and_input(np.float32)
    dx_n, grads_n = layer.backward(x, dy, causal=True, backend="numba")
    dx_r, grads_r = layer.backward(x, dy, causal=True, backend="reference")
    np.testing.assert_allclose(dx_n, dx_r, rtol=1e-4, atol=1e-5)
    for name in grads_r:
        assert grads_n[name].dtype == np.float32
        np.testing.assert_allclose(grads_n[name], grads_r[name], rtol=1e-4, atol=1e-5)


def test_bad_dy_is_rejected():
    layer, x, dy = _layer_and_input()
    with pytest.raises(ValueError, match="dy"):
        layer.backward(x, dy[:, :3])
    with pytest.raises(TypeError, match="dy"):
        layer.backward(x, dy.astype(np.float32))


def test_training_example_runs_and_the_loss_falls(capsys):
    """docs/guide/backward.md's training example, run as written: its loss must fall."""
    guide = (Path(__file__).resolve().parents[1] / "docs" / "guide" / "backward.md").read_text()
    match = re.search(r"<!-- training example -->\s*```python\n(.*?)```", guide, re.S)
    assert match, "docs/guide/backward.md has no training example"
    namespace = {}
    exec(compile(match.group(1), "backward.md", "exec"), namespace)
    losses = namespace["losses"]
    assert len(losses) >= 10 and losses[-1] < 0.5 * losses[0]
    assert "loss" in capsys.readouterr().out
