"""Evaluating :mod:`kernels.mods` functions outside the kernels: densely on every pair (the
reference backend and the tests), per tile (:func:`kernels.mods.block_mask`), and the
wrapper that turns an exception raised inside a user function into a ValueError naming it.

As the attention kernels, each loop has a twin cached on disk that built-ins run
(:mod:`kernels.mods.cache`); user functions run the per-process one.
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from .cache import CachedFn

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
def _dense_apply(element, args, scores, out):
    """out[b, h, i, j] = element(scores[b, h, i, j], b, h, i, j, args); ``out`` may be
    ``scores`` itself."""
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


_dense_visible_cached = njit(parallel=True, cache=True)(_dense_visible.py_func)
_dense_apply_cached = njit(cache=True)(_dense_apply.py_func)
_classify_cells_cached = njit(parallel=True, cache=True)(_classify_cells.py_func)


def _loop(plain, cached, mod, part: str, dtype, function):
    """``(loop, function)``: ``cached`` and ``function`` as a :class:`CachedFn` where ``mod``
    has a structure key for ``part``, else ``plain`` and the dispatcher itself."""
    key = mod.cache_key(part, dtype)
    return (plain, function) if key is None else (cached, CachedFn(key, function))


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
        loop, element = _loop(_dense_visible, _dense_visible_cached, mod, "element",
                              np.float64, mod.element("cpu", np.float64))
        run_user_code(mod.user_names, loop, element, mod.args(np.float64), out)
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
            loop, element = _loop(_dense_apply, _dense_apply_cached, mod, "element", work,
                                  mod.element("cpu", work))
            run_user_code(mod.user_names, loop, element, mod.args(work), out, out)
    return out.astype(scores.dtype, copy=False)


def dense_grads(mod, scores: np.ndarray) -> np.ndarray:
    """d mod / d score at every score (B, H, Lq, Lk), in the scores' dtype."""
    work = np.dtype(scores.dtype)
    loop, grad = _loop(_dense_apply, _dense_apply_cached, mod, "grad", work,
                       mod.grad("cpu", work))
    out = np.empty_like(scores)
    if out.size:
        run_user_code(mod.user_names, loop, grad, mod.args(work), np.ascontiguousarray(scores),
                      out)
    return out


def classify_cells(mod, B: int, H: int, Lq: int, Lk: int, cell_q: int, cell_k: int):
    """Tile classes (B, H, ceil(Lq / cell_q), ceil(Lk / cell_k)) int8 of mask ``mod``."""
    table = np.empty((B, H, -(-Lq // cell_q), -(-Lk // cell_k)), dtype=np.int8)
    if table.size:
        loop, tile = _loop(_classify_cells, _classify_cells_cached, mod, "tile", np.float64,
                           mod.tile("cpu"))
        run_user_code(mod.user_names, loop, tile, mod.args(np.float64), table, Lq, Lk, cell_q,
                      cell_k)
    return table


# --- at given query positions (decoding: q_idx = cache_seqlens[b] + Lnew - Lq + i) ---------


@njit(parallel=True)
def _dense_visible_at(element, args, q_positions, out):
    B, H, Lq, Lk = out.shape
    for bh in prange(B * H):
        b, h = bh // H, bh % H
        for i in range(Lq):
            for j in range(Lk):
                out[b, h, i, j] = element(b, h, q_positions[b, i], j, args)


@njit
def _dense_apply_at(element, args, q_positions, scores, out):
    B, H, Lq, Lk = scores.shape
    for b in range(B):
        for h in range(H):
            for i in range(Lq):
                for j in range(Lk):
                    out[b, h, i, j] = element(scores[b, h, i, j], b, h, q_positions[b, i], j,
                                              args)


def dense_visible_at(mod, H: int, q_positions: np.ndarray, Lk: int) -> np.ndarray:
    """The mask ``mod`` on every pair, query row i of batch b at ``q_idx = q_positions[b,
    i]``: bool (B, H, Lq, Lk).  For user functions (built-ins have their formulas)."""
    positions = np.ascontiguousarray(q_positions, dtype=np.int64)  # (B, Lq)
    out = np.empty(positions.shape[:1] + (H,) + positions.shape[1:] + (Lk,), dtype=np.bool_)
    if out.size:
        run_user_code(mod.user_names, _dense_visible_at, mod.element("cpu", np.float64),
                      mod.args(np.float64), positions, out)
    return out


def dense_scores_at(mod, scores: np.ndarray, q_positions: np.ndarray, dtype=np.float64):
    """``mod`` applied to every score (B, H, Lq, Lk), query row i of batch b at ``q_idx =
    q_positions[b, i]``, evaluated in ``dtype`` (as :func:`dense_scores`)."""
    work = np.dtype(dtype) if np.dtype(dtype) in (np.float32, np.float64) else np.float64
    out = np.array(scores, dtype=work, copy=True)
    if out.size:
        with np.errstate(all="ignore"):
            run_user_code(mod.user_names, _dense_apply_at, mod.element("cpu", work),
                          mod.args(work), np.ascontiguousarray(q_positions, dtype=np.int64),
                          out, out)
    return out.astype(scores.dtype, copy=False)
