"""Compiling, checking and evaluating the score and mask functions of :mod:`kernels.mods`.

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
from numba import njit, prange, types

#: Tile classes (int64 in the kernels).
EMPTY, PARTIAL, FULL = 0, 1, 2

_EXACT_MATH = {"nsz", "arcp", "contract"}


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

# Cephes' tanhf: an odd polynomial for |x| < 0.625, (1 - e) / (1 + e) with e = exp(-2|x|)
# above (no cancellation there: e <= 0.29).  Written with selects, no branch, so that LLVM
# vectorises the loops that call it; math.tanh is a scalar libm call (~4 ns per float32).
_f32 = np.float32
_TH0, _TH1, _TH2, _TH3, _TH4 = (_f32(c) for c in (
    -5.70498872745e-3, 2.06390887954e-2, -5.37397155531e-2, 1.33314422036e-1,
    -3.33332819422e-1))
_TH_SMALL = _f32(0.625)


def _tanh32_source():
    from .numba_cpu import _exp32

    @njit(fastmath=_EXACT_MATH)
    def tanh32(x):
        """tanh of a float32 (a few ulp; NaN for NaN)."""
        a = abs(x)
        z = x * x
        small = ((((_TH0 * z + _TH1) * z + _TH2) * z + _TH3) * z + _TH4) * z * x + x
        e = _exp32(-(a + a))
        big = (_f32(1) - e) / (_f32(1) + e)
        big = big if x >= _f32(0) else -big
        return small if a < _TH_SMALL else big

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
        raise TypeError(f"{name} has dtype {arr.dtype}; expected bool, integer or float")
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
    """Tile forms of ``first op second``: conservative (PARTIAL when unsure)."""

    def build():
        if op == "and":
            def tile(b, h, i0, i1, j0, j1, args):
                a = first(b, h, i0, i1, j0, j1, args[:n_first])
                if a == EMPTY:
                    return EMPTY
                c = second(b, h, i0, i1, j0, j1, args[n_first:])
                if c == EMPTY:
                    return EMPTY
                return FULL if a == FULL and c == FULL else PARTIAL
        else:
            def tile(b, h, i0, i1, j0, j1, args):
                a = first(b, h, i0, i1, j0, j1, args[:n_first])
                if a == FULL:
                    return FULL
                c = second(b, h, i0, i1, j0, j1, args[n_first:])
                if c == FULL:
                    return FULL
                return EMPTY if a == EMPTY and c == EMPTY else PARTIAL
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


def identity_mask(target: str):
    """(element, tile) of the mask that hides nothing."""
    jit = jit_for(target)
    return memo(("no_mask", target), lambda: (jit(_always_visible), jit(_always_full)))


def identity_score(target: str):
    """The score function that changes nothing."""
    return memo(("no_score", target), lambda: jit_for(target)(_same_score))


# --- dense evaluation (the reference) and block classification --------------------------------


@njit(parallel=True)
def _dense_visible(element, args, out):
    B, H, Lq, Lk = out.shape
    for bh in prange(B * H):
        b, h = bh // H, bh % H
        for i in range(Lq):
            for j in range(Lk):
                out[b, h, i, j] = element(b, h, i, j, args)


@njit
def _dense_scores(element, args, scores):
    B, H, Lq, Lk = scores.shape
    for b in range(B):
        for h in range(H):
            for i in range(Lq):
                for j in range(Lk):
                    scores[b, h, i, j] = element(scores[b, h, i, j], b, h, i, j, args)


@njit
def _dense_grads(element, args, scores, out):
    B, H, Lq, Lk = scores.shape
    for b in range(B):
        for h in range(H):
            for i in range(Lq):
                for j in range(Lk):
                    out[b, h, i, j] = element(scores[b, h, i, j], b, h, i, j, args)


@njit(parallel=True)
def _classify_cells(tile, args, table, Lq, Lk, cell_q, cell_k):
    """table[b, h, ci, cj] = tile class of queries [ci·cell_q, ...) x keys [cj·cell_k, ...)."""
    B, H, n_q, n_k = table.shape
    for task in prange(B * H * n_q):
        bh, ci = task // n_q, task % n_q
        b, h = bh // H, bh % H
        i0 = ci * cell_q
        i1 = min(i0 + cell_q, Lq)
        for cj in range(n_k):
            j0 = cj * cell_k
            table[b, h, ci, cj] = tile(b, h, i0, i1, j0, min(j0 + cell_k, Lk), args)


def reraise_from_user(user_names: tuple, exc: BaseException):
    """ValueError naming the user functions, chained from what one of them raised.

    An exception raised inside Numba's parallel loops reaches Python as a SystemError whose
    context is the original exception: that original is the one reported.
    """
    original = exc
    if isinstance(exc, SystemError) and exc.__context__ is not None:
        original = exc.__context__
    names = " or ".join(user_names) if user_names else "a score or mask function"
    raise ValueError(f"{names} raised {type(original).__name__}: {original}") from original


def run_user_code(user_names: tuple, call, *call_args):
    """``call(*call_args)``; an exception from a user function becomes a ValueError naming it."""
    if not user_names:
        return call(*call_args)
    try:
        return call(*call_args)
    except Exception as exc:  # raised inside a user function (nothing else raises here)
        reraise_from_user(user_names, exc)


def dense_visible(mod, B: int, H: int, Lq: int, Lk: int) -> np.ndarray:
    """The mask ``mod`` evaluated on every pair: bool (B, H, Lq, Lk)."""
    out = np.empty((B, H, Lq, Lk), dtype=np.bool_)
    if out.size:
        run_user_code(mod.user_names, _dense_visible, mod.element("cpu", np.float64),
                      mod.args(np.float64), out)
    return out


def dense_scores(mod, scores: np.ndarray, dtype=np.float64) -> np.ndarray:
    """``mod`` applied to every score (B, H, Lq, Lk), evaluated in ``dtype`` (a new array).

    ``dtype`` is float64 for the reference (float32 for a plain float32 evaluation);
    any other dtype (``np.longdouble``) is evaluated in float64.
    """
    work = np.dtype(dtype) if np.dtype(dtype) in (np.float32, np.float64) else np.float64
    out = np.array(scores, dtype=work, copy=True)
    if out.size:
        with np.errstate(all="ignore"):
            run_user_code(mod.user_names, _dense_scores, mod.element("cpu", work),
                          mod.args(work), out)
    return out.astype(scores.dtype, copy=False)


def dense_grads(mod, scores: np.ndarray) -> np.ndarray:
    """d mod / d score at every score (B, H, Lq, Lk), in the scores' dtype."""
    work = np.dtype(scores.dtype)
    grad = mod.grad("cpu", work)
    out = np.empty_like(scores)
    if out.size:
        run_user_code(mod.user_names, _dense_grads, grad, mod.args(work),
                      np.ascontiguousarray(scores), out)
    return out


def classify_cells(mod, B: int, H: int, Lq: int, Lk: int, cell_q: int, cell_k: int):
    """Tile classes (B, H, ceil(Lq / cell_q), ceil(Lk / cell_k)) int8 of mask ``mod``."""
    table = np.empty((B, H, -(-Lq // cell_q), -(-Lk // cell_k)), dtype=np.int8)
    if table.size:
        run_user_code(mod.user_names, _classify_cells, mod.tile("cpu"), mod.args(np.float64),
                      table, Lq, Lk, cell_q, cell_k)
    return table


def probe_types(arrays: tuple) -> tuple:
    """Numba types of bound arrays (what the kernels will see)."""
    return tuple(numba.typeof(a) for a in arrays)


INDEX_TYPES = (types.int64,) * 4
