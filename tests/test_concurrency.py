"""Calls from several Python threads at once return correct results.

Numba's threading layers differ: 'omp' and 'tbb' accept parallel launches from
several threads, 'workqueue' aborts the process on them.  kernels.numba_cpu
serialises launches only when the layer in use is 'workqueue' (see
``launch_guard``); these tests run both the parallel and the serial kernel from a
thread pool and compare with single-threaded results bit for bit.
"""

from concurrent.futures import ThreadPoolExecutor

import numba
import numpy as np
import pytest

from attnbench import kernels
from attnbench.kernels._jit import launch as jit_launch
from attnbench.kernels.numba_cpu import config


def _problems(n):
    rng = np.random.default_rng(0)
    return [
        tuple(rng.standard_normal((2, 4, 70, 32)).astype(np.float32) for _ in range(3))
        for _ in range(n)
    ]


@pytest.mark.parametrize("path", ["parallel", "serial"])
def test_threads_get_the_same_results_as_one_thread(path, monkeypatch):
    monkeypatch.setattr(config, "SERIAL_WORK_LIMIT", 0 if path == "parallel" else float("inf"))
    problems = _problems(6)

    def call(qkv):
        return kernels.attention(*qkv, causal=True, key_lengths=[50, 70], backend="numba")

    expected = [call(p) for p in problems]
    with ThreadPoolExecutor(max_workers=4) as pool:
        for _ in range(3):
            results = list(pool.map(call, problems))
            for got, want in zip(results, expected, strict=True):
                np.testing.assert_array_equal(got, want)


def test_launch_guard_serialises_only_the_unsafe_layer(monkeypatch):
    monkeypatch.setattr(numba.numba, "threading_layer", lambda: "workqueue")
    assert jit_launch.launch_guard() is jit_launch.launch_lock
    monkeypatch.setattr(numba.numba, "threading_layer", lambda: "omp")
    assert jit_launch.launch_guard() is not jit_launch.launch_lock
