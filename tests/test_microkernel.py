"""The micro-kernel path (kernels/numba_cpu/dense/micro.py) against the reference.

Both ways of packing K and V (a separate launch, or fused into the task loop) are run on
every checked case and must agree exactly (half inputs pack fused only).

Small tiles (8 query rows per task, keys in tiles of one or two panels) make tiny problems
cross every boundary: row tails of the register block (Lq not a multiple of ``mr``), key
tails of a panel (Lk, key lengths and the causal cut not multiples of ``nr``), value
widths that are not a multiple of ``nr`` (padded lanes), GQA, both causal alignments,
rows that see no key, and non-finite keys and values where they are hidden.  Every
register block the planner may choose on any target (:func:`micro.register_blocks` of
AVX-512's 32 registers of 512 bits and AVX2's 16 of 256: ``nr`` not a power of two,
``mr`` = 6) runs on whatever target this process compiles for, so one machine checks them
all.  float16 and bfloat16 inputs take float32's blocks (their bits widened as K, V and Q
are packed) and the half tolerance rule.
"""

import ml_dtypes
import numpy as np
import pytest

from attnbench.kernels._dtypes import is_half
from attnbench.kernels.numba_cpu.dense import micro as mk
from attnbench.kernels.numba_cpu.products.intrinsics import tile_product
from attnbench.measure.oracle import tolerance

from .support import COMPARISONS, max_error, oracle

#: The vector register files the planner has blocks for: AVX-512's and AVX2's.
TARGETS = {"avx512": (512, 32), "avx2": (256, 16)}
#: Every block of every dtype on every target, the target's default first.
BLOCKS = list(dict.fromkeys(
    (dtype.type, block) for bits, registers in TARGETS.values()
    for dtype, blocks in mk.register_blocks(bits, registers).items() for block in blocks))
#: The default block of each dtype on this target.
CONFIGS = [(np.float32, mk.CONFIGS[np.dtype(np.float32)][0]),
           (np.float64, mk.CONFIGS[np.dtype(np.float64)][0])]


def _param(dtype, block, name=None):
    return pytest.param(dtype, block, id=f"{name or np.dtype(dtype).name}-{block[0]}x{block[1]}")


#: ... and the half dtypes, on every float32 block.
WITH_HALF = [_param(*case) for case in BLOCKS] + [
    _param(dtype, block, name) for dtype, name in ((np.float16, "float16"),
                                                  (ml_dtypes.bfloat16, "bfloat16"))
    for f32, block in BLOCKS if f32 is np.float32]


def _inputs(dtype, B, H, Hkv, Lq, Lk, D, Dv, seed=0):
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((B, H, Lq, D)).astype(dtype)
    k = rng.standard_normal((B, Hkv, Lk, D)).astype(dtype)
    v = rng.standard_normal((B, Hkv, Lk, Dv)).astype(dtype)
    return q, k, v


def _check(q, k, v, config, block_q=8, block_k=None, **kwargs):
    """The micro-kernel's output against the oracle, within the differential tolerance."""
    (exact, _), (plain, _) = oracle(q, k, v, **kwargs)
    # Half inputs pack fused only: there the second call checks that it repeats bit for bit.
    ways = (True, True) if is_half(q.dtype) else (False, True)
    got, fused = (mk.attention(q, k, v, config=config, block_q=block_q,
                               block_k=block_k or config[1], fuse=fuse, **kwargs)
                  for fuse in ways)
    assert np.array_equal(got, fused, equal_nan=True)  # packing fused or not: same arithmetic
    assert got.dtype == q.dtype and got.shape == exact.shape
    err = max_error(got, exact)
    tol = tolerance(exact, plain, q.dtype)
    assert err <= tol, f"micro-kernel {config}: error {err:.3g} > tolerance {tol:.3g}"
    COMPARISONS.append(("microkernel", np.dtype(q.dtype).name, err, tol))
    return got


