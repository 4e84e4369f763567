"""A kernel's bits do not depend on which kernels a process compiled before it.

The micro-kernel's block function (``kernels.numba_cpu.dense.micro.attend_rows``) is called by the
dense and the packed kernels, and each compiled copy of it summed a softmax row in the
order LLVM's vectoriser picked for the ``reassoc`` loop in that copy's module.  A process
that compiled the packed kernel first, and the next one, which loaded it from the cache and
then compiled the dense kernel, ran two such copies: the packed call and the dense call of
the same sequence differed by 1-4 ulps on about one row in ten, and which bits a call gave
depended on the cache's history (a fresh clone's suite failed so).  The softmax row sums of
the numba kernels are now :func:`kernels.numba_cpu.products.intrinsics.ordered_sum`, one order fixed
by the row's length alone: checked here against a NumPy rendering of its documented order,
and the failing order end to end, in a fresh cache.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from numba import njit

from attnbench.kernels.numba_cpu.products.intrinsics import SUM_LANES, ordered_sum

REPO = Path(__file__).resolve().parents[1]


def _documented_order(x: np.ndarray, nr: int):
    """``sum(x)`` in the order :func:`ordered_sum` documents, in x's dtype."""
    n, wide = x.size, 4 * nr
    acc = np.zeros(wide, x.dtype)
    done = n // wide * wide
    for t in range(0, done, wide):
        acc = acc + x[t:t + wide]
    while acc.size > nr:
        acc = acc[:acc.size // 2] + acc[acc.size // 2:]
    while n - done >= nr:
        acc, done = acc + x[done:done + nr], done + nr
    while acc.size > 1:
        acc = acc[:acc.size // 2] + acc[acc.size // 2:]
    total = acc[0]
    for t in range(done, n):
        total = x.dtype.type(total + x[t])
    return total


@njit
def _sum(x, a0, n):
    return ordered_sum(x, a0, n, SUM_LANES)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_ordered_sum_adds_in_its_documented_order(dtype):
    """Bit for bit, for lengths with and without whole wide vectors, vectors and tails,
    from an offset; the values span 12 decades, so another order would show (it does for
    5 of 6 of these lengths against a sum in 8 lanes)."""
    rng = np.random.default_rng(7)
    x = (rng.standard_normal(700) * 10.0 ** rng.integers(-6, 7, 700)).astype(dtype)
    for n in (0, 1, 15, 16, 17, 63, 64, 65, 80, 100, 255, 256, 300, 650):
        for a0 in (0, 3):
            got = np.array([_sum(x, a0, n)], dtype)
            want = np.array([_documented_order(x[a0:a0 + n], SUM_LANES)], dtype)
            assert got.view(np.uint8).tobytes() == want.view(np.uint8).tobytes(), (n, a0)


def test_ordered_sum_takes_only_contiguous_vectors_of_floats():
    with pytest.raises(Exception, match="ordered_sum"):
        _sum(np.zeros((4, 4), np.float32), 0, 4)
    with pytest.raises(Exception, match="ordered_sum"):
        _sum(np.zeros(8, np.int64), 0, 4)


#: Compiles the packed micro-kernel path (first run) or the dense one (second run) into a
#: fresh cache, then, on the second run, compares the two bit for bit.
SCENARIO = """
import sys
import numpy as np
from attnbench import kernels
from attnbench.kernels.numba_cpu.dense import micro
from attnbench.kernels.numba_cpu import planner
from tests.test_varlen import _packed
from tests.test_varlen_micro import _dense_alone
block = micro.CONFIGS[np.dtype(np.float32)][0]
planner._CHOICES[np.dtype(np.float32)] = block
q, k, v, cu_q, cu_k = _packed([70, 300], [90, 260], 4, 2, 16, 12, np.float32)
if sys.argv[1] == "packed":
    kernels.attention_varlen(q, k, v, cu_q, cu_k, return_lse=True)
    sys.exit(0)
out, lse = kernels.attention_varlen(q, k, v, cu_q, cu_k, return_lse=True)  # from the cache
dense = [_dense_alone(q, k, v, cu_q, cu_k, b, False) for b in range(2)]  # compiled now
rows = [slice(cu_q[b], cu_q[b + 1]) for b in range(2)]
differ = sum(int((out[r].view(np.uint32) != d.view(np.uint32)).sum())
             for r, (d, _) in zip(rows, dense))
print("elements that differ:", differ)
sys.exit(1 if differ else 0)
"""


@pytest.mark.slow
def test_packed_and_dense_agree_whichever_compiled_first(tmp_path):
    """The failing order: a process compiles the packed kernel (and with it the block
    function) into an empty cache; the next loads the packed kernel from the cache, runs
    it, then compiles the dense kernel (and with it a second copy of the block function,
    compiled outside the packed kernel), and compares.
    Each process compiles for about 10-20 s."""
    env = dict(os.environ, NUMBA_CACHE_DIR=str(tmp_path / "numba"), PYTHONPATH=str(REPO))
    for step in ("packed", "compare"):
        result = subprocess.run([sys.executable, "-c", SCENARIO, step], cwd=REPO, env=env,
                                capture_output=True, text=True, timeout=600)
        assert result.returncode == 0, result.stdout + result.stderr
