"""The numba backward's kernel and Numba's disk cache.

Calls with and without :mod:`kernels.mods` functions run one kernel source; the entry
points without mods are cached on disk, those with mods (functions among the arguments,
which the cache could not find again) are compiled per process and write nothing.  Checked
in fresh processes sharing one cache folder.
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
import kernels
from kernels import mods, numba_backward
rng = np.random.default_rng(0)
q, k, v, dout = (rng.standard_normal((1, 2, 9, 4)).astype(np.float32) for _ in range(4))
def backward(**kwargs):  # the forward by the reference: only the backward is compiled
    out, lse = kernels.attention(q, k, v, backend="reference", return_lse=True, **kwargs)
    kernels.attention_backward(q, k, v, dout, out=out, lse=lse, backend="numba", **kwargs)
backward(causal=True)
if sys.argv[1] == "with mods":
    backward(mask_mod=mods.sliding_window(3))
stats = numba_backward.KERNELS[1].stats
print(json.dumps({"hits": sum(stats.cache_hits.values()),
                  "misses": sum(stats.cache_misses.values())}))
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
def test_the_kernel_without_mods_is_cached_and_mods_add_nothing_to_the_cache(tmp_path):
    """A second process loads the serial kernel without mods from the cache; a call with a
    mask function in it leaves the cache's files as they were."""
    first = _run(tmp_path, "plain")
    assert first == {"hits": 0, "misses": 1}
    files = _backward_cache_files(tmp_path)
    assert any("_backward_serial" in name for name in files)
    second = _run(tmp_path, "with mods")
    assert second == {"hits": 1, "misses": 0}
    assert _backward_cache_files(tmp_path) == files
