"""The peers beside kernels: a plain NumPy implementation and PyTorch's SDPA (if installed)."""

import pytest

from attnbench.measure import peers
from tests.benchmarks.common import GRID, problem, run_benchmark, shape_id
from tests.benchmarks.test_attention import MASKS, SHAPES

PEERS = ["numpy", "torch"]


@pytest.mark.parametrize("peer", PEERS)
@pytest.mark.parametrize("mask", MASKS)
@pytest.mark.parametrize("shape", SHAPES[GRID], ids=shape_id)
def test_peer(benchmark, shape, mask, peer):
    usable, why = peers.peer_status(peer)
    if not usable:
        pytest.skip(why)
    point, q, k, v, kwargs = problem(peer, shape, mask)
    run_benchmark(benchmark, peers.make_call(peer, q, k, v, kwargs), point, q, k, v, kwargs)
