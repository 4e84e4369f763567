"""The ``cuda`` backend with score and mask functions (``kernels.mods``).

In Numba's CUDA simulator where no GPU exists (tiny shapes, tiles of 4 x 4 so that
several tiles, ragged tails and empty tiles are crossed), against the float64 reference;
and compiled to PTX in a subprocess (the real compiler: typing errors, float64
instructions in a float32 kernel).
"""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("numba.cuda", reason="numba-cuda is missing: pip install attnbench[cuda]")

from attnbench import kernels  # noqa: E402
from attnbench.kernels import mods  # noqa: E402

from .backward_support import assert_gradients_match, assert_lse_matches  # noqa: E402
from .support import DTYPES, assert_matches_reference, run_ptx_script, small_cuda_tiles  # noqa: E402

pytestmark = pytest.mark.cuda

COMPILE_ONLY = {"test_ptx_of_mod_kernels"}


@pytest.fixture(autouse=True)
def small_tiles(request, monkeypatch):
    """Skip where the backend cannot run; 4-thread blocks and 4-key tiles where it can."""
    small_cuda_tiles(request, monkeypatch, COMPILE_ONLY)


def _qkv(B=2, H=2, Hkv=1, Lq=9, Lk=None, D=3, dtype=np.float32, seed=0):
    rng = np.random.default_rng(seed)
    Lk = Lq if Lk is None else Lk
    return (rng.standard_normal((B, H, Lq, D)).astype(dtype),
            rng.standard_normal((B, Hkv, Lk, D)).astype(dtype),
            rng.standard_normal((B, Hkv, Lk, D)).astype(dtype))


def _user_stripes(b, h, q_idx, kv_idx, period):
    return (q_idx - kv_idx) % period[0] != 1


DOCS = np.array([[0, 0, 0, 0, 1, 2, 2, 2, 2], [0, 1, 1, 1, 1, 1, 1, 1, 3]])  # edge on a tile

