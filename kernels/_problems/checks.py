"""Argument checking and normalisation for :func:`kernels.attention`.

Every backend receives an :class:`AttentionProblem` (defined in :mod:`kernels._problems.dense`,
importable from here): contiguous 4-D arrays of one floating dtype, a mask kept as given
(bool, or additive float whose ``-inf`` entries mean "not visible"; the problem converts
between the two on request), key lengths as ``int64`` and the causal alignment as a single
integer offset (the one representation of ``causal`` from here to the kernels;
:func:`causal_offset` parses it).  The checks of the backward pass's extra arrays
(:func:`check_backward_args`) are here too.  All
user-facing errors are raised here, before any kernel runs, so no backend ever sees an
argument it could misinterpret (and no user ever sees a Numba typing traceback).
"""

from __future__ import annotations

import dataclasses
import math
import numbers

import numpy as np

from .._dtypes import SUPPORTED_DTYPES, compute_dtype, is_half
from .arrays import (
    as_numpy,
    require_dtype,
    require_integers,
    require_shape,
    wrong_dtype,
    wrong_shape,
)
from .dense import AttentionProblem

BACKEND_NAMES = ("auto", "reference", "numba", "cuda")
CAUSAL_ALIGNMENTS = ("top-left", "bottom-right")


def _describe(x) -> str:
    return f"shape {tuple(x.shape)} and dtype {x.dtype}"


def as_float_array(name: str, x) -> np.ndarray:
    x = as_numpy(name, x, "kernels.attention",
                 " (use kernels.cuda_backend.attention_device for device arrays)")
    bf16 = ("bfloat16 (ml_dtypes)" if len(SUPPORTED_DTYPES) == 4
            else "bfloat16 (unavailable here: install ml_dtypes)")
    return require_dtype(name, x, SUPPORTED_DTYPES, f"float32, float64, float16 or {bf16} "
                         "(convert with x.astype(np.float32))")


def check_backend(backend) -> str:
    """Return ``backend`` if it names a known backend, else raise ValueError."""
    if not isinstance(backend, str) or backend not in BACKEND_NAMES:
        raise ValueError(f"backend={backend!r} is unknown; expected one of {list(BACKEND_NAMES)}")
    return backend


def check_qkv(q, k, v):
    """Check q, k and v (types, dtypes, shapes that fit together); return them as arrays."""
    q = as_float_array("q", q)
    k = as_float_array("k", k)
    v = as_float_array("v", v)
    if not (q.dtype == k.dtype == v.dtype):
        raise TypeError(
            f"q, k and v must share one dtype; got q {q.dtype}, k {k.dtype}, v {v.dtype}"
        )
    if q.ndim < 2:
        raise ValueError(f"q must have at least 2 dims (L, D); got {_describe(q)}")
    if not (q.ndim == k.ndim == v.ndim):
        raise ValueError(
            "q, k and v must have the same number of dims; got "
            f"q {q.shape}, k {k.shape}, v {v.shape}"
        )
    if q.shape[-1] != k.shape[-1]:
        raise ValueError(
            f"q and k must share the head size D (last dim); got q {q.shape}, k {k.shape}"
        )
    if q.shape[-1] < 1:
        raise ValueError(f"the head size D must be at least 1; got q {q.shape}")
    if k.shape[-2] != v.shape[-2]:
        raise ValueError(
            f"k and v must have the same number of keys (dim -2); got k {k.shape}, v {v.shape}"
        )
    if q.ndim >= 3:
        if k.shape[-3] != v.shape[-3]:
            raise ValueError(
                f"k and v must have the same number of heads (dim -3); got k {k.shape}, v {v.shape}"
            )
        H, Hkv = q.shape[-3], k.shape[-3]
        if Hkv == 0 or H % Hkv != 0:
            raise ValueError(
                f"the number of query heads ({H}, q {q.shape}) must be a multiple of the number "
                f"of key/value heads ({Hkv}, k {k.shape})"
            )
    if not (q.shape[:-3] == k.shape[:-3] == v.shape[:-3]):
        raise ValueError(
            "q, k and v must share their batch dims (all but the last three); got "
            f"q {q.shape}, k {k.shape}, v {v.shape}"
        )
    return q, k, v


