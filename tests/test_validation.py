"""Bad input gets a clear error naming the argument, before any kernel runs."""

import numpy as np
import pytest

from attnbench import kernels
from attnbench.kernels._api import dispatch as _backends

F32 = np.float32
Q = np.zeros((2, 4, 5, 8), F32)  # (B, H, Lq, D)
K = np.zeros((2, 2, 6, 8), F32)  # (B, Hkv, Lk, D)
V = np.zeros((2, 2, 6, 3), F32)  # (B, Hkv, Lk, Dv)

# (name, call arguments, expected exception, words the message must contain)
BAD_INPUTS = [
    ("q of rank 1", dict(q=np.zeros(8, F32)), ValueError, ["q", "(8,)"]),
    ("ranks differ", dict(k=K[0]), ValueError, ["same number of dims", "(2, 6, 8)"]),
    ("D differs", dict(k=np.zeros((2, 2, 6, 7), F32)), ValueError, ["head size", "(2, 2, 6, 7)"]),
    ("Lk differs k/v", dict(v=np.zeros((2, 2, 7, 3), F32)), ValueError, ["keys", "(2, 2, 7, 3)"]),
    ("H not multiple of Hkv", dict(k=np.zeros((2, 3, 6, 8), F32), v=np.zeros((2, 3, 6, 3), F32)),
     ValueError, ["multiple", "4", "3"]),
    ("Hkv differs k/v", dict(v=np.zeros((2, 1, 6, 3), F32)), ValueError, ["heads", "(2, 1, 6, 3)"]),
    ("B differs", dict(k=np.zeros((3, 2, 6, 8), F32), v=np.zeros((3, 2, 6, 3), F32)), ValueError,
     ["batch", "(3, 2, 6, 8)"]),
    ("D = 0", dict(q=np.zeros((2, 4, 5, 0), F32), k=np.zeros((2, 2, 6, 0), F32)), ValueError,
     ["at least 1"]),
    ("integer q", dict(q=np.zeros((2, 4, 5, 8), np.int32)), TypeError, ["q", "int32"]),
    ("int8", dict(q=Q.astype(np.int8), k=K.astype(np.int8), v=V.astype(np.int8)),
     TypeError, ["q has dtype int8", "float32, float64, float16 or bfloat16"]),
    ("mixed dtypes", dict(k=K.astype(np.float64)), TypeError, ["dtype", "float64", "float32"]),
    ("mask not broadcastable", dict(mask=np.ones((5, 5), bool)), ValueError,
     ["mask", "(5, 5)", "(2, 4, 5, 6)"]),
    ("mask too big", dict(mask=np.ones((3, 2, 4, 5, 6), bool)), ValueError, ["mask"]),
    ("integer mask", dict(mask=np.ones((5, 6), np.int64)), TypeError, ["mask", "int64"]),
    ("key_lengths too long", dict(key_lengths=[3, 7]), ValueError, ["key_lengths", "7", "6"]),
    ("key_lengths negative", dict(key_lengths=[-1, 2]), ValueError, ["key_lengths", "-1"]),
    ("key_lengths wrong shape", dict(key_lengths=[1, 2, 3]), ValueError,
     ["key_lengths", "(3,)", "(2,)"]),
    ("key_lengths float", dict(key_lengths=[1.0, 2.0]), TypeError, ["key_lengths", "float"]),
    ("dropout_p = 1", dict(dropout_p=1.0), ValueError, ["dropout_p", "[0, 1)"]),
    ("dropout_p < 0", dict(dropout_p=-0.1), ValueError, ["dropout_p"]),
    ("dropout_p string", dict(dropout_p="0.1"), TypeError, ["dropout_p"]),
    ("seed negative", dict(dropout_p=0.1, seed=-1), ValueError, ["seed"]),
    ("seed float", dict(dropout_p=0.1, seed=1.5), TypeError, ["seed"]),
    ("scale nan", dict(scale=float("nan")), ValueError, ["scale", "finite"]),
    ("scale inf", dict(scale=float("inf")), ValueError, ["scale", "finite"]),
    ("scale string", dict(scale="8"), TypeError, ["scale"]),
    ("unknown backend", dict(backend="triton"), ValueError, ["backend", "triton", "numba"]),
    ("bad causal", dict(causal="diagonal"), ValueError, ["causal", "bottom-right"]),
    ("return_weights not bool", dict(return_weights="yes"), TypeError, ["return_weights"]),
]


