"""The bfloat16 pair products of the decode kernel (``kernels/numba_cpu/products/pairs.py``).

Both products against NumPy in float64 (the products of two bfloat16 are exact in float32,
so the error is the float32 sums' alone), in both forms: the ``vdpbf16ps`` instruction
where this machine has it and the two fused multiply-adds that stand in for it elsewhere,
which must agree bit for bit on normal numbers (Intel defines the instruction as the odd
pair's product added, rounded, then the even pair's). An odd chunk of keys pairs its last key
with zeros, never with a row it does not list (NaN planted there). The weights' rounding against
ml_dtypes'. The decode step on the pair path: tests/test_decode_products.py (D = 32) and
the head sizes of real models below.
"""

from __future__ import annotations

import functools
import os
import subprocess
import sys
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
from numba import njit

from attnbench.kernels._jit.isa import AVX2_TARGET
from attnbench.kernels.numba_cpu.decode.chunks import round_weights
from attnbench.kernels.numba_cpu.products.pairs import (
    NATIVE,
    pair_block_dots,
    pair_row_dots,
    pair_rows_product,
)

from .test_decode import _check_against_oracle, _decode_case

ROOT = Path(__file__).resolve().parents[1]
BF16 = ml_dtypes.bfloat16
FORMS = [False, pytest.param(True, marks=pytest.mark.skipif(
    not NATIVE, reason="this machine (or its LLVM) has no vdpbf16ps"))]


# The helpers below are not cached on disk: Numba stamps a cached function with its own
# file only, and tests/ is outside kernels._jit.cache's stamps (an edit of the intrinsics
# would leave stale code).  They are built once per form, ``native`` a constant of each:
# a form passed at run time would compile both, and the instruction's form refuses to
# compile (LLVM would abort the process) on a target without it.
@functools.cache
def _helpers(native):
    """``(dots, block_then_rows, rows)`` for one form of the pair products."""

    @njit
    def dots(a, a0, lda, b, c, depth, mr4):
        if mr4:
            pair_row_dots(a, a0, lda, b, 0, c, 0, 1, depth, 4, native)
        else:
            pair_row_dots(a, a0, lda, b, 0, c, 0, 1, depth, 1, native)

    @njit
    def block_then_rows(a, lda, b, rows, ldb, depth):
        """Scores of 4 query rows against the key rows ``rows`` (8 of them): blocks of 4
        rows and 4 keys, of 2 and 4, of 1 and 4; one key at a time in blocks of 1, 1 and 2
        rows (4 in the emulation: the decode chunk's last keys); then one key and one row
        at a time; ldc = 9 (the entries between stay NaN)."""
        nk = rows.size
        blocked = np.full(4 * 9, np.nan, np.float32)
        column = np.full(4 * 9, np.nan, np.float32)
        single = np.full(4 * 9, np.nan, np.float32)
        for jj in range(nk):
            if native:
                pair_block_dots(a, 0, lda, b, rows, jj, ldb, column, jj, 9, depth, 1, 1, native)
                pair_block_dots(a, lda, lda, b, rows, jj, ldb, column, 9 + jj, 9, depth, 1, 1,
                                native)
                pair_block_dots(a, 2 * lda, lda, b, rows, jj, ldb, column, 18 + jj, 9, depth,
                                2, 1, native)
            else:
                pair_block_dots(a, 0, lda, b, rows, jj, ldb, column, jj, 9, depth, 4, 1, native)
        for j0 in range(0, nk, 4):
            if native:
                pair_block_dots(a, 0, lda, b, rows, j0, ldb, blocked, j0, 9, depth, 2, 4,
                                native)
                pair_block_dots(a, 2 * lda, lda, b, rows, j0, ldb, blocked, 18 + j0, 9, depth,
                                1, 4, native)
                pair_block_dots(a, 3 * lda, lda, b, rows, j0, ldb, blocked, 27 + j0, 9, depth,
                                1, 4, native)
            else:
                pair_block_dots(a, 0, lda, b, rows, j0, ldb, blocked, j0, 9, depth, 4, 4,
                                native)
        for jj in range(nk):
            for r in range(4):
                pair_row_dots(a, r * lda, lda, b, rows[jj] * ldb, single, r * 9 + jj, 9,
                              depth, 1, native)
        return blocked, column, single

    @njit
    def rows_product(w, w0, ldw, b, rows, ldb, c, ldc, ahead, wide):
        """4 rows x 48 columns (a block of 32, 16 left over), or 64 (two blocks of 32), of
        ``c += w · b[rows]``; columns from 8 on (``col0 = 8``), every row ahead prefetched."""
        nk = rows.size
        if wide:
            pair_rows_product(w, w0, ldw, b, rows, nk, 8, ldb, c, 0, ldc, ahead, nk, 4, 64,
                              native)
        else:
            pair_rows_product(w, w0, ldw, b, rows, nk, 8, ldb, c, 0, ldc, ahead, nk, 4, 48,
                              native)

    return dots, block_then_rows, rows_product


