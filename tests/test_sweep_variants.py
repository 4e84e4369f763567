"""Sweep points of the backward pass and of attention variants: rows, FLOPs, checks, skips."""

import numpy as np
import pytest

from attnbench import kernels
from attnbench.measure import peers
from attnbench.measure.flops import attention_flops, backward_flops
from attnbench.sweep.calls import make_inputs
from attnbench.sweep.grid import Point
from attnbench.sweep.runner import PointRunner
from attnbench.sweep.variants import (
    alibi_slopes,
    document_ids,
    peer_kwargs,
    variant_kwargs,
    window_size,
)

HAS_TORCH = peers.peer_status("torch")[0]


def quick_runner():
    return PointRunner(max_time=0.002, gemm_peaks={"float32": 100.0, "float64": 50.0},
                       settle=0.0)


@pytest.fixture(scope="module")
def runner():
    return quick_runner()


def point(backend, L=16, mask="none", dtype="float32", direction="forward", variant="none"):
    return Point(backend, L, 8, 2, 1, 1, mask, dtype, direction, variant)


NEEDS_TORCH = pytest.mark.skipif(not HAS_TORCH, reason="torch not installed")


@pytest.mark.parametrize("backend, dtype", [("numba", "float32"), ("reference", "float64"),
                                            pytest.param("torch", "float32", marks=NEEDS_TORCH)])
def test_backward_points_time_the_gradients_and_check_them(runner, backend, dtype):
    row = runner(point(backend, mask="causal", dtype=dtype, direction="backward"))
    assert row["status"] == "ok", row["reason"]
    assert row["direction"] == "backward"
    assert row["flops"] == backward_flops(1, 2, 16, 16, 8, causal=True)
    assert row["flops"] * 2 == attention_flops(1, 2, 16, 16, 8, causal=True) * 5
    assert row["median_ms"] > 0
    assert row["peak_mem_bytes"] > 0 or backend == "torch"  # torch's: a rise of RSS, maybe 0
    assert row["within_tolerance"] and 0 <= row["max_abs_err"] <= row["tolerance"]
    assert "worst" in row["oracle"]  # which of dq, dk, dv came closest to its tolerance


def test_a_wrong_gradient_is_outside_the_tolerance(runner, monkeypatch):
    real = kernels.attention_backward

    def off_by_a_bit(*args, **kwargs):
        dq, dk, dv = real(*args, **kwargs)
        return dq, dk, dv * np.float32(1.001)

    monkeypatch.setattr(kernels, "attention_backward", off_by_a_bit)
    row = quick_runner()(point("numba", L=17, direction="backward"))
    assert row["status"] == "ok" and not row["within_tolerance"]


def test_the_numpy_peer_has_no_backward_and_is_skipped_with_the_reason(runner):
    row = runner(point("numpy", direction="backward"))
    assert row["status"] == "skipped" and "no backward" in row["reason"]


def test_a_variant_counts_only_the_pairs_its_mask_function_leaves_visible(runner):
    p = point("numba", L=40, mask="causal", variant="window-5")
    row = runner(p)
    assert row["status"] == "ok", row["reason"]
    assert row["within_tolerance"]
    q, k, v, kwargs = make_inputs(p)
    problem = kernels.prepare(q, k, v, **kwargs, **variant_kwargs(p.variant, 2, 40))
    pairs = int(problem.visible().sum())  # kernels' own visibility
    assert row["flops"] == pairs * 4 * 8
    assert pairs == 2 * sum(min(i, 5) + 1 for i in range(40))


@pytest.mark.parametrize("backend, variant", [
    ("numba", "documents-3"), ("reference", "alibi"), ("reference", "softcap"),
    ("numpy", "window-4"), ("numpy", "documents-3"), ("numpy", "alibi"),
    pytest.param("torch", "alibi", marks=NEEDS_TORCH),
])
def test_variant_points_agree_with_the_oracle_of_the_same_variant(runner, backend, variant):
    row = runner(point(backend, L=24, mask="causal", variant=variant))
    assert row["status"] == "ok", row["reason"]
    assert row["within_tolerance"], (row["max_abs_err"], row["tolerance"])


def test_what_a_backend_cannot_express_is_skipped_with_the_reason(runner):
    softcap = runner(point("numpy", variant="softcap"))
    assert softcap["status"] == "skipped" and "softcap" in softcap["reason"]


@pytest.mark.parametrize("variant", ["window-4", "alibi"])
def test_backward_variant_points_agree_with_the_oracle(runner, variant):
    row = runner(point("numba", direction="backward", L=24, mask="causal", variant=variant))
    assert row["status"] == "ok", row["reason"]
    assert row["within_tolerance"], (row["max_abs_err"], row["tolerance"])


def test_peer_masks_mean_what_the_mask_functions_mean():
    L, heads = 12, 3
    kwargs = {"mask": np.ones((1, 1, L, L), bool)}
    window = peer_kwargs("window-2", kwargs, heads, L, np.float32)["mask"]
    i, j = np.indices((L, L))
    assert np.array_equal(window[0, 0], (j <= i) & (j >= i - 2))
    ids = document_ids(L, 3)
    assert np.array_equal(peer_kwargs("documents-3", {}, heads, L, np.float32)["mask"][0, 0],
                          ids[:, None] == ids[None, :])
    bias = peer_kwargs("alibi", {"mask": (j <= i)[None, None]}, heads, L, np.float32)["mask"]
    assert bias.dtype == np.float32 and bias.shape == (1, heads, L, L)
    assert bias[0, 1, 5, 2] == np.float32(alibi_slopes(heads)[1] * -3)
    assert bias[0, 0, 2, 5] == -np.inf
    assert peer_kwargs("none", kwargs, heads, L, np.float32) is kwargs
    with pytest.raises(peers.UnsupportedByPeer, match="softcap"):
        peer_kwargs("softcap", {}, heads, L, np.float32)


def test_variant_helpers():
    assert window_size("window-64") == 64 and window_size("documents-8") is None
    assert np.bincount(document_ids(100, 8)).tolist() == [13, 12, 13, 12, 13, 12, 13, 12]
    assert alibi_slopes(8)[0] == 0.5 and alibi_slopes(8)[-1] == 2.0**-8
    assert variant_kwargs("none", 2, 8) == {}
