"""kernels.attention_backward(..., deterministic=True): the numba backward splits the key
blocks of few (batch, kv head) pairs into a number of chunks fixed by the problem
(``config.BACKWARD_DETERMINISTIC_TASKS`` tasks), not by the thread count, so the gradients
are bit-identical on 1 and 2 threads.  Checked for float32, float64, a score function and
MQA on a problem with fewer pairs than twice the threads, against the oracle; that without
it the chunks and dq's bits do follow the threads (so these tests could fail); that
MultiHeadAttention passes it on; and that a value that is not a bool is refused."""

from __future__ import annotations

import functools
from dataclasses import replace

import numba
import numpy as np
import pytest

from attnbench import kernels
from attnbench.kernels import mods
from attnbench.kernels.numba_cpu import config
from attnbench.kernels.numba_cpu.dense import backward as numba_backward

from .backward_support import assert_gradients_match, make_dout

needs_two_threads = pytest.mark.skipif(numba.config.NUMBA_NUM_THREADS < 2,
                                       reason="Numba has fewer than 2 threads")

#: Two (batch, kv head) pairs, fewer than twice two threads, and 11 key blocks: large
#: enough for the parallel kernel and for chunks.
SHAPE = dict(B=1, H=4, Hkv=2, L=700, D=64)


@pytest.fixture
def restore_threads():
    before = numba.get_num_threads()
    yield
    numba.set_num_threads(before)


def _inputs(dtype, B, H, Hkv, L, D, seed=0):
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((B, H, L, D)).astype(dtype)
    k = rng.standard_normal((B, Hkv, L, D)).astype(dtype)
    v = rng.standard_normal((B, Hkv, L, D)).astype(dtype)
    return q, k, v


def _chunks(q, k, v, threads, deterministic, **kwargs):
    problem = replace(kernels.prepare(q, k, v, **kwargs), deterministic=deterministic)
    return numba_backward.key_chunks(problem, threads)


def _gradient_bits(q, k, v, threads, **kwargs):
    """dq, dk, dv as bytes, from the numba backward on ``threads`` threads (out and lse
    from the forward, which does not depend on the thread count)."""
    numba.set_num_threads(threads)
    out, lse = kernels.attention(q, k, v, return_lse=True, backend="numba",
                                 **{n: x for n, x in kwargs.items() if n != "deterministic"})
    grads = kernels.attention_backward(q, k, v, make_dout(q, v), out=out, lse=lse,
                                       backend="numba", **kwargs)
    return tuple(g.tobytes() for g in grads)


CASES = [
    pytest.param("float32", {}, SHAPE, id="f32-gqa"),
    pytest.param("float64", {}, SHAPE, id="f64-gqa"),
    pytest.param("float32", dict(score_mod=mods.softcap(20.0), causal=True), SHAPE,
                 id="f32-softcap-causal"),
    pytest.param("float32", dict(key_lengths=[650]), dict(SHAPE, Hkv=1), id="f32-mqa"),
]