def _dots(a, a0, lda, b, c, depth, mr4, native):
    _helpers(native)[0](a, a0, lda, b, c, depth, mr4)


def _block_then_rows(a, lda, b, rows, ldb, depth, native):
    return _helpers(native)[1](a, lda, b, rows, ldb, depth)


def _rows(w, w0, ldw, b, rows, ldb, c, ldc, ahead, native, wide):
    _helpers(native)[2](w, w0, ldw, b, rows, ldb, c, ldc, ahead, wide)


def _bits(x):
    return np.ascontiguousarray(x).view(np.uint16).ravel()


@pytest.mark.parametrize("native", FORMS)
@pytest.mark.parametrize("depth", [32, 128, 256])
@pytest.mark.parametrize("rows", [1, 4])
def test_row_dots_match_numpy(native, depth, rows):
    rng = np.random.default_rng(depth + rows)
    a = rng.standard_normal((rows, depth + 32)).astype(BF16)
    b = (rng.standard_normal(depth) * 3).astype(BF16)
    c = np.full(rows, np.nan, dtype=np.float32)
    _dots(_bits(a), 32, depth + 32, _bits(b), c, depth, rows == 4, native)  # a0: offset 32
    a64, b64 = a[:, 32:].astype(np.float64), b.astype(np.float64)
    bound = depth * 2.0 ** -24 * (np.abs(a64) @ np.abs(b64))  # float32 sums of exact products
    assert np.all(np.abs(c - a64 @ b64) <= bound)


@pytest.mark.parametrize("native", FORMS)
@pytest.mark.parametrize("depth", [32, 128])
def test_block_dots_are_the_row_dots_bit_for_bit(native, depth):
    """Blocks of rows and key rows (by index, out of order: a paged cache) give the bits of
    one row and key at a time, in both forms (blocks of 2 and 1 rows natively, 4 in the
    emulation)."""
    rng = np.random.default_rng(depth)
    a = rng.standard_normal((4, depth)).astype(BF16)
    keys = (rng.standard_normal((11, depth)) * 3).astype(BF16)
    rows = np.array([7, 2, 3, 10, 0, 5, 9, 1])
    blocked, column, single = _block_then_rows(_bits(a), depth, _bits(keys), rows, depth,
                                               depth, native)
    assert blocked.tobytes() == single.tobytes()  # the NaN between the rows included
    assert column.tobytes() == single.tobytes()
    exact = a.astype(np.float64) @ keys[rows].astype(np.float64).T
    bound = depth * 2.0 ** -24 * (np.abs(a.astype(np.float64))
                                   @ np.abs(keys[rows].astype(np.float64)).T)
    assert np.all(np.abs(blocked.reshape(4, 9)[:, :8] - exact) <= bound)


@pytest.mark.parametrize("native", FORMS)
@pytest.mark.parametrize("nk", [1, 2, 5, 17, 64])
@pytest.mark.parametrize("ncols", [48, 64])
def test_rows_product_matches_numpy_and_reads_only_its_rows(native, nk, ncols):
    """Value rows by index (shuffled, as a paged cache's), columns from 8 on, the
    accumulators of each 32 columns in the unpacks' order inside and natural outside; an
    odd chunk's last key paired with zeros: NaN in every row the chunk does not list and
    in the columns outside the block never reaches ``c``; the rows ahead lie past the
    array's end (prefetches are hints)."""
    rng = np.random.default_rng(nk * ncols)
    w = rng.random((4, 70)).astype(BF16)
    w0 = 3  # an odd start: weight pairs loaded from 2-byte aligned addresses
    ldb = ncols + 16
    values = np.full((80, ldb), np.nan, dtype=BF16)
    rows = rng.permutation(80)[:nk]
    values[rows, 8:8 + ncols] = rng.standard_normal((nk, ncols)).astype(BF16)
    c = rng.standard_normal((4, ncols)).astype(np.float32)
    w64, v64 = w[:, w0:w0 + nk].astype(np.float64), values[rows, 8:8 + ncols].astype(np.float64)
    expected = c + w64 @ v64
    ahead = np.arange(10_000, 10_000 + nk)
    _rows(_bits(w), w0, 70, _bits(values), rows, ldb, c.reshape(-1), ncols, ahead, native,
          ncols == 64)
    assert not np.isnan(c).any()
    magnitude = np.abs(w64) @ np.abs(v64)
    assert np.all(np.abs(c - expected) <= (nk + 1) * 2.0 ** -24 * (magnitude + 4))


