"""Differential tests: every CPU backend against the float64 reference.

The case table names each problem; the tolerance is relative to a plain
implementation's own error in the input dtype (see ``tests/support.py``).
The CUDA backend runs the same comparisons on tiny shapes in ``test_cuda.py``.
"""

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from attnbench.kernels.numba_cpu import config

from .support import DTYPES, Case, assert_matches_reference, make_inputs

# --- named cases ---------------------------------------------------------------------------
# Sizes come from the issue and FlashAttention's tests: odd L and D exercise tails, 31/33
# and 127/129 sit around the numba kernel's BLOCK_Q = 32 and BLOCK_K = 128.
SHAPES = [
    Case("single token", Lq=1, D=8),
    Case("two tokens", Lq=2, D=1),
    Case("L7 D59", Lq=7, D=59),
    Case("L97 D64", Lq=97, D=64),
    Case("L113 D111", Lq=113, D=111),
    Case("L263 D128 B3", B=3, H=2, Lq=263, D=128),
    Case("block tails 31x129", Lq=31, Lk=129, D=8),
    Case("block tails 33x127", Lq=33, Lk=127, D=8),
    Case("cross Lq<Lk", Lq=7, Lk=97, D=64),
    Case("cross Lq>Lk", Lq=113, Lk=7, D=59),
    Case("Dv != D", Lq=9, Lk=11, D=8, Dv=3),
    Case("MHA 8/8", H=8, Lq=33, D=16),
    Case("GQA 8/2", H=8, Hkv=2, Lq=33, D=16),
    Case("MQA 8/1", H=8, Hkv=1, B=3, Lq=33, D=16),
    Case("unscaled", Lq=17, D=64, scale=1.0),
]

MASKS = [
    Case("causal", causal=True),
    Case("causal bottom-right", causal="bottom-right"),
    Case("bool mask", mask="bool"),
    Case("float mask", mask="float"),
    Case("padding mask", mask="padding"),
    Case("key_lengths", key_lengths="random"),
    Case("key_lengths with 0", key_lengths="with-zero"),
    Case("fully masked rows", mask="empty-rows"),
    Case("dropout", dropout_p=0.25),
    Case("causal + key_lengths", causal=True, key_lengths="random"),
    Case("bottom-right + bool mask", causal="bottom-right", mask="bool"),
    Case("all kinds + dropout", causal=True, mask="float", key_lengths="random", dropout_p=0.1),
]

# Each mask kind on a few shapes that stress it: Lq != Lk both ways (bottom-right alignment
# differs from top-left there), GQA, several batches and tile tails.
MASK_SHAPES = [
    dict(B=3, H=8, Hkv=2, Lq=37, Lk=37, D=8),
    dict(B=2, H=2, Lq=13, Lk=150, D=5),
    dict(B=2, H=4, Hkv=1, Lq=150, Lk=13, D=7),
    dict(B=1, H=1, Lq=129, Lk=257, D=64),
]


def _combine(mask_case, shape):
    fields = {**mask_case.__dict__, **shape}
    return Case(**fields)


MASK_CASES = [_combine(m, s) for m in MASKS for s in MASK_SHAPES]
ALL_CASES = [pytest.param(c, id=c.name) for c in SHAPES] + [
    pytest.param(c, id=f"{c.name} B{c.B} H{c.H}/{c.Hkv or c.H} {c.Lq}x{c.Lk}")
    for c in MASK_CASES
]

# path name: (SERIAL_WORK_LIMIT, tile products by the BLAS where SciPy is installed)
NUMBA_PATHS = {
    "serial": (float("inf"), config.HAVE_BLAS),
    "parallel": (0, config.HAVE_BLAS),
    "parallel-loops": (0, False),  # no BLAS: the path of a machine without SciPy
}


@pytest.fixture(params=list(NUMBA_PATHS), ids=lambda p: f"numba-{p}")
def numba_path(request, monkeypatch):
    """Run the numba backend through its serial or parallel kernel, with or without BLAS."""
    serial_limit, have_blas = NUMBA_PATHS[request.param]
    monkeypatch.setattr(config, "SERIAL_WORK_LIMIT", serial_limit)
    monkeypatch.setattr(config, "HAVE_BLAS", have_blas)
    return "numba"


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("case", ALL_CASES)
def test_numba_matches_reference(case, dtype, numba_path):
    q, k, v, kwargs = make_inputs(case, dtype)
    assert_matches_reference(q, k, v, numba_path, **kwargs)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("case", ALL_CASES[:6] + ALL_CASES[len(SHAPES)::4])
def test_reference_backend_rounds_the_oracle(case, dtype):
    """The reference backend is the float64 oracle rounded to the input dtype."""
    q, k, v, kwargs = make_inputs(case, dtype)
    assert_matches_reference(q, k, v, "reference", **kwargs)


