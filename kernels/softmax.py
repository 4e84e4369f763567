"""A numerically stable softmax with temperature, for any axis."""

from __future__ import annotations

import numbers

import numpy as np


def softmax(x, axis=-1, temperature=1.0):
    """Softmax of ``x / temperature`` along ``axis``, computed stably.

    The maximum is subtracted before exponentiating, so large logits do not overflow
    (``softmax([1000, 1001])`` is ``[0.269, 0.731]``, not NaN).

    Parameters
    ----------
    x : array_like
        Real values. float32 and float64 keep their dtype; float16 is computed in float32
        and returned as float16; integers and bools are computed in float64.
    axis : int, default -1
        The axis the probabilities sum over.
    temperature : float, default 1.0
        Positive and finite. Above 1 the distribution flattens, below 1 it sharpens.

    Returns
    -------
    ndarray
        Same shape as ``x``; entries in [0, 1] summing to 1 along ``axis``. A slice whose
        entries are all ``-inf`` has no defined softmax and returns zeros (the convention of
        :func:`kernels.attention` for a query that sees no key).

    Examples
    --------
    >>> import numpy as np, kernels
    >>> kernels.softmax(np.array([0.9, 0.1, 0.3])).round(2)
    array([0.5 , 0.22, 0.27])
    """
    x = np.asarray(x)
    if x.dtype == np.bool_ or np.issubdtype(x.dtype, np.integer):
        x = x.astype(np.float64)
    elif not np.issubdtype(x.dtype, np.floating):
        raise TypeError(f"softmax needs real numbers; got dtype {x.dtype}")
    if isinstance(temperature, bool) or not isinstance(temperature, numbers.Real):
        raise TypeError(f"temperature must be a real number; got {type(temperature).__name__}")
    if not (np.isfinite(temperature) and temperature > 0):
        raise ValueError(f"temperature must be positive and finite; got {temperature}")
    out_dtype = x.dtype
    work = x.astype(np.promote_types(x.dtype, np.float32), copy=False)
    z = work / work.dtype.type(temperature)
    row_max = np.max(z, axis=axis, keepdims=True, initial=-np.inf)
    row_max = np.where(np.isneginf(row_max), 0, row_max).astype(work.dtype)
    e = np.exp(z - row_max)
    total = np.sum(e, axis=axis, keepdims=True)
    out = np.divide(e, total, out=np.zeros_like(e), where=total > 0)
    return out.astype(out_dtype, copy=False)
