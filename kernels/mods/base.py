"""The two kinds of :mod:`kernels.mods` functions (:class:`MaskMod`, :class:`ScoreMod`),
the tile classes and the checks their constructors share."""

from __future__ import annotations

import numbers

import numpy as np

#: Default query rows and keys per cell of a :func:`block_mask`.
BLOCK_MASK_CELL = 64


def _compile():
    """The lowering module (:mod:`kernels.mods.lowering`): imports Numba, so only on use."""
    from . import lowering

    return lowering


def _dense():
    """Dense evaluation (:mod:`kernels.mods.dense`): imports Numba, so only on use."""
    from . import dense

    return dense


def source_name(fn) -> str:
    """``module.qualname`` of a built-in's source function (part of a cache key)."""
    return f"{fn.__module__}.{fn.__qualname__}"


# --- the two kinds ------------------------------------------------------------------------------


class _Mod:
    """What both kinds share: a name (its repr), the bound data, a shape check."""

    #: Names of the user functions inside (for error messages).
    user_names: tuple = ()
    #: A built-in's constructor name and arguments, e.g. ``("softcap", 30.0)``, or a
    #: combination and its parts, ``("and", first, second)``: what the reference's own
    #: formulas (:mod:`kernels.reference.formulas`) read.  None for a user function.
    formula: tuple | None = None

    def __init__(self, name: str):
        self.name = name

    def __repr__(self) -> str:
        return self.name

    def args(self, dtype=np.float64) -> tuple:
        """The bound data as one flat tuple (what the compiled functions receive); floats
        of a score function's data in ``dtype``."""
        raise NotImplementedError

    def check(self, B: int, H: int, Lq: int, Lk: int) -> None:
        """Raise ValueError if the bound data does not fit a (B, H, Lq, Lk) problem."""

    def cache_key(self, part: str, dtype=np.float64) -> str | None:
        """A name of the compiled ``part`` ("element", "tile" or "grad") for the CPU, the
        same in every process for the same code and whatever the bound values; None for
        a user function.  The CPU kernels are cached on disk for keyed functions
        (:mod:`kernels.mods.cache`)."""
        return None


class MaskMod(_Mod):
    """A mask function with its bound data: ``(b, h, q_idx, kv_idx) -> bool`` (True = attend).

    Built by the built-ins, :func:`mask_mod`, :func:`and_masks`, :func:`or_masks` and
    :func:`block_mask`; :func:`kernels.attention` takes one as ``mask_mod=``.
    """

    kind = "mask_mod"
    #: True when tiles are classified without evaluating every pair.
    analytic = True

    def element(self, target: str = "cpu", dtype=np.float64):
        """The compiled ``m(b, h, q_idx, kv_idx, args) -> bool`` for ``target``."""
        raise NotImplementedError

    def tile(self, target: str = "cpu"):
        """The compiled ``t(b, h, i0, i1, j0, j1, args) -> EMPTY | PARTIAL | FULL``."""
        return _compile().exact_tile(target, self.element(target))

    def dense(self, B: int, H: int, Lq: int, Lk: int) -> np.ndarray:
        """The mask on every pair, bool (B, H, Lq, Lk): for the reference and tests."""
        return _dense().dense_visible(self, B, H, Lq, Lk)


class ScoreMod(_Mod):
    """A score function with its bound data: ``(score, b, h, q_idx, kv_idx) -> float``.

    ``grad`` (the derivative with respect to ``score``, same signature) is what a
    backward pass needs; built-ins carry theirs.
    """

    kind = "score_mod"

    def element(self, target: str = "cpu", dtype=np.float64):
        """The compiled ``s(score, b, h, q_idx, kv_idx, args) -> float`` for ``dtype`` scores."""
        raise NotImplementedError

    def grad(self, target: str = "cpu", dtype=np.float64):
        """The compiled d s / d score (same signature); ValueError naming it if it has none."""
        raise NotImplementedError

    @property
    def has_grad(self) -> bool:
        return True

    def dense(self, scores: np.ndarray, dtype=np.float64) -> np.ndarray:
        """The function applied to every score (B, H, Lq, Lk), evaluated in ``dtype``."""
        return _dense().dense_scores(self, scores, dtype)

    def dense_grad(self, scores: np.ndarray) -> np.ndarray:
        """d s / d score at every score (B, H, Lq, Lk)."""
        return _dense().dense_grads(self, scores)


def _int(name: str, x, minimum: int = 0) -> int:
    if isinstance(x, bool) or not isinstance(x, numbers.Integral):
        raise TypeError(f"{name} must be an int; got {type(x).__name__}")
    if x < minimum:
        raise ValueError(f"{name} must be at least {minimum}; got {x}")
    return int(x)
