"""``attnbench bench --only precision``: its rows and targets on tiny shapes (no speed is
asserted: the numbers of a unit-test run on a shared machine mean nothing)."""

import pandas as pd
import pytest

from attnbench.bench import config as bench_config
from attnbench.bench import interval_targets
from attnbench.bench import sections as bench_sections
from attnbench.bench.run import run_bench
from attnbench.bench.targets import targets_table
from attnbench.measure import peers


@pytest.fixture(scope="module")
def precision():
    config = bench_config.BenchConfig(
        heads=2, head_size=16, rounds=1, interval_rounds=1, precision_lengths=(64,),
        precision_torch_lengths=(32,), precision_backward_length=48, decode_length=96,
        sections=("precision",), peers=("torch",))
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(bench_sections, "REMEASURE_SECONDS", 0.0)  # no extra rounds
        table, _ = run_bench(config, progress=lambda line: None)
    return config, table


def test_precision_rows(precision):
    _, table = precision
    assert set(table["section"]) == {"precision"}
    numba = table[table["impl"] == "numba"]
    with_torch = peers.peer_status("torch")[0]
    prefill = numba[numba["variant"] == "prefill"]
    at_64 = prefill[prefill["L"] == 64]
    assert set(zip(at_64["dtype"], at_64["causal"], strict=True)) == {
        (d, c) for d in ("float32", "bfloat16", "float16") for c in (False, True)}
    # the torch-only length: numba in bfloat16 beside torch, and only where torch is
    at_32 = prefill[prefill["L"] == 32]
    assert set(zip(at_32["dtype"], at_32["causal"], strict=True)) == (
        {("bfloat16", c) for c in (False, True)} if with_torch else set())
    assert set(prefill["L"]) == ({32, 64} if with_torch else {64})
    backward = numba[numba["variant"] == "backward"]
    assert set(zip(backward["dtype"], backward["causal"], strict=True)) == {
        (d, c) for d in ("float32", "bfloat16") for c in (False, True)}
    assert set(backward["L"]) == {48}
    decode = numba[numba["variant"] == "decode"]
    assert sorted(decode["dtype"]) == ["bfloat16", "float32"] and set(decode["L"]) == {96}
    by_dtype = decode.set_index("dtype")["extra_mib"]  # bytes of K and V: half in bfloat16
    assert by_dtype["float32"] == 2 * by_dtype["bfloat16"] == 2 * 8 * 96 * 128 * 4 / 2**20
    assert (numba["status"] == "ok").all() and (numba["median_ms"] > 0).all()
    assert (numba["gflops"] > 0).all() and numba["samples_ms"].str.len().gt(0).all()
    torch_rows = table[table["impl"] == "torch"]
    assert len(torch_rows) == (4 if with_torch else 0)


def test_precision_targets(precision):
    config, table = precision
    targets = targets_table(table, config).set_index("target")
    names = ["bfloat16 prefill / float32", "float16 prefill / float32",
             "bfloat16 backward / float32", "float32 decode / bfloat16 decode",
             "numba / torch SDPA, bfloat16"]
    assert set(names) <= set(targets.index)
    assert "numba / numpy" not in targets.index  # no forward section ran
    # one sample per call: no interval, so no verdict either way
    assert (targets.loc[names[:4], "met"] == interval_targets.INCONCLUSIVE).all()
    assert "L=64 causal" in targets.loc[names[0], "measured"]
    assert "L=96 causal" in targets.loc[names[3], "measured"]
    assert "L=32" not in targets.loc[names[0], "measured"]  # no float32 there
    if peers.peer_status("torch")[0]:
        assert "L=32 causal" in targets.loc[names[4], "measured"]
    if not peers.peer_status("torch")[0]:
        assert pd.isna(targets.loc[names[4], "met"])  # no rows: no verdict
        assert "torch is not installed" in targets.loc[names[4], "note"]
