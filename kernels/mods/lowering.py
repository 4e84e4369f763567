"""Compiling and checking the score and mask functions of :mod:`kernels.mods`.

Every function a kernel calls has one of two internal forms, with the bound data as one
flat tuple ``args`` after the index arguments:

    mask element   m(b, h, q_idx, kv_idx, args) -> bool          True = attend
    mask tile      t(b, h, i0, i1, j0, j1, args) -> EMPTY | PARTIAL | FULL
    score element  s(score, b, h, q_idx, kv_idx, args) -> float

The tile form classifies the pairs ``[i0, i1) x [j0, j1)``: EMPTY only if no pair is
visible, FULL only if every pair is, PARTIAL otherwise (always a safe answer).  A user
function ``fn(b, h, q_idx, kv_idx, *arrays)`` is adapted to the element form by a small
wrapper; combinations (``and_masks``, ``chain``...) are closures over their children's
compiled functions that pass each child its slice of ``args``.  The tuple stays flat
because Numba's parallel loops cannot capture nested tuples of arrays.

Functions are compiled once per structure (the same functions, whatever the bound
values), per target (``"cpu"``: ``numba.njit``; ``"cuda"``: a CUDA device function) and
per dtype of the scores: the kernels are specialised on them (each Numba function is a
type of its own) and LLVM inlines them, so a score function costs no call per element.
Bound arrays of the same dtype and rank never cause a recompilation.

Numba is imported only when this module is, that is when a mod is first used.
"""

from __future__ import annotations

import inspect
import math

import numba
import numpy as np
from numba import njit, types

from .._dtypes import compute_dtype
from .._jit.math import EXACT_MATH
from .._problems.arrays import wrong_dtype
from .cells import EMPTY, FULL, PARTIAL

# --- jitting per target -----------------------------------------------------------------------


def jit_for(target: str):
    """The decorator that compiles a mod function for ``target`` ("cpu" or "cuda")."""
    if target == "cpu":
        return njit
    if target == "cuda":
        from numba import cuda

        return cuda.jit(device=True, inline="always")
    raise ValueError(f"unknown target {target!r}")


_MEMO: dict = {}


def memo(key, build):
    """``build()`` once per ``key`` (a hashable structure description); the same result after."""
    try:
        return _MEMO[key]
    except KeyError:
        result = _MEMO[key] = build()
        return result


def scalar_type(dtype):
    """The Numba scalar type of ``dtype``: also a cast inside compiled code (``F(x)``)."""
    return numba.from_dtype(np.dtype(dtype))


# --- a vectorisable tanh (softcap on the CPU) -------------------------------------------------

# A rational function x·P(x²)/Q(x²), P and Q of degree 4 in x², fitted to tanh on [0, 9.02]
# by scripts/fit_tanh.py (which also checks every float32): the input is clamped to
# ±9.02, past which tanh rounds to ±1 in float32, and the result to [-1, 1].  No exp and one
# division, so that the loops calling it vectorise: the softcap score loop is about a
# third faster than with Cephes' tanhf (exp(-2|x|) and a polynomial, both branches
# evaluated).  The price is accuracy
# near ±1, where P and Q are large: 5.13 ulps of the exact result at most, against Cephes'
# 1.5 (the fit alone, in float64, is 0.6).  At the attention's output it does not show: a
# softcapped float32 forward is as far from the float64 oracle as with Cephes' (the score's own
# rounding dominates).  math.tanh is a scalar libm call: no vectorised loop.
_f32 = np.float32
_TA1, _TA2, _TA3, _TA4 = (_f32(c) for c in (
    0.13382680714130402, 0.003497450379654765, 2.0635688997572288e-05, 1.3384090280510463e-08))
_TB1, _TB2, _TB3, _TB4 = (_f32(c) for c in (
    0.46716001629829407, 0.02588433399796486, 0.00032885046675801277, 7.790170002408559e-07))
_TH_CLAMP = _f32(9.02)


def _tanh32_source():
    @njit(fastmath=EXACT_MATH)
    def tanh32(x):
        """tanh of a float32 (~5 ulps at most; NaN for NaN)."""
        c = _TH_CLAMP if x > _TH_CLAMP else x  # comparisons with NaN are false: NaN stays
        c = -_TH_CLAMP if c < -_TH_CLAMP else c
        t = c * c
        num = c + c * t * (((_TA4 * t + _TA3) * t + _TA2) * t + _TA1)
        den = _f32(1) + t * (((_TB4 * t + _TB3) * t + _TB2) * t + _TB1)
        return min(max(num / den, _f32(-1)), _f32(1))  # Numba's min and max keep NaN

    return tanh32


def tanh_for(target: str, dtype):
    """A compiled tanh for scores of ``dtype`` on ``target``."""
    if target == "cpu" and np.dtype(dtype) == np.float32:
        return memo(("tanh32",), _tanh32_source)
    return math.tanh


# --- user functions ---------------------------------------------------------------------------


