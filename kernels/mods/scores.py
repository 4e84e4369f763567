"""Built-in score functions of :mod:`kernels.mods` (ALiBi, soft-capping, relative position
biases) with their derivatives, and :func:`chain`.

Score built-ins are written per dtype (``F``: the scores' Numba type, also a cast), so that
no int64 or float64 value promotes float32 scores to float64."""

from __future__ import annotations

import numbers

import numpy as np

from .base import ScoreMod, _compile, source_name
from .user import as_score_mod


class _BuiltinScore(ScoreMod):
    def __init__(self, name, source_factory, grad_factory, data, check=None, formula=None):
        super().__init__(name)
        self.formula = formula
        self._factory = source_factory
        self._grad_factory = grad_factory
        self._data = data  # floats are cast to the scores' dtype by args()
        self._check = check

    def args(self, dtype=np.float64):
        dtype = np.dtype(dtype)
        return tuple(
            x.astype(dtype, copy=False) if isinstance(x, np.ndarray) and x.dtype.kind == "f"
            else (dtype.type(x) if isinstance(x, np.floating) else x)
            for x in self._data
        )

    def _build(self, factory, target, dtype):
        mc = _compile()
        dtype = np.dtype(dtype)
        return mc.memo(("builtin", target, factory, dtype.name),
                       lambda: mc.jit_for(target)(
                           factory(mc.scalar_type(dtype), mc.tanh_for(target, dtype))))

    def element(self, target="cpu", dtype=np.float64):
        return self._build(self._factory, target, dtype)

    def grad(self, target="cpu", dtype=np.float64):
        return self._build(self._grad_factory, target, dtype)

    def check(self, B, H, Lq, Lk):
        if self._check is not None:
            self._check(B, H, Lq, Lk)

    def cache_key(self, part, dtype=np.float64):
        factory = self._grad_factory if part == "grad" else self._factory
        return f"{source_name(factory)}[{np.dtype(dtype).name}]"


def _alibi_source(F, tanh):
    def alibi(score, b, h, q_idx, kv_idx, args):
        return score + args[0][h] * F(kv_idx - q_idx)
    return alibi


def _unit_grad_source(F, tanh):
    def unit_grad(score, b, h, q_idx, kv_idx, args):
        return F(1)
    return unit_grad


def _softcap_source(F, tanh):
    def softcap(score, b, h, q_idx, kv_idx, args):
        cap = args[0]
        return cap * tanh(score / cap)
    return softcap


def _softcap_grad_source(F, tanh):
    def softcap_grad(score, b, h, q_idx, kv_idx, args):
        t = tanh(score / args[0])
        return F(1) - t * t
    return softcap_grad


def _relative_bias_source(F, tanh):
    def relative_bias(score, b, h, q_idx, kv_idx, args):
        table = args[0]
        R = (table.shape[1] - 1) // 2
        d = min(max(kv_idx - q_idx, -R), R)
        return score + table[h, d + R]
    return relative_bias


def _per_head(name: str, values, what: str):
    def check(B, H, Lq, Lk):
        if values.shape[0] != H:
            raise ValueError(f"{name} has {values.shape[0]} {what} for {H} query heads "
                             f"(shape {values.shape}); expected one per query head")
    return check


def alibi(slopes) -> ScoreMod:
    """ALiBi (BLOOM, MPT): ``score + slopes[h] · (kv_idx - q_idx)``, one slope per query head.

    Parameters
    ----------
    slopes : array_like of float, shape (H,)
        E.g. ``2 ** (-8 * (h + 1) / H)`` for the usual geometric slopes.

    Returns
    -------
    ScoreMod
        For ``score_mod=`` of :func:`kernels.attention` and :func:`kernels.attention_backward`.
    """
    arr = np.asarray(slopes, dtype=np.float64)
    if arr.ndim != 1:
        raise ValueError(f"slopes must be 1-D (one per query head); got shape {arr.shape}")
    if not np.isfinite(arr).all():
        raise ValueError("slopes must be finite")
    return _BuiltinScore(f"alibi({arr.size} slopes)", _alibi_source, _unit_grad_source,
                         (np.ascontiguousarray(arr),), _per_head("slopes", arr, "slopes"),
                         formula=("alibi", arr))


