"""The numba kernel's tiling paths, against the reference.

The kernel walks keys in tiles (``BLOCK_K`` wide, ``BLOCK_K_DIAGONAL`` where a tile crosses
the causal diagonal) for blocks of ``BLOCK_Q`` queries, skips tiles that causal masks,
``key_lengths`` or a bool mask hide whole, trims rows that see nothing of a diagonal tile,
takes an unmasked path for tiles a bool mask shows whole, and falls back to a row-by-row
sum where a partly hidden tile's values are not all finite.  These tests shrink the tiles
(16 queries x 32 keys, 8 at the diagonal) so that small problems cross many tile
boundaries, and put sizes, key lengths and mask blocks exactly on, one before and one
after those boundaries.  Every result is judged by ``assert_matches_reference`` (output
and weights, with and without ``return_weights``; tolerance relative to a plain
implementation's own error).
"""

import os
import subprocess
import sys
from pathlib import Path

import numba
import numpy as np
import pytest

from attnbench import kernels
from attnbench.kernels._jit import math as jit_math
from attnbench.kernels.numba_cpu import config
from attnbench.kernels.numba_cpu.dense import backward, forward

from .support import DTYPES, Case, assert_matches_reference, make_inputs

BQ, BK, DK = 16, 32, 8  # the shrunk tiles: query block, key tile, key tile at the diagonal
REPO = Path(__file__).resolve().parents[1]

#: Tile geometries: (BLOCK_Q, MIN_BLOCK_Q, BLOCK_K, BLOCK_K_DIAGONAL).
TILES = {
    "small": (BQ, BQ, BK, DK),  # fixed 16 x 32 tiles, 8 at the diagonal
    "adaptive": (64, 8, BK, 16),  # query blocks halved for parallelism, down to 8
    "default": (config.BLOCK_Q, config.MIN_BLOCK_Q, config.BLOCK_K,
                config.BLOCK_K_DIAGONAL),
}


@pytest.fixture(params=["small-serial", "small-parallel", "adaptive-parallel"])
def tiles(request, monkeypatch):
    """The numba backend with shrunk tiles, through its serial or its parallel kernel."""
    geometry, path = request.param.split("-")
    block_q, min_block_q, block_k, diag_k = TILES[geometry]
    monkeypatch.setattr(config, "BLOCK_Q", block_q)
    monkeypatch.setattr(config, "MIN_BLOCK_Q", min_block_q)
    monkeypatch.setattr(config, "BLOCK_K", block_k)
    monkeypatch.setattr(config, "BLOCK_K_DIAGONAL", diag_k)
    monkeypatch.setattr(config, "SERIAL_WORK_LIMIT", 0 if path == "parallel" else np.inf)
    return "numba"


# --- sizes on tile boundaries --------------------------------------------------------------
# Lq around BQ (15, 16, 17, 31, 33), Lk around BK (31, 32, 33, 63, 64, 65), both ways.
BOUNDARY_SIZES = [
    Case("one tile exactly", Lq=BQ, Lk=BK),
    Case("tile - 1", Lq=BQ - 1, Lk=BK - 1),
    Case("tile + 1", Lq=BQ + 1, Lk=BK + 1),
    Case("two key tiles - 1", Lq=2 * BQ - 1, Lk=2 * BK - 1),
    Case("two key tiles", Lq=2 * BQ, Lk=2 * BK),
    Case("two key tiles + 1", Lq=2 * BQ + 1, Lk=2 * BK + 1),
    Case("Lq < Lk across tiles", Lq=BQ + 1, Lk=3 * BK + 1),
    Case("Lq > Lk across tiles", Lq=4 * BQ + 1, Lk=BK - 1),
    Case("one key", Lq=BQ + 1, Lk=1),
    Case("one query", Lq=1, Lk=2 * BK + 1),
    Case("D 1, Dv 3", Lq=BQ + 1, Lk=BK + 1, D=1, Dv=3),
    Case("D 59, Dv 64", Lq=2 * BQ + 3, Lk=2 * BK + 5, D=59, Dv=64),
    Case("GQA 6/2 B2", B=2, H=6, Hkv=2, Lq=BQ + 3, Lk=BK + 3),
]
# Each mask kind that changes which tiles are skipped, cut or trimmed.
TILING_MASKS = [
    Case("no mask"),
    Case("causal", causal=True),
    Case("causal bottom-right", causal="bottom-right"),
    Case("bool mask", mask="bool"),
    Case("float mask", mask="float"),
    Case("key_lengths", key_lengths="with-zero"),
    Case("causal + key_lengths + bool", causal=True, key_lengths="random", mask="bool"),
    Case("dropout + causal", causal="bottom-right", dropout_p=0.2),
]