@pytest.mark.parametrize("backend", ["reference", "numba"])
@pytest.mark.parametrize("name, args, error, words", BAD_INPUTS, ids=[b[0] for b in BAD_INPUTS])
def test_bad_input_raises_a_clear_error(name, args, error, words, backend):
    call = dict(q=Q, k=K, v=V, backend=backend) | args
    with pytest.raises(error) as info:
        kernels.attention(call.pop("q"), call.pop("k"), call.pop("v"), **call)
    message = str(info.value)
    for word in words:
        assert word in message, f"{word!r} not in error message {message!r}"


def test_errors_come_before_any_backend_runs(monkeypatch):
    """Validation runs first: a bad argument never reaches a backend module."""
    from attnbench.kernels._api import dense as _api

    def explode(name, entry):
        raise AssertionError(f"backend {name} was reached ({entry})")

    monkeypatch.setattr(_api, "entry_module", explode)
    with pytest.raises(ValueError, match="key_lengths"):
        kernels.attention(Q, K, V, key_lengths=[9, 9], backend="numba")


def test_cuda_without_gpu_or_simulator(monkeypatch):
    monkeypatch.setattr(_backends, "cuda_status", lambda: (False, "no CUDA GPU or driver"))
    with pytest.raises(kernels.BackendUnavailableError, match="cuda.*no CUDA GPU") as info:
        kernels.attention(Q, K, V, backend="cuda")
    assert isinstance(info.value, ValueError)
    assert "cuda" not in [b for b in kernels.available_backends() if b != "cuda"]


def test_device_arrays_are_pointed_to_the_device_entry_point():
    class FakeDeviceArray:
        __cuda_array_interface__ = {}

    with pytest.raises(TypeError, match="device array.*attention_device"):
        kernels.attention(FakeDeviceArray(), K, V)


def test_array_likes_and_scalars_are_accepted():
    q = [[0.0, 1.0], [1.0, 0.0]]  # (L, D) nested lists of floats -> float64
    out = kernels.attention(np.array(q), np.array(q), np.array(q), key_lengths=1, scale=2)
    assert out.shape == (2, 2) and out.dtype == np.float64
    np.testing.assert_array_equal(out, [[0.0, 1.0], [0.0, 1.0]])


# --- kernels.prepare: the validated problem, without running it ---------------------------------

def test_prepare_returns_the_problem_attention_runs():
    rng = np.random.default_rng(0)
    q = rng.standard_normal((2, 3, 4, 5, 8), dtype=np.float32)  # (..., H, Lq, D)
    k = rng.standard_normal((2, 3, 2, 7, 8), dtype=np.float32)  # (..., Hkv, Lk, D)
    v = rng.standard_normal((2, 3, 2, 7, 6), dtype=np.float32)
    problem = kernels.prepare(q, k, v, causal="bottom-right", key_lengths=np.full((2, 3), 6))
    assert problem.shape == (6, 4, 2, 5, 7, 8, 6)  # (B, H, Hkv, Lq, Lk, D, Dv)
    assert problem.causal_offset == 2 and problem.batch_shape == (2, 3)
    assert problem.key_lengths.dtype == np.int64 and problem.key_lengths.shape == (6,)
    assert problem.scale == pytest.approx(1 / np.sqrt(8))
    vis = problem.visible()  # (B, H, Lq, Lk)
    assert vis[0, 0, 0].tolist() == [True, True, True, False, False, False, False]
    assert not vis[..., 6:].any()  # key_lengths hide key 6


@pytest.mark.parametrize("causal, offset", [(False, None), (None, None), (True, 0),
                                            (np.bool_(True), 0), ("top-left", 0),
                                            ("bottom-right", 3)])
def test_causal_offset_is_the_one_reading_of_causal(causal, offset):
    assert kernels.causal_offset(causal, 4, 7) == offset
    q = np.zeros((4, 2), np.float64)
    k = np.zeros((7, 2), np.float64)
    assert kernels.prepare(q, k, k, causal=causal).causal_offset == offset


def test_prepare_rejects_what_attention_rejects():
    q = np.zeros((2, 4, 8), np.float32)
    with pytest.raises(ValueError, match="causal"):
        kernels.prepare(q, q, q, causal="diagonal")
    with pytest.raises(TypeError, match="dtype"):
        kernels.prepare(q, q, q.astype(np.float64))
