"""FLOP counts of attention variants: a mask function's visible pairs, as the kernels see them."""

import numpy as np
import pytest

from attnbench import kernels
from attnbench.kernels import mods
from attnbench.measure.flops import backward_flops, flops_of_problem, visible_pairs


def _same_parity(b, h, q_idx, kv_idx):  # a user function: the general path
    return (q_idx + kv_idx + h) % 2 == 0


#: (mask function, Lq, Lk): windows at and across tile edges, a window of 0 and of L,
#: documents (one-token ones, an edge on 64), a user function, and combinations.
CASES = {
    "window-3": (lambda: mods.sliding_window(3), 9, 9),
    "window-3-right-2": (lambda: mods.sliding_window(3, 2), 9, 12),
    "window-0": (lambda: mods.sliding_window(0), 7, 7),
    "window-L": (lambda: mods.sliding_window(70), 70, 70),
    "window-64-tiles": (lambda: mods.sliding_window(64), 130, 130),
    "documents": (lambda: mods.document(np.array([[0, 0, 1, 2, 2, 2, 3, 3, 4],
                                                  [5, 5, 5, 5, 6, 6, 6, 7, 7]])), 9, 9),
    "documents-edge-64": (lambda: mods.document(np.arange(130) // 64), 130, 130),
    "user": (lambda: mods.mask_mod(_same_parity), 9, 11),
    "and": (lambda: mods.and_masks(mods.sliding_window(4), _same_parity), 10, 10),
    "block-mask": (lambda: mods.block_mask(mods.sliding_window(5), 2, 4, 70, 70), 70, 70),
}


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("masking", [{}, {"causal": True}, {"causal": "bottom-right"},
                                     {"key_lengths": [5, 3]}, {"mask": "bool"}])
def test_mask_function_pairs_are_what_kernels_see(case, masking):
    make, Lq, Lk = CASES[case]
    rng = np.random.default_rng(1)
    q = rng.standard_normal((2, 4, Lq, 8))
    k = rng.standard_normal((2, 2, Lk, 8))
    v = rng.standard_normal((2, 2, Lk, 4))
    kwargs = dict(masking)
    if kwargs.get("mask") == "bool":
        kwargs["mask"] = rng.random((2, 1, Lq, Lk)) < 0.7
    problem = kernels.prepare(q, k, v, mask_mod=make(), **kwargs)
    pairs = int(problem.visible().sum())  # kernels' own visibility (dense)
    assert flops_of_problem(problem) == pairs * 2 * (8 + 4)
    assert flops_of_problem(problem, "backward") == pairs * 2 * (3 * 8 + 2 * 4)


def test_window_and_document_counts_in_closed_form_at_a_large_length():
    L, W = 1 << 16, 256  # no L x L array could be built for this in a test
    window = visible_pairs(1, 2, L, L, causal=True, mask_mod=mods.sliding_window(W))
    assert window == 2 * (L * (W + 1) - W * (W + 1) // 2)
    ids = np.arange(L) // (L // 8)  # 8 equal documents
    assert visible_pairs(1, 1, L, L, mask_mod=mods.document(ids)) == 8 * (L // 8) ** 2
    assert visible_pairs(1, 1, L, L, causal=True, mask_mod=mods.document(ids)) == \
        8 * (L // 8) * (L // 8 + 1) // 2


def test_backward_flops_of_a_window_are_two_and_a_half_forwards():
    window = mods.sliding_window(16)
    assert backward_flops(1, 3, 100, 100, 32, causal=True, mask_mod=window) * 2 == \
        visible_pairs(1, 3, 100, 100, causal=True, mask_mod=window) * 4 * 32 * 5


def test_a_mask_function_that_does_not_fit_the_problem_is_an_error():
    with pytest.raises(ValueError, match="doc_ids"):
        visible_pairs(1, 1, 8, 8, mask_mod=mods.document(np.zeros(9, np.int64)))