def describe(kind: str, fn) -> str:
    """``"mask_mod 'name'"``: how errors name a user function."""
    py = getattr(fn, "py_func", fn)
    name = getattr(py, "__qualname__", None) or getattr(py, "__name__", None) or repr(py)
    return f"{kind} {name!r}"


def python_function(kind: str, fn):
    """The Python function behind ``fn`` (a plain function or a Numba dispatcher)."""
    py = getattr(fn, "py_func", fn)
    if not callable(fn) or not (inspect.isfunction(py) or inspect.ismethod(py)):
        raise TypeError(
            f"{kind} must be a Python function or an @numba.njit function; got "
            f"{type(fn).__name__}"
        )
    return py


def check_arity(kind: str, fn, n_index: int, n_arrays: int) -> None:
    """TypeError naming ``fn`` unless it takes ``n_index`` index arguments and the arrays."""
    py = python_function(kind, fn)
    expected = ("score, b, h, q_idx, kv_idx" if kind == "score_mod" else "b, h, q_idx, kv_idx")
    if n_arrays:
        expected += f", + {n_arrays} bound array(s)"
    try:
        inspect.signature(py).bind(*range(n_index + n_arrays))
    except TypeError:
        raise TypeError(
            f"{describe(kind, fn)} must take ({expected}): {n_index + n_arrays} positional "
            f"arguments; its signature is {inspect.signature(py)}"
        ) from None


_CANONICAL: dict = {}


def canonical(fn):
    """The first function seen with ``fn``'s code, globals and defaults, if it has no closure.

    A lambda or local function written once but created anew at each call (a fresh object
    each time) then compiles once, not at every call.
    """
    if isinstance(fn, numba.core.registry.CPUDispatcher) or not inspect.isfunction(fn):
        return fn
    if fn.__closure__ is not None or fn.__kwdefaults__:
        return fn
    key = (fn.__code__, id(fn.__globals__), fn.__defaults__)
    try:
        return _CANONICAL.setdefault(key, fn)
    except TypeError:  # unhashable defaults
        return fn


def cpu_dispatcher(fn):
    """``fn`` as a Numba CPU dispatcher: itself if it is one, else ``numba.njit(fn)`` (memoised)."""
    if isinstance(fn, numba.core.registry.CPUDispatcher):
        return fn
    return memo(("njit", fn), lambda: njit(fn))


def probe(kind: str, fn, arg_types: tuple, want) -> None:
    """Compile ``fn`` for ``arg_types`` and check its return type; TypeError naming ``fn``.

    ``want`` is a Numba type class (``types.Boolean`` for masks, ``types.Float`` for scores).
    Nothing runs: this only compiles (once per argument types; Numba keeps the result).
    """
    disp = cpu_dispatcher(fn)
    try:
        disp.compile(arg_types)
    except Exception as exc:  # a NumbaError, or an error raised while Numba reads the code
        first = str(exc).strip().splitlines()
        raise TypeError(
            f"Numba cannot compile {describe(kind, fn)} for arguments "
            f"({', '.join(str(t) for t in arg_types)}): "
            f"{first[0] if first else type(exc).__name__}"
        ) from exc
    ret = disp.overloads[tuple(arg_types)].signature.return_type
    if not isinstance(ret, want):
        expected = "a bool (True = attend)" if kind == "mask_mod" else "a float (the new score)"
        raise TypeError(f"{describe(kind, fn)} must return {expected}; it returns {ret}")


def adapt_user(target: str, kind: str, fn, n_arrays: int):
    """The element form of user function ``fn``: passes ``args[0] .. args[n - 1]`` after
    the indices.  Written out (not ``*args``): CUDA's IR-level inlining rejects a star call."""

    def build():
        if target == "cpu":
            inner = cpu_dispatcher(fn)
        else:
            inner = jit_for(target)(python_function(kind, fn))
        index = "b, h, q_idx, kv_idx" if kind == "mask_mod" else "score, b, h, q_idx, kv_idx"
        call = ", ".join([index] + [f"args[{n}]" for n in range(n_arrays)])
        namespace = {"inner": inner}
        exec(f"def element({index}, args):\n    return inner({call})\n", namespace)
        return jit_for(target)(namespace["element"])

    return memo(("user", target, kind, fn, n_arrays), build)


def normalise_array(name: str, x) -> np.ndarray:
    """A bound array as a C-contiguous NumPy array of a numeric or bool dtype."""
    arr = np.asarray(x)
    if arr.dtype.kind not in "biuf":
        raise wrong_dtype(name, arr.dtype, "bool, integer or float")
    return np.ascontiguousarray(arr)


# --- generic tile forms and combinations --------------------------------------------------------


def exact_tile(target: str, element):
    """A tile form that evaluates the element mask on every pair (exact, O(tile area))."""

    def build():
        def tile(b, h, i0, i1, j0, j1, args):
            seen = 0
            for i in range(i0, i1):
                for j in range(j0, j1):
                    if element(b, h, i, j, args):
                        seen += 1
            if seen == 0:
                return EMPTY
            return FULL if seen == (i1 - i0) * (j1 - j0) else PARTIAL

        return jit_for(target)(tile)

    return memo(("exact_tile", target, element), build)


