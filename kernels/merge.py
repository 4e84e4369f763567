"""``merge_attention_states``: partial attention results over disjoint key sets, merged.

A call of attention over keys K split into disjoint parts K_1 .. K_S gives, per part s, the
normalised output ``o_s`` and the natural-log log-sum-exp ``lse_s`` of its visible scores
(``return_lse=True``).  The whole call's result is

    lse = log Σ_s exp(lse_s)                   (taken as m + log Σ_s exp(lse_s - m))
    out = Σ_s exp(lse_s - lse) · o_s

(FlashInfer's ``merge_states``, xFormers' ``merge_attentions``, FlashAttention 3's
``flash_attn_combine``).  A part that saw no key has ``lse_s = -inf``: its weight is 0 and
its output is never read (so a NaN there cannot leak).  A row empty in every part gives
out 0 and lse ``-inf``, never NaN.  Computed in float64 and rounded to the inputs' dtype:
this is not the hot path (the numba decode kernel merges its own splits).  Half outputs
(float16, bfloat16) come with float32 lses, as a half call's ``return_lse=True`` gives them:
out is rounded once to the half dtype, lse to float32.
"""

from __future__ import annotations

import numpy as np

from ._dtypes import HALF_DTYPES, is_half
from ._problems.arrays import refuse_device_array, require_dtype, wrong_dtype, wrong_shape

__all__ = ["merge_attention_states"]

_DTYPES = (np.dtype(np.float32), np.dtype(np.float64))


def _as_stack(name: str, parts, dtypes=_DTYPES) -> np.ndarray:
    """``parts`` as one array (S, ...): an array as it is, a sequence stacked."""
    if isinstance(parts, np.ndarray):
        arr = parts
    else:
        refuse_device_array(name, parts, "merge_attention_states")
        try:
            items = [np.asarray(x) for x in parts]
        except TypeError:
            raise TypeError(f"{name} must be an array or a sequence of arrays; got "
                            f"{type(parts).__name__}") from None
        if not items:
            raise ValueError(f"{name} is empty; expected at least one part")
        shapes = {x.shape for x in items}
        if len(shapes) > 1:
            raise ValueError(f"the parts of {name} differ in shape: {sorted(shapes)}")
        arr = np.stack(items)
    expected = "float32 or float64" + (
        ", or float16 or bfloat16 (with float32 lses)" if dtypes != _DTYPES else "")
    return require_dtype(name, arr, dtypes, expected)


def merge_attention_states(outs, lses):
    """Merge attention results computed over disjoint sets of keys into the whole result.

    Parameters
    ----------
    outs : ndarray, shape (S, ..., H, Lq, Dv), or a sequence of S arrays (..., H, Lq, Dv)
        Each part's normalised output (as :func:`kernels.attention` returns it), float32,
        float64, float16 or ``ml_dtypes.bfloat16``.
    lses : ndarray, shape (S, ..., H, Lq), or a sequence of S arrays (..., H, Lq)
        Each part's natural-log log-sum-exp of its visible scores (``return_lse=True``);
        ``-inf`` for a row that saw no key of the part.  The dtype of ``outs``; float32
        for half ``outs`` (the lse a half call returns).

    Returns
    -------
    out : ndarray, shape (..., H, Lq, Dv)
        ``Σ_s exp(lse_s - lse) · outs[s]``, in the dtype of ``outs``; 0 where every part
        is empty.
    lse : ndarray, shape (..., H, Lq)
        ``log Σ_s exp(lse_s)``, in the dtype of ``lses``; ``-inf`` where every part is
        empty.

    Raises
    ------
    TypeError
        A dtype other than these, or ``outs`` and ``lses`` of different dtypes other than
        half ``outs`` with float32 ``lses``.
    ValueError
        No part, or shapes that do not fit (``lses`` must be ``outs.shape[:-1]``).

    Notes
    -----
    A part with ``lse = -inf`` contributes nothing and its output is not read.  A NaN in
    a part's lse makes that row NaN; ``+inf`` is not a log-sum-exp of finite scores and
    gives NaN too.

    Examples
    --------
    >>> import numpy as np, kernels
    >>> rng = np.random.default_rng(0)
    >>> q, k, v = (rng.standard_normal((1, 2, 3, 8), dtype=np.float32) for _ in range(3))
    >>> parts = [kernels.attention(q, k[..., s, :], v[..., s, :], return_lse=True)
    ...          for s in (slice(0, 1), slice(1, 3))]
    >>> out, lse = kernels.merge_attention_states([p[0] for p in parts], [p[1] for p in parts])
    >>> bool(np.allclose(out, kernels.attention(q, k, v), atol=1e-5))
    True
    """
    outs = _as_stack("outs", outs, _DTYPES + HALF_DTYPES)
    lses = _as_stack("lses", lses)
    if is_half(outs.dtype) and lses.dtype != np.float32:
        raise wrong_dtype("lses", lses.dtype, f"float32 for outs of dtype "
                          f"{outs.dtype} (the lse a half call returns)")
    if not is_half(outs.dtype) and outs.dtype != lses.dtype:
        raise TypeError(f"outs and lses must share one dtype; got outs {outs.dtype}, "
                        f"lses {lses.dtype}")
    if outs.ndim < 2 or outs.shape[0] < 1:
        raise ValueError(f"outs must have shape (S, ..., Lq, Dv) with S >= 1; got {outs.shape}")
    if lses.shape != outs.shape[:-1]:
        raise wrong_shape("lses", lses.shape, f"{outs.shape[:-1]} (outs' shape "
                          f"{outs.shape} without its last dim)")
    wide = lses.astype(np.float64)  # (S, ..., Lq)
    with np.errstate(invalid="ignore"):
        top = wide.max(axis=0)  # (..., Lq); -inf where every part is empty
        empty = top == -np.inf
        shift = np.where(empty, 0.0, top)
        weights = np.exp(wide - shift)  # (S, ..., Lq); 0 for an empty part
        total = weights.sum(axis=0)
        # An empty part's output is not read: 0 · NaN would be NaN.
        parts = np.where((wide == -np.inf)[..., None], 0.0, outs.astype(np.float64))
        out = (weights[..., None] * parts).sum(axis=0)  # (..., Lq, Dv)
    with np.errstate(divide="ignore", invalid="ignore"):
        out = np.where(empty[..., None], 0.0, out / np.where(empty, 1.0, total)[..., None])
        lse = np.where(empty, -np.inf, shift + np.log(np.where(empty, 1.0, total)))
    return out.astype(outs.dtype), lse.astype(lses.dtype)
