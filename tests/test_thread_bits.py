"""The same bits on any number of threads: every numba entry point whose split of work
does not follow the thread count gives bit-identical results on 1 and 2 Numba threads, and
the two whose default split does (the backward's key chunks, decode's key splits) do with
``deterministic=True``.  The shapes are large enough to run in parallel."""

from __future__ import annotations

import hashlib

import numba
import numpy as np
import pytest

from attnbench import kernels
from attnbench.kernels import mods
from attnbench.kernels._dtypes import BFLOAT16

pytestmark = pytest.mark.skipif(numba.config.NUMBA_NUM_THREADS < 2,
                                reason="Numba has fewer than 2 threads here")

B, H, HKV, L, D = 1, 4, 2, 700, 64


def _digest(result) -> str:
    sha = hashlib.sha256()
    for array in (result if isinstance(result, tuple) else (result,)):
        sha.update(np.ascontiguousarray(array).tobytes())
    return sha.hexdigest()


def _inputs(dtype=np.float32):
    rng = np.random.default_rng(0)
    q, k, v, dout = (rng.standard_normal(shape).astype(dtype) for shape in
                     ((B, H, L, D), (B, HKV, L, D), (B, HKV, L, D), (B, H, L, D)))
    return q, k, v, dout


def _packed(x):
    return np.ascontiguousarray(x[0].transpose(1, 0, 2))


CU = np.array([0, 300, 301, L])


def _decode():
    rng = np.random.default_rng(1)
    q = rng.standard_normal((2, 8, 1, D)).astype(np.float32)
    cache = [rng.standard_normal((2, 2, 5000, D)).astype(np.float32) for _ in range(2)]
    return kernels.attention_with_kvcache(q, *cache, cache_seqlens=[4500, 3000],
                                          return_lse=True, deterministic=True)


CALLS = {
    "forward": lambda: kernels.attention(*_inputs()[:3]),
    "forward causal+lse": lambda: kernels.attention(*_inputs()[:3], causal=True,
                                                    return_lse=True),
    "forward window": lambda: kernels.attention(*_inputs()[:3], causal=True,
                                                mask_mod=mods.sliding_window(64)),
    "forward float64": lambda: kernels.attention(*_inputs(np.float64)[:3], causal=True),
    "forward bfloat16": lambda: kernels.attention(*_inputs(BFLOAT16)[:3], causal=True),
    "varlen": lambda: kernels.attention_varlen(
        *(_packed(x) for x in _inputs()[:3]), CU, CU, causal=True, return_lse=True),
    "varlen backward": lambda: kernels.attention_varlen_backward(
        *(_packed(x) for x in _inputs()), CU, CU, causal=True),
    "backward deterministic": lambda: kernels.attention_backward(
        *_inputs(), causal=True, deterministic=True),
    "decode deterministic": _decode,
}


@pytest.fixture
def threads():
    before = numba.get_num_threads()
    yield numba.set_num_threads
    numba.set_num_threads(before)


@pytest.mark.parametrize("name", list(CALLS))
def test_one_and_two_threads_give_the_same_bits(name, threads):
    digests = []
    for count in (1, 2):
        threads(count)
        digests.append(_digest(CALLS[name]()))
    assert digests[0] == digests[1]


def test_the_backward_without_deterministic_follows_the_threads(threads):
    """The control: the default backward's split follows the thread count here, so the
    test above would see a thread-dependent sum."""
    digests = []
    for count in (1, 2):
        threads(count)
        digests.append(_digest(kernels.attention_backward(*_inputs(), causal=True)))
    assert digests[0] != digests[1]
