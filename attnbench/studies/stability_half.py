"""The stability study's float16 points: what half precision does to masks and large logits.

Three measured points (issue 25; claim C25's recorded value):

- ``float16(-1e9)``: the "−1e9 padding" constant is beyond float16's range (largest finite
  65504), so in float16 it *is* −inf: a padded key is hidden exactly, where float32 keeps
  −1e9 as a (very negative) number;
- a logit above 65504 (unscaled, large q and k): a softmax computed in float16 overflows to
  inf and returns NaN; :func:`kernels.attention` on float16 inputs keeps its scores in
  float32 and returns the attended value;
- unscaled against scaled float16 attention at d_k = 1024 (q, k, v ~ N(0, 1)): the
  kernel's error against the float64 oracle, which grows with the logits' spread.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from attnbench import kernels
from attnbench.kernels._dtypes import largest
from attnbench.measure.oracle import max_abs_error, oracle

__all__ = ["half_study"]

#: Seed of the random draws.
SEED = 25


def _naive_float16_softmax(x: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore", invalid="ignore"):
        e = np.exp(x.astype(np.float16))
        return e / e.sum(axis=-1, keepdims=True)


def half_study(d_k: int = 1024, n_queries: int = 64, n_keys: int = 128) -> pd.DataFrame:
    """The float16 points, one row each: ``point``, ``value``, ``finite``, ``note``.

    Parameters
    ----------
    d_k : int, default 1024
        Head size of the scaled/unscaled comparison.
    n_queries, n_keys : int
        Its number of queries and keys.

    Returns
    -------
    DataFrame
    """
    rows = []
    with np.errstate(over="ignore"):
        minus = float(np.float16(-1e9))
    rows.append({"point": "float16(-1e9)", "value": minus, "finite": bool(np.isfinite(minus)),
                 "note": f"beyond float16's largest {largest(np.float16):g}: a -1e9 "
                         "padding mask hides keys exactly (float32(-1e9) stays finite)"})
    q = np.full((1, 1, 1, 2), 200, np.float16)  # (B, H, Lq, D)
    k = np.array([[[[200, 200], [201, 201], [0, 0]]]], np.float16)  # scores 80000, 80400, 0
    v = np.array([[[[1.0], [2.0], [3.0]]]], np.float16)
    naive = _naive_float16_softmax(np.array([80000.0, 80400.0, 0.0]))
    rows.append({"point": "softmax in float16 of logits 80000, 80400, 0",
                 "value": float(naive[1]), "finite": bool(np.isfinite(naive).all()),
                 "note": "exp overflows float16: inf/inf"})
    out = kernels.attention(q, k, v, scale=1.0, backend="numba")
    rows.append({"point": "kernels.attention, float16 inputs, the same logits",
                 "value": float(out[0, 0, 0, 0]), "finite": bool(np.isfinite(out).all()),
                 "note": "scores kept in float32: the key of logit 80400 wins (value 2)"})
    rng = np.random.default_rng(SEED)
    q = rng.standard_normal((1, 1, n_queries, d_k)).astype(np.float16)
    k = rng.standard_normal((1, 1, n_keys, d_k)).astype(np.float16)
    v = rng.standard_normal((1, 1, n_keys, d_k)).astype(np.float16)
    for scaled in (True, False):
        scale = None if scaled else 1.0
        out = kernels.attention(q, k, v, scale=scale, backend="numba")
        exact, _ = oracle(kernels.prepare(q, k, v, scale=scale))
        rows.append({"point": f"float16 attention, d_k={d_k}, "
                              f"{'scaled' if scaled else 'unscaled'}: max error",
                     "value": max_abs_error(out, exact), "finite": bool(np.isfinite(out).all()),
                     "note": "against the float64 oracle over the float16 inputs"})
    return pd.DataFrame(rows)