def combine_masks(target: str, op: str, first, second, n_first: int):
    """``first op second`` for two element forms (op "and"/"or"); ``args`` split at n_first."""

    def build():
        if op == "and":
            def element(b, h, q_idx, kv_idx, args):
                return (first(b, h, q_idx, kv_idx, args[:n_first])
                        and second(b, h, q_idx, kv_idx, args[n_first:]))
        else:
            def element(b, h, q_idx, kv_idx, args):
                return (first(b, h, q_idx, kv_idx, args[:n_first])
                        or second(b, h, q_idx, kv_idx, args[n_first:]))
        return jit_for(target)(element)

    return memo(("combine", target, op, first, second, n_first), build)


def combine_tiles(target: str, op: str, first, second, n_first: int):
    """Tile forms of ``first op second``: conservative (PARTIAL when unsure).

    "and" and "or" are duals: one child's ``decides`` class (EMPTY for "and", FULL for
    "or") is the answer, and the other class holds only where both children say it; the
    second child is not called when the first decides."""

    def build():
        decides, needs_both = (EMPTY, FULL) if op == "and" else (FULL, EMPTY)

        def tile(b, h, i0, i1, j0, j1, args):
            a = first(b, h, i0, i1, j0, j1, args[:n_first])
            if a == decides:
                return decides
            c = second(b, h, i0, i1, j0, j1, args[n_first:])
            if c == decides:
                return decides
            return needs_both if a == needs_both and c == needs_both else PARTIAL
        return jit_for(target)(tile)

    return memo(("combine_tile", target, op, first, second, n_first), build)


def chain_scores(target: str, first, second, n_first: int):
    """``second(first(score))``: score functions applied left to right."""

    def build():
        def element(score, b, h, q_idx, kv_idx, args):
            return second(first(score, b, h, q_idx, kv_idx, args[:n_first]), b, h, q_idx,
                          kv_idx, args[n_first:])
        return jit_for(target)(element)

    return memo(("chain", target, first, second, n_first), build)


def chain_grads(target: str, first, first_grad, second_grad, n_first: int):
    """d/dscore of ``second(first(score))``: ``second'(first(score)) · first'(score)``."""

    def build():
        def grad(score, b, h, q_idx, kv_idx, args):
            inner = first(score, b, h, q_idx, kv_idx, args[:n_first])
            return (second_grad(inner, b, h, q_idx, kv_idx, args[n_first:])
                    * first_grad(score, b, h, q_idx, kv_idx, args[:n_first]))
        return jit_for(target)(grad)

    return memo(("chain_grad", target, first, first_grad, second_grad, n_first), build)


# --- the identities a kernel uses when a call has no mod -----------------------------------------


def _always_visible(b, h, q_idx, kv_idx, args):
    return True


def _always_full(b, h, i0, i1, j0, j1, args):
    return FULL


def _same_score(score, b, h, q_idx, kv_idx, args):
    return score


def user_names(problem) -> tuple:
    """The user functions of a problem's mods, as error messages name them."""
    names = ()
    for mod in (problem.mask_mod, problem.score_mod):
        if mod is not None:
            names += mod.user_names
    return names


def identity_mask(target: str):
    """(element, tile) of the mask that hides nothing."""
    jit = jit_for(target)
    return memo(("no_mask", target), lambda: (jit(_always_visible), jit(_always_full)))


def identity_score(target: str):
    """The score function that changes nothing."""
    return memo(("no_score", target), lambda: jit_for(target)(_same_score))


def identity_score_grad(target: str, dtype):
    """The derivative of :func:`identity_score`: 1 in the scores' dtype."""
    F = scalar_type(dtype)

    def build():
        def unit(score, b, h, q_idx, kv_idx, args):
            return F(1)
        return jit_for(target)(unit)

    return memo(("no_score_grad", target, np.dtype(dtype).name), build)


def probe_types(arrays: tuple) -> tuple:
    """Numba types of bound arrays (what the kernels will see)."""
    return tuple(numba.typeof(a) for a in arrays)


INDEX_TYPES = (types.int64,) * 4


def mod_arguments(problem, target: str = "cpu"):
    """``(mask_fn, tile_fn, mask_args, score_fn, score_args)`` of a problem for ``target``
    ("cpu" or "cuda"): the compiled forms and the flat tuples of bound data; identities
    where the call has no mask or score function."""
    dtype = compute_dtype(problem.dtype)  # float32 for half inputs
    if problem.mask_mod is None:
        mask_fn, tile_fn = identity_mask(target)
        mask_args = ()
    else:
        mask_fn = problem.mask_mod.element(target)
        tile_fn = problem.mask_mod.tile(target)
        mask_args = problem.mask_mod.args(dtype)
    if problem.score_mod is None:
        score_fn, score_args = identity_score(target), ()
    else:
        score_fn = problem.score_mod.element(target, dtype)
        score_args = problem.score_mod.args(dtype)
    return mask_fn, tile_fn, mask_args, score_fn, score_args