def softcap(cap: float) -> ScoreMod:
    """Logit soft-capping (Gemma 2): ``cap · tanh(score / cap)``.

    Parameters
    ----------
    cap : float > 0

    Returns
    -------
    ScoreMod
        For ``score_mod=`` of :func:`kernels.attention` and :func:`kernels.attention_backward`.
    """
    if isinstance(cap, bool) or not isinstance(cap, numbers.Real):
        raise TypeError(f"cap must be a real number; got {type(cap).__name__}")
    if not (np.isfinite(cap) and cap > 0):
        raise ValueError(f"cap must be finite and > 0; got {cap}")
    return _BuiltinScore(f"softcap({cap})", _softcap_source, _softcap_grad_source,
                         (np.float64(cap),), formula=("softcap", float(cap)))


def relative_bias(table) -> ScoreMod:
    """Relative position bias: adds ``table[h, clip(kv_idx - q_idx, -R, R) + R]``.

    Parameters
    ----------
    table : array_like of float, shape (H, 2·R + 1)
        One row per query head; distances beyond ±R share the end entries.

    Returns
    -------
    ScoreMod
        For ``score_mod=`` of :func:`kernels.attention` and :func:`kernels.attention_backward`.
    """
    arr = np.asarray(table, dtype=np.float64)
    if arr.ndim != 2 or arr.shape[1] % 2 != 1:
        raise ValueError(f"table must have shape (H, 2*R + 1) (an odd width); got {arr.shape}")
    return _BuiltinScore(f"relative_bias(table {arr.shape})", _relative_bias_source,
                         _unit_grad_source, (np.ascontiguousarray(arr),),
                         _per_head("table", arr, "rows"), formula=("relative_bias", arr))



class _ChainedScore(ScoreMod):
    def __init__(self, first: ScoreMod, second: ScoreMod):
        super().__init__(f"chain({first!r}, {second!r})")
        self.first, self.second = first, second
        self.formula = ("chain", first, second)
        self.user_names = first.user_names + second.user_names

    def args(self, dtype=np.float64):
        return self.first.args(dtype) + self.second.args(dtype)

    def element(self, target="cpu", dtype=np.float64):
        return _compile().chain_scores(target, self.first.element(target, dtype),
                                       self.second.element(target, dtype),
                                       len(self.first.args(dtype)))

    @property
    def has_grad(self) -> bool:
        return self.first.has_grad and self.second.has_grad

    def grad(self, target="cpu", dtype=np.float64):
        return _compile().chain_grads(target, self.first.element(target, dtype),
                                      self.first.grad(target, dtype),
                                      self.second.grad(target, dtype),
                                      len(self.first.args(dtype)))

    def check(self, B, H, Lq, Lk):
        self.first.check(B, H, Lq, Lk)
        self.second.check(B, H, Lq, Lk)

    def cache_key(self, part, dtype=np.float64):
        parts = ((self.first, "element"), (self.second, part)) if part == "element" else (
            (self.first, "element"), (self.first, "grad"), (self.second, "grad"))
        keys = [mod.cache_key(p, dtype) for mod, p in parts]
        if None in keys:
            return None
        return f"chain_{part}({', '.join(keys)}, {len(self.first.args(dtype))})"


def chain(*score_mods) -> ScoreMod:
    """Score functions applied left to right: ``chain(f, g)(s) = g(f(s))``.

    Parameters
    ----------
    *score_mods : ScoreMod or callable
        At least one; plain functions are wrapped by :func:`score_mod`.

    Returns
    -------
    ScoreMod
        For ``score_mod=`` of :func:`kernels.attention` and :func:`kernels.attention_backward`.
    """
    if not score_mods:
        raise TypeError("chain needs at least one score function")
    mods = [as_score_mod(s) for s in score_mods]
    result = mods[0]
    for s in mods[1:]:
        result = _ChainedScore(result, s)
    return result
