"""Score and mask functions (``kernels.mods``): built-ins, user functions, block sparsity.

Three kinds of checks:

- every built-in through ``backend="reference"`` against the same variant written as a
  dense bool ``mask`` or float bias (or, for soft-capping, the formula in NumPy);
- the numba backend against the oracle (the reference evaluating the functions densely),
  under the baseline-relative tolerance of ``tests/support.py``, on odd sizes, Lq != Lk,
  GQA, windows and documents whose edges fall on the kernel's 64-key cells;
- what must not happen: a recompilation for other bound values, a hidden key read
  (NaN there changes no output bit), a bad function getting past validation.

Every distinct function structure compiles the kernel once (~10 s), so the cases share
structures where they can.
"""

from __future__ import annotations

import numpy as np
import pytest

from attnbench import kernels
from attnbench.kernels import mods
from attnbench.kernels.numba_cpu import choose, config
from attnbench.kernels.numba_cpu.dense import forward as _numba_mods

from .support import DTYPES, assert_matches_reference, max_error, oracle, tolerance

CELL = config.CELL_K  # 64: the kernel's unit of tile classification


def _qkv(B=2, H=4, Hkv=2, Lq=150, Lk=None, D=16, dtype=np.float32, seed=0):
    rng = np.random.default_rng(seed)
    Lk = Lq if Lk is None else Lk
    return (rng.standard_normal((B, H, Lq, D)).astype(dtype),
            rng.standard_normal((B, Hkv, Lk, D)).astype(dtype),
            rng.standard_normal((B, Hkv, Lk, D)).astype(dtype))


def _ij(Lq, Lk):
    return np.arange(Lq)[:, None], np.arange(Lk)[None, :]


def _window_mask(Lq, Lk, left, right):
    i, j = _ij(Lq, Lk)
    return (j >= i - left) & (j <= i + right)


def _documents(B, L, boundaries_per_batch):
    """doc ids (B, L): batch b starts a new document at each of its boundaries."""
    ids = np.zeros((B, L), dtype=np.int64)
    for b, bounds in enumerate(boundaries_per_batch):
        for start in bounds:
            ids[b, start:] += 1
    return ids


def _doc_mask(ids):
    return ids[:, None, :, None] == ids[:, None, None, :]  # (B, 1, L, L)


def _assert_same(a, b, dtype):
    """Two reference results of one variant written two ways: equal up to rounding."""
    np.testing.assert_allclose(a, b, rtol=8 * np.finfo(dtype).eps, atol=8 * np.finfo(dtype).eps)


# --- built-ins against their dense equivalents, through the reference ----------------------------

DOCS = _documents(2, 150, [[CELL, 2 * CELL], [1, 2, 3, 77, 149]])  # edges on cells; 1-token docs


def _mask_builtins(B, H, Lq, Lk):
    """(name, mask_mod, the same as a dense bool mask) for a problem's shape."""
    rng = np.random.default_rng(5)
    prefix = rng.integers(0, Lk + 1, size=B)
    i, j = _ij(Lq, Lk)
    cases = [
        ("window 0", mods.sliding_window(0), _window_mask(Lq, Lk, 0, 0)),
        ("window 63 right 5", mods.sliding_window(63, 5), _window_mask(Lq, Lk, 63, 5)),
        ("window 64", mods.sliding_window(CELL), _window_mask(Lq, Lk, CELL, 0)),
        ("window 65", mods.sliding_window(CELL + 1), _window_mask(Lq, Lk, CELL + 1, 0)),
        ("window L", mods.sliding_window(Lk), _window_mask(Lq, Lk, Lk, 0)),
        ("prefix_lm", mods.prefix_lm(prefix),
         (j < prefix[:, None, None, None]) | (j <= i)),
    ]
    if Lq == Lk == DOCS.shape[1] and B == DOCS.shape[0]:
        cases += [
            ("document", mods.document(DOCS), _doc_mask(DOCS)),
            ("document and window 40", mods.and_masks(mods.document(DOCS), mods.sliding_window(40)),
             _doc_mask(DOCS) & _window_mask(Lq, Lk, 40, 0)),
            ("prefix or window", mods.or_masks(mods.prefix_lm(prefix), mods.sliding_window(10, 3)),
             ((j < prefix[:, None, None, None]) | (j <= i)) | _window_mask(Lq, Lk, 10, 3)),
        ]
    return cases