@pytest.mark.parametrize("backend", ["reference", "numba"])
@pytest.mark.parametrize(
    "q_shape, kv_shape",
    [
        ((5, 8), (6, 8)),  # (L, D)
        ((4, 5, 8), (2, 6, 8)),  # (H, L, D) with GQA
        ((2, 3, 4, 5, 8), (2, 3, 2, 6, 8)),  # (B1, B2, H, L, D)
    ],
    ids=["2-D", "3-D", "5-D"],
)
def test_layouts_of_any_rank(backend, q_shape, kv_shape):
    """2-D, 3-D and N-D inputs give the same numbers as the 4-D layout they stand for."""
    rng = np.random.default_rng(1)
    q = rng.standard_normal(q_shape)
    k = rng.standard_normal(kv_shape)
    v = rng.standard_normal(kv_shape)
    lead = q_shape[:-3] if len(q_shape) > 3 else ()
    key_lengths = rng.integers(0, 7, size=lead) if lead else 4
    kwargs = dict(causal="bottom-right", key_lengths=key_lengths)
    assert_matches_reference(q, k, v, backend, **kwargs)


@pytest.mark.parametrize("backend", ["reference", "numba"])
def test_empty_sequences(backend):
    """L = 0 gives empty outputs; Lk = 0 gives zeros (no query sees a key)."""
    from attnbench import kernels

    q = np.ones((2, 3, 0, 4), np.float32)
    k = v = np.ones((2, 3, 5, 4), np.float32)
    out, w = kernels.attention(q, k, v, backend=backend, return_weights=True)
    assert out.shape == (2, 3, 0, 4) and w.shape == (2, 3, 0, 5)
    q = np.ones((2, 3, 5, 4), np.float32)
    k = v = np.ones((2, 3, 0, 4), np.float32)
    out, w = kernels.attention(q, k, v, backend=backend, return_weights=True)
    assert out.shape == (2, 3, 5, 4) and w.shape == (2, 3, 5, 0)
    np.testing.assert_array_equal(out, 0)


@pytest.mark.parametrize("backend", ["reference", "numba"])
def test_non_contiguous_inputs(backend):
    """Transposed or strided views give the same result as their contiguous copies."""
    from attnbench import kernels

    rng = np.random.default_rng(2)
    base = rng.standard_normal((2, 9, 3, 16)).astype(np.float32)
    q = base.transpose(0, 2, 1, 3)  # (B, H, L, D) view, not contiguous
    k = base[:, ::-1].transpose(0, 2, 1, 3)
    v = base[..., ::2].transpose(0, 2, 1, 3)
    got = kernels.attention(q, k, v, backend=backend, causal=True)
    want = kernels.attention(*(np.ascontiguousarray(x) for x in (q, k, v)), backend=backend,
                             causal=True)
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("backend", ["reference", "numba"])
def test_fully_masked_rows_are_zero_not_nan(backend):
    from attnbench import kernels

    q = k = v = np.ones((1, 2, 4, 8), np.float64)
    mask = np.zeros((4, 4), bool)
    mask[1] = True
    out, w = kernels.attention(q, k, v, mask=mask, backend=backend, return_weights=True)
    np.testing.assert_array_equal(out[:, :, [0, 2, 3]], 0)
    np.testing.assert_array_equal(w[:, :, [0, 2, 3]], 0)
    np.testing.assert_allclose(out[:, :, 1], 1.0)


@pytest.mark.parametrize("backend", ["reference", "numba"])
def test_nan_at_a_visible_position_propagates(backend):
    """NaN where a query can see it is not silently dropped: that row becomes NaN."""
    from attnbench import kernels

    rng = np.random.default_rng(3)
    q, k, v = (rng.standard_normal((1, 1, 6, 4)) for _ in range(3))
    k[0, 0, 2] = np.nan
    out = kernels.attention(q, k, v, causal=True, backend=backend)
    assert np.isfinite(out[0, 0, :2]).all()
    assert np.isnan(out[0, 0, 2:]).all()


# --- hypothesis-drawn problems -------------------------------------------------------------

@st.composite
def problems(draw):
    Hkv = draw(st.sampled_from([1, 2, 3]))
    return Case(
        "drawn",
        B=draw(st.integers(1, 3)),
        Hkv=Hkv,
        H=Hkv * draw(st.sampled_from([1, 2, 4])),
        Lq=draw(st.integers(1, 70)),
        Lk=draw(st.integers(0, 150)),
        D=draw(st.integers(1, 40)),
        Dv=draw(st.integers(1, 40)),
        causal=draw(st.sampled_from([False, True, "bottom-right"])),
        mask=draw(st.sampled_from([None, "bool", "float", "padding", "empty-rows"])),
        key_lengths=draw(st.sampled_from([None, "with-zero"])),
        dropout_p=draw(st.sampled_from([0.0, 0.0, 0.3])),
        scale=draw(st.sampled_from([None, 1.0, 0.01])),
    )


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=problems(), dtype=st.sampled_from(DTYPES), seed=st.integers(0, 2**16))
def test_numba_matches_reference_on_drawn_problems(case, dtype, seed):
    q, k, v, kwargs = make_inputs(case, dtype, seed)
    assert_matches_reference(q, k, v, "numba", **kwargs)
