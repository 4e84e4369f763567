"""The micro-kernel path (kernels/numba_cpu/dense/micro.py) against the reference.

Both ways of packing K and V (a separate launch, or fused into the task loop) are run on
every checked case and must agree exactly (half inputs pack fused only).

Small tiles (8 query rows per task, keys in tiles of one or two panels) make tiny problems
cross every boundary: row tails of the register block (Lq not a multiple of ``mr``), key
tails of a panel (Lk, key lengths and the causal cut not multiples of ``nr``), value
widths that are not a multiple of ``nr`` (padded lanes), GQA, both causal alignments,
rows that see no key, and non-finite keys and values where they are hidden.  Each dtype
compiles its default register block only (each compilation costs seconds).  float16 and
bfloat16 inputs take float32's block (their bits widened as K, V and Q are packed) and the
half tolerance rule.
"""

import ml_dtypes
import numpy as np
import pytest

from attnbench.kernels._dtypes import is_half
from attnbench.kernels.numba_cpu.dense import micro as mk
from attnbench.kernels.numba_cpu.products.intrinsics import tile_product
from attnbench.measure.oracle import tolerance

from .support import COMPARISONS, max_error, oracle

#: The default block of each dtype (8 x 16 and 4 x 16: row tails of 8 and of 4).
CONFIGS = [(np.float32, mk.CONFIGS[np.dtype(np.float32)][0]),
           (np.float64, mk.CONFIGS[np.dtype(np.float64)][0])]
#: ... and the half dtypes, on float32's block.
WITH_HALF = CONFIGS + [pytest.param(dtype, mk.CONFIGS[np.dtype(np.float32)][0], id=name)
                       for dtype, name in ((np.float16, "float16"),
                                           (ml_dtypes.bfloat16, "bfloat16"))]


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


def test_tile_product_is_a_register_block():
    """The micro-kernel alone: c (+)= a · b on offsets and strides, float64 exact enough."""
    import numba

    mr, nr, depth = 3, 8, 5
    rng = np.random.default_rng(1)
    a, b = rng.standard_normal(4 + 2 * 7 + depth + 1), rng.standard_normal(2 + depth * 9 + nr)
    c = rng.standard_normal(1 + 2 * 10 + nr + 3)

    @numba.njit
    def run(a, b, c, accumulate):
        if accumulate:
            tile_product(a, 4, 7, b, 2, 9, c, 1, 10, depth, 3, 8, True)
        else:
            tile_product(a, 4, 7, b, 2, 9, c, 1, 10, depth, 3, 8, False)
    A = np.lib.stride_tricks.as_strided(a[4:], (mr, depth), (56, 8))
    B = np.lib.stride_tricks.as_strided(b[2:], (depth, nr), (72, 8))
    before = c.copy()
    run(a, b, c, True)
    C = np.lib.stride_tricks.as_strided(c[1:], (mr, nr), (80, 8))
    np.testing.assert_allclose(C, before[1:1 + 2 * 10 + nr].reshape(-1)[
        np.arange(mr)[:, None] * 10 + np.arange(nr)] + A @ B, rtol=1e-13)
    untouched = np.ones(c.size, bool)
    untouched[1 + np.arange(mr)[:, None] * 10 + np.arange(nr)] = False
    assert np.array_equal(c[untouched], before[untouched])
    run(a, b, c, False)
    np.testing.assert_allclose(C, A @ B, rtol=1e-13)


@pytest.mark.parametrize("dtype, config", CONFIGS)
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