def _to_4d(x: np.ndarray) -> np.ndarray:
    """(L, D) -> (1, 1, L, D); (H, L, D) -> (1, H, L, D); (..., H, L, D) -> (B, H, L, D)."""
    if x.ndim == 2:
        x = x[None, None]
    elif x.ndim == 3:
        x = x[None]
    else:
        x = x.reshape((math.prod(x.shape[:-3]),) + x.shape[-3:])
    return np.ascontiguousarray(x)


def _check_mask(mask, full_shape: tuple, dtype: np.dtype) -> np.ndarray | None:
    """Turn a mask broadcastable to ``full_shape`` into a 4-D mask: bool, or additive in dtype.

    A bool mask stays bool (True = attend; :meth:`AttentionProblem.additive_mask` converts
    it where a backend needs the additive form).  A float mask is cast to ``dtype``'s
    compute dtype (float32 for half inputs: a half mask widens exactly, a float32 one is
    kept, and what is added to a float32 score is never rounded to half).
    """
    if mask is None:
        return None
    mask = np.asarray(mask)
    if (mask.dtype != np.bool_ and not np.issubdtype(mask.dtype, np.floating)
            and not is_half(mask.dtype)):
        raise wrong_dtype("mask", mask.dtype, "bool (True = attend) or a float dtype "
                          "(added to the scores)")
    try:
        broadcast = np.broadcast_shapes(mask.shape, full_shape)
    except ValueError:
        broadcast = None
    if broadcast != tuple(full_shape):
        raise ValueError(
            f"mask of shape {mask.shape} cannot be broadcast to the scores' shape {full_shape} "
            "(..., H, Lq, Lk)"
        )
    # Left-pad to the full rank, keep the (H, Lq, Lk) tail unexpanded (no L x L copy of a
    # broadcast mask) and fold the batch dims into one, expanding them only if the mask
    # varies along some of them.
    mask = mask.reshape((1,) * (len(full_shape) - mask.ndim) + mask.shape)
    tail = mask.shape[-3:] if len(full_shape) >= 3 else (1,) + mask.shape[-2:]
    batch = mask.shape[:-3]
    if all(n == 1 for n in batch):
        mask = mask.reshape((1,) + tail)
    else:
        batch_full = tuple(full_shape[:-3])
        mask = np.broadcast_to(mask, batch_full + tail).reshape((math.prod(batch_full),) + tail)
    if mask.dtype == np.bool_:
        return np.ascontiguousarray(mask)
    return np.ascontiguousarray(mask, dtype=compute_dtype(dtype))


def _check_key_lengths(key_lengths, batch_shape: tuple, Lk: int) -> np.ndarray | None:
    if key_lengths is None:
        return None
    arr = require_integers("key_lengths", key_lengths)
    B = math.prod(batch_shape)
    if arr.ndim == 0:
        arr = np.full(B, int(arr), dtype=np.int64)
    elif arr.shape == tuple(batch_shape) or (arr.shape == (B,) and len(batch_shape) <= 1):
        arr = arr.reshape(B).astype(np.int64)
    else:
        raise wrong_shape("key_lengths", arr.shape, "a scalar or the batch shape "
                          f"{tuple(batch_shape)} of q")
    if arr.size and (arr.min() < 0 or arr.max() > Lk):
        raise ValueError(
            f"key_lengths must lie in [0, Lk={Lk}]; got values from {arr.min()} to {arr.max()}"
        )
    return np.ascontiguousarray(arr)


def causal_offset(causal, Lq: int, Lk: int) -> int | None:
    """The ``causal`` argument as an offset: query ``i`` sees keys ``j <= i + offset``.

    Parameters
    ----------
    causal : bool or {"top-left", "bottom-right"} or None
        ``False``/``None``: not causal (returns None).  ``True``/``"top-left"``: 0 (PyTorch's
        ``is_causal``).  ``"bottom-right"``: ``Lk - Lq`` (FlashAttention's alignment).
    Lq, Lk : int
        Number of queries and keys.

    Returns
    -------
    int or None
        The offset, or None when not causal.
    """
    if isinstance(causal, np.bool_):
        causal = bool(causal)
    if causal is False or causal is None:
        return None
    if causal is True or causal == "top-left":
        return 0
    if causal == "bottom-right":
        return Lk - Lq
    raise ValueError(f"causal={causal!r}; expected False, True, 'top-left' or 'bottom-right'")


