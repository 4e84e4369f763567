"""The float32 tanh that softcap's CPU kernels compile (:func:`kernels.mods.lowering.tanh_for`).

A rational function fitted by scripts/fit_tanh.py, which checks every float32 in [0, 20]
(largest error 5.13 ulps of the exact result, none outside [-1, 1]); here a dense grid and
the special values, so that a changed coefficient, clamp or order of evaluation fails.
"""

import numpy as np
from numba import vectorize

from attnbench.kernels.mods.lowering import tanh_for

TANH32 = tanh_for("cpu", np.float32)


@vectorize(["float32(float32)"])
def _apply(x):
    return TANH32(x)


def _ulps(got, x):
    exact = np.tanh(x.astype(np.float64))
    return np.abs(got.astype(np.float64) - exact) / np.spacing(np.abs(exact).astype(np.float32))


def test_within_the_documented_ulps_and_never_past_one():
    tiny = np.geomspace(1e-30, 1e-2, 20001)
    x = np.concatenate([np.linspace(-12, 12, 2_000_001), tiny, -tiny]).astype(np.float32)
    got = _apply(x)
    assert _ulps(got, x).max() <= 5.5
    assert np.abs(got).max() <= 1
    assert np.array_equal(np.sign(got), np.sign(x))  # odd, and tanh(0) = 0


def test_special_values():
    x = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 1e30, -1e30, 1e-40], dtype=np.float32)
    with np.errstate(invalid="ignore"):  # the NaN input sets the invalid flag
        got = _apply(x)
    np.testing.assert_array_equal(got[:4], [0.0, -0.0, 1.0, -1.0])
    assert np.signbit(got[1])
    assert np.isnan(got[4])
    np.testing.assert_array_equal(got[5:7], [1.0, -1.0])
    assert got[7] == x[7]  # a subnormal input is its own tanh