@pytest.mark.parametrize("dtype, config", WITH_HALF)
@pytest.mark.parametrize("Lq, Lk, D, Dv", [(1, 1, 1, 1), (13, 37, 5, 7), (40, 70, 8, 33)])
def test_odd_sizes(dtype, config, Lq, Lk, D, Dv):
    q, k, v = _inputs(dtype, 2, 4, 2, Lq, Lk, D, Dv)  # GQA: two query heads per key head
    _check(q, k, v, config)


@pytest.mark.parametrize("dtype, config", WITH_HALF)
@pytest.mark.parametrize("causal", [True, "bottom-right"])
@pytest.mark.parametrize("Lq, Lk", [(37, 37), (21, 50), (50, 21)])
def test_causal(dtype, config, causal, Lq, Lk):
    q, k, v = _inputs(dtype, 1, 2, 1, Lq, Lk, 6, 5)
    _check(q, k, v, config, causal=causal)
    _check(q, k, v, config, block_k=2 * config[1], causal=causal)  # a tile of two panels


@pytest.mark.parametrize("dtype, config", WITH_HALF)
@pytest.mark.parametrize("causal", [False, True])
def test_key_lengths(dtype, config, causal):
    """Lengths on, before and after panel boundaries, and 0: that batch's rows give 0."""
    nr = config[1]
    lengths = [0, 1, nr - 1, nr, nr + 1, 2 * nr + 3]
    q, k, v = _inputs(dtype, len(lengths), 1, 1, 19, 2 * nr + 3, 4, 3)
    got = _check(q, k, v, config, causal=causal, key_lengths=lengths)
    assert np.all(got[0] == 0)


@pytest.mark.parametrize("dtype, config", WITH_HALF)
@pytest.mark.parametrize("bad", [np.nan, np.inf])
def test_hidden_non_finite(dtype, config, bad):
    """NaN/inf in padded keys and values, and in values the causal mask hides, stay hidden."""
    nr = config[1]
    q, k, v = _inputs(dtype, 1, 1, 1, nr + 5, nr + 5, 4, 3)
    k[0, 0, nr + 2:] = bad  # past the key length
    v[0, 0, nr + 2:] = bad
    _check(q, k, v, config, key_lengths=nr + 2)
    v[0, 0, 3] = bad  # seen only by rows >= 3 (causal): the diagonal tile's fallback
    got = mk.attention(q, k, v, config=config, block_q=8, block_k=nr, causal=True,
                       key_lengths=nr + 2)
    assert np.all(np.isfinite(got[0, 0, :3])) and np.all(~np.isfinite(got[0, 0, 3:nr + 2]))
    v[0, 0, 3] = 0
    _check(q, k, v, config, causal=True, key_lengths=nr + 2)


@pytest.mark.parametrize("dtype, config", WITH_HALF)
def test_visible_nan_makes_its_row_nan(dtype, config):
    q, k, v = _inputs(dtype, 1, 1, 1, 9, 9, 4, 3)
    q[0, 0, 4, 1] = np.nan
    got = mk.attention(q, k, v, config=config, block_q=8)
    assert np.isnan(got[0, 0, 4]).all()
    assert np.isfinite(np.delete(got[0, 0], 4, axis=0)).all()


