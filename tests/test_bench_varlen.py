"""``attnbench bench --only varlen`` on tiny shapes: its rows and its targets (one round:
no interval, so every target is inconclusive, never a verdict)."""

from __future__ import annotations

import pytest

from attnbench.bench import config as bench_config
from attnbench.bench import interval_targets
from attnbench.bench.run import run_bench
from attnbench.bench.targets import targets_table

from .support import bench_without_pauses


@pytest.fixture(scope="module")
def varlen_run():
    config = bench_config.BenchConfig(heads=2, head_size=16, rounds=1, interval_rounds=1,
                                      varlen_lengths=(40, 9, 0, 3), sinks_length=48,
                                      sections=("varlen",), peers=())
    with pytest.MonkeyPatch.context() as patch:
        bench_without_pauses(patch)
        table, _ = run_bench(config, progress=lambda line: None)
    return config, table


def test_varlen_section_rows(varlen_run):
    _, table = varlen_run
    rows = table[table["section"] == "varlen"].set_index("variant")
    names = {f"varlen forward: {n}{c}" for n in ("varlen", "dense sum", "padded")
             for c in ("", " causal")}
    names |= {f"varlen backward: {n}{c}" for n in ("varlen", "dense sum") for c in ("", " causal")}
    names |= {f"sinks: {n} {d}" for n in ("plain", "sinks") for d in ("forward", "backward")}
    assert set(rows.index) == names
    assert (rows["status"] == "ok").all() and (rows["median_ms"] > 0).all()
    assert (rows["gflops"] > 0).all() and rows["samples_ms"].str.len().gt(0).all()
    # GFLOP/s count the visible pairs of the sequences, not the padding
    row = rows.loc["varlen forward: padded causal"]
    pairs = sum(L * (L + 1) // 2 for L in (40, 9, 0, 3))
    assert row["gflops"] == pytest.approx(4 * 2 * 16 * pairs / (row["median_ms"] / 1e3) / 1e9)


def test_varlen_targets(varlen_run):
    config, table = varlen_run
    targets = targets_table(table, config).set_index("target")
    names = ["varlen / sum of the dense calls", "padded dense call / varlen",
             "varlen backward / sum of the dense backwards", "sinks / plain"]
    assert set(names) <= set(targets.index)
    assert (targets.loc[names, "met"] == interval_targets.INCONCLUSIVE).all()
    assert "numba / numpy" not in targets.index
