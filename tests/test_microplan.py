"""The micro-kernel path's planner (kernels/numba_cpu/planner.py) and its persisted choices.

Nothing here compiles or times a kernel: the timer is replaced by one that returns given
samples and counts its calls, so these tests check the bookkeeping (fastest median kept,
the choice persisted and reused without re-timing, bad files ignored, a read-only
location survived) in milliseconds.
"""

import json

import numpy as np
import pytest
from numba.core import config as numba_config

from attnbench.kernels import stats
from attnbench.kernels.numba_cpu import planner as mp

F32 = np.dtype(np.float32)
F64 = np.dtype(np.float64)


@pytest.fixture
def planner(monkeypatch, tmp_path):
    """Fresh in-memory plans, wisdom under tmp_path, and a fake timer (samples to hand)."""
    monkeypatch.setattr(numba_config, "CACHE_DIR", str(tmp_path / "numba"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "user"))
    monkeypatch.setattr(mp, "CONFIGS", {F32: ((4, 32), (8, 16), (4, 16))})
    monkeypatch.setattr(mp, "_PLANS", {})
    monkeypatch.setattr(mp, "_CHOICES", {})
    fake = {"medians": [], "timed": 0}  # per _time_calls call: one median per call timed

    def time_calls(calls, rounds):
        fake["timed"] += 1
        medians = fake["medians"].pop(0)
        return {name: [m * 0.9, m, m * 1.1] * 3 for name, m in zip(calls, medians, strict=True)}

    monkeypatch.setattr(mp, "_time_calls", time_calls)
    return fake


def _forget():
    """A new process: nothing in memory, only what was persisted."""
    mp._PLANS.clear()
    mp._CHOICES.clear()


def test_plan_keeps_the_fastest_and_later_processes_reuse_it(planner, tmp_path):
    planner["medians"] = [[3.0, 1.0, 2.0]]
    assert mp.plan(np.float32) == (8, 16) and planner["timed"] == 1
    assert mp.plan("float32") == (8, 16) and planner["timed"] == 1  # in memory
    path = tmp_path / "numba" / mp.FILENAME
    entry = json.loads(path.read_text())["entries"][mp.machine_key("float32")]
    assert entry["plan"] == [8, 16] and entry["plan_seconds"]["8x16"][0] == 1.0
    _forget()
    assert mp.plan(np.float32) == (8, 16) and planner["timed"] == 1  # persisted: not re-timed


def test_choice_against_blas_persisted(planner):
    planner["medians"] = [[3.0, 1.0, 2.0], [1.0, 2.0]]  # the blocks, then micro vs BLAS
    assert mp.choice(np.float32) == (8, 16) and planner["timed"] == 2
    _forget()
    assert mp.choice(np.float32) == (8, 16) and planner["timed"] == 2
    key = mp.machine_key("float32")
    mp.store(key, dict(mp.load(key), choice="blas"))
    _forget()
    assert mp.choice(np.float32) is None and planner["timed"] == 2


@pytest.mark.parametrize("content", [
    "{not json",
    json.dumps({"version": mp.VERSION + 1, "entries": {}}),  # another format
    json.dumps([1, 2]),
    None,  # filled below: the right format, an entry for another CPU only
    "block not in CONFIGS",
])
def test_corrupt_or_foreign_file_is_ignored(planner, tmp_path, content):
    key = mp.machine_key("float32")
    entries = ({"other-cpu|+avx|float32": {"plan": [4, 32]}} if content is None
               else {key: {"plan": [12, 12]}})
    if content is None or content.startswith("block"):
        content = json.dumps({"version": mp.VERSION, "entries": entries})
    path = tmp_path / "numba" / mp.FILENAME
    path.parent.mkdir()
    path.write_text(content)
    planner["medians"] = [[3.0, 1.0, 2.0]]
    assert mp.plan(np.float32) == (8, 16) and planner["timed"] == 1  # re-timed
    stored = json.loads(path.read_text())  # and replaced by a valid file
    assert stored["version"] == mp.VERSION and stored["entries"][key]["plan"] == [8, 16]


def test_unwritable_location_falls_back_to_the_user_cache_then_memory(
        planner, tmp_path, monkeypatch):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    monkeypatch.setattr(numba_config, "CACHE_DIR", str(blocker / "numba"))  # cannot be made
    planner["medians"] = [[3.0, 1.0, 2.0]]
    assert mp.plan(np.float32) == (8, 16)
    assert (tmp_path / "user" / "attnbench" / mp.FILENAME).exists()
    _forget()
    assert mp.plan(np.float32) == (8, 16) and planner["timed"] == 1  # read back from there
    monkeypatch.setenv("XDG_CACHE_HOME", str(blocker / "user"))  # neither: memory only
    _forget()
    planner["medians"] = [[1.0, 3.0, 2.0]]
    assert mp.plan(np.float32) == (4, 32) and planner["timed"] == 2
    assert mp.plan(np.float32) == (4, 32) and planner["timed"] == 2


def test_candidates_follow_the_target_vector_registers():
    """AVX-512 (32 x 512 bits) keeps its blocks; AVX2 (16 x 256) gets blocks whose
    accumulators leave registers for the B loads and a broadcast; this process plans
    among its own target's."""
    from attnbench.kernels._jit import isa
    from attnbench.kernels.numba_cpu.dense import micro

    assert micro.register_blocks(512, 32) == {F32: ((8, 16), (4, 32)), F64: ((4, 16), (8, 8))}
    avx2 = micro.register_blocks(256, 16)
    assert avx2 == {F32: ((6, 16), (4, 24)), F64: ((6, 8), (4, 12))}
    for dtype, blocks in avx2.items():
        lanes = 256 // (8 * dtype.itemsize)
        for mr, nr in blocks:
            assert nr % lanes == 0 and mr * nr // lanes + nr // lanes + 1 <= 16
    here = isa.target()
    assert micro.CONFIGS == micro.register_blocks(here.vector_bits, here.vector_registers)
    assert mp.CONFIGS is micro.CONFIGS


@pytest.mark.parametrize("n, k", [(6, 1), (9, 2), (20, 6)])
def test_median_interval_order_statistics(n, k):
    """The 95% interval of the median is order statistics k and n + 1 - k (1-based)."""
    xs = np.arange(1.0, n + 1)[::-1]
    median, lo, hi = stats.median_interval(xs)
    assert median == np.median(xs) and (lo, hi) == (k, n + 1 - k)


def test_median_interval_says_when_there_are_too_few_samples():
    median, lo, hi = stats.median_interval([3.0, 1.0, 2.0, 5.0, 4.0])  # no 95% interval
    assert median == 3.0 and np.isnan(lo) and np.isnan(hi)
