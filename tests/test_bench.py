"""``attnbench bench``: a smoke run on tiny shapes; its table, targets and files.

Nothing here asserts a speed: the numbers of a unit-test run on a shared machine mean
nothing.  The tests check the shape of what the benchmark reports.
"""

import numpy as np
import pandas as pd
import pytest

from attnbench.bench import config as bench_config
from attnbench.bench import interval_targets
from attnbench.bench import sections as bench_sections
from attnbench.bench.output import format_markdown, format_targets
from attnbench.bench.run import run_bench
from attnbench.bench.targets import targets_table
from attnbench.cli import main
from attnbench.measure import peers
from attnbench.measure.intervals import format_samples

from .support import bench_without_pauses

TINY = ["--L", "64", "128", "--D", "16", "32", "--rounds", "2", "--peak-min-L", "128",
        "--float64-L", "64", "--memory-L", "128", "--tiny-L", "32", "--padding-L", "128",
        "--parallel-L", "128", "--startup-runs", "1",
        "--only", *(name for name in bench_config.SECTIONS
                    if name not in ("backward", "variants", "decode", "varlen",
                                     "precision"))]  # those have tests of their own


@pytest.fixture(scope="module")
def smoke(tmp_path_factory):
    out = tmp_path_factory.mktemp("bench")
    with pytest.MonkeyPatch.context() as patch:
        bench_without_pauses(patch)
        status = main(["bench", *TINY, "--out", str(out)])
    return status, out


@pytest.mark.slow  # an end-to-end run: left out of the quick lane
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
    from attnbench.kernels.numba_cpu import config

    rng = np.random.default_rng(1)
    L, Lk = 200, config.BLOCK_K + 30  # a full key tile and a ragged one
    q = rng.standard_normal((1, 4, L, 8), dtype=np.float32)
    k = rng.standard_normal((1, 2, Lk, 8), dtype=np.float32)  # GQA: 2 heads share each
    v = rng.standard_normal((1, 2, Lk, 5), dtype=np.float32)
    assert measurable(q, k, v)  # big enough for the parallel kernel
    out = tile_gemms(q, k, v)
    last = slice(config.BLOCK_K, Lk)
    expected = (q[0] @ np.repeat(k[0, :, last], 2, axis=0).transpose(0, 2, 1)) @ np.repeat(
        v[0, :, last], 2, axis=0)
    np.testing.assert_allclose(out[0], expected, rtol=1e-4, atol=1e-4)
    small = q[:, :1, :16]
    assert not measurable(small, small, small)  # the kernel runs it serially
    with pytest.raises(ValueError, match="serial kernel"):
        tile_gemms(small, small, small)


# --- the backward and variants sections ------------------------------------------------------


@pytest.fixture(scope="module")
def grad_and_variants():
    """The two sections alone, tiny (one round each: no interval, so no verdict)."""
    config = bench_config.BenchConfig(
        heads=2, head_size=16, rounds=1, interval_rounds=1, backward_lengths=(64,),
        backward_memory_length=64, window_length=96, window_left=16, documents_length=64,
        score_length=64, window_backward_length=80, sections=("backward", "variants"),
        peers=("torch",))
    with pytest.MonkeyPatch.context() as patch:
        bench_without_pauses(patch)
        table, meta = run_bench(config, progress=lambda line: None)
    return config, table, meta


def test_backward_section_rows(grad_and_variants):
    config, table, _ = grad_and_variants
    assert set(table["section"]) == {"backward", "variants"}
    rows = table[table["section"] == "backward"]
    timed = rows[rows["variant"] != "memory of one backward (out, lse given)"]
    numba = timed[timed["impl"] == "numba"]
    assert set(zip(numba["variant"], numba["causal"], strict=True)) == {
        (v, c) for v in ("backward (out, lse given)", "forward") for c in (False, True)}
    assert (numba["status"] == "ok").all() and (numba["median_ms"] > 0).all()
    assert (numba["gflops"] > 0).all()
    assert numba["samples_ms"].str.len().gt(0).all()
    torch_rows = timed[timed["impl"] == "torch"]
    assert len(torch_rows) == 2  # timed, or reported missing
    if peers.peer_status("torch")[0]:
        assert (torch_rows["status"] == "ok").all()
        backward = numba[numba["variant"].str.startswith("backward")]
        assert backward["vs_torch"].notna().all()
    else:
        assert torch_rows["status"].str.startswith("missing").all()
    memory = rows[rows["variant"].str.startswith("memory")].iloc[0]
    assert memory["L"] == 64 and np.isfinite(memory["extra_mib"])


