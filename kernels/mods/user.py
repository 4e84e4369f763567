"""User functions in :mod:`kernels.mods`: :func:`mask_mod` and :func:`score_mod` (a function
with bound arrays, and a score function's derivative), and the coercion of a plain function
passed to :func:`kernels.attention` (:func:`as_mask_mod`, :func:`as_score_mod`)."""

from __future__ import annotations

import numpy as np

from .base import MaskMod, ScoreMod, _compile

# --- user functions ----------------------------------------------------------------------------


class _UserMask(MaskMod):
    analytic = False

    def __init__(self, fn, arrays):
        mc = _compile()
        self.fn = fn = mc.canonical(fn)
        self._arrays = arrays
        mc.check_arity("mask_mod", fn, 4, len(arrays))
        super().__init__(mc.describe("mask_mod", fn))
        self.user_names = (self.name,)
        mc.probe("mask_mod", fn, mc.INDEX_TYPES + mc.probe_types(arrays), mc.types.Boolean)

    def args(self, dtype=np.float64):
        return self._arrays

    def element(self, target="cpu", dtype=np.float64):
        return _compile().adapt_user(target, "mask_mod", self.fn, len(self._arrays))


class _UserScore(ScoreMod):
    def __init__(self, fn, arrays, grad):
        mc = _compile()
        self.fn = fn = mc.canonical(fn)
        self._arrays = arrays
        self._grad = grad = None if grad is None else mc.canonical(grad)
        mc.check_arity("score_mod", fn, 5, len(arrays))
        if grad is not None:
            mc.check_arity("score_mod grad", grad, 5, len(arrays))
        super().__init__(mc.describe("score_mod", fn))
        self.user_names = (self.name,) + (
            (mc.describe("score_mod grad", grad),) if grad is not None else ())
        self._probed = set()

    def probe(self, dtype) -> None:
        """Compile the function (and its grad) for scores of ``dtype``: TypeError if it fails."""
        dtype = np.dtype(dtype)
        if dtype in self._probed:
            return
        mc = _compile()
        arg_types = (mc.scalar_type(dtype),) + mc.INDEX_TYPES + mc.probe_types(self._arrays)
        mc.probe("score_mod", self.fn, arg_types, mc.types.Float)
        if self._grad is not None:
            mc.probe("score_mod grad", self._grad, arg_types, mc.types.Float)
        self._probed.add(dtype)

    def args(self, dtype=np.float64):
        return self._arrays

    def element(self, target="cpu", dtype=np.float64):
        self.probe(dtype)
        return _compile().adapt_user(target, "score_mod", self.fn, len(self._arrays))

    @property
    def has_grad(self) -> bool:
        return self._grad is not None

    def grad(self, target="cpu", dtype=np.float64):
        if self._grad is None:
            raise ValueError(
                f"{self.name} has no derivative: give it as "
                "kernels.mods.score_mod(fn, *arrays, grad=dfn) with dfn(score, b, h, q_idx, "
                "kv_idx, *arrays) = d fn / d score"
            )
        self.probe(dtype)
        return _compile().adapt_user(target, "score_mod", self._grad, len(self._arrays))


def _bound_arrays(arrays) -> tuple:
    mc = _compile()
    return tuple(mc.normalise_array(f"bound array {n}", a) for n, a in enumerate(arrays))


def mask_mod(fn, *arrays) -> MaskMod:
    """A user mask function ``fn(b, h, q_idx, kv_idx, *arrays) -> bool`` with bound arrays.

    ``fn`` is a plain Python function (compiled with ``numba.njit``) or an ``@numba.njit``
    one; it is compiled here, on the arrays' types, so that a function Numba cannot
    compile, of the wrong arity or returning something else than a bool raises a
    TypeError naming it now.  Binding other arrays of the same dtypes and ranks later
    does not recompile.  An exception raised inside ``fn`` while attention runs becomes
    a ValueError naming it.

    Parameters
    ----------
    fn : callable
    *arrays : array_like
        Received by ``fn`` after its indices (C-contiguous copies where needed).

    Returns
    -------
    MaskMod
        For ``mask_mod=`` of :func:`kernels.attention` and :func:`kernels.attention_backward`.
    """
    if isinstance(fn, MaskMod):
        if arrays:
            raise TypeError(f"{fn!r} already has its data; mask_mod() binds arrays to a function")
        return fn
    if isinstance(fn, ScoreMod):
        raise TypeError(f"{fn!r} is a score function: pass it as score_mod=")
    return _UserMask(fn, _bound_arrays(arrays))


def score_mod(fn, *arrays, grad=None) -> ScoreMod:
    """A user score function ``fn(score, b, h, q_idx, kv_idx, *arrays) -> float``.

    As :func:`mask_mod`; the function is compiled (and checked) for the scores' dtype on
    first use, before any work.

    Parameters
    ----------
    fn : callable
    *arrays : array_like
        Received by ``fn`` after its indices.
    grad : callable, optional
        ``d fn / d score`` with ``fn``'s signature, for a backward pass (which raises a
        clear error without it).

    Returns
    -------
    ScoreMod
        For ``score_mod=`` of :func:`kernels.attention` and :func:`kernels.attention_backward`.
    """
    if isinstance(fn, ScoreMod):
        if arrays or grad is not None:
            raise TypeError(f"{fn!r} already has its data and derivative")
        return fn
    if isinstance(fn, MaskMod):
        raise TypeError(f"{fn!r} is a mask function: pass it as mask_mod=")
    return _UserScore(fn, _bound_arrays(arrays), grad)



# --- coercion (kernels.attention's mask_mod= and score_mod=) --------------------------------------


def as_mask_mod(x) -> MaskMod:
    """``x`` as a :class:`MaskMod`: itself, or a plain function wrapped by :func:`mask_mod`."""
    if isinstance(x, MaskMod):
        return x
    return memo_user("mask", x, lambda: mask_mod(x))


def as_score_mod(x) -> ScoreMod:
    """``x`` as a :class:`ScoreMod`: itself, or a plain function wrapped by :func:`score_mod`."""
    if isinstance(x, ScoreMod):
        return x
    return memo_user("score", x, lambda: score_mod(x))


_USER_MODS: dict = {}


def memo_user(kind, fn, build):
    """A plain function passed directly is wrapped (and checked) once."""
    try:
        key = (kind, fn)
        hash(key)
    except TypeError:
        return build()
    if key not in _USER_MODS:
        _USER_MODS[key] = build()
    return _USER_MODS[key]
