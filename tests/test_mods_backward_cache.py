"""The numba backward with built-in mod functions runs the kernel cached on disk.

- its mod functions, the score function's derivative included, are structure-keyed
  :class:`kernels.mods.cache.CachedFn` for built-ins, dispatchers for user functions;
- built-ins run :data:`kernels.numba_cpu.dense.backward.KERNELS` (cached), a user function anywhere
  in the call runs ``KERNELS_WITH_USER_MODS`` (compiled per process), and no dispatcher
  type ever reaches the cached kernel's signatures.

That a second process compiles nothing is checked in ``tests/test_backward_cache.py``.
"""

from __future__ import annotations

import numpy as np
import pytest
from numba import types

from attnbench.kernels import mods
from attnbench.kernels._problems.checks import check_attention_args, check_mods
from attnbench.kernels.mods import cache as _mods_cache
from attnbench.kernels.numba_cpu import config
from attnbench.kernels.numba_cpu.dense import backward as numba_backward
from attnbench.kernels.numba_cpu.dense import mods as _numba_mods_backward

from .backward_support import assert_gradients_match


def same_parity(b, h, q_idx, kv_idx):
    return (q_idx - kv_idx) % 2 == 0


def _problem(score_mod=None, mask_mod=None):
    q = np.zeros((1, 2, 6, 4), np.float32)
    return check_mods(check_attention_args(q, q, q), score_mod=score_mod, mask_mod=mask_mod)


def _qkv(L=21, dtype=np.float32):
    rng = np.random.default_rng(3)
    return tuple(rng.standard_normal((1, 2, L, 4)).astype(dtype) for _ in range(3))


@pytest.fixture
def serial(monkeypatch):
    monkeypatch.setattr(config, "BACKWARD_SERIAL_WORK_LIMIT", float("inf"))


def _types_of(dispatcher) -> list:
    return [t for sig in dispatcher.signatures for t in sig]


def test_builtins_and_the_gradient_are_keyed_user_functions_are_not():
    chained = mods.chain(mods.alibi([0.5, 0.25]), mods.softcap(3.0))
    fns, _ = _numba_mods_backward.mod_functions(
        _problem(mask_mod=mods.sliding_window(2), score_mod=chained))
    assert _numba_mods_backward.cacheable(fns)
    grad_key = f"{chained.cache_key('grad', np.float32)}#{_mods_cache.SOURCE_DIGEST}"
    assert fns[5].key == grad_key
    fns, _ = _numba_mods_backward.mod_functions(_problem(mask_mod=mods.sliding_window(2)))
    assert _numba_mods_backward.cacheable(fns)  # the identity score and its derivative
    assert fns[5].key.startswith("no_score_grad[float32]#")
    fns, _ = _numba_mods_backward.mod_functions(
        _problem(mask_mod=mods.and_masks(mods.sliding_window(2), same_parity)))
    assert not _numba_mods_backward.cacheable(fns)
    assert isinstance(fns[5], _mods_cache.CachedFn)  # the score side stays keyed


@pytest.mark.slow  # user functions compile per process: left out of the quick lane
def test_builtins_run_the_cached_kernel_and_user_functions_the_other(serial):
    cached, per_process = numba_backward.KERNELS[1], numba_backward.KERNELS_WITH_USER_MODS[1]
    q, k, v = _qkv()
    window, cap = mods.sliding_window(4), mods.softcap(2.5)
    assert_gradients_match(q, k, v, "numba", causal=True, mask_mod=window, score_mod=cap)
    key = f"{cap.cache_key('grad', np.float32)}#{_mods_cache.SOURCE_DIGEST}"
    assert _mods_cache.ModFnType(key) in _types_of(cached)
    n_per_process = len(per_process.signatures)
    assert_gradients_match(q, k, v, "numba", causal=True, score_mod=cap,
                           mask_mod=mods.and_masks(window, same_parity))
    assert len(per_process.signatures) == n_per_process + 1  # a new structure: compiled here
    assert not any(isinstance(t, types.Dispatcher) for t in _types_of(cached))