def _combine(size, mask):
    return Case(**{**size.__dict__, **{k: v for k, v in mask.__dict__.items()
                                       if k in ("causal", "mask", "key_lengths", "dropout_p")},
                   "name": f"{size.name} / {mask.name}"})


BOUNDARY_CASES = [pytest.param(_combine(s, m), id=f"{s.name}-{m.name}")
                  for s in BOUNDARY_SIZES for m in TILING_MASKS]


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("case", BOUNDARY_CASES)
def test_tile_boundaries(case, dtype, tiles):
    q, k, v, kwargs = make_inputs(case, dtype, seed=7)
    assert_matches_reference(q, k, v, tiles, **kwargs)


# --- key lengths and causal alignments on tile boundaries -----------------------------------


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("causal", [False, True, "bottom-right"])
def test_key_lengths_on_tile_boundaries(causal, dtype, tiles):
    """Each batch entry ends its keys just before, on, or just after a tile edge (or at 0)."""
    lengths = [0, 1, BK - 1, BK, BK + 1, 2 * BK, 2 * BK + 1, 3 * BK]
    B = len(lengths)
    rng = np.random.default_rng(3)
    q = rng.standard_normal((B, 2, 2 * BQ + 1, 8)).astype(dtype)
    k = rng.standard_normal((B, 2, 3 * BK, 8)).astype(dtype)
    v = rng.standard_normal((B, 2, 3 * BK, 8)).astype(dtype)
    assert_matches_reference(q, k, v, tiles, causal=causal, key_lengths=np.array(lengths))


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("causal", [True, "bottom-right"])
@pytest.mark.parametrize("Lq, Lk", [(BQ, 2 * BK), (2 * BK, BQ), (BQ + 1, BK - 1),
                                    (BK - 1, BQ + 1), (3 * BQ, 3 * BQ + DK),
                                    (3 * BQ + DK, 3 * BQ), (BK + DK + 1, BK)])
def test_causal_alignments_with_lq_ne_lk(Lq, Lk, causal, dtype, tiles):
    """Top-left and bottom-right diagonals cross tiles at every offset; some rows see nothing."""
    q, k, v, kwargs = make_inputs(Case("causal", H=2, Lq=Lq, Lk=Lk, D=8, causal=causal), dtype)
    assert_matches_reference(q, k, v, tiles, **kwargs)


# --- masks that cover whole tiles ------------------------------------------------------------


def _block_mask(Lq, Lk, visible_blocks):
    """A bool mask (Lq, Lk), True on the (query block, key tile) pairs listed."""
    mask = np.zeros((Lq, Lk), dtype=bool)
    for qb, kb in visible_blocks:
        mask[qb * BQ:(qb + 1) * BQ, kb * BK:(kb + 1) * BK] = True
    return mask


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("name, mask", [
    ("block diagonal", _block_mask(4 * BQ, 2 * BK, [(0, 0), (1, 0), (2, 1), (3, 1)])),
    ("one tile visible", _block_mask(2 * BQ, 3 * BK, [(1, 1)])),
    ("whole tiles hidden, rows empty", _block_mask(3 * BQ, 2 * BK, [(0, 1), (2, 0)])),
    ("all visible", np.ones((2 * BQ + 1, 2 * BK + 1), dtype=bool)),
    ("all hidden", np.zeros((BQ + 1, BK + 1), dtype=bool)),
    ("tile-aligned tril", np.kron(np.tril(np.ones((4, 2), dtype=bool)),
                                  np.ones((BQ, BK), dtype=bool))),
])
def test_bool_masks_covering_whole_tiles(name, mask, dtype, tiles):
    Lq, Lk = mask.shape
    rng = np.random.default_rng(4)
    q = rng.standard_normal((1, 2, Lq, 8)).astype(dtype)
    k = rng.standard_normal((1, 2, Lk, 8)).astype(dtype)
    v = rng.standard_normal((1, 2, Lk, 8)).astype(dtype)
    assert_matches_reference(q, k, v, tiles, mask=mask)
    assert_matches_reference(q, k, v, tiles, mask=mask, causal="bottom-right")


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
def test_float_mask_without_minus_inf_is_still_added(dtype, tiles):
    """A float mask that hides nothing still adds to every score (no 'fully visible' shortcut)."""
    rng = np.random.default_rng(5)
    q, k, v = (rng.standard_normal((1, 2, 2 * BK + 1, 8)).astype(dtype) for _ in range(3))
    mask = (3 * rng.standard_normal((2 * BK + 1, 2 * BK + 1))).astype(dtype)
    assert_matches_reference(q, k, v, tiles, mask=mask)
    mask[:BQ, :BK] = -np.inf  # and with one whole tile hidden
    assert_matches_reference(q, k, v, tiles, mask=mask)


