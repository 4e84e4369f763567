"""The numba backward's kernel and Numba's disk cache.

Calls with and without :mod:`kernels.mods` functions run one kernel source; the entry
points without mods and with built-ins (structure-keyed, see :mod:`kernels.mods.cache`)
are cached on disk, those with a user function (a dispatcher among the arguments, which
the cache could not find again) are compiled per process and write nothing.  Checked in
fresh processes sharing one cache folder.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from .support import REPO

SCRIPT = """
import json, sys
import numpy as np
from attnbench import kernels
from attnbench.kernels import mods
from attnbench.kernels.numba_cpu.dense import backward as numba_backward
rng = np.random.default_rng(0)
q, k, v, dout = (rng.standard_normal((1, 2, 9, 4)).astype(np.float32) for _ in range(4))
def backward(**kwargs):  # the forward by the reference: only the backward is compiled
    out, lse = kernels.attention(q, k, v, backend="reference", return_lse=True, **kwargs)
    kernels.attention_backward(q, k, v, dout, out=out, lse=lse, backend="numba", **kwargs)
def odd_keys(b, h, q_idx, kv_idx):
    return kv_idx % 2 == 1
backward(causal=True)
backward(mask_mod=mods.sliding_window(3))
backward(mask_mod=mods.sliding_window(3), score_mod=mods.softcap(2.0), causal=True)
if sys.argv[1] == "with a user function":
    backward(mask_mod=mods.and_masks(mods.sliding_window(3), odd_keys))
stats = numba_backward.KERNELS[1].stats
print(json.dumps({"hits": sum(stats.cache_hits.values()),
                  "misses": sum(stats.cache_misses.values()),
                  "per_process": len(numba_backward.KERNELS_WITH_USER_MODS[1].signatures)}))
"""


def _run(cache_dir, what: str) -> dict:
    env = dict(os.environ, PYTHONPATH=str(REPO), NUMBA_CACHE_DIR=str(cache_dir))
    result = subprocess.run([sys.executable, "-c", SCRIPT, what], cwd=REPO, env=env,
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr
    return json.loads(result.stdout.strip().splitlines()[-1])


def _backward_cache_files(cache_dir) -> set:
    """The cache files of the backward's modules (the forward's are not this test's)."""
    return {os.path.relpath(os.path.join(root, name), cache_dir)
            for root, _, names in os.walk(cache_dir) for name in names if "backward" in name}


@pytest.mark.slow
def test_a_second_process_compiles_no_backward_kernel_of_builtins(tmp_path):
    """The first process compiles the serial kernel without mods, with a window and with a
    window and softcap; the second loads all three from the cache, and a user function
    in it compiles the per-process kernel and leaves the cache's files as they were."""
    first = _run(tmp_path, "built-ins")
    assert first == {"hits": 0, "misses": 3, "per_process": 0}
    files = _backward_cache_files(tmp_path)
    assert any("_backward_serial" in name for name in files)
    second = _run(tmp_path, "with a user function")
    assert second == {"hits": 3, "misses": 0, "per_process": 1}
    assert _backward_cache_files(tmp_path) == files