@pytest.mark.skipif(not NATIVE, reason="this machine (or its LLVM) has no vdpbf16ps")
def test_instruction_and_emulation_agree_bit_for_bit():
    rng = np.random.default_rng(7)
    a = (rng.standard_normal((4, 128)) * 10.0 ** rng.integers(-3, 4, (4, 128))).astype(BF16)
    b = (rng.standard_normal(128) * 10.0 ** rng.integers(-3, 4, 128)).astype(BF16)
    dots = [np.empty(4, np.float32), np.empty(4, np.float32)]
    for native, c in zip((False, True), dots, strict=True):
        _dots(_bits(a), 0, 128, _bits(b), c, 128, True, native)
    assert dots[0].tobytes() == dots[1].tobytes()
    w = rng.random((4, 64)).astype(BF16)
    values = rng.standard_normal((63, 56)).astype(BF16)
    rows = np.arange(63)
    tiles = [np.zeros((4, 48), np.float32), np.zeros((4, 48), np.float32)]
    for native, c in zip((False, True), tiles, strict=True):
        _rows(_bits(w), 0, 64, _bits(values), rows, 56, c.reshape(-1), 48, rows, native,
              False)
    assert tiles[0].tobytes() == tiles[1].tobytes()


@njit
def _rounded(scores, R, nk, ldc):
    weights = np.zeros(scores.size, dtype=np.uint16)
    round_weights(scores, ldc, R, nk, weights)
    return weights


def test_weights_round_to_nearest_even_as_ml_dtypes():
    rng = np.random.default_rng(3)
    ties = np.array([1 + 2.0 ** -8, 1 + 3 * 2.0 ** -8, 0.5 + 2.0 ** -9], dtype=np.float32)
    specials = np.array([0.0, 1.0, np.nan, 1e-40, np.finfo(np.float32).max], dtype=np.float32)
    scores = np.concatenate([rng.random(56, dtype=np.float32), ties, specials])  # 64
    weights = _rounded(np.tile(scores, 2), 2, 61, 64)  # the last 3 of each row not touched
    expected = scores.astype(BF16).view(np.uint16)
    for r in range(2):
        row = weights[r * 64:(r + 1) * 64]
        np.testing.assert_array_equal(row[:61][~np.isnan(scores[:61])],
                                      expected[:61][~np.isnan(scores[:61])])
        assert np.isnan(row[:61].view(BF16).astype(np.float32)[np.isnan(scores[:61])]).all()
        assert not row[61:].any()


@pytest.mark.parametrize("H, Hkv, D, Dv, page_size, num_splits", [
    pytest.param(32, 8, 128, 128, None, 0, id="gqa-d128-contiguous"),
    pytest.param(8, 1, 64, 64, 16, 2, id="mqa-d64-page16-split2"),
    pytest.param(4, 4, 96, 48, 4, 1, id="mha-d96-dv48-page4"),
])
def test_decode_on_the_pair_path_matches_the_oracle(H, Hkv, D, Dv, page_size, num_splits):
    rng = np.random.default_rng(H + D)
    q, k_cache, v_cache, table, lengths, k_new, v_new = _decode_case(
        rng, 1, 333, 1, H, Hkv, page_size, np.dtype(BF16), D=D, DV=Dv)
    out, _, _, _ = _check_against_oracle("numba", q, k_cache, v_cache, table, lengths,
                                         k_new, v_new, num_splits=num_splits)
    assert not np.isnan(out.astype(np.float64)).any()  # NaN fills every slot past the keys


_REFUSED = """
import numpy as np
from numba import njit
from attnbench.kernels.numba_cpu.products.pairs import NATIVE, pair_row_dots
assert not NATIVE
@njit
def dots(a, b, c):
    pair_row_dots(a, 0, 32, b, 0, c, 0, 1, 32, 1, True)
try:
    dots(np.zeros(32, np.uint16), np.zeros(32, np.uint16), np.zeros(1, np.float32))
except NotImplementedError as error:
    print(error)
"""


def test_the_instruction_is_refused_not_aborted_on_a_target_without_it(tmp_path):
    """Compiled for an AVX2 target, the instruction's form raises a NotImplementedError
    naming it; handed to LLVM it would abort the interpreter (what the emulation exists
    for).  In a subprocess, whatever this machine has."""
    env = {**os.environ, **AVX2_TARGET, "NUMBA_CACHE_DIR": str(tmp_path)}
    done = subprocess.run([sys.executable, "-c", _REFUSED], env=env, capture_output=True,
                          text=True, timeout=300, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "vdpbf16ps" in done.stdout and "avx512bf16" in done.stdout
    assert "haswell" in done.stdout
