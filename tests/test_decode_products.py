"""The numba decode kernel's register-blocked products (``kernels/numba_cpu/decode/chunks.py``).

They run on fully visible chunks of float32 and half caches where D and Dv are multiples
of 16 (float64 caches, and the other decode tests' D = 24, take the plain loops). Against
the float64 oracle under the tolerance rule: row counts R = G·Lq that are and are not
multiples of the 4-row block (1, 3, 4, 5, 8), runs of keys cut by pages of 1, 4 and 16
keys or none (contiguous), chunks of 64 keys with ragged tails, causal queries (the chunk
holding the new tokens takes the per-pair loops), splits, float32, float16 and bfloat16
(widened in registers); a score_mod on the product path; and the ``row_dots`` product
itself against NumPy. (NaN past each sequence on this path: tests/test_decode_half_sinks.py
and tests/test_decode.py.)
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from numba import njit

from attnbench import kernels
from attnbench.kernels import mods
from attnbench.kernels.numba_cpu.decode.chunks import VALUE_RUN_BYTES, chunk_values
from attnbench.kernels.numba_cpu.products.blocks import block_dots
from attnbench.kernels.numba_cpu.products.intrinsics import row_dots

from .test_decode import _check_against_oracle, _decode_case, fill_prefix

#: Head sizes on the product path (multiples of 16, D != Dv; Dv = 80 takes a block of 64
#: value columns and one of 16).
PD, PDV = 32, 80

#: The caches that take the products (float64 caches keep the plain loops).
DTYPES = [np.dtype(np.float32), np.dtype(np.float16), np.dtype(ml_dtypes.bfloat16)]
DTYPE_IDS = ["float32", "float16", "bfloat16"]

#: (Lq, Lk, Lnew, H, Hkv, page_size, num_splits): R = H / Hkv · Lq rows per task.
CASES = [
    pytest.param(1, 200, 1, 4, 4, None, 0, id="R1-mha-contiguous"),
    pytest.param(3, 150, 3, 2, 2, 4, 2, id="R3-page4-causal"),
    pytest.param(1, 339, 1, 8, 2, 16, 2, id="R4-gqa-page16-split2"),
    pytest.param(1, 131, 0, 5, 1, 1, 1, id="R5-mqa-page1"),
    pytest.param(2, 257, 2, 8, 2, None, 3, id="R8-gqa-contiguous-Lnew2-split3"),
]


@pytest.mark.parametrize("Lq, Lk, Lnew, H, Hkv, page_size, num_splits", CASES)
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_product_path_matches_the_oracle(dtype, Lq, Lk, Lnew, H, Hkv, page_size, num_splits):
    rng = np.random.default_rng(Lk + H)
    q, k_cache, v_cache, table, lengths, k_new, v_new = _decode_case(
        rng, Lq, Lk, Lnew, H, Hkv, page_size, dtype, D=PD, DV=PDV)
    out, lse, _, _ = _check_against_oracle("numba", q, k_cache, v_cache, table, lengths,
                                           k_new, v_new, num_splits=num_splits)
    assert out.shape == (3, H, Lq, PDV)
    assert not np.isnan(out.astype(np.float64)).any()  # NaN fills every slot past the keys


def test_product_path_applies_a_score_mod():
    rng = np.random.default_rng(5)
    q, k_cache, v_cache, table, lengths, _, _ = _decode_case(
        rng, 1, 300, 0, 8, 2, 16, DTYPES[1], D=PD, DV=PDV)
    lengths = np.maximum(lengths, 1)  # mods need every query at a position >= 0
    fill_prefix(rng, k_cache, v_cache, table, lengths)
    _check_against_oracle("numba", q, k_cache, v_cache, table, lengths, None, None,
                          num_splits=2, score_mod=mods.alibi(np.linspace(0.05, 0.5, 8)))


@njit(cache=True)
def _dots(a, b, b0, rows, depth):
    c = np.full(rows * 3, -1.0, dtype=a.dtype)  # ldc = 3: the entries between stay -1
    r = 0
    while r + 4 <= rows:
        row_dots(a, r * depth, depth, b, b0, c, r * 3, 3, depth, 4, 16)
        r += 4
    while r < rows:
        row_dots(a, r * depth, depth, b, b0, c, r * 3, 3, depth, 1, 16)
        r += 1
    return c


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("rows, depth", [(1, 16), (5, 64), (8, 128), (4, 0)])
def test_row_dots_are_the_dot_products(dtype, rows, depth):
    rng = np.random.default_rng(rows + depth)
    a = rng.standard_normal(rows * depth).astype(dtype)
    b = rng.standard_normal(depth + 7).astype(dtype)
    c = _dots(a, b, 7, rows, depth)
    expected = a.reshape(rows, depth).astype(np.float64) @ b[7:].astype(np.float64)
    eps = np.finfo(dtype).eps
    bound = 2 * depth * eps * (np.abs(a.reshape(rows, depth)) @ np.abs(b[7:])) + 1e-300
    assert (np.abs(c[::3] - expected) <= bound).all()
    assert (c.reshape(rows, 3)[:, 1:] == -1).all()  # nothing written between the rows


@njit  # not cached on disk: an edit of the intrinsics would leave stale code
def _blocks_and_singles(a, b, rows, depth):
    """Scores of 7 rows against the key rows ``rows`` (8), ldc = 9: blocks of 4 rows x 4
    keys, 2 x 4, 1 x 4 and 1 x 16 (the first 16 keys' sums of one row: rows repeated); one
    key at a time for blocks of 4 rows and 1 (the decode chunk's last keys); and one row and
    key at a time (``row_dots``)."""
    blocked = np.full(7 * 9, np.nan, dtype=a.dtype)
    column = np.full(7 * 9, np.nan, dtype=a.dtype)
    single = np.full(7 * 9, np.nan, dtype=a.dtype)
    for jj in range(8):
        block_dots(a, 0, depth, b, rows, jj, depth, column, jj, 9, depth, 4, 1, 16)
        for r in range(4, 7):
            block_dots(a, r * depth, depth, b, rows, jj, depth, column, r * 9 + jj, 9, depth,
                       1, 1, 16)
    for j0 in range(0, 8, 4):
        block_dots(a, 0, depth, b, rows, j0, depth, blocked, j0, 9, depth, 4, 4, 16)
        block_dots(a, 4 * depth, depth, b, rows, j0, depth, blocked, 36 + j0, 9, depth, 2, 4,
                   16)
        block_dots(a, 6 * depth, depth, b, rows, j0, depth, blocked, 54 + j0, 9, depth, 1, 4,
                   16)
    wide = np.full(16, np.nan, dtype=a.dtype)
    doubled = np.concatenate((rows, rows))
    block_dots(a, 6 * depth, depth, b, doubled, 0, depth, wide, 0, 16, depth, 1, 16, 16)
    for jj in range(8):
        for r in range(7):
            row_dots(a, r * depth, depth, b, rows[jj] * depth, single, r * 9 + jj, 9, depth,
                     1, 16)
    return blocked, column, single, wide


@pytest.mark.parametrize("dtype", ["float32", "float64", "float16 keys", "bfloat16 keys"])
def test_block_dots_are_the_row_dots_bit_for_bit(dtype):
    """The decode scores four keys at a time give the bits of one key at a time (the same
    additions, folded together), keys given by index out of order (a paged cache)."""
    rng = np.random.default_rng(3)
    depth = 48
    a_dtype = np.float64 if dtype == "float64" else np.float32
    key_dtype = {"float16 keys": np.float16, "bfloat16 keys": ml_dtypes.bfloat16}.get(
        dtype, a_dtype)
    a = rng.standard_normal(7 * depth).astype(a_dtype)
    keys = rng.standard_normal((11, depth)).astype(key_dtype)
    b = keys.view(np.uint16 if dtype == "bfloat16 keys" else
                  np.int16 if dtype == "float16 keys" else key_dtype).ravel()
    rows = np.array([7, 2, 3, 10, 0, 5, 9, 1])
    blocked, column, single, wide = _blocks_and_singles(a, b, rows, depth)
    assert blocked.tobytes() == single.tobytes()  # the NaN between the rows included
    assert column.tobytes() == single.tobytes()
    assert wide.tobytes() == np.tile(single[54:62], 2).tobytes()
    exact = a.reshape(7, depth).astype(np.float64) @ keys[rows].astype(np.float64).T
    bound = 2 * depth * np.finfo(a_dtype).eps * (np.abs(a.reshape(7, depth)).astype(np.float64)
                                                 @ np.abs(keys[rows].astype(np.float64)).T)
    assert np.all(np.abs(blocked.reshape(7, 9)[:, :8] - exact) <= bound)


def test_float32_product_path_never_reads_past_the_sequence():
    """NaN or finite garbage in every slot past cache_seqlens[b] + Lnew: the same bits out
    (the half caches' version of this test: tests/test_decode_half_sinks.py)."""
    rng = np.random.default_rng(11)
    q, k_cache, v_cache, table, lengths, _, _ = _decode_case(
        rng, 2, 300, 0, 8, 2, 16, DTYPES[0], D=PD, DV=PDV)
    garbage_k = np.where(np.isnan(k_cache), np.float32(1e3), k_cache)
    garbage_v = np.where(np.isnan(v_cache), np.float32(-7.0), v_cache)
    outs = [kernels.attention_with_kvcache(q, kc, vc, cache_seqlens=lengths, block_table=table,
                                           num_splits=3, backend="numba", return_lse=True)
            for kc, vc in ((k_cache, v_cache), (garbage_k, garbage_v))]
    assert outs[0][0].tobytes() == outs[1][0].tobytes()
    assert outs[0][1].tobytes() == outs[1][1].tobytes()


@njit
def _values_whole_and_key_by_key(weights, values, rows, R, Dv, ahead):
    """``chunk_values`` over the whole chunk, and two keys at a time (the bfloat16 pair
    products' own pairs)."""
    nk = rows.size
    whole = np.zeros(R * Dv, np.float32)
    single = np.zeros(R * Dv, np.float32)
    chunk_values(weights, nk, values, rows, nk, R, Dv, whole, ahead, ahead.size)
    for jj in range(0, nk, 2):
        chunk_values(weights[jj:], nk, values, rows[jj:], 2, R, Dv, single, ahead[jj:], 2)
    return whole, single


@pytest.mark.parametrize("pairs", [False, True], ids=["float32", "bfloat16 pairs"])
def test_values_product_bits_do_not_depend_on_the_pages(pairs):
    """The values' product of a chunk whose keys lie on pages of odd lengths (runs of 39
    and 25 rows) gives the bits of the same product two keys at a time: float32 cuts a
    page's run every ``VALUE_RUN_BYTES`` (to prefetch the next value rows between runs)
    and adds each key in order whatever the cuts; the bfloat16 pairs take the keys two by
    two from the chunk's first, across pages.  Prefetches of rows past the cache's end are
    hints, never faults."""
    rng = np.random.default_rng(4)
    R, Dv, nk = 5, 80, 64
    values = rng.standard_normal((70, Dv)).astype(np.float32)
    weights = rng.random((R, nk)).astype(np.float32)
    if pairs:  # bfloat16 bits of both operands, as the kernel gives them
        values = values.astype(ml_dtypes.bfloat16).astype(np.float32)
        weights = weights.astype(ml_dtypes.bfloat16).astype(np.float32)
    rows = np.concatenate([np.arange(3, 42), np.arange(45, 70)])  # runs of 39 and 25 keys
    assert 39 * Dv * 4 > VALUE_RUN_BYTES  # float32: the first run is cut
    ahead = np.arange(70, 70 + nk)  # past the end of the cache
    operands = [x.astype(ml_dtypes.bfloat16).view(np.uint16) if pairs else x
                for x in (weights, values)]
    whole, single = _values_whole_and_key_by_key(operands[0].ravel(), operands[1].ravel(),
                                                 rows, R, Dv, ahead)
    assert whole.tobytes() == single.tobytes()
    exact = weights.astype(np.float64) @ values[rows].astype(np.float64)
    bound = 2 * nk * np.finfo(np.float32).eps * (weights @ np.abs(values[rows]))
    assert np.all(np.abs(whole.reshape(R, Dv) - exact) <= bound)