CASES = [
    # (name, shape, keywords)
    ("window 2", dict(), lambda: dict(mask_mod=mods.sliding_window(2), causal=True)),
    ("window 0 Lq<Lk", dict(Lq=5, Lk=9), lambda: dict(mask_mod=mods.sliding_window(0, 1))),
    ("document", dict(), lambda: dict(mask_mod=mods.document(DOCS), causal=True)),
    ("prefix_lm", dict(Lq=9, Lk=7), lambda: dict(mask_mod=mods.prefix_lm([3, 0]))),
    ("alibi", dict(Lq=5, Lk=9), lambda: dict(score_mod=mods.alibi([0.5, 0.25]),
                                             causal="bottom-right")),
    ("softcap + float mask", dict(), lambda: dict(
        score_mod=mods.softcap(0.7), mask=np.linspace(-1, 1, 81).reshape(9, 9))),
    ("relative_bias + dropout", dict(), lambda: dict(
        score_mod=mods.relative_bias(np.arange(10.0).reshape(2, 5) / 10), dropout_p=0.3, seed=3)),
    ("and/or + chain + lengths", dict(), lambda: dict(
        mask_mod=mods.or_masks(mods.and_masks(mods.document(DOCS), mods.sliding_window(3)),
                               mods.prefix_lm(1)),
        score_mod=mods.chain(mods.alibi([0.1, 0.2]), mods.softcap(1.0)), key_lengths=[9, 6])),
    ("user function + block mask", dict(), lambda: dict(
        mask_mod=mods.block_mask(mods.mask_mod(_user_stripes, np.array([3])), 2, 2, 9, 9,
                                 cell_q=2, cell_k=3))),
]


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("shape, make", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_matches_reference(shape, make, dtype):
    q, k, v = _qkv(**shape, dtype=dtype)
    kwargs = make()
    if "mask" in kwargs:
        kwargs["mask"] = kwargs["mask"].astype(dtype)
    assert_matches_reference(q, k, v, "cuda", **kwargs)


# Backward and lse: the cases whose score functions have derivatives (all built-ins), fewer
# of them (each structure builds two more kernels).
BACKWARD_CASES = [c for c in CASES if c[0] in (
    "window 2", "window 0 Lq<Lk", "document", "prefix_lm", "alibi", "softcap + float mask",
    "relative_bias + dropout", "and/or + chain + lengths", "user function + block mask")]


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("shape, make", [c[1:] for c in BACKWARD_CASES],
                         ids=[c[0] for c in BACKWARD_CASES])
def test_gradients_and_lse_match_reference(shape, make, dtype):
    q, k, v = _qkv(**shape, dtype=dtype)
    kwargs = make()
    if "mask" in kwargs:
        kwargs["mask"] = kwargs["mask"].astype(dtype)
    assert_lse_matches(q, k, v, "cuda", **kwargs)
    assert_gradients_match(q, k, v, "cuda", **kwargs)


def test_backward_keys_hidden_by_a_mask_function_reach_no_gradient():
    q, k, v = _qkv(B=1, H=1, Lq=12)
    dout = np.random.default_rng(5).standard_normal(q.shape).astype(q.dtype)
    kw = dict(mask_mod=mods.sliding_window(1), causal=True, score_mod=mods.softcap(0.9))
    before = kernels.attention_backward(q, k, v, dout, backend="cuda", **kw)
    k2, v2 = k.copy(), v.copy()
    k2[..., :4, :] = np.nan  # keys 0..3: hidden from rows 5.. (window of 1)
    v2[..., :4, :] = np.inf
    out, lse = kernels.attention(q, k, v, backend="cuda", return_lse=True, **kw)
    after = kernels.attention_backward(q, k2, v2, dout, out=out, lse=lse, backend="cuda", **kw)
    np.testing.assert_array_equal(after[0][..., 5:, :], before[0][..., 5:, :])  # dq
    for a, b in zip(after[1:], before[1:], strict=True):
        np.testing.assert_array_equal(a[..., 5:, :], b[..., 5:, :])  # dk, dv of keys 5..


def _never_called(b, h, q_idx, kv_idx):
    if q_idx >= 0:  # always; written so that Numba types the function as returning a bool
        raise RuntimeError("the element function ran")
    return True


def test_backward_skips_empty_tiles_and_checks_no_pair_of_full_ones():
    """Documents on the 4 x 4 tiles' edges: every tile is empty or full, so neither backward
    kernel evaluates the mask function per pair (here one that raises); the gradients are
    the document mask's."""
    ids = np.repeat([0, 1, 2], 4)[None]
    table = mods.block_mask(mods.document(ids), 1, 1, 12, 12, cell_q=4, cell_k=4).table
    assert set(np.unique(table)) == {mods.EMPTY, mods.FULL}
    raising = mods.BlockMask(mods.mask_mod(_never_called), table, 4, 4, 12, 12, 0.0)
    q, k, v = _qkv(B=1, H=2, Lq=12)
    dout = np.random.default_rng(6).standard_normal(q.shape).astype(q.dtype)
    grads = kernels.attention_backward(q, k, v, dout, mask_mod=raising, backend="cuda")
    expected = kernels.attention_backward(q, k, v, dout, mask_mod=mods.document(ids),
                                          backend="cuda")
    for got, want in zip(grads, expected, strict=True):
        np.testing.assert_array_equal(got, want)
    partial = table.copy()
    partial[0, 0, 1, 1] = mods.PARTIAL  # where a tile is partial, the function runs
    raising = mods.BlockMask(mods.mask_mod(_never_called), partial, 4, 4, 12, 12, 0.0)
    out, lse = kernels.attention(q, k, v, mask_mod=mods.document(ids), return_lse=True,
                                 backend="cuda")
    with pytest.raises(ValueError, match="_never_called"):
        kernels.attention_backward(q, k, v, dout, out=out, lse=lse, mask_mod=raising,
                                   backend="cuda")


def test_keys_hidden_by_a_mask_function_are_never_read():
    q, k, v = _qkv(B=1, H=1, Lq=12)
    window = mods.sliding_window(1)
    before = kernels.attention(q, k, v, mask_mod=window, causal=True, backend="cuda")
    k2, v2 = k.copy(), v.copy()
    k2[..., :4, :] = np.nan  # keys 0..3: hidden from rows 5.. (window of 1)
    v2[..., :4, :] = np.inf
    after = kernels.attention(q, k2, v2, mask_mod=window, causal=True, backend="cuda")
    np.testing.assert_array_equal(after[..., 5:, :], before[..., 5:, :])


def test_exception_inside_a_function_names_it():
    def cursed(b, h, q_idx, kv_idx):
        if q_idx == 3:
            raise ValueError("row 3")
        return True

    q, k, v = _qkv()
    with pytest.raises(ValueError, match="mask_mod .*cursed.* raised"):
        kernels.attention(q, k, v, mask_mod=cursed, backend="cuda")


_PTX_SCRIPT = """
import numpy as np
from attnbench import kernels
from attnbench.kernels import mods
from attnbench.kernels.cuda import backward as cuda_backward
from attnbench.kernels.cuda import mods as _cuda_mods

def stripes(b, h, q_idx, kv_idx, period):
    return (q_idx - kv_idx) % period[0] != 1

q = np.zeros((2, 2, 9, 8), np.float32)
docs = np.zeros((2, 9), np.int64)
variants = {
    "window+alibi": dict(mask_mod=mods.sliding_window(3), score_mod=mods.alibi([0.1, 0.2])),
    "document+softcap": dict(mask_mod=mods.document(docs), score_mod=mods.softcap(2.0)),
    "user+relative_bias": dict(mask_mod=mods.mask_mod(stripes, np.array([3])),
                               score_mod=mods.relative_bias(np.zeros((2, 5)))),
    "and/or+chain": dict(mask_mod=mods.and_masks(mods.prefix_lm([1, 2]), mods.or_masks(
        mods.sliding_window(2), mods.document(docs))),
        score_mod=mods.chain(mods.alibi([0.1, 0.2]), mods.softcap(2.0))),
}
result = {}
for dtype in (np.float32, np.float64):
    for name, kwargs in variants.items():
        if dtype == np.float64 and name != "and/or+chain":
            continue  # float64: the variant with every kind of mod, as a compile check
        p = kernels.prepare(q.astype(dtype), q.astype(dtype), q.astype(dtype), **kwargs)
        ptx = _cuda_mods.compile_ptx(p, cc=(8, 0))
        kernels_ptx = {"forward": ptx, **cuda_backward.compile_mods_ptx(p, cc=(8, 0))}
        for kind, text in kernels_ptx.items():
            result[f"{name}/{kind}/{np.dtype(dtype).name}"] = {
                "entry": ".entry" in text,
                "f64_lines": [line.strip() for line in text.splitlines() if ".f64" in line][:5],
            }
print(json.dumps(result))
"""


@pytest.mark.slow  # every mod kernel compiled to PTX: left out of the quick lane
def test_ptx_of_mod_kernels():
    """Every built-in and a user function compile for the device, forward and backward
    (dkdv, dq); float32 stays float32.  In float64 only the combined variant (and/or masks,
    a chain of scores): a mod's code is the same for both dtypes."""
    result = run_ptx_script(_PTX_SCRIPT)
    assert len(result) == 15
    for name, info in result.items():
        assert info["entry"], name
        if name.endswith("float32"):
            assert info["f64_lines"] == [], f"{name} has float64 instructions: {info['f64_lines']}"