# --- non-finite keys and values in partly hidden tiles --------------------------------------


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("where", ["causal diagonal", "key_lengths tail", "bool mask"])
@pytest.mark.parametrize("bad", [np.nan, np.inf])
def test_non_finite_hidden_keys_and_values(where, bad, dtype, tiles):
    """NaN/inf stored where a tile hides them never reaches rows that cannot see them."""
    rng = np.random.default_rng(6)
    L = 2 * BK + 3
    q, k, v = (rng.standard_normal((2, 2, L, 8)).astype(dtype) for _ in range(3))
    kwargs = {}
    if where == "causal diagonal":  # key BK + 5: hidden for rows < BK + 5 of the same tile
        k[:, :, BK + 5], v[:, :, BK + 5] = bad, bad
        kwargs["causal"] = True
    elif where == "key_lengths tail":  # past each batch entry's last key, inside a tile
        k[:, :, BK + 2:], v[:, :, BK + 2:] = bad, bad
        kwargs["key_lengths"] = np.array([BK + 2, BK - 1])
    else:  # keys 3 and BK + 1 hidden from every second query
        k[:, :, [3, BK + 1]], v[:, :, [3, BK + 1]] = bad, bad
        mask = np.ones((L, L), dtype=bool)
        mask[::2, [3, BK + 1]] = False
        kwargs["mask"] = mask
    assert_matches_reference(q, k, v, tiles, **kwargs)


# --- the loops that replace the BLAS without SciPy -----------------------------------------


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("case", [BOUNDARY_CASES[i] for i in (9, 17, 27, 44, 60, 86, 95)])
def test_loops_instead_of_blas(case, dtype, tiles, monkeypatch):
    """The tile products as Numba loops (what runs where SciPy is missing)."""
    monkeypatch.setattr(config, "HAVE_BLAS", False)
    q, k, v, kwargs = make_inputs(case, dtype, seed=8)
    assert_matches_reference(q, k, v, tiles, **kwargs)


