"""Pluggable peers: ``attnbench sweep --backend`` and ``attnbench bench --peers`` take the
implementation specs of ``attnbench conform`` (module:function, registered names)."""

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from attnbench import kernels
from attnbench.bench.config import BenchConfig
from attnbench.bench.sections import compare_section
from attnbench.cli import main
from attnbench.measure import peers

REPO = Path(__file__).resolve().parents[1]
CORRECT = "tests.conformance_impls:correct"


def test_which_names_are_external_peers():
    for name in ("numba", "reference", "cuda", "torch-cuda", "numpy", "torch"):
        assert not peers.is_external(name)
    assert peers.is_external(CORRECT) and peers.is_peer(CORRECT)
    assert not peers.is_external("jax")  # attnbench's own registered names are conform's
    assert not peers.is_external("no-such-name") and not peers.is_peer("no-such-name")
    assert peers.PEERS == ("numpy", "torch")  # the built-in peers are unchanged


def test_an_external_peer_is_called_through_its_adapter():
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((1, 2, 9, 8)).astype(np.float32) for _ in range(3))
    assert peers.peer_status(CORRECT)[0]
    out = peers.make_call(CORRECT, q, k, v, {"causal": True})()
    np.testing.assert_array_equal(out, kernels.attention(q, k, v, causal=True,
                                                         backend="reference"))
    with pytest.raises(peers.UnsupportedByPeer, match="no backward"):
        peers.make_backward_call(CORRECT, q, k, v, q, {})
    usable, why = peers.peer_status("no_such_module:attention")
    assert not usable and "cannot be loaded" in why
    assert peers.peer_threads(CORRECT) is None


def test_sweep_backend_module_function(tmp_path, monkeypatch):
    monkeypatch.setenv("PYTHONPATH", str(REPO))
    status = main(["sweep", "--L", "32", "48", "64", "--dk", "8", "--heads", "1", "--batch",
                   "1", "--mask", "none", "causal", "--dtype", "float32", "--backend", CORRECT,
                   "--out", str(tmp_path), "--max-time", "0.01"])
    assert status == 0
    table = pd.read_csv(tmp_path / "sweep.csv")
    assert set(table["backend"]) == {CORRECT}
    assert (table["status"] == "ok").all() and (table["max_abs_err"] <= table["tolerance"]).all()


def test_another_package_s_registered_name_is_a_peer(monkeypatch):
    from attnbench.measure import implementations

    monkeypatch.setattr(implementations, "registered_names",
                        lambda: frozenset({"theirs", "jax"}))
    assert peers.is_external("theirs") and not peers.is_external("jax")


def test_sweep_rejects_an_unknown_backend():
    with pytest.raises(SystemExit) as exit_info:
        main(["sweep", "--backend", "no-such-name"])
    assert exit_info.value.code == 2


def test_bench_times_an_external_peer_beside_numba():
    config = BenchConfig(peers=("numpy", CORRECT), rounds=2, min_time=0.001, error_rows=16)
    rows = compare_section("speed", config, B=1, H=2, L=64, D=16, causal=False,
                           dtype=np.float32, threads=1, peaks={"float32": 100.0})
    by_impl = {row["impl"]: row for row in rows}
    assert {"numba", "numpy", CORRECT} <= set(by_impl)
    assert by_impl[CORRECT]["status"] == "ok" and by_impl[CORRECT]["median_ms"] > 0
    assert by_impl[CORRECT]["within_tolerance"]
    assert "torch" not in by_impl  # not asked for


def test_bench_peers_flag_accepts_specs():
    from attnbench.cli import build_parser

    args = build_parser().parse_args(["bench", "--peers", "torch", CORRECT])
    assert args.peers == ["torch", CORRECT]
    with pytest.raises(SystemExit):
        build_parser().parse_args(["bench", "--peers", "no-such-name"])

