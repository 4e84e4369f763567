"""The built-in mod functions' CPU kernels (and the loops that evaluate them for the
reference and ``block_mask``) are cached on disk (``kernels.mods.cache``).

- structure keys: equal for the same code whatever the bound values, different for other
  code, None (no disk cache) as soon as a user function is inside;
- built-ins run the cached kernels, user functions the per-process ones;
- a second process finds the kernels in Numba's cache and compiles none of them.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from numba import njit, types

from attnbench.kernels import mods
from attnbench.kernels.mods import cache as _mods_cache
from attnbench.kernels.numba_cpu import config
from attnbench.kernels.numba_cpu.dense import forward as _numba_mods

from .support import REPO, assert_matches_reference


def same_parity(b, h, q_idx, kv_idx):
    return (q_idx - kv_idx) % 2 == 0


def plus_one(score, b, h, q_idx, kv_idx):
    return score + 1.0


def _key(mod, part="element", dtype=np.float32):
    return mod.cache_key(part, dtype)


def test_keys_name_the_code_not_the_values():
    assert _key(mods.sliding_window(3)) == _key(mods.sliding_window(300, 7))
    assert _key(mods.document(np.zeros((2, 5), int))) == _key(mods.document(np.ones(9, int)))
    assert _key(mods.alibi([1.0, 2.0])) == _key(mods.alibi([0.5] * 12))
    window, prefix = mods.sliding_window(3), mods.prefix_lm(4)
    distinct = {
        _key(window), _key(window, "tile"), _key(prefix), _key(prefix, "tile"),
        _key(mods.and_masks(window, prefix)), _key(mods.or_masks(window, prefix)),
        _key(mods.and_masks(prefix, window)),
        _key(mods.block_mask(window, 1, 1, 8, 8)), _key(mods.block_mask(window, 1, 1, 8, 8),
                                                        "tile"),
    }
    assert len(distinct) == 9
    alibi, cap = mods.alibi([1.0]), mods.softcap(5.0)
    scores = {
        _key(alibi), _key(alibi, dtype=np.float64), _key(alibi, "grad"), _key(cap),
        _key(mods.chain(alibi, cap)), _key(mods.chain(cap, alibi)),
        _key(mods.chain(alibi, cap), "grad"),
    }
    assert len(scores) == 7


def test_a_user_function_inside_has_no_key():
    window = mods.sliding_window(3)
    assert _key(mods.mask_mod(same_parity)) is None
    assert _key(mods.and_masks(window, same_parity)) is None
    assert _key(mods.block_mask(same_parity, 1, 1, 8, 8)) is None
    assert _key(mods.block_mask(same_parity, 1, 1, 8, 8), "tile") is not None  # the table's
    assert _key(mods.chain(mods.softcap(5.0), plus_one)) is None


def _qkv(L=70, dtype=np.float32):
    rng = np.random.default_rng(0)
    return tuple(rng.standard_normal((1, 2, L, 8)).astype(dtype) for _ in range(3))


@pytest.mark.slow  # user functions compile per process: left out of the quick lane
def test_builtins_run_the_cached_kernel_and_user_functions_the_other(monkeypatch):
    monkeypatch.setattr(config, "SERIAL_WORK_LIMIT", float("inf"))
    cached, uncached = _numba_mods._attention_serial, _numba_mods._attention_serial_user
    q, k, v = _qkv()
    builtin = mods.and_masks(mods.sliding_window(5), mods.prefix_lm(3))
    assert_matches_reference(q, k, v, "numba", causal=True, mask_mod=builtin,
                             score_mod=mods.softcap(4.0))
    key = f"{_key(builtin)}#{_mods_cache.SOURCE_DIGEST}"
    assert any(t == _mods_cache.ModFnType(key) for sig in cached.signatures for t in sig)
    n_uncached = len(uncached.signatures)
    assert_matches_reference(q, k, v, "numba", causal=True, score_mod=mods.softcap(4.0),
                             mask_mod=mods.and_masks(mods.sliding_window(5), same_parity))
    assert len(uncached.signatures) == n_uncached + 1  # a new structure: this module's function
    assert not any(isinstance(t, types.Dispatcher) for sig in cached.signatures for t in sig)


def test_a_cached_fn_compiles_to_its_dispatchers_code():
    window = mods.sliding_window(2)
    fn = _mods_cache.CachedFn(_key(window), window.element("cpu"))
    args = window.args()

    @njit
    def visible(f, args):
        return f(0, 0, 5, 3, args), f(0, 0, 5, 2, args), f(0, 0, 5, 6, args)

    assert visible(fn, args) == (True, False, False)


_SECOND_PROCESS = """
import json
import numpy as np
from attnbench import kernels
from attnbench.kernels import mods
from attnbench.kernels.mods import dense as _mods_dense
from attnbench.kernels.numba_cpu import config
from attnbench.kernels.numba_cpu.dense import forward as _numba_mods
from attnbench.kernels.numba_cpu.dense import mods as _numba_cpu_mods
config.SERIAL_WORK_LIMIT = float("inf")
rng = np.random.default_rng(0)
q, k, v = (rng.standard_normal((1, 2, 70, 8)).astype(np.float32) for _ in range(3))
docs = np.repeat(np.arange(5), 14)
kernels.attention(q, k, v, causal=True, mask_mod=mods.sliding_window(9), backend="numba")
kernels.attention(q, k, v, mask_mod=mods.document(docs), backend="numba",
                  score_mod=mods.chain(mods.alibi([0.5, 0.25]), mods.softcap(30.0)))
mods.block_mask(mods.document(docs), 1, 2, 70, 70)  # the tile loop
# the dense loops (FLOP counting and the tests evaluate mods densely; the reference has
# its own formulas for the built-ins)
mods.sliding_window(9).dense(1, 2, 70, 70)
mods.alibi([1.0, 2.0]).dense(np.zeros((1, 2, 70, 70), np.float32), np.float32)
stats = {}
for module, name in [(_numba_mods, "_attention_serial"),
                     (_numba_cpu_mods, "_visible_work_cached"),
                     (_mods_dense, "_classify_cells_cached"),
                     (_mods_dense, "_dense_visible_cached"), (_mods_dense, "_dense_apply_cached")]:
    s = getattr(module, name).stats
    stats[name] = [sum(s.cache_hits.values()), sum(s.cache_misses.values())]
print(json.dumps(stats))
"""


def _run_process() -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(_SECOND_PROCESS)], cwd=REPO,
                          env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_a_second_process_compiles_no_builtin_kernel():
    """The first process compiles (or finds) the kernels of a window and of documents with
    chained scores, a block mask's tile loop and the dense loops; the second
    finds every one of them in Numba's cache."""
    _run_process()
    hits_and_misses = _run_process()
    for name, (hits, misses) in hits_and_misses.items():
        assert misses == 0, (name, hits_and_misses)
        assert hits > 0, (name, hits_and_misses)