def _check_scale(scale, D: int) -> float:
    if scale is None:
        return 1.0 / math.sqrt(D)
    if isinstance(scale, bool) or not isinstance(scale, numbers.Real):
        raise TypeError(f"scale must be a real number or None; got {type(scale).__name__}")
    scale = float(scale)
    if not math.isfinite(scale):
        raise ValueError(f"scale must be finite; got {scale}")
    return scale


def check_dropout(dropout_p, seed) -> tuple[float, int]:
    """Validate ``dropout_p`` in [0, 1) and ``seed``; draw a seed if none is given."""
    if isinstance(dropout_p, bool) or not isinstance(dropout_p, numbers.Real):
        raise TypeError(f"dropout_p must be a real number; got {type(dropout_p).__name__}")
    dropout_p = float(dropout_p)
    if not (0.0 <= dropout_p < 1.0):
        raise ValueError(f"dropout_p must lie in [0, 1); got {dropout_p}")
    if seed is None:
        seed = int(np.random.SeedSequence().generate_state(1)[0]) if dropout_p > 0 else 0
    elif isinstance(seed, bool) or not isinstance(seed, numbers.Integral):
        raise TypeError(f"seed must be an int or None; got {type(seed).__name__}")
    seed = int(seed)
    if not (0 <= seed < 2**32):
        raise ValueError(f"seed must lie in [0, 2**32); got {seed}")
    return dropout_p, seed


def check_deterministic(deterministic) -> bool:
    """``deterministic`` as a bool (a NumPy bool too); TypeError naming it otherwise.  The
    one check of the argument, for :func:`kernels.attention_with_kvcache` and
    :func:`kernels.attention_backward`."""
    if not isinstance(deterministic, bool | np.bool_):
        raise TypeError(f"deterministic must be a bool; got {type(deterministic).__name__}")
    return bool(deterministic)


def check_options(q_shape: tuple, k_shape: tuple, dtype: np.dtype, *, causal=False, mask=None,
                  key_lengths=None, scale=None, dropout_p=0.0, seed=None,
                  return_weights=False) -> dict:
    """Validate every argument of :func:`kernels.attention` except the arrays themselves.

    ``q_shape`` and ``k_shape`` are the shapes of already-checked q and k (see
    :func:`check_qkv`).  Returns the :class:`AttentionProblem` fields other than q, k, v.
    """
    had_head_dim = len(q_shape) >= 3
    batch_shape = tuple(q_shape[:-3])
    Lq, Lk, D = q_shape[-2], k_shape[-2], q_shape[-1]
    H = q_shape[-3] if had_head_dim else 1
    full_scores_shape = batch_shape + ((H,) if had_head_dim else ()) + (Lq, Lk)
    offset = causal_offset(causal, Lq, Lk)
    scale = _check_scale(scale, D)
    dropout_p, seed = check_dropout(dropout_p, seed)
    if not isinstance(return_weights, bool | np.bool_):
        raise TypeError(f"return_weights must be a bool; got {type(return_weights).__name__}")
    return dict(
        batch_shape=batch_shape, had_head_dim=had_head_dim,
        mask=_check_mask(mask, full_scores_shape, dtype),
        key_lengths=_check_key_lengths(key_lengths, batch_shape, Lk), causal_offset=offset,
        scale=scale, dropout_p=dropout_p, seed=seed, return_weights=bool(return_weights),
    )