def test_variants_section_rows(grad_and_variants):
    config, table, _ = grad_and_variants
    rows = table[table["section"] == "variants"].set_index("variant")
    assert set(rows.index) == {
        "window: causal", "window: causal + window left=16", "block_mask: window",
        "documents: plain", "documents: 8 documents", "block_mask: documents",
        "scores: plain", "scores: alibi", "scores: softcap", "scores: sinks",
        "window backward: causal", "window backward: causal + window left=16"}
    assert (rows["status"] == "ok").all() and (rows["median_ms"] > 0).all()
    # GFLOP/s from the visible pairs: the window keeps min(i, 16) + 1 keys of query i
    window = rows.loc["window: causal + window left=16"]
    pairs = sum(min(i, 16) + 1 for i in range(96))
    assert window["gflops"] == pytest.approx(4 * pairs * 2 * 16 / (window["median_ms"] / 1e3)
                                             / 1e9)
    backward = rows.loc["window backward: causal + window left=16"]
    pairs = sum(min(i, 16) + 1 for i in range(80))  # five products of 2·16 per pair
    assert backward["L"] == 80 and backward["gflops"] == pytest.approx(
        2 * pairs * 2 * 5 * 16 / (backward["median_ms"] / 1e3) / 1e9)
    documents = rows.loc["documents: 8 documents"]
    assert documents["gflops"] == pytest.approx(
        4 * 8 * 8**2 * 2 * 16 / (documents["median_ms"] / 1e3) / 1e9)


def test_targets_of_the_new_sections(grad_and_variants):
    config, table, meta = grad_and_variants
    targets = targets_table(table, config).set_index("target")
    new = ["backward numba / torch, non-causal", "backward numba / torch, causal",
           "causal speed-up of the backward", "backward / forward time (numba)",
           "extra memory of one backward call", "sliding window speed-up",
           "documents speed-up", "ALiBi / plain", "softcap / plain", "sinks / plain"]
    assert set(new) <= set(targets.index)
    assert "numba / numpy" not in targets.index  # no forward section ran: no forward target
    if not peers.peer_status("torch")[0]:
        new = new[2:]
        assert targets.loc["backward numba / torch, causal", "met"] is None
    timed = [name for name in new if name != "extra memory of one backward call"]
    # one sample per call: no interval, so no verdict either way
    assert (targets.loc[timed, "met"] == interval_targets.INCONCLUSIVE).all()
    assert targets.loc["extra memory of one backward call", "met"] in (True, False)
    assert "no L >= 2048: at L=64" in targets.loc["causal speed-up of the backward", "note"]
    text = format_targets(targets.reset_index())
    assert "inconclusive" in text
    assert "inconclusive" in format_markdown(table, targets.reset_index(), meta)


def _row(variant, samples_s):
    return {"section": "variants", "status": "ok", "variant": variant, "L": 64,
            "samples_ms": format_samples(samples_s)}


@pytest.mark.parametrize("ratio, met", [(0.5, True), (2.0, False), (1.0, "inconclusive")])
def test_ratio_targets_decide_from_the_interval(ratio, met):
    """Tight samples whose ratio is well below, well above, or at the goal."""
    goal = interval_targets.SCORE_MOD_GOAL
    rng = np.random.default_rng(0)
    plain = 1.0 + 0.01 * rng.random(8)
    scaled = goal * ratio * (1.0 + 0.01 * rng.random(8))
    table = pd.DataFrame([_row("scores: plain", plain), _row("scores: alibi", scaled)])
    config = bench_config.BenchConfig()
    target = {t["target"]: t for t in interval_targets.variant_targets(table, config)}
    assert target["ALiBi / plain"]["met"] == met
    assert target["softcap / plain"]["met"] is None  # no rows
    measured = target["ALiBi / plain"]["measured"]
    assert measured.startswith("L=64: ") and " [" in measured
    assert float(measured.split()[1]) == pytest.approx(goal * ratio, rel=0.02)


def test_interval_verdicts_and_their_combination():
    verdict = interval_targets.interval_verdict
    assert verdict(0.5, 0.9, 1.0, at_most=True) is True
    assert verdict(1.1, 1.5, 1.0, at_most=True) is False
    assert verdict(0.9, 1.1, 1.0, at_most=True) == "inconclusive"
    assert verdict(1.8, 2.0, 1.7, at_most=False) is True
    assert verdict(1.0, 1.6, 1.7, at_most=False) is False
    assert verdict(np.nan, np.nan, 1.0, at_most=True) == "inconclusive"
    combine = interval_targets.combine
    assert combine([]) is None
    assert combine([True, True]) is True
    assert combine([True, "inconclusive"]) == "inconclusive"
    assert combine(["inconclusive", False, True]) is False


def test_new_flags_reach_the_config():
    config = bench_config.config_from_args(bench_args(
        ["--backward-L", "128", "256", "--window-L", "512", "--documents-L", "256",
         "--score-L", "128", "--backward-memory-L", "1024", "--window-backward-L", "192",
         "--only", "variants", "backward"]))
    assert config.backward_lengths == (128, 256) and config.window_length == 512
    assert config.window_backward_length == 192
    assert config.sections == ("backward", "variants")  # in the bench's order
    again = bench_config.config_from_args(bench_args(bench_config.command_line(config).split()[2:]))
    assert again == config
