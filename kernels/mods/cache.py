"""Mod functions of a type Numba can cache on disk: the built-ins of :mod:`kernels.mods`.

A Numba function passed to a kernel is a type of its own (``types.Dispatcher``), tied to
one Python object: a kernel specialised on it compiles again in every process, since the
disk cache can only match types that are rebuilt equal in a new process.  The CPU kernels
therefore receive each built-in (and each combination of built-ins) as a :class:`CachedFn`
instead: a small object whose Numba type, :class:`ModFnType`, is named by a *structure
key* (which functions, how combined, the scores' dtype), not by an object.  Calling it in
compiled code resolves to the same compiled function the dispatcher would give (same
typing, same lowering, so LLVM inlines it as before), and a kernel specialised on it is
found again in Numba's cache by the next process.

A key names code, not values: other windows, slopes or document ids share it.  Every key
carries a digest of the modules that define the built-ins (:data:`SOURCE_DIGEST`), so an
edit of a built-in or of a combination compiles the kernels again instead of loading a
stale one (Numba itself only watches the file of the cached kernel).

User functions (:func:`kernels.mods.mask_mod`, :func:`kernels.mods.score_mod`, plain
functions) have no key: they stay dispatchers and their kernels compile once per process.
"""

from __future__ import annotations

import pathlib

from numba.core import types
from numba.extending import NativeValue, models, register_model, typeof_impl, unbox

from .._dtypes import compute_dtype
from .._jit.cache import source_stamp


def _digest() -> str:
    """A short digest of the sources whose code a structure key stands for: the spec of the
    built-ins (what :mod:`kernels.mods` imports), their lowering (:mod:`kernels.mods.lowering`)
    and this module, with every package module they import
    (:func:`kernels._jit.cache.source_stamp`: the same walk that stamps cached kernels)."""
    return source_stamp(*sorted(pathlib.Path(__file__).parent.glob("*.py")))[:12]


#: Digest of the built-ins' sources, part of every key.
SOURCE_DIGEST = _digest()

#: key -> the Numba dispatcher that a call of the key's CachedFn compiles to.
_TARGETS: dict = {}


class CachedFn:
    """A mod function (element, tile or derivative form) named by a structure key.

    Parameters
    ----------
    key : str
        The structure (see :meth:`kernels.mods.base._Mod.cache_key`); equal keys must
        stand for the same code.
    dispatcher : numba dispatcher
        What a call compiles to in this process (the first one given for a key is kept).
    """

    __slots__ = ("key",)

    def __init__(self, key: str, dispatcher):
        self.key = f"{key}#{SOURCE_DIGEST}"
        _TARGETS.setdefault(self.key, dispatcher)

    def __repr__(self) -> str:
        return f"CachedFn({self.key!r})"


class ModFnType(types.Callable, types.Opaque):
    """The Numba type of a :class:`CachedFn`: equal for equal keys, in any process."""

    def __init__(self, key: str):
        self.fn_key = key
        super().__init__(name=f"modfn[{key}]")

    @property
    def key(self):
        return self.fn_key

    def _dispatcher_type(self):
        try:
            return types.Dispatcher(_TARGETS[self.fn_key])
        except KeyError:  # only a CachedFn made in this process is ever compiled
            raise RuntimeError(f"no function registered for {self.fn_key!r}") from None

    def get_call_type(self, context, args, kws):
        return self._dispatcher_type().get_call_type(context, args, kws)

    def get_call_signatures(self):
        return self._dispatcher_type().get_call_signatures()

    def get_impl_key(self, sig):
        return self._dispatcher_type().get_impl_key(sig)


@typeof_impl.register(CachedFn)
def _typeof_cached_fn(val, c):
    return ModFnType(val.key)


register_model(ModFnType)(models.OpaqueModel)


@unbox(ModFnType)
def _unbox_cached_fn(typ, obj, c):
    return NativeValue(obj)  # never read: calls are resolved when compiling


def cacheable(problem, arguments: tuple) -> tuple:
    """:func:`kernels.mods.lowering.mod_arguments` for the CPU with every function that has
    a structure key as a :class:`CachedFn`; a user function stays a dispatcher.

    Parameters
    ----------
    problem : AttentionProblem
    arguments : tuple
        ``(mask_fn, tile_fn, mask_args, score_fn, score_args)`` for target "cpu".
    """
    mask_fn, tile_fn, mask_args, score_fn, score_args = arguments
    dtype = compute_dtype(problem.dtype)  # float32 for half inputs
    mask, score = problem.mask_mod, problem.score_mod
    mask_keys = ("no_mask", "no_mask_tile") if mask is None else (
        mask.cache_key("element", dtype), mask.cache_key("tile", dtype))
    score_key = "no_score" if score is None else score.cache_key("element", dtype)
    return (wrap(mask_keys[0], mask_fn), wrap(mask_keys[1], tile_fn), mask_args,
            wrap(score_key, score_fn), score_args)


def wrap(key, dispatcher):
    """``CachedFn(key, dispatcher)``, or ``dispatcher`` itself when ``key`` is None."""
    return dispatcher if key is None else CachedFn(key, dispatcher)


def all_cached(*functions) -> bool:
    """True when every one of ``functions`` is a :class:`CachedFn`."""
    return all(isinstance(f, CachedFn) for f in functions)