def check_attention_args(
    q, k, v, *, causal=False, mask=None, key_lengths=None, scale=None,
    dropout_p=0.0, seed=None, return_weights=False,
) -> AttentionProblem:
    """Validate the arguments of :func:`kernels.attention` and normalise them.

    Raises
    ------
    TypeError
        A wrong type or dtype (integer, float8, mixed dtypes, non-real scale ...).
    ValueError
        Shapes that do not fit together or values out of range; the message names the
        argument, the shapes seen and what was expected.
    """
    q, k, v = check_qkv(q, k, v)
    fields = check_options(
        q.shape, k.shape, q.dtype, causal=causal, mask=mask, key_lengths=key_lengths,
        scale=scale, dropout_p=dropout_p, seed=seed, return_weights=return_weights,
    )
    return AttentionProblem(q=_to_4d(q), k=_to_4d(k), v=_to_4d(v), **fields)


def check_mods(problem: AttentionProblem, score_mod=None, mask_mod=None) -> AttentionProblem:
    """``problem`` with its score and mask functions checked (:mod:`kernels.mods`).

    Plain functions are wrapped and compiled on a probe (TypeError naming the function if
    Numba cannot compile it, or its arity or return type is wrong); bound data that does
    not fit the problem's shape is a ValueError.  Nothing runs.
    """
    if score_mod is None and mask_mod is None:
        return problem
    from .. import mods

    B, H, _, Lq, Lk, _, _ = problem.shape
    score = None if score_mod is None else mods.as_score_mod(score_mod)
    mask = None if mask_mod is None else mods.as_mask_mod(mask_mod)
    for mod in (score, mask):
        if mod is not None:
            mod.check(B, H, Lq, Lk)
    if score is not None:
        score.element("cpu", compute_dtype(problem.dtype))  # compiles (probes) user functions
    return dataclasses.replace(problem, score_mod=score, mask_mod=mask)


# --- the backward pass ------------------------------------------------------------------------


def _check_grad_like(name: str, x, expected_shape: tuple, dtype: np.dtype, what: str):
    """``x`` as an array of ``expected_shape`` and ``dtype``, or a TypeError/ValueError
    naming ``name``."""
    x = as_numpy(name, x, "attention_backward")
    require_dtype(name, x, (dtype,), f"{dtype}, the dtype of q, k and v "
                  f"(convert with {name}.astype(np.{dtype.name}))")
    return require_shape(name, x, expected_shape, f" {what}")


def check_backward_args(problem: AttentionProblem, q_shape: tuple, dout, out=None, lse=None):
    """Check the arrays :func:`kernels.attention_backward` takes beside q, k and v.

    Parameters
    ----------
    problem : AttentionProblem
        The validated forward problem (from :func:`check_attention_args`).
    q_shape : tuple
        The caller's shape of q (any rank); ``dout`` and ``out`` must have it with the last
        dim replaced by Dv, ``lse`` without its last dim.
    dout, out, lse : array_like
        The gradient of the output, and optionally the forward's output and log-sum-exp.

    Returns
    -------
    dout : ndarray, shape (B, H, Lq, Dv), C-contiguous
    out : ndarray, shape (B, H, Lq, Dv), or None
    lse : ndarray, shape (B, H, Lq), or None

    Raises
    ------
    TypeError
        A dtype other than q's.
    ValueError
        A shape other than the forward output's (``dout``, ``out``) or than
        ``q.shape[:-1]`` (``lse``); the message names the argument.
    """
    B, H, _, Lq, _, _, Dv = problem.shape
    out_shape = tuple(q_shape[:-1]) + (Dv,)
    what = "(the shape of attention's output: q's shape with its last dim replaced by Dv)"
    dout = _check_grad_like("dout", dout, out_shape, problem.dtype, what)
    dout = np.ascontiguousarray(dout.reshape(B, H, Lq, Dv))
    if out is not None:
        out = _check_grad_like("out", out, out_shape, problem.dtype, what)
        out = np.ascontiguousarray(out.reshape(B, H, Lq, Dv))
    if lse is not None:
        lse = _check_grad_like("lse", lse, tuple(q_shape[:-1]), compute_dtype(problem.dtype),
                               "(q's shape without its last dim: (..., H, Lq))")
        lse = np.ascontiguousarray(lse.reshape(B, H, Lq))
    return dout, out, lse