@pytest.mark.slow
def test_kernel_runs_without_scipy(tmp_path):
    """With SciPy hidden, the numba backend compiles its loops-only kernel and agrees."""
    script = (
        "import importlib.util, sys\n"
        "find = importlib.util.find_spec\n"
        "importlib.util.find_spec = lambda name, *a: None if name == 'scipy' else find(name, *a)\n"
        "sys.modules['scipy'] = None\n"
        "import numpy as np\n"
        "from attnbench.kernels.numba_cpu import config\n"
        "assert not config.HAVE_BLAS\n"
        "from tests.support import Case, make_inputs, assert_matches_reference\n"
        "for causal in (False, True):\n"
        "    case = Case('no scipy', B=2, H=2, Lq=70, Lk=300, D=16, causal=causal,\n"
        "                key_lengths='random')\n"
        "    q, k, v, kwargs = make_inputs(case, np.float32)\n"
        "    config.SERIAL_WORK_LIMIT = 0\n"
        "    assert_matches_reference(q, k, v, 'numba', **kwargs)\n"
        "assert 'scipy.linalg' not in sys.modules\n"
    )
    env = dict(os.environ, PYTHONPATH=str(REPO), NUMBA_CACHE_DIR=str(tmp_path))
    result = subprocess.run([sys.executable, "-c", script], cwd=REPO, env=env,
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr


# --- the pieces -------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
def test_fast_exp_is_accurate_to_about_one_ulp(dtype):
    """The kernel's exp, on x <= 0 (the softmax's arguments): <= 1.1 ulp, flushed below tiny."""
    from numba import njit

    @njit(fastmath=jit_math.FASTMATH)
    def exp_all(x, out):
        for i in range(x.size):
            out[i] = jit_math.fast_exp(x[i])

    tiny = np.finfo(dtype).tiny
    x = np.concatenate([np.linspace(-30, 0, 200_001), np.linspace(np.log(tiny) - 5, 0, 100_001),
                        [-np.inf, np.nan, -0.0]]).astype(dtype)
    got = np.empty_like(x)
    exp_all(x, got)
    exact = np.exp(x[:-3].astype(np.longdouble))
    normal = exact >= tiny
    ulps = np.abs(got[:-3] - exact) / np.spacing(exact.astype(dtype))
    assert ulps[normal].max() <= 1.1
    assert (got[:-3][~normal] == 0).all()  # below the smallest normal: flushed to 0
    assert got[-3] == 0 and np.isnan(got[-2]) and got[-1] == 1


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
def test_integer_max_keys_order_as_the_floats(dtype):
    from numba import njit

    @njit
    def keys(x):
        out = np.empty(x.size, dtype=np.int64)
        back = np.empty_like(x)
        for i in range(x.size):
            out[i] = jit_math.max_key(x[i])
            back[i] = jit_math.from_max_key(jit_math.max_key(x[i]))
        return out, back

    x = np.array([-np.inf, -3.5, -1e-30, 0.0, 1e-30, 2.0, 7.5, np.inf], dtype=dtype)
    k, back = keys(x)
    assert (np.diff(k) > 0).all()
    np.testing.assert_array_equal(back, x)


def test_bool_masks_reach_the_backends_as_given():
    """A bool mask is kept as bool; each other form is built only when asked for."""
    q = np.ones((1, 2, 5, 4), np.float32)
    mask = np.tril(np.ones((5, 5), dtype=bool))
    problem = kernels.prepare(q, q, q, mask=mask)
    assert problem.mask_is_bool
    assert problem.mask.dtype == np.bool_ and problem.mask.shape == (1, 1, 5, 5)
    assert problem.visibility_mask() is problem.mask  # no copy
    additive = problem.additive_mask()
    assert additive.dtype == np.float32
    np.testing.assert_array_equal(additive[0, 0], np.where(mask, 0, -np.inf))
    np.testing.assert_array_equal(problem.visible()[0, 0], mask)
    float_problem = kernels.prepare(q, q, q, mask=additive[0, 0])
    assert not float_problem.mask_is_bool and float_problem.mask.dtype == np.float32
    assert float_problem.additive_mask() is float_problem.mask
    np.testing.assert_array_equal(float_problem.visibility_mask(), problem.mask)
    assert kernels.prepare(q, q, q).additive_mask() is None


def test_block_rows_leave_every_thread_two_tasks(monkeypatch):
    monkeypatch.setattr(config, "BLOCK_Q", 256)
    monkeypatch.setattr(config, "MIN_BLOCK_Q", 32)

    def rows(B, H, L, threads):
        q = np.zeros((B, H, L, 4), np.float32)
        return forward.block_rows(kernels.prepare(q, q, q), threads)

    assert rows(1, 12, 4096, 2) == 256  # plenty of tasks
    assert rows(1, 1, 512, 2) == 128  # 4 tasks
    assert rows(1, 1, 64, 2) == 32  # never below MIN_BLOCK_Q


def test_one_kernel_serves_no_mask_and_every_bool_mask():
    """Numba types a read-only array apart from a writable one: a caller's writable mask, a
    read-only one and a mask that varies along the batch (a ``broadcast_to`` view inside
    ``kernels.prepare``) must all run the one compiled kernel, and so must a call without
    a mask (its placeholder is a bool array; the flag says there is none)."""
    rng = np.random.default_rng(3)
    q = rng.standard_normal((2, 2, 20, 8)).astype(np.float32)
    writable = rng.random((2, 2, 20, 20)) < 0.8
    read_only = np.broadcast_to(rng.random((1, 1, 20, 20)) < 0.8, (2, 1, 20, 20))
    masks = (None, writable, read_only, writable[:, :1])
    types = {numba.typeof(forward.mask_arguments(kernels.prepare(q, q, q, mask=m))[0])
             for m in masks}
    assert len(types) == 1 and not types.pop().mutable
    for mask in masks:
        kernels.attention(q, q, q, mask=mask, backend="numba")
        kernels.attention_backward(q, q, q, np.ones_like(q), mask=mask, backend="numba")
    for kernel, position in ((forward._attention_serial, 3), (backward.KERNELS[1], 6)):
        seen = {signature[position] for signature in kernel.signatures}
        assert seen and not any(m.mutable for m in seen), seen
