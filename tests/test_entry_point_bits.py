"""The same bits in every process: a kernel compiled in this process and the same kernel
loaded from Numba's disk cache give bit-identical results, for a call of every entry point
(:mod:`tests.entry_point_bits`), on whatever machine runs the suite.

Two processes share a new, empty cache: the first compiles every kernel it calls, the
second loads them all.  (A kernel whose bits depended on the compilation context — the
fast-math flags letting LLVM reassociate a sum one way in one module and another way in
the next — failed this.)
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests import entry_point_bits

REPO = Path(__file__).resolve().parents[1]


def _digests(cache: Path) -> dict:
    env = {**os.environ, "NUMBA_CACHE_DIR": str(cache),
           "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, "-m", "tests.entry_point_bits", "--numba-only"],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=1200)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout)


def test_digests_see_every_bit():
    a = entry_point_bits.digest((entry_point_bits.np.zeros(3, "float32"),))
    b = entry_point_bits.digest((entry_point_bits.np.array([0, 0, -0.0], "float32"),))
    assert a != b


@pytest.mark.slow  # compiles every entry point's numba kernels in a new cache
def test_a_kernel_compiled_now_and_loaded_from_the_cache_give_the_same_bits(tmp_path):
    fresh = _digests(tmp_path)
    cached = _digests(tmp_path)
    assert len(fresh) == len(entry_point_bits.calls())
    assert fresh == cached, sorted(k for k in fresh if fresh[k] != cached[k])
