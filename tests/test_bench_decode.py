"""attnbench bench --only decode on tiny caches: its rows, the probe beside them, and one
verdict per target decided from intervals (the numbers themselves are not asserted)."""

from dataclasses import replace

import pytest

from attnbench.bench.config import QUICK
from attnbench.bench.decode import PROBE, PROBE_ALL, PROBE_ONE, decode_targets
from attnbench.bench.run import run_bench
from attnbench.bench.targets import targets_table
from attnbench.measure.bandwidth import bandwidth_record, read_bandwidth_gbs

from .support import bench_without_pauses


def test_the_bandwidth_probe_is_in_the_machine_record():
    from attnbench.measure.machine import machine_record

    gbs = read_bandwidth_gbs(mib=8, repeat=2)
    record = machine_record()["read_bandwidth_probes"]
    assert gbs > 0 and record == bandwidth_record()
    assert any(key.startswith("8 MiB") and entry["probes"] >= 1 for key, entry in record.items())


@pytest.mark.slow  # an end-to-end run of the section: left out of the quick lane
def test_decode_section_rows_and_targets(monkeypatch):
    bench_without_pauses(monkeypatch)
    config = replace(QUICK, sections=("decode",), rounds=6, interval_rounds=6, min_time=0.0,
                     decode_length=512, decode_batch_length=128, decode_mqa_length=1024,
                     peers=())
    table, meta = run_bench(config, progress=lambda line: None)
    decode = table[table["section"] == "decode"]
    assert f"bandwidth: {PROBE}" in set(decode["variant"])
    assert {"splits: num_splits=0", "splits: num_splits=1", "gqa: H=32 Hkv=8",
            "gqa: H=8 Hkv=8", "paged: contiguous", "paged: page 16",
            "paged: page 256", f"splits: {PROBE_ONE}", f"splits: {PROBE_ALL}"} <= set(
                decode["variant"])
    ok = decode[decode["status"] == "ok"]
    assert (ok["median_ms"] > 0).all() and ok["samples_ms"].str.split().map(len).min() >= 6
    b1 = ok[ok["variant"] == "bandwidth: B=1 H=32 Hkv=8 L=512"].iloc[0]
    assert b1["extra_mib"] == 1 * 8 * 512 * 2 * 128 * 4 / 2**20  # bytes of K and V read
    targets = targets_table(table, config)
    names = set(targets["target"])
    assert {"decode read bandwidth / probe, B=1", "num_splits=0 speed-up over 1",
            "paged (16) / contiguous time"} <= names
    for _, row in targets[targets["target"].str.startswith(("decode read", "paged"))].iterrows():
        assert row["met"] in (True, False, "inconclusive"), row
        assert "[" in row["measured"]  # an interval
    split = targets[targets["target"] == "num_splits=0 speed-up over 1"].iloc[0]
    assert "the probe on the run's threads over one thread: " in split["note"]  # its bound


def test_targets_without_rows_say_so():
    import pandas as pd

    from attnbench.bench.config import COLUMNS

    targets = decode_targets(pd.DataFrame(columns=list(COLUMNS)))
    assert len(targets) == 7
    assert all(t["met"] is None and "no rows" in t["note"] for t in targets)