@needs_two_threads
@pytest.mark.parametrize("dtype, kwargs, shape", CASES)
def test_one_and_two_threads_give_the_same_bits(restore_threads, monkeypatch, dtype,
                                                 kwargs, shape):
    q, k, v = _inputs(np.dtype(dtype).type, **shape)
    pairs = shape["B"] * shape["Hkv"]
    # The same chunks on any thread count (the default's on four threads), more than one.
    chunks = -(-config.BACKWARD_DETERMINISTIC_TASKS // pairs)
    assert (_chunks(q, k, v, 1, True, **kwargs) == _chunks(q, k, v, 2, True, **kwargs)
            == _chunks(q, k, v, 4, False, **kwargs) == chunks > 1)
    results = [_gradient_bits(q, k, v, threads, deterministic=True, **kwargs)
               for threads in (1, 2)]
    assert results[0] == results[1]
    # Within the suite's tolerance of the oracle (the helper's own call made deterministic).
    monkeypatch.setattr(kernels, "attention_backward",
                        functools.partial(kernels.attention_backward, deterministic=True))
    assert_gradients_match(q, k, v, "numba", **kwargs)


@needs_two_threads
def test_without_deterministic_the_bits_follow_the_threads(restore_threads):
    """The control: by default one thread gets one chunk and two get two, and dq's bits
    move with them (dk and dv do not), so the test above would catch a deterministic mode
    that kept following the threads."""
    q, k, v = _inputs(np.float32, **SHAPE)
    assert _chunks(q, k, v, 1, False) == 1
    assert _chunks(q, k, v, 2, False) == 2
    one, two = (_gradient_bits(q, k, v, threads) for threads in (1, 2))
    assert one[0] != two[0]
    assert one[1:] == two[1:]


def test_few_key_blocks_or_many_pairs_need_no_chunks():
    """The chunks never outnumber the key blocks, and as many pairs as the aim get one."""
    q, k, v = _inputs(np.float32, B=1, H=2, Hkv=1, L=100, D=8)
    assert _chunks(q, k, v, 1, True) == 2  # two key blocks of 64
    q, k, v = _inputs(np.float32, B=4, H=2, Hkv=2, L=100, D=8)
    assert _chunks(q, k, v, 1, True) == 1


@needs_two_threads
def test_multihead_attention_passes_it_on(restore_threads, monkeypatch):
    layer = kernels.MultiHeadAttention(64, 4, n_kv_heads=2, seed=1)
    rng = np.random.default_rng(3)
    x = rng.standard_normal((1, 700, 64)).astype(np.float32)
    dy = rng.standard_normal(x.shape).astype(np.float32)
    results = []
    for threads in (1, 2):
        numba.set_num_threads(threads)
        dx, grads = layer.backward(x, dy, causal=True, backend="numba", deterministic=True)
        results.append((dx.tobytes(), grads["W_q"].tobytes()))
    assert results[0] == results[1]
    # With a KV cache, forward hands it to attention_with_kvcache.
    seen = []
    attend = kernels.KVCache.attend
    monkeypatch.setattr(kernels.KVCache, "attend",
                        lambda self, *a, **kw: seen.append(kw) or attend(self, *a, **kw))
    cache = kernels.KVCache(1, 2, 32, 16)
    layer(x[:, :3], cache=cache, deterministic=True)
    assert seen[0]["deterministic"] is True


def test_the_reference_takes_and_ignores_it():
    q, k, v = _inputs(np.float32, B=1, H=2, Hkv=1, L=20, D=8)
    dout = make_dout(q, v)
    plain = kernels.attention_backward(q, k, v, dout, backend="reference")
    fixed = kernels.attention_backward(q, k, v, dout, backend="reference",
                                       deterministic=np.bool_(True))
    assert all(a.tobytes() == b.tobytes() for a, b in zip(plain, fixed, strict=True))


@pytest.mark.parametrize("value", ["yes", 1, None])
def test_a_value_that_is_not_a_bool_is_refused_first(monkeypatch, value):
    """A TypeError naming it, in the words of attention_with_kvcache's, before any backend
    runs (the backward's kernel is replaced by one that fails)."""
    q, k, v = _inputs(np.float32, B=1, H=2, Hkv=1, L=20, D=8)
    monkeypatch.setattr(numba_backward, "run", lambda *a, **kw: pytest.fail("it ran"))
    words = f"deterministic must be a bool; got {type(value).__name__}"
    with pytest.raises(TypeError, match=words):
        kernels.attention_backward(q, k, v, make_dout(q, v), backend="numba",
                                   deterministic=value)
    layer = kernels.MultiHeadAttention(8, 2, seed=1)
    x = np.ones((1, 4, 8), np.float32)
    with pytest.raises(TypeError, match=words):
        layer.backward(x, x, deterministic=value)
    with pytest.raises(TypeError, match=words):
        layer(x, deterministic=value)
    cache = kernels.KVCache(1, 2, 16, 4)
    with pytest.raises(TypeError, match=words):
        cache.attend(np.ones((1, 2, 1, 4), np.float32), deterministic=value)
