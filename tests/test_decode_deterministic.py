"""kernels.attention_with_kvcache(..., deterministic=True): with ``num_splits=0`` each
sequence's keys are split into runs of a fixed size, so a sequence's bits depend neither on
the thread count nor on the other sequences of the batch (SGLang's fixed split size).
Checked on 1 and 2 threads, alone and inside larger batches, contiguous and paged, float32
and bfloat16, GQA, against the oracle; that ``deterministic=False`` does follow the threads
(so these tests could fail); that an explicit ``num_splits`` wins; that heads read
together or apart change no bit; and that a value that is not a bool is refused."""

from __future__ import annotations

import ml_dtypes
import numba
import numpy as np
import pytest

from attnbench import kernels
from attnbench.kernels import mods
from attnbench.kernels._problems import decode as decode_problem
from attnbench.kernels._problems.decode_checks import check_decode_args
from attnbench.kernels.numba_cpu.decode import plan as decode_plan
from tests.test_decode import _check_against_oracle, fill_prefix, make_cache

SPLIT = decode_problem.DETERMINISTIC_SPLIT_KEYS
#: Two sequences: three splits (the last one short) and just over one split.
LENGTHS = [2 * SPLIT + 400, SPLIT + 1]

needs_two_threads = pytest.mark.skipif(numba.config.NUMBA_NUM_THREADS < 2,
                                       reason="Numba has fewer than 2 threads")


@pytest.fixture
def restore_threads():
    before = numba.get_num_threads()
    yield
    numba.set_num_threads(before)


def _dtype(name):
    return ml_dtypes.bfloat16 if name == "bfloat16" else np.dtype(name).type


def _case(lengths, page_size, dtype, H=8, Hkv=2, Lq=2, D=32, DV=32, seed=0):
    """``(q, k_cache, v_cache, table, lengths)``: GQA, NaN in every slot past a sequence."""
    rng = np.random.default_rng(seed)
    lengths = np.asarray(lengths)
    k_cache, v_cache, table = make_cache(rng, len(lengths), Hkv, int(lengths.max()) + 5,
                                         page_size, dtype, D=D, DV=DV)
    fill_prefix(rng, k_cache, v_cache, table, lengths)
    q = rng.standard_normal((len(lengths), H, Lq, D)).astype(dtype)
    return q, k_cache, v_cache, table, lengths


def _call(q, k_cache, v_cache, table, lengths, **kw):
    out, lse = kernels.attention_with_kvcache(q, k_cache, v_cache, cache_seqlens=lengths,
                                              block_table=table, return_lse=True,
                                              backend=kw.pop("backend", "numba"), **kw)
    return out, lse


def _bits(result):
    return tuple(x.tobytes() for x in result)


def _problem(q, k_cache, v_cache, table, lengths, **kw):
    return check_decode_args(q, k_cache, v_cache, cache_seqlens=lengths, block_table=table,
                             **kw)[0]


LAYOUTS = [
    pytest.param(None, "float32", 32, id="contiguous-f32-products"),
    pytest.param(16, "float32", 32, id="page16-f32-products"),
    pytest.param(16, "float32", 24, id="page16-f32-loops"),
    pytest.param(16, "bfloat16", 32, id="page16-bf16-pairs"),
    pytest.param(None, "bfloat16", 32, id="contiguous-bf16-pairs"),
]


@needs_two_threads
@pytest.mark.parametrize("page_size, dtype, D", LAYOUTS)
def test_one_and_two_threads_give_the_same_bits(restore_threads, page_size, dtype, D):
    case = _case(LENGTHS, page_size, _dtype(dtype), D=D, DV=D)
    problem = _problem(*case, deterministic=True)
    # The same splits on either thread count; a paged cache of short runs is read heads
    # together on one thread and one head per task on two (six tasks): both paths run.
    assert (decode_plan.choose_splits(problem, threads=1)
            == decode_plan.choose_splits(problem, threads=2) == 3)
    if page_size is not None:
        assert decode_plan.heads_per_task(problem, 3, threads=1) == 2
        assert decode_plan.heads_per_task(problem, 3, threads=2) == 1
    results = []
    for threads in (1, 2):
        numba.set_num_threads(threads)
        results.append(_bits(_call(*case, deterministic=True)))
    assert results[0] == results[1]
    _check_against_oracle("numba", *case[:5], None, None, deterministic=True)


