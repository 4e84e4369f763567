"""Sweep points of the decode and varlen kinds (attnbench.sweep.kinds), and the sinks variant.

- a decode point times one step against a full cache and says the K/V bytes it read;
- a varlen point is judged by the dense oracle of each sequence, and a wrong output fails;
- what a kind cannot run is skipped with the reason;
- the scaling table claims O(Lk) for decode time (named Lk) and nothing against a varlen
  batch's size.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from attnbench.studies import scaling
from attnbench.sweep import kinds
from attnbench.sweep.grid import Grid, Point
from attnbench.sweep.runner import PointRunner


def _point(**kw) -> Point:
    base = dict(backend="numba", L=32, d_k=8, heads=4, kv_heads=2, batch=3, mask="none",
                dtype="float32")
    return Point(**{**base, **kw})


def test_varlen_lengths_halve_down_to_one():
    assert kinds.varlen_lengths(4096, 8).tolist() == [4096, 2048, 1024, 512, 256, 128, 64, 32]
    assert kinds.varlen_lengths(4, 4).tolist() == [4, 2, 1, 1]


@pytest.mark.parametrize("point, words", [
    (_point(kind="decode", mask="causal"), "mask none"),
    (_point(kind="decode", direction="backward"), "no backward"),
    (_point(kind="decode", variant="window-8"), "variants"),
    (_point(kind="varlen", backend="numpy"), "packed-batch"),
    (_point(kind="varlen", mask="padding"), "masks none, causal"),
    (_point(kind="varlen", variant="documents-2"), "documents"),
    (_point(kind="varlen", backend="cuda"), "CPU only"),
])
def test_what_a_kind_cannot_run_is_skipped_with_the_reason(point, words):
    row = PointRunner(max_time=0.01)(point)
    assert row["status"] == "skipped" and words in row["reason"], row["reason"]


def test_grids_reject_an_unknown_kind():
    with pytest.raises(ValueError, match="kind 'prefill' is unknown"):
        Grid(kind=("prefill",))


def test_a_decode_point_reads_its_cache_once_and_agrees_with_the_oracle():
    point = _point(kind="decode", L=48, batch=2)
    row = PointRunner(max_time=0.02)(point)
    assert row["status"] == "ok", row["reason"]
    assert row["within_tolerance"]
    assert row["bytes_read"] == 2 * 2 * 48 * 2 * 8 * 4  # B·Hkv·Lk·(D + Dv)·4 bytes
    assert row["read_gbs"] == pytest.approx(row["bytes_read"] / row["median_ms"] / 1e6)
    assert row["flops"] == 2 * 4 * 48 * 4 * 8  # B·H·Lk pairs, 2·(D + Dv) each


def test_a_bfloat16_decode_point_reads_half_the_bytes_within_the_half_tolerance():
    point = _point(kind="decode", L=48, batch=2, dtype="bfloat16")
    row = PointRunner(max_time=0.02)(point)
    assert row["status"] == "ok", row["reason"]
    assert row["within_tolerance"]
    assert row["bytes_read"] == 2 * 2 * 48 * 2 * 8 * 2  # B·Hkv·Lk·(D + Dv)·2 bytes


@pytest.mark.parametrize("kw", [dict(mask="causal"), dict(mask="causal", variant="sinks"),
                                dict(mask="none", direction="backward"),
                                dict(mask="causal", direction="backward", variant="sinks"),
                                dict(mask="causal", dtype="float16"),
                                dict(mask="causal", direction="backward", variant="sinks",
                                     dtype="bfloat16")])
def test_a_varlen_point_is_judged_by_each_sequences_dense_oracle(kw):
    runner = PointRunner(max_time=0.02)
    point = _point(kind="varlen", **kw)
    row, out = runner.time_point(point)
    assert row["status"] == "ok", row["reason"]
    good = runner.check_point(point, dict(row), out)
    assert good["within_tolerance"], good
    bump = 1e-3 if point.dtype in ("float32", "float64") else 0.1  # > a few ulps of half
    if point.direction == "forward":  # a wrong entry in the last (shortest) sequence fails
        wrong = np.array(out, copy=True)
        wrong[-1, 0, 0] += bump
    else:
        grads, lse = out
        wrong = (tuple(g.copy() for g in grads), lse)
        wrong[0][1][-1, 0, 0] += bump  # dk
    bad = runner.check_point(point, dict(row), wrong)
    assert not bad["within_tolerance"]


def test_a_decode_series_is_claimed_linear_in_lk_and_a_varlen_batch_size_not_at_all():
    rows = []
    for kind, variable, values in (("decode", "L", (64, 128, 256)),
                                   ("varlen", "batch", (1, 2, 3))):
        for value in values:
            point = _point(kind=kind, **{"batch": 2, "L": 32, variable: value})
            t = 10.0 * value  # ms, proportional: far above the fit's 1 ms floor
            rows.append({**point.as_dict(), "status": "ok", "median_ms": t,
                         "call_overhead_ms": 1e-6, "flops": value, "peak_mem_bytes": 10.0,
                         "base_mem_bytes": 0.0})
    fits = scaling.scaling_table(pd.DataFrame(rows), quantities=("time",))
    decode = fits[(fits["kind"] == "decode") & (fits["variable"] == "L")].iloc[0]
    assert decode["expected"] == 1 and "Lk" in decode["verdict"]
    varlen = fits[(fits["kind"] == "varlen") & (fits["variable"] == "batch")].iloc[0]
    assert np.isnan(varlen["expected"]) and varlen["outcome"] == "measured"
