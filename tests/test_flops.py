"""FLOP counting: the closed forms against brute-force counting of visible pairs."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from attnbench import kernels
from attnbench.measure.flops import (
    attention_flops,
    backward_flops,
    causal_offset,
    flops_of_problem,
    gflops,
    visible_pairs,
)

CAUSAL_KINDS = (False, True, "top-left", "bottom-right")


def brute_force_pairs(B, H, Lq, Lk, causal=False, key_lengths=None, mask=None) -> int:
    """Count visible (b, h, i, j) one by one, straight from the definitions."""
    offset = {False: None, True: 0, "top-left": 0, "bottom-right": Lk - Lq}[causal]
    lengths = np.broadcast_to(Lk if key_lengths is None else key_lengths, (B,))
    visible = np.ones((B, H, Lq, Lk), dtype=bool) if mask is None else (
        np.broadcast_to(mask, (B, H, Lq, Lk)))
    count = 0
    for b in range(B):
        for h in range(H):
            for i in range(Lq):
                for j in range(Lk):
                    hidden_by_causal = offset is not None and j > i + offset
                    if visible[b, h, i, j] and j < lengths[b] and not hidden_by_causal:
                        count += 1
    return count


# name, (B, H, Lq, Lk), causal, key_lengths, expected visible pairs
CLOSED_FORM_CASES = [
    ("full square", (2, 3, 5, 5), False, None, 2 * 3 * 25),
    ("causal square: L(L+1)/2", (1, 1, 5, 5), True, None, 15),
    ("top-left is causal=True", (1, 1, 5, 5), "top-left", None, 15),
    ("bottom-right square = top-left", (1, 1, 5, 5), "bottom-right", None, 15),
    # Lq > Lk, bottom-right: the first Lq - Lk = 3 queries see nothing, then 1, 2, 3, 4.
    ("bottom-right Lq > Lk", (1, 1, 7, 4), "bottom-right", None, 10),
    # Lq < Lk, bottom-right: query i sees i + 4 keys (decoding with a KV cache).
    ("bottom-right Lq < Lk", (1, 1, 3, 6), "bottom-right", None, 4 + 5 + 6),
    ("top-left Lq < Lk", (1, 1, 3, 6), True, None, 1 + 2 + 3),
    ("top-left Lq > Lk", (1, 1, 6, 3), True, None, 1 + 2 + 3 + 3 + 3 + 3),
    ("key lengths", (3, 2, 4, 6), False, [6, 2, 0], 2 * 4 * (6 + 2 + 0)),
    ("key lengths + causal", (2, 1, 4, 4), True, [4, 2], (1 + 2 + 3 + 4) + (1 + 2 + 2 + 2)),
    ("no queries", (1, 1, 0, 4), True, None, 0),
    ("no keys", (1, 1, 4, 0), "bottom-right", None, 0),
]


@pytest.mark.parametrize(
    "shape, causal, key_lengths, expected",
    [case[1:] for case in CLOSED_FORM_CASES],
    ids=[case[0] for case in CLOSED_FORM_CASES],
)
def test_closed_form_known_counts(shape, causal, key_lengths, expected):
    assert visible_pairs(*shape, causal=causal, key_lengths=key_lengths) == expected
    assert brute_force_pairs(*shape, causal=causal, key_lengths=key_lengths) == expected


@settings(max_examples=150, deadline=None)
@given(
    B=st.integers(1, 3), H=st.integers(1, 3), Lq=st.integers(0, 12), Lk=st.integers(0, 12),
    causal=st.sampled_from(CAUSAL_KINDS), with_lengths=st.booleans(), seed=st.integers(0, 99),
)
def test_closed_form_matches_brute_force(B, H, Lq, Lk, causal, with_lengths, seed):
    rng = np.random.default_rng(seed)
    key_lengths = rng.integers(0, Lk + 1, size=B) if with_lengths else None
    expected = brute_force_pairs(B, H, Lq, Lk, causal, key_lengths)
    assert visible_pairs(B, H, Lq, Lk, causal=causal, key_lengths=key_lengths) == expected


@settings(max_examples=80, deadline=None)
@given(
    B=st.integers(1, 3), H=st.integers(1, 3), Lq=st.integers(1, 9), Lk=st.integers(1, 9),
    causal=st.sampled_from(CAUSAL_KINDS), with_lengths=st.booleans(),
    mask_shape=st.sampled_from(["full", "per-batch keys", "shared"]), seed=st.integers(0, 99),
)
def test_mask_count_matches_brute_force(B, H, Lq, Lk, causal, with_lengths, mask_shape, seed):
    rng = np.random.default_rng(seed)
    shape = {"full": (B, H, Lq, Lk), "per-batch keys": (B, 1, 1, Lk),
             "shared": (Lq, Lk)}[mask_shape]
    mask = rng.random(shape) < 0.6
    key_lengths = rng.integers(0, Lk + 1, size=B) if with_lengths else None
    expected = brute_force_pairs(B, H, Lq, Lk, causal, key_lengths, mask)
    assert visible_pairs(B, H, Lq, Lk, causal=causal, key_lengths=key_lengths,
                         mask=mask) == expected
    additive = np.where(mask, 0.0, -np.inf)  # the float form of the same mask
    assert visible_pairs(B, H, Lq, Lk, causal=causal, key_lengths=key_lengths,
                         mask=additive) == expected


def test_closed_form_needs_no_l_by_l_array():
    L = 10**6  # an L x L bool array would take a terabyte
    assert visible_pairs(1, 1, L, L, causal=True) == L * (L + 1) // 2
    assert visible_pairs(2, 1, L, L, key_lengths=[L, L // 2]) == L * L + L * (L // 2)


def test_flops_formula():
    B, H, Lq, Lk, D = 2, 4, 97, 113, 64
    assert attention_flops(B, H, Lq, Lk, D) == 4 * B * H * Lq * Lk * D
    assert attention_flops(B, H, Lq, Lk, D, 48) == 2 * B * H * Lq * Lk * (D + 48)
    L = 128
    causal = attention_flops(1, 1, L, L, D, causal=True)
    assert causal == 4 * D * L * (L + 1) // 2  # about half of the full count
    assert causal / attention_flops(1, 1, L, L, D) == pytest.approx(0.5, rel=1 / L)


# name, keyword arguments of kernels.attention beyond q, k, v (shapes: B=2, H=4, Hkv=2)
PROBLEM_CASES = [
    ("plain", {}),
    ("causal", {"causal": True}),
    ("bottom-right", {"causal": "bottom-right"}),
    ("key lengths", {"key_lengths": np.array([3, 0])}),
    ("bool mask", {"mask": np.random.default_rng(1).random((2, 4, 7, 5)) < 0.5}),
    ("padding mask + causal", {"mask": np.arange(5) < np.array([[[[2]]], [[[5]]]]),
                               "causal": True}),
    ("float mask", {"mask": np.where(np.eye(7, 5, dtype=bool), -np.inf, 0.5)}),
]


@pytest.mark.parametrize("kwargs", [case[1] for case in PROBLEM_CASES],
                         ids=[case[0] for case in PROBLEM_CASES])
def test_flops_of_problem_counts_what_kernels_see(kwargs):
    rng = np.random.default_rng(0)
    q = rng.standard_normal((2, 4, 7, 16))
    k = rng.standard_normal((2, 2, 5, 16))
    v = rng.standard_normal((2, 2, 5, 8))
    problem = kernels.prepare(q, k, v, **kwargs)
    pairs = int(problem.visible().sum())  # kernels' own visibility
    assert flops_of_problem(problem) == pairs * 2 * (16 + 8)
    # backward: S recomputed, dQ, dK (D each); dV, dP (Dv each)
    assert flops_of_problem(problem, "backward") == pairs * 2 * (3 * 16 + 2 * 8)


def test_backward_flops_are_two_and_a_half_forwards_and_directions_are_checked():
    assert backward_flops(2, 3, 17, 9, 64, causal=True) * 2 == \
        attention_flops(2, 3, 17, 9, 64, causal=True) * 5
    problem = kernels.prepare(*(np.zeros((1, 1, 3, 4)),) * 3)
    with pytest.raises(ValueError, match="direction"):
        flops_of_problem(problem, "sideways")


def test_causal_offset():
    assert causal_offset(False, 3, 5) is None
    assert causal_offset(None, 3, 5) is None
    assert causal_offset(True, 3, 5) == 0
    assert causal_offset(np.True_, 3, 5) == 0
    assert causal_offset("bottom-right", 3, 5) == 2
    assert causal_offset(-4, 3, 5) == -4
    with pytest.raises(ValueError, match="causal"):
        causal_offset("bottom-left", 3, 5)


def test_bad_arguments_are_named():
    with pytest.raises(ValueError, match="key_lengths"):
        visible_pairs(2, 1, 4, 4, key_lengths=[1, 5])
    with pytest.raises(TypeError, match="key_lengths"):
        visible_pairs(2, 1, 4, 4, key_lengths=[1.0, 2.0])
    with pytest.raises(ValueError, match="mask"):
        visible_pairs(2, 1, 4, 4, mask=np.ones((3, 4), dtype=bool))


def test_gflops():
    assert gflops(2e9, 0.5) == 4.0
    assert np.isnan(gflops(1e9, 0.0))