@pytest.mark.parametrize("mr, nr", [(3, 8), (6, 12), (4, 24)])
def test_tile_product_is_a_register_block(mr, nr):
    """The micro-kernel alone: c (+)= a · b on offsets and strides, float64 exact enough,
    also where ``nr`` is not a power of two."""
    import numba

    depth, lda, ldb, ldc = 5, 7, nr + 1, nr + 2
    rng = np.random.default_rng(1)
    a = rng.standard_normal(4 + (mr - 1) * lda + depth + 1)
    b = rng.standard_normal(2 + depth * ldb + nr)
    c = rng.standard_normal(1 + (mr - 1) * ldc + nr + 3)

    @numba.njit
    def run(a, b, c, accumulate):
        if accumulate:
            tile_product(a, 4, lda, b, 2, ldb, c, 1, ldc, depth, mr, nr, True)
        else:
            tile_product(a, 4, lda, b, 2, ldb, c, 1, ldc, depth, mr, nr, False)
    A = np.lib.stride_tricks.as_strided(a[4:], (mr, depth), (8 * lda, 8))
    B = np.lib.stride_tricks.as_strided(b[2:], (depth, nr), (8 * ldb, 8))
    cells = 1 + np.arange(mr)[:, None] * ldc + np.arange(nr)
    before = c.copy()
    # Fused multiply-adds in order: within depth rounding errors of each term's size.
    bound = 2 * depth * np.finfo(np.float64).eps * (np.abs(before[cells]) + np.abs(A) @ np.abs(B))
    run(a, b, c, True)
    assert np.all(np.abs(c[cells] - (before[cells] + A @ B)) <= bound)
    untouched = np.ones(c.size, bool)
    untouched[cells] = False
    assert np.array_equal(c[untouched], before[untouched])
    run(a, b, c, False)
    assert np.all(np.abs(c[cells] - A @ B) <= bound)
    assert np.array_equal(c[untouched], before[untouched])


@pytest.mark.parametrize("dtype, config", [_param(*case) for case in BLOCKS])
def test_lse_as_the_numba_backend(dtype, config):
    """``run`` gives the log-sum-exp the numba backend's return_lse gives (-inf: no key)."""
    from attnbench import kernels
    from attnbench.kernels.numba_cpu import choose

    q, k, v = _inputs(dtype, 2, 2, 2, 21, 45, 4, 3)
    problem = kernels.prepare(q, k, v, causal="bottom-right", key_lengths=[0, 40])
    out, lse = mk.run(problem, config, block_q=8, block_k=config[1])
    ref_out, _, ref_lse = choose.run(problem, return_lse=True)
    assert np.all(lse[0] == -np.inf) and np.all(out[0] == 0)
    eps = np.finfo(dtype).eps
    np.testing.assert_allclose(lse[1], ref_lse[1], rtol=0, atol=64 * eps * np.abs(ref_lse[1]).max())
    np.testing.assert_allclose(out, ref_out, rtol=0, atol=64 * eps)


def test_rejects_what_it_does_not_support():
    from attnbench import kernels

    q, k, v = _inputs(np.float32, 1, 1, 1, 4, 4, 2, 2)
    problem = kernels.prepare(q, k, v, mask=np.ones((4, 4), bool))
    with pytest.raises(ValueError, match="causal, key_lengths and scale only"):
        mk.run(problem, CONFIGS[0][1])


def test_later_calls_skip_the_literal_dispatch(monkeypatch):
    """Once compiled, run() calls the block's specialisation, not the dispatcher (~15 ms)."""
    config = CONFIGS[0][1]
    q, k, v = _inputs(np.float32, 1, 2, 1, 9, 11, 4, 3)
    first = mk.attention(q, k, v, config=config, block_q=8)
    real, dispatched = mk._kernel, []

    class Spy:
        overloads = real.overloads

        def __call__(self, *args):
            dispatched.append(args)
            return real(*args)

    monkeypatch.setattr(mk, "_kernel", Spy())
    assert np.array_equal(mk.attention(q, k, v, config=config, block_q=8), first)
    assert dispatched == []


@pytest.mark.parametrize("dtype, block_k", [(np.float32, 96), (np.float64, 48)])
def test_blocks_of_one_tile_size_give_the_same_bits(dtype, block_k):
    """A block changes which elements are computed together, never an element's order of
    operations: every block of every target, on tiles of one size, gives the same bits."""
    q, k, v = _inputs(dtype, 1, 4, 2, 50, 203, 8, 12)
    blocks = [block for f, block in BLOCKS if f is dtype]
    for causal in (False, True):
        first, *others = (mk.attention(q, k, v, config=block, block_k=block_k, causal=causal)
                          for block in blocks)
        assert all(np.array_equal(first, other) for other in others)