@needs_two_threads
def test_without_deterministic_the_splits_follow_the_threads(restore_threads):
    """The control: num_splits=0 alone splits by the thread count, and the bits move with
    it; so the test above would catch a deterministic mode that kept doing so."""
    case = _case([2 * SPLIT], None, np.float32, H=4, Hkv=1, Lq=1)
    problem = _problem(*case)
    assert decode_plan.choose_splits(problem, threads=1) != decode_plan.choose_splits(
        problem, threads=2)
    results = []
    for threads in (1, 2):
        numba.set_num_threads(threads)
        results.append(_bits(_call(*case)))
    assert results[0][0] != results[1][0]
    fixed = _problem(*case, deterministic=True)
    assert (decode_plan.choose_splits(fixed, threads=1)
            == decode_plan.choose_splits(fixed, threads=4) == 2)


@pytest.mark.parametrize("page_size, dtype, which", [
    pytest.param(16, "float32", None, id="page16-f32"),
    pytest.param(None, "float32", "window", id="contiguous-f32-window"),
    pytest.param(16, "bfloat16", None, id="page16-bf16"),
])
def test_a_sequence_alone_or_in_a_batch_gives_the_same_bits(page_size, dtype, which):
    """Sequence 1 alone and inside a batch whose other sequences are shorter and longer (a
    longer one adds splits, empty for sequence 1): the same bits.  Without deterministic
    the batch changes the split count."""
    kw = dict(mask_mod=mods.sliding_window(3000)) if which == "window" else {}
    q, k_cache, v_cache, table, lengths = _case([300, LENGTHS[0], 3 * SPLIT + 50], page_size,
                                                _dtype(dtype))
    batch = _call(q, k_cache, v_cache, table, lengths, deterministic=True, **kw)
    if page_size is None:  # the same memory as a batch of one
        alone_args = q[1:2], k_cache[1:2], v_cache[1:2], None, lengths[1:2]
    else:
        alone_args = q[1:2], k_cache, v_cache, table[1:2], lengths[1:2]
    alone = _call(*alone_args, deterministic=True, **kw)
    assert alone[0].tobytes() == batch[0][1:2].tobytes()
    assert alone[1].tobytes() == batch[1][1:2].tobytes()
    free = (_problem(q, k_cache, v_cache, table, lengths), _problem(*alone_args))
    assert decode_plan.choose_splits(free[0]) != decode_plan.choose_splits(free[1])
    _check_against_oracle("numba", q, k_cache, v_cache, table, lengths, None, None,
                          deterministic=True, **kw)


def test_an_explicit_num_splits_wins_and_ignores_the_batch():
    """num_splits=n > 0 cuts each sequence into n parts of its own length: deterministic
    changes nothing, and a sequence's bits do not depend on the batch either."""
    q, k_cache, v_cache, table, lengths = _case([300, 1500, 700], 4, np.float32)
    free = _call(q, k_cache, v_cache, table, lengths, num_splits=3)
    fixed = _call(q, k_cache, v_cache, table, lengths, num_splits=3, deterministic=True)
    assert _bits(free) == _bits(fixed)
    assert _problem(q, k_cache, v_cache, table, lengths, num_splits=3,
                    deterministic=True).split_keys() == 0
    alone = _call(q[1:2], k_cache, v_cache, table[1:2], lengths[1:2], num_splits=3,
                  deterministic=True)
    assert alone[0].tobytes() == fixed[0][1:2].tobytes()
    assert alone[1].tobytes() == fixed[1][1:2].tobytes()


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_heads_read_together_or_apart_change_no_bit(monkeypatch, dtype):
    """Whatever the thread count picks for heads_per_task, each head's arithmetic is the
    same: forced to 1 and to every head, on a contiguous and a paged cache."""
    for page_size in (None, 16):
        case = _case(LENGTHS, page_size, _dtype(dtype), H=6, Hkv=3, Lq=3)
        results = []
        for heads in (1, 3):
            monkeypatch.setattr(decode_plan, "heads_per_task", lambda p, n, h=heads: h)
            results.append(_bits(_call(*case, deterministic=True)))
        assert results[0] == results[1], page_size


