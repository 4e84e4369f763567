"""``attnbench bench``: a smoke run on tiny shapes; its table, targets and files.

Nothing here asserts a speed: the numbers of a unit-test run on a shared machine mean
nothing.  The tests check the shape of what the benchmark reports.
"""

import numpy as np
import pandas as pd
import pytest

from attnbench.bench import config as bench_config
from attnbench.bench import sections as bench_sections
from attnbench.cli import main
from attnbench.measure import peers

TINY = ["--L", "64", "128", "--D", "16", "32", "--rounds", "2", "--peak-min-L", "128",
        "--float64-L", "64", "--memory-L", "128", "--tiny-L", "32", "--padding-L", "128",
        "--parallel-L", "128", "--startup-runs", "1"]


@pytest.fixture(scope="module")
def smoke(tmp_path_factory):
    out = tmp_path_factory.mktemp("bench")
    status = main(["bench", *TINY, "--out", str(out)])
    return status, out


def test_bench_writes_the_table_targets_and_files(smoke, capsys):
    status, out = smoke
    assert status == 0
    for name in ("bench.csv", "targets.csv", "machine.json", "bench.png", "bench.html",
                 "bench.md"):
        assert (out / name).stat().st_size > 0
    markdown = (out / "bench.md").read_text()
    assert markdown.startswith("`attnbench bench --L 64 128 ")  # the command that reran it
    assert "| 64 | yes |" in markdown and "| numba / numpy |" in markdown
    table = pd.read_csv(out / "bench.csv")
    for column in (*bench_config.COLUMNS, "cpu_model", "numba_threads", "blas", "gemm_peak_gflops"):
        assert column in table.columns
    sections = set(table["section"])
    assert sections == {"speed", "peak", "float64", "memory", "tiny", "causal", "padding",
                        "parallel", "startup"}
    causal = table[table["section"] == "causal"]  # L >= --peak-min-L, both kinds
    assert set(zip(causal["L"], causal["causal"], strict=True)) == {(128, False), (128, True)}
    speed = table[table["section"] == "speed"]
    assert set(speed["L"]) == {64, 128} and set(speed["causal"]) == {True, False}
    # missing peers get a row too; the GEMM floor is timed on non-causal shapes only
    assert set(speed["impl"]) == {"numba", "torch", "numpy", bench_config.FLOOR}
    floor = speed[speed["impl"] == bench_config.FLOOR]
    assert not floor["causal"].any() and set(floor["L"]) == {64, 128}
    assert (floor["median_ms"] > 0).all() and floor["vs_numpy"].notna().all()
    assert floor["max_abs_err"].isna().all()  # not an attention output: no error
    numba = speed[speed["impl"] == "numba"]
    assert (numba["status"] == "ok").all()
    assert numba["within_tolerance"].all() and (numba["median_ms"] > 0).all()
    assert numba["vs_numpy"].notna().all()
    if peers.peer_status("torch")[0]:
        assert numba["vs_torch"].notna().all()
    else:
        assert speed[speed["impl"] == "torch"]["status"].str.startswith("missing").all()
    assert set(table[table["section"] == "peak"]["D"]) == {32}  # D=16 is the speed table's
    memory = table[table["section"] == "memory"].set_index("impl")
    assert np.isfinite(memory.loc["numba", ["extra_mib", "rss_extra_mib"]]).all()
    targets = pd.read_csv(out / "targets.csv")
    assert tuple(targets.columns) == bench_config.TARGET_COLUMNS
    assert len(targets) >= 9
    assert targets["note"].isna().all() or not targets["note"].str.contains("quick").any()


def test_missing_peer_is_reported_not_dropped(monkeypatch):
    monkeypatch.setattr(peers, "peer_status", lambda name: (False, f"{name} is not installed"))
    config = bench_config.BenchConfig(rounds=1, error_rows=8)
    rows = bench_sections.compare_section("speed", config, B=1, H=1, L=16, D=8, causal=False,
                                          dtype=np.float32, threads=1, peaks={"float32": 1.0})
    by_impl = {row["impl"]: row for row in rows}
    assert by_impl["numba"]["status"] == "ok"
    for peer in ("torch", "numpy"):
        assert by_impl[peer]["status"] == f"missing: {peer} is not installed"
        assert np.isnan(by_impl[peer]["median_ms"])


def test_command_line_reruns_the_config():
    config = bench_config.config_from_args(bench_args(["--quick", "--L", "300", "--threads", "1"]))
    line = bench_config.command_line(config)
    assert line.startswith("attnbench bench --L 300 ") and "--threads 1" in line
    again = bench_config.config_from_args(bench_args(line.split()[2:]))
    assert again == config


def bench_args(argv):
    from attnbench.cli import build_parser

    return build_parser().parse_args(["bench", *argv])


def test_gemm_floor_runs_the_kernels_products():
    """The floor's last P · V tile equals the same product done by NumPy."""
    from attnbench.bench.gemm_floor import measurable, tile_gemms
    from kernels import numba_cpu

    rng = np.random.default_rng(1)
    L, Lk = 200, numba_cpu.BLOCK_K + 30  # a full key tile and a ragged one
    q = rng.standard_normal((1, 4, L, 8), dtype=np.float32)
    k = rng.standard_normal((1, 2, Lk, 8), dtype=np.float32)  # GQA: 2 heads share each
    v = rng.standard_normal((1, 2, Lk, 5), dtype=np.float32)
    assert measurable(q, k, v)  # big enough for the parallel kernel
    out = tile_gemms(q, k, v)
    last = slice(numba_cpu.BLOCK_K, Lk)
    expected = (q[0] @ np.repeat(k[0, :, last], 2, axis=0).transpose(0, 2, 1)) @ np.repeat(
        v[0, :, last], 2, axis=0)
    np.testing.assert_allclose(out[0], expected, rtol=1e-4, atol=1e-4)
    small = q[:, :1, :16]
    assert not measurable(small, small, small)  # the kernel runs it serially
    with pytest.raises(ValueError, match="serial kernel"):
        tile_gemms(small, small, small)