def _score_builtins(B, H, Lq, Lk, dtype):
    """(name, score_mod, the same as a float bias (H, Lq, Lk)) for the additive built-ins."""
    slopes = 2.0 ** (-8.0 * np.arange(1, H + 1) / H)
    R = 7
    table = np.random.default_rng(6).standard_normal((H, 2 * R + 1))
    i, j = _ij(Lq, Lk)
    return [
        ("alibi", mods.alibi(slopes), slopes[:, None, None] * (j - i)),
        ("relative_bias", mods.relative_bias(table), table[:, np.clip(j - i, -R, R) + R]),
    ]


REF_SHAPES = [dict(B=2, H=4, Hkv=2, Lq=150, Lk=150, D=16),
              dict(B=2, H=2, Hkv=1, Lq=37, Lk=150, D=9)]


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("shape", REF_SHAPES, ids=lambda s: f"{s['Lq']}x{s['Lk']}")
def test_mask_builtins_equal_their_dense_masks_in_the_reference(shape, dtype):
    q, k, v = _qkv(**shape, dtype=dtype)
    B, H, Lq, Lk = shape["B"], shape["H"], shape["Lq"], shape["Lk"]
    for name, mod, dense in _mask_builtins(B, H, Lq, Lk):
        np.testing.assert_array_equal(mod.dense(B, H, Lq, Lk),
                                      np.broadcast_to(dense, (B, H, Lq, Lk)), err_msg=name)
        for causal in (False, True):
            ours = kernels.attention(q, k, v, mask_mod=mod, causal=causal, backend="reference")
            theirs = kernels.attention(q, k, v, mask=dense, causal=causal, backend="reference")
            _assert_same(ours, theirs, dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("shape", REF_SHAPES, ids=lambda s: f"{s['Lq']}x{s['Lk']}")
def test_score_builtins_equal_their_dense_biases_in_the_reference(shape, dtype):
    q, k, v = _qkv(**shape, dtype=dtype)
    B, H, Lq, Lk = shape["B"], shape["H"], shape["Lq"], shape["Lk"]
    for _name, mod, bias in _score_builtins(B, H, Lq, Lk, dtype):
        for causal in (False, "bottom-right"):
            ours = kernels.attention(q, k, v, score_mod=mod, causal=causal, backend="reference")
            theirs = kernels.attention(q, k, v, mask=bias.astype(dtype), causal=causal,
                                       backend="reference")
            _assert_same(ours, theirs, dtype)


def _softcap_formula(q, k, v, cap, bias=None):
    """softmax(cap · tanh(s / cap) [+ bias]) v in float64, written out."""
    q, k, v = (x.astype(np.float64) for x in (q, k, v))
    group = q.shape[1] // k.shape[1]
    k, v = np.repeat(k, group, axis=1), np.repeat(v, group, axis=1)
    s = q @ k.swapaxes(-1, -2) / np.sqrt(q.shape[-1])
    if bias is not None:
        s = s + bias
    s = cap * np.tanh(s / cap)
    p = np.exp(s - s.max(-1, keepdims=True))
    return (p / p.sum(-1, keepdims=True)) @ v


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
def test_softcap_and_chain_equal_the_formula_in_the_reference(dtype):
    q, k, v = _qkv(Lq=37, Lk=50, dtype=dtype)
    q *= 4  # scores of a few units: the cap of 2 bends them
    slopes = np.array([0.5, 0.25, 0.125, 0.0625])
    i, j = _ij(37, 50)
    bias = slopes[:, None, None] * (j - i)
    chained = mods.chain(mods.alibi(slopes), mods.softcap(2.0))
    for mod, b in [(mods.softcap(2.0), None), (chained, bias)]:
        ours = kernels.attention(q, k, v, score_mod=mod, backend="reference")
        _assert_same(ours, _softcap_formula(q, k, v, 2.0, b).astype(dtype), dtype)


# --- the numba kernel against the oracle ---------------------------------------------------------


@pytest.fixture
def serial(monkeypatch):
    """Small problems run the serial kernel anyway; make that explicit."""
    monkeypatch.setattr(config, "SERIAL_WORK_LIMIT", float("inf"))


NUMBA_SHAPES = [
    dict(B=2, H=4, Hkv=2, Lq=150, Lk=150, D=16),  # GQA, 3 cells with a ragged last one
    dict(B=2, H=2, Hkv=1, Lq=37, Lk=150, D=9),  # Lq < Lk
    dict(B=1, H=2, Hkv=2, Lq=150, Lk=70, D=7),  # Lq > Lk
]


# float32 only: a mask function's code has no dtype (it sees indices), and every kernel
# dtype runs with mask functions in test_numba_mods_combine_with_every_other_mask; a mask
# structure is a kernel specialisation (~7 s to compile) per dtype.
@pytest.mark.parametrize("dtype", [np.float32], ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("shape", NUMBA_SHAPES, ids=lambda s: f"{s['Lq']}x{s['Lk']}")
def test_numba_mask_builtins_match_the_oracle(serial, shape, dtype):
    q, k, v = _qkv(**shape, dtype=dtype)
    B, H, Lq, Lk = shape["B"], shape["H"], shape["Lq"], shape["Lk"]
    for _name, mod, _ in _mask_builtins(B, H, Lq, Lk):
        for causal in (False, True, "bottom-right"):
            assert_matches_reference(q, k, v, "numba", mask_mod=mod, causal=causal)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("shape", NUMBA_SHAPES, ids=lambda s: f"{s['Lq']}x{s['Lk']}")
def test_numba_score_builtins_match_the_oracle(serial, shape, dtype):
    q, k, v = _qkv(**shape, dtype=dtype)
    B, H, Lq, Lk = shape["B"], shape["H"], shape["Lq"], shape["Lk"]
    scored = [(name, mod) for name, mod, _ in _score_builtins(B, H, Lq, Lk, dtype)]
    scored += [("softcap", mods.softcap(0.5)),
               ("alibi then softcap", mods.chain(scored[0][1], mods.softcap(0.5)))]
    for _name, mod in scored:
        for causal in (False, True):
            assert_matches_reference(q, k, v, "numba", score_mod=mod, causal=causal)


COMBINED = [
    # (name, keywords): mods with every other kind of mask, dropout and key lengths
    ("window+alibi+lengths", lambda B, H, L: dict(
        mask_mod=mods.sliding_window(CELL - 1), score_mod=mods.alibi(np.linspace(0.1, 1, H)),
        key_lengths=np.array([L, L // 2 + 3])[:B])),
    ("window+bool mask+dropout", lambda B, H, L: dict(
        mask_mod=mods.sliding_window(CELL + 1, 2),
        mask=np.random.default_rng(1).random((L, L)) < 0.8,
        dropout_p=0.2, seed=7, causal=True)),
    ("document+float mask+softcap", lambda B, H, L: dict(
        mask_mod=mods.document(DOCS), score_mod=mods.softcap(1.5),
        mask=np.random.default_rng(2).standard_normal((H, L, L)).astype(np.float32), causal=True)),
]


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("name, make", COMBINED, ids=[c[0] for c in COMBINED])
def test_numba_mods_combine_with_every_other_mask(serial, name, make, dtype):
    q, k, v = _qkv(dtype=dtype)
    kwargs = make(2, 4, 150)
    if "mask" in kwargs and kwargs["mask"].dtype.kind == "f":
        kwargs["mask"] = kwargs["mask"].astype(dtype)
    assert_matches_reference(q, k, v, "numba", **kwargs)


@pytest.mark.parametrize("use_blas", [True, False], ids=["blas", "loops"])
def test_numba_parallel_kernel(use_blas):
    """The parallel kernel (and the loops of a machine without SciPy) on one combination."""
    if use_blas and not config.HAVE_BLAS:
        pytest.skip("SciPy is missing")
    q, k, v = _qkv(Lq=150, D=16)
    kwargs = dict(mask_mod=mods.sliding_window(CELL + 1, 2), score_mod=mods.softcap(0.5),
                  causal=True, key_lengths=np.array([150, 100]))
    (exact, _), (plain, _) = oracle(q, k, v, **kwargs)
    problem = kernels.prepare(q, k, v, **kwargs)
    out, _ = _numba_mods.run_tiles(problem, parallel=True, use_blas=use_blas)
    assert max_error(out, exact) <= tolerance(exact, plain, q.dtype)


@pytest.mark.slow  # user functions compile per process: left out of the quick lane
def test_rows_that_see_nothing_get_zero():
    q, k, v = _qkv(Lq=20, Lk=20, dtype=np.float64)
    # odd rows see nothing (the mask function), nor does batch 1 (key_lengths 0)
    odd_rows_blind = mods.mask_mod(lambda b, h, qi, ki: qi % 2 == 0)
    out = kernels.attention(q, k, v, mask_mod=odd_rows_blind, key_lengths=[20, 0],
                            backend="numba")
    assert np.all(out[:, :, 1::2] == 0) and np.all(out[1] == 0)
    assert np.all(out[0, :, ::2] != 0)
    assert_matches_reference(q, k, v, "numba", mask_mod=odd_rows_blind, key_lengths=[20, 0])


# --- user functions ------------------------------------------------------------------------------


def same_document(b, h, q_idx, kv_idx, doc_ids):
    return doc_ids[b, q_idx] == doc_ids[b, kv_idx]


def head_bias(score, b, h, q_idx, kv_idx, bias):
    return score + bias[h, q_idx % bias.shape[1]]


@pytest.mark.slow  # user functions compile per process: left out of the quick lane
def test_user_functions_with_bound_arrays_match_the_builtins(serial):
    q, k, v = _qkv()
    user = mods.mask_mod(same_document, DOCS)
    out = kernels.attention(q, k, v, mask_mod=user, causal=True, backend="numba")
    builtin = kernels.attention(q, k, v, mask_mod=mods.document(DOCS), causal=True,
                                backend="numba")
    # Not bit equality: the built-in kernel may come from Numba's disk cache and the user kernel
    # from a fresh compile, and with reassociation allowed the two need not round alike.  Both
    # must meet the reference's tolerance, and agree with each other within it.
    (exact, _), (plain, _) = oracle(q, k, v, mask_mod=mods.document(DOCS), causal=True)
    tol = tolerance(exact, plain, q.dtype)
    assert max_error(out, exact) <= tol and max_error(builtin, exact) <= tol
    assert max_error(out, builtin) <= 2 * tol
    assert_matches_reference(q, k, v, "numba", mask_mod=user, causal=True)


@pytest.mark.slow  # user functions compile per process: left out of the quick lane
def test_bound_arrays_change_without_recompiling(serial):
    """Other values and other shapes of the same dtype and rank reuse the compiled kernel."""
    q, k, v = _qkv()
    kernel = _numba_mods._attention_serial_user
    bias = np.zeros((4, 3), np.float32)
    kernels.attention(q, k, v, score_mod=mods.score_mod(head_bias, bias), backend="numba")
    compiled = len(kernel.signatures)
    rng = np.random.default_rng(3)
    for shape in [(4, 3), (4, 5), (4, 1)]:
        bias = rng.standard_normal(shape).astype(np.float32)
        docs = np.sort(rng.integers(0, 4, size=(2, 150)), axis=1)
        for mask_mod in (None, mods.mask_mod(same_document, docs)):
            kwargs = dict(score_mod=mods.score_mod(head_bias, bias), mask_mod=mask_mod)
            assert_matches_reference(q, k, v, "numba", **kwargs)
    # one more for the (document, bias) pair's first call, none for values or shapes
    assert len(kernel.signatures) == compiled + 1
    # built-ins (their kernel is the one cached on disk): other windows
    kernel = _numba_mods._attention_serial
    kernels.attention(q, k, v, mask_mod=mods.sliding_window(3), backend="numba")
    compiled = len(kernel.signatures)
    for left in (0, 7, 200):
        kernels.attention(q, k, v, mask_mod=mods.sliding_window(left, 1), backend="numba")
    assert len(kernel.signatures) == compiled


def test_plain_function_passed_directly(serial):
    q, k, v = _qkv(Lq=30, dtype=np.float64)

    def local(b, h, q_idx, kv_idx):
        return kv_idx <= q_idx - 2 or kv_idx == q_idx

    def halve(score, b, h, q_idx, kv_idx):
        return score * 0.5

    assert_matches_reference(q, k, v, "numba", mask_mod=local, score_mod=halve)
    i, j = _ij(30, 30)
    dense = kernels.attention(q, k, v, mask=(j <= i - 2) | (j == i), scale=0.5 / 4,
                              backend="reference")
    _assert_same(kernels.attention(q, k, v, mask_mod=local, score_mod=halve, backend="numba"),
                 dense, np.float32)  # the kernel's own float64 rounding: far below this


# --- bad functions -------------------------------------------------------------------------------


def _three_args(b, h, q_idx):
    return True


def _returns_array(b, h, q_idx, kv_idx):
    return np.zeros(3)


def _returns_float(b, h, q_idx, kv_idx):
    return 1.5


def _calls_python(b, h, q_idx, kv_idx):
    import json  # noqa: F401  (Numba cannot compile an import inside a function)
    return True


def _score_returns_bool(score, b, h, q_idx, kv_idx):
    return score > 0


BAD_FUNCTIONS = [
    # (what, keywords, error, regex the message matches)
    ("wrong arity", dict(mask_mod=_three_args), TypeError, r"mask_mod '_three_args' must take"),
    ("bound arrays missing", dict(mask_mod=same_document),
     TypeError, r"mask_mod 'same_document' must take"),
    ("returns an array", dict(mask_mod=_returns_array), TypeError,
     r"mask_mod '_returns_array' must return a bool"),
    ("returns a float", dict(mask_mod=_returns_float), TypeError,
     r"mask_mod '_returns_float' must return a bool"),
    ("not compilable", dict(mask_mod=_calls_python), TypeError,
     r"Numba cannot compile mask_mod '_calls_python'"),
    ("score returns bool", dict(score_mod=_score_returns_bool), TypeError,
     r"score_mod '_score_returns_bool' must return a float"),
    ("not a function", dict(mask_mod=42), TypeError, "mask_mod must be a Python function"),
    ("mask as score", dict(score_mod=mods.sliding_window(3)), TypeError, "is a mask function"),
    ("score as mask", dict(mask_mod=mods.softcap(3.0)), TypeError, "is a score function"),
    ("alibi slopes per head", dict(score_mod=mods.alibi([1.0, 2.0, 3.0])), ValueError,
     r"3 slopes for 4 query heads"),
    ("document Lq != Lk", dict(mask_mod=mods.document(np.zeros((2, 150), int))), ValueError,
     r"Lq = Lk = L"),
    ("block mask of another shape",
     dict(mask_mod=mods.block_mask(mods.sliding_window(2), 2, 4, 64, 64)),
     ValueError, r"computed for .* Lq=64"),
]


@pytest.mark.parametrize("backend", ["reference", "numba"])
@pytest.mark.parametrize("kwargs, error, match", [c[1:] for c in BAD_FUNCTIONS],
                         ids=[c[0] for c in BAD_FUNCTIONS])
def test_bad_functions_fail_before_any_work(kwargs, error, match, backend, monkeypatch):
    q, k, v = _qkv(Lq=20, Lk=30)

    def no_kernel(*args, **kw):
        raise AssertionError("a kernel ran")

    monkeypatch.setattr(choose, "run", no_kernel)
    from attnbench.kernels.reference import forward as reference
    monkeypatch.setattr(reference, "run", no_kernel)
    with pytest.raises(error, match=match):
        kernels.attention(q, k, v, backend=backend, **kwargs)


def _raises_late(b, h, q_idx, kv_idx):
    if q_idx == 17:
        raise ValueError("position 17 is cursed")
    return True


def _score_raises(score, b, h, q_idx, kv_idx):
    if kv_idx == 3:
        raise KeyError("no key 3")
    return score


@pytest.mark.parametrize("parallel", [False, True], ids=["serial", "parallel"])
def test_exception_inside_a_function_is_a_value_error_naming_it(parallel):
    q, k, v = _qkv(Lq=20, Lk=30)
    problem = kernels.prepare(q, k, v, mask_mod=_raises_late)
    with pytest.raises(ValueError, match=r"mask_mod '_raises_late' raised ValueError: position "
                                         r"17 is cursed") as info:
        _numba_mods.run_tiles(problem, parallel=parallel)
    assert isinstance(info.value.__cause__, ValueError)
    with pytest.raises(ValueError, match=r"score_mod '_score_raises' raised KeyError") as info:
        kernels.attention(q, k, v, score_mod=_score_raises, backend="reference")
    assert isinstance(info.value.__cause__, KeyError)


# --- hidden keys are never read ------------------------------------------------------------------


@pytest.mark.parametrize("garbage", [np.nan, np.inf, 1e30], ids=["nan", "inf", "huge"])
@pytest.mark.parametrize("use_blas", [True, False], ids=["blas", "loops"])
def test_keys_hidden_by_a_mask_function_are_never_read(serial, monkeypatch, garbage, use_blas):
    """Keys another document owns, and keys left of a window, hold garbage: no bit changes."""
    monkeypatch.setattr(config, "HAVE_BLAS", use_blas and config.HAVE_BLAS)
    q, k, v = _qkv(B=2, H=2, Hkv=2, Lq=150, D=8)
    ids = _documents(2, 150, [[CELL, 2 * CELL], [CELL, 2 * CELL]])
    doc = mods.document(ids)
    window = mods.sliding_window(CELL - 1)
    for mask_mod, rows, cols in [(doc, slice(0, CELL), slice(CELL, None)),
                                 (window, slice(2 * CELL, None), slice(0, CELL))]:
        before = kernels.attention(q, k, v, mask_mod=mask_mod, causal=True, backend="numba")
        k2, v2 = k.copy(), v.copy()
        k2[:, :, cols] = garbage
        v2[:, :, cols] = garbage
        after = kernels.attention(q, k2, v2, mask_mod=mask_mod, causal=True, backend="numba")
        np.testing.assert_array_equal(after[:, :, rows], before[:, :, rows])


@pytest.mark.parametrize("garbage", [np.nan, np.inf, -np.inf], ids=["nan", "inf", "-inf"])
@pytest.mark.parametrize("use_blas", [True, False], ids=["blas", "loops"])
def test_garbage_in_partly_hidden_tiles_changes_no_visible_bit(serial, monkeypatch, garbage,
                                                                use_blas):
    """A window of 37 keys (not a multiple of any tile): keys 0..39 hold garbage; rows from
    77 on do not see them, but share the key tiles that hold them with keys they see."""
    monkeypatch.setattr(config, "HAVE_BLAS", use_blas and config.HAVE_BLAS)
    q, k, v = _qkv(B=1, H=2, Hkv=1, Lq=150, D=8)
    for mask_mod in (mods.sliding_window(37), mods.alibi(np.ones(2))):
        kw = ({"mask_mod": mask_mod} if isinstance(mask_mod, mods.MaskMod)
              else {"score_mod": mask_mod, "mask_mod": mods.sliding_window(37)})
        before = kernels.attention(q, k, v, backend="numba", **kw)
        k2, v2 = k.copy(), v.copy()
        k2[:, :, :40] = garbage
        v2[:, :, :40] = garbage
        after = kernels.attention(q, k2, v2, backend="numba", **kw)
        np.testing.assert_array_equal(after[:, :, 77:], before[:, :, 77:])
        assert not np.isfinite(after[:, :, :40]).all()  # rows that see the garbage get it


# --- block masks ---------------------------------------------------------------------------------


def test_block_mask_classifies_cells_exactly_for_user_functions():
    ids = _documents(2, 150, [[CELL, 2 * CELL], [10, 100]])
    user = mods.mask_mod(same_document, ids)
    bm = mods.block_mask(user, 2, None, 150, 150)
    dense = user.dense(2, 1, 150, 150)
    for b in range(2):
        for ci in range(bm.table.shape[2]):
            for cj in range(bm.table.shape[3]):
                cell = dense[b, 0, ci * CELL:(ci + 1) * CELL, cj * CELL:(cj + 1) * CELL]
                want = mods.EMPTY if not cell.any() else (mods.FULL if cell.all() else mods.PARTIAL)
                assert bm.table[b, 0, ci, cj] == want, (b, ci, cj)
    assert bm.seconds >= 0 and 0 < bm.density() < 1
    # the built-in's analytic classification is the same for contiguous documents
    np.testing.assert_array_equal(mods.block_mask(mods.document(ids), 2, None, 150, 150).table,
                                  bm.table)


@pytest.mark.slow  # user functions compile per process: left out of the quick lane
def test_block_mask_reused_gives_the_mask_functions_result(serial):
    q, k, v = _qkv()
    user = mods.mask_mod(same_document, DOCS)
    bm = mods.block_mask(user, 2, None, 150, 150)
    direct = kernels.attention(q, k, v, mask_mod=user, causal=True, backend="numba")
    for _ in range(2):
        np.testing.assert_array_equal(
            kernels.attention(q, k, v, mask_mod=bm, causal=True, backend="numba"), direct)
    assert_matches_reference(q, k, v, "numba", mask_mod=bm, causal=True)


def test_block_mask_skips_empty_cells():
    """NaN keys in cells the block mask calls empty cannot reach the output."""
    ids = _documents(1, 150, [[CELL, 2 * CELL]])
    bm = mods.block_mask(mods.mask_mod(same_document, ids), 1, 1, 150, 150)
    q, k, v = _qkv(B=1, H=1, Hkv=1)
    before = kernels.attention(q, k, v, mask_mod=bm, backend="numba")
    k2 = k.copy()
    k2[..., CELL:, :] = np.nan  # keys of documents 1 and 2
    after = kernels.attention(q, k2, v, mask_mod=bm, backend="numba")
    np.testing.assert_array_equal(after[..., :CELL, :], before[..., :CELL, :])


def _never_called(b, h, q_idx, kv_idx):
    if q_idx >= 0:  # always; written so that Numba types the function as returning a bool
        raise RuntimeError("the element function ran")
    return True


def test_block_mask_cells_skip_the_element_function(serial):
    """Documents on cell edges: every cell is empty or full, so the kernel never evaluates
    the mask function per element (here one that raises), and skips the empty cells."""
    ids = _documents(1, 150, [[CELL, 2 * CELL]])
    table = mods.block_mask(mods.document(ids), 1, 1, 150, 150).table
    assert set(np.unique(table)) == {mods.EMPTY, mods.FULL}
    raising = mods.BlockMask(mods.mask_mod(_never_called), table, CELL, CELL, 150, 150, 0.0)
    q, k, v = _qkv(B=1, H=1, Hkv=1)
    out = kernels.attention(q, k, v, mask_mod=raising, backend="numba")  # did not raise
    (exact, _), (plain, _) = oracle(q, k, v, mask_mod=mods.document(ids))
    assert max_error(out, exact) <= tolerance(exact, plain, q.dtype)
    with pytest.raises(ValueError, match="_never_called"):  # where a cell is partial, it runs
        kernels.attention(q, k, v, mask_mod=raising, causal=True, backend="numba")


# --- derivatives (for a backward pass) -----------------------------------------------------------


def _finite_difference(mod, scores, step=1e-6):
    return (mod.dense(scores + step) - mod.dense(scores - step)) / (2 * step)


def _softcap_grad_user(score, b, h, q_idx, kv_idx):
    return 1.0 - np.tanh(score / 3.0) ** 2


def _softcap_user(score, b, h, q_idx, kv_idx):
    return 3.0 * np.tanh(score / 3.0)


@pytest.mark.parametrize("name", ["alibi", "softcap", "relative_bias", "chain", "user"])
def test_score_derivatives_match_finite_differences(name):
    rng = np.random.default_rng(8)
    B, H, Lq, Lk = 2, 3, 9, 11
    scores = rng.standard_normal((B, H, Lq, Lk)) * 4
    mod = {
        "alibi": lambda: mods.alibi([0.5, 1.0, 2.0]),
        "softcap": lambda: mods.softcap(2.5),
        "relative_bias": lambda: mods.relative_bias(rng.standard_normal((H, 5))),
        "chain": lambda: mods.chain(mods.softcap(2.0), mods.alibi([1.0, 2.0, 3.0]),
                                    mods.softcap(1.5)),
        "user": lambda: mods.score_mod(_softcap_user, grad=_softcap_grad_user),
    }[name]()
    grad = mod.dense_grad(scores)
    fd = _finite_difference(mod, scores)
    np.testing.assert_allclose(grad, fd, rtol=1e-6, atol=1e-8)
    assert not np.allclose(grad, 0)


def test_user_score_without_grad_names_itself():
    mod = mods.score_mod(_softcap_user)
    assert not mod.has_grad
    with pytest.raises(ValueError, match=r"score_mod '_softcap_user' has no derivative"):
        mod.grad()