@pytest.mark.parametrize("split", [64, 100])
def test_small_split_sizes_on_ragged_lengths(monkeypatch, split):
    """The fixed size patched small (a multiple of the kernel's chunk of 64 keys, and not):
    many splits, lengths 0 and every remainder, causal Lq > 1; the oracle agrees and each
    sequence alone gives its rows' bits."""
    monkeypatch.setattr(decode_problem, "DETERMINISTIC_SPLIT_KEYS", split)
    q, k_cache, v_cache, table, lengths = _case([0, 3, split, split + 1, 7 * split - 5],
                                                4, np.float32, H=4, Hkv=1, Lq=3)
    assert _problem(q, k_cache, v_cache, table, lengths, deterministic=True).split_keys() \
        == split
    out, lse, _, _ = _check_against_oracle("numba", q, k_cache, v_cache, table, lengths,
                                           None, None, deterministic=True)
    for b in range(len(lengths)):
        alone = _call(q[b:b + 1], k_cache, v_cache, table[b:b + 1], lengths[b:b + 1],
                      deterministic=True)
        assert alone[0].tobytes() == out[b:b + 1].tobytes(), b
        assert alone[1].tobytes() == lse[b:b + 1].tobytes(), b


def test_the_reference_and_kvcache_take_the_argument():
    q, k_cache, v_cache, table, lengths = _case([40, 9], 4, np.float32, D=24, DV=16)
    _check_against_oracle("reference", q, k_cache, v_cache, table, lengths, None, None,
                          deterministic=True)
    cache = kernels.KVCache(2, 2, 48, 24, value_dim=16, page_size=4)
    cache.append(np.ones((2, 2, 5, 24), np.float32), np.ones((2, 2, 5, 16), np.float32))
    direct = kernels.attention_with_kvcache(q, cache.k, cache.v, cache_seqlens=cache.seqlens,
                                            block_table=cache.block_table, deterministic=True)
    assert cache.attend(q, deterministic=True).tobytes() == direct.tobytes()
    with pytest.raises(TypeError, match="deterministic"):
        cache.attend(q, deterministic="yes")


def test_cuda_takes_the_fixed_split_size(monkeypatch):
    """The cuda kernel (simulator or GPU), the split size patched small for tiny shapes:
    agrees with the oracle, and a sequence alone gives its rows' bits."""
    if "cuda" not in kernels.available_backends():
        pytest.skip(kernels.cuda_status()[1])
    monkeypatch.setattr(decode_problem, "DETERMINISTIC_SPLIT_KEYS", 8)
    q, k_cache, v_cache, table, lengths = _case([5, 19, 40], 4, np.float32, H=2, Hkv=1,
                                                Lq=1, D=8, DV=8)
    out, lse, _, _ = _check_against_oracle("cuda", q, k_cache, v_cache, table, lengths,
                                           None, None, deterministic=True)
    alone = _call(q[1:2], k_cache, v_cache, table[1:2], lengths[1:2], deterministic=True,
                  backend="cuda")
    assert alone[0].tobytes() == out[1:2].tobytes()
    assert alone[1].tobytes() == lse[1:2].tobytes()


@pytest.mark.parametrize("value", ["yes", 1, None, 0.0, np.array([True])])
def test_a_deterministic_that_is_not_a_bool_is_refused(value):
    q, k_cache, v_cache, table, lengths = _case([6, 2], 4, np.float32, D=24, DV=16)
    new = np.ones((2, 2, 1, 24), np.float32), np.ones((2, 2, 1, 16), np.float32)
    before = k_cache.tobytes(), v_cache.tobytes()
    with pytest.raises(TypeError, match="deterministic must be a bool"):
        kernels.attention_with_kvcache(q, k_cache, v_cache, *new, cache_seqlens=lengths,
                                       block_table=table, deterministic=value)
    assert (k_cache.tobytes(), v_cache.tobytes()) == before  # nothing written
    # np.bool_ is a bool, as for causal
    kernels.attention_with_kvcache(q, k_cache, v_cache, cache_seqlens=lengths,
                                   block_table=table, deterministic=np.True_)
